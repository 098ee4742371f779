"""The broker compacts its runs off the write path: between batches, never inside a flush.

Counted with the recorder's statistics (which flush did compaction work), not with timings.
"""

from __future__ import annotations

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

    flushes: ClassVar[list[int]] = []  # units of compaction work each flush did

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, compact_records=4, **kwargs)

    def flush(self) -> recorder.Position:
        def done() -> int:
            stats = self.statistics()
            return stats.compactions + stats.merges

        before = done()
        try:
            return super().flush()
        finally:
            CountingWriter.flushes.append(done() - before)


async def test_writes_are_acknowledged_without_compaction_which_runs_when_idle(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(recorder, "RunWriter", CountingWriter)
    CountingWriter.flushes = []
    with trio.fail_after(60):
        broker = Broker(tmp_path)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            for i in range(200):  # each batch and its bookkeeping: ~2 records, a seal every 2
                await broker.wait_written(await broker.ingest(Batch("w", i + 1, "r", columns(i))))
            writer = broker._runs["r"].writer
            # The persist task compacts between batches: the backlog drains without writes.
            for _ in range(5000):  # bounded by fail_after too
                if not writer.statistics().compaction_backlog:
                    break
                await trio.sleep(0.01)
            stats = writer.statistics()
            broker.close()
            await broker.wait_closed()
    assert len(CountingWriter.flushes) >= 200
    # No flush (hence no acknowledged write) waited for compaction...
    assert stats.inline_compactions == 0
    assert not any(CountingWriter.flushes)
    # ...and it was done all the same, merges included.
    assert stats.compactions > 50 and stats.merges > 10
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("a").steps.tolist() == list(range(200))
        assert reader.statistics().records < 100


async def test_a_broker_that_never_idles_still_compacts_within_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "RunWriter", CountingWriter)
    CountingWriter.flushes = []
    # No idle moment: the persist thread's compaction does nothing (as if batches always waited).
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
