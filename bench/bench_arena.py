"""The first burst of histograms with the spare arrays' arena in huge pages or in 4 KB pages.

``add_histogram`` copies its values into an arena of ``SPARE_BYTES`` (vdl_stream/writer.py) that
asks for 2 MB pages (``MADV_HUGEPAGE``); a first burst touches it fresh. On a virtual machine
whose kernel reports free memory to the host (``page_reporting``), a fresh huge page costs from
one to ten times as much from one process to the next (docs/performance.md, "Histograms: the
process CPU per call"). This runs the benchmark's histogram child (``bench_writer.py``'s
``measure_histograms``, one burst) with the arena as the writer maps it (``huge``), in 4 KB pages
(``4k``), or in 4 KB pages filled 2 MB ahead with ``MADV_POPULATE_WRITE`` (``populate``), each
variant in a fresh process, the variants in turn.

Usage: python bench/bench_arena.py [--pairs N] [--histograms N]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = ("huge", "4k", "populate")
KEYS = ("add_histogram_loop_us", "cpu_per_histogram_us", "add_histogram_main_cpu_us")
#: Linux's MADV_POPULATE_WRITE (5.14 and later), which Python 3.11's mmap does not name.
MADV_POPULATE_WRITE = 23


def child(variant: str, n: int) -> None:
    """Print the figures of one burst of ``n`` histograms with the arena as ``variant``."""
    root = Path(__file__).resolve().parent
    sys.path[:0] = [str(root.parent), str(root)]
    import bench_writer
    import numpy as np

    from vdl_stream import writer

    if variant != "huge":
        state = {"done": 0}

        def map_arena(nbytes: int) -> np.ndarray:
            mapped = mmap.mmap(-1, nbytes + writer._HUGE_PAGE)
            mapped.madvise(mmap.MADV_NOHUGEPAGE)
            whole = np.frombuffer(mapped, np.uint8)
            state["map"], state["start"] = mapped, -whole.ctypes.data % writer._HUGE_PAGE
            return whole[state["start"] : state["start"] + nbytes]

        writer._map_arena = map_arena
    if variant == "populate":
        new = writer._SpareArrays._new

        def populated(self, dtype, size):
            flat = new(self, dtype, size)
            arena = self._arena
            if arena is not None and state["done"] < min(self._arena_used, arena.size):
                step = min(writer._HUGE_PAGE, arena.size - state["done"])
                state["map"].madvise(MADV_POPULATE_WRITE, state["start"] + state["done"], step)
                state["done"] += step
            return flat

        writer._SpareArrays._new = populated
    with tempfile.TemporaryDirectory() as tmp:
        result = bench_writer.measure_histograms("vdl-stream", n, Path(tmp), 10_000)
    print(json.dumps({k: result[k] for k in KEYS}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="rounds of every variant in turn")
    parser.add_argument("--histograms", type=int, default=2_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.histograms)
        return
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.pairs):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]  # each variant first in turn
        for variant in order:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    variant,
                    "--histograms",
                    str(args.histograms),
                ],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"one burst of {args.histograms:,} histograms of 10,000 float32, {args.pairs} processes "
        f"per variant in turn; load average {os.getloadavg()[0]:.1f}; us per call"
    )
    for key in KEYS:
        for variant in VARIANTS:
            cells = ", ".join(f"{r[key]:.1f}" for r in runs[variant])
            median = statistics.median(r[key] for r in runs[variant])
            print(f"{key:28}{variant:>9}: median {median:7.1f}; runs {cells}")


if __name__ == "__main__":
    main()
