"""Transports lose nothing and duplicate nothing: spooling, a killed broker, a broker that is down."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from functools import partial

import numpy as np
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, ConnectionTimeout, serve_websocket

import recorder
from tests.conftest import (
    HeldWrites,
    start_broker_server,
    start_serve,
    stop_serve,
    wait_for,
    wait_until,
)
from vdl_stream import attach, transport
from vdl_stream.codec import Batch, ScalarColumns, decode_batch, decode_message, encode_ack
from vdl_stream.transport import Spool, WebSocketTransport, describe_connect_error


def test_spool_keeps_memory_then_disk_in_order():
    spool = Spool(memory_bytes=10, disk_bytes=1000)
    for seq in range(1, 8):
        spool.put(seq, bytes([seq]) * 4)
    assert len(spool) == 7 and spool.last() == 7
    stats = spool.statistics()
    assert (stats.frames, stats.memory_bytes, stats.disk_bytes, stats.dropped) == (7, 8, 20, 0)
    assert [spool.get(s) for s in (1, 2, 3, 7)] == [b"\1" * 4, b"\2" * 4, b"\3" * 4, b"\7" * 4]
    assert spool.after(4) == [5, 6, 7]
    spool.ack(5)
    assert 5 not in spool and 6 in spool and spool.get(5) is None
    spool.ack(7)
    assert len(spool) == 0 and spool.last() is None
    spool.put(8, b"x" * 30)  # the file was truncated and is reused
    assert spool.get(8) == b"x" * 30
    spool.close()


def test_spool_drops_oldest_past_its_disk_bound_with_one_warning():
    spool = Spool(memory_bytes=0, disk_bytes=25)
    with pytest.warns(RuntimeWarning, match="dropping the oldest"):
        for seq in range(1, 6):
            spool.put(seq, b"y" * 10)
    assert spool.after(0) == [4, 5]
    assert spool.dropped == 3
    spool.close()


def _all_acknowledged(writer) -> bool:
    stats = writer.statistics()
    return (
        stats.queued_calls == 0
        and stats.pending_batches == 0
        and stats.transport is not None
        and stats.transport.queued_batches == 0
    )


def test_killed_broker_loses_and_duplicates_nothing(tmp_path):
    logdir = tmp_path / "logs"
    server = start_serve(logdir)
    port = server.url.rsplit(":", 1)[1]
    steps = 30_000
    try:
        with attach(url=server.ws_url, run="k", telemetry=False) as writer:
            for step in range(steps):
                writer.add_scalar("loss", step * 0.5, step)
                if step == 10_000:
                    # Let what was logged be acknowledged, then pull the plug.
                    wait_for(lambda: _all_acknowledged(writer), what="acknowledgements")
                    server.proc.kill()
                    server.proc.wait()
                if step == 20_000:
                    server = start_serve(logdir, port=int(port))
                if step % 1000 == 0:
                    time.sleep(0.02)  # a training step takes time: batches go out meanwhile
            assert writer.flush(timeout=30) is True
        with recorder.RunReader(logdir / "k") as reader:
            series = reader.read_scalars("loss")
        assert series.steps.tolist() == list(range(steps))  # every event exactly once
        assert series.values.tolist() == [s * 0.5 for s in range(steps)]
    finally:
        stop_serve(server)


def test_training_goes_on_when_the_broker_is_down(tmp_path):
    started = time.monotonic()
    with pytest.warns(RuntimeWarning) as warned:
        writer = attach(url="ws://127.0.0.1:9", run="down", telemetry=False)  # nothing listens on 9
        for step in range(10_000):
            writer.add_scalar("loss", 1.0, step)
        assert writer.flush(timeout=1) is False
        writer.close(timeout=1)
    assert time.monotonic() - started < 15
    messages = [str(w.message) for w in warned]
    assert any("cannot reach the broker" in m for m in messages)
    assert any("not confirmed within the timeout" in m for m in messages)


def test_the_unreachable_broker_warning_says_why():
    with pytest.warns(RuntimeWarning) as warned:
        writer = attach(url="ws://127.0.0.1:9", run="why", telemetry=False)
        writer.close(timeout=0.5)
    messages = [str(w.message) for w in warned if "cannot reach" in str(w.message)]
    assert messages and "connection refused" in messages[0]
    assert "HandshakeError: )" not in messages[0]


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (
            ConnectionRejected(401, (), b"missing or wrong token"),
            "HTTP 401 (missing or wrong token)",
        ),
        (ConnectionRejected(403, (), None), "HTTP 403 (origin or host refused)"),
        (ConnectionTimeout(), "no answer to the WebSocket handshake"),
        (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
        (OSError(113, "No route to host"), "No route to host"),
    ],
)
def test_connect_errors_are_described(error, text):
    assert text in describe_connect_error(error)


def test_websocket_transport_resends_retryable_refusals_and_drops_the_others(tmp_path):
    """Over a real serve: a locked run is refused (retryable) until freed, then lands once; a
    clashing run name is refused for good; both reach take_errors() once."""
    server = start_serve(tmp_path / "logs")
    holder = recorder.RunWriter(tmp_path / "logs" / "held")

    def batch(seq: int, run: str) -> Batch:
        steps = np.arange(seq * 10 - 10, seq * 10)
        return Batch("t", seq, run, [ScalarColumns("x", steps, steps + 1.7e9, steps * 1.0)])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            transport = await nursery.start(WebSocketTransport.run, server.ws_url)
            with trio.fail_after(30):
                for seq in range(1, 6):
                    await transport.send(batch(seq, "held"))
                with trio.move_on_after(1):
                    await transport.wait_acked(5)
                errors = transport.take_errors()
                assert [(e.retryable, "another process" in e.reason) for e in errors] == [
                    (True, True)
                ]
                stats = transport.statistics()
                assert stats.queued_batches == 5 and stats.refusals >= 1 and stats.retries >= 1
                holder.close()
                await transport.wait_acked(5)
                assert transport.statistics().queued_batches == 0
                # a second writer, with a run name the record format cannot hold
                other = await nursery.start(WebSocketTransport.run, server.ws_url)
                await other.send(Batch("u", 1, "exp1/segment-000000.vdlr"))
                await other.wait_acked(1)  # refused for good: nothing left to wait for
                (error,) = other.take_errors()
                assert not error.retryable and "clashes" in error.reason
                assert other.statistics().queued_batches == 0
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        holder.close()
        stop_serve(server)
    with recorder.RunReader(tmp_path / "logs" / "held") as reader:
        assert reader.read_scalars("x").steps.tolist() == list(range(50))


def test_spool_keeps_frames_in_memory_when_its_file_cannot_take_them(tmp_path, monkeypatch):
    """A full disk under the spool file: frames stay in memory, in order, nothing lost."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
        ).returncode
    ):
        pytest.skip("needs root and mount for a tmpfs")
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(disk))
        spool = Spool(memory_bytes=10, disk_bytes=1 << 20)
        with pytest.warns(RuntimeWarning, match="cannot write the spool file"):
            for seq in range(1, 41):
                spool.put(seq, bytes([seq]) * 4096)  # 160 KiB into a 64 KiB disk
        assert spool.file_errors > 0 and len(spool) == 40 and spool.dropped == 0
        assert [spool.get(s)[:1] for s in spool.after(0)] == [bytes([s]) for s in range(1, 41)]
        spool.ack(20)
        assert spool.after(0) == list(range(21, 41)) and spool.nbytes == 20 * 4096
        spool.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], timeout=20, check=False)


class _AckGate:
    """A broker stand-in on 127.0.0.1 that records each batch's arrival and holds its ack until
    the test releases it: what the writer sends while a batch is in flight becomes visible."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int, float]] = []  # (seq, points, arrival)
        self.paths: list[str] = []  # each handshake's target
        self.release = threading.Semaphore(0)  # one release per ack the test allows
        self.port = 0
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    def __enter__(self) -> _AckGate:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(100):  # let whatever waits go, then stop the loop
            self.release.release()
        assert self._token is not None
        self._token.run_sync_soon(self._scope.cancel)
        self._thread.join(10)

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether ``count`` batches came within ``timeout`` seconds."""
        try:
            wait_for(lambda: len(self.batches) >= count, timeout)
        except AssertionError:
            return False
        return True

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as nursery:
                server = await nursery.start(
                    partial(serve_websocket, self._handle, "127.0.0.1", 0, ssl_context=None)
                )
                self.port = server.port
                self._ready.set()

    async def _handle(self, request) -> None:
        self.paths.append(request.path)
        ws = await request.accept()
        # Batches are read as they come (several may be in flight) and acknowledged in order,
        # one per release.
        send, receive = trio.open_memory_channel[tuple[str, int]](1000)

        async def acknowledge() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for writer, seq in receive:
                    await trio.to_thread.run_sync(self.release.acquire)
                    await ws.send_message(encode_ack(writer, seq))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acknowledge)
            with contextlib.suppress(ConnectionClosed):
                while True:
                    batch = decode_batch(decode_message(await ws.get_message()))
                    points = sum(len(c.steps) for c in batch.scalars)
                    self.batches.append((batch.seq, points, time.monotonic()))
                    send.send_nowait((batch.writer, batch.seq))
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("window", [1, 2])
def test_a_point_logged_while_the_window_has_room_leaves_at_once_not_at_the_interval(
    monkeypatch, window
):
    """The gate is a broker that knows no ``taken`` (an older one): the writer asks for it
    (``TAKEN`` on) and, hearing none, its window counts the batches not yet acknowledged, as
    before."""
    monkeypatch.setattr(transport, "TAKEN", True)
    with _AckGate() as gate:
        # A 30 s interval: only the adaptive flush can deliver within the test's deadlines.
        writer = attach(
            url=f"ws://127.0.0.1:{gate.port}",
            run="idle",
            telemetry=False,
            flush_interval=30.0,
            window=window,
        )
        try:
            for step in range(3):
                logged = time.monotonic()
                writer.add_scalar("loss", 1.0, step)
                assert gate.wait_for(step + 1, timeout=5), f"point {step} waited for the timer"
                assert gate.batches[step][1] == 1
                assert gate.batches[step][2] - logged < 5
                gate.release.release()
            # Up to `window` batches go unacknowledged, each at once, one point each; while
            # the window is full, calls accumulate into the next batch, sent as soon as an
            # answer frees a place (not at the 30 s interval).
            for step in range(3, 3 + window):
                writer.add_scalar("loss", 1.0, step)
                assert gate.wait_for(step + 1, timeout=5), f"point {step} waited for an answer"
                assert gate.batches[step][1] == 1
            first = 3 + window
            for step in range(first, first + 100):
                writer.add_scalar("loss", 1.0, step)
            assert not gate.wait_for(first + 1, timeout=0.3)  # nothing more: the window is full
            stats = writer.statistics()
            assert (stats.queued_calls, stats.batches, stats.sent_batches) == (
                100,
                first,
                first,
            )
            assert stats.transport is not None and stats.transport.in_flight == window
            gate.release.release()
            assert gate.wait_for(first + 1, timeout=5)
            assert gate.batches[first][1] == 100
            # (the sender counts a batch as sent once its send returned, which may come just
            # after the gate read it)
            wait_for(lambda: writer.statistics().transport.in_flight == window, 5, "in flight")
            assert gate.paths == ["/ws/ingest?taken=1"]
        finally:
            for _ in range(10):
                gate.release.release()
            writer.close(timeout=10)


def _one_point(seq: int) -> Batch:
    """Writer ``t``'s batch ``seq`` of run ``r``: one point of ``x`` at step ``seq``."""
    steps = np.array([seq], dtype=np.int64)
    return Batch("t", seq, "r", [ScalarColumns("x", steps, steps + 1.7e9, steps * 1.0)])


@pytest.mark.parametrize("taken", [True, False], ids=["taken", "written"])
async def test_over_a_socket_the_window_frees_when_the_broker_took_a_batch_not_when_it_wrote_it(
    tmp_path, monkeypatch, taken
):
    """A real server in process, its writes held. With ``TAKEN`` the window (2) frees as each
    batch is taken, so batches keep going until UNACKED_PER_WINDOW windows wait for their
    writes; without it (the writer asks for no ``taken``) the window fills at 2, as before.
    Either way the spool keeps every batch until its ``ack``, and all land once."""

    monkeypatch.setattr(transport, "TAKEN", taken)
    release = HeldWrites(monkeypatch).open
    window = 2
    full = transport.UNACKED_PER_WINDOW * window if taken else window

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                broker, url = await start_broker_server(nursery, tmp_path / "logs")
                sender = await nursery.start(WebSocketTransport.run, "ws" + url[4:])
                for seq in range(1, full + 1):
                    with trio.fail_after(10):  # a place frees without any write
                        await sender.wait_window(window)
                    await sender.send(_one_point(seq))
                await wait_until(lambda: broker.statistics().batches == full, 10, "ingested")
                with trio.move_on_after(0.3) as waited:
                    await sender.wait_window(window)
                assert waited.cancelled_caught and not sender.has_room(window)
                assert sender.unacknowledged() == full  # nothing written: all kept
                release.set()
                await sender.wait_acked(full)
                assert sender.unacknowledged() == 0 and sender.has_room(window)
                broker.close()
                nursery.cancel_scope.cancel()
    finally:
        release.set()
    with recorder.RunReader(tmp_path / "logs" / "r") as reader:
        assert reader.read_scalars("x").steps.tolist() == list(range(1, full + 1))


async def test_over_a_socket_with_taken_the_link_carries_one_batch_until_the_broker_took_it(
    tmp_path, monkeypatch
):
    """``TAKEN`` on, a window of 2, writes held: once the broker has said ``taken``, a second
    batch sent while the first is not yet taken (its ingest held) leaves no room, although the
    window counts two; the place frees when the broker takes it, before any write. Before
    (h13-loop), two batches could wait in the server's receive path, one behind the other."""
    from vdl_stream.broker import Broker

    monkeypatch.setattr(transport, "TAKEN", True)
    release = HeldWrites(monkeypatch).open
    entered, gate = trio.Event(), trio.Event()
    ingest = Broker.ingest

    async def held_ingest(broker, batch):  # type: ignore[no-untyped-def]
        if batch.seq == 2:
            entered.set()
            await gate.wait()
        return await ingest(broker, batch)

    monkeypatch.setattr(Broker, "ingest", held_ingest)
    window = 2
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                broker, url = await start_broker_server(nursery, tmp_path / "logs")
                sender = await nursery.start(WebSocketTransport.run, "ws" + url[4:])
                await sender.send(_one_point(1))
                # Taken, not written: the broker said so, and the link is free again.
                await wait_until(lambda: sender._taken == 1, 10, "taken")
                assert sender.has_room(window) and sender.unacknowledged() == 1
                await sender.send(_one_point(2))
                await entered.wait()
                with trio.move_on_after(0.3) as waited:
                    await sender.wait_window(window)
                assert waited.cancelled_caught and not sender.has_room(window)
                gate.set()
                with trio.fail_after(10):  # taken: room again, both still unwritten
                    await sender.wait_window(window)
                assert sender.unacknowledged() == 2
                release.set()
                await sender.wait_acked(2)
                broker.close()
                nursery.cancel_scope.cancel()
    finally:
        release.set()
        gate.set()
    with recorder.RunReader(tmp_path / "logs" / "r") as reader:
        assert reader.read_scalars("x").steps.tolist() == [1, 2]


@pytest.mark.filterwarnings("ignore:.*refused a batch")
async def test_in_process_a_batch_refused_while_an_older_refusal_is_harvested_keeps_both(
    tmp_path, monkeypatch
):
    """In process, ``send`` awaits the broker's ingest while another task may harvest an older
    batch's refusal (it goes back to the backlog). The sent batch is then refused at ingest (the
    broker wants the older one first); both go again, the older first, and land once each.
    The old transport kept only the backlog above the newer refusal: the older batch was
    dropped and every re-send refused, for ever (test_window.py's flipper, 1 run in 3 of 100
    seeds)."""
    import errno

    from vdl_stream.broker import Broker

    released = threading.Event()
    failures = [1]
    write_part = Broker._write_part

    def full_disk(broker, run, batches, size):  # type: ignore[no-untyped-def]
        if failures[0]:
            failures[0] -= 1
            released.wait(10)  # batch 1's write fails only once batch 2's ingest is under way
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_part(broker, run, batches, size)

    entered, gate = trio.Event(), trio.Event()
    ingest = Broker.ingest

    async def held_ingest(broker, batch):  # type: ignore[no-untyped-def]
        if batch.seq == 2 and not gate.is_set():
            entered.set()
            await gate.wait()
        return await ingest(broker, batch)

    monkeypatch.setattr(Broker, "_write_part", full_disk)
    monkeypatch.setattr(Broker, "_write_here", lambda broker, items: False)
    monkeypatch.setattr(Broker, "ingest", held_ingest)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker = Broker(tmp_path / "logs")
            await nursery.start(broker.run)
            sender = transport.InProcessTransport(broker)
            await sender.send(_one_point(1))
            nursery.start_soon(sender.send, _one_point(2))
            await entered.wait()
            released.set()
            await broker.wait_persisted(1)  # batch 1 refused (a full disk, retryable)
            assert sender.unacknowledged() == 1  # harvested: batch 1 back in the backlog
            gate.set()
            with trio.fail_after(10):
                await sender.wait_acked(2)
            assert failures == [0] and sender.unacknowledged() == 0
            broker.close()
            nursery.cancel_scope.cancel()
    with recorder.RunReader(tmp_path / "logs" / "r") as reader:
        records = reader.read_records(kind="scalars", tag="x")
    assert [int(s) for r in records for s in r.data.steps] == [1, 2]


async def test_over_a_socket_batches_taken_then_refused_at_their_write_go_again_once(
    tmp_path, monkeypatch
):
    """``TAKEN`` on: the broker takes batches (``taken`` frees the window) and then fails to
    write them (a full disk, retryable, twice). The writer's spool still holds them: they and
    every later batch go again, in order, and each lands exactly once."""
    import errno

    from vdl_stream.broker import Broker

    monkeypatch.setattr(transport, "TAKEN", True)
    failures = [2]
    write_part = Broker._write_part

    def full_disk(broker, run, batches, size):  # type: ignore[no-untyped-def]
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_part(broker, run, batches, size)

    monkeypatch.setattr(Broker, "_write_part", full_disk)
    monkeypatch.setattr(Broker, "_write_here", lambda broker, items: False)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url = await start_broker_server(nursery, tmp_path / "logs")
            sender = await nursery.start(WebSocketTransport.run, "ws" + url[4:])
            for seq in range(1, 31):
                await sender.wait_window(2)
                await sender.send(_one_point(seq))
            await sender.wait_acked(30)
            errors = sender.take_errors()
            assert failures == [0] and errors and all(e.retryable for e in errors)
            assert "disk full" in errors[0].reason
            assert sender.statistics().retries >= 1 and sender.unacknowledged() == 0
            broker.close()
            nursery.cancel_scope.cancel()
    with recorder.RunReader(tmp_path / "logs" / "r") as reader:  # every record: a duplicate shows
        records = reader.read_records(kind="scalars", tag="x")
    assert [int(s) for r in records for s in r.data.steps] == list(range(1, 31))
