"""Deferred compaction (``defer_compaction=True``): flushes seal and queue, ``compact()`` works.

The broker opens its writers this way, so that a write is never acknowledged behind compaction;
these tests hold the recorder to what that relies on: a flush does no compaction work while the
backlog is within ``DEFERRED_MAX``, ``compact()`` does it one unit at a time, a writer that is never
given the time still compacts (bounded backlog), and what is read back never changes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from recorder_testing import BASE_WALL

from recorder import RunReader, RunWriter
from recorder.blocks import parse_block_name
from recorder.writer import DEFERRED_MAX


def write(w: RunWriter, first: int, flushes: int, after_flush=None) -> None:
    for i in range(first, first + flushes):
        w.append_scalars("x", [i], [BASE_WALL + i * 0.02], [float(i)])
        w.append_record("ingest", None, None, BASE_WALL + i * 0.02, {"w": i})
        w.flush()
        if after_flush is not None:
            after_flush(w)


def check(path, n: int) -> None:
    with RunReader(path) as r:
        assert r.read_scalars("x").steps.tolist() == list(range(n))
        assert r.last_record("ingest").data == {"w": n - 1}
        assert r.statistics().corrupt_records == 0


def test_a_deferring_flush_seals_but_compacts_nothing_until_compact(tmp_path):
    w = RunWriter(tmp_path / "r", sync="never", compact_records=4, defer_compaction=True)
    backlogs = []
    write(w, 0, 2 * DEFERRED_MAX + 2, lambda w: backlogs.append(w.statistics().compaction_backlog))
    stats = w.statistics()
    assert (stats.compactions, stats.merges, stats.inline_compactions) == (0, 0, 0)
    # Sealed every 4 records (2 a flush): the backlog grew by one every two flushes, to the bound.
    assert max(backlogs) == DEFERRED_MAX
    assert backlogs[:4] == [0, 0, 1, 1]
    check(tmp_path / "r", 2 * DEFERRED_MAX + 2)  # readers see the sealed segments meanwhile
    # One unit per call with a zero budget, until nothing waits.
    calls = 0
    while w.compact(budget_s=0):
        calls += 1
        assert w.statistics().compactions + w.statistics().merges == calls
    assert w.statistics().compaction_backlog == 0
    assert w.statistics().compactions >= DEFERRED_MAX
    assert w.statistics().inline_compactions == 0
    assert any(parse_block_name(n) for n in os.listdir(tmp_path / "r"))
    check(tmp_path / "r", 2 * DEFERRED_MAX + 2)
    assert not w.compact()
    w.close()
    check(tmp_path / "r", 2 * DEFERRED_MAX + 2)


def test_a_writer_never_given_time_still_compacts_within_the_bound(tmp_path):
    w = RunWriter(tmp_path / "r", sync="never", compact_records=4, defer_compaction=True)
    backlogs = []
    write(w, 0, 1000, lambda w: backlogs.append(w.statistics().compaction_backlog))
    stats = w.statistics()
    assert max(backlogs) <= DEFERRED_MAX
    assert stats.compactions > 400 and stats.merges > 50
    assert stats.inline_compactions == stats.compactions + stats.merges
    with RunReader(tmp_path / "r") as r:
        # At most DEFERRED_MAX sealed segments (and the open one) are read record by record.
        assert r.statistics().records < 200  # instead of 2,000
    check(tmp_path / "r", 1000)
    w.close()
    check(tmp_path / "r", 1000)


def test_deferred_and_inline_compaction_read_back_the_same(tmp_path):
    inline = RunWriter(tmp_path / "i", sync="never", compact_records=4)
    deferred = RunWriter(tmp_path / "d", sync="never", compact_records=4, defer_compaction=True)
    rng = np.random.default_rng(3)
    write(inline, 0, 300)
    write(deferred, 0, 300, lambda w: w.compact(budget_s=0) if rng.random() < 0.3 else None)
    inline.close()
    deferred.close()
    with RunReader(tmp_path / "i") as a, RunReader(tmp_path / "d") as b:
        assert a.read_scalars("x").steps.tolist() == b.read_scalars("x").steps.tolist()
        assert a.read_scalars("x").values.tolist() == b.read_scalars("x").values.tolist()
        assert [r.data for r in a.read_records("ingest")] == [
            r.data for r in b.read_records("ingest")
        ]


def test_close_compacts_what_waits(tmp_path):
    w = RunWriter(tmp_path / "r", sync="never", compact_records=4, defer_compaction=True)
    write(w, 0, 2 * DEFERRED_MAX)
    assert w.statistics().compaction_backlog > 0
    w.close()
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "r"))
    with RunReader(tmp_path / "r") as r:
        assert r.statistics().records < 2 * DEFERRED_MAX  # whole in blocks, as inline leaves it
    check(tmp_path / "r", 2 * DEFERRED_MAX)


def test_compact_without_compaction_or_work_says_none_is_left(tmp_path):
    with RunWriter(tmp_path / "a", compact_records=None, defer_compaction=True) as w:
        write(w, 0, 5)
        assert w.compact() is False
    with RunWriter(tmp_path / "b") as w:
        assert w.compact(budget_s=1.0) is False


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_bad_budget_is_refused(tmp_path, bad):
    message = f"budget_s must be None or a number >= 0, got {bad!r}"
    with RunWriter(tmp_path / "r") as w, pytest.raises(ValueError, match=message):
        w.compact(budget_s=bad)


def test_bad_defer_compaction_is_refused(tmp_path):
    with pytest.raises(ValueError, match="defer_compaction must be a bool, got 1"):
        RunWriter(tmp_path / "r", defer_compaction=1)
