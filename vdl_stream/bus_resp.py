"""RESP2, the Redis wire protocol, for the bus's hot path: ``XADD`` and ``XREAD BLOCK``.

coredis (which the bus keeps for leases and everything else) sends each command through a
writer task of its connection and hands each answer back through a reader task: two extra
passes of the broker's scheduler per command on top of the socket's, and on a busy 2-core host
each pass is time a live point waits (docs/performance.md, "Cross-broker latency"). The bus's
read loop owns a :class:`Connection` here: its task writes each XREAD to the socket and reads
the answer itself. Its publish loop writes each round's XADD to another, and an ack task reads
those answers, so that a round never waits for the previous one's answer.

The codec is I/O-free (:func:`encode`, :func:`parse`), tested without sockets; the connection is
a thin trio shell around it. Only what the bus sends is supported: commands of bytes, str and
int arguments; answers of simple strings, errors, integers, bulk strings and arrays (RESP2, the
protocol every Redis since 2.0 speaks by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

#: Bytes asked of the socket at a time: an XREAD answer of many entries arrives in few reads
#: (each incomplete read parses the answer again from its start).
RECEIVE_BYTES = 1 << 20


class ReplyError(Exception):
    """An error answer of Redis (``-ERR ...``), as the message Redis sent."""


class Incomplete(Exception):
    """The buffer ends inside an answer: more bytes are needed."""


def encode(*args: bytes | str | int) -> bytes:
    """One command as RESP: an array of bulk strings.

    Raises:
        TypeError: an argument is not bytes, str or int (named in the message).
    """
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            value = arg
        elif isinstance(arg, str):
            value = arg.encode()
        elif isinstance(arg, int) and not isinstance(arg, bool):
            value = b"%d" % arg
        else:
            raise TypeError(f"a command argument must be bytes, str or int, got {arg!r:.40}")
        parts.append(b"$%d\r\n" % len(value))
        parts.append(value)
        parts.append(b"\r\n")
    return b"".join(parts)


def parse(buffer: bytes, pos: int = 0) -> tuple[Any, int]:
    """The answer that starts at ``buffer[pos]``, and the position after it.

    Bulk and simple strings are bytes, a null is None, an error is a :class:`ReplyError`
    (returned, not raised: one answer of a pipeline may be an error).

    Raises:
        Incomplete: the buffer ends inside the answer.
        ValueError: the bytes are not RESP2.
    """
    end = buffer.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind = buffer[pos : pos + 1]
    if kind == b"$":
        size = int(buffer[pos + 1 : end])
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buffer) < stop + 2:
            raise Incomplete
        return buffer[end + 2 : stop], stop + 2
    if kind == b"*":
        count = int(buffer[pos + 1 : end])
        if count < 0:
            return None, end + 2
        items = []
        pos = end + 2
        for _ in range(count):
            item, pos = parse(buffer, pos)
            items.append(item)
        return items, pos
    if kind == b":":
        return int(buffer[pos + 1 : end]), end + 2
    if kind == b"+":
        return buffer[pos + 1 : end], end + 2
    if kind == b"-":
        return ReplyError(buffer[pos + 1 : end].decode(errors="replace")), end + 2
    raise ValueError(f"not a RESP2 answer: {buffer[pos : pos + 20]!r}")


def entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The stream entries of an ``XRANGE``/``XREVRANGE`` answer (or one stream's of ``XREAD``):
    ``(id, fields)`` in order.

    Raises:
        ValueError: the answer is not a list of entries.
    """
    if not isinstance(reply, list):
        raise ValueError("not a list of stream entries")
    out = []
    for identifier, flat in reply:
        if not isinstance(identifier, bytes) or not isinstance(flat, list):
            raise ValueError("not a stream entry")
        out.append((identifier, dict(zip(flat[::2], flat[1::2], strict=True))))
    return out


def streams(reply: Any) -> dict[bytes, list[tuple[bytes, dict[bytes, bytes]]]]:
    """An ``XREAD`` answer as ``{stream: entries}`` (``{}`` when it timed out: a null).

    Raises:
        ValueError: the answer is not an XREAD answer.
    """
    if reply is None:
        return {}
    if not isinstance(reply, list):
        raise ValueError("not an XREAD answer")
    return {key: entries(items) for key, items in reply}


class Connection:
    """One connection to Redis. Open it with :func:`open_connection`.

    Either one task calls :meth:`call` or :meth:`pipeline` (it writes the commands and reads
    their answers itself), or one task sends with :meth:`send` while another reads the answers,
    in order, with :meth:`receive` (so that a sender never waits for an answer).

    A send or a receive that fails or is cancelled midway leaves the connection unusable (a
    command may be half written, an answer half read): it is closed, and every later call
    raises :class:`ConnectionError`.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._buffer = b""
        self._broken = False

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (lost, or by :meth:`aclose`)."""
        return self._broken

    async def call(self, *args: bytes | str | int) -> Any:
        """Send one command and return its answer.

        Raises:
            ReplyError: Redis answered with an error.
            ConnectionError: the connection was lost (now or by an earlier call).
        """
        (reply,) = await self.pipeline([args])
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[Any]:
        """Send ``commands`` in one write and return their answers in order (an error answer
        as a :class:`ReplyError` in its place).

        Raises:
            ConnectionError: the connection was lost (now or by an earlier call).
        """
        await self.send(commands)
        return await self.receive(len(commands))

    async def send(self, commands: Sequence[Sequence[bytes | str | int]]) -> None:
        """Send ``commands`` in one write; their answers are for :meth:`receive`.

        Raises:
            ConnectionError: the connection was lost (now or by an earlier call).
        """
        data = b"".join(encode(*command) for command in commands)
        if self._broken:
            raise ConnectionError("the Redis connection was lost by an earlier command")
        try:
            await self._stream.send_all(data)
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
                raise ConnectionError(f"the Redis connection was lost: {exc}") from None
            raise

    async def receive(self, count: int) -> list[Any]:
        """The next ``count`` answers, in order (an error answer as a :class:`ReplyError`).

        Raises:
            ConnectionError: the connection was lost (now or by an earlier call).
        """
        if self._broken:
            raise ConnectionError("the Redis connection was lost by an earlier command")
        try:
            replies = []
            pos = 0
            while len(replies) < count:
                try:
                    reply, pos = parse(self._buffer, pos)
                except Incomplete:
                    self._buffer = self._buffer[pos:]
                    pos = 0
                    data = await self._stream.receive_some(RECEIVE_BYTES)
                    if not data:
                        raise ConnectionError("Redis closed the connection") from None
                    self._buffer += data
                    continue
                replies.append(reply)
            self._buffer = self._buffer[pos:]
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
                raise ConnectionError(f"the Redis connection was lost: {exc}") from None
            if isinstance(exc, ValueError):  # not RESP2: nothing more can be read from it
                raise ConnectionError(f"Redis answered out of protocol: {exc}") from None
            raise
        return replies

    async def aclose(self) -> None:
        """Close the connection (later calls raise :class:`ConnectionError`)."""
        self._broken = True
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self._stream)


async def open_connection(url: str) -> Connection:
    """Connect to the Redis of ``url`` (``redis://[user:password@]host[:port][/db]``, or
    ``rediss://`` for TLS), authenticate and select the database as the URL says.

    Raises:
        OSError: Redis cannot be reached.
        ReplyError: it refused the password or the database.
    """
    parts = urlsplit(url)
    stream: trio.abc.Stream = await trio.open_tcp_stream(parts.hostname or "", parts.port or 6379)
    try:
        if parts.scheme == "rediss":
            import ssl  # only for TLS

            stream = trio.SSLStream(
                stream, ssl.create_default_context(), server_hostname=parts.hostname
            )
            await stream.do_handshake()
        connection = Connection(stream)
        if parts.password is not None:
            user = [unquote(parts.username)] if parts.username else []
            await connection.call("AUTH", *user, unquote(parts.password))
        db = parts.path.strip("/")
        if db and int(db):
            await connection.call("SELECT", int(db))
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return connection
