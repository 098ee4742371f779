"""``vdl-stream replay``: recorded runs through a broker and the live path, paced, never written to."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio
from trio_websocket import open_websocket_url

import recorder
from vdl_stream.replay import (
    BrokerSlot,
    Replayer,
    RunTimeline,
    find_runs,
    load_timelines,
    parse_speed,
    serve_replay,
)

WALL = 1_700_000_000.0


def record_run(run_dir: Path, points: int = 100, spacing: float = 1.0) -> None:
    """A run with two scalar tags, histograms, a text and a broker bookkeeping record."""
    steps = np.arange(points)
    walls = WALL + steps * spacing
    with recorder.RunWriter(run_dir) as w:
        half = points // 2
        w.append_scalars("loss", steps[:half], walls[:half], np.sin(steps[:half]))
        w.append_scalars("acc", steps, walls, steps / points)
        w.append_record("ingest", None, None, WALL, {"w": 3})  # not a dashboard event
        w.flush()
        w.append_scalars("loss", steps[half:], walls[half:], np.sin(steps[half:]))
        for step in (10, points // 2):
            edges = np.array([0.0, 1.0, 2.0]).tobytes()
            counts = np.array([3.0, 4.0]).tobytes()
            w.append_record(
                "histogram",
                "w",
                step,
                WALL + step * spacing,
                {"edges": edges, "counts": counts, "num": 7},
            )
        w.append_record("text", "note", 5, WALL + 5 * spacing, {"text": "hi"})


def fingerprint(path: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for dirpath, _, names in os.walk(path):
        for name in names:
            p = Path(dirpath) / name
            st = p.stat()
            out[str(p.relative_to(path))] = (
                st.st_size,
                st.st_mtime_ns,
                hashlib.sha256(p.read_bytes()).hexdigest(),
            )
    return out


def timeline(run_dir: Path, name: str = "r") -> RunTimeline:
    with recorder.RunReader(run_dir) as reader:
        return RunTimeline(name, list(reader.iter_records()))


def test_timeline_takes_by_wall_time_in_order(tmp_path):
    record_run(tmp_path / "r")
    t = timeline(tmp_path / "r")
    assert t.span() == (WALL, WALL + 99)
    scalars, events = t.take(WALL + 4.5)
    assert sorted((c.tag, c.steps.tolist()) for c in scalars) == [
        ("acc", [0, 1, 2, 3, 4]),
        ("loss", [0, 1, 2, 3, 4]),
    ]
    assert events == []
    scalars, events = t.take(WALL + 10)
    assert [(e["kind"], e["step"]) for e in events] == [("text", 5), ("histogram", 10)]
    assert all(c.steps.tolist() == list(range(5, 11)) for c in scalars)
    assert t.next_wall() == WALL + 11
    assert t.wall_of_step(50) == WALL + 50
    scalars, events = t.take(math.inf, max_points=30)
    assert sum(len(c) for c in scalars) == 30  # batches are bounded
    t.rewind()
    scalars, events = t.take(math.inf, max_points=10**6)
    assert sum(len(c) for c in scalars) == 200 and len(events) == 3
    assert "ingest" not in {e["kind"] for e in events}
    assert t.done()


def test_find_runs_takes_a_run_or_a_logdir(tmp_path):
    record_run(tmp_path / "logs" / "a", points=4)
    record_run(tmp_path / "logs" / "b" / "c", points=4)
    assert find_runs(str(tmp_path / "logs" / "a")) == {"a": str(tmp_path / "logs" / "a")}
    assert sorted(find_runs(str(tmp_path / "logs"))) == ["a", "b/c"]
    with pytest.raises(recorder.NotARunError, match="neither a run directory"):
        find_runs(str(tmp_path / "nothing"))
    assert parse_speed("max") == math.inf and parse_speed("2.5") == 2.5
    for bad in ("0", "-1", "fast", "nan"):
        with pytest.raises(ValueError, match="speed must be"):
            parse_speed(bad)


class FakeSink:
    """Records when each batch arrived (trio time)."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, object]] = []
        self.resets = 0

    async def ingest(self, batch) -> int:
        self.batches.append((trio.current_time(), batch))
        return len(self.batches)

    async def reset(self) -> None:
        self.resets += 1
        self.batches.clear()


def arrivals(sink: FakeSink) -> dict[int, float]:
    """acc step -> when it was fed."""
    out = {}
    for at, batch in sink.batches:
        for c in batch.scalars:
            if c.tag == "acc":
                out.update(dict.fromkeys(c.steps.tolist(), at))
    return out


async def test_paced_replay_keeps_the_recorded_timing(tmp_path, autojump_clock):
    record_run(tmp_path / "r", points=101, spacing=1.0)
    sink = FakeSink()
    replayer = Replayer([timeline(tmp_path / "r")], sink, speed=10)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            await nursery.start(replayer.run)
            await replayer.finished.wait()
            nursery.cancel_scope.cancel()
    fed = arrivals(sink)
    assert sorted(fed) == list(range(101))
    for step, at in fed.items():  # recorded second `step` plays at step / 10, within one tick
        assert step / 10 - 1e-6 <= at - t0 <= step / 10 + 0.051, step
    status = replayer.status()
    assert status.finished and status.fed == status.total == 202 + 3
    assert status.position == WALL + 100


async def test_long_pauses_are_shortened(tmp_path, autojump_clock):
    with recorder.RunWriter(tmp_path / "r") as w:
        w.append_scalars("acc", [0, 1, 2], [WALL, WALL + 1, WALL + 10_000], [0.0, 1.0, 2.0])
    sink = FakeSink()
    replayer = Replayer([timeline(tmp_path / "r")], sink, speed=1, max_gap=2)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            await nursery.start(replayer.run)
            await replayer.finished.wait()
            nursery.cancel_scope.cancel()
    fed = arrivals(sink)
    assert fed[1] - t0 == pytest.approx(1, abs=0.06)
    assert fed[2] - fed[1] == pytest.approx(2, abs=0.06)  # not 9999 s


async def test_pause_seek_and_speed(tmp_path, autojump_clock):
    record_run(tmp_path / "r", points=101, spacing=1.0)
    sink = FakeSink()
    replayer = Replayer([timeline(tmp_path / "r")], sink, speed=1, start_paused=True)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            await trio.sleep(5)
            assert sink.batches == []  # paused
            replayer.seek(step=40)  # forwards: everything before step 40 at once
            await trio.sleep(0.01)
            assert max(arrivals(sink)) == 39 and sink.resets == 0
            replayer.play()
            await trio.sleep(3.01)
            assert max(arrivals(sink)) == 43
            replayer.pause()
            position = replayer.status().position
            await trio.sleep(10)
            assert max(arrivals(sink)) == 43 and replayer.status().position == position
            replayer.seek(wall=WALL + 20.5)  # backwards: a fresh broker, fed up to 20
            await trio.sleep(0.01)
            assert sink.resets == 1 and max(arrivals(sink)) == 20
            assert sorted(arrivals(sink)) == list(range(21))
            replayer.set_speed("max")
            replayer.play()
            await replayer.finished.wait()
            assert sorted(arrivals(sink)) == list(range(101))
            nursery.cancel_scope.cancel()
    with pytest.raises(ValueError, match="exactly one"):
        replayer.seek()


async def test_max_speed_through_a_broker_delivers_everything_and_never_writes(tmp_path):
    record_run(tmp_path / "logs" / "r", points=20_000, spacing=0.01)
    before = fingerprint(tmp_path / "logs")
    timelines = await trio.to_thread.run_sync(load_timelines, str(tmp_path / "logs"))
    got: dict[str, list] = {"acc": [], "loss": []}
    kinds = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            slot = BrokerSlot(str(tmp_path / "work"), nursery)
            os.makedirs(tmp_path / "work")
            await slot.start()
            sub = slot.subscribe()
            replayer = Replayer(timelines, slot, speed=math.inf)
            await nursery.start(replayer.run)
            while sum(len(v) for v in got.values()) < 40_000 or len(kinds) < 3:
                frame = msgpack.unpackb(await sub.receive())
                if frame["type"] == "runs":
                    assert frame["runs"] == ["r"]
                    continue
                assert frame["type"] == "data" and frame["run"] == "r"
                for tag, steps, _walls, values in frame["scalars"]:
                    got[tag].extend(
                        zip(
                            np.frombuffer(steps, "<f8").tolist(),
                            np.frombuffer(values, "<f8").tolist(),
                            strict=True,
                        )
                    )
                kinds += [e["kind"] for e in frame["events"]]
            await slot.aclose()
            nursery.cancel_scope.cancel()
    with recorder.RunReader(tmp_path / "logs" / "r") as reader:
        for tag in ("acc", "loss"):
            s = reader.read_scalars(tag)
            assert got[tag] == list(
                zip(s.steps.astype(float).tolist(), s.values.tolist(), strict=True)
            )
    assert sorted(kinds) == ["histogram", "histogram", "text"]
    assert fingerprint(tmp_path / "logs") == before  # the recorded run was never written
    # the broker recorded into the work directory instead
    assert recorder.list_runs(tmp_path / "work" / "gen1") == ["r"]


async def http(
    port: int, method: str, path: str, body: bytes = b"", ctype: str = "application/json"
):
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        head_bytes, rest = data.split(b"\r\n\r\n", 1)
        length = int(head_bytes.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += await stream.receive_some()
    status = int(head_bytes.split(b" ", 2)[1])
    return status, json.loads(rest)


async def test_http_control_and_the_live_websocket(tmp_path):
    record_run(tmp_path / "r", points=50, spacing=1.0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            slot = BrokerSlot(str(tmp_path), nursery)
            await slot.start()
            replayer = Replayer([timeline(tmp_path / "r", "exp")], slot, speed=1, start_paused=True)
            await nursery.start(replayer.run)
            url = await nursery.start(serve_replay, slot, replayer, "127.0.0.1", 0)
            port = int(url.rsplit(":", 1)[1])
            status, body = await http(port, "GET", "/api/replay")
            assert status == 200 and body["playing"] is False and body["runs"] == ["exp"]
            assert (body["start"], body["end"], body["total"]) == (WALL, WALL + 49, 103)
            async with open_websocket_url(url.replace("http", "ws") + "/ws/live") as ws:
                await ws.send_message(msgpack.packb({"type": "subscribe", "runs": None}))
                cmd = json.dumps({"action": "seek", "step": 30}).encode()
                status, body = await http(port, "POST", "/api/replay", cmd)
                assert status == 200
                steps = set()
                while 29 not in steps:
                    frame = msgpack.unpackb(await ws.get_message())
                    if frame["type"] in ("data", "snapshot") and frame.get("run") == "exp":
                        for _tag, s, _, _ in frame["scalars"]:
                            steps.update(np.frombuffer(s, "<f8").astype(int).tolist())
                assert steps >= set(range(30)) and max(steps) == 29  # up to the seek, no further
            speed = json.dumps({"action": "speed", "speed": "max"}).encode()
            status, body = await http(port, "POST", "/api/replay", speed)
            assert status == 200 and body["speed"] == "max"
            status, body = await http(port, "POST", "/api/replay", b'{"action": "rewind"}')
            assert status == 400 and "action must be one of" in body["error"]
            status, body = await http(
                port, "POST", "/api/replay", b'{"action": "play"}', "text/plain"
            )
            assert status == 415
            status, body = await http(port, "POST", "/api/replay", b'{"action": "play"}')
            assert status == 200 and body["playing"] is True
            await replayer.finished.wait()
            await slot.aclose()
            nursery.cancel_scope.cancel()


def test_command_line_replay_exits_at_the_end_and_leaves_the_run_alone(tmp_path):
    record_run(tmp_path / "logs" / "r", points=500, spacing=0.001)
    before = fingerprint(tmp_path / "logs")
    cmd = [sys.executable, "-m", "vdl_stream.cli", "replay", str(tmp_path / "logs")]
    done = subprocess.run(
        [*cmd, "--speed", "max", "--exit", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "replaying r at http://127.0.0.1:" in done.stdout
    assert "replayed 1,003 of 1,003 points and events" in done.stdout
    assert fingerprint(tmp_path / "logs") == before
    bad = subprocess.run([*cmd, "--speed", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "speed must be a positive number" in bad.stderr
    bad = subprocess.run(
        [*cmd[:-1], str(tmp_path / "none")], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "neither a run directory" in bad.stderr


def _post(url: str, body: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(
        url + "/api/replay",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_the_page_shows_a_replay_and_a_seek_back(tmp_path, browser):
    """In Chromium: replayed points reach the charts; seeking back shows the run as it stood."""
    record_run(tmp_path / "logs" / "r", points=300, spacing=0.01)
    run = str(tmp_path / "logs" / "r")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vdl_stream.cli", "replay", run, "--paused", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        line = proc.stdout.readline()
        assert " at http" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.rsplit(" at ", 1)[1].strip().rstrip("/")
        page.goto(url + "/")
        page.wait_for_function("() => window.vdl && window.vdl.connected", timeout=15_000)
        assert _post(url, {"action": "speed", "speed": "max"})["speed"] == "max"
        assert _post(url, {"action": "play"})["playing"] is True
        page.wait_for_function(
            "() => window.vdl.series('r', 'acc').steps.length === 300", timeout=15_000
        )
        got = page.evaluate("window.vdl.series('r', 'acc')")
        assert got["steps"] == list(range(300))
        assert got["values"] == [s / 300 for s in range(300)]
        _post(url, {"action": "pause"})
        status = _post(url, {"action": "seek", "step": 100})
        assert status["playing"] is False
        # a fresh broker: the page reconnects by itself and gets the run as it stood at step 100
        page.wait_for_function(
            "() => window.vdl.series('r', 'acc').steps.length === 100", timeout=15_000
        )
        assert page.evaluate("window.vdl.series('r', 'acc')")["steps"] == list(range(100))
        assert errors == []
    finally:
        page.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def test_a_live_runs_many_small_chunks_become_one_per_tag_and_restart(tmp_path):
    with recorder.RunWriter(tmp_path / "r") as w:
        for step in range(500):  # a flush per point, as a live broker writes
            w.append_scalars("acc", [step], [WALL + step], [step / 2])
            w.flush()
        w.append_scalars("acc", [100, 101], [WALL + 600, WALL + 601], [-1.0, -2.0])  # restart
    t = timeline(tmp_path / "r")
    assert [len(c.steps) for c in t.chunks] == [500, 2]
    scalars, _ = t.take(math.inf, max_points=10**6)
    assert [c.steps[0] for c in scalars] == [0, 100]  # the restart is fed as its own batch part
