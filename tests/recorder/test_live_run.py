"""bench/live_run.py writes runs at the live cadence other tests and benchmarks rely on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from recorder import RunReader, RunWriter

LIVE_RUN = Path(__file__).resolve().parents[2] / "bench" / "live_run.py"


def load_live_run():
    spec = importlib.util.spec_from_file_location("live_run", LIVE_RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("killed", [False, True])
def test_a_live_run_has_the_documented_cadence(tmp_path, killed):
    live_run = load_live_run()
    info = live_run.write_live_run(tmp_path / "r", 0.02, killed=killed)  # 72 simulated seconds
    assert info["flushes"] == 3600 and info["points"] == 36_000
    assert info["statistics"]["compactions"] >= 1  # a flush per 20 ms: compaction runs
    with RunReader(tmp_path / "r") as r:
        tags = r.tags()
        assert sum(t.startswith("train/") for t in tags) == 5
        assert tags["train/loss"].count == 3600 and tags["train/loss"].step_max == 3599
        assert tags["hist/layer0"].count == 3600 // 50
        assert tags["images/sample"].count == 4  # steps 0, 1000, 2000, 3000
        assert len(r.read_records("telemetry")) == 72
        assert r.last_record("ingest").data == {"trainer-0": 3600}
        walls = r.read_scalars("train/loss").walls
        assert walls[-1] - walls[0] == pytest.approx(3599 / 50, abs=1e-3)
    RunWriter(tmp_path / "r").close()  # a killed run reopens and closes cleanly


def test_bad_hours_are_refused(tmp_path):
    with pytest.raises(ValueError, match="hours must be a number > 0, got 0"):
        load_live_run().write_live_run(tmp_path / "r", 0)
