"""RunWriter.append_scalar_batch: a batch's columns at once, the same bytes as tag by tag.

The per-tag path (:meth:`RunWriter.append_scalars`) is the contract: a run written through the
batch path must be byte for byte the run written through it (segments, blocks, index, digest),
whatever the batches hold. The small group encoder (codec.encode_small_group, Python numbers)
must likewise give encode_group_series's payload and part columns exactly.
"""

from __future__ import annotations

import os
import tempfile
import time
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recorder import RunReader, RunWriter, codec
from recorder.records import RecorderError, ScalarSeries
from recorder.writer import BUFFER_BYTES, GROUP_BELOW

CREATED = 1_790_000_000.25  # segment headers, block footers and the index hold time.time()


def _files(run_dir: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(run_dir)):
        with open(os.path.join(run_dir, name), "rb") as f:
            out[name] = f.read()
    return out


def _columns(batch: list[tuple[str, list[int], list[float], list[float]]]):
    tags = [tag for tag, *_ in batch]
    counts = [len(steps) for _, steps, _, _ in batch]
    steps = np.array([s for _, col, _, _ in batch for s in col], np.int64)
    walls = np.array([w for _, _, col, _ in batch for w in col], np.float64)
    values = np.array([v for _, _, _, col in batch for v in col], np.float64)
    return tags, counts, steps, walls, values


def _write(run_dir: str, ops: list, joined: bool, compact_records: int | None) -> dict[str, bytes]:
    """Write ``ops`` (("batch", [(tag, steps, walls, values), ...]), ("record", i) or
    ("flush",)) into a new run, each batch through append_scalar_batch (``joined``) or one
    append_scalars call per tag, the path as it was before either existed: every group chunk
    encoded by NumPy (no small group encoder); returns the run's files."""
    small = codec.SMALL_GROUP_POINTS if joined else 0
    with (
        mock.patch.object(time, "time", lambda: CREATED),
        mock.patch.object(codec, "SMALL_GROUP_POINTS", small),
    ):
        w = RunWriter(run_dir, sync="never", compact_records=compact_records)
        for op in ops:
            if op[0] == "batch":
                if joined:
                    w.append_scalar_batch(*_columns(op[1]))
                else:
                    for tag, *cols in op[1]:
                        w.append_scalars(tag, *(np.array(c) for c in cols))
            elif op[0] == "record":
                w.append_record("text", "notes", op[1], CREATED + op[1], {"text": f"r{op[1]}"})
            else:
                w.flush()
        w.close()
    return _files(run_dir)


def _both_ways(
    ops: list, compact_records: int | None = None
) -> tuple[list[str], dict[str, list[int]]]:
    """Write ``ops`` tag by tag and through append_scalar_batch; return the names of the files
    that differ between the two runs (or are in only one) and the steps the batch-written run
    reads back, per tag."""
    with tempfile.TemporaryDirectory() as tmp:
        per_tag = _write(os.path.join(tmp, "per_tag"), ops, False, compact_records)
        joined = _write(os.path.join(tmp, "joined"), ops, True, compact_records)
        with RunReader(os.path.join(tmp, "joined")) as reader:
            steps = {
                tag: reader.read_scalars(tag).steps.tolist()
                for tag, info in sorted(reader.tags().items())
                if info.kind == "scalars"
            }
    differing = sorted(n for n in per_tag.keys() | joined.keys() if per_tag.get(n) != joined.get(n))
    return differing, steps


def _points(tag: str, steps: list[int], wall0: float = 1.7e9) -> tuple:
    """Points of ``tag`` at ``steps``, their values differing from tag to tag."""
    offset = ord(tag[-1]) / 7
    return (tag, steps, [wall0 + 0.001 * s for s in steps], [0.5 * s - offset for s in steps])


def test_a_live_batch_writes_the_same_bytes_as_per_tag_appends() -> None:
    """Ten tags of a point each, flushed with a record after each, then compacted: the common
    live case (one group chunk a flush), and every file of the run the same."""
    ops = []
    for k in range(40):
        ops.append(("batch", [_points(f"train/metric{i}", [k]) for i in range(10)]))
        ops += [("record", k), ("flush",)]
    expected = {f"train/metric{i}": list(range(40)) for i in range(10)}
    assert _both_ways(ops) == ([], expected)
    assert _both_ways(ops, compact_records=16) == ([], expected)


def test_batches_that_meet_in_a_flush_write_the_same_bytes() -> None:
    """A pending batch followed by more scalars before the flush (its tags again, a restart,
    a tag appended alone, a large column), records between them."""
    ops = [
        ("batch", [_points("a", [1]), _points("b", [1, 2]), _points("c", [5])]),
        ("record", 1),
        ("batch", [_points("a", [2, 3]), _points("b", [0]), _points("d", list(range(300)))]),
        ("batch", [_points("c", [6]), _points("e", [])]),
        ("flush",),
        ("batch", [_points("x", [1]), _points("y", [1])]),
        ("batch", [_points("x", [2])]),
        ("flush",),
        ("batch", [_points("x", [3]), _points("x", [1]), _points("y", [2])]),  # a tag twice
        ("flush",),
    ]
    differing, steps = _both_ways(ops)
    assert differing == []
    # Restarts supersede what came before them: "a" 1, 2, 3; "b" restarts at 0; "x" at 1.
    assert steps == {
        "a": [1, 2, 3],
        "b": [0],
        "c": [5, 6],
        "d": list(range(300)),
        "x": [1],
        "y": [1, 2],
    }


def test_a_batch_over_the_buffer_bound_is_written_where_per_tag_appends_write_it() -> None:
    """Past BUFFER_BYTES the buffer goes to the OS inside the batch, tag by tag."""
    n = BUFFER_BYTES // 24 // 3 + 10  # three such tags cross the bound inside the batch
    big = np.arange(n, dtype=np.int64).tolist()
    ops = [("batch", [_points("a", big), _points("b", big), _points("c", big), _points("d", [1])])]
    differing, steps = _both_ways(ops)
    assert differing == []
    assert {tag: len(s) for tag, s in steps.items()} == {"a": n, "b": n, "c": n, "d": 1}


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
odd_floats = st.sampled_from(
    [0.0, -0.0, 1.0, -1.5, float("nan"), float("inf"), float("-inf"), 5e-324, 1e300]
)
walls_st = st.one_of(
    st.floats(1.6e9, 1.8e9), st.sampled_from([0.0, -0.0, float("nan"), float("inf"), 1e20])
)
steps_st = st.one_of(
    st.integers(-5, 40), st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**62, -(2**62) - 1])
)


@st.composite
def column(draw: st.DrawFn, tags: list[str]) -> tuple:
    tag = draw(st.sampled_from(tags))
    n = draw(
        st.one_of(st.integers(0, 4), st.just(1), st.integers(GROUP_BELOW - 2, GROUP_BELOW + 1))
    )
    if draw(st.booleans()):  # a progression, as most training loops log
        first, stride = draw(st.integers(-3, 50)), draw(st.integers(-2, 3))
        steps = [first + stride * i for i in range(n)]
    else:
        steps = draw(st.lists(steps_st, min_size=n, max_size=n))
    walls = draw(st.lists(walls_st, min_size=n, max_size=n))
    values = draw(st.lists(st.one_of(finite, odd_floats), min_size=n, max_size=n))
    return (tag, steps, walls, values)


@st.composite
def operations(draw: st.DrawFn) -> list:
    tags = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    ops = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["batch", "batch", "record", "flush"]))
        if kind == "batch":
            ops.append(("batch", draw(st.lists(column(tags), min_size=1, max_size=6))))
        elif kind == "record":
            ops.append(("record", i))
        else:
            ops.append(("flush",))
    return ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations(), st.sampled_from([None, 3]))
def test_random_batches_write_the_same_bytes_as_per_tag_appends(
    ops: list, compact_records: int | None
) -> None:
    differing, steps = _both_ways(ops, compact_records)
    assert differing == []
    logged = {tag for op in ops if op[0] == "batch" for tag, col, *_ in op[1] if col}
    assert set(steps) == logged  # every tag logged with a point is in the run


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=12).flatmap(
        lambda counts: st.tuples(
            st.just(counts),
            st.lists(steps_st, min_size=sum(counts), max_size=sum(counts)),
            st.lists(walls_st, min_size=sum(counts), max_size=sum(counts)),
            st.lists(st.one_of(finite, odd_floats), min_size=sum(counts), max_size=sum(counts)),
        )
    )
)
def test_the_small_group_encoder_gives_numpys_bytes(drawn: tuple) -> None:
    counts, steps, walls, values = drawn
    tags = [f"t{i}" for i in range(len(counts))]
    series = ScalarSeries(
        np.array(steps, np.int64), np.array(walls, np.float64), np.array(values, np.float64)
    )
    small = codec.encode_small_group(tags, counts, series)
    if small is None:  # left to NumPy: steps near the int64 bounds, or mixed signed zeros
        s = np.array(steps, dtype=object)
        assert (
            s.min() < -(2**62)
            or s.max() >= 2**62
            or (0.0 in values and {np.copysign(1, x) for x in values if x == 0} == {-1, 1})
            or (0.0 in walls and {np.copysign(1, x) for x in walls if x == 0} == {-1, 1})
        )
        return
    payload, summary, parts = codec.encode_group_series(tags, counts, series)
    assert bytes(small[0]) == bytes(payload)
    assert repr(small[1]) == repr(summary)
    as_lists = [c.tolist() if isinstance(c, np.ndarray) else c for c in parts]
    assert repr(small[2]) == repr(as_lists)  # repr: NaN equal to NaN


def test_live_batch_points_read_back(tmp_path) -> None:
    with RunWriter(tmp_path / "run", sync="never") as w:
        for k in range(3):
            steps = np.full(3, k, np.int64)
            counts = [1, 1, 1] if k else list(np.ones(3, np.int64))  # NumPy integers too
            w.append_scalar_batch(["a", "b", "c"], counts, steps, 1.7e9 + steps, steps * 0.5)
            w.flush()
    reader = RunReader(tmp_path / "run")
    try:
        for tag in "abc":
            got = reader.read_scalars(tag)
            assert got.steps.tolist() == [0, 1, 2]
            assert got.values.tolist() == [0.0, 0.5, 1.0]
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((["a"], [1, 1], [1, 2], [0.0, 0.0], [1.0, 1.0]), ValueError, "tags and counts"),
        ((["a", ""], [1, 1], [1, 2], [0.0, 0.0], [1.0, 1.0]), ValueError, "tag must be"),
        ((["a", 3], [1, 1], [1, 2], [0.0, 0.0], [1.0, 1.0]), ValueError, "tag must be"),
        ((["a", "b"], [1, -1], [1], [0.0], [1.0]), ValueError, "counts must hold"),
        ((["a", "b"], [1, 1.0], [1, 2], [0.0, 0.0], [1.0, 1.0]), ValueError, "counts must hold"),
        ((["a", "b"], [1, 2], [1, 2], [0.0, 0.0], [1.0, 1.0]), ValueError, "add up"),
        ((["a", "b"], [1, 1], [1, 2], [0.0], [1.0, 1.0]), ValueError, "equal lengths"),
        ((["a", "b"], [1, 1], [[1, 2]], [0.0, 0.0], [1.0, 1.0]), ValueError, "1-D"),
        ((["a", "b"], [1, 1], [1.5, 2.0], [0.0, 0.0], [1.0, 1.0]), TypeError, "integers"),
        ((["a", "b"], [1, 1], [1, 2], [0.0, 0.0], ["x", "y"]), TypeError, "real numbers"),
    ],
)
def test_bad_batches_are_refused_whole(tmp_path, args, error, message) -> None:
    with RunWriter(tmp_path / "run", sync="never") as w:
        with pytest.raises(error, match=message):
            w.append_scalar_batch(*args)
        assert w.statistics().pending_points == 0  # nothing of it was buffered
    w2 = RunWriter(tmp_path / "closed", sync="never")
    w2.close()
    with pytest.raises(RecorderError, match="closed"):
        w2.append_scalar_batch(["a"], [1], [1], [0.0], [1.0])


def _walls_before(walls: np.ndarray) -> list:
    """codec._encode_walls as it was before it decided from the extremes (f2c0088)."""
    if np.isfinite(walls).all() and np.abs(walls).max() < codec.MAX_US_WALL:
        base = float(walls.min())
        offsets = codec.encode_us(walls, base)
        if offsets.max() <= codec.MAX_WALL_OFFSET_US:
            return ["us", base, offsets.astype("<u4").tobytes()]
    return ["f8", walls.astype("<f8").tobytes()]


def _summary_before(steps: np.ndarray, values: np.ndarray) -> tuple:
    """codec.scalar_summary as it was before its unfiltered fast path (f2c0088)."""
    finite = values[np.isfinite(values)]
    vmin = float(finite.min()) if len(finite) else None
    vmax = float(finite.max()) if len(finite) else None
    return int(steps.min()), int(steps.max()), vmin, vmax


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(walls_st, finite, st.floats(-4.6e9, 4.6e9), st.just(codec.MAX_US_WALL)),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.one_of(finite, odd_floats), min_size=1, max_size=40),
)
def test_walls_and_summaries_encode_as_before(walls: list[float], values: list[float]) -> None:
    w = np.array(walls, np.float64)
    assert codec._encode_walls(w) == _walls_before(w)
    v = np.array(values, np.float64)
    steps = np.arange(len(v), dtype=np.int64)
    assert repr(codec.scalar_summary(steps, v)) == repr(_summary_before(steps, v))
