"""Compaction in a thread of its own: ``RunWriter.compact()`` beside appends and flushes.

The broker runs compaction units in a worker thread while its persist thread writes. These tests
run the same arrangement with real files and real threads: one thread appends and flushes, one
calls ``compact()`` as fast as it can, readers open and follow the run meanwhile. Whatever the
interleaving (seeded batch sizes, a flush landing anywhere inside a unit), every point is read
exactly once, in order, by the follower, by every fresh reader (a prefix of what was flushed,
never a half-swapped state) and after close.
"""

from __future__ import annotations

import os
import threading
import time
import traceback

import numpy as np
import pytest
from recorder_testing import BASE_WALL

from recorder import RunReader, RunWriter
from recorder.blocks import parse_block_name
from recorder.writer import DEFERRED_MAX

DEADLINE_S = 120


def _compact_until(w: RunWriter, stop: threading.Event, errors: list, units: list) -> None:
    """Call ``compact()`` without pause until ``stop`` (the compaction thread)."""
    try:
        while not stop.is_set():
            w.compact(budget_s=0)
            units.append(w.statistics().compactions + w.statistics().merges)
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def _follow_until(path, stop: threading.Event, errors: list, steps: list, texts: list) -> None:
    """Follow the run with one reader, polling without pause until ``stop`` (then once more)."""
    try:
        with RunReader(path) as follower:
            records = list(follower.iter_records())  # what was there at open
            while True:
                last = stop.is_set()
                records = [*records, *follower.poll()]
                for r in records:
                    if r.kind == "scalars":
                        steps.extend(r.data.steps.tolist())
                    elif r.kind == "text":
                        texts.append(r.step)
                records = []
                if last:
                    return
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_concurrent_compaction_keeps_every_point_once_and_readers_consistent(tmp_path, seed):
    rng = np.random.default_rng(seed)
    path = tmp_path / "r"
    w = RunWriter(path, sync="never", compact_records=4, defer_compaction=True)
    stop, errors = threading.Event(), []
    units: list[int] = []
    followed: list[int] = []
    texts: list[int] = []
    compactor = threading.Thread(target=_compact_until, args=(w, stop, errors, units))
    compactor.start()
    follower = None
    n = 0
    expected_texts = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        for flush in range(400):
            assert time.monotonic() < deadline
            assert not errors, "".join(traceback.format_exception(errors[0]))
            for _ in range(int(rng.integers(1, 4))):  # 1 to 3 batches a flush
                k = int(rng.integers(1, 50))
                steps = np.arange(n, n + k, dtype=np.int64)
                w.append_scalars("x", steps, BASE_WALL + steps * 0.02, steps * 0.5)
                n += k
            if rng.random() < 0.3:
                w.append_record("text", "t", n, BASE_WALL + n * 0.02, {"n": n})
                expected_texts.append(n)
            w.flush()
            if flush == 5:  # the follower starts on a run that is already being compacted
                follower = threading.Thread(
                    target=_follow_until, args=(path, stop, errors, followed, texts)
                )
                follower.start()
            if flush % 40 == 0:
                # A fresh reader sees a prefix of what was flushed, at least all flushed so far
                # (the writer waits meanwhile: the flushes after it are not counted).
                with RunReader(path) as r:
                    seen = r.read_scalars("x").steps.tolist()
                    assert r.statistics().corrupt_records == 0
                assert seen == list(range(n))
        # The writer was never held behind compaction past the bound's twice.
        assert w.statistics().compaction_backlog <= 2 * DEFERRED_MAX
    finally:
        stop.set()
        compactor.join(DEADLINE_S)
        if follower is not None:
            follower.join(DEADLINE_S)
    assert not errors, "".join(traceback.format_exception(errors[0]))
    assert not compactor.is_alive() and follower is not None and not follower.is_alive()
    stats = w.statistics()
    assert stats.compactions > 50 and stats.merges > 5  # compaction ran: in the other thread
    assert stats.inline_compactions < stats.compactions + stats.merges
    assert followed == list(range(n))  # every point once, in order, across every swap
    assert texts == expected_texts
    with RunReader(path) as r:  # before close: what compaction left, read whole
        assert r.read_scalars("x").steps.tolist() == list(range(n))
        assert r.read_scalars("x").values.tolist() == (np.arange(n) * 0.5).tolist()
    w.close()
    names = os.listdir(path)
    assert not any(name.endswith(".tmp") for name in names)
    assert any(parse_block_name(name) for name in names)
    with RunReader(path) as r:
        assert r.read_scalars("x").steps.tolist() == list(range(n))
        assert [rec.step for rec in r.read_records("text")] == expected_texts


def test_close_waits_for_a_unit_under_way_and_compact_then_does_nothing(tmp_path):
    path = tmp_path / "r"
    w = RunWriter(path, sync="never", compact_records=4, defer_compaction=True)
    for i in range(4 * DEFERRED_MAX):
        w.append_scalars("x", [i], [BASE_WALL + i], [float(i)])
        w.append_record("text", "t", i, BASE_WALL + i, {"i": i})
        w.flush()
    assert w.compaction_waiting
    inside, release = threading.Event(), threading.Event()

    def hook(stage: str) -> None:
        if stage == "written" and not release.is_set():
            inside.set()
            release.wait(DEADLINE_S)

    w._compaction.hook = hook
    results: list = []
    other = threading.Thread(target=lambda: results.append(w.compact()))
    other.start()
    assert inside.wait(DEADLINE_S)  # a unit is under way in the other thread, mid-swap
    closer = threading.Thread(target=w.close)
    closer.start()
    # That close waits can only be seen for a while: half a second, in which it would have
    # closed the descriptors under the unit (which then fails in the other thread).
    closer.join(0.5)
    assert closer.is_alive() and not w.closed
    release.set()
    closer.join(DEADLINE_S)
    other.join(DEADLINE_S)
    assert not closer.is_alive() and not other.is_alive()
    assert results == [False]  # the other thread stopped at close: close did the rest
    assert w.closed
    names = os.listdir(path)
    assert not any(name.endswith(".tmp") for name in names)
    # Whole in blocks, as an inline writer leaves it: the segments' blocks merged, the tail alone.
    assert sum(parse_block_name(name) is not None for name in names) >= 2
    assert sum(name.startswith("segment-") for name in names) == 1
    with RunReader(path) as r:
        assert r.read_scalars("x").steps.tolist() == list(range(4 * DEFERRED_MAX))
