"""ReaderPool: a worker process's downsampled reads are the asking reader's, value for value."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from recorder_testing import BASE_WALL

import recorder.reader_pool as reader_pool_module
from recorder import ReaderPool, RunReader, RunWriter, ScalarSeries
from recorder.preview import PREVIEW_NAME
from recorder.reader_pool import prefetch, read_downsampled


def write_sweep_run(path) -> None:
    """A run as a sweep writes it in bulk (one 10,000-point chunk a tag) plus a resumed tag (a
    restart: two chunks), small flushes (group chunks), NaN and infinities, and an event; without
    its preview (as a run closed before previews), so that downsampled reads decode its chunks."""
    rng = np.random.default_rng(7)
    n = 10_000
    with RunWriter(path, sync="never") as w:
        values = rng.normal(size=n).cumsum()
        values[[17, 4_000]] = np.nan
        values[[900, 9_999]] = np.inf, -np.inf
        w.append_scalars("loss", np.arange(n), BASE_WALL + np.arange(n) * 0.37, values)
        w.append_scalars("lr", np.arange(n) * 3, BASE_WALL + np.arange(n), rng.random(n))
        w.flush()
        w.append_scalars(
            "lr", np.arange(5_000, 8_000), BASE_WALL + n + np.arange(3_000), rng.random(3_000)
        )
        for i in range(40):
            w.append_scalars("acc", [i], [BASE_WALL + i], [i / 40])
            w.flush()
        w.append_record("text", "note", 0, BASE_WALL, {"text": "x"})
    os.remove(os.path.join(path, PREVIEW_NAME))


def same_bits(a: ScalarSeries, b: ScalarSeries) -> bool:
    """The same columns, dtype and bytes (NaN payloads included)."""
    return all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b, strict=True)
    )


def test_a_pool_process_reads_the_points_the_asking_reader_reads(tmp_path):
    run = tmp_path / "run"
    write_sweep_run(run)
    tags = ["acc", "loss", "lr", "missing"]
    pool = ReaderPool(1)
    try:
        pool.start()
        assert pool.ready
        with RunReader(run) as reader:
            position = reader.position()
            got, other = pool.read(str(run), position, tags, 200, lambda: 7)
            assert other == 7
            assert got is not None
            for max_points in (200, 2):
                got_here = read_downsampled(str(run), position, tags, max_points)
                with RunReader(run) as other:
                    want = [other.read_scalars(t, max_points=max_points) for t in tags]
                assert all(same_bits(a, b) for a, b in zip(got_here, want, strict=True))
            want = [reader.read_scalars(t, max_points=200) for t in tags]
            assert [len(s.steps) for s in want] == [40, 198, 198, 0]
            assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    finally:
        pool.close()
    assert not pool.ready
    with pytest.raises(RuntimeError, match="the reader pool is not started"):
        pool.read(str(run), position, tags, 200, lambda: None)


def test_a_read_kept_from_elsewhere_answers_the_reader_until_it_reads_more(tmp_path):
    run = tmp_path / "run"
    write_sweep_run(run)
    with RunReader(run) as reader:
        assert reader.read_scalars_kept("loss", 200) is None  # nothing read yet
        elsewhere = read_downsampled(str(run), reader.position(), ["loss"], 200)
        assert elsewhere is not None
        reader.keep_scalars("loss", 200, elsewhere[0])
        kept = reader.read_scalars_kept("loss", 200)
        assert kept is not None and kept.values is elsewhere[0].values
        assert not kept.values.flags.writeable
        assert reader.read_scalars("loss", max_points=200).values is elsewhere[0].values
        assert reader.read_scalars_kept("loss", 100) is None  # another read
        with RunWriter(run, sync="never") as w:  # more appended: what was kept is dropped
            w.append_scalars("loss", [10_000], [BASE_WALL], [1.0])
        os.remove(os.path.join(run, PREVIEW_NAME))  # its close's preview would answer
        assert reader.refresh()
        assert reader.read_scalars_kept("loss", 200) is None


def test_a_damaged_or_shorter_run_is_left_to_the_asking_reader(tmp_path):
    run = tmp_path / "run"
    write_sweep_run(run)
    with RunReader(run) as reader:
        position = reader.position()
        assert read_downsampled(str(run), position, ["loss"], 200) is not None
    segment = sorted(p for p in run.iterdir() if p.name.startswith("segment-"))[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 4] ^= 0xFF  # inside the first chunk's payload
    segment.write_bytes(bytes(data))
    (run / "index.vdli").unlink(missing_ok=True)
    assert read_downsampled(str(run), position, ["loss", "lr"], 200) is None


def test_reader_pool_arguments_are_checked():
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match=f"processes must be a positive int, got {bad!r}"):
            ReaderPool(bad)


def test_a_lost_process_closes_the_pool(tmp_path):
    run = tmp_path / "run"
    write_sweep_run(run)
    with ReaderPool(1) as pool, RunReader(run) as reader:
        pool.start()
        (proc,) = pool._procs
        proc.kill()
        proc.wait()
        with pytest.raises(RuntimeError, match=f"the reader process {proc.pid} was lost"):
            pool.read(str(run), reader.position(), ["loss"], 200, lambda: None)
        assert not pool.ready


def test_an_unreadable_run_or_a_failing_meanwhile_leaves_the_process_usable(tmp_path):
    run = tmp_path / "run"
    write_sweep_run(run)
    with ReaderPool(1) as pool, RunReader(run) as reader:
        pool.start()
        position = reader.position()
        # The process's reader raised NotARunError: the asking side reads it (and reports).
        assert pool.read(str(tmp_path / "nope"), position, ["loss"], 200, lambda: 1) == (None, 1)

        def fail() -> None:
            raise ValueError("the events")

        with pytest.raises(ValueError, match="the events"):
            pool.read(str(run), position, ["loss"], 200, fail)
        assert pool.ready
        got, _ = pool.read(str(run), position, ["loss"], 200, lambda: None)
        assert same_bits(got[0], reader.read_scalars("loss", max_points=200))


def test_a_read_waiting_for_a_process_is_woken_when_the_pool_closes(tmp_path):
    run = tmp_path / "run"
    write_sweep_run(run)
    pool = ReaderPool(1)
    pool.start()
    with RunReader(run) as reader:
        position = reader.position()
        started, failed = threading.Event(), []

        def second_read() -> None:  # waits for the one process, busy in the first read
            started.set()
            try:
                pool.read(str(run), position, ["loss"], 200, lambda: None)
            except RuntimeError as exc:
                failed.append(str(exc))

        thread = threading.Thread(target=second_read)

        def meanwhile() -> None:
            thread.start()
            assert started.wait(10)
            pool.close()  # both reads fail: the one under way, and the one waiting for it

        with pytest.raises(RuntimeError, match=r"the reader process \d+ was lost"):
            pool.read(str(run), position, ["loss"], 200, meanwhile)
        thread.join(10)
        assert not thread.is_alive()
    assert failed in (
        ["the reader pool is closed"],
        ["the reader pool is not started"],  # (it had not reached the queue yet)
    )


def test_prefetch_asks_the_os_for_every_file_of_a_run_and_skips_a_large_or_missing_one(
    tmp_path, monkeypatch
):
    run = tmp_path / "run"
    write_sweep_run(run)
    sizes = {p.name: p.stat().st_size for p in run.iterdir() if p.is_file()}
    asked: list[tuple[int, int, int, int]] = []
    advise = reader_pool_module.os.posix_fadvise

    def recorded(fd: int, offset: int, length: int, advice: int) -> None:
        asked.append((fd, offset, length, advice))
        advise(fd, offset, length, advice)

    monkeypatch.setattr(reader_pool_module.os, "posix_fadvise", recorded)
    assert prefetch(run) == sum(sizes.values()) > 100_000
    assert len(asked) == len(sizes)  # each file, whole, read ahead
    assert {(o, n, a) for _, o, n, a in asked} == {
        (0, 0, reader_pool_module.os.POSIX_FADV_WILLNEED)
    }
    asked.clear()
    assert prefetch(run, max_bytes=sum(sizes.values()) - 1) == 0  # a long run: its reads decide
    assert prefetch(tmp_path / "gone") == 0
    assert asked == []
