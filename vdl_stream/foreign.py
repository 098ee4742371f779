"""Live TensorBoard and VisualDL log directories: foreign runs followed as they are written.

``vdl-stream serve --logdir DIR`` shows, next to its own runs, every directory under ``DIR`` that
holds TensorBoard event files (``events.out.tfevents.*``) or VisualDL record files
(``vdlrecords.*.log``), and pushes what their writers append to open pages as it lands, like a
native run. The data path::

    event files (other processes)  --poll, read new bytes-->  tfevents / vdlrecords decoders
        --> ForeignBatch --> Broker.ingest (fan-out at once)  --> mirror run (recorder, cache dir)

Naming and permissions (docs/interop.md, "Live TensorBoard and VisualDL log directories"):

- A foreign run is named by its directory relative to ``DIR`` (``exp1/train``), as TensorBoard and
  ``vdl-stream import`` name runs; files directly in ``DIR`` form a run named after ``DIR`` itself.
  Every file of one directory (several writers, files rotated by a writer) feeds that one run.
- Foreign runs are read-only: the source files are never written, and batches that writers send
  to a foreign run's name are refused (not retryable). A directory that also holds the broker's
  own segment files is a native run and is not followed as foreign. Each foreign run gets one
  ``meta`` record when first seen: ``followed_from``, ``source_dir`` (relative), ``read_only``.
- Status: event files carry no close marker; a foreign run is ``finished`` once all its files are
  read and unchanged for :data:`FINISHED_AFTER` s, ``live`` again when one grows (``meta`` status
  records, as a closing writer sends).
- What was decoded is kept in a mirror run under the cache directory
  (``$VDL_STREAM_CACHE`` or ``~/.cache/vdl-stream``, ``/foreign-<hash of DIR>``), so snapshots,
  HTTP reads and export work as for native runs. Each file's writer id is derived from its name
  and inode, and its batch sequence number is the byte offset the batch ends at; a restarted
  server resumes every file where the mirror stopped.

Reading rules: a torn tail (an incomplete record) and a zero-filled stretch (a block an NFS client
has not seen written yet) mean "not written yet": the file is read again from the last good record
on the next poll, for ever for a torn tail, and for :data:`ZERO_GRACE` seconds for zeros that valid
records already follow (after that the stretch is reported as damage and skipped). A record whose
checksum fails counts as zero-filled when it holds 8 zero bytes in a row or ends in a zero byte;
VisualDL records (no checksums) when their length is zero, or when they end in a zero byte followed
by a zero byte or the end of the file. Damage that is
not zeros (a checksum mismatch over other bytes) is logged as an error naming the file and the
offset, skipped, and the rest of the file is still followed. A file that cannot be read is logged
once; every other file and run carries on.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio

from recorder.catalog import SEGMENT_RE

from . import codec, tfevents, tfrecord, vdlrecords
from .codec import Batch, ScalarColumns
from .errors import RefusedError
from .interop import source_kind
from .run_summary import CLOSED, RUNNING, STATUS_KEY

log = logging.getLogger("vdl_stream.foreign")

#: Seconds between two polls of the files that grew recently.
POLL = 0.02
#: Seconds between two walks of the log directory (new runs, new files, quiet files).
SCAN = 1.0
#: A file that has not grown for this many seconds is polled only at each walk.
QUIET = 10.0
#: Bytes read from one file per poll, at most (a single larger record is read whole).
READ_BYTES = 4 << 20
#: Bytes read from all files together per poll, at most (the rest waits for the next poll).
ROUND_BYTES = 32 << 20
#: Seconds a zero-filled stretch that valid records follow is waited for before it is skipped.
ZERO_GRACE = 30.0
#: A foreign run whose files are all read and unchanged for this many seconds is shown
#: ``finished`` (event files carry no close marker), and ``live`` again when one grows.
FINISHED_AFTER = 60.0
#: Files followed at most; more are left out with one warning.
MAX_FILES = 4096
#: Damage reports logged per file, at most (the rest is counted).
LOGGED_DAMAGE = 5
#: The writer id prefix of foreign batches (see :class:`ForeignBatch`).
WRITER_PREFIX = "foreign:"

_U64 = struct.Struct("<Q")


class ForeignBatch(Batch):
    """A batch decoded from a foreign file; the only kind of batch a foreign run accepts."""


def cache_root(logdir: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> Path:
    """The directory the mirrors of ``logdir``'s foreign runs are kept in: ``base`` (default
    ``$VDL_STREAM_CACHE``, else ``~/.cache/vdl-stream``) / ``foreign-<hash of logdir>``."""
    root = base or os.environ.get("VDL_STREAM_CACHE") or Path.home() / ".cache" / "vdl-stream"
    digest = hashlib.sha256(os.path.abspath(os.fspath(logdir)).encode()).hexdigest()[:16]
    return Path(root) / f"foreign-{digest}"


def run_name(logdir: str, dirpath: str) -> str | None:
    """The run name of the foreign directory ``dirpath`` under ``logdir``, or None when the
    name is not a valid run name (:func:`codec.check_run_name`)."""
    rel = os.path.relpath(dirpath, logdir)
    parts = [os.path.basename(os.path.abspath(logdir))] if rel == "." else rel.split(os.sep)
    name = "/".join(parts)
    try:
        return codec.check_run_name(name)
    except ValueError:
        return None


@dataclass
class Source:
    """One followed file: where reading stopped and what is waited for.

    Attributes:
        path: the file.
        kind: ``"tensorboard"`` or ``"visualdl"``.
        run: the run it feeds.
        writer: the writer id of its batches (from its name and inode).
        offset: bytes decoded and ingested so far (the next record starts here).
        size: the file size last seen.
        grew: ``time.monotonic()`` when it last grew (or was found).
        mtime: the file's modification time, as last seen.
        zeros_since: when a zero-filled stretch that valid records follow was first seen.
        metrics: the hparams metric tags of the file's experiment summary, once seen.
        damage: damaged stretches reported so far.
        resumed: the offset was read back from the mirror.
    """

    path: str
    kind: str
    run: str
    writer: str
    offset: int = 0
    size: int = 0
    grew: float = 0.0
    zeros_since: float | None = None
    mtime: float | None = None
    metrics: list[str] = field(default_factory=list)
    damage: int = 0
    resumed: bool = False


@dataclass
class Chunk:
    """What one poll decoded from one source: the block, and the offset it ends at."""

    source: Source
    block: tfevents.EventBlock | None
    end: int
    size: int
    error: OSError | None = None


def _has_zeros(buf: bytes | memoryview, start: int, length: int) -> bool:
    """Whether the damaged stretch ``buf[start:start+length]`` looks unwritten: 8 zero bytes in a
    row (a zero-filled block inside it), or a zero last byte (a zero-filled block that starts
    inside the record and runs past its end). A damaged record taken for unwritten by mistake
    only waits :data:`ZERO_GRACE` before it is reported; the checksums keep garbage out."""
    part = bytes(buf[start : start + length])
    return b"\0" * 8 in part or part.endswith(b"\0")


def _cut_tfevents(buf: bytes, frames: tfrecord.Frames, src: Source, now: float) -> tfrecord.Frames:
    """Stop ``frames`` at the first damaged stretch that looks unwritten (zeros), unless it has
    been waited for :data:`ZERO_GRACE` seconds already."""
    for c in frames.corrupt:
        if not _has_zeros(buf, c.offset, c.length):
            continue
        if src.zeros_since is None:
            src.zeros_since = now
        if now - src.zeros_since >= ZERO_GRACE:
            src.zeros_since = None
            return frames  # waited long enough: it is damage
        keep = frames.offsets < c.offset
        return tfrecord.Frames(
            frames.offsets[keep],
            frames.lengths[keep],
            [d for d in frames.corrupt if d.offset < c.offset],
            c.offset,
        )
    src.zeros_since = None
    return frames


def _vdl_limit(buf: bytes, src: Source, now: float) -> int:
    """The end of the complete, written VisualDL records at the start of ``buf``: stops before
    a torn tail and (within :data:`ZERO_GRACE`) before a zero length (VisualDL never writes an
    empty record) or a record whose last byte is zero with a zero byte or the end of the file
    after it. The latter also holds back, until the next record is written, a last record that
    really ends in a zero byte (a scalar of exactly 0.0)."""
    pos = 0
    size = len(buf)
    while pos + 8 <= size:
        (n,) = _U64.unpack_from(buf, pos)
        if n > vdlrecords.MAX_RECORD:
            return size  # damage: the decoder reports it
        if pos + 8 + n > size:
            break
        # No checksums here: a zero length, or a record ending in a zero byte with zeros (or
        # nothing yet) after it, is a zero-filled block that starts inside it.
        after = bytes(buf[pos + 8 + n : pos + 9 + n])
        unwritten = n == 0 or (buf[pos + 7 + n] == 0 and after in (b"", b"\0"))
        if unwritten:
            if src.zeros_since is None:
                src.zeros_since = now
            if now - src.zeros_since < ZERO_GRACE:
                return pos
            src.zeros_since = None
        pos += 8 + n
    return pos


def read_chunk(src: Source, now: float | None = None, read_bytes: int | None = None) -> Chunk:
    """Read and decode what was appended to ``src`` since its offset (blocking).

    Args:
        src: the file and where reading stopped (its ``zeros_since`` is updated here).
        now: ``time.monotonic()`` for the zero-filled grace (default: now).
        read_bytes: bytes read at most (default :data:`READ_BYTES`); a single longer record is
            read whole.

    Returns a :class:`Chunk` whose ``end`` is the offset to resume from (``src.offset`` when
    nothing complete was there). Damage is in ``block.corrupt`` with file offsets; an OSError
    is returned in ``error``, not raised.
    """
    now = time.monotonic() if now is None else now
    read_bytes = READ_BYTES if read_bytes is None else read_bytes
    try:
        with open(src.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= src.offset:
                return Chunk(src, None, src.offset, size)
            f.seek(src.offset)
            buf = f.read(min(size - src.offset, read_bytes))
            if len(buf) >= 12 and len(buf) < size - src.offset:
                # One record larger than a read: read exactly that record.
                (n,) = _U64.unpack_from(buf, 0)
                need = n + 16 if src.kind == "tensorboard" else n + 8
                if len(buf) < need <= size - src.offset and n < tfrecord.MAX_RECORD:
                    f.seek(src.offset)
                    buf = f.read(need)
    except OSError as exc:
        return Chunk(src, None, src.offset, src.size, exc)
    block = tfevents.EventBlock()
    block.hparam_metrics = src.metrics
    if src.kind == "tensorboard":
        frames = tfrecord.scan_frames(buf, 0, max_records=1 << 30, max_bytes=1 << 40, final=False)
        frames = _cut_tfevents(buf, frames, src, now)
        frames.corrupt = [
            tfrecord.Corruption(src.offset + c.offset, c.length, c.reason) for c in frames.corrupt
        ]
        tfevents.decode_records(buf, frames, block, base=src.offset)
        end = src.offset + frames.end
    else:
        limit = _vdl_limit(buf, src, now)
        pos = vdlrecords.decode_records(buf, 0, limit, block, 1 << 30, 1 << 40)
        block.corrupt = [
            tfrecord.Corruption(src.offset + c.offset, c.length, c.reason) for c in block.corrupt
        ]
        end = src.offset + pos
    block.end = end
    return Chunk(src, block, end, size)


def to_batch(src: Source, block: tfevents.EventBlock, seq: int) -> tuple[ForeignBatch, int]:
    """Turn a decoded block into a batch of ``src``'s run; returns it and the values left out
    (a tag or event the wire schema refuses, or a point without a finite wall time)."""
    dropped = 0
    scalars = []
    for tag, (steps, walls, values) in block.scalars.items():
        try:
            codec.check_tag(tag)
        except (TypeError, ValueError):
            dropped += len(steps)
            continue
        s = np.asarray(steps, dtype=np.int64)
        w = np.asarray(walls, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(w)
        if not finite.all():
            dropped += int((~finite).sum())
            s, w, v = s[finite], w[finite], v[finite]
        if len(s):
            scalars.append(ScalarColumns(tag, s, w, v))
    events = []
    for kind, tag, step, wall, data in block.events:
        event = {**data, "kind": kind, "tag": tag, "step": step, "wall": wall}
        if kind == "meta":
            event["tag"] = event["step"] = None
        try:
            codec.check_event(event)
        except codec.ProtocolError:
            dropped += 1
            continue
        events.append(event)
    return ForeignBatch(src.writer, seq, src.run, scalars, events), dropped


def _writer_id(path: str, st: os.stat_result) -> str:
    key = f"{os.path.basename(path)}:{st.st_dev}:{st.st_ino}".encode()
    return WRITER_PREFIX + hashlib.sha256(key).hexdigest()[:24]


@dataclass(frozen=True)
class ForeignStatistics:
    """What the follower does.

    Attributes:
        runs: foreign runs shown.
        files: files followed.
        records: records decoded.
        points: scalar points and events ingested.
        damage: damaged stretches skipped.
        dropped: values left out (a tag or event the wire schema refuses).
        waiting: files whose tail is torn or zero-filled now (retried each poll).
    """

    runs: int
    files: int
    records: int
    points: int
    damage: int
    dropped: int
    waiting: int


#: A directory listed less than this many ns after its modification time is listed again at the
#: next walk: an entry added in the same clock tick as the listing leaves the time unchanged.
RACY_NS = 2_000_000_000


@dataclass(frozen=True)
class _Listing:
    """What one walk found in a directory, kept while its modification time stays the same."""

    mtime: int  # st_mtime_ns when listed
    listed: int  # time.time_ns() when listed
    subdirs: tuple[str, ...]  # sorted; links to directories are not followed (as os.walk)
    native: bool  # holds a native run's segment: its files are not sources
    sources: tuple[tuple[str, str], ...]  # (file name, kind), sorted, when not native

    @classmethod
    def of(cls, dirpath: str, mtime: int, mirror: str) -> _Listing:
        """List ``dirpath`` (blocking); ``mirror``, a --cache-dir inside the log directory, is
        left out: its mirrors are not sources."""
        listed = time.time_ns()
        subdirs, names = [], []
        with os.scandir(dirpath) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if not is_dir:
                    names.append(entry.name)
                elif os.path.abspath(entry.path) != mirror:
                    subdirs.append(entry.path)
        native = any(SEGMENT_RE.match(n) for n in names)
        sources = (
            ()
            if native
            else tuple((n, kind) for n in sorted(names) if (kind := source_kind(n)) is not None)
        )
        return cls(mtime, listed, tuple(sorted(subdirs)), native, sources)


class ForeignRuns:
    """Follows the TensorBoard and VisualDL files under a log directory into the broker.

    Args:
        logdir: the directory ``serve`` watches.
        mirror: where the mirror runs are kept (see :func:`cache_root`).
        poll: seconds between polls of recently grown files.
        scan: seconds between walks of the log directory.

    Raises:
        ValueError: ``poll`` or ``scan`` is not a positive number.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        mirror: str | os.PathLike[str],
        *,
        poll: float = POLL,
        scan: float = SCAN,
    ) -> None:
        for name, value in (("poll", poll), ("scan", scan)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.logdir = os.fspath(logdir)
        self.mirror = Path(mirror)
        self._poll = float(poll)
        self._scan = float(scan)
        self._sources: dict[str, Source] = {}  # path -> source
        self._runs: set[str] = set()
        self._refused: set[str] = set()  # directories whose name is taken by a native run
        self._warned: set[str] = set()
        self._dirs: dict[str, _Listing] = {}  # directory -> its last listing (_list)
        self._limiter = trio.CapacityLimiter(1)
        self._turn = 0  # which source a poll round reads first
        self._status: dict[str, str] = {}  # run -> the status meta last given to it
        self._status_seq = 0
        self._records = self._points = self._damage = self._dropped = 0

    # -- what the broker asks -------------------------------------------------------------------

    def mirror_path(self, name: str) -> Path | None:
        """The mirror directory of foreign run ``name``; None for any other run."""
        return self.mirror / name if name in self._runs else None

    def owns(self, name: str) -> bool:
        """Whether ``name`` is a foreign run."""
        return name in self._runs

    def refusal(self, batch: Batch) -> RefusedError | None:
        """The refusal of ``batch`` when it is a writer's batch for a (read-only) foreign run."""
        if batch.run in self._runs and not isinstance(batch, ForeignBatch):
            return RefusedError(
                f"run {batch.run!r} is read-only: the server follows it from TensorBoard or "
                "VisualDL files; write to another run name",
                retryable=False,
            )
        return None

    def statistics(self) -> ForeignStatistics:
        """Counts of what was followed so far."""
        return ForeignStatistics(
            runs=len(self._runs),
            files=len(self._sources),
            records=self._records,
            points=self._points,
            damage=self._damage,
            dropped=self._dropped,
            waiting=sum(s.offset < s.size for s in self._sources.values()),
        )

    # -- the task -------------------------------------------------------------------------------

    async def run(self, broker: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Walk the log directory every ``scan`` s and poll the files that grew recently every
        ``poll`` s, ingesting what they append into ``broker``, until cancelled or the broker
        closes."""
        task_status.started()
        next_scan = 0.0
        while True:
            now = time.monotonic()
            walked = now >= next_scan
            if walked:
                await self._walk(broker)
                next_scan = time.monotonic() + self._scan
                sources = list(self._sources.values())
            else:
                sources = [s for s in self._sources.values() if now - s.grew < QUIET]
            if sources:
                chunks, deferred = await trio.to_thread.run_sync(
                    self._read_all, sources, limiter=self._limiter
                )
                # A read capped at READ_BYTES or ROUND_BYTES left more behind: no pause.
                more = deferred or any(c.source.offset < c.end < c.size for c in chunks)
                try:
                    for chunk in chunks:
                        await self._take(broker, chunk)
                except trio.ClosedResourceError:  # the broker closed: serve is shutting down
                    return
                if more:
                    continue
                if walked:  # every file was looked at, none left behind: update statuses
                    try:
                        await self._settle(broker)
                    except trio.ClosedResourceError:
                        return
            active = any(now - s.grew < QUIET for s in self._sources.values())
            await trio.sleep(self._poll if active else max(0.0, next_scan - time.monotonic()))

    def _read_all(self, sources: list[Source]) -> tuple[list[Chunk], bool]:
        """Read what grew, at most :data:`ROUND_BYTES` a round (blocking); returns the chunks
        and whether sources were left for the next round. Each round starts at another source,
        so that one busy file never starves the others."""
        now = time.monotonic()
        out = []
        budget = ROUND_BYTES
        start = self._turn % len(sources)
        self._turn += 1
        for src in sources[start:] + sources[:start]:
            if budget <= 0:
                return out, True
            try:
                st = os.stat(src.path)
                size = st.st_size
                src.mtime = st.st_mtime
            except FileNotFoundError:
                out.append(Chunk(src, None, src.offset, -1))
                continue
            except OSError as exc:
                out.append(Chunk(src, None, src.offset, src.size, exc))
                continue
            if size == src.size and size <= src.offset:
                continue
            budget -= min(max(size - src.offset, 0), READ_BYTES)
            out.append(read_chunk(src, now))
        return out, False

    async def _take(self, broker: Any, chunk: Chunk) -> None:
        src = chunk.source
        if chunk.size == -1:  # the file was removed: its run stays, with what it held
            del self._sources[src.path]
            return
        if chunk.error is not None:
            self._warn(src.path, f"cannot read {self._rel(src.path)}: {chunk.error}")
            return
        if chunk.size > src.size:
            src.grew = time.monotonic()
        src.size = chunk.size
        if chunk.size < src.offset:
            self._warn(
                src.path + ":shrank",
                f"{self._rel(src.path)} shrank below what was read ({src.offset} bytes); "
                "following it from its end",
            )
            src.offset = chunk.size
            return
        block = chunk.block
        if block is None:
            return
        for c in block.corrupt[: max(0, LOGGED_DAMAGE - src.damage)]:
            log.error(
                "vdl-stream: %s: damaged record at byte %d (%d bytes, %s); skipped, the rest "
                "of the file is still followed",
                self._rel(src.path),
                c.offset,
                c.length,
                c.reason,
            )
        src.damage += len(block.corrupt)
        self._damage += len(block.corrupt)
        if chunk.end <= src.offset:
            return
        src.metrics = block.hparam_metrics
        batch, dropped = to_batch(src, block, chunk.end)
        if batch.count():
            try:
                await broker.ingest(batch)
            except RefusedError as exc:  # e.g. the cache disk is full: retried next poll
                self._warn(src.run + ":refused", f"cannot keep run {src.run!r}: {exc.reason}")
                return
        self._warned.discard(src.run + ":refused")
        self._records += block.records
        self._points += batch.count()
        self._dropped += dropped
        src.offset = chunk.end

    async def _walk(self, broker: Any) -> None:
        """Find new foreign directories and files; open the runs of new directories."""
        try:
            found = await trio.to_thread.run_sync(self._list, limiter=self._limiter)
        except OSError as exc:
            self._warn("", f"cannot list the log directory {self.logdir}: {exc}")
            return
        for dirpath, files in found:
            name = run_name(self.logdir, dirpath)
            if name is None:
                self._warn(dirpath, f"{self._rel(dirpath)}: not a valid run name; not shown")
                continue
            if name not in self._runs:
                if name in broker.runs() or name in self._refused:
                    self._refused.add(name)
                    self._warn(
                        dirpath,
                        f"{self._rel(dirpath)} holds TensorBoard/VisualDL files but its name "
                        f"{name!r} is a run of this server; not shown",
                    )
                    continue
                self._runs.add(name)
                if not await self._announce(broker, name, dirpath, {k for _, k, _ in files}):
                    self._runs.discard(name)
                    continue
            for path, kind, writer in files:
                if path in self._sources:
                    continue
                if len(self._sources) >= MAX_FILES:
                    self._warn("max", f"following {MAX_FILES} files already; more are left out")
                    break
                src = Source(path, kind, name, writer, grew=time.monotonic())
                try:
                    src.offset = await broker.written_upto(name, writer)
                except RefusedError as exc:
                    self._warn(name + ":open", f"cannot keep run {name!r}: {exc.reason}")
                    continue
                src.resumed = src.offset > 0
                self._sources[path] = src

    async def _settle(self, broker: Any) -> None:
        """Give each run whose status changed a ``meta`` status record: ``closed`` once all its
        files are read and unchanged for :data:`FINISHED_AFTER` s, ``running`` once one grows
        (run_summary.py turns these into ``finished`` and ``live``)."""
        now = time.time()
        runs: dict[str, bool] = {}
        for src in self._sources.values():
            quiet = (
                src.offset >= src.size
                and src.mtime is not None
                and now - src.mtime > FINISHED_AFTER
            )
            runs[src.run] = runs.get(src.run, True) and quiet
        for name, quiet in runs.items():
            status = CLOSED if quiet else RUNNING
            if self._status.get(name) == status:
                continue
            # Sequence numbers from the clock, so that they keep growing across restarts.
            self._status_seq = max(self._status_seq + 1, int(now * 1000))
            event = {"kind": "meta", "tag": None, "step": None, "wall": now, STATUS_KEY: status}
            batch = ForeignBatch(WRITER_PREFIX + "status", self._status_seq, name, [], [event])
            try:
                await broker.ingest(batch)
            except RefusedError:
                continue  # tried again at the next walk
            self._status[name] = status

    async def _announce(self, broker: Any, name: str, dirpath: str, kinds: set[str]) -> bool:
        """Open a new foreign run and give it, once (the seq makes a resumed run skip it), a
        ``meta`` record saying where it comes from and that it is read-only."""
        writer = WRITER_PREFIX + "meta"
        event = {
            "kind": "meta",
            "tag": None,
            "step": None,
            "wall": time.time(),
            "followed_from": sorted(kinds),
            "source_dir": self._rel(dirpath),
            "read_only": True,
        }
        try:
            if await broker.written_upto(name, writer) == 0:
                await broker.ingest(ForeignBatch(writer, 1, name, [], [event]))
        except RefusedError as exc:
            self._warn(name + ":open", f"cannot keep run {name!r}: {exc.reason}")
            return False
        return True

    def _list(self) -> list[tuple[str, list[tuple[str, str, str]]]]:
        """``(directory, [(file, kind, writer id)])`` of every foreign directory (blocking).

        A directory is listed again only when its modification time changed (an entry was
        added, removed or renamed in it) or when that time was too close to the last listing
        to trust (:data:`RACY_NS`); otherwise one ``stat`` answers for it. A log directory of
        1,000 native runs is walked every :data:`SCAN` s, and listing each run's files and
        matching them took 35-75 ms of the server's GIL a walk.
        """
        out: list[tuple[str, list[tuple[str, str, str]]]] = []
        if not os.path.isdir(self.logdir):
            self._dirs = {}
            return out
        mirror = os.path.abspath(self.mirror)
        seen: dict[str, _Listing] = {}
        stack = [self.logdir]
        while stack:  # depth first, sorted: the order os.walk(topdown=True) with sorted names
            dirpath = stack.pop()
            try:
                mtime = os.stat(dirpath).st_mtime_ns
            except OSError:
                continue
            listing = self._dirs.get(dirpath)
            if listing is None or listing.mtime != mtime or listing.listed - mtime < RACY_NS:
                try:
                    listing = _Listing.of(dirpath, mtime, mirror)
                except OSError:
                    continue
            seen[dirpath] = listing
            stack.extend(reversed(listing.subdirs))
            if listing.native:
                continue
            files = []
            for name, kind in listing.sources:
                path = os.path.join(dirpath, name)
                if path in self._sources:
                    files.append((path, kind, self._sources[path].writer))
                    continue
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):  # (not followed: a link is not a regular file)
                    continue
                files.append((path, kind, _writer_id(path, st)))
            if files:
                out.append((dirpath, files))
        self._dirs = seen
        return out

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.logdir)

    def _warn(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("vdl-stream: %s", message)
