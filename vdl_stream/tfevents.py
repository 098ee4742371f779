"""TensorBoard event files: TFRecord framing with masked CRC-32C, and the Event/Summary protobufs.

No TensorFlow and no protobuf package: the framing and the few messages needed are decoded by hand
from the protobuf wire format. The core is I/O-free (functions over bytes and numpy arrays); only
:func:`read_event_file` touches a file.

A TFRecord file is a sequence of records, each::

    length      u64 little-endian
    length_crc  u32 little-endian   masked CRC-32C of the 8 length bytes
    payload     length bytes        one serialized tensorflow.Event
    data_crc    u32 little-endian   masked CRC-32C of the payload

where ``masked(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2**32)``. CRCs are checked for many
records at once (:func:`crc32c_many`): with google-crc32c's C code for records of 16 bytes and more,
with numpy for the 8-byte lengths (and for everything where google-crc32c is not installed).

Decoded (field numbers from tensorflow/core/util/event.proto and framework/summary.proto)::

    Event         wall_time double = 1, step int64 = 2, graph_def bytes = 4 (a GraphDef: see
                  vdl_stream.graphs.graphdef_graph), summary Summary = 5 (others are skipped)
    Summary       value Value = 1 (repeated)
    Value         tag string = 1, simple_value float = 2, image Image = 4, histo HistogramProto = 5,
                  audio Audio = 6, tensor TensorProto = 8, metadata SummaryMetadata = 9
    Metadata      plugin_data PluginData = 1 { plugin_name string = 1 }
    Histogram     min = 1, max = 2, num = 3, sum = 4, sum_squares = 5 (double),
                  bucket_limit = 6, bucket = 7 (repeated double, packed or not)
    Image         height int32 = 1, width int32 = 2, colorspace int32 = 3, encoded_image_string = 4
    Audio         sample_rate float = 1, num_channels = 2, length_frames = 3 (int64),
                  encoded_audio_string = 4, content_type string = 5
    TensorProto   dtype = 1, tensor_shape = 2 { dim = 2 { size = 1 } }, tensor_content bytes = 4,
                  float_val = 5, double_val = 6, int_val = 7, string_val = 8, int64_val = 10

What becomes what: ``simple_value`` and one-element numeric tensors of the ``scalars`` plugin (or of
no plugin) are scalars; ``histo`` and ``histograms``-plugin tensors (``[k, 3]`` rows of left edge,
right edge, count) are histograms; ``image`` and ``images``-plugin tensors (``[width, height,
encoded...]``) are images (the first image of a batch); ``text``-plugin string tensors are text
(elements joined by newlines); ``audio`` is audio; ``pr_curves``-plugin tensors are pr_curve events
and ``hparams``-plugin session start summaries hparams events (see "pr_curve and hparams" below); a
``graph_def`` is a ``graph`` event (tag ``graph``). Everything else (run metadata, session logs,
other plugins) is counted as skipped, by name.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Records decoded per :class:`EventBlock` (at most).
BLOCK_RECORDS = 65536
#: Payload bytes per block (at most; one larger record gets a block of its own).
BLOCK_BYTES = 16 << 20
#: Records longer than this are refused as damage (TensorBoard's own limit is far lower in practice).
MAX_RECORD = 1 << 31
HEADER = 12  # length u64 + length crc u32
FOOTER = 4

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_MASK_DELTA = 0xA282EAD8

# -- CRC-32C (Castagnoli) ----------------------------------------------------------------------


def _make_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    return t


_TABLE = _make_table()
_TABLE_LIST = _TABLE.tolist()


# google-crc32c (C, hardware CRC instructions where the CPU has them) checks records of at least
# GOOGLE_MIN_LENGTH bytes when its wheel is installed (a dependency; the numpy path below stays as
# the fallback for a platform without the wheel). Shorter records, above all the 8-byte length of
# every header, stay with numpy: one bulk pass over a byte column beats a call per record there.
# Measured in docs/performance.md ("CRC-32C: google-crc32c against numpy").
try:
    import google_crc32c as _google_crc32c
except ImportError:  # pragma: no cover - the wheel is a dependency
    _google_crc32c = None
else:
    if _google_crc32c.implementation != "c":  # its pure-Python fallback is slower than numpy
        _google_crc32c = None

#: Records at least this long are checked with google-crc32c when it is there.
GOOGLE_MIN_LENGTH = 16
#: The CRC-32C implementation :func:`crc32c_many` uses by default: ``"google"`` or ``"numpy"``.
CRC_BACKEND = "google" if _google_crc32c is not None else "numpy"


def _crc_google(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC-32C of ``data[o:o+n]`` for each pair, one google-crc32c call per record."""
    value = _google_crc32c.value  # it takes bytes only (not a numpy or mmap buffer)
    lo = int(offsets.min())
    hi = int((offsets + lengths).max())
    if hi - lo <= 2 * int(lengths.sum()) + (1 << 20):  # contiguous records: one copy of the span
        raw = data[lo:hi].tobytes()
        pairs = zip((offsets - lo).tolist(), lengths.tolist(), strict=True)
        return np.fromiter((value(raw[o : o + n]) for o, n in pairs), np.uint32, len(offsets))
    pairs = zip(offsets.tolist(), lengths.tolist(), strict=True)
    return np.fromiter(
        (value(data[o : o + n].tobytes()) for o, n in pairs), np.uint32, len(offsets)
    )


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """Return the CRC-32C of ``data`` (plain Python; the reference for :func:`crc32c_many`)."""
    crc = 0xFFFFFFFF
    table = _TABLE_LIST
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def mask(crc: int | np.ndarray) -> Any:
    """Apply TFRecord's CRC mask to one CRC or an array of them (uint32)."""
    if isinstance(crc, np.ndarray):
        c = crc.astype(np.uint32)
        return ((c >> np.uint32(15)) | (c << np.uint32(17))) + np.uint32(_MASK_DELTA)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """Return the masked CRC-32C of ``data`` as TFRecord stores it."""
    return mask(crc32c(data))


_ZERO_TABLES: dict[int, np.ndarray] = {}


def _zero_tables(lane: int) -> np.ndarray:
    """Tables ``z[i][v]``: the CRC state ``v << 8i`` advanced over ``lane`` zero bytes (linear)."""
    z = _ZERO_TABLES.get(lane)
    if z is None:
        rows = []
        for i in range(4):
            s = np.arange(256, dtype=np.uint32) << np.uint32(8 * i)
            for _ in range(lane):
                s = _TABLE[s & 0xFF] ^ (s >> np.uint32(8))
            rows.append(s)
        z = _ZERO_TABLES[lane] = np.stack(rows)
    return z


def _crc_group(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, lane: int) -> np.ndarray:
    """CRC-32C of records all at least 4 bytes long, computed lane-parallel.

    Each record is left-padded with zeros to a whole number of ``lane``-byte lanes. With the
    register starting at 0 leading zeros change nothing, and starting at 0xFFFFFFFF is the same as
    starting at 0 with the first four message bytes inverted. So every lane's CRC is computed at
    once (one numpy pass per byte column), and the lanes of a record are folded left to right with
    ``crc(A || B) = zero_advance(crc(A), len(B)) ^ crc(B)``.
    """
    n = len(offsets)
    lanes = np.maximum((lengths + lane - 1) // lane, 1)
    padded = lanes * lane
    starts = np.cumsum(padded) - padded
    dst = starts + padded - lengths
    flat = np.zeros(int(padded.sum()), dtype=np.uint8)
    if n > 64 and int(lengths.max()) <= 1024:
        total = int(lengths.sum())
        rec = np.repeat(np.arange(n), lengths)
        within = np.arange(total, dtype=np.int64) - (np.cumsum(lengths) - lengths)[rec]
        flat[dst[rec] + within] = buf[offsets[rec] + within]
    else:
        for o, d, k in zip(offsets.tolist(), dst.tolist(), lengths.tolist(), strict=True):
            flat[d : d + k] = buf[o : o + k]
    for k in range(4):
        flat[dst + k] ^= 0xFF
    m = flat.reshape(-1, lane)
    s = np.zeros(len(m), dtype=np.uint32)
    eight = np.uint32(8)
    for j in range(lane):
        s = _TABLE[(s ^ m[:, j]) & 0xFF] ^ (s >> eight)
    first = starts // lane
    acc = s[first]
    multi = np.nonzero(lanes > 1)[0]
    if len(multi):
        z = _zero_tables(lane)
        multi = multi[np.argsort(-lanes[multi], kind="stable")]
        counts = lanes[multi]
        for k in range(1, int(counts[0])):
            sel = multi[: int(np.searchsorted(-counts, -k, side="left"))]
            a = acc[sel]
            a = z[0][a & 0xFF] ^ z[1][(a >> eight) & 0xFF] ^ z[2][(a >> 16) & 0xFF] ^ z[3][a >> 24]
            acc[sel] = a ^ s[first[sel] + k]
    return acc ^ np.uint32(0xFFFFFFFF)


def _advance(z: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Advance CRC states ``a`` over the zero bytes that the tables ``z`` stand for."""
    eight = np.uint32(8)
    return z[0][a & 0xFF] ^ z[1][(a >> eight) & 0xFF] ^ z[2][(a >> 16) & 0xFF] ^ z[3][a >> 24]


def _doubled_tables(lane: int, doublings: int) -> np.ndarray:
    """Zero-advance tables for ``lane << doublings`` bytes (Z_2L = Z_L after Z_L)."""
    key = -(lane << doublings)
    z = _ZERO_TABLES.get(key)
    if z is None:
        z = _zero_tables(lane) if not doublings else _doubled_tables(lane, doublings - 1)
        if doublings:
            z = np.stack([_advance(z, row) for row in z])
        _ZERO_TABLES[key] = z
    return z


def _crc_long(data: np.ndarray, offset: int, length: int, lane: int = 64) -> int:
    """CRC-32C of one long record: 64-byte lanes at once, then folded pairwise, log2(lanes) times.

    The record is left-padded with zero lanes to a power of two (leading zeros do not change a
    CRC whose register starts at 0), so every level folds equal-length halves:
    ``crc(A || B) = zero_advance(crc(A), len(B)) ^ crc(B)``.
    """
    lanes = max(1, -(-length // lane))
    lanes = 1 << (lanes - 1).bit_length()
    total = lanes * lane
    flat = np.zeros(total, dtype=np.uint8)
    flat[total - length :] = data[offset : offset + length]
    flat[total - length : total - length + 4] ^= 0xFF
    m = flat.reshape(lanes, lane)
    s = np.zeros(lanes, dtype=np.uint32)
    eight = np.uint32(8)
    for j in range(lane):
        s = _TABLE[(s ^ m[:, j]) & 0xFF] ^ (s >> eight)
    level = 0
    while len(s) > 1:
        s = _advance(_doubled_tables(lane, level), s[0::2]) ^ s[1::2]
        level += 1
    return int(s[0]) ^ 0xFFFFFFFF


def _crc_same_length(data: np.ndarray, offsets: np.ndarray, length: int) -> np.ndarray:
    """CRC-32C of records that all have ``length`` (>= 4) bytes: one numpy pass per byte column."""
    m = data[offsets[:, None] + np.arange(length)]
    m[:, :4] ^= 0xFF  # starting at 0xFFFFFFFF = starting at 0 with the first 4 bytes inverted
    s = np.zeros(len(offsets), dtype=np.uint32)
    eight = np.uint32(8)
    for j in range(length):
        s = _TABLE[(s ^ m[:, j]) & 0xFF] ^ (s >> eight)
    return s ^ np.uint32(0xFFFFFFFF)


def crc32c_many(
    buf: bytes | bytearray | memoryview | np.ndarray,
    offsets: Any,
    lengths: Any,
    backend: str | None = None,
) -> np.ndarray:
    """Return the CRC-32C of ``buf[o:o+n]`` for every ``(o, n)`` pair, as a uint32 array.

    With ``backend="google"`` (the default when google-crc32c is installed, see
    :data:`CRC_BACKEND`) records of :data:`GOOGLE_MIN_LENGTH` bytes or more go through
    google-crc32c. Everything else is vectorized with numpy: records shorter than 256 bytes in
    groups of equal length, up to 4 KiB lane-parallel in 64-byte lanes, longer ones one by one
    with a pairwise fold of their lanes.

    Raises:
        ValueError: ``backend`` is not ``"google"``, ``"numpy"`` or None, or is ``"google"``
            without google-crc32c installed.
    """
    backend = CRC_BACKEND if backend is None else backend
    if backend not in ("google", "numpy"):
        raise ValueError(f"backend must be 'google', 'numpy' or None, got {backend!r}")
    if backend == "google" and _google_crc32c is None:
        raise ValueError("backend 'google' needs the google-crc32c package (C implementation)")
    data = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if backend == "google" and len(offsets):
        long = lengths >= GOOGLE_MIN_LENGTH
        if long.all():
            return _crc_google(data, offsets, lengths)
        out = np.zeros(len(offsets), dtype=np.uint32)
        if long.any():
            out[long] = _crc_google(data, offsets[long], lengths[long])
        out[~long] = _crc32c_many_numpy(data, offsets[~long], lengths[~long])
        return out
    return _crc32c_many_numpy(data, offsets, lengths)


def _crc32c_many_numpy(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`crc32c_many` with numpy only (the fallback, and the path for short records)."""
    out = np.zeros(len(offsets), dtype=np.uint32)
    tiny = lengths < 4
    for i in np.nonzero(tiny)[0].tolist():
        out[i] = crc32c(data[offsets[i] : offsets[i] + lengths[i]].tobytes())
    short = np.nonzero(~tiny & (lengths < 256))[0]
    if len(short):
        sizes, inverse = np.unique(lengths[short], return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse, minlength=len(sizes)))
        lo = 0
        for size, hi in zip(sizes.tolist(), bounds.tolist(), strict=True):
            idx = short[order[lo:hi]]
            out[idx] = _crc_same_length(data, offsets[idx], size)
            lo = hi
    idx = np.nonzero((lengths >= 256) & (lengths < 4096))[0]
    if len(idx):
        out[idx] = _crc_group(data, offsets[idx], lengths[idx], 64)
    for i in np.nonzero(lengths >= 4096)[0].tolist():
        out[i] = _crc_long(data, int(offsets[i]), int(lengths[i]))
    return out


def encode_record(payload: bytes) -> bytes:
    """Frame ``payload`` as one TFRecord (length, masked CRCs), as TensorFlow writes it."""
    length = _U64.pack(len(payload))
    return b"".join(
        (
            length,
            _U32.pack(masked_crc32c(length)),
            payload,
            _U32.pack(masked_crc32c(payload)),
        )
    )


# -- framing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corruption:
    """A damaged stretch of a file that was skipped.

    Attributes:
        offset: byte offset of the damage in the file.
        length: bytes skipped.
        reason: what was wrong, e.g. ``"payload checksum mismatch"``.
    """

    offset: int
    length: int
    reason: str


@dataclass
class Frames:
    """Records found in a buffer: payload offsets and lengths, with damage and the end reached."""

    offsets: np.ndarray
    lengths: np.ndarray
    corrupt: list[Corruption]
    end: int  # bytes consumed: the next record (or the torn tail) starts here


def _header_crcs_ok(data: np.ndarray, positions: np.ndarray) -> np.ndarray:
    stored = (
        data[positions + 8].astype(np.uint32)
        | (data[positions + 9].astype(np.uint32) << 8)
        | (data[positions + 10].astype(np.uint32) << 16)
        | (data[positions + 11].astype(np.uint32) << 24)
    )
    return mask(crc32c_many(data, positions, np.full(len(positions), 8))) == stored


def _u32_at(data: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return (
        data[positions].astype(np.uint32)
        | (data[positions + 1].astype(np.uint32) << 8)
        | (data[positions + 2].astype(np.uint32) << 16)
        | (data[positions + 3].astype(np.uint32) << 24)
    )


def _resync(data: np.ndarray, start: int, size: int) -> int:
    """Return the first offset at or after ``start`` holding a valid record header, or ``size``."""
    window = 1 << 20
    pos = start
    while pos + HEADER <= size:
        hi = min(pos + window, size - HEADER + 1)
        cand = np.arange(pos, hi, dtype=np.int64)
        ok = np.nonzero(_header_crcs_ok(data, cand))[0]
        if len(ok):
            return int(cand[ok[0]])
        pos = hi
    return size


def scan_frames(
    buf: bytes | bytearray | memoryview | np.ndarray,
    start: int = 0,
    max_records: int = BLOCK_RECORDS,
    max_bytes: int = BLOCK_BYTES,
    final: bool = True,
) -> Frames:
    """Find the valid records of ``buf`` from ``start`` on, checking both checksums of each.

    Stops after ``max_records`` records or ``max_bytes`` payload bytes, or at an incomplete record
    at the end (a torn tail: ``end`` points at it, and nothing is reported for it). A header whose
    checksum fails is damage: the bytes up to the next valid header are skipped and reported. A
    payload whose checksum fails is reported and skipped (its length was checked). With
    ``final=False`` damage in the last incomplete stretch is left for a later call.
    """
    data = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    size = len(data)
    raw = memoryview(data)
    offsets: list[int] = []
    lengths: list[int] = []
    corrupt: list[Corruption] = []
    pos = start
    nbytes = 0
    while len(offsets) < max_records and nbytes < max_bytes:
        # Optimistic pass: walk the lengths, then check the header CRCs of all at once.
        heads: list[int] = []
        sizes: list[int] = []
        p = pos
        budget = max_records - len(offsets)
        while len(heads) < budget and p + HEADER <= size:
            (n,) = _U64.unpack_from(raw, p)
            heads.append(p)
            sizes.append(n)
            if n > MAX_RECORD or p + HEADER + n + FOOTER > size:
                break
            p += HEADER + n + FOOTER
            if nbytes + p - pos >= max_bytes:
                break
        if not heads:
            break
        hpos = np.array(heads, dtype=np.int64)
        good = _header_crcs_ok(data, hpos)
        bad = np.nonzero(~good)[0]
        n_good = int(bad[0]) if len(bad) else len(heads)
        # Of the records with good headers, the last may be incomplete (torn tail).
        complete = n_good
        torn = False
        if n_good and (
            sizes[n_good - 1] > MAX_RECORD
            or heads[n_good - 1] + HEADER + sizes[n_good - 1] + FOOTER > size
        ):
            complete = n_good - 1
            torn = True
        if complete:
            hp = hpos[:complete]
            ln = np.array(sizes[:complete], dtype=np.int64)
            payload_at = hp + HEADER
            stored = _u32_at(data, payload_at + ln)
            ok = mask(crc32c_many(data, payload_at, ln)) == stored
            for i in np.nonzero(~ok)[0].tolist():
                corrupt.append(
                    Corruption(heads[i], HEADER + sizes[i] + FOOTER, "payload checksum mismatch")
                )
            offsets.extend(payload_at[ok].tolist())
            lengths.extend(ln[ok].tolist())
            nbytes += int(ln.sum())
            pos = heads[complete - 1] + HEADER + sizes[complete - 1] + FOOTER
        if torn:
            if sizes[n_good - 1] > MAX_RECORD:  # a valid header with an absurd length
                nxt = _resync(data, pos + 1, size)
                corrupt.append(Corruption(pos, nxt - pos, "record length out of range"))
                pos = nxt
                continue
            break  # wait for the rest of the record (or report it as truncated at the end)
        if complete < len(heads):  # a header checksum failed at heads[complete]
            nxt = _resync(data, pos + 1, size)
            if nxt >= size - HEADER and not final:
                break
            corrupt.append(Corruption(pos, nxt - pos, "header checksum mismatch"))
            pos = nxt
    return Frames(
        np.array(offsets, dtype=np.int64), np.array(lengths, dtype=np.int64), corrupt, pos
    )


# -- protobuf wire format ----------------------------------------------------------------------


class DecodeError(ValueError):
    """A payload is not a well-formed protobuf message of the expected type."""


def _varint(b: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        byte = b[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def _skip(b: bytes, pos: int, wire: int) -> int:
    if wire == 0:
        return _varint(b, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        n, pos = _varint(b, pos)
        return pos + n
    if wire == 5:
        return pos + 4
    raise DecodeError(f"unsupported wire type {wire}")


def wire_fields(b: bytes) -> list[tuple[int, int, Any]]:
    """Split a message into ``(field, wire type, value)``; length-delimited values as bytes."""
    out = []
    pos = 0
    n = len(b)
    while pos < n:
        key, pos = _varint(b, pos)
        fnum, wire = key >> 3, key & 7
        if wire == 0:
            v, pos = _varint(b, pos)
        elif wire == 1:
            v = b[pos : pos + 8]
            pos += 8
        elif wire == 2:
            k, pos = _varint(b, pos)
            v = b[pos : pos + k]
            pos += k
        elif wire == 5:
            v = b[pos : pos + 4]
            pos += 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        if pos > n:
            raise DecodeError("message truncated")
        out.append((fnum, wire, v))
    return out


def packed_doubles(items: list[tuple[int, Any]]) -> list[float]:
    """Repeated double values, packed (wire 2) or not (wire 1)."""
    out: list[float] = []
    for wire, v in items:
        if wire == 2:
            if len(v) % 8:
                raise DecodeError("packed doubles not a multiple of 8 bytes")
            out.extend(np.frombuffer(v, dtype="<f8").tolist())
        elif wire == 1:
            out.append(_F64.unpack(v)[0])
    return out


def _floats(items: list[tuple[int, Any]]) -> list[float]:
    out: list[float] = []
    for wire, v in items:
        if wire == 2:
            if len(v) % 4:
                raise DecodeError("packed floats not a multiple of 4 bytes")
            out.extend(np.frombuffer(v, dtype="<f4").astype(np.float64).tolist())
        elif wire == 5:
            out.append(_F32.unpack(v)[0])
    return out


def _varints(items: list[tuple[int, Any]], signed64: bool = True) -> list[int]:
    out: list[int] = []
    for wire, v in items:
        if wire == 2:
            pos = 0
            while pos < len(v):
                x, pos = _varint(v, pos)
                out.append(x)
        elif wire == 0:
            out.append(v)
    if signed64:
        out = [x - (1 << 64) if x >= 1 << 63 else x for x in out]
    return out


def group_fields(fields: list[tuple[int, int, Any]]) -> dict[int, list[tuple[int, Any]]]:
    """Group :func:`wire_fields` output by field number: ``{field: [(wire type, value), ...]}``."""
    out: dict[int, list[tuple[int, Any]]] = {}
    for fnum, wire, v in fields:
        out.setdefault(fnum, []).append((wire, v))
    return out


def last_field(g: dict[int, list[tuple[int, Any]]], fnum: int, default: Any = None) -> Any:
    """The value of field ``fnum`` (the last one wins, as protobuf merges), or ``default``."""
    items = g.get(fnum)
    return items[-1][1] if items else default


# TensorFlow DataType numbers and their numpy little-endian types.
_DTYPES = {
    1: "<f4",  # DT_FLOAT
    2: "<f8",  # DT_DOUBLE
    3: "<i4",  # DT_INT32
    4: "u1",  # DT_UINT8
    5: "<i2",  # DT_INT16
    6: "i1",  # DT_INT8
    9: "<i8",  # DT_INT64
    10: "u1",  # DT_BOOL
    19: "<f2",  # DT_HALF
}
DT_STRING = 7


@dataclass
class Tensor:
    """A decoded TensorProto: ``dtype`` number, ``shape``, and numbers or byte strings."""

    dtype: int
    shape: tuple[int, ...]
    numbers: np.ndarray | None = None
    strings: list[bytes] | None = None


def decode_tensor(b: bytes) -> Tensor:
    """Decode a TensorProto of a numeric or string dtype.

    Raises:
        DecodeError: malformed bytes, or a dtype this decoder does not know.
    """
    g = group_fields(wire_fields(b))
    dtype = last_field(g, 1, 0)
    shape: list[int] = []
    shape_msg = last_field(g, 2)
    if shape_msg is not None:
        for wire, dim in group_fields(wire_fields(shape_msg)).get(2, []):
            if wire == 2:
                shape.append(last_field(group_fields(wire_fields(dim)), 1, 0))
    if dtype == DT_STRING:
        return Tensor(dtype, tuple(shape), strings=[v for w, v in g.get(8, []) if w == 2])
    np_type = _DTYPES.get(dtype)
    if np_type is None:
        raise DecodeError(f"tensor dtype {dtype} is not supported")
    content = last_field(g, 4)
    if content:
        numbers = np.frombuffer(content, dtype=np_type).astype(np.float64)
    elif dtype == 1:
        numbers = np.array(_floats(g.get(5, [])), dtype=np.float64)
    elif dtype == 2:
        numbers = np.array(packed_doubles(g.get(6, [])), dtype=np.float64)
    elif dtype == 9:
        numbers = np.array(_varints(g.get(10, [])), dtype=np.float64)
    elif dtype == 19:  # half_val: the bits of each half in an int32
        bits = np.array(_varints(g.get(13, []), signed64=False), dtype=np.uint16)
        numbers = bits.view("<f2").astype(np.float64)
    else:
        vals = _varints(g.get(7, []))
        numbers = np.array([x - (1 << 32) if x >= 1 << 31 else x for x in vals], np.float64)
    return Tensor(dtype, tuple(shape), numbers=numbers)


def image_format(data: bytes) -> str:
    """Name the encoding of an image from its first bytes: png, jpeg, gif, webp or unknown."""
    if data.startswith(b"\x89PNG"):
        return "png"
    if data.startswith(b"\xff\xd8"):
        return "jpeg"
    if data.startswith(b"GIF8"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "unknown"


def histogram_event(
    edges: np.ndarray,
    counts: np.ndarray,
    *,
    hmin: float | None,
    hmax: float | None,
    num: float,
    total: float,
    sum_sq: float,
) -> dict[str, Any]:
    """Build the data of a ``histogram`` event (docs/protocol.md) from bucket edges and counts."""
    return {
        "edges": np.asarray(edges, dtype="<f8").tobytes(),
        "counts": np.asarray(counts, dtype="<f8").tobytes(),
        "num": int(num),
        "nan": 0,
        "inf": 0,
        "min": hmin,
        "max": hmax,
        "sum": float(total),
        "sum_sq": float(sum_sq),
    }


_HUGE = 1e300  # TensorFlow's outer bucket limits are +-DBL_MAX


def _histo(b: bytes) -> dict[str, Any]:
    g = group_fields(wire_fields(b))

    def dbl(f: int) -> float:
        v = last_field(g, f)
        return _F64.unpack(v)[0] if v is not None else 0.0

    hmin, hmax, num, total, sum_sq = dbl(1), dbl(2), dbl(3), dbl(4), dbl(5)
    limits = np.array(packed_doubles(g.get(6, [])), dtype=np.float64)
    counts = np.array(packed_doubles(g.get(7, [])), dtype=np.float64)
    if len(limits) != len(counts):
        raise DecodeError(f"histogram has {len(limits)} limits and {len(counts)} buckets")
    # bucket i covers (limits[i-1], limits[i]]; the first starts at the minimum.
    left = hmin if not len(limits) or hmin <= limits[0] else limits[0]
    edges = np.concatenate([[left], limits])
    if num:
        edges[edges >= _HUGE] = hmax
        edges[edges <= -_HUGE] = hmin
    return histogram_event(edges, counts, hmin=hmin, hmax=hmax, num=num, total=total, sum_sq=sum_sq)


def _tensor_histogram(t: Tensor) -> dict[str, Any]:
    if t.numbers is None or t.numbers.size % 3:
        raise DecodeError("a histograms tensor must have shape [k, 3]")
    rows = t.numbers.reshape(-1, 3)
    counts = rows[:, 2]
    edges = np.concatenate([rows[:1, 0], rows[:, 1]]) if len(rows) else np.zeros(1)
    centers = (rows[:, 0] + rows[:, 1]) / 2
    nonzero = rows[counts > 0]
    return histogram_event(
        edges,
        counts,
        hmin=float(nonzero[0, 0]) if len(nonzero) else None,
        hmax=float(nonzero[-1, 1]) if len(nonzero) else None,
        num=float(counts.sum()),
        total=float((centers * counts).sum()),
        sum_sq=float((centers * centers * counts).sum()),
    )


# -- events ------------------------------------------------------------------------------------


@dataclass
class EventBlock:
    """What a run of records decoded into.

    Attributes:
        scalars: tag -> ``(steps, walls, values)`` sequences (lists or arrays), in file order.
        events: ``(kind, tag, step, wall, data)`` tuples of non-scalar events, in file order;
            ``data`` is the event's kind-specific map (docs/protocol.md).
        corrupt: damaged stretches skipped (framing) or records that did not decode.
        skipped: counts of records or values not imported, by what they were.
        records: records read (valid framing), including skipped ones.
        end: the file offset up to which this block consumed bytes.
        first_wall: the smallest wall time seen (None when no event had one).
    """

    scalars: dict[str, tuple[list[int], list[float], list[float]]] = field(default_factory=dict)
    events: list[tuple[str, str | None, int | None, float, dict[str, Any]]] = field(
        default_factory=list
    )
    corrupt: list[Corruption] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    records: int = 0
    end: int = 0
    first_wall: float | None = None
    # The metric tags of the hparams experiment summary seen last (tensorboardX writes it just
    # before the session start summary that holds the values); carried from block to block.
    hparam_metrics: list[str] = field(default_factory=list)
    # The index of the record being decoded, and per tag the record index of every point (kept
    # so that points decoded in bulk can be merged back into file order).
    index: int = 0
    order: dict[str, list[int]] = field(default_factory=dict)

    def add_scalar(self, tag: str, step: int, wall: float, value: float) -> None:
        """Append one scalar point of ``tag``."""
        cols = self.scalars.get(tag)
        if cols is None:
            cols = self.scalars[tag] = ([], [], [])
            self.order[tag] = []
        cols[0].append(step)
        cols[1].append(wall)
        cols[2].append(value)
        self.order[tag].append(self.index)

    def scalar_count(self) -> int:
        """The number of scalar points in the block."""
        return sum(len(cols[0]) for cols in self.scalars.values())


def _decode_value(block: EventBlock, v: bytes, step: int, wall: float) -> None:
    """Decode one Summary.Value into ``block``."""
    # Fast path for tensorboardX's add_scalar: tag (field 1) then simple_value (field 2), nothing else.
    if v[0] == 0x0A:
        n = v[1]
        if n < 0x80 and len(v) == n + 7 and v[n + 2] == 0x15:
            block.add_scalar(v[2 : n + 2].decode(), step, wall, _F32.unpack_from(v, n + 3)[0])
            return
    g = group_fields(wire_fields(v))
    tag = last_field(g, 1, b"").decode()
    if not tag:
        tag = last_field(g, 7, b"").decode()  # node_name, in very old files
    if not tag:
        block.skipped["value without a tag"] += 1
        return
    plugin = ""
    content = b""
    meta = last_field(g, 9)
    if meta is not None:
        pdata = last_field(group_fields(wire_fields(meta)), 1)
        if pdata is not None:
            pg = group_fields(wire_fields(pdata))
            plugin = last_field(pg, 1, b"").decode()
            content = last_field(pg, 2, b"")
    if plugin == "hparams":  # pr_curve and hparams block (below)
        _hparams_value(block, tag, content, wall)
        return
    simple = last_field(g, 2)
    if simple is not None:
        block.add_scalar(tag, step, wall, _F32.unpack(simple)[0])
        return
    histo = last_field(g, 5)
    if histo is not None:
        block.events.append(("histogram", tag, step, wall, _histo(histo)))
        return
    image = last_field(g, 4)
    if image is not None:
        ig = group_fields(wire_fields(image))
        data = last_field(ig, 4, b"")
        block.events.append(
            (
                "image",
                tag,
                step,
                wall,
                {
                    "format": image_format(data),
                    "data": bytes(data),
                    "width": last_field(ig, 2, 0),
                    "height": last_field(ig, 1, 0),
                    "channels": last_field(ig, 3, 0),
                },
            )
        )
        return
    audio = last_field(g, 6)
    if audio is not None:
        ag = group_fields(wire_fields(audio))
        rate = last_field(ag, 1)
        block.events.append(
            (
                "audio",
                tag,
                step,
                wall,
                {
                    "format": (last_field(ag, 5, b"audio/wav").decode().split("/")[-1] or "wav"),
                    "data": bytes(last_field(ag, 4, b"")),
                    "sample_rate": _F32.unpack(rate)[0] if rate is not None else None,
                    "channels": last_field(ag, 2, 0),
                    "frames": last_field(ag, 3, 0),
                },
            )
        )
        return
    tensor = last_field(g, 8)
    if tensor is None:
        block.skipped["value of another type"] += 1
        return
    t = decode_tensor(tensor)
    if plugin in ("scalars", "") and t.numbers is not None and t.numbers.size == 1:
        block.add_scalar(tag, step, wall, float(t.numbers[0]))
    elif plugin == "histograms" and t.numbers is not None:
        block.events.append(("histogram", tag, step, wall, _tensor_histogram(t)))
    elif plugin == "images" and t.strings is not None and len(t.strings) >= 3:
        data = bytes(t.strings[2])
        block.events.append(
            (
                "image",
                tag,
                step,
                wall,
                {
                    "format": image_format(data),
                    "data": data,
                    "width": int(t.strings[0] or 0),
                    "height": int(t.strings[1] or 0),
                },
            )
        )
    elif plugin == "pr_curves" and t.numbers is not None and _is_pr_curve(t.numbers):
        block.events.append(("pr_curve", tag, step, wall, _pr_curve(t)))
    elif plugin == "text" and t.strings is not None:
        text = "\n".join(s.decode("utf-8", "replace") for s in t.strings)
        block.events.append(("text", tag, step, wall, {"text": text}))
    else:
        block.skipped[f"plugin {plugin or 'none'}"] += 1


# -- pr_curve and hparams ------------------------------------------------------------------------
#
# pr_curves plugin: a float tensor of shape [6, num_thresholds], rows TP, FP, TN, FN, precision,
# recall, at thresholds i / (num_thresholds - 1) (tensorboard/plugins/pr_curve/summary.py).
#
# hparams plugin: no tensor worth reading; the plugin data's ``content`` is an HParamsPluginData
# (tensorboard/plugins/hparams/plugin_data.proto, api.proto)::
#
#     HParamsPluginData  version int32 = 1, experiment = 2, session_start_info = 3,
#                        session_end_info = 4
#     Experiment         hparam_infos = 4, metric_infos MetricInfo = 5 (repeated)
#     MetricInfo         name MetricName = 1 { group string = 1, tag string = 2 }
#     SessionStartInfo   hparams map<string, google.protobuf.Value> = 1 (entries key = 1, value = 2)
#     Value              null_value = 1, number_value double = 2, string_value = 3, bool_value = 4
#
# The experiment names the metric tags; the session start info holds the values, and becomes one
# ``hparams`` event (the metrics' values are the run's scalars of those tags).


def _is_pr_curve(numbers: np.ndarray) -> bool:
    """Whether a pr_curves tensor has 6 rows of at least 2 thresholds (else it is skipped)."""
    return numbers.size >= 12 and numbers.size % 6 == 0


def _pr_curve(t: Tensor) -> dict[str, Any]:
    numbers = t.numbers if t.numbers is not None else np.zeros(0)
    if numbers.size % 6 or numbers.size < 12:
        raise DecodeError(f"a pr_curves tensor must have shape [6, n >= 2], got {numbers.size}")
    rows = numbers.reshape(6, -1)
    n = rows.shape[1]
    f8 = [np.ascontiguousarray(r, dtype="<f8").tobytes() for r in rows]
    return {
        "thresholds": (np.arange(n, dtype="<f8") / (n - 1)).tobytes(),
        "tp": f8[0],
        "fp": f8[1],
        "tn": f8[2],
        "fn": f8[3],
        "precision": f8[4],
        "recall": f8[5],
        "num_thresholds": n,
    }


def _hparam_value(b: bytes) -> Any:
    g = group_fields(wire_fields(b))
    if 2 in g:
        return _F64.unpack(last_field(g, 2))[0]
    if 3 in g:
        return bytes(last_field(g, 3)).decode()
    if 4 in g:
        return bool(last_field(g, 4))
    return None


def _hparams_value(block: EventBlock, tag: str, content: bytes, wall: float) -> None:
    """Decode the HParamsPluginData of a value of the hparams plugin into ``block``."""
    g = group_fields(wire_fields(content))
    experiment = last_field(g, 2)
    if experiment is not None:
        metrics = []
        for wire, info in group_fields(wire_fields(experiment)).get(5, []):
            name = last_field(group_fields(wire_fields(info)), 1)
            if wire == 2 and name is not None:
                ng = group_fields(wire_fields(name))
                group = bytes(last_field(ng, 1, b"")).decode()
                mtag = bytes(last_field(ng, 2, b"")).decode()
                if mtag:
                    metrics.append(f"{group}/{mtag}" if group else mtag)
        block.hparam_metrics = metrics
        block.skipped["hparams experiment"] += 1
        return
    start = last_field(g, 3)
    if start is None:
        block.skipped["hparams session end"] += 1
        return
    hparams: dict[str, Any] = {}
    for wire, entry in group_fields(wire_fields(start)).get(1, []):
        if wire != 2:
            continue
        eg = group_fields(wire_fields(entry))
        key = bytes(last_field(eg, 1, b"")).decode()
        value = _hparam_value(last_field(eg, 2, b""))
        if key and value is not None:
            hparams[key] = value
    block.events.append(
        (
            "hparams",
            None,
            None,
            wall,
            {"hparams": hparams, "metrics": list(block.hparam_metrics), "metric_values": None},
        )
    )


def decode_event(payload: bytes, block: EventBlock) -> None:
    """Decode one serialized ``tensorflow.Event`` into ``block``.

    Raises:
        DecodeError: the payload is not a well-formed Event (also IndexError/struct.error/
            UnicodeDecodeError from deep inside; :func:`decode_records` turns all into damage).
    """
    pos = 0
    n = len(payload)
    wall = 0.0
    step = 0
    summary = None
    graph_def = None
    what = None
    while pos < n:
        key = payload[pos]
        if key == 0x09:
            wall = _F64.unpack_from(payload, pos + 1)[0]
            pos += 9
        elif key == 0x10:
            step, pos = _varint(payload, pos + 1)
            if step >= 1 << 63:
                step -= 1 << 64
        elif key == 0x2A:
            k, pos = _varint(payload, pos + 1)
            summary = payload[pos : pos + k]
            pos += k
        else:
            key, pos = _varint(payload, pos)
            if key == 0x22:  # graph_def bytes = 4: imported as a graph event (vdl_stream.graphs)
                k, pos = _varint(payload, pos)
                graph_def = payload[pos : pos + k]
                pos += k
                continue
            if key >> 3 == 3:
                what = "file_version"
            elif what is None:
                what = {
                    4: "graph_def",
                    6: "log_message",
                    7: "session_log",
                    8: "tagged_run_metadata",
                    9: "meta_graph_def",
                }.get(key >> 3, f"event field {key >> 3}")
            pos = _skip(payload, pos, key & 7)
    if pos != n:
        raise DecodeError("event truncated")
    if block.first_wall is None or wall < block.first_wall:
        block.first_wall = wall
    if graph_def is not None:
        from .graphs import graphdef_graph

        block.events.append(("graph", "graph", step, wall, graphdef_graph(bytes(graph_def))))
        return
    if summary is None:
        block.skipped[what or "empty event"] += 1
        return
    spos = 0
    sn = len(summary)
    while spos < sn:
        key, spos = _varint(summary, spos)
        if key == 0x0A:
            k, spos = _varint(summary, spos)
            _decode_value(block, summary[spos : spos + k], step, wall)
            spos += k
        else:
            spos = _skip(summary, spos, key & 7)
    if spos != sn:
        raise DecodeError("summary truncated")


_DECODE_ERRORS = (DecodeError, IndexError, struct.error, UnicodeDecodeError, ValueError)


def _bulk_scalars(
    data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode, all at once, the records that are exactly one ``simple_value`` Event.

    That is the layout tensorboardX and TensorFlow 1 write for every ``add_scalar``::

        09 wall(8) 10 step(varint) 2a L1 0a L2 0a T tag(T) 15 value(4)

    with one-byte lengths. Returns ``(ok, tags, tag index, steps, walls, values)`` where ``ok``
    marks the records decoded here; every other record goes through :func:`decode_event`.
    """
    size = len(data)
    ok = (lengths >= 20) & (lengths < 128 + 16)
    at = np.minimum(offsets, size - 1)

    def byte(pos: np.ndarray) -> np.ndarray:
        return data[np.minimum(pos, size - 1)].astype(np.int64)

    ok &= (byte(at) == 0x09) & (byte(at + 9) == 0x10)
    k = np.arange(10)
    vb = data[np.minimum(at[:, None] + 10 + k, size - 1)].astype(np.uint64)
    cont = vb >= 0x80
    ok &= ~cont.all(axis=1)
    vlen = np.argmin(cont, axis=1) + 1
    parts = (vb & np.uint64(0x7F)) << (7 * k).astype(np.uint64)
    parts[k[None, :] >= vlen[:, None]] = 0
    steps = np.bitwise_or.reduce(parts, axis=1).view(np.int64)
    p = at + 10 + vlen
    l1, l2, t = byte(p + 1), byte(p + 3), byte(p + 5)
    ok &= (byte(p) == 0x2A) & (byte(p + 2) == 0x0A) & (byte(p + 4) == 0x0A)
    ok &= (l1 == l2 + 2) & (l2 == t + 7) & (l1 < 0x80) & (t > 0)
    ok &= byte(p + 6 + t) == 0x15
    ok &= p + 2 + l1 == at + lengths
    empty = np.zeros(0, dtype=np.int64)
    if not ok.any():
        return ok, [], empty, empty, np.zeros(0), np.zeros(0)
    sel = np.nonzero(ok)[0]
    at, p, t, steps = at[sel], p[sel], t[sel], steps[sel]
    walls = data[at[:, None] + 1 + np.arange(8)].copy().view("<f8").ravel()
    values = data[(p + 7 + t)[:, None] + np.arange(4)].copy().view("<f4").ravel()
    width = int(t.max())
    keys = np.zeros((len(sel), width + 1), dtype=np.uint8)
    keys[:, 0] = t
    cols = np.arange(width)
    raw = data[np.minimum((p + 6)[:, None] + cols, size - 1)]
    raw[cols[None, :] >= t[:, None]] = 0
    keys[:, 1:] = raw
    uniq, inverse = np.unique(keys.view(f"V{width + 1}").ravel(), return_inverse=True)
    tags = []
    bad = np.zeros(len(uniq), dtype=bool)
    for i, key in enumerate(uniq.tolist()):
        try:
            tags.append(key[1 : 1 + key[0]].decode())
        except UnicodeDecodeError:
            tags.append("")
            bad[i] = True
    if bad.any():  # leave undecodable tags to the record-by-record path, which reports them
        drop = bad[inverse]
        ok[sel[drop]] = False
        keep = ~drop
        inverse, steps, walls, values = inverse[keep], steps[keep], walls[keep], values[keep]
    return ok, tags, inverse, steps, walls, values.astype(np.float64)


def decode_records(
    buf: bytes | mmap.mmap,
    frames: Frames,
    block: EventBlock,
    base: int = 0,
    data: np.ndarray | None = None,
) -> EventBlock:
    """Decode the payloads ``frames`` found in ``buf`` into ``block`` (damage recorded there).

    Plain scalar events are decoded in bulk with numpy; every other record one by one. Points of
    a tag stay in file order either way.
    """
    block.corrupt.extend(frames.corrupt)
    offsets, lengths = frames.offsets, frames.lengths
    if data is None:
        data = np.frombuffer(buf, dtype=np.uint8)
    if len(offsets):
        ok, tags, inverse, steps, walls, values = _bulk_scalars(data, offsets, lengths)
    else:
        ok, tags, inverse = np.zeros(0, dtype=bool), [], np.zeros(0, dtype=np.int64)
    first = block.records
    slow = np.nonzero(~ok)[0]
    for i, o, n in zip(slow.tolist(), offsets[slow].tolist(), lengths[slow].tolist(), strict=True):
        block.index = first + i
        try:
            decode_event(buf[o : o + n], block)
        except _DECODE_ERRORS as exc:
            block.corrupt.append(Corruption(base + o - HEADER, n + HEADER + FOOTER, str(exc)))
    block.records += len(offsets)
    if tags:
        index = first + np.nonzero(ok)[0]
        walls_min = float(walls.min())
        if block.first_wall is None or walls_min < block.first_wall:
            block.first_wall = walls_min
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse, minlength=len(tags)))
        lo = 0
        for tag, hi in zip(tags, bounds.tolist(), strict=True):
            pick = order[lo:hi]
            lo = hi
            if not len(pick):
                continue
            cols = (steps[pick], walls[pick], values[pick])
            if tag in block.scalars:  # merge with points decoded one by one, by record index
                mine = block.scalars[tag]
                at = np.concatenate([index[pick], np.array(block.order[tag], dtype=np.int64)])
                merged = np.argsort(at, kind="stable")
                cols = tuple(
                    np.concatenate([a, np.asarray(b, dtype=a.dtype)])[merged]
                    for a, b in zip(cols, mine, strict=True)
                )
            block.scalars[tag] = cols
            block.order[tag] = []  # (bulk points need no index once merged)
    block.end = base + frames.end
    return block


def read_event_file(path: str | os.PathLike[str], block_records: int = BLOCK_RECORDS) -> Any:
    """Yield :class:`EventBlock` s decoded from a TensorBoard event file, in file order.

    Checksums are verified; damaged records are skipped and listed in ``corrupt``. An incomplete
    record at the end (the file was still being written, or cut off) is reported as a
    :class:`Corruption` with reason ``"truncated record at end of file"``.

    Raises:
        OSError: the file cannot be opened.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            data = np.frombuffer(mm, dtype=np.uint8)
            try:
                pos = 0
                metrics: list[str] = []
                while pos < size:
                    frames = scan_frames(data, pos, max_records=block_records)
                    block = EventBlock(hparam_metrics=metrics)
                    block = decode_records(mm, frames, block, data=data)
                    metrics = block.hparam_metrics
                    if frames.end == pos and not frames.corrupt and not len(frames.offsets):
                        block.corrupt.append(
                            Corruption(pos, size - pos, "truncated record at end of file")
                        )
                        block.end = size
                        yield block
                        break
                    pos = frames.end
                    yield block
            finally:
                del data  # release the buffer before the mmap closes


def is_event_file(name: str) -> bool:
    """Return whether a file name looks like a TensorBoard event file."""
    return "tfevents" in name and not name.endswith((".tmp", ".lock"))
