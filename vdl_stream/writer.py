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
import hashlib
import logging
import os
import random
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from . import codec, summaries
from .codec import Batch
from .errors import unwrap
from .summaries import to_float, to_step
from .transport import InProcessTransport, Transport, WebSocketTransport

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


class Writer:
    """Logs events of one run. Create it with :func:`vdl_stream.attach`.

    Thread-compatible: call it from one training thread (the background thread is internal).
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
        self._flush_interval = flush_interval
        self._flush_timeout = flush_timeout
        self._seq = 0
        self._open_transport = open_transport
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake: trio.Event | None = None
        self._flushes: list[tuple[threading.Event, list[bool]]] = []
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
            raise self._error
        _live_writers.add(self)

    # -- the hot path ---------------------------------------------------------------------------

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        """Log one scalar point.

        Args:
            tag: the series name, e.g. ``"train/loss"``: a non-empty str of at most 256 characters.
            value: a number, numpy scalar or one-element tensor; NaN and Inf are recorded as such.
            step: the training step (int).
            walltime: seconds since the epoch; now when omitted.

        Raises:
            TypeError, ValueError: a bad argument, named in the message. Nothing logged before is lost.
        """
        if tag not in self._tags or type(tag) is not str:
            self._tags.add(codec.check_tag(tag))
        if type(value) is not float:
            value = to_float(value)
        if type(step) is not int:
            step = to_step(step)
        if self._closed:
            raise ValueError(f"writer for run {self.run!r} is closed")
        self._points.append((tag, step, value, time.time() if walltime is None else walltime))

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
        if self._closed:
            raise ValueError(f"writer for run {self.run!r} is closed")
        self._events.append(event)

    # -- flushing and closing -------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything logged so far is persisted and fsynced by the broker.

        Returns True when durable. If that cannot happen within ``timeout`` seconds (default
        ``flush_timeout``), warns and returns False; the data stays queued and is retried.
        """
        if self._closed:
            return True
        done = threading.Event()
        result = [False]
        # Look the list up in the loop, not here: the pump swaps in a new one every interval.
        self._call_soon(lambda: self._flushes.append((done, result)))
        if not done.wait(self._flush_timeout if timeout is None else timeout):
            warnings.warn(
                f"vdl-stream: flush of run {self.run!r} not confirmed within the timeout; "
                "the data stays queued",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        return result[0]

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the background thread and release the run. Idempotent."""
        if self._closed:
            return
        if not self.flush(timeout):
            self._flush_timeout = 1.0  # undeliverable now: do not stall the program's exit
        self._closed = True
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
            else:
                log.exception("vdl-stream background thread failed")

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            transport: Transport = await self._open_transport(nursery)
            self.url = getattr(transport, "url", None)
            self._token = trio.lowlevel.current_trio_token()
            self._wake = trio.Event()
            self._ready.set()
            if self._telemetry is not None:
                nursery.start_soon(partial(self._sample_telemetry, **self._telemetry))
            try:
                await self._pump(transport)
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

    async def _pump(self, transport: Transport) -> None:
        while True:
            with trio.move_on_after(self._flush_interval):
                await self._wake.wait()
            self._wake = trio.Event()
            closing = self._closing
            flushes, self._flushes = self._flushes, []
            seq = await self._send_pending(transport, sync=bool(flushes) or closing)
            if flushes:
                ok = False
                with trio.move_on_after(self._flush_timeout):
                    await transport.wait_acked(seq)
                    ok = True
                for done, result in flushes:
                    result[0] = ok
                    done.set()
            if closing:
                return

    async def _send_pending(self, transport: Transport, *, sync: bool) -> int:
        """Hand everything appended so far to the transport; return the last writer seq used."""
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
            await transport.send(batch)
        return self._seq


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
    cache_mb: int = 128,
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
        cache_mb: with ``serve``, the memory (MiB) the dashboard may keep of decoded run data
            between reads, all runs together (as ``vdl-stream serve --cache-mb``).

    Raises:
        PortInUseError: ``serve`` and the port is taken.
        ValueError: a bad argument, named in the message.
    """
    from .telemetry import distributed_env

    if telemetry_interval < 0.1:
        raise ValueError(f"telemetry_interval must be at least 0.1 s, got {telemetry_interval!r}")
    if isinstance(cache_mb, bool) or not isinstance(cache_mb, int) or cache_mb < 1:
        raise ValueError(f"cache_mb must be a positive int, got {cache_mb!r}")
    if serve and url is not None:
        raise ValueError("serve=True runs a broker in this process; it cannot go with url=")
    rank, local_rank, world_size = distributed_env()
    run = make_run_name(world_size) if run is None else codec.check_run_name(run)
    mute = False
    if world_size > 1:
        if all_ranks:
            run = f"{run}/rank{rank}"
        elif rank != 0:
            mute = True  # telemetry only
            if url is None:  # two processes must not append to one run directory
                run = f"{run}/rank{rank}"
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

    async def open_local(nursery: trio.Nursery) -> Transport:
        from .broker import Broker

        broker = Broker(logdir, cache_bytes=cache_mb << 20)
        await nursery.start(broker.run)
        transport = InProcessTransport(broker)
        if serve:
            from .server import serve_dashboard  # the web stack loads only when serving

            await nursery.start(broker.follow)  # show the other runs of the log directory too
            transport.url = await nursery.start(serve_dashboard, broker, host, port, token)
        return transport

    return Writer(run, open_local, **options)
