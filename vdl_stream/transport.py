"""Transports carry a writer's batches to a broker and report when they are durable.

- :class:`InProcessTransport`: the broker runs in the writer's own background trio loop.
- :class:`WebSocketTransport`: the broker is a ``vdl-stream serve`` reached over ``/ws/ingest``.
  Batches stay queued until acknowledged; after a disconnect the transport reconnects with backoff
  and re-sends them, and the broker drops the ones it already has, so nothing is lost or duplicated.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from . import codec
from .codec import Batch

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("vdl_stream.transport")


class Transport(Protocol):
    """What the writer's background loop needs from a transport."""

    url: str | None

    async def send(self, batch: Batch) -> None:
        """Take a batch; it is re-sent as needed until acknowledged."""

    async def wait_acked(self, seq: int) -> None:
        """Wait until the writer's batches up to ``seq`` are durable."""

    async def aclose(self) -> None:
        """Deliver what is queued (bounded by the caller's deadline) and release resources."""


class InProcessTransport:
    """Hands batches straight to a broker running in the same trio loop."""

    def __init__(self, broker: Broker) -> None:
        self.url: str | None = None
        self._broker = broker
        self._broker_seq: dict[int, int] = {}  # writer seq -> broker seq

    async def send(self, batch: Batch) -> None:
        self._broker_seq[batch.seq] = await self._broker.ingest(batch)

    async def wait_acked(self, seq: int) -> None:
        broker_seq = self._broker_seq.get(seq, 0)
        self._broker_seq = {s: b for s, b in self._broker_seq.items() if s > seq}
        await self._broker.wait_persisted(broker_seq, durable=True)

    async def aclose(self) -> None:
        self._broker.close()
        await self._broker.wait_closed()


class WebSocketTransport:
    """Publishes batches to a remote broker over a WebSocket, re-sending until acknowledged.

    Args:
        url: the server, ``ws://host:port`` (the ``/ws/ingest`` path is added when missing).
        token: sent as ``Authorization: Bearer <token>`` when given.
        max_queued_bytes: unacknowledged batches kept in memory; beyond it the oldest are dropped
            with a warning, so a broker that stays down never exhausts the training process.
    """

    def __init__(
        self, url: str, token: str | None = None, *, max_queued_bytes: int = 256 << 20
    ) -> None:
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss://, got {url!r}")
        self.url = url if url.rstrip("/").endswith("/ws/ingest") else url.rstrip("/") + "/ws/ingest"
        self._headers = [("Authorization", f"Bearer {token}")] if token else []
        self._max_bytes = max_queued_bytes
        self._unacked: OrderedDict[int, bytes] = OrderedDict()
        self._queued_bytes = 0
        self._acked = 0
        self._dropped = 0
        self._changed = trio.Event()
        self._warned = False

    @classmethod
    async def run(
        cls,
        url: str,
        token: str | None = None,
        *,
        task_status: trio.TaskStatus[WebSocketTransport] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Create a transport, report it through ``task_status`` and keep it connected."""
        self = cls(url, token)
        task_status.started(self)
        await self._connect_forever()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def send(self, batch: Batch) -> None:
        frame = codec.encode_batch(batch)
        self._unacked[batch.seq] = frame
        self._queued_bytes += len(frame)
        while self._queued_bytes > self._max_bytes and len(self._unacked) > 1:
            _, old = self._unacked.popitem(last=False)
            self._queued_bytes -= len(old)
            self._dropped += 1
            if self._dropped == 1:
                warnings.warn(
                    "vdl-stream: the broker is unreachable and the send queue is full; "
                    "dropping the oldest batches",
                    RuntimeWarning,
                    stacklevel=1,
                )
        self._notify()

    async def wait_acked(self, seq: int) -> None:
        while self._acked < seq and seq in self._unacked:
            await self._changed.wait()

    async def aclose(self) -> None:
        if self._unacked:
            await self.wait_acked(next(reversed(self._unacked)))

    async def _connect_forever(self) -> None:
        delay = 0.05
        while True:
            try:
                async with open_websocket_url(
                    self.url, extra_headers=self._headers, connect_timeout=5
                ) as ws:
                    delay = 0.05
                    self._warned = False
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._receive_acks, ws, nursery.cancel_scope)
                        try:
                            await self._send_loop(ws)
                        except ConnectionClosed:
                            nursery.cancel_scope.cancel()
            except (OSError, HandshakeError, ConnectionClosed) as exc:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"vdl-stream: cannot reach the broker at {self.url} ({exc!s:.200}); "
                        "training continues and batches are re-sent when it is back",
                        RuntimeWarning,
                        stacklevel=1,
                    )
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _send_loop(self, ws) -> None:
        sent = 0
        while True:
            pending = [s for s in self._unacked if s > sent]
            for seq in pending:
                frame = self._unacked.get(seq)
                if frame is not None:
                    await ws.send_message(frame)
                sent = seq
            if not pending:
                await self._changed.wait()

    async def _receive_acks(self, ws, cancel_scope: trio.CancelScope) -> None:
        try:
            while True:
                message = codec.decode_message(await ws.get_message())
                if message.get("type") == "ack":
                    seq = int(message["seq"])
                    self._acked = max(self._acked, seq)
                    for s in [s for s in self._unacked if s <= seq]:
                        self._queued_bytes -= len(self._unacked.pop(s))
                    self._notify()
        except (ConnectionClosed, codec.ProtocolError):
            pass
        finally:
            cancel_scope.cancel()
