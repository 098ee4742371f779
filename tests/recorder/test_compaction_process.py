"""Compaction in a process of its own (``recorder.CompactionProcess``).

The process builds each new block from the files (a sealed segment read back, or the blocks of a
merge) under a temporary name of its own and fsyncs it; the owner swaps it in. These tests hold it
to what the broker relies on: the blocks are the ones the owner's thread would build, the work is
done in the other process (not here), and a SIGKILL of the process (with its block written and not
answered) or of its owner loses nothing, leaves nothing a reader sees, and is recovered from.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from recorder_testing import BASE_WALL

from recorder import CompactionProcess, RunReader, RunWriter, compaction

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(w: RunWriter, first: int, flushes: int) -> None:
    for i in range(first, first + flushes):
        steps = np.arange(3 * i, 3 * i + 3)
        w.append_scalars("x", steps, BASE_WALL + steps * 0.02, steps * 0.5)
        w.append_scalars("y", steps[:1], BASE_WALL + steps[:1] * 0.02, steps[:1] * 2.0)
        w.append_record("text", "t", i, BASE_WALL + i * 0.02, {"w": i})
        w.flush()


def process_writer(path, process: CompactionProcess) -> RunWriter:
    """A writer whose compaction is deferred and built in ``process`` (4 records a segment)."""
    return RunWriter(
        path, sync="never", compact_records=4, defer_compaction=True, compaction_process=process
    )


def contents(path) -> tuple:
    with RunReader(path) as r:
        assert r.statistics().corrupt_records == 0
        x, y = r.read_scalars("x"), r.read_scalars("y")
        ingests = [rec.data["w"] for rec in r.read_records("text")]
        return x.steps.tolist(), x.values.tolist(), y.steps.tolist(), ingests


def names(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith((".vdlb", ".vdlr", ".tmp")))


def wait_for(condition, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def process():
    with CompactionProcess() as p:
        assert p.ready(timeout=60)
        yield p


def test_the_process_builds_the_blocks_this_thread_would(tmp_path, process, monkeypatch):
    startup = process.cpu_seconds  # its imports, counted from its start
    here = RunWriter(tmp_path / "here", sync="never", compact_records=4, defer_compaction=True)
    write(here, 0, 90)
    here.compact()
    here.close()

    # The owner builds nothing itself: it could not (neither feed works in this process).
    def refuse(*args):
        raise AssertionError("a block was built in the owner's process")

    monkeypatch.setattr(compaction, "_feed_capture", refuse)
    monkeypatch.setattr(compaction, "_feed_segment", refuse)
    monkeypatch.setattr(compaction, "_feed_block", refuse)
    there = process_writer(tmp_path / "there", process)
    write(there, 0, 90)  # flushes past the bound build in the process too
    assert there.compact() is False
    there.close()  # its last segment too
    stats = there.statistics()
    monkeypatch.undo()

    assert contents(tmp_path / "there") == contents(tmp_path / "here")
    assert names(tmp_path / "there") == names(tmp_path / "here")
    assert stats.compactions >= 20 and stats.merges >= 5
    assert stats.inline_compactions > 0  # the flushes' units went to the process too
    assert process.units == stats.compactions + stats.merges
    # Its CPU is counted as the writer's compaction's (its start-up by the process alone).
    assert startup > 0 and stats.compaction_seconds >= process.cpu_seconds - startup > 0
    assert process.restarts == 0


def test_a_killed_process_loses_nothing_and_another_takes_over(tmp_path, process):
    run = tmp_path / "r"
    w = process_writer(run, process)
    write(w, 0, 9)  # sealed segments waiting (a seal every two flushes)
    sealed = w.statistics().compaction_backlog
    assert sealed >= 2
    process.hold = str(tmp_path / "held")
    swaps: list[list[str]] = []
    w._compaction.hook = lambda stage: swaps.append(names(run)) if stage == "written" else None
    t = threading.Thread(target=w.compact)
    t.start()
    wait_for(lambda: os.path.exists(process.hold), "the process to hold")
    with open(process.hold) as f:
        pid = int(f.read())
    # Stopped with its block complete and fsynced under its temporary name, not swapped in.
    assert f"block-000000-000000.vdlb.{pid}.tmp" in os.listdir(run)
    process.hold = None
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    # The unit was done again (by the next process, once up), from the files as they were: the
    # lost process's temporary block was gone before the first swap.
    assert w._compaction.lost == 1 and process.restarts == 1
    assert not any(n.endswith(f".{pid}.tmp") for n in swaps[0])
    stats = w.statistics()
    assert stats.compactions == sealed and stats.compaction_backlog == 0
    assert contents(run)[3] == list(range(9))

    # The next process takes the next units.
    assert process.ready(timeout=60) and process.pid != pid
    write(w, 9, 4)
    assert w.compact() is False
    assert w.statistics().compactions == sealed + 2 and process.units >= 2
    assert not any(n.endswith(".tmp") for n in os.listdir(run))
    w.close()
    assert contents(run)[3] == list(range(13))
    assert contents(run)[0] == list(range(39))


def test_the_process_outlives_the_thread_that_started_it(tmp_path):
    """A process started from a worker thread that then ends (a trio worker thread retires
    after a while idle) keeps serving: its life follows its owner process, not that thread."""
    with CompactionProcess() as process:
        starter = threading.Thread(target=process.ready, args=(60,))
        starter.start()
        starter.join(90)
        assert process.ready(timeout=60)
        pid = process.pid
        w = process_writer(tmp_path / "r", process)
        write(w, 0, 9)
        assert w.compact() is False
        w.close()
        assert process.units > 0 and process.restarts == 0 and process.pid == pid
    assert contents(tmp_path / "r")[3] == list(range(9))


def test_the_process_dies_with_its_owner_and_the_run_recovers(tmp_path):
    run, held = tmp_path / "r", tmp_path / "held"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(run), str(held)],
        env={
            **os.environ,
            "PYTHONPATH": os.path.join(ROOT, "tests", "recorder") + os.pathsep + ROOT,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: held.exists() or owner.poll() is not None, "the process to hold", 60)
        assert owner.poll() is None, owner.communicate()[1].decode()
        pid = int(held.read_text())
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, not yet reaped
        except FileNotFoundError:
            return True

    wait_for(gone, "the compaction process to die with its owner")
    # Its temporary block is ignored by readers, and removed by the next writer.
    assert any(n.endswith(".tmp") for n in os.listdir(run))
    assert contents(run)[3] == list(range(9))
    RunWriter(run, sync="never", compact_records=4).close()
    assert not any(n.endswith(".tmp") for n in os.listdir(run))
    assert contents(run)[3] == list(range(9))


# The owner of test_the_process_dies_with_its_owner_and_the_run_recovers: writes 9 flushes
# (fsynced: the test kills it), then compacts in a process held mid-unit.
OWNER = r"""
import sys
from recorder import CompactionProcess, RunWriter
from test_compaction_process import write

p = CompactionProcess()
w = RunWriter(
    sys.argv[1], sync="flush", compact_records=4, defer_compaction=True, compaction_process=p
)
write(w, 0, 9)
assert p.ready(timeout=60)
p.hold = sys.argv[2]
w.compact()
"""


def test_a_process_lost_again_and_again_leaves_the_units_to_this_thread(tmp_path):
    process = CompactionProcess(max_losses=2)
    w = process_writer(tmp_path / "r", process)
    write(w, 0, 13)  # sealed segments (a seal every two flushes; past the bound, some done)
    done, waiting = w.statistics().compactions, w.statistics().compaction_backlog
    built = process.units  # the flushes' units, in the process (they wait for its start)
    try:
        for losses in (1, 2):
            assert process.ready(timeout=60)
            process._proc.kill()  # before it is asked: the request finds the pipe broken
            process._proc.wait()
            assert w._compaction.step()  # lost, queued again
            assert process.losses == losses and w.statistics().compactions == done
        assert not process.usable and not process.ready()
        assert w.compact() is False  # done here
        assert w.statistics().compactions == done + waiting and process.units == built
    finally:
        process.close()
        w.close()
    assert contents(tmp_path / "r")[3] == list(range(13))


def test_a_unit_waits_for_the_process_to_start_instead_of_building_here(tmp_path, monkeypatch):
    """A unit that comes while the process is still importing waits for it: built here, it
    would hold the owner's GIL for the whole unit (seconds for a broker at 1M events/s)."""

    def refuse(*args):
        raise AssertionError("a block was built in the owner's process")

    monkeypatch.setattr(compaction, "_feed_capture", refuse)
    monkeypatch.setattr(compaction, "_feed_segment", refuse)
    with CompactionProcess() as process:
        w = process_writer(tmp_path / "r", process)
        write(w, 0, 9)  # sealed segments waiting; the process not started yet
        assert process.pid is None
        assert w.compact() is False
        w.close()
        assert process.units >= 2 and process.restarts == 0
    monkeypatch.undo()
    assert contents(tmp_path / "r")[3] == list(range(9))


def test_a_process_that_does_not_come_up_leaves_the_unit_here(tmp_path, monkeypatch):
    """The wait for the process's start is bounded: past it, the unit is built here."""
    monkeypatch.setattr(compaction, "PROCESS_START_WAIT", 0.0)
    with CompactionProcess() as process:
        w = process_writer(tmp_path / "r", process)
        write(w, 0, 5)
        assert w._compaction.step()  # the process just started, not up: built here
        assert process.units == 0 and w.statistics().compactions == 1
        w.close()
    assert contents(tmp_path / "r")[3] == list(range(5))


def test_the_process_runs_below_its_owner_priority(tmp_path):
    """Compaction takes only the CPU the live path leaves: the process is ``nice``."""
    owner = os.getpriority(os.PRIO_PROCESS, 0)
    with CompactionProcess() as process:
        assert process.ready(timeout=60)
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == min(
            owner + compaction.PROCESS_NICE, 19
        )
    with CompactionProcess(nice=0) as process:
        assert process.ready(timeout=60)
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == owner
    for bad in (-1, 20, 1.5, "10"):
        with pytest.raises(ValueError, match="nice must be an int from 0 to 19"):
            CompactionProcess(nice=bad)


def test_a_bad_compaction_process_is_refused(tmp_path):
    with pytest.raises(ValueError, match="compaction_process must be None or a CompactionProcess"):
        RunWriter(tmp_path / "r", compaction_process="yes")
