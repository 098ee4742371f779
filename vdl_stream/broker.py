"""The broker: takes batches from writers, persists every one through ``recorder``, fans them out.

One broker owns one log directory. Its data path::

    ingest()  --(bounded channel)-->  persist task  --(to_thread)-->  recorder.RunWriter
       \\--> offer() to every subscriber's own bounded channel (never awaited)

Ingest assigns each batch a broker sequence number and offers the encoded frame to every subscriber
without waiting; a subscriber whose queue is full is marked with a gap and re-syncs from a snapshot.
Persistence runs in its own task, so no browser can hold back durability. Writers are acknowledged
only after their batch is written (and fsynced, when they asked for it with ``sync``).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

import recorder
from recorder import framing
from recorder.catalog import INDEX_NAME, SEGMENT_RE

from . import codec
from .codec import Batch, ScalarColumns

log = logging.getLogger("vdl_stream.broker")

#: Bookkeeping record kind: the last (writer, seq) persisted, so a restarted broker still dedupes.
INGEST_KIND = "ingest"
#: At most this many non-scalar events per (kind, tag) go into a snapshot.
SNAPSHOT_EVENTS = 100
#: Untagged kinds in a snapshot, with their limits: an hour of telemetry at one sample a second.
UNTAGGED_SNAPSHOT = {"telemetry": 3600, "hparams": SNAPSHOT_EVENTS, "meta": SNAPSHOT_EVENTS}
#: Points per tag in the snapshot offered to open pages when a new run appears (the page's default).
SNAPSHOT_POINTS = 2000
#: Default budget for decoded data kept by runs' readers between reads.
DEFAULT_CACHE_BYTES = 128 << 20
#: Default seconds after which an unused reader is closed.
IDLE_CLOSE = 30.0
#: Points decoded at a time when a long tag is downsampled streaming.
STREAM_CHUNK = 1 << 16
#: What a RunReader's in-memory index holds per record (measured on live-cadence runs: the
#: entries, and the part lists of grouped chunks); open readers' indexes have a budget too, so
#: that many open readers are closed, least recently used first.
READER_RECORD_BYTES = 2048
#: Reader threads at a time: reads of different runs overlap, and memory stays bounded.
READ_THREADS = 2


@dataclass(frozen=True)
class SubscriberStatistics:
    """A point-in-time view of one subscriber's queue."""

    depth: int
    peak: int
    capacity: int
    sent: int
    dropped: int
    gaps: int


class Subscriber:
    """One browser's subscription: its own bounded queue of encoded frames, fed without awaiting.

    When the queue is full the *gap* policy applies: further frames are dropped, and once the
    consumer has drained what was queued it receives a ``gap`` message, after which the client
    subscribes again and gets a fresh snapshot.
    """

    def __init__(
        self, runs: set[str] | None, capacity: int, tags: re.Pattern[str] | None = None
    ) -> None:
        self.runs = runs
        self.tags = tags
        self.after_seq = 0
        # run -> the broker seq up to which its snapshot already covers that run
        self.covered: dict[str, int] = {}
        self._capacity = capacity
        self._send, self._receive = trio.open_memory_channel[tuple[int, str | None, bytes]](
            capacity
        )
        self._gap = False
        self._peak = self._sent = self._dropped = self._gaps = 0

    def wants(self, run: str) -> bool:
        """Return whether this subscription covers ``run``."""
        return self.runs is None or run in self.runs

    def select(
        self, scalars: list[ScalarColumns], events: list[dict[str, Any]]
    ) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
        """Keep what the tag pattern matches; events without a tag (telemetry) always pass."""
        if self.tags is None:
            return scalars, events
        search = self.tags.search
        return (
            [c for c in scalars if search(c.tag)],
            [e for e in events if e.get("tag") is None or search(e["tag"])],
        )

    def offer(self, seq: int, run: str | None, frame: bytes) -> None:
        """Queue a frame (about ``run``, or None) if there is room; never blocks.

        On overflow, apply the gap policy.
        """
        if self._gap:
            self._dropped += 1
            return
        try:
            self._send.send_nowait((seq, run, frame))
        except trio.WouldBlock:
            self._gap = True
            self._gaps += 1
            self._dropped += 1
            return
        except trio.ClosedResourceError:
            return
        depth = self._send.statistics().current_buffer_used
        self._peak = max(self._peak, depth)

    async def receive(self) -> bytes:
        """Return the next frame to send: queued data, or a ``gap`` message after an overflow."""
        while True:
            try:
                seq, run, frame = self._receive.receive_nowait()
            except trio.WouldBlock:
                if self._gap:
                    self._gap = False
                    return codec.encode_message({"type": "gap", "seq": self.after_seq})
                seq, run, frame = await self._receive.receive()
            if seq > self.covered.get(run, self.after_seq):  # type: ignore[arg-type]
                self._sent += 1
                return frame

    def close(self) -> None:
        """Stop accepting frames; a pending ``receive`` ends with ``trio.EndOfChannel``."""
        self._send.close()

    def statistics(self) -> SubscriberStatistics:
        """Return queue depth, peak, capacity and sent/dropped/gap counts."""
        return SubscriberStatistics(
            self._send.statistics().current_buffer_used,
            self._peak,
            self._capacity,
            self._sent,
            self._dropped,
            self._gaps,
        )


@dataclass(frozen=True)
class BrokerStatistics:
    """A point-in-time view of the broker: counters and its ingest queue."""

    batches: int
    events: int
    duplicates: int
    seq: int
    written_seq: int
    durable_seq: int
    runs: int
    subscribers: int
    queue_depth: int
    queue_peak: int


@dataclass(frozen=True)
class ReadStatistics:
    """A point-in-time view of the broker's read side.

    Attributes:
        cache_bytes: decoded data held by runs' readers now.
        index_bytes: what the open readers' in-memory indexes hold (an estimate).
        cache_budget: the budget for each (they may pass it until the next trim; the index of
            the most recently used reader is kept whatever its size).
        cache_evictions: readers that dropped their cache to keep the budget.
        readers_open: runs with an open reader (each holds file descriptors).
        followed: runs other processes write, followed by this broker.
        skipped: runs left out because their files cannot be read.
    """

    cache_bytes: int
    index_bytes: int
    cache_budget: int
    cache_evictions: int
    readers_open: int
    followed: int
    skipped: int


class _Run:
    """A run directory: the writer the persist task owns, and a reader for snapshots."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.writer: recorder.RunWriter | None = None
        self.reader: recorder.RunReader | None = None
        self.position: Any = None  # end of what the persist task has flushed
        self.last_seq: dict[str, int] = {}  # writer id -> last accepted seq
        self.persisted_seq: dict[str, int] = {}  # writer id -> last seq handed to the recorder
        self.unsynced = False  # written since its last fsync
        self.loaded = False  # whether last_seq was read back from disk
        self.local = False  # this broker writes it; otherwise another process may, and we follow
        # Read side. One reader serves snapshots, HTTP reads and (for a followed run) the tail; it
        # is closed when idle and reopened at ``position`` (RunReader(limit=position)).
        self.signature: tuple | None = None  # the segment files' names, sizes and mtimes
        self.used = 0.0  # time.monotonic() of the reader's last use
        self.cached = 0  # bytes of decoded data the reader holds, as of its last use
        self.base = 0  # bytes its in-memory index holds, estimated
        self.lock = trio.Lock()  # RunReader is not thread-safe

    def load_ingest_state(self) -> None:
        """Read which writer sequence numbers this run already holds (blocking)."""
        self.loaded = True
        if not self.path.is_dir():
            return
        try:
            reader = recorder.RunReader(self.path)
        except recorder.NotARunError:
            return
        with reader:
            # Each bookkeeping record holds every writer the run has seen: the newest suffices.
            record = reader.last_record(INGEST_KIND)
        if record is not None:
            self.last_seq.update(record.data)
        self.persisted_seq = dict(self.last_seq)


def _thin(items: list, limit: int) -> list:
    """Return at most ``limit`` items evenly spread over ``items``, always keeping the last."""
    if len(items) <= limit:
        return items
    picks = np.linspace(0, len(items) - 1, limit).round().astype(int)
    return [items[i] for i in picks]


def _record_event(record: recorder.Record) -> dict[str, Any]:
    return {
        **record.data,
        "kind": record.kind,
        "tag": record.tag,
        "step": record.step,
        "wall": record.wall,
    }


class Broker:
    """Ingests writer batches for one log directory, persists them and fans them out.

    Args:
        logdir: the directory holding one sub-directory per run.
        sync_interval: fsync dirty runs at least this often, in seconds.
        queue_size: capacity of the ingest queue, in batches; ``ingest`` waits when it is full.
        subscriber_queue: capacity of each subscriber's queue, in frames.
        cache_bytes: the budget, in bytes, for decoded data that runs' readers keep between reads;
            beyond it the least recently used readers drop their caches.
        idle_close: close a run's reader (its file descriptors and cache) after this many seconds
            without a read or new data; it reopens where it stopped when needed.

    Raises:
        ValueError: ``cache_bytes`` or ``idle_close`` is not positive.
    """

    def __init__(
        self,
        logdir: str | Path,
        *,
        sync_interval: float = 1.0,
        queue_size: int = 64,
        subscriber_queue: int = 256,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        idle_close: float = IDLE_CLOSE,
    ) -> None:
        if not isinstance(cache_bytes, int) or cache_bytes <= 0:
            raise ValueError(f"cache_bytes must be a positive int, got {cache_bytes!r}")
        if not idle_close > 0:
            raise ValueError(f"idle_close must be a positive number of seconds, got {idle_close!r}")
        self.logdir = Path(logdir)
        self._sync_interval = sync_interval
        self._subscriber_queue = subscriber_queue
        self._runs: dict[str, _Run] = {}
        self._subscribers: set[Subscriber] = set()
        self._send, self._receive = trio.open_memory_channel[tuple[int, Batch | None, bool]](
            queue_size
        )
        self._seq = self._written_seq = self._durable_seq = 0
        self._progress = trio.Event()
        self._open_lock = trio.Lock()
        self._queue_peak = self._batches = self._events = self._duplicates = 0
        self._limiter = trio.CapacityLimiter(1)
        self._closed = trio.Event()
        # Read side: its own threads, so that a long read never holds back persistence.
        self._read_limiter = trio.CapacityLimiter(READ_THREADS)
        self._cache = _ReadCache(cache_bytes)
        # A downsampled read of a tag whose points would take over a quarter of the budget
        # streams it (24 bytes a point decoded) instead of caching it whole.
        self._stream_over = cache_bytes // (4 * 24)
        self._idle_close = idle_close
        self._ingest_seq = 0  # broker seq of the newest batch ingested (not followed)
        self._following = False  # the first discovery is done: later runs are offered snapshots
        self._skipped: dict[str, tuple | None] = {}  # unreadable run -> its files when skipped
        self._warned: set[str] = set()

    # -- ingest ---------------------------------------------------------------------------------

    async def ingest(self, batch: Batch) -> int:
        """Accept a batch: fan it out and queue it for persistence.

        Waits only while the persistence queue is full. Returns the broker sequence number that
        :meth:`wait_persisted` takes. A batch whose (writer, seq) was already accepted is a
        duplicate from a re-sending writer: it is dropped, and the number returned covers the
        original.
        """
        run = await self._get_run(batch.run)
        last = run.last_seq.get(batch.writer, 0)
        if batch.seq <= last:
            self._duplicates += 1
            if batch.sync:
                await self._send.send((self._seq, None, True))
            return self._seq
        run.last_seq[batch.writer] = batch.seq
        run.local = True
        self._batches += 1
        self._events += batch.count()
        seq = self._fan_out(batch.run, batch.scalars, batch.events)
        self._ingest_seq = seq  # snapshots wait for this to be written; followed data is on disk
        await self._send.send((seq, batch, batch.sync))
        self._queue_peak = max(self._queue_peak, self._send.statistics().current_buffer_used)
        return seq

    def _fan_out(self, run: str, scalars: list[ScalarColumns], events: list[dict[str, Any]]) -> int:
        """Give new data of ``run`` the next broker seq and offer it to every subscriber of it."""
        self._seq += 1
        seq = self._seq
        frames: dict[str | None, bytes | None] = {}  # one encoding per distinct tag pattern
        for sub in self._subscribers:
            if sub.wants(run):
                key = None if sub.tags is None else sub.tags.pattern
                if key not in frames:
                    picked = sub.select(scalars, events)
                    frames[key] = (
                        codec.encode_live("data", seq, run, *picked) if any(picked) else None
                    )
                if frames[key] is not None:
                    sub.offer(seq, run, frames[key])
        return seq

    def _announce(self) -> None:
        """Tell subscribers of every run which runs exist now."""
        names = codec.encode_message({"type": "runs", "runs": sorted(self._runs)})
        for sub in self._subscribers:
            if sub.runs is None:
                sub.offer(self._seq + 1, None, names)

    async def wait_persisted(self, seq: int, *, durable: bool = False) -> None:
        """Return once every batch up to broker sequence ``seq`` is written (and fsynced if durable)."""
        while (self._durable_seq if durable else self._written_seq) < seq:
            await self._progress.wait()

    async def _get_run(self, name: str) -> _Run:
        run = self._runs.get(name)
        if run is not None and run.loaded:
            return run
        async with self._open_lock:
            run = self._runs.get(name)
            if run is None or not run.loaded:
                new = run is None
                run = run or _Run(name, self.logdir / name)
                await trio.to_thread.run_sync(run.load_ingest_state, limiter=self._limiter)
                self._runs[name] = run
                if new:
                    self._announce()
        return run

    # -- persistence ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the persist task until :meth:`close` closes ingest; then flush, fsync and close runs."""
        task_status.started()
        last_sync = time.monotonic()
        done = False
        try:
            while not done:
                items: list[tuple[int, Batch | None, bool]] = []
                with trio.move_on_after(self._sync_interval):
                    try:
                        items.append(await self._receive.receive())
                    except trio.EndOfChannel:
                        done = True
                while not done:
                    try:
                        items.append(self._receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                    except trio.EndOfChannel:
                        done = True
                positions = await trio.to_thread.run_sync(
                    self._persist, items, limiter=self._limiter
                )
                for name, position in positions.items():
                    self._runs[name].position = position
                if items:
                    self._written_seq = max(self._written_seq, max(s for s, _, _ in items))
                    self._wake_waiters()  # written: acknowledge writers that did not ask to sync
                sync = done or any(s for _, _, s in items)
                if sync or time.monotonic() - last_sync >= self._sync_interval:
                    written = self._written_seq
                    await trio.to_thread.run_sync(self._sync_runs, limiter=self._limiter)
                    last_sync = time.monotonic()
                    self._durable_seq = written
                    self._wake_waiters()
        finally:
            # Cancelled or closed: what was accepted but not yet written is written now.
            leftovers = []
            while True:
                try:
                    leftovers.append(self._receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            with trio.move_on_after(10, shield=True):
                await trio.to_thread.run_sync(self._persist, leftovers, limiter=self._limiter)
                await trio.to_thread.run_sync(self._sync_runs, limiter=self._limiter)
                await trio.to_thread.run_sync(self._close_runs, limiter=self._limiter)
            for sub in self._subscribers:
                sub.close()
            self._closed.set()

    async def _discover(self) -> None:
        """Find runs on disk this broker does not know yet, and start following them.

        A run found after the first discovery is offered to current subscribers as a snapshot
        frame, so a page opened before the run began shows its history too. A run that cannot be
        read (a foreign or damaged segment, a symbolic link) is skipped with one warning and
        tried again only once its files change.
        """
        try:
            names = await trio.to_thread.run_sync(
                recorder.list_runs, self.logdir, limiter=self._read_limiter
            )
        except OSError as exc:
            self._warn_once("", f"cannot list the log directory {self.logdir}: {exc}")
            return
        found = []
        for name in names:
            if name in self._runs or self._closed.is_set():
                continue
            run = _Run(name, self.logdir / name)
            async with run.lock:
                try:
                    opened = await trio.to_thread.run_sync(
                        _open_follower, run, self._skipped.get(name, ()), limiter=self._read_limiter
                    )
                except Exception as exc:  # one unreadable run never stops the others
                    self._skip(run, exc)
                    continue
                if not opened or name in self._runs:  # (or this broker started writing it)
                    continue
                self._skipped.pop(name, None)
                self._warned.discard(name)
                self._runs[name] = run
            found.append(run)
        if found:
            self._announce()
            if self._following:
                for run in found:
                    await self._offer_snapshot(run)
                    await self._trim()

    async def follow(
        self,
        interval: float = 1.0,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Every ``interval`` s, discover new runs in the log directory and tail the runs other
        processes write there, fanning out what they append. Returns once the broker is closed.

        Readers unused for ``idle_close`` seconds are closed, so quiet runs hold no file
        descriptors; a closed follower reopens where it stopped once its files change.
        """
        await self._discover()
        self._following = True
        task_status.started()
        while True:
            with trio.move_on_after(interval):
                await self._closed.wait()
            if self._closed.is_set():
                return
            await self._discover()
            await self._tail_all()
            await self._warm_up()

    async def _tail_all(self) -> None:
        """Poll the followed runs whose files changed; close readers that went idle."""
        runs = [r for r in self._runs.values() if not r.local]
        signatures = await trio.to_thread.run_sync(
            _signatures, [r.path for r in runs], limiter=self._read_limiter
        )
        now = time.monotonic()
        for run, signature in zip(runs, signatures, strict=True):
            if self._closed.is_set():
                return
            if signature != run.signature:
                await self._tail(run)
        for run in list(self._runs.values()):
            if run.reader is not None and now - run.used > self._idle_close:
                async with run.lock:
                    if run.reader is not None and time.monotonic() - run.used > self._idle_close:
                        run.reader.close()
                        run.reader = None
                        self._cache.forget(run.name)
        await self._trim()

    async def _warm_up(self) -> None:
        """Open the reader of one followed run not opened yet, the most recently written first,
        while the readers' budget has room (or none is open), so that the first page finds it
        open; discovery itself opens nothing, so that serve starts at once."""
        if self._cache.index >= self._cache.budget and self._cache.sizes:
            return
        waiting = [
            r
            for r in self._runs.values()
            if r.reader is None and r.position is None and not r.local
        ]
        if not waiting:
            return
        run = max(waiting, key=lambda r: max((m for _, _, m in r.signature or ()), default=0))
        async with run.lock:
            if run.reader is not None or self._runs.get(run.name) is not run:
                return
            try:
                await trio.to_thread.run_sync(_open_reader, run, limiter=self._read_limiter)
            except Exception as exc:  # one unreadable run never stops the others
                self._read_failed(run, exc)
                return
            self._cache.update(run)
        await self._trim()

    async def _tail(self, run: _Run) -> None:
        """Read what another process appended to ``run`` and fan it out."""
        async with run.lock:
            if self._runs.get(run.name) is not run or run.local:
                return
            try:
                records = await trio.to_thread.run_sync(_poll, run, limiter=self._read_limiter)
            except Exception as exc:  # one unreadable run never stops the others
                self._read_failed(run, exc)
                return
            # Fanned out under the lock: a snapshot reading this run sees either none or all
            # of it, and covers exactly the seqs given out before it (see snapshot()).
            scalars = [
                ScalarColumns(r.tag, r.data.steps, r.data.walls, r.data.values)
                for r in records
                if r.kind == "scalars"
            ]
            events = [_record_event(r) for r in records if r.kind in codec.EVENT_KINDS]
            if scalars or events:
                self._fan_out(run.name, scalars, events)
            self._cache.update(run)

    async def _offer_snapshot(self, run: _Run) -> None:
        """Offer a snapshot of a newly found ``run`` to the subscribers that want it."""
        if not any(sub.wants(run.name) for sub in self._subscribers):
            return
        async with run.lock:
            try:
                scalars, events = await trio.to_thread.run_sync(
                    _read_snapshot,
                    run,
                    None,
                    SNAPSHOT_POINTS,
                    self._stream_over,
                    limiter=self._read_limiter,
                )
            except Exception as exc:
                self._read_failed(run, exc)
                return
            self._cache.update(run)
            self._seq += 1
            seq = self._seq
            frames: dict[str | None, bytes] = {}
            for sub in self._subscribers:
                if sub.wants(run.name):
                    key = None if sub.tags is None else sub.tags.pattern
                    if key not in frames:
                        picked = sub.select(scalars, events)
                        frames[key] = codec.encode_live("snapshot", seq, run.name, *picked)
                    sub.offer(seq, run.name, frames[key])

    def _skip(self, run: _Run, exc: BaseException) -> None:
        """Stop serving a run whose files cannot be read; warn once, retry when they change."""
        self._skipped[run.name] = run.signature
        if run.reader is not None:
            run.reader.close()
            run.reader = None
        self._cache.forget(run.name)
        if self._runs.get(run.name) is run:
            del self._runs[run.name]
            self._announce()
        self._warn_once(run.name, f"skipping run {run.name!r}: {_describe(exc)}", exc)

    def _read_failed(self, run: _Run, exc: BaseException) -> None:
        """Isolate an error reading one run: a followed run with bad files is skipped; any
        other error is logged once and the run is tried again later."""
        gone = (recorder.NotARunError, FileNotFoundError)  # its directory was removed
        if not run.local and isinstance(exc, (recorder.FormatError, UnreadableRunError, *gone)):
            self._skip(run, exc)
        else:
            self._warn_once(run.name, f"cannot read run {run.name!r}: {_describe(exc)}", exc)

    def _warn_once(self, key: str, message: str, exc: BaseException | None = None) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        # Errors the recorder raises on purpose carry their reason; anything else is a bug,
        # logged with its traceback.
        expected = exc is None or isinstance(exc, (recorder.RecorderError, OSError))
        log.warning("vdl-stream: %s", message, exc_info=None if expected else exc)

    async def _trim(self) -> None:
        """Keep the readers' memory within the budget: drop the decoded data of the least
        recently used readers first; if that is not enough, close them (they reopen where they
        stopped when needed)."""
        for close in (False, True):
            # Decoded data first, then whole readers (their indexes), least recently used first;
            # the most recently used reader stays open even past the budget: closing the one
            # just read would make every read of a run bigger than the budget reopen it.
            victims = self._cache.index_victims() if close else self._cache.data_victims()
            for name in victims:
                run = self._runs.get(name)
                if run is None:
                    self._cache.forget(name)
                    continue
                async with run.lock:
                    if run.reader is None:
                        self._cache.forget(name)
                    elif close:
                        run.reader.close()
                        run.reader = None
                        run.cached = 0
                        self._cache.forget(name)
                        self._cache.evictions += 1
                    else:
                        try:
                            await trio.to_thread.run_sync(
                                _drop_cache, run, limiter=self._read_limiter
                            )
                        except Exception as exc:  # its reader is broken: close it
                            self._read_failed(run, exc)
                            run.reader.close()
                            run.reader = None
                            run.cached = 0
                        self._cache.evicted(run)

    def _wake_waiters(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def _persist(self, items: list[tuple[int, Batch | None, bool]]) -> dict[str, Any]:
        """Append batches to their runs and write them to the OS; runs in a worker thread.

        Returns the new end position of every run written. fsync is :meth:`_sync_runs`'s job, so
        that writers that did not ask for durability are acknowledged without waiting for it.
        """
        touched: dict[str, _Run] = {}
        for _, batch, _ in items:
            if batch is None:
                continue
            run = self._runs[batch.run]
            if run.writer is None:
                # The broker schedules fsync itself (_sync_runs), off the acknowledgement path.
                run.writer = recorder.RunWriter(run.path, sync="never")
            w = run.writer
            for cols in batch.scalars:
                w.append_scalars(cols.tag, cols.steps, cols.walls, cols.values)
            for event in batch.events:
                data = {k: v for k, v in event.items() if k not in ("kind", "tag", "step", "wall")}
                w.append_record(
                    event["kind"], event.get("tag"), event.get("step"), event["wall"], data
                )
            run.persisted_seq[batch.writer] = batch.seq
            touched[run.name] = run
        for run in touched.values():
            # Written after the data it covers, in the same flush, so a restart never skips data;
            # it names only batches handed over here, never ones still queued for persistence.
            run.writer.append_record(INGEST_KIND, None, None, time.time(), dict(run.persisted_seq))
            run.unsynced = True
        return {name: run.writer.flush() for name, run in touched.items()}

    def _sync_runs(self) -> None:
        """fsync every run written since its last fsync; runs in a worker thread."""
        for run in self._runs.values():
            if run.unsynced and run.writer is not None:
                run.writer.sync()
                run.unsynced = False

    def _close_runs(self) -> None:
        for run in self._runs.values():
            if run.writer is not None:
                run.writer.close()
            if run.reader is not None:
                run.reader.close()

    def close(self) -> None:
        """Stop accepting batches. The persist task drains what was accepted, fsyncs and returns."""
        self._send.close()

    async def wait_closed(self) -> None:
        """Return once the persist task has drained, fsynced and closed every run."""
        await self._closed.wait()

    # -- subscribers ----------------------------------------------------------------------------

    def run_path(self, name: str) -> Path:
        """Return the directory of a run the broker knows; ``KeyError`` for any other name."""
        return self._runs[name].path

    def runs(self) -> list[str]:
        """Return the names of the runs the broker knows, sorted."""
        return sorted(self._runs)

    def subscribe(
        self, runs: set[str] | None = None, tags: re.Pattern[str] | None = None
    ) -> Subscriber:
        """Register a subscriber to ``runs`` (None: all) and tags matching ``tags`` (None: all).

        It receives every matching batch ingested from now on.
        """
        sub = Subscriber(runs, self._subscriber_queue, tags)
        sub.after_seq = self._seq
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Remove a subscriber and close its queue."""
        self._subscribers.discard(sub)
        sub.close()

    async def snapshot(self, sub: Subscriber, max_points: int = 2000) -> list[bytes]:
        """Return snapshot frames for a fresh subscriber: every run's history up to now.

        Frames queued for ``sub`` that the snapshot already covers are skipped afterwards. A run
        that cannot be read is left out (and logged once); the others are still sent.
        """
        frames: list[bytes] = []

        async def keep(frame: bytes) -> None:
            frames.append(frame)

        await self.send_snapshot(sub, keep, max_points)
        return frames

    async def send_snapshot(
        self, sub: Subscriber, send: Callable[[bytes], Awaitable[Any]], max_points: int = 2000
    ) -> None:
        """Like :meth:`snapshot`, but hand each run's frame to ``send`` as soon as it is read, so
        a page over many runs draws the first ones while the others are still being read."""
        # Batches ingested before the subscription were never offered to ``sub``: the snapshot
        # must hold them, so wait until they are written. Nothing to wait for when only
        # followed runs moved (what was fanned out of them was on disk already).
        await self.wait_persisted(min(sub.after_seq, self._ingest_seq))
        for name in sorted(self._runs):
            run = self._runs.get(name)
            if run is None or not sub.wants(name):
                continue
            async with run.lock:
                # Under the run's lock its reader's end and the seqs given out for it agree: a
                # followed run's data is fanned out under this lock, and a written run's position
                # moves together with the written seq.
                covered = self._written_seq if run.local else self._seq
                try:
                    scalars, events = await trio.to_thread.run_sync(
                        _read_snapshot,
                        run,
                        run.position,
                        max_points,
                        self._stream_over,
                        limiter=self._read_limiter,
                    )
                except Exception as exc:  # one unreadable run never stops the snapshot
                    self._read_failed(run, exc)
                    continue
                sub.covered[name] = covered
                self._cache.update(run)
            scalars, events = sub.select(scalars, events)
            await send(codec.encode_live("snapshot", covered, name, scalars, events))
            await self._trim()

    async def _read(self, name: str, fn: Any, *args: Any) -> Any:
        """Run ``fn(run, *args)`` on run ``name`` in a reader thread; KeyError for an unknown or
        unreadable run (the error is logged once)."""
        run = self._runs.get(name)
        if run is None:
            raise KeyError(name)
        async with run.lock:
            try:
                result = await trio.to_thread.run_sync(fn, run, *args, limiter=self._read_limiter)
            except (KeyError, ValueError):
                raise
            except recorder.NotARunError:  # a run this broker writes, before its first write
                raise KeyError(name) from None
            except Exception as exc:
                self._read_failed(run, exc)
                raise KeyError(name) from exc
            self._cache.update(run)
        await self._trim()
        return result

    async def read_scalars(
        self, name: str, tag: str, *, start: int | None, end: int | None, max_points: int | None
    ) -> recorder.ScalarSeries:
        """Read one tag of one run from disk, as the HTTP API serves it."""
        return await self._read(name, _read_scalars, tag, start, end, max_points, self._stream_over)

    async def read_events(
        self, name: str, kind: str, tag: str | None = None
    ) -> list[dict[str, Any]]:
        """Read the events of one kind (and tag) of a run from disk, as event maps, in write order."""
        if kind not in codec.EVENT_KINDS:
            raise KeyError(name)
        records = await self._read(name, _read_records, kind, tag)
        return [_record_event(r) for r in records]

    async def tags(self, name: str) -> dict[str, recorder.TagInfo]:
        """Return the tags of a run with their kinds and ranges."""
        return await self._read(name, _read_tags)

    def read_statistics(self) -> ReadStatistics:
        """Return the read side's cache use, open readers and skipped runs; cheap to poll."""
        return ReadStatistics(
            cache_bytes=self._cache.data,
            index_bytes=self._cache.index,
            cache_budget=self._cache.budget,
            cache_evictions=self._cache.evictions,
            readers_open=sum(r.reader is not None for r in self._runs.values()),
            followed=sum(not r.local for r in self._runs.values()),
            skipped=len(self._skipped),
        )

    def statistics(self) -> BrokerStatistics:
        """Return counters and queue depths; cheap enough to poll."""
        return BrokerStatistics(
            self._batches,
            self._events,
            self._duplicates,
            self._seq,
            self._written_seq,
            self._durable_seq,
            len(self._runs),
            len(self._subscribers),
            self._send.statistics().current_buffer_used,
            self._queue_peak,
        )

    def subscriber_statistics(self) -> list[SubscriberStatistics]:
        """Return the statistics of every subscriber."""
        return [s.statistics() for s in self._subscribers]


class UnreadableRunError(recorder.RecorderError):
    """A run directory whose files the broker will not read (a symbolic link or a special file
    where a segment or the index should be)."""


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, recorder.RecorderError) else f"{type(exc).__name__}: {exc}"


class _ReadCache:
    """What each run's open reader holds, in least-recently-used order: decoded data, and the
    in-memory index (estimated); each kind has ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.sizes: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name -> (data, index)
        self.data = 0
        self.index = 0
        self.evictions = 0

    def update(self, run: _Run) -> None:
        """Record that ``run``'s reader was just used; it holds ``run.cached`` and ``run.base``."""
        self._set(run.name, (run.cached, run.base) if run.reader is not None else (0, 0))
        self.sizes.move_to_end(run.name)

    def _set(self, name: str, sizes: tuple[int, int]) -> None:
        data, index = self.sizes.get(name, (0, 0))
        self.data += sizes[0] - data
        self.index += sizes[1] - index
        self.sizes[name] = sizes

    def forget(self, name: str) -> None:
        """The reader of ``name`` is closed (or the run gone)."""
        self._set(name, (0, 0))
        del self.sizes[name]

    def evicted(self, run: _Run) -> None:
        """``run``'s reader dropped its decoded data."""
        self.evictions += 1
        self._set(run.name, (run.cached, run.base) if run.reader is not None else (0, 0))
        self.sizes.move_to_end(run.name, last=False)

    def data_victims(self) -> list[str]:
        """Readers to drop the decoded data of, least recently used first, to fit the budget."""
        return self._victims(0, self.data, None)

    def index_victims(self) -> list[str]:
        """Readers to close, least recently used first, so that the indexes of the others fit
        the budget; never the most recently used one."""
        return self._victims(1, self.index, next(reversed(self.sizes), None))

    def _victims(self, kind: int, used: int, keep: str | None) -> list[str]:
        over = used - self.budget
        out = []
        for name, sizes in self.sizes.items():
            if over <= 0:
                break
            if sizes[kind] and name != keep:
                out.append(name)
                over -= sizes[kind]
        return out


def _measure(run: _Run) -> None:
    """Set ``run.cached``: the decoded data its open reader holds (blocking)."""
    run.cached = 0 if run.reader is None else run.reader.cached_bytes()


def _adopt(run: _Run, reader: recorder.RunReader) -> None:
    """Make ``reader`` the run's reader; estimate what its index holds in memory."""
    run.reader = reader
    run.base = reader.statistics().records * READER_RECORD_BYTES
    run.used = time.monotonic()


def _drop_cache(run: _Run) -> None:
    """Release what ``run``'s reader caches (blocking; hold ``run.lock``)."""
    assert run.reader is not None
    run.reader.drop_cache()
    _measure(run)


def _signature(path: Path) -> tuple:
    """What identifies the state of a run's files: each segment's (and the index's) name, size
    and modification time. Reads no file, opens none.

    Raises:
        UnreadableRunError: a segment or the index is a symbolic link or not a regular file (a
            FIFO would block a reader forever; a link may lead out of the log directory).
    """
    items = []
    with os.scandir(path) as it:
        for item in it:
            if not (SEGMENT_RE.match(item.name) or item.name == INDEX_NAME):
                continue
            if item.is_symlink() or not item.is_file(follow_symlinks=False):
                what = "a symbolic link" if item.is_symlink() else "not a regular file"
                raise UnreadableRunError(f"{path / item.name} is {what}")
            st = item.stat(follow_symlinks=False)
            items.append((item.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(items))


def _signatures(paths: list[Path]) -> list[tuple | None]:
    """:func:`_signature` of each path; None where it cannot be taken (then the run is polled,
    and its error reported there)."""
    out: list[tuple | None] = []
    for path in paths:
        try:
            out.append(_signature(path))
        except (OSError, UnreadableRunError):
            out.append(None)
    return out


def _open_follower(run: _Run, skipped: tuple | None) -> bool:
    """Check a run found on disk (blocking): its files' kinds and segment headers. Reads no
    record and keeps nothing open: its reader opens when a page reads it or its files change.

    Returns False when there is nothing to follow yet, or its files are as they were when it
    was skipped.

    Raises:
        UnreadableRunError, recorder.FormatError: files the broker will not read.
    """
    try:
        signature = _signature(run.path)
    except UnreadableRunError:
        run.signature = None
        if skipped is None:
            return False  # skipped for this reason already: one warning is enough
        raise
    run.signature = signature
    if signature == skipped or not any(SEGMENT_RE.match(name) for name, _, _ in signature):
        return False
    for name, _, _ in signature:
        if SEGMENT_RE.match(name):
            _check_header(run.path / name)
    return True


def _check_header(path: Path) -> None:
    """Check a segment's header (blocking): a foreign file or a newer format is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, even if swapped for a FIFO
    try:
        head = os.pread(fd, framing.HEADER_SIZE, 0)
    finally:
        os.close(fd)
    try:
        if len(head) < framing.HEADER_SIZE:  # being created: what is there must be the magic
            if head != framing.MAGIC[: len(head)]:
                raise framing.HeaderError("wrong magic number: not a vdl-stream recorder file")
        else:
            framing.decode_header(head)
    except framing.HeaderError as exc:
        raise recorder.FormatError(f"{path}: {exc}") from None


def _open_reader(run: _Run, limit: Any = None) -> recorder.RunReader:
    """Return the run's reader, opening it if it was closed (blocking; hold ``run.lock``).

    A run this broker writes is read up to ``limit`` (the position its writer flushed); a
    followed run's reader is advanced only by :func:`_poll`, so everything it has read was
    fanned out.
    """
    if run.reader is None:
        _adopt(run, recorder.RunReader(run.path, limit=run.position if limit is None else limit))
        if run.position is None and not run.local:
            # A followed run read for the first time: what it holds now is history (in the
            # snapshot being read); only what is appended later is fanned out.
            run.position = run.reader.position()
    elif run.local:
        run.reader.refresh(run.position if limit is None else limit)
    run.used = time.monotonic()
    return run.reader


def _poll(run: _Run) -> list[recorder.Record]:
    """Read what was appended to a followed run since the last poll (blocking; hold
    ``run.lock``); reopens a reader closed while idle where it stopped."""
    signature = _signature(run.path)
    reader = _open_reader(run)
    records = reader.poll()
    run.base += len(records) * READER_RECORD_BYTES
    run.signature = signature
    run.position = reader.position()
    _measure(run)
    return records


class _StreamingExtremes:
    """Downsampling in one pass over a series of any length, in memory bounded by ``max_points``.

    Keeps what recorder's downsampling keeps (the first and the last point, and per bucket of
    consecutive points the minimum and the maximum, a NaN being both) without knowing the length
    in advance: buckets start one point wide and double whenever there would be too many.
    """

    def __init__(self, max_points: int) -> None:
        self.buckets = max(1, (max_points - 2) // 2)
        self.size = 1  # points per bucket
        self.n = 0  # points seen
        self.first: tuple | None = None
        self.last: tuple | None = None
        empty = np.empty(0)
        # candidates: global index, step, wall, value
        self.cand = (np.empty(0, np.int64), np.empty(0, np.int64), empty, empty)

    def add(self, steps: np.ndarray, walls: np.ndarray, values: np.ndarray) -> None:
        """Take the next points of the series."""
        k = len(steps)
        if not k:
            return
        g0 = self.n
        if self.first is None:
            self.first = (0, int(steps[0]), float(walls[0]), float(values[0]))
        self.last = (g0 + k - 1, int(steps[-1]), float(walls[-1]), float(values[-1]))
        self.n += k
        # This chunk's extremes per bucket of the current size, by reshaping (padded to whole
        # buckets); a tie with the padding never picks it (the index is clamped to real points).
        size = self.size
        front = g0 % size
        rows = -(-(front + k) // size)
        pad = rows * size - front - k
        picks = []
        for fill, arg in ((np.inf, np.argmin), (-np.inf, np.argmax)):
            grid = np.concatenate([np.full(front, fill), values, np.full(pad, fill)])
            idx = arg(grid.reshape(rows, size), axis=1) + np.arange(rows) * size - front
            picks.append(np.clip(idx, 0, k - 1))
        idx = np.unique(np.concatenate(picks))
        g, st, wa, va = self.cand
        self.cand = (
            np.concatenate([g, idx + g0]),
            np.concatenate([st, steps[idx]]),
            np.concatenate([wa, walls[idx]]),
            np.concatenate([va, values[idx]]),
        )
        self._reduce()

    def _reduce(self) -> None:
        g, st, wa, va = self.cand
        if not len(g):
            return
        while (int(g[-1]) // self.size - int(g[0]) // self.size) >= self.buckets:
            self.size *= 2
        bucket = g // self.size
        nan = np.isnan(va)
        keep = []
        # per bucket the minimum (a NaN first), then the maximum (a NaN first); first occurrence
        for vals in (np.where(nan, -np.inf, va), -np.where(nan, np.inf, va)):
            order = np.lexsort((g, ~nan, vals, bucket))
            b = bucket[order]
            starts = np.flatnonzero(np.concatenate([[True], b[1:] != b[:-1]]))
            keep.append(order[starts])
        sel = np.unique(np.concatenate(keep))
        self.cand = (g[sel], st[sel], wa[sel], va[sel])

    def result(self) -> recorder.ScalarSeries:
        """The points kept, in series order."""
        g, st, wa, va = self.cand
        ends = [p for p in (self.first, self.last) if p is not None]
        if ends:
            g = np.concatenate([g, [p[0] for p in ends]])
            st = np.concatenate([st, np.array([p[1] for p in ends], np.int64)])
            wa = np.concatenate([wa, [p[2] for p in ends]])
            va = np.concatenate([va, [p[3] for p in ends]])
        _, sel = np.unique(g, return_index=True)
        return recorder.ScalarSeries(st[sel].astype(np.int64), wa[sel], va[sel])


def _scalars(
    reader: recorder.RunReader,
    tag: str,
    count: int,
    start: int | None,
    end: int | None,
    max_points: int | None,
    stream_over: int,
) -> recorder.ScalarSeries:
    """Read a tag; a downsampled read of a tag of over ``stream_over`` points streams it chunk
    by chunk instead of caching it whole, so its memory stays bounded however long the run."""
    if max_points is None or count <= stream_over:
        return reader.read_scalars(tag, start=start, end=end, max_points=max_points)
    extremes = _StreamingExtremes(max_points)
    for piece in reader.iter_scalars(tag, start=start, end=end, max_chunk_points=STREAM_CHUNK):
        extremes.add(piece.steps, piece.walls, piece.values)
    return extremes.result()


def _read_snapshot(
    run: _Run, limit: Any, max_points: int, stream_over: int
) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
    """Read a run up to ``limit``, downsampled for drawing (blocking; hold ``run.lock``)."""
    try:
        reader = _open_reader(run, limit)
    except recorder.NotARunError:
        return [], []
    scalars, events = [], []
    for tag, info in reader.tags().items():
        if info.kind == "scalars":
            s = _scalars(reader, tag, info.count, None, None, max_points, stream_over)
            scalars.append(ScalarColumns(tag, s.steps, s.walls, s.values))
        elif info.kind in codec.EVENT_KINDS:
            records = reader.read_records(kind=info.kind, tag=tag)
            events.extend(_record_event(r) for r in _thin(records, SNAPSHOT_EVENTS))
    for kind, limit in UNTAGGED_SNAPSHOT.items():  # events without a tag are not in tags()
        records = [r for r in reader.read_records(kind=kind) if r.tag is None]
        events.extend(_record_event(r) for r in _thin(records, limit))
    events.sort(key=lambda e: e["wall"])
    _measure(run)
    return scalars, events


def _read_scalars(
    run: _Run,
    tag: str,
    start: int | None,
    end: int | None,
    max_points: int | None,
    stream_over: int,
) -> recorder.ScalarSeries:
    reader = _open_reader(run)
    info = reader.tags().get(tag)
    count = 0 if info is None else info.count
    series = _scalars(reader, tag, count, start, end, max_points, stream_over)
    _measure(run)
    return series


def _read_records(run: _Run, kind: str, tag: str | None) -> list[recorder.Record]:
    reader = _open_reader(run)
    records = reader.read_records(kind=kind, tag=tag)
    _measure(run)
    return records


def _read_tags(run: _Run) -> dict[str, recorder.TagInfo]:
    reader = _open_reader(run)
    _measure(run)
    return {
        tag: info
        for tag, info in reader.tags().items()
        if info.kind == "scalars" or info.kind in codec.EVENT_KINDS
    }
