"""What the recorder keeps per record, as the cyclic garbage collector sees it.

A training process that logs through ``attach()`` records in process: every object the recorder
keeps for thousands of records (until compaction) and the collector tracks is promoted to its
oldest generation, and promotions are what set off full collections, pauses of every thread of
the training process. Kept state that grows with the records must hold no tracked object per
record.
"""

from __future__ import annotations

import gc

import numpy as np

from recorder import RunWriter

BASE_WALL = 1.7e9


def tracked_within(root: object) -> int:
    """The objects the collector tracks among ``root`` and everything it refers to (classes
    and what they refer to left out)."""
    seen: set[int] = set()
    todo = [root]
    count = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not gc.is_tracked(obj) or isinstance(obj, type):
            continue
        seen.add(id(obj))
        count += 1
        todo.extend(gc.get_referents(obj))
    return count


def test_a_segments_capture_holds_no_tracked_object_per_record(tmp_path):
    """1,000 flushes of a live run (each a scalar chunk of a few tags and an event), kept in the
    capture of the segment that compaction will read: after collections, a handful of tracked
    objects in all (the capture, its lists), not several per record."""
    with RunWriter(tmp_path / "r", sync="never", compact_records=4096) as w:
        for i in range(1000):
            for tag in ("loss", "lr", "acc"):
                w.append_scalars(tag, np.array([i]), np.array([BASE_WALL + i]), np.array([0.5]))
            w.append_record("text", "notes", i, BASE_WALL + i, {"text": f"step {i}"})
            w.flush()
        capture = w._fresh
        assert capture is not None and w.statistics().records == 2000
        gc.collect()
        gc.collect()  # a tuple of tuples is untracked one level per collection
        assert tracked_within(capture) < 20
