"""Transports carry a writer's batches to a broker and report when they are durable.

- :class:`InProcessTransport`: the broker runs in the writer's own background trio loop.
- :class:`WebSocketTransport`: the broker is a ``vdl-stream serve`` reached over ``/ws/ingest``.
  Batches stay queued until acknowledged; after a disconnect the transport reconnects with backoff
  and re-sends them, and the broker drops the ones it already has, so nothing is lost or duplicated.
  Given several brokers' URLs (brokers joined by ``--bus``, docs/deploy.md) it *fails over*: when
  the connection drops, or a broker refuses a batch with a retryable reason (the run is leased by
  another broker), it moves on to the next URL and re-sends from the first unacknowledged batch.

The refusal contract (both transports; the writer codes against it):

- The broker may *refuse* a batch instead of acknowledging it (a full disk, too many open files,
  a run held by another process, a run name the file system cannot hold, an event that breaks
  the schema). Nothing of a refused batch is on disk. Each refusal is a
  :class:`~vdl_stream.errors.RefusedError` with a one-line ``reason`` and ``retryable``.
- A *retryable* refusal is re-sent by the transport itself, in order with the writer's later
  batches (the broker refuses those until the refused one comes again), after a backoff that
  doubles from ``RETRY_DELAY`` to ``MAX_RETRY_DELAY``, until the broker accepts it. Meanwhile
  batches wait in a bounded :class:`Spool` (memory, then a temporary file).
- A *non-retryable* refusal ends that batch: it is forgotten, and :meth:`Transport.wait_acked`
  no longer waits for it.
- Every refusal reaches the writer once through :meth:`Transport.take_errors`, which the writer
  polls on each call or flush to report the real reason. The same reason refused again while
  not yet taken is not queued twice, and at most ``MAX_ERRORS`` wait.
- ``send`` never raises a refusal and never waits for the disk: it waits only while the broker's
  ingest queue is full (in process) or not at all (WebSocket).

The in-flight window. A batch is *unacknowledged* from ``send`` until the broker's answer: an
acknowledgement means the batch is written, so a writer that waited for the answer before sending
the next batch would make every point wait for the previous batch's disk write. The writer
(``attach(window=...)``, default :data:`WINDOW`) keeps up to ``window`` batches unacknowledged
instead: it cuts and sends the next batch as soon as :meth:`Transport.unacknowledged` is below the
window, and while it is not, lets calls accumulate into one larger batch, cut as soon as an answer
frees a place (:meth:`Transport.wait_window`). The transports keep every guarantee with several
batches in flight: batches are sent and re-sent in sequence order, an answer settles the batches
up to its seq, a retryable refusal sends the refused batch and every later one again, in order,
and the broker drops re-sent copies it already has by (writer, seq) (``Broker.ingest``), so nothing
acknowledged is lost and nothing lands twice.

What the window counts. With :data:`TAKEN` on (off by default) a place in the window frees when
the broker has *taken* a batch (ingested it: numbered, fanned out to the browsers and queued for its
write), not when it has written it: over a socket the broker says so with a ``taken`` message
(docs/protocol.md; the transport asks for it with ``?taken=1`` on ``/ws/ingest``, and a broker that
does not know it sends none, which leaves the window counting acknowledgements as before); in
process, when ``Broker.ingest`` returned. The acknowledgement keeps its meaning: the spool keeps a
batch until its ``ack`` (written; fsynced for ``sync``), and a reconnect or a failover re-sends
from the first unacknowledged batch, taken or not. So that a slow disk still holds the writer back,
at most :data:`UNACKED_PER_WINDOW` times ``window`` batches stay unacknowledged
(:meth:`Transport.has_room`). Over a socket, once the broker has said ``taken`` on the connection,
at most :data:`TAKEN_IN_FLIGHT` batches are sent and not yet taken: the link carries one batch at a
time, and calls merge while it does, so that no batch waits in the server's receive path behind
another (a window of 2 on ``taken`` made batches wait there as long as the writer saved).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    ConnectionTimeout,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from . import codec, masking
from .codec import Batch
from .errors import RefusedError

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("vdl_stream.transport")

#: First delay before a retryable refusal is re-sent, in seconds; it doubles up to the maximum.
RETRY_DELAY = 0.05
MAX_RETRY_DELAY = 2.0
#: Seconds a connection being left waits for the broker's answer to its close (and, twice
#: that, for the whole close). Left after a refusal (another broker holds the run), the broker
#: may still be refusing hundreds of batches sent before the refusal came: trio-websocket's
#: default (60 s) held a failing-over writer that long at every hop, and its reader, blocked on
#: the answers nobody read, could hold the close for good (bench_bus.py failover). Nothing is
#: lost by not waiting: every unacknowledged batch goes again on the next connection.
DISCONNECT_TIMEOUT = 1.0
#: Refusals waiting for take_errors() at most; older ones are dropped (and counted).
MAX_ERRORS = 100
#: Batches a writer keeps unacknowledged at most by default (its in-flight window; see the module
#: docstring): 2 overlaps one batch's disk write with the next batch's way to the broker.
WINDOW = 2
#: The largest window ``attach(window=...)`` takes: more only makes batches smaller.
MAX_WINDOW = 16
#: Whether the window counts batches not yet *taken* by the broker (ingested and fanned out) rather
#: than not yet acknowledged (written): a point then waits for the broker's ingest, not for the
#: previous batch's write (module docstring). Read at each connection (the ``?taken=1`` asked of
#: ``/ws/ingest``) and at each look at the window. Off: on the 2 shared cores, at load 10-18, the
#: writer's wait halved but batches then waited as long in the server's receive path and the end
#: to end p50 was lower in about half of the alternated pairs only (docs/performance.md, "(2026-12-01,
#: h5-taken)"); the decision wants a quiet machine.
TAKEN = False
#: With :data:`TAKEN`, the batches a writer keeps unacknowledged at most, in windows: a disk slower
#: than the link fills the spool up to this many windows, then holds the writer back.
UNACKED_PER_WINDOW = 4
#: With :data:`TAKEN`, over a socket whose broker says ``taken``: the batches sent and not yet
#: taken at most, whatever the window. With the window's 2 the second waited in the server's
#: receive path behind the first (``encoded -> ingest`` 1.5-2.4 ms against 0.4-0.5 ms with 1;
#: docs/performance.md, "10k events/s: where the p50 goes").
TAKEN_IN_FLIGHT = 1


@dataclass(frozen=True)
class TransportStatistics:
    """A point-in-time view of a transport.

    Attributes:
        queued_batches: batches held (not yet acknowledged or refused for good).
        queued_bytes: bytes those batches take in the spool (memory and file).
        in_flight: batches handed to the broker whose outcome is not known yet.
        reconnects: connections opened after the first (WebSocket only).
        refusals: refusals received.
        retries: batches re-sent after a retryable refusal.
        dropped: batches dropped because the spool was full.
    """

    queued_batches: int
    queued_bytes: int
    in_flight: int
    reconnects: int
    refusals: int
    retries: int
    dropped: int


@dataclass(frozen=True)
class SpoolStatistics:
    """A point-in-time view of a :class:`Spool`.

    Attributes:
        frames: frames held.
        memory_bytes: bytes of the frames held in memory.
        disk_bytes: bytes of the frames in the temporary file (or kept in memory because the
            file could not take them).
        file_errors: writes the temporary file refused (a full disk).
        dropped: frames dropped, oldest first, past the disk bound.
    """

    frames: int
    memory_bytes: int
    disk_bytes: int
    file_errors: int
    dropped: int


class Transport(Protocol):
    """What the writer's background loop needs from a transport (see the module docstring)."""

    url: str | None

    async def send(self, batch: Batch) -> None:
        """Take a batch; it is re-sent as needed until acknowledged or refused for good."""

    async def wait_acked(self, seq: int) -> None:
        """Wait until every batch up to ``seq`` is durable or was refused for good; retryable
        refusals are re-sent meanwhile (bound the wait with a cancel scope)."""

    def unacknowledged(self) -> int:
        """Return how many batches were taken and are not answered yet (never blocks)."""

    def has_room(self, window: int) -> bool:
        """Return whether the writer may cut and send its next batch now (never blocks): fewer
        than ``window`` batches are not yet taken (with :data:`TAKEN`; else not yet
        acknowledged; over a socket whose broker says ``taken``, fewer than
        :data:`TAKEN_IN_FLIGHT`), and fewer than :data:`UNACKED_PER_WINDOW` times ``window``
        are unacknowledged."""

    async def wait_window(self, window: int) -> None:
        """Wait until :meth:`has_room` says so: the writer's cue to cut and send the next batch
        (its in-flight window, see the module docstring)."""

    def take_errors(self) -> list[RefusedError]:
        """Return the refusals received since the last call, each once, oldest first."""

    def take_notices(self) -> list[str]:
        """Return what the broker told the writer since the last call (``notice``, e.g. another
        writer logs one of its series at once), each once, oldest first."""

    def statistics(self) -> TransportStatistics:
        """Return queue depths and counters (see :class:`TransportStatistics`)."""

    async def aclose(self) -> None:
        """Deliver what is queued (bounded by the caller's deadline) and release resources."""


class _Refusals:
    """The refusals a transport has to hand to its writer, each once, bounded."""

    def __init__(self) -> None:
        self._pending: list[RefusedError] = []
        self.count = self.lost = 0

    def add(self, refusal: RefusedError) -> None:
        self.count += 1
        if any(
            r.reason == refusal.reason and r.retryable == refusal.retryable for r in self._pending
        ):
            return  # the same cause again, not taken yet: once is enough
        self._pending.append(refusal)
        if len(self._pending) > MAX_ERRORS:
            self._pending.pop(0)
            self.lost += 1

    def take(self) -> list[RefusedError]:
        taken, self._pending = self._pending, []
        return taken


class _Backoff:
    """When a refused batch may go again: RETRY_DELAY, doubling to MAX_RETRY_DELAY."""

    def __init__(self) -> None:
        self.delay = RETRY_DELAY
        self.at = 0.0

    def refused(self) -> None:
        self.at = trio.current_time() + self.delay
        self.delay = min(self.delay * 2, MAX_RETRY_DELAY)

    def accepted(self) -> None:
        self.delay = RETRY_DELAY


class InProcessTransport:
    """Hands batches straight to a broker running in the same trio loop.

    Batches the broker refused with a retryable reason wait in a :class:`Spool` and go again, in
    order, on the next ``send``/``wait_acked`` after the backoff (see the module docstring).
    """

    def __init__(self, broker: Broker, *, spool: Spool | None = None) -> None:
        self.url: str | None = None
        self._broker = broker
        # writer seq -> (broker seq, batch): accepted, outcome not known yet; in seq order
        self._unconfirmed: OrderedDict[int, tuple[int, Batch]] = OrderedDict()
        self._backlog = spool or Spool()  # refused (retryable) and later batches, encoded
        self._backoff = _Backoff()
        self._refusals = _Refusals()
        self._retries = 0
        self._last = 0
        self._writer: str | None = None  # the id of the writer whose batches these are
        self._confirmed = 0  # the highest broker seq of a batch written

    async def send(self, batch: Batch) -> None:
        self._last = max(self._last, batch.seq)
        self._writer = batch.writer
        self._harvest()
        if len(self._backlog):
            self._backlog.put(batch.seq, codec.encode_batch(batch))
            await self._drain()
            return
        try:
            await self._deliver(batch)
        except BaseException:
            # Cancelled before the broker took it (the broker undoes a half-taken batch): keep
            # it, so that it goes with the next delivery instead of being lost.
            if batch.seq not in self._unconfirmed and batch.seq not in self._backlog:
                self._backlog.put(batch.seq, codec.encode_batch(batch))
            raise

    async def _deliver(self, batch: Batch) -> bool:
        """Hand one batch to the broker; return False if it was refused at once."""
        try:
            broker_seq = await self._broker.ingest(batch)
        except RefusedError as refusal:
            self._refused(batch.seq, batch, refusal)
            return False
        self._unconfirmed[batch.seq] = (broker_seq, batch)
        self._backlog.discard(batch.seq)
        return True

    async def _drain(self) -> None:
        """Re-send the backlog in order once its backoff has passed (never sleeps).

        A batch leaves the backlog only once the broker took it, so a cancelled drain loses
        nothing."""
        while len(self._backlog) and trio.current_time() >= self._backoff.at:
            seq = self._backlog.first()
            frame = self._backlog.get(seq)
            if frame is None:
                self._backlog.discard(seq)
                continue
            batch = codec.decode_batch(codec.decode_message(frame))
            self._retries += 1
            if not await self._deliver(batch):
                return
        if not len(self._backlog):
            self._backoff.accepted()

    def _harvest(self) -> None:
        """Settle the accepted batches the broker has written or refused since (never blocks)."""
        while self._unconfirmed:
            seq, (broker_seq, batch) = next(iter(self._unconfirmed.items()))
            if not self._broker.written(broker_seq):
                return
            del self._unconfirmed[seq]
            refusal = self._broker.refusal(broker_seq)
            if refusal is not None:
                self._refused(seq, batch, refusal)
            else:
                self._confirmed = max(self._confirmed, broker_seq)

    def _refused(self, seq: int, batch: Batch, refusal: RefusedError) -> None:
        self._refusals.add(refusal)
        if not refusal.retryable:
            return  # that batch ends here
        # This batch and every later one go again, in order: the broker refuses the later ones
        # until this one is back.
        later = [s for s in self._unconfirmed if s > seq]
        held = {s: codec.encode_batch(self._unconfirmed.pop(s)[1]) for s in later}
        held[seq] = codec.encode_batch(batch)
        # The whole backlog stays, earlier batches too: a batch sent while another task harvested
        # an older refusal (``send`` awaits the broker's ingest) is refused after that older one
        # went back to the backlog, which must still go first (test_window.py, the flipper).
        old = self._backlog
        for s in old.after(0):
            frame = old.get(s)
            if frame is not None:
                held.setdefault(s, frame)
        self._backlog = Spool(old.memory_limit, old.disk_limit)
        self._backlog.dropped = old.dropped
        old.close()
        for s in sorted(held):
            self._backlog.put(s, held[s])
        self._backoff.refused()

    async def wait_acked(self, seq: int) -> None:
        while True:
            self._harvest()
            await self._drain()
            pending = [b for s, (b, _) in self._unconfirmed.items() if s <= seq]
            if pending:
                await self._broker.wait_persisted(max(pending))  # settled by _harvest next
                continue
            if self._backlog_holds(seq):
                await trio.sleep_until(self._backoff.at)
                continue
            await self._broker.wait_persisted(self._confirmed, durable=True)
            return

    def unacknowledged(self) -> int:
        """Batches taken whose write is not known yet, and refused ones waiting to go again."""
        self._harvest()
        return len(self._unconfirmed) + len(self._backlog)

    def has_room(self, window: int) -> bool:
        """Whether the next batch may go (see :meth:`Transport.has_room`). In process a batch
        is taken once ``Broker.ingest`` returned: with :data:`TAKEN` only the refused batches
        waiting to go again are not taken, and the written ones free the rest of the bound."""
        unacknowledged = self.unacknowledged()
        if not TAKEN:
            return unacknowledged < window
        return len(self._backlog) < window and unacknowledged < UNACKED_PER_WINDOW * window

    async def wait_window(self, window: int) -> None:
        """Return once :meth:`has_room`: the oldest batch's write frees a place. Refused
        batches waiting for their backoff count too; once it has passed this returns, so that
        the next batch takes them along (``send`` re-sends them first)."""
        while not self.has_room(window):
            if self._unconfirmed:
                # Broker seqs grow in the order the batches were taken: the first is the oldest.
                await self._broker.wait_persisted(next(iter(self._unconfirmed.values()))[0])
            else:
                await trio.sleep_until(self._backoff.at)
                return

    def _backlog_holds(self, seq: int) -> bool:
        first = self._backlog.first()
        return first is not None and first <= seq

    def take_errors(self) -> list[RefusedError]:
        return self._refusals.take()

    def take_notices(self) -> list[str]:
        return [] if self._writer is None else self._broker.take_notices(self._writer)

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(
            queued_batches=len(self._unconfirmed) + len(self._backlog),
            queued_bytes=self._backlog.nbytes,
            in_flight=len(self._unconfirmed),
            reconnects=0,
            refusals=self._refusals.count,
            retries=self._retries,
            dropped=self._backlog.dropped,
        )

    async def aclose(self) -> None:
        try:
            if self._last:
                await self.wait_acked(self._last)
        finally:
            self._broker.close()
            self._backlog.close()
            await self._broker.wait_closed()


class Spool:
    """Unacknowledged frames by sequence number: in memory up to a bound, then in a temporary file.

    While a broker is unreachable a writer keeps everything it could not deliver. The first
    ``memory_bytes`` stay in memory; later frames go to an anonymous temporary file (gone when the
    process ends). Past ``disk_bytes`` in all, the oldest frames are dropped, with a warning, so a
    broker that never comes back cannot fill the disk either. Writes are small appends to the
    page cache, so they are made directly rather than from a worker thread. A frame the file
    cannot take (its disk is full) stays in memory, in order, counted against ``disk_bytes``.
    """

    def __init__(self, memory_bytes: int = 64 << 20, disk_bytes: int = 4 << 30) -> None:
        self.memory_limit = memory_bytes
        self.disk_limit = disk_bytes
        self._memory: OrderedDict[int, bytes] = OrderedDict()
        # seq -> (offset, length) in the file, or the frame itself when the file could not take
        # it (a full disk): kept in memory then, in order, rather than lost
        self._disk: OrderedDict[int, tuple[int, int] | bytes] = OrderedDict()
        self.file_errors = 0
        self._file: Any = None
        self._end = 0  # end of the spool file
        self._memory_bytes = self._disk_bytes = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._memory) + len(self._disk)

    def __contains__(self, seq: int) -> bool:
        return seq in self._memory or seq in self._disk

    @property
    def nbytes(self) -> int:
        """Bytes held, in memory and in the file."""
        return self._memory_bytes + self._disk_bytes

    def statistics(self) -> SpoolStatistics:
        """Return what is held and what was lost (see :class:`SpoolStatistics`)."""
        return SpoolStatistics(
            frames=len(self),
            memory_bytes=self._memory_bytes,
            disk_bytes=self._disk_bytes,
            file_errors=self.file_errors,
            dropped=self.dropped,
        )

    def first(self) -> int | None:
        """Return the oldest sequence number held, or None."""
        if self._memory:
            return next(iter(self._memory))
        return next(iter(self._disk)) if self._disk else None

    def discard(self, seq: int) -> None:
        """Forget the frame of ``seq`` alone (a batch refused for good, or taken for re-sending)."""
        frame = self._memory.pop(seq, None)
        if frame is not None:
            self._memory_bytes -= len(frame)
        elif seq in self._disk:
            self._disk_bytes -= _length(self._disk.pop(seq))
        if not self._disk and self._file is not None:
            self._file.truncate(0)
            self._end = 0

    def last(self) -> int | None:
        """Return the newest sequence number held, or None."""
        if self._disk:
            return next(reversed(self._disk))
        return next(reversed(self._memory)) if self._memory else None

    def put(self, seq: int, frame: bytes) -> None:
        """Keep ``frame`` until :meth:`ack` covers ``seq``; seqs must increase."""
        if not self._disk and self._memory_bytes + len(frame) <= self.memory_limit:
            self._memory[seq] = frame
            self._memory_bytes += len(frame)
            return
        try:
            if self._file is None:
                # unbuffered, written with pwrite: a failed write leaves no buffer behind
                self._file = tempfile.TemporaryFile(prefix="vdl-stream-spool-", buffering=0)  # noqa: SIM115 (closed by close())
            view = memoryview(frame)
            offset = self._end
            while view:
                written = os.pwrite(self._file.fileno(), view, offset)
                view, offset = view[written:], offset + written
        except OSError as exc:
            self.file_errors += 1
            if self.file_errors == 1:
                warnings.warn(
                    f"vdl-stream: cannot write the spool file ({exc.strerror or exc}); keeping "
                    "unacknowledged batches in memory",
                    RuntimeWarning,
                    stacklevel=1,
                )
            self._disk[seq] = frame
        else:
            self._disk[seq] = (self._end, len(frame))
            self._end += len(frame)
        self._disk_bytes += len(frame)
        while self._disk_bytes > self.disk_limit and len(self) > 1:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        if self._memory:
            _, frame = self._memory.popitem(last=False)
            self._memory_bytes -= len(frame)
        else:
            self._disk_bytes -= _length(self._disk.popitem(last=False)[1])
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
        place = self._disk[seq]
        if isinstance(place, bytes):
            return place
        offset, length = place
        return os.pread(self._file.fileno(), length, offset)

    def after(self, seq: int) -> list[int]:
        """Return the sequence numbers held above ``seq``, in order."""
        return [s for s in (*self._memory, *self._disk) if s > seq]

    def ack(self, seq: int) -> None:
        """Forget every frame up to ``seq``."""
        while self._memory and next(iter(self._memory)) <= seq:
            self._memory_bytes -= len(self._memory.popitem(last=False)[1])
        while self._disk and next(iter(self._disk)) <= seq:
            self._disk_bytes -= _length(self._disk.popitem(last=False)[1])
        if not self._disk and self._file is not None:
            self._file.truncate(0)
            self._end = 0

    def close(self) -> None:
        """Release the spool file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _length(place: tuple[int, int] | bytes) -> int:
    return len(place) if isinstance(place, bytes) else place[1]


def _ingest_urls(url: str | Sequence[str]) -> list[str]:
    """Check one URL or a list of them; return each with the ``/ws/ingest`` path."""
    urls = [url] if isinstance(url, str) else list(url) if isinstance(url, Sequence) else None
    if not urls:
        raise ValueError(f"url must be a ws:// URL or a non-empty list of them, got {url!r:.80}")
    checked = []
    for one in urls:
        if not isinstance(one, str) or not one.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss://, got {one!r:.80}")
        checked.append(
            one if one.rstrip("/").endswith("/ws/ingest") else one.rstrip("/") + "/ws/ingest"
        )
    return checked


def _ask_taken(url: str) -> str:
    """``url`` asking the broker for ``taken`` messages (``?taken=1``; one it does not know is
    ignored by it)."""
    return url + ("&" if "?" in url else "?") + "taken=1"


def describe_connect_error(exc: BaseException) -> str:
    """Say in a few words why connecting to a broker failed (trio-websocket's errors often have
    an empty message)."""
    if isinstance(exc, ConnectionRejected):
        body = (exc.body or b"").decode("utf-8", "replace").strip()[:120]
        hint = {401: "missing or wrong token", 403: "origin or host refused", 404: "no such path"}
        detail = body or hint.get(exc.status_code, "")
        return f"the server refused the WebSocket with HTTP {exc.status_code}" + (
            f" ({detail})" if detail else ""
        )
    if isinstance(exc, ConnectionTimeout):
        return "no answer to the WebSocket handshake in time"
    if isinstance(exc, HandshakeError):
        cause = exc.__cause__ or exc.__context__
        if cause is not None:  # trio-websocket wraps the socket's error without a message
            return describe_connect_error(cause)
        return "the WebSocket handshake failed"
    if isinstance(exc, ConnectionClosed):
        reason = exc.reason
        text = f": {reason.reason}" if reason.reason else ""
        return f"the connection was closed (code {reason.code}{text})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is vdl-stream serve running there?)"
    attempts = exc.__cause__
    if isinstance(attempts, BaseExceptionGroup) and attempts.exceptions:
        # trio's "all attempts to connect to H:P failed": the reasons are in the group
        return describe_connect_error(attempts.exceptions[0])
    if isinstance(exc, OSError):
        detail = exc.strerror or str(exc) or type(exc).__name__
        return f"cannot connect: {detail}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class WebSocketTransport:
    """Publishes batches to a remote broker over a WebSocket, re-sending until acknowledged.

    Every batch gets one answer from the broker, ``ack`` or ``refused`` (docs/protocol.md);
    refusals follow the module's contract: retryable ones go again after a backoff, in order with
    the later batches; the others are forgotten; all reach :meth:`take_errors`.

    Args:
        url: the server, ``ws://host:port`` (the ``/ws/ingest`` path is added when missing), or a
            list of them: brokers joined by ``--bus``, tried in order. The transport moves to the
            next one when the connection fails or drops, or when a broker refuses a batch with a
            retryable reason (after the refusal backoff); it never goes back on its own to the
            first. The broker that takes the run over continues it from the shared log, and its
            dedup by (writer, seq) makes the re-sent batches land exactly once.
        token: sent as ``Authorization: Bearer <token>`` when given.
        spool: where unacknowledged batches wait (memory, then a temporary file).

    Raises:
        ValueError: ``url`` is empty, or one of its URLs does not start with ws:// or wss://.
    """

    def __init__(
        self, url: str | Sequence[str], token: str | None = None, *, spool: Spool | None = None
    ) -> None:
        self.urls = _ingest_urls(url)
        self._current = 0
        self.url = self.urls[0]
        self._headers = [("Authorization", f"Bearer {token}")] if token else []
        self._spool = spool or Spool()
        self._acked = 0
        # The highest seq the broker said it took (``taken``) on this connection: the window
        # counts the batches above it and above the acknowledged ones.
        self._taken = 0
        # Whether the broker of the current connection sends ``taken`` (it said so once): then
        # the link carries TAKEN_IN_FLIGHT batches at a time.
        self._says_taken = False
        self._sent = 0  # the highest seq sent on the current connection
        self._changed = trio.Event()
        self._warned = False
        self._refusals = _Refusals()
        self._notices: list[str] = []  # the broker's notices not taken yet, at most MAX_ERRORS
        self._backoff = _Backoff()
        self._resend_from: int | None = None  # a retryable refusal: send again from this seq
        self._connections = self._retries = 0
        self._move = False  # a retryable refusal with other brokers to try: move to the next
        self.failovers = 0  # moves from one broker's URL to another's

    @classmethod
    async def run(
        cls,
        url: str | Sequence[str],
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
        while True:
            first = self._spool.first()
            if first is None or first > seq or self._acked >= seq:
                return
            await self._changed.wait()

    def unacknowledged(self) -> int:
        """Batches taken and not answered yet: sent, waiting to be sent, or to be re-sent."""
        return len(self._spool)

    def has_room(self, window: int) -> bool:
        """Whether the next batch may go (see :meth:`Transport.has_room`). Once the broker has
        said ``taken`` on this connection, fewer than :data:`TAKEN_IN_FLIGHT` batches may be
        neither taken nor acknowledged (and fewer than :data:`UNACKED_PER_WINDOW` times
        ``window`` unacknowledged). A broker that sends no ``taken`` (an older one, or
        :data:`TAKEN` off) leaves acknowledgements alone to free places in ``window``."""
        held = len(self._spool)
        if not self._says_taken:
            return held < window
        if held >= UNACKED_PER_WINDOW * window:
            return False
        return len(self._spool.after(max(self._taken, self._acked))) < TAKEN_IN_FLIGHT

    async def wait_window(self, window: int) -> None:
        """Return once :meth:`has_room` (an answer came). While the broker cannot be reached
        nothing is answered: the writer batches meanwhile."""
        while not self.has_room(window):
            await self._changed.wait()

    def take_errors(self) -> list[RefusedError]:
        return self._refusals.take()

    def take_notices(self) -> list[str]:
        taken, self._notices = self._notices, []
        return taken

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(
            queued_batches=len(self._spool),
            queued_bytes=self._spool.nbytes,
            in_flight=len([s for s in self._spool.after(self._acked) if s <= self._sent]),
            reconnects=max(0, self._connections - 1),
            refusals=self._refusals.count,
            retries=self._retries,
            dropped=self._spool.dropped,
        )

    async def aclose(self) -> None:
        last = self._spool.last()
        if last is not None:
            await self.wait_acked(last)

    async def _connect_forever(self) -> None:
        delay = 0.05
        tried = 0  # URLs tried since the last connection that worked
        while True:
            self._move = False
            try:
                # Leaving a connection is bounded: trio-websocket's reader, handing the broker's
                # last answers to a message queue nobody reads any more, can keep its close from
                # ever ending (a writer failing over then stood still for good).
                with trio.CancelScope() as leaving:
                    async with open_websocket_url(
                        _ask_taken(self.url) if TAKEN else self.url,
                        extra_headers=self._headers,
                        connect_timeout=5,
                        disconnect_timeout=DISCONNECT_TIMEOUT,
                    ) as ws:
                        # Its frames masked with numpy, not wsproto's pure Python (this
                        # connection's only: the training process's other wsproto users keep
                        # wsproto's own code).
                        masking.mask_connection(ws)
                        delay = 0.05
                        tried = 0
                        self._warned = False
                        self._connections += 1
                        try:
                            async with trio.open_nursery() as nursery:
                                nursery.start_soon(self._receive_answers, ws, nursery.cancel_scope)
                                try:
                                    await self._send_loop(ws)
                                except ConnectionClosed:
                                    nursery.cancel_scope.cancel()
                        finally:
                            leaving.deadline = trio.current_time() + 2 * DISCONNECT_TIMEOUT
            except (OSError, HandshakeError, ConnectionClosed) as exc:
                if not self._warned and tried + 1 >= len(self.urls):
                    self._warned = True
                    where = self.url if len(self.urls) == 1 else f"any of {', '.join(self.urls)}"
                    warnings.warn(
                        f"vdl-stream: cannot reach the broker at {where} "
                        f"({describe_connect_error(exc):.200}); "
                        "training continues and batches are re-sent when it is back",
                        RuntimeWarning,
                        stacklevel=1,
                    )
            if len(self.urls) > 1:
                # Fail over: the next broker at once (the refusal's backoff, if one refused),
                # and the growing delay only once every broker was tried.
                self._current = (self._current + 1) % len(self.urls)
                self.url = self.urls[self._current]
                self.failovers += 1
                tried += 1
                if self._move:
                    await trio.sleep_until(self._backoff.at)
                    continue
                if tried < len(self.urls):
                    await trio.sleep(0.05)
                    continue
                tried = 0
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _send_loop(self, ws: WebSocketConnection) -> None:
        self._sent = self._acked  # after a reconnect, everything unacknowledged goes again
        self._taken = self._acked  # and none of it counts as taken until this broker says so
        self._says_taken = False  # nor is this broker known to say it
        self._resend_from = None
        while True:
            if self._resend_from is not None:
                await trio.sleep_until(self._backoff.at)
                if self._resend_from is not None:
                    again = self._spool.after(self._resend_from - 1)
                    self._retries += len([s for s in again if s <= self._sent])
                    self._sent = min(self._sent, self._resend_from - 1)
                    self._resend_from = None
            pending = self._spool.after(self._sent)
            for seq in pending:
                if self._resend_from is not None:
                    break  # a refusal came in meanwhile: back off first
                frame = self._spool.get(seq)
                if frame is not None:
                    await ws.send_message(frame)
                self._sent = max(self._sent, seq)
            if not pending and self._resend_from is None:
                await self._changed.wait()

    async def _receive_answers(
        self, ws: WebSocketConnection, cancel_scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                message = codec.decode_message(await ws.get_message())
                kind = message.get("type")
                if kind == "ack":
                    seq = int(message["seq"])
                    self._acked = max(self._acked, seq)
                    self._spool.ack(seq)
                    self._backoff.accepted()
                    self._notify()
                elif kind == "taken":
                    seq = int(message["seq"])
                    self._says_taken = True
                    # Not past a retryable refusal still to be re-sent: those go again first.
                    if seq > self._taken and (self._resend_from is None or seq < self._resend_from):
                        self._taken = seq
                        self._notify()
                elif kind == "refused":
                    self._on_refused(message)
                    if self._move:
                        return  # the finally closes this connection; the next URL follows
                elif kind == "notice" and len(self._notices) < MAX_ERRORS:
                    self._notices.append(str(message.get("message") or "")[:400])
        except (ConnectionClosed, codec.ProtocolError, KeyError, TypeError, ValueError):
            pass
        finally:
            # What that broker took but did not acknowledge goes again: not taken any more.
            self._taken = self._acked
            self._says_taken = False  # until the next broker says so, acknowledgements count
            cancel_scope.cancel()

    def _on_refused(self, message: dict[str, Any]) -> None:
        seq = int(message["seq"])
        reason = str(message.get("reason") or "refused by the broker")[:300]
        refusal = RefusedError(reason, retryable=bool(message.get("retryable")))
        self._refusals.add(refusal)
        if seq not in self._spool:
            return  # an answer to a copy we no longer hold
        if not refusal.retryable:
            self._spool.discard(seq)
        elif self._resend_from is None or seq < self._resend_from:
            if self._resend_from is None:
                self._backoff.refused()
            self._resend_from = seq
            # Taken and then refused (a write that failed): it and the later ones go again,
            # and count against the window until taken again.
            self._taken = min(self._taken, seq - 1)
            # Another broker may hold the run (its lease), or have room: go there.
            self._move = len(self.urls) > 1
        self._notify()
