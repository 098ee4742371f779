"""RunWriter and RunReader on real files: the API, restarts, rotation, index, bad input."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from recorder_testing import BASE_WALL, same_series, series

from recorder import (
    LOCK_NAME,
    CorruptionWarning,
    FormatError,
    NotARunError,
    Position,
    Record,
    RecorderError,
    RunReader,
    RunWriter,
    ScalarSeries,
    TagInfo,
    framing,
    list_runs,
    lock_holders,
    writers_gone,
)
from recorder.catalog import INDEX_NAME, segment_name


def append(w: RunWriter, tag: str, s: ScalarSeries) -> None:
    w.append_scalars(tag, s.steps, s.walls, s.values)


def snapshot(run_dir) -> dict[str, bytes]:
    """Every file of a directory with its bytes."""
    return {name: (run_dir / name).read_bytes() for name in sorted(os.listdir(run_dir))}


def test_round_trip_of_scalars_and_records(tmp_path):
    run = tmp_path / "run"
    loss = series(np.arange(0, 3000, 3), np.sin(np.arange(1000)))
    with RunWriter(run) as w:
        append(w, "loss", loss)
        w.append_record("meta", None, None, BASE_WALL, {"name": "exp", "lr": 0.1})
        w.append_record("text", "notes", 7, BASE_WALL + 1, {"text": "hello", "raw": b"\x00\xff"})
        w.append_record("histogram", "w", 7, BASE_WALL + 2, {"edges": [0.0, 1.0], "counts": [3]})
        w.append_record("meta", None, None, BASE_WALL + 3, {"lr": 0.01, "seed": 1})
    r = RunReader(run)
    assert same_series(r.read_scalars("loss"), loss)
    tags = r.tags()
    assert set(tags) == {"loss", "notes", "w"}
    assert tags["notes"] == TagInfo("text", 1, 7, 7, None, None)
    assert tags["w"] == TagInfo("histogram", 1, 7, 7, None, None)
    info = r.tags()["loss"]
    assert (info.kind, info.count, info.step_min, info.step_max) == ("scalars", 1000, 0, 2997)
    assert info.vmin == loss.values.min() and info.vmax == loss.values.max()
    assert r.read_records("text") == [
        Record("text", "notes", 7, BASE_WALL + 1, {"text": "hello", "raw": b"\x00\xff"})
    ]
    assert [rec.kind for rec in r.read_records()] == ["meta", "text", "histogram", "meta"]
    assert r.read_records(tag="w")[0].data == {"edges": [0.0, 1.0], "counts": [3]}
    assert r.meta == {"name": "exp", "lr": 0.01, "seed": 1}
    assert r.statistics().records == 5 and r.statistics().scalar_points == 1000
    r.close()


def test_iter_records_in_write_order_and_from_step(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        append(w, "a", series([0, 1, 2]))
        w.append_record("text", "t", 1, BASE_WALL + 10, {"text": "x"})
        append(w, "b", series([0, 1]))
        append(w, "a", series([3, 4]))  # coalesced into the chunk of "a"
        w.flush()
        append(w, "a", series([5, 6]))
        w.append_record("meta", None, None, BASE_WALL + 20, {"k": 1})
    r = RunReader(run)
    got = [(rec.kind, rec.tag, rec.step) for rec in r.iter_records()]
    # "a" and "b" have few points pending at the first flush: they share a group chunk, written
    # where "a" was first appended.
    assert got == [
        ("scalars", "a", 0),
        ("scalars", "b", 0),
        ("text", "t", 1),
        ("scalars", "a", 5),
        ("meta", None, None),
    ]
    assert next(iter(r.iter_records())).data.steps.tolist() == [0, 1, 2, 3, 4]
    late = list(r.iter_records(from_step=4))
    assert [(rec.kind, rec.tag, rec.step) for rec in late] == [
        ("scalars", "a", 4),
        ("scalars", "a", 5),
        ("meta", None, None),
    ]
    assert late[0].data.steps.tolist() == [4]
    after = list(r.iter_records(from_wall=BASE_WALL + 10))
    assert [rec.kind for rec in after] == ["text", "meta"]


def test_restart_supersedes_older_points_but_keeps_them_in_the_file(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        append(w, "loss", series(np.arange(0, 100), np.zeros(100)))
        w.flush()
        append(w, "loss", series(np.arange(60, 80), np.ones(20)))  # resumed from step 60
        append(w, "loss", series(np.arange(80, 90), np.full(10, 2.0)))
        append(w, "loss", series(np.arange(85, 87), np.full(2, 3.0)))  # restart inside the buffer
    r = RunReader(run)
    s = r.read_scalars("loss")
    assert s.steps.tolist() == [*list(range(85)), 85, 86]
    assert s.values[:60].tolist() == [0.0] * 60
    assert s.values[60:80].tolist() == [1.0] * 20
    assert s.values[80:85].tolist() == [2.0] * 5
    assert s.values[85:].tolist() == [3.0, 3.0]
    assert r.tags()["loss"].count == 132  # the file keeps every point
    assert sum(len(rec.data.steps) for rec in r.iter_records()) == 132
    assert r.read_scalars("loss", start=50, end=61).steps.tolist() == list(range(50, 62))


def test_a_repeated_step_is_no_restart_wherever_the_flushes_fall(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        append(w, "acc", series([0, 1, 1], [0.0, 1.0, 1.5]))
        w.flush()
        append(w, "acc", series([1, 2], [1.7, 2.0]))  # step 1 again, in a new chunk
        append(w, "acc", series([2, 3], [2.5, 3.0]))  # and step 2 again, in the same buffer
    s = RunReader(run).read_scalars("acc")
    assert s.steps.tolist() == [0, 1, 1, 1, 2, 2, 3]
    assert s.values.tolist() == [0.0, 1.0, 1.5, 1.7, 2.0, 2.5, 3.0]


def test_restart_seen_by_a_tailing_reader(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run)
    append(w, "x", series(np.arange(10)))
    w.flush()
    r = RunReader(run)
    assert r.read_scalars("x").steps.tolist() == list(range(10))
    append(w, "x", series([4, 5], [-1.0, -2.0]))
    w.flush()
    assert r.refresh()
    s = r.read_scalars("x")
    assert s.steps.tolist() == [0, 1, 2, 3, 4, 5] and s.values.tolist()[-2:] == [-1.0, -2.0]
    w.close()


def test_range_and_max_points_queries(tmp_path):
    run = tmp_path / "run"
    values = np.random.default_rng(3).normal(size=50_000)
    values[12_345] = 99.0
    with RunWriter(run) as w:
        append(w, "v", series(np.arange(50_000), values))
    r = RunReader(run)
    part = r.read_scalars("v", start=100, end=199)
    assert part.steps.tolist() == list(range(100, 200))
    assert r.read_scalars("v", start=49_990).steps.tolist() == list(range(49_990, 50_000))
    small = r.read_scalars("v", max_points=500)
    assert len(small.steps) <= 500
    assert small.steps[0] == 0 and small.steps[-1] == 49_999
    assert 99.0 in small.values and values.min() in small.values
    assert np.all(np.diff(small.steps) > 0)
    assert len(r.read_scalars("missing").steps) == 0
    with pytest.raises(ValueError, match="max_points must be an int >= 2 or None, got 1"):
        r.read_scalars("v", max_points=1)


def test_unordered_steps_range_query_uses_a_mask(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        append(w, "v", series([10, 30, 20, 40]))
    r = RunReader(run)
    assert r.read_scalars("v", start=15, end=35).steps.tolist() == [30, 20]


def test_flush_makes_data_visible_and_position_grows(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run, sync="never")
    start = w.position()
    assert start == Position(0, framing.HEADER_SIZE)
    append(w, "x", series([1, 2]))
    r = RunReader(run)
    assert not r.refresh()  # buffered only
    assert w.statistics().pending_points == 2
    end = w.flush()
    assert end > start and end == w.position() and hash(end) == hash(Position(*end))
    assert r.refresh() and r.read_scalars("x").steps.tolist() == [1, 2]
    w.close()


def test_refresh_with_limit_reads_only_up_to_it(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run, segment_bytes=200)
    w.append_record("text", "t", 0, BASE_WALL, {"text": "x"})
    w.flush()
    r = RunReader(run)
    positions = []
    for i in range(1, 10):
        w.append_record("text", "t", i, BASE_WALL, {"text": "x" * 40})
        positions.append(w.flush())
    w.close()
    assert r.refresh(limit=positions[3])
    assert [rec.step for rec in r.read_records()] == [0, 1, 2, 3, 4]
    assert not r.refresh(limit=positions[3])
    assert r.refresh()
    assert [rec.step for rec in r.read_records()] == list(range(10))


def test_reader_limit_applies_to_indexed_records_too(tmp_path):
    run = tmp_path / "run"
    positions = []
    with RunWriter(run, segment_bytes=300) as w:
        for i in range(8):
            w.append_record("text", "t", i, BASE_WALL, {"text": "x" * 40})
            positions.append(w.flush())
    assert positions[-1].segment >= 2
    for k in (0, 3, 7):
        r = RunReader(run, limit=positions[k])
        assert r.statistics().index_used
        assert [rec.step for rec in r.read_records()] == list(range(k + 1))
        assert r.refresh() == (k < 7)  # the rest is read by scanning, in order
        assert [rec.step for rec in r.read_records()] == list(range(8))
        r.close()


def test_segments_rotate_by_size_and_read_back_across_them(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run, segment_bytes=4096) as w:
        for i in range(50):
            append(w, "x", series(np.arange(i * 100, (i + 1) * 100)))
            w.flush()
        assert w.statistics().segments > 5
    names = [n for n in os.listdir(run) if n.startswith("segment-")]
    assert len(names) > 5
    assert all(os.path.getsize(run / n) <= 4096 for n in names)
    r = RunReader(run)
    assert r.read_scalars("x").steps.tolist() == list(range(5000))


def test_one_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run, segment_bytes=1024) as w:
        w.append_record("image", "img", 0, BASE_WALL, {"png": b"\x01" * 5000})
        w.append_record("image", "img", 1, BASE_WALL, {"png": b"\x02" * 10})
    r = RunReader(run)
    assert [len(rec.data["png"]) for rec in r.read_records("image")] == [5000, 10]


def test_large_events_are_not_held_in_memory_but_read_again(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        w.append_record("image", "img", 0, BASE_WALL, {"png": b"\x07" * 100_000})
        w.append_record("text", "t", 0, BASE_WALL, {"text": "small"})
    os.remove(run / INDEX_NAME)
    r = RunReader(run)
    entries = {e.kind: e for e in r._catalog.entries}
    assert entries["image"].data is None and entries["text"].data is not None
    for _ in range(2):
        assert r.read_records("image")[0].data["png"] == b"\x07" * 100_000
    assert entries["image"].data is None


def test_large_batches_are_split_into_bounded_chunks(tmp_path):
    run = tmp_path / "run"
    n = 200_000
    with RunWriter(run) as w:
        append(w, "x", series(np.arange(n)))
    r = RunReader(run)
    chunks = list(r.iter_records())
    assert len(chunks) == 4 and max(len(c.data.steps) for c in chunks) <= 1 << 16
    assert np.array_equal(r.read_scalars("x").steps, np.arange(n))


def test_reader_never_writes_into_the_run(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run)
    append(w, "x", series([1, 2, 3]))
    w.flush()
    before = snapshot(run)
    with RunReader(run) as r:  # no index yet: the reader rebuilds it in memory only
        r.read_scalars("x")
        r.tags()
        list(r.iter_records())
        r.refresh()
    assert snapshot(run) == before
    w.close()
    (run / INDEX_NAME).write_bytes(b"garbage")
    before = snapshot(run)
    with pytest.warns(CorruptionWarning, match="ignoring the index"), RunReader(run) as r:
        assert r.read_scalars("x").steps.tolist() == [1, 2, 3]
    assert snapshot(run) == before


def test_index_is_used_and_matches_a_scan(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run, segment_bytes=2048) as w:
        for i in range(20):
            append(w, f"t{i % 3}", series(np.arange(i * 10, i * 10 + 10)))
            w.append_record("text", "log", i, BASE_WALL + i, {"text": str(i)})
            w.flush()
    indexed = RunReader(run)
    assert indexed.statistics().index_used
    assert indexed.statistics().bytes_read == 0  # nothing read before a query
    os.remove(run / INDEX_NAME)
    scanned = RunReader(run)
    assert not scanned.statistics().index_used
    assert indexed.tags() == scanned.tags()
    for tag in ("t0", "t1", "t2"):
        assert same_series(indexed.read_scalars(tag), scanned.read_scalars(tag))
    assert indexed.read_records("text") == scanned.read_records("text")


def test_index_covers_a_prefix_and_the_rest_is_scanned(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        append(w, "x", series([0, 1]))
    w = RunWriter(run)  # reopened: the old index still describes the first part
    append(w, "x", series([2, 3]))
    w.flush()
    r = RunReader(run)
    assert r.statistics().index_used
    assert r.read_scalars("x").steps.tolist() == [0, 1, 2, 3]
    w.close()


def test_a_run_too_large_to_index_is_read_by_scanning(tmp_path, monkeypatch):
    from recorder import writer

    monkeypatch.setattr(writer, "INDEX_MAX_ROWS", 5)
    run = tmp_path / "run"
    with RunWriter(run) as w:
        for i in range(8):
            w.append_record("text", "t", i, BASE_WALL, {"text": "x"})
            w.flush()
    assert not (run / INDEX_NAME).exists()
    r = RunReader(run)
    assert not r.statistics().index_used
    assert [rec.step for rec in r.read_records()] == list(range(8))


def test_stale_index_is_ignored_with_a_warning(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        append(w, "x", series(np.arange(100)))
    seg = run / segment_name(0)
    seg.write_bytes(seg.read_bytes()[:40])  # shorter than the index says
    with pytest.warns(CorruptionWarning, match="ignoring the index"):
        r = RunReader(run)
    assert not r.statistics().index_used
    assert len(r.read_scalars("x").steps) == 0


def test_damage_found_through_the_index_is_reported_at_read_time(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        append(w, "a", series(np.arange(10)))
        w.flush()
        append(w, "a", series(np.arange(10, 20)))
        w.flush()
        append(w, "b", series([1]))
    seg = run / segment_name(0)
    blob = bytearray(seg.read_bytes())
    blob[framing.HEADER_SIZE + 30] ^= 0x40  # inside the first chunk of "a"
    seg.write_bytes(bytes(blob))
    r = RunReader(run)
    assert r.statistics().index_used
    with pytest.warns(CorruptionWarning, match="damaged bytes"):
        s = r.read_scalars("a")
    assert s.steps.tolist() == list(range(10, 20))
    assert r.statistics().corrupt_records == 1
    assert r.tags()["a"].count == 10
    assert r.read_scalars("b").steps.tolist() == [1]


def test_mid_file_corruption_costs_one_record_and_is_reported(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        for i in range(5):
            w.append_record("text", "t", i, BASE_WALL, {"text": "abc" * 10})
            w.flush()
    os.remove(run / INDEX_NAME)
    seg = run / segment_name(0)
    blob = bytearray(seg.read_bytes())
    frame = (len(blob) - framing.HEADER_SIZE) // 5
    blob[framing.HEADER_SIZE + 2 * frame + 1] ^= 0xFF  # the length field of record 2
    seg.write_bytes(bytes(blob))
    with pytest.warns(CorruptionWarning, match=r"segment-000000\.vdlr: skipped \d+ damaged bytes"):
        r = RunReader(run)
    assert [rec.step for rec in r.read_records()] == [0, 1, 3, 4]
    stats = r.statistics()
    assert stats.corrupt_records == 1 and stats.corrupt_bytes == frame


def test_writer_reopen_truncates_a_torn_tail_and_appends(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run)
    append(w, "x", series([0, 1, 2]))
    w.flush()
    append(w, "x", series([3, 4, 5]))
    w.flush()
    del w  # a crash: no close(), no index
    assert not (run / INDEX_NAME).exists()
    seg = run / segment_name(0)
    full = seg.read_bytes()
    seg.write_bytes(full[:-7])  # the last record is torn
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn tail is normal: no warning
        r = RunReader(run)
        assert r.read_scalars("x").steps.tolist() == [0, 1, 2]
        assert r.statistics().pending_bytes > 0 and r.statistics().corrupt_records == 0
        w = RunWriter(run)
    assert w.statistics().truncated_bytes > 0
    append(w, "x", series([3, 4]))
    w.close()
    r = RunReader(run)
    assert r.read_scalars("x").steps.tolist() == [0, 1, 2, 3, 4]
    assert r.statistics().corrupt_records == 0


def test_a_damaged_last_record_waits_like_a_torn_tail_and_is_cut_on_reopen(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run)
    for i in range(3):
        w.append_record("text", "t", i, BASE_WALL, {"text": "abc"})
        w.flush()
    del w  # crashed
    seg = run / segment_name(0)
    blob = bytearray(seg.read_bytes())
    blob[-6] ^= 0x01  # inside the payload of the last record
    seg.write_bytes(bytes(blob))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a damaged last record may be a torn write: pending
        r = RunReader(run)
    assert [rec.step for rec in r.read_records()] == [0, 1]
    assert r.statistics().pending_bytes > 0
    w = RunWriter(run)  # cuts the damaged tail off
    assert w.statistics().truncated_bytes == r.statistics().pending_bytes
    w.append_record("text", "t", 2, BASE_WALL, {"text": "again"})
    w.append_record("text", "t", 3, BASE_WALL, {"text": "more"})
    w.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert r.refresh()
    assert [rec.step for rec in r.read_records()] == [0, 1, 2, 3]
    assert r.statistics().corrupt_records == 0 and r.statistics().pending_bytes == 0
    w.close()


def test_writer_reopen_repairs_a_torn_segment_header(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run, segment_bytes=300) as w:
        for i in range(6):
            w.append_record("text", "t", i, BASE_WALL, {"text": "y" * 50})
            w.flush()
        last = w.position().segment
    assert last > 0
    (run / segment_name(last + 1)).write_bytes(framing.MAGIC[:5])  # crash while creating it
    r = RunReader(run)
    assert len(r.read_records()) == 6
    with RunWriter(run, segment_bytes=300) as w:
        w.append_record("text", "t", 6, BASE_WALL, {"text": "z"})
    assert [rec.step for rec in RunReader(run).read_records()] == list(range(7))


def test_sync_schedules_count_fsyncs(tmp_path):
    w = RunWriter(tmp_path / "a", sync="flush")
    for i in range(3):
        append(w, "x", series([i]))
        w.flush()
    assert w.statistics().fsyncs == 3
    w.flush()  # nothing new: nothing to fsync
    assert w.statistics().fsyncs == 3
    w.close()
    w = RunWriter(tmp_path / "b", sync="never")
    for i in range(3):
        append(w, "x", series([i]))
        w.flush()
    assert w.statistics().fsyncs == 0
    w.sync()  # sync() fsyncs whatever the mode
    assert w.statistics().fsyncs == 1
    w.close()
    assert w.statistics().fsyncs == 1
    w = RunWriter(tmp_path / "c", sync="interval", sync_interval=3600)
    append(w, "x", series([1]))
    w.flush()
    assert w.statistics().fsyncs == 0
    w.close()  # close fsyncs in every mode but "never"
    assert w.statistics().fsyncs == 1
    w = RunWriter(tmp_path / "d", sync="interval", sync_interval=0)
    append(w, "x", series([1]))
    w.flush()
    assert w.statistics().fsyncs == 1
    w.close()


def test_close_is_idempotent_and_a_closed_writer_refuses_appends(tmp_path):
    w = RunWriter(tmp_path / "run")
    w.close()
    w.close()
    with pytest.raises(RecorderError, match="closed"):
        append(w, "x", series([1]))
    with pytest.raises(RecorderError, match="closed"):
        w.flush()


def test_one_writer_per_run(tmp_path):
    with RunWriter(tmp_path / "run"), pytest.raises(RecorderError, match="already open"):
        RunWriter(tmp_path / "run")
    RunWriter(tmp_path / "run").close()  # the lock went with the first writer


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda w: w.append_scalars("", [1], [1.0], [1.0]), ValueError, "tag must be a non-empty str, got ''"),
        (lambda w: w.append_scalars(3, [1], [1.0], [1.0]), ValueError, "tag must be a non-empty str, got 3"),
        (lambda w: w.append_scalars("x", [1, 2], [1.0], [1.0]), ValueError, "equal lengths, got 2, 1, 1"),
        (lambda w: w.append_scalars("x", [1.5], [1.0], [1.0]), TypeError, "steps must hold integers"),
        (lambda w: w.append_scalars("x", [[1]], [1.0], [1.0]), ValueError, "steps must be a 1-D array"),
        (lambda w: w.append_scalars("x", [1], ["a"], [1.0]), TypeError, "walls must hold real numbers"),
        (lambda w: w.append_record("scalars", "x", 1, 1.0, {}), ValueError, "reserved"),
        (lambda w: w.append_record("", "x", 1, 1.0, {}), ValueError, "kind must be a non-empty str"),
        (lambda w: w.append_record("text", "", 1, 1.0, {}), ValueError, "tag must be None or a non-empty str"),
        (lambda w: w.append_record("text", "x", 1.5, 1.0, {}), ValueError, "step must be None or an int, got 1.5"),
        (lambda w: w.append_record("text", "x", 1, math.nan, {}), ValueError, "wall must be a number"),
        (lambda w: w.append_record("text", "x", 1, 1.0, [1]), TypeError, "data must be a dict, got list"),
        (lambda w: w.append_record("text", "x", 1, 1.0, {"f": object()}), TypeError, "msgpack"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_with_exact_messages(tmp_path, call, error, message):
    with RunWriter(tmp_path / "run") as w:
        with pytest.raises(error, match=message.replace("(", r"\(").replace("[", r"\[")):
            call(w)
        assert w.statistics().pending_points == w.statistics().pending_records == 0


def test_a_tag_used_with_two_kinds_keeps_both(tmp_path):
    with RunWriter(tmp_path / "run") as w:
        append(w, "loss", series([1, 2]))
        w.flush()
        w.append_record("text", "loss", 1, 1.0, {"text": "a note"})
    r = RunReader(tmp_path / "run")
    assert r.tags()["loss"].kind == "scalars" and r.tags()["loss"].count == 2
    assert r.read_scalars("loss").steps.tolist() == [1, 2]
    assert r.read_records("text", "loss")[0].data == {"text": "a note"}
    with RunWriter(tmp_path / "run2") as w:
        w.append_record("text", "t", 1, 1.0, {})
    with pytest.raises(ValueError, match="tag 't' holds 'text' records, not scalars"):
        RunReader(tmp_path / "run2").read_scalars("t")


def test_bad_writer_arguments(tmp_path):
    with pytest.raises(ValueError, match="sync must be one of"):
        RunWriter(tmp_path / "a", sync="always")
    with pytest.raises(ValueError, match="sync_interval must be a number >= 0, got -1"):
        RunWriter(tmp_path / "a", sync_interval=-1)
    with pytest.raises(ValueError, match="segment_bytes must be an int > 32, got 10"):
        RunWriter(tmp_path / "a", segment_bytes=10)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotARunError, match="file: not a directory"):
        RunWriter(tmp_path / "file")


def test_not_a_run_errors_name_the_path(tmp_path):
    with pytest.raises(NotARunError, match=f"{tmp_path}/nope: not a run directory"):
        RunReader(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotARunError, match=f"{tmp_path}/empty: not a run directory"):
        RunReader(tmp_path / "empty")
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotARunError, match=f"{tmp_path}/f"):
        RunReader(tmp_path / "f")


def test_foreign_and_newer_segments_raise_format_error_naming_the_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    seg = run / segment_name(0)
    seg.write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # a zip file under our name
    with pytest.raises(FormatError, match=f"{seg}: wrong magic number"):
        RunReader(run)
    with pytest.raises(FormatError, match=f"{seg}: wrong magic number"):
        RunWriter(run)
    head = bytearray(framing.encode_header(0, 1.0))
    head[8] = 9
    seg.write_bytes(bytes(head))
    with pytest.raises(FormatError, match=f"{seg}: format version 9 is newer"):
        RunReader(run)
    seg.write_bytes(framing.encode_header(3, 1.0))
    with pytest.raises(FormatError, match="header says segment 3"):
        RunReader(run)
    seg.write_bytes(b"")  # an empty segment is a run being created: no records yet
    assert RunReader(run).read_records() == []


def test_list_runs_finds_nested_runs(tmp_path):
    for name in ("exp1/train", "exp1/eval", "b", "deep/a/b/c"):
        RunWriter(tmp_path / name).close()
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "exp1" / "notes.txt").write_text("x")
    assert list_runs(tmp_path) == ["b", "deep/a/b/c", "exp1/eval", "exp1/train"]
    assert list_runs(tmp_path / "missing") == []
    with pytest.raises(NotADirectoryError, match=r"notes\.txt"):
        list_runs(tmp_path / "exp1" / "notes.txt")


def test_statistics_are_frozen_and_count(tmp_path):
    with RunWriter(tmp_path / "run") as w:
        append(w, "x", series(np.arange(10)))
        w.append_record("text", "t", 1, 1.0, {"text": "a"})
        stats = w.statistics()
        assert (stats.pending_points, stats.pending_records) == (10, 1)
        w.flush()
        stats = w.statistics()
        assert (stats.records, stats.scalar_points, stats.segments) == (2, 10, 1)
        assert stats.bytes == os.path.getsize(tmp_path / "run" / segment_name(0))
        with pytest.raises(AttributeError):
            stats.records = 0  # type: ignore[misc]


def test_scalar_storage_stays_under_16_bytes_per_point(tmp_path):
    run = tmp_path / "run"
    rng = np.random.default_rng(0)
    with RunWriter(run) as w:
        for tag in range(10):
            for batch in range(10):
                steps = np.arange(batch * 1000, (batch + 1) * 1000)
                walls = BASE_WALL + steps * 0.013 + rng.random(1000) * 1e-3
                w.append_scalars(f"tag{tag}", steps, walls, rng.normal(size=1000))
    size = os.path.getsize(run / segment_name(0))
    assert size / 100_000 <= 12.5
    r = RunReader(run)
    assert len(r.read_scalars("tag3").steps) == 10_000


def test_a_full_disk_at_close_raises_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """The index written at close() fails for want of space: close() says so, the run keeps every
    point flushed, and no half-written ``.tmp`` file is left in the run directory."""
    import errno

    from recorder import framing

    run = tmp_path / "r"
    w = RunWriter(run)
    append(w, "loss", series(range(500)))
    w.flush()

    def full(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(framing, "write_all", full)
    with pytest.raises(OSError, match="No space left"):
        w.close()
    monkeypatch.undo()
    assert not [name for name in os.listdir(run) if name.endswith(".tmp")]
    with RunReader(run) as reader:
        assert len(reader.read_scalars("loss").steps) == 500


# A process holding a run open until it is killed: it says "open" once its lock is taken.
HOLDER = """
import sys, numpy as np
from recorder import RunWriter
w = RunWriter(sys.argv[1])
w.append_scalars("x", np.arange(3), 1.7e9 + np.arange(3.0), np.ones(3))
w.flush()
print("open", flush=True)
sys.stdin.read()
"""


def _holder(run_dir) -> subprocess.Popen:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": repo},
    )
    assert proc.stdout.readline().strip() == "open"
    return proc


def test_a_killed_writer_is_gone_and_a_live_or_closed_one_is_not(tmp_path):
    """``writers_gone``: a run whose writer process was killed (reaped or a zombie yet) is gone;
    one held open, one closed by a process that runs on, one never locked, one whose lock file
    names another machine or no machine (an older file) is not."""
    held, killed, zombie = tmp_path / "held", tmp_path / "killed", tmp_path / "zombie"
    holders = [_holder(held), _holder(killed), _holder(zombie)]
    try:
        closed = tmp_path / "closed"
        with RunWriter(closed) as w:  # this process closes it and runs on
            w.append_scalars("x", np.arange(3), BASE_WALL + np.arange(3.0), np.ones(3))
        holders[1].kill()
        holders[1].wait()
        holders[2].kill()  # not reaped: a zombie until wait()
        for _ in range(200):  # the kernel lets go of the lock as the process exits
            if not lock_holders(zombie / LOCK_NAME):
                break
            time.sleep(0.01)
        runs = [held, killed, zombie, closed, tmp_path / "never"]
        assert writers_gone([str(r) for r in runs]) == [False, True, True, False, False]
        for text in (f"{holders[1].pid} some-other-host\n", f"{holders[1].pid}\n"):
            (killed / LOCK_NAME).write_text(text)
            assert writers_gone([str(killed)]) == [False]
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
