"""CPU of the broker's persist step per call: ``Broker._persist`` on batches as the server decodes them.

    PYTHONPATH=$PWD python bench/persist_cpu.py                     # 10 tags x 1 point, 2,000 calls
    PYTHONPATH=$PWD python bench/persist_cpu.py --tags 4 --points 1024 --calls 200
    PYTHONPATH=$PWD python bench/persist_cpu.py --profile            # cProfile of the same calls

A broker in this process (compaction in a process of its own, as served), one run; the batches
are built as a writer sends them (steps counting up, walls a millisecond apart), encoded as
``batch`` frames and decoded by :func:`vdl_stream.codec.decode_batch`, as the server's ingest
route does (read-only columns of the frame), all before the clock starts. Then ``_persist`` is
called ``--calls`` times in a row on the event loop's thread, one batch a call (each call appends
the batch and its bookkeeping record and flushes, as the persist task does for one queued batch),
and the process CPU (``time.process_time``) over the calls is divided by their number: the
persist step's own CPU (with ``--rounds R`` the calls are also timed in R rounds of thread CPU,
and the best and median round reported), with the hop to the worker thread and the fsync schedule left out. Run
it alternately in a before and an after tree (it imports ``vdl_stream`` from ``PYTHONPATH``).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import trio

from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns, decode_batch, encode_batch


def build_batches(tags: int, points: int, calls: int) -> list[Batch]:
    """``calls + 1`` batches of ``tags`` x ``points`` points, decoded from their wire frames."""
    names = [f"train/metric{i}" for i in range(tags)]
    rng = np.random.default_rng(0)
    out = []
    for seq in range(1, calls + 2):
        steps = np.arange((seq - 1) * points, seq * points, dtype=np.int64)
        walls = 1.7e9 + steps * 1e-3
        scalars = [ScalarColumns(n, steps, walls, rng.normal(size=points)) for n in names]
        frame = encode_batch(Batch("bench", seq, "run", scalars, []))
        out.append(decode_batch(msgpack.unpackb(frame, raw=False)))
    return out


def measure(tags: int, points: int, calls: int, profile: str | None, rounds: int = 1) -> dict:
    """Process CPU and wall time per ``_persist`` call (see the module docstring)."""
    batches = build_batches(tags, points, calls)
    result: dict = {"tags": tags, "points": points, "calls": calls}

    async def main(logdir: Path) -> None:
        broker = Broker(logdir)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            # The first batch opens the run and its writer, through the persist task.
            await broker.wait_written(await broker.ingest(batches[0]))
            items = [(1_000_000 + i, b, False) for i, b in enumerate(batches[1:])]
            profiler = cProfile.Profile(time.thread_time) if profile else None
            times0 = os.times()
            cpu, wall, own = time.process_time(), time.perf_counter(), time.thread_time()
            if profiler is not None:
                profiler.enable()
            per_round = []
            size = -(-len(items) // rounds)
            for lo in range(0, len(items), size):
                started = time.thread_time()
                for item in items[lo : lo + size]:
                    broker._persist([item])
                per_round.append((time.thread_time() - started) / len(items[lo : lo + size]))
            if profiler is not None:
                profiler.disable()
            own = time.thread_time() - own
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            result["thread_cpu_us_per_call"] = own / calls * 1e6
            # The quietest round: what the calls cost when nothing else took the core's caches.
            result["best_round_us_per_call"] = min(per_round) * 1e6
            result["median_round_us_per_call"] = statistics.median(per_round) * 1e6
            times1 = os.times()
            result["user_us_per_call"] = (times1.user - times0.user) / calls * 1e6
            result["system_us_per_call"] = (times1.system - times0.system) / calls * 1e6
            result["cpu_us_per_call"] = cpu / calls * 1e6
            result["wall_us_per_call"] = wall / calls * 1e6
            if profiler is not None:
                profiler.dump_stats(profile)
            broker.close()
            await broker.wait_closed()

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))
    result["loadavg"] = os.getloadavg()[0]
    return result


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--points", type=int, default=1, help="points a tag in each batch")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1, help="split the calls in rounds")
    parser.add_argument("--profile", nargs="?", const="/tmp/persist_cpu.prof", metavar="PATH")
    args = parser.parse_args()
    print(json.dumps(measure(args.tags, args.points, args.calls, args.profile, args.rounds)))
    if args.profile:
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
