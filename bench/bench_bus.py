"""Several brokers, one dashboard: ``vdl-stream serve --bus`` on one host, a real redis-server;
and how soon a freshly spawned ``serve`` shows its first chart.

``start`` (run only when named: ``--only start``): cold starts, from the process spawn. A bucket
on moto's S3 server (127.0.0.1) holds ``--start-runs`` runs recorded through
``attach(logdir="s3://...")``; its writers' cache holds the same runs on local disk. ``--repeat``
times, interleaved: ``vdl-stream --help`` (spawn to its usage), ``vdl-stream demo`` (spawn to
the line with its dashboard's URL), and ``vdl-stream serve`` over the local directory and over
the bucket (an empty ``--cache-dir``), each from spawn to the line saying it serves and to the
first run's snapshot on ``/ws/live`` (the first chart). With ``--base DIR`` (a checkout of
another commit) every case also runs that checkout's code, interleaved, so both see the same
load; medians are reported. ``--pyc``: with compiled bytecode, as an installed package has it
(a ``PYTHONPYCACHEPREFIX`` in the work directory, filled by a first spawn of each checkout that is
not counted); without it, what ``PYTHONDONTWRITEBYTECODE=1`` gives: every module compiled anew.

The other three phases, each against a fresh ``redis-server`` (127.0.0.1, a free port, no persistence),
the last two with three fresh ``vdl-stream serve --bus`` subprocesses sharing one log directory:

0. ``hop``: Redis alone: one ``XADD`` of a 600-byte entry every 4 ms, read back by a blocked
   ``XREAD`` in the same process; latency from before the XADD to the XREAD's return (500
   entries), through coredis on trio (a pipeline of one, as the bus used it before) and through
   the bus's own RESP connections (``vdl_stream/bus_resp.py``, as it uses them now), alternated
   ``--repeat`` times; with each round's CPU time. ``--hop-busy N``: N tasks beside the hop,
   each taking 0.2 ms of CPU a step, as a busy broker's loop (each pass of the scheduler then
   costs the hop's tasks N x 0.2 ms; the CPU time then counts theirs too).
1. ``latency``: 48 raw ``/ws/ingest`` writers, 16 per broker (a process of writers per broker),
   each in its own run and paced so that together they send ``--rate`` events/s (batches of 25
   points; all sending at the same instants, or with ``--stagger`` each writer ``k/48`` of a
   batch interval after the first, as independent jobs do); one ``/ws/live`` client per broker
   (each its own process) subscribed to every run as the page subscribes (split snapshots,
   batched live frames, a ``gap`` naming runs answered with a ``keep`` re-subscription).
   Reports, for each client, the runs it saw, and the latency from a point's creation (its wall
   time, stamped when the batch is built) to its arrival, split into points written through the
   client's own broker and through another broker (the bus path); the brokers' bus counters
   (published, dropped, gaps); Redis's commands/s and memory.
2. ``failover``: ``--writers`` ``attach(url=[a, b, c])`` writers (threads of this process, each
   broker first in a third of the lists) logging steadily; one broker SIGKILLed ``--kills`` times
   at random moments (and started again on its port after a random pause). Afterwards every run
   is read back from disk: steps lost and steps duplicated must both be 0. The flushes share one
   600-s deadline; ``not_flushed`` names the writers that did not flush by then, with their
   statistics (pending batches, refusals, the problem being retried): what they still held when
   the bench closed them is counted apart (``steps_undelivered``), not as lost.

Only 127.0.0.1 is used; every loop is bounded; every process started is stopped in ``finally``.

Usage: python bench/bench_bus.py [--quick] [--seconds S] [--rate N] [--writers N] [--kills N]
                                 [--seed N] [--json PATH] [--keep DIR] [--skip PHASE ...]
                                 [--only PHASE ...] [--repeat N] [--hop-busy N] [--stagger]
                                 [--start-runs N] [--base DIR]

``--keep DIR``: when the failover phase loses or duplicates a step, or a writer does not flush,
its log directory and the brokers' logs are copied to ``DIR/failover-seed<N>`` (``damaged_runs`` in the results says which
runs and the first missing steps).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import psutil
import trio
from broker_clients import (
    MAX_MESSAGE,
    STARTED,
    ServeProcess,
    WriterResult,
    free_port,
    kill_started,
    stop_process,
    stream_batches,
)
from trio_websocket import open_websocket_url

import recorder
from vdl_stream import attach, codec

PHASES = ("hop", "latency", "failover", "start")
#: Phases run when --only does not name them.
DEFAULT_PHASES = ("hop", "latency", "failover")
REPO = Path(__file__).resolve().parent.parent
BROKERS = 3
#: Lease ttl given to the brokers of the failover phase (``--bus-lease``): how long a killed
#: broker's runs wait (the latency phase runs the default).
LEASE = "1.5"


class RedisProcess:
    """A ``redis-server`` on 127.0.0.1 and a free port, without persistence."""

    def __init__(self, workdir: Path) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            raise SystemExit("redis-server is not installed (scripts/test.sh installs it)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                *(executable, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        STARTED.add(self.proc)
        deadline = time.monotonic() + 10
        while self.info("server") is None:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer within 10 s")
            time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def info(self, section: str) -> dict[str, str] | None:
        """``INFO section`` through redis-cli, as a dict; None while it does not answer."""
        try:
            out = subprocess.run(
                ["redis-cli", "-p", str(self.port), "info", section],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        pairs = [line.split(":", 1) for line in out.splitlines() if ":" in line]
        return dict(pairs) or None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_brokers(
    logdir: Path,
    workdir: Path,
    redis: RedisProcess,
    ports: list[int],
    lease: str | None = None,
    names: list[str] | None = None,
) -> list[ServeProcess]:
    """Start a ``serve --bus`` per port (0: any free port), with ``--bus-lease`` if given; each
    logs to ``workdir/<name>.log`` (``names``; by default broker0, broker1, ...)."""
    leasing = ("--bus-lease", lease) if lease else ()
    names = names or [f"broker{i}" for i in range(len(ports))]
    return [
        ServeProcess(
            logdir, workdir / f"{name}.log", "--port", str(port), "--bus", redis.url, *leasing
        )
        for name, port in zip(names, ports, strict=True)
    ]


# -- phase 0: the Redis hop alone ----------------------------------------------------------------


def phase_hop(args: argparse.Namespace, workdir: Path) -> dict:
    """The Redis hop alone, through coredis and through the bus's own RESP connections
    (``vdl_stream/bus_resp.py``, what its publish and read loops use), alternated ``--repeat``
    times in one process: p50/p99 of each, and the CPU time of each round."""
    import coredis

    from vdl_stream import bus_resp

    redis = RedisProcess(workdir)
    count = 500

    async def hop_coredis(key: str, latencies: list[float]) -> None:
        client = coredis.Redis.from_url(redis.url)

        async def read() -> None:
            last = "0-0"
            while len(latencies) < count:
                result = await client.xread({key: last}, count=100, block=1000)
                now = time.perf_counter()
                for entry in (result or {}).get(key.encode(), ()):
                    last = entry.identifier.decode()
                    latencies.append(now - float(entry.field_values[b"t"]))

        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for _ in range(count):
                async with client.pipeline(transaction=False) as pipe:
                    pipe.xadd(key, {"t": repr(time.perf_counter()), "f": b"x" * 600})
                await trio.sleep(0.004)

    async def hop_raw(key: str, latencies: list[float]) -> None:
        publisher = await bus_resp.open_connection(redis.url)
        reader = await bus_resp.open_connection(redis.url)

        async def read() -> None:
            last = b"0-0"
            while len(latencies) < count:
                reply = await reader.call(
                    "XREAD", "COUNT", 100, "BLOCK", 1000, "STREAMS", key, last
                )
                now = time.perf_counter()
                for identifier, fields in bus_resp.streams(reply).get(key.encode(), ()):
                    last = identifier
                    latencies.append(now - float(fields[b"t"]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for _ in range(count):
                await publisher.call(
                    "XADD", key, "*", "t", repr(time.perf_counter()), "f", b"x" * 600
                )
                await trio.sleep(0.004)
        await publisher.aclose()
        await reader.aclose()

    results: dict[str, list] = {"coredis": [], "raw": []}

    async def busy() -> None:
        """A task of a busy broker's loop: 0.2 ms of CPU a step (a batch's ingest, a frame's
        fan-out), then a pass of the scheduler."""
        while True:
            end = time.perf_counter() + 0.0002
            while time.perf_counter() < end:
                pass
            await trio.lowlevel.checkpoint()

    async def main() -> None:
        with trio.fail_after(60 * args.repeat * (1 + args.hop_busy)):
            for i in range(args.repeat):
                for name, hop in (("coredis", hop_coredis), ("raw", hop_raw)):
                    latencies: list[float] = []
                    cpu = time.process_time()
                    async with trio.open_nursery() as nursery:
                        for _ in range(args.hop_busy):
                            nursery.start_soon(busy)
                        await hop(f"hop-{name}-{i}", latencies)
                        nursery.cancel_scope.cancel()
                    results[name].append(
                        {
                            **percentiles([np.array(latencies)]),
                            "cpu_s": round(time.process_time() - cpu, 3),
                        }
                    )

    try:
        trio.run(main)
    finally:
        redis.stop()
    return {
        name: {
            "rounds": rounds,
            "p50_ms_median": float(np.median([r["p50_ms"] for r in rounds])),
            "p99_ms_median": float(np.median([r["p99_ms"] for r in rounds])),
            "cpu_s_median": float(np.median([r["cpu_s"] for r in rounds])),
        }
        for name, rounds in results.items()
    }


# -- phase 1: latency across brokers ------------------------------------------------------------


@dataclass
class Browser:
    """What one ``/ws/live`` client (subscribed to every run) received."""

    runs: set[str] = field(default_factory=set)
    own: list[np.ndarray] = field(default_factory=list)  # latencies via its own broker
    other: list[np.ndarray] = field(default_factory=list)  # via another broker (the bus)
    gaps: int = 0
    run_gaps: int = 0  # of ``gaps``, those naming runs (re-synced with ``keep``)
    error: str | None = None


async def browse(ws: str, own_runs: set[str], result: Browser, since: list[float]) -> None:
    """Subscribe to every run as the page does (split snapshots, batched live frames) and
    answer a ``gap`` as it does: one naming runs with a ``keep`` re-subscription (those runs'
    snapshots come again), one of every run afresh."""
    ask = {"type": "subscribe", "runs": None, "max_points": 2000, "split": True, "batch": True}
    subscribe = codec.encode_message(ask)
    resync = codec.encode_message({**ask, "keep": True})
    try:
        async with open_websocket_url(
            ws + "/ws/live", max_message_size=MAX_MESSAGE, message_queue_size=256
        ) as conn:
            await conn.send_message(subscribe)
            while True:
                message = codec.decode_message(await conn.get_message())
                now = time.time()
                frames = (
                    [codec.decode_message(f) for f in message["frames"]]
                    if message["type"] == "frames"
                    else [message]
                )
                for frame in frames:
                    kind = frame["type"]
                    if kind == "gap":
                        result.gaps += 1
                        if frame.get("runs") is not None:
                            result.run_gaps += 1
                        await conn.send_message(subscribe if frame.get("runs") is None else resync)
                    elif kind in ("data", "snapshot"):
                        run = frame["run"]
                        result.runs.add(run)
                        if kind != "data":
                            continue
                        for _tag, _steps, walls, _values in frame["scalars"]:
                            w = np.frombuffer(walls, dtype="<f8")
                            w = w[w >= since[0]]  # after the warm-up
                            if len(w):
                                (result.own if run in own_runs else result.other).append(now - w)
    except Exception as exc:  # reported, never hidden
        result.error = f"{type(exc).__name__}: {exc}"[:200]


def cpu_seconds(server: ServeProcess) -> float:
    times = psutil.Process(server.pid).cpu_times()
    return times.user + times.system


def percentiles(chunks: list[np.ndarray]) -> dict[str, float]:
    lat = np.concatenate(chunks) * 1000 if chunks else np.zeros(0)
    if not len(lat):
        return {"points": 0}
    return {
        "points": len(lat),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "max_ms": round(float(lat.max()), 1),
    }


def _browser_process(ws: str, own: set[str], since: float, until: float, out: Path) -> None:
    """A child process: one ``/ws/live`` client until ``until``; results saved to ``out``."""
    result = Browser()

    async def main() -> None:
        with trio.move_on_after(max(0.0, until - time.time())):
            await browse(ws, own, result, [since])

    trio.run(main)
    empty = np.zeros(0)
    np.savez(
        out,
        own=np.concatenate(result.own) if result.own else empty,
        other=np.concatenate(result.other) if result.other else empty,
    )
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "runs": sorted(result.runs),
                "gaps": result.gaps,
                "run_gaps": result.run_gaps,
                "error": result.error,
            }
        )
    )


def _writers_process(specs: list[tuple[str, str, str, float]], options: dict, out: Path) -> None:
    """A child process: raw writers ``(writer, run, ws, phase)`` streaming from ``options["at"]``
    on, each its ``phase`` seconds later."""
    results = [WriterResult(writer, run) for writer, run, _, _ in specs]

    async def main() -> None:
        start = trio.Event()
        async with trio.open_nursery() as nursery:
            for (_, _, ws, phase), result in zip(specs, results, strict=True):
                nursery.start_soon(
                    lambda ws=ws, r=result, phase=phase: stream_batches(
                        ws,
                        r,
                        tags=["loss"],
                        points=options["points"],
                        seconds=options["seconds"],
                        start=start,
                        batches_per_s=options["batches_per_s"],
                        phase=phase,
                    )
                )
            await trio.sleep(max(0.0, options["at"] - time.time()))
            start.set()

    trio.run(main)
    out.write_text(json.dumps([{"acked": r.acked_seq, "error": r.error} for r in results]))


def phase_latency(args: argparse.Namespace, workdir: Path) -> dict:
    """48 paced writers in 3 processes, one browser process per broker (so that no client
    process is the bottleneck: each has its own GIL)."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    redis = RedisProcess(workdir)
    brokers = start_brokers(workdir / "logs", workdir, redis, [0] * BROKERS)
    children: list = []
    try:
        writers, points = 48, 25
        runs = [f"bus{i:02d}" for i in range(writers)]
        home = {run: i % BROKERS for i, run in enumerate(runs)}
        start_at = time.time() + 3  # every connection and subscription in place
        since = start_at + 1  # after a warm-up: runs appear, leases are taken
        until = since + args.seconds
        options = {
            "points": points,
            "seconds": until - start_at,
            "batches_per_s": args.rate / writers / points,
            "at": start_at,
        }
        for i, broker in enumerate(brokers):
            own = {r for r in runs if home[r] == i}
            children.append(
                fork.Process(
                    target=_browser_process,
                    args=(broker.ws, own, since, until + 0.5, workdir / f"browser{i}.npz"),
                )
            )
            # --stagger: writer k sends k/48 of a batch interval after writer 0, as independent
            # training jobs do; without it all 48 send at the same instants (a burst of 16
            # batches a broker, then 32 from the bus, every interval).
            interval = 1 / options["batches_per_s"]
            specs = [
                (f"w{r}", r, broker.ws, k * interval / writers if args.stagger else 0.0)
                for k, r in enumerate(runs)
                if home[r] == i
            ]
            children.append(
                fork.Process(
                    target=_writers_process, args=(specs, options, workdir / f"writers{i}.json")
                )
            )
        for child in children:
            child.start()
        time.sleep(max(0.0, since - time.time()))
        stats_before = [b.stats() for b in brokers]
        cpu_before = [cpu_seconds(b) for b in brokers]
        redis_before = redis.info("stats") or {}
        time.sleep(max(0.0, until - time.time()))
        stats = [b.stats() for b in brokers]
        cpu = [cpu_seconds(b) - c for b, c in zip(brokers, cpu_before, strict=True)]
        redis_after = redis.info("stats") or {}
        memory = redis.info("memory") or {}
        load = psutil.getloadavg()
        for child in children:
            child.join(120)
        elapsed = args.seconds
        browsers = []
        for i in range(BROKERS):
            saved = np.load(workdir / f"browser{i}.npz")
            meta = json.loads((workdir / f"browser{i}.json").read_text())
            browsers.append((saved["own"], saved["other"], meta))
        written = [
            w
            for i in range(BROKERS)
            for w in json.loads((workdir / f"writers{i}.json").read_text())
        ]
        published = sum(
            s["bus"]["published"] - b["bus"]["published"]
            for s, b in zip(stats, stats_before, strict=True)
        )
        commands = int(redis_after.get("total_commands_processed", 0)) - int(
            redis_before.get("total_commands_processed", 0)
        )
        return {
            "brokers": BROKERS,
            "writers": writers,
            "rate_target": args.rate,
            "stagger": args.stagger,
            "seconds": elapsed,
            "events_per_s": round(sum(w["acked"] for w in written) * points / options["seconds"]),
            "writer_errors": [w["error"] for w in written if w["error"]],
            "browsers": [
                {
                    "runs_seen": len(meta["runs"]),
                    "own_broker": percentiles([own]),
                    "other_broker": percentiles([other]),
                    "gaps": meta["gaps"],
                    "run_gaps": meta.get("run_gaps", 0),
                    "error": meta["error"],
                }
                for own, other, meta in browsers
            ],
            "every_browser_sees_every_run": all(len(m["runs"]) == writers for _, _, m in browsers),
            "other_broker_all": percentiles([other for _, other, _ in browsers]),
            "bus": [{k: v for k, v in s["bus"].items() if k != "stages"} for s in stats],
            # --trace: per broker, the age of points at each stage of the bus path
            "stages": [s["bus"].get("stages") for s in stats] if args.trace else None,
            # the persist queue's peak depth (of 64): ingest waits while it is full
            "ingest_queue_peak": [s["broker"]["queue_peak"] for s in stats],
            "subscribers": [s["subscribers"] for s in stats],
            "broker_cpu_per_s": [round(c / elapsed, 2) for c in cpu],
            "load_average": [round(x, 1) for x in load],
            "batches_published_per_s": round(published / elapsed),
            # stream entries (XADDs): batches of a run merged per publish tick while busy
            "xadd_per_s": round(
                sum(
                    s["bus"].get("entries", 0) - b["bus"].get("entries", 0)
                    for s, b in zip(stats, stats_before, strict=True)
                )
                / elapsed
            ),
            "redis_commands_per_s": round(commands / elapsed),
            "redis_used_memory_mb": round(int(memory.get("used_memory", 0)) / 2**20, 1),
        }
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
        for broker in brokers:
            broker.stop()
        redis.stop()


# -- phase 2: SIGKILL failover -------------------------------------------------------------------


#: Seconds the failover phase waits for every writer's flush, all together.
FLUSH_DEADLINE = 600.0


def _writer_state(writer) -> dict:
    """What a writer that did not flush still holds and what it was told (its statistics)."""
    stats = writer.statistics()
    return {
        k: getattr(stats, k)
        for k in (
            "pending_batches",
            "refusals",
            "send_failures",
            "problem",
            "batches",
            "sent_batches",
        )
        if hasattr(stats, k)
    } | _transport_state(writer, stats)


def _await_chain(coro) -> list[str]:
    """Where a coroutine waits: ``file:line function`` of each frame down its await chain."""
    out = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            name = frame.f_code.co_filename.rsplit("/", 1)[-1]
            out.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
        following = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        if frame is not None and frame.f_code.co_name == "__aexit__" and "self" in frame.f_locals:
            # contextlib's async context manager: on into the generator it drives
            following = getattr(frame.f_locals["self"], "gen", following)
        coro = following
    return out


def _tasks_of(writer) -> list[str]:
    """Each trio task of a writer's background loop, with the innermost frames it waits in
    (the loop's own thread walks its task tree): where a stalled writer is stuck."""

    def walk() -> list[str]:
        lines, todo = [], [trio.lowlevel.current_root_task()]
        while todo:
            task = todo.pop()
            lines.append(" > ".join(_await_chain(task.coro)[-7:]))
            todo.extend(c for n in task.child_nurseries for c in n.child_tasks)
        return lines

    token = getattr(writer, "_token", None)
    try:
        return trio.from_thread.run_sync(walk, trio_token=token) if token else []
    except (trio.RunFinishedError, RuntimeError) as exc:
        return [f"not readable: {exc}"]


def _transport_state(writer, stats) -> dict:
    """Where a writer's transport stands: its counters, the broker it is on, what it has had
    acknowledged and its failovers (read from the transport: a diagnosis, not an API)."""
    out = dict(stats.transport.__dict__) if getattr(stats, "transport", None) else {}
    transport = getattr(writer, "_transport", None)
    for name, key in (("url", "url"), ("acked", "_acked"), ("sent", "_sent")):
        if hasattr(transport, key):
            out[name] = getattr(transport, key)
    if hasattr(transport, "failovers"):
        out["failovers"] = transport.failovers
    return {"transport": out, "tasks": _tasks_of(writer)}


def phase_failover(args: argparse.Namespace, workdir: Path) -> dict:
    redis = RedisProcess(workdir)
    logdir = workdir / "logs"
    ports = [free_port() for _ in range(BROKERS)]
    brokers = start_brokers(logdir, workdir, redis, ports, LEASE)
    rng = random.Random(args.seed)
    stop = threading.Event()
    counts = [0] * args.writers
    urls = [b.ws for b in brokers]
    writers = [
        attach(url=urls[i % BROKERS :] + urls[: i % BROKERS], run=f"fo{i:02d}", telemetry=False)
        for i in range(args.writers)
    ]

    def log_steadily(index: int) -> None:
        writer, step = writers[index], 0
        while not stop.is_set():
            writer.add_scalar("loss", float(step), step)
            step += 1
            counts[index] = step
            if step % 10 == 0:
                time.sleep(0.01)  # about 1,000 steps/s a writer

    threads = [threading.Thread(target=log_steadily, args=(i,)) for i in range(args.writers)]
    kills = []
    t0 = time.time()
    try:
        for t in threads:
            t.start()
        for _ in range(args.kills):
            time.sleep(rng.uniform(0.5, 2.0))
            victim = rng.randrange(BROKERS)
            t_kill = time.time()
            brokers[victim].proc.kill()
            brokers[victim].proc.wait()
            time.sleep(rng.uniform(0.2, 1.0))
            brokers[victim].stop()
            # A log of its own: the killed one's log is kept (--keep) for a diagnosis.
            again = [f"broker{victim}-restart{len(kills) + 1}"]
            brokers[victim] = start_brokers(
                logdir, workdir, redis, [ports[victim]], LEASE, names=again
            )[0]
            kills.append({"broker": victim, "at_s": round(t_kill - t0, 2)})
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(60)
        # One deadline for all the flushes (not 120 s each), so a stalled writer cannot hold the
        # bench for an hour; the ones that did not flush are reported with their statistics.
        deadline = time.monotonic() + args.flush_deadline
        flushed = [w.flush(max(0.1, deadline - time.monotonic())) for w in writers]
        stalled = {
            f"fo{i:02d}": _writer_state(w)
            for i, (w, ok) in enumerate(zip(writers, flushed, strict=True))
            if not ok
        }
    finally:
        stop.set()
        # Together: a stalled writer's close waits for its flush (30 s), and one after the
        # other a dozen of them held the bench for minutes.
        closing = [threading.Thread(target=w.close) for w in writers]
        for t in closing:
            t.start()
        for t in closing:
            t.join(120)
        for broker in brokers:
            broker.stop()
        redis.stop()
    lost = duplicated = undelivered = 0
    damaged: dict[str, dict] = {}
    for i, n in enumerate(counts):
        with recorder.RunReader(logdir / f"fo{i:02d}") as reader:
            steps = reader.read_scalars("loss").steps
        unique = np.unique(steps)
        missing = np.setdiff1d(np.arange(n), unique)
        duplicated += len(steps) - len(unique)
        if f"fo{i:02d}" in stalled:
            undelivered += len(missing)  # the writer still held them: the stall, not a loss
        else:
            lost += len(missing)
        if len(missing) or len(steps) != len(unique):
            damaged[f"fo{i:02d}"] = {
                "missing": len(missing),
                "first_missing": missing[:5].tolist(),
                "duplicated": len(steps) - len(unique),
            }
    if (damaged or stalled) and args.keep:
        shutil.copytree(workdir, args.keep / f"failover-seed{args.seed}", dirs_exist_ok=True)
    return {
        "writers": args.writers,
        "kills": kills,
        "steps_logged": sum(counts),
        "steps_lost": int(lost),
        "steps_duplicated": int(duplicated),
        "steps_undelivered": int(undelivered),
        "damaged_runs": damaged,
        "all_flushed": all(flushed),
        "not_flushed": stalled,
    }


# -- phase 3: cold starts ----------------------------------------------------------------------


def _cpu(pid: int) -> float:
    """CPU seconds process ``pid`` used so far (its threads included): unlike wall time, barely
    moved by the other work on a shared machine."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _spawn_until(tree: Path, argv: list[str], marker: str, cwd: Path) -> tuple[float, float]:
    """Seconds from spawning ``python -m vdl_stream.cli ARGV`` (``tree``'s code) until its
    output holds ``marker``, and the CPU seconds it used by then; the process is stopped
    afterwards (``--help`` exits by itself: its CPU time is then its whole run's)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vdl_stream.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=cwd,  # not the checkout: Python puts the working directory first on sys.path
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)},
    )
    STARTED.add(proc)
    out = b""
    deadline = t0 + 60
    try:
        while marker.encode() not in out and time.perf_counter() < deadline:
            left = max(0.0, deadline - time.perf_counter())
            ready, _, _ = select.select([proc.stdout], [], [], left)
            chunk = os.read(proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                break
            out += chunk
        elapsed = time.perf_counter() - t0
        try:
            cpu = _cpu(proc.pid)
        except psutil.NoSuchProcess:
            cpu = float("nan")
        if proc.poll() is not None:  # exited (--help): its rusage is whole
            proc.wait()
        if marker.encode() not in out:
            raise RuntimeError(f"vdl-stream {argv[0]} printed no {marker!r}: {out[-200:]!r}")
    finally:
        stop_process(proc, 20, signal.SIGINT)
        proc.stdout.close()
    return elapsed, cpu


async def _first_chart(ws: str, t0: float) -> float:
    """Seconds from ``t0`` to the first run's snapshot on ``/ws/live`` (the page's subscribe)."""
    subscribe = {"type": "subscribe", "runs": None, "max_points": 2000, "split": True}
    async with open_websocket_url(ws + "/ws/live", max_message_size=MAX_MESSAGE) as conn:
        await conn.send_message(codec.encode_message(subscribe))
        while True:
            if codec.decode_message(await conn.get_message())["type"] == "snapshot":
                return time.perf_counter() - t0


def _serve_cold(tree: Path, logdir: str, workdir: Path, *extra: str) -> dict[str, float]:
    """Spawn a serve of ``tree`` over ``logdir``: seconds to its URL line and to a first chart."""
    t0 = time.perf_counter()
    server = ServeProcess(logdir, workdir / "serve-start.log", *extra, tree=tree)  # type: ignore[arg-type]
    try:
        ready = time.perf_counter() - t0

        async def main() -> float:
            with trio.fail_after(60):
                return await _first_chart(server.ws, t0)

        first = trio.run(main)
        return {"ready_s": ready, "first_chart_s": first, "cpu_at_first_chart_s": _cpu(server.pid)}
    finally:
        server.stop()


def phase_start(args: argparse.Namespace, workdir: Path) -> dict:
    from tests.s3_server import MotoServer, restore_env, set_env
    from vdl_stream import storage

    moto = MotoServer()
    old = set_env({**moto.env(), "VDL_STREAM_CACHE": str(workdir / "writer-cache")})
    no_bytecode = os.environ.get("PYTHONDONTWRITEBYTECODE")
    try:
        moto.create_bucket("start")
        url = "s3://start/runs"
        steps = 2000 if args.quick else 20_000
        for r in range(args.start_runs):
            with attach(logdir=url, run=f"exp/run{r:02d}", telemetry=False) as writer:
                for i in range(steps):
                    writer.add_scalar("train/loss", 1.0 / (i + 1), i)
                    writer.add_scalar("train/acc", i / steps, i)
                    if i % 10 == 0:
                        writer.flush()  # a live run's cadence: the broker compacts as it goes
                writer.add_text("notes", "bench", 1)
        local = str(storage.cache_dir(url))  # the writers' cache holds the runs whole
        trees = {"this": REPO, **({"base": args.base.resolve()} if args.base else {})}
        if args.pyc:
            os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
            os.environ["PYTHONPYCACHEPREFIX"] = str(workdir / "pyc")
            for tree in trees.values():  # compiles the modules serve and demo import, once
                _serve_cold(tree, local, workdir)
                _spawn_until(
                    tree,
                    ["demo", "--logdir", str(workdir / "demo-warm"), "--port", "0"],
                    "dashboard at",
                    workdir,
                )
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
        for i in range(args.repeat):
            for name, tree in trees.items():  # interleaved: every tree sees the same load
                got = samples[name]
                demo = ["demo", "--logdir", str(workdir / f"demo-{name}-{i}"), "--port", "0"]
                for key, argv, marker in (
                    ("help", ["--help"], "usage:"),
                    ("demo_url", demo, "dashboard at"),
                ):
                    wall, cpu = _spawn_until(tree, argv, marker, workdir)
                    got.setdefault(f"{key}_s", []).append(wall)
                    got.setdefault(f"{key}_cpu_s", []).append(cpu)
                for where, logdir, extra in (
                    ("local", local, ()),
                    ("bucket", url, ("--cache-dir", str(workdir / f"cold-{name}-{i}"))),
                ):
                    for key, value in _serve_cold(tree, logdir, workdir, *extra).items():
                        got.setdefault(f"serve_{where}_{key}", []).append(value)
        return {
            "bytecode_cached": args.pyc,
            "runs": args.start_runs,
            "steps": steps,
            "repeat": args.repeat,
            "load_average": [round(x, 1) for x in psutil.getloadavg()],
            **{
                name: {k: round(statistics.median(v), 3) for k, v in got.items()}
                for name, got in samples.items()
            },
            "samples": {
                name: {k: [round(x, 3) for x in v] for k, v in got.items()}
                for name, got in samples.items()
            },
        }
    finally:
        restore_env(old)
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        if no_bytecode is not None:
            os.environ["PYTHONDONTWRITEBYTECODE"] = no_bytecode
        moto.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="short phases (development)")
    parser.add_argument("--seconds", type=float, default=None, help="latency phase length")
    parser.add_argument("--rate", type=int, default=30_000, help="events/s, all writers")
    parser.add_argument("--writers", type=int, default=None, help="failover phase writers")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs in the failover phase")
    parser.add_argument("--seed", type=int, default=13, help="failover: kill moments, victims")
    parser.add_argument(
        "--flush-deadline",
        type=float,
        default=FLUSH_DEADLINE,
        help="failover: seconds for every writer's flush, all together (then: not_flushed)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="brokers report the age of points at each stage of the bus path "
        "(VDL_STREAM_BUS_TRACE=1; latency phase: 'stages' in the results)",
    )
    parser.add_argument(
        "--keep", type=Path, help="failover: copy the log directory and logs here on a loss"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=PHASES)
    parser.add_argument(
        "--only", nargs="*", choices=PHASES, help="run these phases (default: all but start)"
    )
    parser.add_argument("--repeat", type=int, default=None, help="start: cold starts per case")
    parser.add_argument(
        "--stagger",
        action="store_true",
        help="latency: writers' sends spread over the batch interval, not all at once",
    )
    parser.add_argument(
        "--hop-busy",
        type=int,
        default=0,
        help="hop: this many tasks beside the hop, each 0.2 ms of CPU a step (a busy broker)",
    )
    parser.add_argument("--start-runs", type=int, default=3, help="start: runs in the bucket")
    parser.add_argument(
        "--base", type=Path, help="start: also time this checkout's code (another commit)"
    )
    parser.add_argument(
        "--pyc", action="store_true", help="start: with cached bytecode (an installed package)"
    )
    args = parser.parse_args()
    args.seconds = args.seconds or (4.0 if args.quick else 15.0)
    args.writers = args.writers or (12 if args.quick else 48)
    args.repeat = args.repeat or (3 if args.quick else 5)
    if args.trace:  # inherited by the serve processes (bench/broker_clients.py)
        os.environ["VDL_STREAM_BUS_TRACE"] = "1"
    chosen = args.only if args.only is not None else DEFAULT_PHASES
    results = {}
    try:
        for phase in PHASES:
            if phase in args.skip or phase not in chosen:
                continue
            with tempfile.TemporaryDirectory(prefix=f"bench-bus-{phase}-") as tmp:
                run = {
                    "hop": phase_hop,
                    "latency": phase_latency,
                    "failover": phase_failover,
                    "start": phase_start,
                }[phase]
                results[phase] = run(args, Path(tmp))
            print(json.dumps({phase: results[phase]}, indent=1), flush=True)
    finally:
        kill_started()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
