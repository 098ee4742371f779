"""Segment headers and record framing, as plain functions over bytes; and the few writes and reads
of whole files that the run's files share (``write_all``, ``write_atomically``, ``read_small``).

The byte layout is documented in docs/record-format.md. A frame is::

    length u32 LE | crc32(length bytes) u32 LE | payload (length bytes) | crc32(payload) u32 LE

Scanning distinguishes three states of the bytes after the last good frame: a *torn tail* (an
incomplete frame, the normal state of a file being written, left pending), *damage* (a frame whose
checksum fails, or garbage, followed by a valid frame: skipped and reported), and *undecided*
damage with no valid frame after it yet (left pending like a torn tail, unless the segment is
sealed).
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"\x89VDLREC\n"
INDEX_MAGIC = b"\x89VDLIDX\n"
FORMAT_VERSION = 1
HEADER_SIZE = 32
FRAME_OVERHEAD = 12
MAX_PAYLOAD = 1 << 30
# Every payload is a msgpack array of 5 elements, so it starts with this byte; resynchronisation
# after damage only tries offsets where it appears.
PAYLOAD_MARKER = 0x95

_HEADER = struct.Struct("<8sIIdI")  # magic, version, segment number, creation time, reserved
_U32 = struct.Struct("<I")
_FRAME_HEAD = struct.Struct("<II")


class HeaderError(ValueError):
    """A segment header is not valid; ``reason`` says why (the caller adds the path)."""


def encode_header(segment: int, created: float, magic: bytes = MAGIC) -> bytes:
    """Return the 32-byte header of segment number ``segment`` created at Unix time ``created``."""
    head = _HEADER.pack(magic, FORMAT_VERSION, segment, created, 0)
    return head + _U32.pack(zlib.crc32(head))


def decode_header(data: bytes, magic: bytes = MAGIC) -> tuple[int, int, float]:
    """Parse a header; return ``(version, segment, created)``.

    Raises:
        HeaderError: wrong magic, a newer version, or a checksum mismatch. ``data`` shorter than a
            header raises only when the bytes present already differ from the magic.
    """
    if data[: len(magic)] != magic[: len(data)]:
        raise HeaderError("wrong magic number: not a vdl-stream recorder file")
    if len(data) < HEADER_SIZE:
        raise HeaderError(f"header is truncated ({len(data)} of {HEADER_SIZE} bytes)")
    _, version, segment, created, _ = _HEADER.unpack_from(data)
    if version > FORMAT_VERSION:
        raise HeaderError(
            f"format version {version} is newer than this recorder reads (up to {FORMAT_VERSION})"
        )
    (crc,) = _U32.unpack_from(data, HEADER_SIZE - 4)
    if crc != zlib.crc32(data[: HEADER_SIZE - 4]):
        raise HeaderError("header checksum mismatch")
    return version, segment, created


def encode_frame(payload: bytes) -> bytes:
    """Frame one payload: length, checksum of length, payload, checksum of payload."""
    head, tail = frame_parts(payload)
    return b"".join((head, payload, tail))


def frame_parts(payload: bytes) -> tuple[bytes, bytes]:
    """The 8 bytes that go before ``payload`` in its frame and the 4 after it, so that a writer
    can hand the three to ``pwritev`` without joining them into a copy of the payload."""
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ValueError(f"record payload is {n} bytes, more than the limit of {MAX_PAYLOAD}")
    length = _U32.pack(n)
    return length + _U32.pack(zlib.crc32(length)), _U32.pack(zlib.crc32(payload))


@dataclass
class Scan:
    """Result of :func:`scan_frames`.

    Attributes:
        frames: ``(frame offset, payload length)`` of every valid frame, in order.
        damaged: ``(offset, byte count)`` of every damaged region skipped.
        end: offset up to which the bytes are accounted for; bytes from here on are pending.
        valid_end: end of the last valid frame (or the start offset if none): where a writer
            reopening the file truncates to.
    """

    frames: list[tuple[int, int]] = field(default_factory=list)
    damaged: list[tuple[int, int]] = field(default_factory=list)
    end: int = 0
    valid_end: int = 0


def _frame_at(buf: memoryview, pos: int, n: int) -> tuple[str, int]:
    """Classify the frame at ``pos``: ("ok" | "short" | "bad_head" | "bad_payload", payload length)."""
    if n - pos < 8:
        return "short", 0
    length, length_crc = _FRAME_HEAD.unpack_from(buf, pos)
    if length > MAX_PAYLOAD or zlib.crc32(buf[pos : pos + 4]) != length_crc:
        return "bad_head", 0
    end = pos + 8 + length + 4
    if end > n:
        return "short", length
    (payload_crc,) = _U32.unpack_from(buf, end - 4)
    if zlib.crc32(buf[pos + 8 : end - 4]) != payload_crc:
        return "bad_payload", length
    return "ok", length


def _next_frame(buf: memoryview, start: int, n: int) -> int | None:
    """Offset of the first valid frame at or after ``start``, or None when there is none yet.

    Returns None as well when a plausible frame is cut off by the end of the buffer: more bytes may
    make it valid, so the damage cannot be measured yet.
    """
    if n - start < FRAME_OVERHEAD:
        return None
    tail = np.frombuffer(buf, dtype=np.uint8, count=n - start - 8, offset=start + 8)
    for rel in np.flatnonzero(tail == PAYLOAD_MARKER):
        pos = start + int(rel)
        state, _ = _frame_at(buf, pos, n)
        if state == "ok":
            return pos
        if state == "short":
            return None
    return None


def scan_frames(data: bytes | memoryview, start: int = 0, *, sealed: bool = False) -> Scan:
    """Walk the frames of ``data`` from offset ``start``.

    Args:
        data: the bytes of a segment (or a prefix of it).
        start: offset of the first frame.
        sealed: True when no more bytes will ever be appended (a later segment exists): trailing
            bytes that do not form a valid frame are then reported as damage instead of pending.

    Returns:
        A :class:`Scan`.
    """
    buf = memoryview(data).cast("B")
    n = len(buf)
    scan = Scan(end=start, valid_end=start)
    pos = start
    while pos < n:
        state, length = _frame_at(buf, pos, n)
        if state == "ok":
            scan.frames.append((pos, length))
            pos += FRAME_OVERHEAD + length
            scan.valid_end = pos
        elif state == "bad_payload":
            scan.damaged.append((pos, FRAME_OVERHEAD + length))
            pos += FRAME_OVERHEAD + length
        elif state == "bad_head":
            nxt = _next_frame(buf, pos + 1, n)
            if nxt is None:
                break
            scan.damaged.append((pos, nxt - pos))
            pos = nxt
        else:  # short: a torn tail
            break
    if sealed and pos < n:
        scan.damaged.append((pos, n - pos))
        pos = n
    elif not sealed and pos > scan.valid_end:
        # Damaged frames with no valid frame after them may be a write that a crash tore (or that
        # a writer is about to truncate on reopen): keep them pending, like a torn tail.
        scan.damaged = [d for d in scan.damaged if d[0] < scan.valid_end]
        pos = scan.valid_end
    scan.end = pos
    return scan


def payload_of(data: bytes | memoryview, offset: int, length: int) -> memoryview:
    """The payload bytes of the frame at ``offset`` with payload ``length`` (no checks)."""
    return memoryview(data)[offset + 8 : offset + 8 + length]


def check_frame(frame: bytes | memoryview) -> memoryview | None:
    """Verify one complete frame (as read back from disk); return its payload, or None if damaged."""
    buf = memoryview(frame).cast("B")
    state, length = _frame_at(buf, 0, len(buf))
    if state != "ok" or FRAME_OVERHEAD + length != len(buf):
        return None
    return buf[8 : 8 + length]


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the blocking descriptor ``fd`` (``os.write`` may take a part)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomically(path: str, data: bytes, durable: bool) -> None:
    """Replace ``path`` by a file holding ``data``: written to ``path + ".tmp"`` (fsynced first
    with ``durable``), then renamed over it, so a reader finds the old file or the new one whole;
    on a failure (a full disk) the temporary file is removed and the error raised.
    The directory itself is not fsynced (the caller does, where the rename must survive power
    loss)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # A full disk (or any failure) leaves no half-written temporary file behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_small(path: str, max_bytes: int) -> bytes | None:
    """The bytes of the regular file ``path``; None when it is missing, is not a regular file (a
    FIFO must not block the reader: opened without blocking) or is larger than ``max_bytes``.

    Raises:
        OSError: it exists but cannot be read (or its directory cannot).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        return os.pread(fd, st.st_size, 0)
    finally:
        os.close(fd)
