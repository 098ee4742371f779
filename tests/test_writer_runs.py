"""Runs over time: durability at flush() under SIGKILL, resumed runs, ranks, telemetry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import recorder
from tests import fake_pynvml
from vdl_stream import attach, codec


def test_a_process_killed_right_after_flush_loses_nothing(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, vdl_stream
        w = vdl_stream.attach({str(tmp_path)!r}, run="killed", telemetry=False)
        for step in range(20_000):
            w.add_scalar("loss", step * 2.0, step)
        w.add_histogram("h", list(range(10)), 1)
        assert w.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr
    with recorder.RunReader(tmp_path / "killed") as reader:
        assert reader.read_scalars("loss").values.tolist() == [s * 2.0 for s in range(20_000)]
        assert len(reader.read_records(kind="histogram")) == 1


def test_attaching_to_a_run_again_appends_and_a_restore_supersedes(tmp_path):
    with attach(tmp_path, run="resumed", telemetry=False) as w:
        for step in range(100):
            w.add_scalar("loss", 1.0, step)
    with attach(tmp_path, run="resumed", telemetry=False) as w:  # training continued
        for step in range(100, 200):
            w.add_scalar("loss", 2.0, step)
    with attach(
        tmp_path, run="resumed", telemetry=False
    ) as w:  # restored from a step-150 checkpoint
        for step in range(150, 160):
            w.add_scalar("loss", 3.0, step)
    with recorder.RunReader(tmp_path / "resumed") as reader:
        series = reader.read_scalars("loss")
    assert series.steps.tolist() == list(range(160))
    assert series.values.tolist() == [1.0] * 100 + [2.0] * 50 + [3.0] * 10


def test_only_rank_zero_logs_by_default_but_every_rank_sends_telemetry(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with attach(tmp_path, telemetry_interval=0.1) as w:
        w.add_scalar("loss", 1.0, 0)  # accepted and dropped: rank 1 does not log
        time.sleep(0.35)
    assert w.run.startswith("job-") and w.run.endswith("/rank1")
    with recorder.RunReader(tmp_path / w.run) as reader:
        kinds = {info.kind for info in reader.tags().values()}
        telemetry = reader.read_records(kind="telemetry")
    assert "scalars" not in kinds
    assert telemetry and all(r.data["rank"] == 1 for r in telemetry)
    with attach(tmp_path, all_ranks=True, telemetry=False) as w2:
        w2.add_scalar("loss", 1.0, 0)
    assert w2.run == w.run  # same job, same run: every rank logs as <run>/rank<N>
    with recorder.RunReader(tmp_path / w2.run) as reader:
        assert reader.read_scalars("loss").values.tolist() == [1.0]


def test_gpu_telemetry_travels_with_the_run(tmp_path, monkeypatch):
    device = fake_pynvml.FakeDevice(0, util=87, mem_used=3 << 30, mem_total=80 << 30)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make_module([device]))
    with attach(tmp_path, run="gpu", telemetry_interval=0.1) as w:
        for step in range(10):
            w.add_scalar("loss", float(np.float32(step)), step)
        time.sleep(0.35)
    with recorder.RunReader(tmp_path / "gpu") as reader:
        samples = reader.read_records(kind="telemetry")
    assert len(samples) >= 2
    fields = samples[-1].data["fields"]
    assert fields["gpu0/util"] == 87.0
    assert fields["gpu0/mem_used"] == float(3 << 30)
    assert "ram/used" in fields and samples[-1].data["rank"] == 0 and samples[-1].data["host"]


def test_flush_is_confirmed_even_when_its_request_races_the_pump(tmp_path, monkeypatch):
    from vdl_stream.writer import Writer

    original = Writer._call_soon

    def late(self, fn, *args):
        time.sleep(0.2)  # the pump swaps its list of pending flushes meanwhile
        original(self, fn, *args)

    monkeypatch.setattr(Writer, "_call_soon", late)
    with attach(tmp_path, run="race", telemetry=False) as w:
        w.add_scalar("x", 1.0, 0)
        assert w.flush(timeout=5) is True


@pytest.mark.parametrize(
    ("run", "text"),
    [
        ("a\u202eb", r"invisible.*U\+202E"),
        ("a\u2028b", r"U\+2028"),
        ("a\u200bb", r"U\+200B"),
        ("a\ufeffb", r"U\+FEFF"),
        ("a\ud800b", r"U\+D800"),
        ("exp/\u2066x", r"U\+2066"),
        ("x" * 256, "at most 255 bytes"),
        ("é" * 128, "at most 255 bytes"),
        ("exp1/segment-000000.vdlr", "clashes with the record format"),
        ("exp1/index.vdli", "clashes"),
        ("exp1/index.vdli.tmp", "clashes"),
        ("exp1/writer.lock", "clashes"),
        ("exp1/x.TMP", "clashes"),
        ("a/segment-000001.vdlr/b", "clashes"),
        ("/abs", "relative path"),
        ("a//b", "relative path"),
        ("a/./b", "relative path"),
        ("..", "relative path"),
        (b"run", "non-empty str"),
        ("", "non-empty str"),
    ],
)
def test_run_names_are_checked_for_what_a_directory_or_a_screen_would_garble(run, text):
    with pytest.raises(ValueError, match=text):
        codec.check_run_name(run)


@pytest.mark.parametrize(
    "run", ["exp1", "exp1/train", "运行-1", "a b", "x" * 255, "é" * 127, "v1.2"]
)
def test_plain_run_names_pass(run):
    assert codec.check_run_name(run) == run
