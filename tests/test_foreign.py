"""Live TensorBoard and VisualDL log directories: ``serve`` follows files other programs write.

Real files throughout, written by tensorboardX (in a subprocess for the end-to-end test) or byte
by byte where a test needs a torn or zero-filled tail; the broker is real, and the end-to-end test
runs ``vdl-stream serve`` and reads ``/ws/live`` like a page.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboardX import SummaryWriter
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary
from trio_websocket import open_websocket_url

import recorder
from tests.conftest import start_serve, stop_serve, wait_until
from vdl_stream import codec, tfrecord
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.errors import RefusedError
from vdl_stream.foreign import ForeignRuns, Source, read_chunk

REPO = Path(__file__).resolve().parent.parent
WALL = 1_700_000_000.0


def scalar_record(tag: str, step: int, value: float, wall: float = WALL) -> bytes:
    """One TFRecord holding a tensorflow.Event with one simple_value, as tensorboardX writes it."""
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
    event = Event(wall_time=wall + step, step=step, summary=summary)
    return tfrecord.encode_record(event.SerializeToString())


def vdl_record(tag: str, step: int, value: float) -> bytes:
    """One VisualDL record (u64 length, visualdl.Record{values: [Value{id, tag, timestamp,
    value}]}), encoded by hand as VisualDL's RecordWriter writes it."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    t = tag.encode()
    value_msg = (
        b"\x08" + varint(step) + b"\x12" + varint(len(t)) + t + b"\x18" + varint(1_700_000_000_000)
    )
    value_msg += b"\x25" + struct.pack("<f", value)
    record = b"\x0a" + varint(len(value_msg)) + value_msg
    return struct.pack("<Q", len(record)) + record


def append(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` as a writer would."""
    with open(path, "ab") as f:
        f.write(data)


def write_at(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` over ``path`` at ``offset`` (a block that arrives late)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@contextlib.asynccontextmanager
async def following(logdir: Path, mirror: Path) -> AsyncIterator[tuple[Broker, ForeignRuns, Any]]:
    """A broker over ``logdir`` (following, publishing summaries, as in ``serve``) whose foreign
    follower polls every 10 ms, and a subscriber."""
    broker = Broker(logdir)
    follower = ForeignRuns(logdir, mirror, poll=0.01, scan=0.05)
    broker.foreign = follower
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await nursery.start(broker.follow, 0.2)
        sub = broker.subscribe()
        await nursery.start(follower.run, broker)
        try:
            yield broker, follower, sub
        finally:
            broker.close()
            await broker.wait_closed()
            nursery.cancel_scope.cancel()


async def collect(sub: Any, run: str, tag: str, n: int, seconds: float = 10) -> list[float]:
    """The values of ``run``'s ``tag`` in the data frames ``sub`` receives, until ``n`` came."""
    values: list[float] = []
    with trio.fail_after(seconds):
        while len(values) < n:
            message = msgpack.unpackb(await sub.receive())
            if message["type"] == "data" and message["run"] == run:
                for t, _, _, v in message["scalars"]:
                    if t == tag:
                        values.extend(np.frombuffer(v, "<f8").tolist())
    return values


async def nothing_more(sub: Any, run: str, seconds: float = 0.3) -> None:
    """Assert that ``sub`` gets no scalar point of ``run`` for ``seconds`` (several polls)."""
    with trio.move_on_after(seconds):
        while True:
            message = msgpack.unpackb(await sub.receive())
            if message["type"] == "data" and message["run"] == run:
                assert not message["scalars"], message


# -- torn and zero-filled tails ------------------------------------------------------------------


async def test_a_torn_tail_is_retried_until_the_record_is_complete(tmp_path):
    logdir = tmp_path / "logs"
    (logdir / "run").mkdir(parents=True)
    path = logdir / "run" / "events.out.tfevents.1.host"
    records = [scalar_record("loss", i, i * 0.5) for i in range(4)]
    path.write_bytes(b"".join(records[:3]) + records[3][:9])  # cut inside the header
    async with following(logdir, tmp_path / "mirror") as (_, follower, sub):
        assert await collect(sub, "run", "loss", 3) == [0.0, 0.5, 1.0]
        await nothing_more(sub, "run")
        assert follower.statistics().waiting == 1
        append(path, records[3][9:20])  # now cut inside the payload, then complete
        await nothing_more(sub, "run")
        append(path, records[3][20:] + scalar_record("loss", 4, 2.0))
        assert await collect(sub, "run", "loss", 2) == [1.5, 2.0]
        assert follower.statistics().damage == 0


async def test_a_zero_filled_block_waits_for_its_data(tmp_path):
    """NFS: the file grew, the block in the middle reads as zeros, valid records follow it. The
    follower stops before the zeros and re-reads from there; nothing after them is delivered
    out of order, nothing is reported as damage, and everything arrives once the block is
    written."""
    logdir = tmp_path / "logs"
    (logdir / "run").mkdir(parents=True)
    path = logdir / "run" / "events.out.tfevents.1.host"
    records = [scalar_record("loss", i, float(i)) for i in range(6)]
    hole = len(records[2]) + len(records[3])
    path.write_bytes(records[0] + records[1] + b"\0" * hole + records[4] + records[5])
    async with following(logdir, tmp_path / "mirror") as (_, follower, sub):
        assert await collect(sub, "run", "loss", 2) == [0.0, 1.0]
        await nothing_more(sub, "run")
        assert follower.statistics().damage == 0
        write_at(
            path, len(records[0]) + len(records[1]), records[2] + records[3]
        )  # the block arrives
        assert await collect(sub, "run", "loss", 4) == [2.0, 3.0, 4.0, 5.0]
        assert follower.statistics().damage == 0


async def test_a_zero_filled_tail_waits_too(tmp_path):
    logdir = tmp_path / "logs"
    (logdir / "run").mkdir(parents=True)
    path = logdir / "run" / "events.out.tfevents.1.host"
    records = [scalar_record("loss", i, float(i)) for i in range(3)]
    path.write_bytes(records[0] + b"\0" * 4096)  # preallocated: size grew, data not yet there
    async with following(logdir, tmp_path / "mirror") as (_, follower, sub):
        assert await collect(sub, "run", "loss", 1) == [0.0]
        await nothing_more(sub, "run")
        write_at(path, len(records[0]), records[1] + records[2])
        assert await collect(sub, "run", "loss", 2) == [1.0, 2.0]
        assert follower.statistics().damage == 0


def test_zeros_followed_by_records_become_damage_after_the_grace(tmp_path):
    """Zeros that never fill in are not waited for forever: after ZERO_GRACE they are damage."""
    path = tmp_path / "events.out.tfevents.1.host"
    records = [scalar_record("loss", i, float(i)) for i in range(3)]
    path.write_bytes(records[0] + b"\0" * 64 + records[1] + records[2])
    src = Source(str(path), "tensorboard", "run", "w")
    first = read_chunk(src, now=100.0)
    assert first.end == len(records[0]) and not first.block.corrupt
    later = read_chunk(src, now=100.0 + 31)
    assert later.end == path.stat().st_size
    assert [c.reason for c in later.block.corrupt] == ["header checksum mismatch"]
    assert later.block.scalars["loss"][2].tolist() == [0.0, 1.0, 2.0]


# -- several writers, rotation, damage -----------------------------------------------------------


async def test_two_writers_and_a_rotated_file_feed_one_run(tmp_path):
    logdir = tmp_path / "logs"
    run = logdir / "exp" / "train"
    run.mkdir(parents=True)
    async with following(logdir, tmp_path / "mirror") as (broker, _, sub):
        a = SummaryWriter(str(run), filename_suffix=".a", flush_secs=1)
        b = SummaryWriter(str(run), filename_suffix=".b", flush_secs=1)
        try:
            for i in range(5):
                a.add_scalar("a/loss", float(i), i)
                b.add_scalar("b/loss", float(10 + i), i)
            a.flush()
            b.flush()
            # tensorboardX's flush writes what its worker thread took from its queue: flush
            # until all is in (bounded by collect's deadline).
            got_a: list[float] = []
            got_b: list[float] = []
            with trio.fail_after(10):
                while len(got_a) < 5 or len(got_b) < 5:
                    with trio.move_on_after(0.2):
                        message = msgpack.unpackb(await sub.receive())
                        if message["type"] == "data" and message["run"] == "exp/train":
                            for t, _, _, v in message["scalars"]:
                                (got_a if t == "a/loss" else got_b).extend(
                                    np.frombuffer(v, "<f8").tolist()
                                )
                    a.flush()
                    b.flush()
            assert got_a == [0.0, 1.0, 2.0, 3.0, 4.0]
            assert got_b == [10.0, 11.0, 12.0, 13.0, 14.0]
        finally:
            a.close()
            b.close()
        # Rotation: the writer starts a new file in the same directory.
        rotated = run / "events.out.tfevents.2.host.rotated"
        rotated.write_bytes(b"".join(scalar_record("a/loss", i, float(i)) for i in range(5, 8)))
        assert await collect(sub, "exp/train", "a/loss", 3) == [5.0, 6.0, 7.0]
        assert broker.runs() == ["exp/train"]
        tags = await broker.tags("exp/train")
        assert set(tags) == {"a/loss", "b/loss"}


async def test_a_corrupt_file_is_logged_and_other_runs_carry_on(tmp_path, caplog):
    logdir = tmp_path / "logs"
    (logdir / "bad").mkdir(parents=True)
    (logdir / "good").mkdir()
    rng = np.random.default_rng(1)
    garbage = bytes(rng.integers(1, 256, 3000, dtype=np.uint8))  # no zeros: damage, not unwritten
    good = logdir / "good" / "events.out.tfevents.1.host"
    bad = logdir / "bad" / "events.out.tfevents.1.host"
    bad.write_bytes(scalar_record("loss", 0, 1.0) + garbage + scalar_record("loss", 1, 2.0))
    good.write_bytes(scalar_record("loss", 0, 7.0))
    with caplog.at_level(logging.ERROR, "vdl_stream.foreign"):
        async with following(logdir, tmp_path / "mirror") as (_, follower, sub):
            values: dict[str, list[float]] = {"bad": [], "good": []}
            with trio.fail_after(10):
                while len(values["bad"]) < 2 or len(values["good"]) < 1:
                    message = msgpack.unpackb(await sub.receive())
                    if message["type"] == "data":
                        for _, _, _, v in message["scalars"]:
                            values[message["run"]].extend(np.frombuffer(v, "<f8").tolist())
            assert values == {"bad": [1.0, 2.0], "good": [7.0]}
            append(good, scalar_record("loss", 1, 8.0))  # the good run is still followed, live
            assert await collect(sub, "good", "loss", 1) == [8.0]
            assert follower.statistics().damage == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "bad/events.out.tfevents.1.host: damaged record at byte" in errors[0]
    assert "header checksum mismatch" in errors[0]


async def test_visualdl_records_are_followed_with_torn_and_zero_tails(tmp_path):
    logdir = tmp_path / "logs"
    (logdir / "vdl").mkdir(parents=True)
    path = logdir / "vdl" / "vdlrecords.1700000000.log"
    records = [vdl_record("acc", i, i / 10) for i in range(4)]
    path.write_bytes(records[0] + records[1][:5])
    async with following(logdir, tmp_path / "mirror") as (_, _, sub):
        assert await collect(sub, "vdl", "acc", 1) == [0.0]
        write_at(
            path, len(records[0]), records[1] + b"\0" * len(records[2])
        )  # torn tail completed, then a zero block
        assert await collect(sub, "vdl", "acc", 1) == [pytest.approx(0.1)]
        await nothing_more(sub, "vdl")
        write_at(path, len(records[0]) + len(records[1]), records[2] + records[3])
        assert await collect(sub, "vdl", "acc", 2) == [pytest.approx(0.2), pytest.approx(0.3)]


# -- naming, read-only, restart ------------------------------------------------------------------


async def test_foreign_runs_are_read_only_and_resume_without_duplicates(tmp_path):
    logdir = tmp_path / "logs"
    (logdir / "tb").mkdir(parents=True)
    path = logdir / "tb" / "events.out.tfevents.1.host"
    path.write_bytes(b"".join(scalar_record("loss", i, float(i)) for i in range(3)))
    mirror = tmp_path / "mirror"
    async with following(logdir, mirror) as (broker, follower, sub):
        assert await collect(sub, "tb", "loss", 3) == [0.0, 1.0, 2.0]
        assert follower.owns("tb") and not follower.owns("other")
        batch = Batch(
            "w", 1, "tb", [ScalarColumns("x", np.zeros(1, "<i8"), np.ones(1), np.ones(1))]
        )
        with pytest.raises(RefusedError) as refused:
            await broker.ingest(batch)
        assert not refused.value.retryable
        assert "read-only" in refused.value.reason
        assert broker.run_path("tb") == mirror / "tb"
    assert not any(n for n in os.listdir(logdir / "tb") if "tfevents" not in n)  # untouched
    with recorder.RunReader(mirror / "tb") as reader:  # the broker closed: all is on disk
        (meta,) = [r for r in reader.read_records("meta") if "followed_from" in r.data]
    assert meta.data["followed_from"] == ["tensorboard"] and meta.data["read_only"] is True
    assert meta.data["source_dir"] == "tb"
    append(path, scalar_record("loss", 3, 3.0))
    async with following(logdir, mirror) as (broker, _, sub):
        assert await collect(sub, "tb", "loss", 1) == [3.0]  # only what is new
        await nothing_more(sub, "tb")
    with recorder.RunReader(mirror / "tb") as reader:
        assert reader.read_scalars("loss").values.tolist() == [0.0, 1.0, 2.0, 3.0]
        metas = reader.read_records("meta")
        assert sum("followed_from" in r.data for r in metas) == 1  # not again on resume


# -- end to end: serve, a tensorboardX writer process, /ws/live ------------------------------------

WRITER = """
import sys, time
from tensorboardX import SummaryWriter
w = SummaryWriter(sys.argv[1], flush_secs=1)
print("started", flush=True)
for step in range(200):  # 2 s: the run is found (within serve's 1 s walk) while it is written
    w.add_scalar("train/loss", step * 0.25, step)
    time.sleep(0.01)
    if step % 10 == 9:
        w.flush()
w.close()
print("done", flush=True)
"""


def start_writer(directory: Path) -> subprocess.Popen:
    """Start the tensorboardX process of :data:`WRITER`, writing into ``directory``."""
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def test_serve_pushes_a_tensorboardx_writer_live(tmp_path):
    """``vdl-stream serve`` over a directory a tensorboardX process is writing: a client of
    /ws/live gets every point, in order, while the writer runs."""
    logdir = tmp_path / "logs"
    logdir.mkdir()
    server = start_serve(logdir, "--cache-dir", str(tmp_path / "cache"))
    writer = None
    try:
        with trio.fail_after(60):
            async with open_websocket_url(server.ws_url + "/ws/live") as ws:
                await ws.send_message(codec.encode_message({"type": "subscribe", "runs": None}))
                writer = start_writer(logdir / "tbx" / "run1")
                values: list[float] = []
                live = 0
                while len(values) < 200:
                    message = msgpack.unpackb(await ws.get_message())
                    if message.get("run") != "tbx/run1" or message["type"] not in (
                        "data",
                        "snapshot",
                    ):
                        continue
                    if message["type"] == "snapshot":
                        values = []
                    else:
                        live += 1
                    for tag, _, _, v in message["scalars"]:
                        if tag == "train/loss":
                            values.extend(np.frombuffer(v, "<f8").tolist())
                assert values == [s * 0.25 for s in range(200)]
                assert live >= 2  # pushed as it was written, not in one piece at the end
            # A writer that sends to the foreign run is refused: it is read-only.
            async with open_websocket_url(server.ws_url + "/ws/ingest") as ingest:
                columns = ScalarColumns("x", np.zeros(1, "<i8"), np.full(1, WALL), np.ones(1))
                await ingest.send_message(codec.encode_batch(Batch("w", 1, "tbx/run1", [columns])))
                answer = msgpack.unpackb(await ingest.get_message())
            assert answer["type"] == "refused" and answer["retryable"] is False, answer
            assert "read-only" in answer["reason"]
        assert await trio.to_thread.run_sync(writer.wait, 30) == 0
        assert await trio.to_thread.run_sync(stop_serve, server) == 0  # a clean shutdown
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
        stop_serve(server)


async def test_the_follower_stops_cleanly_when_the_broker_closes(tmp_path):
    """Shutdown: a file that grows after the broker closed ends the follower, not serve with an
    error (ingest raises ClosedResourceError then)."""
    logdir = tmp_path / "logs"
    (logdir / "run").mkdir(parents=True)
    path = logdir / "run" / "events.out.tfevents.1.host"
    path.write_bytes(scalar_record("loss", 0, 0.0))
    broker = Broker(logdir)
    follower = ForeignRuns(logdir, tmp_path / "mirror", poll=0.01, scan=0.05)
    broker.foreign = follower
    returned = trio.Event()

    async def follow(task_status=trio.TASK_STATUS_IGNORED):
        await follower.run(broker, task_status=task_status)
        returned.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            sub = broker.subscribe()
            await nursery.start(follow)
            assert await collect(sub, "run", "loss", 1) == [0.0]
            broker.close()
            await broker.wait_closed()
            append(path, scalar_record("loss", 1, 1.0))
            await returned.wait()


async def test_reads_are_bounded_per_poll_and_every_file_gets_its_turn(tmp_path, monkeypatch):
    """With a budget of a few records per poll, two long files are still read whole, in order."""
    from vdl_stream import foreign

    monkeypatch.setattr(foreign, "READ_BYTES", 200)
    monkeypatch.setattr(foreign, "ROUND_BYTES", 150)
    logdir = tmp_path / "logs"
    for name in ("a", "b"):
        (logdir / name).mkdir(parents=True)
        records = [scalar_record("loss", i, float(i)) for i in range(60)]
        (logdir / name / "events.out.tfevents.1.host").write_bytes(b"".join(records))
    async with following(logdir, tmp_path / "mirror") as (_, follower, sub):
        values: dict[str, list[float]] = {"a": [], "b": []}
        with trio.fail_after(20):
            while len(values["a"]) < 60 or len(values["b"]) < 60:
                message = msgpack.unpackb(await sub.receive())
                if message["type"] == "data":
                    batch_points = 0
                    for _, _, _, v in message["scalars"]:
                        values[message["run"]].extend(np.frombuffer(v, "<f8").tolist())
                        batch_points += len(v) // 8
                    assert batch_points <= 5  # 200 bytes a read: a few records a batch
        assert values == {"a": [float(i) for i in range(60)], "b": [float(i) for i in range(60)]}
        # The follower moves a file's offset once its batch is ingested, which is after the
        # frame reached the subscriber: wait for it (polled, with a deadline).
        await wait_until(lambda: not follower.statistics().waiting, 10, "the offsets")


# -- property: a file written in any pieces is read exactly once, in order ----------------------


def _read_on(src: Source, got: list[float]) -> None:
    """Read what ``src`` has past its offset, checking it is undamaged; keep tag "v"'s values."""
    chunk = read_chunk(src, now=0.0)
    if chunk.block is not None:
        assert not chunk.block.corrupt
        got.extend(np.asarray(chunk.block.scalars.get("v", ([], [], []))[2]).tolist())
    src.offset = chunk.end


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["tensorboard", "visualdl"]),
    cuts=st.lists(st.integers(1, 400), min_size=1, max_size=12),
    hole=st.booleans(),
)
def test_any_split_of_a_growing_file_is_read_exactly_once(tmp_path_factory, kind, cuts, hole):
    """Append a file in random pieces (cut mid-header, mid-payload), optionally with the next piece
    first seen as zeros (an NFS block not yet written): polling after every step yields every
    point once, in order, and never reports damage."""
    path = tmp_path_factory.mktemp("split") / (
        "events.out.tfevents.1.h" if kind == "tensorboard" else "vdlrecords.1.log"
    )
    make = scalar_record if kind == "tensorboard" else vdl_record
    data = b"".join(make("v", i, float(i)) for i in range(30))
    src = Source(str(path), kind, "run", "w")
    got: list[float] = []

    def poll() -> None:
        _read_on(src, got)

    written = 0
    path.write_bytes(b"")
    for cut in [*cuts, len(data)]:
        end = min(len(data), written + cut)
        if hole and end > written:
            append(path, b"\0" * (end - written))  # the size grew, the bytes are not there yet
            poll()
            write_at(path, written, data[written:end])
        else:
            append(path, data[written:end])
        written = end
        poll()
    poll()
    assert got == pytest.approx([float(i) for i in range(30)])
    assert src.offset == len(data)


@settings(max_examples=60, deadline=None)
@given(
    hole_at=st.integers(0, 1100),
    hole_len=st.integers(8, 300),  # a block: 8 bytes at least (NFS holes are whole pages)
    tail=st.integers(0, 400),
)
def test_a_hole_with_data_after_it_holds_back_only_until_filled(
    tmp_path_factory, hole_at, hole_len, tail
):
    """NFS: a later block is visible before an earlier one. Nothing at or after the hole is read
    (no damage, no point out of order); once it is filled, everything comes, once."""
    path = tmp_path_factory.mktemp("hole") / "events.out.tfevents.1.h"
    data = b"".join(scalar_record("v", i, float(i)) for i in range(30))
    hole_at = min(hole_at, len(data) - 1)
    end = min(len(data), hole_at + hole_len)
    visible = min(len(data), end + tail)
    path.write_bytes(data[:hole_at] + b"\0" * (end - hole_at) + data[end:visible])
    src = Source(str(path), "tensorboard", "run", "w")
    got: list[float] = []

    def poll() -> None:
        _read_on(src, got)

    poll()
    assert src.offset <= hole_at  # stopped before the hole
    write_at(path, hole_at, data[hole_at:end])
    append(path, data[visible:])
    poll()
    poll()
    assert got == [float(i) for i in range(30)]


async def test_a_quiet_foreign_run_is_finished_and_live_again_when_it_grows(tmp_path):
    """Event files carry no close marker: a run whose files are read and unchanged for
    FINISHED_AFTER seconds is shown finished (not crashed), and live again once one grows."""
    logdir = tmp_path / "logs"
    (logdir / "old").mkdir(parents=True)
    path = logdir / "old" / "events.out.tfevents.1.host"
    path.write_bytes(scalar_record("loss", 0, 1.0))
    past = time.time() - 3600
    os.utime(path, (past, past))  # written an hour ago

    async def until_status(sub: Any, wanted: str) -> None:
        with trio.fail_after(15):  # summaries are published once a second
            while True:
                message = msgpack.unpackb(await sub.receive())
                if message["type"] == "summaries":
                    for summary in message["runs"]:
                        if summary["name"] == "old" and summary["status"] == wanted:
                            return

    async with following(logdir, tmp_path / "mirror") as (broker, _, sub):
        await until_status(sub, "finished")
        assert [s["status"] for s in broker.summaries() if s["name"] == "old"] == ["finished"]
        append(path, scalar_record("loss", 1, 2.0))
        assert await collect(sub, "old", "loss", 1) == [2.0]
        await until_status(sub, "live")


# -- the walk's listings (ForeignRuns._list) ------------------------------------------------------


def _walk_reference(logdir: str, mirror: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """What ``_list`` finds, by the plain os.walk it replaced (without writer ids)."""
    from recorder.catalog import SEGMENT_RE
    from vdl_stream.interop import source_kind

    out = []
    for dirpath, dirnames, filenames in os.walk(logdir):
        dirnames.sort()
        dirnames[:] = [d for d in dirnames if os.path.abspath(os.path.join(dirpath, d)) != mirror]
        if any(SEGMENT_RE.match(n) for n in filenames):
            continue
        files = []
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if source_kind(name) is not None and os.path.isfile(path) and not os.path.islink(path):
                files.append((path, source_kind(name)))
        if files:
            out.append((dirpath, files))
    return out


def _found(follower: ForeignRuns) -> list[tuple[str, list[tuple[str, str]]]]:
    return [(d, [(p, k) for p, k, _ in files]) for d, files in follower._list()]


_TREE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["a", "a/b", "a/b/c", "d", "d/e", "mirror", "mirror/x", "."]),
        st.sampled_from(
            [
                "events.out.tfevents.1.host",
                "events.out.tfevents.2.host",
                "vdlrecords.1.log",
                "segment-000000.vdlr",
                "notes.txt",
                "events.out.tfevents.link",
                "sub",
            ]
        ),
        st.booleans(),  # add (or remove)
        st.booleans(),  # put the directory's mtime back to what it was
    ),
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(first=_TREE_OPS, then=_TREE_OPS)
def test_the_walk_finds_what_os_walk_finds_after_any_changes(
    tmp_path_factory: pytest.TempPathFactory, first: list, then: list
) -> None:
    """Files and directories added and removed between walks, some with the directory's mtime
    put back (a change inside one clock tick): every walk finds what os.walk finds."""
    logdir = tmp_path_factory.mktemp("logdir")
    mirror = logdir / "mirror"
    follower = ForeignRuns(logdir, mirror, poll=0.01, scan=0.05)

    def apply(ops: list) -> None:
        for where, name, add, keep_mtime in ops:
            d = logdir / where
            d.mkdir(parents=True, exist_ok=True)
            before = os.stat(d).st_mtime_ns
            path = d / name
            if add and not os.path.lexists(path):
                if name == "sub":
                    path.mkdir()
                elif name.endswith(".link"):
                    path.symlink_to(d)
                else:
                    path.write_bytes(b"")
            elif not add and os.path.lexists(path):
                if path.is_dir() and not path.is_symlink():
                    if not any(path.iterdir()):
                        path.rmdir()
                else:
                    path.unlink()
            if keep_mtime:
                os.utime(d, ns=(before, before))

    apply(first)
    assert _found(follower) == _walk_reference(str(logdir), str(mirror))
    apply(then)
    assert _found(follower) == _walk_reference(str(logdir), str(mirror))


def test_an_unchanged_directory_is_not_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory whose mtime is unchanged (and old enough to trust) costs a stat, not a
    listing; a file added to it is found at the next walk."""
    import vdl_stream.foreign as foreign

    runs = [tmp_path / f"run{i}" for i in range(5)]
    old = time.time_ns() - 10 * foreign.RACY_NS
    for d in runs:
        d.mkdir()
        (d / "events.out.tfevents.1.host").write_bytes(b"")
        os.utime(d, ns=(old, old))
    os.utime(tmp_path, ns=(old, old))
    follower = ForeignRuns(tmp_path, tmp_path / "mirror", poll=0.01, scan=0.05)
    assert len(follower._list()) == 5

    listed: list[str] = []
    scandir = os.scandir

    def counting(path: Any) -> Any:
        listed.append(os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(foreign.os, "scandir", counting)
    assert len(follower._list()) == 5
    assert listed == []
    (runs[2] / "events.out.tfevents.2.host").write_bytes(b"")
    found = dict(follower._list())
    assert listed == [str(runs[2])]
    assert [os.path.basename(p) for p, _, _ in found[str(runs[2])]] == [
        "events.out.tfevents.1.host",
        "events.out.tfevents.2.host",
    ]


def test_a_file_added_within_the_listings_clock_tick_is_found(tmp_path: Path) -> None:
    """An entry added without changing the directory's mtime (the same clock tick as the
    listing) is found at the next walk: a listing that recent is not trusted."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.out.tfevents.1.host").write_bytes(b"")
    follower = ForeignRuns(tmp_path, tmp_path / "mirror", poll=0.01, scan=0.05)
    assert [len(files) for _, files in follower._list()] == [1]
    mtime = os.stat(run).st_mtime_ns
    (run / "events.out.tfevents.2.host").write_bytes(b"")
    os.utime(run, ns=(mtime, mtime))
    assert [len(files) for _, files in follower._list()] == [2]
