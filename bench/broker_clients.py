"""Load generators for bench/bench_broker.py: a ``vdl-stream serve`` subprocess and WebSocket clients.

Everything here talks only to 127.0.0.1, and every loop is bounded by a count or a deadline.

- :class:`ServeProcess`: ``python -m vdl_stream.cli serve --port 0`` in its own process (so the
  load generators never share its GIL), its URL read from the first line it prints.
- :func:`stream_together`: several :func:`stream_batches` writers started at the same moment.
- :func:`stream_batches`: one raw writer on ``/ws/ingest`` sending ``batch`` frames built with the
  project's codec, either as fast as a bounded window of unacknowledged batches allows, or paced.
- :func:`live_subscriber`: one ``/ws/live`` client recording, for every point it receives, the time
  since the point's wall time.
- :func:`stalled_subscriber`: a client that subscribes and then never reads its socket again.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import trio
from trio_websocket import open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Message, RejectConnection, Request

from vdl_stream import codec
from vdl_stream.codec import Batch, ScalarColumns

REPO = Path(__file__).resolve().parent.parent
MAX_MESSAGE = 64 << 20
#: Every process the benchmark starts, so an abort (SIGTERM) can kill what is still running.
STARTED: set[subprocess.Popen] = set()


def kill_started() -> None:
    """Kill every started process that is still running (the abort path; normal exits stop each)."""
    for proc in list(STARTED):
        if proc.poll() is None:
            proc.kill()


class ServeProcess:
    """A ``vdl-stream serve`` subprocess on 127.0.0.1 with a free port; stop it with :meth:`stop`.

    Args:
        logdir: the log directory to serve.
        stderr_path: where the server's stderr goes (a file, so a chatty server never blocks).
        extra: more ``serve`` flags.
        tree: the checkout whose code runs (``PYTHONPATH``); this one by default.

    Raises:
        RuntimeError: the server did not print its URL within 30 s.
    """

    def __init__(self, logdir: Path, stderr_path: Path, *extra: str, tree: Path = REPO) -> None:
        self.logdir = logdir
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vdl_stream.cli",
                "serve",
                "--logdir",
                str(logdir),
                "--port",
                "0",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=tree,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)},
        )
        STARTED.add(self.proc)
        try:
            ready, _, _ = select.select([self.proc.stdout], [], [], 30)
            line = self.proc.stdout.readline().decode() if ready else ""
            if " at http" not in line:
                raise RuntimeError(f"serve did not start: {line!r}; see {stderr_path}")
        except BaseException:
            self.stop()
            raise
        self.url = line.rsplit(" at ", 1)[1].strip().split("/?")[0].rstrip("/")
        self.ws = "ws" + self.url.removeprefix("http")
        self.host, port = self.url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.pid = self.proc.pid

    def stats(self) -> dict:
        """Return ``/api/stats`` (broker and subscriber statistics)."""
        with urllib.request.urlopen(self.url + "/api/stats", timeout=10) as response:
            return json.load(response)

    def stop(self) -> int | None:
        """SIGTERM the server, wait up to 20 s for its graceful exit, else kill it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
        return self.proc.returncode


def stop_process(
    proc: subprocess.Popen | None, grace: float = 10, sig: int = signal.SIGTERM
) -> None:
    """Stop a child we started with ``sig``, killing it after ``grace`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def log_paced(
    add: Callable[[str, float, int], None], tags: list[str], rate: int, seconds: float
) -> int:
    """Call ``add(tag, value, step)`` ``rate`` times a second for ``seconds``, round-robin over
    ``tags`` (each tag's step counts its own points); return how many calls were made."""
    t0 = time.perf_counter()
    n = 0
    while (elapsed := time.perf_counter() - t0) < seconds:
        due = int(elapsed * rate)
        while n < due:
            add(tags[n % len(tags)], float(n), n // len(tags))
            n += 1
        time.sleep(0.0005)
    return n


def process_cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds so far of process ``pid``, or of its thread ``thread`` (a
    thread id; the main thread's is the pid), from /proc."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(path) as f:
        # Fields after the command (which may hold spaces): utime and stime are the 12th and
        # 13th of them (14 and 15 of proc(5)).
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_batch(
    writer: str, seq: int, run: str, tags: list[str], points: int, wall: float | None = None
) -> bytes:
    """Encode batch ``seq``: ``points`` points for each tag, steps continuing the previous batch.

    Values are the step numbers (so a reader can check them); walls are ``wall`` (now if None).
    """
    steps = np.arange((seq - 1) * points, seq * points, dtype=np.int64)
    walls = np.full(points, time.time() if wall is None else wall)
    values = steps.astype(np.float64)
    columns = [ScalarColumns(tag, steps, walls, values) for tag in tags]
    return codec.encode_batch(Batch(writer, seq, run, columns))


@dataclass
class WriterResult:
    """What one raw writer sent and what the broker acknowledged."""

    writer: str
    run: str
    connected: bool = False
    sent_batches: int = 0
    sent_events: int = 0
    acked_seq: int = 0
    first_send: float = 0.0
    last_ack: float = 0.0
    ack_latencies: list[float] = field(default_factory=list)
    error: str | None = None


async def stream_batches(
    ws_url: str,
    result: WriterResult,
    *,
    tags: list[str],
    points: int,
    seconds: float,
    start: trio.Event,
    window: int = 8,
    batches_per_s: float | None = None,
    drain_timeout: float = 60.0,
    connected: trio.Semaphore | None = None,
    phase: float = 0.0,
) -> None:
    """Stream batches to ``/ws/ingest`` for ``seconds`` after ``start`` is set, then await the acks.

    Unpaced (``batches_per_s`` None) it keeps at most ``window`` batches unacknowledged; paced it
    sends one batch every ``1 / batches_per_s`` seconds (still within ``window``), the first
    ``phase`` seconds after ``start`` (writers given different phases do not all send at the
    same instants). Fills ``result``; a connection error is recorded there instead of raised.
    """
    per_batch = points * len(tags)
    sent_at: dict[int, float] = {}
    changed = trio.Event()

    async def read_acks(ws) -> None:
        nonlocal changed
        while True:
            message = codec.decode_message(await ws.get_message())
            if message.get("type") != "ack":
                continue
            now = time.perf_counter()
            seq = int(message["seq"])
            for s in range(result.acked_seq + 1, seq + 1):
                result.ack_latencies.append(now - sent_at.pop(s))
            result.acked_seq = max(result.acked_seq, seq)
            result.last_ack = now
            changed.set()
            changed = trio.Event()

    try:
        async with open_websocket_url(
            ws_url + "/ws/ingest", max_message_size=MAX_MESSAGE, connect_timeout=30
        ) as ws:
            result.connected = True
            if connected is not None:
                connected.release()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_acks, ws)
                await start.wait()
                t0 = time.perf_counter() + phase
                result.first_send = t0
                seq = 0
                while time.perf_counter() - t0 < seconds:
                    if batches_per_s is not None:
                        delay = t0 + seq / batches_per_s - time.perf_counter()
                        if delay > 0:
                            await trio.sleep(delay)
                    while seq - result.acked_seq >= window:
                        with trio.move_on_after(drain_timeout) as waited:
                            await changed.wait()
                        if waited.cancelled_caught:
                            raise TimeoutError(f"no ack within {drain_timeout} s")
                    seq += 1
                    frame = make_batch(result.writer, seq, result.run, tags, points)
                    sent_at[seq] = time.perf_counter()
                    await ws.send_message(frame)
                    result.sent_batches = seq
                    result.sent_events += per_batch
                with trio.move_on_after(drain_timeout):
                    while result.acked_seq < seq:
                        await changed.wait()
                nursery.cancel_scope.cancel()
    except Exception as exc:  # recorded and reported as a failed connection, never hidden
        result.error = f"{type(exc).__name__}: {exc}"[:200]
        if connected is not None and not result.connected:
            connected.release()


@dataclass
class SubscriberResult:
    """What one ``/ws/live`` subscriber received."""

    walls: list[np.ndarray] = field(default_factory=list)
    latencies: list[np.ndarray] = field(default_factory=list)
    frames: int = 0
    points: int = 0
    gaps: int = 0
    error: str | None = None

    def latency_since(self, wall0: float) -> np.ndarray:
        """Latencies (seconds) of the points whose wall time is at or after ``wall0``."""
        if not self.walls:
            return np.zeros(0)
        walls, lat = np.concatenate(self.walls), np.concatenate(self.latencies)
        return lat[walls >= wall0]


async def stream_together(
    ws_url: str,
    writers: list[WriterResult],
    *,
    connect_timeout: float = 30.0,
    on_start: Callable[[], None] | None = None,
    **options: Any,
) -> None:
    """Run :func:`stream_batches` for every writer of ``writers`` (``options`` are its keyword
    arguments but ``start`` and ``connected``), starting them at once when all are connected
    (within ``connect_timeout`` seconds); ``on_start`` is called at that moment."""
    start = trio.Event()
    connected = trio.Semaphore(0)
    async with trio.open_nursery() as nursery:
        for w in writers:
            nursery.start_soon(
                partial(stream_batches, ws_url, w, start=start, connected=connected, **options)
            )
        with trio.fail_after(connect_timeout):
            for _ in writers:
                await connected.acquire()
        start.set()
        if on_start is not None:
            on_start()


async def live_subscriber(
    ws_url: str,
    run: str,
    result: SubscriberResult,
    ready: trio.Semaphore,
    stop: trio.Event,
    page: bool = False,
) -> None:
    """Subscribe to ``run`` on ``/ws/live`` and record each data point's latency until ``stop``
    (``page``: subscribe as the page does, with ``split`` and ``batch``)."""
    ask = {"type": "subscribe", "runs": [run], "max_points": 2000}
    if page:
        ask |= {"split": True, "batch": True}
    subscribe = codec.encode_message(ask)
    try:
        async with open_websocket_url(
            ws_url + "/ws/live", max_message_size=MAX_MESSAGE, message_queue_size=64
        ) as ws:
            await ws.send_message(subscribe)
            ready.release()
            async with trio.open_nursery() as nursery:

                async def stopper() -> None:
                    await stop.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stopper)
                while True:
                    data = await ws.get_message()
                    now = time.time()
                    message = codec.decode_message(data)
                    messages = [message]
                    if message["type"] == "frames":  # batch: several frames in one message
                        messages = [codec.decode_message(f) for f in message["frames"]]
                    for message in messages:
                        kind = message["type"]
                        if kind == "gap":
                            result.gaps += 1
                            await ws.send_message(subscribe)
                        elif kind == "data":
                            result.frames += 1
                            for _tag, _steps, walls, _values in message["scalars"]:
                                w = np.frombuffer(walls, dtype="<f8")
                                result.walls.append(w)
                                result.latencies.append(now - w)
                                result.points += len(w)
    except Exception as exc:  # reported in the table, never hidden
        result.error = f"{type(exc).__name__}: {exc}"[:200]
        ready.release()


async def stalled_subscriber(
    host: str, port: int, run: str, ready: trio.Semaphore, stop: trio.Event
) -> None:
    """Connect to ``/ws/live``, subscribe to ``run``, then never read the socket until ``stop``.

    The receive buffer is made small before connecting, so the server's side fills quickly.
    """
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        with trio.fail_after(30):
            await sock.connect((host, port))
            conn = WSConnection(ConnectionType.CLIENT)
            await _send_all(sock, conn.send(Request(host=f"{host}:{port}", target="/ws/live")))
            accepted = False
            while not accepted:
                data = await sock.recv(65536)
                if not data:
                    raise ConnectionError("server closed during the handshake")
                conn.receive_data(data)
                for event in conn.events():
                    if isinstance(event, RejectConnection):
                        raise ConnectionError(f"handshake rejected: {event.status_code}")
                    accepted = accepted or isinstance(event, AcceptConnection)
            message = codec.encode_message({"type": "subscribe", "runs": [run], "max_points": 2000})
            await _send_all(sock, conn.send(Message(data=message)))
        ready.release()
        await stop.wait()
    finally:
        sock.close()


async def _send_all(sock: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[await sock.send(view) :]
