"""``attach()``: how a training process starts logging a run.

It names the run (:func:`make_run_name`, :func:`resolve_run`), checks the log directory, and
starts a :class:`~vdl_stream.writer.Writer` on a transport: an in-process broker (which this
module imports only then, with the web stack only when ``serve=True``) or a remote
``vdl-stream serve`` over a WebSocket. The writer itself (the hot path and its background thread)
imports no broker and no server.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import trio

import recorder

from . import codec, storage
from .errors import RefusedError, describe
from .transport import MAX_WINDOW, WINDOW, InProcessTransport, Transport, WebSocketTransport
from .writer import Writer

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


def attach(
    logdir: str | os.PathLike[str] = "vdl_logs",
    run: str | None = None,
    *,
    url: str | Sequence[str] | None = None,
    serve: bool = False,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    telemetry: bool = True,
    telemetry_interval: float = 1.0,
    flush_interval: float = 0.02,
    window: int = WINDOW,
    all_ranks: bool = False,
    cache_mb: int = 128,
    allowed_hosts: Sequence[str] = (),
) -> Writer:
    """Start logging a run and return its :class:`Writer`.

    Args:
        logdir: where an in-process broker records runs (``logdir/<run>/``): a directory, or
            an object store URL ``s3://bucket/prefix`` (``gs://``, ``az://``; needs the
            ``cloud`` extra), whose runs' local heads are kept under ``$VDL_STREAM_CACHE``
            (default ``~/.cache/vdl-stream``) and published to the store as they are sealed,
            and whole when the writer closes (docs/object-storage.md).
        run: the run name; a unique, time-sortable name when omitted. An existing run is appended to.
        url: publish to a running ``vdl-stream serve`` at this ``ws://host:port`` instead of
            recording in-process; or a list of such URLs, brokers joined by ``serve --bus``:
            the writer fails over from one to the next (docs/deploy.md).
        serve: also serve the dashboard from this process (in-process broker only).
        host, port: where the dashboard listens when ``serve`` is true (``port=0``: any free port).
        token: the access token for ``url``, or required by the served dashboard.
        telemetry: sample GPU (NVML) and host (psutil) telemetry into the run.
        telemetry_interval: seconds between telemetry samples (at least 0.1).
        flush_interval: the longest, in seconds, a logged point waits in the process while a
            batch is in flight. When none is, the next call's point leaves at once; while one is,
            calls accumulate into the next batch, sent as soon as the link is free (adaptive
            flushing: docs/guide.md, "Durability and transports").
        window: the in-flight window, batches sent and not yet acknowledged (written by the
            broker) at most, from 1 to 16. While fewer are in flight, the next call's point
            leaves at once; 2 lets it leave while the previous batch is being written (1 makes
            it wait for that write; more only makes batches smaller).
        all_ranks: in a distributed job, let every rank log, each as the sub-run ``<run>/rank<N>``.
            By default only rank 0 logs, and every rank sends telemetry.
        cache_mb: with ``serve``, the memory (MiB) the dashboard may keep of decoded run data
            between reads, all runs together (as ``vdl-stream serve --cache-mb``).
        allowed_hosts: with ``serve``, Host names the dashboard answers besides loopback and
            ``host`` (as ``vdl-stream serve --allow-host``; docs/security.md).

    Raises:
        PortInUseError: ``serve`` and the port is taken.
        InsecureBindError: ``serve`` on a non-loopback ``host`` without a ``token``.
        ValueError: a bad argument (an empty token, say), named in the message.
    """
    from .telemetry import distributed_env

    _check_seconds("telemetry_interval", telemetry_interval, 0.1, 3600.0)
    _check_seconds("flush_interval", flush_interval, 1e-3, 60.0)
    _check_window(window)
    if isinstance(cache_mb, bool) or not isinstance(cache_mb, int) or cache_mb < 1:
        raise ValueError(f"cache_mb must be a positive int, got {cache_mb!r}")
    if serve and url is not None:
        raise ValueError("serve=True runs a broker in this process; it cannot go with url=")
    if url is not None and not isinstance(url, str):
        if not isinstance(url, Sequence) or not url or not all(isinstance(u, str) for u in url):
            raise TypeError(
                f"url must be a str or a non-empty list of str, got {type(url).__name__} {url!r:.40}"
            )
        url = list(url)
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a str or None, got {type(token).__name__}")
    if serve:
        from .server import check_bind  # the web stack loads only when serving

        # At the call, not in the background thread: a refused bind must reach the caller.
        check_bind(host, token)
    rank, local_rank, _ = distributed_env()
    named = run is not None
    run, mute = resolve_run(run, all_ranks=all_ranks, url=None if url is None else "ws:")
    # NVML sees every GPU of the node, so one process per node reports them.
    sampling = {"interval": telemetry_interval, "rank": rank, "gpus": local_rank == 0}
    options = {
        "flush_interval": flush_interval,
        "window": window,
        "telemetry": sampling if telemetry else None,
        "mute": mute,
    }
    if url is not None:

        async def open_remote(nursery: trio.Nursery) -> Transport:
            return await nursery.start(WebSocketTransport.run, url, token)

        return Writer(run, open_remote, **options)

    sync = None
    if storage.is_store_url(logdir):  # runs in an object store (docs/object-storage.md)
        assert isinstance(logdir, str)
        client = storage.ObstoreClient(logdir)  # a bad URL or a missing obstore fails here
        logdir = storage.cache_dir(logdir)
        sync = storage.StoreSync(client, logdir, mirror=serve)
        if not named:  # a unique new name: nothing to continue from the store
            sync.fresh_runs.add(run)
    run_dir = check_logdir(logdir, run)

    async def open_local(nursery: trio.Nursery) -> Transport:
        from .broker import Broker

        broker = Broker(
            logdir,
            cache_bytes=cache_mb << 20,
            prepare_write=None if sync is None else sync.prepare_write,
        )
        await nursery.start(broker.run)
        if sync is not None:
            # Publishes what the broker seals; after the broker closed its runs, publishes
            # the rest (within storage.FINAL_DEADLINE), before this thread ends.
            broker.store_statistics = sync.statistics
            await nursery.start(sync.run, broker.wait_closed)
        # Open the run now, not at the first batch, so that a run held by another process or a
        # directory that cannot be written raises here, at attach(), instead of in the thread.
        await _open_run(broker, run, run_dir)
        transport = InProcessTransport(broker)
        if serve:
            from .server import serve_dashboard  # the web stack loads only when serving

            await nursery.start(broker.follow)  # show the other runs of the log directory too
            from .alerts import AlertEngine

            await nursery.start(AlertEngine().run, broker)  # live alerts for the page
            transport.url = await nursery.start(
                partial(serve_dashboard, allowed_hosts=allowed_hosts), broker, host, port, token
            )
        return transport

    return Writer(run, open_local, **options)


def _check_seconds(name: str, value: object, least: float, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not least <= value <= most:
        raise ValueError(f"{name} must be from {least:g} to {most:g} s, got {value!r}")


def _check_window(window: object) -> int:
    """Check an in-flight window (batches a writer keeps unacknowledged at most); return it.

    Raises:
        TypeError: ``window`` is not an int.
        ValueError: it is not from 1 to :data:`~vdl_stream.transport.MAX_WINDOW`.
    """
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int number of batches, got {type(window).__name__}")
    if not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be from 1 to {MAX_WINDOW} batches, got {window!r}")
    return window


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
    cause = exc.strerror or describe(exc)
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
    # remote writers; open_run takes those steps now, so the real error reaches attach().
    try:
        await broker.open_run(run)
    except RefusedError as refusal:
        raise RefusedError(
            f"cannot record a run in {run_dir}: {refusal.reason}", retryable=refusal.retryable
        ) from None
    except recorder.RecorderError as exc:
        raise type(exc)(str(exc)) from None
    except OSError as exc:
        raise _path_error(exc, run_dir) from None
