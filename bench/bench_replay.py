"""Benchmark: ``vdl-stream replay --speed max`` of a large run into a broker subscriber.

Records a run of N scalar points (10 tags, 1 ms apart) plus one histogram per 10,000 points with
``recorder.RunWriter``, then replays it the way ``vdl-stream replay --speed max`` does: timelines
loaded with ``RunReader.iter_records()``, fed by a :class:`~vdl_stream.replay.Replayer` into a
real :class:`~vdl_stream.broker.Broker` over a temporary directory (which persists everything it is
fed), with one in-process subscriber decoding every ``data`` frame (msgpack) and counting points.
The rate is points and events received by the subscriber per second, from the first feed to the
last frame received; the time until the broker has also written and fsynced everything is printed
too.

With ``--websocket`` the subscriber is also measured as a WebSocket client of ``/ws/live`` (the
browser's path), started paused so that it is subscribed before the first batch.

Usage::

    python bench/bench_replay.py --points 10000000 --websocket
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time

import msgpack
import numpy as np
import trio

import recorder
from vdl_stream.replay import BrokerSlot, Replayer, load_timelines, serve_replay

TAGS = 10


def record(run_dir: str, points: int) -> int:
    """Write the run; return its number of points and events."""
    per_tag = points // TAGS
    block = 1 << 16
    events = 0
    with recorder.RunWriter(run_dir, sync="never") as w:
        for lo in range(0, per_tag, block):
            hi = min(lo + block, per_tag)
            steps = np.arange(lo, hi, dtype=np.int64)
            for k in range(TAGS):
                walls = 1.7e9 + (steps * TAGS + k) * 1e-3
                w.append_scalars(f"train/m{k}", steps, walls, np.sin(steps * (k + 1) * 1e-4))
            for step in range(lo - lo % 1000 + 1000 if lo % 1000 else lo, hi, 1000):
                edges = np.linspace(-1, 1, 31).tobytes()
                counts = np.ones(30).tobytes()
                w.append_record(
                    "histogram",
                    "weights",
                    step,
                    1.7e9 + step * TAGS * 1e-3,
                    {"edges": edges, "counts": counts, "num": 30},
                )
                events += 1
            w.flush()
    return per_tag * TAGS + events


async def replay(logdir: str, workdir: str, total: int) -> tuple[float, float, float, int, int]:
    t = time.perf_counter()
    timelines = await trio.to_thread.run_sync(load_timelines, logdir)
    load = time.perf_counter() - t
    received = 0
    gaps = 0
    async with trio.open_nursery() as nursery:
        slot = BrokerSlot(workdir, nursery)
        await slot.start()
        sub = slot.subscribe()
        replayer = Replayer(timelines, slot, speed=math.inf)
        started = time.perf_counter()
        await nursery.start(replayer.run)
        while received < total:
            frame = msgpack.unpackb(await sub.receive())
            if frame["type"] == "gap":
                gaps += 1
                break
            if frame["type"] != "data":
                continue
            received += sum(len(cols[1]) // 8 for cols in frame["scalars"]) + len(frame["events"])
        elapsed = time.perf_counter() - started
        await slot.aclose()  # the broker drains, writes and fsyncs what it was fed
        persisted = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    return load, elapsed, persisted, received, gaps


async def replay_websocket(logdir: str, workdir: str, total: int) -> tuple[float, int]:
    """The same, with the subscriber a WebSocket client of ``/ws/live`` on 127.0.0.1."""
    from trio_websocket import open_websocket_url

    timelines = await trio.to_thread.run_sync(load_timelines, logdir)
    received = 0
    async with trio.open_nursery() as nursery:
        slot = BrokerSlot(workdir, nursery)
        await slot.start()
        replayer = Replayer(timelines, slot, speed=math.inf, start_paused=True)
        await nursery.start(replayer.run)
        url = await nursery.start(serve_replay, slot, replayer, "127.0.0.1", 0)
        ws_url = url.replace("http", "ws", 1) + "/ws/live"
        async with open_websocket_url(ws_url, max_message_size=64 << 20) as ws:
            await ws.send_message(msgpack.packb({"type": "subscribe", "runs": None}))
            # The broker announces nothing to a new subscriber while it has no run: poll for it.
            while not slot.statistics().subscribers:  # noqa: ASYNC110
                await trio.sleep(0.01)
            started = time.perf_counter()
            replayer.play()
            while received < total:
                frame = msgpack.unpackb(await ws.get_message())
                if frame["type"] == "gap":
                    break
                if frame["type"] == "data":
                    received += sum(len(c[1]) // 8 for c in frame["scalars"])
                    received += len(frame["events"])
            elapsed = time.perf_counter() - started
        await slot.aclose()
        nursery.cancel_scope.cancel()
    return elapsed, received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument(
        "--websocket", action="store_true", help="also measure through /ws/live on 127.0.0.1"
    )
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="vdl-bench-replay-")
    try:
        t = time.perf_counter()
        total = record(os.path.join(work, "logs", "big"), args.points)
        print(f"recorded {total:,} points and events in {time.perf_counter() - t:.1f} s")
        os.makedirs(os.path.join(work, "broker"))
        load, elapsed, persisted, received, gaps = trio.run(
            replay, os.path.join(work, "logs"), os.path.join(work, "broker"), total
        )
        print(f"loaded the run in {load:.2f} s")
        print(
            f"replayed {received:,} of {total:,} into a subscriber in {elapsed:.2f} s: "
            f"{received / elapsed:,.0f} events/s ({gaps} gaps)"
        )
        print(
            f"broker done persisting them (temporary directory, fsynced) after {persisted:.2f} s: "
            f"{received / persisted:,.0f} events/s"
        )
        if args.websocket:
            os.makedirs(os.path.join(work, "broker2"))
            elapsed, received = trio.run(
                replay_websocket, os.path.join(work, "logs"), os.path.join(work, "broker2"), total
            )
            print(
                f"through /ws/live: {received:,} of {total:,} in {elapsed:.2f} s: "
                f"{received / elapsed:,.0f} events/s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
