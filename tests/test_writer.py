"""The writer side: attach(), the hot path's checks, durability at flush(), and the CLI."""

from __future__ import annotations

import math
import socket
import subprocess
import sys

import numpy as np
import pytest

import recorder
from vdl_stream import attach
from vdl_stream.errors import PortInUseError
from vdl_stream.writer import make_run_name


def test_in_process_flush_is_durable_and_complete(tmp_path):
    with attach(tmp_path, run="r1") as w:
        for step in range(5000):
            w.add_scalar("train/loss", 1.0 / (step + 1), step)
            w.add_scalar("train/acc", np.float32(step / 5000), np.int64(step))
        w.add_scalar("train/loss", math.nan, 5000)
        w.add_scalar("train/loss", math.inf, 5001)
        assert w.flush() is True
        # durable means readable from disk by anyone once flush() returned
        with recorder.RunReader(tmp_path / "r1") as reader:
            loss = reader.read_scalars("train/loss")
            assert loss.steps.tolist() == list(range(5002))
            assert loss.values[10] == pytest.approx(1 / 11)
            assert math.isnan(loss.values[5000]) and math.isinf(loss.values[5001])
            assert reader.read_scalars("train/acc").values[2500] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("args", "error", "text"),
    [
        ((3, 1.0, 0), TypeError, "tag must be a non-empty str, got int"),
        (("", 1.0, 0), ValueError, "tag must be a non-empty str"),
        (("a\x00", 1.0, 0), ValueError, "control characters"),
        (
            ("t", "1.5", 0),
            TypeError,
            "value must be a real number or a one-element tensor, got str",
        ),
        (("t", [1, 2], 0), TypeError, "value must be a real number .* got list"),
        (("t", None, 0), TypeError, "value .* got NoneType"),
        (("t", 1.0, 1.5), TypeError, "step must be an int, got float"),
        (("t", 1.0, "3"), TypeError, "step must be an int, got str"),
    ],
)
def test_bad_input_raises_at_the_call_site_and_loses_nothing(tmp_path, args, error, text):
    with attach(tmp_path, run="r") as w:
        w.add_scalar("ok", 1.0, 0)
        with pytest.raises(error, match=text):
            w.add_scalar(*args)
        w.add_scalar("ok", 2.0, 1)
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("ok").values.tolist() == [1.0, 2.0]
        assert set(reader.tags()) <= {"ok"}


def test_histogram_is_recorded(tmp_path):
    values = np.concatenate([np.random.default_rng(0).normal(size=1000), [np.nan, np.inf]])
    with attach(tmp_path, run="h") as w:
        w.add_histogram("w", values, 7, buckets=5)
    with recorder.RunReader(tmp_path / "h") as reader:
        (record,) = reader.read_records(kind="histogram")
    assert (record.tag, record.step) == ("w", 7)
    counts = np.frombuffer(record.data["counts"], "<f8")
    assert len(counts) == 5 and counts.sum() == 1000
    assert (record.data["nan"], record.data["inf"], record.data["num"]) == (1, 1, 1002)


def test_run_names_are_unique_and_sortable():
    names = [make_run_name() for _ in range(200)]
    assert len(set(names)) == 200
    assert names[0][:15] <= names[-1][:15]


def test_serving_on_a_taken_port_is_a_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            PortInUseError,
            match=f"port {port} on 127.0.0.1 is already in use; choose another with --port",
        ):
            attach(tmp_path, serve=True, port=port)
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "vdl_stream.cli",
                "serve",
                "--logdir",
                str(tmp_path),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert cli.returncode == 2
    assert cli.stderr.strip().count("\n") == 0
    assert f"port {port}" in cli.stderr and "--port" in cli.stderr


def test_remote_writer_flush_is_acknowledged(serve_process):
    with attach(url=serve_process.ws_url, run="remote") as w:
        for step in range(2000):
            w.add_scalar("loss", step * 0.25, step)
        assert w.flush(timeout=20) is True
        with recorder.RunReader(serve_process.logdir / "remote") as reader:
            assert reader.read_scalars("loss").values.tolist() == [s * 0.25 for s in range(2000)]


def test_demo_trains_and_logs(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vdl_stream.cli",
            "demo",
            "--no-serve",
            "--steps",
            "300",
            "--delay",
            "0",
            "--logdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (run,) = recorder.list_runs(tmp_path)
    with recorder.RunReader(tmp_path / run) as reader:
        tags = reader.tags()
        loss = reader.read_scalars("train/loss").values
        assert {"train/loss", "train/accuracy", "train/lr", "eval/accuracy", "weights/w1"} <= set(
            tags
        )
        assert len(loss) == 300
        assert loss[-50:].mean() < loss[:50].mean()  # it really learns
        assert reader.read_scalars("eval/accuracy").values[-1] > 0.6
