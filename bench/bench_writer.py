"""Writer hot-path benchmark: vdl-stream against tensorboardX on the same events, in one run.

For each library (and a null writer whose calls do nothing: the loop's own cost), in a fresh
subprocess:
- add_scalar, loop wall time: 200,000 calls over 10 tags, the whole loop's wall time divided by
  the calls; it includes the background thread taking the GIL while the loop runs, which is what a
  training loop pays (also the median of 1,000-call chunks, which leaves those hand-offs out);
  and the CPU time of all threads over the loop (``*_loop_cpu_us``): other processes on the
  machine do not change it, and where the threads take turns at the GIL it is what the loop wall
  time comes to on a quiet machine;
- total process CPU per scalar event, from opening the writer through close (all threads:
  background encoding, persistence, close); the library's import, paid once per process
  whatever the number of events, is measured apart (``import_cpu_ms``), for every library alike;
- add_histogram (2,000 histograms of 10,000 float32; ``--histogram-size`` for another size):
  loop wall time and process CPU per call, and the page faults per call over the loop (all
  threads; fresh memory, paid in system time whichever thread faults it in; a count, so other
  processes on the machine do not change it), and the CPU time of each role's threads from the
  loop's start through ``flush()`` (``add_histogram_{main,writer,other}_cpu_us``: the training
  thread, the writer's background thread, the rest). With ``--histogram-rounds R`` the writer logs R
  bursts of them, each followed by ``flush()``, and only the last is measured: a training loop
  logs its histograms every so many steps, and from the second time on, a writer that keeps its
  memory finds it warm (the first burst faults in fresh pages, docs/performance.md);
- bytes on disk per scalar event.

Besides, a "floor" writer that only does what any writer keeping the calls for a background
thread must do in the caller's thread (a dict lookup, the time and a list extend per scalar; a
copy per histogram): the least a hot path can cost on this interpreter.

Usage: python bench/bench_writer.py [--scalars N] [--histograms N] [--histogram-size N]
                                    [--histogram-rounds R] [--repeat R] [--before TREE]
       python bench/bench_writer.py --binning [--repeat R] [--before TREE]
       python bench/bench_writer.py --persist [--repeat R] [--before TREE]
       python bench/bench_writer.py --stages [--scalars N] [--histograms N] [--histogram-rounds R]
                                    [--repeat R] [--before TREE]
       python bench/bench_writer.py --binning-pairs TREE [--repeat R]
(the second: the histogram binning alone, CPU per histogram of 1k to 1M values; the third: the
in-process broker's persist path alone, thread CPU per binned histogram event; the fourth: where
vdl-stream's process CPU goes, stage by stage, for one burst of histograms and for the scalars;
the fifth: this tree's binning against TREE's in one process, in turn, trial by trial).

The ratio is tensorboardX / vdl-stream (higher is better for vdl-stream).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TAGS = [f"train/metric{i}" for i in range(10)]
CHUNK = 1000


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class NullWriter:
    """Calls that do nothing: what the loop itself costs."""

    def add_scalar(self, tag, value, step):
        pass

    def add_histogram(self, tag, values, step):
        pass

    def flush(self):
        pass

    def close(self):
        pass


class FloorWriter:
    """What any writer that keeps the calls for a background thread must do in the caller's
    thread, and nothing else: look the tag's buffer up, take the time, extend the buffer
    (scalars); copy the values (histograms). No checks, no background thread, nothing sent: the
    floor under vdl-stream's hot path on this interpreter."""

    def __init__(self) -> None:
        self._series: dict[str, list] = {}
        self._events: list = []

    def add_scalar(self, tag, value, step):
        try:
            extend = self._series[tag]
        except KeyError:
            extend = self._series[tag] = [].extend
        extend((step, value, _now()))

    def add_histogram(self, tag, values, step):
        self._events.append((tag, step, _now(), values.copy()))

    def flush(self):
        self._events.clear()  # what a background thread would have taken meanwhile

    def close(self):
        pass


_now = time.time


def load(lib: str) -> float:
    """Import what ``lib``'s writer needs; return the CPU seconds that took (paid once)."""
    cpu0 = time.process_time()
    if lib == "vdl-stream":
        # attach's own module (vdl_stream loads it lazily, at the first ``vdl_stream.attach``)
        # and the broker it starts in process: what ``from tensorboardX import SummaryWriter``
        # loads for tensorboardX, so that neither library's figure carries import time.
        import vdl_stream.broker  # noqa: F401
        from vdl_stream import attach  # noqa: F401
    elif lib == "tensorboardX":
        from tensorboardX import SummaryWriter  # noqa: F401
    # The imports leave the collector's counters near a full collection (338, 11, 9 after
    # vdl-stream's), which then runs within the first measured calls: 9 to 25 ms once per
    # process (h15-hist), not a cost per call. Collected here, for every library alike, it is
    # paid with the imports.
    gc.collect()
    return time.process_time() - cpu0


def open_writer(lib: str, logdir: Path):
    if lib in ("null", "floor"):
        (logdir / "bench").mkdir()
        return NullWriter() if lib == "null" else FloorWriter()
    if lib == "vdl-stream":
        import vdl_stream

        return vdl_stream.attach(logdir, run="bench", telemetry=False)
    from tensorboardX import SummaryWriter

    return SummaryWriter(str(logdir / "bench"))


def measure_scalars(lib: str, n: int, logdir: Path) -> dict:
    imported = load(lib)
    cpu0 = time.process_time()
    writer = open_writer(lib, logdir)
    add = writer.add_scalar
    chunks = []
    perf = time.perf_counter
    tags = TAGS
    loop_cpu0 = time.process_time()
    loop0 = perf()
    for start in range(0, n, CHUNK):
        t0 = perf()
        for i in range(start, start + CHUNK):
            add(tags[i % 10], i * 0.001, i // 10)
        chunks.append((perf() - t0) / CHUNK)
    loop = perf() - loop0
    loop_cpu = time.process_time() - loop_cpu0
    writer.close()
    cpu = time.process_time() - cpu0
    return {
        "add_scalar_loop_us": loop / n * 1e6,
        "add_scalar_loop_cpu_us": loop_cpu / n * 1e6,
        "add_scalar_median_us": statistics.median(chunks) * 1e6,
        "add_scalar_p99_us": sorted(chunks)[int(len(chunks) * 0.99)] * 1e6,
        "cpu_per_scalar_us": cpu / n * 1e6,
        "bytes_per_scalar": dir_bytes(logdir / "bench") / n,
        "import_cpu_ms": imported * 1e3,
    }


def measure_histograms(lib: str, n: int, logdir: Path, size: int, rounds: int = 1) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    data = [rng.normal(size=size).astype(np.float32) for _ in range(20)]
    load(lib)
    writer = open_writer(lib, logdir)
    for r in range(rounds - 1):  # earlier bursts, not measured (--histogram-rounds)
        for i in range(n):
            writer.add_histogram("weights", data[i % 20], r * n + i)
        writer.flush()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    threads0 = thread_cpu()
    cpu0 = time.process_time()
    loop0 = time.perf_counter()
    for i in range((rounds - 1) * n, rounds * n):
        writer.add_histogram("weights", data[i % 20], i)
    loop = time.perf_counter() - loop0
    loop_cpu = time.process_time() - cpu0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    writer.flush()  # before close, while the threads that did the work are still alive
    threads = thread_cpu()
    writer.close()
    return {
        "add_histogram_loop_us": loop / n * 1e6,
        "add_histogram_loop_cpu_us": loop_cpu / n * 1e6,
        "add_histogram_loop_faults": faults / n,
        "cpu_per_histogram_us": (time.process_time() - cpu0) / n * 1e6,
        **{
            f"add_histogram_{role}_cpu_us": (threads[role] - threads0.get(role, 0.0)) / n * 1e6
            for role in THREAD_ROLES
        },
    }


#: How ``thread_cpu`` groups a process's threads: the training loop's, the writer's background
#: thread (vdl-stream's is named so; tensorboardX's falls under "other"), and the rest (the
#: in-process broker's persist, fsync and compaction threads, tensorboardX's writer thread).
THREAD_ROLES = ("main", "writer", "other")


def thread_cpu() -> dict[str, float]:
    """CPU seconds each role's live threads have used (``THREAD_ROLES``; the thread's own
    clock, so other processes on the machine do not change it, as they do wall times)."""
    used = dict.fromkeys(THREAD_ROLES, 0.0)
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # ended meanwhile
            continue
        role = "main" if thread is main else "writer" if thread.name == "vdl-stream" else "other"
        used[role] += seconds
    return used


BINNING_SIZES = (100, 1_000, 10_000, 100_000, 1_000_000)
#: Histograms binned in one call of ``bin_histograms`` (the "together" column).
TOGETHER = 64


def measure_binning(lib: str) -> dict:
    """Process CPU (all threads) per histogram of float32 normal values into 10 bins, best of
    5 rounds: vdl-stream's ``bin_histogram`` (what the background thread runs per histogram),
    or, for "numpy", ``np.histogram`` with the sum and sum of squares a histogram records.
    Where the tree has ``bin_histograms`` (what the background thread runs per batch), also
    per histogram when ``TOGETHER`` of one size are binned in one call."""
    import numpy as np

    together = None
    if lib == "vdl-stream":
        from vdl_stream import summaries
        from vdl_stream.summaries import bin_histogram

        together = getattr(summaries, "bin_histograms", None)
    else:

        def bin_histogram(values, buckets):
            as_f8 = values.astype(np.float64)
            return np.histogram(as_f8, buckets), as_f8.sum(), np.dot(as_f8, as_f8)

    rng = np.random.default_rng(0)
    result = {}
    for size in BINNING_SIZES:
        values = rng.normal(size=size).astype(np.float32)
        reps = max(20, 2_000_000 // size)
        best = math.inf
        for _ in range(5):
            cpu0 = time.process_time()
            for _ in range(reps):
                bin_histogram(values, 10)
            best = min(best, (time.process_time() - cpu0) / reps)
        result[f"bin_{size}_us"] = best * 1e6
        if together is not None:
            jobs = [(values, 10)] * TOGETHER
            best = math.inf
            for _ in range(5):
                cpu0 = time.process_time()
                for _ in range(max(1, reps // TOGETHER)):
                    together(jobs)
                best = min(best, (time.process_time() - cpu0) / max(1, reps // TOGETHER))
            result[f"together_{size}_us"] = best / TOGETHER * 1e6
    return result


def measure_persist(size: int, events: int = 200, batches: int = 10, rounds: int = 6) -> dict:
    """The in-process broker's persist path alone: the thread CPU of ``Broker._persist`` per
    event, for batches of ``events`` binned histograms of ``size`` float32 values fed to a
    broker by ``ingest``, ``batches`` a round; the best and the median of ``rounds`` rounds
    (the persist thread's work without the writer's binning beside it)."""
    import numpy as np
    import trio

    from vdl_stream import broker as broker_module
    from vdl_stream.codec import Batch
    from vdl_stream.summaries import histogram_event

    used = [0.0]
    persist = broker_module.Broker._persist

    def timed(self, items):
        start = time.thread_time()
        try:
            return persist(self, items)
        finally:
            used[0] += time.thread_time() - start

    broker_module.Broker._persist = timed
    rng = np.random.default_rng(0)
    values = rng.normal(size=size).astype(np.float32)
    binned = [histogram_event("weights", values, i, 1.0e9 + i) for i in range(events)]
    per_round: list[float] = []

    async def run(logdir: Path) -> None:
        broker = broker_module.Broker(logdir)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            seq = 0
            for _ in range(rounds):
                used[0] = 0.0
                for _ in range(batches):
                    seq += 1
                    batch_events = [{**e, "step": seq * events + j} for j, e in enumerate(binned)]
                    await broker.wait_written(
                        await broker.ingest(Batch("w", seq, "bench", [], batch_events))
                    )
                per_round.append(used[0] / (batches * events))
            broker.close()
            await broker.wait_closed()

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run, Path(tmp))
    return {
        "persist_best_us": min(per_round) * 1e6,
        "persist_median_us": statistics.median(per_round) * 1e6,
    }


#: The stages ``measure_stages`` times: (module, class or None, function, label). Each is timed
#: on the CPU clock of the thread that runs it, per call of the loop; nested stages are inside
#: their callers' figures (the copy inside ``add_histogram``, the binning inside
#: ``_take_pending``). A stage a tree lacks is left out.
STAGES = (
    ("vdl_stream.writer", "Writer", "add_histogram", "training: add_histogram, whole"),
    ("vdl_stream.summaries", None, "histogram_call", "training: checks (histogram_call)"),
    ("vdl_stream.writer", "_SpareArrays", "copy", "training: the copy"),
    ("vdl_stream.writer", "Writer", "_add_event", "training: queueing (_add_event)"),
    ("vdl_stream.writer", "Writer", "_take_pending", "writer: a batch cut, whole"),
    ("vdl_stream.writer", "Writer", "_take_columns", "writer: scalar columns + frees"),
    ("vdl_stream.summaries", None, "bin_histograms", "writer: binning"),
    ("vdl_stream.writer", "_Pending", "put", "writer: pending queue"),
    ("vdl_stream.broker", "Broker", "_fan_out", "writer: broker fan-out"),
    ("vdl_stream.broker", "Broker", "_summarize", "writer: broker summaries"),
    ("vdl_stream.broker", "Broker", "_persist", "persist: _persist, whole"),
    ("recorder.writer", "RunWriter", "append_scalars", "persist: append_scalars"),
    ("recorder.writer", "RunWriter", "append_record", "persist: append_record"),
    ("recorder.writer", "RunWriter", "flush", "persist: recorder flush"),
    ("vdl_stream.writer", "Writer", "close", "close (training thread)"),
)


def measure_stages(what: str, n: int, size: int, rounds: int = 1) -> dict:
    """vdl-stream's process CPU per call, attach through close, split by stage (``STAGES``)
    and by thread role (``THREAD_ROLES``, through ``flush()``), for ``n`` histograms of
    ``size`` float32 (one burst; ``rounds`` bursts, each flushed, all measured) or ``n``
    scalars over 10 tags. The timers cost about 0.3 us
    a timed call: the per-call stages of a histogram (its four on the training thread and
    ``append_record``) carry that, the per-batch ones do not. Besides: the share of the calls
    whose histogram the training thread binned itself (``SPARE_BYTES`` of copies waiting), and
    the garbage collector's thread CPU by generation (``GC_LABELS``)."""
    import importlib
    from collections import defaultdict

    import numpy as np

    load("vdl-stream")
    used: dict[str, float] = defaultdict(float)
    clock = time.thread_time

    def timed(fn, label):
        def stage(*args, **kwargs):
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                used[label] += clock() - start

        return stage

    for module_name, owner_name, name, label in STAGES:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        fn = getattr(owner, name, None)
        if fn is not None:
            setattr(owner, name, timed(fn, label))
    # The histograms the training thread binned itself (the spare arrays full: a burst past
    # SPARE_BYTES of copies waiting), as a share of the calls: bin_histogram there is the loop's.
    summaries = importlib.import_module("vdl_stream.summaries")
    main_thread = threading.main_thread()
    bin_alone = summaries.bin_histogram

    def counted(*args, **kwargs):
        if threading.current_thread() is main_thread:
            used[IN_LOOP] += 1
        return bin_alone(*args, **kwargs)

    summaries.bin_histogram = counted
    gc.callbacks.append(gc_timer(used))
    rng = np.random.default_rng(0)
    data = [rng.normal(size=size).astype(np.float32) for _ in range(20)]
    with tempfile.TemporaryDirectory() as tmp:
        cpu0 = time.process_time()
        writer = open_writer("vdl-stream", Path(tmp))
        threads0 = thread_cpu()
        if what == "histograms":
            for i in range(n * rounds):
                writer.add_histogram("weights", data[i % 20], i)
                if i % n == n - 1:
                    writer.flush()
            n *= rounds
        else:
            add, tags = writer.add_scalar, TAGS
            for i in range(n):
                add(tags[i % 10], i * 0.001, i // 10)
        writer.flush()
        threads = thread_cpu()
        writer.close()
        cpu = time.process_time() - cpu0
    calls = used.pop(IN_LOOP, 0.0)
    return {
        "training: share of calls binned in the loop (%)": calls / n * 100,
        "process CPU, attach through close": cpu / n * 1e6,
        **{
            f"thread role: {r}": (threads[r] - threads0.get(r, 0.0)) / n * 1e6 for r in THREAD_ROLES
        },
        **{label: used[label] / n * 1e6 for *_, label in STAGES if label in used},
        **{label: used[label] / n * 1e6 for label in GC_LABELS},
    }


IN_LOOP = "binned in the loop"
#: The cyclic garbage collector's work, by generation, on whichever thread allocated when a
#: collection fell due (so inside the stages above, in any of them): a full collection
#: (generation 2) traverses every tracked object of the process, the imports' included.
GC_LABELS = tuple(f"gc: generation {g} collections, any thread" for g in range(3))


def gc_timer(used: dict[str, float]):
    """A ``gc.callbacks`` entry that adds each collection's thread CPU time to ``used``, under
    its generation's label in ``GC_LABELS``."""
    started: dict[int, float] = {}

    def callback(phase: str, info: dict) -> None:
        ident = threading.get_ident()
        if phase == "start":
            started[ident] = time.thread_time()
        elif ident in started:
            used[GC_LABELS[info["generation"]]] += time.thread_time() - started.pop(ident)

    return callback


def binning_pairs(before: str, trials: int, n: int = 400, size: int = 10_000) -> None:
    """Print the thread CPU per histogram of ``bin_histograms`` over ``n`` copies of ``size``
    float32 (cold: 64 MB are written between trials), this checkout's binning against the one
    of the tree ``before``, both in this process and in turn (the order swapped every trial),
    with each trial's ratio: one process, so a machine whose load moves figures by 2x between
    processes still compares the two codes within a few percent."""
    import importlib
    import shutil

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as tmp:
        # The before tree's package under another name, so that both import side by side.
        shutil.copytree(Path(before) / "vdl_stream", Path(tmp) / "vdl_stream_before")
        sys.path.insert(0, tmp)
        codes = {
            "before": importlib.import_module("vdl_stream_before.summaries"),
            "this": importlib.import_module("vdl_stream.summaries"),
        }
    rng = np.random.default_rng(0)
    source = [rng.normal(size=size).astype(np.float32) for _ in range(20)]
    copies = {name: [source[i % 20].copy() for i in range(n)] for name in codes}
    used: dict[str, list[float]] = {name: [] for name in codes}
    for trial in range(trials):
        for name in list(codes)[:: -1 if trial % 2 else 1]:
            np.ones(8 << 20).sum()  # 64 MB through the caches: the copies are cold, as in a writer
            jobs = [(values, 10) for values in copies[name]]
            start = time.thread_time()
            for first in range(0, n, 100):  # batches of 100, as the background thread bins them
                codes[name].bin_histograms(jobs[first : first + 100])
            used[name].append((time.thread_time() - start) / n * 1e6)
    ratios = [b / a for a, b in zip(used["before"], used["this"], strict=True)]
    print(
        f"bin_histograms, {n} cold copies of {size:,} float32 into 10 bins, thread CPU per "
        f"histogram, {trials} trials in turn; load average {os.getloadavg()[0]:.1f}"
    )
    for name in codes:
        print(
            f"{name:8} median {statistics.median(used[name]):6.1f} us, min {min(used[name]):6.1f}"
        )
    print(
        f"this / before: median {statistics.median(ratios):.3f}; trials "
        + ", ".join(f"{r:.2f}" for r in ratios)
    )


def child(lib: str, what: str, n: int, size: int, rounds: int = 1) -> None:
    if what in ("stages-histograms", "stages-scalars"):
        print(json.dumps(measure_stages(what.removeprefix("stages-"), n, size, rounds)))
        return
    if what == "binning":
        print(json.dumps(measure_binning(lib)))
        return
    if what == "persist":
        print(json.dumps(measure_persist(size)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        result = (
            measure_scalars(lib, n, logdir)
            if what == "scalars"
            else measure_histograms(lib, n, logdir, size, rounds)
        )
    print(json.dumps(result))


def run_child(
    lib: str, what: str, n: int, size: int, tree: str | None = None, rounds: int = 1
) -> dict:
    """Measure in a fresh process; ``tree``: import vdl_stream from that source tree (by
    default the one on ``PYTHONPATH``, else this script's own checkout, never whichever
    vdl_stream happens to be installed)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if tree is None and not env.get("PYTHONPATH"):
        tree = str(Path(__file__).resolve().parent.parent)
    if tree is not None:
        env["PYTHONPATH"] = tree
    out = subprocess.run(
        [sys.executable, __file__, "--child", lib, what, str(n), str(size), str(rounds)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scalars", type=int, default=200_000)
    parser.add_argument("--histograms", type=int, default=2_000)
    parser.add_argument(
        "--histogram-size", type=int, default=10_000, help="float32 values per histogram"
    )
    parser.add_argument(
        "--histogram-rounds",
        type=int,
        default=1,
        help="bursts of --histograms histograms per writer, each flushed; the last is measured "
        "(with --stages: all of them, the garbage collector's work over a longer run)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per library; medians reported")
    parser.add_argument(
        "--before",
        metavar="TREE",
        help="also measure vdl-stream imported from this source tree (e.g. a worktree of main), "
        "in turn with the others, so that before and after share the machine's moment",
    )
    parser.add_argument(
        "--binning",
        action="store_true",
        help="only the histogram binning: CPU per histogram of 1k to 1M float32 values, "
        "vdl-stream (and --before) against np.histogram",
    )
    parser.add_argument(
        "--persist",
        action="store_true",
        help="only the in-process broker's persist path: thread CPU of Broker._persist per "
        "binned histogram event, vdl-stream (and --before), processes in turn",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="only vdl-stream's process CPU split by stage and thread, for one burst of "
        "--histograms and for --scalars, vdl-stream (and --before), processes in turn",
    )
    parser.add_argument(
        "--binning-pairs",
        metavar="TREE",
        help="only the binning of cold 10,000-value histograms, this checkout's against TREE's "
        "in one process, in turn (--repeat trials, at least 2)",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # lib what n size [rounds]
        lib, what, n, size, *rounds = args.child
        child(lib, what, int(n), int(size), int(rounds[0]) if rounds else 1)
        return
    if args.histogram_rounds < 1:
        parser.error(f"--histogram-rounds must be at least 1, got {args.histogram_rounds}")
    if args.binning:
        binning(args.before, args.repeat)
        return
    if args.persist:
        persist(args.before, args.repeat, args.histogram_size)
        return
    if args.binning_pairs:
        binning_pairs(args.binning_pairs, max(2, args.repeat))
        return
    if args.stages:
        stages(
            args.before,
            args.repeat,
            args.histograms,
            args.histogram_size,
            args.scalars,
            args.histogram_rounds,
        )
        return
    # (column, library, source tree); each repeat runs every column once, in turn.
    columns = [("null", "null", None), ("floor", "floor", None), ("vdl-stream", "vdl-stream", None)]
    if args.before:
        columns.insert(1, ("before", "vdl-stream", args.before))
    columns.append(("tensorboardX", "tensorboardX", None))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in columns}
    for _ in range(args.repeat):
        for name, lib, tree in columns:
            runs[name].append(
                {
                    **run_child(lib, "scalars", args.scalars, 0, tree),
                    **run_child(
                        lib,
                        "histograms",
                        args.histograms,
                        args.histogram_size,
                        tree,
                        args.histogram_rounds,
                    ),
                }
            )
    results = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    ours, anchor = results["vdl-stream"], results["tensorboardX"]
    print(
        f"{args.scalars} scalars over {len(TAGS)} tags, {args.histograms} histograms of "
        f"{args.histogram_size:,} float32"
        + (f" (the last of {args.histogram_rounds} bursts)" if args.histogram_rounds > 1 else "")
        + "; "
        f"median of {args.repeat} runs each; load average {os.getloadavg()[0]:.1f}"
    )
    names = [name for name, _, _ in columns]
    print(f"{'metric':28}" + "".join(f"{name:>14}" for name in names) + f"{'ratio':>9}")
    for key in ours:
        ratio = anchor[key] / ours[key] if ours[key] else float("inf")
        cells = "".join(f"{results[name][key]:14.3f}" for name in names)
        print(f"{key:28}{cells}{ratio:8.1f}x")
    # Each run's histogram figures, in the order run: on this machine one process in a few
    # reads 2 to 6 times the training thread's CPU of the next (fresh memory costs that much
    # more at times, docs/performance.md, "Histograms: the process CPU per call"), and a
    # median of three can land on either side; the runs show which.
    print("each run, in order:")
    for key in RUN_KEYS:
        for name in names:
            if key in runs[name][0]:
                cells = ", ".join(f"{r[key]:.1f}" for r in runs[name])
                print(f"  {key:28}{name:>14}: {cells}")


#: The figures printed run by run after the medians' table.
RUN_KEYS = ("add_histogram_loop_us", "cpu_per_histogram_us", "add_histogram_main_cpu_us")


def persist(before: str | None, repeat: int, size: int) -> None:
    """Print the persist path's figures: every process's best and median round, per column."""
    columns = [("vdl-stream", None)]
    if before:
        columns.insert(0, ("before", before))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in columns}
    for _ in range(repeat):
        for name, tree in columns:
            runs[name].append(run_child("vdl-stream", "persist", 0, size, tree))
    print(
        f"Broker._persist thread CPU per binned histogram event ({size:,} float32 values, "
        f"batches of 200); load average {os.getloadavg()[0]:.1f}"
    )
    for name, _ in columns:
        for key in ("persist_best_us", "persist_median_us"):
            cells = ", ".join(f"{r[key]:.1f}" for r in runs[name])
            print(f"{name:12} {key:18} {cells}")


def stages(
    before: str | None, repeat: int, histograms: int, size: int, scalars: int, rounds: int = 1
) -> None:
    """Print the split of the process CPU per call, stage by stage: medians of ``repeat`` fresh
    processes per column, the columns in turn, their order reversed every other repeat (a
    process's figures depend on the one that ran before it: docs/performance.md, "Writer
    ratios against tensorboardX (2026-12-02, h14-hist)")."""
    columns = [("vdl-stream", None)]
    if before:
        columns.insert(0, ("before", before))
    for what, n in (("histograms", histograms), ("scalars", scalars)):
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in columns}
        for r in range(repeat):
            for name, tree in columns[:: -1 if r % 2 else 1]:
                runs[name].append(run_child("vdl-stream", f"stages-{what}", n, size, tree, rounds))
        print(
            f"{what}: {n:,}"
            + (
                f" of {size:,} float32, "
                + ("one burst" if rounds == 1 else f"{rounds} bursts, each flushed")
                if what == "histograms"
                else " over 10 tags"
            )
            + f"; us of thread CPU per call, median of {repeat} processes; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        print(f"{'stage':42}" + "".join(f"{name:>14}" for name, _ in columns))
        keys = [k for k in runs[columns[-1][0]][0] if all(k in rs[0] for rs in runs.values())]
        for key in keys:
            cells = "".join(
                f"{statistics.median(r[key] for r in runs[name]):14.3f}" for name, _ in columns
            )
            print(f"{key:42}{cells}")


def binning(before: str | None, repeat: int) -> None:
    """Print the binning table: medians of ``repeat`` fresh processes per column."""
    columns = [("numpy", "numpy", None), ("vdl-stream", "vdl-stream", None)]
    if before:
        columns.insert(1, ("before", "vdl-stream", before))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in columns}
    for _ in range(repeat):
        for name, lib, tree in columns:
            runs[name].append(run_child(lib, "binning", 0, 0, tree))
    print(
        f"process CPU per histogram of float32 into 10 bins (best of 5 rounds, median of "
        f"{repeat} processes); load average {os.getloadavg()[0]:.1f}"
    )
    # (column, key prefix): each column's one-by-one figure, then its "together" figure if any.
    cells_of = [(name, "bin") for name, _, _ in columns]
    cells_of += [(name, "together") for name, _, _ in columns if "together_100_us" in runs[name][0]]
    head = "".join(
        f"{name if kind == 'bin' else name + f' x{TOGETHER}':>18}" for name, kind in cells_of
    )
    print(f"{'values':>10}{head}")
    for size in BINNING_SIZES:
        cells = "".join(
            f"{statistics.median(r[f'{kind}_{size}_us'] for r in runs[name]):18.1f}"
            for name, kind in cells_of
        )
        print(f"{size:>10,}{cells}")


if __name__ == "__main__":
    main()
