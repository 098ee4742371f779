"""Runs whose tag restarts often, for ``bench_recorder.py --restarts``, and one read timed on
it in a fresh process of the tree under test.

    python bench/restarts_run.py write SHAPE RECORDS RUN_DIR   # make a run (this tree's writer)
    python bench/restarts_run.py time RUN_DIR READ             # time one read: JSON on stdout

Run ``time`` from the root of the tree to measure (its ``recorder`` is the one imported). Shapes,
one tag ``loss`` of RECORDS records, each written as its own flush:

* ``writers``: four writers interleaved, each with a step counter of its own, records of 50-500
  points (a restart at most records: a writer behind the others starts below their steps);
* ``epochs``: a step counter reset every epoch of 1,000 steps, records of 100 points;
* ``none``: one counter, records of 50-500 points (no restart).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.getcwd())  # the tree under test, whatever this file's own tree

import recorder
from recorder import RunReader, RunWriter
from recorder.preview import PREVIEW_NAME, load_preview, write_preview

SNAPSHOT_POINTS = 2000  # vdl_stream.broker.SNAPSHOT_POINTS (the recorder must not import it)
BASE_WALL = 1.7e9


def records(shape: str, n: int) -> list[np.ndarray]:
    """The steps of each record, in write order."""
    rng = np.random.default_rng(14)
    out = []
    if shape == "epochs":
        for i in range(n):
            lo = (i % 10) * 100
            out.append(np.arange(lo, lo + 100))
        return out
    tops = [0, 0, 0, 0]
    for i in range(n):
        w = i % 4 if shape == "writers" else 0
        size = int(rng.integers(50, 501))
        out.append(np.arange(tops[w], tops[w] + size))
        tops[w] += size
    return out


def write(shape: str, n: int, run_dir: str) -> None:
    """Write the run: one flush per record, then close (index, compaction, preview)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    with RunWriter(run_dir, sync="never") as w:
        for i, steps in enumerate(records(shape, n)):
            w.append_scalars("loss", steps, BASE_WALL + i + steps * 1e-6, np.sin(steps * 0.01))
            w.flush()


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def time_read(run_dir: str, read: str) -> dict:
    """One read (``READS``) on a fresh reader, nothing cached: seconds, and the points returned.
    ``replay``: vdl_stream's replay timeline's points as of the run's end."""
    if read == "preview":  # as a closing writer writes it, every tag read whatever its length
        with contextlib.suppress(FileNotFoundError):  # (not answered from the one written before)
            os.remove(os.path.join(run_dir, PREVIEW_NAME))
        seconds, _ = timed(lambda: write_preview(run_dir, tag_points=1 << 62))
        return {"seconds": seconds, "points": len(load_preview(run_dir).tags["loss"].steps)}
    if read == "replay":  # a replay's points as of its end (the timeline built, not timed)
        from vdl_stream.replay import RunTimeline

        with RunReader(run_dir) as r:
            timeline = RunTimeline("r", list(r.iter_records()), run_dir)
        timeline.move_to(float("inf"))
        seconds, s = timed(lambda: timeline.series_at(timeline.cursor(), "loss"))
        return {"seconds": seconds, "points": len(s.steps)}
    with RunReader(run_dir) as r:
        if read == "read_scalars":
            seconds, n = timed(lambda: len(r.read_scalars("loss").steps))
        elif read == "snapshot":
            seconds, n = timed(lambda: len(r.read_scalars("loss", max_points=SNAPSHOT_POINTS)))
        else:
            seconds, n = timed(lambda: sum(len(p.steps) for p in r.iter_scalars("loss")))
    return {"seconds": seconds, "points": n}


READS = ("read_scalars", "snapshot", "iter_scalars", "preview", "replay")


def main() -> None:
    """Command line entry point."""
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        res = time_read(sys.argv[2], sys.argv[3])
        res["recorder"] = os.path.dirname(recorder.__file__)  # the tree measured
        print(json.dumps(res))


if __name__ == "__main__":
    main()
