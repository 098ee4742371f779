"""The runs API over a sweep: ``GET /api/runs`` and the first ``summaries`` frame (issue 12).

    python bench/bench_runs.py                    # 1,000 runs x 10 tags, 1k and 10k points a tag
    python bench/bench_runs.py --quick            # 200 runs, 100 and 1k points a tag, 2 starts
    python bench/bench_runs.py --points 1000 10000 100000 --runs 1000
    python bench/bench_runs.py --baseline /work/main  # and serve start-up against another tree
    python bench/bench_runs.py --micro                # only the write paths' costs (in-process)
    python bench/bench_runs.py --startup-only --baseline /work/main --starts 7

For each ``--points`` the log directory of bench/runs_data.py (``--runs`` runs of ``--tags`` tags,
hparams, host, close markers; generated once under bench/out/runs/) is served by a fresh
``vdl-stream serve`` subprocess of this checkout on 127.0.0.1, ``--starts`` times. Each start
measures:

* ``startup_s``: from starting the process until it prints its URL (discovery of every run, with
  its summary read from the recorder's digest, happens before it listens);
* ``cold_ms``: the first ``GET /api/runs`` (body read);
* ``warm_ms``: the median of ``--gets`` more;
* ``stats_ms``: the median of ``--gets`` ``GET /api/stats`` (a small answer): the floor that the
  machine's load sets for any answer at that moment;
* ``summaries_ms``: from opening ``/ws/live`` until its first ``summaries`` frame (every run's
  summary) is read, and that frame's size.

And after each start, in this process (no HTTP, no other work): a ``Broker``'s discovery of the
runs, and the median time to build the ``GET /api/runs`` answer and the ``summaries`` frame (the
server's own cost). The starts of the sizes are interleaved (one of each per round), so that the
shared machine's load weighs on every size alike; every figure is a median over the starts.

The OS page cache is warm (the generation just wrote the files, or an earlier start read them).
Results: a Markdown table on stdout, and the record in bench/out/runs.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import trio  # noqa: E402
from runs_data import cached_facts, cached_runs  # noqa: E402
from trio_websocket import open_websocket_url  # noqa: E402

from tests.conftest import start_serve, stop_serve  # noqa: E402


def get_runs(url: str) -> tuple[float, bytes]:
    """``GET /api/runs``: seconds until the whole body is read, and the body."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url + "/api/runs", timeout=60) as response:
        body = response.read()
    return time.perf_counter() - t0, body


async def first_summaries(ws_url: str) -> tuple[float, int, int]:
    """Seconds from opening ``/ws/live`` until the first ``summaries`` frame is read; its size
    and run count."""
    t0 = time.perf_counter()
    async with open_websocket_url(ws_url + "/ws/live", max_message_size=1 << 30) as ws:
        while True:
            data = await ws.get_message()
            message = msgpack.unpackb(data, raw=False)
            if message["type"] == "summaries":
                return time.perf_counter() - t0, len(data), len(message["runs"])


def in_process(logdir: str, runs: int, gets: int) -> dict:
    """The server's own cost, without HTTP: a Broker over ``logdir`` discovers its runs (reading
    every digest), then ``summaries_json()`` (what GET /api/runs answers with) and the first
    ``summaries`` frame are built ``gets`` times each."""
    from vdl_stream.broker import Broker

    async def run() -> dict:
        broker = Broker(logdir)
        t0 = time.perf_counter()
        await broker._discover()
        discover = time.perf_counter() - t0
        assert len(broker.runs()) == runs
        answer, frame = [], []
        for _ in range(gets):
            t = time.perf_counter()
            broker.summaries_json()
            answer.append(time.perf_counter() - t)
            t = time.perf_counter()
            broker.summaries_frame()
            frame.append(time.perf_counter() - t)
        return {
            "discover_s": discover,
            "answer_ms": statistics.median(answer) * 1e3,
            "frame_ms": statistics.median(frame) * 1e3,
        }

    return trio.run(run)


def one_start(logdir: str, runs: int, gets: int) -> dict:
    """Start serve over ``logdir`` once and take every measure."""
    t0 = time.perf_counter()
    server = start_serve(Path(logdir))
    try:
        startup = time.perf_counter() - t0
        cold, body = get_runs(server.url)
        answer = json.loads(body)
        assert len(answer["runs"]) == runs, len(answer["runs"])
        warm = [get_runs(server.url)[0] for _ in range(gets)]
        floor = []  # the server's answer time for a tiny body, now: the machine's noise floor
        for _ in range(gets):
            t0 = time.perf_counter()
            with urllib.request.urlopen(server.url + "/api/stats", timeout=60) as response:
                response.read()
            floor.append(time.perf_counter() - t0)
        ws_s, frame_bytes, frame_runs = trio.run(first_summaries, server.ws_url)
        assert frame_runs == runs
        statuses: dict[str, int] = {}
        for r in answer["runs"]:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        return {
            "startup_s": startup,
            "cold_ms": cold * 1e3,
            "warm_ms": statistics.median(warm) * 1e3,
            "warm_ms_all": [w * 1e3 for w in warm],
            "stats_ms": statistics.median(floor) * 1e3,
            "body_bytes": len(body),
            "summaries_ms": ws_s * 1e3,
            "summaries_bytes": frame_bytes,
            "statuses": statuses,
        }
    finally:
        stop_serve(server)


def startup_s(logdir: str, tree: str) -> float:
    """Seconds until ``vdl-stream serve`` of checkout ``tree`` over ``logdir`` prints its URL."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = tree
    try:
        t0 = time.perf_counter()
        server = start_serve(Path(logdir))
        seconds = time.perf_counter() - t0
        stop_serve(server)
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    return seconds


def micro() -> dict:
    """The costs on the write paths, in this process: ``RunSummary.add`` per batch (read every
    50 batches, as the broker's publisher reads it once a second), and 1-point
    ``RunWriter.append_scalars`` calls (a flush every 100), which keep the recorder's digest."""

    import numpy as np

    from vdl_stream.codec import ScalarColumns
    from vdl_stream.run_summary import RunSummary

    def add_us(tags: int, points: int, n: int) -> float:
        summary = RunSummary("r", time.time())
        cols = [
            ScalarColumns(
                f"t{i}", np.arange(points), np.full(points, 1.7e9), np.random.rand(points)
            )
            for i in range(tags)
        ]
        t0 = time.perf_counter()
        for i in range(n):
            summary.add(cols, [], 0.0)
            if i % 50 == 0:
                summary.status(0.0)
        return (time.perf_counter() - t0) / n * 1e6

    return {
        "add_10x2_us": min(add_us(10, 2, 20_000) for _ in range(3)),
        "add_1x4096_us": min(add_us(1, 4096, 2_000) for _ in range(3)),
        "append_1_point_us": append_us(str(ROOT)),
    }


# 1-point appends with a flush every 100 (the recorder of the checkout on PYTHONPATH).
APPEND = """
import os, sys, tempfile, time
import numpy as np
from recorder import RunWriter
best = []
for _ in range(3):
    with tempfile.TemporaryDirectory() as tmp:
        w = RunWriter(os.path.join(tmp, "r"), sync="never")
        s, wl, v = np.array([1]), np.array([1.7e9]), np.array([0.5])
        t0 = time.perf_counter()
        for i in range(100_000):
            w.append_scalars("a", s + i, wl, v)
            if i % 100 == 0:
                w.flush()
        best.append((time.perf_counter() - t0) / 100_000 * 1e6)
        w.close()
print(min(best))
"""


def append_us(tree: str) -> float:
    """Microseconds a 1-point ``append_scalars`` (best of 3 x 100,000) with ``tree``'s recorder."""
    out = subprocess.run(
        [sys.executable, "-c", APPEND],
        env={**os.environ, "PYTHONPATH": tree},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(out.stdout.strip())


def measure_all(args: argparse.Namespace) -> list[dict]:
    """Every ``--points`` size, the starts interleaved (one of each size per round), so that
    the machine's load changes weigh on every size alike."""
    logdirs, generated = [], []
    for points in args.points:
        t0 = time.perf_counter()
        logdirs.append(cached_runs(args.runs, args.tags, points, args.seed))
        generated.append(time.perf_counter() - t0)
    starts: list[list[dict]] = [[] for _ in args.points]
    inner: list[list[dict]] = [[] for _ in args.points]
    for _ in range(args.starts):
        for i, logdir in enumerate(logdirs):
            starts[i].append(one_start(logdir, args.runs, args.gets))
            inner[i].append(in_process(logdir, args.runs, args.gets))
    return [
        measure(args, points, logdirs[i], generated[i], starts[i], inner[i])
        for i, points in enumerate(args.points)
    ]


def measure(
    args: argparse.Namespace,
    points: int,
    logdir: str,
    generated: float,
    starts: list[dict],
    inners: list[dict],
) -> dict:
    facts = cached_facts(logdir)
    inner = {k: statistics.median(x[k] for x in inners) for k in inners[0]}

    def med(key: str) -> float:
        return statistics.median(s[key] for s in starts)

    return {
        "points_per_tag": points,
        "points_per_run": points * args.tags,
        "logdir_bytes": facts["bytes"],
        "generate_s": generated,
        "startup_s": med("startup_s"),
        "cold_ms": med("cold_ms"),
        "warm_ms": med("warm_ms"),
        "summaries_ms": med("summaries_ms"),
        "stats_ms": med("stats_ms"),
        "body_bytes": starts[0]["body_bytes"],
        "summaries_bytes": starts[0]["summaries_bytes"],
        "statuses": starts[0]["statuses"],
        "in_process": inner,
        "starts": starts,
    }


def report(result: dict) -> str:
    a = result["args"]
    lines = [
        f"{a['runs']:,} runs x {a['tags']} tags; medians of {a['starts']} fresh `serve` starts "
        f"({a['gets']} warm GETs each)",
        "",
        "| points a run | logdir | serve start-up | GET /api/runs cold | warm | GET /api/stats "
        "| first `summaries` frame | answer | frame | in the server: discovery; answer; frame |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["results"]:
        inner = r["in_process"]
        lines.append(
            f"| {r['points_per_run']:,} | {r['logdir_bytes'] / 1e6:,.0f} MB | "
            f"{r['startup_s']:.2f} s | {r['cold_ms']:.1f} ms | {r['warm_ms']:.1f} ms | "
            f"{r['stats_ms']:.1f} ms | "
            f"{r['summaries_ms']:.1f} ms | {r['body_bytes'] / 1e3:,.0f} kB | "
            f"{r['summaries_bytes'] / 1e3:,.0f} kB | {inner['discover_s']:.2f} s; "
            f"{inner['answer_ms']:.2f} ms; {inner['frame_ms']:.2f} ms |"
        )
    rows = result["results"]
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        lines += [
            "",
            f"{hi['points_per_run'] // lo['points_per_run']}x the points a run: GET /api/runs warm "
            f"x{hi['warm_ms'] / lo['warm_ms']:.2f}, cold x{hi['cold_ms'] / lo['cold_ms']:.2f}, "
            f"first summaries frame x{hi['summaries_ms'] / lo['summaries_ms']:.2f}",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help="runs (default 1000)")
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument(
        "--points", type=int, nargs="+", default=None, help="points a tag (default 1000 10000)"
    )
    parser.add_argument("--starts", type=int, default=None, help="fresh serve starts (default 5)")
    parser.add_argument("--gets", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="200 runs, 100/1k points, 2 starts")
    parser.add_argument("--out", default=str(HERE / "out" / "runs.json"))
    parser.add_argument("--baseline", help="another checkout: its serve start-up too")
    parser.add_argument("--micro", action="store_true", help="only the write-path costs")
    parser.add_argument(
        "--startup-only", action="store_true", help="only serve start-up against --baseline"
    )
    args = parser.parse_args()
    if args.quick:
        args.runs = args.runs or 200
        args.points = args.points or [100, 1000]
        args.starts = args.starts or 2
    args.runs = args.runs or 1000
    args.points = args.points or [1000, 10_000]
    args.starts = args.starts or 5
    if args.micro:
        figures = micro()
        if args.baseline:
            figures["append_1_point_us_baseline"] = append_us(args.baseline)
        print(json.dumps(figures, indent=1))
        return
    results = [] if args.startup_only else measure_all(args)
    result = {
        "args": vars(args),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": results,
    }
    if args.baseline:
        logdir = cached_runs(args.runs, args.tags, args.points[-1], args.seed)
        times: dict[str, list[float]] = {"this": [], "baseline": []}
        for _ in range(args.starts):  # interleaved, as the sizes are
            times["this"].append(startup_s(logdir, str(ROOT)))
            times["baseline"].append(startup_s(logdir, args.baseline))
        result["startup_vs_baseline"] = {k: statistics.median(v) for k, v in times.items()}
        result["startup_vs_baseline_all"] = times
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if results:
        print(report(result))
    if args.baseline:
        b = result["startup_vs_baseline"]
        print(
            f"\nserve start-up over {args.runs:,} runs of {args.points[-1] * args.tags:,} points: "
            f"{b['this']:.2f} s, baseline {args.baseline}: {b['baseline']:.2f} s "
            f"(medians of {args.starts}, interleaved)"
        )


if __name__ == "__main__":
    main()
