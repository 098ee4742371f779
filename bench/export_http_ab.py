"""``GET /api/export`` of one run from two or more checkouts, alternated: wall time and CPU.

    python bench/export_http_ab.py RUN_DIR --trees BEFORE,. --format csv --repeats 3
    python bench/export_http_ab.py RUN_DIR --trees BEFORE,. --format json --tag 'tag[01]$' --settle 3

Each try starts a fresh ``vdl-stream serve`` of the tree over the run's parent directory (as
bench/bench_serve.py does), reads the whole export, and prints its wall time, the server's CPU
time from its readiness to the end (user + system; its start-up's background reads included),
the CPU time of its export child process if one ran (sampled every 50 ms: a lower bound) and the
client's (this process's), and the server's minor page faults. ``--tag`` exports the tags it
matches only; ``--settle S`` starts the export S seconds after the server's readiness, its
start-up reads then left out of its CPU time. The trees take turns, so the machine's load falls on all alike; on a
shared machine compare the CPU times (the last lines give each tree's medians). ``--digest``
also prints the body's size and SHA-256, to check that the trees send the same bytes (it costs
the client about a second of CPU per GB).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import psutil  # noqa: E402
from bench_serve import Serve  # noqa: E402


def minor_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (Linux's /proc/PID/stat; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except OSError:
        return 0


def export_once(
    tree: Path,
    run: Path,
    fmt: str,
    work: Path,
    tag: str | None = None,
    settle: float = 0.0,
    digest: bool = False,
) -> dict:
    """One export of ``run`` (``tag``: the tags matched only) from a fresh server of ``tree``,
    ``settle`` seconds after its readiness; its times (and the body's size and SHA-256 if
    ``digest``)."""
    server = Serve(tree, run.parent, work / "serve-ab.log")
    try:
        proc = psutil.Process(server.proc.pid)
        time.sleep(settle)  # the server's start-up reads run meanwhile, left out below
        cpu0 = sum(proc.cpu_times()[:2])
        faults0 = minor_faults(proc.pid)
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
        if tag:
            url += "&tag=" + urllib.parse.quote(tag)
        body = hashlib.sha256() if digest else None
        size = 0
        with urllib.request.urlopen(url, timeout=1800) as response:
            while chunk := response.read(1 << 20):
                size += len(chunk)
                if body is not None:
                    body.update(chunk)
        wall, client = time.perf_counter() - t0, time.process_time() - c0
        done.set()
        sampler.join(10)
        return {
            "wall_s": wall,
            "server_cpu_s": sum(proc.cpu_times()[:2]) - cpu0,
            "server_faults": minor_faults(proc.pid) - faults0,
            "child_cpu_s": sum(children.values()),
            "client_cpu_s": client,
            "load": os.getloadavg()[0],
            "bytes": size,
            "sha256": body.hexdigest() if body is not None else None,
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
    parser.add_argument("--tag", metavar="PATTERN", help="only tags matching this regex")
    parser.add_argument(
        "--settle", type=float, default=0.0, help="seconds from readiness to the export"
    )
    parser.add_argument("--digest", action="store_true", help="print the body's SHA-256")
    args = parser.parse_args()
    if args.repeats < 1 or args.settle < 0 or not args.run.is_dir():
        parser.error(
            f"--repeats must be >= 1, --settle >= 0 and RUN a run directory; got "
            f"{args.repeats}, {args.settle}, {args.run}"
        )
    work = Path(os.environ.get("TMPDIR", "/tmp"))
    trees = args.trees.split(",")
    tries: dict[str, list[dict]] = {tree: [] for tree in trees}
    for _ in range(args.repeats):
        for tree in trees:
            r = export_once(
                Path(tree).resolve(), args.run.resolve(), args.format, work, args.tag,
                args.settle, args.digest,
            )  # fmt: skip
            tries[tree].append(r)
            print(f"{tree}: wall {r['wall_s']:.2f} s, server CPU {r['server_cpu_s']:.2f} s, "
                  f"server faults {r['server_faults']:,}, "
                  f"child CPU >= {r['child_cpu_s']:.2f} s, client CPU {r['client_cpu_s']:.2f} s, "
                  f"load average {r['load']:.1f}, {r['bytes']:,} bytes"
                  + (f", sha256 {r['sha256'][:16]}" if args.digest else ""), flush=True)  # fmt: skip
    for tree, rs in tries.items():
        medians = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "server_cpu_s")}
        child = statistics.median(r["child_cpu_s"] for r in rs)
        print(f"{tree}: median of {len(rs)}: wall {medians['wall_s']:.2f} s, server CPU "
              f"{medians['server_cpu_s']:.2f} s, child CPU >= {child:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
