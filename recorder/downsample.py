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
    rest = inner[full * size :]
    # Each bucket's two picks, the lower index first, bucket after bucket: already in order, so
    # only a bucket whose minimum is its maximum repeats an index (no sort, unlike np.unique).
    lows = np.empty(full + (len(rest) > 0), np.int64)
    highs = np.empty_like(lows)
    lows[:full] = grid.argmin(axis=1)
    highs[:full] = grid.argmax(axis=1)
    if len(rest):
        lows[full] = rest.argmin()
        highs[full] = rest.argmax()
    picks = np.empty(2 * len(lows) + 2, np.int64)
    picks[0] = 0
    picks[-1] = n - 1
    offsets = np.arange(len(lows), dtype=np.int64) * size + 1
    np.add(np.minimum(lows, highs), offsets, out=picks[1:-1:2])
    np.add(np.maximum(lows, highs), offsets, out=picks[2:-1:2])
    fresh = np.empty(len(picks), bool)
    fresh[0] = True
    np.not_equal(picks[1:], picks[:-1], out=fresh[1:])
    return picks[fresh]


def downsample(series: ScalarSeries, max_points: int) -> ScalarSeries:
    """Return ``series`` reduced to at most ``max_points`` points with :func:`extreme_indices`."""
    if len(series.steps) <= max_points:
        return series
    keep = extreme_indices(series.values, max_points)
    return ScalarSeries(series.steps[keep], series.walls[keep], series.values[keep])
