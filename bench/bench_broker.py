"""Broker and ``vdl-stream serve`` benchmark: ingest, many writers, live latency, TensorBoard freshness.

One run measures, each phase against a fresh ``vdl-stream serve`` subprocess over a fresh log
directory (so the load generators in this process never share the server's GIL):

1. ingest, persisted: 4 raw ``/ws/ingest`` writers sending 4,096-event ``batch`` frames with at
   most ``--window`` unacknowledged batches each; events/s acknowledged (the broker acknowledges
   only what it has written), checked against ``/api/stats`` and read back from disk; median of
   ``--repeat`` runs. Then the same with 4 ``attach(url=...)`` writer processes calling
   ``add_scalar`` as fast as they can.
2. 256 writer connections at once, each paced at a modest rate, each in its own run: every batch
   acknowledged, and every event on disk afterwards (``recorder.RunReader``); loss must be 0.
3. latency from ``add_scalar`` (an ``attach(url=...)`` writer process at 10,000 events/s) to the
   event's arrival in 10 ``/ws/live`` subscribers; the same from raw batches stamped when built
   (the server's share alone); then with one of the 10 subscribers stalled (subscribes, never
   reads): the other nine's latency, and the server's RSS over time.
4. TensorBoard freshness: tensorboardX scalars written and flushed one at a time until visible in
   TensorBoard's HTTP API, at its defaults and with ``--reload_interval 1``; ratios against 3.

Only 127.0.0.1 is used; every loop is bounded; every process started is stopped in ``finally``.

Usage: python bench/bench_broker.py [--quick] [--repeat N] [--json PATH] [--profile DIR]
                                    [--tensorboard PATH] [--skip PHASE ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import psutil
import trio
from broker_clients import (
    STARTED,
    ServeProcess,
    SubscriberResult,
    WriterResult,
    kill_started,
    live_subscriber,
    log_paced,
    stalled_subscriber,
    stream_together,
)

import recorder

PHASES = ("ingest", "attach", "many", "latency", "stalled", "tensorboard")


@dataclass
class Settings:
    """Sizes and durations of one benchmark run (``--quick`` shrinks the durations)."""

    ingest_seconds: float = 5.0
    ingest_writers: int = 4
    ingest_points: int = 1024  # per tag; 4 tags -> 4,096 events per batch
    ingest_tags: int = 4
    window: int = 8
    attach_seconds: float = 5.0
    many_writers: int = 256
    many_seconds: float = 5.0
    many_rate: float = 5.0  # batches/s per writer
    many_points: int = 100  # events per batch
    latency_seconds: float = 10.0
    latency_rate: int = 10_000  # events/s
    latency_tags: int = 10
    subscribers: int = 10
    stalled_seconds: float = 45.0
    tb_samples: int = 20


QUICK = Settings(
    ingest_seconds=3.0,
    attach_seconds=3.0,
    many_seconds=3.0,
    latency_seconds=5.0,
    stalled_seconds=25.0,
    tb_samples=8,
)


def percentile(values, q: float) -> float:
    """The ``q``-th percentile of ``values`` (NaN when empty)."""
    a = np.asarray(values, dtype=float)
    return float(np.percentile(a, q)) if a.size else float("nan")


def disk_counts(logdir: Path) -> dict[str, int]:
    """Scalar points on disk per run, read back with ``recorder.RunReader``."""
    counts = {}
    for run in recorder.list_runs(logdir):
        with recorder.RunReader(logdir / run) as reader:
            counts[run] = sum(
                info.count for info in reader.tags().values() if info.kind == "scalars"
            )
    return counts


class Profiler:
    """``py-spy record`` on the server for one phase, when ``--profile DIR`` is given."""

    def __init__(self, directory: Path | None, name: str, pid: int, seconds: float) -> None:
        self.proc = None
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                _py_spy(),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, int(seconds))),
                "--rate",
                "200",
                "--threads",
                "--format",
                "raw",
                "-o",
                str(directory / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(directory / f"{name}.log", "wb"),  # noqa: SIM115 (short-lived)
        )
        STARTED.add(self.proc)
        time.sleep(0.5)

    def stop(self) -> None:
        """Wait for the recording to end (bounded), killing it if it overruns."""
        if self.proc is None:
            return
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _py_spy() -> str:
    for candidate in (Path(sys.executable).parent / "py-spy", Path("/tmp/tbvenv/bin/py-spy")):
        if candidate.exists():
            return str(candidate)
    return "py-spy"


class Bench:
    """One benchmark run: phases, each against its own server, filling ``self.results``."""

    def __init__(self, args: argparse.Namespace, settings: Settings, workdir: Path) -> None:
        self.args = args
        self.s = settings
        self.workdir = workdir
        self.results: dict[str, dict] = {}
        self._servers = 0

    def server(self) -> ServeProcess:
        """Start a fresh ``vdl-stream serve`` over a fresh log directory."""
        self._servers += 1
        logdir = self.workdir / f"logs{self._servers}"
        return ServeProcess(logdir, self.workdir / f"serve{self._servers}.stderr")

    def profiler(self, name: str, server: ServeProcess, seconds: float) -> Profiler:
        """Start py-spy on ``server`` when profiling was asked for."""
        directory = Path(self.args.profile) if self.args.profile else None
        return Profiler(directory, name, server.pid, seconds)

    # -- 1. ingest --------------------------------------------------------------------------------

    def ingest_once(self, profile: bool) -> dict:
        """4 raw writers, unpaced within a window; persisted events/s."""
        s = self.s
        tags = [f"train/metric{i}" for i in range(s.ingest_tags)]
        server = self.server()
        try:
            prof = self.profiler("ingest", server, s.ingest_seconds + 2) if profile else None
            writers = [WriterResult(f"w{i}", f"ingest/rank{i}") for i in range(s.ingest_writers)]
            cpu0, own0 = _cpu(server.pid), time.process_time()

            wall0 = time.perf_counter()
            trio.run(
                partial(
                    stream_together, server.ws, writers, tags=tags, points=s.ingest_points,
                    seconds=s.ingest_seconds, window=s.window,
                )
            )  # fmt: skip
            cpu, own = _cpu(server.pid) - cpu0, time.process_time() - own0
            wall = time.perf_counter() - wall0
            if prof:
                prof.stop()
            every = server.stats()
            stats = every["broker"]
        finally:
            rc = server.stop()
        errors = [w.error for w in writers if w.error]
        acked = sum(min(w.acked_seq, w.sent_batches) for w in writers) * len(tags) * s.ingest_points
        sent = sum(w.sent_events for w in writers)
        span = max(w.last_ack for w in writers) - min(w.first_send for w in writers)
        on_disk = sum(disk_counts(server.logdir).values())
        lat = [x for w in writers for x in w.ack_latencies]
        return {
            "events_per_s": acked / span if span > 0 else 0.0,
            "sent": sent,
            "acked": acked,
            "on_disk": on_disk,
            "stats_events": stats["events"],
            # The broker counts the alert events it ingests too (the detectors watch the
            # synthetic series): raised by the time of /api/stats, so at least those ingested.
            "alerts_raised": (every.get("alerts") or {}).get("raised", 0),
            "written_seq": stats["written_seq"],
            "seq": stats["seq"],
            "ack_p50_ms": percentile(lat, 50) * 1e3,
            "ack_p99_ms": percentile(lat, 99) * 1e3,
            "server_cpu_per_s": cpu / wall,
            "server_cpu_s_per_million": cpu / acked * 1e6 if acked else float("nan"),
            "client_cpu_per_s": own / wall,
            "load_average": os.getloadavg()[0],
            "errors": errors,
            "exit_code": rc,
        }

    def phase_ingest(self) -> None:
        runs = [self.ingest_once(profile=(i == 0)) for i in range(self.args.repeat)]
        rates = [r["events_per_s"] for r in runs]
        self.results["ingest"] = {
            "events_per_s_median": statistics.median(rates),
            "events_per_s_all": rates,
            "lossless": all(
                r["acked"] == r["sent"] == r["on_disk"]
                and 0 <= r["stats_events"] - r["sent"] <= r["alerts_raised"]
                for r in runs
            ),
            "runs": runs,
        }

    # -- 1b. attach(url=...) writers --------------------------------------------------------------

    def phase_attach(self) -> None:
        """4 processes, each ``attach(url=...)`` calling ``add_scalar`` flat out, then ``flush()``."""
        s = self.s
        server = self.server()
        children = []
        try:
            start_at = time.time() + 3.0  # all children start their loops together
            for i in range(s.ingest_writers):
                children.append(
                    _child(
                        [
                            "attach-ingest",
                            server.ws,
                            f"attach/rank{i}",
                            str(s.attach_seconds),
                            str(start_at),
                        ]
                    )
                )
            outs = [_child_result(c, timeout=s.attach_seconds + 120) for c in children]
            stats = server.stats()["broker"]
        finally:
            for c in children:
                _kill(c)
            rc = server.stop()
        count = sum(o["count"] for o in outs)
        span = max(o["flushed"] for o in outs) - min(o["t0"] for o in outs)
        loop_rate = sum(o["count"] / (o["t1"] - o["t0"]) for o in outs)
        on_disk = sum(disk_counts(server.logdir).values())
        self.results["attach"] = {
            "per_writer": outs,
            "server_stderr": _tail(server),
            "events_per_s": count / span,
            "add_scalar_calls_per_s": loop_rate,
            "count": count,
            "on_disk": on_disk,
            "stats_events": stats["events"],
            "flush_ok": all(o["flush_ok"] for o in outs),
            "exit_code": rc,
        }

    # -- 2. many writers --------------------------------------------------------------------------

    def phase_many(self) -> None:
        """256 connections at once, each paced, each its own run; loss must be 0."""
        s = self.s
        server = self.server()
        writers = [WriterResult(f"rank{i:03d}", f"job/rank{i:03d}") for i in range(s.many_writers)]
        try:
            prof = self.profiler("many", server, s.many_seconds + 20)
            rss: list[int] = []

            trio.run(
                partial(
                    stream_together, server.ws, writers, tags=["loss"], points=s.many_points,
                    seconds=s.many_seconds, window=64, batches_per_s=s.many_rate,
                    connect_timeout=60,
                    on_start=lambda: rss.append(psutil.Process(server.pid).memory_info().rss),
                )
            )  # fmt: skip
            prof.stop()
            stats = server.stats()["broker"]
        finally:
            rc = server.stop()
        on_disk = disk_counts(server.logdir)
        sent = sum(w.sent_events for w in writers)
        acked = sum(min(w.acked_seq, w.sent_batches) for w in writers) * s.many_points
        disk = sum(on_disk.get(w.run, 0) for w in writers)
        lat = [x for w in writers for x in w.ack_latencies]
        self.results["many"] = {
            "writers": len(writers),
            "connected": sum(w.connected for w in writers),
            "errors": sorted({w.error for w in writers if w.error})[:5],
            "sent": sent,
            "acked": acked,
            "on_disk": disk,
            "stats_events": stats["events"],
            "lost": sent - disk,
            "server_stderr": _tail(server),
            "unacked": sent - acked,
            "offered_events_per_s": sent / s.many_seconds,
            "persisted_events_per_s": acked
            / (max(w.last_ack for w in writers) - min(w.first_send for w in writers)),
            "drain_s": max(w.last_ack for w in writers)
            - min(w.first_send for w in writers)
            - s.many_seconds,
            "ack_p50_ms": percentile(lat, 50) * 1e3,
            "ack_p99_ms": percentile(lat, 99) * 1e3,
            "exit_code": rc,
        }

    # -- 3. latency ---------------------------------------------------------------------------------

    def latency(
        self,
        name: str,
        *,
        source: str,
        seconds: float,
        stalled: int = 0,
        flush_interval: float | None = None,
        window: int | None = None,
        writers: int = 1,
        rate: int | None = None,
        subscribers: int | None = None,
        page: bool = False,
    ) -> dict:
        """Run one latency configuration and return p50/p99 (ms), RSS samples and subscriber stats.

        ``source`` is ``attach`` (an ``attach(url=...)`` process calling ``add_scalar``) or ``raw``
        (batches of 50 points every 5 ms built here, walls stamped when built). ``writers``
        attach processes share ``rate`` (events/s in all; default ``latency_rate``) on one run;
        ``subscribers`` overrides the number of subscribers; ``page``: they subscribe as the page
        does (``split`` and ``batch``: live frames batched while the link is busy); ``window``:
        the writers' in-flight window (default: attach's).
        """
        s = self.s
        run = "live"
        server = self.server()
        n_subs = s.subscribers if subscribers is None else subscribers
        total_rate = s.latency_rate if rate is None else rate
        n_live = n_subs - stalled
        subs = [SubscriberResult() for _ in range(n_live)]
        rss: list[tuple[float, int]] = []
        stalled_stats: list[dict] = []
        children: list = []
        out: dict = {}
        try:
            prof = self.profiler(name, server, seconds + 2) if name else None
            proc = psutil.Process(server.pid)

            async def main() -> None:
                stop = trio.Event()
                ready = trio.Semaphore(0)
                async with trio.open_nursery() as nursery:
                    for sub in subs:
                        nursery.start_soon(live_subscriber, server.ws, run, sub, ready, stop, page)
                    for _ in range(stalled):
                        nursery.start_soon(
                            stalled_subscriber, server.host, server.port, run, ready, stop
                        )
                    with trio.fail_after(30):
                        for _ in range(n_subs):
                            await ready.acquire()
                    t0 = time.monotonic()

                    async def sample() -> None:
                        while not stop.is_set():
                            rss.append((time.monotonic() - t0, proc.memory_info().rss))
                            with trio.move_on_after(0.5):
                                await stop.wait()

                    nursery.start_soon(sample)
                    if source == "attach":
                        children.extend(
                            _child(
                                [
                                    "attach-latency",
                                    server.ws,
                                    run,
                                    str(total_rate // writers),
                                    str(seconds),
                                    str(s.latency_tags),
                                    "default" if flush_interval is None else str(flush_interval),
                                    "default" if window is None else str(window),
                                ]
                            )
                            for _ in range(writers)
                        )
                        for child in children:
                            result = await trio.to_thread.run_sync(
                                _child_result, child, seconds + 60
                            )
                            for key, value in result.items():  # counts and rates add up
                                summed = type(value) in (int, float) and key in out
                                out[key] = out[key] + value if summed else value
                    else:
                        await _raw_source(server.ws, run, s.latency_rate, seconds)
                    await trio.sleep(1.0)  # the last frames in flight
                    if stalled:
                        stats = await trio.to_thread.run_sync(server.stats)
                        stalled_stats.extend(stats["subscribers"])
                    stop.set()

            trio.run(main)
            if prof:
                prof.stop()
        finally:
            for child in children:
                _kill(child)
            rc = server.stop()
        starts = [np.concatenate(sub.walls).min() for sub in subs if sub.walls]
        wall0 = (min(starts) if starts else 0.0) + 1.0  # leave out the first second (warm-up)
        lat = np.concatenate([sub.latency_since(wall0) for sub in subs] or [np.zeros(0)])
        walls = np.concatenate([w for sub in subs for w in sub.walls] or [np.zeros(0)])
        all_lat = np.concatenate([x for sub in subs for x in sub.latencies] or [np.zeros(0)])
        keep = walls >= wall0
        walls, all_lat = walls[keep], all_lat[keep]
        second = np.floor(walls - wall0).astype(int)
        per_second = (
            [percentile(all_lat[second == i], 99) * 1e3 for i in range(second.max() + 1)]
            if walls.size
            else []
        )
        rss_mb = [r / 2**20 for _, r in rss]
        half = len(rss_mb) // 2
        return {
            "p50_ms": percentile(lat, 50) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3,
            "max_ms": float(lat.max() * 1e3) if lat.size else float("nan"),
            "per_second_p99_ms": [round(x, 1) for x in per_second],
            "seconds_p99_over_50ms": sum(1 for x in per_second if x > 50),
            "points": int(lat.size),
            "per_subscriber_points": [sub.points for sub in subs],
            "gaps_seen_by_live": sum(sub.gaps for sub in subs),
            "errors": [sub.error for sub in subs if sub.error],
            "rss_mb_start": rss_mb[0] if rss_mb else None,
            "rss_mb_max": max(rss_mb) if rss_mb else None,
            "rss_mb_end": rss_mb[-1] if rss_mb else None,
            "rss_mb_max_first_half": max(rss_mb[:half]) if half else None,
            "rss_mb_max_second_half": max(rss_mb[half:]) if half else None,
            "rss_series": [(round(t, 1), round(r / 2**20, 1)) for t, r in rss],
            "subscriber_stats": stalled_stats,
            "writer": out,
            "exit_code": rc,
        }

    def phase_latency(self) -> None:
        """The three unstalled configurations, ``--repeat`` times each, interleaved; medians."""
        s = self.s
        configs = {
            "latency_attach": {"source": "attach"},
            "latency_attach_fi10ms": {"source": "attach", "flush_interval": 0.01},
            # issue 16: a window of one batch in flight (the writer waits for each batch's
            # write before it sends the next): what the default window of 2 gains
            "latency_attach_w1": {"source": "attach", "window": 1},
            "latency_raw": {"source": "raw"},
            # issue 16: the same as the page subscribes (batched live frames), as a browser gets it
            "latency_attach_page": {"source": "attach", "page": True},
            # issue 16: 1M events/s from 4 writers, 2 subscribers (a Python subscriber decodes
            # about 1M points/s on this machine, so 10 would measure the subscribers)
            "latency_attach_4w_1m": {
                "source": "attach",
                "writers": 4,
                "rate": 1_000_000,
                "subscribers": 2,
            },
        }
        runs: dict[str, list[dict]] = {key: [] for key in configs}
        for i in range(self.args.repeat):
            for key, options in configs.items():
                name = key if i == 0 else ""  # profile the first round only
                runs[key].append(self.latency(name, seconds=s.latency_seconds, **options))
        for key, results in runs.items():
            self.results[key] = {
                **results[0],
                "p50_ms": statistics.median(r["p50_ms"] for r in results),
                "p99_ms": statistics.median(r["p99_ms"] for r in results),
                "p50_ms_all": [r["p50_ms"] for r in results],
                "p99_ms_all": [r["p99_ms"] for r in results],
                "repeats": len(results),
            }

    def phase_stalled(self) -> None:
        s = self.s
        self.results["stalled_attach"] = self.latency(
            "stalled", source="attach", seconds=s.stalled_seconds, stalled=1
        )

    # -- 4. TensorBoard -----------------------------------------------------------------------------

    def phase_tensorboard(self) -> None:
        from broker_tensorboard import find_tensorboard, measure

        tb = find_tensorboard(self.args.tensorboard)
        if tb is None:
            self.results["tensorboard"] = {
                "error": "tensorboard not found (pass --tensorboard PATH)"
            }
            return
        out = {}
        for label, interval, spacing in (("default", None, 0.61), ("reload_1s", 1.0, 0.13)):
            r = measure(
                tb,
                self.workdir,
                reload_interval=interval,
                samples=self.s.tb_samples,
                spacing=spacing,
            )
            r["p50_ms"] = percentile(r["delays"], 50) * 1e3
            r["p99_ms"] = percentile(r["delays"], 99) * 1e3
            out[label] = r
        self.results["tensorboard"] = out


async def _raw_source(ws_url: str, run: str, rate: int, seconds: float) -> None:
    """Send 50-point batches every 50/rate s for ``seconds``, walls stamped when each is built."""
    from broker_clients import make_batch
    from trio_websocket import open_websocket_url

    points = 50
    period = points / rate
    async with open_websocket_url(ws_url + "/ws/ingest") as ws:

        async def drain_acks() -> None:
            while True:
                await ws.get_message()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_acks)
            t0 = time.perf_counter()
            seq = 0
            while time.perf_counter() - t0 < seconds:
                delay = t0 + seq * period - time.perf_counter()
                if delay > 0:
                    await trio.sleep(delay)
                seq += 1
                await ws.send_message(make_batch("raw", seq, run, ["train/loss"], points))
            nursery.cancel_scope.cancel()


def _tail(server: ServeProcess, limit: int = 2000) -> str:
    """The end of the server's stderr (empty for a quiet server)."""
    return server.stderr_path.read_text(errors="replace")[-limit:]


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


# -- child processes (attach(url=...) writers) ------------------------------------------------------


def _child(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.add(proc)
    return proc


def _child_result(proc: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"child timed out; stderr: {err[-500:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}): {err[-1000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    if err.strip():
        result["stderr"] = err[-1500:]  # warnings from the writer (broker unreachable, flush late)
    return result


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _diagnose(writer) -> dict:
    """State of a writer whose flush was not confirmed (private fields: for the report only)."""
    import gc

    from vdl_stream.transport import WebSocketTransport

    transports = [o for o in gc.get_objects() if isinstance(o, WebSocketTransport)]
    t = transports[0] if transports else None
    return {
        "writer_seq": writer._seq,
        "pending_flushes": len(writer._flushes),
        "pending_points": len(writer._points),
        "transport_acked": t._acked if t else None,
        "spool": t._spool.after(0)[:20] if t else None,
    }


def child_main(argv: list[str]) -> None:
    """Entry point of the writer child processes."""
    from vdl_stream import attach

    mode = argv[0]
    if mode == "attach-ingest":
        url, run, seconds, start_at = argv[1], argv[2], float(argv[3]), float(argv[4])
        tags = [f"train/metric{i}" for i in range(4)]
        writer = attach(url=url, run=run, telemetry=False)
        add = writer.add_scalar
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.time()
        n = 0
        while time.time() - t0 < seconds:
            for i in range(n, n + 1000):
                add(tags[i & 3], 0.5, i >> 2)
            n += 1000
        t1 = time.time()
        ok = writer.flush(timeout=120)
        flushed = time.time()
        diagnosis = None if ok else _diagnose(writer)
        writer.close(timeout=30)
        print(
            json.dumps(
                {
                    "count": n,
                    "t0": t0,
                    "t1": t1,
                    "flushed": flushed,
                    "flush_ok": ok,
                    "flush_s": flushed - t1,
                    "diagnosis": diagnosis,
                }
            )
        )
    elif mode == "attach-latency":
        url, run, rate, seconds = argv[1], argv[2], int(argv[3]), float(argv[4])
        ntags = int(argv[5])
        # "default": whatever attach() defaults to, so the figure follows the library
        options: dict = {} if argv[6] == "default" else {"flush_interval": float(argv[6])}
        if argv[7] != "default":
            options["window"] = int(argv[7])
        tags = [f"train/metric{i}" for i in range(ntags)]
        writer = attach(url=url, run=run, telemetry=False, **options)
        n = log_paced(writer.add_scalar, tags, rate, seconds)
        ok = writer.flush(timeout=60)
        writer.close(timeout=30)
        print(json.dumps({"count": n, "rate": n / seconds, "flush_ok": ok}))
    else:
        raise SystemExit(f"unknown child mode {mode!r}")


# -- report -----------------------------------------------------------------------------------------


def report(results: dict, settings: Settings, args: argparse.Namespace) -> None:
    """Print the table of figures against the targets of issue 5."""
    rows: list[tuple[str, str, str, str]] = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    if "ingest" in results:
        r = results["ingest"]
        rate = r["events_per_s_median"]
        one = r["runs"][0]
        rows.append(
            (
                f"ingest, {settings.ingest_writers} raw writers, 4,096-event batches (median of {len(r['runs'])})",
                f"{rate:,.0f} ev/s persisted  (runs: {', '.join(f'{x:,.0f}' for x in r['events_per_s_all'])})",
                ">= 1,000,000",
                verdict(rate >= 1e6),
            )
        )
        rows.append(
            (
                "  acked == sent == on disk == /api/stats (less the alerts it raised)",
                str(r["lossless"]),
                "True",
                verdict(r["lossless"]),
            )
        )
        rows.append(
            (
                "  ack latency p50 / p99; server CPU",
                f"{one['ack_p50_ms']:.0f} / {one['ack_p99_ms']:.0f} ms; server {one['server_cpu_per_s']:.2f} cores "
                f"({one['server_cpu_s_per_million']:.2f} CPU-s per 1M events), load generator "
                f"{one['client_cpu_per_s']:.2f} cores",
                "",
                "",
            )
        )
    if "attach" in results:
        r = results["attach"]
        rows.append(
            (
                f"ingest, {settings.ingest_writers} attach(url=) writer processes",
                f"{r['events_per_s']:,.0f} ev/s persisted (add_scalar loops {r['add_scalar_calls_per_s']:,.0f}/s)",
                "(report)",
                f"on disk {r['on_disk']:,} of {r['count']:,}",
            )
        )
    if "many" in results:
        r = results["many"]
        ok = r["lost"] == 0 and r["unacked"] == 0 and r["connected"] == r["writers"]
        rows.append(
            (
                f"{r['writers']} writer connections, {settings.many_rate:g} x {settings.many_points} ev/s each",
                f"{r['connected']} connected; sent {r['sent']:,}, acked {r['acked']:,}, on disk {r['on_disk']:,}",
                "loss 0",
                verdict(ok) + f" (lost {r['lost']})",
            )
        )
        rows.append(
            (
                "  ack latency p50 / p99; acks done after the last send",
                f"{r['ack_p50_ms']:.0f} / {r['ack_p99_ms']:.0f} ms; {r['drain_s']:.1f} s "
                f"({r['persisted_events_per_s']:,.0f} ev/s persisted)",
                "",
                "",
            )
        )
    for key, label in (
        ("latency_attach", "add_scalar -> /ws/live, 10k ev/s, 10 subs (attach defaults)"),
        ("latency_attach_fi10ms", "  same, attach(flush_interval=0.01)"),
        ("latency_attach_w1", "  same, attach(window=1): each batch waits for the last's write"),
        ("latency_raw", "  batch built -> /ws/live (server share only)"),
        ("latency_attach_page", "  same, 10 subs subscribed as the page is (batch, split)"),
        ("latency_attach_4w_1m", "add_scalar -> /ws/live, 1M ev/s from 4 writers, 2 subs"),
        ("stalled_attach", "  attach defaults, 1 of 10 subs stalled: other 9"),
    ):
        if key in results:
            r = results[key]
            # issue 16's targets: p50 <= 3 / p99 <= 10 ms at 10k ev/s; p99 <= 50 ms at 1M ev/s
            p50_target, p99_target = {
                "latency_attach_4w_1m": (math.inf, 50),
                "stalled_attach": (20, 50),
            }.get(key, (3, 10))
            ok = r["p50_ms"] <= p50_target and r["p99_ms"] <= p99_target
            figure = f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"
            if r.get("repeats", 1) > 1:
                figure += f" (median of {r['repeats']}; p99s {', '.join(f'{x:.0f}' for x in r['p99_ms_all'])})"
            else:
                worst = max(r["per_second_p99_ms"] or [float("nan")])
                figure += f" ({r['points']:,} pts; worst 1-s p99 {worst:.0f} ms)"
            target = f"<= {p50_target:g} / <= {p99_target:g} ms".replace("<= inf / ", "p99 ")
            rows.append((label, figure, target, verdict(ok)))
    if "stalled_attach" in results:
        r = results["stalled_attach"]
        stuck = [
            x
            for x in r["subscriber_stats"]
            if x.get("gaps") or x.get("dropped") or x.get("coalesced")
        ]
        growth = r["rss_mb_max_second_half"] - r["rss_mb_max_first_half"]
        rows.append(
            (
                "  server RSS during the stall (start / max / end)",
                f"{r['rss_mb_start']:.0f} / {r['rss_mb_max']:.0f} / {r['rss_mb_end']:.0f} MB "
                f"(2nd-half max - 1st-half max: {growth:+.1f} MB)",
                "bounded",
                verdict(growth < 20),
            )
        )
        rows.append(
            (
                "  stalled subscriber in /api/stats",
                "; ".join(
                    f"depth {x['depth']}/{x['capacity']}, coalesced {x.get('coalesced', 0)}, "
                    f"dropped {x['dropped']}, gaps {x['gaps']}"
                    for x in stuck
                )
                or "no subscriber dropped anything",
                "",
                "",
            )
        )
    if "tensorboard" in results:
        r = results["tensorboard"]
        if "error" in r:
            rows.append(("TensorBoard freshness", r["error"], "", ""))
        else:
            base = results.get("latency_attach")
            for label, key in (("defaults", "default"), ("--reload_interval 1", "reload_1s")):
                t = r[key]
                ratio = ""
                if base:
                    ratio = f"{t['p50_ms'] / base['p50_ms']:.0f}x / {t['p99_ms'] / base['p99_ms']:.0f}x vdl"
                rows.append(
                    (
                        f"TensorBoard {t['version']} freshness, {label}",
                        f"p50 {t['p50_ms'] / 1e3:.2f} s, p99 {t['p99_ms'] / 1e3:.2f} s "
                        f"({len(t['delays'])} samples, {t['missing']} unseen)",
                        "(compare)",
                        ratio,
                    )
                )
    width = max(len(r[0]) for r in rows) if rows else 10
    vw = max(len(r[1]) for r in rows) if rows else 10
    print()
    print(f"{'measure':{width}}  {'figure':{vw}}  {'target':16}  verdict")
    for name, value, target, v in rows:
        print(f"{name:{width}}  {value:{vw}}  {target:16}  {v}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases (about 2 minutes)")
    parser.add_argument(
        "--repeat", type=int, default=None, help="ingest runs (median); 3, or 1 with --quick"
    )
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument(
        "--profile", help="record py-spy profiles of the server into this directory"
    )
    parser.add_argument(
        "--tensorboard", help="the tensorboard executable (default: PATH, /tmp/tbvenv)"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=PHASES, help="phases to leave out")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return
    settings = QUICK if args.quick else Settings()
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    print(
        f"vdl-stream broker benchmark ({'quick' if args.quick else 'full'}); "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="vdl-bench-broker-") as tmp:

        def abort(signum: int, frame: object) -> None:
            # SIGTERM (e.g. from `timeout`): unwinding through trio.run is not safe from a signal
            # handler, so kill what was started, remove the scratch directory and exit.
            kill_started()
            shutil.rmtree(tmp, ignore_errors=True)
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, abort)
        bench = Bench(args, settings, Path(tmp))
        steps = {
            "ingest": bench.phase_ingest,
            "attach": bench.phase_attach,
            "many": bench.phase_many,
            "latency": bench.phase_latency,
            "stalled": bench.phase_stalled,
            "tensorboard": bench.phase_tensorboard,
        }
        for name, step in steps.items():
            if name in args.skip:
                continue
            t0 = time.perf_counter()
            print(f"  {name} ...", end="", flush=True)
            try:
                step()
            except Exception as exc:  # one broken phase still leaves the others' figures
                bench.results[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                print(f" FAILED: {type(exc).__name__}: {exc}", flush=True)
                continue
            print(f" {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    report(bench.results, settings, args)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.results, indent=1, default=str))


if __name__ == "__main__":
    main()
