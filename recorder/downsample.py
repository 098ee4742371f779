"""Downsampling of scalar series that never hides a spike (no I/O)."""

from __future__ import annotations

import numpy as np

from recorder.records import ScalarSeries


def extreme_indices(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of at most ``max_points`` points that keep the shape of ``values``.

    Keeps the first and the last point, and from each of ``(max_points - 2) // 2`` equal buckets of
    the points in between, the minimum and the maximum. The result is sorted and has no duplicates.
    A NaN in a bucket is its minimum and maximum (NumPy's ``argmin`` picks it), so a divergence shows.

    Args:
        values: the values, in the order of the series.
        max_points: at least 2.
    """
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = (max_points - 2) // 2
    ends = np.array([0, n - 1])
    if buckets == 0:
        return ends
    inner = values[1 : n - 1]
    m = n - 2
    size = -(-m // buckets)
    full = m // size
    grid = inner[: full * size].reshape(full, size)
    offsets = np.arange(full) * size + 1
    parts = [ends, grid.argmin(axis=1) + offsets, grid.argmax(axis=1) + offsets]
    rest = inner[full * size :]
    if len(rest):
        parts.append(np.array([rest.argmin(), rest.argmax()]) + full * size + 1)
    return np.unique(np.concatenate(parts))


def downsample(series: ScalarSeries, max_points: int) -> ScalarSeries:
    """Return ``series`` reduced to at most ``max_points`` points with :func:`extreme_indices`."""
    if len(series.steps) <= max_points:
        return series
    keep = extreme_indices(series.values, max_points)
    return ScalarSeries(series.steps[keep], series.walls[keep], series.values[keep])
