"""``/ws/live`` to browsers that negotiate permessage-deflate, as every browser does (h-live,
docs/performance.md "Live latency")."""

from __future__ import annotations

from functools import partial

import numpy as np
import trio
from trio_websocket import open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, Message, Request
from wsproto.extensions import PerMessageDeflate

from vdl_stream import codec
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.server import run_server


class DeflateClient:
    """A ``/ws/live`` client on a raw socket that offers permessage-deflate, as browsers do
    (trio-websocket offers no extension)."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.conn = WSConnection(ConnectionType.CLIENT)
        self.messages: list[bytes] = []
        self.deflate: PerMessageDeflate | None = None

    @classmethod
    async def connect(cls, host: str, port: int) -> DeflateClient:
        sock = trio.socket.socket()
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
        part = b""
        while not self.messages:
            for event in await self._events():
                if isinstance(event, BytesMessage):
                    part += event.data
                    if event.message_finished:
                        message = codec.decode_message(part)
                        part = b""
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
