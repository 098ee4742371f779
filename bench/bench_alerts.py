"""Alerts benchmark (issue 14): what the detectors cost ingest, and how often they cry wolf.

Phases:

0. ``detectors``: the detectors alone, no broker: batches as ``make_batches`` makes them (4 tags, a
   gradient histogram in every 25th) handed to ``AlertEngine.observe`` as the broker does, and a
   round run on what ``--round-batches`` of them queued, as the engine's task would; CPU time per
   event (the thread's) of ``observe`` and of the rounds, median of ``--repeat``, for small and
   large batches and rounds of a few or many. One thread, no I/O: the figure a loaded machine
   disturbs least, and the cost the throughput target is about.
1. ``throughput``: an in-process ``Broker`` over a fresh log directory ingests ``--batches``
   batches (each ``--tags`` loss-like tags x ``--points`` points, noisy and positive; a gradient
   histogram in every 25th), waits until all are written and judged, and closes (its last flush
   and fsync); with the alert engine running (every detector on, default rules) and without
   it, in ``--repeat`` pairs of runs (off then on, on then off, ...). Each pair gives a ratio
   of the process's CPU time through the close (every thread, persistence included; "events
   per CPU second" on/off, the throughput ratio of an ingest bound by CPU), and the verdict
   line judges the target on the median of those ratios, with their quartiles and range (the
   verdict says "undecided" when the quartiles straddle the target: run more pairs). Beside
   it: the wall-clock ratio per pair, the detectors' own CPU (``cpu_seconds`` of their
   statistics), the CPU split into user and system time, the event loop's thread's and the
   garbage collector's (a ``gc.callbacks`` timer), minor page faults and context switches per
   batch, batches the detectors dropped, and the load average at the start and the end. The
   detectors share the broker's process (and its GIL) here, the worst case for the comparison.
   Two paths (``--paths``): large batches (a fast writer, 4,096 points) and small ones (30
   points, what a writer's 20 ms flush holds for a demo-speed loop; 20 times as many). The
   batches made for a path are frozen out of the garbage collector (``gc.freeze``), and each run
   starts after a collection: the collector then traverses what the runs make, not the input
   (a full collection over 40,000 small batches took 45 ms, in whichever run it fell). On the
   2-core development machine the system time of the persist thread (the kernel's page cache)
   moves by 2x between identical runs and dwarfs the detectors: pairs, not more runs per mode,
   are what makes the ratio settle (docs/performance.md, "Alerts: the large-batch path").
   ``--rate`` paces ingest to that many events/s in both modes (use fewer ``--batches`` with
   it): persistence then gets the same flushes on and off, so CPU per event compares the
   detectors' work alone, without the cost per event that rises when a slower loop hands the
   persist task smaller flushes. ``--null`` runs both halves of each pair with the detectors
   off (an A/A test): the spread of its ratios is the bench's own noise at that moment.
   ``--slices K`` runs each pair as K consecutive parts of its batches, each part off and on in
   turn, and takes the pair's ratio over the CPU summed per mode: the same events per mode and
   pair, with the two modes K times closer in time (a drift of the machine's load or of the
   page cache then weighs on both alike within the pair). Each pair also gives the ratio of
   the event loop's thread alone (ingest, ``observe`` and the rounds) and of the other threads
   (persistence), so that the process's figure, the target, says which side moved.
   ``--tasks`` times the loop's CPU per trio task (the bench's ingest, the persist task, the
   detectors' round task and tick, trio's own) and the ingest steps right after a round.
2. ``served``: the real path. A ``vdl-stream serve`` subprocess (default rules, or
   ``--alerts off``: no detectors at all), 4 raw ``/ws/ingest`` writers (bench/broker_clients.py,
   as bench_broker.py's ingest phase) sending ``--tags`` tags x ``--served-points`` points per
   batch for ``--seconds`` seconds with at most 8 unacknowledged batches each (or paced to
   ``--served-rate`` events/s in all, a rate both modes sustain, so that costs fixed per second
   weigh alike on each event: CPU per event then compares the detectors' work alone); events/s
   acknowledged (persisted), the server's CPU time per event (all its threads, and its event
   loop's alone) and the writers' (this process), in ``--repeat`` pairs of runs off and on;
   the verdict takes the median of the pairs' ratios, as above. A machine shared with other work disturbs wall-clock rates far more than
   CPU time, so each path's verdict line judges the target on events per CPU second (the rate
   of an ingest that has a core to itself) and prints the wall-clock ratio beside it; the last
   line sums up every path measured.
3. ``latency``: a ``vdl-stream serve`` and a training process (tests/alert_writer.py) with a
   fault (learning rate x100, a NaN loss, gradients x1e6 at step 300); seconds from the offending
   point's wall time (taken in the training process) to the alert's arrival at a ``/ws/live``
   client, per alert.
4. ``false-positives``: the demo's training (tests/alert_faults.py, the model, data and optimiser
   of vdl_stream/demo.py, one seed per run) for ``--runs`` runs of ``--steps`` steps, its points
   handed to the detectors in the writer's batch sizes; alerts raised (the target is 0), the same
   runs handed over from half-way (a server started next to a running job: the detectors never
   saw the start), and for contrast the same runs with a fault (learning rate x100 at step 2,000):
   runs caught.

Usage: python bench/bench_alerts.py [--quick] [--repeat PAIRS] [--runs N] [--steps N] [--seconds S]
                                    [--rate EVENTS_PER_S] [--batches N] [--paths large small] [--null]
                                    [--slices K] [--tasks]
                                    [--served-points N ...] [--served-rate EVENTS_PER_S]
                                    [--json PATH] [--skip PHASE ...] [--tree CHECKOUT]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The checkout whose code is measured: --tree PATH (read before the imports below, so that they
# come from it; e.g. a worktree of main, for before and after in the same moment), else this one.
sys.path.insert(
    0,
    os.path.abspath(sys.argv[sys.argv.index("--tree") + 1])
    if "--tree" in sys.argv[:-1]
    else str(Path(__file__).resolve().parent.parent),
)

import broker_clients
import numpy as np
import psutil
import trio
from broker_clients import ServeProcess, WriterResult, kill_started, stream_together

from tests import alert_faults
from vdl_stream import codec, summaries
from vdl_stream.alerts import AlertEngine
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns

TREE = Path(sys.path[0])
PHASES = ("detectors", "throughput", "served", "latency", "false-positives")
#: The issue's target: ingest with every detector on loses at most this share of its rate.
TARGET_LOSS = 0.10


def make_batches(n: int, tags: int, points: int, seed: int = 0) -> list[Batch]:
    """``n`` batches of ``tags`` loss-like tags x ``points`` points and a gradient histogram."""
    rng = np.random.default_rng(seed)
    out = []
    step = 0
    for seq in range(1, n + 1):
        steps = np.arange(step, step + points, dtype=np.int64)
        walls = 1.7e9 + steps * 0.01
        scalars = []
        for t in range(tags):
            # A decaying loss with multiplicative noise: what the spike and divergence rules judge.
            values = np.exp(-steps / 5e4) * np.exp(rng.normal(0, 0.3, points)) * (1 + t)
            scalars.append(ScalarColumns(f"train/loss{t}", steps, walls, values))
        events = []
        if seq % 25 == 1:  # as the demo: a gradient histogram every 25 steps
            events.append(
                summaries.histogram_event("grads/w", rng.normal(0, 0.01, 256), step, walls[-1], 10)
            )
        out.append(Batch("bench", seq, "bench", scalars, events))
        step += points
    return out


class _GcTimer:
    """CPU seconds spent in the garbage collector (every generation, any thread) while open."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started: dict[int, float] = {}

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started[threading.get_ident()] = time.thread_time()
        else:
            began = self._started.pop(threading.get_ident(), None)
            if began is not None:
                self.seconds += time.thread_time() - began
                self.collections += 1

    def __enter__(self) -> _GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class _TaskClock(trio.abc.Instrument):
    """The event loop thread's CPU per trio task (each step timed with ``time.thread_time``),
    and the ingest steps' CPU by how many ingest steps came since the detectors' last round
    step (0-2, 3-29, 30 or more): where the loop's extra with the detectors on goes. Each step
    costs two clock reads (about 1 µs on the development machine), in both modes alike."""

    #: Bounds of the "ingest steps since a round" bins (the last bin: the rest, and "off").
    BINS = (3, 30)

    def __init__(self) -> None:
        self.on = False
        self.cpu: dict[str, float] = {}
        self.steps: dict[str, int] = {}
        self.after_round = [[0.0, 0] for _ in range(len(self.BINS) + 1)]
        self._since = 1 << 30
        self._began = 0.0

    def start(self) -> None:
        """Count from now on (called from within a task's step: that step counts from here)."""
        self._began = time.thread_time()
        self.on = True

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._began = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if not self.on:
            return
        spent = time.thread_time() - self._began
        name = task.name.rsplit(".", 1)[-1]
        self.cpu[name] = self.cpu.get(name, 0.0) + spent
        self.steps[name] = self.steps.get(name, 0) + 1
        if name == "_detect":
            self._since = 0
        elif name == "_ingest":
            b = sum(self._since >= bound for bound in self.BINS)
            self.after_round[b][0] += spent
            self.after_round[b][1] += 1
            self._since += 1


def _usage() -> dict[str, float]:
    """This process's CPU seconds, user and system (every thread), the calling thread's (the
    event loop's), minor page faults and context switches, now."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    loop = resource.getrusage(resource.RUSAGE_THREAD)
    return {
        "user": me.ru_utime,
        "system": me.ru_stime,
        "loop": loop.ru_utime + loop.ru_stime,
        "faults": me.ru_minflt,
        "switches": me.ru_nvcsw + me.ru_nivcsw,
    }


async def _ingest(
    logdir: Path, batches: list[Batch], alerts: bool, rate: float = 0.0, tasks: bool = False
) -> dict:
    """Ingest ``batches`` into a fresh broker (``rate``: paced to that many events a second,
    else as fast as it takes them), let the detectors judge all they queued, then close the
    broker (its last flush and fsync). Returns the wall seconds until every batch was written
    (the rate's figure), and over the whole run through the close: the process's CPU seconds
    (user and system, every thread), the event loop's thread's, the garbage collector's, minor
    page faults, context switches, and the detectors' statistics.

    CPU is taken through the close so that every run's window holds the same work, all of its
    data written, flushed and fsynced, whatever its length (the fsync itself costs the process
    next to nothing: the kernel writes the pages back on its own time). ``tasks``: also the
    loop's CPU per task (:class:`_TaskClock`).
    """
    broker = Broker(logdir)
    engine = AlertEngine() if alerts else None
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        if engine is not None:
            await nursery.start(engine.run, broker)
        gc_timer = _GcTimer().__enter__()
        clock = _TaskClock() if tasks else None
        if clock is not None:
            trio.lowlevel.add_instrument(clock)
            clock.start()
        before = _usage()
        started = time.perf_counter()
        seq = 0
        sent = 0
        began = trio.current_time()
        for batch in batches:
            if rate:
                # Paced: persistence then writes what the same interval brought in both modes,
                # so its cost per flush weighs alike on each event.
                await trio.sleep_until(began + sent / rate)
                sent += batch.count()
            seq = await broker.ingest(batch)
        await broker.wait_written(seq)
        elapsed = time.perf_counter() - started
        if engine is not None:
            # Let the detectors judge what is queued (ingest never waits for them, but their
            # CPU time counts): every batch counted observed (once judged) or dropped.
            with trio.move_on_after(30):
                while (  # noqa: ASYNC110 (counters, no event)
                    engine.statistics().queue_depth
                    or engine.statistics().observed + engine.statistics().dropped < len(batches)
                ):
                    await trio.sleep(0.005)
        stats = engine.statistics().__dict__ if engine is not None else {}
        broker.close()
        await broker.wait_closed()
        after = _usage()
        if clock is not None:
            clock.on = False
        gc_timer.__exit__()
        nursery.cancel_scope.cancel()
    out = {k: after[k] - before[k] for k in after}
    out.update(elapsed=elapsed, gc=gc_timer.seconds, stats=stats)
    if clock is not None:
        out["tasks"] = {"cpu": clock.cpu, "steps": clock.steps, "after_round": clock.after_round}
    return out


#: (points per tag and batch, batches per round): a slow writer's round, a fast one's, served
#: 1,024-point batches (the served phase's rate per run in a 50 ms and a 0.1 s round), a fast
#: writer's large batches.
DETECTOR_CASES = ((30, 4), (30, 600), (1024, 6), (1024, 12), (4096, 12))


def _take(engine: AlertEngine) -> object:
    """What a round takes from ``engine``'s queue (also for a ``--tree`` whose engine queued
    batches in a deque, before it grouped them as they came)."""
    if hasattr(engine, "_take"):
        taken = engine._take()
        return taken[0] if isinstance(taken, tuple) else taken  # (pending, batches) since h-alerts
    items, engine._queue = engine._queue, type(engine._queue)()
    engine._depth = engine._points = 0
    return items


def phase_detectors(args: argparse.Namespace, results: dict) -> None:
    from vdl_stream.telemetry import legacy_view

    for points, per_round in DETECTOR_CASES:
        # The first round (each tag's state set up, the smoothing's constants computed) is not
        # counted: a run pays it once.
        rounds = 1 + max(20, 200_000 // (points * per_round))
        batches = make_batches(per_round * rounds, args.tags, points)
        views = [legacy_view(b.scalars, b.events) for b in batches]
        # The broker counts each batch for its statistics and hands observe() that count (a
        # --tree from before it took one counts the columns itself).
        counted = "points" in inspect.signature(AlertEngine.observe).parameters
        counts = [b.count() for b in batches]
        events = sum(b.count() for b in batches[per_round:])
        runs = []
        for _ in range(args.repeat):
            engine = AlertEngine()
            observe = judge = 0.0
            for r in range(rounds):
                cut = slice(r * per_round, (r + 1) * per_round)
                t0 = time.thread_time()
                if counted:
                    for batch, view, n in zip(batches[cut], views[cut], counts[cut], strict=True):
                        engine.observe(batch.run, *view, points=n)
                else:
                    for batch, view in zip(batches[cut], views[cut], strict=True):
                        engine.observe(batch.run, *view)
                t1 = time.thread_time()
                engine._round(_take(engine))
                if r:
                    judge += time.thread_time() - t1
                    observe += t1 - t0
            runs.append((observe / events * 1e9, judge / events * 1e9))
        obs = statistics.median(r[0] for r in runs)
        rnd = statistics.median(r[1] for r in runs)
        results[f"detectors_{points}x{per_round}"] = {
            "points_per_batch": points * args.tags,
            "batches_per_round": per_round,
            "observe_cpu_ns_per_event": round(obs, 2),
            "round_cpu_ns_per_event": round(rnd, 2),
            "load": round(os.getloadavg()[0], 1),
        }
        print(
            f"detectors alone, {args.tags} tags x {points} points a batch, {per_round} batches a "
            f"round, median of {args.repeat}: observe {obs:.1f} ns an event, rounds "
            f"{rnd:.1f} ns, together {obs + rnd:.1f} ns (load average "
            f"{os.getloadavg()[0]:.1f})",
            flush=True,
        )


def _spread(values: list[float]) -> str:
    """The median of ``values`` with their quartiles and extremes, as printed by the verdicts."""
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return (
        f"{statistics.median(values):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}, range "
        f"{min(values):.3f}-{max(values):.3f}, {len(values)} pairs)"
    )


def _summed_stats(parts: list[dict]) -> dict:
    """The detectors' statistics of a pair's runs in one mode: counts summed, the rest (peaks,
    a run's own figures) as the last run had them."""
    out = dict(parts[-1])
    for key in ("observed", "dropped", "dropped_points", "raised", "suppressed", "failed"):
        if key in out:
            out[key] = sum(p.get(key, 0) for p in parts)
    if "cpu_seconds" in out:
        out["cpu_seconds"] = sum(p.get("cpu_seconds", 0.0) for p in parts)
    if "queue_peak" in out:
        out["queue_peak"] = max(p.get("queue_peak", 0) for p in parts)
    return out


def phase_throughput(args: argparse.Namespace, results: dict) -> None:
    for label, points, count in (
        ("large", 4096, args.batches),
        ("small", 30, args.batches * 20),
    ):
        if label not in args.paths:
            continue
        batches = make_batches(count, args.tags, points)
        events = sum(b.count() for b in batches)
        # The input (40,000 small batches: some 100,000 objects) is not the broker's: a full
        # collection traversed it all (45 ms, up to 50 ns an event of a small-batch run),
        # landing in one run or another as the collector's counters happened to cross.
        # Frozen, the collector sees only what the runs themselves make, as in a server.
        gc.collect()
        gc.freeze()
        load_start = os.getloadavg()[0]
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        # (CPU ratio, wall ratio, the loop's thread's, the other threads') on/off of each pair
        pairs: list[tuple[float, float, float, float]] = []
        slices = args.slices
        cuts = [count * j // slices for j in range(slices + 1)]
        for i in range(args.repeat):
            # Pairs, each mode once, alternating which goes first (off-on, on-off, ...): a load that drifts
            # over the runs weighs on both alike, and each pair's ratio compares runs taken
            # seconds apart. With --slices K a pair's batches go in K consecutive parts, each
            # ingested off and on in turn (the order alternating from part to part), and the
            # pair's ratio is that of its CPU summed per mode: the same events per mode, with
            # off and on K times closer in time.
            parts: dict[str, list[dict]] = {"off": [], "on": []}
            for j in range(slices):
                chunk = batches[cuts[j] : cuts[j + 1]]
                for mode in ("off", "on") if (i * slices + j) % 2 == 0 else ("on", "off"):
                    logdir = Path(tempfile.mkdtemp(prefix="vdl-bench-alerts-"))
                    gc.collect()  # the previous run's garbage, outside the measured window
                    try:
                        on = mode == "on" and not args.null
                        parts[mode].append(
                            trio.run(_ingest, logdir, chunk, on, args.rate, args.tasks)
                        )
                    finally:
                        shutil.rmtree(logdir, ignore_errors=True)
            pair = {}
            for mode, done in parts.items():
                r = {k: sum(p[k] for p in done) for k in done[0] if k not in ("stats", "tasks")}
                if args.tasks:
                    r["tasks"] = [p["tasks"] for p in done]
                r["stats"] = _summed_stats([p["stats"] for p in done])
                r["cpu"] = r["user"] + r["system"]
                runs[mode].append(r)
                pair[mode] = r
            pairs.append(
                (
                    pair["off"]["cpu"] / pair["on"]["cpu"],
                    pair["off"]["elapsed"] / pair["on"]["elapsed"],
                    # The event loop's thread alone (where ingest, observe and the rounds run)
                    # and every other thread (the persist thread's writes): the process's ratio
                    # is the target, these say which side of it moved.
                    pair["off"]["loop"] / pair["on"]["loop"],
                    (pair["off"]["cpu"] - pair["off"]["loop"])
                    / (pair["on"]["cpu"] - pair["on"]["loop"]),
                )
            )
        load_end = os.getloadavg()[0]
        gc.unfreeze()

        def per_event(mode: str, key: str, runs: dict = runs, events: int = events) -> float:
            return statistics.median(r[key] for r in runs[mode]) / events * 1e9

        cpu_ratio = statistics.median(p[0] for p in pairs)
        wall_ratio = statistics.median(p[1] for p in pairs)
        own = statistics.median(r["stats"].get("cpu_seconds", 0) for r in runs["on"]) / events * 1e9
        stats = runs["on"][-1]["stats"]
        dropped = [r["stats"].get("dropped") for r in runs["on"]]
        keys = ("cpu", "user", "system", "loop", "gc")
        med = {m: {k: per_event(m, k) for k in keys} for m in runs}
        for m in runs:
            med[m]["faults"] = statistics.median(r["faults"] for r in runs[m]) / count
            med[m]["switches"] = statistics.median(r["switches"] for r in runs[m]) / count
            med[m]["events_per_s"] = events / statistics.median(r["elapsed"] for r in runs[m])
        off, on = med["off"], med["on"]
        load = max(load_start, load_end)
        results[f"throughput_{label}"] = {
            "points_per_batch": points * args.tags,
            "batches": count,
            "pairs": args.repeat,
            "slices": args.slices,
            "cpu_ratio_on_off": round(cpu_ratio, 3),
            "cpu_ratio_pairs": [round(p[0], 3) for p in pairs],
            "ratio_on_off": round(wall_ratio, 3),
            "loop_ratio_pairs": [round(p[2], 3) for p in pairs],
            "other_threads_ratio_pairs": [round(p[3], 3) for p in pairs],
            "wall_ratio_pairs": [round(p[1], 3) for p in pairs],
            "median_off": {k: round(v, 2) for k, v in off.items()},
            "median_on": {k: round(v, 2) for k, v in on.items()},
            "detector_cpu_ns_per_event": round(own, 2),
            "dropped_per_run": dropped,
            "target_holds": cpu_ratio >= 1 - TARGET_LOSS,
            "paced_events_per_s": args.rate or None,
            "load_start": round(load_start, 2),
            "load_end": round(load_end, 2),
            "detector_stats": stats,
        }
        paced = f"paced to {args.rate:,.0f} events/s, " if args.rate else ""
        if args.slices > 1:
            paced += f"each pair in {args.slices} parts alternated, "
        if args.null:
            paced += "NULL RUN (detectors off in both halves of each pair: the bench's noise), "
        print(
            f"ingest in-process, {label} batches ({args.tags} tags x {points} points, {count} "
            f"batches), {paced}{args.repeat} pairs of runs off/on (load average {load_start:.2f} "
            f"at the start, {load_end:.2f} at the end):\n"
            f"  events/s until written, median off {off['events_per_s']:,.0f}, on "
            f"{on['events_per_s']:,.0f}\n"
            f"  CPU per event through the close, median off {off['cpu']:.1f} ns, on "
            f"{on['cpu']:.1f} ns ({on['cpu'] - off['cpu']:+.1f} ns; the detectors' own "
            f"{own:.1f} ns); dropped by the detectors per run {dropped}\n"
            f"    user off {off['user']:.1f}, on {on['user']:.1f} ns; system off "
            f"{off['system']:.1f}, on {on['system']:.1f} ns; the event loop's thread off "
            f"{off['loop']:.1f}, on {on['loop']:.1f} ns; garbage collector off {off['gc']:.2f}, "
            f"on {on['gc']:.2f} ns\n"
            f"    minor faults per batch off {off['faults']:.1f}, on {on['faults']:.1f}; context "
            f"switches per batch off {off['switches']:.2f}, on {on['switches']:.2f}\n"
            f"  events per CPU second on/off, per pair: {_spread([p[0] for p in pairs])}\n"
            f"    the event loop's thread alone: {_spread([p[2] for p in pairs])}\n"
            f"    the other threads (persistence): {_spread([p[3] for p in pairs])}\n"
            f"  wall clock on/off, per pair: {_spread([p[1] for p in pairs])}\n"
            f"  verdict: {_verdict([p[0] for p in pairs], wall_ratio, load)}",
            flush=True,
        )
        if args.tasks:
            results[f"throughput_{label}"]["tasks"] = _print_tasks(runs, events)


def _print_tasks(runs: dict[str, list[dict]], events: int) -> dict:
    """Print (and return) the event loop's CPU per task, ns an event, median per mode over the
    runs (``--tasks``), the rest of the loop's thread (the scheduler, I/O waits, the
    collector between steps), and the ingest steps' µs a batch by ingest steps since a round."""
    out: dict[str, dict] = {}
    for mode, rs in runs.items():
        cpu: dict[str, list[float]] = {}
        bins: list[list[float]] = [[0.0, 0] for _ in range(len(_TaskClock.BINS) + 1)]
        for r in rs:
            totals: dict[str, float] = {}
            for part in r["tasks"]:
                for name, spent in part["cpu"].items():
                    totals[name] = totals.get(name, 0.0) + spent
                for b, (spent, n) in enumerate(part["after_round"]):
                    bins[b][0] += spent
                    bins[b][1] += n
            totals["(rest of the loop's thread)"] = r["loop"] - sum(totals.values())
            for name, spent in totals.items():
                cpu.setdefault(name, []).append(spent)
        per = {k: statistics.median(v) / events * 1e9 for k, v in sorted(cpu.items())}
        after = [round(t / n * 1e6, 1) if n else None for t, n in bins]
        out[mode] = {"loop_ns_per_event": per, "ingest_us_per_batch_after_round": after}
        print(
            f"  the loop's CPU per task, {mode}, ns an event: "
            + ", ".join(f"{k} {v:.1f}" for k, v in per.items())
            + f"; ingest steps, µs a batch, 0-2 / 3-29 / 30+ steps after a round: {after}",
            flush=True,
        )
    return out


def _noisy_batch(
    writer: str, seq: int, run: str, tags: list[str], points: int, wall: float | None = None
) -> bytes:
    """broker_clients.make_batch with loss-like values (a decay with multiplicative noise) in
    place of the step numbers: a steadily rising series is a diverging loss, and would have the
    detectors fire (and be rate limited) on every round, which is not what a normal run costs."""
    steps = np.arange((seq - 1) * points, seq * points, dtype=np.int64)
    walls = np.full(points, time.time() if wall is None else wall)
    rng = np.random.default_rng(seq)
    values = np.exp(-steps / 5e5) * np.exp(rng.normal(0, 0.3, points))
    columns = [ScalarColumns(tag, steps, walls, values * (1 + i)) for i, tag in enumerate(tags)]
    return codec.encode_batch(Batch(writer, seq, run, columns))


def _cpu(proc: psutil.Process) -> tuple[float, float]:
    """CPU seconds of ``proc``: all its threads, and its main thread (the event loop)."""
    t = proc.cpu_times()
    main = next((x for x in proc.threads() if x.id == proc.pid), None)
    return t.user + t.system, (main.user_time + main.system_time) if main else float("nan")


def _served_once(alerts: bool, points: int, args: argparse.Namespace, workdir: Path) -> dict:
    """One served run: a ``vdl-stream serve`` (detectors on, or ``--alerts off``) and 4 writers
    in this process for ``--seconds``; rates, and the CPU time of both processes over the run."""
    logdir = Path(tempfile.mkdtemp(prefix="logs-", dir=workdir))
    extra = () if alerts else ("--alerts", "off")
    server = ServeProcess(logdir, workdir / "serve.err", *extra, tree=TREE)
    tags = [f"train/loss{i}" for i in range(args.tags)]
    writers = [WriterResult(f"w{i}", f"ingest/rank{i}") for i in range(4)]
    proc = psutil.Process(server.pid)
    try:
        (cpu0, main0), writer0 = _cpu(proc), time.process_time()
        # Paced (--served-rate): both modes carry the same rate, so fixed costs per second
        # (timers, fsyncs, the follower's listing) weigh the same on each event in both.
        pace = args.served_rate / (len(writers) * len(tags) * points) if args.served_rate else None
        trio.run(
            partial(
                stream_together, server.ws, writers, tags=tags, points=points,
                seconds=args.seconds, window=8, batches_per_s=pace,
            )
        )  # fmt: skip
        (cpu1, main1), writer1 = _cpu(proc), time.process_time()
        stats = server.stats()
    finally:
        server.stop()
        shutil.rmtree(logdir, ignore_errors=True)
    acked = sum(min(w.acked_seq, w.sent_batches) for w in writers) * len(tags) * points
    span = max(w.last_ack for w in writers) - min(w.first_send for w in writers)
    errors = [w.error for w in writers if w.error]
    ns = 1e9 / acked if acked else float("nan")
    return {
        "events_per_s": acked / span,
        "server_cpu_ns_per_event": (cpu1 - cpu0) * ns,
        "server_main_cpu_ns_per_event": (main1 - main0) * ns,
        "writer_cpu_ns_per_event": (writer1 - writer0) * ns,
        "load": os.getloadavg()[0],
        "alerts": stats.get("alerts"),
        "errors": errors,
    }


def _verdict(cpu_ratios: list[float], wall_ratio: float, load: float) -> str:
    """The target's verdict on the median of the pairs' "events per CPU second" ratios, which a
    load-bound machine disturbs least (a core's worth of ingest, detectors on over off), and
    whether their quartiles agree with it; the wall-clock ratio is printed beside it, and is
    only meaningful on a machine with a core to spare (load below cores)."""
    target = 1 - TARGET_LOSS
    cpu_ratio = statistics.median(cpu_ratios)
    held = "HOLDS" if cpu_ratio >= target else "NOT MET"
    if len(cpu_ratios) > 1:
        q = statistics.quantiles(cpu_ratios, n=4, method="inclusive")
        if q[0] < target <= q[2]:
            held += " (undecided: the quartiles of the pairs straddle the target)"
    cores = os.cpu_count() or 1
    wall = "holds" if wall_ratio >= target else "not met"
    trust = "quiet machine" if load < cores else f"load {load:.1f} on {cores} cores: noise"
    return (
        f"target (detectors on within {TARGET_LOSS:.0%} of off) {held}: events per CPU second "
        f"on/off {cpu_ratio:.3f} (>= {target:.2f}); wall clock on/off {wall_ratio:.3f}, {wall} "
        f"({trust})"
    )


def phase_served(args: argparse.Namespace, results: dict) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="vdl-bench-alerts-served-"))
    broker_clients.make_batch = _noisy_batch
    keys = (
        "events_per_s",
        "server_cpu_ns_per_event",
        "server_main_cpu_ns_per_event",
        "writer_cpu_ns_per_event",
        "load",
    )
    try:
        for points in args.served_points:
            runs: dict[str, list[dict]] = {"off": [], "on": []}
            load_start = os.getloadavg()[0]
            for i in range(args.repeat):
                # Pairs, alternating which mode goes first, so a load that changes over the
                # runs weighs on both alike; each pair's ratio compares runs seconds apart.
                for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                    r = _served_once(mode == "on", points, args, workdir)
                    if r["errors"]:
                        raise RuntimeError(f"writers failed: {r['errors']}")
                    runs[mode].append(r)
            load_end = os.getloadavg()[0]
            pair_cpu = [
                a["server_cpu_ns_per_event"] / b["server_cpu_ns_per_event"]
                for a, b in zip(runs["off"], runs["on"], strict=True)
            ]
            pair_wall = [
                b["events_per_s"] / a["events_per_s"]
                for a, b in zip(runs["off"], runs["on"], strict=True)
            ]
            med = {
                mode: {k: statistics.median(r[k] for r in rs) for k in keys}
                for mode, rs in runs.items()
            }
            off, on = med["off"], med["on"]
            # The detectors' own CPU per event, over the runs with them (their statistics).
            own = [
                r["alerts"]["cpu_seconds"] / (r["alerts"]["observed"] * points * args.tags) * 1e9
                for r in runs["on"]
                if r["alerts"] and r["alerts"].get("observed")
            ]
            detector_ns = statistics.median(own) if own else 0.0
            wall_ratio = statistics.median(pair_wall)
            cpu_ratio = statistics.median(pair_cpu)
            both_ratio = (off["server_cpu_ns_per_event"] + off["writer_cpu_ns_per_event"]) / (
                on["server_cpu_ns_per_event"] + on["writer_cpu_ns_per_event"]
            )
            extra = on["server_cpu_ns_per_event"] - off["server_cpu_ns_per_event"]
            results[f"served_{points}"] = {
                "points_per_batch": points * args.tags,
                "paced_events_per_s": args.served_rate or None,
                "runs_per_mode": args.repeat,
                "median_off": {k: round(v, 1) for k, v in off.items()},
                "median_on": {k: round(v, 1) for k, v in on.items()},
                "detector_cpu_ns_per_event": round(detector_ns, 1),
                "server_extra_cpu_ns_per_event": round(extra, 1),
                "ratio_on_off": round(wall_ratio, 3),
                "cpu_ratio_on_off": round(cpu_ratio, 3),
                "cpu_ratio_pairs": [round(x, 3) for x in pair_cpu],
                "wall_ratio_pairs": [round(x, 3) for x in pair_wall],
                "load_start": round(load_start, 2),
                "load_end": round(load_end, 2),
                "cpu_ratio_on_off_with_writers": round(both_ratio, 3),
                "target_holds": cpu_ratio >= 1 - TARGET_LOSS,
                "all": {
                    mode: [{k: round(r[k], 1) for k in keys} for r in rs]
                    for mode, rs in runs.items()
                },
                "detector_stats": runs["on"][-1]["alerts"],
            }
            paced = f"paced to {args.served_rate:,.0f} events/s, " if args.served_rate else ""
            print(
                f"serve, {args.tags} tags x {points} points per batch, {paced}{args.repeat} pairs "
                f"of runs off/on (load average {load_start:.2f} at the start, {load_end:.2f} at "
                f"the end):\n"
                f"  events/s off {off['events_per_s']:,.0f}, on {on['events_per_s']:,.0f}\n"
                f"  server CPU per event off {off['server_cpu_ns_per_event']:.0f} ns, on "
                f"{on['server_cpu_ns_per_event']:.0f} ns ({extra:+.0f} ns; the detectors' own "
                f"{detector_ns:.0f} ns); its event loop off "
                f"{off['server_main_cpu_ns_per_event']:.0f}, on "
                f"{on['server_main_cpu_ns_per_event']:.0f} ns\n"
                f"  writers' CPU per event off {off['writer_cpu_ns_per_event']:.0f} ns, on "
                f"{on['writer_cpu_ns_per_event']:.0f} ns; events per CPU second on/off, server "
                f"{cpu_ratio:.3f}, server and writers {both_ratio:.3f} (medians)\n"
                f"  events per server CPU second on/off, per pair: {_spread(pair_cpu)}\n"
                f"  wall clock on/off, per pair: {_spread(pair_wall)}\n"
                f"  verdict: {_verdict(pair_cpu, wall_ratio, max(load_start, load_end))}",
                flush=True,
            )
    finally:
        kill_started()
        shutil.rmtree(workdir, ignore_errors=True)


def phase_latency(args: argparse.Namespace, results: dict) -> None:
    from tests.test_alerts import _live

    workdir = Path(tempfile.mkdtemp(prefix="vdl-bench-alerts-latency-"))
    server = ServeProcess(workdir / "logs", workdir / "serve.err", tree=TREE)
    out = {}
    try:
        for fault, rules in (
            ("lr", {"spike", "divergence"}),
            ("nan", {"nan"}),
            ("grad", {"gradient_explode"}),
        ):
            for i in range(args.latency_runs):
                target = SimpleNamespace(ws_url=server.ws)
                proc, got = trio.run(_live, target, f"lat-{fault}-{i}", fault, rules)
                proc.wait(60)
                for received, alert in got:
                    if alert["rule"] in rules:
                        out.setdefault(f"{fault}:{alert['rule']}", []).append(
                            received - alert["wall"]
                        )
    finally:
        server.stop()
        kill_started()
        shutil.rmtree(workdir, ignore_errors=True)
    results["latency_s"] = {
        k: {"median": round(statistics.median(v), 3), "max": round(max(v), 3), "n": len(v)}
        for k, v in out.items()
    }
    for k, v in out.items():
        print(
            f"latency {k}: median {statistics.median(v) * 1e3:.0f} ms, max {max(v) * 1e3:.0f} ms "
            f"over {len(v)} runs",
            flush=True,
        )


def _alerts(steps: int, seed: int, start: int = 0, **faults: object) -> list[dict]:
    engine = AlertEngine()
    sink = alert_faults.Collect(engine, start=start)
    alert_faults.train(sink, steps, seed=seed, **faults)
    sink.flush()
    return [event for _, event in engine.pending()]


def phase_false_positives(args: argparse.Namespace, results: dict) -> None:
    false = []
    joined = []  # the same runs seen from half-way, as by a server started next to the job
    caught = 0
    started = time.perf_counter()
    for seed in range(args.runs):
        alerts = _alerts(args.steps, seed)
        false.extend((seed, a["rule"], a["series"], a["step"]) for a in alerts)
        late = _alerts(args.steps, seed, start=args.steps // 2)
        joined.extend((seed, a["rule"], a["series"], a["step"]) for a in late)
        faulty = _alerts(args.steps, seed, lr_boost_at=min(2000, args.steps // 2))
        caught += any(a["rule"] in ("spike", "divergence", "nan") for a in faulty)
        print(
            f"  seed {seed}: {len(alerts)} alerts normal, {len(late)} seen from step "
            f"{args.steps // 2}, {len(faulty)} with lr x100",
            flush=True,
        )
    results["false_positives"] = {
        "runs": args.runs,
        "steps": args.steps,
        "alerts": len(false),
        "which": false,
        "alerts_joined_half_way": len(joined),
        "which_joined": joined,
        "faulty_runs_caught": caught,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(
        f"false positives: {len(false)} alerts over {args.runs} normal demo runs of {args.steps} "
        f"steps, {len(joined)} over the same runs seen from half-way; lr x100 caught in "
        f"{caught}/{args.runs} runs",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument(
        "--repeat", type=int, default=5, help="pairs of runs, off and on (default: 5)"
    )
    parser.add_argument(
        "--null",
        action="store_true",
        help="throughput phase: run 'on' with the detectors off too, so that the pairs' ratios "
        "show the bench's own noise (an A/A test) on this machine at this load",
    )
    parser.add_argument(
        "--tasks",
        action="store_true",
        help="throughput phase: also time the event loop's CPU per trio task (two clock reads "
        "a step, in both modes) and the ingest steps right after a detector round",
    )
    parser.add_argument(
        "--slices",
        type=int,
        default=1,
        help="throughput phase: ingest each pair's batches in this many consecutive parts, each "
        "off and on in turn, the pair's ratio taken over its summed CPU (default: 1, one run "
        "per mode and pair)",
    )
    parser.add_argument(
        "--paths",
        nargs="*",
        default=["large", "small"],
        choices=("large", "small"),
        help="throughput phase: which batch sizes (default: large small)",
    )
    parser.add_argument("--batches", type=int, default=400, help="large batches (default: 400)")
    parser.add_argument("--tags", type=int, default=4, help="scalar tags per batch (default: 4)")
    parser.add_argument(
        "--served-points",
        type=int,
        nargs="*",
        default=[1024, 8],
        help="points per tag and batch in the served phase (default: 1024 8)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="served phase (default: 5)")
    parser.add_argument(
        "--served-rate",
        type=float,
        default=0.0,
        help="served phase: pace the writers to this many events/s in all (default: 0, as fast "
        "as acknowledgements allow); at a rate both modes sustain, CPU per event compares the "
        "work alone",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="throughput phase: pace ingest to this many events/s (default: 0, as fast as the "
        "broker takes them); at a rate both modes sustain, CPU per event compares the work alone",
    )
    parser.add_argument("--latency-runs", type=int, default=5, help="per fault (default: 5)")
    parser.add_argument("--runs", type=int, default=10, help="demo runs (default: 10)")
    parser.add_argument("--steps", type=int, default=5000, help="steps per run (default: 5000)")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--skip", nargs="*", default=[], choices=PHASES, help="phases to leave out")
    parser.add_argument(
        "--tree",
        help="measure the code of this checkout (e.g. a worktree of main, for before and after "
        "in the same moment); this one by default",
    )
    args = parser.parse_args()
    if args.slices < 1:
        parser.error(f"--slices must be at least 1, got {args.slices}")
    print(
        f"measuring {Path(codec.__file__).resolve().parent.parent}; load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if args.quick:
        args.batches, args.runs, args.steps, args.seconds = 100, 2, 1500, 2.0
        args.latency_runs = 1
    results: dict = {"args": vars(args)}
    if "detectors" not in args.skip:
        phase_detectors(args, results)
    if "throughput" not in args.skip:
        phase_throughput(args, results)
    if "served" not in args.skip:
        phase_served(args, results)
    if "latency" not in args.skip:
        phase_latency(args, results)
    if "false-positives" not in args.skip:
        phase_false_positives(args, results)
    verdicts = {k: v["target_holds"] for k, v in results.items() if "target_holds" in v}
    if verdicts:
        missed = [k for k, held in verdicts.items() if not held]
        print(
            "verdict: the 10% target "
            + (
                f"holds on every path measured ({', '.join(verdicts)})"
                if not missed
                else f"is NOT met on {', '.join(missed)}"
            )
            + " (events per CPU second, detectors on over off)",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
