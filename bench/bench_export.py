"""Export speed in process: rows/s of :class:`vdl_stream.interop.Export` by format and threads.

    python bench/bench_export.py                          # 10M points, csv and json, threads 0
    python bench/bench_export.py --threads 0,1,2,auto --tag 'tag[01]$' --repeats 5
    python bench/bench_export.py --values small --points 2000000   # every value below 1e-4

The run is bench/bench_serve.py's bulk run of ``--points`` points (10 tags, cached under
``--cache``), or with ``--values small`` a run of the same shape whose values all lie between
1e-7 and 6e-5 (a learning rate's: every one of them in exponent notation). Each configuration is run ``--repeats`` times, the configurations interleaved so
that the machine's load falls on all of them alike; the output goes to /dev/null through
``os.write``. Prints the median wall and CPU time (user + system of the whole process, threads
included) of each, and rows per second of both: on a shared machine the CPU figure moves less.
For the CLI and ``/api/export`` (peak RSS, event-loop stall) see bench/bench_serve.py.

The process keeps freed memory for reuse as ``vdl-stream export`` (and ``/api/export``'s child)
does (``interop._keep_freed_memory``); ``--malloc default`` leaves glibc's defaults, as a program
that uses :class:`Export` itself has them (every block then faults its pages in afresh).
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

import numpy as np  # noqa: E402
from bench_serve import bulk_run  # noqa: E402

from vdl_stream import interop  # noqa: E402
from vdl_stream.interop import Export, export_threads  # noqa: E402


def small_run(cache: Path, points: int) -> Path:
    """bulk_run's shape (``points`` over 10 tags, in bulk), its values a learning rate's, all
    below 1e-4; cached."""
    return bulk_run(cache, points, "small", lambda s, t: 3e-5 * (1 + np.cos(s * 1e-4 + t)) + 1e-7)


def export_once(
    run: Path, fmt: str, pattern: str | None, threads: int | None
) -> tuple[int, float, float]:
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
    parser.add_argument(
        "--threads",
        default="0",
        help="comma-separated Export(threads=) values; auto: the default (export_threads())",
    )
    parser.add_argument(
        "--values", choices=("bulk", "small"), default="bulk", help="the run (default bulk)"
    )
    parser.add_argument("--tag", help="only tags matching this regex (a smaller export)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; medians are printed")
    parser.add_argument("--cache", default="/tmp/vdl-bench-serve", help="where the run is kept")
    parser.add_argument(
        "--malloc",
        choices=("keep", "default"),
        default="keep",
        help="keep freed memory as the CLI does (default), or glibc's defaults",
    )
    args = parser.parse_args()
    formats = args.formats.split(",")
    try:
        threads = [None if t == "auto" else int(t) for t in args.threads.split(",")]
    except ValueError:
        threads = [-1]  # refused below
    bad_threads = any(t is not None and t < 0 for t in threads)
    if not set(formats) <= {"csv", "json"} or bad_threads or args.repeats < 1:
        parser.error(
            f"--formats takes csv and json, --threads ints >= 0 or auto, --repeats >= 1; got "
            f"{args.formats!r}, {args.threads!r}, {args.repeats}"
        )
    keep = getattr(interop, "_keep_freed_memory", None)  # an older tree has none
    if args.malloc == "keep" and keep is not None:
        keep()
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    make = small_run if args.values == "small" else bulk_run
    run = make(Path(args.cache), args.points)
    results: dict[tuple[str, int | None], list[tuple[int, float, float]]] = {}
    for _ in range(args.repeats):
        for fmt in formats:
            for t in threads:
                results.setdefault((fmt, t), []).append(export_once(run, fmt, args.tag, t))
    print(f"{args.points:,} points ({args.values}), tag {args.tag or 'all'}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (auto: {export_threads()} threads now), "
          f"median of {args.repeats}, malloc {args.malloc if keep else 'default (old tree)'}")  # fmt: skip
    print("\n| format | threads | rows | wall s | rows/s | CPU s | rows per CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (fmt, t), runs in results.items():
        rows = runs[0][0]
        wall = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        name = "auto" if t is None else t
        print(f"| {fmt} | {name} | {rows:,} | {wall:.2f} | {rows / wall / 1e6:.2f}M | {cpu:.2f} | "
              f"{rows / cpu / 1e6:.2f}M |")  # fmt: skip


if __name__ == "__main__":
    main()
