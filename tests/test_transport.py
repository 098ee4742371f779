"""Transports lose nothing and duplicate nothing: spooling, a killed broker, a broker that is down."""

from __future__ import annotations

import time

import pytest

import recorder
from tests.conftest import start_serve, stop_serve
from vdl_stream import attach
from vdl_stream.transport import Spool


def test_spool_keeps_memory_then_disk_in_order():
    spool = Spool(memory_bytes=10, disk_bytes=1000)
    for seq in range(1, 8):
        spool.put(seq, bytes([seq]) * 4)
    assert len(spool) == 7 and spool.last() == 7
    assert [spool.get(s) for s in (1, 2, 3, 7)] == [b"\1" * 4, b"\2" * 4, b"\3" * 4, b"\7" * 4]
    assert spool.after(4) == [5, 6, 7]
    spool.ack(5)
    assert 5 not in spool and 6 in spool and spool.get(5) is None
    spool.ack(7)
    assert len(spool) == 0 and spool.last() is None
    spool.put(8, b"x" * 30)  # the file was truncated and is reused
    assert spool.get(8) == b"x" * 30
    spool.close()


def test_spool_drops_oldest_past_its_disk_bound_with_one_warning():
    spool = Spool(memory_bytes=0, disk_bytes=25)
    with pytest.warns(RuntimeWarning, match="dropping the oldest"):
        for seq in range(1, 6):
            spool.put(seq, b"y" * 10)
    assert spool.after(0) == [4, 5]
    assert spool.dropped == 3
    spool.close()


def test_killed_broker_loses_and_duplicates_nothing(tmp_path):
    logdir = tmp_path / "logs"
    server = start_serve(logdir)
    port = server.url.rsplit(":", 1)[1]
    steps = 30_000
    try:
        with attach(url=server.ws_url, run="k", telemetry=False) as writer:
            for step in range(steps):
                writer.add_scalar("loss", step * 0.5, step)
                if step == 10_000:
                    time.sleep(0.3)  # let batches be acknowledged, then pull the plug
                    server.proc.kill()
                    server.proc.wait()
                if step == 20_000:
                    server = start_serve(logdir, port=int(port))
                if step % 1000 == 0:
                    time.sleep(0.02)  # a training step takes time: batches go out meanwhile
            assert writer.flush(timeout=30) is True
        with recorder.RunReader(logdir / "k") as reader:
            series = reader.read_scalars("loss")
        assert series.steps.tolist() == list(range(steps))  # every event exactly once
        assert series.values.tolist() == [s * 0.5 for s in range(steps)]
    finally:
        stop_serve(server)


def test_training_goes_on_when_the_broker_is_down(tmp_path):
    started = time.monotonic()
    with pytest.warns(RuntimeWarning) as warned:
        writer = attach(url="ws://127.0.0.1:9", run="down", telemetry=False)  # nothing listens on 9
        for step in range(10_000):
            writer.add_scalar("loss", 1.0, step)
        assert writer.flush(timeout=1) is False
        writer.close(timeout=1)
    assert time.monotonic() - started < 15
    messages = [str(w.message) for w in warned]
    assert any("cannot reach the broker" in m for m in messages)
    assert any("not confirmed within the timeout" in m for m in messages)
