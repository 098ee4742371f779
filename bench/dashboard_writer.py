"""The live load of bench/bench_dashboard.py: a training loop logging scalars at a paced rate.

Run as its own process (so it does not share the page driver's GIL):

    python bench/dashboard_writer.py --url ws://127.0.0.1:PORT --run live --tags 20 --rate 1000 \
        --duration 60

It attaches to a running ``vdl-stream serve``, prints ``ready``, waits for a line on stdin, then
logs ``--tags`` tags (``load/t00`` ...) at ``--rate`` points per second each: every ``--tick``
seconds, ``rate * tick`` points per tag, steps 0, 1, 2, ... With ``--prefill N`` it first logs N
points per tag at once (steps 0..N-1), flushes, prints a JSON line and waits for another line on
stdin before the paced load (steps from N). The schedule is absolute, so a late tick
is caught up by the next one; the loop is bounded both by the number of points and by time
(``duration`` + 30 s). At the end it flushes (waiting for the broker's acknowledgement) and prints
one JSON line: points sent per tag, the time it took, the worst lateness behind schedule and the
CPU seconds the process used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vdl_stream import attach


def tag_name(i: int) -> str:
    """The tag of load series ``i``, sorted in creation order."""
    return f"load/t{i:02d}"


def main() -> None:
    """Parse the arguments, attach, log the paced load and report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="ws://host:port of vdl-stream serve")
    parser.add_argument("--run", required=True)
    parser.add_argument("--tags", type=int, default=20)
    parser.add_argument("--rate", type=int, default=1000, help="points per second per tag")
    parser.add_argument("--tick", type=float, default=0.01, help="seconds between batches")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument(
        "--prefill", type=int, default=0, help="points per tag logged at once before the paced load"
    )
    args = parser.parse_args()

    per_tick = max(1, round(args.rate * args.tick))
    ticks = math.ceil(args.duration / args.tick)
    tags = [tag_name(i) for i in range(args.tags)]
    writer = attach(url=args.url, run=args.run, telemetry=False)
    try:
        print("ready", flush=True)
        sys.stdin.readline()  # the benchmark says when to start
        step = 0
        if args.prefill:
            # History logged as fast as the writer takes it, so that the page's ring buffers are
            # full before the paced load is measured.
            wall = time.time() - args.prefill / args.rate
            for start in range(0, args.prefill, 10_000):
                for tag in tags:
                    for s in range(start, min(args.prefill, start + 10_000)):
                        writer.add_scalar(tag, math.sin(s * 1e-3), s, wall + s / args.rate)
            step = args.prefill
            print(json.dumps({"prefilled": writer.flush(timeout=300)}), flush=True)
            sys.stdin.readline()
        start = time.monotonic()
        deadline = start + args.duration + 30.0
        behind = 0.0
        first = step
        for k in range(ticks):
            due = start + k * args.tick
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            else:
                behind = max(behind, now - due)
            if now > deadline:
                break
            wall = time.time()
            for tag in tags:
                for i in range(per_tick):
                    writer.add_scalar(tag, math.sin((step + i) * 1e-3), step + i, wall)
            step += per_tick
        elapsed = time.monotonic() - start
        flushed = writer.flush(timeout=60)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(
            json.dumps(
                {
                    "points_per_tag": step,
                    "prefill_per_tag": first,
                    "tags": tags,
                    "elapsed_s": elapsed,
                    "flush_s": time.monotonic() - start - elapsed,
                    "flushed": flushed,
                    "max_behind_s": behind,
                    "cpu_s": usage.ru_utime + usage.ru_stime,
                }
            ),
            flush=True,
        )
    finally:
        writer.close(timeout=10)


if __name__ == "__main__":
    main()
