"""Event builders for the non-scalar kinds: validate the arguments, return a msgpack-native map.

Plain functions with no I/O, shared by :class:`vdl_stream.Writer` and the drop-in facades in
``compat.py``. Each returns a map with the common keys of docs/protocol.md (``kind``, ``tag``,
``step``, ``wall``) plus the kind's own keys, documented in docs/guide.md. Values are only str, int,
float, bool, None, bytes, lists and maps; numeric arrays travel as little-endian ``<f8`` bytes.

Every function raises ``TypeError``/``ValueError`` naming the bad argument, so a mistake surfaces at
the call site in the training loop and never later in the background thread.
"""

from __future__ import annotations

import io
import math
import operator
import struct
import threading
import wave
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import codec

#: Most buckets a histogram may have.
MAX_BUCKETS = 10_000
#: Most thresholds a PR or ROC curve may have.
MAX_THRESHOLDS = 10_000
#: Largest encoded payload (PNG, WAV, text) of one event, so every event fits a wire frame.
MAX_PAYLOAD_BYTES = codec.MAX_FRAME_BYTES // 2
#: The dataformats an image may be given in, as letters (any order of them is accepted).
IMAGE_FORMATS = ("HW", "HWC", "CHW", "NHWC", "NCHW")
#: Most values (pixels times channels) of an image, checked before it is converted or encoded.
MAX_IMAGE_VALUES = 4 * MAX_PAYLOAD_BYTES
#: Images of a batch per row of the tiled grid, as tensorboardX's make_grid.
GRID_COLUMNS = 8

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOR_TYPE = {1: 0, 3: 2, 4: 6}  # channels -> grey, RGB, RGBA
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1
_FLOAT_MAX = float(np.finfo(np.float64).max)
#: Histograms of at most this many bins compute their edges in Python floats (fewer calls).
_FEW_EDGES = 64
#: Below this magnitude neither the sum nor the sum of squares of any array numpy can hold
#: overflows a float64, so histograms of such values skip numpy's error-state context.
_NO_OVERFLOW = 1e100
_MINIMUM_COUNT = 1e-7  # keeps precision/recall finite on empty buckets, as TensorBoard does


# -- shared checks ------------------------------------------------------------------------------


def to_float(value: object, name: str = "value") -> float:
    """Convert a Python/numpy number or a one-element tensor-like to ``float``.

    Accepts anything with ``.item()`` (numpy, torch, paddle, jax scalars and one-element arrays)
    or ``__float__``, without importing any framework. NaN and ±Inf pass.

    Raises:
        TypeError: not a real number (``name`` and the type are in the message).
        ValueError: an int too large for a float64.
    """
    try:
        if hasattr(value, "item"):
            value = value.item()  # type: ignore[union-attr]
        if isinstance(value, (str, bytes)):
            raise TypeError
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        raise ValueError(f"{name} must fit in a float64, got {value!r:.40}") from None
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a real number or a one-element tensor, "
            f"got {type(value).__name__} {_short(value)}"
        ) from None


def _short(value: object) -> str:
    """``repr(value)`` cut to 40 characters, never failing (the value may be anything)."""
    try:
        text = repr(value)
    except Exception:
        return "(unprintable)"
    return text if len(text) <= 40 else text[:37] + "..."


#: Steps are stored as int64.
STEP_MIN, STEP_MAX = -(1 << 63), (1 << 63) - 1


def to_step(step: object, name: str = "step") -> int:
    """Return an integer step (Python/numpy int, one-element integer tensor) as an int64-range ``int``.

    Floats are refused, even integral ones such as ``1.0``: a step computed in floating point is
    refused at its first call rather than at the first one that happens not to be whole. ``bool``
    is refused too. Anything with ``.item()`` is unwrapped first, then taken through ``__index__``.

    Raises:
        TypeError: not an integer (``name``, the type and the value are in the message).
        ValueError: outside the int64 range.
    """
    original = step
    if hasattr(step, "item"):
        try:
            step = step.item()  # type: ignore[union-attr]
        except (TypeError, ValueError):  # a tensor of several elements
            step = original
    if type(step) is not int:
        try:
            if isinstance(step, bool):
                raise TypeError
            step = operator.index(step)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"{name} must be an int, got {type(original).__name__} {_short(original)}"
            ) from None
    if not STEP_MIN <= step <= STEP_MAX:  # type: ignore[operator]
        raise ValueError(f"{name} must be in the int64 range [-2**63, 2**63 - 1], got {step}")
    return int(step)  # an int subclass becomes a plain int for msgpack


def check_str(value: object, name: str) -> str:
    """Return ``value`` as a plain ``str`` if it is a str that UTF-8 can encode, else raise.

    Raises:
        TypeError: not a str; ValueError: it holds a lone surrogate (``"a\\ud800b"``), which no
        encoding on the wire or on disk can carry.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r:.40}")
    value = str(value)  # a str subclass becomes a plain str for msgpack
    if not value.isascii() and not codec._encodable(value):
        raise ValueError(
            f"{name} must be encodable as UTF-8 (no lone surrogates), got {value!r:.80}"
        )
    return value


def to_array(values: object, name: str = "values") -> np.ndarray:
    """Convert an array-like or tensor (numpy, torch, paddle, jax) of real numbers to float64.

    Raises:
        TypeError: not an array of real numbers (strings, objects, complex numbers are refused).
        ValueError: numbers too large for a float64.
    """
    arr = as_numpy(values, name)
    try:
        return arr.astype(np.float64, copy=False)
    except OverflowError:
        raise ValueError(f"{name} must hold numbers that fit in a float64") from None


def _common(kind: str, tag: str | None, step: int | None, wall: float) -> dict[str, Any]:
    return {"kind": kind, "tag": tag, "step": step, "wall": wall}


def check_wall(wall: object, name: str = "walltime") -> float:
    """Return ``wall`` as a finite float of seconds since the epoch, else raise naming ``name``."""
    value = to_float(wall, name)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    return value


def _step(step: object, optional: bool = False) -> int | None:
    if step is None and optional:
        return None
    return to_step(step)


def _positive_int(value: object, name: str, limit: int, least: int = 1) -> int:
    if hasattr(value, "item") and not isinstance(value, bool):
        value = value.item()  # numpy integer
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.40}")
    if not least <= value <= limit:
        raise ValueError(f"{name} must be from {least} to {limit}, got {value}")
    return value


def as_numpy(value: object, name: str) -> np.ndarray:
    """Return an array-like or tensor (numpy, torch, paddle, jax) as a numpy array, keeping its dtype.

    Raises:
        TypeError: ``value`` is not an array of real numbers (named ``name`` in the message).
    """
    if type(value) is np.ndarray and value.dtype.kind in "buif":
        return value  # the common case, without the framework probes (each a failed lookup)
    original = type(value).__name__
    if hasattr(value, "detach"):  # torch: leave the autograd graph and the device
        value = value.detach()
    if hasattr(value, "cpu"):
        value = value.cpu()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        arr = None
    if arr is None or arr.dtype.kind not in "buif":
        raise TypeError(f"{name} must be an array of numbers or a tensor, got {original}")
    return arr


def _f8(arr: np.ndarray) -> bytes:
    return np.ascontiguousarray(arr, dtype="<f8").tobytes()


# -- histogram ----------------------------------------------------------------------------------


def histogram_event(
    tag: str, values: Any, step: int, wall: float, buckets: int = 10
) -> dict[str, Any]:
    """Build a ``histogram`` event: the distribution of ``values`` in ``buckets`` equal bins.

    The bins span the finite values' range (a single value ``v`` gets the range ``v ± 0.5``, as
    ``np.histogram``). NaN and ±Inf are counted in ``nan`` and ``inf`` and left out of the bins and
    of ``min``/``max``/``sum``/``sum_sq``. A value within rounding of an inner edge may be counted in
    the neighbouring bin (the price of a histogram several times faster than ``np.histogram``).

    Args:
        tag: the tag (see :func:`vdl_stream.codec.check_tag`).
        values: any array-like or tensor of numbers, of any shape (flattened).
        step: the training step.
        wall: seconds since the epoch.
        buckets: the number of bins, 1 to :data:`MAX_BUCKETS`.

    Returns:
        The event map with ``edges`` (``<f8`` bytes, ``buckets + 1``), ``counts`` (``<f8`` bytes,
        ``buckets``), ``num``, ``nan``, ``inf``, ``min``, ``max`` (None without finite values),
        ``sum`` and ``sum_sq``.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    event, arr, n = histogram_call(tag, values, step, wall, buckets, copy=False)
    event.update(bin_histogram(arr, n))
    return event


def histogram_call(
    tag: str, values: Any, step: int, wall: float, buckets: int = 10, *, copy: bool = True
) -> tuple[dict[str, Any], np.ndarray, int]:
    """Check a histogram call as :func:`histogram_event` does, leaving the binning for later.

    Returns the event without its bins, the values (a private copy when ``copy``: the caller
    may change its array once the call returned) and the number of bins; :func:`bin_histogram`
    makes the bins. So the writer's hot path pays a copy, and its background thread the binning.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    codec.check_tag(tag)
    # The common types pass without the general conversions (a hot path: the writer's
    # add_histogram); anything else takes them, with their messages.
    if type(step) is not int or not STEP_MIN <= step <= STEP_MAX:
        step = to_step(step)
    if type(wall) is not float or wall - wall != 0.0:  # not finite: NaN, ±Inf
        wall = check_wall(wall)
    if type(buckets) is int and 1 <= buckets <= MAX_BUCKETS:
        n = buckets
    else:
        n = _positive_int(buckets, "buckets", MAX_BUCKETS)
    arr = as_numpy(values, "values")
    event = {"kind": "histogram", "tag": tag, "step": step, "wall": wall}
    return event, (arr.copy() if copy else arr), n


def bin_histogram(values: np.ndarray, buckets: int) -> dict[str, Any]:
    """The bins and statistics of a checked :func:`histogram_call` (never raises for one)."""
    return _histogram(values.reshape(-1), buckets)


def _empty_histogram(n: int, num: int, nan: int, inf: int) -> dict[str, Any]:
    return {
        "edges": bytes(8 * (n + 1)),
        "counts": bytes(8 * n),
        "num": num,
        "nan": nan,
        "inf": inf,
        "min": None,
        "max": None,
        "sum": 0.0,
        "sum_sq": 0.0,
    }


def _histogram(arr: np.ndarray, n: int) -> dict[str, Any]:
    """Bin a flat array of any numeric dtype as float64 values (see :func:`histogram_event`)."""
    num = int(arr.size)
    nan = inf = 0
    if not num:
        return _empty_histogram(n, num, nan, inf)
    # In the array's own dtype (no float64 copy of it): every numeric value converts to the
    # float64 that astype gives, and that conversion keeps order, so these are its min and max.
    # The ufuncs themselves: ndarray.min and .max are Python wrappers around them (a
    # microsecond of the dozen numpy calls' overhead that a histogram's binning is made of).
    # "+ 0.0" makes a zero +0.0: which of -0.0 and 0.0 min and max give depends on the dtype's
    # loop (float16's and float64's differ), and the record must not.
    lo, hi = float(_MIN(arr)) + 0.0, float(_MAX(arr)) + 0.0
    if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN poisons min and max
        arr = arr.astype(np.float64, copy=False)
        finite_mask = np.isfinite(arr)
        nan = int(np.isnan(arr).sum())
        inf = num - nan - int(finite_mask.sum())
        arr = arr[finite_mask]
        if not arr.size:
            return _empty_histogram(n, num, nan, inf)
        lo, hi = float(_MIN(arr)) + 0.0, float(_MAX(arr)) + 0.0
    vmin, vmax = lo, hi
    if not math.isfinite(n / (hi - lo) if hi > lo else math.inf):
        # One value, or a range too narrow for distinct edges: ±0.5 as numpy (relatively more
        # for values beyond 1e8, where ±0.5 would round away).
        pad = max(0.5, abs(lo) * 1e-9, abs(hi) * 1e-9)
        lo, hi = max(lo - pad, -_FLOAT_MAX), min(hi + pad, _FLOAT_MAX)
    if math.isfinite(hi - lo):
        safe = max(-vmin, vmax) < _NO_OVERFLOW  # (the wide range below always sets errstate)
        counts, total, total_sq = _count(arr, lo, n / (hi - lo), n, safe)
        edge_bytes = _edge_bytes(lo, hi, n)
        count_bytes = _count_bytes(counts, n)
    else:  # the range overflows a float64 (values near ±1.8e308): interpolate, then search
        arr = arr.astype(np.float64, copy=False)
        t = np.arange(n + 1) / n
        edges = lo * (1 - t) + hi * t
        edges[n] = hi
        edge_bytes = _f8(edges)
        index = np.searchsorted(edges, arr, side="right") - 1
        counts = np.bincount(np.clip(index, 0, n - 1), minlength=n)
        with np.errstate(over="ignore"):  # a sum past 1.8e308 is recorded as inf
            total, total_sq = float(np.add.reduce(arr)), float(np.add.reduce(arr * arr))
        count_bytes = _f8(counts[:n])
    return {
        "edges": edge_bytes,
        "counts": count_bytes,
        "num": num,
        "nan": nan,
        "inf": inf,
        "min": vmin,
        "max": vmax,
        "sum": total,
        "sum_sq": total_sq,
    }


_MIN, _MAX = np.minimum.reduce, np.maximum.reduce


def _count_bytes(counts: np.ndarray, n: int) -> bytes:
    """The ``n`` bins' counts as ``<f8`` bytes, from ``counts`` of ``n + 1`` bins: the last
    (where the maximum lands) is added to bin ``n - 1``, the closed last bin. Up to
    ``_FEW_EDGES`` bins through Python ints and ``struct`` (the same doubles: every count is
    below 2**53), without the four numpy calls of an add, a slice and a conversion."""
    if n <= _FEW_EDGES:
        c = counts.tolist()
        c[n - 1] += c[n]
        return struct.pack(f"<{n}d", *c[:n])
    counts[n - 1] += counts[n]
    return _f8(counts[:n])


def _edge_bytes(lo: float, hi: float, n: int) -> bytes:
    """The ``n + 1`` edges of equal bins from ``lo`` to ``hi`` (a finite ``hi - lo``), as
    ``<f8`` bytes."""
    step = (hi - lo) / n
    if n <= _FEW_EDGES:  # the same float operations as below, without four numpy calls
        return struct.pack(f"<{n + 1}d", *[i * step + lo for i in range(n)], hi)
    edges = np.arange(n + 1, dtype=np.float64)
    edges[:n] *= step  # edges[n] is hi: n * step may round past 1.8e308
    edges += lo
    edges[n] = hi
    return _f8(edges)


def bin_histograms(
    jobs: list[tuple[np.ndarray, int]],
    done: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """:func:`bin_histogram` of each ``(values, buckets)`` job, the results bit for bit the same,
    with a few numpy calls per group of small histograms rather than a dozen per histogram.

    The writer's background thread bins what the training loop logged since its last batch in
    one go. For a small histogram (a bias, a norm's scale) the dozen numpy calls of
    :func:`bin_histogram` cost more in Python than in arithmetic; so histograms of the same
    size, up to ``_GROUP_ROW_MAX`` values, are binned as the rows of one float64 array: per
    group one min, max, subtract, multiply, cast, bincount and the two sums, each row's
    arithmetic the same as alone (about twice as fast for 100 to 1,000 values;
    docs/performance.md, "Histogram hot path"). Larger histograms, where the arithmetic
    dominates and grouping measured no faster in the writer, single ones, and rows that need
    the special cases of :func:`_histogram` (NaN or Inf, one value, a range that overflows,
    values past 1e100) go through :func:`bin_histogram`.

    ``done(j, result)``, if given, is called as soon as job ``j`` is binned, once per job: the
    writer gives each copy back to its spare arrays there, while the rest are still binned,
    so that the training loop's next copies find them.
    """
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    # Grouped by size and bucket count: a group's bincount holds (buckets + 1) counts a row,
    # so rows are bounded by both (2-value histograms of 10,000 buckets are not 1 GB of counts).
    by_size: dict[tuple[int, int], list[int]] = {}
    for j, (values, n) in enumerate(jobs):
        if 0 < values.size <= _GROUP_ROW_MAX:
            by_size.setdefault((values.size, n), []).append(j)
    for (size, n), members in by_size.items():
        if len(members) == 1:
            continue
        rows = max(1, _GROUP_VALUES // max(size, n + 1))
        for start in range(0, len(members), rows):
            group = members[start : start + rows]
            _bin_rows(jobs, group, size, results)
            if done is not None:
                for j in group:
                    result = results[j]
                    if result is not None:
                        done(j, result)
    binned = []
    for j, result in enumerate(results):
        if result is None:  # binned alone
            result = bin_histogram(*jobs[j])
            if done is not None:
                done(j, result)
        binned.append(result)
    return binned


#: Values binned at once by :func:`bin_histograms` (a group of rows), at most: 640 KB of pass
#: arrays per thread that bins, reused; and the largest histogram it groups.
_GROUP_VALUES = 1 << 15
_GROUP_ROW_MAX = 1 << 12


def _bin_rows(
    jobs: list[tuple[np.ndarray, int]],
    members: list[int],
    size: int,
    results: list[dict[str, Any] | None],
) -> None:
    """Bin ``jobs[members]``, all of ``size`` values, as the rows of one array; fill in
    ``results`` for the rows without special cases (the others stay None)."""
    k = len(members)
    rows, index = _pass_arrays(_GROUP_VALUES)
    a = rows[0, : k * size].reshape(k, size)
    for r, j in enumerate(members):
        np.copyto(a[r], jobs[j][0].reshape(-1))  # the float64 that astype gives
    los = (_MIN(a, axis=1) + 0.0).tolist()  # a zero as +0.0 (see _histogram)
    his = (_MAX(a, axis=1) + 0.0).tolist()
    lo_col = np.zeros((k, 1))
    scale_col = np.zeros((k, 1))
    offsets = np.zeros((k, 1), np.int32)
    plain = []  # (row, job, lo, hi, n, offset): the rows binned here
    apart = []  # the rows binned alone
    offset = 0
    for r, j in enumerate(members):
        lo, hi, n = los[r], his[r], jobs[j][1]
        # The cases _histogram treats apart (not finite, no distinct edges, a range or sums
        # that could overflow): that row is zeroed here and binned alone.
        if not (hi > lo and max(-lo, hi) < _NO_OVERFLOW and math.isfinite(n / (hi - lo))):
            a[r] = 0.0
            apart.append(r)
            continue
        lo_col[r, 0] = lo
        scale_col[r, 0] = n / (hi - lo)
        offsets[r, 0] = offset
        plain.append((r, j, lo, hi, n, offset))
        offset += n + 1
    if not plain:
        return
    for r in apart:  # their zeros count in one bin past every other row's, then dropped
        offsets[r, 0] = offset
    s = rows[1, : k * size].reshape(k, size)
    np.subtract(a, lo_col, s)
    s *= scale_col
    i = index[: k * size].reshape(k, size)
    np.copyto(i, s, casting="unsafe")  # truncated as astype does (0 <= s <= n)
    i += offsets  # each row's bins after the previous row's (set-aside rows: one bin past all)
    counts = np.bincount(i.reshape(-1), minlength=offset + 1)
    totals = np.add.reduce(a, axis=1).tolist()
    squares = np.add.reduce(np.multiply(a, a, s), axis=1).tolist()
    for r, j, lo, hi, n, first in plain:
        results[j] = {
            "edges": _edge_bytes(lo, hi, n),
            "counts": _count_bytes(counts[first : first + n + 1], n),
            "num": size,
            "nan": 0,
            "inf": 0,
            "min": lo,
            "max": hi,
            "sum": totals[r],
            "sum_sq": squares[r],
        }


#: Values binned per pass: big arrays go through in pieces of this many, so that the pass's
#: float64 and index arrays are the same few hundred kilobytes every time (reused, in cache),
#: never a fresh array the size of the histogram (fresh memory is paid in page faults). Each
#: thread that bins keeps its own three (320 KB), from its first histogram on.
_CHUNK = 1 << 14
_scratch = threading.local()  # each thread's pass arrays (bin_histogram runs in several threads)


def _pass_arrays(size: int = _CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """This thread's pass arrays of ``size`` values (made once): two float64 rows, the values
    and the scaled values (then their squares), so that one reduction along the rows sums
    both, each row in numpy's pairwise order as alone; and the int32 bin indices."""
    arrays = getattr(_scratch, "arrays", None)
    if arrays is None:
        arrays = _scratch.arrays = {}
    kept = arrays.get(size)
    if kept is None:
        kept = arrays[size] = (np.empty((2, size)), np.empty(size, np.int32))
    return kept


def _count(
    arr: np.ndarray, lo: float, scale: float, n: int, safe: bool
) -> tuple[np.ndarray, float, float]:
    """Count finite ``arr`` (any numeric dtype) in ``n + 1`` bins from ``lo``, ``scale`` bins
    per unit (the maximum lands at ``n``: :func:`_count_bytes` adds it to the last, closed bin);
    also return the sum and the sum of squares of its values as float64.

    Per value: a subtract, a multiply, a cast to int32 and a bincount; no sorting and none of
    np.histogram's per-element edge checks. The sums are numpy's pairwise summation, not
    ``np.dot``: that is BLAS, which above 10,000 values hands the work to its own threads, and
    where the cores are busy (a training process) they spin and wait: a 100k-value histogram
    took 5.8 ms of CPU instead of 50 us. ``safe``: no value is large enough for a sum or a
    square to overflow, so numpy's error state need not be set (a context per histogram).
    """
    if not safe:
        with np.errstate(over="ignore"):  # a sum past 1.8e308 is recorded as inf
            return _count(arr, lo, scale, n, True)
    rows, index = _pass_arrays()
    size = arr.size
    counts, total, total_sq = _count_piece(arr[:_CHUNK], lo, scale, n, rows, index)
    for start in range(_CHUNK, size, _CHUNK):  # past the first piece: add the others to it
        more, piece_sum, piece_sq = _count_piece(
            arr[start : start + _CHUNK], lo, scale, n, rows, index
        )
        counts += more
        total += piece_sum
        total_sq += piece_sq
    return counts, total, total_sq


def _count_piece(
    piece: np.ndarray,
    lo: float,
    scale: float,
    n: int,
    rows: np.ndarray,
    index: np.ndarray,
) -> tuple[np.ndarray, float, float]:
    """:func:`_count` of at most ``_CHUNK`` values, through the thread's pass arrays."""
    m = piece.size
    rows = rows[:, :m]
    if piece.dtype == np.float64:
        a = piece
    else:
        a = rows[0]
        np.copyto(a, piece)  # the float64 that astype gives, into the reused array
    # Outputs passed by position: the keyword costs a ufunc call 0.2 us more, of the dozen
    # calls' overhead that is a quarter of a 10,000-value histogram's binning.
    s = np.subtract(a, lo, rows[1])
    s *= scale
    # Truncated to int32 as astype does, into the reused array (0 <= s <= n, so int32 holds the
    # indices, and numpy casts float64 to int32 several times faster than to int64). Not one
    # multiply with an int32 output: its buffered cast is slower than the two passes.
    i = index[:m]
    np.copyto(i, s, casting="unsafe")
    counts = np.bincount(i, None, n + 1)  # (weights, minlength) by position, as above
    # One piece: numpy's pairwise sum of the whole array, bit for bit as before the pieces.
    if a is piece:  # float64 values, not copied: each sum on its own
        return counts, float(np.add.reduce(a)), float(np.add.reduce(np.multiply(a, a, s)))
    # Both sums in one reduction along the rows: each row is summed alone, in the same
    # pairwise order as a reduction of its own (the rows of _bin_rows rely on it too). The
    # squares take the scaled values' row, done with once the indices are cut.
    np.multiply(a, a, s)
    total, total_sq = np.add.reduce(rows, axis=1).tolist()
    return counts, total, total_sq


# -- image --------------------------------------------------------------------------------------


def image_event(
    tag: str, img: Any, step: int, wall: float, dataformats: str = "HWC"
) -> dict[str, Any]:
    """Build an ``image`` event: ``img`` encoded as PNG.

    Args:
        tag: the tag.
        img: a numpy array or tensor of dtype uint8 (0..255) or float (0..1, scaled to 0..255,
            clipped; NaN becomes 0), with C (channels) 1 (grey), 3 (RGB) or 4 (RGBA).
        step: the training step.
        wall: seconds since the epoch.
        dataformats: the order of ``img``'s axes: ``HW``, ``HWC``, ``CHW``, ``NHWC``, ``NCHW``
            (any order of those letters). A batch (``N``) is tiled into a grid of at most
            :data:`GRID_COLUMNS` images per row, as tensorboardX does.

    Returns:
        The event map with ``format`` (``"png"``), ``data`` (the PNG bytes), ``width``, ``height``.

    Raises:
        TypeError, ValueError: a bad argument; for a bad shape the message names the expected
        ``dataformats`` and the shape received.
    """
    codec.check_tag(tag)
    event = _common("image", tag, _step(step), check_wall(wall))
    pixels = _image_hwc(as_numpy(img, "img"), dataformats)
    data = encode_png(pixels)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"img encodes to {len(data)} bytes of PNG, over the limit of {MAX_PAYLOAD_BYTES}"
        )
    event.update(format="png", data=data, width=pixels.shape[1], height=pixels.shape[0])
    return event


def _image_hwc(arr: np.ndarray, dataformats: object) -> np.ndarray:
    """Return ``arr`` as HWC uint8 pixels, a batch tiled into a grid."""
    fmt = dataformats.upper() if isinstance(dataformats, str) else None
    if fmt is None or "".join(sorted(fmt)) not in ("HW", "CHW", "CHNW"):
        raise ValueError(
            f"dataformats must be one of {', '.join(IMAGE_FORMATS)} (letters in any order), "
            f"got {dataformats!r:.40}"
        )
    given, shape = fmt, arr.shape
    if arr.ndim != len(fmt):
        raise ValueError(
            f"img with dataformats={given!r} must have {len(fmt)} dimensions, got shape {shape}"
        )
    if "C" not in fmt:
        arr, fmt = arr[..., None], fmt + "C"
    if arr.shape[fmt.index("C")] not in _PNG_COLOR_TYPE:
        raise ValueError(
            f"img with dataformats={given!r} must have C of 1, 3 or 4 channels, got shape {shape}"
        )
    if 0 in shape:
        raise ValueError(f"img with dataformats={given!r} must not be empty, got shape {shape}")
    if arr.size > MAX_IMAGE_VALUES:
        raise ValueError(
            f"img must have at most {MAX_IMAGE_VALUES} values (pixels times channels), "
            f"got shape {shape}"
        )
    if arr.dtype == np.uint8:
        pixels = arr
    elif arr.dtype.kind == "f":
        with np.errstate(over="ignore"):  # beyond float32 is beyond 1: inf, clipped to 1 below
            scaled = np.nan_to_num(arr.astype(np.float32), nan=0.0, posinf=1.0, neginf=0.0)
        np.clip(scaled, 0.0, 1.0, out=scaled)
        scaled *= 255.0
        pixels = np.rint(scaled).astype(np.uint8)
    else:
        raise ValueError(f"img must be uint8 (0..255) or float (0..1), got dtype {arr.dtype}")
    if "N" not in fmt:
        return np.ascontiguousarray(pixels.transpose([fmt.index(c) for c in "HWC"]))
    batch = pixels.transpose([fmt.index(c) for c in "NHWC"])
    n, h, w, c = batch.shape
    cols = min(n, GRID_COLUMNS)
    rows = -(-n // cols)
    grid = np.zeros((rows * cols, h, w, c), dtype=np.uint8)
    grid[:n] = batch
    return grid.reshape(rows, cols, h, w, c).transpose(0, 2, 1, 3, 4).reshape(rows * h, cols * w, c)


def encode_png(pixels: np.ndarray) -> bytes:
    """Encode HWC uint8 ``pixels`` (C = 1, 3 or 4) as a PNG (8-bit grey, RGB or RGBA).

    Every row uses the PNG "Up" filter (the byte-wise difference to the row above), which helps
    zlib on smooth images and costs one numpy subtraction.
    """
    h, w, c = pixels.shape
    rows = pixels.reshape(h, w * c)
    filtered = np.empty((h, 1 + w * c), dtype=np.uint8)
    filtered[:, 0] = 2  # filter type Up; the row above the first counts as zeros
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # uint8 arithmetic wraps mod 256

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", w, h, 8, _PNG_COLOR_TYPE[c], 0, 0, 0)
    return b"".join(
        (
            _PNG_SIGNATURE,
            chunk(b"IHDR", header),
            chunk(b"IDAT", zlib.compress(filtered.tobytes(), 6)),
            chunk(b"IEND", b""),
        )
    )


# -- text ---------------------------------------------------------------------------------------


def text_event(tag: str, text_string: str, step: int | None, wall: float) -> dict[str, Any]:
    """Build a ``text`` event with key ``text``.

    Args:
        tag: the tag.
        text_string: the text (a ``str``; Markdown is shown as such by the dashboard).
        step: the training step, or None.
        wall: seconds since the epoch.

    Raises:
        TypeError: ``text_string`` is not a str; ValueError: it is over the size limit.
    """
    codec.check_tag(tag)
    event = _common("text", tag, _step(step, optional=True), check_wall(wall))
    text_string = check_str(text_string, "text_string")
    if len(text_string) * 4 > MAX_PAYLOAD_BYTES and len(text_string.encode()) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"text_string must be at most {MAX_PAYLOAD_BYTES} bytes of UTF-8")
    event["text"] = text_string
    return event


# -- audio --------------------------------------------------------------------------------------


def audio_event(
    tag: str, audio_array: Any, step: int, wall: float, sample_rate: int = 8000
) -> dict[str, Any]:
    """Build an ``audio`` event: ``audio_array`` encoded as a 16-bit PCM WAV file.

    Args:
        tag: the tag.
        audio_array: float samples in [-1, 1] (scaled to ±32767; beyond that clipped, NaN made 0)
            or int16 samples; mono ``(frames,)`` or ``(frames, 1)``, stereo ``(frames, 2)``, or
            channels first ``(1, frames)``/``(2, frames)`` as torchaudio has them.
        step: the training step.
        wall: seconds since the epoch.
        sample_rate: samples per second per channel, 1 to 1,000,000.

    Returns:
        The event map with ``format`` (``"wav"``), ``data`` (the WAV bytes), ``sample_rate``,
        ``channels``, ``frames``, and ``clipped`` (float samples that were out of range or NaN).

    Raises:
        TypeError, ValueError: a bad argument; a bad shape or dtype is named in the message.
    """
    codec.check_tag(tag)
    event = _common("audio", tag, _step(step), check_wall(wall))
    rate = _positive_int(sample_rate, "sample_rate", 1_000_000)
    arr = as_numpy(audio_array, "audio_array")
    if arr.ndim == 2 and arr.shape[1] not in (1, 2) and arr.shape[0] in (1, 2):
        arr = arr.T  # channels first
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[1] not in (1, 2) or arr.shape[0] == 0:
        raise ValueError(
            "audio_array must be mono (frames,) or stereo (frames, 2) / (2, frames) with at least "
            f"one frame, got shape {np.shape(audio_array)}"
        )
    clipped = 0
    if arr.dtype == np.int16:
        pcm = arr.astype("<i2")
    elif arr.dtype.kind == "f":
        samples = arr.astype(np.float64)
        bad = ~(np.abs(samples) <= 1.0)  # out of range, ±Inf or NaN
        clipped = int(bad.sum())
        if clipped:
            samples = np.clip(np.nan_to_num(samples, nan=0.0), -1.0, 1.0)
        pcm = np.rint(samples * 32767.0).astype("<i2")
    else:
        raise ValueError(f"audio_array must be float (-1..1) or int16, got dtype {arr.dtype}")
    frames, channels = pcm.shape
    if frames * channels * 2 > MAX_PAYLOAD_BYTES:
        raise ValueError(f"audio_array of {frames} frames is over {MAX_PAYLOAD_BYTES} bytes of WAV")
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.ascontiguousarray(pcm).tobytes())
    event.update(
        format="wav",
        data=out.getvalue(),
        sample_rate=rate,
        channels=channels,
        frames=frames,
        clipped=clipped,
    )
    return event


# -- hparams ------------------------------------------------------------------------------------


def _hparam_value(value: object, name: str) -> str | int | float | bool:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars, one-element tensors
    if type(value) in (bool, float):
        return value  # type: ignore[return-value]
    if isinstance(value, str):
        return check_str(value, name)
    if type(value) is int:
        if not _INT64_MIN <= value <= _UINT64_MAX:
            raise ValueError(f"{name} must fit in 64 bits, got {value}")
        return value
    raise TypeError(f"{name} must be a str, int, float or bool, got {type(value).__name__}")


def hparams_event(hparams_dict: Any, metrics_list: Any, wall: float) -> dict[str, Any]:
    """Build an ``hparams`` event: a run's hyperparameters and the metrics that judge it.

    Args:
        hparams_dict: ``{name: value}`` with str names and str, int, float or bool values (numpy
            scalars are converted).
        metrics_list: the tags of the metrics (VisualDL's ``metrics_list``: the dashboard takes
            their values from those scalar series), or ``{tag: value}`` (tensorboardX's
            ``metric_dict``: final values given here).
        wall: seconds since the epoch.

    Returns:
        The event map (``tag`` and ``step`` None) with ``hparams`` (the map), ``metrics`` (the list
        of metric tags, in either form) and ``metric_values`` (``{tag: float}`` when a dict was
        given, else None).

    Raises:
        TypeError, ValueError: a bad argument, named with its key in the message.
    """
    event = _common("hparams", None, None, check_wall(wall))
    if not isinstance(hparams_dict, Mapping):
        raise TypeError(f"hparams_dict must be a dict, got {type(hparams_dict).__name__}")
    hparams = {}
    for key, value in hparams_dict.items():
        codec.check_tag(key, "hparams_dict key")
        hparams[key] = _hparam_value(value, f"hparams_dict[{key!r}]")
    metric_values: dict[str, float] | None = None
    if isinstance(metrics_list, Mapping):
        metric_values = {}
        for key, value in metrics_list.items():
            codec.check_tag(key, "metric_dict key")
            metric_values[key] = to_float(value, f"metric_dict[{key!r}]")
        metrics = list(metric_values)
    elif isinstance(metrics_list, (list, tuple)):
        metrics = [codec.check_tag(m, f"metrics_list[{i}]") for i, m in enumerate(metrics_list)]
    else:
        raise TypeError(
            "metrics_list must be a list of metric tags or a dict {tag: value}, "
            f"got {type(metrics_list).__name__}"
        )
    event.update(hparams=hparams, metrics=metrics, metric_values=metric_values)
    return event


# -- PR and ROC curves --------------------------------------------------------------------------


def curve_counts(
    labels: Any, predictions: Any, num_thresholds: int, weights: Any = None
) -> dict[str, np.ndarray]:
    """Compute the confusion counts at ``num_thresholds`` thresholds, as VisualDL/TensorBoard do.

    Threshold ``i`` is ``i / (num_thresholds - 1)``; a prediction ``p`` counts as positive at
    threshold ``i`` when ``floor(p * (num_thresholds - 1)) >= i``.

    Returns:
        float64 arrays ``thresholds``, ``tp``, ``fp``, ``tn``, ``fn`` (weighted counts).

    Raises:
        TypeError, ValueError: bad labels (not 0/1), predictions (outside [0, 1] or NaN), sizes,
        weights or ``num_thresholds``, named in the message.
    """
    n = _positive_int(num_thresholds, "num_thresholds", MAX_THRESHOLDS, least=2)
    truth = to_array(labels, "labels").ravel()
    scores = to_array(predictions, "predictions").ravel()
    if truth.size != scores.size or not truth.size:
        raise ValueError(
            "labels and predictions must have the same, non-zero number of elements, "
            f"got {truth.size} and {scores.size}"
        )
    bad = (truth != 0) & (truth != 1)
    if bad.any():
        raise ValueError(f"labels must be 0 or 1 (or bool), got {float(truth[bad][0])!r}")
    bad = ~((scores >= 0) & (scores <= 1))
    if bad.any():
        raise ValueError(
            f"predictions must be probabilities in [0, 1], got {float(scores[bad][0])!r}"
        )
    if weights is None:
        weight = np.ones_like(truth)
    else:
        weight = to_array(weights, "weights").ravel()
        if weight.size == 1:
            weight = np.full_like(truth, weight[0])
        if weight.size != truth.size:
            raise ValueError(
                f"weights must be one number or one per label, got {weight.size} for "
                f"{truth.size} labels"
            )
        bad = ~((weight >= 0) & np.isfinite(weight))
        if bad.any():
            raise ValueError(
                f"weights must be finite and non-negative, got {float(weight[bad][0])!r}"
            )
    bucket = np.floor(scores * (n - 1)).astype(np.intp)
    tp_buckets = np.bincount(bucket, weights=truth * weight, minlength=n)
    fp_buckets = np.bincount(bucket, weights=(1.0 - truth) * weight, minlength=n)
    tp = np.cumsum(tp_buckets[::-1])[::-1]
    fp = np.cumsum(fp_buckets[::-1])[::-1]
    return {
        "thresholds": np.arange(n) / (n - 1),
        "tp": tp,
        "fp": fp,
        "tn": fp[0] - fp,
        "fn": tp[0] - tp,
    }


def pr_curve_event(
    tag: str,
    labels: Any,
    predictions: Any,
    step: int,
    wall: float,
    num_thresholds: int = 10,
    weights: Any = None,
) -> dict[str, Any]:
    """Build a ``pr_curve`` event: precision and recall of binary ``predictions`` by threshold.

    Args:
        tag: the tag.
        labels: the true labels, 0/1 or bool, any shape (flattened).
        predictions: the predicted probabilities of label 1, in [0, 1], as many as ``labels``.
        step: the training step.
        wall: seconds since the epoch.
        num_thresholds: the number of thresholds, 2 to :data:`MAX_THRESHOLDS`.
        weights: None, one number, or one non-negative weight per label.

    Returns:
        The event map with ``num_thresholds`` and ``<f8`` bytes of ``num_thresholds`` elements:
        ``thresholds``, ``tp``, ``fp``, ``tn``, ``fn``, ``precision`` (``tp / (tp + fp)``),
        ``recall`` (``tp / (tp + fn)``); a zero denominator is taken as 1e-7, as TensorBoard does.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    codec.check_tag(tag)
    event = _common("pr_curve", tag, _step(step), check_wall(wall))
    c = curve_counts(labels, predictions, num_thresholds, weights)
    tp, fp, fn = c["tp"], c["fp"], c["fn"]
    event.update({key: _f8(value) for key, value in c.items()})
    event["precision"] = _f8(tp / np.maximum(_MINIMUM_COUNT, tp + fp))
    event["recall"] = _f8(tp / np.maximum(_MINIMUM_COUNT, tp + fn))
    event["num_thresholds"] = len(tp)
    return event


def roc_curve_event(
    tag: str,
    labels: Any,
    predictions: Any,
    step: int,
    wall: float,
    num_thresholds: int = 10,
    weights: Any = None,
) -> dict[str, Any]:
    """Build a ``roc_curve`` event: true and false positive rates of ``predictions`` by threshold.

    Arguments as :func:`pr_curve_event`. The map has ``num_thresholds`` and ``<f8`` bytes of
    ``thresholds``, ``tp``, ``fp``, ``tn``, ``fn``, ``tpr`` (``tp / (tp + fn)``) and ``fpr``
    (``fp / (fp + tn)``).

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    codec.check_tag(tag)
    event = _common("roc_curve", tag, _step(step), check_wall(wall))
    c = curve_counts(labels, predictions, num_thresholds, weights)
    tp, fp, tn, fn = c["tp"], c["fp"], c["tn"], c["fn"]
    event.update({key: _f8(value) for key, value in c.items()})
    event["tpr"] = _f8(tp / np.maximum(_MINIMUM_COUNT, tp + fn))
    event["fpr"] = _f8(fp / np.maximum(_MINIMUM_COUNT, fp + tn))
    event["num_thresholds"] = len(tp)
    return event
