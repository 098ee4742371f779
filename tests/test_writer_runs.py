"""Runs over time: durability at flush() under SIGKILL, resumed runs, ranks, telemetry."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import recorder
from tests import fake_pynvml
from tests.conftest import http_get, stop_serve, wait_for
from vdl_stream import LogWriter, SummaryWriter, attach, codec


def test_a_process_killed_right_after_flush_loses_nothing(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, vdl_stream
        w = vdl_stream.attach({str(tmp_path)!r}, run="killed", telemetry=False)
        for step in range(20_000):
            w.add_scalar("loss", step * 2.0, step)
        w.add_histogram("h", list(range(10)), 1)
        assert w.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr
    with recorder.RunReader(tmp_path / "killed") as reader:
        assert reader.read_scalars("loss").values.tolist() == [s * 2.0 for s in range(20_000)]
        assert len(reader.read_records(kind="histogram")) == 1


def test_attaching_to_a_run_again_appends_and_a_restore_supersedes(tmp_path):
    with attach(tmp_path, run="resumed", telemetry=False) as w:
        for step in range(100):
            w.add_scalar("loss", 1.0, step)
    with attach(tmp_path, run="resumed", telemetry=False) as w:  # training continued
        for step in range(100, 200):
            w.add_scalar("loss", 2.0, step)
    with attach(
        tmp_path, run="resumed", telemetry=False
    ) as w:  # restored from a step-150 checkpoint
        for step in range(150, 160):
            w.add_scalar("loss", 3.0, step)
    with recorder.RunReader(tmp_path / "resumed") as reader:
        series = reader.read_scalars("loss")
    assert series.steps.tolist() == list(range(160))
    assert series.values.tolist() == [1.0] * 100 + [2.0] * 50 + [3.0] * 10


def _telemetry_points(run_dir) -> int:
    """Points of the run's telemetry tag with the most (0 before the run is written)."""
    try:
        with recorder.RunReader(run_dir) as reader:
            tags = reader.tags()
    except recorder.NotARunError:  # not written yet
        return 0
    return max((i.count for t, i in tags.items() if t.startswith("@telemetry/")), default=0)


def test_only_rank_zero_logs_by_default_but_every_rank_sends_telemetry(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with attach(tmp_path, telemetry_interval=0.1) as w:
        w.add_scalar("loss", 1.0, 0)  # accepted and dropped: rank 1 does not log
        wait_for(lambda: _telemetry_points(tmp_path / w.run) >= 1, what="a telemetry sample")
    assert w.run.startswith("job-") and w.run.endswith("/rank1")
    with recorder.RunReader(tmp_path / w.run) as reader:
        tags = reader.tags()
    # Telemetry travels as "@telemetry/<host>/rank<r>/<field>" scalars; nothing else was logged.
    assert all(t.startswith("@telemetry/") for t in tags), sorted(tags)
    assert tags and all(t.split("/")[2] == "rank1" for t in tags)
    with attach(tmp_path, all_ranks=True, telemetry=False) as w2:
        w2.add_scalar("loss", 1.0, 0)
    assert w2.run == w.run  # same job, same run: every rank logs as <run>/rank<N>
    with recorder.RunReader(tmp_path / w2.run) as reader:
        assert reader.read_scalars("loss").values.tolist() == [1.0]


def test_gpu_telemetry_travels_with_the_run(tmp_path, monkeypatch):
    device = fake_pynvml.FakeDevice(0, util=87, mem_used=3 << 30, mem_total=80 << 30)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make_module([device]))
    with attach(tmp_path, run="gpu", telemetry_interval=0.1) as w:
        for step in range(10):
            w.add_scalar("loss", float(np.float32(step)), step)
        wait_for(lambda: _telemetry_points(tmp_path / "gpu") >= 2, what="two samples")
    with recorder.RunReader(tmp_path / "gpu") as reader:
        tags = reader.tags()
        host = socket.gethostname()
        util = reader.read_scalars(f"@telemetry/{host}/rank0/gpu0/util")
        mem = reader.read_scalars(f"@telemetry/{host}/rank0/gpu0/mem_used")
    assert len(util.values) >= 2 and set(util.values.tolist()) == {87.0}
    assert mem.values[-1] == float(3 << 30)
    assert f"@telemetry/{host}/rank0/ram/used" in tags
    # A telemetry point's step is its wall time in milliseconds (always growing).
    assert util.steps.tolist() == [int(w * 1000) for w in util.walls.tolist()]


def test_flush_is_confirmed_even_when_its_request_races_the_pump(tmp_path, monkeypatch):
    from vdl_stream.writer import Writer

    original = Writer._call_soon

    def late(self, fn, *args):
        time.sleep(0.2)  # the pump swaps its list of pending flushes meanwhile
        original(self, fn, *args)

    monkeypatch.setattr(Writer, "_call_soon", late)
    with attach(tmp_path, run="race", telemetry=False) as w:
        w.add_scalar("x", 1.0, 0)
        assert w.flush(timeout=5) is True


@pytest.mark.parametrize(
    ("run", "text"),
    [
        ("a\u202eb", r"invisible.*U\+202E"),
        ("a\u2028b", r"U\+2028"),
        ("a\u200bb", r"U\+200B"),
        ("a\ufeffb", r"U\+FEFF"),
        ("a\ud800b", r"U\+D800"),
        ("exp/\u2066x", r"U\+2066"),
        ("x" * 256, "at most 255 bytes"),
        ("é" * 128, "at most 255 bytes"),
        ("exp1/segment-000000.vdlr", "clashes with the record format"),
        ("exp1/index.vdli", "clashes"),
        ("exp1/index.vdli.tmp", "clashes"),
        ("exp1/writer.lock", "clashes"),
        ("exp1/x.TMP", "clashes"),
        ("a/segment-000001.vdlr/b", "clashes"),
        ("/abs", "relative path"),
        ("a//b", "relative path"),
        ("a/./b", "relative path"),
        ("..", "relative path"),
        (b"run", "non-empty str"),
        ("", "non-empty str"),
    ],
)
def test_run_names_are_checked_for_what_a_directory_or_a_screen_would_garble(run, text):
    with pytest.raises(ValueError, match=text):
        codec.check_run_name(run)


@pytest.mark.parametrize(
    "run", ["exp1", "exp1/train", "运行-1", "a b", "x" * 255, "é" * 127, "v1.2"]
)
def test_plain_run_names_pass(run):
    assert codec.check_run_name(run) == run


# -- a log directory that cannot be written, a run held elsewhere ------------------------------


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and exc.__traceback__ is not None
    return text


@pytest.mark.parametrize("make", ["attach", "LogWriter", "SummaryWriter"])
def test_a_logdir_that_is_a_file_is_a_one_line_error_at_the_call(tmp_path, make):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError) as caught:
        if make == "attach":
            attach(blocker, run="r", telemetry=False)
        elif make == "LogWriter":
            LogWriter(blocker / "r", telemetry=False)
        else:
            SummaryWriter(blocker / "r", telemetry=False)
    assert str(blocker) in one_line(caught.value)
    assert "Not a directory" in str(caught.value) or "File exists" in str(caught.value)


@pytest.fixture
def read_only_dir(tmp_path):
    """A real read-only file system (a tmpfs mounted ro), when this process may mount one."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount_point)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 3 MiB file system, when this process may mount one."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_a_full_disk_is_reported_and_the_writer_resumes_when_space_frees(small_tmpfs):
    logdir = small_tmpfs / "logs"
    ballast = small_tmpfs / "ballast"
    ballast.write_bytes(bytes(2_600_000))
    w = attach(logdir, run="full", telemetry=False)
    step = 0
    with pytest.warns(RuntimeWarning, match="disk full") as caught:
        deadline = time.monotonic() + 60
        while not any("disk full" in str(x.message) for x in caught):
            assert time.monotonic() < deadline, "the disk never filled"
            for _ in range(2000):
                w.add_scalar("x", float(step), step)
                step += 1
            time.sleep(0.005)
    with pytest.warns(RuntimeWarning, match="not confirmed within the timeout: .*disk full"):
        assert w.flush(timeout=0.5) is False
    assert w._thread.is_alive()
    ballast.unlink()  # space frees: the transport's retries land
    assert w.flush(timeout=30) is True
    w.close()
    with recorder.RunReader(logdir / "full") as reader:
        assert reader.read_scalars("x").steps.tolist() == list(range(step))


@pytest.mark.parametrize("make", ["attach", "LogWriter", "SummaryWriter"])
def test_a_read_only_logdir_is_a_one_line_error_at_the_call(read_only_dir, make):
    with pytest.raises(OSError) as caught:
        if make == "attach":
            attach(read_only_dir, run="r", telemetry=False)
        elif make == "LogWriter":
            LogWriter(read_only_dir / "r", telemetry=False)
        else:
            SummaryWriter(read_only_dir / "r", telemetry=False)
    text = one_line(caught.value)
    assert str(read_only_dir) in text and "Read-only file system" in text


def test_a_logdir_without_permission_is_a_one_line_error_at_the_call(tmp_path):
    logdir = tmp_path / "private"
    # root's directory, for the child that drops to nobody; a read-only one for anyone else
    logdir.mkdir(mode=0o700 if os.getuid() == 0 else 0o500)
    script = textwrap.dedent(
        f"""
        import os, sys, vdl_stream, vdl_stream.broker, vdl_stream.telemetry
        attach = vdl_stream.attach  # loaded now: nobody may not read the interpreter's files
        if os.getuid() == 0:
            os.setgid(65534); os.setuid(65534)  # run as nobody: root may write anywhere
        try:
            attach({str(logdir)!r}, run="r", telemetry=False)
        except PermissionError as exc:
            print(exc)
            sys.exit(3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert f"cannot record a run in {logdir}/r: Permission denied" in done.stdout


HOLD_RUN = """
import sys, recorder
w = recorder.RunWriter(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_run_open_in_another_process_is_refused_at_the_call(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_RUN, str(tmp_path / "exp1")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(recorder.RunLockedError) as caught:
            attach(tmp_path, run="exp1", telemetry=False)
        text = one_line(caught.value)
        assert str(tmp_path / "exp1") in text and f"process {holder.pid}" in text
        with pytest.raises(recorder.RunLockedError, match="already open"):
            SummaryWriter(tmp_path / "exp1", telemetry=False)
        with pytest.raises(recorder.RunLockedError, match="already open"):
            LogWriter(tmp_path / "exp1", telemetry=False).add_scalar("x", 1.0, 0)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with attach(tmp_path, run="exp1", telemetry=False) as w:  # released with the process
        w.add_scalar("x", 1.0, 0)


def test_two_writers_of_one_run_in_one_process_are_refused(tmp_path):
    with attach(tmp_path, run="r", telemetry=False) as first:
        with pytest.raises(
            recorder.RunLockedError, match=f"{tmp_path / 'r'}.*process {os.getpid()}"
        ):
            attach(tmp_path, run="r", telemetry=False)
        first.add_scalar("x", 1.0, 0)
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("x").values.tolist() == [1.0]
        assert "writer.lock" not in {info for info in reader.tags()}


def test_run_lock_is_released_at_close_and_ignored_by_readers(tmp_path):
    run_dir = tmp_path / "r"
    with recorder.RunWriter(run_dir) as w:
        w.append_scalars("x", np.arange(3), np.zeros(3), np.ones(3))
        host = "".join(socket.gethostname().split())
        assert (run_dir / "writer.lock").read_text() == f"{os.getpid()} {host}\n"
        with pytest.raises(recorder.RunLockedError, match=f"process {os.getpid()}"):
            recorder.RunWriter(run_dir)
    recorder.RunWriter(run_dir).close()  # free again
    assert recorder.list_runs(tmp_path) == ["r"]
    with recorder.RunReader(run_dir) as reader:
        assert reader.read_scalars("x").steps.tolist() == [0, 1, 2]


def test_visualdl_1x_modes_leave_no_empty_parent_run(tmp_path):
    writer = LogWriter(tmp_path / "dir", telemetry=False)
    with writer.mode("train") as logger:
        loss = logger.scalar("loss")
    loss.add_record(0, 1.0)
    writer.close()
    assert recorder.list_runs(tmp_path) == ["dir/train"]
    assert writer.logdir == str(tmp_path / "dir")
    assert not (tmp_path / "dir" / "segment-000000.vdlr").exists()


def test_a_run_with_foreign_files_is_refused_at_attach_naming_the_path(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "segment-000000.vdlr").write_bytes(b"PK\x03\x04 not a segment at all" * 4)
    with pytest.raises(Exception, match=f"cannot record a run in {tmp_path / 'r'}: ") as caught:
        attach(tmp_path, run="r", telemetry=False)
    assert "\n" not in str(caught.value)


def test_a_refusal_of_the_remote_server_is_reported_and_fails_the_flush(serve_process):
    serve_process.logdir.mkdir(exist_ok=True)
    (serve_process.logdir / "blocker").write_text("a file where a run directory would go")
    w = attach(url=serve_process.ws_url, run="blocker/r", telemetry=False)
    w.add_scalar("x", 1.0, 0)
    with pytest.warns(RuntimeWarning, match="refused part of it: .*clashes with a file"):
        assert w.flush(timeout=20) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once, not again on the next call
        w.add_scalar("x", 2.0, 1)
    assert w._thread.is_alive()
    w.close(timeout=5)


def _log_in_turns(writers, rounds: int, *, tag: str = "loss") -> None:
    """Each writer logs ``tag`` at its own steps and flushes, one writer after the other."""
    for step in range(rounds):
        for w in writers:
            w.add_scalar(tag, float(step), step)
            assert w.flush(timeout=20)


def _warnings_about_sharing(caught) -> list[str]:
    return [str(w.message) for w in caught if "two writers log" in str(w.message)]


def test_two_jobs_logging_one_series_of_a_served_run_are_both_warned(serve_process):
    a = attach(url=serve_process.ws_url, run="exp1", telemetry=False)
    b = attach(url=serve_process.ws_url, run="exp1", telemetry=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _log_in_turns([a, b], 3)
        # Each hears it at a call after the notice came (the pump passes it on, then the
        # next call warns): log on until both did, within a deadline.
        deadline = time.monotonic() + 20
        step = 3
        while len(_warnings_about_sharing(caught)) < 2 and time.monotonic() < deadline:
            _log_in_turns([a, b], 1)
            step += 1
    said = _warnings_about_sharing(caught)
    assert len(said) == 2, said
    assert all(s.startswith("vdl-stream: run 'exp1': the broker warns: two writers") for s in said)
    assert all("'loss'" in s and "its own run" in s for s in said)
    a.close(timeout=10)
    b.close(timeout=10)

    def writers_alerts() -> list:
        status, body = http_get(f"{serve_process.url}/api/alerts?run=exp1")
        assert status == 200
        return [x for x in body["alerts"] if x["rule"] == "writers"]

    # The page hears of it as well: one alert of the series, recorded in the run.
    wait_for(writers_alerts, 20, "the writers alert")
    (alert,) = writers_alerts()
    assert alert["title"] == "Two writers: loss" and alert["level"] == "warn"
    stop_serve(serve_process)
    log = serve_process.proc.stderr.read()
    assert log.count("two writers log 'loss' at once") == 1, log


def test_a_job_logging_into_the_run_of_a_serving_writer_warns_both(tmp_path):
    # The in-process broker of a writer that serves its dashboard takes batches over /ws/ingest
    # too: a second job logging the same series there is told, and so is the serving writer.
    own = attach(tmp_path, run="exp1", serve=True, port=0, telemetry=False)
    other = attach(url="ws" + own.url.removeprefix("http"), run="exp1", telemetry=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deadline = time.monotonic() + 20
        while len(_warnings_about_sharing(caught)) < 2 and time.monotonic() < deadline:
            _log_in_turns([own, other], 1)
    said = _warnings_about_sharing(caught)
    assert len(said) == 2, said
    other.close(timeout=10)
    own.close(timeout=10)


def test_a_resumed_run_and_ranks_with_series_of_their_own_are_not_warned(serve_process):
    first = attach(url=serve_process.ws_url, run="exp1", telemetry=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _log_in_turns([first], 3)
        first.close(timeout=10)
        # A resumed job: the same series again, after the first writer is done.
        resumed = attach(url=serve_process.ws_url, run="exp1", telemetry=False)
        _log_in_turns([resumed], 3)
        # Another writer of the run at once, with series of its own (as a rank's telemetry).
        rank = attach(url=serve_process.ws_url, run="exp1", telemetry=False)
        for step in range(4):
            resumed.add_scalar("loss", float(step), 10 + step)
            rank.add_scalar("rank1/loss", float(step), step)
            assert resumed.flush(timeout=20) and rank.flush(timeout=20)
        # What a warning would need to reach the calls: a pump round and a call after it.
        _log_in_turns([resumed], 2)
    assert _warnings_about_sharing(caught) == []
    resumed.close(timeout=10)
    rank.close(timeout=10)
    stop_serve(serve_process)
    assert "two writers log" not in serve_process.proc.stderr.read()
