"""Diagnostics of the bus path: how old the points are at each stage, and the event loop's stalls.

Off unless the environment has ``VDL_STREAM_BUS_TRACE=1`` when the broker starts (``bench/bench_bus.py
--trace`` sets it for its brokers); then ``GET /api/stats`` reports, under ``bus.stages``, for each
stage the age of every point that passed it (now minus the point's wall time, in ms, the last
:data:`KEPT` arrays of points): p50, p90 and p99, weighted by points as a browser sees them. The
ages compare clocks of the writer's host and the broker's, so they mean something only where the
clocks agree (one host, as in the benchmark). Stages, in path order (A: the broker the writer
writes to; B: another broker)::

    1_admitted     A  the batch's lease is checked at ingest
    2_published    A  queued for the bus, as it is fanned out to A's own subscribers
    3_xadd_sent    A  its publish round starts (the XADD pipeline is sent)
    4_xadd_acked   A  Redis answered that round
    5_in_redis     B  the entry's id (Redis's clock when it added the entry)
    6_xread        B  the XREAD that returned it came back
    7_fanned_out   B  offered to B's subscribers

plus ``loop_lag`` (how late a 5-ms sleep of the event loop wakes, ms) and ``steps``: the tasks whose
steps ran longer than 5 ms, as ``[count, total ms, longest ms, CPU ms]`` (CPU far below wall time
means the process waited for a core, not that the task computed).

The percentiles are computed by :func:`watch_loop` once every :data:`SUMMARY_INTERVAL` in a
worker thread (concatenating and sorting up to :data:`KEPT` arrays a stage is heavy numpy work
that held the event loop, and so the bus path it measures, whenever ``/api/stats`` was read);
``/api/stats`` returns the latest result (:func:`latest`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Whether tracing is on (read once, at import).
ON = os.environ.get("VDL_STREAM_BUS_TRACE") == "1"
#: Arrays of ages kept per stage (one per batch or entry).
KEPT = 20_000
#: Steps longer than this many ms are counted.
LONG_STEP_MS = 5.0
#: Seconds between two summaries (computed in a worker thread).
SUMMARY_INTERVAL = 1.0

_ages: dict[str, deque[np.ndarray]] = {}
_steps: dict[str, list[float]] = {}  # task name -> [count, total ms, longest ms, CPU ms]
_latest: dict[str, Any] | None = None  # the last summary watch_loop computed


def age(stage: str, walls: np.ndarray, now: float | None = None) -> None:
    """Record the age of points with wall times ``walls`` at ``stage`` (``now``: the time they
    passed it, default the present)."""
    if not ON:
        return
    kept = _ages.get(stage)
    if kept is None:
        kept = _ages[stage] = deque(maxlen=KEPT)
    kept.append(((time.time() if now is None else now) - np.asarray(walls, dtype=float)) * 1000)


def walls_of(scalars: Sequence[Any]) -> np.ndarray | None:
    """The wall times of a batch's points (its first tag's column; None without scalars)."""
    for column in scalars:
        if len(column.walls):
            return column.walls
    return None


def latest() -> dict[str, Any] | None:
    """The last summary :func:`watch_loop` computed (None before the first): never computes
    one, so reading it costs the event loop nothing."""
    return _latest


def summary(ages: dict[str, list[np.ndarray]], steps: dict[str, list[float]]) -> dict[str, Any]:
    """p50 / p90 / p99 of every stage's ages (and of ``loop_lag``), with the tasks' long steps.

    Heavy numpy work: :func:`watch_loop` runs it in a worker thread, on copies (``ages``:
    stage -> its arrays; ``steps``: the long steps), never the live records."""
    out: dict[str, Any] = {}
    for stage, kept in sorted(ages.items()):
        if not kept:
            continue
        joined = np.concatenate([np.atleast_1d(a) for a in kept])
        out[stage] = {
            "points": len(joined),
            **{f"p{q}": round(float(np.percentile(joined, q)), 2) for q in (50, 90, 99)},
        }
    top = sorted(steps.items(), key=lambda kv: -kv[1][1])[:12]
    out["steps"] = {name[-70:]: [round(v) for v in s] for name, s in top}
    return out


async def _summarize_loop() -> None:
    """Every :data:`SUMMARY_INTERVAL`, copy the records (cheap: lists of references) and
    summarize the copies in a worker thread (:func:`latest`), until cancelled."""
    import trio

    global _latest
    while True:
        await trio.sleep(SUMMARY_INTERVAL)
        ages = {stage: list(kept) for stage, kept in _ages.items()}
        steps = {name: list(s) for name, s in _steps.items()}
        _latest = await trio.to_thread.run_sync(summary, ages, steps)


async def watch_loop() -> None:
    """Record how late the event loop wakes a 5-ms sleep (``loop_lag``) and the tasks' long
    steps (``steps``), and summarize them with the stages' ages every :data:`SUMMARY_INTERVAL`
    in a worker thread (:func:`latest`), until cancelled."""
    import trio

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_summarize_loop)
        await _watch_lag()


async def _watch_lag() -> None:
    """The ``loop_lag`` and ``steps`` records of :func:`watch_loop`."""
    import trio

    class Steps(trio.abc.Instrument):
        """Counts task steps longer than :data:`LONG_STEP_MS` (wall and CPU time)."""

        def __init__(self) -> None:
            self._start = (time.perf_counter(), time.thread_time())

        def before_task_step(self, task: Any) -> None:
            self._start = (time.perf_counter(), time.thread_time())

        def after_task_step(self, task: Any) -> None:
            wall = (time.perf_counter() - self._start[0]) * 1000
            if wall > LONG_STEP_MS:
                s = _steps.setdefault(task.name, [0, 0.0, 0.0, 0.0])
                s[0] += 1
                s[1] += wall
                s[2] = max(s[2], wall)
                s[3] += (time.thread_time() - self._start[1]) * 1000

    instrument = Steps()
    trio.lowlevel.add_instrument(instrument)
    lags = _ages.setdefault("loop_lag", deque(maxlen=KEPT))
    try:
        while True:
            start = time.perf_counter()
            await trio.sleep(0.005)
            lags.append(np.array([(time.perf_counter() - start - 0.005) * 1000]))
    finally:
        trio.lowlevel.remove_instrument(instrument)
