"""The writer: what training code calls on every batch.

The hot path (``add_scalar``) validates cheaply and appends a tuple to a list; nothing else. A
background thread running its own trio loop wakes every ``flush_interval``, takes what was appended,
groups it into columnar batches and hands them to a transport: the in-process broker, or a remote
``vdl-stream serve`` over a WebSocket. The training loop never waits for the dashboard, except in
``flush()`` and ``close()``, which wait (with a timeout) for durability.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import logging
import os
import random
import threading
import time
import uuid
import warnings
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

import recorder

from . import codec, summaries
from .codec import Batch
from .errors import RefusedError, unwrap
from .summaries import to_float, to_step
from .transport import InProcessTransport, Spool, Transport, WebSocketTransport

log = logging.getLogger("vdl_stream.writer")


JOB_ID_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PADDLE_JOB_ID", "MASTER_ADDR")


def make_run_name(world_size: int = 1) -> str:
    """Return a unique run name that sorts by start time, e.g. ``20261129-161700-3fa2c1``.

    In a distributed job (``world_size > 1``) every rank must agree on the name without talking,
    so it is derived from the job's id in the environment (``TORCHELASTIC_RUN_ID``,
    ``SLURM_JOB_ID``, ``PADDLE_JOB_ID``, or ``MASTER_ADDR:MASTER_PORT``): ``job-<hash>``.
    """
    if world_size > 1:
        for name in JOB_ID_VARIABLES:
            if os.environ.get(name):
                key = f"{name}={os.environ[name]}:{os.environ.get('MASTER_PORT', '')}"
                return "job-" + hashlib.sha1(key.encode()).hexdigest()[:12]
    return time.strftime("%Y%m%d-%H%M%S") + f"-{random.getrandbits(24):06x}"


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
)


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


def _event_bytes(event: dict[str, Any]) -> int:
    """A cheap estimate of an event's size in memory (its str/bytes payloads dominate)."""
    size = 96
    for value in event.values():
        if isinstance(value, (bytes, str)):
            size += len(value)
        elif isinstance(value, (dict, list)):
            size += 64 * len(value)
    return size


def _batch_bytes(batch: Batch) -> int:
    """A cheap estimate of a batch's size in memory."""
    size = 128 + sum(24 * len(c) + len(c.tag) for c in batch.scalars)
    return size + sum(_event_bytes(e) for e in batch.events)


class _Pending:
    """Batches taken from the hot path and not yet handed to the transport, oldest first.

    In memory up to ``memory_bytes`` (estimated); past that, encoded into a transport
    :class:`Spool` that keeps them in a temporary file (and drops the oldest, with a warning, past
    its disk bound). Once anything is spilled, later batches are spilled too until the spool is
    empty, so the order is always memory first, then spool.
    """

    def __init__(self, memory_bytes: int, disk_bytes: int) -> None:
        self._memory: OrderedDict[int, tuple[Batch, int]] = OrderedDict()
        self._memory_bytes = 0
        self._memory_limit = memory_bytes
        self._spool = Spool(memory_bytes=0, disk_bytes=disk_bytes)
        self.spilled = 0  # batches ever spilled to disk
        self.dropped = 0  # batches dropped: the spool was full, or could not be written

    def __len__(self) -> int:
        return len(self._memory) + len(self._spool)

    def put(self, batch: Batch) -> str | None:
        """Keep ``batch``; return a problem to report (spilling failed), or None."""
        size = _batch_bytes(batch)
        if not len(self._spool) and (
            self._memory_bytes + size <= self._memory_limit or not self._memory
        ):
            self._memory[batch.seq] = (batch, size)
            self._memory_bytes += size
            return None
        try:
            self._spool.put(batch.seq, codec.encode_batch(batch))
        except Exception as exc:  # a full or unwritable temp dir, or a batch msgpack refuses
            # Keep the batch in memory over the bound rather than lose it; past four times the
            # bound, the oldest batches go (the training process must not run out of memory).
            self._memory[batch.seq] = (batch, size)
            self._memory_bytes += size
            while self._memory_bytes > 4 * self._memory_limit and len(self._memory) > 1:
                _, (_, dropped) = self._memory.popitem(last=False)
                self._memory_bytes -= dropped
                self.dropped += 1
            return f"cannot spill pending batches to a temporary file ({_describe(exc)})"
        self.spilled += 1
        return None

    def first(self) -> tuple[int, Batch] | None:
        """Return the oldest pending batch with its seq, or None."""
        if self._memory:
            seq, (batch, _) = next(iter(self._memory.items()))
            return seq, batch
        while len(self._spool):
            seq = self._spool.after(0)[0]
            frame = self._spool.get(seq)
            if frame is not None:
                return seq, codec.decode_batch(codec.decode_message(frame))
            self._spool.ack(seq)  # pragma: no cover - get() returns a frame for every held seq
        return None

    def remove(self, seq: int) -> None:
        """Forget the oldest batch, ``seq``, once the transport has taken it."""
        if seq in self._memory:
            self._memory_bytes -= self._memory.pop(seq)[1]
        else:
            self._spool.ack(seq)

    def close(self) -> None:
        """Release the spool file."""
        self._spool.close()


def _describe(exc: BaseException) -> str:
    """One line for a user: the exception's type and message, never an empty message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text:.300}" if text else type(exc).__name__


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
    ) -> None:
        self.run = codec.check_run_name(run)
        self.url: str | None = None  # the dashboard URL when this writer serves one
        self._id = uuid.uuid4().hex[:16]
        self._points: list[tuple[str, int, float, float]] = []
        self._events: list[dict[str, Any]] = []
        self._tags: set[str] = set()
        self._closed = False
        # The hot path's only extra check: set when the writer is closed or has news to report.
        self._attention = False
        self._reports: deque[str] = deque()  # appended by the background thread, drained here
        self._warned: set[str] = set()
        self._problem: str | None = None  # the unresolved failure, for flush()'s warning
        self._refusals = 0  # refusals (batches the broker will never store) reported so far
        self._flush_interval = flush_interval
        self._flush_timeout = flush_timeout
        self._seq = 0
        self._sent = 0  # the newest seq the transport has taken
        self._open_transport = open_transport
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake: trio.Event | None = None
        self._sent_changed: trio.Event | None = None
        self._pending = _Pending(PENDING_MEMORY_BYTES, PENDING_DISK_BYTES)
        self._flushes: list[tuple[threading.Event, list[bool]]] = []
        self._confirm_lock = trio.Lock()  # one wait_acked at a time, in flush order
        self._closing = False
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._telemetry = telemetry
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
        if type(tag) is not str or tag not in self._tags:
            self._tags.add(codec.check_tag(tag))
        if type(value) is not float:
            value = to_float(value)
        if type(step) is not int or not -0x8000000000000000 <= step <= 0x7FFFFFFFFFFFFFFF:
            step = to_step(step)
        if walltime is None:
            walltime = time.time()
        elif type(walltime) is not float or walltime - walltime != 0.0:  # not finite: NaN, ±Inf
            walltime = summaries.check_wall(walltime)
        if self._attention:
            self._attend()
        self._points.append((tag, step, value, walltime))

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
        self._add_event(summaries.histogram_event(tag, values, step, wall, buckets))

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

    def _add_event(self, event: dict[str, Any]) -> None:
        """Queue a non-scalar event map (already validated by the caller)."""
        if self._attention:
            self._attend()
        self._events.append(event)

    def _attend(self) -> None:
        """The hot path's slow branch: refuse calls on a closed writer; warn about news."""
        if self._closed:
            raise ValueError(f"writer for run {self.run!r} is closed")
        self._attention = False  # before draining: a report appended meanwhile sets it again
        while self._reports:
            self._warn_once(self._reports.popleft(), stacklevel=4)

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
        refusals = self._refusals
        # Look the list up in the loop, not here: the pump swaps in a new one every interval.
        self._call_soon(lambda: self._flushes.append((done, result)))
        if not done.wait(self._flush_timeout if timeout is None else timeout):
            cause = f": {self._problem}" if self._problem else ""
            self._warn_flush(f"not confirmed within the timeout{cause}; the data stays queued")
            return False
        if self._refusals != refusals:
            self._warn_flush(f"incomplete: the broker refused part of it: {self._problem}")
            return False
        return result[0]

    def _warn_flush(self, why: str) -> None:
        warnings.warn(f"vdl-stream: flush of run {self.run!r} {why}", RuntimeWarning, stacklevel=3)

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the background thread and release the run. Idempotent."""
        if self._closed:
            return
        if not self._thread.is_alive() or not self.flush(timeout):
            self._flush_timeout = 1.0  # undeliverable now: do not stall the program's exit
        self._closed = True
        self._attention = True
        self._call_soon(lambda: setattr(self, "_closing", True))
        self._thread.join(self._flush_timeout if timeout is None else timeout)
        _live_writers.discard(self)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the background loop and wake the pump."""

        def run() -> None:
            fn(*args)
            assert self._wake is not None
            self._wake.set()

        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(run, trio_token=self._token)

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
                self._report(f"the background thread stopped ({_describe(exc)})")
        finally:
            self._pending.close()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            transport: Transport = await self._open_transport(nursery)
            self.url = getattr(transport, "url", None)
            self._token = trio.lowlevel.current_trio_token()
            self._wake = trio.Event()
            self._sent_changed = trio.Event()
            self._ready.set()
            if self._telemetry is not None:
                nursery.start_soon(partial(self._sample_telemetry, **self._telemetry))
            try:
                async with trio.open_nursery() as inner:
                    inner.start_soon(self._deliver, transport)
                    await self._pump(transport, inner)
                    inner.cancel_scope.cancel()
            finally:
                with trio.move_on_after(self._flush_timeout, shield=True):
                    await transport.aclose()
            nursery.cancel_scope.cancel()

    async def _sample_telemetry(self, interval: float, rank: int, gpus: bool) -> None:
        """Sample GPU and host telemetry every ``interval`` s into the same path as scalars."""
        from .telemetry import TelemetrySampler

        # nvmlInit can take seconds on GPUs without persistence mode: keep it off the loop.
        sampler = await trio.to_thread.run_sync(partial(TelemetrySampler, rank=rank, gpus=gpus))
        try:
            while True:
                self._events.append(await trio.to_thread.run_sync(sampler.sample))
                await trio.sleep(interval)
        finally:
            sampler.close()

    async def _pump(self, transport: Transport, nursery: trio.Nursery) -> None:
        """Every interval, move what the hot path appended into pending batches; never waits on
        the transport, so the hot path's lists stay short whatever the broker does."""
        while True:
            with trio.move_on_after(self._flush_interval):
                await self._wake.wait()
            self._wake = trio.Event()
            closing = self._closing
            flushes, self._flushes = self._flushes, []
            self._take_refusals(transport)
            seq = self._take_pending(sync=bool(flushes) or closing)
            if flushes:
                nursery.start_soon(self._confirm, transport, seq, flushes)
            if closing:
                # Deliver what is pending, within the flush timeout (close() already flushed).
                with trio.move_on_after(self._flush_timeout):
                    await self._wait_sent(seq)
                left = len(self._pending)
                if left:
                    self._report(f"{left} batch(es) could not be delivered before close")
                return

    def _take_pending(self, *, sync: bool) -> int:
        """Turn everything appended so far into one pending batch; return the newest seq."""
        # Take a prefix and delete it: appends racing with us land after it and stay queued.
        n, m = len(self._points), len(self._events)
        if n or m or sync:
            points = self._points[:n]
            del self._points[:n]
            events = self._events[:m]
            del self._events[:m]
            self._seq += 1
            batch = Batch(
                self._id, self._seq, self.run, codec.columns_from_points(points), events, sync
            )
            problem = self._pending.put(batch)
            if problem is not None:
                self._report(problem)
            self._wake_sender()
        return self._seq

    def _wake_sender(self) -> None:
        assert self._sent_changed is not None
        self._sent_changed.set()
        self._sent_changed = trio.Event()

    async def _wait_sent(self, seq: int) -> None:
        while self._sent < seq:
            assert self._sent_changed is not None
            await self._sent_changed.wait()

    def _take_refusals(self, transport: Transport) -> None:
        """Report the broker's refusals that the transport collected (each once)."""
        take = getattr(transport, "take_errors", None)
        if take is None:
            return
        for error in take():
            if getattr(error, "retryable", False):
                self._report(f"the broker refused a batch, retrying: {error.reason}")
            else:
                self._refusals += 1
                self._report(f"the broker refused a batch: {getattr(error, 'reason', error)}")

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
                self._report(f"cannot hand a batch to the broker, retrying ({_describe(exc)})")
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

    async def _confirm(
        self, transport: Transport, seq: int, flushes: list[tuple[threading.Event, list[bool]]]
    ) -> None:
        """Resolve ``flushes`` once batch ``seq`` is taken by the transport and acknowledged."""
        async with self._confirm_lock:
            await self._wait_sent(seq)
            await transport.wait_acked(seq)
        self._take_refusals(transport)
        if self._pending_is_clear():
            self._problem = None  # everything up to here went through: the cause went away
        for done, result in flushes:
            result[0] = True
            done.set()


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


def attach(
    logdir: str | os.PathLike[str] = "vdl_logs",
    run: str | None = None,
    *,
    url: str | None = None,
    serve: bool = False,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    telemetry: bool = True,
    telemetry_interval: float = 1.0,
    flush_interval: float = 0.02,
    all_ranks: bool = False,
) -> Writer:
    """Start logging a run and return its :class:`Writer`.

    Args:
        logdir: where an in-process broker records runs (``logdir/<run>/``).
        run: the run name; a unique, time-sortable name when omitted. An existing run is appended to.
        url: publish to a running ``vdl-stream serve`` at this ``ws://host:port`` instead of
            recording in-process.
        serve: also serve the dashboard from this process (in-process broker only).
        host, port: where the dashboard listens when ``serve`` is true (``port=0``: any free port).
        token: the access token for ``url``, or required by the served dashboard.
        telemetry: sample GPU (NVML) and host (psutil) telemetry into the run.
        telemetry_interval: seconds between telemetry samples (at least 0.1).
        flush_interval: how often, in seconds, the background thread publishes what was logged.
            A point waits half of it on average before it leaves the process; 20 ms keeps the
            dashboard's end-to-end latency near 10 ms at a few hundred small batches a second.
        all_ranks: in a distributed job, let every rank log, each as the sub-run ``<run>/rank<N>``.
            By default only rank 0 logs, and every rank sends telemetry.

    Raises:
        PortInUseError: ``serve`` and the port is taken.
        ValueError: a bad argument, named in the message.
    """
    from .telemetry import distributed_env

    if telemetry_interval < 0.1:
        raise ValueError(f"telemetry_interval must be at least 0.1 s, got {telemetry_interval!r}")
    if serve and url is not None:
        raise ValueError("serve=True runs a broker in this process; it cannot go with url=")
    if not isinstance(flush_interval, (int, float)) or not 0 < flush_interval <= 60:
        raise ValueError(
            f"flush_interval must be a number of seconds in (0, 60], got {flush_interval!r}"
        )
    rank, local_rank, _ = distributed_env()
    run, mute = resolve_run(run, all_ranks=all_ranks, url=url)
    # NVML sees every GPU of the node, so one process per node reports them.
    sampling = {"interval": telemetry_interval, "rank": rank, "gpus": local_rank == 0}
    options = {
        "flush_interval": flush_interval,
        "telemetry": sampling if telemetry else None,
        "mute": mute,
    }
    if url is not None:

        async def open_remote(nursery: trio.Nursery) -> Transport:
            return await nursery.start(WebSocketTransport.run, url, token)

        return Writer(run, open_remote, **options)

    run_dir = check_logdir(logdir, run)

    async def open_local(nursery: trio.Nursery) -> Transport:
        from .broker import Broker

        broker = Broker(logdir)
        await nursery.start(broker.run)
        # Open the run now, not at the first batch, so that a run held by another process or a
        # directory that cannot be written raises here, at attach(), instead of in the thread.
        await _open_run(broker, run, run_dir)
        transport = InProcessTransport(broker)
        if serve:
            from .server import serve_dashboard  # the web stack loads only when serving

            await nursery.start(broker.follow)  # show the other runs of the log directory too
            transport.url = await nursery.start(serve_dashboard, broker, host, port, token)
        return transport

    return Writer(run, open_local, **options)


def resolve_run(
    run: str | None, *, all_ranks: bool = False, url: str | None = None
) -> tuple[str, bool]:
    """Return the run a process logs into, as :func:`attach` names it, and whether it is muted.

    ``run=None`` gets a unique name (shared by the ranks of a distributed job). In a distributed
    job, ``all_ranks`` makes every rank log as ``<run>/rank<N>``; otherwise ranks other than 0 are
    muted (telemetry only), into ``<run>/rank<N>`` when recording in-process.

    Raises:
        ValueError: ``run`` is not a valid run name (see :func:`vdl_stream.codec.check_run_name`).
    """
    from .telemetry import distributed_env

    rank, _, world_size = distributed_env()
    run = make_run_name(world_size) if run is None else codec.check_run_name(run)
    mute = False
    if world_size > 1:
        if all_ranks:
            run = f"{run}/rank{rank}"
        elif rank != 0:
            mute = True  # telemetry only
            if url is None:  # two processes must not append to one run directory
                run = f"{run}/rank{rank}"
    return codec.check_run_name(run), mute


def _path_error(exc: OSError, path: str) -> OSError:
    """``exc`` as one line that names ``path`` and the cause: ``cannot record run in P: cause``."""
    cause = exc.strerror or _describe(exc)
    error = type(exc)(exc.errno, f"cannot record a run in {path}: {cause}")
    return error


def check_logdir(logdir: str | os.PathLike[str], run: str) -> str:
    """Create the run directory ``logdir/run`` and check it can be written; return its path.

    Raises:
        TypeError: ``logdir`` is not a str or path.
        OSError: it cannot be created or written (a file in the way, a read-only file system, no
            permission); the message names the path and the cause, on one line.
    """
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a str or path, got {type(logdir).__name__} {logdir!r:.40}")
    path = os.path.join(os.fspath(logdir), run) if run else os.fspath(logdir)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise _path_error(exc, path) from None
    if not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, f"cannot record a run in {path}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):  # as root too: a read-only file system says so
        err = errno.EROFS if _read_only(path) else errno.EACCES
        raise PermissionError(err, f"cannot record a run in {path}: {os.strerror(err)}")
    return path


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:  # pragma: no cover - the path was just created
        return False


async def _open_run(broker: Any, run: str, run_dir: str) -> None:
    """Have the in-process ``broker`` open (and lock) ``run`` now, as its persist task would.

    Raises:
        recorder.RunLockedError: another writer holds the run (the message names the directory
            and the holder's pid).
        OSError: the run cannot be written; one line naming the directory and the cause.
        RefusedError: the broker cannot use the run (e.g. foreign files in it); the message names
            the directory.
    """
    # The broker opens runs lazily, at their first batch, and turns failures into refusals for
    # remote writers; here its own steps are taken ahead, so the real error reaches attach().
    try:
        state = await broker._get_run(run)
    except RefusedError as refusal:
        raise RefusedError(
            f"cannot record a run in {run_dir}: {refusal.reason}", retryable=refusal.retryable
        ) from None
    try:
        await trio.to_thread.run_sync(broker._writer, state, limiter=broker._limiter)
    except recorder.RecorderError as exc:
        raise type(exc)(str(exc)) from None
    except OSError as exc:
        raise _path_error(exc, run_dir) from None
