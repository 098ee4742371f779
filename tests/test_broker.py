"""The broker and the server, with real files and real WebSocket clients on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

import recorder
from vdl_stream import broker as broker_module
from vdl_stream import codec
from vdl_stream.broker import Broker, Subscriber
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.server import run_server


def scalars(tag: str, steps: range, scale: float = 1.0) -> ScalarColumns:
    s = np.arange(steps.start, steps.stop, dtype=np.int64)
    return ScalarColumns(tag, s, 1.7e9 + s.astype(np.float64), s * scale)


async def test_ingest_persists_durably_and_reads_back(tmp_path):
    with trio.fail_after(20):
        broker = Broker(tmp_path)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            seq = await broker.ingest(Batch("w", 1, "run-a", [scalars("loss", range(100), 0.5)]))
            event = {"kind": "text", "tag": "note", "step": 3, "wall": 1.7e9, "text": "hi"}
            seq = await broker.ingest(
                Batch("w", 2, "run-a", [scalars("loss", range(100, 150), 0.5)], [event], sync=True)
            )
            await broker.wait_persisted(seq, durable=True)
            assert broker.statistics().durable_seq >= seq
            broker.close()
            await broker.wait_closed()
    with recorder.RunReader(tmp_path / "run-a") as reader:
        series = reader.read_scalars("loss")
        assert series.steps.tolist() == list(range(150))
        assert series.values.tolist() == [s * 0.5 for s in range(150)]
        texts = reader.read_records(kind="text")
        assert [r.data["text"] for r in texts] == ["hi"]


async def test_writers_taking_turns_on_one_series_are_told_once_and_others_are_not(tmp_path):
    def hist(tag: str, step: int) -> dict:
        return {"kind": "histogram", "tag": tag, "step": step, "wall": 1.7e9, "count": 0}

    def text(tag: str, step: int) -> dict:
        return {"kind": "text", "tag": tag, "step": step, "wall": 1.7e9, "text": "t"}

    with trio.fail_after(20):
        broker = Broker(tmp_path)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            seqs = {"a": 0, "b": 0, "c": 0}

            async def send(writer: str, run: str, scalar_tags=(), events=()) -> None:
                seqs[writer] += 1
                columns = [scalars(t, range(seqs[writer], seqs[writer] + 1)) for t in scalar_tags]
                await broker.ingest(Batch(writer, seqs[writer], run, columns, list(events)))

            # One series each (the same tag of another kind is another series), meta events
            # with no tag, and a resumed job: a, then c for good.
            for step in range(3):
                await send("a", "r", ["loss"], [text("w", step)])
                await send("b", "r", ["rank1/loss"], [hist("w", step)])
                await send(
                    "b", "r", [], [{"kind": "meta", "tag": None, "step": None, "wall": 1.7e9}]
                )
            await send("c", "r", ["loss"], [text("w", 9)])
            await send("c", "r", ["loss"])
            assert broker.take_notices("a") == broker.take_notices("c") == []
            # A histogram series that goes a, b, a: told, to both, once.
            await send("a", "r2", [], [hist("h", 0)])
            await send("b", "r2", [], [hist("h", 0)])
            assert broker.take_notices("a") == []
            await send("a", "r2", [], [hist("h", 1)])
            told = broker.take_notices("a")
            assert len(told) == 1 and told[0].startswith("two writers log 'h' at once")
            assert broker.take_notices("b") == told
            assert broker.take_notices("b") == []  # each once
            for step in range(3):
                await send("b", "r2", [], [hist("h", 5 + step)])
                await send("a", "r2", [], [hist("h", 5 + step)])
            assert broker.take_notices("a") == broker.take_notices("b") == []
            # Past WATCHED_SERIES series a run's new ones are not watched: bounded memory.
            broker_module.WATCHED_SERIES = 2
            try:
                for who in "aba":
                    await send(who, "r3", ["x", "y", "z"])
            finally:
                broker_module.WATCHED_SERIES = 4096
            assert list(broker._runs["r3"].series_writers) == ["x", "y"]
            assert len(broker.take_notices("a")) == 1  # for x, which is watched
            broker.close()
            await broker.wait_closed()


async def test_duplicate_batches_are_dropped_even_after_a_restart(tmp_path):
    with trio.fail_after(20):
        for attempt in range(2):
            broker = Broker(tmp_path)
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.run)
                # the second broker sees seq 1-3 again (a writer re-sending after a reconnect)
                for seq in range(1, 4 + attempt):
                    await broker.ingest(
                        Batch("w", seq, "r", [scalars("x", range(seq * 10, seq * 10 + 10))])
                    )
                broker.close()
                await broker.wait_closed()
            assert broker.statistics().duplicates == (3 if attempt else 0)
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("x").steps.tolist() == list(range(10, 50))


async def test_full_subscriber_gets_a_gap_not_a_stall():
    sub = Subscriber(None, capacity=2)
    for seq in range(1, 6):
        sub.offer(seq, "r", f"frame{seq}".encode())
    stats = sub.statistics()
    assert (stats.depth, stats.dropped, stats.gaps) == (2, 3, 1)
    assert await sub.receive() == b"frame1"
    assert await sub.receive() == b"frame2"
    gap = msgpack.unpackb(await sub.receive())
    assert gap["type"] == "gap"
    sub.offer(9, "r", b"frame9")  # after the gap was reported, frames flow again
    assert await sub.receive() == b"frame9"


def _offer_data(sub: Subscriber, seq: int, run: str, cols: list[ScalarColumns]) -> None:
    """Offer a data frame with its data, as the broker's fan-out does."""
    sub.offer(seq, run, codec.encode_live("data", seq, run, cols, []), (cols, []))


def _points(frame: bytes) -> dict[str, list[float]]:
    message = msgpack.unpackb(frame)
    assert message["type"] == "data"
    return {t: np.frombuffer(s, "<f8").tolist() for t, s, _w, _v in message["scalars"]}


async def test_a_full_subscriber_gets_the_overflow_coalesced_in_order_not_a_gap():
    sub = Subscriber(None, capacity=2)
    for seq in range(1, 7):  # 1, 2 queued; 3..6 held
        _offer_data(sub, seq, "r", [scalars("a", range(seq * 10, seq * 10 + 2))])
    _offer_data(sub, 7, "s", [scalars("b", range(2))])
    sub.offer(8, "s", b"not-data")  # nothing of it to coalesce: a gap of run "s" alone
    stats = sub.statistics()
    assert (stats.depth, stats.dropped, stats.gaps, stats.coalesced) == (2, 1, 1, 5)
    assert stats.run_gaps == 1
    # ... what was held of "s" went with it; "r" is kept, and a frame about no run is held
    sub.offer(9, None, b"about-no-run")
    assert sub.statistics().side_frames == 1 and sub.lost_runs == {"s"} and not sub.lost
    got = [await sub.receive() for _ in range(5)]
    assert [_points(f) for f in got[:2]] == [{"a": [10.0, 11.0]}, {"a": [20.0, 21.0]}]
    assert msgpack.unpackb(got[2]) == {"type": "gap", "seq": 0, "runs": ["s"]}
    assert got[3] == b"about-no-run"  # frames about no run go before the coalesced data
    assert _points(got[4]) == {"a": [30.0, 31.0, 40.0, 41.0, 50.0, 51.0, 60.0, 61.0]}
    sub = Subscriber(None, capacity=2)
    for seq in range(1, 7):
        _offer_data(sub, seq, "r", [scalars("a", range(seq * 10, seq * 10 + 2))])
    _offer_data(sub, 7, "s", [scalars("b", range(2))])
    assert _points(await sub.receive()) == {"a": [10.0, 11.0]}
    _offer_data(sub, 8, "r", [scalars("a", range(80, 82))])  # room now, but "r" is held: after it
    assert _points(await sub.receive()) == {"a": [20.0, 21.0]}
    sub.covered["r"] = 3  # a snapshot taken meanwhile holds batch 3
    merged = msgpack.unpackb(await sub.receive())
    assert merged["seq"] == 8 and merged["run"] == "r"
    assert _points(await sub.receive()) == {"b": [0.0, 1.0]}
    steps = {t: np.frombuffer(s, "<f8").tolist() for t, s, _w, _v in merged["scalars"]}
    assert steps == {"a": [40.0, 41.0, 50.0, 51.0, 60.0, 61.0, 80.0, 81.0]}
    stats = sub.statistics()
    assert (stats.gaps, stats.dropped, stats.coalesced, stats.held_bytes) == (0, 0, 6, 0)
    assert not sub.lost  # nothing was lost: a keep re-subscription may keep the runs
    _offer_data(sub, 9, "r", [scalars("a", range(90, 91))])  # and frames flow as before
    assert _points(await sub.receive()) == {"a": [90.0]}


async def test_what_a_full_subscriber_holds_is_bounded_in_bytes_then_a_gap():
    frame = len(codec.encode_live("data", 1, "r", [scalars("a", range(100))], []))
    sub = Subscriber(None, capacity=1, capacity_bytes=3 * frame)
    for seq in range(1, 10):
        _offer_data(sub, seq, "r", [scalars("a", range(100))])
    stats = sub.statistics()
    assert (stats.depth, stats.coalesced, stats.gaps, stats.held_bytes) == (1, 3, 1, 0)
    assert stats.dropped == 9 - 1 - 3
    await sub.receive()
    assert msgpack.unpackb(await sub.receive())["type"] == "gap"


async def receive(ws) -> dict:
    return msgpack.unpackb(await ws.get_message())


async def until(ws, kind: str) -> dict:
    while True:
        message = await receive(ws)
        if message["type"] == kind:
            return message


async def test_browser_gets_snapshot_then_live_data(tmp_path, nursery):
    with trio.fail_after(30):
        url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
        ws_url = "ws" + url.removeprefix("http")
        async with open_websocket_url(ws_url + "/ws/ingest") as writer:
            first = Batch("w", 1, "run", [scalars("loss", range(10))])
            await writer.send_message(codec.encode_batch(first))
            assert (await receive(writer))["seq"] == 1
            async with open_websocket_url(ws_url + "/ws/live") as browser:
                assert (await receive(browser))["type"] == "hello"
                await browser.send_message(
                    codec.encode_message({"type": "subscribe", "runs": None})
                )
                snap = await until(browser, "snapshot")
                tag, steps, _, values = snap["scalars"][0]
                assert np.frombuffer(values, "<f8").tolist() == [float(s) for s in range(10)]
                assert (snap["run"], tag) == ("run", "loss")
                assert np.frombuffer(steps, "<f8").tolist() == list(range(10))
                second = Batch("w", 2, "run", [scalars("loss", range(10, 15), 2.0)])
                await writer.send_message(codec.encode_batch(second))
                data = await until(browser, "data")
                assert data["seq"] > snap["seq"]
                assert np.frombuffer(data["scalars"][0][3], "<f8").tolist() == [
                    20.0,
                    22.0,
                    24.0,
                    26.0,
                    28.0,
                ]


async def test_a_bad_frame_closes_only_that_client(tmp_path, nursery):
    with trio.fail_after(30):
        url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
        ws_url = "ws" + url.removeprefix("http") + "/ws/ingest"
        async with open_websocket_url(ws_url) as good, open_websocket_url(ws_url) as bad:
            await good.send_message(
                codec.encode_batch(Batch("g", 1, "r", [scalars("a", range(5))]))
            )
            await bad.send_message(b"\xc1 not msgpack")
            with pytest.raises(ConnectionClosed) as closed:
                await bad.get_message()
            assert closed.value.reason.code == 1008
            assert "malformed msgpack" in closed.value.reason.reason
            await good.send_message(
                codec.encode_batch(Batch("g", 2, "r", [scalars("a", range(5, 9))], sync=True))
            )
            acks = [(await receive(good))["seq"] for _ in range(2)]
            assert acks == [1, 2]


async def test_runs_written_by_another_process_are_discovered_and_followed(tmp_path):
    with recorder.RunWriter(tmp_path / "old", sync="never") as old:
        old.append_scalars("loss", np.arange(5), np.zeros(5), np.ones(5))
    other = recorder.RunWriter(tmp_path / "other", sync="never")  # "another process"
    other.append_scalars("loss", np.arange(3), np.zeros(3), np.zeros(3))
    other.flush()
    broker = Broker(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(partial(broker.follow, 0.05))
            assert broker.runs() == ["old", "other"]
            sub = broker.subscribe()
            snapshots = {
                msgpack.unpackb(f)["run"]: msgpack.unpackb(f) for f in await broker.snapshot(sub)
            }
            assert np.frombuffer(snapshots["other"]["scalars"][0][1], "<f8").tolist() == [0, 1, 2]
            other.append_scalars("loss", np.arange(3, 6), np.zeros(3), np.full(3, 7.0))
            other.append_record("text", "note", 4, 1.0, {"text": "appended"})
            other.flush()
            data = msgpack.unpackb(await sub.receive())
            while data["type"] != "data":
                data = msgpack.unpackb(await sub.receive())
            assert data["run"] == "other"
            assert np.frombuffer(data["scalars"][0][1], "<f8").tolist() == [3, 4, 5]
            assert data["events"][0]["text"] == "appended"
            with recorder.RunWriter(tmp_path / "new", sync="never") as new:  # a run that appears
                new.append_scalars("acc", np.arange(2), np.zeros(2), np.ones(2))
            runs = msgpack.unpackb(await sub.receive())
            assert runs == {"type": "runs", "runs": ["new", "old", "other"]}
            nursery.cancel_scope.cancel()
    other.close()


async def test_snapshots_carry_untagged_events(tmp_path):
    broker = Broker(tmp_path)
    hparams = {"kind": "hparams", "tag": None, "step": None, "wall": 1.0, "hparams": {"lr": 0.1}}
    samples = [
        {
            "kind": "telemetry",
            "tag": None,
            "step": None,
            "wall": 2.0 + i,
            "fields": {"cpu/percent": i},
        }
        for i in range(3)
    ]
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await broker.ingest(Batch("w", 1, "r", [], [hparams, *samples]))
            sub = broker.subscribe()
            (frame,) = await broker.snapshot(sub)
            nursery.cancel_scope.cancel()
    events = msgpack.unpackb(frame)["events"]
    assert [e["kind"] for e in events] == ["hparams", "telemetry", "telemetry", "telemetry"]
    assert events[0]["hparams"] == {"lr": 0.1} and events[-1]["fields"] == {"cpu/percent": 2}


async def test_small_batches_are_written_by_ingest_itself_in_order(tmp_path, monkeypatch):
    """A small batch to a run whose writer is open, with nothing queued before it unwritten, is
    written by ``ingest`` itself (no persist task and worker thread on the acknowledgement
    path); the first batch of a run (its files opened), a batch over INLINE_WRITE_BYTES, a
    ``sync`` batch and a batch behind one still queued go through the worker thread, as does
    any batch while the persist limiter is busy. Everything lands on disk in ingest order."""
    monkeypatch.setattr("vdl_stream.broker.INLINE_WRITE_BYTES", 64 << 10)  # off by default
    broker = Broker(tmp_path)
    where: dict[int, bool] = {}  # writer seq -> written in the event loop's thread
    persist = broker._persist

    def traced(items):  # type: ignore[no-untyped-def]
        for _, batch, _ in items:
            if batch is not None:
                where[batch.seq] = threading.current_thread() is threading.main_thread()
        return persist(items)

    monkeypatch.setattr(broker, "_persist", traced)
    per_tag = broker_module.INLINE_WRITE_BYTES // (24 * 10) + 1  # ten tags: over the bound
    sizes = [3, 3, per_tag, 3, 3, 3]
    steps = [0]
    for n in sizes:
        steps.append(steps[-1] + n)

    def batch(i: int) -> Batch:
        columns = [scalars(f"t{k}", range(steps[i], steps[i] + sizes[i])) for k in range(10)]
        return Batch("w", i + 1, "r", columns, sync=i == 4)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            for i in range(4):
                await broker.wait_written(await broker.ingest(batch(i)))
            queued = await broker.ingest(batch(4))  # sync: queued for the persist task
            await broker.wait_written(await broker.ingest(batch(5)), durable=True)
            assert broker.written(queued)
            # The limiter busy (a run opened or retired in a thread meanwhile): not here.
            item = (99, Batch("w", 7, "r", [scalars("t0", range(steps[-1], steps[-1] + 1))]), 0)
            other = object()  # as a worker thread's call holds it
            await broker._limiter.acquire_on_behalf_of(other)
            assert not broker._write_here([item])
            broker._limiter.release_on_behalf_of(other)
            broker.close()
            await broker.wait_closed()
    assert where == {1: False, 2: True, 3: False, 4: True, 5: False, 6: False}
    with recorder.RunReader(tmp_path / "r") as reader:
        for k in range(10):
            assert reader.read_scalars(f"t{k}").steps.tolist() == list(range(steps[-1]))
        assert reader.read_records(kind="ingest")[-1].data == {"w": 6}


async def test_ingest_writes_nothing_itself_by_default(tmp_path, monkeypatch):
    """INLINE_WRITE_BYTES is 0 by default: every batch, small ones too, is written in the
    persist task's worker thread."""
    assert broker_module.INLINE_WRITE_BYTES == 0
    broker = Broker(tmp_path)
    where: list[bool] = []
    persist = broker._persist

    def traced(items):  # type: ignore[no-untyped-def]
        where.append(threading.current_thread() is threading.main_thread())
        return persist(items)

    monkeypatch.setattr(broker, "_persist", traced)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            for i in range(3):
                batch = Batch("w", i + 1, "r", [scalars("x", range(i, i + 1))])
                await broker.wait_written(await broker.ingest(batch))
            broker.close()
            await broker.wait_closed()
    assert where == [False, False, False]


_ROOT = str(Path(__file__).resolve().parents[1])  # this checkout, for a child process
_KILLED_BROKER = """
import sys, time, numpy as np, trio
from vdl_stream import broker as broker_module
from vdl_stream.broker import Broker
broker_module.INLINE_WRITE_BYTES = int(sys.argv[2])  # > 0: ingest writes these batches itself
from vdl_stream.codec import Batch, ScalarColumns

async def main():
    broker = Broker(sys.argv[1])
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        for i in range(1, 100_000):
            s = np.array([i], dtype=np.int64)
            columns = [ScalarColumns(f"t{k}", s, s + 1.7e9, s * 0.5) for k in range(3)]
            await broker.wait_written(await broker.ingest(Batch("w", i, "r", columns)))
            print(i, flush=True)  # acknowledged: written

trio.run(main)
"""


@pytest.mark.parametrize("inline", [0, 64 << 10])
async def test_a_sigkilled_broker_loses_no_acknowledged_batch(tmp_path, inline):
    """Acknowledged means written: SIGKILL the broker's process (small batches, each waited
    for: with ``inline``, written by ``ingest`` itself) after a few hundred acknowledgements; every
    batch acknowledged is on disk after reopening, in order, with nothing after a gap."""
    env = {**os.environ, "PYTHONPATH": _ROOT}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", _KILLED_BROKER, str(tmp_path), str(inline)],
        stdout=subprocess.PIPE,
        env=env,
    )
    acked = 0
    try:
        with trio.fail_after(60):
            buf = b""
            while acked < 300:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the broker process ended early"
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if lines:
                    acked = int(lines[-1])
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    with recorder.RunReader(tmp_path / "r") as reader:
        for k in range(3):
            steps = reader.read_scalars(f"t{k}").steps.tolist()
            assert steps[:acked] == list(range(1, acked + 1))
            assert steps == list(range(1, len(steps) + 1))


async def test_the_dedup_record_names_only_batches_handed_to_disk(tmp_path):
    """A batch accepted but still queued when the broker dies must be taken again on restart."""
    broker = Broker(tmp_path)
    run = await broker._get_run("r")
    run.last_seq["w"] = 2  # batch 2 was accepted and is still queued for persistence
    batch = Batch("w", 1, "r", [scalars("x", range(3))])
    await trio.to_thread.run_sync(broker._persist, [(1, batch, False)])
    await trio.to_thread.run_sync(broker._close_runs)
    with recorder.RunReader(tmp_path / "r") as reader:
        (record,) = reader.read_records(kind="ingest")
    assert record.data == {"w": 1}


async def test_an_idle_subscribers_frame_goes_to_its_writer_at_offer_never_past_a_queued_one():
    """With ``direct`` set (its consumer waits on an empty queue), ``offer`` hands a frame to it
    rather than queueing it; a frame it refuses is queued, and while anything is queued every
    later frame queues behind it (order kept). A frame the run's snapshot covers goes nowhere,
    as the consumer would have skipped it."""
    sub = Subscriber(None, capacity=8)
    wrote: list[bytes] = []
    takes = [True]

    def direct(frame: bytes) -> bool:
        if takes[0]:
            wrote.append(frame)
        return takes[0]

    sub.direct = direct
    sub.offer(1, "r", b"one")
    stats = sub.statistics()
    assert wrote == [b"one"] and stats.depth == 0
    assert stats.written_at_offer == 1 and stats.sent == 1
    takes[0] = False
    sub.offer(2, "r", b"two")  # refused by the writer (its socket full): queued
    takes[0] = True
    sub.offer(3, "r", b"three")  # something is queued: behind it, not past it
    sub.offer(4, None, b"runs")
    assert wrote == [b"one"] and sub.statistics().depth == 3
    assert [sub.receive_nowait() for _ in range(3)] == [b"two", b"three", b"runs"]
    sub.covered["r"] = 5
    sub.offer(5, "r", b"five")  # the snapshot holds it already: not written (queued, skipped)
    sub.offer(6, "r", b"six")
    assert wrote == [b"one"] and sub.receive_nowait() == b"six"
    sub.offer(7, "r", b"seven")
    sub.direct = None  # the consumer is busy: queued
    sub.offer(8, "r", b"eight")
    assert wrote == [b"one", b"seven"] and sub.receive_nowait() == b"eight"
    stats = sub.statistics()
    assert stats.written_at_offer == 2 and stats.sent == 7 and stats.depth == 0


async def test_lost_is_a_gap_of_every_run_and_depth_counts_what_is_queued(tmp_path):
    """``Subscriber.lost`` follows from its gaps: a gap of one run leaves it False, a gap of every
    run makes it True (and it stays True once the gap was sent); the queue depth it counts
    itself (statistics' ``peak``) matches the channel's."""
    sub = Subscriber(None, capacity=4)
    for seq in (1, 2, 3):
        sub.offer(seq, "a", b"x" * seq)
    assert sub.statistics().depth == 3 and sub.statistics().peak == 3
    assert sub.receive_nowait() == b"x"
    sub.offer(4, "a", b"y")
    assert sub.statistics().depth == 3 and sub.statistics().peak == 3
    sub.mark_gap("a")
    assert not sub.lost and sub.lost_runs == {"a"}
    sub.mark_gap()
    assert sub.lost
    while True:  # the queue drains, then the gap of every run is sent
        try:
            frame = sub.receive_nowait()
        except trio.WouldBlock:
            break
    assert codec.decode_message(frame)["type"] == "gap"
    assert sub.lost and sub.statistics().depth == 0


def test_latency_stages_script_reports_every_stage_of_a_short_run(tmp_path):
    """bench/latency_stages.py wraps the broker's and writer's functions by name; a short run
    over loopback (a server, one writer, two subscribers) must still match batches at every stage
    and report the persist thread's split, the housekeeping and CPU lines (a rename would leave
    its rows empty), and its in-process modes must run."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "latency_stages.py"
    env = {**os.environ, "PYTHONPATH": str(script.parent.parent)}
    out = tmp_path / "stages.json"
    argv = [sys.executable, str(script), "--seconds", "2.5", "--rate", "2000", "--subscribers", "2"]
    argv += ["--window-counts", "taken", "--write-at-offer", "on"]
    done = subprocess.run(
        [*argv, "--json", str(out)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    for stage in (
        "call -> batch",
        "encoded -> ingest",
        "ingest -> written",
        "  persist thread",
        "offer -> subscriber",
        "add_scalar -> subscriber",
        "add_scalar -> first subscriber",
        "ingest -> taken at writer",
    ):
        assert figures["stages"][stage]["50"] >= 0, stage
    # Each batch's taken reaches the writer before its ack (which waits for the write).
    assert figures["stages"]["ingest -> taken at writer"]["50"] < (
        figures["stages"]["ingest -> written"]["50"]
        + figures["stages"]["written -> ack at writer"]["50"]
    )
    assert figures["batches_per_s"] > 0
    # Frames for an idle subscriber are written by the fan-out itself; the others are taken
    # from the queue by the subscriber's send task.
    at_offer, offers = figures["written_at_offer"]
    assert 0 < at_offer <= offers
    # (The stages leave the first second out, where the few frames that subscribers in processes
    # leave queued may all fall.)
    queued = figures["stages"].get("offer -> taken to send")
    assert queued is None or queued["50"] >= 0
    # The first of two subscribers to get a frame got it no later than the two's median.
    first, every = (
        figures["stages"][f"add_scalar -> {s}"]["50"] for s in ("first subscriber", "subscriber")
    )
    assert first <= every
    assert figures["subscriber_us_per_frame"] > 0
    # Each subscriber ran in a process of its own (h13-loop), and the writer's wait is split by
    # what each batch waited on, down to its socket write.
    assert figures["subscribers"] == "2 processes"
    assert sum(figures["cycle_paths"].values()) > 0
    for stage in ("  batch -> send", "  send -> encoded", "  socket write"):
        assert figures["stages"][stage]["50"] >= 0, stage
    # The subscribers of the mode before, in one thread of the driver, still run.
    argv += ["--subscribers-in-process"]
    done = subprocess.run(
        [*argv, "--json", str(out)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["subscribers"] == "one process" and figures["subscriber_us_per_frame"] > 0
    acks, sends = figures["acks"]  # every batch answered, in at most as many sends
    assert acks >= sends >= 1
    assert figures["cpu"]["server: event loop"] > 0 and figures["cpu"]["writer 0"] > 0
    assert "waited for housekeeping" in done.stdout
    for mode, shown in (
        (["--ingest-only", "150"], "Broker.ingest with 10 subscribers"),
        (["--persist-only", "30", "--seconds", "0.5"], "ingest -> written"),
    ):
        done = subprocess.run(
            [sys.executable, str(script), *mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and shown in done.stdout, done.stderr[-2000:]
    # --in-process: the writer's own broker serves the subscribers (the in-process transport).
    argv = [sys.executable, str(script), "--seconds", "2", "--rate", "2000", "--subscribers", "2"]
    done = subprocess.run(
        [*argv, "--in-process", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    for stage in ("call -> batch", "batch -> ingest (in process)", "add_scalar -> subscriber"):
        assert figures["stages"][stage]["50"] >= 0, stage
