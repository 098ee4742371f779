"""TFRecord files, as TensorBoard writes its event files: framing with masked CRC-32C.

A TFRecord file is a sequence of records, each::

    length      u64 little-endian
    length_crc  u32 little-endian   masked CRC-32C of the 8 length bytes
    payload     length bytes        one serialized message (a tensorflow.Event in event files)
    data_crc    u32 little-endian   masked CRC-32C of the payload

where ``masked(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2**32)``. CRCs are checked for many
records at once (:func:`crc32c_many`): with google-crc32c's C code for records of 16 bytes and more,
with numpy for the 8-byte lengths (and for everything where google-crc32c is not installed).
I/O-free: functions over bytes and numpy arrays. The messages inside are vdl_stream.protowire's and
vdl_stream.tfevents' business.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Records framed per block (at most): what a reader decodes at once.
BLOCK_RECORDS = 65536
#: Payload bytes per block (at most; one larger record gets a block of its own).
BLOCK_BYTES = 16 << 20
#: Records longer than this are refused as damage (TensorBoard's own limit is far lower in practice).
MAX_RECORD = 1 << 31
HEADER = 12  # length u64 + length crc u32
FOOTER = 4

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
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
