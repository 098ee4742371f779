"""Export speed in process: rows/s of :class:`vdl_stream.interop.Export` by format and threads.

    python bench/bench_export.py                          # 10M points, csv and json, threads 0
    python bench/bench_export.py --threads 0,1,2 --tag 'tag[01]$' --repeats 5

The run is bench/bench_serve.py's bulk run of ``--points`` points (10 tags, cached under
``--cache``). Each configuration is run ``--repeats`` times, the configurations interleaved so
that the machine's load falls on all of them alike; the output goes to /dev/null through
``os.write``. Prints the median wall and CPU time (user + system of the whole process, threads
included) of each, and rows per second of both: on a shared machine the CPU figure moves less.
For the CLI and ``/api/export`` (peak RSS, event-loop stall) see bench/bench_serve.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_serve import bulk_run  # noqa: E402

from vdl_stream.interop import Export  # noqa: E402


def export_once(run: Path, fmt: str, pattern: str | None, threads: int) -> tuple[int, float, float]:
    """Export ``run`` to /dev/null; return the rows, wall seconds and CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        with Export(run, fmt, pattern, threads=threads) as export:
            for chunk in export:
                os.write(fd, chunk)
    finally:
        os.close(fd)
    return export.rows, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    """Parse the arguments, run every configuration, print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=10_000_000, help="default 10,000,000")
    parser.add_argument("--formats", default="csv,json", help="comma-separated (default csv,json)")
    parser.add_argument("--threads", default="0", help="comma-separated Export(threads=) values")
    parser.add_argument("--tag", help="only tags matching this regex (a smaller export)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; medians are printed")
    parser.add_argument("--cache", default="/tmp/vdl-bench-serve", help="where the run is kept")
    args = parser.parse_args()
    formats = args.formats.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    if not set(formats) <= {"csv", "json"} or min(threads) < 0 or args.repeats < 1:
        parser.error(
            f"--formats takes csv and json, --threads ints >= 0, --repeats >= 1; got "
            f"{args.formats!r}, {args.threads!r}, {args.repeats}"
        )
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    run = bulk_run(Path(args.cache), args.points)
    results: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    for _ in range(args.repeats):
        for fmt in formats:
            for t in threads:
                results.setdefault((fmt, t), []).append(export_once(run, fmt, args.tag, t))
    print(f"{args.points:,} points, tag {args.tag or 'all'}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, median of {args.repeats}")  # fmt: skip
    print("\n| format | threads | rows | wall s | rows/s | CPU s | rows per CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (fmt, t), runs in results.items():
        rows = runs[0][0]
        wall = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        print(f"| {fmt} | {t} | {rows:,} | {wall:.2f} | {rows / wall / 1e6:.2f}M | {cpu:.2f} | "
              f"{rows / cpu / 1e6:.2f}M |")  # fmt: skip


if __name__ == "__main__":
    main()
