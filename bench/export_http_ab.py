"""``GET /api/export`` of one run from two or more checkouts, alternated: wall time and CPU.

    python bench/export_http_ab.py RUN_DIR --trees BEFORE,. --format csv --repeats 3
    python bench/export_http_ab.py RUN_DIR --trees BEFORE,. --format json --tag 'tag[01]$' --settle 3

Each try starts a fresh ``vdl-stream serve`` of the tree over the run's parent directory (as
bench/bench_serve.py does), waits until it has settled (its start-up reads done:
``bench_serve.wait_settled``, as bench_serve.py's export does; ``--settle S`` waits S seconds
instead), reads the whole export, and prints its wall time, the server's CPU time over it (user
+ system), its export child's (the child and its helper process, exact: counted by the server
once it has reaped the child; the lines before 2026-12-01 h5-json sampled it every 50 ms, a
lower bound) and the client's (this process's), the server and child's CPU per million stored
points exported (what the machine's load barely moves), and the server's minor page faults.
``--tag`` exports the tags it matches only. The trees take turns, so the machine's load falls
on all alike; on a shared machine compare the CPU times (the last lines give each tree's
medians). ``--digest``
also prints the body's size and SHA-256, to check that the trees send the same bytes (it costs
the client about a second of CPU per GB).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
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
from bench_serve import Serve, server_cpu, wait_settled  # noqa: E402

import recorder  # noqa: E402


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
    settle: float | None = None,
    digest: bool = False,
) -> dict:
    """One export of ``run`` (``tag``: the tags matched only) from a fresh server of ``tree``,
    once it has settled (or ``settle`` seconds after its readiness); its times (and the body's
    size and SHA-256 if ``digest``)."""
    server = Serve(tree, run.parent, work / "serve-ab.log")
    try:
        proc = psutil.Process(server.proc.pid)
        if settle is None:
            settled = wait_settled(proc.pid)
        else:
            time.sleep(settle)  # the server's start-up reads run meanwhile, left out below
            settled = settle
        cpu0 = server_cpu(proc.pid)
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
        cpu1 = server_cpu(proc.pid)  # the child is reaped before the body's last chunk
        return {
            "wall_s": wall,
            "settled_s": settled,
            "server_cpu_s": cpu1[0] - cpu0[0],
            "server_faults": minor_faults(proc.pid) - faults0,
            "child_cpu_s": cpu1[1] - cpu0[1],
            "child_sampled_cpu_s": sum(children.values()),
            "client_cpu_s": client,
            "server_peak_mb": server.peak_mb(),
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
        "--settle",
        type=float,
        default=None,
        help="seconds from readiness to the export (default: until the server has settled)",
    )
    parser.add_argument("--digest", action="store_true", help="print the body's SHA-256")
    args = parser.parse_args()
    if args.repeats < 1 or (args.settle or 0) < 0 or not args.run.is_dir():
        parser.error(
            f"--repeats must be >= 1, --settle >= 0 and RUN a run directory; got "
            f"{args.repeats}, {args.settle}, {args.run}"
        )
    work = Path(os.environ.get("TMPDIR", "/tmp"))
    trees = args.trees.split(",")
    tries: dict[str, list[dict]] = {tree: [] for tree in trees}
    with recorder.RunReader(args.run) as reader:
        regex = re.compile(args.tag) if args.tag else None
        points = sum(
            info.count
            for t, info in reader.tags().items()
            if info.kind == "scalars" and (regex is None or regex.search(t))
        )
    for _ in range(args.repeats):
        for tree in trees:
            r = export_once(
                Path(tree).resolve(), args.run.resolve(), args.format, work, args.tag,
                args.settle, args.digest,
            )  # fmt: skip
            r["cpu_per_m"] = (r["server_cpu_s"] + r["child_cpu_s"]) / (points / 1e6)
            tries[tree].append(r)
            print(f"{tree}: wall {r['wall_s']:.2f} s ({points / r['wall_s'] / 1e6:.2f}M rows/s), "
                  f"server CPU {r['server_cpu_s']:.2f} s, server faults {r['server_faults']:,}, "
                  f"child CPU {r['child_cpu_s']:.2f} s (sampled {r['child_sampled_cpu_s']:.2f}), "
                  f"server + child {r['cpu_per_m']:.3f} s per M rows, settled in "
                  f"{r['settled_s']:.1f} s, client CPU {r['client_cpu_s']:.2f} s, "
                  f"load average {r['load']:.1f}, server peak RSS {r['server_peak_mb']:.0f} MB, "
                  f"{r['bytes']:,} bytes"
                  + (f", sha256 {r['sha256'][:16]}" if args.digest else ""), flush=True)  # fmt: skip
    for tree, rs in tries.items():
        keys = ("wall_s", "server_cpu_s", "child_cpu_s", "cpu_per_m")
        m = {k: statistics.median(r[k] for r in rs) for k in keys}
        print(f"{tree}: median of {len(rs)}: wall {m['wall_s']:.2f} s "
              f"({points / m['wall_s'] / 1e6:.2f}M rows/s), server CPU {m['server_cpu_s']:.2f} s, "
              f"child CPU {m['child_cpu_s']:.2f} s, server + child {m['cpu_per_m']:.3f} s "
              f"per M rows ({points:,} stored points)")  # fmt: skip


if __name__ == "__main__":
    main()
