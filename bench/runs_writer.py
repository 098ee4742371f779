"""The live load of bench/dashboard_runs.py: many runs logging scalars at once, paced.

Run as its own process (so it does not share the page driver's GIL):

    python bench/runs_writer.py --url ws://127.0.0.1:PORT --runs 50 --tags 10 --rate 100 \
        --duration 30

It attaches ``--runs`` writers (runs ``live-00`` ...) to a running ``vdl-stream serve``, each with
hparams, logs one point per tag, prints ``ready`` and waits for a line on stdin; then every
``--tick`` seconds it logs ``rate * tick`` points per tag for every run (steps 1, 2, ...) on an
absolute schedule, bounded by the number of ticks and by time (``duration`` + 30 s). At the end it
flushes every writer and prints one JSON line: points sent per tag, the worst lateness and the CPU
seconds used.
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


def main() -> None:
    """Parse the arguments, attach every run, log the paced load and report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="ws://host:port of vdl-stream serve")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--rate", type=int, default=100, help="points per second per tag and run")
    parser.add_argument("--tick", type=float, default=0.1, help="seconds between batches")
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()
    if args.runs < 1 or args.tags < 1 or args.rate < 1:
        sys.exit(
            f"--runs, --tags and --rate must be positive, got {args.runs}, {args.tags}, {args.rate}"
        )

    per_tick = max(1, round(args.rate * args.tick))
    ticks = math.ceil(args.duration / args.tick)
    tags = [f"live/t{i:02d}" for i in range(args.tags)]
    writers = []
    try:
        for r in range(args.runs):
            w = attach(url=args.url, run=f"live-{r:02d}", telemetry=False)
            writers.append(w)
            w.add_hparams({"lr": 10 ** -(1 + r % 4), "optimizer": ("adam", "sgd")[r % 2]}, tags[:1])
            for tag in tags:
                w.add_scalar(tag, 0.0, 0)
        for w in writers:
            w.flush(timeout=60)
        print("ready", flush=True)
        sys.stdin.readline()  # the benchmark says when to start
        start = time.monotonic()
        deadline = start + args.duration + 30.0
        behind = 0.0
        step = 1
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
            for r, w in enumerate(writers):
                for t, tag in enumerate(tags):
                    for i in range(per_tick):
                        s = step + i
                        w.add_scalar(tag, math.exp(-s * 1e-3 * (1 + r % 5)) + 0.01 * t, s, wall)
            step += per_tick
        flushed = all(w.flush(timeout=60) for w in writers)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(
            json.dumps(
                {
                    "points_per_tag": step,
                    "runs": args.runs,
                    "tags": args.tags,
                    "elapsed_s": time.monotonic() - start,
                    "flushed": flushed,
                    "max_behind_s": behind,
                    "cpu_s": usage.ru_utime + usage.ru_stime,
                }
            ),
            flush=True,
        )
    finally:
        for w in writers:
            w.close(timeout=10)


if __name__ == "__main__":
    main()
