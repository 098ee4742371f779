"""Block files: compacted runs of segments (the byte layout is in docs/record-format.md).

A writer that flushes every 20 ms leaves thousands of tiny records. Compaction rewrites the
records of sealed segments ``a..b`` into one *block* file ``block-AAAAAA-BBBBBB.vdlb``: each tag's
points as large columnar chunks (a new chunk only at a restart or past ``CHUNK_POINTS``), events
byte for byte in per-(kind, tag) batches, and an index of them all (with per-chunk summaries) at the
end of the file. Every piece of data remembers its *origin*, the position just after the record it
came from in the segments, so that positions (reader limits, followers) keep their meaning after
the segments are gone.

This module is I/O-light: :class:`BlockBuilder` streams a block into a file descriptor, and the
decoding functions work on bytes. Scheduling and the crash-safe swap are the writer's job.
"""

from __future__ import annotations

import itertools
import os
import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack
import numpy as np

from recorder import codec, framing
from recorder.records import Position, ScalarSeries

BLOCK_MAGIC = b"\x89VDLBLK\n"
BLOCK_VERSION = 2
# The footer's own version: 3 adds a level-of-detail summary after each scalar chunk (the header
# stays at 2: a version 2 reader reads such a file, skipping the summaries it does not know).
FOOTER_VERSION = 3
BLOCK_RE = re.compile(r"^block-(\d{6,})-(\d{6,})\.vdlb$")
TRAILER_MAGIC = b"VDLBEND\n"
_TRAILER = struct.Struct("<QII8s")  # footer offset, footer frame size, crc32 of the 12 bytes, magic
TRAILER_SIZE = _TRAILER.size
EVENTS = "events"
INGEST = "ingest"
# Points per compacted chunk, at most (the writer's chunk size).
CHUNK_POINTS = 1 << 16
# Points per slice of a chunk's level-of-detail summary (the summary keeps each slice's first
# minimum and first maximum; a downsampled read decodes only the slices cut by a bucket edge).
# None writes blocks without summaries (footer version 2, as before them).
LOD_SLICE: int | None = 256
# Events per batch record, at most, and payload bytes per batch (a batch is read whole).
BATCH_EVENTS = 4096
BATCH_BYTES = 4 << 20

CHUNK_COLUMNS = (
    "offset", "length", "tag", "count", "first_step", "first_wall", "last_step", "last_wall",
    "smin", "smax", "vmin", "vmax", "vmin_step", "vmax_step", "finite", "o_first", "o_last",
)  # fmt: skip
# Footer version 3: where each chunk's summary frame is (None: the chunk has none), and where
# each event batch's index frame is.
LOD_COLUMNS = ("lod_offset", "lod_length")
INDEX_COLUMNS = ("idx_offset", "idx_length")
EVENT_COLUMNS = (
    "offset", "length", "kind", "tag", "count", "first_step", "first_wall", "smin", "smax",
    "o_first", "o_last",
)  # fmt: skip


def block_name(first: int, last: int) -> str:
    """File name of the block covering segments ``first..last``."""
    return f"block-{first:06d}-{last:06d}.vdlb"


def parse_block_name(name: str) -> tuple[int, int] | None:
    """``(first, last)`` segment of a block file name, or None for any other name."""
    match = BLOCK_RE.match(name)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2))


class BlockError(ValueError):
    """A block file is malformed (the caller adds the path)."""


def has_summaries(footer: Footer) -> bool:
    """Whether every scalar chunk of a block has its level-of-detail summary and every event
    batch its event index (footer version 3)."""
    for cols, key in ((footer.chunks, "lod_offset"), (footer.events, "idx_offset")):
        offsets = cols.get(key)
        if cols["offset"] and (offsets is None or any(o is None for o in offsets)):
            return False
    return True


@dataclass
class Footer:
    """The index of a block: what it covers and a row per record (columns as lists)."""

    first: int
    last: int
    level: int
    created: float
    segments: list  # [number, created, size] of each segment covered, in order
    chunks: dict  # CHUNK_COLUMNS -> list
    events: dict  # EVENT_COLUMNS -> list

    def bases(self) -> dict[int, int]:
        """Linear origin of the start of each covered segment."""
        out, total = {}, 0
        for number, _, size in self.segments:
            out[number] = total
            total += size
        return out

    @property
    def end(self) -> Position:
        """The position just after the last byte covered."""
        number, _, size = self.segments[-1]
        return Position(number, size)


class Origins:
    """Conversion between positions in segments ``first..last`` and one integer ("linear")."""

    def __init__(self, segments: list) -> None:
        self.numbers = [int(s[0]) for s in segments]
        sizes = np.array([int(s[2]) for s in segments], np.int64)
        self.bases = np.concatenate([[0], np.cumsum(sizes)])
        self.first, self.last = self.numbers[0], self.numbers[-1]

    def linear(self, pos: Position) -> int:
        """The linear value of ``pos``; positions outside the covered segments are clamped."""
        if pos.segment < self.first:
            return -1
        if pos.segment > self.last:
            return int(self.bases[-1]) + 1
        i = pos.segment - self.first
        return int(self.bases[i]) + min(pos.offset, int(self.bases[i + 1] - self.bases[i]))

    def position(self, linear: int) -> Position:
        """The position of a linear value (the end of a record: never a segment's offset 0)."""
        i = int(np.searchsorted(self.bases, linear, "left")) - 1
        i = max(0, min(i, len(self.numbers) - 1))
        return Position(self.numbers[i], int(linear - self.bases[i]))


class BlockBuilder:
    """Collects the contents of a block in write order, then writes it with :meth:`write`.

    Args:
        segments: ``[number, created, size]`` of every segment the block covers, in order.
    """

    def __init__(self, segments: list) -> None:
        self.segments = [[int(n), float(c), int(s)] for n, c, s in segments]
        self.origins = Origins(self.segments)
        # tag -> list of (steps, walls, values, piece counts, piece origins)
        self._scalars: dict[str, list] = {}
        # (kind, tag) -> list of (step, wall, payload, origin)
        self._events: dict[tuple[str, str | None], list] = {}
        self._order: list = []  # (kind, tag) keys and tags in order of first appearance
        self._ingest: tuple | None = None

    def add_scalars(
        self,
        tag: str,
        series: ScalarSeries,
        counts: np.ndarray,
        origins: np.ndarray,
    ) -> None:
        """Add points of ``tag``: ``counts[i]`` points came from the record ending at linear
        origin ``origins[i]``."""
        pieces = self._scalars.get(tag)
        if pieces is None:
            pieces = self._scalars[tag] = []
        pieces.append((series.steps, series.walls, series.values, counts, origins))

    def add_event(
        self, kind: str, tag: str | None, step: int | None, wall: float, payload: bytes, origin: int
    ) -> None:
        """Add one event, its payload byte for byte. An ``"ingest"`` record (untagged) replaces
        the previous one: each holds every writer's state, the newest suffices."""
        item = (step, wall, bytes(payload), origin)
        if kind == INGEST and tag is None:
            self._ingest = item
            return
        key = (kind, tag)
        self._events.setdefault(key, []).append(item)

    def write(self, fd: int, level: int, created: float) -> int:
        """Write the block to ``fd`` (at offset 0, sequentially); return its size. Each scalar
        chunk is followed by its level-of-detail summary (unless :data:`LOD_SLICE` is None)."""
        out = _Out(fd)
        first, last = self.segments[0][0], self.segments[-1][0]
        out.write(_header(first, last, created))
        lod_slice = LOD_SLICE
        names = CHUNK_COLUMNS if lod_slice is None else (*CHUNK_COLUMNS, *LOD_COLUMNS)
        chunk_cols: dict[str, list] = {c: [] for c in names}
        event_cols: dict[str, list] = {c: [] for c in EVENT_COLUMNS}
        for tag in sorted(self._scalars):
            for chunk in _chunks(self._scalars[tag]):
                payload, columns = _chunk_payload(tag, chunk)
                offset, length = out.frame(payload)
                _chunk_row(chunk_cols, offset, length, tag, chunk)
                if lod_slice is not None:
                    lod_offset, lod_length = out.frame(lod_payload(chunk[0], columns, lod_slice))
                    chunk_cols["lod_offset"].append(lod_offset)
                    chunk_cols["lod_length"].append(lod_length)
        keys = sorted(self._events, key=lambda k: (k[0], k[1] or ""))
        if self._ingest is not None:
            self._events[(INGEST, None)] = [self._ingest]
            keys.append((INGEST, None))
        if lod_slice is not None:
            event_cols.update({c: [] for c in INDEX_COLUMNS})
        for key in keys:
            for batch in _batches(self._events[key]):
                payload, index = _batch_payload(key, batch)
                offset, length = out.frame(payload)
                _event_row(event_cols, offset, length, key, batch)
                if lod_slice is not None:
                    idx_offset, idx_length = out.frame(index)
                    event_cols["idx_offset"].append(idx_offset)
                    event_cols["idx_length"].append(idx_length)
        footer = {
            "version": BLOCK_VERSION if lod_slice is None else FOOTER_VERSION,
            "first": first,
            "last": last,
            "level": level,
            "created": created,
            "segments": self.segments,
            "chunks": chunk_cols,
            "events": event_cols,
        }
        blob = msgpack.packb(footer, use_bin_type=True)
        offset, _ = out.frame(blob)
        head = struct.pack("<QI", offset, framing.FRAME_OVERHEAD + len(blob))
        out.write(
            _TRAILER.pack(
                offset, framing.FRAME_OVERHEAD + len(blob), zlib.crc32(head), TRAILER_MAGIC
            )
        )
        out.flush()
        return out.size


class _Out:
    """Buffered sequential writes to a file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0
        self._buf: list[bytes] = []
        self._held = 0

    def write(self, data: bytes) -> None:
        self._buf.append(data)
        self._held += len(data)
        self.size += len(data)
        if self._held >= 1 << 20:
            self.flush()

    def frame(self, payload: bytes) -> tuple[int, int]:
        offset = self.size
        self.write(framing.encode_frame(payload))
        return offset, len(payload)

    def flush(self) -> None:
        data = b"".join(self._buf)
        self._buf, self._held = [], 0
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]


def _header(first: int, last: int, created: float) -> bytes:
    head = struct.pack("<8sIIdI", BLOCK_MAGIC, BLOCK_VERSION, first, created, last)
    return head + struct.pack("<I", zlib.crc32(head))


def _chunks(pieces: list) -> Iterable[tuple]:
    """Cut the points of one tag into chunks: a new chunk where a piece starts below the largest
    step of the chunk so far (a restart: readers then supersede), or when the next piece would
    take it past CHUNK_POINTS. Merging pieces only where no restart can happen keeps
    ``read_scalars`` exactly as it was (the largest kept step after a chunk is its own maximum)."""
    steps = np.concatenate([p[0] for p in pieces])
    walls = np.concatenate([p[1] for p in pieces])
    values = np.concatenate([p[2] for p in pieces])
    counts = np.concatenate([p[3] for p in pieces]).astype(np.int64)
    origins = np.concatenate([p[4] for p in pieces]).astype(np.int64)
    starts = np.cumsum(counts) - counts
    piece_max = np.maximum.reduceat(steps, starts)
    firsts = steps[starts]
    running = np.maximum.accumulate(piece_max)
    # Only a piece starting below the largest step before it can be a restart.
    candidates = np.flatnonzero(firsts[1:] < running[:-1]) + 1
    cuts = [0]
    top = None
    for j in candidates.tolist():
        lo = cuts[-1]
        top = int(piece_max[lo:j].max())
        if int(firsts[j]) < top:
            cuts.append(j)
    cuts.append(len(counts))
    ends = np.cumsum(counts)
    for lo, hi in itertools.pairwise(cuts):
        while lo < hi:
            base = int(starts[lo])
            # The most pieces from lo whose points fit (at least one piece).
            stop = int(np.searchsorted(ends[lo:hi], base + CHUNK_POINTS, "right")) + lo
            stop = max(stop, lo + 1)
            a, b = base, int(ends[stop - 1])
            yield (
                ScalarSeries(steps[a:b], walls[a:b], values[a:b]),
                counts[lo:stop],
                origins[lo:stop],
            )
            lo = stop


def _chunk_payload(tag: str, chunk: tuple) -> tuple[bytes, dict]:
    """The payload of a chunk (the bytes ``msgpack.packb`` gives), and where its columns' bytes
    are in it: ``{"cs": step locator, "cw": wall locator, "cv": offset of the values}``."""
    series, counts, origins = chunk
    data = codec.scalar_data(*series)
    data["k"] = len(counts)
    data["oc"] = codec.encode_ints(counts)
    data["oo"] = codec.encode_ints(origins)
    packer = msgpack.Packer(use_bin_type=True)
    parts = [
        packer.pack_array_header(5),
        packer.pack(codec.SCALARS),
        packer.pack(tag),
        packer.pack(int(series.steps[0])),
        packer.pack(float(series.walls[0])),
        packer.pack_map_header(len(data)),
    ]
    size = sum(map(len, parts))
    where = {}
    for key, value in data.items():
        packed_key, packed = packer.pack(key), packer.pack(value)
        size += len(packed_key) + len(packed)
        if key in ("s", "w", "v"):
            tail = value if key == "v" else value[-1]
            # The column's bytes end the packed value (a bin, or a list ending with one).
            where[key] = size - len(tail) if isinstance(tail, bytes) else None
        parts += (packed_key, packed)
    s_enc, w_enc = data["s"], data["w"]
    if s_enc[0] == "range":
        cs = ["range", s_enc[1], s_enc[2]]
    elif s_enc[0] == "u4":
        cs = ["u4", s_enc[1], where["s"]]
    else:
        cs = ["i8", where["s"]]
    cw = ["us", w_enc[1], where["w"]] if w_enc[0] == "us" else ["f8", where["w"]]
    return b"".join(parts), {"cs": cs, "cw": cw, "cv": where["v"]}


def _slice_extremes(values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Index of the first minimum and of the first maximum of each slice of ``size`` values
    (NumPy's argmin/argmax: a NaN is both)."""
    n = len(values)
    full = n // size
    grid = values[: full * size].reshape(full, size)
    offsets = np.arange(full, dtype=np.int64) * size
    imin, imax = grid.argmin(axis=1) + offsets, grid.argmax(axis=1) + offsets
    if full * size < n:
        rest = values[full * size :]
        imin = np.append(imin, rest.argmin() + full * size)
        imax = np.append(imax, rest.argmax() + full * size)
    return imin, imax


def _slice_crcs(data: bytes, width: int, size: int, n: int) -> np.ndarray:
    """crc32 of each slice's bytes of a column of ``width``-byte items."""
    step = width * size
    return np.array([zlib.crc32(data[i : i + step]) for i in range(0, width * n, step)], "<u4")


def lod_payload(series: ScalarSeries, columns: dict, size: int) -> bytes:
    """The level-of-detail summary of one chunk (layout in docs/record-format.md).

    Args:
        series: the chunk's points.
        columns: where the chunk's columns are in its payload (:func:`_chunk_payload`).
        size: points per slice.
    """
    steps, walls, values = series
    n = len(steps)
    imin, imax = _slice_extremes(values, size)
    v = values.astype("<f8").tobytes()
    sw = [b""] * -(-n // size)
    if columns["cs"][0] != "range":
        width = 4 if columns["cs"][0] == "u4" else 8
        base = columns["cs"][1] if width == 4 else 0
        col = (steps - base).astype("<u4" if width == 4 else "<i8").tobytes()
        sw = [col[i : i + width * size] for i in range(0, width * n, width * size)]
    if columns["cw"][0] == "us":
        offsets = codec.encode_us(walls, columns["cw"][1]).astype("<u4")
        wcol, wwidth = offsets.tobytes(), 4
        # The wall times as a reader decodes them (to the microsecond), not as given.
        walls = codec.decode_us(wcol, columns["cw"][1])
    else:
        wcol, wwidth = walls.astype("<f8").tobytes(), 8
    wparts = [wcol[i : i + wwidth * size] for i in range(0, wwidth * n, wwidth * size)]
    data = {
        "S": size,
        "n": n,
        "imin": imin.astype("<u4").tobytes(),
        "imax": imax.astype("<u4").tobytes(),
        "vmin": values[imin].astype("<f8").tobytes(),
        "vmax": values[imax].astype("<f8").tobytes(),
        "smin": steps[imin].astype("<i8").tobytes(),
        "smax": steps[imax].astype("<i8").tobytes(),
        "wmin": walls[imin].astype("<f8").tobytes(),
        "wmax": walls[imax].astype("<f8").tobytes(),
        "crc": _slice_crcs(v, 8, size, n).tobytes(),
        "crcsw": np.array(
            [zlib.crc32(a + b) for a, b in zip(sw, wparts, strict=True)], "<u4"
        ).tobytes(),
        **columns,
    }
    return msgpack.packb(data, use_bin_type=True)


@dataclass
class Lod:
    """A chunk's level-of-detail summary, decoded: per slice of ``size`` points, the local index,
    value, step and wall time of its first minimum and first maximum, and checksums of its
    columns' bytes; and where the chunk's columns are in its payload."""

    size: int
    n: int
    imin: np.ndarray
    imax: np.ndarray
    vmin: np.ndarray
    vmax: np.ndarray
    smin: np.ndarray
    smax: np.ndarray
    wmin: np.ndarray
    wmax: np.ndarray
    crc: np.ndarray
    crcsw: np.ndarray
    cs: list
    cw: list
    cv: int


def decode_lod(payload: bytes) -> Lod:
    """Decode a summary payload.

    Raises:
        PayloadError: it is malformed.
    """
    try:
        d = msgpack.unpackb(payload, raw=False)
        size, n = int(d["S"]), int(d["n"])
        k = -(-n // size)
        lod = Lod(
            size, n,
            np.frombuffer(d["imin"], "<u4").astype(np.int64),
            np.frombuffer(d["imax"], "<u4").astype(np.int64),
            np.frombuffer(d["vmin"], "<f8"), np.frombuffer(d["vmax"], "<f8"),
            np.frombuffer(d["smin"], "<i8"), np.frombuffer(d["smax"], "<i8"),
            np.frombuffer(d["wmin"], "<f8"), np.frombuffer(d["wmax"], "<f8"),
            np.frombuffer(d["crc"], "<u4"), np.frombuffer(d["crcsw"], "<u4"),
            list(d["cs"]), list(d["cw"]), int(d["cv"]),
        )  # fmt: skip
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise codec.PayloadError(f"chunk summary is malformed: {exc}") from None
    cols = (lod.imin, lod.imax, lod.vmin, lod.vmax, lod.smin, lod.smax, lod.wmin, lod.wmax)
    if size < 1 or any(len(c) != k for c in (*cols, lod.crc, lod.crcsw)):
        raise codec.PayloadError("chunk summary columns have the wrong length")
    if lod.cs[0] not in ("range", "u4", "i8") or lod.cw[0] not in ("us", "f8"):
        raise codec.PayloadError("chunk summary has an unknown column encoding")
    return lod


def _chunk_row(cols: dict, offset: int, length: int, tag: str, chunk: tuple) -> None:
    series, _, origins = chunk
    steps, walls, values = series
    finite = np.isfinite(values)
    all_finite = bool(finite.all())
    vals = values if all_finite else np.where(finite, values, np.nan)
    if finite.any():
        imin = int(np.nanargmin(vals))
        imax = int(np.nanargmax(vals))
        vmin, vmax = float(values[imin]), float(values[imax])
        vmin_step, vmax_step = int(steps[imin]), int(steps[imax])
    else:
        vmin = vmax = vmin_step = vmax_step = None
    row = (
        offset, length, tag, len(steps), int(steps[0]), float(walls[0]), int(steps[-1]),
        float(walls[-1]), int(steps.min()), int(steps.max()), vmin, vmax, vmin_step, vmax_step,
        all_finite, int(origins[0]), int(origins[-1]),
    )  # fmt: skip
    for name, value in zip(CHUNK_COLUMNS, row, strict=True):
        cols[name].append(value)


def _batches(items: list) -> Iterable[list]:
    batch: list = []
    size = 0
    for item in items:
        if batch and (len(batch) >= BATCH_EVENTS or size + len(item[2]) > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item[2])
    if batch:
        yield batch


def _batch_payload(key: tuple, batch: list) -> tuple[bytes, bytes]:
    """The payload of an event batch (the bytes ``msgpack.packb`` gives), and its event index:
    where each event's payload is in it, with its checksum (docs/record-format.md)."""
    kind, tag = key
    origins = np.array([item[3] for item in batch], np.int64)
    oo = codec.encode_ints(origins)
    packer = msgpack.Packer(use_bin_type=True)
    parts = [
        packer.pack_array_header(5),
        packer.pack(EVENTS),
        packer.pack(tag),
        packer.pack(batch[0][0]),
        packer.pack(float(batch[0][1])),
        packer.pack_map_header(6),
        packer.pack("kind"),
        packer.pack(kind),
        packer.pack("n"),
        packer.pack(len(batch)),
        packer.pack("p"),
        packer.pack_array_header(len(batch)),
    ]
    size = sum(map(len, parts))
    at = np.empty(len(batch), "<u4")
    lengths = np.empty(len(batch), "<u4")
    crcs = np.empty(len(batch), "<u4")
    for i, item in enumerate(batch):
        packed = packer.pack(item[2])
        size += len(packed)
        at[i], lengths[i], crcs[i] = size - len(item[2]), len(item[2]), zlib.crc32(item[2])
        parts.append(packed)
    parts += (
        packer.pack("oo"),
        packer.pack(oo),
        packer.pack("st"),
        packer.pack([item[0] for item in batch]),
        packer.pack("wl"),
        packer.pack(np.array([item[1] for item in batch], "<f8").tobytes()),
    )
    index = {
        "n": len(batch),
        "at": at.tobytes(),
        "len": lengths.tobytes(),
        "crc": crcs.tobytes(),
        "oo": oo,
    }
    return b"".join(parts), msgpack.packb(index, use_bin_type=True)


@dataclass
class EventIndex:
    """Where each event of a batch is in its payload: offset and length of its own payload, its
    crc32, and its linear origin."""

    at: np.ndarray
    length: np.ndarray
    crc: np.ndarray
    origins: np.ndarray


def decode_event_index(payload: bytes, n: int) -> EventIndex:
    """Decode the event index of a batch of ``n`` events.

    Raises:
        PayloadError: it is malformed.
    """
    try:
        d = msgpack.unpackb(payload, raw=False)
        index = EventIndex(
            np.frombuffer(d["at"], "<u4").astype(np.int64),
            np.frombuffer(d["len"], "<u4").astype(np.int64),
            np.frombuffer(d["crc"], "<u4"),
            codec.decode_ints(d["oo"], n),
        )
        ok = d["n"] == n
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise codec.PayloadError(f"event index is malformed: {exc}") from None
    if not ok or not (len(index.at) == len(index.length) == len(index.crc) == n):
        raise codec.PayloadError("event index has the wrong length")
    return index


def _event_row(cols: dict, offset: int, length: int, key: tuple, batch: list) -> None:
    steps = [item[0] for item in batch if item[0] is not None]
    row = (
        offset, length, key[0], key[1], len(batch), batch[0][0], float(batch[0][1]),
        min(steps) if steps else None, max(steps) if steps else None, int(batch[0][3]),
        int(batch[-1][3]),
    )  # fmt: skip
    for name, value in zip(EVENT_COLUMNS, row, strict=True):
        cols[name].append(value)


def read_footer(fd: int, size: int | None = None) -> Footer:
    """Read and verify the header, trailer and footer of the block open as ``fd``.

    Raises:
        BlockError: a wrong magic, a newer version, or a checksum mismatch.
    """
    if size is None:
        size = os.fstat(fd).st_size
    if size < framing.HEADER_SIZE + TRAILER_SIZE:
        raise BlockError(f"block is truncated ({size} bytes)")
    head = os.pread(fd, framing.HEADER_SIZE, 0)
    magic, version, first, _created, last = struct.unpack_from("<8sIIdI", head)
    if magic != BLOCK_MAGIC:
        raise BlockError("wrong magic number: not a vdl-stream block file")
    if version > BLOCK_VERSION:
        raise BlockError(
            f"format version {version} is newer than this recorder reads (up to {BLOCK_VERSION})"
        )
    if struct.unpack_from("<I", head, 28)[0] != zlib.crc32(head[:28]):
        raise BlockError("header checksum mismatch")
    tail = os.pread(fd, TRAILER_SIZE, size - TRAILER_SIZE)
    offset, length, crc, magic = _TRAILER.unpack(tail)
    if magic != TRAILER_MAGIC or crc != zlib.crc32(tail[:12]):
        raise BlockError("trailer is damaged")
    if offset + length > size - TRAILER_SIZE:
        raise BlockError("trailer points past the end of the file")
    payload = framing.check_frame(os.pread(fd, length, offset))
    if payload is None:
        raise BlockError("footer checksum mismatch")
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        footer = Footer(
            obj["first"], obj["last"], obj["level"], obj["created"], obj["segments"],
            obj["chunks"], obj["events"],
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise BlockError(f"footer is malformed: {exc}") from None
    if (footer.first, footer.last) != (first, last) or not footer.segments:
        raise BlockError("footer does not match the header")
    return footer


def chunk_origins(data: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(piece counts, piece origins)`` of a block's scalar chunk.

    Raises:
        PayloadError: the columns are malformed.
    """
    try:
        oc, oo, k = data["oc"], data["oo"], data["k"]
    except (KeyError, TypeError) as exc:
        raise codec.PayloadError(f"chunk origins are missing: {exc}") from None
    counts = codec.decode_ints(oc, k)
    origins = codec.decode_ints(oo, k)
    if int(counts.sum()) != data["n"]:
        raise codec.PayloadError("chunk origins do not add up")
    return counts, origins


def batch_events(data: dict) -> tuple[list[tuple], np.ndarray]:
    """The events of a batch as decoded payloads ``(kind, tag, step, wall, data)``, and their
    origins.

    Raises:
        PayloadError: the batch or one of its payloads is malformed.
    """
    try:
        payloads, n = data["p"], data["n"]
        if not isinstance(payloads, list) or len(payloads) != n or n < 1:
            raise codec.PayloadError("event batch is malformed")
        origins = codec.decode_ints(data["oo"], n)
    except (KeyError, TypeError) as exc:
        raise codec.PayloadError(f"event batch is malformed: {exc}") from None
    return [codec.decode_payload(p) for p in payloads], origins


def batch_payloads(data: dict) -> list[bytes]:
    """The raw payloads of an event batch (for merging blocks without decoding events)."""
    return list(data["p"])
