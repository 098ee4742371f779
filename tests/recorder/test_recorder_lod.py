"""Level-of-detail summaries: a downsampled read of block chunks answers from each chunk's slice
extremes, reading only the slices a bucket edge falls in, and returns exactly what downsampling
the whole series returns."""

from __future__ import annotations

import contextlib
import math
import os
import warnings

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_testing import BASE_WALL

from recorder import (
    CorruptionWarning,
    RunLockedError,
    RunReader,
    RunWriter,
    add_summaries,
    blocks,
    framing,
    reader,
)
from recorder.downsample import downsample
from recorder.reader import RunReader as _Reader

SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.5, math.nan, math.inf, -math.inf]


@contextlib.contextmanager
def lod_slice(size: int | None):
    """Write blocks with summaries of ``size`` points a slice (None: none, as older writers)."""
    old = blocks.LOD_SLICE
    blocks.LOD_SLICE = size
    try:
        yield
    finally:
        blocks.LOD_SLICE = old


@contextlib.contextmanager
def streamed():
    """Downsample chunk by chunk (from summaries where there are) whatever the tag's length: a
    short tag is otherwise decoded whole (``SMALL_DOWNSAMPLE``)."""
    old = reader.SMALL_DOWNSAMPLE
    reader.SMALL_DOWNSAMPLE = 0
    try:
        yield
    finally:
        reader.SMALL_DOWNSAMPLE = old


def identical(a, b) -> bool:
    """Same steps, and walls and values bit for bit (NaN included)."""
    return (
        np.array_equal(a.steps, b.steps)
        and a.walls.tobytes() == b.walls.tobytes()
        and a.values.tobytes() == b.values.tobytes()
    )


def full_then_downsample(path, tag, start, end, max_points):
    with RunReader(path) as r:
        return downsample(r.read_scalars(tag, start=start, end=end), max_points)


@st.composite
def writes(draw) -> list[tuple]:
    """Batches of points of two tags (values with ties, NaN, infinities, signed zeros; some
    restarts; wall times as the codec stores them, in microseconds or not) and flushes."""
    top = {"a": -1, "b": -1}
    out = []
    for _ in range(draw(st.integers(1, 60))):
        if draw(st.integers(0, 3)) == 0:
            out.append(("f",))
            continue
        tag = draw(st.sampled_from(["a", "b"]))
        n = draw(st.integers(1, 60))
        if top[tag] >= 0 and draw(st.integers(0, 8)) == 0:
            first = draw(st.integers(0, top[tag]))  # a restart
        else:
            first = top[tag] + draw(st.integers(0, 2))
        top[tag] = max(top[tag], first + n - 1)
        values = draw(
            st.lists(
                st.one_of(st.sampled_from(SPECIAL), st.floats(-5, 5, width=16)),
                min_size=n,
                max_size=n,
            )
        )
        stride = draw(st.sampled_from([1, 1, 3]))
        out.append(("s", tag, first, n, stride, values))
    return out


def apply(w: RunWriter, acts: list[tuple]) -> None:
    for act in acts:
        if act[0] == "f":
            w.flush()
            continue
        _, tag, first, n, stride, values = act
        steps = first + stride * np.arange(n)
        w.append_scalars(tag, steps, BASE_WALL + steps * 0.0137, values)
        w.flush()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writes(),
    st.one_of(st.none(), st.integers(1, 5)),
    st.integers(2, 6),
    st.lists(st.integers(2, 40), min_size=1, max_size=4),
    st.one_of(st.none(), st.none(), st.integers(0, 100)),
    st.one_of(st.none(), st.none(), st.integers(50, 2000)),
    st.booleans(),
)
def test_downsampling_from_summaries_equals_downsampling_every_point(
    tmp_path_factory, acts, slice_size, every, max_points, start, end, close
):
    path = tmp_path_factory.mktemp("lod") / "r"
    with warnings.catch_warnings(), lod_slice(slice_size):
        warnings.simplefilter("error")
        w = RunWriter(path, sync="never", compact_records=every)
        apply(w, acts)
        w.flush()
        if close:
            w.close()
        for tag in ("a", "b"):
            for m in max_points:
                want = full_then_downsample(path, tag, start, end, m)
                with RunReader(path) as r:
                    got = r.read_scalars(tag, start=start, end=end, max_points=m)
                assert identical(got, want), (tag, m)
                with streamed(), RunReader(path) as r:
                    got = r.read_scalars(tag, start=start, end=end, max_points=m)
                assert identical(got, want), (tag, m, "streamed")
        if not close:
            w.close()


def write_long(path, points: int, per_flush: int = 500, every: int = 8) -> None:
    rng = np.random.default_rng(7)
    w = RunWriter(path, sync="never", compact_records=every)
    for lo in range(0, points, per_flush):
        steps = np.arange(lo, lo + per_flush)
        values = rng.normal(size=per_flush)
        values[rng.random(per_flush) < 0.001] = np.nan
        w.append_scalars("loss", steps, BASE_WALL + steps * 0.02, values)
        w.flush()
    w.close()


def count_decodes(monkeypatch) -> list:
    calls: list = []
    real = _Reader._piece_points

    def counting(self, ref):
        calls.append(ref)
        return real(self, ref)

    monkeypatch.setattr(_Reader, "_piece_points", counting)
    return calls


def test_a_downsampled_read_of_blocks_decodes_no_chunk_and_reads_a_fraction(tmp_path, monkeypatch):
    write_long(tmp_path / "r", 300_000)
    want = full_then_downsample(tmp_path / "r", "loss", None, None, 200)
    size = sum(os.path.getsize(tmp_path / "r" / n) for n in os.listdir(tmp_path / "r"))
    calls = count_decodes(monkeypatch)
    with RunReader(tmp_path / "r") as r:
        before = r.statistics().bytes_read
        got = r.read_scalars("loss", max_points=200)
        read = r.statistics().bytes_read - before
    assert identical(got, want)
    assert calls == []  # every chunk answered from its summary
    assert read < size / 10, (read, size)


def test_buckets_narrower_than_two_slices_decode_the_chunks(tmp_path, monkeypatch):
    write_long(tmp_path / "r", 20_000)
    want = full_then_downsample(tmp_path / "r", "loss", None, None, 1000)  # 20 points a bucket
    calls = count_decodes(monkeypatch)
    with RunReader(tmp_path / "r") as r:
        assert identical(r.read_scalars("loss", max_points=1000), want)
    assert calls


def block_names(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if blocks.parse_block_name(n))


def chunk_frames(path, name) -> dict:
    with open(path / name, "rb") as f:
        return blocks.read_footer(f.fileno()).chunks


def test_a_damaged_summary_is_passed_over_for_the_chunk(tmp_path, monkeypatch):
    write_long(tmp_path / "r", 100_000)
    want = full_then_downsample(tmp_path / "r", "loss", None, None, 100)
    name = block_names(tmp_path / "r")[0]
    c = chunk_frames(tmp_path / "r", name)
    blob = bytearray((tmp_path / "r" / name).read_bytes())
    blob[c["lod_offset"][0] + 40] ^= 0xFF
    (tmp_path / "r" / name).write_bytes(bytes(blob))
    calls = count_decodes(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the chunk itself is intact: no damage to report
        with RunReader(tmp_path / "r") as r:
            assert identical(r.read_scalars("loss", max_points=100), want)
    assert len(calls) == 1


def test_a_damaged_value_under_a_bucket_edge_is_reported_as_a_full_read_reports_it(tmp_path):
    write_long(tmp_path / "r", 100_000)
    name = block_names(tmp_path / "r")[0]
    c = chunk_frames(tmp_path / "r", name)
    path = tmp_path / "r" / name
    blob = bytearray(path.read_bytes())
    lod = blocks.decode_lod(framing.check_frame(
        bytes(blob[c["lod_offset"][0] : c["lod_offset"][0] + 12 + c["lod_length"][0]])
    ))  # fmt: skip
    blob[c["offset"][0] + 8 + lod.cv + 8] ^= 0x01  # the second value: the first slice is read
    path.write_bytes(bytes(blob))
    with pytest.warns(CorruptionWarning):
        want = full_then_downsample(tmp_path / "r", "loss", None, None, 100)
    with pytest.warns(CorruptionWarning), RunReader(tmp_path / "r") as r:
        assert identical(r.read_scalars("loss", max_points=100), want)


def test_blocks_of_older_writers_get_summaries_while_readers_read(tmp_path, monkeypatch):
    with lod_slice(None):
        write_long(tmp_path / "r", 100_000)
    names = block_names(tmp_path / "r")
    for name in names:
        with open(tmp_path / "r" / name, "rb") as f:
            footer = blocks.read_footer(f.fileno())
        assert not blocks.has_summaries(footer)
        assert "lod_offset" not in footer.chunks
    want = full_then_downsample(tmp_path / "r", "loss", 10, None, 100)
    early = RunReader(tmp_path / "r")
    assert identical(early.read_scalars("loss", start=10, max_points=100), want)  # decoded
    with RunWriter(tmp_path / "r"), pytest.raises(RunLockedError):
        add_summaries(tmp_path / "r")
    assert add_summaries(tmp_path / "r") == len(names)
    assert add_summaries(tmp_path / "r") == 0
    assert block_names(tmp_path / "r") == names
    # The early reader holds the old footers: it notices the files changed and reads the new.
    assert identical(early.read_scalars("loss", start=10, max_points=100), want)
    assert early.read_scalars("loss").steps.tolist() == list(range(100_000))
    early.close()
    calls = count_decodes(monkeypatch)
    with RunReader(tmp_path / "r") as r:
        assert identical(r.read_scalars("loss", start=10, max_points=100), want)
    assert len(calls) <= 1  # the chunk the range cuts


def test_a_resumed_writer_gives_old_blocks_summaries_one_per_compaction(tmp_path):
    with lod_slice(None):
        write_long(tmp_path / "r", 60_000, per_flush=50)
    old = block_names(tmp_path / "r")
    assert len(old) >= 2
    w = RunWriter(tmp_path / "r", sync="never", compact_records=8)
    for i in range(60_000, 60_000 + 8 * 4 * 6):
        w.append_scalars("loss", [i], [BASE_WALL + i * 0.02], [0.0])
        w.flush()
    w.close()
    for name in block_names(tmp_path / "r"):
        with open(tmp_path / "r" / name, "rb") as f:
            assert blocks.has_summaries(blocks.read_footer(f.fileno())), name
    with RunReader(tmp_path / "r") as r:
        assert r.read_scalars("loss").steps.tolist() == list(range(60_000 + 8 * 4 * 6))


def test_the_summary_frame_is_plain_msgpack_of_the_documented_keys(tmp_path):
    write_long(tmp_path / "r", 3_000, per_flush=50)
    name = block_names(tmp_path / "r")[0]
    c = chunk_frames(tmp_path / "r", name)
    blob = (tmp_path / "r" / name).read_bytes()
    frame = blob[c["lod_offset"][0] : c["lod_offset"][0] + 12 + c["lod_length"][0]]
    lod = msgpack.unpackb(framing.check_frame(frame))
    assert sorted(lod) == sorted(
        ["S", "n", "imin", "imax", "vmin", "vmax", "smin", "smax", "wmin", "wmax", "crc",
         "crcsw", "cs", "cw", "cv"]
    )  # fmt: skip
    assert lod["n"] == c["count"][0] and len(lod["imin"]) == 4 * -(-lod["n"] // lod["S"])


def write_events(path, n: int = 3000, close: bool = True) -> None:
    w = RunWriter(path, sync="never", compact_records=8)
    for i in range(n):
        wall = BASE_WALL + i * 0.02
        w.append_scalars("x", [i], [wall], [float(i)])
        if i % 3 == 0:
            w.append_record("histogram", "h", i, wall, {"counts": [i] * (i % 7)})
            w.append_record("telemetry", None, None, wall, {"fields": {"cpu": float(i)}})
        w.flush()
    if close:
        w.close()


def count_batch_loads(monkeypatch) -> list:
    from recorder.catalog import Catalog

    calls: list = []
    real = Catalog.load

    def counting(self, entry, **kw):
        if entry.batch:
            calls.append(entry)
        return real(self, entry, **kw)

    monkeypatch.setattr(Catalog, "load", counting)
    return calls


@pytest.mark.parametrize("close", [False, True])
def test_a_limited_read_of_events_reads_each_picked_event_alone(tmp_path, monkeypatch, close):
    write_events(tmp_path / "r", close=close)
    for kind, tag in (("histogram", "h"), ("telemetry", None)):
        with RunReader(tmp_path / "r") as r:
            every = r.read_records(kind, tag)
        calls = count_batch_loads(monkeypatch)
        for limit in (1, 2, 7, 100, 999):
            with RunReader(tmp_path / "r") as r:
                got = r.read_records(kind, tag, limit=limit)
            picked = np.linspace(0, len(every) - 1, limit).round().astype(int)
            assert got == [every[i] for i in picked], (kind, limit)
        assert calls == []  # no batch was read whole
        monkeypatch.undo()


def test_batch_payloads_are_plain_msgpack_and_the_index_points_into_them(tmp_path):
    import zlib

    write_events(tmp_path / "r", 600)
    name = block_names(tmp_path / "r")[0]
    with open(tmp_path / "r" / name, "rb") as f:
        ev = blocks.read_footer(f.fileno()).events
    blob = (tmp_path / "r" / name).read_bytes()
    assert ev["idx_offset"] and all(o is not None for o in ev["idx_offset"])
    for i in range(len(ev["offset"])):
        payload = framing.check_frame(
            blob[ev["offset"][i] : ev["offset"][i] + 12 + ev["length"][i]]
        )
        assert payload == msgpack.packb(msgpack.unpackb(payload))
        data = msgpack.unpackb(payload)[4]
        frame = blob[ev["idx_offset"][i] : ev["idx_offset"][i] + 12 + ev["idx_length"][i]]
        assert ev["idx_offset"][i] == ev["offset"][i] + 12 + ev["length"][i]
        index = blocks.decode_event_index(framing.check_frame(frame), data["n"])
        for j, p in enumerate(data["p"]):
            a, n = int(index.at[j]), int(index.length[j])
            assert payload[a : a + n] == p and int(index.crc[j]) == zlib.crc32(p)


def test_a_damaged_event_is_reported_as_reading_its_batch_whole_reports_it(tmp_path, monkeypatch):
    write_events(tmp_path / "r")
    name = block_names(tmp_path / "r")[0]
    path = tmp_path / "r" / name
    with open(path, "rb") as f:
        ev = blocks.read_footer(f.fileno()).events
    i = ev["kind"].index("histogram")
    blob = bytearray(path.read_bytes())
    index = blocks.decode_event_index(
        framing.check_frame(
            bytes(blob[ev["idx_offset"][i] : ev["idx_offset"][i] + 12 + ev["idx_length"][i]])
        ),
        ev["count"][i],
    )
    blob[ev["offset"][i] + 8 + int(index.at[0]) + 3] ^= 0x01  # inside the first event
    path.write_bytes(bytes(blob))
    with pytest.warns(CorruptionWarning), RunReader(tmp_path / "r") as r:
        got = r.read_records("histogram", "h", limit=5)
    monkeypatch.setattr(_Reader, "_picked_events", lambda self, entry, local: None)
    with pytest.warns(CorruptionWarning), RunReader(tmp_path / "r") as r:
        assert got == r.read_records("histogram", "h", limit=5)  # the batch dropped alike


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["noise", "ties", "trend", "nan", "steps"]),
    st.sampled_from([2, 3, 4, 8]),
    st.lists(st.integers(4, 300), min_size=1, max_size=3),
)
def test_slices_across_bucket_edges_are_read_only_when_they_may_hold_an_extreme(
    tmp_path_factory, seed, shape, slice_size, max_points
):
    """Long series of every shape (noise, few distinct values, a trend whose extremes sit at
    the bucket edges, NaN, plateaus): a slice across a bucket edge is skipped when its summary
    shows it cannot hold the bucket's first minimum or maximum, and the result is still exactly
    the downsampling of every point."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1_000, 6_000))
    values = {
        "noise": lambda: rng.normal(size=n),
        "ties": lambda: rng.choice([0.0, -0.0, 1.0, 2.0], n),
        "trend": lambda: np.arange(n) * (1 if seed % 2 else -1) + rng.normal(size=n) * 3,
        "nan": lambda: np.where(rng.random(n) < 0.002, np.nan, rng.normal(size=n)),
        "steps": lambda: np.repeat(rng.normal(size=n // 50 + 1), 50)[:n],
    }[shape]()
    path = tmp_path_factory.mktemp("edges") / "r"
    with warnings.catch_warnings(), lod_slice(slice_size), streamed():
        warnings.simplefilter("error")
        with RunWriter(path, sync="never", compact_records=4) as w:
            for lo in range(0, n, 97):
                s = np.arange(lo, min(n, lo + 97))
                w.append_scalars("a", s, BASE_WALL + s * 0.5, values[s])
                w.flush()
        for m in max_points:
            want = full_then_downsample(path, "a", None, None, m)
            with RunReader(path) as r:
                assert identical(r.read_scalars("a", max_points=m), want), (shape, m)


def test_a_downsampled_read_of_noise_skips_most_slices_across_bucket_edges(tmp_path, monkeypatch):
    write_long(tmp_path / "r", 300_000)
    want = full_then_downsample(tmp_path / "r", "loss", None, None, 200)
    read = []
    real = reader._LodChunk.read_slices

    def counted(self, slices):
        read.extend(slices)
        return real(self, slices)

    monkeypatch.setattr(reader._LodChunk, "read_slices", counted)
    with RunReader(tmp_path / "r") as r:
        assert identical(r.read_scalars("loss", max_points=200), want)
    # 99 buckets of about 3,000 points (256-point slices): about 100 slices cross an edge or
    # hold an end; noise puts a bucket's extreme in an edge slice now and then (about a third).
    assert 2 <= len(read) < 70, len(read)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.integers(3, 400),
    st.sampled_from(["range", "u4", "i8"]),
    st.sampled_from(["us", "f8"]),
    st.lists(st.integers(2, 500), min_size=1, max_size=3),
    st.integers(0, 2**32 - 1),
)
def test_a_tag_of_one_chunk_decodes_the_steps_and_walls_of_its_picks_alone(
    tmp_path_factory, n, step_kind, wall_kind, max_points_list, seed
):
    """A bulk-written tag (one chunk in a segment) read downsampled: the values pick the points
    and only the picks' steps and walls are decoded, for every step and wall encoding, with the
    same answer, bit for bit, as downsampling every point."""
    rng = np.random.default_rng(seed)
    path = tmp_path_factory.mktemp("one")
    squares = np.arange(n, dtype=np.int64) ** 2  # irregular: no range
    steps = {"range": 5 + 3 * np.arange(n), "u4": 7 + squares, "i8": squares << 31}[step_kind]
    walls = BASE_WALL + np.cumsum(rng.random(n)) * 1.37
    if wall_kind == "f8":
        walls[n // 2] = math.nan  # a wall the us encoding cannot hold
    values = rng.choice(np.array(SPECIAL + [3.0] * 8), n) * rng.random(n)
    with RunWriter(path, sync="never") as w:
        w.append_scalars("t", steps, walls, values)
    with RunReader(path) as r:
        data = r._catalog.load(r._by_tag["t"][0], keep=False)
        assert data["s"][0] == step_kind and data["w"][0] == wall_kind
    for max_points in max_points_list:
        with RunReader(path) as r:
            got = r.read_scalars("t", max_points=max_points)
        assert identical(got, full_then_downsample(path, "t", None, None, max_points))
        assert all(col.flags.owndata or col.base is not None for col in got)


def test_a_damaged_chunk_read_downsampled_alone_is_reported_and_left_out(tmp_path):
    with RunWriter(tmp_path, sync="never") as w:
        w.append_scalars("t", np.arange(1000), BASE_WALL + np.arange(1000.0), np.ones(1000))
        w.append_scalars("u", np.arange(10), BASE_WALL + np.arange(10.0), np.ones(10))
    with RunReader(tmp_path) as r:
        entry = r._by_tag["t"][0]
    segment = os.path.join(tmp_path, "segment-000000.vdlr")
    with open(segment, "r+b") as f:
        f.seek(entry.offset + 8 + entry.length // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with RunReader(tmp_path) as r, pytest.warns(CorruptionWarning):
        got = r.read_scalars("t", max_points=100)
        assert len(got.steps) == 0
        assert len(r.read_scalars("u", max_points=100).steps) == 10
