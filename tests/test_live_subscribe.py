"""``/ws/live`` subscriptions: split snapshots, ``keep`` re-subscriptions (a delta) and batched
live frames (docs/protocol.md), with a real server, real files and real WebSocket clients on
127.0.0.1."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed, open_websocket_url

from vdl_stream import codec
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.server import LIVE_BURST, LIVE_RATE, parse_newest, run_server


def scalars(tag: str, steps: range) -> ScalarColumns:
    s = np.arange(steps.start, steps.stop, dtype=np.int64)
    return ScalarColumns(tag, s, 1.7e9 + s.astype(np.float64), s * 0.5)


def text(step: int) -> dict:
    return {"kind": "text", "tag": "note", "step": step, "wall": 1.7e9 + step, "text": f"t{step}"}


def unpack(raw: bytes) -> list[dict]:
    """The frames of one WebSocket message (a ``frames`` message holds several)."""
    message = msgpack.unpackb(raw)
    if message["type"] == "frames":
        return [msgpack.unpackb(f) for f in message["frames"]]
    return [message]


def steps_of(frame: dict, tag: str = "loss") -> list[int]:
    return [
        int(s) for t, steps, _, _ in frame.get("scalars", []) if t == tag
        for s in np.frombuffer(steps, "<f8")
    ]  # fmt: skip


async def subscribe(ws, runs: list[str] | None, **flags) -> None:
    await ws.send_message(
        codec.encode_message({"type": "subscribe", "runs": runs, "max_points": 100_000, **flags})
    )


async def until_synced(ws) -> list[dict]:
    """Every frame up to and including the next ``synced``."""
    got = []
    while True:
        for frame in unpack(await ws.get_message()):
            got.append(frame)
            if frame["type"] == "synced":
                return got


class Writer:
    """A raw writer on ``/ws/ingest``: one batch at a time, each acknowledged."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.seq = 0

    async def send(self, run: str, steps: range, events: list[dict] | None = None) -> None:
        self.seq += 1
        batch = Batch("w", self.seq, run, [scalars("loss", steps)], events or [])
        await self.ws.send_message(codec.encode_batch(batch))
        answer = msgpack.unpackb(await self.ws.get_message())
        assert (answer["type"], answer["seq"]) == ("ack", self.seq), answer


async def serve(nursery, tmp_path) -> str:
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
    return "ws" + url.removeprefix("http")


async def test_a_split_snapshot_sends_the_scalars_then_the_events(tmp_path, nursery):
    with trio.fail_after(30):
        ws_url = await serve(nursery, tmp_path)
        async with open_websocket_url(ws_url + "/ws/ingest") as w:
            writer = Writer(w)
            for k in range(3):
                await writer.send("r", range(k * 10, k * 10 + 10), [text(k * 10)])
            async with open_websocket_url(ws_url + "/ws/live") as browser:
                await subscribe(browser, None, split=True)
                got = await until_synced(browser)
                kinds = [f["type"] for f in got if f["type"] != "summaries"]
                assert kinds[-3:] == ["snapshot", "snapshot_events", "synced"], kinds
                snap, events = (f for f in got if f["type"].startswith("snapshot"))
                assert snap["events_follow"] is True and snap["events"] == []
                assert steps_of(snap) == list(range(30))
                assert "scalars" not in events and events["seq"] == snap["seq"]
                assert [e["text"] for e in events["events"]] == ["t0", "t10", "t20"]
                # Unsplit (a client that did not ask): one frame with both, as before.
                await subscribe(browser, None)
                got = await until_synced(browser)
                (whole,) = (f for f in got if f["type"].startswith("snapshot"))
                assert whole["type"] == "snapshot" and "events_follow" not in whole
                assert steps_of(whole) == list(range(30)) and len(whole["events"]) == 3


async def test_keep_sends_snapshots_of_the_added_runs_only(tmp_path, nursery):
    with trio.fail_after(30):
        ws_url = await serve(nursery, tmp_path)
        async with open_websocket_url(ws_url + "/ws/ingest") as w:
            writer = Writer(w)
            for run in ("a", "b", "c"):
                await writer.send(run, range(5))
            async with open_websocket_url(ws_url + "/ws/live") as browser:
                await subscribe(browser, ["a", "b"], keep=True, split=True)
                got = await until_synced(browser)
                assert sorted(f["run"] for f in got if f["type"] == "snapshot") == ["a", "b"]
                await subscribe(browser, ["b", "c"], keep=True, split=True)
                got = await until_synced(browser)
                assert [f["run"] for f in got if f["type"] == "snapshot"] == ["c"]
                # Live: b (kept) and c (added) get data; a (dropped) does not.
                for run in ("a", "b", "c"):
                    await writer.send(run, range(5, 8))
                seen: dict[str, list[int]] = {}
                while sorted(seen) != ["b", "c"] or any(len(v) < 3 for v in seen.values()):
                    for f in unpack(await browser.get_message()):
                        assert f.get("run") != "a", f
                        if f["type"] == "data":
                            seen.setdefault(f["run"], []).extend(steps_of(f))
                assert seen == {"b": [5, 6, 7], "c": [5, 6, 7]}
                # Fewer points per tag than the held runs were sent with: they stay.
                await browser.send_message(
                    codec.encode_message(
                        {"type": "subscribe", "runs": ["b", "c"], "keep": True,
                         "max_points": 100_000 - 1}
                    )
                )  # fmt: skip
                got = await until_synced(browser)
                assert [f["run"] for f in got if f["type"] == "snapshot"] == []
                # Another tag filter: nothing held matches it, everything is sent again.
                await subscribe(browser, ["b", "c"], keep=True, tags="loss")
                got = await until_synced(browser)
                assert sorted(f["run"] for f in got if f["type"] == "snapshot") == ["b", "c"]


@asynccontextmanager
async def broker_of_two_runs(tmp_path) -> AsyncIterator[Broker]:
    """A running broker over ``tmp_path`` that wrote runs "a" and "b" (three points of "loss"
    each, persisted); closed when the block ends."""
    broker = Broker(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        for seq, run in enumerate(("a", "b"), 1):
            await broker.ingest(Batch("w", seq, run, [scalars("loss", range(3))], sync=True))
        yield broker
        broker.close()
        await broker.wait_closed()


async def test_keep_after_lost_frames_sends_everything_again(tmp_path):
    with trio.fail_after(20):
        async with broker_of_two_runs(tmp_path) as broker:
            sub = broker.subscribe({"a"})
            await broker.send_snapshot(sub, _discard, 2000)
            assert sub.snapshots == {"a": 2000}
            assert broker.resubscribe(sub, {"a", "b"}, 2000) == ["b"]
            assert broker.resubscribe(sub, {"a", "b"}, 4000) == ["a", "b"]  # more points
            sub.mark_gap()
            assert broker.resubscribe(sub, {"a"}, 2000) is None  # the caller starts afresh


async def test_a_gap_of_one_run_resends_that_run_alone(tmp_path):
    """A gap naming runs (a run whose frames were lost: the bus saw a hole, or its data did
    not fit the subscriber's queue) re-syncs those runs alone: the ``keep`` re-subscription
    that answers it returns them, not the runs sent whole nor the runs that appeared since
    (their every batch reached the client as ``data`` frames)."""
    with trio.fail_after(20):
        async with broker_of_two_runs(tmp_path) as broker:
            sub = broker.subscribe(None)
            await broker.send_snapshot(sub, _discard, 2000)
            await broker.ingest(Batch("w", 3, "c", [scalars("loss", range(3))], sync=True))
            broker._bus_gap("b")  # frames of "b" lost between brokers
            broker._bus_gap("b")  # one gap, however many holes before it is sent
            frames = [msgpack.unpackb(sub.receive_nowait()) for _ in range(3)]
            assert [f["type"] for f in frames] == ["runs", "data", "gap"]  # the queue first
            assert frames[2]["runs"] == ["b"] and sub.statistics().run_gaps == 1
            assert broker.resubscribe(sub, None, 2000) == ["b"]
            await broker.send_snapshot(sub, _discard, 2000, runs=["b"])
            assert broker.resubscribe(sub, None, 2000) == []  # nothing lost since
            # A run that lost frames and is no longer covered is forgotten with it.
            broker._bus_gap("a")
            assert broker.resubscribe(sub, {"b", "c"}, 2000) == []
            assert broker.resubscribe(sub, None, 2000) == ["a"]
            broker._bus_gap(None)  # every run: the caller starts afresh
            assert broker.resubscribe(sub, None, 2000) is None


async def test_frames_about_no_run_wait_while_the_queue_is_full_instead_of_a_gap(tmp_path):
    """A subscriber whose queue is full while its snapshot is sent (the broker's own
    ``summaries`` and ``runs`` frames come meanwhile) gets no gap: those frames wait, then go
    before the run data held for it, which comes coalesced, one frame per run."""
    with trio.fail_after(20):
        broker = Broker(tmp_path, subscriber_queue=4)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            sub = broker.subscribe(None)
            for k in range(12):
                run = f"r{k % 3}"
                await broker.ingest(Batch("w", k + 1, run, [scalars("loss", range(k, k + 1))]))
                if k % 4 == 3:
                    broker._announce()  # a frame about no run, as a summary would be
            stats = sub.statistics()
            # (the first batch of each run announces it: a frame about no run too)
            assert (stats.gaps, stats.dropped, stats.side_frames) == (0, 0, 4), stats
            got = []
            while True:
                try:
                    got.append(msgpack.unpackb(sub.receive_nowait()))
                except trio.WouldBlock:
                    break
            kinds = [f["type"] for f in got]
            assert "gap" not in kinds and kinds.count("runs") >= 2, kinds
            last_runs = max(i for i, k in enumerate(kinds) if k == "runs")
            assert all(k == "data" for k in kinds[last_runs + 1 :])
            steps = {f"r{i}": [] for i in range(3)}
            for f in got:
                if f["type"] == "data":
                    steps[f["run"]].extend(steps_of(f))
            assert steps == {f"r{i}": list(range(i, 12, 3)) for i in range(3)}
            broker.close()
            await broker.wait_closed()


async def _discard(frame: bytes) -> None:
    pass


async def test_a_live_run_added_dropped_and_added_again_mid_stream_is_exact(tmp_path, nursery):
    """Race: run x is written without pause while the browser keeps y and adds, drops and adds x
    back at random moments (``keep``, split snapshots, batched frames). Whatever the timing, the
    browser ends with every point and event of x once: a snapshot replaces what it holds, data
    frames append, frames of a run outside its subscription are ignored (as the page does)."""
    rng = random.Random(1)
    batches, per = 150, 4
    with trio.fail_after(120):
        ws_url = await serve(nursery, tmp_path)
        async with (
            open_websocket_url(ws_url + "/ws/ingest") as w,
            open_websocket_url(ws_url + "/ws/live", max_message_size=1 << 26) as browser,
        ):
            writer = Writer(w)
            await writer.send("y", range(3))
            held: dict[str, list[int]] = {}
            notes: dict[str, list[int]] = {}
            wanted = {"y"}
            await subscribe(browser, ["y"], keep=True, split=True, batch=True)
            done = trio.Event()

            async def write() -> None:
                for k in range(batches):
                    await writer.send("x", range(k * per, k * per + per), [text(k * per)])
                    if rng.random() < 0.2:
                        await trio.sleep(rng.random() * 0.01)
                done.set()

            async def churn() -> None:
                while not done.is_set():
                    await trio.sleep(rng.random() * 0.05)
                    runs = ["y", "x"] if "x" not in wanted or done.is_set() else ["y"]
                    wanted.clear()
                    wanted.update(runs)
                    if "x" not in wanted:
                        held.pop("x", None)
                        notes.pop("x", None)
                    await subscribe(browser, runs, keep=True, split=True, batch=True)
                if "x" not in wanted:
                    wanted.add("x")
                    await subscribe(browser, ["y", "x"], keep=True, split=True, batch=True)

            last, last_note = list(range(batches * per)), (batches - 1) * per

            async def read() -> None:
                while (
                    held.get("x") != last
                    or notes.get("x", [])[-1:] != [last_note]
                    or not done.is_set()
                ):
                    raw = None
                    with trio.move_on_after(0.5):  # the last frame may come before ``done``
                        raw = await browser.get_message()
                    for f in unpack(raw) if raw is not None else []:
                        run = f.get("run")
                        if run is None or run not in wanted:
                            continue
                        if f["type"] == "snapshot":
                            held[run], notes[run] = steps_of(f), []
                        elif f["type"] in ("data", "snapshot_events"):
                            held.setdefault(run, []).extend(steps_of(f))
                            notes.setdefault(run, []).extend(
                                e["step"] for e in f["events"] if e["kind"] == "text"
                            )
                        assert f["type"] != "gap"

            async with trio.open_nursery() as inner:
                inner.start_soon(write)
                inner.start_soon(churn)
                inner.start_soon(read)
            assert held["x"] == list(range(batches * per))
            # A snapshot holds 100 events of a tag picked over the run, later ones come live:
            # each once, in order, up to the last.
            got = notes["x"]
            assert len(got) >= 100 and got[-1] == last_note and got == sorted(set(got))
            assert set(got) <= set(range(0, batches * per, per))
            assert held["y"] == [0, 1, 2]


async def test_batched_live_frames_go_at_once_then_at_most_live_rate_messages(tmp_path, nursery):
    with trio.fail_after(60):
        ws_url = await serve(nursery, tmp_path)
        async with open_websocket_url(ws_url + "/ws/ingest") as w:
            writer = Writer(w)
            await writer.send("r", range(1))
            async with open_websocket_url(ws_url + "/ws/live") as browser:
                await subscribe(browser, None, batch=True)
                await until_synced(browser)
                # A quiet link: a lone frame is not held back for a tick.
                started = trio.current_time()
                await writer.send("r", range(1, 2))
                assert steps_of(unpack(await browser.get_message())[0]) == [1]
                assert trio.current_time() - started < 0.5
                # 1,000 batches as fast as they are acknowledged, read as fast as they come:
                # frames queued meanwhile travel together, in at most LIVE_RATE messages a
                # second (bursts of LIVE_BURST).
                start = trio.current_time()
                async with trio.open_nursery() as inner:

                    async def send_all() -> None:  # not waiting for each acknowledgement
                        for k in range(2, 1002):
                            batch = Batch("w", k + 1, "r", [scalars("loss", range(k, k + 1))], [])
                            await w.send_message(codec.encode_batch(batch))
                        for _ in range(2, 1002):
                            assert msgpack.unpackb(await w.get_message())["type"] == "ack"

                    inner.start_soon(send_all)
                    messages, steps = 0, []
                    with trio.fail_after(30):
                        while steps[-1:] != [1001]:
                            frames = unpack(await browser.get_message())
                            messages += 1
                            for f in frames:
                                if f["type"] == "data":
                                    steps.extend(steps_of(f))
                elapsed = trio.current_time() - start
                assert steps == list(range(2, 1002))
                assert messages <= LIVE_BURST + elapsed * LIVE_RATE + 1, (messages, elapsed)


async def test_a_followed_run_is_primed_and_its_snapshot_stays_exact_as_it_grows(
    tmp_path, monkeypatch
):
    """``serve`` reads the newest followed run's snapshot scalars while the first page loads;
    that page's snapshot then reads no chunk, and once the run grows a snapshot has every point
    (the kept reads are dropped, never served stale)."""
    import recorder
    from recorder.reader import RunReader
    from tests.conftest import wait_until

    reads = []
    original = RunReader._downsample_stream

    def counted(self, tag, start, end, max_points, *args):
        if max_points == 2000:  # a snapshot's (the run's summary reads 2 points)
            reads.append(tag)
        return original(self, tag, start, end, max_points, *args)

    monkeypatch.setattr(RunReader, "_downsample_stream", counted)
    writer = recorder.RunWriter(tmp_path / "r", sync="never")
    for tag in ("loss", "acc"):
        s = np.arange(5000)
        writer.append_scalars(tag, s, 1.7e9 + s, s * 0.5)
    writer.flush()
    broker = Broker(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(partial(broker.follow, 0.05))
            await wait_until(lambda: len(reads) >= 2, 20, "the run's snapshot read once")
            assert sorted(reads) == ["acc", "loss"]
            sub = broker.subscribe()
            (frame,) = await broker.snapshot(sub, max_points=2000)
            assert len(reads) == 2  # nothing read again
            (loss,) = (c for c in msgpack.unpackb(frame)["scalars"] if c[0] == "loss")
            steps = np.frombuffer(loss[1], "<f8")
            assert len(steps) <= 2000 and steps[0] == 0 and steps[-1] == 4999
            broker.unsubscribe(sub)
            s = np.arange(5000, 5010)
            writer.append_scalars("loss", s, 1.7e9 + s, s * 0.5)
            writer.flush()
            sub = broker.subscribe()
            for _ in range(600):  # until the follower polled the new points
                (frame,) = await broker.snapshot(sub, max_points=2000)
                (loss,) = (c for c in msgpack.unpackb(frame)["scalars"] if c[0] == "loss")
                if np.frombuffer(loss[1], "<f8")[-1] == 5009:
                    break
                await trio.sleep(0.05)
            assert np.frombuffer(loss[1], "<f8")[-1] == 5009
            assert np.frombuffer(loss[3], "<f8")[-1] == 5009 * 0.5
            nursery.cancel_scope.cancel()
    writer.close()


async def test_runs_snapshots_are_read_several_at_once_each_run_in_order(tmp_path, monkeypatch):
    """A subscription to many runs reads ``SNAPSHOT_RUNS`` of them at once (their reads overlap
    in the reader threads); each run still comes whole and in order (scalars, then events)."""
    import threading

    import recorder
    from vdl_stream import broker as broker_module

    names = [f"r{i}" for i in range(7)]
    for k, name in enumerate(names):
        with recorder.RunWriter(tmp_path / name, sync="never") as w:
            s = np.arange(100)
            w.append_scalars("loss", s, 1.7e9 + s, s + k)
            w.append_record("text", "note", 1, 1.7e9, {"text": name})
    both = threading.Barrier(2, timeout=10)  # broken (a failure) unless two reads overlap
    real = broker_module._snapshot_scalars

    def overlapping(run, limit, max_points):
        if run.name in ("r0", "r1"):
            both.wait()
        return real(run, limit, max_points)

    monkeypatch.setattr(broker_module, "_snapshot_scalars", overlapping)
    broker = Broker(tmp_path)
    frames: list[dict] = []

    async def keep(frame: bytes) -> None:
        frames.append(msgpack.unpackb(frame))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(partial(broker.follow, 0.05))
            sub = broker.subscribe()
            await broker.send_snapshot(sub, keep, 2000, split=True)
            nursery.cancel_scope.cancel()
    assert sorted(sub.snapshots) == names
    for k, name in enumerate(names):
        mine = [f for f in frames if f["run"] == name]
        assert [f["type"] for f in mine] == ["snapshot", "snapshot_events"], (name, mine)
        assert np.frombuffer(mine[0]["scalars"][0][3], "<f8")[0] == k
        assert [e["text"] for e in mine[1]["events"]] == [name]


async def test_snapshots_of_many_runs_come_whole_even_when_split(tmp_path, nursery, monkeypatch):
    """A ``subscribe`` bringing snapshots of more than ``SPLIT_RUNS_UP_TO`` runs gets each run as
    one whole ``snapshot`` (its scalars and its events, no ``snapshot_events``) although it asked
    for ``split``; one bringing that many or fewer (counted among the runs it names, not the
    server's) still gets them split."""
    from vdl_stream import broker as broker_module

    monkeypatch.setattr(broker_module, "SPLIT_RUNS_UP_TO", 2)
    with trio.fail_after(30):
        ws_url = await serve(nursery, tmp_path)
        async with open_websocket_url(ws_url + "/ws/ingest") as w:
            writer = Writer(w)
            for k, run in enumerate("abcde"):
                await writer.send(run, range(10), [text(k)])
            async with open_websocket_url(ws_url + "/ws/live") as browser:
                # Two of the five runs: split, the scalars first.
                await subscribe(browser, ["a", "b"], keep=True, split=True, batch=True)
                got = [f for f in await until_synced(browser) if f["type"].startswith("snap")]
                assert sorted({f["run"] for f in got}) == ["a", "b"], got
                for run in ("a", "b"):
                    mine = [f for f in got if f["run"] == run]
                    assert [f["type"] for f in mine] == ["snapshot", "snapshot_events"], mine
                    assert mine[0]["events_follow"] is True and mine[0]["events"] == []
                    assert [e["text"] for e in mine[1]["events"]] == [f"t{'abcde'.index(run)}"]
                # Three runs added: each whole.
                await subscribe(browser, list("abcde"), keep=True, split=True, batch=True)
                got = [f for f in await until_synced(browser) if f["type"].startswith("snap")]
                assert sorted(f["run"] for f in got) == ["c", "d", "e"], got
                for f in got:
                    assert f["type"] == "snapshot" and "events_follow" not in f, f
                    assert steps_of(f) == list(range(10))
                    assert [e["text"] for e in f["events"]] == [f"t{'abcde'.index(f['run'])}"]


# -- the first subscription in the URL (/ws/live?newest=N) ----------------------------------------


async def test_the_url_subscribes_to_the_newest_runs_without_a_subscribe_message(tmp_path, nursery):
    with trio.fail_after(30):
        ws_url = await serve(nursery, tmp_path)
        async with open_websocket_url(ws_url + "/ws/ingest") as w:
            writer = Writer(w)
            # Last walls: b (step 19) newest, then c (9), then a (4).
            for run, last in (("a", 5), ("b", 20), ("c", 10)):
                await writer.send(run, range(last), [text(0)])
            url = ws_url + "/ws/live?newest=2&all_up_to=2&max_points=100"
            async with open_websocket_url(url) as browser:
                hello = msgpack.unpackb(await browser.get_message())
                assert hello["subscribed"] == {"runs": ["b", "c"], "max_points": 100}
                # No subscribe sent: the snapshots of the two newest follow the summaries, split.
                got = await until_synced(browser)
                assert [f["type"] for f in got[:2]] == ["runs", "summaries"]
                snaps = [f for f in got if f["type"] == "snapshot"]
                assert sorted(f["run"] for f in snaps) == ["b", "c"]
                assert all(f["events_follow"] is True for f in snaps)
                assert sorted(f["run"] for f in got if f["type"] == "snapshot_events") == ["b", "c"]
                (b,) = (f for f in snaps if f["run"] == "b")
                assert steps_of(b) == list(range(20))
                # The page's own subscribe changes it as a keep re-subscription does (b, sent
                # with as many points, is kept).
                await browser.send_message(
                    codec.encode_message(
                        {"type": "subscribe", "runs": ["a", "b"], "max_points": 100,
                         "keep": True, "split": True}
                    )
                )  # fmt: skip
                got = await until_synced(browser)
                assert [f["run"] for f in got if f["type"] == "snapshot"] == ["a"]
            # As many runs as all_up_to, or fewer: every run (nil), runs added later included.
            url = ws_url + "/ws/live?newest=2&all_up_to=3"
            async with open_websocket_url(url) as browser:
                hello = msgpack.unpackb(await browser.get_message())
                assert hello["subscribed"] == {"runs": None, "max_points": 2000}
                got = await until_synced(browser)
                assert sorted(f["run"] for f in got if f["type"] == "snapshot") == ["a", "b", "c"]
                await writer.send("d", range(3))
                while True:
                    frames = unpack(await browser.get_message())
                    if any(f["type"] == "data" and f["run"] == "d" for f in frames):
                        break
            # Without newest: no subscription, and hello says none.
            async with open_websocket_url(ws_url + "/ws/live?summaries=table") as browser:
                assert "subscribed" not in msgpack.unpackb(await browser.get_message())


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("newest=0", "newest must be an int in [1, 1000]"),
        ("newest=1001", "newest must be an int in [1, 1000]"),
        ("newest=ten", "newest must be an int in [1, 1000]"),
        ("newest=-1", "newest must be an int in [1, 1000]"),
        ("newest=%EF%BC%91", "newest must be an int in [1, 1000]"),  # a full-width digit
        ("newest=", "newest must be an int in [1, 1000]"),
        ("newest=10&all_up_to=x", "all_up_to must be an int in [0, 100000]"),
        ("newest=10&max_points=1", "max_points must be an int in [2, 100000]"),
        ("newest=10&max_points=99999999999", "max_points must be an int in [2, 100000]"),
        ("max_points=100", "all_up_to and max_points need newest"),
    ],
)
async def test_a_bad_first_subscription_in_the_url_closes_with_its_reason(
    tmp_path, nursery, query, reason
):
    with trio.fail_after(30):
        ws_url = await serve(nursery, tmp_path)
        async with open_websocket_url(ws_url + "/ws/live?" + query) as browser:
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await browser.get_message()
            assert closed.value.reason.code == 1008
            assert closed.value.reason.reason == reason


_NEWEST_NAMES = ("newest", "all_up_to", "max_points", "summaries")


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(_NEWEST_NAMES),
        st.one_of(st.text(max_size=9), st.integers(-5, 2_000_000).map(str)),
    )
)
def test_parse_newest_takes_ints_in_range_and_names_anything_else(query):
    try:
        got = parse_newest(query)
    except codec.ProtocolError as exc:
        message = str(exc)
        assert len(message) <= 120
        assert message.split()[0] in _NEWEST_NAMES[:3], message
        return
    if "newest" not in query:
        assert got is None and not {"all_up_to", "max_points"} & set(query)
        return
    assert got is not None
    ranges = {"newest": (1, 1000), "all_up_to": (0, 100_000), "max_points": (2, 100_000)}
    for name, (lo, hi) in ranges.items():
        value = getattr(got, "count" if name == "newest" else name)
        assert lo <= value <= hi
        if name in query:
            assert query[name].isascii() and value == int(query[name])
