"""A writer process killed with SIGKILL at random moments never loses fsynced data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

STRESS = Path(__file__).resolve().parents[2] / "bench" / "recorder_stress.py"


def load_stress():
    spec = importlib.util.spec_from_file_location("recorder_stress", STRESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sigkill_at_random_moments_50_trials(tmp_path):
    stress = load_stress()
    result = stress.run_trials(str(tmp_path / "run"), trials=50, seed=1234)
    assert result["trials"] == 50
    assert result["steps"] > 1000  # the writers made progress between kills
    assert result["killed_before_open"] < 50


def test_the_checker_catches_lost_data(tmp_path):
    stress = load_stress()
    from recorder import RunWriter

    with RunWriter(tmp_path / "run") as w:
        w.append_scalars("x", [0, 1, 2], [1.0, 1.0, 1.0], [0.0, 0.5, 1.0])
    assert stress.verify(str(tmp_path / "run"), 3) == 3
    with pytest.raises(stress.CrashCheckError, match="lost fsynced data"):
        stress.verify(str(tmp_path / "run"), 4)
