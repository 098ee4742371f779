"""The reader's cache controls and streaming read: cached_bytes, drop_cache, iter_scalars."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_testing import BASE_WALL, same_series
from test_recorder_groups import operations, run_ops

from recorder import RunReader, RunWriter, ScalarSeries
from recorder import reader as reader_module


def concatenated(pieces: list[ScalarSeries]) -> ScalarSeries:
    if not pieces:
        return ScalarSeries(np.empty(0, np.int64), np.empty(0), np.empty(0))
    return ScalarSeries(*(np.concatenate(c) for c in zip(*pieces, strict=True)))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    operations(),
    st.integers(1, 300),
    st.one_of(st.none(), st.integers(0, 200)),
    st.one_of(st.none(), st.integers(0, 400)),
    st.booleans(),
    st.sampled_from([None, 2, 5]),
)
def test_iter_scalars_concatenated_equals_read_scalars(
    tmp_path_factory, ops, chunk, start, end, warm, compact
):
    run = tmp_path_factory.mktemp("i") / "run"
    with RunWriter(run, sync="never", compact_records=compact) as w:
        run_ops(w, ops)
        w.flush()
        r = RunReader(run)  # scanned, before the index exists
    for reader in (r, RunReader(run)):
        for tag in {op[0] for op in ops}:
            if warm:
                reader.read_scalars(tag)  # the cache is used where it is loaded
            pieces = list(reader.iter_scalars(tag, start=start, end=end, max_chunk_points=chunk))
            assert all(1 <= len(p) <= chunk for p in pieces)
            want = reader.read_scalars(tag, start=start, end=end)
            assert same_series(concatenated(pieces), want), tag
            # The parts, read when asked for (some empty: superseded by a restart), likewise.
            parts = []
            for count, read in reader.iter_scalar_parts(tag, max_chunk_points=chunk):
                part = read()
                assert 1 <= count <= chunk and len(part) <= count
                parts.append(part)
            assert same_series(concatenated(parts), reader.read_scalars(tag)), tag
        reader.close()


def test_scalar_parts_decode_only_the_chunks_read(tmp_path, monkeypatch):
    """Chunks of 65,536 points, grouped when small, sliced when large: a consumer reading every
    other part decodes every other chunk, not all of them."""
    from recorder import codec

    n = 5 * 65_536 + 100
    with RunWriter(tmp_path / "r") as w:
        w.append_scalars("a", np.arange(n), BASE_WALL + np.arange(n), np.arange(n) * 0.5)
    decoded: list[int] = []
    decode = codec.decode_scalars

    def counting(data, at=None):
        decoded.append(data["n"])
        return decode(data, at)

    monkeypatch.setattr(codec, "decode_scalars", counting)
    with RunReader(tmp_path / "r") as r:
        parts = list(r.iter_scalar_parts("a"))
        assert [c for c, _ in parts] == [65_536] * 5 + [100] and not decoded
        got = [read() for _, read in parts[::2]]
        assert decoded == [65_536] * 3
        assert [int(p.steps[0]) for p in got] == [0, 2 * 65_536, 4 * 65_536]
        decoded.clear()
        halves = list(r.iter_scalar_parts("a", max_chunk_points=32_768))
        assert [c for c, _ in halves] == [32_768] * 10 + [100]
        assert same_series(concatenated([read() for _, read in halves]), r.read_scalars("a"))
        assert decoded == [65_536] * 5 + [100]  # each chunk once for its two slices
        with pytest.raises(ValueError, match="max_chunk_points must be an int >= 1, got 0"):
            r.iter_scalar_parts("a", max_chunk_points=0)


def test_iter_scalars_of_an_unknown_tag_is_empty_and_bad_arguments_are_refused(tmp_path):
    with RunWriter(tmp_path / "r") as w:
        w.append_record("text", "t", 1, BASE_WALL, {"text": "x"})
        w.append_scalars("a", [0], [BASE_WALL], [1.0])
    with RunReader(tmp_path / "r") as r:
        assert list(r.iter_scalars("nope")) == []
        with pytest.raises(ValueError, match="max_chunk_points must be an int >= 1, got 0"):
            r.iter_scalars("a", max_chunk_points=0)
        with pytest.raises(ValueError, match="holds 'text' records, not scalars"):
            r.iter_scalars("t")


def test_cached_bytes_grow_with_reads_and_drop_cache_frees_them(tmp_path):
    n = 200_000
    with RunWriter(tmp_path / "r") as w:
        for tag in ("a", "b"):
            w.append_scalars(tag, np.arange(n), BASE_WALL + np.arange(n), np.arange(n) * 0.5)
        for i in range(50):  # small flushes: group chunks
            w.append_scalars("a", [n + i], [BASE_WALL], [1.0])
            w.append_scalars("c", [i], [BASE_WALL], [2.0])
            w.flush()
    r = RunReader(tmp_path / "r")
    before = r.cached_bytes()
    assert before < 100_000  # the index holds summaries only
    full = r.read_scalars("a")
    assert r.cached_bytes() >= 24 * len(full)
    r.read_scalars("c")
    r.drop_cache()
    assert r.cached_bytes() < 100_000
    again = r.read_scalars("a")  # read again from disk
    assert same_series(again, full)
    assert r.read_scalars("c").values.tolist() == [2.0] * 50
    assert r.read_scalars("a", max_points=100).steps[-1] == n + 49
    r.close()


def test_iter_scalars_memory_is_bounded_by_the_chunk_size(tmp_path):
    n = 1_000_000
    with RunWriter(tmp_path / "r") as w:
        w.append_scalars("x", np.arange(n), BASE_WALL + np.arange(n) * 0.1, np.ones(n))
    with RunReader(tmp_path / "r") as r:
        total = 0
        for piece in r.iter_scalars("x", max_chunk_points=10_000):
            assert len(piece) <= 10_000
            total += len(piece)
            assert r.cached_bytes() < 2_000_000  # nothing of the series is kept
        assert total == n


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    operations(),
    st.integers(2, 40),
    st.one_of(st.none(), st.integers(0, 200)),
    st.one_of(st.none(), st.integers(0, 400)),
    st.data(),
)
def test_max_points_read_chunk_by_chunk_equals_downsampling_the_whole_series(
    tmp_path_factory, monkeypatch, ops, max_points, start, end, data
):
    from recorder.downsample import downsample

    run = tmp_path_factory.mktemp("d") / "run"
    with RunWriter(run, sync="never", compact_records=data.draw(st.sampled_from([None, 3]))) as w:
        for i, (tag, first, n, flush) in enumerate(ops):
            steps = np.arange(first, first + n)
            values = i * 1000.0 + np.arange(n)
            if data.draw(st.booleans()):  # ties, NaN and infinities: argmin/argmax edge cases
                rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
                pool = [[0.0, 1.0], [0.0, 1.0, -1.0, np.inf], [0.0, np.nan, -np.inf]]
                values = rng.choice(pool[data.draw(st.integers(0, 2))], n)
            w.append_scalars(tag, steps, BASE_WALL + steps * 0.5, values)
            if flush:
                w.flush()
    for tag in {op[0] for op in ops}:
        cold = RunReader(run)  # nothing loaded: read chunk by chunk
        with monkeypatch.context() as m:
            m.setattr(reader_module, "SMALL_DOWNSAMPLE", 0)  # short tags too (else decoded whole)
            got = cold.read_scalars(tag, start=start, end=end, max_points=max_points)
        assert not cold.cached_bytes() or cold.cached_bytes() < 50_000
        with RunReader(run) as fresh:  # a short tag decoded whole, downsampled at once
            whole = fresh.read_scalars(tag, start=start, end=end, max_points=max_points)
        warm = RunReader(run)
        want = downsample(warm.read_scalars(tag, start=start, end=end), max_points)
        assert same_series(got, want), (tag, got, want)
        assert same_series(whole, want), (tag, whole, want)
        assert same_series(
            warm.read_scalars(tag, start=start, end=end, max_points=max_points), want
        )
        cold.close()
        warm.close()


def test_streaming_reads_share_decoded_group_chunks_within_a_bound(tmp_path, monkeypatch):
    """Every tag of a live tail has a part in each group chunk: a downsampled read of the
    second tag decodes none of them again, and what is kept stays under its budget."""
    import recorder.reader as reader_module

    with RunWriter(tmp_path / "r", compact_records=None) as w:
        for i in range(400):  # one point per tag per flush: group chunks
            for tag in ("a", "b"):
                w.append_scalars(tag, [i], [BASE_WALL + i], [float(i)])
            w.flush()
    loads = []
    with RunReader(tmp_path / "r") as r:
        original = r._catalog.load

        def counted(entry, **kw):
            loads.append(entry)
            return original(entry, **kw)

        monkeypatch.setattr(r._catalog, "load", counted)
        assert r.read_scalars("a", max_points=50).steps[-1] == 399
        first = len(loads)
        assert first >= 400 and r.cached_bytes() > 0
        assert r.read_scalars("b", max_points=50).values[-1] == 399.0
        assert len(loads) == first  # the groups came from the reader's cache
        r.drop_cache()
        assert r.cached_bytes() < 100_000
        monkeypatch.setattr(reader_module, "GROUP_CACHE_BYTES", 1_000)
        r.read_scalars("a", max_points=50)
        assert r._groups_bytes <= 1_000 + 400  # one group over the bound at most


def test_a_downsampled_read_asked_again_is_kept_until_the_run_changes(tmp_path, monkeypatch):
    """A page reloaded (or a run selected again) asks the same downsampled reads: they are kept
    and read nothing, until the reader reads more of the run, finds damage or drops its cache."""
    writer = RunWriter(tmp_path / "r", sync="never")
    for i in range(20):
        steps = np.arange(i * 1000, (i + 1) * 1000)
        writer.append_scalars("a", steps, BASE_WALL + steps, np.sin(steps * 0.01))
        writer.flush()
    loads = []  # downsampled reads made from the run's chunks
    original = RunReader._downsample_stream

    def counted(self, *args):
        loads.append(args)
        return original(self, *args)

    monkeypatch.setattr(RunReader, "_downsample_stream", counted)
    r = RunReader(tmp_path / "r")
    first = r.read_scalars("a", max_points=100)
    read = len(loads)
    assert read == 1
    assert r.cached_bytes() >= sum(col.nbytes for col in first)
    again = r.read_scalars("a", max_points=100)
    assert len(loads) == read  # kept: nothing read
    assert same_series(again, first)
    assert not again.values.flags.writeable
    other = r.read_scalars("a", start=5000, max_points=100)  # another read is its own
    assert len(loads) > read and other.steps[0] == 5000
    # More of the run: the kept read is stale and is read again, with the new points.
    writer.append_scalars("a", [20_000], [BASE_WALL + 20_000], [9.0])
    writer.flush()
    assert r.refresh()
    read = len(loads)
    fresh = r.read_scalars("a", max_points=100)
    assert len(loads) > read and fresh.steps[-1] == 20_000 and fresh.values[-1] == 9.0
    read = len(loads)
    r.drop_cache()
    r.read_scalars("a", max_points=100)
    assert len(loads) > read
    writer.close()
    r.close()
