"""Record payloads: msgpack encoding of events and columnar scalar chunks (no I/O).

Every payload is the msgpack array ``[kind, tag, step, wall, data]``. For ``kind == "scalars"`` the
data is a map of columns (see docs/record-format.md for the encodings); with tag None it is a
*group chunk* holding a few points of each of several tags.
"""

from __future__ import annotations

import math
import struct
from itertools import pairwise
from typing import Any

import msgpack
import numpy as np

from recorder.records import ScalarSeries

SCALARS = "scalars"
MAX_STEP_OFFSET = 0xFFFFFFFF
MAX_WALL_OFFSET_US = 0xFFFFFFFF
_I8 = np.dtype("<i8")
_F8 = np.dtype("<f8")
_U4 = np.dtype("<u4")


class PayloadError(ValueError):
    """A payload passed its checksum but is not a well-formed record."""


def encode_record(kind: str, tag: str | None, step: int | None, wall: float, data: Any) -> bytes:
    """Encode one non-scalar event. Raises TypeError when ``data`` is not msgpack-serialisable."""
    return msgpack.packb([kind, tag, step, wall, data], use_bin_type=True)


def _encode_steps(steps: np.ndarray) -> list:
    n = len(steps)
    first = int(steps[0])
    if n == 1:
        return ["range", first, 0]
    diffs = np.diff(steps)
    stride = int(diffs[0])
    if (diffs == stride).all():
        return ["range", first, stride]
    base = int(steps.min())
    if int(steps.max()) - base <= MAX_STEP_OFFSET:
        return ["u4", base, (steps - base).astype(_U4).tobytes()]
    return ["i8", steps.astype(_I8).tobytes()]


def quantize_walls(walls: np.ndarray) -> np.ndarray:
    """Wall times to the microsecond, as a reader decodes them from ``us`` columns: the float
    nearest to ``k / 1e6`` for the integer ``k = rint(wall * 1e6)``. Writers apply it before
    publishing, so what a browser sees live is bit for bit what it reads back from disk."""
    with np.errstate(over="ignore"):
        quantized = walls * 1e6
    np.rint(quantized, out=quantized)
    quantized /= 1e6
    quantized += 0.0  # -0.0 becomes 0.0, as a decoded ``us`` column gives it
    if not np.isfinite(quantized).all():  # beyond 1.8e302 s: no microseconds to take
        quantized = np.where(np.isfinite(quantized), quantized, walls)
    return quantized


def encode_us(walls: np.ndarray, base: float) -> np.ndarray:
    """The ``us`` offsets of finite ``walls`` from ``base`` (their minimum): whole microseconds,
    as differences of integers (exact in float64), so that :func:`decode_us` gives
    :func:`quantize_walls` of each wall whatever ``base`` is."""
    offsets = np.rint(walls * 1e6)
    offsets -= np.rint(base * 1e6)
    return offsets


def decode_us(
    offsets: bytes | memoryview, base: float, out: np.ndarray | None = None
) -> np.ndarray:
    """Wall times from a ``us`` column (``<u4`` microseconds after ``base``), into ``out`` if
    given: ``(rint(base * 1e6) + offset) / 1e6``, which is :func:`quantize_walls` of the walls
    written (files written before this rule read within a microsecond of what they read before)."""
    walls = np.add(
        np.frombuffer(offsets, dtype=_U4), np.rint(base * 1e6), out=out, dtype=np.float64
    )
    walls /= 1e6
    return walls


#: Wall times at or beyond this many seconds (the year 2112) are kept as f8: their microseconds
#: are no longer exact integers in a float64, so ``us`` offsets could not give them back exactly.
MAX_US_WALL = 2.0**52 / 1e6


def _encode_walls(walls: np.ndarray) -> list:
    # The extremes decide it all (NaN propagates through min and max; the largest magnitude is
    # one of them; rint is monotonic, so the largest offset is the largest wall's): two
    # reductions and no temporary array besides the offsets.
    lo, hi = walls.min(), walls.max()
    if math.isfinite(lo) and math.isfinite(hi) and max(-lo, hi) < MAX_US_WALL:
        base = float(lo)
        top = np.rint(hi * 1e6) - np.rint(base * 1e6)
        if top <= MAX_WALL_OFFSET_US:
            return ["us", base, encode_us(walls, base).astype(_U4).tobytes()]
    return ["f8", walls.astype(_F8).tobytes()]


def scalar_summary(
    steps: np.ndarray, values: np.ndarray
) -> tuple[int, int, float | None, float | None]:
    """``(step min, step max, finite value min, finite value max)`` of a non-empty chunk."""
    lo, hi = values.min(), values.max()
    if math.isfinite(lo) and math.isfinite(hi) and lo and hi:
        # Every value finite (NaN propagates through min and max): no filtered copy. A zero
        # extreme goes the long way, as before: with both signed zeros, which one NumPy gives
        # may depend on the array it reduces.
        return int(steps.min()), int(steps.max()), float(lo), float(hi)
    finite = values[np.isfinite(values)]
    vmin = float(finite.min()) if len(finite) else None
    vmax = float(finite.max()) if len(finite) else None
    return int(steps.min()), int(steps.max()), vmin, vmax


def scalar_data(steps: np.ndarray, walls: np.ndarray, values: np.ndarray) -> dict:
    """The column map of a chunk of ``steps``, ``walls``, ``values`` (not packed)."""
    smin, smax, vmin, vmax = scalar_summary(steps, values)
    return {
        "n": len(steps),
        "smin": smin,
        "smax": smax,
        "vmin": vmin,
        "vmax": vmax,
        "s": _encode_steps(steps),
        "w": _encode_walls(walls),
        "v": values.astype(_F8).tobytes(),
    }


def encode_ints(values: np.ndarray) -> list:
    """A column of integers (origins, counts) in the smallest encoding: ``range``, ``d2``
    (non-decreasing, consecutive differences below 2^16: ``["d2", first, u16 differences]``),
    ``u4`` or ``i8``."""
    if len(values) > 2:
        diffs = np.diff(values)
        if diffs.min() >= 0 and diffs.max() <= 0xFFFF and not (diffs == diffs[0]).all():
            return ["d2", int(values[0]), diffs.astype("<u2").tobytes()]
    return _encode_steps(np.asarray(values, dtype=np.int64))


def decode_ints(enc: list, n: int) -> np.ndarray:
    """Inverse of :func:`encode_ints` (``n`` values).

    Raises:
        PayloadError: an unknown encoding or the wrong length.
    """
    try:
        if enc[0] == "d2":
            out = np.empty(n, np.int64)
            out[0] = enc[1]
            np.cumsum(np.frombuffer(enc[2], dtype="<u2"), out=out[1:])
            out[1:] += enc[1]
        else:
            out = _decode_steps(enc, n)
    except (ValueError, TypeError, IndexError) as exc:
        raise PayloadError(f"integer column is malformed: {exc}") from None
    if len(out) != n:
        raise PayloadError("integer column has the wrong length")
    return out


def _pack(record: list, points: int) -> memoryview:
    """msgpack ``record`` (a chunk of ``points`` points) and return a view of msgpack's own
    buffer: ``packb`` would copy the payload once more, into a ``bytes``. The buffer is sized
    for the chunk up front, so it does not grow by copies either."""
    packer = msgpack.Packer(use_bin_type=True, autoreset=False, buf_size=24 * points + 1024)
    packer.pack(record)
    return packer.getbuffer()


def bytes_view(column: np.ndarray, dtype: Any = _F8) -> memoryview:
    """A column's bytes as ``dtype`` (``<f8`` by default), for msgpack to copy straight into
    its payload or frame: no ``tobytes`` copy first, and no conversion when the column already
    has that type."""
    return memoryview(np.ascontiguousarray(column, dtype=dtype)).cast("B")


def encode_scalars(
    tag: str, steps: np.ndarray, walls: np.ndarray, values: np.ndarray
) -> tuple[memoryview, tuple[int, int, float | None, float | None]]:
    """Encode one non-empty columnar chunk of a tag's scalar points (int64, float64, float64).

    Returns the payload (a view of the encoder's buffer, bytes-like) and the chunk's
    :func:`scalar_summary`.
    """
    summary = smin, smax, vmin, vmax = scalar_summary(steps, values)
    data = {
        "n": len(steps),
        "smin": smin,
        "smax": smax,
        "vmin": vmin,
        "vmax": vmax,
        "s": _encode_steps(steps),
        "w": _encode_walls(walls),
        "v": bytes_view(values),
    }
    payload = _pack([SCALARS, tag, int(steps[0]), float(walls[0]), data], len(steps))
    return payload, summary


def encode_group(
    parts: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[memoryview, tuple[int, int, float | None, float | None], list]:
    """Encode the points of several tags, each few, as one *group chunk* (tag None).

    The points are stored tag-major: part ``i`` is the ``counts[i]`` points after those of the
    parts before it. Returns the payload, the summary over all points (as :func:`scalar_summary`)
    and the part columns (see :func:`group_parts`).
    """
    series = ScalarSeries(*(np.concatenate([p[i] for p in parts]) for i in (1, 2, 3)))
    return encode_group_series([p[0] for p in parts], [len(p[1]) for p in parts], series)


def encode_group_series(
    tags: list[str], counts: list[int], series: ScalarSeries
) -> tuple[memoryview, tuple[int, int, float | None, float | None], list]:
    """:func:`encode_group` of parts already concatenated: ``counts[i]`` points of ``tags[i]``."""
    steps, walls, values = series
    summary = scalar_summary(steps, values)
    payload, data = _pack_group(
        summary,
        tags,
        counts,
        _encode_group_steps(steps, np.asarray(counts)),
        _encode_walls(walls),
        values,
        (int(steps[0]), float(walls[0])),
    )
    return payload, summary, group_parts(data["tags"], data["c"], series)


def _pack_group(
    summary: tuple[int, int, float | None, float | None],
    tags: list[str],
    counts: list[int],
    enc_steps: list,
    enc_walls: list,
    values: np.ndarray,
    first: tuple[int, float],
) -> tuple[memoryview, dict[str, Any]]:
    """A group chunk's payload from its encoded columns (the one layout both group encoders
    write, docs/record-format.md), and its data map."""
    smin, smax, vmin, vmax = summary
    n = len(values)
    data = {
        "n": n,
        "smin": smin,
        "smax": smax,
        "vmin": vmin,
        "vmax": vmax,
        "tags": list(tags),
        "c": list(counts),
        "s": enc_steps,
        "w": enc_walls,
        "v": bytes_view(values),
    }
    return _pack([SCALARS, None, first[0], first[1], data], n), data


def _encode_group_steps(steps: np.ndarray, counts: np.ndarray) -> list:
    """Steps of a group: ``["ranges", firsts, strides]`` when every part is an arithmetic
    progression and that is smaller than 4 bytes a point, else as :func:`_encode_steps`."""
    n = len(steps)
    starts = np.cumsum(counts) - counts
    if 6 * len(counts) < 4 * n:
        diffs = np.diff(steps)
        strides = np.zeros(len(counts), np.int64)
        multi = counts > 1
        strides[multi] = diffs[starts[multi]]
        inside = np.ones(n - 1, bool)
        inside[starts[1:] - 1] = False
        if (diffs[inside] == np.repeat(strides, counts)[1:][inside]).all():
            return ["ranges", steps[starts].tolist(), strides.tolist()]
    return _encode_steps(steps)


#: Points of a group chunk up to which :func:`encode_small_group` encodes it with Python's own
#: numbers: for a few points NumPy's fixed cost per call (about 0.5-1 us, some 40 calls a chunk)
#: is all of the work.
SMALL_GROUP_POINTS = 64
#: Steps within this bound cannot overflow int64 when subtracted, so differences taken with
#: Python's integers equal NumPy's (which wrap beyond it: left to the NumPy path).
_SAFE_STEP = 1 << 62


def _mixed_zeros(xs: list[float]) -> bool:
    """Whether ``xs`` holds both ``0.0`` and ``-0.0``: NumPy's min and max may give either of
    them, so a chunk holding both is left to NumPy, whose answer the files already hold."""
    signs = {math.copysign(1.0, x) for x in xs if x == 0.0}
    return len(signs) > 1


def encode_small_group(
    tags: list[str], counts: list[int], series: ScalarSeries
) -> tuple[memoryview, tuple[int, int, float | None, float | None], list, tuple] | None:
    """:func:`encode_group_series` of a chunk of a few points (:data:`SMALL_GROUP_POINTS`),
    computed on Python lists, byte for byte the same payload and part columns (as lists rather
    than arrays: the index writes them the same).

    Returns ``(payload, summary, parts, lists)``, ``lists`` being ``(steps, walls, values)`` as
    Python lists (for the digest), or None where NumPy must decide: steps beyond
    ``+-2**62`` (NumPy's differences wrap) or a column holding both signed zeros.
    """
    steps_arr, walls_arr, values_arr = series
    steps, walls, values = steps_arr.tolist(), walls_arr.tolist(), values_arr.tolist()
    n = len(steps)
    smin, smax = min(steps), max(steps)
    if smin < -_SAFE_STEP or smax >= _SAFE_STEP:
        return None
    if (0.0 in values and _mixed_zeros(values)) or (0.0 in walls and _mixed_zeros(walls)):
        return None
    isfinite = math.isfinite
    finite = values if all(map(isfinite, values)) else [x for x in values if isfinite(x)]
    vmin = min(finite) if finite else None
    vmax = max(finite) if finite else None
    # The part columns (group_parts), and whether every part is an arithmetic progression.
    nan = math.nan
    if len(counts) == n:  # a point a part (a live batch): the columns are the points
        firsts = smins = smaxs = steps
        first_walls = walls
        los = his = values if finite is values else [x if isfinite(x) else nan for x in values]
        strides = [0] * n
        progressions = True
    else:
        firsts, first_walls, smins, smaxs, los, his, strides = [], [], [], [], [], [], []
        progressions = True
        start = 0
        for count in counts:
            end = start + count
            part = steps[start:end]
            firsts.append(part[0])
            first_walls.append(walls[start])
            smins.append(min(part))
            smaxs.append(max(part))
            stride = part[1] - part[0] if count > 1 else 0
            strides.append(stride)
            if progressions and count > 2:
                progressions = all(b - a == stride for a, b in pairwise(part))
            vs = [x for x in values[start:end] if isfinite(x)]
            los.append(min(vs) if vs else nan)
            his.append(max(vs) if vs else nan)
            start = end
    if 6 * len(firsts) < 4 * n and progressions:
        enc_steps: list = ["ranges", firsts, strides]
    elif n == 1:
        enc_steps = ["range", steps[0], 0]
    else:
        stride = steps[1] - steps[0]
        if all(b - a == stride for a, b in pairwise(steps)):
            enc_steps = ["range", steps[0], stride]
        elif smax - smin <= MAX_STEP_OFFSET:
            enc_steps = ["u4", smin, struct.pack(f"<{n}I", *[s - smin for s in steps])]
        else:
            enc_steps = ["i8", steps_arr.astype(_I8).tobytes()]
    enc_walls: list | None = None
    if all(map(isfinite, walls)) and max(map(abs, walls)) < MAX_US_WALL:
        base = min(walls)
        # round() is NumPy's rint (half to even), on integers exact in a float64 here.
        at = round(base * 1e6)
        offsets = [round(w * 1e6) - at for w in walls]
        if max(offsets) <= MAX_WALL_OFFSET_US:
            enc_walls = ["us", base, struct.pack(f"<{n}I", *offsets)]
    if enc_walls is None:
        enc_walls = ["f8", walls_arr.astype(_F8).tobytes()]
    payload, data = _pack_group(
        (smin, smax, vmin, vmax),
        tags,
        counts,
        enc_steps,
        enc_walls,
        values_arr,
        (steps[0], walls[0]),
    )
    parts = [data["tags"], data["c"], firsts, first_walls, smins, smaxs, los, his]
    return payload, (smin, smax, vmin, vmax), parts, (steps, walls, values)


def group_parts(tags: list[str], counts: list[int], series: ScalarSeries) -> list:
    """The part columns of a group chunk, from its decoded points.

    Returns ``[tags, counts, first steps, first walls, step mins, step maxes, value mins, value
    maxes]``: a list of str and NumPy arrays, one element per part (value extremes over finite
    values, NaN when a part has none).
    """
    counts_arr = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(counts_arr) - counts_arr
    steps, walls, values = series
    finite = np.isfinite(values)
    lo = np.minimum.reduceat(np.where(finite, values, np.inf), starts)
    hi = np.maximum.reduceat(np.where(finite, values, -np.inf), starts)
    lo[lo == np.inf] = np.nan
    hi[hi == -np.inf] = np.nan
    return [
        list(tags),
        counts_arr,
        steps[starts],
        walls[starts],
        np.minimum.reduceat(steps, starts),
        np.maximum.reduceat(steps, starts),
        lo,
        hi,
    ]


def decode_payload(payload: bytes | memoryview) -> tuple[str, str | None, int | None, float, Any]:
    """Decode a payload into ``(kind, tag, step, wall, data)``; scalar data stays encoded.

    Raises:
        PayloadError: the payload is not a well-formed record.
    """
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise PayloadError(f"payload is not valid msgpack: {exc}") from None
    if not isinstance(obj, list) or len(obj) != 5:
        raise PayloadError("payload is not a 5-element array")
    kind, tag, step, wall, data = obj
    if (
        not isinstance(kind, str)
        or not (tag is None or isinstance(tag, str))
        or not (step is None or isinstance(step, int))
        or not isinstance(wall, (int, float))
    ):
        raise PayloadError("payload fields have the wrong types")
    if kind == SCALARS:
        _check_scalar_data(data, group=tag is None)
    return kind, tag, step, float(wall), data


def _check_scalar_data(data: Any, group: bool) -> None:
    try:
        n = data["n"]
        if group:
            tags, counts = data["tags"], data["c"]
            if not (
                isinstance(tags, list)
                and isinstance(counts, list)
                and len(tags) == len(counts) > 0
                and all(isinstance(t, str) and t for t in tags)
                and all(isinstance(c, int) and c > 0 for c in counts)
                and sum(counts) == n
            ):
                raise PayloadError("group chunk parts are malformed")
        ok = (
            isinstance(n, int)
            and n > 0
            and isinstance(data["smin"], int)
            and isinstance(data["smax"], int)
            and isinstance(data["v"], bytes)
            and len(data["v"]) == 8 * n
            and isinstance(data["s"], list)
            and isinstance(data["w"], list)
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise PayloadError("scalar chunk is malformed")


def decode_scalars(data: dict, at: np.ndarray | None = None) -> ScalarSeries:
    """Turn the column map of a scalar chunk into arrays.

    Args:
        data: the chunk's column map.
        at: only the points at these indices (ascending, each below ``data["n"]``), decoding
            the steps and walls of those points alone; the arrays are then new (never views of
            ``data``), and equal, bit for bit, to the full decode's at ``at``.

    Raises:
        PayloadError: a column has an unknown encoding or the wrong length.
    """
    n = data["n"]
    if at is not None:
        return _decode_scalars_at(data, n, at)
    try:
        steps = _decode_steps(data["s"], n, data.get("c"))
        walls = _decode_walls(data["w"], n)
        values = np.frombuffer(data["v"], dtype=_F8)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise PayloadError(f"scalar chunk is malformed: {exc}") from None
    if len(steps) != n or len(walls) != n or len(values) != n:
        raise PayloadError("scalar chunk columns have different lengths")
    return ScalarSeries(steps, walls, values)


def scalar_values(data: dict) -> np.ndarray:
    """The value column of a scalar chunk's column map (a read-only view of its bytes).

    Raises:
        PayloadError: the column is missing or has the wrong length.
    """
    try:
        values = np.frombuffer(data["v"], dtype=_F8)
        ok = len(values) == data["n"]
    except (ValueError, TypeError, KeyError) as exc:
        raise PayloadError(f"scalar chunk is malformed: {exc}") from None
    if not ok:
        raise PayloadError("scalar chunk columns have different lengths")
    return values


def _decode_scalars_at(data: dict, n: int, at: np.ndarray) -> ScalarSeries:
    """:func:`decode_scalars` at the indices ``at`` only (the same arithmetic per point)."""
    try:
        s, w = data["s"], data["w"]
        if s[0] == "range" and len(s) == 3:
            steps = s[1] + s[2] * at.astype(np.int64)
        elif s[0] == "u4" and len(s[2]) == 4 * n:
            steps = np.frombuffer(s[2], dtype=_U4)[at].astype(np.int64) + s[1]
        elif s[0] == "i8" and len(s[1]) == 8 * n:
            steps = np.frombuffer(s[1], dtype=_I8)[at]
        else:  # "ranges" (group parts), or a malformed column: decoded whole
            steps = _decode_steps(s, n, data.get("c"))
            if len(steps) != n:
                raise ValueError("the step column has the wrong length")
            steps = steps[at]
        if w[0] == "us" and len(w[2]) == 4 * n:
            walls = np.add(
                np.frombuffer(w[2], dtype=_U4)[at], np.rint(w[1] * 1e6), dtype=np.float64
            )
            walls /= 1e6
        elif w[0] == "f8" and len(w[1]) == 8 * n:
            walls = np.frombuffer(w[1], dtype=_F8)[at]
        else:
            raise ValueError("the wall column is malformed")
        values = scalar_values(data)[at]  # (checks the column's length)
    except PayloadError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise PayloadError(f"scalar chunk is malformed: {exc}") from None
    return ScalarSeries(steps, walls, values)


def decode_scalars_into(
    data: dict, steps: np.ndarray, walls: np.ndarray, values: np.ndarray
) -> None:
    """Decode the column map of a scalar chunk into the given arrays of length ``data["n"]``.

    Writing straight into a caller's buffer saves a copy when many chunks make one series.

    Raises:
        PayloadError: a column has an unknown encoding or the wrong length (nothing is written).
    """
    n = data["n"]
    s, w = data["s"], data["w"]
    try:
        sizes_ok = (
            (s[0] == "range" and len(s) == 3)
            or (s[0] == "ranges" and len(s[1]) == len(s[2]) == len(data["c"]))
            or (s[0] == "u4" and len(s[2]) == 4 * n)
            or (s[0] == "i8" and len(s[1]) == 8 * n)
        ) and ((w[0] == "us" and len(w[2]) == 4 * n) or (w[0] == "f8" and len(w[1]) == 8 * n))
    except (TypeError, IndexError, KeyError):
        sizes_ok = False
    if not sizes_ok:
        raise PayloadError("scalar chunk columns are malformed")
    if s[0] == "ranges":
        steps[:] = _decode_ranges(s, data.get("c"), n)
    elif s[0] == "range":
        np.multiply(np.arange(n, dtype=np.int64), s[2], out=steps)
        steps += s[1]
    elif s[0] == "u4":
        np.add(np.frombuffer(s[2], dtype=_U4), s[1], out=steps, dtype=np.int64)
    else:
        steps[:] = np.frombuffer(s[1], dtype=_I8)
    if w[0] == "us":
        decode_us(w[2], w[1], out=walls)
    else:
        walls[:] = np.frombuffer(w[1], dtype=_F8)
    values[:] = np.frombuffer(data["v"], dtype=_F8)


def _decode_ranges(enc: list, counts: list | None, n: int) -> np.ndarray:
    if counts is None or len(enc[1]) != len(counts) or len(enc[2]) != len(counts):
        raise ValueError("ranges do not match the parts")
    counts_arr = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(counts_arr) - counts_arr
    firsts = np.asarray(enc[1], dtype=np.int64)
    strides = np.asarray(enc[2], dtype=np.int64)
    per_point = np.repeat(strides, counts_arr)
    return np.repeat(firsts - strides * starts, counts_arr) + per_point * np.arange(n)


def _decode_steps(enc: list, n: int, counts: list | None = None) -> np.ndarray:
    if enc[0] == "ranges":
        return _decode_ranges(enc, counts, n)
    if enc[0] == "range":
        return enc[1] + enc[2] * np.arange(n, dtype=np.int64)
    if enc[0] == "u4":
        return np.frombuffer(enc[2], dtype=_U4).astype(np.int64) + enc[1]
    if enc[0] == "i8":
        return np.frombuffer(enc[1], dtype=_I8)
    raise ValueError(f"unknown step encoding {enc[0]!r}")


def _decode_walls(enc: list, n: int) -> np.ndarray:
    if enc[0] == "us":
        return decode_us(enc[2], enc[1])
    if enc[0] == "f8":
        return np.frombuffer(enc[1], dtype=_F8)
    raise ValueError(f"unknown wall encoding {enc[0]!r}")
