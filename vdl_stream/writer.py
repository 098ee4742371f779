"""The writer: what training code calls on every batch.

The hot path (``add_scalar``) validates cheaply and extends its tag's column buffer; nothing
else. A background thread running its own trio loop takes what was appended, turns it into
columnar batches and hands them to a transport: the in-process broker, or a remote
``vdl-stream serve`` over a WebSocket. The training loop never waits for the dashboard, except in
``flush()`` and ``close()``, which wait (with a timeout) for durability.

Flushing adapts to the link (the opposite of Nagle's algorithm): while fewer than ``window``
batches are in flight (not yet acknowledged, i.e. written; with ``transport.TAKEN`` on, not yet
taken by the broker: ingested and fanned out, and over a socket whose broker says so, one batch
at a time: ``transport.TAKEN_IN_FLIGHT``), the next call wakes the background thread and its
point leaves at once; while the window is full, calls accumulate and leave together as soon as an
answer frees a place. So low rates get the lowest latency and high rates the biggest batches. A
window of 2 (the default) lets a point leave while the previous batch is still being written,
instead of waiting for that write (with ``TAKEN``, at most ``transport.UNACKED_PER_WINDOW``
windows wait for their writes). ``flush_interval`` bounds the wait while the window is full only
when the points held reach :data:`MAX_HELD_POINTS` (or the transport cannot take batches at all):
under overload the writer merges calls into fewer, larger batches, which the broker handles at a
fraction of the per-batch cost, rather than queueing many small ones behind the link. The hot path
pays nothing for it: the wake rides on the ``_attention`` flag it already tests.

Every argument is checked at the call, so the background thread only sees what it can store. It
still never stops on a failure: the pump (hot path -> pending batches) never waits on the
transport; pending batches are bounded in memory and spill to a temporary file; a separate task
hands them over in order, keeping and retrying one that fails; and what went wrong reaches the
training thread as one warning per reason on its next call (a flag it already tests, no lock).

The scalar path: one dict lookup per call finds the tag's flat buffer ``[step, value, wall, ...]``
(a tag is checked once, when first seen) and extends it by the call's three items at once, so the
buffer always holds whole points. The pump, woken at most once per batch, cuts each buffer's
prefix and makes its three columns with one ``np.fromiter`` each: no Python work per point, no
per-point objects kept alive, no regrouping by tag. From there a value is copied at most three
times before the ``pwritev`` that writes it (docs/performance.md, "The scalar path, copy by
copy").

    add_* --extend/append--> per-tag buffers, events --pump, when the link is free (or every
          interval)--> _Pending (memory, then Spool file) --_deliver, in order, retried-->
          transport --> broker;
          _pace: link free and nothing waiting --> arm the next call's wake;
          flush() --_confirm--> wait_acked
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import socket
import threading
import time
import uuid
import warnings
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import trio

from . import codec, summaries
from .codec import Batch, ScalarColumns
from .errors import describe, unwrap
from .run_summary import CLOSED, RUNNING, STATUS_KEY
from .summaries import to_float, to_step
from .transport import WINDOW, Spool, Transport, TransportStatistics

log = logging.getLogger("vdl_stream.writer")


#: The keys under which a histogram event waits, until the background thread bins it: the copy
#: of its values and its number of bins (never sent: binned before a batch is made). Two keys,
#: not one tuple: a dict holding only strs, numbers, None and arrays is left untracked by the
#: cyclic garbage collector, a fresh tuple makes it tracked. So the events of a burst, waiting
#: to be binned, are not traversed by every collection meanwhile, nor promoted to the oldest
#: generation (docs/performance.md, "Histograms: the process CPU per call").
_BIN = "_bin"
_BUCKETS = "_buckets"

#: The public logging calls; a rank that does not log replaces them all with a no-op.
LOGGING_METHODS = (
    "add_scalar",
    "add_scalars",
    "add_histogram",
    "add_image",
    "add_text",
    "add_audio",
    "add_hparams",
    "add_pr_curve",
    "add_roc_curve",
    "add_video",
    "add_figure",
    "add_graph",
    "add_embedding",
    "alert",
)


#: While the in-flight window is full, calls accumulate in the hot path's buffers (merged into the
#: next batch) up to this many points, or :data:`MAX_HELD_EVENTS` other events of at most
#: :data:`MAX_HELD_BYTES` (estimated) in all; past that the pump cuts a batch at its interval
#: anyway, into the pending queue that spills to a file, so memory stays bounded (a broker that is
#: down, say).
MAX_HELD_POINTS = 1 << 16
MAX_HELD_EVENTS = 64
MAX_HELD_BYTES = 8 << 20

#: Batches waiting for the transport are kept in memory up to this many bytes (estimated), then
#: spilled to a temporary file (a transport :class:`Spool`), so a stalled or failing broker never
#: makes the training process grow without bound.
PENDING_MEMORY_BYTES = 64 << 20
#: Spilled batches beyond this many bytes are dropped, oldest first, with a warning.
PENDING_DISK_BYTES = 4 << 30
#: Backoff between attempts to hand a batch to a transport that failed: from 50 ms doubling to 2 s.
RETRY_FIRST, RETRY_MAX = 0.05, 2.0
#: Distinct problem reasons a writer warns about, at most (a warning is given once per reason).
MAX_WARNED_REASONS = 100
#: Copies of ``add_histogram``'s values waiting to be binned, at most this many bytes (past
#: that a call bins its values itself); and arrays kept for later copies, as many bytes at most.
SPARE_BYTES = 64 << 20
#: ``add_histogram`` copies values of up to this many bytes holding the GIL (a few tens of
#: microseconds at most), larger ones with numpy, which releases it meanwhile.
HELD_COPY_BYTES = 1 << 20


def _event_bytes(event: dict[str, Any]) -> int:
    """A cheap estimate of an event's size in memory (its str/bytes payloads dominate, or the
    copy of a histogram's values waiting to be binned)."""
    size = 96
    for value in event.values():
        kind = type(value)
        if kind is float or kind is int or value is None:  # most values: no isinstance calls
            continue
        if kind is bytes or kind is str or isinstance(value, (bytes, str)):  # exact types first
            size += len(value)
        elif isinstance(value, (dict, list)):
            size += 64 * len(value)
    waiting = event.get(_BIN)
    if waiting is not None:
        size += waiting.nbytes
    return size


def _binned_bytes(event: dict[str, Any]) -> int:
    """:func:`_event_bytes` of a binned histogram event, from the four of its thirteen values
    that are not numbers or None (its kind, tag, edges and counts), without walking them all."""
    return 96 + len(event["kind"]) + len(event["tag"]) + len(event["edges"]) + len(event["counts"])


def _batch_bytes(batch: Batch, events_bytes: int | None = None) -> int:
    """A cheap estimate of a batch's size in memory; ``events_bytes``: its events' share, when
    the caller sized them already."""
    size = 128 + sum(24 * len(c) + len(c.tag) for c in batch.scalars)
    if events_bytes is None:
        events_bytes = sum(_event_bytes(e) for e in batch.events)
    return size + events_bytes


class _SpareArrays:
    """The copies of ``add_histogram``'s values, from the call until the background thread has
    binned them: bounded, and their arrays reused.

    ``add_histogram`` copies its values (the caller may change its array once the call returned)
    and the background thread bins them later. A fresh copy is fresh memory, and faulting it in
    costs several times the copy itself (10k float32: 25 to 35 us in 4 KB pages against ~1 us,
    measured in docs/performance.md). So the copies go into arrays of the same dtype and size that
    earlier calls used, as many as are in flight at once; and new arrays are cut from one arena
    of ``limit`` bytes that asks the kernel for 2 MB pages (``MADV_HUGEPAGE``, Linux): a 40 KB
    copy into fresh arena memory faults in its share of a huge page, 4 to 6 us here, not ten 4 KB
    pages. The arena is mapped on the first copy and only what is touched becomes resident; its
    arrays are kept for later copies. Past the arena (or without one), arrays come from
    ``np.empty`` and are kept only within ``limit`` bytes when there is no arena. And at most
    ``limit`` bytes of copies wait to be binned: past that (the background thread is behind),
    :meth:`full` tells the call to bin its values itself, so memory stays bounded.

    Lock-free between its two threads: only the training thread takes (``copy``) and only the
    background thread gives back (``give_back``); each keeps its own byte counts, so no count is
    ever written by both threads.
    """

    def __init__(self, limit: int) -> None:
        self._free: dict[tuple[np.dtype[Any], int], list[np.ndarray]] = {}
        self._limit = limit
        self._taken = 0  # bytes of kept arrays taken out again (training thread)
        self._copied = 0  # bytes copied (training thread)
        self._given = 0  # bytes of arrays kept (background thread)
        self._binned = 0  # bytes of copies binned (background thread)
        self._arena: np.ndarray | None = None  # uint8, mapped on the first copy
        self._arena_used = 0  # bytes of the arena cut into arrays (training thread)

    def full(self) -> bool:
        """Whether the copies waiting to be binned have reached the bound."""
        return self._copied - self._binned >= self._limit

    def copy(self, arr: np.ndarray) -> np.ndarray:
        """A flat copy of ``arr``, in a kept array when one fits (training thread)."""
        spares = self._free.get((arr.dtype, arr.size))
        if spares:  # only this thread pops: the list cannot empty between the test and the pop
            flat = spares.pop()
            self._taken += flat.nbytes
        else:
            flat = self._new(arr.dtype, arr.size)
        self._copied += flat.nbytes
        if flat.nbytes <= HELD_COPY_BYTES:
            # Bytes for bytes, holding the GIL: np.copyto releases it for the ~1 us of a 40 KB
            # copy, and each release is a chance for the background thread to take it and the
            # loop to wait for it back (docs/performance.md, "Writer hot path (2026-12-01,
            # h2-hist)"). Larger copies release it: the background thread is not held up.
            try:
                memoryview(flat).cast("B")[:] = memoryview(arr).cast("B")
                return flat
            except (TypeError, ValueError):  # not C-contiguous, or a byte order it refuses
                pass
        np.copyto(flat.reshape(arr.shape), arr)
        return flat

    def _new(self, dtype: np.dtype[Any], size: int) -> np.ndarray:
        """A new array, cut from the arena while it lasts (training thread)."""
        arena = self._arena
        if arena is None:
            arena = self._arena = _map_arena(self._limit)
        start = -(-self._arena_used // 64) * 64  # each array on a cache line of its own
        end = start + size * dtype.itemsize
        if end > arena.size:
            return np.empty(size, dtype)
        self._arena_used = end
        return arena[start:end].view(dtype)

    def give_back(self, flat: np.ndarray) -> None:
        """Take back a copy once binned; keep its array for a later copy: always one cut from
        the arena, another within the bound while there is no arena (background thread)."""
        size = flat.nbytes
        self._binned += size
        if not size:
            return
        if flat.base is None:  # from np.empty, not the arena
            if self._arena is not None and self._arena.size:
                return  # an arena exists: it alone is the bound; arrays past it are not kept
            if self._given - self._taken + size > self._limit:
                return
        self._free.setdefault((flat.dtype, flat.size), []).append(flat)
        self._given += size

    def nbytes(self) -> int:
        """Bytes of arrays kept (approximately: the two threads' counts are read one after the
        other)."""
        return self._given - self._taken


#: The size of a huge page, to which the spare arrays' arena is aligned.
_HUGE_PAGE = 2 << 20


def _map_arena(nbytes: int) -> np.ndarray:
    """``nbytes`` of anonymous memory for the spare arrays, aligned to a huge page and marked for
    huge pages where the platform has them; an empty array where it cannot be mapped."""
    madvise = getattr(mmap, "MADV_HUGEPAGE", None)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if madvise is None or not flags:
        return np.empty(0, np.uint8)  # no huge pages to ask for: np.empty does as well
    try:
        mapped = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=flags)
        mapped.madvise(madvise)
    except (OSError, ValueError):
        return np.empty(0, np.uint8)
    whole = np.frombuffer(mapped, np.uint8)
    start = -whole.ctypes.data % _HUGE_PAGE
    return whole[start : start + nbytes]


@dataclass(frozen=True)
class WriterStatistics:
    """A point-in-time view of a :class:`Writer`'s background delivery.

    Attributes:
        pending_batches: batches taken from the hot path and not yet handed to the transport.
        pending_bytes: their estimated size in memory plus their bytes in the spool file.
        spilled_batches: batches ever spilled to the spool file (memory bound reached).
        dropped_batches: batches dropped: the spool was full, or could not be written.
        send_failures: failed attempts to hand a batch to the transport (each retried).
        refusals: batches the broker refused for good (each reported).
        problem: the unresolved failure being retried, or None.
        queued_calls: points and events logged and not yet taken into a batch.
        batches: batches taken from the hot path so far.
        sent_batches: the newest batch handed to the transport (batches are numbered 1, 2, ...).
        transport: the transport's own view (queue depths, batches in flight, reconnects), or
            None once the background thread has ended.
    """

    pending_batches: int
    pending_bytes: int
    spilled_batches: int
    dropped_batches: int
    send_failures: int
    refusals: int
    problem: str | None
    queued_calls: int = 0
    batches: int = 0
    sent_batches: int = 0
    transport: TransportStatistics | None = None


class _Pending:
    """Batches taken from the hot path and not yet handed to the transport, oldest first.

    In memory up to ``memory_bytes`` (estimated); past that, encoded into a transport
    :class:`Spool` that keeps them in a temporary file (and drops the oldest, with a warning, past
    its disk bound). Should the spool file fail (its disk full too), later batches wait in memory
    behind it, up to four times the bound, the oldest of them dropped past that. The order is
    always head (memory), spool, tail (memory): a batch never overtakes an older one, which a
    reader would take for a training restart.
    """

    def __init__(self, memory_bytes: int, disk_bytes: int) -> None:
        self._head: OrderedDict[int, tuple[Batch, int]] = OrderedDict()
        self._tail: OrderedDict[int, tuple[Batch, int]] = OrderedDict()
        self._memory_bytes = 0
        self._memory_limit = memory_bytes
        self._spool = Spool(memory_bytes=0, disk_bytes=disk_bytes)
        self.spilled = 0  # batches ever spilled to disk
        self._dropped = 0  # batches dropped from memory (the spool could not be written)

    def __len__(self) -> int:
        return len(self._head) + len(self._spool) + len(self._tail)

    def put(self, batch: Batch, events_bytes: int | None = None) -> str | None:
        """Keep ``batch``; return a problem to report (spilling failed), or None.

        ``events_bytes``: its events' estimated size, when the caller has it (else sized here).
        """
        size = _batch_bytes(batch, events_bytes)
        fits = self._memory_bytes + size <= self._memory_limit or not self._head
        if fits and not len(self._spool) and not self._tail:
            self._head[batch.seq] = (batch, size)
            self._memory_bytes += size
            return None
        if not self._tail:
            try:
                self._spool.put(batch.seq, codec.encode_batch(batch))
            except Exception as exc:  # a full or unwritable temp dir, or a batch msgpack refuses
                problem = f"cannot spill pending batches to a temporary file ({describe(exc)})"
            else:
                self.spilled += 1
                return None
        else:
            problem = None
        # Behind the spool, in memory, rather than lost; bounded, the training process must not
        # run out of memory either.
        self._tail[batch.seq] = (batch, size)
        self._memory_bytes += size
        dropped = 0
        while self._memory_bytes > 4 * self._memory_limit and len(self._tail) > 1:
            _, (_, size) = self._tail.popitem(last=False)
            self._memory_bytes -= size
            dropped += 1
        if dropped:
            self._dropped += dropped
            problem = (
                f"dropped the oldest pending batches ({self._dropped} so far): memory is full "
                "and the spool file cannot be written"
            )
        return problem

    def nbytes(self) -> int:
        """Estimated bytes held in memory plus bytes in the spool."""
        return self._memory_bytes + self._spool.nbytes

    def first(self) -> tuple[int, Batch] | None:
        """Return the oldest pending batch with its seq, or None."""
        if self._head:
            seq, (batch, _) = next(iter(self._head.items()))
            return seq, batch
        while len(self._spool):
            seq = self._spool.first()
            frame = self._spool.get(seq)
            if frame is not None:
                return seq, codec.decode_batch(codec.decode_message(frame))
            self._spool.ack(seq)  # pragma: no cover - get() returns a frame for every held seq
        if self._tail:
            seq, (batch, _) = next(iter(self._tail.items()))
            return seq, batch
        return None

    @property
    def dropped(self) -> int:
        """Batches dropped: the spool was full, or could not be written."""
        return self._dropped + self._spool.dropped

    def remove(self, seq: int) -> None:
        """Forget the oldest batch, ``seq``, once the transport has taken it."""
        for memory in (self._head, self._tail):
            if seq in memory:
                self._memory_bytes -= memory.pop(seq)[1]
                return
        self._spool.ack(seq)

    def close(self) -> None:
        """Release the spool file."""
        self._spool.close()


class Writer:
    """Logs events of one run. Create it with :func:`vdl_stream.attach`.

    Thread-compatible: call it from one training thread (the background thread is internal).

    Every argument is checked at the call: a bad one raises ``TypeError``/``ValueError`` naming
    it, and nothing logged before is lost. What was accepted is handed to the transport by a
    background thread that never stops on a failure: it keeps the data (bounded in memory, then in
    a temporary file), retries with backoff, and reports the reason once, as a ``RuntimeWarning``,
    on the next ``add_*`` call or ``flush()``.
    """

    def __init__(
        self,
        run: str,
        open_transport: Callable[[trio.Nursery], Any],
        *,
        flush_interval: float = 0.02,
        flush_timeout: float = 30.0,
        telemetry: dict[str, Any] | None = None,
        mute: bool = False,
        window: int = WINDOW,
    ) -> None:
        self.run = codec.check_run_name(run)
        # The in-flight window: batches the writer keeps unacknowledged at most before it holds
        # calls back to merge them (see _pace and _hold_back). Checked once, by attach(), before
        # it creates anything (session._check_window).
        self._window = window
        self.url: str | None = None  # the dashboard URL when this writer serves one
        self._id = uuid.uuid4().hex[:16]
        # Per-tag column buffers (see "The scalar path" in the module docstring): the hot path's
        # one lookup per call gives the bound ``extend`` of its tag's flat buffer
        # [step, value, wall, step, value, wall, ...]; buffers are only ever cut in place.
        self._series: dict[str, Callable[[tuple[int, float, float]], None]] = {}
        # The same for points already checked by their producer (telemetry's reserved tags), kept
        # apart so that add_scalar never takes such a tag without its checks.
        self._checked_series: dict[str, Callable[[tuple[int, float, float]], None]] = {}
        # Every buffer with its tag, in order of first use: what the pump drains.
        self._buffers: list[tuple[str, list[int | float]]] = []
        self._events: list[dict[str, Any]] = []
        # The first _held_events of _events and their estimated bytes, as _hold_back last sized
        # them (background thread only: the hot path appends, only the pump cuts).
        self._held_events = 0
        self._held_bytes = 0
        self._spares = _SpareArrays(SPARE_BYTES)  # add_histogram's copies, reused
        self._closed = False
        # The hot path's only extra check: set when the writer is closed or has news to report.
        self._attention = False
        self._reports: deque[str] = deque()  # appended by the background thread, drained here
        self._warned: set[str] = set()
        self._problem: str | None = None  # the unresolved failure, for flush()'s warning
        self._refusals = 0  # refusals (batches the broker will never store) reported so far
        self._last_refusal: str | None = None
        self._flushed_refusals = 0  # _refusals when the last flush() returned
        self._send_failures = 0
        self._flush_interval = flush_interval
        self._flush_timeout = flush_timeout
        self._seq = 0
        self._sent = 0  # the newest seq the transport has taken
        self._open_transport = open_transport
        self._transport: Transport | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake: trio.Event | None = None
        # Set (with _attention) by _pace when the link is free and nothing waits: the next call
        # wakes the pump at once instead of leaving its point to the interval's timer.
        self._idle = False
        self._sent_changed: trio.Event | None = None
        self._pending = _Pending(PENDING_MEMORY_BYTES, PENDING_DISK_BYTES)
        self._flushes: list[tuple[threading.Event, list[bool]]] = []
        # Flushes handed to the confirm task, with the seq each waits for; a flush that timed
        # out is taken out again, so a broker that never answers cannot make this grow.
        self._to_confirm: list[tuple[int, threading.Event, list[bool]]] = []
        self._confirm_wake: trio.Event | None = None
        self._closing = False
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._telemetry = telemetry
        self._mute = mute
        # The run's status meta events (see _stamp_status): "running" with the first data,
        # "closed" (the close marker) with the last, each at the wall time of that data.
        self._status_due = RUNNING if not mute else None
        self._close_due = False
        self._newest_wall: float | None = None
        if mute:  # a rank that does not log: the calls stay valid and cost nothing
            for name in LOGGING_METHODS:
                setattr(self, name, _discard)
        self._thread = threading.Thread(target=self._thread_main, name="vdl-stream", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._pending.close()
            raise self._error.with_traceback(None) from None
        _live_writers.add(self)

    # -- the hot path ---------------------------------------------------------------------------

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        """Log one scalar point.

        Args:
            tag: the series name, e.g. ``"train/loss"``: a non-empty str of at most 256 characters,
                without control characters or lone surrogates.
            value: a number, numpy scalar or one-element tensor; NaN and Inf are recorded as such.
            step: the training step: an int (numpy integers and one-element integer tensors too)
                in the int64 range. Floats are refused, even ``1.0``.
            walltime: seconds since the epoch, a finite number; now when omitted.

        Raises:
            TypeError, ValueError: a bad argument, named in the message. Nothing logged before is lost.
        """
        try:
            extend = self._series[tag]
        except Exception:  # a tag not seen yet (checked once, here), or not even hashable
            extend = self._new_series(tag)
        if type(value) is not float:
            value = to_float(value)
        # Bounds below 2**30 keep both comparisons on the interpreter's inlined path for small
        # ints (a bound of 2**63 calls the generic comparison, twice per call); larger steps
        # take to_step, which checks the int64 range.
        if type(step) is not int or step > 0x3FFFFFFF or step < -0x3FFFFFFF:
            step = to_step(step)
        if walltime is None:
            walltime = _now()
        elif type(walltime) is not float or walltime - walltime != 0.0:  # not finite: NaN, ±Inf
            walltime = summaries.check_wall(walltime)
        if self._attention:
            self._attend(extend, (step, value, walltime))
        else:
            extend((step, value, walltime))

    def _new_series(self, tag: object) -> Callable[[tuple[int, float, float]], None]:
        """Check a tag the hot path has not seen and open its buffer; return its ``extend``.

        A str subclass equal to a tag already seen finds that tag's buffer by value; one that
        is not is refused here, as check_tag refuses anything but a plain str."""
        checked = codec.check_tag(tag)
        extend = self._series.get(checked)
        if extend is None:
            extend = self._series[checked] = self._open_buffer(checked)
        return extend

    def _open_buffer(self, tag: str) -> Callable[[tuple[int, float, float]], None]:
        buffer: list[int | float] = []
        self._buffers.append((tag, buffer))
        return buffer.extend

    def _append_point(self, point: tuple[str, int, float, float]) -> None:
        """Queue a ``(tag, step, value, wall)`` point its producer already checked (telemetry,
        from the background loop): no checks here, and its tag never becomes one add_scalar
        takes unchecked."""
        tag, step, value, wall = point
        extend = self._checked_series.get(tag)
        if extend is None:
            extend = self._checked_series[tag] = self._open_buffer(tag)
        extend((step, value, wall))

    def _queued_points(self) -> int:
        """Points logged and not yet taken into a batch."""
        return sum(len(buffer) for _, buffer in self._buffers) // 3

    def _has_points(self) -> bool:
        return any(buffer for _, buffer in self._buffers)

    def add_histogram(
        self,
        tag: str,
        values: Any,
        step: int,
        walltime: float | None = None,
        buckets: int = 10,
    ) -> None:
        """Log the distribution of ``values`` (any array-like or tensor) in ``buckets`` bins.

        Non-finite values are counted (``nan``, ``inf`` keys) and left out of the bins. See
        :func:`vdl_stream.summaries.histogram_event`.
        """
        wall = _wall(walltime)
        event, arr, n = summaries.histogram_call(tag, values, step, wall, buckets, copy=False)
        if self._spares.full():
            # The background thread is behind by SPARE_BYTES of copies: bin here, rather than
            # let a loop of histograms fill the memory.
            event.update(summaries.bin_histogram(arr, n))
        else:
            # Binned by the background thread (_take_pending) from a copy: the loop may change
            # its array right after the call (a weight updated in place).
            event[_BIN] = self._spares.copy(arr)
            event[_BUCKETS] = n
        self._add_event(event)

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: dict[str, Any],
        step: int,
        walltime: float | None = None,
    ) -> None:
        """Log several scalars at one step, each under the tag ``main_tag/key`` (as VisualDL).

        Every key and value is checked before any is logged.
        """
        codec.check_tag(main_tag, "main_tag")
        if not isinstance(tag_scalar_dict, dict):
            raise TypeError(f"tag_scalar_dict must be a dict, got {type(tag_scalar_dict).__name__}")
        wall = time.time() if walltime is None else summaries.check_wall(walltime)
        step = to_step(step)
        points = []
        for key, value in tag_scalar_dict.items():
            tag = codec.check_tag(f"{main_tag}/{codec.check_tag(key, 'tag_scalar_dict key')}")
            points.append((tag, to_float(value, f"tag_scalar_dict[{key!r}]")))
        for tag, value in points:
            self.add_scalar(tag, value, step, wall)

    def add_image(
        self, tag: str, img: Any, step: int, walltime: float | None = None, dataformats: str = "HWC"
    ) -> None:
        """Log an image (uint8, or float in [0, 1]) as PNG. See :func:`summaries.image_event`."""
        wall = _wall(walltime)
        self._add_event(summaries.image_event(tag, img, step, wall, dataformats))

    def add_text(
        self, tag: str, text_string: str, step: int | None = None, walltime: float | None = None
    ) -> None:
        """Log a text (a str). See :func:`summaries.text_event`."""
        wall = _wall(walltime)
        self._add_event(summaries.text_event(tag, text_string, step, wall))

    def add_audio(
        self,
        tag: str,
        audio_array: Any,
        step: int,
        sample_rate: int = 8000,
        walltime: float | None = None,
    ) -> None:
        """Log audio (float in [-1, 1] or int16) as WAV. See :func:`summaries.audio_event`."""
        wall = _wall(walltime)
        self._add_event(summaries.audio_event(tag, audio_array, step, wall, sample_rate))

    def add_hparams(
        self, hparams_dict: dict[str, Any], metrics_list: Any, walltime: float | None = None
    ) -> None:
        """Log the run's hyperparameters and its metric tags. See :func:`summaries.hparams_event`."""
        wall = _wall(walltime)
        self._add_event(summaries.hparams_event(hparams_dict, metrics_list, wall))

    def add_pr_curve(
        self,
        tag: str,
        labels: Any,
        predictions: Any,
        step: int,
        num_thresholds: int = 10,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log a precision-recall curve. See :func:`summaries.pr_curve_event`."""
        wall = _wall(walltime)
        self._add_event(
            summaries.pr_curve_event(tag, labels, predictions, step, wall, num_thresholds, weights)
        )

    def add_roc_curve(
        self,
        tag: str,
        labels: Any,
        predictions: Any,
        step: int,
        num_thresholds: int = 10,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log a ROC curve. See :func:`summaries.roc_curve_event`."""
        wall = _wall(walltime)
        self._add_event(
            summaries.roc_curve_event(tag, labels, predictions, step, wall, num_thresholds, weights)
        )

    # -- add_video / add_figure (vdl_stream.media) ---------------------------------------------

    def add_video(
        self,
        tag: str,
        vid_tensor: Any,
        step: int,
        fps: float = 4,
        walltime: float | None = None,
        dataformats: str = "NTCHW",
    ) -> None:
        """Log a video as an animated GIF ``image`` event (needs Pillow).

        ``vid_tensor``: (N, T, C, H, W) by default (``dataformats`` names another order, or
        ``TCHW`` for one video), uint8 or float in [0, 1], C of 1, 3 or 4; the N videos of a
        batch are tiled into one grid. ``fps``: frames per second, above 0 and at most 100.
        See :func:`vdl_stream.media.video_event`.
        """
        from . import media

        wall = _wall(walltime)
        self._add_event(media.video_event(tag, vid_tensor, step, wall, fps, dataformats))

    def add_figure(
        self, tag: str, figure: Any, step: int, close: bool = True, walltime: float | None = None
    ) -> None:
        """Log a matplotlib figure (or a list of them, tiled) rendered to PNG by Agg, no display.

        ``close`` closes the figure through pyplot afterwards. See
        :func:`vdl_stream.media.figure_event`.
        """
        from . import media

        wall = _wall(walltime)
        self._add_event(media.figure_event(tag, figure, step, wall, close))

    # -- add_graph (vdl_stream.graphs) --------------------------------------------------------

    def add_graph(
        self,
        model: Any,
        input_to_model: Any = None,
        verbose: bool = False,
        use_strict_trace: bool = True,
        *,
        tag: str = "graph",
        step: int = 0,
        walltime: float | None = None,
    ) -> None:
        """Log a model's graph: a ``torch.nn.Module``, ``paddle.nn.Layer`` or ONNX model.

        The model is converted here, in the training process, to a framework-neutral ``graph``
        event (nodes with op type, scope, shapes and parameter counts; edges) that the page draws
        as a layered, collapsible diagram. See :func:`vdl_stream.graphs.model_graph`.

        Args:
            model: a torch module (traced with torch.fx, else torch.jit.trace), a Paddle layer
                (paddle.jit.to_static), an ``onnx.ModelProto`` or the path of an ``.onnx`` file.
            input_to_model: example inputs: torch, a tensor or tuple (gives shapes; needed when
                fx cannot trace the model); Paddle, the ``input_spec`` (required); ONNX, unused.
            verbose: print the graph, one line per node.
            use_strict_trace: ``strict`` of ``torch.jit.trace``.
            tag: the graph's tag (several models in one run take several tags).
            step: the step it belongs to.
            walltime: seconds since the epoch; now when omitted.

        Raises:
            TypeError: ``model`` is not a model (named in the message), or a bad input.
            ValueError: the model could not be traced; the message says why.
        """
        from . import graphs

        wall = _wall(walltime)
        self._add_event(
            graphs.graph_event(
                model,
                input_to_model,
                tag=tag,
                step=step,
                wall=wall,
                use_strict_trace=use_strict_trace,
                verbose=verbose,
            )
        )

    # -- add_embedding (vdl_stream.embeddings) -------------------------------------------------

    def add_embedding(
        self,
        mat: Any,
        metadata: Any = None,
        label_img: Any = None,
        global_step: int | None = None,
        tag: str = "default",
        metadata_header: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log N points in D dimensions for the page's projector (tensorboardX's names and order).

        Args:
            mat: an N x D matrix (numpy, torch, paddle, jax, lists), stored as float32; NaN and
                Inf are refused with their row and column.
            metadata: None, N labels (one column), or N rows of labels, one per
                ``metadata_header`` name.
            label_img: None or N thumbnails (N, C, H, W) (C of 1, 3 or 4; uint8 or float in
                [0, 1]), shown on hover; tiled into one PNG sprite.
            global_step: the step; None is 0.
            tag: the embedding's name (TensorBoard's default ``"default"``).
            metadata_header: None or the names of the metadata columns.
            walltime: seconds since the epoch; now when omitted.

        Raises:
            TypeError, ValueError: a bad argument, named with the bad shape or value.
        """
        from .embeddings import embedding_event

        step = 0 if global_step is None else global_step
        self._add_event(
            embedding_event(mat, metadata, label_img, step, tag, metadata_header, _wall(walltime))
        )

    def alert(
        self,
        title: str,
        text: str,
        level: str = "warn",
        step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Raise an alert from training code (the name W&B and trackio use).

        It is recorded in the run as an ``alert`` event (rule ``"user"``), shown in the page's
        alerts panel and toasts, and posted to the server's webhooks (docs/alerts.md).

        Args:
            title: a short headline, a non-empty str of at most 4,096 characters.
            text: the message, a str of at most 4,096 characters.
            level: ``"info"``, ``"warn"`` or ``"error"``.
            step: the training step it concerns, or None.
            walltime: seconds since the epoch, a finite number; now when omitted.

        Raises:
            TypeError, ValueError: a bad argument, named in the message.
        """
        from .alerts import alert_event

        self._add_event(alert_event(title, text, level, step=step, wall=walltime))

    def _add_event(self, event: dict[str, Any]) -> None:
        """Queue a non-scalar event map (already validated by the caller)."""
        if self._attention:
            self._attend(event=event)
        else:
            self._events.append(event)

    def _attend(
        self,
        extend: Callable[[tuple[int, float, float]], None] | None = None,
        point: tuple[int, float, float] | None = None,
        event: dict[str, Any] | None = None,
    ) -> None:
        """The hot path's slow branch: refuse calls on a closed writer, warn about news, then
        take the call's point or event, and wake the pump if the link is free."""
        if self._closed:
            raise ValueError(f"writer for run {self.run!r} is closed")
        self._attention = False  # before draining: a report appended meanwhile sets it again
        while self._reports:
            self._warn_once(self._reports.popleft(), stacklevel=4)
        if extend is not None and point is not None:
            extend(point)
        if event is not None:
            self._events.append(event)
        if self._idle:
            # The link is free: this call's data leaves now. Woken only after the append, since
            # queueing the wake releases the GIL and the pump may run before this returns.
            self._idle = False
            assert self._token is not None
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._kick)

    def _warn_once(self, reason: str, stacklevel: int) -> None:
        if reason in self._warned:
            return
        if len(self._warned) < MAX_WARNED_REASONS:
            self._warned.add(reason)
        warnings.warn(
            f"vdl-stream: run {self.run!r}: {reason}", RuntimeWarning, stacklevel=stacklevel
        )

    def _report(self, reason: str, *, problem: bool = True) -> None:
        """Called in the background thread: tell the training thread on its next call."""
        if problem:
            self._problem = reason
        self._reports.append(reason)
        self._attention = True

    def statistics(self) -> WriterStatistics:
        """Return the state of delivery: what waits, what was spilled, dropped or refused."""
        return WriterStatistics(
            pending_batches=len(self._pending),
            pending_bytes=self._pending.nbytes(),
            spilled_batches=self._pending.spilled,
            dropped_batches=self._pending.dropped,
            send_failures=self._send_failures,
            refusals=self._refusals,
            problem=self._problem,
            queued_calls=self._queued_points() + len(self._events),
            batches=self._seq,
            sent_batches=self._sent,
            transport=self._transport_statistics(),
        )

    def _transport_statistics(self) -> TransportStatistics | None:
        """The transport's statistics, read in the background loop (which changes them)."""
        transport = self._transport
        if transport is None or self._token is None or not self._thread.is_alive():
            return None
        if threading.current_thread() is self._thread:  # called from the loop itself
            return transport.statistics()
        try:
            return trio.from_thread.run_sync(transport.statistics, trio_token=self._token)
        except trio.RunFinishedError:
            return None

    # -- flushing and closing -------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything logged so far is persisted and fsynced by the broker.

        Returns True when durable. If that cannot happen within ``timeout`` seconds (default
        ``flush_timeout``), or the broker refused part of it, warns with the reason and returns
        False; data that was not refused stays queued and is retried.
        """
        if self._closed:
            return True
        while self._reports:
            self._warn_once(self._reports.popleft(), stacklevel=3)
        if not self._thread.is_alive():
            self._warn_flush(
                f"failed: the background thread stopped ({self._problem or 'unknown'})"
            )
            return False
        done = threading.Event()
        result = [False]
        # Look the list up in the loop, not here: the pump swaps in a new one every interval.
        self._call_soon(lambda: self._flushes.append((done, result)))
        if not done.wait(self._flush_timeout if timeout is None else timeout):
            self._call_soon(self._forget_flush, done)
            problem = self._problem
            cause = f": {problem}" if problem else ""
            self._warn_flush(f"not confirmed within the timeout{cause}; the data stays queued")
            self._absorb_reports(problem)
            return False
        # Anything refused since the last flush was logged before this one: not all is stored.
        refusals = self._refusals
        refused, self._flushed_refusals = refusals - self._flushed_refusals, refusals
        if refused:
            reason = self._last_refusal
            self._warn_flush(f"incomplete: the broker refused part of it: {reason}")
            self._absorb_reports(reason)
            return False
        return result[0]

    def _warn_flush(self, why: str) -> None:
        warnings.warn(f"vdl-stream: flush of run {self.run!r} {why}", RuntimeWarning, stacklevel=3)

    def _absorb_reports(self, told: str | None) -> None:
        """Take the pending reports after a flush warning: those it already told are not
        repeated on the next call; others are warned now."""
        while self._reports:
            reason = self._reports.popleft()
            if told and told in reason and len(self._warned) < MAX_WARNED_REASONS:
                self._warned.add(reason)
            else:
                self._warn_once(reason, stacklevel=4)

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the background thread and release the run. Idempotent."""
        if self._closed:
            return
        if not self._mute:
            self._close_due = True  # the next batch taken ends with the close marker
        if not self._thread.is_alive() or not self.flush(timeout):
            self._flush_timeout = 1.0  # undeliverable now: do not stall the program's exit
        self._closed = True
        self._attention = True
        self._call_soon(lambda: setattr(self, "_closing", True))
        self._thread.join(self._flush_timeout if timeout is None else timeout)
        _live_writers.discard(self)
        while self._reports:  # e.g. batches that could not be delivered before the close
            self._warn_once(self._reports.popleft(), stacklevel=3)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the background loop and wake the pump, without waiting for it:
        ``flush(timeout)`` and ``close(timeout)`` must keep their timeouts even while the loop
        is busy (a starved or blocked loop would otherwise hold the caller until it runs)."""

        def run() -> None:
            fn(*args)
            assert self._wake is not None
            self._wake.set()

        assert self._token is not None
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(run)

    # -- the background thread ------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to attach() if start-up failed
            exc = unwrap(exc)
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
            else:  # a bug: every failure of a batch is caught and retried in _deliver
                log.exception("vdl-stream background thread failed")
                self._report(f"the background thread stopped ({describe(exc)})")
        finally:
            self._pending.close()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            transport: Transport = await self._open_transport(nursery)
            self._transport = transport
            self.url = getattr(transport, "url", None)
            self._token = trio.lowlevel.current_trio_token()
            self._wake = trio.Event()
            self._sent_changed = trio.Event()
            self._confirm_wake = trio.Event()
            self._ready.set()
            if self._telemetry is not None:
                nursery.start_soon(partial(self._sample_telemetry, **self._telemetry))
            try:
                async with trio.open_nursery() as inner:
                    inner.start_soon(self._deliver, transport)
                    inner.start_soon(self._confirm, transport)
                    inner.start_soon(self._pace, transport)
                    await self._pump(transport)
                    inner.cancel_scope.cancel()
            finally:
                with trio.move_on_after(self._flush_timeout, shield=True):
                    await transport.aclose()
            nursery.cancel_scope.cancel()

    async def _sample_telemetry(self, interval: float, rank: int, gpus: bool) -> None:
        """Sample GPU and host telemetry every ``interval`` s into the same path as scalars."""
        from .telemetry import TelemetrySampler, sample_points

        # nvmlInit can take seconds on GPUs without persistence mode: keep it off the loop.
        sampler = await trio.to_thread.run_sync(partial(TelemetrySampler, rank=rank, gpus=gpus))
        try:
            while True:
                sample = await trio.to_thread.run_sync(sampler.sample)
                # Telemetry on the scalar path (issue 16): one point per field under the reserved
                # "@telemetry/" tags, which add_scalar refuses, so they skip its checks.
                for point in sample_points(sample):
                    self._append_point(point)
                await trio.sleep(interval)
        finally:
            sampler.close()

    async def _pump(self, transport: Transport) -> None:
        """Every interval, move what the hot path appended into pending batches; never waits on
        the transport, so the hot path's lists stay bounded whatever the broker does."""
        while True:
            with trio.move_on_after(self._flush_interval) as timer:
                await self._wake.wait()
            if timer.cancelled_caught and self._hold_back(transport):
                # The window is full: merge into the batch cut when a place frees. Refusals
                # are reported meanwhile (a refusing broker keeps the window full).
                self._take_refusals(transport)
                continue
            self._wake = trio.Event()
            closing = self._closing
            flushes, self._flushes = self._flushes, []
            self._take_refusals(transport)
            seq = self._take_pending(sync=bool(flushes) or closing)
            if flushes:
                self._to_confirm += [(seq, done, result) for done, result in flushes]
                assert self._confirm_wake is not None
                self._confirm_wake.set()
            if closing:
                # Deliver what is pending, within the flush timeout (close() already flushed).
                with trio.move_on_after(self._flush_timeout):
                    await self._wait_sent(seq)
                left = len(self._pending)
                if left:
                    self._report(f"{left} batch(es) could not be delivered before close")
                return

    def _kick(self) -> None:
        """Wake the pump (in the background loop): a call came while the link was free."""
        assert self._wake is not None
        self._wake.set()

    def _hold_back(self, transport: Transport) -> bool:
        """Whether the pump's timer should leave what was logged in the hot path's buffers: the
        in-flight window is full (``_pace`` wakes the pump when an answer frees a place), and
        what is held is within its bounds. Never while batches wait to be handed over (the
        transport is failing: they go to the bounded, spilling pending queue), nor on a flush."""
        if self._flushes or self._closing or len(self._pending) or transport.has_room(self._window):
            return False
        events = self._events
        held = len(events)
        if held >= MAX_HELD_EVENTS:
            return False
        if held > self._held_events:  # size only the events appended since the last tick
            self._held_bytes += sum(_event_bytes(e) for e in events[self._held_events : held])
            self._held_events = held
        # Last, as it walks every tag's buffer.
        return self._held_bytes < MAX_HELD_BYTES and self._queued_points() < MAX_HELD_POINTS

    async def _pace(self, transport: Transport) -> None:
        """Adaptive flushing: each time fewer than ``window`` batches are in flight, send what
        waits at once, or, when nothing waits, arm the hot path to wake the pump on its next
        call."""
        while True:
            seq = self._seq
            await self._wait_sent(seq)
            await transport.wait_window(self._window)
            if self._seq == seq:
                assert self._wake is not None
                if self._events or self._has_points():
                    self._wake.set()  # they accumulated while the link was busy: send them now
                else:
                    self._idle = True
                    self._attention = True  # after _idle: the hot path's check sees both
            while self._seq == seq:  # until the pump takes the next batch
                assert self._sent_changed is not None
                await self._sent_changed.wait()

    def _take_pending(self, *, sync: bool) -> int:
        """Turn everything appended so far into one pending batch; return the newest seq."""
        m = len(self._events)
        columns = self._take_columns()
        if columns or m or sync:
            # Take a prefix and delete it: appends racing with us land after it and stay queued.
            events = self._events[:m]
            del self._events[:m]
            self._held_events = self._held_bytes = 0  # those _hold_back sized were all taken
            self._seq += 1
            events_bytes: int | None = self._bin(events)
            if self._status_due is not None or self._close_due:
                events = self._stamp_status(columns, events)
                events_bytes = None  # the first and the last batch: sized whole, status included
            batch = Batch(self._id, self._seq, self.run, columns, events, sync)
            problem = self._pending.put(batch, events_bytes)
            if problem is not None:
                self._report(problem)
            self._wake_sender()
        return self._seq

    def _bin(self, events: list[dict[str, Any]]) -> int:
        """Bin the histograms among ``events`` (all at once: summaries.bin_histograms) and give
        their copies back to the spare arrays; return the events' estimated size once binned
        (:func:`_event_bytes`), each sized once, here (background thread)."""
        size = 0
        waiting = []
        for event in events:
            if _BIN in event:
                waiting.append(event)
            else:
                size += _event_bytes(event)
        if not waiting:
            return size
        jobs = [(event.pop(_BIN), event.pop(_BUCKETS)) for event in waiting]

        def done(j: int, binned: dict[str, Any]) -> None:
            # Each copy goes back as soon as it is binned, not after the whole batch: the
            # loop, still logging meanwhile, copies into it instead of into fresh pages.
            waiting[j].update(binned)
            self._spares.give_back(jobs[j][0])

        summaries.bin_histograms(jobs, done)
        return size + sum(map(_binned_bytes, waiting))

    def _stamp_status(
        self, columns: list[ScalarColumns], events: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Add the run's status meta events to a batch being taken (background thread).

        ``{"status": "running", "host": ...}`` goes first in the first batch holding data, at its
        oldest wall time; the close marker ``{"status": "closed"}`` last in the batch taken after
        ``close()``, at the newest wall time logged. So the markers never widen the run's time
        range, also when the calls gave wall times of their own (imports, replays, tests).
        """
        walls = [float(c.walls.min()) for c in columns if len(c.walls)]
        walls += [float(c.walls.max()) for c in columns if len(c.walls)]
        walls += [e["wall"] for e in events if isinstance(e.get("wall"), (int, float))]
        if walls:
            newest = max(walls)
            self._newest_wall = (
                newest if self._newest_wall is None else max(self._newest_wall, newest)
            )
        if self._status_due is not None and (walls or self._close_due):
            wall = min(walls) if walls else time.time()
            events = [_status_event(self._status_due, socket.gethostname(), wall), *events]
            self._status_due = None
        if self._close_due and self._status_due is None:
            wall = self._newest_wall if self._newest_wall is not None else time.time()
            events = [*events, _status_event(CLOSED, None, wall)]
            self._close_due = False
        return events

    def _take_columns(self) -> list[ScalarColumns]:
        """Cut every tag's buffer and turn them all into columns with one numpy call a column
        for the whole batch (codec.tags_scalar_columns), no Python work per point (background
        thread). Per tag, the same calls cost about 9 us a tag, on the path of every point:
        90 us a batch of 10 tags (docs/performance.md, "10k events/s: where the p50 goes")."""
        parts: list[tuple[str, list[int | float], int]] = []
        # Iterating while the hot path appends a new tag is safe: a list grows in place.
        for tag, buffer in self._buffers:
            n = len(buffer)  # a multiple of 3: each call extends by its 3 items at once
            if n:
                parts.append((tag, buffer, n))
        if not parts:
            return []
        try:
            columns = codec.tags_scalar_columns(parts)
        except Exception:  # a point that cannot be stored: each tag apart, dropping only it
            columns = [self._column(tag, buffer, n) for tag, buffer, n in parts]
        for _, buffer, n in parts:
            # Only the prefix taken: points appended meanwhile stay for the next batch.
            del buffer[:n]
        return [column for column in columns if len(column)]

    def _column(self, tag: str, buffer: list[int | float], n: int) -> ScalarColumns:
        """The columns of a tag's first ``n`` buffered items. The calls checked every point,
        so this cannot fail; if it still does, the points that cannot be stored are dropped and
        reported, never the rest."""
        try:
            return codec.scalar_columns(tag, buffer, n)
        except Exception as exc:
            flat = buffer[:n]
            kept: list[int | float] = []
            for i in range(0, len(flat), 3):
                try:
                    codec.scalar_columns(tag, flat[i : i + 3])
                except Exception:
                    continue
                kept += flat[i : i + 3]
            self._report(
                f"dropped {(len(flat) - len(kept)) // 3} scalar point(s) that cannot be stored "
                f"({describe(exc)})"
            )
            return codec.scalar_columns(tag, kept)

    def _wake_sender(self) -> None:
        assert self._sent_changed is not None
        self._sent_changed.set()
        self._sent_changed = trio.Event()

    async def _wait_sent(self, seq: int) -> None:
        while self._sent < seq:
            assert self._sent_changed is not None
            await self._sent_changed.wait()

    def _take_refusals(self, transport: Transport) -> None:
        """Report the broker's refusals and notices that the transport collected (each once)."""
        notices = getattr(transport, "take_notices", None)
        if notices is not None:
            for notice in notices():
                self._report(f"the broker warns: {notice}", problem=False)
        take = getattr(transport, "take_errors", None)
        if take is None:
            return
        for error in take():
            if getattr(error, "retryable", False):
                self._report(f"the broker refused a batch, retrying: {error.reason}")
            else:
                self._last_refusal = str(getattr(error, "reason", error))
                self._refusals += 1
                self._report(f"the broker refused a batch: {self._last_refusal}")

    async def _deliver(self, transport: Transport) -> None:
        """Hand pending batches to the transport in order; on a failure keep the batch, report
        the reason, and retry with backoff until the cause goes away."""
        delay = RETRY_FIRST
        while True:
            item = None
            try:
                item = self._pending.first()
                if item is not None:
                    await transport.send(item[1])
            except Exception as exc:  # never trio.Cancelled (a BaseException)
                self._send_failures += 1
                self._report(f"cannot hand a batch to the broker, retrying ({describe(exc)})")
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if item is None:
                assert self._sent_changed is not None
                await self._sent_changed.wait()
                continue
            if delay != RETRY_FIRST:  # recovered
                self._problem = None
                delay = RETRY_FIRST
            self._pending.remove(item[0])
            self._sent = item[0]
            self._wake_sender()

    def _pending_is_clear(self) -> bool:
        return not len(self._pending) and not self._reports

    async def _confirm(self, transport: Transport) -> None:
        """Resolve flushes once the batches they wait for are taken by the transport and
        acknowledged; the only caller of ``wait_acked``, so waits never race each other."""
        while True:
            if not self._to_confirm:
                assert self._confirm_wake is not None
                await self._confirm_wake.wait()
                self._confirm_wake = trio.Event()
                continue
            target = max(seq for seq, _, _ in self._to_confirm)
            await self._wait_sent(target)
            await transport.wait_acked(target)
            self._take_refusals(transport)
            if self._pending_is_clear():
                self._problem = None  # everything up to here went through: the cause went away
            confirmed = [r for r in self._to_confirm if r[0] <= target]
            self._to_confirm = [r for r in self._to_confirm if r[0] > target]
            for _, done, result in confirmed:
                result[0] = True
                done.set()

    def _forget_flush(self, done: threading.Event) -> None:
        """Drop a flush whose caller stopped waiting (in the loop)."""
        self._to_confirm = [r for r in self._to_confirm if r[1] is not done]


_now = time.time  # one global lookup on the hot path instead of two


def _status_event(status: str, host: str | None, wall: float) -> dict[str, Any]:
    """A ``meta`` event of the run's status (and the writer's host): ``running`` when a writer
    starts, ``closed`` (the close marker) when it is closed (vdl_stream/run_summary.py)."""
    event: dict[str, Any] = {"kind": "meta", "tag": None, "step": None, "wall": wall}
    event[STATUS_KEY] = status
    if host:
        event["host"] = host
    return event


def _wall(walltime: float | None) -> float:
    """The wall time of an event: the caller's, or now."""
    return time.time() if walltime is None else walltime


def _discard(*args: Any, **kwargs: Any) -> None:
    """Stand-in for the logging calls of a rank that does not log."""


_live_writers: weakref.WeakSet[Writer] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Flush writers the program forgot to close, so a script that just ends loses nothing."""
    for writer in list(_live_writers):
        writer.close(timeout=10.0)
