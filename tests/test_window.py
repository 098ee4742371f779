"""The writer's in-flight window: several batches unacknowledged, every guarantee kept.

With ``window`` batches in flight a point leaves while the previous batch is still being written;
while the window is full, calls merge into one batch. These tests make the broker slow (its writes
held or delayed), refusing (the run locked by another writer, at random) and killed (a ``serve``
process killed and restarted), and check that what lands is every point exactly once, in order.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import trio

import recorder
from tests.conftest import HeldWrites, start_serve, stop_serve, wait_for
from vdl_stream import attach, transport
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.errors import RefusedError
from vdl_stream.transport import InProcessTransport
from vdl_stream.writer import MAX_HELD_POINTS, Writer


def raw_steps(run_dir: Path, tag: str = "x") -> list[int]:
    """The steps of ``tag`` in write order, every record as written (a duplicate would show)."""
    with recorder.RunReader(run_dir) as reader:
        records = reader.read_records(kind="scalars", tag=tag)
    return [int(s) for r in records for s in r.data.steps]


@pytest.mark.parametrize("taken", [False, True], ids=["written", "taken"])
@pytest.mark.parametrize("window", [1, 2])
def test_in_process_the_next_batch_leaves_while_the_previous_is_written(
    tmp_path, monkeypatch, window, taken
):
    """A write held. The window counting acknowledgements (``TAKEN`` off): up to ``window``
    batches go at once, one point each. ``TAKEN`` on: a batch frees its place once the broker
    took it (ingest returned), so batches keep going, each at once, until UNACKED_PER_WINDOW
    times ``window`` wait for their writes. Then calls merge into one batch that leaves when the
    writes go on (not at the 30 s interval). Everything lands once, in order."""
    monkeypatch.setattr(transport, "TAKEN", taken)
    bound = transport.UNACKED_PER_WINDOW * window if taken else window
    writes = HeldWrites(monkeypatch)
    writer = attach(tmp_path, run="w", telemetry=False, flush_interval=30.0, window=window)
    try:
        for step in range(bound):
            writer.add_scalar("x", float(step), step)
            wait_for(lambda s=step: writer.statistics().sent_batches == s + 1, 5, f"batch {step}")
        for step in range(bound, bound + 100):
            writer.add_scalar("x", float(step), step)
        time.sleep(0.3)  # give a wrong implementation the time to send more
        stats = writer.statistics()
        assert (stats.batches, stats.queued_calls) == (bound, 100)
        assert stats.transport is not None and stats.transport.in_flight == bound
        writes.open.set()
        wait_for(lambda: writer.statistics().queued_calls == 0, 5, "the merged batch")
        assert writer.statistics().batches == bound + 1  # the 100 calls in one batch
        assert writer.flush(timeout=10) is True
    finally:
        writes.open.set()
        writer.close(timeout=10)
    assert raw_steps(tmp_path / "w") == list(range(bound + 100))


def test_while_the_window_is_full_held_calls_stay_bounded(tmp_path, monkeypatch):
    """Writes held for long: the pump holds calls back only up to MAX_HELD_POINTS, then cuts
    batches at its interval again (into the pending queue), so the hot path's buffers stay
    bounded; everything lands once the writes go on. (The window counts acknowledgements here,
    so that the first batch fills it.)"""
    monkeypatch.setattr(transport, "TAKEN", False)
    monkeypatch.setattr("vdl_stream.writer.MAX_HELD_POINTS", 1000)
    writes = HeldWrites(monkeypatch)
    writer = attach(tmp_path, run="b", telemetry=False, flush_interval=0.005, window=1)
    try:
        writer.add_scalar("x", 0.0, 0)
        wait_for(lambda: writer.statistics().sent_batches == 1, 5, "the first batch")
        for step in range(1, 501):
            writer.add_scalar("x", float(step), step)
        time.sleep(0.1)  # twenty of the pump's intervals: it holds the calls, merged
        stats = writer.statistics()
        assert (stats.batches, stats.queued_calls) == (1, 500)
        for step in range(501, 5001):
            writer.add_scalar("x", float(step), step)
            if step % 500 == 0:
                time.sleep(0.02)  # several of the pump's intervals
        wait_for(lambda: writer.statistics().queued_calls < 1000, 5, "the pump's cut")
        assert writer.statistics().batches > 1
        writes.open.set()
        assert writer.flush(timeout=20) is True
    finally:
        writes.open.set()
        writer.close(timeout=10)
    assert raw_steps(tmp_path / "b") == list(range(5001))
    assert MAX_HELD_POINTS >= 1 << 14  # the real bound: merged batches of many calls


def test_while_the_window_is_full_held_events_stay_bounded_in_bytes(tmp_path, monkeypatch):
    """Large events (texts of 1 MB) are held back only up to MAX_HELD_BYTES: then the pump
    cuts them into the pending queue (which spills to a file) at its interval. (The window
    counts acknowledgements here, so that the first batch fills it.)"""
    monkeypatch.setattr(transport, "TAKEN", False)
    monkeypatch.setattr("vdl_stream.writer.MAX_HELD_BYTES", 3 << 20)
    writes = HeldWrites(monkeypatch)
    writer = attach(tmp_path, run="e", telemetry=False, flush_interval=0.005, window=1)
    try:
        writer.add_text("t", "first", 0)
        wait_for(lambda: writer.statistics().sent_batches == 1, 5, "the first batch")
        for step in range(1, 3):
            writer.add_text("t", "y" * (1 << 20), step)
        time.sleep(0.1)  # twenty of the pump's intervals: 2 MB are held
        assert (writer.statistics().batches, writer.statistics().queued_calls) == (1, 2)
        writer.add_text("t", "y" * (1 << 20), 3)  # 3 MB: the bound
        wait_for(lambda: writer.statistics().queued_calls == 0, 5, "the pump's cut")
        writes.open.set()
        assert writer.flush(timeout=20) is True
    finally:
        writes.open.set()
        writer.close(timeout=10)
    with recorder.RunReader(tmp_path / "e") as reader:
        assert [r.step for r in reader.read_records(kind="text")] == [0, 1, 2, 3]


@pytest.mark.filterwarnings("ignore:.*refused a batch, retrying")
@pytest.mark.parametrize("window", [1, 2, 4])
def test_a_slow_and_refusing_broker_with_a_window_loses_and_duplicates_nothing(
    tmp_path, monkeypatch, window
):
    """Writes delayed at random and the run locked by another writer at random (the broker
    keeps one run open, so another run's batch frees the lock), while the writer logs at least
    20,000 points with several batches in flight: each point lands exactly once, in order."""
    rng = np.random.default_rng(window)
    persist = Broker._persist

    def slow(broker: Broker, items):  # type: ignore[no-untyped-def]
        time.sleep(float(rng.uniform(0, 0.004)))
        return persist(broker, items)

    monkeypatch.setattr(Broker, "_persist", slow)
    stop = threading.Event()
    flips = [0]
    failures: list[Exception] = []

    async def open_transport(nursery: trio.Nursery) -> InProcessTransport:
        broker = Broker(tmp_path, max_open_writers=1)
        await nursery.start(broker.run)

        async def flip() -> None:
            holder = None
            other = 0
            try:
                while not stop.is_set():
                    await trio.sleep(float(rng.uniform(0.005, 0.03)))
                    if holder is None:
                        # Another run's batch (each from a writer of its own, so that one
                        # refused never holds back the next) closes the flaky run's writer.
                        other += 1
                        y = ScalarColumns("y", np.array([other]), np.array([1.7e9]), np.ones(1))
                        with contextlib.suppress(RefusedError):
                            seq = await broker.ingest(Batch(f"o{other}", 1, "other", [y]))
                            await broker.wait_written(seq)
                        with contextlib.suppress(recorder.RecorderError):
                            holder = recorder.RunWriter(tmp_path / "flaky")
                            flips[0] += 1
                    else:
                        holder.close()
                        holder = None
            except Exception as exc:  # shown by the flush's assertion: it ends the writer
                failures.append(exc)
                raise
            finally:
                if holder is not None:
                    holder.close()

        nursery.start_soon(flip)
        return InProcessTransport(broker)

    writer = Writer("flaky", open_transport, flush_interval=0.005, window=window)
    step = 0
    deadline = time.monotonic() + 30
    refusals = 0
    while step < 20_000 or (not refusals and time.monotonic() < deadline):
        writer.add_scalar("x", float(step), step)
        step += 1
        if step % 200 == 0:
            time.sleep(0.002)  # a training step
            if step % 2000 == 0:
                refusals = writer.statistics().transport.refusals
    stop.set()
    assert writer.flush(timeout=60) is True, f"the flipper failed: {failures}"
    stats = writer.statistics().transport
    writer.close(timeout=30)
    assert flips[0] > 0 and stats is not None and stats.refusals > 0
    assert raw_steps(tmp_path / "flaky") == list(range(step))


@pytest.mark.filterwarnings("ignore:.*cannot reach the broker")
@pytest.mark.parametrize("taken", [False, True], ids=["written", "taken"])
@pytest.mark.parametrize("window", [2, 4])
def test_a_killed_broker_with_a_window_loses_and_duplicates_nothing(
    tmp_path, monkeypatch, window, taken
):
    """Over a socket, batches in flight when ``serve`` is killed are re-sent to the restarted
    one, which drops those it has: every point exactly once, in order. With ``TAKEN`` the
    batches taken and not yet acknowledged when it died go again too."""
    monkeypatch.setattr(transport, "TAKEN", taken)
    logdir = tmp_path / "logs"
    server = start_serve(logdir)
    port = int(server.url.rsplit(":", 1)[1])
    steps = 30_000
    try:
        with attach(url=server.ws_url, run="k", telemetry=False, window=window) as writer:
            for step in range(steps):
                writer.add_scalar("loss", step * 0.5, step)
                if step == 10_000:
                    # Killed while batches are in flight (not waiting for their answers).
                    server.proc.kill()
                    server.proc.wait()
                if step == 20_000:
                    server = start_serve(logdir, port=port)
                if step % 500 == 0:
                    time.sleep(0.01)  # a training step takes time: batches go out meanwhile
            assert writer.flush(timeout=30) is True
            assert writer.statistics().transport.reconnects >= 1
        assert raw_steps(logdir / "k", "loss") == list(range(steps))
    finally:
        stop_serve(server)


def test_a_locked_run_over_the_socket_with_a_window_lands_once(tmp_path):
    """``serve`` refuses the run (another process holds it, retryable) while several batches
    are in flight; once it is free every batch lands once, in order."""
    logdir = tmp_path / "logs"
    server = start_serve(logdir)
    holder = recorder.RunWriter(logdir / "held")
    try:
        with pytest.warns(RuntimeWarning, match="another process"):
            writer = attach(url=server.ws_url, run="held", telemetry=False, window=4)
            for step in range(5000):
                writer.add_scalar("x", float(step), step)
                if step % 250 == 0:
                    time.sleep(0.01)
            wait_for(lambda: writer.statistics().transport.refusals > 0, 10, "a refusal")
            writer.add_scalar("x", 5000.0, 5000)  # the warning comes with a call
            holder.close()
            assert writer.flush(timeout=30) is True
            writer.close(timeout=10)
    finally:
        holder.close()
        stop_serve(server)
    assert raw_steps(logdir / "held") == list(range(5001))


@pytest.mark.parametrize(
    ("window", "error", "text"),
    [
        (0, ValueError, "window must be from 1 to 16 batches, got 0"),
        (17, ValueError, "window must be from 1 to 16 batches, got 17"),
        (True, TypeError, "window must be an int number of batches, got bool"),
        (2.0, TypeError, "window must be an int number of batches, got float"),
    ],
)
def test_a_bad_window_is_refused_naming_it(tmp_path, window, error, text):
    with pytest.raises(error, match=text):
        attach(tmp_path, run="bad", telemetry=False, window=window)
    assert transport.MAX_WINDOW == 16
