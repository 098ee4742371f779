"""The broker: takes batches from writers, persists every one through ``recorder``, fans them out.

One broker owns one log directory. Its data path::

    ingest()  --(bounded channel)-->  persist task  --(to_thread)-->  recorder.RunWriter
       \\--(INLINE_WRITE_BYTES, off by default: a small batch, nothing queued: ingest)--/
       \\--> offer() to every subscriber's own bounded channel (never awaited)
    compaction task  --(to_thread, its own limiter)-->  RunWriter.compact()  (beside the writes)
                                   \\--(a pipe)-->  recorder.CompactionProcess (builds the blocks)

Ingest assigns each batch a broker sequence number and offers the encoded frame to every subscriber
without waiting; a subscriber whose queue is full is marked with a gap and re-syncs from a snapshot.
Persistence runs in its own task, so no browser can hold back durability. Writers are acknowledged
only after their batch is written (and fsynced, when they asked for it with ``sync``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import operator
import os
import re
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

import recorder
from recorder import framing
from recorder.blocks import BLOCK_RE
from recorder.catalog import INDEX_NAME, SEGMENT_RE
from recorder.digest import data_files, load_digest
from recorder.reader_pool import prefetch, usable_cores
from recorder.writer import GROUP_BELOW

from . import codec, following
from .alerts import ALERTS_WRITER, AlertEngine
from .codec import RESERVED_TAG_PREFIX, Batch, ScalarColumns
from .errors import RefusedError
from .run_summary import CRASH_AFTER, RunSummary, summaries_frame
from .telemetry import legacy_view

log = logging.getLogger("vdl_stream.broker")

#: Bookkeeping record kind: the last (writer, seq) persisted, so a restarted broker still dedupes.
INGEST_KIND = "ingest"
#: At most this many non-scalar events per (kind, tag) go into a snapshot.
SNAPSHOT_EVENTS = 100
#: Embeddings per tag in a snapshot: each is read whole (megabytes), though browsers get only
#: its description (codec.encode_live) and fetch the one they show from /api/blob.
SNAPSHOT_EMBEDDINGS = 20
#: Untagged kinds in a snapshot, with their limits: an hour of telemetry at one sample a second.
UNTAGGED_SNAPSHOT = {"telemetry": 3600, "hparams": SNAPSHOT_EVENTS, "meta": SNAPSHOT_EVENTS}
#: Alerts (untagged: a tag holds one kind) in a snapshot: the per-run rate limit keeps them few.
UNTAGGED_SNAPSHOT["alert"] = 10 * SNAPSHOT_EVENTS
#: Points per tag in the snapshot offered to open pages when a new run appears (the page's default).
SNAPSHOT_POINTS = 2000
#: Snapshot frames read ahead of the one being sent (``Broker.send_snapshot``).
SNAPSHOT_AHEAD = 2
#: Runs whose snapshots are read at once for one subscription (``Broker.send_snapshot``): their
#: reads overlap in the reader threads (``READ_THREADS``: file reads, numpy and zlib release the
#: GIL) and with encoding and sending on the event loop.
SNAPSHOT_RUNS = 3
#: A subscription sending snapshots of more runs than this gets each of them whole (one frame,
#: read in one reader-thread hand-off), even when it asked for ``split``: a page redraws at most
#: once a second while that many runs load (ui/src/app.js, ``SELECT_ALL_UP_TO``), so a run's
#: scalars going ahead of its events would not be drawn sooner, and the second hand-off, frame
#: and message of each run cost the server and the page (docs/protocol.md, "split").
SPLIT_RUNS_UP_TO = 20
#: Default budget for decoded data kept by runs' readers between reads.
DEFAULT_CACHE_BYTES = 128 << 20
#: Default seconds after which an unused reader is closed.
IDLE_CLOSE = 30.0
#: What a RunReader's in-memory index holds per record (measured on live-cadence runs: the
#: entries, and the part lists of grouped chunks); open readers' indexes have a budget too, so
#: that many open readers are closed, least recently used first.
READER_RECORD_BYTES = 2048
#: Reader threads at a time: reads of different runs overlap, and memory stays bounded.
READ_THREADS = 2
#: The most processes ``serve`` reads the scalars of snapshots sent whole with (``Broker``'s
#: ``read_processes``); how many it starts: :func:`default_read_processes`.
READ_PROCESSES = 2
#: The reader processes start once no snapshot has been read or sent for this many seconds
#: after the first one over a sweep, or at once when a subscription of many runs (sent whole:
#: what they read) begins. A page's first chart is drawn while the browser decodes the first
#: snapshots: the processes' imports (0.3-0.4 s of CPU each, NumPy most of it) started right
#: after them competed with it for a small machine's cores (docs/performance.md, h6-cold).
POOL_START_QUIET = 1.0
#: A persist flush of one run is cut after this many bytes of batches, each part with its own
#: bookkeeping record, so the recorder never writes a part of a flush on its own (its buffer
#: writes itself out past 32 MiB).
FLUSH_BYTES = 16 << 20
#: The recorder's own segment limit for the broker's writers: never reached; the broker starts
#: new segments itself, between flushes.
NO_ROTATION = 1 << 62
#: A batch of at most this many bytes (:func:`_batch_bytes`), to a run whose writer is open,
#: with no segment to start and no compaction waiting, is written by ``ingest`` itself when
#: nothing queued before it is unwritten, rather than through the persist task's worker
#: thread (Broker._write_now). Anything that may block longer (opening a run, starting a
#: segment, fsync, compaction, bus leases) stays in the thread. 0 (the default): off. In
#: process it halves ``ingest -> written`` and cuts the CPU a small batch costs 0.55x; served
#: at 10k events/s to 10 subscribers (five alternated pairs, load 3.4-4.5) the p50 did not move
#: (medians 17.3 against 19.0 ms) while the server's event loop took the writes' CPU, and the
#: p99 was higher in 4 of 5 pairs: the decision wants a quiet machine (docs/performance.md,
#: "(2026-12-01, h4-persist)"); 64 << 10 is the value measured.
INLINE_WRITE_BYTES = 0
#: A refusal of the same run for the same reason is logged at most once in this many seconds.
LOG_INTERVAL = 10.0
#: Seconds of compaction units the compaction thread does for one run before turning to the
#: next (units are never split): one run's long backlog does not keep the others waiting, and a
#: run's units follow one another in one thread call, so its flushes rarely find them paused.
COMPACT_TURN = 0.25
#: Refusals remembered for waiters that ask after the fact, by broker seq (oldest forgotten).
REFUSALS_KEPT = 65536
#: Notices kept for writers that have not sent a batch since (each was logged as well): at most
#: this many writers, the oldest dropped first, and :data:`NOTICES_PER_WRITER` a writer.
NOTICE_WRITERS = 1024
NOTICES_PER_WRITER = 8
#: Series of a run whose writers are watched for two at once (:meth:`Broker._check_shared`); the
#: series a run gets past this many are not watched, so a hostile writer's endless new tags
#: cost a bounded memory (about 100 bytes a series).
WATCHED_SERIES = 4096
#: Changed run summaries are published to every subscriber at most this often, in seconds.
SUMMARY_INTERVAL = 1.0
#: Seconds an ingested batch waits for room in the persist queue even when its connection
#: closes meanwhile (see :meth:`Broker.ingest`).
ENQUEUE_SHIELD = 60.0
#: Runs whose summary is a placeholder (no current digest) read per follow round, at most.
SUMMARY_FILLS = 8


def default_open_writers() -> int:
    """A quarter of the process's open-file limit, between 8 and 4,096.

    A ``RunWriter`` holds three descriptors (the directory, the open segment, the lock file), so
    at the bound writers take three quarters of the limit: enough for as many live runs as the
    server takes writer connections under ``ulimit -n 1024``. Should the process still run out
    of descriptors, the broker closes half of its writers and refuses (retryable) the batches
    it could not write.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(8, min(4096, soft // 4))


def default_read_processes(cores: int | None = None) -> int:
    """The reader processes ``serve`` starts: the cores it may run on less two, at most
    :data:`READ_PROCESSES`; none on a machine of two cores.

    A reader process pays for a run's scalars with more CPU than the server's own reader threads
    (it opens the run again and answers through a pipe): on two cores, through ``serve``, 0.99 and
    1.07 s of the server's CPU per selection of 100 unread runs with two processes against 0.69
    and 0.85 s without (docs/performance.md, h9-snap). That only pays where a core is free beside
    the event loop's process and a browser on the same machine; on two cores the page's
    selection keeps both busy.

    Args:
        cores: the cores to count; None: those this process may run on.
    """
    if cores is None:
        cores = usable_cores()
    return max(0, min(READ_PROCESSES, cores - 2))


class SubscriberLimitError(RuntimeError):
    """The broker already serves its maximum number of subscribers; try again later."""


def refusal_for(exc: BaseException) -> RefusedError:
    """Turn an error from persisting or opening a run into a :class:`RefusedError`.

    The reason is one line for a remote user and never names a server path. Causes that can go
    away by themselves or by an operator's hand (a full disk, too many open files, a run another
    process writes, permissions) are retryable; names the file system or the record format can
    never hold are not.
    """
    if isinstance(exc, recorder.RunLockedError) or (
        type(exc) is recorder.RecorderError and "already open" in str(exc)
    ):
        return RefusedError("the run is being written by another process", retryable=True)
    if isinstance(exc, (recorder.NotARunError, recorder.FormatError, IsADirectoryError)):
        return RefusedError(
            "the run name clashes with a file of the record format, or the run's files are "
            "not readable segments",
            retryable=False,
        )
    if isinstance(exc, OSError):
        code = exc.errno
        if code in (errno.ENOSPC, errno.EDQUOT):
            return RefusedError("disk full on the server (no space left)", retryable=True)
        if code in (errno.EMFILE, errno.ENFILE):
            return RefusedError("the server has too many open files", retryable=True)
        if code == errno.ENAMETOOLONG:
            return RefusedError(
                "the run name is too long for the server's file system (255 bytes a part)",
                retryable=False,
            )
        if code in (errno.ENOTDIR, errno.EEXIST):
            return RefusedError(
                "the run name clashes with a file in the log directory", retryable=False
            )
        if code in (errno.EACCES, errno.EPERM, errno.EROFS):
            return RefusedError(
                "the server may not write the run (permission denied or read-only)",
                retryable=True,
            )
        return RefusedError(
            f"the server cannot write the run: {exc.strerror or code}", retryable=True
        )
    return RefusedError(
        f"the server cannot record the batch: {type(exc).__name__}", retryable=False
    )


@dataclass(frozen=True)
class SubscriberStatistics:
    """A point-in-time view of one subscriber's queue."""

    depth: int
    peak: int
    capacity: int
    sent: int
    dropped: int
    gaps: int
    bytes: int = 0
    peak_bytes: int = 0
    capacity_bytes: int = 0
    #: data frames folded into coalesced ``data`` frames (the queue was full when they came)
    coalesced: int = 0
    #: bytes (of the frames folded, and of frames about no run) held for later now
    held_bytes: int = 0
    #: of ``gaps``, those of named runs only (a ``gap`` with ``runs``): the others went on
    run_gaps: int = 0
    #: frames about no run (``runs``, ``summaries``) held while the queue was full
    side_frames: int = 0
    #: of ``sent``, frames written by :meth:`Subscriber.offer` itself through ``direct`` (the
    #: consumer was idle), without passing through the queue
    written_at_offer: int = 0


#: Frames about no run (``runs``, ``summaries``: about one a second) a full subscriber holds for
#: later, at most; past that it is sent a ``gap`` of every run.
SIDE_FRAMES = 64
#: :attr:`Subscriber.snapshots` value of a run that reached the client whole as ``data`` frames
#: from its first batch: as good as a snapshot of any size.
WHOLE = 1 << 62


class Subscriber:
    """One browser's subscription: its own bounded queue of encoded frames, fed without awaiting.

    The queue is bounded twice: in frames (``capacity``) and in bytes (``capacity_bytes``; a
    frame larger than that is still taken into an empty queue, so one large event cannot stop a
    subscriber for good). When either bound would be passed, a ``data`` frame offered with its
    data is *coalesced*: the data is held (its arrays are shared, not copied), and once the
    consumer has drained the queue it gets one ``data`` frame per run holding every batch held
    for that run, in order, under the newest of their seqs (batches a snapshot covers since are
    left out). A run with data held has its later frames held too, so its order never changes.
    A frame about no run (``runs``, ``summaries``) that finds the queue full is held as it is
    (at most :data:`SIDE_FRAMES`), and goes before the coalesced data; while one is held, every
    ``data`` frame is held too, so a ``runs`` frame still comes before the data of a new run.
    Indeed while anything is held (or a ``gap`` is pending) every frame is held, so the queue
    drains however busy the other runs are, and then the consumer gets few, large frames. What
    is held is bounded by ``capacity_bytes`` as well (counted in encoded frame bytes).

    Past that, the *gap* policy applies, to the run concerned only where there is one: a run
    whose data cannot be held (or whose new-run ``snapshot`` finds the queue full) loses its
    held data, its frames are dropped until the client is told, and the client gets a ``gap``
    naming it (``{"type": "gap", "seq", "runs": [...]}``) once the queue drained; the other runs
    go on. It re-syncs those runs with a ``keep`` re-subscription
    (:meth:`Broker.resubscribe` sends their snapshots again, and nothing of the others). When a
    frame about no run cannot be held, or the broker marks a gap of every run, every further
    frame is dropped, and once the consumer has drained what was queued it receives a ``gap``
    without ``runs``, after which the client subscribes afresh.
    """

    def __init__(
        self,
        runs: set[str] | None,
        capacity: int,
        tags: re.Pattern[str] | None = None,
        capacity_bytes: int = 8 << 20,
    ) -> None:
        self.runs = runs
        self.tags = tags
        self.after_seq = 0
        # run -> the broker seq up to which its snapshot already covers that run
        self.covered: dict[str, int] = {}
        #: the broker seq when the subscription last changed (:meth:`Broker.resubscribe`): the
        #: snapshots it calls for hold every batch ingested up to it
        self.since = 0
        #: run -> ``max_points`` of its snapshot, for the runs whose whole snapshot was handed
        #: to the client (:data:`WHOLE`: it got the run whole, frame by frame): what a ``keep``
        #: re-subscription need not send again
        self.snapshots: dict[str, int] = {}
        #: runs whose frames were dropped since the subscription last changed (per-run gaps):
        #: a ``keep`` re-subscription sends their snapshots again
        self.lost_runs: set[str] = set()
        #: the runs the broker knew when the subscription last changed (None: not tracked); a
        #: run it covers that appeared since reached the client whole, unless it lost frames
        #: or was first offered as a snapshot (``_partial``)
        self.known: set[str] | None = None
        self._partial: set[str] = set()
        self._capacity = capacity
        self._capacity_bytes = capacity_bytes
        self._bytes = self._peak_bytes = 0
        self._send, self._receive = trio.open_memory_channel[tuple[int, str | None, bytes]](
            capacity
        )
        self._gap = False
        self._gap_runs: set[str] = set()  # runs whose ``gap`` is still to be sent
        self._peak = self._sent = self._dropped = self._gaps = self._run_gaps = 0
        # Items in the channel, counted here: offer() runs once per subscriber and batch, and
        # the channel's statistics() builds a record each time (live block, h-live).
        self._depth = 0
        # The coalesce policy: run -> [(seq, scalars, events, frame bytes)] offered while the
        # queue was full, their frames' bytes (and the side frames'), and the frames built from
        # them, to be sent next.
        self._held: dict[str, list[tuple[int, list[ScalarColumns], list[dict[str, Any]], int]]] = {}
        self._held_bytes = 0
        self._side: list[bytes] = []  # frames about no run, held in order
        self._ready: list[bytes] = []
        self._coalesced = 0
        #: Set by a consumer while it waits on an empty queue: a synchronous writer that sends a
        #: frame to the client at once if it can go whole without waiting, and returns whether
        #: it went (False: nothing was written). :meth:`offer` hands it a frame before queueing
        #: it, so an idle browser costs no task wake-up and queue hand-off per frame
        #: (docs/performance.md, "(2026-12-02, h12-loop)").
        self.direct: Callable[[bytes], bool] | None = None
        self._written_at_offer = 0

    @property
    def lost(self) -> bool:
        """Whether frames of every run were dropped (a gap of every run, not of named runs):
        nothing the client holds is kept, and it re-syncs from a fresh subscription."""
        return self._gaps > self._run_gaps

    def wants(self, run: str) -> bool:
        """Return whether this subscription covers ``run``."""
        return self.runs is None or run in self.runs

    def select(
        self, scalars: list[ScalarColumns], events: list[dict[str, Any]]
    ) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
        """Keep what the tag pattern matches; telemetry (its reserved scalar tags, and the
        untagged events of runs written before) always passes, as the page's System view shows it
        whatever tags the charts are filtered to."""
        if self.tags is None:
            return scalars, events
        search = self.tags.search
        return (
            [c for c in scalars if c.tag.startswith(RESERVED_TAG_PREFIX) or search(c.tag)],
            [e for e in events if e.get("tag") is None or search(e["tag"])],
        )

    def offer(
        self,
        seq: int,
        run: str | None,
        frame: bytes,
        data: tuple[list[ScalarColumns], list[dict[str, Any]]] | None = None,
    ) -> None:
        """Queue a frame (about ``run``, or None) if there is room; never blocks.

        ``data``: the ``(scalars, events)`` a ``data`` frame encodes, so that it can be coalesced
        on overflow; without it, an overflow applies the gap policy to ``run``.
        """
        if self._gap or (run is not None and run in self._gap_runs):
            self._dropped += 1  # the client re-reads what it lost, these included
            return
        if data is None and run is not None and self.known is not None and run not in self.known:
            self._partial.add(run)  # a new run's snapshot: not necessarily whole
        if self._held or self._side or self._gap_runs:
            # Something waits for the queue to drain: nothing goes past it (so each run keeps
            # its order), and the queue drains however busy the other runs are.
            self._hold(seq, run, frame, data)
            return
        if self._bytes and self._bytes + len(frame) > self._capacity_bytes:
            self._hold(seq, run, frame, data)
            return
        direct = self.direct
        if (
            direct is not None
            and not self._depth
            and not self._ready
            and self._passes(seq, run)  # judged now rather than when taken
            and direct(frame)
        ):
            self._sent += 1
            self._written_at_offer += 1
            return
        try:
            self._send.send_nowait((seq, run, frame))
        except trio.WouldBlock:
            self._hold(seq, run, frame, data)
            return
        except trio.ClosedResourceError:
            return
        self._bytes += len(frame)
        self._peak_bytes = max(self._peak_bytes, self._bytes)
        self._depth += 1
        self._peak = max(self._peak, self._depth)

    def _hold(
        self,
        seq: int,
        run: str | None,
        frame: bytes,
        data: tuple[list[ScalarColumns], list[dict[str, Any]]] | None,
    ) -> None:
        """Hold a frame that found the queue full (data coalesced, a frame about no run as it
        is), or apply the gap policy: to ``run`` alone if the frame is about one."""
        room = self._held_bytes + len(frame) <= self._capacity_bytes
        if run is None:
            if not room or len(self._side) >= SIDE_FRAMES:
                self.mark_gap()
                self._dropped += 1
                return
            self._side.append(frame)
            self._held_bytes += len(frame)
            return
        if data is None or not room:
            self.mark_gap(run)
            self._dropped += 1
            return
        self._held.setdefault(run, []).append((seq, data[0], data[1], len(frame)))
        self._held_bytes += len(frame)
        self._coalesced += 1

    def _release(self) -> None:
        """Turn what is held into frames ready to be sent next: the frames about no run in
        order, then one ``data`` frame per run."""
        side, self._side = self._side, []
        held, self._held, self._held_bytes = self._held, {}, 0
        self._ready.extend(side)
        for run, batches in held.items():
            if not self.wants(run):
                continue
            covered = self.covered.get(run, self.after_seq)
            batches = [b for b in batches if b[0] > covered]
            if not batches:
                continue
            columns, events = codec.join_batches((b[1], b[2]) for b in batches)
            self._ready.append(codec.encode_live("data", batches[-1][0], run, columns, events))

    def mark_gap(self, run: str | None = None) -> None:
        """Apply the gap policy now, to ``run`` (None: every run): drop its frames until the
        client is told, and have it re-sync from a snapshot.

        Used on overflow, when frames already offered turn out not to be on disk (a batch
        refused after its fan-out), so the page re-reads the truth, and by the bus when live
        frames from another broker were lost on the way.
        """
        if run is not None and not self._gap:
            self.lost_runs.add(run)
            lost = self._held.pop(run, None)
            if lost:
                self._held_bytes -= sum(b[3] for b in lost)
            if run not in self._gap_runs:
                self._gap_runs.add(run)
                self._gaps += 1
                self._run_gaps += 1
                self._wake()
            return
        self._held.clear()
        self._side.clear()
        self._held_bytes = 0
        self._ready.clear()
        self._gap_runs.clear()
        if not self._gap:
            self._gap = True
            self._gaps += 1
            self._wake()

    def _wake(self) -> None:
        """Wake a consumer waiting on an empty queue, so that it takes the pending ``gap``."""
        if self._depth == 0:
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._send.send_nowait((0, None, b""))  # seq 0: skipped by _take
                self._depth += 1

    def resynced(self, known: Iterable[str]) -> None:
        """The subscription changed in place (:meth:`Broker.resubscribe`), and every lost run
        it covers is sent afresh: forget the losses (a pending ``gap`` of them is moot), and
        watch the runs that appear after ``known`` (the broker's runs now)."""
        self.lost_runs.clear()
        self._gap_runs.clear()
        self._partial.clear()
        self.known = set(known)

    def grown(self, names: Iterable[str]) -> list[str]:
        """Of the broker's runs ``names``, those this subscription got whole frame by frame:
        they appeared after it last changed, it covers them, and they lost nothing."""
        if self.known is None:
            return []
        return [
            n
            for n in names
            if n not in self.known
            and self.wants(n)
            and n not in self._partial
            and n not in self.lost_runs
        ]

    def _take(self, seq: int, run: str | None, frame: bytes) -> bytes | None:
        """A dequeued frame, or None for one to skip: of a run the subscription no longer
        covers, or covered by that run's snapshot."""
        self._bytes -= len(frame)
        self._depth -= 1
        if self._passes(seq, run):
            self._sent += 1
            return frame
        return None

    def _passes(self, seq: int, run: str | None) -> bool:
        """Whether a frame of ``run`` (None: about no run) at ``seq`` goes to the client: its run
        still subscribed to, and the frame newer than that run's snapshot."""
        if run is not None and not self.wants(run):
            return False
        return seq > self.covered.get(run, self.after_seq)  # type: ignore[arg-type]

    def receive_nowait(self) -> bytes:
        """Return the next frame to send if one is ready (queued data; once the queue drained,
        a ``gap`` after an overflow, then what was held); else raise ``trio.WouldBlock``.

        Raises:
            trio.WouldBlock: nothing to send now.
            trio.EndOfChannel: closed, and everything queued was taken.
        """
        while True:
            if self._ready:
                self._sent += 1
                return self._ready.pop(0)
            try:
                item = self._receive.receive_nowait()
            except trio.WouldBlock:
                if self._gap:
                    self._gap = False
                    return codec.encode_message({"type": "gap", "seq": self.after_seq})
                if self._gap_runs:
                    runs, self._gap_runs = sorted(self._gap_runs), set()
                    self._sent += 1
                    gap = {"type": "gap", "seq": self.after_seq, "runs": runs}
                    return codec.encode_message(gap)
                if self._held or self._side:  # the queue is drained: what was held goes now
                    self._release()
                    continue
                raise
            frame = self._take(*item)
            if frame is not None:
                return frame

    async def receive(self) -> bytes:
        """Return the next frame to send: queued data, or a ``gap`` message after an overflow."""
        while True:
            try:
                return self.receive_nowait()
            except trio.WouldBlock:
                pass
            frame = self._take(*await self._receive.receive())
            if frame is not None:
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
            self._bytes,
            self._peak_bytes,
            self._capacity_bytes,
            self._coalesced,
            self._held_bytes,
            self._run_gaps,
            len(self._side),
            self._written_at_offer,
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
    refusals: int = 0
    open_writers: int = 0
    subscribers_refused: int = 0


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
        # alerts: the detectors were told where its tags began in its files (AlertEngine.history)
        self.history_told = False
        # Read side. One reader serves snapshots, HTTP reads and (for a followed run) the tail; it
        # is closed when idle and reopened at ``position`` (RunReader(limit=position)).
        self.signature: tuple | None = None  # the segment files' names, sizes and mtimes
        # its directory's key read before ``signature`` was taken (following.py), or None
        self.dir_key: following.DirKey | None = None
        self.used = 0.0  # time.monotonic() of the reader's last use
        self.cached = 0  # bytes of decoded data the reader holds, as of its last use
        self.base = 0  # bytes its in-memory index holds, estimated
        self.lock = trio.Lock()  # RunReader is not thread-safe
        # (writer, seq) -> broker seq of a batch accepted but not yet written or refused, so a
        # re-sent copy waits for the original's outcome instead of being acknowledged blindly.
        self.inflight: dict[tuple[str, int], int] = {}
        # writer -> (seq, refusal, last): a retryable refusal of that writer's batch ``seq``;
        # until the writer sends ``seq`` again, its later batches are refused too, so nothing
        # lands out of order and the dedup by (writer, seq) stays exact. ``last`` is the highest
        # seq of the writer refused since (see _hold): what another broker must have written
        # before the refusal counts as settled (_bus_settle). Ingest side (event loop).
        self.resend_from: dict[str, tuple[int, RefusedError, int]] = {}
        # The same, on the persist side (worker thread): batches queued behind a refused one.
        self.blocked: dict[str, tuple[int, RefusedError, int]] = {}
        self.rotating = False  # the writer is open with a segment limit to start a new segment
        # Series key (a scalar's tag, or an event's (kind, tag)) -> (the writer that logged it
        # last, the one before that), for :meth:`Broker._check_shared`; and the pairs of writers
        # already told that they log one series at once.
        self.series_writers: dict[str | tuple[str, str], tuple[str, str | None]] = {}
        self.shared_by: set[frozenset[str]] = set()
        # The run's summary (run_summary.py); ``summary_exact``: it covers everything the run
        # held when it was set (else a placeholder until a reader computes it);
        # ``summary_files``: the data files a summary taken from the recorder's digest describes.
        self.summary: RunSummary | None = None
        self.summary_exact = False
        self.summary_files: list[tuple[str, int]] | None = None
        self.summary_failed = False  # reading it for its summary failed: not tried again

    def load_ingest_state(self) -> None:
        """Read which writer sequence numbers this run already holds (blocking)."""
        if self.path.is_dir():
            try:
                reader = recorder.RunReader(self.path)
            except recorder.NotARunError:
                reader = None
            if reader is not None:
                with reader:
                    # Each bookkeeping record holds every writer the run has seen: the newest
                    # suffices.
                    record = reader.last_record(INGEST_KIND)
                    if self.summary is None or not self.summary_exact:
                        _summary_from_disk(self, reader)
                if record is not None:
                    self.last_seq.update(record.data)
        if self.summary is None:
            self.summary = RunSummary(self.name, time.time())
            self.summary_exact = True
        self.persisted_seq = dict(self.last_seq)
        self.loaded = True  # only now: a failed load is tried again by the next batch


def _hold(
    held: dict[str, tuple[int, RefusedError, int]], writer: str, seq: int, refusal: RefusedError
) -> None:
    """Note in ``held`` (a run's ``resend_from`` or ``blocked``) that ``writer``'s batch ``seq``
    was refused (retryable): the lowest refused seq is the one that must come again first, the
    highest is what another broker must have written for the refusal to be settled."""
    old = held.get(writer)
    if old is None:
        held[writer] = (seq, refusal, seq)
    elif seq < old[0]:
        held[writer] = (seq, refusal, max(old[2], seq))
    elif seq > old[2]:
        held[writer] = (old[0], old[1], seq)


def _out_of_files(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


#: The types of an event's values that :func:`_batch_bytes` counts by length, and those it
#: skips at once (most of a histogram's or a curve's values): set lookups, not isinstance calls.
_SIZED = frozenset((bytes, str))
_UNSIZED = frozenset((float, int, bool, type(None)))


def _series(
    batch: Batch,
) -> Iterator[tuple[str | tuple[str, str], str, ScalarColumns | dict[str, Any]]]:
    """Each series ``batch`` logs into, as (its key in ``_Run.series_writers``, its tag, what
    of the batch is in it): a scalar column by its tag, an event with a tag and a step by its
    kind and tag. Meta (status), hparams and a run's graph are not series."""
    for columns in batch.scalars:
        yield columns.tag, columns.tag, columns
    for event in batch.events:
        tag = event.get("tag")
        if tag is not None and event.get("step") is not None:
            yield (event.get("kind", ""), tag), tag, event


def _batch_bytes(batch: Batch) -> int:
    """About how many bytes ``batch`` takes in the recorder's buffer.

    Sized once per batch on the persist path (the part it joins and the segment it fits are
    both decided from that one figure), with no generator or isinstance call per value: sized
    twice with them, it was a fifth of the persist thread's samples for batches of histograms
    (docs/performance.md, "Writer hot path (2026-12-01, h3-hist)")."""
    size = 24 * sum([len(c.steps) for c in batch.scalars]) + 64 * len(batch.events)
    for event in batch.events:
        for value in event.values():
            kind = type(value)
            if kind in _SIZED or (kind not in _UNSIZED and isinstance(value, (bytes, str))):
                size += len(value)
    return size


def _joined_columns(
    scalars: list[ScalarColumns], counts: list[int]
) -> tuple[list[str], list[int], np.ndarray, np.ndarray, np.ndarray]:
    """A batch's scalar columns (of ``counts`` points) joined tag-major, as
    :meth:`recorder.RunWriter.append_scalar_batch` takes them; read-only, so that the recorder
    keeps them rather than copying them again."""
    # The recorder's dtypes here: one column of another integer or float type must not turn
    # the joined steps into floats (which append_scalars, taking each column alone, accepts).
    steps = np.concatenate([c.steps for c in scalars], dtype=np.int64, casting="same_kind")
    walls = np.concatenate([c.walls for c in scalars], dtype=np.float64, casting="same_kind")
    values = np.concatenate([c.values for c in scalars], dtype=np.float64, casting="same_kind")
    steps.flags.writeable = walls.flags.writeable = values.flags.writeable = False
    return [c.tag for c in scalars], counts, steps, walls, values


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

    A batch that cannot be persisted (a full disk, too many open files, a run locked by another
    process, a run name the file system or the record format cannot hold) is *refused*: it is
    not acknowledged, nothing of it is left on disk without its bookkeeping, and every other run
    and subscriber carries on. :meth:`ingest` raises :class:`~vdl_stream.errors.RefusedError`
    for refusals known at once; :meth:`wait_written` raises it for refusals found while
    persisting. After a retryable refusal of a writer's batch ``n`` its later batches are
    refused too until ``n`` is sent again, so batches land in order and the dedup by
    (writer, seq) stays exact.

    Args:
        logdir: the directory holding one sub-directory per run.
        sync_interval: fsync dirty runs at least this often, in seconds.
        queue_size: capacity of the ingest queue, in batches; ``ingest`` waits when it is full.
        subscriber_queue: capacity of each subscriber's queue, in frames.
        subscriber_bytes: capacity of each subscriber's queue, in bytes of encoded frames.
        max_subscribers: :meth:`subscribe` raises :class:`SubscriberLimitError` past this many.
        max_open_writers: run files kept open for writing at once; the least recently written
            run is fsynced and closed to make room (and reopened when it is written again).
            By default a quarter of the open-file limit (256 under ``ulimit -n 1024``; each
            holds three descriptors, see :func:`default_open_writers`).
        segment_bytes: a run's segment file is closed and the next one started once it is about
            this large, always between two flushes (a segment may exceed it by one flush).
        cache_bytes: the budget, in bytes, for decoded data that runs' readers keep between reads;
            beyond it the least recently used readers drop their caches.
        idle_close: close a run's reader (its file descriptors and cache) after this many seconds
            without a read or new data; it reopens where it stopped when needed.
        prepare_write: called with a run's directory (in a worker thread) before the broker
            first reads or writes it for ingest; an object store's sync uses it to fetch a run
            that so far exists only in the store (vdl_stream/storage.py). An OSError from it
            refuses the batch as retryable.
        compaction_process: build compaction's blocks in a process of its own
            (:class:`recorder.CompactionProcess`, started at the first unit and again whenever
            it dies), so their CPU is off this process's GIL; the compaction thread only waits
            for it and swaps the blocks in. False, or after it died three times in a row: the
            compaction thread builds them itself.
        read_processes: processes that read the scalars of snapshots sent whole (a page
            selecting more than ``SPLIT_RUNS_UP_TO`` runs) beside this one
            (:class:`recorder.ReaderPool`: those reads hold the GIL, so threads take turns on
            one core). Started once a subscription's snapshot was sent while the broker knew
            of more than ``SPLIT_RUNS_UP_TO`` runs (a page's first load over a sweep) and no
            snapshot was then read or sent for ``POOL_START_QUIET`` s, or when a subscription
            of more than ``SPLIT_RUNS_UP_TO`` runs begins: a server over a few runs never
            starts them, and no subscription waits for them. Until they are up, and with 0,
            the reader threads read everything.

    Raises:
        ValueError: a size, count or ``idle_close`` is not positive.
    """

    def __init__(
        self,
        logdir: str | Path,
        *,
        sync_interval: float = 1.0,
        queue_size: int = 64,
        subscriber_queue: int = 256,
        subscriber_bytes: int = 8 << 20,
        max_subscribers: int = 256,
        max_open_writers: int | None = None,
        segment_bytes: int = 64 << 20,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        idle_close: float = IDLE_CLOSE,
        crash_after: float = CRASH_AFTER,
        prepare_write: Callable[[Path], None] | None = None,
        compaction_process: bool = True,
        read_processes: int = 0,
    ) -> None:
        for name, value in (
            ("subscriber_queue", subscriber_queue),
            ("subscriber_bytes", subscriber_bytes),
            ("max_subscribers", max_subscribers),
            ("max_open_writers", max_open_writers or 1),
            ("queue_size", queue_size),
            ("segment_bytes", segment_bytes),
        ):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if type(read_processes) is not int or read_processes < 0:
            raise ValueError(f"read_processes must be an int >= 0, got {read_processes!r}")
        if not isinstance(cache_bytes, int) or cache_bytes <= 0:
            raise ValueError(f"cache_bytes must be a positive int, got {cache_bytes!r}")
        if not idle_close > 0:
            raise ValueError(f"idle_close must be a positive number of seconds, got {idle_close!r}")
        if (
            isinstance(crash_after, bool)
            or not isinstance(crash_after, (int, float))
            or not (crash_after > 0)
        ):
            raise ValueError(
                f"crash_after must be a positive number of seconds, got {crash_after!r}"
            )
        self.logdir = Path(logdir)
        self._prepare_write = prepare_write
        # With a log directory in an object store: its sync's statistics (GET /api/stats).
        self.store_statistics: Callable[[], Any] | None = None
        self._sync_interval = sync_interval
        self._subscriber_queue = subscriber_queue
        self._subscriber_bytes = subscriber_bytes
        self._max_subscribers = max_subscribers
        self._max_open_writers = max_open_writers or default_open_writers()
        self._segment_bytes = segment_bytes
        self._runs: dict[str, _Run] = {}
        self._subscribers: set[Subscriber] = set()
        self._send, self._receive = trio.open_memory_channel[tuple[int, Batch | None, bool]](
            queue_size
        )
        self._seq = self._written_seq = self._durable_seq = 0
        # Items in the persist queue or in the persist task's hands, not yet written: while
        # any is, ingest queues every batch behind them (_write_now), to keep ingest order.
        self._unwritten = 0
        self._progress = trio.Event()
        self._open_lock = trio.Lock()
        self._queue_peak = self._batches = self._events = self._duplicates = 0
        self._refusal_count = self._subscribers_refused = 0
        self._refused: OrderedDict[int, RefusedError] = OrderedDict()  # broker seq -> refusal
        self._logged: dict[tuple[str, str], float] = {}  # (run, reason) -> when last logged
        # writer id -> what the broker has to tell it (take_notices), oldest writer first
        self._notices: OrderedDict[str, list[str]] = OrderedDict()
        self._open_writers: OrderedDict[str, _Run] = OrderedDict()  # LRU, persist thread only
        self._limiter = trio.CapacityLimiter(1)
        # Runs whose writer has compaction waiting: added by the persist thread after a flush,
        # taken by the compaction thread (:meth:`_compact_runs`), under _compact_lock. The
        # compaction task runs units in a thread of its own (its own limiter), beside the
        # persist thread: a write waits only for the swap of a writer's compaction state.
        self._compact_due: set[str] = set()
        self._compact_lock = threading.Lock()
        self._compact_limiter = trio.CapacityLimiter(1)
        self._compact_wanted = trio.Event()
        self._compaction_process = recorder.CompactionProcess() if compaction_process else None
        self._compaction_restarts = 0  # restarts of the process already logged
        self._closed = trio.Event()
        # Read side: its own threads, so that a long read never holds back persistence.
        self._read_limiter = trio.CapacityLimiter(READ_THREADS)
        self._reader_pool = recorder.ReaderPool(read_processes) if read_processes else None
        self._pool_wanted = trio.Event()  # starts the reader pool, once snapshots are quiet
        self._pool_now = trio.Event()  # starts it at once: a snapshot of many runs began
        self._snapshots_open = 0  # send_snapshot calls under way
        self._snapshot_ended = 0.0  # trio.current_time() the last one returned
        self._cache = _ReadCache(cache_bytes)
        self._idle_close = idle_close
        self._ingest_seq = 0  # broker seq of the newest batch ingested (not followed)
        self._following = False  # the first discovery is done: later runs are offered snapshots
        self._skipped: dict[str, tuple | None] = {}  # unreadable run -> its files when skipped
        self._warned: set[str] = set()
        # Run summaries (see the "run summaries" block): what was last published of each run
        # as (summary version, status, publish tick), and the tick counter.
        self._crash_after = float(crash_after)
        self._published: dict[str, tuple[int, str, int]] = {}
        self._summary_tick = 0
        # The follow loop's memory of the log directory's files between rounds (following.py).
        self._follow_state = following.FollowState(self.logdir)

    # -- ingest ---------------------------------------------------------------------------------

    async def ingest(self, batch: Batch) -> int:
        """Accept a batch: fan it out and queue it for persistence.

        Waits only while the persistence queue is full. Returns the broker sequence number that
        :meth:`wait_written` takes. A batch whose (writer, seq) was already accepted is a
        duplicate from a re-sending writer: it is dropped, and the number returned is the
        original's while that is still queued (so waiting on it reports the original's outcome),
        else one that is reached once the original is durable.

        Raises:
            RefusedError: the run cannot be opened (retryable or not), or an earlier batch of
                this writer was refused and must be sent again first (retryable).
            trio.ClosedResourceError: the broker is closed.
        """
        refusal = self._foreign_refusal(batch)  # foreign block, below: foreign runs are read-only
        if refusal is not None:
            self._refusal_count += 1
            raise refusal
        try:
            if self._bus is not None:  # bus: only the broker holding the run's lease takes it
                await self._bus.admit(batch)
            run = await self._get_run(batch.run)
            if self._bus is not None:
                self._bus.check_order(batch, run.last_seq)
                if run.resend_from:
                    self._bus_settle(run.resend_from, run.last_seq)
        except RefusedError as refusal:
            self._refusal_count += 1
            if self._bus is not None:  # bus: nothing of this writer's after it until it is back
                self._bus.refused(batch, refusal)
            raise
        resend = run.resend_from.get(batch.writer)
        if resend is not None:
            first, why, upto = resend
            # Taken only if every refused batch before it has come again (it is the first of
            # them, or the one after the last taken): a later batch still arriving on the
            # writer's previous connection must not land over the ones not yet re-sent.
            if batch.seq > first and min(upto, batch.seq - 1) > run.last_seq.get(batch.writer, 0):
                self._refusal_count += 1
                _hold(run.resend_from, batch.writer, batch.seq, why)
                raise why
            if batch.seq >= upto:
                del run.resend_from[batch.writer]  # put back if this copy is not taken
            else:
                resend = None  # kept: the rest of the refused batches must come in order
        last = run.last_seq.get(batch.writer, 0)
        if batch.seq <= last:
            self._duplicates += 1
            original = run.inflight.get((batch.writer, batch.seq))
            if original is not None:
                if batch.sync:
                    await self._send.send((original, None, True))
                    self._unwritten += 1
                return original
            if not batch.sync:
                return 0  # written before: nothing to wait for
            # Written before, maybe not yet fsynced: a marker of its own makes the persist task
            # fsync, and its number is never one of a refused batch.
            self._seq += 1
            await self._send.send((self._seq, None, True))
            self._unwritten += 1
            return self._seq
        run.last_seq[batch.writer] = batch.seq
        run.local = True
        if batch.writer != ALERTS_WRITER:
            self._check_shared(run, batch)
        # Telemetry columns as the telemetry events the summary and the detectors read (one
        # conversion, vdl_stream/telemetry.py): never training data to either.
        view = legacy_view(batch.scalars, batch.events)
        seq = self._fan_out(batch.run, batch.scalars, batch.events, view=view)
        if self._bus is not None:  # bus: to the other brokers' browsers too, as fanned out here
            self._bus.publish(batch)
        count = batch.count()
        if self.alerts is not None and batch.writer != ALERTS_WRITER:  # alerts block, below
            # (counted once, for both; the view's two lists passed as they are: a starred call
            # builds a tuple and a keyword dict per batch)
            self.alerts.observe(batch.run, view[0], view[1], points=count)
        run.inflight[(batch.writer, batch.seq)] = seq
        ingested, self._ingest_seq = self._ingest_seq, seq  # snapshots wait for it to be written
        try:
            # Shielded (bus failover fix): numbered and fanned out, the batch reaches the persist
            # queue even if its connection closes while the queue is full. Dropped there, a
            # later batch of its writer, re-sent on a new connection meanwhile and waiting
            # behind it, was written first, and the dropped one's re-sent copy then read as a
            # duplicate of what the files hold: lost (bench_bus.py failover, seed 15). Bounded,
            # should the persist task be gone without closing the queue.
            # The deadline's scope only when the queue is full: a scope per batch stayed in
            # trio's deadline heap (and its cycle-free garbage in the collector's young
            # generation) until the heap's next prune, 1,000 batches later whenever another
            # task held an earlier deadline (the alert engine's rounds do): twice the young
            # collections at small batches (docs/performance.md, "Alerts' cost on ingest").
            item = (seq, batch, batch.sync)
            if self._write_now(item):
                await trio.lowlevel.cancel_shielded_checkpoint()  # written (or refused) here
            else:
                try:
                    self._send.send_nowait(item)
                except trio.WouldBlock:
                    with trio.fail_after(ENQUEUE_SHIELD, shield=True):
                        await self._send.send(item)
                else:
                    await trio.lowlevel.cancel_shielded_checkpoint()  # as send() does
                self._unwritten += 1
        except BaseException:
            # Closed (the broker shuts down) or stuck while the queue was full: the batch was not
            # taken, so its re-sent copy must not be dropped as a duplicate; browsers that saw
            # it re-sync.
            run.last_seq[batch.writer] = last
            run.inflight.pop((batch.writer, batch.seq), None)
            # A copy of this batch re-sent on another connection meanwhile (a writer that
            # reconnected while this one was still being read) waits on this number: it must
            # hear that the batch was not taken, not be acknowledged once later ones are written.
            self._refused[seq] = RefusedError(
                "the batch was not taken (its connection closed); send it again", retryable=True
            )
            if self._ingest_seq == seq:
                self._ingest_seq = ingested
            if resend is not None:
                run.resend_from[batch.writer] = resend
            for sub in self._subscribers:
                if sub.wants(batch.run):
                    sub.mark_gap(batch.run)
            if self._bus is not None:  # bus: and the other brokers' browsers re-sync it too
                self._bus.settled(batch.run, refused=True)
            raise
        self._batches += 1
        self._events += count
        self._queue_peak = max(self._queue_peak, self._send.statistics().current_buffer_used)
        return seq

    def _fan_out(
        self,
        run: str,
        scalars: list[ScalarColumns],
        events: list[dict[str, Any]],
        *,
        summarize: bool = True,
        view: tuple[list[ScalarColumns], list[dict[str, Any]]] | None = None,
    ) -> int:
        """Give new data of ``run`` the next broker seq and offer it to every subscriber of it
        (``summarize``: fold it into the run's summary, as data that is in the run; ``view``:
        the data's ``legacy_view``, when the caller has it already)."""
        if summarize:
            self._summarize(run, *(legacy_view(scalars, events) if view is None else view))
        self._seq += 1
        seq = self._seq
        # One encoding per distinct tag pattern, offered with its data (to coalesce on overflow).
        frames: dict[str | None, tuple[bytes, tuple[list, list]] | None] = {}
        for sub in self._subscribers:
            if sub.wants(run):
                key = None if sub.tags is None else sub.tags.pattern
                if key not in frames:
                    picked = sub.select(scalars, events)
                    frames[key] = (
                        (codec.encode_live("data", seq, run, *picked), picked)
                        if any(picked)
                        else None
                    )
                offered = frames[key]
                if offered is not None:
                    sub.offer(seq, run, offered[0], offered[1])
        return seq

    def _announce(self) -> None:
        """Tell subscribers of every run which runs exist now."""
        names = codec.encode_message({"type": "runs", "runs": sorted(self._runs)})
        for sub in self._subscribers:
            if sub.runs is None:
                sub.offer(self._seq + 1, None, names)

    async def wait_persisted(self, seq: int, *, durable: bool = False) -> None:
        """Return once every batch up to broker sequence ``seq`` is written or refused (and the
        written ones fsynced if ``durable``). Use :meth:`wait_written` to learn a refusal."""
        while (self._durable_seq if durable else self._written_seq) < seq:
            await self._progress.wait()

    async def wait_written(self, seq: int, *, durable: bool = False) -> None:
        """Wait for the batch that :meth:`ingest` numbered ``seq``, as :meth:`wait_persisted`.

        Raises:
            RefusedError: that batch was refused while persisting; nothing of it is on disk.
        """
        await self.wait_persisted(seq, durable=durable)
        refusal = self.refusal(seq)
        if refusal is not None:
            raise refusal

    def written(self, seq: int) -> bool:
        """Return whether the batch numbered ``seq`` was written or refused (never blocks)."""
        return self._written_seq >= seq

    def refusal(self, seq: int) -> RefusedError | None:
        """Return the refusal of the batch numbered ``seq`` if it was refused (and recently)."""
        return self._refused.get(seq)

    async def open_run(self, name: str) -> None:
        """Open (and lock) run ``name`` for writing now rather than at its first batch.

        For an in-process writer that wants the real cause at ``attach()`` instead of a refusal
        later. The run stays open like any other (it may be closed later to bound open files,
        and is reopened at its next batch).

        Raises:
            RefusedError: the name is not a valid run name, or the run's files cannot be read.
            recorder.RunLockedError: another writer holds the run.
            recorder.RecorderError: the run directory is not usable (a file in the way).
            OSError: the run cannot be created or written (the message names the path).
        """
        run = await self._get_run(name)
        await trio.to_thread.run_sync(self._writer, run, limiter=self._limiter)

    async def _get_run(self, name: str) -> _Run:
        run = self._runs.get(name)
        if run is not None and run.loaded:
            return run
        async with self._open_lock:
            run = self._runs.get(name)
            if run is None or not run.loaded:
                new = run is None
                if new:
                    try:
                        codec.check_run_name(name)  # the in-process path has no decoder
                    except ValueError as exc:
                        raise RefusedError(str(exc)[:200], retryable=False) from None
                run = run or _Run(name, self._run_dir(name))
                try:
                    if self._prepare_write is not None:
                        # Not under the persist limiter: a slow store delays this run's first
                        # batch only, never the persistence of the others.
                        prepare = self._prepare_write
                        taken = self._bus_taken is not None and name in self._bus_taken
                        if taken:  # bus: continue the run from the store, and claim it there
                            prepare = functools.partial(prepare, taken_over=True)
                        await trio.to_thread.run_sync(prepare, run.path)
                        if taken:
                            self._bus_taken.discard(name)
                    await trio.to_thread.run_sync(run.load_ingest_state, limiter=self._limiter)
                except (OSError, recorder.RecorderError) as exc:
                    # Not added: a later batch tries again (the cause may go away).
                    if _out_of_files(exc):
                        await trio.to_thread.run_sync(self._shed_writers, limiter=self._limiter)
                    raise refusal_for(exc) from None
                self._runs[name] = run
                if new:
                    self._announce()
        return run

    # -- persistence ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the persist task until :meth:`close` closes ingest; then flush, fsync and close runs.

        Beside it, a compaction task compacts the runs' sealed segments in a thread of its own
        (:meth:`_compact`), so that no write waits for compaction.

        A failure to persist refuses the batches concerned (see :class:`Broker`); it never ends
        this task.
        """
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._compact)
            if self._reader_pool is not None:
                nursery.start_soon(self._start_reader_pool, self._reader_pool)
            try:
                await self._persist_loop()
            finally:
                nursery.cancel_scope.cancel()  # a unit under way ends first (close waits for it)

    async def _persist_loop(self) -> None:
        last_sync = time.monotonic()
        done = False
        try:
            while not done:
                items: list[tuple[int, Batch | None, bool]] = []
                try:
                    # A deadline's scope only when nothing waits (as in ingest, above): one per
                    # flush otherwise stays in trio's deadline heap until its next prune.
                    items.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    with trio.move_on_after(self._sync_interval):
                        try:
                            items.append(await self._receive.receive())
                        except trio.EndOfChannel:
                            done = True
                except trio.EndOfChannel:
                    done = True
                while not done:
                    try:
                        items.append(self._receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                    except trio.EndOfChannel:
                        done = True
                await self._write(items)
                sync = done or any(s for _, _, s in items)
                if sync or time.monotonic() - last_sync >= self._sync_interval:
                    written = self._written_seq
                    synced = await trio.to_thread.run_sync(self._sync_runs, limiter=self._limiter)
                    last_sync = time.monotonic()
                    if synced:
                        self._durable_seq = written
                    self._wake_waiters()
                if self._compact_due:
                    self._compact_wanted.set()
        finally:
            # Cancelled or closed: what was accepted but not yet written is written now.
            leftovers = []
            while True:
                try:
                    leftovers.append(self._receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            with trio.move_on_after(10, shield=True):
                await self._write(leftovers)
                if await trio.to_thread.run_sync(self._sync_runs, limiter=self._limiter):
                    self._durable_seq = self._written_seq
                await trio.to_thread.run_sync(self._close_runs, limiter=self._limiter)
            for sub in self._subscribers:
                sub.close()
            self._closed.set()

    async def _compact(self) -> None:
        """The compaction task: whenever the persist task finds compaction waiting, run units in
        a worker thread of its own (its own limiter, so never in the persist thread's way) until
        none waits. The thread hands each unit's block to the compaction process (when there is
        one and it is up) and waits for it off the GIL, then swaps the block in; the writes wait
        for a unit only for the swap of a writer's compaction state (RunWriter.compact)."""
        try:
            while True:
                await self._compact_wanted.wait()
                self._compact_wanted = trio.Event()
                while await trio.to_thread.run_sync(
                    self._compact_runs, limiter=self._compact_limiter
                ):
                    pass
        finally:
            if self._compaction_process is not None:
                # No unit under way: the thread call above is not abandoned on cancel, and the
                # writers were closed before (the persist task's end; their last units went to
                # the process too). It exits as its pipe closes.
                self._compaction_process.close()

    async def _start_reader_pool(self, pool: recorder.ReaderPool) -> None:
        """Start the reader processes once a snapshot was sent while the broker knew of more runs
        than ``SPLIT_RUNS_UP_TO`` (fewer are never sent whole) and snapshots went quiet
        (:meth:`_pool_start_due`); close them at the end."""
        try:
            await self._pool_wanted.wait()
            await self._pool_start_due()
            try:
                # Abandoned on cancel: close() below stops the processes being started.
                await trio.to_thread.run_sync(pool.start, abandon_on_cancel=True)
            except Exception as exc:  # the reader threads go on reading everything
                log.warning("reader processes not started (%s: %s)", type(exc).__name__, exc)
                pool.close()
            await trio.sleep_forever()
        finally:
            pool.close()

    async def _pool_start_due(self) -> None:
        """Return once no snapshot was read or sent for ``POOL_START_QUIET`` s, or at once when
        a snapshot of more than ``SPLIT_RUNS_UP_TO`` runs began (``_pool_now``)."""
        while not self._pool_now.is_set():
            wait = POOL_START_QUIET
            if not self._snapshots_open:
                wait = self._snapshot_ended + POOL_START_QUIET - trio.current_time()
                if wait <= 0:
                    return
            with trio.move_on_after(wait):  # (a snapshot under way: look again after that long)
                await self._pool_now.wait()

    async def _write(self, items: list[tuple[int, Batch | None, bool]]) -> None:
        """Persist ``items`` in a worker thread, then publish positions, refusals and progress."""
        if not items:
            return
        positions, refused = await trio.to_thread.run_sync(
            self._persist, items, limiter=self._limiter
        )
        self._unwritten -= len(items)
        self._publish(items, positions, refused)

    def _write_now(self, item: tuple[int, Batch, bool]) -> bool:
        """Write a batch that :meth:`ingest` just took, here and now, if that is cheap and
        keeps the order: nothing queued for the persist task is unwritten, the batch asks for
        no fsync, and :meth:`_write_here` allows it. Returns whether it was written (or
        refused); False: the caller queues it for the persist task.

        The acknowledgement then needs no round through the persist task and its worker
        thread (1.5-2.5 ms of wall time); the write, a few kB to the page cache, costs the event
        loop 0.1-0.3 ms of CPU, and the flush may still seal a segment (a file created, no
        fsync). Served, the ack still leaves behind the batch's fan-out sends, which is why
        INLINE_WRITE_BYTES is 0 by default (docs/performance.md, "(2026-12-01, h4-persist)").
        """
        if not INLINE_WRITE_BYTES or item[2] or self._unwritten or not self._write_here([item]):
            return False
        try:
            positions, refused = self._persist([item])
        finally:
            self._limiter.release()
        self._publish([item], positions, refused)
        if self._compact_due:  # the flush may have sealed a segment: as the persist task does
            self._compact_wanted.set()
        return True

    def _publish(
        self,
        items: list[tuple[int, Batch | None, bool]],
        positions: dict[str, Any],
        refused: dict[int, Any],
    ) -> None:
        """Publish what :meth:`_persist` wrote of ``items``: positions, refusals, progress."""
        for name, position in positions.items():
            self._runs[name].position = position
        for seq, (batch, (refusal, root)) in refused.items():
            self._refuse(seq, batch, refusal, root)
        bus = self._bus
        for seq, batch, _ in items:
            if batch is not None:
                inflight = self._runs[batch.run].inflight
                if inflight.get((batch.writer, batch.seq)) == seq:  # not a newer copy's
                    del inflight[(batch.writer, batch.seq)]
                if bus is not None:  # bus: published at ingest; now in the files, or refused
                    bus.settled(batch.run, refused=seq in refused)
        self._written_seq = max(self._written_seq, max(s for s, _, _ in items))
        self._wake_waiters()  # written: acknowledge writers that did not ask to sync

    def _write_here(self, items: list[tuple[int, Batch | None, bool]]) -> bool:
        """Whether ``items`` may be written on the event loop (taking the persist limiter, which
        the caller releases): at most INLINE_WRITE_BYTES of batches, no bus, and every run's
        writer open, far from its segment's end and with no compaction waiting (so the flush
        neither opens files, nor starts a segment, nor waits for a compaction unit). False
        when the limiter is busy (a run being opened or retired in a thread)."""
        if self._bus is not None:
            return False
        size = 0
        for _, batch, _ in items:
            if batch is None:
                continue
            run = self._runs[batch.run]
            writer = run.writer
            if writer is None or run.rotating or writer.compaction_waiting:
                return False
            size += _batch_bytes(batch)
            if size > INLINE_WRITE_BYTES:
                return False
            # _write_part starts a segment when a flush of about twice its size would not fit.
            if writer.position().offset + 2 * INLINE_WRITE_BYTES + 4096 > self._segment_bytes:
                return False
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            return False
        return True

    def _log_due(self, run: str, reason: str) -> bool:
        """Whether a warning about ``run`` for ``reason`` may be logged now: one line per run
        and reason every LOG_INTERVAL s, so that a writer retrying into a full disk (or a
        compaction failing at every unit) does not fill the log too."""
        now = time.monotonic()
        if now - self._logged.get((run, reason), -LOG_INTERVAL) < LOG_INTERVAL:
            return False
        self._logged[(run, reason)] = now
        while len(self._logged) > 1024:
            del self._logged[next(iter(self._logged))]
        return True

    def _refuse(self, seq: int, batch: Batch, refusal: RefusedError, root: bool) -> None:
        """Record that the batch numbered ``seq`` was refused while persisting (event loop)."""
        self._refusal_count += 1
        self._refused[seq] = refusal
        while len(self._refused) > REFUSALS_KEPT:
            self._refused.popitem(last=False)
        run = self._runs[batch.run]
        key = (batch.writer, batch.seq)
        if refusal.retryable and run.inflight.get(key) == seq:
            # The writer will send it again (no copy of it was taken since): accept that copy,
            # and nothing of this writer after it until then.
            _hold(run.resend_from, batch.writer, batch.seq, refusal)
            run.last_seq[batch.writer] = min(run.last_seq.get(batch.writer, 0), batch.seq - 1)
        # Subscribers were offered this batch at ingest, but it is not on disk: re-sync them.
        for sub in self._subscribers:
            if sub.wants(batch.run):
                sub.mark_gap(batch.run)
        if root and self._log_due(batch.run, refusal.reason):
            log.warning(
                "refusing batches of run %r: %s (%d refusals so far)",
                batch.run,
                refusal.reason,
                self._refusal_count,
            )

    async def _discover(self) -> None:
        """Find runs on disk this broker does not know yet, and start following them.

        A run found after the first discovery is offered to current subscribers as a snapshot
        frame, so a page opened before the run began shows its history too. A run that cannot be
        read (a foreign or damaged segment, a symbolic link) is skipped with one warning and
        tried again only once its files change.
        """
        try:
            # Lists only the directories whose entries changed (following.py).
            names = await trio.to_thread.run_sync(
                self._follow_state.find_runs, limiter=self._read_limiter
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
                        _discovered,
                        run,
                        self._skipped.get(name, ()),
                        self._crash_after,
                        limiter=self._read_limiter,
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

        Meanwhile it publishes the run summaries that changed to every subscriber once every
        ``SUMMARY_INTERVAL`` s (:meth:`publish_summaries`), and gives runs found without a current
        digest their summary, a few each round.
        """
        await self._discover()
        self._following = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._publish_summaries, SUMMARY_INTERVAL)
            task_status.started()
            # The newest run's reader opens now, while the first browser loads the page, rather
            # than a second later or on that browser's snapshot.
            await self._warm_up()
            while True:
                with trio.move_on_after(interval):
                    await self._closed.wait()
                if self._closed.is_set():
                    break
                self._follow_state.start_round()
                await self._discover()
                gone = await self._writers_gone()
                await self._tail_all()
                # Still not closed once the round read what the writer wrote before it let go
                # of the lock: it ended without closing the run.
                self.writer_lost(r.name for r in gone if self._runs.get(r.name) is r)
                await self._fill_summaries()
                await self._warm_up()
            nursery.cancel_scope.cancel()

    async def _writers_gone(self) -> list[_Run]:
        """The followed runs that read ``live`` whose writer, a process of this machine, ended
        without closing them (``recorder.writers_gone``: killed, or crashed): ``crashed`` within a
        round, as a served writer's lost connection makes them, not after ``crash_after`` s.

        Asked before the round's tail: a writer closing its run writes the close marker before it
        lets go of the lock, so the tail that follows reads it. Runs the bus carries are left to
        their lease."""
        runs = [
            r
            for r in self._runs.values()
            if not r.local
            and r.summary is not None
            and not r.summary.closed
            and not r.summary.disconnected
            and not (self._bus is not None and self._bus.carries(r.name))
        ]
        if not runs:
            return []
        gone = await trio.to_thread.run_sync(
            recorder.writers_gone, [str(r.path) for r in runs], limiter=self._read_limiter
        )
        return [r for r, g in zip(runs, gone, strict=True) if g]

    async def _tail_all(self) -> None:
        """Poll the followed runs whose files changed; close readers that went idle.

        A run is listed file by file only when its directory or its head segment changed
        (following.py), so an idle round costs two stats a run.
        """
        runs = [r for r in self._runs.values() if not r.local]
        checked = await trio.to_thread.run_sync(
            self._follow_state.check_runs,
            [(r.name, r.path, r.signature, r.dir_key) for r in runs],
            _signature,
            (UnreadableRunError,),
            limiter=self._read_limiter,
        )
        now = time.monotonic()
        for run, (listed, signature, key) in zip(runs, checked, strict=True):
            if self._closed.is_set():
                return
            if not listed:
                continue
            if signature != run.signature:
                await self._tail(run)
            elif run.signature is not None:
                # Nothing new in its files (an entry that is not data changed, or its turn to
                # be listed): the key read before this listing vouches for them from now on.
                run.dir_key = key
        for run in list(self._runs.values()):
            if run.reader is not None and now - run.used > self._idle_close:
                async with run.lock:
                    if run.reader is not None and time.monotonic() - run.used > self._idle_close:
                        run.reader.close()
                        run.reader = None
                        self._cache.forget(run.name)
        await self._trim()

    def follow_statistics(self) -> following.FollowStatistics:
        """What the follow loop's last round looked at: directories statted and listed, runs
        checked and listed in full, files statted (:class:`following.FollowStatistics`)."""
        return self._follow_state.statistics()

    async def _warm_up(self) -> None:
        """Open the reader of one followed run not opened yet, the most recently written first,
        while the readers' budget has room (or none is open), so that the first page finds it
        open and its snapshot's scalars read (:func:`_open_primed`); discovery itself opens
        nothing, so that serve starts at once."""
        if self._cache.index >= self._cache.budget and self._cache.sizes:
            return
        waiting = [
            r
            for r in self._runs.values()
            if r.reader is None and r.position is None and not r.local
        ]
        if not waiting:
            return
        run = max(waiting, key=lambda r: max(map(_MTIME, r.signature or ()), default=0))
        async with run.lock:
            if run.reader is not None or self._runs.get(run.name) is not run:
                return
            try:
                # Primed while decoded data has room: a long list of runs read one a second
                # never pushes out what pages read.
                prime = self._cache.data < self._cache.budget // 2
                await trio.to_thread.run_sync(_open_primed, run, prime, limiter=self._read_limiter)
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
            if self._bus is not None and self._bus.carries(run.name):
                # bus: it fanned this run out live already; the reader catches up (without
                # decoding) when a snapshot needs it, not every second
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
                view = legacy_view(scalars, events)
                self._fan_out(run.name, scalars, events, view=view)
                if self.alerts is not None:  # alerts block, below: followed runs are watched too
                    if not run.history_told:
                        # Followed from its end as it was when found: what came before is
                        # history the detectors never see, but where it began matters to them.
                        run.history_told = True
                        try:
                            starts = await trio.to_thread.run_sync(
                                _scalar_starts, run, limiter=self._read_limiter
                            )
                        except Exception:  # the detectors go on without it
                            log.warning(
                                "could not list the tags of run %r", run.name, exc_info=True
                            )
                            starts = {}
                        self.alerts.history(run.name, starts)
                    self.alerts.observe(run.name, *view, followed=True)
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

    def _persist(
        self, items: list[tuple[int, Batch | None, bool]]
    ) -> tuple[dict[str, Any], dict[int, Any]]:
        """Append batches to their runs and write them to the OS; runs in a worker thread.

        Returns the new end position of every run written, and the refused batches as
        ``{broker seq: (batch, (RefusedError, root))}`` (``root``: refused for its own failure,
        not because an earlier batch of its writer was). fsync is :meth:`_sync_runs`'s job, so
        that writers that did not ask for durability are acknowledged without waiting for it.

        Each run is written on its own: a failure refuses that run's batches of this call and
        leaves every other run untouched. A run's batches and the bookkeeping record naming
        them go to the recorder in one flush, data first, so a restart never skips data.
        """
        by_run: dict[str, list[tuple[int, Batch]]] = {}
        for seq, batch, _ in items:
            if batch is not None:
                by_run.setdefault(batch.run, []).append((seq, batch))
        positions: dict[str, Any] = {}
        refused: dict[int, Any] = {}
        for name, batches in by_run.items():
            if self._bus is not None:
                run = self._runs[name]
                if not self._bus.holds(name):
                    self._bus_refuse(run, batches, refused)
                    continue
                for _, batch in batches if run.blocked else ():
                    self._bus_settle(run.blocked, run.persisted_seq, batch)
            self._persist_run(self._runs[name], batches, positions, refused)
        return positions, refused

    def _persist_run(
        self,
        run: _Run,
        batches: list[tuple[int, Batch]],
        positions: dict[str, Any],
        refused: dict[int, Any],
    ) -> None:
        """Write one run's batches in parts of about FLUSH_BYTES, in order (blocking).

        A batch behind a refused batch of its writer is refused too, unless that refused batch
        is in this call ahead of it and gets written. A failed part refuses itself and every
        batch after it.
        """
        part: list[tuple[int, Batch]] = []
        size = 0  # the part's bytes (_batch_bytes), which _write_part reuses

        def write(rest: list[tuple[int, Batch]]) -> bool:
            """Write ``part``; on failure refuse it and ``rest`` (the batches after it)."""
            nonlocal part, size
            if not part:
                return True
            try:
                positions[run.name] = self._write_part(run, [b for _, b in part], size)
            except Exception as exc:  # any failure refuses the run's batches
                refusal = refusal_for(exc)
                self._abandon(run)
                for s, b in [*part, *rest]:
                    refused[s] = (b, (refusal, True))
                    if refusal.retryable:
                        _hold(run.blocked, b.writer, b.seq, refusal)
                return False
            for _, b in part:
                held = run.blocked.get(b.writer)
                if held is not None and b.seq == held[0]:
                    del run.blocked[b.writer]  # the refused batch is in: its writer goes on
            part, size = [], 0
            return True

        for index, (seq, batch) in enumerate(batches):
            held = run.blocked.get(batch.writer)
            if held is not None and batch.seq > held[0]:
                if any(b.writer == batch.writer and b.seq == held[0] for _, b in part):
                    if not write(batches[index:]):  # the refused batch is ahead: settle it
                        return
                    held = run.blocked.get(batch.writer)
                if held is not None and batch.seq > held[0]:
                    refused[seq] = (batch, (held[1], False))  # behind a refused batch
                    _hold(run.blocked, batch.writer, batch.seq, held[1])
                    continue
            part.append((seq, batch))
            size += _batch_bytes(batch)
            if size >= FLUSH_BYTES and not write(batches[index + 1 :]):
                return
        write([])

    def _write_part(self, run: _Run, batches: list[Batch], size: int) -> Any:
        """Write ``batches`` of one run and their bookkeeping record in one flush (blocking).

        ``size``: their bytes as :func:`_batch_bytes` estimates them (the caller sized each
        batch once already). Returns the run's new end position. On failure nothing of
        ``batches`` is left for a later flush to write (the caller abandons the writer).
        """
        w = self._writer(run)
        # The recorder would start a new segment in the middle of a flush that does not fit,
        # writing the first part of the batches on its own: a crash there leaves data without its
        # bookkeeping record, and the writer's re-send duplicates it. Start the new segment
        # before the flush instead, so that the flush lands whole in one write.
        estimate = 2 * size + 4096
        offset = w.position().offset
        if offset + estimate > self._segment_bytes and offset >= estimate:
            w = self._rotate(run, offset)
        persisted = dict(run.persisted_seq)
        for batch in batches:
            scalars = batch.scalars
            counts = [len(c.steps) for c in scalars]
            if 0 in counts:  # an empty column adds nothing, and its dtype may be anything
                scalars = [c for c in scalars if len(c.steps)]
                counts = [n for n in counts if n]
            if len(counts) > 1 and max(counts) < GROUP_BELOW:
                # A few points a tag (a live batch): one recorder call for the batch's tags, the
                # columns checked once and their group chunk encoded whole. Larger columns go
                # tag by tag, as the frame holds them: joining them would only copy them
                # (docs/performance.md, "(2026-12-01, h5-persist)").
                w.append_scalar_batch(*_joined_columns(scalars, counts))
            else:
                for cols in scalars:
                    w.append_scalars(cols.tag, cols.steps, cols.walls, cols.values)
            for event in batch.events:
                # The record's data is the event less its common keys, in the event's order: a
                # copy and four pops in C, five times cheaper than a comprehension that tests
                # every key (a histogram has thirteen).
                data = event.copy()
                pop = data.pop
                w.append_record(pop("kind"), pop("tag", None), pop("step", None), pop("wall"), data)
            persisted[batch.writer] = batch.seq
        # After the data it covers, in the same flush, so a restart never skips data; it names
        # only batches handed over here, never ones still queued for persistence.
        w.append_record(INGEST_KIND, None, None, time.time(), persisted)
        run.unsynced = True
        position = w.flush()
        self._note_compaction(run.name, w)
        run.persisted_seq = persisted
        if run.rotating:
            self._reopen(run, NO_ROTATION)
        return position

    def _rotate(self, run: _Run, offset: int) -> recorder.RunWriter:
        """Reopen a run's writer so that its next frame starts a new segment (blocking).

        A writer's ``segment_bytes`` of ``offset`` (its current segment's size) makes the first
        frame of the next flush start a new segment, and no later frame of it (the flush is
        smaller than ``offset``); the writer is then reopened without a limit (:meth:`_reopen`).
        """
        run.rotating = True
        return self._reopen(run, offset)

    def _reopen(self, run: _Run, segment_bytes: int) -> recorder.RunWriter:
        writer, run.writer = run.writer, None
        assert writer is not None
        # Not fsynced after close (sync="never"): fsync first, so _sync_runs, which fsyncs only
        # the open segment, misses nothing.
        writer.sync()
        run.unsynced = False
        writer.close()
        run.writer = recorder.RunWriter(
            run.path,
            sync="never",
            segment_bytes=segment_bytes,
            defer_compaction=True,
            compaction_process=self._compaction_process,
        )
        run.rotating = segment_bytes != NO_ROTATION
        return run.writer

    def _writer(self, run: _Run) -> recorder.RunWriter:
        """Return the run's open writer, opening it (and closing the least recently used one
        past ``max_open_writers``) if needed (blocking)."""
        if run.writer is not None:
            self._open_writers.move_to_end(run.name)
            return run.writer
        while len(self._open_writers) >= self._max_open_writers:
            _, idle = self._open_writers.popitem(last=False)
            self._retire(idle)
        try:
            # The broker schedules fsync itself (_sync_runs), off the acknowledgement path, and
            # starts segments itself (_write_part), between flushes.
            # Compaction, too, is off the acknowledgement path (_compact_runs).
            run.writer = recorder.RunWriter(
                run.path,
                sync="never",
                segment_bytes=NO_ROTATION,
                defer_compaction=True,
                compaction_process=self._compaction_process,
            )
            run.rotating = False
        except OSError as exc:
            if _out_of_files(exc):
                self._shed_writers()
            raise
        self._open_writers[run.name] = run
        return run.writer

    def _shed_writers(self) -> None:
        """Out of file descriptors: close the least recently used half of the open writers, so
        the retry of what was refused finds room (blocking)."""
        for _ in range((len(self._open_writers) + 1) // 2):
            self._retire(self._open_writers.popitem(last=False)[1])

    def _retire(self, run: _Run) -> None:
        """fsync and close a run's writer to free its files (blocking)."""
        writer, run.writer = run.writer, None
        self._open_writers.pop(run.name, None)
        if writer is None:
            return
        try:
            if run.unsynced:
                writer.sync()
                run.unsynced = False
            writer.close()
        except Exception:  # logged; its data was written, only fsync is in doubt
            log.warning("closing the writer of run %r failed", run.name, exc_info=True)
            self._abandon_writer(writer)

    def _abandon(self, run: _Run) -> None:
        """Drop a run's writer after a failed write, writing nothing more (blocking).

        What the failed flush handed over was either written whole or truncated by the
        recorder; the writer is reopened (which checks the files again) on the next batch.
        """
        writer, run.writer = run.writer, None
        self._open_writers.pop(run.name, None)
        if writer is None:
            return
        stats = writer.statistics()
        # fsync what earlier flushes wrote and acknowledged, unless a failed append left part of
        # a batch in the buffer (sync would write it without its bookkeeping).
        if run.unsynced and not stats.pending_records and not stats.pending_points:
            try:
                writer.sync()
                run.unsynced = False
            except Exception:  # a full disk may refuse even this
                log.warning("fsync of run %r failed", run.name, exc_info=True)
        self._abandon_writer(writer)

    @staticmethod
    def _abandon_writer(writer: recorder.RunWriter) -> None:
        # A RunWriter dropped without close() releases its descriptors and its lock and writes
        # nothing more (recorder documents this); run that now rather than at collection.
        writer.__del__()

    def _sync_runs(self) -> bool:
        """fsync every run written since its last fsync; return whether all succeeded (worker
        thread). A run whose fsync fails is abandoned: its pages may be lost, so its writer is
        not trusted again (the next batch reopens the run and checks its files)."""
        ok = True
        for run in list(self._runs.values()):
            if run.unsynced and run.writer is not None:
                try:
                    run.writer.sync()
                    run.unsynced = False
                    self._note_compaction(run.name, run.writer)  # sync() may seal too
                except Exception:  # one run's failure must not stop the others
                    log.warning("fsync of run %r failed", run.name, exc_info=True)
                    ok = False
                    run.unsynced = False  # never fsync again after a failed fsync
                    self._abandon(run)
        return ok

    def _note_compaction(self, name: str, writer: recorder.RunWriter) -> None:
        """Queue run ``name`` for :meth:`_compact_runs` if its writer has compaction waiting
        (persist thread, after a flush or sync that may have sealed a segment)."""
        if writer.compaction_waiting:
            with self._compact_lock:
                self._compact_due.add(name)

    def _compact_runs(self) -> bool:
        """Do up to COMPACT_TURN seconds of the compaction each run's writer has waiting (at
        least one unit); return whether any is left (compaction thread, beside the persist
        thread: ``RunWriter.compact`` is the one writer method safe to call from another
        thread, and the persist thread may close or replace the writer meanwhile). A failure is
        logged and leaves the run's files as they were: compaction swaps files crash-safely."""
        with self._compact_lock:
            due = list(self._compact_due)
        for name in due:
            run = self._runs.get(name)
            writer = None if run is None else run.writer
            left = failed = False
            try:
                left = writer is not None and writer.compact(budget_s=COMPACT_TURN)
            except Exception:  # a full disk: the flushes' bound still applies; retried later
                failed = True  # not at once: the next flush queues the run again
                # A writer closed meanwhile (retired, reopened) is no failure.
                if not writer.closed and self._log_due(name, "compaction"):
                    log.warning("compaction of run %r failed", name, exc_info=True)
            if not left:
                with self._compact_lock:
                    # Unless a flush sealed more since: it queued the run again (or will).
                    if failed or writer is None or not writer.compaction_waiting:
                        self._compact_due.discard(name)
        process = self._compaction_process
        if process is not None and process.restarts > self._compaction_restarts:
            # Its unit was queued again, the files as before it, and done again (here while
            # another process starts): nothing lost, but worth knowing.
            self._compaction_restarts = process.restarts
            log.warning(
                "the compaction process ended and was started again (%d times in all)%s",
                process.restarts,
                "" if process.usable else "; compaction now runs in this process",
            )
        return bool(self._compact_due)

    def _close_runs(self) -> None:
        for run in self._runs.values():
            if run.writer is not None:
                try:
                    run.writer.close()
                except Exception:  # close the others anyway
                    log.warning("closing run %r failed", run.name, exc_info=True)
                run.writer = None
            if run.reader is not None:
                try:
                    run.reader.close()
                except Exception:  # close the others anyway
                    log.warning("closing the reader of run %r failed", run.name, exc_info=True)
        self._open_writers.clear()

    def close(self) -> None:
        """Stop accepting batches. The persist task drains what was accepted, fsyncs and returns."""
        self._send.close()

    async def wait_closed(self) -> None:
        """Return once the persist task has drained, fsynced and closed every run."""
        await self._closed.wait()

    # -- bus (several brokers as one dashboard; vdl_stream/bus.py) -------------------------------

    #: The bus this broker is joined to (``serve --bus``), set by :class:`~vdl_stream.bus.Bus`.
    _bus: Any = None
    #: Runs whose lease this broker has just taken: their next open continues them from the
    #: object store and claims them there (``prepare_write(taken_over=True)``).
    _bus_taken: set[str] | None = None

    def _bus_refuse(
        self, run: _Run, batches: list[tuple[int, Batch]], refused: dict[int, Any]
    ) -> None:
        """Refuse (retryable) the batches of a run whose lease this broker lost before they were
        written (persist thread): another broker writes the run now, the writer goes there."""
        refusal = RefusedError(self._bus.LEASE_LOST, retryable=True)
        for seq, batch in batches:
            refused[seq] = (batch, (refusal, True))
            _hold(run.blocked, batch.writer, batch.seq, refusal)

    def _bus_took(self, name: str) -> None:
        """This broker took the lease of run ``name``: forget what it knew of the run's writers,
        so that the next batch reads their sequence numbers back from the run's files (another
        broker may have written it since)."""
        if self._prepare_write is not None:  # an object store: the run continues from there
            if self._bus_taken is None:
                self._bus_taken = set()
            self._bus_taken.add(name)
        run = self._runs.get(name)
        if run is not None and run.writer is None:
            run.loaded = False
            run.last_seq.clear()
            run.persisted_seq.clear()
            # resend_from and blocked stay: a writer's batch refused here must still come again
            # before its later ones, unless another broker wrote it meanwhile (_bus_settle).

    @staticmethod
    def _bus_settle(
        held: dict[str, tuple[int, RefusedError, int]],
        done: dict[str, int],
        batch: Batch | None = None,
    ) -> None:
        """Forget refusals (``resend_from`` or ``blocked``) of batches that are in the run's files
        after all: another broker wrote them while this one did not hold the run.

        Every batch of the writer refused here must be in the files (``done``: the highest seq
        of each writer there), not only the first: the writer had sent later ones before it heard
        of the refusal, and a refusal settled by its first batch alone let a later batch land
        over the hole between (the batches of the hole were then acknowledged as duplicates: lost).
        With ``batch`` (the persist side: ingest has put each writer's batches in order), its
        writer's refusal is also settled when every refused batch before it is in the files:
        the other broker wrote part of them, and ``batch`` is the first of the rest."""
        for writer, (_, _, last) in list(held.items()):
            if last <= done.get(writer, 0):
                del held[writer]
        if batch is not None:
            entry = held.get(batch.writer)
            if entry is not None and min(entry[2], batch.seq - 1) <= done.get(batch.writer, 0):
                del held[batch.writer]

    async def _bus_publish(self, names: Iterable[str]) -> None:
        """Publish runs ``names`` to the object store now (``--logdir s3://...``; nothing for a
        local log directory): this broker gives them up, and the broker that takes one next
        continues it from the store, so it must hold everything written here."""
        store = getattr(self._prepare_write, "__self__", None)  # the StoreSync, if any
        publish = getattr(store, "publish_run", None)
        for name in names:
            run = self._runs.get(name)
            if publish is None or run is None:
                continue
            try:
                # Abandoned if the caller's deadline passes: the lease then goes anyway, and a
                # PUT that lands after the next broker claimed the run is fenced (refused).
                await trio.to_thread.run_sync(publish, run.path, abandon_on_cancel=True)
            except OSError as exc:  # the lease goes anyway: the store is down or refused it
                log.warning("could not publish run %r before giving it up: %s", name, exc)

    async def _bus_release(self, name: str) -> None:
        """Stop writing run ``name`` (its lease is lost or released): fsync and close its writer,
        so another broker can open it, and follow it again like a run of another process."""
        run = self._runs.get(name)
        if run is None:
            return
        await trio.to_thread.run_sync(self._retire, run, limiter=self._limiter)
        async with run.lock:
            run.local = False
            run.loaded = False
            if run.reader is not None:
                run.reader.close()
                run.reader = None
                self._cache.forget(name)
            # Reopened as a follower: what is on disk then is history, later appends are tailed.
            run.position = None

    @staticmethod
    def _bus_catch_up(run: _Run) -> None:
        """Move a followed run's reader to the end of its files without decoding what it skips
        (blocking; hold ``run.lock``): the bus fanned those records out already."""
        signature, key = following.signed(run.path, _signature)
        reader = _open_reader(run)
        reader.refresh()
        run.signature, run.dir_key = signature, key
        run.position = reader.position()
        _measure(run)

    def _bus_learn(self, name: str) -> bool:
        """Another broker writes run ``name``: serve it here too (its files are in the shared
        log directory, or will be read from the shared store). Return whether it was known."""
        if name in self._runs or self._closed.is_set():
            return True
        try:
            codec.check_run_name(name)
        except ValueError:
            return True  # never from a broker of ours: ignore it
        self._runs[name] = _Run(name, self.logdir / name)
        self._announce()
        return False

    def _bus_fan_out(
        self, name: str, scalars: list[ScalarColumns], events: list[dict[str, Any]]
    ) -> None:
        """Fan out what another broker wrote of run ``name`` to this broker's subscribers."""
        self._bus_learn(name)
        self._fan_out(name, scalars, events)

    def _bus_resend(self, sub: Subscriber, name: str) -> None:
        """Offer ``sub`` again the live frames of run ``name`` that came by the bus and that its
        writing broker had not yet written when it last said (:meth:`Bus.unsettled`)."""
        for scalars, events in self._bus.unsettled(name):
            picked = sub.select(scalars, events)
            if any(picked):
                self._seq += 1
                sub.offer(
                    self._seq, name, codec.encode_live("data", self._seq, name, *picked), picked
                )

    def _bus_gap(self, name: str | None) -> None:
        """Live frames of run ``name`` (None: of every run) were lost between brokers: the
        subscribers concerned are sent a ``gap`` (naming ``name``) and re-sync from snapshots."""
        for sub in self._subscribers:
            if name is None or sub.wants(name):
                sub.mark_gap(name)

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

        Raises:
            SubscriberLimitError: ``max_subscribers`` are subscribed already.
        """
        if len(self._subscribers) >= self._max_subscribers:
            self._subscribers_refused += 1
            raise SubscriberLimitError(
                f"the server already serves {self._max_subscribers} live subscribers"
            )
        sub = Subscriber(runs, self._subscriber_queue, tags, self._subscriber_bytes)
        sub.after_seq = sub.since = self._seq
        sub.known = set(self._runs)
        self._subscribers.add(sub)
        return sub

    def resubscribe(
        self, sub: Subscriber, runs: set[str] | None, max_points: int
    ) -> list[str] | None:
        """Change the runs of ``sub`` in place (a ``subscribe`` with ``keep``): return the runs
        whose snapshots the client still lacks, for :meth:`send_snapshot` (``runs=``).

        The runs ``sub`` was sent a whole snapshot of, with at least ``max_points`` points per
        tag, and that it still covers are kept: their queued and later frames go on, nothing of
        them is read or sent again. Runs it no longer covers get no frame from now on (queued
        ones are dropped). Every other run it covers is returned, and its frames queued before
        now are skipped: its snapshot (which :meth:`send_snapshot` reads to include every batch
        ingested before now) holds them.

        A run that appeared after the subscription last changed, written here or carried by
        the bus, reached the client whole as ``data`` frames: it is kept like a sent snapshot.
        A run that lost frames to a gap of its own (``Subscriber.lost_runs``) is sent afresh.

        Returns None when ``sub`` lost frames of every run (a gap without ``runs``): the client
        re-syncs from a fresh subscription, which the caller makes.
        """
        if sub.lost:
            return None
        # Runs that appeared since and reached the client whole, frame by frame, are as good as
        # any snapshot: those written here, or carried by the bus from their announcement on
        # (not a run found on disk, whose history may not have been offered).
        live = (
            n
            for n, r in self._runs.items()
            if r.local or (self._bus is not None and self._bus.carries(n))
        )
        for name in sub.grown(live):
            sub.snapshots[name] = WHOLE
        for name in sub.lost_runs:  # per-run gaps: these are sent afresh
            sub.snapshots.pop(name, None)
        sub.resynced(self._runs)
        sub.runs = runs
        sub.since = self._seq
        for name, points in list(sub.snapshots.items()):
            if not sub.wants(name) or points < max_points:
                del sub.snapshots[name]
        for name in list(sub.covered):
            if not sub.wants(name):
                del sub.covered[name]
        missing = [n for n in sorted(self._runs) if sub.wants(n) and n not in sub.snapshots]
        for name in missing:
            sub.covered[name] = sub.since
        return missing

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
        self,
        sub: Subscriber,
        send: Callable[[bytes], Awaitable[Any]],
        max_points: int = 2000,
        *,
        runs: Iterable[str] | None = None,
        split: bool = False,
    ) -> None:
        """Like :meth:`snapshot`, but hand each run's frame to ``send`` as soon as it is read, so
        a page over many runs draws the first ones while the others are still being read.

        Args:
            runs: the runs to send (what :meth:`resubscribe` returned); None: every run ``sub``
                covers.
            split: send each run as two frames, ``snapshot`` with its scalars (``events_follow``
                true) and then ``snapshot_events`` with its events, so that a page draws its
                charts before the histograms and images are read, sent and decoded; ignored
                when more than ``SPLIT_RUNS_UP_TO`` runs are sent (each run then comes whole).

        Frames are sent by a task of their own while the next ones are read, up to
        ``SNAPSHOT_RUNS`` runs at a time, taken in the order of ``runs``: each run's frames go in
        order, frames of different runs may interleave. A run counts as sent
        (``sub.snapshots``) once its last frame was handed to ``send``.
        """
        # Batches ingested before the subscription were never offered to ``sub``: the snapshot
        # must hold them, so wait until they are written. Nothing to wait for when only
        # followed runs moved (what was fanned out of them was on disk already).
        await self.wait_persisted(min(sub.since, self._ingest_seq))
        names = sorted(self._runs) if runs is None else list(runs)
        # Counted among the runs ``sub`` wants: a page's first subscription names 10 of 1,000.
        many = sum(map(sub.wants, names)) > SPLIT_RUNS_UP_TO
        split = split and not many
        # (frame, the run it completes or None); a frame or two of read-ahead.
        to_send, to_sender = trio.open_memory_channel[tuple[bytes, str | None]](SNAPSHOT_AHEAD)

        async def sender() -> None:
            async for frame, done in to_sender:
                await send(frame)
                if done is not None:
                    sub.snapshots[done] = max_points

        queue = iter(names)  # shared by the readers: each takes the next run

        async def reader() -> None:
            for name in queue:
                for item in await self._snapshot_frames(sub, name, max_points, split, to_send):
                    await to_send.send(item)
                await self._trim()

        if many:  # what the reader processes read: they start now if they are not up
            self._pool_now.set()
        self._snapshots_open += 1
        try:
            async with trio.open_nursery() as nursery:
                if many:
                    # Many runs, each read whole: their files are asked of the disk at once, in
                    # the order they are read, instead of a chunk at a time by each read (a
                    # selection of 100 runs no longer in the page cache: docs/performance.md,
                    # h5-select).
                    paths = [self._runs[n].path for n in names if n in self._runs and sub.wants(n)]
                    nursery.start_soon(trio.to_thread.run_sync, _prefetch_runs, paths)
                nursery.start_soon(sender)
                async with to_send, trio.open_nursery() as readers:
                    for _ in range(min(SNAPSHOT_RUNS, len(names))):
                        readers.start_soon(reader)
        finally:
            self._snapshots_open -= 1
            self._snapshot_ended = trio.current_time()
        if len(self._runs) > SPLIT_RUNS_UP_TO:
            self._pool_wanted.set()

    async def _snapshot_frames(
        self,
        sub: Subscriber,
        name: str,
        max_points: int,
        split: bool,
        to_send: trio.MemorySendChannel[tuple[bytes, str | None]],
    ) -> list[tuple[bytes, str | None]]:
        """Read the snapshot of run ``name`` for ``sub``; return its frames still to send. With
        ``split`` the scalars frame is handed to ``to_send`` before the events are read, if
        there is room (never waiting for a browser while the run's lock is held)."""
        run = self._runs.get(name)
        if run is None or not sub.wants(name):
            return []
        frames: list[tuple[bytes, str | None]] = []
        async with run.lock:
            # Under the run's lock its reader's end and the seqs given out for it agree: a
            # followed run's data is fanned out under this lock, and a written run's position
            # moves together with the written seq (both set at once on the event loop, so they
            # are taken together here, and both reads stop at that one position).
            covered = self._written_seq if run.local else self._seq
            if self._bus is not None and not run.local:
                # bus: frames fanned out before ``covered`` that the run's writing broker has
                # not yet reported in its files may be missing from them: sent again after the
                # snapshot (twice rather than not at all)
                self._bus_resend(sub, name)
            try:
                if self._bus is not None and not run.local and self._bus.carries(name):
                    # bus: live frames of this run come by the bus, and the files hold
                    # what they carried: read them to their end (what the frames fanned out
                    # meanwhile repeat comes twice, rather than not at all)
                    await trio.to_thread.run_sync(
                        self._bus_catch_up, run, limiter=self._read_limiter
                    )
                limit = run.position
                pool = self._reader_pool
                if not split and pool is not None and pool.ready:
                    scalars, events = await trio.to_thread.run_sync(
                        _read_snapshot_by, pool, run, limit, max_points, limiter=self._read_limiter
                    )
                elif not split:  # both parts in one hand-off: the frame waits for both anyway
                    scalars, events = await trio.to_thread.run_sync(
                        _read_snapshot, run, limit, max_points, limiter=self._read_limiter
                    )
                else:
                    scalars = await trio.to_thread.run_sync(
                        _snapshot_scalars, run, limit, max_points, limiter=self._read_limiter
                    )
            except Exception as exc:  # one unreadable run never stops the snapshot
                self._read_failed(run, exc)
                return []
            if split:
                picked, _ = sub.select(scalars, [])
                frame = codec.encode_live("snapshot", covered, name, picked, [], events_follow=True)
                try:
                    to_send.send_nowait((frame, None))
                except trio.WouldBlock:
                    frames.append((frame, None))
                try:
                    events = await trio.to_thread.run_sync(
                        _snapshot_events, run, limit, limiter=self._read_limiter
                    )
                except Exception as exc:
                    self._read_failed(run, exc)
                    events = []  # the scalars went: the run stands without its events (logged once)
            sub.covered[name] = covered
            self._cache.update(run)
            if self.alerts is not None and self.alerts.held(name):  # alerts block: a
                # followed run's alerts, held (not recorded), as of ``covered``
                events = sorted(events + self.alerts.held(name), key=lambda e: e["wall"])
        if split:
            _, events = sub.select([], events)
            events = [codec.event_for_browser(e) for e in events]
            frame = codec.encode_message(
                {"type": "snapshot_events", "seq": covered, "run": name, "events": events}
            )
        else:
            frame = codec.encode_live("snapshot", covered, name, *sub.select(scalars, events))
        frames.append((frame, name))
        return frames

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
        return await self._read(name, _read_scalars, tag, start, end, max_points)

    async def read_events(
        self, name: str, kind: str, tag: str | None = None
    ) -> list[dict[str, Any]]:
        """Read the events of one kind (and tag) of a run from disk, as event maps, in write order."""
        if kind not in codec.EVENT_KINDS:
            raise KeyError(name)
        records = await self._read(name, _read_records, kind, tag)
        events = [_record_event(r) for r in records]
        if kind == "alert" and self.alerts is not None:  # alerts block: a followed run's alerts
            held = [e for e in self.alerts.held(name) if tag is None or e.get("tag") == tag]
            if held:
                events = sorted(events + held, key=lambda e: e["wall"])
        return events

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
            self._refusal_count,
            len(self._open_writers),
            self._subscribers_refused,
        )

    def subscriber_statistics(self) -> list[SubscriberStatistics]:
        """Return the statistics of every subscriber."""
        return [s.statistics() for s in self._subscribers]

    # -- run summaries (docs/http-api.md, "Run summaries"; vdl_stream/run_summary.py) ----------

    def _summarize(
        self, name: str, scalars: list[ScalarColumns], events: list[dict[str, Any]]
    ) -> None:
        """Fold data being fanned out, in its ``legacy_view``, into the run's summary (never
        reads the run)."""
        run = self._runs.get(name)
        if run is None:
            return
        if run.summary is None:  # not expected: discovery and load_ingest_state set one
            run.summary = RunSummary(name, time.time())
        run.summary.add(scalars, events, time.time())

    def _check_shared(self, run: _Run, batch: Batch) -> None:
        """Notice two writers logging one series of ``run`` at once.

        Each writer numbers its own steps, so their batches interleave two step sequences in one
        series, and every read applies the restart rule (docs/guide.md, "Runs, restarts and
        ranks"): most of both writers' points are hidden once the run is read back, though the
        live view showed them. A series that goes from writer A to B and back to A is written by
        both at once; a resumed job (A, then B for good) is not, nor are ranks that each log
        series of their own (telemetry). Both writers hear of it (:meth:`take_notices`), the
        server logs it, once per pair of writers in a run, and the alert engine raises its
        ``writers`` alert (docs/alerts.md)."""
        writer = batch.writer
        owners = run.series_writers
        shared = None
        for key, tag, part in _series(batch):
            owner = owners.get(key)
            if owner is None:
                if len(owners) < WATCHED_SERIES:
                    owners[key] = (writer, None)
            elif owner[0] != writer:
                owners[key] = (writer, owner[0])
                if owner[1] == writer and shared is None:
                    shared = (tag, owner[0], part)
        if shared is None:
            return
        tag, other, part = shared
        step = int(part.steps[0]) if isinstance(part, ScalarColumns) else part["step"]
        pair = frozenset((writer, other))
        if pair in run.shared_by:
            return
        run.shared_by.add(pair)
        # Said in the run's own context (a writer's warning, an alert of the run): no run name.
        text = (
            f"two writers log {tag!r} at once; each numbers its own steps, so a read keeps only "
            "the newest points after each restart of the steps and hides most of both; give "
            "each job its own run (attach(run=...))"
        )
        log.warning("run %r: %s (writers %s and %s)", run.name, text, other, writer)
        if self.alerts is not None:  # alerts block: the page shows it too, at the step
            self.alerts.shared_series(run.name, tag, step, text)
        for one in (writer, other):
            notices = self._notices.pop(one, [])
            if len(notices) < NOTICES_PER_WRITER:
                notices.append(text)
            self._notices[one] = notices
        while len(self._notices) > NOTICE_WRITERS:
            self._notices.popitem(last=False)

    def take_notices(self, writer: str) -> list[str]:
        """What the broker has to tell ``writer`` (each once), e.g. that another writer logs
        one of its series at once: the server sends each as a ``notice`` (docs/protocol.md),
        and the writer warns in the training thread."""
        if not self._notices:
            return []
        return self._notices.pop(writer, [])

    def writer_lost(self, runs: Iterable[str]) -> None:
        """The writer of ``runs`` is gone (its connection ended, or its process): each of them
        that did not get the close marker is ``crashed`` until its next batch, and the alert
        engine's crash rule hears of it (docs/alerts.md)."""
        runs = list(runs)
        for name in runs:
            run = self._runs.get(name)
            if run is not None and run.summary is not None:
                run.summary.lost_writer()
        if self.alerts is not None:
            self.alerts.writer_lost(runs)

    def _summary_objects(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        now = time.time()
        out = []
        for name in sorted(self._runs) if names is None else names:
            run = self._runs.get(name)
            if run is not None and run.summary is not None:
                out.append(run.summary.to_json(now, self._crash_after))
        return out

    def _summary_frame(self, names: Iterable[str] | None = None) -> bytes:
        now = time.time()
        packed = []
        for name in sorted(self._runs) if names is None else names:
            run = self._runs.get(name)
            if run is not None and run.summary is not None:
                packed.append(run.summary.msgpack_bytes(now, self._crash_after))
        return summaries_frame(packed)

    def summaries(self) -> list[dict[str, Any]]:
        """Return every run's summary object, sorted by name (shared objects: do not change)."""
        return self._summary_objects()

    def summaries_json(self) -> bytes:
        """Return ``{"runs": [summary, ...]}`` as JSON text; each summary is encoded once per
        change, so this costs a join whatever the points per run."""
        now = time.time()
        parts = [b'{"runs":[']
        for name in sorted(self._runs):
            summary = self._runs[name].summary
            if summary is not None:
                parts += (summary.json_bytes(now, self._crash_after), b",")
        if len(parts) > 1:
            parts.pop()  # the last comma
        parts.append(b"]}")
        return b"".join(parts)  # one copy of the answer (a megabyte for 1,000 runs)

    @property
    def summary_tick(self) -> int:
        """The number of summary publications so far (see :meth:`summaries_frame`)."""
        return self._summary_tick

    def summaries_frame(self, since: int | None = None) -> bytes | None:
        """Return a ``summaries`` frame of every run (``since`` None), or of the runs whose
        summary was published after publication ``since`` (None when there are none)."""
        if since is None:
            names = None
        else:
            names = [n for n, (_, _, tick) in sorted(self._published.items()) if tick > since]
            if not names:
                return None
        return self._summary_frame(names)

    def publish_summaries(self) -> int:
        """Offer the summaries that changed since the last call (in content or in status) to
        every subscriber, as one ``summaries`` frame; return how many runs it holds."""
        now = time.time()
        changed = []
        for name, run in self._runs.items():
            summary = run.summary
            if summary is None:
                continue
            status = summary.status(now, self._crash_after)
            seen = self._published.get(name)
            if seen is None or seen[0] != summary.version or seen[1] != status:
                changed.append((name, summary.version, status))
        for name in [n for n in self._published if n not in self._runs]:
            del self._published[name]  # skipped or removed runs
        if not changed:
            return 0
        self._summary_tick += 1
        for name, version, status in changed:
            self._published[name] = (version, status, self._summary_tick)
        frame = self._summary_frame(sorted(name for name, _, _ in changed))
        for sub in self._subscribers:
            sub.offer(self._seq + 1, None, frame)
        return len(changed)

    async def _publish_summaries(self, interval: float) -> None:
        """Publish changed summaries every ``interval`` seconds (started by :meth:`follow`)."""
        while True:
            await trio.sleep(interval)
            self.publish_summaries()

    async def _fill_summaries(self) -> None:
        """Give a few followed runs that have only a placeholder summary (no current digest on
        disk) their real one, by opening their reader: the most recently written first."""
        waiting = [
            r
            for r in self._runs.values()
            if not r.summary_exact and not r.local and r.position is None and not r.summary_failed
        ]
        waiting.sort(key=lambda r: max((m for _, _, m in r.signature or ()), default=0))
        for run in waiting[-SUMMARY_FILLS:]:
            async with run.lock:
                if run.summary_exact or self._runs.get(run.name) is not run:
                    continue
                try:
                    await trio.to_thread.run_sync(_open_reader, run, limiter=self._read_limiter)
                except Exception as exc:  # one unreadable run never stops the others
                    run.summary_failed = True  # and is not tried again by this loop
                    self._read_failed(run, exc)
                    continue
                self._cache.update(run)
            await self._trim()

    # -- foreign runs (vdl_stream/foreign.py; docs/interop.md) ------------------------------------

    #: The follower of the TensorBoard and VisualDL files under the log directory, set by
    #: ``serve``; it ingests what they append into read-only runs kept in its mirror directory.
    foreign: Any = None

    def _run_dir(self, name: str) -> Path:
        """Where run ``name`` is kept: its foreign mirror, or its directory in the log directory."""
        if self.foreign is not None:
            mirror = self.foreign.mirror_path(name)
            if mirror is not None:
                return mirror
        return self.logdir / name

    async def written_upto(self, name: str, writer: str) -> int:
        """Open run ``name`` for ingest and return the last seq of ``writer`` it holds (0: none).

        Raises:
            RefusedError: the run cannot be opened (as :meth:`ingest`).
        """
        run = await self._get_run(name)
        return run.last_seq.get(writer, 0)

    def _foreign_refusal(self, batch: Batch) -> RefusedError | None:
        """A writer's batch for a read-only foreign run is refused (the alert engine's are not)."""
        if self.foreign is None or batch.writer == ALERTS_WRITER:
            return None
        return self.foreign.refusal(batch)

    # -- alerts (vdl_stream/alerts.py; docs/alerts.md) ------------------------------------------

    #: The detectors watching this broker's ingest, set by :meth:`AlertEngine.run` while it
    #: runs. Ingest only queues each batch for them (never waits), and skips their own alerts.
    alerts: AlertEngine | None = None

    def followed(self, name: str) -> bool:
        """Whether ``name`` is a run this broker only follows (another process writes it), so
        that alerts on it cannot be recorded in it (docs/alerts.md)."""
        run = self._runs.get(name)
        return run is not None and not run.local

    async def publish_alerts(self, name: str, events: list[dict[str, Any]]) -> None:
        """Push alert events of a followed run to its subscribers without recording them (the
        run's writer lock is another process's) and without counting them in its summary."""
        run = self._runs.get(name)
        if run is None:
            return
        async with run.lock:  # as followed data: a snapshot sees either none or all of it
            if self._runs.get(name) is run and self.alerts is not None:
                self.alerts.hold(name, events)
                self._fan_out(name, [], events, summarize=False)


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


_MTIME = operator.itemgetter(2)  # of a signature's entry: its file's st_mtime_ns


def _signature(path: Path) -> tuple:
    """What identifies the state of a run's files: each segment's, block's (compacted chunks)
    and the index's name, size and modification time. Reads no file, opens none.

    Raises:
        UnreadableRunError: one of them is a symbolic link or not a regular file (a FIFO would
            block a reader forever; a link may lead out of the log directory).
    """
    items = []
    with os.scandir(path) as it:
        for item in it:
            if not (
                SEGMENT_RE.match(item.name) or BLOCK_RE.match(item.name) or item.name == INDEX_NAME
            ):
                continue
            if item.is_symlink() or not item.is_file(follow_symlinks=False):
                what = "a symbolic link" if item.is_symlink() else "not a regular file"
                raise UnreadableRunError(f"{path / item.name} is {what}")
            st = item.stat(follow_symlinks=False)
            items.append((item.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(items))


def _open_follower(run: _Run, skipped: tuple | None) -> bool:
    """Check a run found on disk (blocking): its files' kinds and segment headers. Reads no
    record and keeps nothing open: its reader opens when a page reads it or its files change.

    Returns False when there is nothing to follow yet, or its files are as they were when it
    was skipped.

    Raises:
        UnreadableRunError, recorder.FormatError: files the broker will not read.
    """
    try:
        signature, run.dir_key = following.signed(run.path, _signature)
    except UnreadableRunError:
        run.signature = run.dir_key = None
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


def _discovered(run: _Run, skipped: tuple | None, crash_after: float) -> bool:
    """:func:`_open_follower`, then the run's summary from the recorder's digest when it is
    current, else a placeholder, encoded for answers (blocking). Reads one small file a run."""
    opened = _open_follower(run, skipped)
    if opened:
        files = sorted(
            (name, size)
            for name, size, _ in run.signature or ()
            if BLOCK_RE.match(name) or (SEGMENT_RE.match(name) and size > framing.HEADER_SIZE)
        )
        digest = load_digest(run.path, files)
        if digest is not None:
            run.summary = RunSummary.from_digest(run.name, digest, _heard(run))
            run.summary_exact, run.summary_files = True, digest.files
        else:
            run.summary = RunSummary(run.name, _heard(run))
            run.summary_exact, run.summary_files = False, None
        run.summary.prime(time.time(), crash_after)
    return opened


def _heard(run: _Run) -> float:
    """When a followed run last changed: its newest file's modification time."""
    return max((m for _, _, m in run.signature or ()), default=time.time_ns()) / 1e9


def _summary_on_open(run: _Run) -> None:
    """A followed run's reader was opened for the first time (blocking; hold ``run.lock``):
    from here on its fan-out updates the summary, so the summary must cover exactly what the
    reader holds. One taken from a digest still does if the files did not change since."""
    if run.summary_exact and (
        run.summary_files is None or data_files(run.path) == run.summary_files
    ):
        run.summary_files = None
        return
    assert run.reader is not None
    try:
        # Its files as they are now (run.signature may be older: _poll sets it after this).
        heard = max((m for _, _, m in _signature(run.path)), default=time.time_ns()) / 1e9
        run.summary = RunSummary.from_reader(run.name, run.reader, heard)
    except Exception as exc:  # the run's reads report their own errors; this one is a shortcut
        run.summary_failed = True
        log.warning("vdl-stream: no summary of run %r: %s", run.name, _describe(exc))
        return
    run.summary_exact, run.summary_files = True, None


def _summary_from_disk(run: _Run, reader: recorder.RunReader) -> None:
    """The summary of a run this broker starts writing (blocking): from its digest when
    current, else from ``reader``."""
    digest = load_digest(run.path)
    now = time.time()
    if digest is not None:
        run.summary = RunSummary.from_digest(run.name, digest, now)
    else:
        run.summary = RunSummary.from_reader(run.name, reader, now)
    run.summary_exact, run.summary_files = True, None


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
            _summary_on_open(run)
    elif run.local:
        run.reader.refresh(run.position if limit is None else limit)
    run.used = time.monotonic()
    return run.reader


def _open_primed(run: _Run, prime: bool) -> None:
    """Open a followed run's reader and, with ``prime``, read its snapshot's scalars once
    (blocking; hold ``run.lock``): the reader keeps downsampled reads until the run changes, so
    the first page's snapshot of it finds them read (about 0.2 s of CPU for a 24-hour run's ten
    tags, 2 ms for ten tags of 10,000 points)."""
    _open_reader(run)
    if prime:
        _snapshot_scalars(run, run.position, SNAPSHOT_POINTS)
    else:
        _measure(run)


def _poll(run: _Run) -> list[recorder.Record]:
    """Read what was appended to a followed run since the last poll (blocking; hold
    ``run.lock``); reopens a reader closed while idle where it stopped."""
    # Taken before reading: what is appended meanwhile changes the files again, and is read
    # by the next poll; the directory's key before that (following.py).
    signature, key = following.signed(run.path, _signature)
    reader = _open_reader(run)
    records = reader.poll()
    run.base += len(records) * READER_RECORD_BYTES
    run.signature, run.dir_key = signature, key
    run.position = reader.position()
    _measure(run)
    return records


def _scalar_starts(run: _Run) -> dict[str, int]:
    """Each scalar tag of a followed run with its first step in the run's files, from its
    reader's index (blocking; hold ``run.lock``, right after :func:`_poll`); {} when the run
    cannot say (its reader was closed meanwhile)."""
    reader = run.reader
    if reader is None:
        return {}
    return {
        tag: info.step_min
        for tag, info in reader.tags().items()
        if info.kind == "scalars" and info.step_min is not None
    }


def _prefetch_runs(paths: list[Path]) -> int:
    """:func:`recorder.reader_pool.prefetch` of each run of ``paths``, in order (blocking,
    briefly); the bytes asked for."""
    return sum(prefetch(path) for path in paths)


def _read_snapshot(
    run: _Run, limit: Any, max_points: int
) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
    """Read a run up to ``limit``, downsampled for drawing: :func:`_snapshot_scalars` and
    :func:`_snapshot_events` at once, the reader opened, its tags listed and its memory measured
    once (blocking; hold ``run.lock``)."""
    try:
        reader = _open_reader(run, limit)
    except recorder.NotARunError:
        return [], []
    tags = reader.tags()
    scalars, events = _scalars_of(reader, tags, max_points), _events_of(reader, tags)
    _measure(run)
    return scalars, events


def _read_snapshot_by(
    pool: recorder.ReaderPool, run: _Run, limit: Any, max_points: int
) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
    """:func:`_read_snapshot`, the scalars the run's reader has not kept read by one of
    ``pool``'s processes up to the reader's position while this thread reads the events, then
    kept by the reader as if it had read them (blocking; hold ``run.lock``). A run the pool
    cannot answer for (damaged, changed, unreadable; a process lost) is read here, as before."""
    try:
        reader = _open_reader(run, limit)
    except recorder.NotARunError:
        return [], []
    tags = reader.tags()
    kept: dict[str, recorder.ScalarSeries | None] = {}
    for tag, info in tags.items():
        if info.kind == "scalars":
            kept[tag] = reader.read_scalars_kept(tag, max_points)
    missing = [tag for tag, s in kept.items() if s is None]
    if not missing:
        events = _events_of(reader, tags)
    else:
        position = reader.position()
        try:
            series, events = pool.read(
                str(run.path), position, missing, max_points, lambda: _events_of(reader, tags)
            )
        except RuntimeError as exc:
            if pool.ready:
                raise  # the events' read
            log.warning("reader processes closed (%s)", exc)
            series = None
        if series is None:
            return _read_snapshot(run, limit, max_points)
        for tag, s in zip(missing, series, strict=True):
            reader.keep_scalars(tag, max_points, s)
            kept[tag] = s
    _measure(run)
    scalars = [ScalarColumns(tag, *s) for tag, s in kept.items() if s is not None]
    return scalars, events


def _snapshot_scalars(run: _Run, limit: Any, max_points: int) -> list[ScalarColumns]:
    """The scalar part of a snapshot: every scalar tag of a run up to ``limit``, downsampled to
    ``max_points`` (blocking; hold ``run.lock``)."""
    try:
        reader = _open_reader(run, limit)
    except recorder.NotARunError:
        return []
    scalars = _scalars_of(reader, reader.tags(), max_points)
    _measure(run)
    return scalars


def _snapshot_events(run: _Run, limit: Any) -> list[dict[str, Any]]:
    """The event part of a snapshot: up to ``SNAPSHOT_EVENTS`` events of every event tag (picked
    over the run by the reader) and the untagged kinds of a run up to ``limit``, in wall order
    (blocking; hold ``run.lock``)."""
    try:
        reader = _open_reader(run, limit)
    except recorder.NotARunError:
        return []
    events = _events_of(reader, reader.tags())
    _measure(run)
    return events


def _scalars_of(
    reader: recorder.RunReader, tags: dict[str, recorder.TagInfo], max_points: int
) -> list[ScalarColumns]:
    """Every scalar tag of ``tags`` (the reader's), downsampled to ``max_points`` (blocking)."""
    scalars = []
    for tag, info in tags.items():
        if info.kind == "scalars":
            # A tag not loaded is downsampled chunk by chunk, keeping nothing (bounded memory).
            s = reader.read_scalars(tag, max_points=max_points)
            scalars.append(ScalarColumns(tag, s.steps, s.walls, s.values))
    return scalars


def _events_of(
    reader: recorder.RunReader, tags: dict[str, recorder.TagInfo]
) -> list[dict[str, Any]]:
    """The events of a snapshot from ``reader`` (``tags``: its tags), in wall order (blocking)."""
    events = []
    for tag, info in tags.items():
        if info.kind in codec.EVENT_KINDS:
            # Thinned by the reader: only the picked events of a long run are decoded.
            count = SNAPSHOT_EMBEDDINGS if info.kind == "embedding" else SNAPSHOT_EVENTS
            records = reader.read_records(kind=info.kind, tag=tag, limit=count)
            events.extend(_record_event(r) for r in records)
    for kind, count in UNTAGGED_SNAPSHOT.items():  # events without a tag are not in tags()
        records = reader.read_records(kind=kind, limit=count)
        events.extend(_record_event(r) for r in records if r.tag is None)
    events.sort(key=lambda e: e["wall"])
    return events


def _read_scalars(
    run: _Run,
    tag: str,
    start: int | None,
    end: int | None,
    max_points: int | None,
) -> recorder.ScalarSeries:
    reader = _open_reader(run)
    series = reader.read_scalars(tag, start=start, end=end, max_points=max_points)
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
