"""Transports carry a writer's batches to a broker and report when they are durable.

- :class:`InProcessTransport`: the broker runs in the writer's own background trio loop.
- :class:`WebSocketTransport`: the broker is a ``vdl-stream serve`` reached over ``/ws/ingest``.
  Batches stay queued until acknowledged; after a disconnect the transport reconnects with backoff
  and re-sends them, and the broker drops the ones it already has, so nothing is lost or duplicated.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

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


class Spool:
    """Unacknowledged frames by sequence number: in memory up to a bound, then in a temporary file.

    While a broker is unreachable a writer keeps everything it could not deliver. The first
    ``memory_bytes`` stay in memory; later frames go to an anonymous temporary file (gone when the
    process ends). Past ``disk_bytes`` in all, the oldest frames are dropped, with a warning, so a
    broker that never comes back cannot fill the disk either. Writes are small appends to the
    page cache, so they are made directly rather than from a worker thread.
    """

    def __init__(self, memory_bytes: int = 64 << 20, disk_bytes: int = 4 << 30) -> None:
        self._memory_limit = memory_bytes
        self._disk_limit = disk_bytes
        self._memory: OrderedDict[int, bytes] = OrderedDict()
        self._disk: OrderedDict[int, tuple[int, int]] = OrderedDict()  # seq -> (offset, length)
        self._file: Any = None
        self._end = 0  # end of the spool file
        self._memory_bytes = self._disk_bytes = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._memory) + len(self._disk)

    def __contains__(self, seq: int) -> bool:
        return seq in self._memory or seq in self._disk

    def last(self) -> int | None:
        """Return the newest sequence number held, or None."""
        if self._disk:
            return next(reversed(self._disk))
        return next(reversed(self._memory)) if self._memory else None

    def put(self, seq: int, frame: bytes) -> None:
        """Keep ``frame`` until :meth:`ack` covers ``seq``; seqs must increase."""
        if not self._disk and self._memory_bytes + len(frame) <= self._memory_limit:
            self._memory[seq] = frame
            self._memory_bytes += len(frame)
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="vdl-stream-spool-")  # noqa: SIM115 (closed by close())
        self._file.seek(self._end)
        self._file.write(frame)
        self._disk[seq] = (self._end, len(frame))
        self._end += len(frame)
        self._disk_bytes += len(frame)
        while self._disk_bytes > self._disk_limit and len(self) > 1:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        if self._memory:
            _, frame = self._memory.popitem(last=False)
            self._memory_bytes -= len(frame)
        else:
            _, (_, length) = self._disk.popitem(last=False)
            self._disk_bytes -= length
        self.dropped += 1
        if self.dropped == 1:
            warnings.warn(
                "vdl-stream: the broker has been unreachable for long and the spool is full; "
                "dropping the oldest batches",
                RuntimeWarning,
                stacklevel=1,
            )

    def get(self, seq: int) -> bytes | None:
        """Return the frame of ``seq``, or None if it was acknowledged or dropped."""
        frame = self._memory.get(seq)
        if frame is not None or seq not in self._disk:
            return frame
        offset, length = self._disk[seq]
        self._file.seek(offset)
        return self._file.read(length)

    def after(self, seq: int) -> list[int]:
        """Return the sequence numbers held above ``seq``, in order."""
        return [s for s in (*self._memory, *self._disk) if s > seq]

    def ack(self, seq: int) -> None:
        """Forget every frame up to ``seq``."""
        while self._memory and next(iter(self._memory)) <= seq:
            self._memory_bytes -= len(self._memory.popitem(last=False)[1])
        while self._disk and next(iter(self._disk)) <= seq:
            self._disk_bytes -= self._disk.popitem(last=False)[1][1]
        if not self._disk and self._file is not None:
            self._file.truncate(0)
            self._end = 0

    def close(self) -> None:
        """Release the spool file."""
        if self._file is not None:
            self._file.close()
            self._file = None


class WebSocketTransport:
    """Publishes batches to a remote broker over a WebSocket, re-sending until acknowledged.

    Args:
        url: the server, ``ws://host:port`` (the ``/ws/ingest`` path is added when missing).
        token: sent as ``Authorization: Bearer <token>`` when given.
        spool: where unacknowledged batches wait (memory, then a temporary file).
    """

    def __init__(self, url: str, token: str | None = None, *, spool: Spool | None = None) -> None:
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss://, got {url!r}")
        self.url = url if url.rstrip("/").endswith("/ws/ingest") else url.rstrip("/") + "/ws/ingest"
        self._headers = [("Authorization", f"Bearer {token}")] if token else []
        self._spool = spool or Spool()
        self._acked = 0
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
        try:
            await self._connect_forever()
        finally:
            self._spool.close()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def send(self, batch: Batch) -> None:
        self._spool.put(batch.seq, codec.encode_batch(batch))
        self._notify()

    async def wait_acked(self, seq: int) -> None:
        while self._acked < seq and seq in self._spool:
            await self._changed.wait()

    async def aclose(self) -> None:
        last = self._spool.last()
        if last is not None:
            await self.wait_acked(last)

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
                        f"vdl-stream: cannot reach the broker at {self.url} "
                        f"({type(exc).__name__}: {exc!s:.200}); "
                        "training continues and batches are re-sent when it is back",
                        RuntimeWarning,
                        stacklevel=1,
                    )
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _send_loop(self, ws: WebSocketConnection) -> None:
        sent = self._acked  # after a reconnect, everything unacknowledged goes again
        while True:
            pending = self._spool.after(sent)
            for seq in pending:
                frame = self._spool.get(seq)
                if frame is not None:
                    await ws.send_message(frame)
                sent = seq
            if not pending:
                await self._changed.wait()

    async def _receive_acks(self, ws: WebSocketConnection, cancel_scope: trio.CancelScope) -> None:
        try:
            while True:
                message = codec.decode_message(await ws.get_message())
                if message.get("type") == "ack":
                    seq = int(message["seq"])
                    self._acked = max(self._acked, seq)
                    self._spool.ack(seq)
                    self._notify()
        except (ConnectionClosed, codec.ProtocolError):
            pass
        finally:
            cancel_scope.cancel()
