"""The broker compacts its runs off the write path: in a thread of its own, never inside a flush.

Counted with the recorder's statistics (which flush did compaction work), not with timings.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import ClassVar

import numpy as np
import trio

import recorder
from recorder.writer import DEFERRED_MAX
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns


def columns(i: int) -> list[ScalarColumns]:
    steps = np.array([i], np.int64)
    return [ScalarColumns(t, steps, np.array([1.7e9 + i]), steps * 0.5) for t in ("a", "b")]


class CountingWriter(recorder.RunWriter):
    """A RunWriter that compacts every 4 records and notes the compaction work of each flush."""

    flushes: ClassVar[list[int]] = []  # units of compaction work each flush did itself

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, compact_records=4, **kwargs)

    def flush(self) -> recorder.Position:
        def done() -> int:
            # Not compactions + merges: the compaction thread's units run during flushes too.
            return self.statistics().inline_compactions

        before = done()
        try:
            return super().flush()
        finally:
            CountingWriter.flushes.append(done() - before)


async def test_writes_are_acknowledged_while_a_compaction_unit_is_under_way(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "RunWriter", CountingWriter)
    CountingWriter.flushes = []
    inside, release, resumed = threading.Event(), threading.Event(), threading.Event()

    def hook(stage: str) -> None:
        # The compaction thread stops in the middle of a unit: its block written and fsynced,
        # not yet swapped in. Bounded, so that a broker that wrote behind it fails, not hangs.
        if stage == "written" and not release.is_set():
            inside.set()
            release.wait(20)
            resumed.set()

    with trio.fail_after(60):
        broker = Broker(tmp_path)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await broker.open_run("r")
            writer = broker._runs["r"].writer
            writer._compaction.hook = hook
            # The compaction process up first: on a loaded machine its start-up let many seals
            # queue before the first unit, and flushes past the bound then did units themselves.
            assert await trio.to_thread.run_sync(broker._compaction_process.ready, 60)
            i = 0
            while not inside.is_set() and i < 1000:  # until a unit is under way
                i += 1
                await broker.wait_written(await broker.ingest(Batch("w", i, "r", columns(i - 1))))
                if writer.statistics().compaction_backlog:
                    # A unit waits: the compaction thread takes it before more are queued.
                    await trio.to_thread.run_sync(inside.wait, 10)
            assert inside.is_set()
            # Each batch ~2 records, a seal every 2 batches: about 4 more units queued, within
            # the bound while a unit runs (2 * DEFERRED_MAX); short of it however many queued.
            held_writes = 0
            while (
                held_writes < 2 * DEFERRED_MAX
                and writer.statistics().compaction_backlog < 2 * DEFERRED_MAX - 1
            ):
                i += 1
                held_writes += 1
                await broker.wait_written(await broker.ingest(Batch("w", i, "r", columns(i - 1))))
            held = held_writes >= 2 and not resumed.is_set()
            release.set()
            for _ in range(5000):  # the backlog drains without writes (bounded by fail_after too)
                if not writer.statistics().compaction_backlog and not writer.compaction_waiting:
                    break
                await trio.sleep(0.01)
            stats = writer.statistics()
            broker.close()
            await broker.wait_closed()
    assert held  # the writes were acknowledged while the unit was held mid-swap
    assert len(CountingWriter.flushes) >= i
    # No flush (hence no acknowledged write) did compaction work...
    assert stats.inline_compactions == 0
    assert not any(CountingWriter.flushes)
    # ...and it was done all the same.
    assert stats.compactions >= DEFERRED_MAX
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("a").steps.tolist() == list(range(i))
        assert reader.statistics().records < 30


async def test_a_broker_that_never_idles_still_compacts_within_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "RunWriter", CountingWriter)
    CountingWriter.flushes = []
    # No compaction thread: its units do nothing (as if it never got the CPU).
    monkeypatch.setattr(Broker, "_compact_runs", lambda self: None)
    backlogs = []
    original = CountingWriter.flush

    def flush(self: CountingWriter) -> recorder.Position:
        position = original(self)
        backlogs.append(self.statistics().compaction_backlog)
        return position

    monkeypatch.setattr(CountingWriter, "flush", flush)
    with trio.fail_after(60):
        broker = Broker(tmp_path)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            for i in range(200):
                await broker.wait_written(await broker.ingest(Batch("w", i + 1, "r", columns(i))))
            stats = broker._runs["r"].writer.statistics()
            broker.close()
            await broker.wait_closed()
    assert max(backlogs) <= DEFERRED_MAX
    assert stats.compactions > 50
    assert stats.inline_compactions == stats.compactions + stats.merges
    # Only the flushes past the bound did work, one unit or so each.
    assert sum(1 for n in CountingWriter.flushes if n) < len(CountingWriter.flushes)
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("b").steps.tolist() == list(range(200))


async def test_a_killed_compaction_process_is_started_again_and_loses_nothing(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(recorder, "RunWriter", CountingWriter)
    CountingWriter.flushes = []
    with trio.fail_after(120):
        broker = Broker(tmp_path)
        process = broker._compaction_process
        assert process is not None  # the default
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            i = 0

            async def write_until(condition) -> None:  # bounded by the count and fail_after
                nonlocal i
                for _ in range(3000):
                    if condition():
                        return
                    i += 1
                    await broker.wait_written(
                        await broker.ingest(Batch("w", i, "r", columns(i - 1)))
                    )
                raise AssertionError("the condition never held")

            await write_until(lambda: process.units >= 2)  # started, and building blocks
            first, built = process.pid, process.units
            await trio.to_thread.run_sync(os.kill, first, signal.SIGKILL)
            # The writes go on; the next unit notices, and a fresh process takes over: blocks
            # counted after the kill are the new process's (more may have come in before it).
            await write_until(lambda: process.restarts == 1 and process.units >= built + 2)
            assert process.pid != first and process.usable
            stats = broker._runs["r"].writer.statistics()
            broker.close()
            await broker.wait_closed()
    assert stats.compactions >= 4
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "r"))
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("a").steps.tolist() == list(range(i))
        assert reader.statistics().corrupt_records == 0
    assert process.cpu_seconds > 0 and not process.usable  # closed with the broker
