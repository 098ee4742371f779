"""Runs on object storage (issue 13): a fresh broker's first chart from a bucket, and the object
store requests a live run costs.

Against a real S3 API: moto's server mode on 127.0.0.1 (a subprocess; ``moto[server]``, in the
``test`` extra). Everything is loopback; every loop is bounded by a count or a deadline.

1. **Cold start.** ``--runs`` runs of ``--points`` steps of two scalar tags (plus a text and a
   histogram) are recorded through ``attach(logdir="s3://...")`` (flushed every 10 steps, so the
   broker compacts them as a live run). Then, ``--repeat`` times, a fresh ``vdl-stream serve
   --logdir s3://...`` with an empty ``--cache-dir`` is started, and a WebSocket client (the
   page's own subscribe) times the snapshots: from the process spawn, and from the line that says
   it serves (its first listing of the bucket done), to the first run's snapshot (the first chart)
   and to every run's. The requests the cold start sent come from its ``/api/stats``.
2. **Live.** A ``serve --logdir s3://...`` (the writers' broker) takes ``--live-runs`` writers
   (``attach(url=...)``, ``--tags`` tags at ``--rate`` steps/s each) for ``--seconds``; a second
   serve over the same bucket (a reader on another machine) follows them. Both brokers' request
   counts (``/api/stats``), per run per minute.

Usage::

    python bench/bench_store.py            # full: 8 runs x 50,000 steps, 5 cold starts, 120 s live
    python bench/bench_store.py --quick    # 3 runs x 20,000 steps, 3 cold starts, 30 s live
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import trio
from trio_websocket import open_websocket_url

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import vdl_stream  # noqa: E402
from bench.broker_clients import ServeProcess, kill_started  # noqa: E402
from tests.s3_server import MotoServer, set_env  # noqa: E402
from vdl_stream import storage  # noqa: E402

URL = "s3://bench/runs"


def record(runs: int, points: int) -> None:
    """Record ``runs`` runs through in-process brokers publishing to the bucket."""
    for r in range(runs):
        with vdl_stream.attach(logdir=URL, run=f"exp/run{r:02d}", telemetry=False) as writer:
            for i in range(points):
                writer.add_scalar("train/loss", 1.0 / (i + 1), i)
                writer.add_scalar("train/acc", i / points, i)
                if i % 10 == 0:
                    writer.flush()
            writer.add_text("notes", "bench", 1)
            writer.add_histogram("weights", np.arange(1000.0), points)


async def _first_snapshots(ws_url: str, t_spawn: float) -> dict:
    async with open_websocket_url(ws_url + "/ws/live", max_message_size=64 << 20) as ws:
        await ws.send_message(
            msgpack.packb({"type": "subscribe", "runs": None, "max_points": 2000})
        )
        runs: set[str] | None = None
        got: set[str] = set()
        first = None
        while runs is None or not runs <= got:
            msg = msgpack.unpackb(await ws.get_message(), raw=False)
            if msg["type"] == "runs":
                runs = set(msg["runs"])
            elif msg["type"] == "snapshot":
                got.add(msg["run"])
                if first is None:
                    first = time.perf_counter() - t_spawn
        return {"first": first, "all": time.perf_counter() - t_spawn, "runs": len(got)}


def cold_start(tmp: Path, expected_runs: int, logdir: str = URL) -> dict:
    """One fresh serve over ``logdir`` (the bucket, with an empty cache; or a local directory,
    the baseline): timings and requests."""
    cache = tmp / "cold-cache"
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    server = ServeProcess(logdir, tmp / "serve-cold.err", "--cache-dir", str(cache))  # type: ignore[arg-type]
    try:
        ready = time.perf_counter() - t0

        async def main() -> dict:
            with trio.fail_after(60):
                return await _first_snapshots(server.ws, t0)

        snap = trio.run(main)
        if snap["runs"] != expected_runs:
            raise RuntimeError(f"the cold serve showed {snap['runs']} of {expected_runs} runs")
        store = server.stats()["store"] or {"requests": {}, "cache": {"fetched_bytes": 0}}
    finally:
        server.stop()
    return {
        "ready_s": ready,
        "first_chart_s": snap["first"],
        "all_runs_s": snap["all"],
        "first_chart_after_ready_s": snap["first"] - ready,
        "requests": store["requests"],
        "fetched_bytes": store["cache"]["fetched_bytes"],
    }


def cold_start_in_process(tmp: Path, expected_runs: int, logdir: str = URL) -> dict:
    """A fresh broker (``run_server``) over ``logdir`` in this process, its imports done: the
    broker's own start (the first listing of the bucket included) to the first chart."""
    from vdl_stream.server import run_server

    cache = tmp / "cold-cache"
    shutil.rmtree(cache, ignore_errors=True)

    async def main() -> dict:
        stop = trio.Event()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                t0 = time.perf_counter()
                url = await nursery.start(
                    lambda task_status: run_server(
                        logdir,
                        port=0,
                        cache_dir=cache,
                        shutdown_trigger=stop.wait,
                        task_status=task_status,
                    )
                )
                ready = time.perf_counter() - t0
                snap = await _first_snapshots("ws" + url.removeprefix("http").rstrip("/"), t0)
                stop.set()
        if snap["runs"] != expected_runs:
            raise RuntimeError(f"the broker showed {snap['runs']} of {expected_runs} runs")
        return {"ready_s": ready, "first_chart_s": snap["first"], "all_runs_s": snap["all"]}

    return trio.run(main)


def live(tmp: Path, runs: int, tags: int, rate: float, seconds: float) -> dict:
    """Writers at a live cadence through one broker; a second broker follows via the bucket."""
    writer_broker = ServeProcess(URL, tmp / "serve-w.err", "--cache-dir", str(tmp / "cache-w"))  # type: ignore[arg-type]
    reader_broker = ServeProcess(URL, tmp / "serve-r.err", "--cache-dir", str(tmp / "cache-r"))  # type: ignore[arg-type]
    try:
        w0 = writer_broker.stats()["store"]["requests"]
        r0 = reader_broker.stats()["store"]["requests"]
        stop = threading.Event()
        errors: list[BaseException] = []

        def write(r: int) -> None:
            try:
                with vdl_stream.attach(
                    url=writer_broker.ws, run=f"live/run{r:02d}", telemetry=False
                ) as writer:
                    step, start = 0, time.perf_counter()
                    while not stop.is_set():
                        for t in range(tags):
                            writer.add_scalar(f"m/{t:02d}", float(step % 97), step)
                        step += 1
                        delay = start + step / rate - time.perf_counter()
                        if delay > 0:
                            stop.wait(delay)  # pacing: the writer's cadence
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(r,)) for r in range(runs)]
        t_start = time.perf_counter()
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(60)
        elapsed = time.perf_counter() - t_start
        if errors:
            raise errors[0]
        w1 = writer_broker.stats()["store"]
        r1 = reader_broker.stats()["store"]
    finally:
        writer_broker.stop()
        reader_broker.stop()
    minutes = elapsed / 60

    def per_run_minute(after: dict, before: dict) -> dict:
        return {
            k: round((after[k] - before[k]) / runs / minutes, 2)
            for k in ("put", "get", "get_range", "list", "delete")
        }

    return {
        "seconds": elapsed,
        "runs": runs,
        "points_per_s": runs * tags * rate,
        "writer_broker_per_run_minute": per_run_minute(w1["requests"], w0),
        "reader_broker_per_run_minute": per_run_minute(r1["requests"], r0),
        "writer_broker_bytes_per_run_minute": round(w1["bytes_uploaded"] / runs / minutes),
        "writer_failures": w1["failures"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--points", type=int)
    parser.add_argument("--repeat", type=int)
    parser.add_argument("--live-runs", type=int, default=4)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--rate", type=float, default=50.0, help="steps/s per writer")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 8)
    points = args.points or (20_000 if args.quick else 50_000)
    repeat = args.repeat or (3 if args.quick else 5)
    seconds = args.seconds or (30.0 if args.quick else 120.0)

    server = MotoServer()
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    set_env({**server.env(), "VDL_STREAM_CACHE": str(tmp / "writer-cache")})
    try:
        server.create_bucket("bench")
        t = time.perf_counter()
        record(runs, points)
        print(f"recorded {runs} runs x {points:,} steps in {time.perf_counter() - t:.1f} s")
        objects = storage.ObstoreClient(URL).list("")
        blocks = sum(".vdlb." in o.key for o in objects)
        print(
            f"  the bucket holds {len(objects)} objects, {sum(o.size for o in objects):,} bytes; "
            f"{blocks / runs:.1f} blocks a run"
        )
        # The same runs on local disk: the writers' cache holds them whole (the baseline).
        local = str(storage.cache_dir(URL))
        colds, bases, inproc, inproc_local = [], [], [], []
        for _ in range(repeat):  # interleaved, so all see the same load
            colds.append(cold_start(tmp, runs))
            bases.append(cold_start(tmp, runs, local))
            inproc.append(cold_start_in_process(tmp, runs))
            inproc_local.append(cold_start_in_process(tmp, runs, local))
        for label, results in (("the bucket", inproc), ("a local directory", inproc_local)):
            med = {k: statistics.median(c[k] for c in results) for k in results[0]}
            print(
                "broker started in this process over {} (median of {}): ready {:.3f} s, first "
                "chart {:.3f} s, all {} runs {:.3f} s".format(
                    label, repeat, med["ready_s"], med["first_chart_s"], runs, med["all_runs_s"]
                )
            )
        for label, results in (("the bucket", colds), ("a local directory", bases)):
            med = {
                k: statistics.median(c[k] for c in results)
                for k in results[0]
                if k not in ("requests", "fetched_bytes")
            }
            print(
                "cold serve over {} (median of {}): ready {:.2f} s, first chart {:.2f} s "
                "from spawn ({:.2f} s after ready), all {} runs {:.2f} s".format(
                    label,
                    repeat,
                    med["ready_s"],
                    med["first_chart_s"],
                    med["first_chart_after_ready_s"],
                    runs,
                    med["all_runs_s"],
                )
            )
        print(f"  requests of one cold start: {colds[-1]['requests']}")
        print(f"  block bytes fetched: {colds[-1]['fetched_bytes']:,}")
        lv = live(tmp, args.live_runs, args.tags, args.rate, seconds)
        print(f"live: {lv['runs']} runs, {lv['points_per_s']:,.0f} points/s, {lv['seconds']:.0f} s")
        print(f"  writers' broker, per run per minute: {lv['writer_broker_per_run_minute']}")
        print(
            f"  its upload, bytes per run per minute: {lv['writer_broker_bytes_per_run_minute']:,}"
        )
        print(f"  reader broker, per run per minute: {lv['reader_broker_per_run_minute']}")
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "cold": colds,
                        "local": bases,
                        "in_process": inproc,
                        "in_process_local": inproc_local,
                        "live": lv,
                    },
                    indent=1,
                )
            )
    finally:
        kill_started()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
