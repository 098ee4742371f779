"""Diagnostics (temporary): how old a batch is at each stage of the bus path."""

from __future__ import annotations

import os
import time
from collections import deque

import numpy as np

ON = os.environ.get("VDL_STREAM_BUS_TRACE") == "1"
_ages: dict[str, deque] = {}


def age(stage: str, wall: float, now: float | None = None) -> None:
    if not ON:
        return
    d = _ages.get(stage)
    if d is None:
        d = _ages[stage] = deque(maxlen=20000)
    d.append(((time.time() if now is None else now) - np.asarray(wall, dtype=float)) * 1000)


def first_wall(scalars):
    """Every point's wall time (the first tag's column): ages are weighted by points, as the
    browser's are."""
    for col in scalars:
        if len(col.walls):
            return col.walls
    return None


def summary() -> dict:
    out = {}
    for stage, d in _ages.items():
        a = np.concatenate([np.atleast_1d(x) for x in d])
        out[stage] = {
            "n": len(a),
            "p50": round(float(np.percentile(a, 50)), 2),
            "p90": round(float(np.percentile(a, 90)), 2),
            "p99": round(float(np.percentile(a, 99)), 2),
        }
    return out


def clear() -> None:
    _ages.clear()


async def lag_task() -> None:
    import trio

    while True:
        t = time.perf_counter()
        await trio.sleep(0.005)
        lag = (time.perf_counter() - t - 0.005) * 1000
        d = _ages.setdefault("loop_lag", deque(maxlen=20000))
        d.append(lag)


_steps: dict[str, list] = {}  # task name -> [count>5ms, total wall ms, max wall ms, total cpu ms]


_gaps: list = [0, 0.0, 0.0]  # count > 5 ms, total ms, max ms: between two task steps


def instrument():
    import trio

    class Steps(trio.abc.Instrument):
        _t = (time.perf_counter(), time.thread_time())

        _end = None

        def before_task_step(self, task):
            self._t = (time.perf_counter(), time.thread_time())
            if self._end is not None:
                gap = (self._t[0] - self._end) * 1000
                self._end = None
                if gap > 5:
                    _gaps[0] += 1
                    _gaps[1] += gap
                    _gaps[2] = max(_gaps[2], gap)

        def after_task_step(self, task):
            t0, c0 = self._t
            self._end = time.perf_counter()
            wall = (time.perf_counter() - t0) * 1000
            cpu = (time.thread_time() - c0) * 1000
            if wall > 5:
                s = _steps.setdefault(task.name, [0, 0.0, 0.0, 0.0])
                s[0] += 1
                s[1] += wall
                s[2] = max(s[2], wall)
                s[3] += cpu

    return Steps()


def steps_summary() -> dict:
    top = sorted(_steps.items(), key=lambda kv: -kv[1][1])[:12]
    return {k[-70:]: [v[0], round(v[1]), round(v[2]), round(v[3])] for k, v in top}


def dur(stage: str, seconds: float) -> None:
    if ON:
        _ages.setdefault(stage, deque(maxlen=20000)).append(seconds * 1000)
