"""``vdl-stream replay``: recorded runs read in place, paced, served as live data; seeks and status
announced on ``/ws/live``; the recorded runs never written."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio
from trio_websocket import open_websocket_url

import recorder
from vdl_stream import codec
from vdl_stream.broker import SNAPSHOT_EVENTS, Broker, SubscriberLimitError
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.errors import RefusedError
from vdl_stream.replay import (
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
    """Every file under ``path``: size, mtime (ns) and SHA-256."""
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
        return RunTimeline(name, list(reader.iter_records()), str(run_dir))


def decode(frame: bytes) -> dict:
    return msgpack.unpackb(frame)


def steps_of(message: dict, tag: str) -> list[int]:
    """The steps of ``tag`` in a snapshot or data frame."""
    out: list[int] = []
    for t, steps, _walls, _values in message.get("scalars", []):
        if t == tag:
            out += np.frombuffer(steps, "<f8").astype(int).tolist()
    return out


class Collector:
    """An in-process subscriber of a replay: every frame it receives, with the trio time."""

    def __init__(self, replayer: Replayer, max_points: int = 2000) -> None:
        self.replayer = replayer
        self.max_points = max_points
        self.frames: list[tuple[float, dict]] = []
        self.sub = replayer.source.subscribe()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        for frame in await self.replayer.source.snapshot(self.sub, self.max_points):
            self.frames.append((trio.current_time(), decode(frame)))
        task_status.started()
        while True:
            try:
                frame = await self.sub.receive()
            except trio.EndOfChannel:
                return
            self.frames.append((trio.current_time(), decode(frame)))

    def of(self, kind: str) -> list[dict]:
        return [m for _, m in self.frames if m["type"] == kind]

    def arrivals(self, tag: str = "acc") -> dict[int, float]:
        """step -> when it came in a data frame."""
        out: dict[int, float] = {}
        for at, m in self.frames:
            if m["type"] == "data":
                out.update(dict.fromkeys(steps_of(m, tag), at))
        return out

    def since(self, index: int) -> list[dict]:
        return [m for _, m in self.frames[index:]]


# -- the timeline ------------------------------------------------------------------------------


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
    assert t.newest() == (WALL + 10, 10)
    scalars, events = t.take(math.inf, max_points=30)
    assert sum(len(c) for c in scalars) == 30  # batches are bounded
    t.rewind()
    assert t.taken() == 0 and t.newest() is None
    scalars, events = t.take(math.inf, max_points=10**6)
    assert sum(len(c) for c in scalars) == 200 and len(events) == 3
    assert "ingest" not in {e["kind"] for e in events}
    assert t.done()
    t.move_to(WALL + 20.5)  # just before: everything released earlier counts as taken
    assert t.taken() == 2 * 21 + 2 and t.next_wall() == WALL + 21
    t.move_to(WALL + 20)
    assert t.taken() == 2 * 20 + 2 and t.next_wall() == WALL + 20


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
    # as of the end, the restart supersedes steps 100.. of the first chunk, as the recorder does
    with recorder.RunReader(tmp_path / "r") as reader:
        expected = reader.read_scalars("acc")
    got = t.series_at(t.cursor(), "acc")
    assert got.steps.tolist() == expected.steps.tolist() == [*range(100), 100, 101]
    assert got.values.tolist() == expected.values.tolist()
    t.move_to(WALL + 600.5)  # between the two points of the restart
    assert t.series_at(t.cursor(), "acc").steps.tolist() == [*range(100), 100]
    t.move_to(WALL + 300)  # before it
    assert t.series_at(t.cursor(), "acc").steps.tolist() == list(range(300))


class _CountedSteps(np.ndarray):
    """Steps that count the comparisons made on them (on slices too)."""

    compared = 0

    def __lt__(self, other):
        _CountedSteps.compared += 1
        return np.asarray(self) < other


def test_a_replay_with_thousands_of_restarts_compares_each_chunk_once(tmp_path):
    """Four writers logging one tag with step counters of their own: a restart at most of
    2,000 chunks. The points as of any cursor are those the recorder reads as of there, found
    with at most one comparison per chunk (each restart compared every chunk kept before it)."""
    tops = [0, 0, 0, 0]
    with recorder.RunWriter(tmp_path / "r") as w:
        for i in range(2000):
            k = i % 4
            steps = np.arange(tops[k], tops[k] + 5 + i % 3)
            tops[k] += len(steps)
            w.append_scalars("acc", steps, WALL + i + steps * 1e-6, steps * 0.5)
            w.flush()
    t = timeline(tmp_path / "r")
    assert len(t.chunks) > 1000  # (compaction merges only where no restart can happen)
    for c in t.chunks:
        c.steps = c.steps.view(_CountedSteps)
    for wall in (WALL + 999.5, WALL + 2000):
        t.move_to(wall)
        positions = t.cursor()[0]
        steps, values = np.empty(0, np.int64), np.empty(0)  # the rule replayed chunk by chunk
        for c in t.chunks:
            n = positions[c.index]
            if n and len(steps) and c.steps[0] < steps.max():
                keep = steps < np.asarray(c.steps)[0]
                steps, values = steps[keep], values[keep]
            steps = np.concatenate([steps, np.asarray(c.steps)[:n]])
            values = np.concatenate([values, c.values[:n]])
        _CountedSteps.compared = 0
        got = t.series_at(t.cursor(), "acc")
        assert _CountedSteps.compared <= len(t.chunks)
        assert np.asarray(got.steps).tolist() == steps.tolist()
        assert got.values.tolist() == values.tolist()
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("acc").steps.tolist() == steps.tolist()


# -- pacing, seeking, status -------------------------------------------------------------------


async def test_paced_replay_keeps_the_recorded_timing(tmp_path, autojump_clock):
    record_run(tmp_path / "r", points=101, spacing=1.0)
    replayer = Replayer([timeline(tmp_path / "r")], speed=10)
    collector = Collector(replayer)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(collector.run)
            t0 = trio.current_time()
            await nursery.start(replayer.run)
            await replayer.finished.wait()
            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    fed = collector.arrivals()
    assert sorted(fed) == list(range(101))
    for step, at in fed.items():  # recorded second `step` plays at step / 10, within one tick
        assert step / 10 - 1e-6 <= at - t0 <= step / 10 + 0.051, step
    status = replayer.status()
    assert status.finished and status.fed == status.total == 202 + 3
    assert status.position == WALL + 100 and status.step == 100
    # the status went out while playing (at least once a second) and when it finished
    statuses = collector.of("replay")
    assert statuses[0]["playing"] is True and statuses[-1]["finished"] is True
    assert len(statuses) >= 10
    versions = [s["version"] for s in statuses]
    assert versions == sorted(versions)


async def test_long_pauses_are_shortened(tmp_path, autojump_clock):
    with recorder.RunWriter(tmp_path / "r") as w:
        w.append_scalars("acc", [0, 1, 2], [WALL, WALL + 1, WALL + 10_000], [0.0, 1.0, 2.0])
    replayer = Replayer([timeline(tmp_path / "r")], speed=1, max_gap=2)
    collector = Collector(replayer)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(collector.run)
            t0 = trio.current_time()
            await nursery.start(replayer.run)
            await replayer.finished.wait()
            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    fed = collector.arrivals()
    assert fed[1] - t0 == pytest.approx(1, abs=0.06)
    assert fed[2] - fed[1] == pytest.approx(2, abs=0.06)  # not 9999 s


async def test_a_seek_is_a_reset_and_snapshots_at_the_target_forward_back_and_restart(
    tmp_path, autojump_clock
):
    record_run(tmp_path / "r", points=101, spacing=1.0)
    replayer = Replayer([timeline(tmp_path / "r")], speed=1, start_paused=True)
    collector = Collector(replayer)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            await nursery.start(collector.run)
            first = collector.since(0)
            assert [m["type"] for m in first] == ["replay", "snapshot"]
            assert first[0]["playing"] is False and first[0]["position"] == WALL
            assert first[1]["scalars"] == [] and first[1]["events"] == []
            await trio.sleep(5)
            assert collector.of("data") == []  # paused

            mark = len(collector.frames)
            replayer.seek(step=40)  # forwards: the run as it stood just before step 40
            assert replayer.status().position == WALL + 40  # at once, for the command's answer
            await trio.sleep(0.01)
            got = collector.since(mark)
            assert [m["type"] for m in got if m["type"] != "replay"] == [
                "reset",
                "snapshot",
                "synced",
            ]
            reset, snapshot, synced = (m for m in got if m["type"] != "replay")
            assert reset["runs"] == ["r"] and reset["seq"] == snapshot["seq"] == synced["seq"]
            assert steps_of(snapshot, "acc") == steps_of(snapshot, "loss") == list(range(40))
            kinds = [(e["kind"], e["step"]) for e in snapshot["events"]]
            assert kinds == [("text", 5), ("histogram", 10)]
            assert got[-1]["type"] == "replay" and got[-1]["step"] == 39
            assert got[-1]["fed"] == 2 * 40 + 2 and got[-1]["position"] == WALL + 40

            replayer.play()
            await trio.sleep(3.01)
            assert sorted(collector.arrivals()) == [40, 41, 42, 43]  # data frames go on from there
            replayer.pause()
            position = replayer.status().position
            await trio.sleep(10)
            assert max(collector.arrivals()) == 43 and replayer.status().position == position

            mark = len(collector.frames)
            replayer.seek(wall=WALL + 20.5)  # backwards: the same cursor, moved back
            await trio.sleep(0.01)
            got = [m for m in collector.since(mark) if m["type"] != "replay"]
            assert [m["type"] for m in got] == ["reset", "snapshot", "synced"]
            assert steps_of(got[1], "acc") == list(range(21))
            assert [(e["kind"], e["step"]) for e in got[1]["events"]] == [
                ("text", 5),
                ("histogram", 10),
            ]

            mark = len(collector.frames)
            replayer.seek(wall=WALL - 100)  # a restart: clamped to the start, nothing shown
            await trio.sleep(0.01)
            got = [m for m in collector.since(mark) if m["type"] != "replay"]
            assert [m["type"] for m in got] == ["reset", "snapshot", "synced"]
            assert got[1]["scalars"] == [] and got[1]["events"] == []
            assert replayer.status().fed == 0 and replayer.status().step is None

            mark = len(collector.frames)
            replayer.set_speed("max")
            replayer.play()
            await replayer.finished.wait()
            await trio.sleep(0.01)
            data = [m for m in collector.since(mark) if m["type"] == "data"]
            assert sorted(s for m in data for s in steps_of(m, "acc")) == list(range(101))
            nursery.cancel_scope.cancel()
    with pytest.raises(ValueError, match="exactly one"):
        replayer.seek()
    with pytest.raises(ValueError, match="wall must be a finite number"):
        replayer.seek(wall=math.nan)
    versions = [m["version"] for m in collector.of("replay")]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)


def write_run(run_dir: Path, until: float = math.inf) -> None:
    """A run the way a restarted training writes it, with only what was recorded before ``until``:
    a tag in many flushes, a restart, a second tag, 300 histograms (more than a snapshot keeps),
    texts and telemetry."""
    with recorder.RunWriter(run_dir) as w:

        def scalars(tag: str, steps: np.ndarray, walls: np.ndarray, values: np.ndarray) -> None:
            keep = walls < until
            if keep.any():
                w.append_scalars(tag, steps[keep], walls[keep], values[keep])

        for lo in range(0, 12_000, 1000):
            steps = np.arange(lo, lo + 1000)
            scalars("loss", steps, WALL + steps * 0.01, np.cos(steps / 700.0))
            w.flush()
        restart = np.arange(8000, 20_000)  # resumed from a checkpoint at step 8000
        scalars("loss", restart, WALL + 130 + restart * 0.01, -np.cos(restart / 500.0))
        both = np.arange(20_000)
        scalars("acc", both, WALL + both * 0.015, both / 20_000)
        for i in range(300):
            wall = WALL + i
            if wall < until:
                edges = np.linspace(0, 1, 4).tobytes()
                w.append_record(
                    "histogram", "w", i * 10, wall, {"edges": edges, "counts": bytes(24), "num": 3}
                )
                w.append_record(
                    "telemetry", None, None, wall, {"host": "h", "rank": 0, "fields": {}}
                )
            if i % 50 == 0 and wall < until:
                w.append_record("text", "note", i * 10, wall, {"text": f"at {i}"})


async def live_snapshot(logdir: Path, max_points: int) -> dict:
    """A live broker's snapshot of the only run in ``logdir`` (as ``vdl-stream serve`` sends it)."""
    broker = Broker(logdir)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await nursery.start(broker.follow)
        sub = broker.subscribe()
        (frame,) = await broker.snapshot(sub, max_points)
        broker.close()
        await broker.wait_closed()
        nursery.cancel_scope.cancel()
    return decode(frame)


@pytest.mark.parametrize("target", [WALL + 95.5, WALL + 170.25, WALL + 1000])
async def test_a_page_connecting_mid_replay_gets_the_run_as_it_stood_like_a_live_snapshot(
    tmp_path, target
):
    write_run(tmp_path / "logs" / "r")
    write_run(tmp_path / "cut" / "r", until=target)  # what a live run held at that moment
    expected = await live_snapshot(tmp_path / "cut", max_points=300)
    replayer = Replayer([timeline(tmp_path / "logs" / "r")], start_paused=True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            replayer.seek(wall=target)
            await trio.sleep(0.01)
            sub = replayer.source.subscribe()  # a browser arriving now
            frames = [decode(f) for f in await replayer.source.snapshot(sub, 300)]
            nursery.cancel_scope.cancel()
    assert [f["type"] for f in frames] == ["replay", "snapshot"]
    assert frames[0]["position"] == min(target, replayer.end)
    got = frames[1]
    assert sorted(c[0] for c in got["scalars"]) == sorted(c[0] for c in expected["scalars"])
    for mine, live in zip(
        sorted(got["scalars"]), sorted(expected["scalars"]), strict=True
    ):  # same tags, same points picked: downsampled as live snapshots are
        assert len(np.frombuffer(mine[1])) <= 300
        assert mine == live, mine[0]
    strip = lambda events: [(e["kind"], e["tag"], e["step"], e["wall"]) for e in events]  # noqa: E731
    # the same events (in wall order; the order of events at one wall time is not specified)
    assert sorted(strip(got["events"]), key=str) == sorted(strip(expected["events"]), key=str)
    walls = [e["wall"] for e in got["events"]]
    assert walls == sorted(walls)
    histograms = [e for e in got["events"] if e["kind"] == "histogram"]
    assert len(histograms) == min(SNAPSHOT_EVENTS, int(min(target, WALL + 299) - WALL) + 1)


async def test_everything_at_max_speed_reaches_a_subscriber_and_the_run_is_never_written(
    tmp_path,
):
    record_run(tmp_path / "logs" / "r", points=20_000, spacing=0.01)
    before = fingerprint(tmp_path / "logs")
    timelines = await trio.to_thread.run_sync(load_timelines, str(tmp_path / "logs"))
    got: dict[str, list] = {"acc": [], "loss": []}
    kinds = []
    replayer = Replayer(timelines, speed=math.inf, start_paused=True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            sub = replayer.source.subscribe()
            await replayer.source.snapshot(sub)
            replayer.play()
            while sum(len(v) for v in got.values()) < 40_000 or len(kinds) < 3:
                frame = decode(await sub.receive())
                if frame["type"] == "replay":
                    continue
                assert frame["type"] == "data" and frame["run"] == "r", frame["type"]
                for tag, steps, _walls, values in frame["scalars"]:
                    got[tag].extend(
                        zip(
                            np.frombuffer(steps, "<f8").tolist(),
                            np.frombuffer(values, "<f8").tolist(),
                            strict=True,
                        )
                    )
                kinds += [e["kind"] for e in frame["events"]]
            await replayer.finished.wait()
            assert replayer.source.statistics().events == 40_003
            replayer.source.close()
            with pytest.raises(trio.EndOfChannel):
                while True:
                    await sub.receive()
            nursery.cancel_scope.cancel()
    with recorder.RunReader(tmp_path / "logs" / "r") as reader:
        for tag in ("acc", "loss"):
            s = reader.read_scalars(tag)
            assert got[tag] == list(
                zip(s.steps.astype(float).tolist(), s.values.tolist(), strict=True)
            )
    assert sorted(kinds) == ["histogram", "histogram", "text"]
    assert fingerprint(tmp_path / "logs") == before  # the recorded run was never written
    assert sorted(os.listdir(tmp_path)) == ["logs"]  # and nothing was written beside it


async def test_a_replay_takes_no_writers_and_a_bounded_number_of_pages(tmp_path):
    record_run(tmp_path / "r", points=10)
    before = fingerprint(tmp_path)
    replayer = Replayer([timeline(tmp_path / "r")], start_paused=True, max_subscribers=2)
    batch = Batch("w", 1, "r", [ScalarColumns("x", np.arange(1), np.ones(1), np.ones(1))])
    with pytest.raises(RefusedError, match="takes no writers") as info:
        await replayer.source.ingest(batch)
    assert info.value.retryable is False
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            url = await nursery.start(serve_replay, replayer, "127.0.0.1", 0)
            ws_url = url.replace("http", "ws")
            # a writer pointed at a replay hears why its batch is refused, and nothing is written
            async with open_websocket_url(ws_url + "/ws/ingest") as writer:
                await writer.send_message(codec.encode_batch(batch))
                answer = decode(await writer.get_message())
                assert answer["type"] == "refused" and answer["retryable"] is False
                assert "takes no writers" in answer["reason"]
            a, b = replayer.source.subscribe(), replayer.source.subscribe()
            with pytest.raises(SubscriberLimitError, match="already serves 2"):
                replayer.source.subscribe()
            replayer.source.unsubscribe(a)
            replayer.source.unsubscribe(replayer.source.subscribe())
            replayer.source.unsubscribe(b)
            assert replayer.source.statistics().subscribers == 0
            replayer.source.close()
            nursery.cancel_scope.cancel()
    assert fingerprint(tmp_path) == before


# -- over HTTP and /ws/live --------------------------------------------------------------------


async def http(
    port: int, method: str, path: str, body: bytes = b"", ctype: str = "application/json"
) -> tuple[int, dict]:
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


async def command(port: int, **body: object) -> dict:
    status, answer = await http(port, "POST", "/api/replay", json.dumps(body).encode())
    assert status == 200, answer
    return answer


async def next_of(ws, kind: str) -> dict:
    """The next frame of ``kind`` on ``ws`` (others are skipped)."""
    while True:
        message = decode(await ws.get_message())
        if message["type"] == kind:
            return message


async def test_status_and_seeks_arrive_on_the_same_socket(tmp_path):
    record_run(tmp_path / "r", points=50, spacing=1.0)
    replayer = Replayer([timeline(tmp_path / "r", "exp")], speed=1, start_paused=True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            url = await nursery.start(serve_replay, replayer, "127.0.0.1", 0)
            port = int(url.rsplit(":", 1)[1])
            status, body = await http(port, "GET", "/api/replay")
            assert status == 200 and body["playing"] is False and body["runs"] == ["exp"]
            assert (body["start"], body["end"], body["total"]) == (WALL, WALL + 49, 103)
            async with open_websocket_url(url.replace("http", "ws") + "/ws/live") as ws:
                assert decode(await ws.get_message())["type"] == "hello"
                assert decode(await ws.get_message()) == {"type": "runs", "runs": ["exp"]}
                summaries = decode(await ws.get_message())  # every run, finished, no figures
                assert summaries["type"] == "summaries"
                assert [(r["name"], r["status"]) for r in summaries["runs"]] == [
                    ("exp", "finished")
                ]
                await ws.send_message(msgpack.packb({"type": "subscribe", "runs": None}))
                first = decode(await ws.get_message())
                assert first["type"] == "replay" and first["playing"] is False
                assert (first["start"], first["end"], first["step"]) == (WALL, WALL + 49, None)
                snapshot = decode(await ws.get_message())
                assert snapshot["type"] == "snapshot" and snapshot["run"] == "exp"

                answer = await command(port, action="play")
                assert answer["playing"] is True
                pushed = await next_of(ws, "replay")  # pushed, not asked for
                assert pushed["playing"] is True and pushed["version"] >= answer["version"] - 1
                assert steps_of(await next_of(ws, "data"), "acc") == [0]  # released at once

                answer = await command(port, action="pause")
                while (pushed := await next_of(ws, "replay"))["version"] < answer["version"]:
                    pass
                assert pushed["playing"] is False

                answer = await command(port, action="seek", step=30)
                assert answer["position"] == WALL + 30
                reset = await next_of(ws, "reset")
                assert reset["runs"] == ["exp"]
                snapshot = decode(await ws.get_message())
                assert snapshot["type"] == "snapshot" and snapshot["seq"] == reset["seq"]
                assert steps_of(snapshot, "acc") == list(range(30))

                answer = await command(port, action="seek", wall=WALL + 3.5)  # back
                reset = await next_of(ws, "reset")
                snapshot = decode(await ws.get_message())
                assert steps_of(snapshot, "acc") == list(range(4))

                answer = await command(port, action="speed", speed="max")
                assert answer["speed"] == "max"
                pushed = await next_of(ws, "replay")
                while pushed["version"] < answer["version"]:
                    pushed = await next_of(ws, "replay")
                assert pushed["speed"] == "max"
                status, stats = await http(port, "GET", "/api/stats")
                assert status == 200 and stats["broker"]["resets"] >= 2
                assert len(stats["subscribers"]) == 1  # one socket all along
            status, body = await http(port, "POST", "/api/replay", b'{"action": "rewind"}')
            assert status == 400 and "action must be one of" in body["error"]
            status, body = await http(
                port, "POST", "/api/replay", b'{"action": "seek", "step": 1.5}'
            )
            assert status == 400 and "step must be an integer" in body["error"]
            status, body = await http(
                port, "POST", "/api/replay", b'{"action": "play"}', "text/plain"
            )
            assert status == 415
            replayer.source.close()
            nursery.cancel_scope.cancel()


async def test_the_http_api_answers_as_of_the_replay_position(tmp_path):
    record_run(tmp_path / "r", points=100, spacing=1.0)
    replayer = Replayer([timeline(tmp_path / "r")], start_paused=True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            url = await nursery.start(serve_replay, replayer, "127.0.0.1", 0)
            port = int(url.rsplit(":", 1)[1])
            await command(port, action="seek", step=30)
            status, body = await http(port, "GET", "/api/scalars?run=r&tag=acc")
            assert status == 200 and body["steps"] == list(range(30))
            status, body = await http(port, "GET", "/api/scalars?run=r&tag=acc&start=5&end=9")
            assert body["steps"] == [5, 6, 7, 8, 9]
            status, body = await http(port, "GET", "/api/scalars?run=r&tag=acc&max_points=4")
            assert body["steps"] == [0, 1, 28, 29]  # first, last, the bucket's min and max
            status, body = await http(port, "GET", "/api/tags?run=r")
            assert status == 200
            assert body["tags"]["acc"]["count"] == 30 and body["tags"]["acc"]["step_max"] == 29
            assert body["tags"]["w"]["kind"] == "histogram" and body["tags"]["w"]["count"] == 1
            status, body = await http(port, "GET", "/api/events?run=r&kind=histogram")
            assert [e["step"] for e in body["events"]] == [10]
            status, body = await http(port, "GET", "/api/scalars?run=nope&tag=acc")
            assert status == 404
            status, body = await http(port, "GET", "/api/scalars?run=r&tag=nope")
            assert status == 404
            replayer.source.close()
            nursery.cancel_scope.cancel()


def test_command_line_replay_exits_at_the_end_and_writes_nothing(tmp_path):
    record_run(tmp_path / "logs" / "r", points=500, spacing=0.001)
    before = fingerprint(tmp_path / "logs")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    cmd = [sys.executable, "-m", "vdl_stream.cli", "replay", str(tmp_path / "logs")]
    done = subprocess.run(
        [*cmd, "--speed", "max", "--exit", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert done.returncode == 0, done.stderr
    assert "replaying r at http://127.0.0.1:" in done.stdout
    assert "replayed 1,003 of 1,003 points and events" in done.stdout
    assert fingerprint(tmp_path / "logs") == before
    assert list(scratch.iterdir()) == []  # no temporary copy any more
    bad = subprocess.run([*cmd, "--speed", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "speed must be a positive number" in bad.stderr
    bad = subprocess.run(
        [*cmd[:-1], str(tmp_path / "none")], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "neither a run directory" in bad.stderr
