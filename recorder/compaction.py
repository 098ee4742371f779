"""Compaction of a live run: sealed segments of small records become blocks; blocks merge.

The writer (:class:`~recorder.RunWriter`) drives it from ``flush()``/``sync()``: when its current
segment holds ``compact_records`` records it seals it (starts the next segment) and hands it here.
The records are taken from what the writer kept while writing them (no decoding), or read back
from disk for segments an earlier writer left. Four adjacent blocks of one level merge into one of
the next level, up to :data:`MAX_LEVEL`.

Every change is crash-safe the way Prometheus TSDB swaps blocks: the new file is written whole
under a temporary name, fsynced, renamed into place and the directory fsynced; only then are the
files it replaces deleted. Readers take the largest block and ignore files inside it, so at any
moment the directory holds one complete state; a writer reopening the run finishes an interrupted
swap (:meth:`Compactor.recover`).

Threads: the work of a unit (reading, encoding, writing and fsyncing the new block, deleting the
old files) may run in another thread than the writer's appends and flushes. Two locks keep them
apart: :attr:`Compactor.lock` guards only the state the two share (the queue of sealed segments and
the list of blocks), held for a queue operation or the swap of the list, never across I/O; units
themselves are serialised among themselves by a second lock, so a flush that must do compaction work
(past the deferred bound) and a compaction thread never run two units at once.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from recorder import blocks, codec, framing
from recorder.catalog import INDEX_NAME, SEGMENT_RE, segment_name
from recorder.records import FormatError, ScalarSeries

# Blocks of one level merged into one of the next, and the highest level. A level-3 block of a
# run written at the live cadence spans ~20 minutes: about one full chunk per tag.
MERGE_FAN = 4
MAX_LEVEL = 3
# Blocks are merged only while the inputs stay below this many bytes (bounds a flush's work).
MERGE_MAX_BYTES = 128 << 20
# A sealed segment is compacted when it holds at least this many records, averaging less than
# SMALL_RECORD bytes: segments of large chunks (a bulk load) are already what compaction makes.
MIN_RECORDS = 32
SMALL_RECORD = 64 << 10
TMP_SUFFIX = ".tmp"


class SegmentCapture:
    """What a writer wrote into one segment, kept for compacting it without reading it back."""

    __slots__ = ("complete", "items", "number")

    def __init__(self, number: int, complete: bool = True) -> None:
        self.number = number
        self.complete = complete  # False: the segment holds records of an earlier writer
        self.items: list = []  # (end offset, entry fields, payload or [(tag, s, w, v)])

    def add(self, items: list) -> None:
        """Keep the records just written."""
        self.items.extend(items)


class Compactor:
    """Compaction state of one run directory, owned by its writer.

    :meth:`seal` and :meth:`backlog` (the writer's side) and :meth:`step` (one unit, from any
    thread) may be called concurrently; a unit holds :attr:`lock` only to take its work from the
    queue and to publish its new block, so the writer never waits for a unit's I/O. :meth:`run`
    and :meth:`shut` are the owner's.

    Args:
        run_dir: the run directory.
        dir_fd: a descriptor of it (for fsync).
        created: segment number -> creation time (the writer's map, kept up to date by it).
        min_records: a sealed segment with fewer records is left as it is.
    """

    def __init__(
        self, run_dir: str, dir_fd: int, created: dict[int, float], min_records: int = MIN_RECORDS
    ) -> None:
        self.run_dir = run_dir
        self.min_records = min_records
        self.dir_fd = dir_fd
        self.created = created
        self.blocks: list[list[int]] = []  # [first, last, level, bytes], in segment order
        self.pending: list[tuple[int, int, int, SegmentCapture | None]] = []
        self.compactions = 0
        self.merges = 0
        self.seconds = 0.0  # CPU time spent compacting (process time)
        self.unmergeable: set[tuple[int, int]] = set()
        # Blocks an older writer left without level-of-detail summaries: one gets them per run.
        self.unsummarised: list[str] = []
        # Test hook: called with a stage name at each step of a swap ("written", "renamed",
        # "removed"), so tests can kill the process between them.
        self.hook: Callable[[str], None] | None = None
        # The state shared with the writer's thread (pending, blocks): held briefly, never
        # across I/O. Units are serialised by _unit; past shut() no unit starts.
        self.lock = threading.Lock()
        self._unit = threading.Lock()
        self.closed = False

    # -- recovery -------------------------------------------------------------------------------

    def recover(self) -> None:
        """Finish what a killed writer left: delete temporary files, and files a block covers
        (the block is complete: it was renamed into place only once written and fsynced)."""
        names = os.listdir(self.run_dir)
        found = {}
        for name in names:
            if name.endswith(TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.run_dir, name))
                continue
            rng = blocks.parse_block_name(name)
            if rng is not None:
                found[name] = rng
        chosen: list[tuple[int, int, str]] = []
        stale = []
        for name, (a, b) in sorted(found.items(), key=lambda kv: (kv[1][0], -kv[1][1])):
            if chosen and a <= chosen[-1][1]:
                stale.append(name)
            else:
                chosen.append((a, b, name))
        for name in names:
            match = SEGMENT_RE.match(name)
            if match and any(a <= int(match.group(1)) <= b for a, b, _ in chosen):
                stale.append(name)
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.run_dir, name))
        if stale:
            os.fsync(self.dir_fd)
        for a, b, name in chosen:
            path = os.path.join(self.run_dir, name)
            fd = os.open(path, os.O_RDONLY)
            try:
                footer = blocks.read_footer(fd)
            except blocks.BlockError as exc:
                raise FormatError(f"{path}: {exc}") from None
            finally:
                os.close(fd)
            self.blocks.append([a, b, footer.level, os.path.getsize(path)])
            if blocks.LOD_SLICE is not None and not blocks.has_summaries(footer):
                self.unsummarised.append(name)

    def seal(self, number: int, size: int, records: int, capture: SegmentCapture | None) -> None:
        """Queue a sealed segment (no record will be appended to it) for compaction."""
        with self.lock:
            self.pending.append((number, size, records, capture))

    def shut(self) -> None:
        """Wait for a unit under way in another thread, and let :meth:`step` start no more (the
        owner is closing: its descriptors go next). :meth:`run` stays the owner's to call."""
        with self._unit:
            self.closed = True

    # -- running --------------------------------------------------------------------------------

    def run(self) -> None:
        """Compact the queued sealed segments, then merge blocks while a level is full (the
        owner's thread; waits for a unit another thread has under way)."""
        with self._unit:
            unit = self._claim(take=True)
            if unit is None:
                return
            start = time.thread_time()
            try:
                while unit is not None:
                    self._do(unit)
                    unit = self._claim(take=True)
                self._summarise_one()
            finally:
                self.seconds += time.thread_time() - start

    def step(self, wait: bool = True) -> bool:
        """Do one unit of the queued work: compact one sealed segment, else merge one full group
        of blocks, else give one block its summaries; return whether any work was done.

        Safe to call from another thread than the writer's while it appends and flushes: the
        unit reads, encodes and fsyncs without :attr:`lock`, which it holds only to take its work
        and to swap in its block. Each unit is one crash-safe swap (:meth:`_install`), the same
        as :meth:`run` makes, so stopping between units leaves the run in a state :meth:`run`
        could have left too.

        Args:
            wait: whether to wait for a unit another thread has under way; False: return False
                at once then.
        """
        if not self._unit.acquire(blocking=wait):
            return False
        try:
            if self.closed:
                return False
            start = time.thread_time()  # this thread's CPU: another may be writing meanwhile
            try:
                unit = self._claim(take=True)
                if unit is not None:
                    self._do(unit)
                    return True
                return self._summarise_one()
            finally:
                self.seconds += time.thread_time() - start
        finally:
            self._unit.release()

    def _claim(self, take: bool = False) -> tuple | None:
        """The next unit, ``("sealed", (number, size, records, capture))`` (oldest first; taken
        off the queue if ``take``) or ``("merge", group)``, or None (under :attr:`lock`)."""
        with self.lock:
            if self.pending:
                return ("sealed", self.pending.pop(0) if take else self.pending[0])
            group = self._full_group()
            return None if group is None else ("merge", group)

    def _do(self, unit: tuple) -> None:
        kind, work = unit
        if kind == "sealed":
            # Compacted or (few or large records) let be: either way a unit, so a flush over the
            # deferred bound does no more than it must.
            self._compact_sealed(*work)
        else:
            self._merge(work)

    def backlog(self) -> int:
        """Units of work queued: sealed segments waiting, plus full groups of blocks waiting to
        merge (counted without overlap, one level at a time). A unit under way is not counted."""
        with self.lock:
            return len(self.pending) + sum(1 for _ in self._full_groups())

    def _summarise_one(self) -> bool:
        """Give one block an older writer left its summaries (a resumed run catches up one block
        per compaction, so no flush does more than one block's work for it); return whether one
        was rewritten."""
        live = {blocks.block_name(b[0], b[1]) for b in self.blocks}
        while self.unsummarised:
            name = self.unsummarised.pop()
            if name not in live:
                continue  # merged meanwhile: the merged block has them
            size = rewrite_with_summaries(self.run_dir, name, self.dir_fd)
            if size is not None:
                with self.lock:
                    self.blocks = [
                        [*b[:3], size] if blocks.block_name(b[0], b[1]) == name else b
                        for b in self.blocks
                    ]
            return True
        return False

    def _compact_sealed(
        self, number: int, size: int, records: int, capture: SegmentCapture | None
    ) -> None:
        """Compact a sealed segment taken from :attr:`pending`, unless it holds few or large
        records (then it is left as it is)."""
        if records < self.min_records or size > SMALL_RECORD * records:
            return
        self._compact_segment(number, size, capture)

    def _compact_segment(self, number: int, size: int, capture: SegmentCapture | None) -> None:
        segments = [[number, self.created[number], size]]
        builder = blocks.BlockBuilder(segments)
        if capture is not None and capture.complete:
            _feed_capture(builder, capture)
        elif not _feed_segment(builder, os.path.join(self.run_dir, segment_name(number)), size):
            return  # damaged: left for readers to report
        nbytes = self._install(builder, number, number, 0, [segment_name(number)])
        with self.lock:  # a new list: the writer's thread may be reading the old one
            self.blocks = sorted([*self.blocks, [number, number, 0, nbytes]])
        self.compactions += 1

    def _full_group(self) -> list[list[int]] | None:
        """The first group :meth:`_full_groups` finds, or None."""
        return next(self._full_groups(), None)

    def _full_groups(self) -> Iterator[list[list[int]]]:
        """Groups of ``MERGE_FAN`` adjacent blocks of one level below ``MAX_LEVEL`` within
        ``MERGE_MAX_BYTES``, in order and without overlap (a group too large is passed over)."""
        run: list[list[int]] = []
        for block in self.blocks:
            if (
                run
                and run[-1][1] + 1 == block[0]
                and run[-1][2] == block[2]
                and (run[-1][0], run[-1][1]) not in self.unmergeable
            ):
                run.append(block)
            else:
                run = [block]
            if len(run) == MERGE_FAN and block[2] < MAX_LEVEL:
                if sum(b[3] for b in run) <= MERGE_MAX_BYTES:
                    yield run
                run = []

    def _merge(self, group: list[list[int]]) -> None:
        footers = []
        for first, last, _, _ in group:
            path = os.path.join(self.run_dir, blocks.block_name(first, last))
            fd = os.open(path, os.O_RDONLY)
            footers.append((fd, blocks.read_footer(fd)))
        try:
            segments = [s for _, f in footers for s in f.segments]
            builder = blocks.BlockBuilder(segments)
            ok = all(
                _feed_block(builder, fd, footer, int(builder.origins.bases[i]))
                for (fd, footer), i in zip(footers, _first_indexes(footers), strict=True)
            )
        finally:
            for fd, _ in footers:
                os.close(fd)
        if not ok:
            for first, last, _, _ in group:
                self.unmergeable.add((first, last))
            return
        first, last, level = group[0][0], group[-1][1], group[0][2] + 1
        old = [blocks.block_name(b[0], b[1]) for b in group]
        nbytes = self._install(builder, first, last, level, old)
        with self.lock:
            kept = [b for b in self.blocks if b not in group]
            self.blocks = sorted([*kept, [first, last, level, nbytes]])
        self.merges += 1

    def _install(
        self, builder: blocks.BlockBuilder, first: int, last: int, level: int, old: list[str]
    ) -> int:
        """Write a block crash-safely, then delete the files it replaces; return its size."""
        name = blocks.block_name(first, last)
        path = os.path.join(self.run_dir, name)
        tmp = path + TMP_SUFFIX
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            size = builder.write(fd, level, time.time())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        self._stage("written")
        os.replace(tmp, path)
        os.fsync(self.dir_fd)  # the block is in place, durably, before anything goes
        self._stage("renamed")
        # The index lists segments a block now replaces: it would be stale. A closing writer
        # writes none while the run has blocks (their footers are its index).
        for victim in [*old, INDEX_NAME]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.run_dir, victim))
            if victim != INDEX_NAME:
                self._stage("removing")
        os.fsync(self.dir_fd)
        self._stage("removed")
        return size

    def _stage(self, name: str) -> None:
        if self.hook is not None:
            self.hook(name)


def rewrite_with_summaries(run_dir: str, name: str, dir_fd: int) -> int | None:
    """Rewrite the block ``name`` with level-of-detail summaries, crash-safely (a new file under
    a temporary name, fsynced, renamed over the old one, directory fsynced); return its new size,
    or None when it has them already or is damaged (left as it is). The caller holds the run's
    lock. The points, events and origins stay the same; readers that had the old file notice a
    different file under the name and read the new one."""
    path = os.path.join(run_dir, name)
    fd = os.open(path, os.O_RDONLY)
    try:
        footer = blocks.read_footer(fd)
        if blocks.has_summaries(footer):
            return None
        builder = blocks.BlockBuilder(footer.segments)
        if not _feed_block(builder, fd, footer, 0):
            return None
    except blocks.BlockError:
        return None
    finally:
        os.close(fd)
    tmp = path + TMP_SUFFIX
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        size = builder.write(out, footer.level, footer.created)
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(out)
    os.replace(tmp, path)
    os.fsync(dir_fd)
    return size


def add_summaries(run_dir: str | os.PathLike[str]) -> int:
    """Give every block of a run written before level-of-detail summaries existed its summaries
    (what a writer resuming the run does one block per compaction); return how many blocks were
    rewritten. Readers may be reading the run meanwhile.

    Raises:
        RunLockedError: a writer holds the run.
        NotADirectoryError: ``run_dir`` is not a directory.
    """
    from recorder.writer import lock_run, unlock_run  # the writer imports this module

    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise NotADirectoryError(f"run_dir is not a directory: {run_dir!r}")
    lock = lock_run(run_dir)
    try:
        dir_fd = os.open(run_dir, os.O_RDONLY)
        try:
            done = 0
            for name in sorted(os.listdir(run_dir)):
                if blocks.parse_block_name(name) is not None:
                    done += rewrite_with_summaries(run_dir, name, dir_fd) is not None
            return done
        finally:
            os.close(dir_fd)
    finally:
        unlock_run(lock)


def _first_indexes(footers: list) -> list[int]:
    out, k = [], 0
    for _, footer in footers:
        out.append(k)
        k += len(footer.segments)
    return out


def _feed_capture(builder: blocks.BlockBuilder, capture: SegmentCapture) -> None:
    tags: list[str] = []
    counts: list[list[int]] = []
    ends: list[int] = []
    cols: tuple[list, list, list] = ([], [], [])
    for end, fields, data in capture.items:
        if isinstance(data, tuple):  # scalar points: (tags, counts, steps, walls, values)
            tags.extend(data[0])
            counts.append(data[1])
            ends.append(end)
            for col, arr in zip(cols, data[2:], strict=True):
                col.append(arr)
        else:
            kind, tag, step, wall = fields[:4]
            builder.add_event(kind, tag, step, wall, data, end)
    if not tags:
        return
    part_counts = np.fromiter((c for cs in counts for c in cs), np.int64, len(tags))
    part_ends = np.repeat(np.array(ends, np.int64), [len(cs) for cs in counts])
    steps, walls, values = (np.concatenate(col) for col in cols)
    names = sorted(set(tags))
    index = {name: i for i, name in enumerate(names)}
    part_tags = np.fromiter((index[t] for t in tags), np.int64, len(tags))
    point_tags = np.repeat(part_tags, part_counts)
    for i, name in enumerate(names):
        parts = part_tags == i
        points = point_tags == i
        builder.add_scalars(
            name,
            ScalarSeries(steps[points], walls[points], values[points]),
            part_counts[parts],
            part_ends[parts],
        )


def _add_pieces(builder: blocks.BlockBuilder, tag: str, pieces: list) -> None:
    counts = np.array([len(p[0]) for p in pieces], np.int64)
    origins = np.array([p[3] for p in pieces], np.int64)
    series = ScalarSeries(*(np.concatenate([p[i] for p in pieces]) for i in range(3)))
    builder.add_scalars(tag, series, counts, origins)


def _feed_segment(builder: blocks.BlockBuilder, path: str, size: int) -> bool:
    """Feed the records of a sealed segment read from disk; False if any is damaged."""
    with open(path, "rb") as f:
        data = f.read(size)
    try:
        framing.decode_header(data[: framing.HEADER_SIZE])
    except framing.HeaderError:
        return False
    scan = framing.scan_frames(data, framing.HEADER_SIZE, sealed=True)
    if scan.damaged or scan.end != len(data):
        return False
    per_tag: dict[str, list] = {}
    for offset, length in scan.frames:
        payload = framing.payload_of(data, offset, length)
        end = offset + framing.FRAME_OVERHEAD + length
        try:
            kind, tag, step, wall, body = codec.decode_payload(payload)
            if kind == codec.SCALARS:
                series = codec.decode_scalars(body)
                if tag is None:
                    bounds = np.cumsum([0, *body["c"]]).tolist()
                    for t, lo, hi in zip(body["tags"], bounds[:-1], bounds[1:], strict=True):
                        cols = (series.steps[lo:hi], series.walls[lo:hi], series.values[lo:hi])
                        per_tag.setdefault(t, []).append((*cols, end))
                else:
                    per_tag.setdefault(tag, []).append((*series, end))
            else:
                builder.add_event(kind, tag, step, wall, bytes(payload), end)
        except codec.PayloadError:
            return False
    for tag, pieces in per_tag.items():
        _add_pieces(builder, tag, pieces)
    return True


def _feed_block(builder: blocks.BlockBuilder, fd: int, footer: blocks.Footer, shift: int) -> bool:
    """Feed the records of a block (origins shifted into the merged block's); False if damaged."""
    c, ev = footer.chunks, footer.events
    try:
        for i in range(len(c["offset"])):
            data = _read_record(fd, c["offset"][i], c["length"][i])
            if data is None:
                return False
            series = codec.decode_scalars(data)
            counts, origins = blocks.chunk_origins(data)
            builder.add_scalars(c["tag"][i], series, counts, origins + shift)
        for i in range(len(ev["offset"])):
            data = _read_record(fd, ev["offset"][i], ev["length"][i])
            if data is None:
                return False
            n = data["n"]
            origins = codec.decode_ints(data["oo"], n).tolist()
            steps, walls = data["st"], np.frombuffer(data["wl"], "<f8").tolist()
            if not (len(data["p"]) == len(steps) == len(walls) == n):
                return False
            kind, tag = data["kind"], ev["tag"][i]
            for payload, step, wall, origin in zip(data["p"], steps, walls, origins, strict=True):
                builder.add_event(kind, tag, step, wall, payload, origin + shift)
    except (codec.PayloadError, KeyError, TypeError):
        return False
    return True


def _read_record(fd: int, offset: int, length: int) -> dict | None:
    payload = framing.check_frame(os.pread(fd, framing.FRAME_OVERHEAD + length, offset))
    if payload is None:
        return None
    return codec.decode_payload(payload)[4]
