"""A broker with reader processes sends the same snapshots, byte for byte, as one without."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import trio
import trio.testing

from recorder import ReaderPool, RunWriter
from recorder.preview import PREVIEW_NAME
from tests.conftest import wait_until
from vdl_stream import broker as broker_module
from vdl_stream.broker import Broker

WALL = 1_790_000_000.0


def write_sweep(logdir, runs: int, previews: bool = False) -> list[str]:
    """Finished runs written in bulk (as bench/runs_data.py does): three tags of 3,000 points
    (NaN and infinities among them), a group chunk of small flushes, hparams and a text; without
    their previews unless ``previews`` (as runs closed before them: their reads decode chunks)."""
    rng = np.random.default_rng(3)
    names = [f"s-{k:02d}" for k in range(runs)]
    for name in names:
        with RunWriter(logdir / name, sync="never") as w:
            for tag in ("train/loss", "eval/loss", "lr"):
                values = rng.normal(size=3_000).cumsum()
                values[rng.integers(0, 3_000, 3)] = (np.nan, np.inf, -np.inf)
                w.append_scalars(tag, np.arange(3_000), WALL + np.arange(3_000) * 0.5, values)
            w.append_record("hparams", None, 0, WALL, {"hparams": {"lr": 0.1}, "metrics": {}})
            w.flush()
            for i in range(5):
                w.append_scalars("acc", [i], [WALL + i], [i / 5])
                w.flush()
            w.append_record("text", "note", 0, WALL, {"text": name})
        if not previews:
            (logdir / name / PREVIEW_NAME).unlink()
    return names


async def snapshot_frames(logdir, names: list[str], processes: int, used: list[str]) -> list[bytes]:
    """The frames of one subscription to ``names`` (200 points a tag, split asked, as the page
    asks), from a fresh broker with ``processes`` reader processes, started and ready first."""
    broker = Broker(logdir, read_processes=processes)
    frames: list[bytes] = []

    async def keep(frame: bytes) -> None:
        frames.append(frame)

    async def drop(frame: bytes) -> None:
        pass

    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await nursery.start(broker.follow, 3600.0)  # one round: discovery, then quiet
        if processes:  # the first snapshot sent starts them
            assert not broker._reader_pool.ready
            sub = broker.subscribe({names[0]}, None)
            await broker.send_snapshot(sub, drop, 200, runs=[names[0]], split=True)
            broker.unsubscribe(sub)
            await wait_until(lambda: broker._reader_pool.ready, 60, "the reader processes")
            read = broker._reader_pool.read

            def counted(run_dir, *args):  # (every run but the first: its reads are kept)
                used.append(run_dir)
                return read(run_dir, *args)

            broker._reader_pool.read = counted
        sub = broker.subscribe(set(names), None)
        await broker.send_snapshot(sub, keep, 200, runs=names, split=True)
        broker.unsubscribe(sub)
        nursery.cancel_scope.cancel()
    return frames


async def test_snapshots_read_by_reader_processes_are_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_module, "SPLIT_RUNS_UP_TO", 4)  # more runs: each sent whole
    names = write_sweep(tmp_path, 8)
    with trio.fail_after(120):
        used: list[str] = []
        want = await snapshot_frames(tmp_path, names, 0, used)
        got = await snapshot_frames(tmp_path, names, 2, used)
    # Frames of different runs may interleave (three runs read at once): compared by run.
    assert len(got) == len(want) == len(names)
    assert sorted(got) == sorted(want)
    assert sorted(used) == sorted(str(tmp_path / n) for n in names[1:])


async def test_snapshots_of_runs_with_previews_are_the_same_bytes_and_ask_no_process(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(broker_module, "SPLIT_RUNS_UP_TO", 4)
    names = write_sweep(tmp_path, 8, previews=True)
    with trio.fail_after(120):
        used: list[str] = []
        in_threads = await snapshot_frames(tmp_path, names, 0, used)
        by_processes = await snapshot_frames(tmp_path, names, 2, used)
        for name in names:
            (tmp_path / name / PREVIEW_NAME).unlink()
        want = await snapshot_frames(tmp_path, names, 0, used)
    assert len(want) == len(names)
    assert sorted(in_threads) == sorted(by_processes) == sorted(want)
    assert used == []  # every scalar answered by the run's preview


async def test_a_pool_that_cannot_start_leaves_the_reads_to_the_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_module, "SPLIT_RUNS_UP_TO", 1)

    def fail(self) -> None:
        raise OSError("no processes here")

    monkeypatch.setattr(ReaderPool, "start", fail)
    names = write_sweep(tmp_path, 3)
    with trio.fail_after(60):
        want = await snapshot_frames(tmp_path, names, 0, [])
        broker = Broker(tmp_path, read_processes=1)
        frames: list[bytes] = []

        async def keep(frame: bytes) -> None:
            frames.append(frame)

        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(broker.follow, 3600.0)
            for _ in range(2):  # the first starts the pool (and fails); the second reads
                frames.clear()
                sub = broker.subscribe(set(names), None)
                await broker.send_snapshot(sub, keep, 200, runs=names, split=True)
                broker.unsubscribe(sub)
                await trio.testing.wait_all_tasks_blocked()
            assert not broker._reader_pool.ready
            nursery.cancel_scope.cancel()
    assert sorted(frames) == sorted(want)


async def test_a_broker_of_few_runs_starts_no_reader_process(tmp_path):
    names = write_sweep(tmp_path, 3)  # SPLIT_RUNS_UP_TO (20) or fewer: never sent whole
    frames: list[bytes] = []

    async def keep(frame: bytes) -> None:
        frames.append(frame)

    with trio.fail_after(60):
        broker = Broker(tmp_path, read_processes=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(broker.follow, 3600.0)
            sub = broker.subscribe(set(names), None)
            await broker.send_snapshot(sub, keep, 200, runs=names, split=True)
            await trio.testing.wait_all_tasks_blocked()
            assert not broker._pool_wanted.is_set()
            assert broker._reader_pool._procs == [] and not broker._reader_pool.ready
            nursery.cancel_scope.cancel()
    assert len(frames) == 2 * len(names)  # split: the scalars, then the events


async def test_a_subscription_of_many_runs_asks_for_their_files_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_module, "SPLIT_RUNS_UP_TO", 2)
    asked: list[list[str]] = []
    prefetch_runs = broker_module._prefetch_runs

    def recorded(paths):
        asked.append([p.name for p in paths])
        return prefetch_runs(paths)

    monkeypatch.setattr(broker_module, "_prefetch_runs", recorded)
    names = write_sweep(tmp_path, 4)
    frames: list[bytes] = []

    async def keep(frame: bytes) -> None:
        frames.append(frame)

    with trio.fail_after(60):
        broker = Broker(tmp_path)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(broker.follow, 3600.0)
            for runs in (names[:2], names[::-1]):  # few (split, read as they come), then many
                sub = broker.subscribe(set(runs), None)
                await broker.send_snapshot(sub, keep, 200, runs=runs, split=True)
                broker.unsubscribe(sub)
            nursery.cancel_scope.cancel()
    assert asked == [names[::-1]]  # once, for the many, in the order they are read
    assert len(frames) == 2 * 2 + 4


async def started_after(tmp_path, monkeypatch, subscriptions: list[list[str]]) -> float:
    """Seconds from the end of the last of ``subscriptions`` (each one snapshot, split asked,
    sent one right after the other) until the broker started its reader processes."""
    starts: list[float] = []
    start = ReaderPool.start

    def timed(self) -> None:
        starts.append(time.perf_counter())
        start(self)

    monkeypatch.setattr(ReaderPool, "start", timed)

    async def drop(frame: bytes) -> None:
        pass

    broker = Broker(tmp_path, read_processes=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await nursery.start(broker.follow, 3600.0)
        for runs in subscriptions:
            sub = broker.subscribe(set(runs), None)
            await broker.send_snapshot(sub, drop, 200, runs=runs, split=True)
            broker.unsubscribe(sub)
        ended = time.perf_counter()
        await wait_until(lambda: broker._reader_pool.ready, 60, "the reader processes")
        nursery.cancel_scope.cancel()
    return starts[0] - ended


async def test_the_reader_processes_start_once_snapshots_are_quiet(tmp_path, monkeypatch):
    # Their imports would compete with the page drawing the snapshots just sent.
    monkeypatch.setattr(broker_module, "SPLIT_RUNS_UP_TO", 2)
    monkeypatch.setattr(broker_module, "POOL_START_QUIET", 0.5)
    names = write_sweep(tmp_path, 4)
    with trio.fail_after(120):
        # The first snapshot over the sweep wants them; the second, sent within the quiet
        # time, puts their start off again.
        waited = await started_after(tmp_path, monkeypatch, [names[:1], names[1:2]])
    assert 0.45 <= waited < 30


async def test_a_snapshot_of_many_runs_starts_the_reader_processes_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_module, "SPLIT_RUNS_UP_TO", 2)
    monkeypatch.setattr(broker_module, "POOL_START_QUIET", 3600.0)
    names = write_sweep(tmp_path, 4)
    with trio.fail_after(120):
        # (The first wants them; the second, of more than SPLIT_RUNS_UP_TO runs, starts them.)
        waited = await started_after(tmp_path, monkeypatch, [names[:1], names])
    assert waited < 60


def test_serve_reads_in_processes_only_where_cores_are_free(monkeypatch):
    """Two cores: none (a process's reads cost more of them than the GIL they free); then the
    cores less two, at most READ_PROCESSES; by default the cores this process may run on."""
    from vdl_stream.broker import READ_PROCESSES, default_read_processes

    assert [default_read_processes(n) for n in range(1, 7)] == [0, 0, 1, 2, 2, 2]
    assert READ_PROCESSES == 2
    monkeypatch.setattr(broker_module.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert default_read_processes() == 0
    monkeypatch.setattr(broker_module.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert default_read_processes() == 2
    monkeypatch.delattr(broker_module.os, "sched_getaffinity")
    monkeypatch.setattr(broker_module.os, "cpu_count", lambda: 3)
    assert default_read_processes() == 1


def test_serve_builds_its_broker_with_the_default_reader_processes(monkeypatch):
    """``run_server`` asks default_read_processes how many reader processes its broker gets."""
    from vdl_stream import server

    asked: list[int] = []

    class Stop(Exception):
        pass

    def broker_of(logdir, **kwargs):
        asked.append(kwargs["read_processes"])
        raise Stop

    monkeypatch.setattr(server, "default_read_processes", lambda: 7)
    monkeypatch.setattr(server, "Broker", broker_of)
    with contextlib.suppress(Stop):
        trio.run(server.run_server, "/nonexistent-logdir", "127.0.0.1", 0)
    assert asked == [7]
