"""The follow loop over many finished runs: an idle round lists none of them (vdl_stream/following.py),
yet whatever another process does to a run (appends, new segments, compaction) is still read.

Real runs on disk written by RunWriter, writers in other processes, a real Broker following them.
Finished runs are given modification times an hour old, as a sweep written earlier has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio

import recorder
from vdl_stream import following
from vdl_stream.broker import Broker

REPO = Path(__file__).resolve().parent.parent
TAG = "train/loss"
RUNS = 120

# Another process appending points [start, stop) to a run, a flush every 5 points.
WRITE = """
import sys
import numpy as np
import recorder
path, start, stop, segment_bytes, compact = sys.argv[1:6]
compact = None if compact == "none" else int(compact)
with recorder.RunWriter(path, sync="never", segment_bytes=int(segment_bytes),
                        compact_records=compact) as w:
    for lo in range(int(start), int(stop), 5):
        s = np.arange(lo, min(lo + 5, int(stop)))
        w.append_scalars("train/loss", s, 1.7e9 + s, s * 0.5)
        w.flush()
"""


def write_elsewhere(
    run: Path, steps: range, *, segment_bytes: int = 64 << 20, compact: int | None = None
) -> None:
    """Append ``steps`` to ``run`` from another process (real files, another writer)."""
    done = subprocess.run(
        [
            *(sys.executable, "-c", WRITE, str(run), str(steps.start), str(steps.stop)),
            *(str(segment_bytes), "none" if compact is None else str(compact)),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def age(path: Path, seconds: float = 3600) -> None:
    """Set the modification time of ``path`` and everything under it ``seconds`` back."""
    old = time.time_ns() - int(seconds * 1e9)
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), ns=(old, old))
        os.utime(dirpath, ns=(old, old))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A log directory of ``RUNS`` finished runs of 20 points each, an hour old."""
    logdir = tmp_path / "logs"
    for i in range(RUNS):
        with recorder.RunWriter(logdir / f"r{i:03d}", sync="never") as w:
            s = np.arange(20)
            w.append_scalars(TAG, s, 1.7e9 + s, s * 0.5)
    age(logdir)
    return logdir


async def wait_rounds(broker: Broker, n: int) -> None:
    """Wait until the follow loop completed ``n`` more rounds."""
    start = broker.follow_statistics().rounds
    for _ in range(100_000):  # bounded in count; the test's fail_after bounds it in time
        if broker.follow_statistics().rounds >= start + n:
            return
        await trio.sleep(0.01)
    raise AssertionError(f"the follow loop did not complete {n} rounds")


async def follow_and_read(broker: Broker, nursery: trio.Nursery, run: Path):
    """Start ``broker`` following every 20 ms, subscribe, wait three rounds and read ``run``
    once, as a page would: from then on what is appended to it is fanned out live. Returns the
    subscription."""
    await nursery.start(broker.run)
    await nursery.start(partial(broker.follow, 0.02))
    sub = broker.subscribe()
    await wait_rounds(broker, 3)
    series = await broker.read_scalars(run.name, TAG, start=None, end=None, max_points=None)
    assert len(series.steps) == 20
    return sub


async def received_steps(sub, run: str, count: int) -> list[float]:
    """Steps of ``run`` in the data frames ``sub`` receives, until there are ``count``."""
    steps: list[float] = []
    while len(steps) < count:
        message = msgpack.unpackb(await sub.receive())
        if message["type"] == "data" and message["run"] == run:
            for tag, s, _, _ in message["scalars"]:
                if tag == TAG:
                    steps.extend(np.frombuffer(s, "<f8").tolist())
    return steps


async def test_an_idle_round_over_many_finished_runs_lists_none_of_them(sweep, monkeypatch):
    listings = [0]
    scandir = os.scandir

    def counted(*args, **kwargs):
        listings[0] += 1
        return scandir(*args, **kwargs)

    monkeypatch.setattr(os, "scandir", counted)  # every directory listing (os.walk's too)
    broker = Broker(sweep)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(partial(broker.follow, 0.02))
            await wait_rounds(broker, 3)
            assert len(broker.runs()) == RUNS
            before, start = listings[0], broker.follow_statistics().rounds
            await wait_rounds(broker, 2 * following.RECHECK_ROUNDS)
            rounds = broker.follow_statistics().rounds - start
            # Listing every run's directory to discover it and again to tail it: 2 * RUNS a
            # round. Now only the runs on their recheck turn (RUNS / RECHECK_ROUNDS a round on
            # average, twice) and the reader the loop opens ahead of a page, one a round.
            per_round = (listings[0] - before) / rounds
            assert per_round < RUNS / 4, per_round
            stats = broker.follow_statistics()
            assert stats.runs_probed == RUNS
            assert stats.dirs_statted == RUNS + 1
            assert stats.runs_listed < RUNS / 4, stats
            assert stats.dirs_listed < RUNS / 4, stats
            # A probe stats each run's head segment; a listing each of its data files.
            assert stats.files_statted <= RUNS + 3 * stats.runs_listed, stats
            nursery.cancel_scope.cancel()


async def test_a_head_segment_grown_by_another_process_is_tailed_even_with_its_mtime_put_back(
    sweep, monkeypatch
):
    monkeypatch.setattr(following, "RECHECK_ROUNDS", 1 << 30)  # no safety net: the probe finds it
    broker = Broker(sweep)
    run = sweep / "r007"
    (head,) = sorted(run.glob("segment-*.vdlr"))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            sub = await follow_and_read(broker, nursery, run)
            old, old_dir = head.stat().st_mtime_ns, run.stat().st_mtime_ns
            # Written while the event loop waits (no round runs until the mtimes are put back).
            write_elsewhere(run, range(20, 35))
            # A clock too coarse to tell the append apart, and a directory whose new index and
            # digest left no trace: only the head segment's size says that it grew.
            os.utime(head, ns=(old, old))
            os.utime(run, ns=(old_dir, old_dir))
            assert sorted(run.glob("segment-*.vdlr")) == [head]
            assert await received_steps(sub, "r007", 15) == list(range(20, 35))
            series = await broker.read_scalars("r007", TAG, start=None, end=None, max_points=None)
            assert series.steps.tolist() == list(range(35))
            nursery.cancel_scope.cancel()


async def test_runs_rotated_and_compacted_by_another_process_are_read_whole(sweep, monkeypatch):
    monkeypatch.setattr(following, "RECHECK_ROUNDS", 1 << 30)  # no safety net: the probe finds it
    broker = Broker(sweep)
    run = sweep / "r011"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            sub = await follow_and_read(broker, nursery, run)
            before = sorted(p.name for p in run.iterdir())
            # Sealed every two records (a new segment), and compacted into blocks.
            await trio.to_thread.run_sync(partial(write_elsewhere, run, range(20, 60), compact=2))
            after = sorted(p.name for p in run.iterdir())
            assert any(name.startswith("block-") for name in after), after
            assert "segment-000000.vdlr" not in after, (before, after)  # compacted away
            assert sorted(await received_steps(sub, "r011", 40)) == list(range(20, 60))
            await wait_rounds(broker, 2)
            series = await broker.read_scalars("r011", TAG, start=None, end=None, max_points=None)
            assert series.steps.tolist() == list(range(60))
            # and it is still tailed after
            await trio.to_thread.run_sync(partial(write_elsewhere, run, range(60, 65), compact=2))
            assert await received_steps(sub, "r011", 5) == list(range(60, 65))
            nursery.cancel_scope.cancel()


async def test_a_new_segment_hidden_from_directory_mtimes_is_found_by_the_recheck(
    sweep, monkeypatch
):
    """A filesystem that does not keep directory mtimes (some network and FUSE mounts): a new
    segment (the head untouched) is still found, by each run's turn to be listed in full."""
    monkeypatch.setattr(following, "RECHECK_ROUNDS", 5)
    broker = Broker(sweep)
    run = sweep / "r003"
    (head,) = sorted(run.glob("segment-*.vdlr"))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            sub = await follow_and_read(broker, nursery, run)
            head_before = head.stat()
            dir_before = run.stat()
            # The head is past segment_bytes: the writer starts segment 1 before writing.
            # Written while the event loop waits (no round runs until the mtime is put back).
            write_elsewhere(run, range(20, 25), segment_bytes=head_before.st_size)
            old = dir_before.st_mtime_ns
            os.utime(run, ns=(old, old))  # as if the directory's mtime never moved
            assert (run / "segment-000001.vdlr").exists()
            head_after = head.stat()
            assert (head_after.st_size, head_after.st_mtime_ns) == (
                head_before.st_size,
                head_before.st_mtime_ns,
            )
            dir_after = run.stat()
            if (dir_after.st_ino, dir_after.st_size) != (dir_before.st_ino, dir_before.st_size):
                pytest.skip("this filesystem's directory size moved: the key changed anyway")
            assert await received_steps(sub, "r003", 5) == list(range(20, 25))
            nursery.cancel_scope.cancel()


def test_discovery_finds_what_list_runs_finds_listing_only_changed_directories(tmp_path):
    logdir = tmp_path / "logs"
    for name in ["a", "exp1/train", "exp1/eval", "exp2/deep/run", "a/nested"]:
        with recorder.RunWriter(logdir / name, sync="never") as w:
            w.append_scalars(TAG, np.arange(3), 1.7e9 + np.arange(3), np.zeros(3))
    (logdir / "empty" / "dir").mkdir(parents=True)
    (logdir / "linked").symlink_to(logdir / "exp1")  # not entered, as os.walk does not
    age(logdir)
    state = following.FollowState(logdir)
    assert state.find_runs() == recorder.list_runs(logdir)
    assert state.find_runs() == ["a", "a/nested", "exp1/eval", "exp1/train", "exp2/deep/run"]
    state.start_round()
    state.find_runs()
    state.start_round()
    stats = state.statistics()
    assert stats.dirs_statted == 11  # the root and the 10 directories under it, each once
    assert stats.dirs_listed <= 2, stats  # (only those on their recheck turn)
    # A run appears deep in an old directory; one goes; nothing else is listed for it.
    with recorder.RunWriter(logdir / "exp2" / "deep" / "late", sync="never") as w:
        w.append_scalars(TAG, np.arange(3), 1.7e9 + np.arange(3), np.zeros(3))
    for path in (logdir / "exp1" / "eval").iterdir():
        path.unlink()
    (logdir / "exp1" / "eval").rmdir()
    assert state.find_runs() == recorder.list_runs(logdir)
    assert "exp2/deep/late" in state.find_runs() and "exp1/eval" not in state.find_runs()
    shutil.rmtree(logdir)
    assert state.find_runs() == [] == recorder.list_runs(logdir)


def test_a_linked_log_directory_finds_a_run_created_in_its_target(tmp_path, monkeypatch):
    """``--logdir`` may be a symbolic link: a run created in its target is found next round
    (the link's own mtime never moves)."""
    monkeypatch.setattr(following, "RECHECK_ROUNDS", 1 << 30)  # no safety net
    target = tmp_path / "logs"
    with recorder.RunWriter(target / "a", sync="never") as w:
        w.append_scalars(TAG, np.arange(3), 1.7e9 + np.arange(3), np.zeros(3))
    link = tmp_path / "link"
    link.symlink_to(target)
    age(target)
    old = time.time_ns() - 3600 * 10**9
    os.utime(link, ns=(old, old), follow_symlinks=False)
    state = following.FollowState(link)
    assert state.find_runs() == ["a"]
    state.start_round()
    with recorder.RunWriter(target / "b", sync="never") as w:
        w.append_scalars(TAG, np.arange(3), 1.7e9 + np.arange(3), np.zeros(3))
    assert state.find_runs() == ["a", "b"]
