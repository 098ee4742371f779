"""``GET /api/export`` of one run from two or more checkouts, alternated: wall time and CPU.

    python bench/export_http_ab.py RUN_DIR --trees BEFORE,. --format csv --repeats 3

Each try starts a fresh ``vdl-stream serve`` of the tree over the run's parent directory (as
bench/bench_serve.py does), reads the whole export, and prints its wall time, the server's CPU
time from its readiness to the end (user + system; its start-up's background reads included),
the CPU time of its export child process if one ran (sampled every 50 ms: a lower bound) and the
client's (this process's). The trees take turns, so the machine's load falls on all alike; on a
shared machine compare the CPU times.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import psutil  # noqa: E402
from bench_serve import Serve  # noqa: E402


def export_once(tree: Path, run: Path, fmt: str, work: Path) -> dict:
    """One export of ``run`` from a fresh server of ``tree``; its times."""
    server = Serve(tree, run.parent, work / "serve-ab.log")
    try:
        proc = psutil.Process(server.proc.pid)
        cpu0 = sum(proc.cpu_times()[:2])
        children: dict[int, float] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for child in proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        children[child.pid] = sum(child.cpu_times()[:2])
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0, c0 = time.perf_counter(), time.process_time()
        url = f"{server.url}/api/export?run={run.name}&format={fmt}"
        with urllib.request.urlopen(url, timeout=1800) as response:
            while response.read(1 << 20):
                pass
        wall, client = time.perf_counter() - t0, time.process_time() - c0
        done.set()
        sampler.join(10)
        return {
            "wall_s": wall,
            "server_cpu_s": sum(proc.cpu_times()[:2]) - cpu0,
            "child_cpu_s": sum(children.values()),
            "client_cpu_s": client,
            "load": os.getloadavg()[0],
        }
    finally:
        server.stop()


def main() -> None:
    """Parse the arguments; run the trees in turn; print one line a try."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory")
    parser.add_argument("--trees", default=".", help="comma-separated checkouts (default .)")
    parser.add_argument("--format", choices=("csv", "json"), default="csv")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1 or not args.run.is_dir():
        parser.error(
            f"--repeats must be >= 1 and RUN a run directory; got {args.repeats}, {args.run}"
        )
    work = Path(os.environ.get("TMPDIR", "/tmp"))
    for _ in range(args.repeats):
        for tree in args.trees.split(","):
            r = export_once(Path(tree).resolve(), args.run.resolve(), args.format, work)
            print(f"{tree}: wall {r['wall_s']:.2f} s, server CPU {r['server_cpu_s']:.2f} s, "
                  f"child CPU >= {r['child_cpu_s']:.2f} s, client CPU {r['client_cpu_s']:.2f} s, "
                  f"load average {r['load']:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
