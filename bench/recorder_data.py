"""The synthetic runs bench/bench_recorder.py measures (NumPy only, so the anchors' venv can use it)."""

from __future__ import annotations

import numpy as np

WALL0 = 1_790_000_000.0


def tag_series(tag: int, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 0..steps-1, wall times ~50 ms apart with jitter, and a noisy decaying curve."""
    rng = np.random.default_rng(seed * 1_000_003 + tag)
    s = np.arange(steps, dtype=np.int64)
    walls = WALL0 + s * 0.05 + rng.random(steps) * 1e-3
    values = np.exp(-s / (steps / 3)) + rng.normal(0, 0.05, steps)
    return s, walls, values
