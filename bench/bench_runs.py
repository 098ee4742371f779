"""The runs API over a sweep: ``GET /api/runs`` and the first ``summaries`` frame (issue 12).

    python bench/bench_runs.py                    # 1,000 runs x 10 tags, 1k and 10k points a tag
    python bench/bench_runs.py --quick            # 200 runs, 100 and 1k points a tag, 2 starts
    python bench/bench_runs.py --points 1000 10000 100000 --runs 1000

For each ``--points`` the log directory of bench/runs_data.py (``--runs`` runs of ``--tags`` tags,
hparams, host, close markers; generated once under bench/out/runs/) is served by a fresh
``vdl-stream serve`` subprocess of this checkout on 127.0.0.1, ``--starts`` times. Each start
measures:

* ``startup_s``: from starting the process until it prints its URL (discovery of every run, with
  its summary read from the recorder's digest, happens before it listens);
* ``cold_ms``: the first ``GET /api/runs`` (body read);
* ``warm_ms``: the median of ``--gets`` more;
* ``summaries_ms``: from opening ``/ws/live`` until its first ``summaries`` frame (every run's
  summary) is read, and that frame's size.

And once, in this process (no HTTP, no other work): a ``Broker``'s discovery of the runs, and the
median time to build the ``GET /api/runs`` answer and the ``summaries`` frame (the server's cost).

The OS page cache is warm (the generation just wrote the files, or an earlier start read them).
Results: a Markdown table on stdout, and the record in bench/out/runs.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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
            "body_bytes": len(body),
            "summaries_ms": ws_s * 1e3,
            "summaries_bytes": frame_bytes,
            "statuses": statuses,
        }
    finally:
        stop_serve(server)


def measure(args: argparse.Namespace, points: int) -> dict:
    t0 = time.perf_counter()
    logdir = cached_runs(args.runs, args.tags, points, args.seed)
    generated = time.perf_counter() - t0
    facts = cached_facts(logdir)
    starts = [one_start(logdir, args.runs, args.gets) for _ in range(args.starts)]
    inner = in_process(logdir, args.runs, args.gets)

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
        "| points a run | logdir | serve start-up | GET /api/runs cold | warm | first `summaries` "
        "frame | answer | frame | in the server: discovery; answer; frame |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["results"]:
        inner = r["in_process"]
        lines.append(
            f"| {r['points_per_run']:,} | {r['logdir_bytes'] / 1e6:,.0f} MB | "
            f"{r['startup_s']:.2f} s | {r['cold_ms']:.1f} ms | {r['warm_ms']:.1f} ms | "
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
    args = parser.parse_args()
    if args.quick:
        args.runs = args.runs or 200
        args.points = args.points or [100, 1000]
        args.starts = args.starts or 2
    args.runs = args.runs or 1000
    args.points = args.points or [1000, 10_000]
    args.starts = args.starts or 5
    results = [measure(args, p) for p in args.points]
    result = {
        "args": vars(args),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(report(result))


if __name__ == "__main__":
    main()
