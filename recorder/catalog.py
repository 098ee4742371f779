"""What a run directory holds: its segments, the records in them, and the index that lists them.

A :class:`Catalog` is the shared inner part of :class:`~recorder.RunReader` and
:class:`~recorder.RunWriter` (which uses it once, on reopening a run). It reads segments
incrementally, verifies every frame it scans, and loads the index when one matches the segments, in
which case the indexed records are verified lazily, when their payload is first read.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from recorder import codec, framing
from recorder.records import CorruptionWarning, FormatError, Position

SEGMENT_RE = re.compile(r"^segment-(\d{6,})\.vdlr$")
INDEX_NAME = "index.vdli"
INDEX_VERSION = 1
# Event payloads larger than this are not kept in memory after scanning (read again on demand).
KEEP_EVENT_BYTES = 16 << 10


def segment_name(number: int) -> str:
    """File name of segment ``number``."""
    return f"segment-{number:06d}.vdlr"


def list_segments(run_dir: str) -> list[int]:
    """Numbers of the segment files in ``run_dir``, ascending."""
    numbers = []
    with os.scandir(run_dir) as it:
        for item in it:
            match = SEGMENT_RE.match(item.name)
            if match and item.is_file():
                numbers.append(int(match.group(1)))
    return sorted(numbers)


class Entry:
    """Where one record is and what it summarises (one index row)."""

    __slots__ = (
        "count",
        "data",
        "kind",
        "length",
        "offset",
        "parts",
        "segment",
        "seq",
        "smax",
        "smin",
        "step",
        "tag",
        "vmax",
        "vmin",
        "wall",
    )

    def __init__(
        self,
        segment: int,
        offset: int,
        length: int,
        kind: str,
        tag: str | None,
        step: int | None,
        wall: float,
        count: int,
        smin: int | None,
        smax: int | None,
        vmin: float | None,
        vmax: float | None,
        data: Any = None,
        parts: list | None = None,
    ) -> None:
        self.segment = segment
        self.offset = offset
        self.length = length
        self.kind = kind
        self.tag = tag
        self.step = step
        self.wall = wall
        self.count = count
        self.smin = smin
        self.smax = smax
        self.vmin = vmin
        self.vmax = vmax
        self.data = data
        self.parts = parts  # a group chunk's part columns (codec.group_parts), else None
        self.seq = -1  # its number in write order, set by a reader

    @classmethod
    def from_payload(cls, segment: int, offset: int, length: int, decoded: tuple) -> Entry:
        """Build the entry of a decoded payload ``(kind, tag, step, wall, data)``."""
        kind, tag, step, wall, data = decoded
        if kind == codec.SCALARS:
            parts = None
            if tag is None:
                parts = codec.group_parts(data["tags"], data["c"], codec.decode_scalars(data))
            return cls(
                segment, offset, length, kind, tag, step, wall, data["n"], data["smin"],
                data["smax"], data.get("vmin"), data.get("vmax"), data, parts,
            )  # fmt: skip
        return cls(segment, offset, length, kind, tag, step, wall, 1, step, step, None, None, data)

    def row(self) -> list:
        """The index row of this entry."""
        return [
            self.segment, self.offset, self.length, self.kind, self.tag, self.step, self.wall,
            self.count, self.smin, self.smax, self.vmin, self.vmax,
            None if self.parts is None else [
                c.tolist() if isinstance(c, np.ndarray) else c for c in self.parts
            ],
        ]  # fmt: skip

    @property
    def end(self) -> Position:
        """Position just after this record."""
        return Position(self.segment, self.offset + framing.FRAME_OVERHEAD + self.length)


@dataclass
class SegmentState:
    """Scanning state of one segment file."""

    number: int
    path: str
    fd: int
    created: float | None = None  # None until the header has been read
    scanned: int = 0  # bytes accounted for (valid records or reported damage)
    valid_end: int = 0  # end of the last valid record
    pending: int = 0  # bytes after ``scanned`` not yet decided (torn tail)


class Catalog:
    """The records of one run directory, read incrementally.

    Args:
        run_dir: the run directory (must exist).
        keep_data: keep decoded payloads in memory once read: scalar chunks (until a reader has
            folded them into its arrays) and events up to KEEP_EVENT_BYTES; larger events
            (images, audio) are read again from disk when asked for. A writer reopening a run
            only needs the summaries.
    """

    def __init__(self, run_dir: str, *, keep_data: bool = True) -> None:
        self.run_dir = run_dir
        self.keep_data = keep_data
        self.entries: list[Entry] = []
        self.segments: dict[int, SegmentState] = {}
        self.damaged_records = 0
        self.damaged_bytes = 0
        self.bytes_read = 0
        self.index_used = False

    def close(self) -> None:
        """Close the open segment files."""
        for state in self.segments.values():
            if state.fd >= 0:
                os.close(state.fd)
                state.fd = -1

    @property
    def pending_bytes(self) -> int:
        """Bytes at segment ends not yet forming a complete record."""
        return sum(s.pending for s in self.segments.values())

    def _damage(self, state: SegmentState, offset: int, nbytes: int, why: str) -> None:
        self.damaged_records += 1
        self.damaged_bytes += nbytes
        warnings.warn(
            f"{state.path}: skipped {nbytes} damaged bytes at offset {offset} ({why})",
            CorruptionWarning,
            stacklevel=4,
        )

    def report_damage(self, entry: Entry, why: str) -> None:
        """Count and warn about a record found damaged after its checksum passed."""
        state = self._open_segment(entry.segment)
        self._damage(state, entry.offset, framing.FRAME_OVERHEAD + entry.length, why)

    def _open_segment(self, number: int) -> SegmentState:
        state = self.segments.get(number)
        if state is None:
            path = os.path.join(self.run_dir, segment_name(number))
            state = SegmentState(number, path, os.open(path, os.O_RDONLY))
            self.segments[number] = state
        return state

    def _read_header(self, state: SegmentState, sealed: bool) -> bool:
        """Read the header of ``state`` if not done yet; False while it is still incomplete."""
        if state.created is not None:
            return True
        head = os.pread(state.fd, framing.HEADER_SIZE, 0)
        try:
            if len(head) < framing.HEADER_SIZE and not sealed:
                if head[: len(framing.MAGIC)] != framing.MAGIC[: len(head)]:
                    raise framing.HeaderError("wrong magic number: not a vdl-stream recorder file")
                return False  # the writer is creating it (or crashed doing so)
            _, number, created = framing.decode_header(head)
        except framing.HeaderError as exc:
            raise FormatError(f"{state.path}: {exc}") from None
        if number != state.number:
            raise FormatError(
                f"{state.path}: header says segment {number}, file name says {state.number}"
            )
        state.created = created
        state.scanned = state.valid_end = framing.HEADER_SIZE
        return True

    def update(self, limit: Position | None = None) -> list[Entry]:
        """Scan newly appended bytes (up to ``limit``); return the new entries, in order.

        Raises:
            FormatError: a segment has a wrong magic, a newer version or a damaged header.
        """
        numbers = list_segments(self.run_dir)
        new: list[Entry] = []
        for i, number in enumerate(numbers):
            if limit is not None and number > limit.segment:
                break
            state = self._open_segment(number)
            size = os.fstat(state.fd).st_size
            limited = limit is not None and number == limit.segment
            if limited:
                size = min(size, limit.offset)
            sealed = i + 1 < len(numbers) and not limited
            if not self._read_header(state, sealed):
                state.pending = size
                continue
            if size < state.scanned:
                # A writer reopened the run and cut off a damaged tail this reader had skipped;
                # what it appends next starts at the last valid record.
                state.scanned = min(state.valid_end, size)
            if size <= state.scanned:
                state.pending = 0
                continue
            self._scan(state, size, sealed, new)
        self.entries.extend(new)
        return new

    def _scan(self, state: SegmentState, size: int, sealed: bool, out: list[Entry]) -> None:
        start = state.scanned
        data = os.pread(state.fd, size - start, start)
        self.bytes_read += len(data)
        scan = framing.scan_frames(data, 0, sealed=sealed)
        for offset, nbytes in scan.damaged:
            self._damage(state, start + offset, nbytes, "checksum mismatch")
        for offset, length in scan.frames:
            payload = framing.payload_of(data, offset, length)
            try:
                decoded = codec.decode_payload(payload)
                entry = Entry.from_payload(state.number, start + offset, length, decoded)
            except codec.PayloadError as exc:
                self._damage(state, start + offset, framing.FRAME_OVERHEAD + length, str(exc))
                continue
            if not self._keeps(entry):
                entry.data = None
            out.append(entry)
        state.scanned = start + scan.end
        if scan.frames:
            state.valid_end = start + scan.valid_end
        state.pending = size - state.scanned

    def _keeps(self, entry: Entry) -> bool:
        return self.keep_data and (entry.kind == codec.SCALARS or entry.length <= KEEP_EVENT_BYTES)

    def load(self, entry: Entry, *, keep: bool = True) -> Any:
        """The decoded data of ``entry``, reading and verifying it if needed; None if damaged.

        With ``keep=False`` the data is not kept in memory (a streaming read).
        """
        if entry.data is not None:
            return entry.data
        state = self._open_segment(entry.segment)
        frame = os.pread(state.fd, framing.FRAME_OVERHEAD + entry.length, entry.offset)
        self.bytes_read += len(frame)
        payload = framing.check_frame(frame)
        why = "checksum mismatch"
        if payload is not None:
            try:
                decoded = codec.decode_payload(payload)
            except codec.PayloadError as exc:
                why = str(exc)
            else:
                if decoded[0] == entry.kind and decoded[1] == entry.tag:
                    if keep and self._keeps(entry):
                        entry.data = decoded[4]
                    return decoded[4]
                why = "record does not match the index"
        self._damage(state, entry.offset, len(frame), why)
        return None

    def load_index(self, limit: Position | None = None) -> bool:
        """Adopt the index file if it matches the segments; return whether it was used.

        A missing index is normal (a live run); a damaged or stale one is reported with a warning
        and ignored, and the records are then found by scanning the segments. With ``limit``, only
        the records ending at or before it are adopted.
        """
        path = os.path.join(self.run_dir, INDEX_NAME)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return False
        try:
            segments, rows = _decode_index(blob)
            states = []
            for number, created, size in segments:
                state = self._open_segment(number)
                self._read_header(state, sealed=True)
                if state.created != created or os.fstat(state.fd).st_size < size:
                    raise ValueError(f"segment {number} changed since the index was written")
                states.append((state, size))
            entries = [Entry(*row[:12], None, row[12]) for row in rows]
        except (ValueError, TypeError, FormatError, OSError) as exc:
            warnings.warn(
                f"{path}: ignoring the index ({exc}); rebuilding it from the segments",
                CorruptionWarning,
                stacklevel=3,
            )
            self.close()
            self.segments.clear()
            return False
        if limit is not None:
            entries = [e for e in entries if e.end <= limit]
        for state, size in states:
            if limit is not None and Position(state.number, size) > limit:
                if state.number > limit.segment:
                    continue  # scanned from its header by a later update()
                ends = [e.end.offset for e in entries if e.segment == state.number]
                size = max(ends, default=framing.HEADER_SIZE)
            state.scanned = state.valid_end = size
        self.entries.extend(entries)
        self.index_used = True
        return True


def _decode_index(blob: bytes) -> tuple[list, list]:
    try:
        framing.decode_header(blob[: framing.HEADER_SIZE], magic=framing.INDEX_MAGIC)
    except framing.HeaderError as exc:
        raise ValueError(str(exc)) from None
    payload = framing.check_frame(blob[framing.HEADER_SIZE :])
    if payload is None:
        raise ValueError("checksum mismatch")
    obj = msgpack.unpackb(payload, raw=False)
    if not isinstance(obj, dict) or obj.get("version") != INDEX_VERSION:
        raise ValueError("unknown index layout")
    segments, rows = obj["segments"], obj["rows"]
    if any(len(row) != 13 for row in rows):
        raise ValueError("malformed index row")
    return segments, rows


def encode_index(
    segments: list[tuple[int, float, int]], entries: list[Entry], created: float
) -> bytes:
    """The bytes of an index file listing ``entries`` and covering ``(number, created, size)``."""
    payload = msgpack.packb(
        {
            "version": INDEX_VERSION,
            "segments": [list(s) for s in segments],
            "rows": [e.row() for e in entries],
        },
        use_bin_type=True,
    )
    return framing.encode_header(0, created, magic=framing.INDEX_MAGIC) + framing.encode_frame(
        payload
    )
