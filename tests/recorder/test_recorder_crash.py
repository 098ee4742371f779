"""A writer process killed with SIGKILL at random moments never loses fsynced data."""

from __future__ import annotations

import importlib.util
import os
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


def test_sigkill_at_random_moments_with_deferred_compaction_30_trials(tmp_path):
    # As the broker writes: flushes only seal, compact() does one unit now and then.
    stress = load_stress()
    result = stress.run_trials(str(tmp_path / "run"), trials=30, seed=99, defer=True)
    assert result["trials"] == 30
    assert result["killed_mid_compaction"] > 0
    assert result["steps"] > 500


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("stage", ["written", "renamed", "removing", "removed"])
@pytest.mark.parametrize("nth", [1, 5])  # the 5th swap is the first merge of four blocks
def test_a_writer_killed_mid_compaction_loses_nothing_and_recovers(tmp_path, stage, nth, defer):
    stress = load_stress()
    from recorder import RunReader, RunWriter
    from recorder.blocks import parse_block_name
    from recorder.catalog import SEGMENT_RE

    run = str(tmp_path / "run")
    child = stress.start_writer(run, 0, 7, 6, f"{stage}:{nth}", defer)
    out, err = child.communicate(timeout=120)
    assert child.returncode == -9, err
    acknowledged = stress._durable(out)
    assert acknowledged
    names = os.listdir(run)
    assert (stage == "written") == any(n.endswith(".tmp") for n in names)
    # A reader sees every flushed step exactly once, whatever the stage (verify checks 0..n-1).
    n = stress.verify(run, acknowledged)
    with RunReader(run) as r:
        assert r.read_scalars("x").steps.tolist() == list(range(n))
    # The next writer finishes the swap: no temporary file, nothing a block covers.
    with RunWriter(run, compact_records=6) as w:
        names = os.listdir(run)
        assert not any(name.endswith(".tmp") for name in names)
        ranges = [parse_block_name(name) for name in names if parse_block_name(name)]
        segments = [int(m.group(1)) for m in map(SEGMENT_RE.match, names) if m]
        assert not any(a <= s <= b for a, b in ranges for s in segments)
        assert not any((a, b) != (c, d) and c <= a and b <= d for a, b in ranges for c, d in ranges)
        w.append_scalars("x", [n], [1.0], [0.5])
    assert stress.verify(run, n + 1) == n + 1
