"""Benchmark: a tensorboardX writer logging 1,000 points/s into a directory ``serve`` watches;
latency from ``add_scalar`` to a WebSocket client of ``/ws/live`` (what a page receives).

Starts ``vdl-stream serve --logdir DIR`` (a real subprocess), subscribes to ``/ws/live`` like a
page, then starts a tensorboardX process that logs ``--rate`` points per second of one tag for
``--seconds`` seconds, in batches every 10 ms, with ``SummaryWriter(flush_secs=--flush-secs)``
and an explicit ``flush()`` after every batch. Each point's wall time is the time ``add_scalar``
was called (tensorboardX's default ``walltime``); the client records, for every point it receives,
``receive time - wall time`` (same host, same clock). The points of the first ``--warmup``
seconds after the first point are left out of the percentiles: they include finding the new
directory (one walk, every second), reported apart as the time to the first point. Figures: docs/performance.md ("Live TensorBoard
logdirs")::

    python bench/bench_follow_tb.py                   # 1,000 points/s for 20 s
    python bench/bench_follow_tb.py --quick           # 5 s
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgpack
import numpy as np
import trio
from trio_websocket import open_websocket_url

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from broker_clients import ServeProcess  # noqa: E402

WRITER = """
import sys, time
from tensorboardX import SummaryWriter
directory, rate, seconds, flush_secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
w = SummaryWriter(directory, flush_secs=flush_secs)
per_batch = max(1, rate // 100)
start = time.monotonic()
step = 0
while time.monotonic() - start < seconds:
    for _ in range(per_batch):
        w.add_scalar("train/loss", step * 1e-3, step)
        step += 1
    w.flush()
    pause = start + step / rate - time.monotonic()
    if pause > 0:
        time.sleep(pause)
w.close()
print(step, flush=True)
"""


def start_writer(logdir: Path, args: argparse.Namespace) -> subprocess.Popen:
    """The tensorboardX process of :data:`WRITER`, writing into ``logdir/tb/run``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(logdir / "tb" / "run"),
            str(args.rate),
            str(args.seconds),
            str(args.flush_secs),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def collect(
    receive: Callable[[], Awaitable[bytes]], logdir: Path, args: argparse.Namespace
) -> dict[str, float]:
    """Start the writer, take frames from ``receive`` until every point it wrote arrived, and
    summarise the latencies (receive time minus each point's wall time)."""
    latencies: list[float] = []
    walls: list[float] = []
    first: float | None = None
    writer = start_writer(logdir, args)
    try:
        expected = None
        with trio.fail_after(args.seconds + 60):
            while expected is None or len(latencies) < expected:
                with trio.move_on_after(0.5):
                    message = msgpack.unpackb(await receive())
                    now = time.time()
                    if message.get("type") == "data" and message.get("run") == "tb/run":
                        first = now if first is None else first
                        for tag, _, w, _ in message["scalars"]:
                            if tag == "train/loss":
                                wall = np.frombuffer(w, "<f8")
                                walls.extend(wall.tolist())
                                latencies.extend((now - wall).tolist())
                if expected is None and writer.poll() is not None:
                    expected = int(writer.stdout.read().strip() or 0)
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
    return _summary(np.array(walls), np.array(latencies), first, args)


async def measure(ws_url: str, logdir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Subscribe to ``/ws/live`` like a page, then :func:`collect`."""
    async with open_websocket_url(ws_url + "/ws/live", max_message_size=1 << 24) as ws:
        await ws.send_message(msgpack.packb({"type": "subscribe", "runs": None}))
        return await collect(ws.get_message, logdir, args)


async def measure_in_process(logdir: Path, args: argparse.Namespace) -> dict[str, float]:
    """The server's share alone: a Broker and its ForeignRuns in this process, one subscriber
    (no web server, no WebSocket, no other process between the file and the subscriber)."""
    from vdl_stream.broker import Broker
    from vdl_stream.foreign import ForeignRuns

    broker = Broker(logdir)
    broker.foreign = ForeignRuns(logdir, logdir.parent / "cache")
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await nursery.start(broker.follow)
        sub = broker.subscribe()
        await nursery.start(broker.foreign.run, broker)
        result = await collect(sub.receive, logdir, args)
        broker.close()
        await broker.wait_closed()
        nursery.cancel_scope.cancel()
    return result


def _summary(
    wall: np.ndarray, latencies: np.ndarray, first: float | None, args: argparse.Namespace
) -> dict[str, float]:
    lat = latencies * 1e3
    steady = lat[wall >= wall.min() + args.warmup]
    return {
        "points": len(lat),
        "first_ms": ((first or wall.min()) - wall.min()) * 1e3,
        "p50": float(np.percentile(steady, 50)),
        "p90": float(np.percentile(steady, 90)),
        "p99": float(np.percentile(steady, 99)),
        "max": float(steady.max()),
        "steady": len(steady),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1000, help="points per second (default 1000)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--flush-secs", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="5 s, 2 s of warm-up")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="measure the server's share alone: broker and follower in this process, no WebSocket",
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup = 5.0, 2.0
    for i in range(args.repeat):
        tmp = Path(tempfile.mkdtemp(prefix="bench-follow-tb-"))
        (tmp / "logs").mkdir()
        try:
            if args.in_process:
                r = trio.run(measure_in_process, tmp / "logs", args)
                where = "a subscriber in the server process"
            else:
                server = ServeProcess(
                    tmp / "logs", tmp / "serve.err", "--cache-dir", str(tmp / "cache")
                )
                where = "/ws/live"
                try:
                    r = trio.run(measure, server.ws, tmp / "logs", args)
                finally:
                    server.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"run {i + 1}: {r['points']} points at {args.rate}/s, flush_secs {args.flush_secs}: "
            f"write -> {where} p50 {r['p50']:.1f} ms, p90 {r['p90']:.1f} ms, "
            f"p99 {r['p99']:.1f} ms, max {r['max']:.1f} ms (over {r['steady']} points after "
            f"{args.warmup:g} s); first point after {r['first_ms']:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
