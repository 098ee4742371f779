"""What the cyclic garbage collector costs a training process that logs for hours.

A training loop logs with ``attach(logdir)`` (the broker, the recorder and compaction in this
process), telemetry off: each step scalars of ``--tags`` tags, a histogram every
``--histogram-every`` steps and a text every ``--text-every``, then "computes" for ``--step-ms``
while allocating a few small objects a microsecond, as a framework's loop does. The writer sends
a batch whenever its link is free, so the broker writes a batch, and the recorder a record or
more, every step or two: the hours of a run at a 20 ms cadence pass faster than in real time
(say ``--step-ms 1`` for 20x), and the record count, not the clock, is what the collector sees.

Printed at the end (one JSON line with ``--json``):

- per collection generation: how many collections, their total and largest pause in wall time
  and in the collecting thread's CPU (a ``gc.callbacks`` entry), and which threads ran them;
- the training loop's largest stalls: the largest gaps between two consecutive iterations of
  its loop (a call or a compute slice of a few microseconds each), and how much of each the
  collections (in any thread) took;
- the objects the collector tracks per record kept: tracked objects by type at half the run and
  at its end, before close, the growth divided by the records written between the two, and for
  the types that grew most, what holds a sample of them (``gc.get_referrers``).

Usage (from a tree's root, so that its code is the one imported)::

    python3 bench/gc_long_run.py --records 200000
    PYTHONPATH=BEFORE python3 bench/gc_long_run.py ...   # another tree's code, this script
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter

import numpy as np

if "PYTHONPATH" not in os.environ:  # this tree's code, not the installed one's
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import recorder
import vdl_stream


class Collections:
    """A ``gc.callbacks`` entry timing every collection in the thread that runs it.

    With ``promotions``, it also counts by type the objects each collection of generation 1
    moves into the oldest generation (a diagnostic: it adds milliseconds to every such
    collection, outside the timed part). Those promotions, whether the objects live on or not,
    are what the collector counts towards its next full collection.
    """

    def __init__(self, promotions: bool = False) -> None:
        self.done: list[tuple[int, str, float, float, float]] = []  # gen, thread, start, wall, cpu
        self._start: dict[int, tuple[float, float]] = {}
        self.promotions = promotions
        self.promoted: Counter = Counter()
        self._old: set[int] = set()

    def __call__(self, phase: str, info: dict) -> None:
        ident = threading.get_ident()
        gen = info["generation"]
        if phase == "start":
            if self.promotions and gen == 1:
                self._old = {id(o) for o in gc.get_objects(2)}
            self._start[ident] = (time.perf_counter(), time.thread_time())
            return
        begun = self._start.pop(ident, None)
        if begun is None:
            return
        wall, cpu = time.perf_counter() - begun[0], time.thread_time() - begun[1]
        self.done.append((gen, threading.current_thread().name, begun[0], wall, cpu))
        if self.promotions and gen == 1:
            old = self._old
            self.promoted.update(type_name(o) for o in gc.get_objects(2) if id(o) not in old)

    def summary(self) -> dict:
        out = {}
        for gen in range(3):
            rows = [r for r in self.done if r[0] == gen]
            out[f"gen{gen}"] = {
                "count": len(rows),
                "wall_ms": round(sum(r[3] for r in rows) * 1e3, 2),
                "max_wall_ms": round(max((r[3] for r in rows), default=0.0) * 1e3, 3),
                "cpu_ms": round(sum(r[4] for r in rows) * 1e3, 2),
                "max_cpu_ms": round(max((r[4] for r in rows), default=0.0) * 1e3, 3),
                "threads": dict(Counter(r[1] for r in rows)),
            }
        return out


def overlap(done: list, lo: float, hi: float) -> float:
    """Seconds of the collections in ``done`` that fall between ``lo`` and ``hi``."""
    return sum(max(0.0, min(hi, start + wall) - max(lo, start)) for _, _, start, wall, _ in done)


def type_name(obj: object) -> str:
    """The name of ``obj``'s type, module-qualified outside builtins."""
    t = type(obj)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


def tracked_by_type() -> Counter:
    """Tracked objects by type name."""
    return Counter(type_name(obj) for obj in gc.get_objects())


def holders(name: str, sample: int = 12) -> dict:
    """What refers to a sample of the newest tracked objects of type ``name`` (two levels)."""
    objs = [o for o in gc.get_objects() if type_name(o) == name][-sample:]
    seen: Counter = Counter()
    frame = sys._getframe()
    for obj in objs:
        for ref in gc.get_referrers(obj):
            if ref is objs or ref is frame:
                continue
            key = type(ref).__name__
            if isinstance(ref, (list, dict, tuple)):
                up = [
                    type(r).__name__
                    for r in gc.get_referrers(ref)
                    if r is not objs and r is not frame and not isinstance(r, type(frame))
                ][:3]
                key += " <- " + ",".join(up)
            seen[key] += 1
    del objs
    return dict(seen.most_common(4))


def shape(obj: object) -> str:
    """A short description of a tuple's element types, for the unexplained tuples."""
    if isinstance(obj, tuple):
        return "(" + ", ".join(type(x).__name__ for x in obj[:5]) + ")"
    return type(obj).__name__


def run_writer() -> recorder.RunWriter | None:
    """The recorder's writer of this process's run (the broker holds it)."""
    for obj in gc.get_objects():
        if isinstance(obj, recorder.RunWriter):
            return obj
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=150_000, help="records to write")
    parser.add_argument("--tags", type=int, default=20)
    parser.add_argument("--histogram-every", type=int, default=10, help="steps")
    parser.add_argument("--text-every", type=int, default=100, help="steps")
    parser.add_argument("--step-ms", type=float, default=1.0, help="compute per step")
    parser.add_argument("--dir", default=None, help="log directory (default: a temporary one)")
    parser.add_argument("--top", type=int, default=8, help="stalls and types to print")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--promotions", action="store_true", help="count what each collection promotes (slow)"
    )
    args = parser.parse_args()

    logdir = args.dir or tempfile.mkdtemp(prefix="gc-long-")
    gc.collect()  # the imports' due full collection is paid before the run, not in it
    timer = Collections(args.promotions)
    gc.callbacks.append(timer)
    writer = vdl_stream.attach(logdir, "gc-long", telemetry=False)
    rw = None
    while rw is None:  # the broker opens the run at attach
        rw = run_writer()
    tags = [f"train/metric{i:02d}" for i in range(args.tags)]
    hist = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    step_s = args.step_ms / 1e3
    gaps = np.zeros(args.top * 4)  # the largest gaps (s), unsorted beyond the smallest's slot
    gap_at = np.zeros_like(gaps)
    smallest = 0.0
    junk: list = []
    mid = None
    t0 = time.perf_counter()
    last = t0
    step = 0
    half = args.records // 2
    while True:
        records = rw.statistics().records
        if mid is None and records >= half:
            mid = (records, tracked_by_type(), len(gc.get_objects(2)))
            last = time.perf_counter()  # the count above is the benchmark's, not a stall
        if records >= args.records:
            break
        for i, tag in enumerate(tags):
            writer.add_scalar(tag, i + step * 1e-3, step)
        if step % args.histogram_every == 0:
            writer.add_histogram("weights", hist, step)
        if step % args.text_every == 0:
            writer.add_text("notes", f"step {step}", step)
        # Compute: small objects made and dropped, as a framework's loop does, and the gaps
        # between slices measured (a slice is a microsecond or so unless the loop stalls).
        end = last + step_s
        now = time.perf_counter()
        while True:
            gap = now - last
            if gap > smallest:
                k = int(np.argmin(gaps))
                gaps[k], gap_at[k] = gap, now
                smallest = float(gaps.min())
            last = now
            if now >= end:
                break
            junk.append((now, [now]))
            if len(junk) > 64:
                junk.clear()
            now = time.perf_counter()
        step += 1
    elapsed = time.perf_counter() - t0
    records = rw.statistics().records
    end_types = tracked_by_type()
    end_old = len(gc.get_objects(2))
    grown = end_types - mid[1]
    per_record = {k: round(v / max(1, records - mid[0]), 3) for k, v in grown.most_common(args.top)}
    held = {k: holders(k) for k, _ in grown.most_common(3)}
    tuples = Counter(shape(o) for o in gc.get_objects() if type(o) is tuple)
    gc.callbacks.remove(timer)
    writer.close()
    order = np.argsort(gaps)[::-1]
    result = {
        "tree": os.path.dirname(os.path.dirname(os.path.abspath(recorder.__file__))),
        "records": records,
        "steps": step,
        "seconds": round(elapsed, 1),
        "collections": timer.summary(),
        "stalls_ms": [round(float(gaps[k]) * 1e3, 2) for k in order[: args.top]],
        "stalls_at_s": [round(float(gap_at[k] - t0), 1) for k in order[: args.top]],
        # Of each stall, the time collections (in any thread) ran inside it.
        "stalls_gc_ms": [
            round(overlap(timer.done, gap_at[k] - gaps[k], gap_at[k]) * 1e3, 2)
            for k in order[: args.top]
        ],
        "tracked_per_record": round(
            (sum(end_types.values()) - sum(mid[1].values())) / max(1, records - mid[0]), 3
        ),
        "oldest_per_record": round((end_old - mid[2]) / max(1, records - mid[0]), 3),
        "tracked_at_end": sum(end_types.values()),
        "grown_per_record": per_record,
        "held_by": held,
        "tuples_at_end": dict(tuples.most_common(5)),
    }
    if args.promotions:
        total = sum(timer.promoted.values())
        result["promoted_per_record"] = round(total / max(1, records), 3)
        result["promoted_by_type"] = {
            k: round(v / max(1, records), 3) for k, v in timer.promoted.most_common(args.top)
        }
    if args.dir is None:
        shutil.rmtree(logdir, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
