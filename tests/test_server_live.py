"""``/ws/live`` to browsers that negotiate permessage-deflate, as every browser does (h-live,
docs/performance.md "Live latency")."""

from __future__ import annotations

import socket
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from trio_websocket import open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, Message, Request
from wsproto.extensions import PerMessageDeflate

from tests.conftest import HeldWrites, start_broker_server, wait_until
from vdl_stream import codec, masking, server
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.server import _frame_header, run_server


class DeflateClient:
    """A ``/ws/live`` client on a raw socket that offers permessage-deflate, as browsers do
    (trio-websocket offers no extension)."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.conn = WSConnection(ConnectionType.CLIENT)
        self.messages: list[bytes] = []
        self.deflate: PerMessageDeflate | None = None
        self._part = b""  # a message read in part (kept between calls of frame())

    @classmethod
    async def connect(cls, host: str, port: int, rcvbuf: int | None = None) -> DeflateClient:
        sock = trio.socket.socket()
        if rcvbuf is not None:  # set before connecting: the window is agreed at the handshake
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect((host, port))
        client = cls(sock)
        request = Request(
            host=f"{host}:{port}", target="/ws/live", extensions=[PerMessageDeflate()]
        )
        await client._send(client.conn.send(request))
        while client.deflate is None:
            for event in await client._events():
                if isinstance(event, AcceptConnection):
                    client.deflate = next(
                        e for e in event.extensions if e.name == "permessage-deflate"
                    )
        return client

    async def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[await self.sock.send(view) :]

    async def _events(self) -> list:
        data = await self.sock.recv(1 << 16)
        assert data, "the server closed the connection"
        self.conn.receive_data(data)
        return list(self.conn.events())

    async def send(self, message: dict) -> None:
        await self._send(self.conn.send(Message(data=codec.encode_message(message))))

    async def frame(self) -> dict:
        """The next frame (decompressed by wsproto), one of a ``frames`` message's in turn."""
        while not self.messages:
            for event in await self._events():
                if isinstance(event, BytesMessage):
                    self._part += event.data
                    if event.message_finished:
                        message = codec.decode_message(self._part)
                        self._part = b""
                        inner = message["frames"] if message["type"] == "frames" else None
                        self.messages.extend(inner or [codec.encode_message(message)])
        return codec.decode_message(self.messages.pop(0))


async def test_browsers_with_deflate_both_get_a_live_frame_as_the_writer_sent_it(tmp_path):
    """Browsers negotiate permessage-deflate (the server's at zlib level 1, ``QuickDeflate``);
    a frame fanned out to two of them decompresses to the same frame, the writer's points."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
            host, port = url.removeprefix("http://").split("/")[0].split(":")
            browsers = [await DeflateClient.connect(host, int(port)) for _ in range(2)]
            for browser in browsers:
                assert browser.deflate.enabled()
                await browser.send({"type": "subscribe", "runs": None})
                while (await browser.frame())["type"] != "synced":
                    pass
            async with open_websocket_url("ws" + url.removeprefix("http") + "/ws/ingest") as ws:
                steps = np.arange(5, dtype=np.int64)
                columns = [ScalarColumns("loss", steps, 1.7e9 + steps, steps * 0.5)]
                await ws.send_message(codec.encode_batch(Batch("w", 1, "r", columns)))
                assert codec.decode_message(await ws.get_message())["type"] == "ack"
            got = []
            for browser in browsers:
                while (frame := await browser.frame())["type"] != "data":
                    pass
                got.append(frame)
            assert got[0] == got[1]
            assert np.frombuffer(got[0]["scalars"][0][3], "<f8").tolist() == [0, 0.5, 1, 1.5, 2]
            for browser in browsers:
                browser.sock.close()
            nursery.cancel_scope.cancel()


def test_small_messages_go_uncompressed_and_large_ones_deflated_in_one_context():
    """``QuickDeflate`` leaves a message under ``DEFLATE_FROM_BYTES`` uncompressed (RSV1 clear)
    and deflates larger ones; a browser's inflater reads both, interleaved, in order (RFC 7692
    lets a sender leave any message uncompressed; the compressor's context spans the others)."""
    from wsproto.events import AcceptConnection as Accept

    from vdl_stream.server import DEFLATE_FROM_BYTES, QuickDeflate

    client = WSConnection(ConnectionType.CLIENT)
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(
        client.send(Request(host="h", target="/ws/live", extensions=[PerMessageDeflate()]))
    )
    assert isinstance(next(server.events()), Request)
    client.receive_data(server.send(Accept(extensions=[QuickDeflate()])))
    assert isinstance(next(client.events()), Accept)
    rng = np.random.default_rng(1)
    small = rng.random(10).tobytes()  # 80 bytes
    large = np.repeat(rng.random(50), 10).tobytes()  # 4 kB that deflate shrinks
    assert len(small) < DEFLATE_FROM_BYTES <= len(large)
    sent = [small, large, small, large, small]
    for message in sent:
        wire = server.send(Message(data=message))
        compressed = bool(wire[0] & 0x40)  # RSV1: this message is deflated
        assert compressed == (len(message) >= DEFLATE_FROM_BYTES)
        if compressed:
            assert len(wire) < len(message) / 2
        client.receive_data(wire)
    got = [e.data for e in client.events() if isinstance(e, BytesMessage)]
    assert got == sent


async def test_serve_puts_what_start_up_built_out_of_the_collectors_reach(tmp_path):
    """A full collection walked the ~60,000 objects of a started server (tens of ms in the middle
    of a live run); ``run_server`` freezes them once started."""
    import gc

    gc.unfreeze()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
            frozen = gc.get_freeze_count()
            nursery.cancel_scope.cancel()
    gc.unfreeze()
    assert frozen > 10_000


def test_a_frame_header_before_the_bytes_is_what_wsproto_writes():
    """Live frames that go uncompressed are written as a header before the frame's own bytes
    (``_Wire``), the same for every browser: the very bytes wsproto's server framing writes,
    at each size where the length's encoding changes (RFC 6455 5.2)."""
    server = WSConnection(ConnectionType.SERVER)
    client = WSConnection(ConnectionType.CLIENT)
    server.receive_data(client.send(Request(host="h", target="/ws/live")))
    assert isinstance(next(server.events()), Request)
    client.receive_data(server.send(AcceptConnection()))
    for size in (0, 1, 125, 126, 127, 65535, 65536, 70000):
        data = bytes(range(256)) * (size // 256) + bytes(size % 256)
        assert _frame_header(size) + data == server.send(Message(data=data)), size


@given(
    parts=st.lists(st.binary(max_size=300), min_size=1, max_size=5),
    cut=st.floats(0, 1, exclude_max=True),
)
def test_a_partial_write_leaves_the_rest_copied_at_most_once(parts, cut):
    """What ``_Wire.send`` still has to write after the socket took part of a ``writev``: the
    very bytes after the first ``written``, and no copy at all when they lie in the last part
    (the tail of a large frame): a view of it."""
    whole = b"".join(parts)
    if not whole:
        return
    written = int(cut * len(whole))
    rest = server._untaken(parts, written)
    assert bytes(rest) == whole[written:]
    if written >= len(whole) - len(parts[-1]):
        assert isinstance(rest, memoryview) and rest.obj is parts[-1]


def test_a_large_frame_cut_short_is_not_copied_whole():
    """A 1 MB frame after its header, the socket having taken 64 kB: the rest is a view of
    the frame's own bytes (``b"".join(parts)[written:]`` built a 1 MB copy, then the rest)."""
    frame = bytes(1 << 20)
    rest = server._untaken([_frame_header(len(frame)), frame], 65536)
    assert isinstance(rest, memoryview) and rest.obj is frame and len(rest) == (1 << 20) - 65526


async def _serve_a_browser_with_a_small_window(
    nursery: trio.Nursery, logdir: Path, batch: bool = False
) -> tuple[Broker, str, DeflateClient]:
    """A broker and its web server on ``logdir``, and a deflate browser with a 4 kB receive
    buffer subscribed to run ``r`` (up to ``synced``; ``batch`` as the page subscribes)."""
    broker, url = await start_broker_server(nursery, logdir)
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    browser = await DeflateClient.connect(host, int(port), rcvbuf=4096)
    # Closed whatever happens: a server send stuck on its full socket would hold the test's
    # teardown (a frame once begun goes whole).
    nursery.start_soon(_close_at_exit, browser.sock)
    await browser.send({"type": "subscribe", "runs": ["r"], "batch": batch})
    while (await browser.frame())["type"] != "synced":
        pass
    return broker, url, browser


def _large_batch(seq: int, rng: np.random.Generator) -> bytes:
    """Batch ``seq`` of run ``r``: three tags of 20,000 random points, about 1.4 MB as a data
    frame, little of it compressible."""
    steps = np.arange(20_000, dtype=np.int64)
    columns = [
        ScalarColumns(f"t{i}", steps + seq * 20_000, 1.7e9 + steps, rng.random(20_000))
        for i in range(3)
    ]
    return codec.encode_batch(Batch("w", seq, "r", columns))


@pytest.mark.parametrize("direct", [False, True], ids=["asgi", "direct"])
async def test_a_browser_that_stops_reading_gets_every_frame_whole_across_a_resubscribe(
    tmp_path, monkeypatch, direct
):
    """A browser whose socket is full holds a frame halfway written; a re-subscription then
    waits for that frame rather than cutting it (a cut frame would leave the browser's
    permessage-deflate state out of step: nothing after it would decode). Every message the
    browser reads afterwards decodes, through the new subscription's ``synced`` and a later
    batch's frame. Through hypercorn's send path, and written directly (``WRITE_DIRECT``)."""
    monkeypatch.setattr(server, "WRITE_DIRECT", direct)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url, browser = await _serve_a_browser_with_a_small_window(nursery, tmp_path)
            rng = np.random.default_rng(7)
            async with open_websocket_url("ws" + url.removeprefix("http") + "/ws/ingest") as ws:
                for seq in range(1, 9):
                    await ws.send_message(_large_batch(seq, rng))
                    assert codec.decode_message(await ws.get_message())["type"] == "ack"
                # The browser reads nothing meanwhile: its stream is stuck in a frame.
                await wait_until(
                    lambda: any(s.depth for s in broker.subscriber_statistics()),
                    30,
                    "the browser's stream to be stuck in a frame",
                )
                await browser.send({"type": "subscribe", "runs": ["r"]})
                kinds = []
                while "synced" not in kinds:
                    kinds.append((await browser.frame())["type"])
                assert "data" in kinds or "snapshot" in kinds, kinds
                last = [ScalarColumns("t0", np.array([10**6]), np.array([1.8e9]), np.array([0.5]))]
                await ws.send_message(codec.encode_batch(Batch("w", 9, "r", last)))
                assert codec.decode_message(await ws.get_message())["type"] == "ack"
                while (frame := await browser.frame())["type"] != "data" or frame["seq"] < 9:
                    pass
                assert np.frombuffer(frame["scalars"][0][3], "<f8").tolist() == [0.5]
            broker.close()
            nursery.cancel_scope.cancel()


async def test_a_browser_that_takes_nothing_is_cut_off_and_frees_its_place(tmp_path, monkeypatch):
    """A browser that subscribes and then never reads again (its socket full) does not hold
    its pool place and the server's send task for good: once a message written directly
    (``WRITE_DIRECT``) has waited ``STALLED_SEND_S`` for the socket, the connection is cut and
    the subscription ends; the writer's batches are answered throughout."""
    monkeypatch.setattr(server, "WRITE_DIRECT", True)
    monkeypatch.setattr(server, "STALLED_SEND_S", 1.0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            # The browser reads nothing after its ``synced``.
            broker, url, _ = await _serve_a_browser_with_a_small_window(nursery, tmp_path)
            assert len(broker.subscriber_statistics()) == 1
            rng = np.random.default_rng(7)
            async with open_websocket_url("ws" + url.removeprefix("http") + "/ws/ingest") as ws:
                for seq in range(1, 5):  # far past the browser's socket's room
                    await ws.send_message(_large_batch(seq, rng))
                    assert codec.decode_message(await ws.get_message())["type"] == "ack"
                await wait_until(
                    lambda: not broker.subscriber_statistics(),
                    20,
                    "the stalled browser's subscription to end",
                )
            broker.close()
            nursery.cancel_scope.cancel()


async def _close_at_exit(sock: trio.socket.SocketType) -> None:
    try:
        await trio.sleep_forever()
    finally:
        sock.close()


@pytest.mark.parametrize("direct", [False, True], ids=["asgi", "direct"])
async def test_answers_written_in_one_round_go_to_the_writer_in_one_send(
    tmp_path, monkeypatch, direct
):
    """The broker's first write is held while two more batches come: the next persist round
    writes both, and their two ``ack``s go to the writer together, in one send (one ``writev``
    with the direct writes), in order; every batch still gets its own answer."""
    monkeypatch.setattr(server, "WRITE_DIRECT", direct)
    writes = HeldWrites(monkeypatch)
    release, rounds = writes.open, writes.rounds
    sends: list[int] = []
    send_many = server.WebSocketSession.send_many

    async def counted(self, messages):  # type: ignore[no-untyped-def]
        if all(codec.decode_message(m)["type"] == "ack" for m in messages):
            sends.append(len(messages))
        await send_many(self, messages)

    monkeypatch.setattr(server.WebSocketSession, "send_many", counted)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url = await start_broker_server(nursery, tmp_path)
            async with open_websocket_url("ws" + url.removeprefix("http") + "/ws/ingest") as ws:
                for seq in (1, 2, 3):
                    steps = np.array([seq], dtype=np.int64)
                    columns = [ScalarColumns("loss", steps, 1.7e9 + steps, steps * 0.5)]
                    await ws.send_message(codec.encode_batch(Batch("w", seq, "r", columns)))
                    if seq == 1:  # the first round holds batch 1 alone
                        await wait_until(lambda: rounds, 10, "the first write")
                await wait_until(lambda: broker.statistics().batches == 3, 10, "three batches")
                release.set()
                acks = [codec.decode_message(await ws.get_message()) for _ in range(3)]
            assert [(a["type"], a["seq"]) for a in acks] == [("ack", 1), ("ack", 2), ("ack", 3)]
            assert rounds[:2] == [1, 2]
            assert sends == [1, 2]
            broker.close()
            nursery.cancel_scope.cancel()


def _one_point(writer: str, seq: int) -> bytes:
    steps = np.array([seq], dtype=np.int64)
    # One run for both writers (a second run would be opened behind the held write), each
    # logging a series of its own: two writers taking turns on one series are told so with a
    # ``notice`` (Broker._check_shared), which this test does not expect.
    columns = [ScalarColumns(f"{writer}/loss", steps, 1.7e9 + steps, steps * 0.5)]
    return codec.encode_batch(Batch(writer, seq, "r", columns))


@pytest.mark.parametrize("direct", [False, True], ids=["asgi", "direct"])
async def test_a_writer_that_asks_hears_taken_before_the_write_and_an_older_one_only_acks(
    tmp_path, monkeypatch, direct
):
    """The broker's writes held: a writer connected with ``?taken=1`` hears ``taken`` for each
    batch as soon as the broker ingested it, long before its ``ack``; one connected without it
    (an older writer) hears nothing until the writes, then its ``ack``s alone, as before. Both
    get one ``ack`` a batch, in order, once written."""
    monkeypatch.setattr(server, "WRITE_DIRECT", direct)
    release = HeldWrites(monkeypatch).open
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url = await start_broker_server(nursery, tmp_path)
            ingest = "ws" + url.removeprefix("http") + "/ws/ingest"
            async with (
                open_websocket_url(ingest + "?taken=1") as new,
                open_websocket_url(ingest) as old,
            ):
                for seq in (1, 2):
                    await new.send_message(_one_point("new", seq))
                    await old.send_message(_one_point("old", seq))
                heard = [codec.decode_message(await new.get_message()) for _ in range(2)]
                assert [(m["type"], m["writer"], m["seq"]) for m in heard] == [
                    ("taken", "new", 1),
                    ("taken", "new", 2),
                ]
                await wait_until(lambda: broker.statistics().batches == 4, 10, "four batches")
                assert not release.is_set()
                with trio.move_on_after(0.3):
                    early = codec.decode_message(await old.get_message())
                    pytest.fail(f"the older writer heard {early} before any write")
                release.set()
                for ws, writer in ((new, "new"), (old, "old")):
                    acks = [codec.decode_message(await ws.get_message()) for _ in range(2)]
                    assert [(a["type"], a["writer"], a["seq"]) for a in acks] == [
                        ("ack", writer, 1),
                        ("ack", writer, 2),
                    ]
            broker.close()
            nursery.cancel_scope.cancel()


def _one_point_batch(seq: int) -> bytes:
    """Batch ``seq`` of run ``r``: one point of ``loss``, its value ``seq`` (a frame of a few
    hundred bytes, under ``DEFLATE_FROM_BYTES``)."""
    steps = np.array([seq], dtype=np.int64)
    columns = [ScalarColumns("loss", steps, 1.7e9 + steps, steps * 1.0)]
    return codec.encode_batch(Batch("w", seq, "r", columns))


@pytest.mark.parametrize("batch", [False, True], ids=["plain", "page"])
async def test_small_frames_written_at_offer_and_queued_reach_a_browser_whole_and_in_order(
    tmp_path, monkeypatch, batch
):
    """A browser whose send task waits on an empty queue gets a small live frame written by
    the broker's fan-out itself (``Subscriber.direct``); while its socket is full the frames
    queue for its send task instead, and once it reads again they arrive in order, whole, the
    large frame that filled it first; then the fan-out writes again. Every batch's point
    arrives once, in order. Subscribed plainly, and as the page is (``batch``: the queued
    frames then travel together)."""
    monkeypatch.setattr(server, "WRITE_DIRECT", True)
    monkeypatch.setattr(server, "WRITE_AT_OFFER", True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url, browser = await _serve_a_browser_with_a_small_window(
                nursery, tmp_path, batch
            )
            got: list[float] = []

            async def read_data(upto: int) -> None:
                while not got or got[-1] < upto:  # a large batch's marks are negative
                    frame = await browser.frame()
                    if frame["type"] == "data":
                        for tag, _steps, _walls, values in frame["scalars"]:
                            points = np.frombuffer(values, "<f8").tolist()
                            # the large batch's three tags each as one mark, if whole
                            got.extend(points if tag == "loss" else [-float(len(points))])

            def written_at_offer() -> int:
                (stats,) = broker.subscriber_statistics()
                return stats.written_at_offer

            async with open_websocket_url("ws" + url.removeprefix("http") + "/ws/ingest") as ws:

                async def send(data: bytes) -> None:
                    await ws.send_message(data)
                    assert codec.decode_message(await ws.get_message())["type"] == "ack"

                for seq in range(1, 4):  # the browser reads each: its send task is idle
                    await send(_one_point_batch(seq))
                    await read_data(seq)
                assert written_at_offer() == 3
                # The browser stops reading; a large frame fills its socket, and the small
                # frames after it queue behind it.
                await send(_large_batch(4, np.random.default_rng(7)))
                for seq in range(5, 25):
                    await send(_one_point_batch(seq))
                (stats,) = broker.subscriber_statistics()
                assert stats.written_at_offer == 3 and stats.depth > 0
                await read_data(24)
                for seq in range(25, 28):  # idle again: written at offer
                    await send(_one_point_batch(seq))
                    await read_data(seq)
                assert written_at_offer() >= 5
                # The browser reads on while a large frame and small ones after it go: its
                # socket takes more now and then, and none of them comes between the large
                # frame's parts (the send task holds the frame, and the send lock).
                async with trio.open_nursery() as reading:
                    reading.start_soon(read_data, 60)
                    await send(_large_batch(28, np.random.default_rng(8)))
                    for seq in range(29, 61):
                        await send(_one_point_batch(seq))
            large = [-20_000.0] * 3
            assert got == [1.0, 2.0, 3.0, *large, *map(float, range(5, 28)), *large] + [
                float(seq) for seq in range(29, 61)
            ]
            broker.close()
            nursery.cancel_scope.cancel()


async def test_with_write_at_offer_off_every_frame_goes_through_the_send_task(
    tmp_path, monkeypatch
):
    """``WRITE_AT_OFFER = False`` keeps every live frame in the subscriber's queue
    for its send task (the path before h12-loop); the frames still arrive, in order."""
    monkeypatch.setattr(server, "WRITE_AT_OFFER", False)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url, browser = await _serve_a_browser_with_a_small_window(nursery, tmp_path)
            async with open_websocket_url("ws" + url.removeprefix("http") + "/ws/ingest") as ws:
                for seq in range(1, 4):
                    await ws.send_message(_one_point_batch(seq))
                    assert codec.decode_message(await ws.get_message())["type"] == "ack"
                    while (frame := await browser.frame())["type"] != "data":
                        pass
                    assert np.frombuffer(frame["scalars"][0][3], "<f8").tolist() == [seq]
            (stats,) = broker.subscriber_statistics()
            assert stats.written_at_offer == 0 and stats.sent >= 3
            broker.close()
            nursery.cancel_scope.cancel()


async def test_a_large_batch_is_unmasked_by_the_quick_masker_and_ingested_whole(
    tmp_path, monkeypatch
):
    """Served, the server unmasks a writer's frames with ``QuickMasker`` on that connection
    (``masking.unmask_connection``), leaving wsproto's module alone, and a batch of 20,000
    points (a 480 kB frame, arriving in many parts) is ingested exactly as it was sent."""
    unmasked: list[int] = []
    process = masking.QuickMasker.process

    def counted(self, data):  # type: ignore[no-untyped-def]
        unmasked.append(len(data))
        return process(self, data)

    monkeypatch.setattr(masking.QuickMasker, "process", counted)
    rng = np.random.default_rng(16)
    steps = np.arange(20_000, dtype=np.int64)
    walls, values = 1.7e9 + steps * 1e-3, rng.standard_normal(20_000)
    frame = codec.encode_batch(Batch("w", 1, "r", [ScalarColumns("loss", steps, walls, values)]))
    assert len(frame) > 400_000
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url = await start_broker_server(nursery, tmp_path)
            from wsproto import frame_protocol

            assert frame_protocol.XorMaskerSimple is masking._WSPROTO_MASKER
            async with open_websocket_url("ws" + url.removeprefix("http") + "/ws/ingest") as ws:
                await ws.send_message(frame)
                answer = codec.decode_message(await ws.get_message())
            assert (answer["type"], answer["seq"]) == ("ack", 1)
            got = await broker.read_scalars("r", "loss", start=None, end=None, max_points=None)
            assert got.steps.tolist() == steps.tolist()
            assert got.values.tolist() == values.tolist()
            assert got.walls.tolist() == walls.tolist()
            # The server's end unmasked the frame with it, in large parts; the client's end (a
            # plain trio-websocket connection in the same process) masked it with wsproto's own.
            assert len(frame) <= sum(unmasked) < 2 * len(frame)
            assert max(unmasked) >= masking.NUMPY_UNMASK_FROM
            assert frame_protocol.XorMaskerSimple is masking._WSPROTO_MASKER
            broker.close()
            nursery.cancel_scope.cancel()
