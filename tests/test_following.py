"""Following: a dashboard shows the runs other processes write into its log directory, live.

Real processes throughout: a training process (``attach()`` with its own in-process broker), a
``vdl-stream serve`` subprocess, an ``attach(serve=True)`` process, and a real Chromium page whose
chart data is checked. Every order of start is tried: writer, server, page; server, page, writer;
server, writer, page.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio
from trio_websocket import open_websocket_url

import recorder
from tests.conftest import http_get, start_serve, stop_serve
from vdl_stream import codec
from vdl_stream.broker import Broker

REPO = Path(__file__).resolve().parent.parent
TAG = "train/loss"

# A training process: logs one point of TAG every 10 ms with its own in-process broker (no server),
# until its standard input closes (or 60 s pass); then closes cleanly and prints how many it logged.
WRITER = """
import select, sys, time
from vdl_stream import attach
logdir, run = sys.argv[1], sys.argv[2]
with attach(logdir, run=run, telemetry=False) as w:
    step = 0
    print("started", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        w.add_scalar("train/loss", step * 0.5, step)
        step += 1
        if step == 5:
            w.flush(timeout=10)
            print("flushed", flush=True)
        if select.select([sys.stdin], [], [], 0.01)[0]:
            break
print(f"done {step}", flush=True)
"""

# A training process that also serves its dashboard (attach(serve=True)), logging run "own".
SERVING_WRITER = """
import sys, time
from vdl_stream import attach
with attach(sys.argv[1], run="own", serve=True, port=0, telemetry=False) as w:
    print(w.url, flush=True)
    for step in range(20):
        w.add_scalar("train/loss", float(step), step)
    w.flush(timeout=10)
    sys.stdin.read()  # until the test closes it
"""


class WriterProcess:
    """The training process of :data:`WRITER`; :meth:`stop` returns the points it logged."""

    def __init__(self, logdir: Path, run: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(logdir), run],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert self._line() == "started"
        assert self._line() == "flushed"  # the run is on disk

    def _line(self, timeout: float = 30) -> str:
        # poll(), not select(): select() fails on descriptors past 1024, which a long test
        # session can reach.
        poller = select.poll()
        poller.register(self.proc.stdout, select.POLLIN)
        if not poller.poll(timeout * 1000):
            self.kill()
            raise AssertionError(f"the writer process said nothing: {self.proc.stderr.read()}")
        return self.proc.stdout.readline().strip()

    def stop(self) -> int:
        """Close its standard input (it stops logging and closes), return the points logged."""
        self.proc.stdin.close()
        line = self._line()
        assert self.proc.wait(30) == 0, self.proc.stderr.read()
        assert line.startswith("done "), line
        return int(line.split()[1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def series(page, run: str) -> dict:
    return page.evaluate(f"window.vdl.series({json.dumps(run)}, {json.dumps(TAG)})")


def wait_points(page, run: str, at_least: int) -> int:
    """Wait (15 s at most) until the page holds ``at_least`` points of the run; return how many."""
    page.wait_for_function(
        "([run, tag, n]) => window.vdl.series(run, tag).steps.length >= n",
        arg=[run, TAG, at_least],
        timeout=15_000,
    )
    return len(series(page, run)["steps"])


def check_live_then_closed(page, writer: WriterProcess, run: str) -> None:
    """Points keep arriving while the writer runs; after it closes, the page holds every one."""
    seen = wait_points(page, run, 1)
    wait_points(page, run, seen + 50)  # more arrive with no reload: live
    logged = writer.stop()
    page.wait_for_function(
        "([run, tag, n]) => { const s = window.vdl.series(run, tag).steps;"
        " return s.length === n && s[n - 1] === n - 1; }",
        arg=[run, TAG, logged],
        timeout=15_000,
    )
    got = series(page, run)
    assert got["steps"] == list(range(logged))
    assert got["values"] == [s * 0.5 for s in range(logged)]
    # the chart itself draws them (uPlot's data is [xs, ...ys])
    page.wait_for_function(
        "([tag, n]) => { const u = window.vdl.charts.get(tag);"
        " return u && u.data[0][u.data[0].length - 1] === n - 1; }",
        arg=[TAG, logged],
        timeout=15_000,
    )


def wait_fanned_out(server, at_least: int = 2) -> None:
    """Wait (15 s at most) until the server has fanned out ``at_least`` followed batches."""
    deadline = time.monotonic() + 15
    while http_get(server.url + "/api/stats")[1]["broker"]["seq"] < at_least:
        assert time.monotonic() < deadline, "the server fanned out nothing of the followed run"
        time.sleep(0.05)


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.mark.parametrize("order", ["writer-serve-page", "serve-page-writer", "serve-writer-page"])
def test_a_dashboard_follows_another_process_run_live(logdir, browser, order):
    writer = server = page = None
    errors: list[str] = []
    try:
        for step in order.split("-"):
            if step == "writer":
                writer = WriterProcess(logdir, "job")
            elif step == "serve":
                server = start_serve(logdir)
            else:
                if writer is not None:
                    # The server has fanned out some of the run already: a page arriving now
                    # once waited forever for a write that following never makes.
                    wait_fanned_out(server)
                page = browser.new_page()
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(server.url + "/")
                page.wait_for_function("() => window.vdl && window.vdl.connected", timeout=15_000)
        check_live_then_closed(page, writer, "job")
        status, stats = http_get(server.url + "/api/stats")
        assert status == 200 and stats["subscribers"][0]["sent"] > 0
        assert [r["name"] for r in http_get(server.url + "/api/runs")[1]["runs"]] == ["job"]
        assert errors == []
    finally:
        if page is not None:
            page.close()
        if writer is not None:
            writer.kill()
        if server is not None:
            assert stop_serve(server) == 0


async def receive(ws) -> dict:
    return msgpack.unpackb(await ws.get_message())


def start_serving_writer(logdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SERVING_WRITER, str(logdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def test_attach_serve_follows_another_process_run(logdir):
    """A training process serving its own dashboard shows another process's run too, live."""
    serving = start_serving_writer(logdir)
    writer = None
    try:
        with trio.fail_after(60):
            url = (await trio.to_thread.run_sync(serving.stdout.readline)).strip()
            assert url.startswith("http://127.0.0.1:")
            ws_url = "ws" + url.removeprefix("http") + "/ws/live"
            async with open_websocket_url(ws_url) as ws:
                await ws.send_message(codec.encode_message({"type": "subscribe", "runs": None}))
                writer = await trio.to_thread.run_sync(WriterProcess, logdir, "other")
                steps: dict[str, set[int]] = {"own": set(), "other": set()}
                while len(steps["other"]) < 100 or len(steps["own"]) < 20:
                    message = await receive(ws)
                    if message["type"] in ("snapshot", "data"):
                        if message["type"] == "snapshot":
                            steps[message["run"]] = set()
                        for tag, s, _, _ in message["scalars"]:
                            if tag == TAG:
                                steps[message["run"]].update(np.frombuffer(s, "<f8").astype(int))
                logged = await trio.to_thread.run_sync(writer.stop)
                while len(steps["other"]) < logged:
                    message = await receive(ws)
                    if message["type"] == "data" and message["run"] == "other":
                        for _, s, _, _ in message["scalars"]:
                            steps["other"].update(np.frombuffer(s, "<f8").astype(int))
            assert steps["other"] == set(range(logged))
            assert steps["own"] == set(range(20))
    finally:
        if writer is not None:
            writer.kill()
        serving.stdin.close()
        serving.wait(30)


def write_points(path: Path, steps: range) -> None:
    with recorder.RunWriter(path, sync="never") as w:
        s = np.arange(steps.start, steps.stop)
        w.append_scalars(TAG, s, 1.7e9 + s, s * 0.5)


def open_fds_under(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # an fd closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
    return count


async def test_idle_followers_close_and_reopen_where_they_stopped(logdir):
    write_points(logdir / "quiet", range(10))
    broker = Broker(logdir, idle_close=0.2)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(partial(broker.follow, 0.05))
            sub = broker.subscribe()
            (frame,) = await broker.snapshot(sub)
            assert np.frombuffer(msgpack.unpackb(frame)["scalars"][0][1], "<f8").tolist() == list(
                range(10)
            )
            for _ in range(200):  # idle: closed, no fd left
                if not broker.read_statistics().readers_open:
                    break
                await trio.sleep(0.05)
            assert broker.read_statistics().readers_open == 0
            assert open_fds_under(logdir / "quiet") == 0
            write_points(logdir / "quiet", range(10, 15))  # it resumes: reopened at its end
            data = msgpack.unpackb(await sub.receive())
            while data["type"] != "data":
                data = msgpack.unpackb(await sub.receive())
            assert np.frombuffer(data["scalars"][0][1], "<f8").tolist() == list(range(10, 15))
            assert broker.statistics().written_seq == 0  # nothing ingested, nothing waited for
            nursery.cancel_scope.cancel()


async def test_a_run_appearing_after_the_page_opened_arrives_as_a_snapshot(logdir):
    broker = Broker(logdir)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(partial(broker.follow, 0.05))
            sub = broker.subscribe()
            assert await broker.snapshot(sub) == []
            write_points(logdir / "late", range(7))  # its whole history lands before discovery
            kinds = []
            while "snapshot" not in kinds:
                message = msgpack.unpackb(await sub.receive())
                kinds.append(message["type"])
            assert kinds == ["runs", "snapshot"]
            assert message["run"] == "late"
            assert np.frombuffer(message["scalars"][0][3], "<f8").tolist() == [
                s * 0.5 for s in range(7)
            ]
            nursery.cancel_scope.cancel()


def test_a_page_arriving_after_data_was_followed_gets_its_snapshot(logdir):
    """Regression: the snapshot waited for a write that following never makes (seq moved by
    following, written_seq never), so a page opened next to a running job stayed empty."""
    writer = WriterProcess(logdir, "r")
    server = start_serve(logdir)
    try:
        wait_fanned_out(server)

        async def snapshot_run() -> str:
            with trio.fail_after(10):
                async with open_websocket_url(server.ws_url + "/ws/live") as ws:
                    await ws.send_message(codec.encode_message({"type": "subscribe", "runs": None}))
                    while True:
                        message = await receive(ws)
                        if message["type"] == "snapshot":
                            return message["run"]

        assert trio.run(snapshot_run) == "r"
        writer.stop()
    finally:
        writer.kill()
        stop_serve(server)


# -- one bad run never stops the server ---------------------------------------------------------


def make_bad_runs(logdir: Path, names: list[str]) -> None:
    """Runs whose only segment is foreign, from a newer format, or a symbolic link elsewhere."""
    from recorder import framing

    for name in names:
        run = logdir / name
        run.mkdir(parents=True)
        segment = run / "segment-000000.vdlr"
        if name.startswith("foreign"):
            segment.write_bytes(b"PK\x03\x04 not a recorder file at all" * 4)
        elif name.startswith("newer"):
            header = bytearray(framing.encode_header(0, 1.7e9))
            header[8:12] = (framing.FORMAT_VERSION + 1).to_bytes(4, "little")
            segment.write_bytes(bytes(header))
        else:
            target = logdir.parent / "elsewhere.vdlr"
            target.write_bytes(b"secret")
            segment.symlink_to(target)


def wait_runs(server, expected: list[str]) -> None:
    deadline = time.monotonic() + 15
    while (runs := [r["name"] for r in http_get(server.url + "/api/runs")[1]["runs"]]) != expected:
        assert server.proc.poll() is None, server.proc.stderr.read()
        assert time.monotonic() < deadline, runs
        time.sleep(0.05)


def test_bad_runs_present_at_start_or_appearing_later_are_skipped(logdir):
    write_points(logdir / "good", range(10))
    make_bad_runs(logdir, ["foreign", "newer", "linked"])
    server = start_serve(logdir)
    try:
        wait_runs(server, ["good"])
        make_bad_runs(logdir, ["foreign-later", "newer-later", "linked-later"])
        write_points(logdir / "good2", range(5))
        wait_runs(server, ["good", "good2"])
        # a foreign segment appears in a run being followed: that run goes, the other stays live
        (logdir / "good2" / "segment-000001.vdlr").write_bytes(b"garbage" * 10)
        wait_runs(server, ["good"])
        write_points(logdir / "good", range(10, 20))
        deadline = time.monotonic() + 15
        while len(http_get(server.url + "/api/scalars?run=good&tag=" + TAG)[1]["steps"]) < 20:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(2.5)  # a few more polls of the log directory: no repeated warnings
        assert server.proc.poll() is None
    finally:
        assert stop_serve(server) == 0
    stderr = server.proc.stderr.read()
    for name in ["foreign", "newer", "linked", "foreign-later", "newer-later", "linked-later"]:
        assert stderr.count(f"skipping run {name!r}") == 1, stderr
    assert stderr.count("skipping run 'good2'") == 1, stderr
    assert "Traceback" not in stderr, stderr


# -- bounded memory -----------------------------------------------------------------------------


def vm_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


def test_serve_memory_stays_within_the_cache_budget_on_a_long_run(tmp_path):
    """Downsampled reads and snapshots of a 6M-point tag (144 MB decoded) under --cache-mb 16."""
    logdir = tmp_path / "logs"
    with recorder.RunWriter(logdir / "long", sync="never") as w:
        for lo in range(0, 6_000_000, 1 << 20):
            s = np.arange(lo, min(6_000_000, lo + (1 << 20)))
            w.append_scalars(TAG, s, 1.7e9 + s * 0.02, np.sin(s * 1e-4))
    write_points(logdir / "short", range(100))
    server = start_serve(logdir, "--cache-mb", "16")
    try:
        wait_runs(server, ["long", "short"])
        baseline = vm_rss_mb(server.proc.pid)
        for query in ("", "&start=1000&end=5000000", "&start=2000000"):
            status, got = http_get(
                f"{server.url}/api/scalars?run=long&tag={TAG}&max_points=2000{query}"
            )
            assert status == 200 and 2 <= len(got["steps"]) <= 2000
        assert got["steps"][0] == 2_000_000 and got["steps"][-1] == 5_999_999
        assert http_get(f"{server.url}/api/scalars?run=short&tag={TAG}")[1]["steps"] == list(
            range(100)
        )

        async def snapshot() -> dict:
            with trio.fail_after(60):
                async with open_websocket_url(
                    server.ws_url + "/ws/live", max_message_size=1 << 24
                ) as ws:
                    await ws.send_message(
                        codec.encode_message({"type": "subscribe", "runs": ["long"]})
                    )
                    while True:
                        message = await receive(ws)
                        if message["type"] == "snapshot":
                            return message

        snap = trio.run(snapshot)
        steps = np.frombuffer(snap["scalars"][0][1], "<f8")
        assert steps[0] == 0 and steps[-1] == 5_999_999 and len(steps) <= 2000
        grown = vm_rss_mb(server.proc.pid) - baseline
        assert grown < 60, f"serve grew by {grown:.0f} MB"
    finally:
        stop_serve(server)


def test_a_bad_cache_budget_is_refused_naming_it(tmp_path):
    from vdl_stream import attach
    from vdl_stream.cli import main

    with pytest.raises(ValueError, match="cache_mb must be a positive int, got 0"):
        attach(tmp_path, cache_mb=0)
    with pytest.raises(ValueError, match="cache_bytes must be a positive int, got -1"):
        Broker(tmp_path, cache_bytes=-1)
    with pytest.raises(SystemExit):
        main(["serve", "--logdir", str(tmp_path), "--cache-mb", "none"])
