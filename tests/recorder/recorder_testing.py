"""Helpers shared by the recorder tests."""

from __future__ import annotations

import numpy as np

from recorder import Record, ScalarSeries

BASE_WALL = 1_790_000_000.0


def series(steps, values=None, walls=None) -> ScalarSeries:
    """A ScalarSeries from plain sequences (walls default to one per second from BASE_WALL)."""
    steps = np.asarray(steps, dtype=np.int64)
    if values is None:
        values = steps.astype(np.float64)
    if walls is None:
        walls = BASE_WALL + np.arange(len(steps), dtype=np.float64)
    return ScalarSeries(steps, np.asarray(walls, np.float64), np.asarray(values, np.float64))


def same_series(a: ScalarSeries, b: ScalarSeries, wall_tolerance: float = 1e-6) -> bool:
    """Equal steps, values (NaN equal to NaN, bit patterns aside) and walls within a microsecond."""
    return (
        a.steps.dtype == np.int64
        and np.array_equal(a.steps, b.steps)
        and np.array_equal(a.values, b.values, equal_nan=True)
        and len(a.walls) == len(b.walls)
        and bool(np.all(np.abs(a.walls - b.walls) <= wall_tolerance))
    )


def same_record(a: Record, b: Record) -> bool:
    """Records equal field by field (scalar chunks compared with :func:`same_series`)."""
    if (a.kind, a.tag, a.step) != (b.kind, b.tag, b.step) or abs(a.wall - b.wall) > 1e-6:
        return False
    if a.kind == "scalars":
        return same_series(a.data, b.data)
    return a.data == b.data


def same_records(got: list[Record], want: list[Record]) -> bool:
    """Two record lists equal element by element."""
    return len(got) == len(want) and all(same_record(a, b) for a, b in zip(got, want, strict=True))
