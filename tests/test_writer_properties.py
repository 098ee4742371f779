"""A property test over the public writer API: arbitrary Python objects for every argument.

Every call of every ``add_*`` method of :func:`vdl_stream.attach`'s writer, :class:`LogWriter` and
:class:`SummaryWriter` either raises ``TypeError``/``ValueError`` at the call, or its data comes
back exactly from the recorder (scalars point by point, events field by field). After a canary
scalar per example, the last test checks that every writer's background thread is alive, every
canary is on disk, and everything accepted reads back. One writer of each kind serves the module.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import recorder
from recorder.codec import quantize_walls
from vdl_stream import LogWriter, SummaryWriter, attach, summaries
from vdl_stream.compat import MILLISECONDS_ABOVE

EXAMPLES = settings(
    max_examples=int(os.environ.get("VDL_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- strategies ---------------------------------------------------------------------------------

# Every code point, lone surrogates and controls included.
any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=12)
numpy_scalars = st.one_of(
    hnp.from_dtype(np.dtype("int64")).map(np.int64),
    hnp.from_dtype(np.dtype("uint64")).map(np.uint64),
    hnp.from_dtype(np.dtype("float32")).map(np.float32),
    hnp.from_dtype(np.dtype("float64")).map(np.float64),
    st.booleans().map(np.bool_),
)
small_arrays = hnp.arrays(
    dtype=st.sampled_from([np.float64, np.float32, np.int16, np.uint8, np.int64, np.bool_]),
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
)
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**65), 2**65),
    st.floats(),
    any_text,
    st.binary(max_size=8),
    numpy_scalars,
    small_arrays,
    st.lists(st.one_of(st.floats(), st.integers(), any_text), max_size=4),
    st.tuples(st.integers(), st.floats()),
    st.dictionaries(any_text, st.one_of(st.floats(), st.integers(), any_text), max_size=3),
    st.builds(object),
    st.just(float("nan")),
)


def arg(valid: st.SearchStrategy, odd: st.SearchStrategy | None = None) -> st.SearchStrategy:
    """Mostly values the API takes (so that many calls are accepted), sometimes ``odd`` values
    near its edges, and sometimes anything at all."""
    # one_of flattens nested one_ofs and picks among their leaves, so weigh with a draw instead.
    unusual = anything if odd is None else st.one_of(odd, anything)
    return st.integers(0, 9).flatmap(lambda i: valid if i < 8 else unusual)


tags = arg(
    st.text(st.characters(codec="utf-8", blacklist_categories=("Cc",)), min_size=1, max_size=20),
    st.one_of(any_text, st.text(min_size=250, max_size=260)),
)
steps = arg(st.integers(-(2**63), 2**63 - 1), st.one_of(st.integers(), numpy_scalars))
values = arg(st.floats(), st.one_of(st.integers(-(2**1030), 2**1030), numpy_scalars))
walltimes = arg(
    st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    st.one_of(st.floats(), st.integers(-(10**13), 10**13)),
)
arrays = arg(
    hnp.arrays(np.float64, st.integers(1, 6), elements=st.floats(-1, 1)),
    st.one_of(small_arrays, st.lists(st.floats(), max_size=6)),
)
images = arg(
    hnp.arrays(
        dtype=st.sampled_from([np.uint8, np.float32, np.float64]),
        shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 3, 4])),
    ),
    hnp.arrays(np.int32, st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5))),
)
probabilities = hnp.arrays(np.float64, 4, elements=st.floats(0, 1))
labels = hnp.arrays(np.int64, 4, elements=st.integers(0, 1))
counts = arg(st.integers(2, 40), st.integers(-2, 2))
texts = arg(st.text(max_size=40), any_text)
param_values = st.one_of(
    st.text(max_size=5), st.floats(), st.integers(-(2**63), 2**63), st.booleans()
)
hparam_dicts = arg(
    st.dictionaries(st.text(min_size=1, max_size=6), param_values, max_size=3),
    st.dictionaries(any_text, st.one_of(any_text, st.integers()), max_size=3),
)
metric_lists = arg(
    st.one_of(
        st.lists(st.text(min_size=1, max_size=6), max_size=3),
        st.dictionaries(st.text(min_size=1, max_size=6), st.floats(), max_size=3),
    )
)
scalar_dicts = arg(
    st.dictionaries(st.text(min_size=1, max_size=6), st.floats(), max_size=3),
    st.dictionaries(any_text, anything, max_size=3),
)

# -- the histogram's binning, against np.histogram ---------------------------------------------

# Values numpy's histogram chokes on or rounds at: NaN, ±Inf, the largest and smallest floats,
# constants, values on or next to the edges.
_EDGE_FLOATS = st.sampled_from(
    [0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, 5e-324, 1e300, -1e300, 1.7976931348623157e308, 2**53]
)
adversarial_arrays = st.one_of(
    hnp.arrays(
        st.sampled_from([np.float16, np.float32, np.float64]),
        st.integers(0, 80),
        elements={"allow_nan": True, "allow_infinity": True},
    ),
    hnp.arrays(np.float64, st.integers(0, 80), elements=st.one_of(st.floats(), _EDGE_FLOATS)),
    hnp.arrays(
        st.sampled_from([np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.bool_]),
        st.integers(0, 80),
    ),
    st.builds(lambda v, k: np.full(k, v), st.floats(allow_nan=False), st.integers(1, 30)),
    st.builds(
        lambda k, n: np.arange(k * n + 1, dtype=np.float64) / k,  # every edge of n bins hit
        st.integers(1, 7),
        st.integers(1, 20),
    ),
)


@settings(max_examples=300, deadline=None)
@given(adversarial_arrays, st.integers(1, 70))
def test_histogram_bins_as_numpy_up_to_values_at_an_edge(values, buckets):
    """bin_histogram is np.histogram's binning over the finite values as float64, except that a
    value within rounding of an inner edge may land in either bin next to it (docs/guide.md);
    NaN and ±Inf are counted apart; sums are exact up to float64 rounding."""
    got = summaries.bin_histogram(values, buckets)
    as_f8 = values.astype(np.float64).ravel()
    finite = as_f8[np.isfinite(as_f8)]
    counts = np.frombuffer(got["counts"], "<f8")
    edges = np.frombuffer(got["edges"], "<f8")
    assert len(counts) == buckets and len(edges) == buckets + 1
    assert (got["num"], got["nan"], got["inf"]) == (
        as_f8.size,
        int(np.isnan(as_f8).sum()),
        int(np.isinf(as_f8).sum()),
    )
    assert counts.sum() == finite.size and (counts >= 0).all()
    if not finite.size:
        assert got["min"] is None and got["max"] is None and not counts.any()
        return
    assert (got["min"], got["max"]) == (finite.min(), finite.max())
    assert np.isfinite(edges).all() and (np.diff(edges) >= 0).all()
    assert edges[0] <= finite.min() and finite.max() <= edges[-1]
    # Each inner edge splits the values as it should, give or take those within rounding of it.
    span = edges[-1] - edges[0]
    below = np.cumsum(counts)[:-1]
    for k, edge in enumerate(edges[1:-1]):
        tol = 1e-12 * (abs(edge) + span)
        assert (finite < edge - tol).sum() <= below[k] <= (finite < edge + tol).sum(), k
    # Against numpy where both span the values' own range (a single value, or a range too
    # narrow for distinct edges, is widened: by ±0.5 as numpy, relatively more beyond 1e8).
    if np.isfinite(span) and (edges[0], edges[-1]) == (finite.min(), finite.max()) and span > 0:
        try:
            want, want_edges = np.histogram(finite, bins=buckets)
        except ValueError:  # numpy: "too many bins for data range"
            return
        np.testing.assert_allclose(edges, want_edges, rtol=1e-12, atol=1e-300)
        near = [(abs(finite - e) <= 1e-12 * (abs(e) + span)).sum() for e in want_edges[1:-1]]
        assert (abs(np.cumsum(counts)[:-1] - np.cumsum(want)[:-1]) <= near).all()
    if np.abs(finite).max() < 1e150:  # no square overflows: compare with exact sums
        assert got["sum"] == pytest.approx(math.fsum(finite), rel=1e-9, abs=1e-300)
        assert got["sum_sq"] == pytest.approx(math.fsum(finite * finite), rel=1e-9, abs=1e-300)
    else:
        assert got["sum_sq"] == math.inf or got["sum_sq"] > 0


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.uint8])
def test_histogram_of_many_values_is_binned_in_pieces_as_numpy_bins_it_whole(dtype):
    # Past summaries._CHUNK values the binning goes piece by piece through reused arrays.
    size = 3 * summaries._CHUNK + 5
    rng = np.random.default_rng(4)
    values = (rng.normal(size=size) * 40).astype(dtype)
    if np.dtype(dtype).kind == "f":
        values[::1001] = np.nan
        values[7] = np.inf
    got = summaries.bin_histogram(values, 25)
    as_f8 = values.astype(np.float64)
    finite = as_f8[np.isfinite(as_f8)]
    want, edges = np.histogram(finite, bins=25)
    np.testing.assert_allclose(np.frombuffer(got["edges"], "<f8"), edges, rtol=1e-12)
    counts = np.frombuffer(got["counts"], "<f8")
    span = edges[-1] - edges[0]
    near = [(abs(finite - e) <= 1e-12 * (abs(e) + span)).sum() for e in edges[1:-1]]
    assert counts.sum() == finite.size
    assert (abs(np.cumsum(counts)[:-1] - np.cumsum(want)[:-1]) <= near).all()
    assert (got["nan"], got["inf"]) == (np.isnan(as_f8).sum(), np.isinf(as_f8).sum())
    assert (got["min"], got["max"]) == (finite.min(), finite.max())
    assert got["sum"] == pytest.approx(math.fsum(finite), rel=1e-12, abs=1e-9)
    assert got["sum_sq"] == pytest.approx(math.fsum(finite * finite), rel=1e-12)


def test_histogram_sums_never_go_through_blas(monkeypatch):
    # Above 10,000 values BLAS (np.dot) hands a dot product to its own threads, which spin
    # wherever the cores are busy: a 100k-value histogram cost 5.8 ms of CPU instead of 50 us.
    def refuse(*args, **kwargs):
        raise AssertionError("bin_histogram called BLAS")

    monkeypatch.setattr(np, "dot", refuse)
    monkeypatch.setattr(np, "vdot", refuse)
    monkeypatch.setattr(np, "inner", refuse)
    values = np.random.default_rng(3).normal(size=20_001).astype(np.float32)
    got = summaries.bin_histogram(values, 30)
    exact = math.fsum(values.astype(np.float64) ** 2)
    assert got["sum_sq"] == pytest.approx(exact, rel=1e-12)
    assert np.frombuffer(got["counts"], "<f8").sum() == 20_001


def _same_histogram(got: dict, want: dict) -> bool:
    """Equal bit for bit (NaN equal to NaN: an overflowing sum may be one)."""
    return got.keys() == want.keys() and all(
        got[k] == want[k] or (got[k] != got[k] and want[k] != want[k]) for k in want
    )


# -- the recorded histogram, pinned ----------------------------------------------------------

_FLOAT_MAX = float(np.finfo(np.float64).max)


def _recorded_histogram(values: np.ndarray, n: int) -> dict:
    """What the recorder stores for ``add_histogram(values, buckets=n)``, stated plainly: one
    numpy operation after another on a float64 copy, as the binning did on 2026-12-01
    (``8a15e44``). A faster binning must give these edges, counts, min, max and sums bit for
    bit, or the same run would chart differently live, replayed and exported."""
    a = values.astype(np.float64).ravel()
    finite = a[np.isfinite(a)]
    nan = int(np.isnan(a).sum())
    out = {"num": a.size, "nan": nan, "inf": a.size - nan - finite.size}
    if not finite.size:
        zeros = {"edges": bytes(8 * (n + 1)), "counts": bytes(8 * n), "min": None, "max": None}
        return {**out, **zeros, "sum": 0.0, "sum_sq": 0.0}
    vmin = lo = float(finite.min()) + 0.0  # a zero's sign is not kept: +0.0
    vmax = hi = float(finite.max()) + 0.0
    if not (hi > lo and math.isfinite(n / (hi - lo))):  # widened: ±0.5, relatively past 1e8
        pad = max(0.5, abs(lo) * 1e-9, abs(hi) * 1e-9)
        lo, hi = max(lo - pad, -_FLOAT_MAX), min(hi + pad, _FLOAT_MAX)
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(hi - lo):
            # Each value's bin: (value - lo) * (n / (hi - lo)), truncated; the maximum's (n)
            # counted in the last bin. Edges: i * ((hi - lo) / n) + lo, the last one hi.
            index = ((finite - lo) * (n / (hi - lo))).astype(np.int64)
            edges = np.append(np.arange(n, dtype=np.float64) * ((hi - lo) / n) + lo, hi)
        else:  # the range overflows: edges interpolated, each value's bin searched
            t = np.arange(n + 1) / n
            edges = lo * (1 - t) + hi * t
            edges[n] = hi
            index = np.clip(np.searchsorted(edges, finite, side="right") - 1, 0, n - 1)
        counts = np.bincount(index, minlength=n + 1)
        counts[n - 1] += counts[n]
        # numpy's pairwise sums, piece by piece (summaries._CHUNK values) past one piece.
        pieces = [finite[i : i + summaries._CHUNK] for i in range(0, finite.size, summaries._CHUNK)]
        total = total_sq = 0.0
        for piece in pieces:
            total += float(np.add.reduce(piece))
            total_sq += float(np.add.reduce(piece * piece))
    return {
        **out,
        "edges": edges.astype("<f8").tobytes(),
        "counts": counts[:n].astype("<f8").tobytes(),
        "min": vmin,
        "max": vmax,
        "sum": total,
        "sum_sq": total_sq,
    }


def _seeded_values(dtype: type, size: int, shape: str, seed: int) -> np.ndarray:
    """``size`` values of ``dtype`` from ``seed``: normal at a random scale and offset, integers,
    a constant or a symmetric range (an edge at 0), some NaN and Inf where the dtype has them."""
    rng = np.random.default_rng(seed)
    if shape == "normal":
        values = rng.normal(size=size) * 10.0 ** rng.integers(-8, 9) + rng.normal() * 100
    elif shape == "integers":
        values = rng.integers(-50, 50, size=size).astype(np.float64)
    elif shape == "constant":
        values = np.full(size, rng.normal() * 1e3)
    else:  # symmetric: -a and a both present, the middle edge exactly at 0
        values = rng.uniform(-1, 1, size=size)
        values[:2] = (-1.0, 1.0)[: min(2, size)]
    with np.errstate(over="ignore", invalid="ignore"):
        values = values.astype(dtype)
    if size and np.dtype(dtype).kind == "f" and rng.random() < 0.3:
        values[rng.integers(0, size, size=3)] = rng.choice([np.nan, np.inf, -np.inf], size=3)
    return values


# Past summaries._CHUNK (16,384) values the sums go piece by piece; past _GROUP_ROW_MAX
# histograms are binned alone; 64 edges is where the edges leave Python floats for numpy.
_PINNED_VALUES = st.one_of(
    adversarial_arrays,
    st.builds(
        _seeded_values,
        st.sampled_from([np.float32, np.float32, np.float64, np.float16, np.int32, np.uint8]),
        st.one_of(
            st.integers(0, 5_000),
            st.sampled_from([10_000, summaries._CHUNK, summaries._CHUNK + 1]),
            st.integers(2 * summaries._CHUNK - 3, 2 * summaries._CHUNK + 3),
        ),
        st.sampled_from(["normal", "integers", "constant", "symmetric"]),
        st.integers(0, 2**32 - 1),
    ),
)


@settings(max_examples=300, deadline=None)
@given(_PINNED_VALUES, st.sampled_from([1, 2, 3, 10, 10, 16, 30, 64, 65, 200]))
def test_the_recorded_histogram_is_pinned_bit_for_bit(values, buckets):
    want = _recorded_histogram(values, buckets)
    assert _same_histogram(summaries.bin_histogram(values, buckets), want)
    # The writer's background thread bins through bin_histograms (same-size rows grouped).
    for binned in summaries.bin_histograms([(values.copy(), buckets)] * 3):
        assert _same_histogram(binned, want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_a_zero_min_or_max_is_recorded_as_plus_zero_whatever_the_dtype(dtype):
    """Which of -0.0 and 0.0 numpy's min and max return depends on the dtype's loop (float16's
    gave -0.0 where float64's gave 0.0, found by the pin above): the record says +0.0."""
    for values in ([-0.0, 0.0, -1.0], [0.0, -0.0, 1.0], [-0.0], [-0.0, 0.0]):
        arr = np.array(values, dtype)
        for binned in (summaries.bin_histogram(arr, 3), *summaries.bin_histograms([(arr, 3)] * 2)):
            zeros = [v for v in (binned["min"], binned["max"]) if v == 0]
            assert zeros and all(math.copysign(1.0, v) == 1.0 for v in zeros), (values, binned)
            edges = np.frombuffer(binned["edges"], "<f8")
            assert not np.signbit(edges[(edges == 0)]).any(), (values, edges)
        assert _same_histogram(summaries.bin_histogram(arr, 3), _recorded_histogram(arr, 3))


def test_a_histograms_two_sums_take_one_reduction_bit_for_bit_as_two(monkeypatch):
    # A 10,000-value histogram's binning is a dozen numpy calls, whose overhead is a quarter of
    # its cost: the sum and the sum of squares of the copied values come from one reduction
    # along two rows, each row summed in the pairwise order of a reduction of its own.
    reductions = []

    class Add:  # np.add, its reductions counted
        def __call__(self, *args, **kwargs):
            return np.add(*args, **kwargs)

        def reduce(self, *args, **kwargs):
            reductions.append(np.shape(args[0]))
            return np.add.reduce(*args, **kwargs)

    class Numpy:
        add = Add()

        def __getattr__(self, name):
            return getattr(np, name)

    values = np.random.default_rng(3).normal(size=10_000).astype(np.float32)
    want = _recorded_histogram(values, 10)
    monkeypatch.setattr(summaries, "np", Numpy())
    assert _same_histogram(summaries.bin_histogram(values, 10), want)
    assert reductions == [(2, 10_000)]
    # Past one piece of _CHUNK values, one reduction a piece.
    reductions.clear()
    values = np.random.default_rng(4).normal(size=summaries._CHUNK + 5).astype(np.float32)
    assert _same_histogram(summaries.bin_histogram(values, 7), _recorded_histogram(values, 7))
    assert reductions == [(2, summaries._CHUNK), (2, 5)]


def test_the_pin_refuses_a_binning_in_float32_arithmetic():
    # The tempting shortcut for float32 values (half the memory traffic: no float64 copy)
    # moves values at the edges to the neighbouring bin, which the pin above would catch.
    values = np.linspace(-1.0, 1.0, 1_001, dtype=np.float32)
    want = _recorded_histogram(values, 10)
    assert _same_histogram(summaries.bin_histogram(values, 10), want)
    lo, hi = float(values.min()), float(values.max())
    index = ((values - np.float32(lo)) * np.float32(10 / (hi - lo))).astype(np.int64)
    counts = np.bincount(index, minlength=11)
    counts[9] += counts[10]
    shortcut = {**want, "counts": counts[:10].astype("<f8").tobytes()}
    assert not _same_histogram(shortcut, want)


# Several histograms of one size (what bin_histograms bins as the rows of one array), with every
# special case _histogram treats apart (NaN, Inf, constants, huge values) among them.
_SAME_SIZE_JOBS = st.integers(1, 120).flatmap(
    lambda size: st.lists(
        st.tuples(
            st.one_of(
                hnp.arrays(
                    st.sampled_from(
                        [np.float16, np.float32, np.float64, np.int64, np.uint64, np.bool_]
                    ),
                    size,
                ),
                hnp.arrays(np.float64, size, elements=st.one_of(st.floats(), _EDGE_FLOATS)),
                st.builds(lambda v: np.full(size, v), st.floats(allow_nan=False)),
            ),
            st.integers(1, 70),
        ),
        min_size=1,
        max_size=12,
    )
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_SAME_SIZE_JOBS, min_size=1, max_size=3), st.randoms(use_true_random=False))
def test_histograms_binned_together_are_bit_for_bit_each_binned_alone(groups, rnd):
    jobs = [job for group in groups for job in group]
    rnd.shuffle(jobs)  # the groups interleave, as tags do in a batch
    finished: dict[int, dict] = {}

    def done(j, result):  # called once per job, as soon as it is binned
        assert j not in finished
        finished[j] = result

    got = summaries.bin_histograms([(values.copy(), n) for values, n in jobs], done)
    assert len(got) == len(jobs)
    assert all(finished[j] is result for j, result in enumerate(got))
    for (values, n), binned in zip(jobs, got, strict=True):
        assert _same_histogram(binned, summaries.bin_histogram(values, n)), (values, n)


def test_histograms_binned_in_groups_of_many_rows_are_each_as_alone():
    # Rows of 1,000 and of _GROUP_ROW_MAX values (grouped), one more and the benchmark's 10,000
    # (alone); a NaN, a constant and an overflowing row among the grouped ones; more rows than
    # one group holds.
    rng = np.random.default_rng(6)
    jobs = []
    limit = summaries._GROUP_ROW_MAX
    for size in (1_000, limit, limit + 1, 10_000):
        for i in range(2 * summaries._GROUP_VALUES // size + 3):
            values = (rng.normal(size=size) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
            jobs.append((values, [10, 64, 65, 200][i % 4]))
    jobs[3][0][17] = np.nan
    jobs[5][0][:] = 2.5
    jobs.append((np.full(1_000, 1e200), 10))
    got = summaries.bin_histograms(jobs)
    for (values, n), binned in zip(jobs, got, strict=True):
        assert _same_histogram(binned, summaries.bin_histogram(values, n))
    assert got[3]["nan"] == 1 and got[5]["min"] == got[5]["max"] == 2.5


# -- the writers and what they should hold ------------------------------------------------------


class Expected:
    """What each run should hold: scalar points per tag and events per kind, in call order."""

    def __init__(self) -> None:
        self.points: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        self.events: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        self.canaries: dict[str, int] = defaultdict(int)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("props")
    vdl = LogWriter(logdir / "vdl", telemetry=False)
    writers = {
        "api": attach(logdir, run="api", telemetry=False),
        "vdl": vdl,
        "tb": SummaryWriter(logdir / "tb", telemetry=False),
        "vdl/m": vdl.mode("m").writer,  # VisualDL 1.x: a mode is a sub-run
    }
    yield logdir, writers, Expected()
    for w in writers.values():
        w.close()


def call(env: tuple, run: str, method: str, *args: Any) -> bool:
    """Call ``method`` of the run's writer; True if accepted, False if refused with
    TypeError/ValueError. Anything else fails the test. A canary follows every call."""
    _, writers, expected = env
    try:
        getattr(writers[run], method)(*args)
        accepted = True
    except (TypeError, ValueError):
        accepted = False
    n = expected.canaries[run]
    writers[run].add_scalar("canary", float(n), n)
    expected.canaries[run] = n + 1
    return accepted


def alive(env: tuple, run: str) -> bool:
    """Whether the run's writer still has its background thread (one bad call must not kill it)."""
    writer = env[1][run]
    return getattr(writer, "writer", writer)._thread.is_alive()


def wall_of(walltime: Any, run: str) -> float | None:
    """The stored wall time of an accepted ``walltime`` (None: now, not checked)."""
    if walltime is None:
        return None
    wall = summaries.check_wall(walltime)
    if run == "vdl" and abs(wall) > MILLISECONDS_ABOVE:
        return wall / 1000.0
    return wall


def expect_point(env: tuple, run: str, tag: str, step: Any, value: Any, walltime: Any) -> None:
    env[2].points[run][tag].append(
        (summaries.to_step(step), summaries.to_float(value), wall_of(walltime, run))
    )


def expect_event(env: tuple, run: str, event: dict[str, Any], wall: float | None) -> None:
    data = {k: v for k, v in event.items() if k not in ("kind", "tag", "step", "wall")}
    env[2].events[run][event["kind"]].append((event["tag"], event["step"], wall, data))


# -- the calls ----------------------------------------------------------------------------------

RUNS = ["api", "vdl", "tb"]


@EXAMPLES
@given(run=st.sampled_from(RUNS), tag=tags, value=values, step=steps, walltime=walltimes)
def test_add_scalar(env, run, tag, value, step, walltime):
    if run == "tb" and step is None:
        step = 0  # global_step=None is step 0 (checked below as such)
    if call(env, run, "add_scalar", tag, value, step, walltime):
        expect_point(env, run, tag, step, value, walltime)
    assert alive(env, run), run


@EXAMPLES
@given(run=st.sampled_from(RUNS), main=tags, scalars=scalar_dicts, step=steps, walltime=walltimes)
def test_add_scalars(env, run, main, scalars, step, walltime):
    if run == "tb" and step is None:
        step = 0
    if call(env, run, "add_scalars", main, scalars, step, walltime):
        for key, value in scalars.items():
            expect_point(env, run, f"{main}/{key}", step, value, walltime)
    assert alive(env, run), run


@EXAMPLES
@given(run=st.sampled_from(RUNS), tag=tags, data=arrays, step=steps, walltime=walltimes, n=counts)
def test_add_histogram(env, run, tag, data, step, walltime, n):
    if run == "tb":
        accepted = call(env, run, "add_histogram", tag, data, step, n, walltime)
        step = 0 if step is None else step
    else:
        accepted = call(env, run, "add_histogram", tag, data, step, walltime, n)
    if accepted:
        wall = wall_of(walltime, run)
        event = summaries.histogram_event(tag, data, step, wall or 0.0, n)
        expect_event(env, run, event, wall)
    assert alive(env, run), run


@EXAMPLES
@given(
    run=st.sampled_from(RUNS),
    tag=tags,
    img=images,
    step=steps,
    walltime=walltimes,
    fmt=arg(st.just("HWC"), st.sampled_from(["CHW", "HW", "WHC", "NHWC", "hwc"])),
)
def test_add_image(env, run, tag, img, step, walltime, fmt):
    if (
        run == "tb" and isinstance(fmt, str) and fmt == "NHWC"
    ):  # SummaryWriter.add_images: a batch tiled into a grid
        img = img[None] if isinstance(img, np.ndarray) else img
        if call(env, run, "add_images", tag, img, step, walltime, fmt):
            step = 0 if step is None else step
            wall = wall_of(walltime, run)
            expect_event(env, run, summaries.image_event(tag, img, step, wall or 0.0, fmt), wall)
        assert alive(env, run), run
        return
    if call(env, run, "add_image", tag, img, step, walltime, fmt):
        step = 0 if step is None else step
        wall = wall_of(walltime, run)
        expect_event(env, run, summaries.image_event(tag, img, step, wall or 0.0, fmt), wall)
    assert alive(env, run), run


@EXAMPLES
@given(
    run=st.sampled_from(RUNS), tag=tags, text=texts, step=arg(st.none(), steps), walltime=walltimes
)
def test_add_text(env, run, tag, text, step, walltime):
    if call(env, run, "add_text", tag, text, step, walltime):
        if run == "tb" and step is None:
            step = 0
        wall = wall_of(walltime, run)
        expect_event(env, run, summaries.text_event(tag, text, step, wall or 0.0), wall)
    assert alive(env, run), run


@EXAMPLES
@given(
    run=st.sampled_from(RUNS),
    tag=tags,
    audio=arrays,
    step=steps,
    rate=arg(st.integers(1, 1_000_000), st.integers(-1, 2_000_000)),
    walltime=walltimes,
)
def test_add_audio(env, run, tag, audio, step, rate, walltime):
    if call(env, run, "add_audio", tag, audio, step, rate, walltime):
        step = 0 if step is None else step
        wall = wall_of(walltime, run)
        expect_event(env, run, summaries.audio_event(tag, audio, step, wall or 0.0, rate), wall)
    assert alive(env, run), run


@EXAMPLES
@given(run=st.sampled_from(RUNS), params=hparam_dicts, metrics=metric_lists, walltime=walltimes)
def test_add_hparams(env, run, params, metrics, walltime):
    if run == "tb":  # SummaryWriter.add_hparams(hparam_dict, metric_dict, ...) has no walltime
        if call(env, run, "add_hparams", params, metrics):
            expect_event(env, run, summaries.hparams_event(params, metrics, 0.0), None)
    elif call(env, run, "add_hparams", params, metrics, walltime):
        wall = wall_of(walltime, run)
        expect_event(env, run, summaries.hparams_event(params, metrics, wall or 0.0), wall)
    assert alive(env, run), run


@EXAMPLES
@given(
    run=st.sampled_from(RUNS),
    kind=st.sampled_from(["pr_curve", "roc_curve"]),
    tag=tags,
    truth=arg(labels),
    scores=arg(probabilities),
    step=steps,
    n=counts,
    weights=arg(st.none(), arrays),
    walltime=walltimes,
)
def test_add_curves(env, run, kind, tag, truth, scores, step, n, weights, walltime):
    if run == "tb" and kind == "roc_curve":
        kind = "pr_curve"  # SummaryWriter has no ROC curves
    if call(env, run, f"add_{kind}", tag, truth, scores, step, n, weights, walltime):
        step = 0 if step is None else step
        if run == "vdl" and type(n) is int:
            n = min(n, 127)
        wall = wall_of(walltime, run)
        build = summaries.pr_curve_event if kind == "pr_curve" else summaries.roc_curve_event
        expect_event(env, run, build(tag, truth, scores, step, wall or 0.0, n, weights), wall)
    assert alive(env, run), run


@EXAMPLES
@given(
    tag=tags,
    step=steps,
    value=values,
    text=texts,
    component=st.sampled_from(["scalar", "text", "histogram"]),
    buckets=counts,
)
def test_visualdl_1x_recorders(env, tag, step, value, text, component, buckets):
    _, writers, expected = env
    mode = writers["vdl"].mode("m")
    try:
        if component == "scalar":
            mode.scalar(tag).add_record(step, value)
        elif component == "text":
            mode.text(tag).add_record(step, text)
        else:
            mode.histogram(tag, buckets).add_record(step, value)
        accepted = True
    except (TypeError, ValueError):
        accepted = False
    n = expected.canaries["vdl/m"]
    writers["vdl/m"].add_scalar("canary", float(n), n)
    expected.canaries["vdl/m"] = n + 1
    assert alive(env, "vdl/m")
    if not accepted:
        return
    if component == "scalar":
        expect_point(env, "vdl/m", tag, step, value, None)
    elif component == "text":
        expect_event(env, "vdl/m", summaries.text_event(tag, text, step, 0.0), None)
    else:
        expect_event(env, "vdl/m", summaries.histogram_event(tag, value, step, 0.0, buckets), None)


MADE = itertools.count()


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    make=st.sampled_from(["LogWriter", "SummaryWriter"]),
    logdir=arg(st.text(alphabet="abc/.", min_size=1, max_size=8)),
    comment=arg(st.text(alphabet="abc", max_size=4), any_text),
    display_name=arg(st.text(max_size=4), any_text),
)
def test_constructors(env, tmp_path_factory, make, logdir, comment, display_name):
    root = Path(env[0]) / "made"
    root.mkdir(exist_ok=True)
    if isinstance(logdir, str):  # keep every directory it may create under the test's own
        parts = [p for p in logdir.split("/") if p not in ("", "..")]
        logdir = str(root.joinpath(*parts)) if parts else logdir
    cwd = os.getcwd()
    os.chdir(root)  # without a directory the facades record under ./runs
    try:
        if make == "LogWriter":
            writer = LogWriter(logdir, comment, display_name=display_name, telemetry=False)
        else:
            writer = SummaryWriter(logdir, comment, telemetry=False)
    except (TypeError, ValueError):
        return
    finally:
        os.chdir(cwd)
    made = next(MADE)
    try:
        writer.add_scalar("x", float(made), made)  # runs may repeat: each example's own point
        assert writer.writer._thread.is_alive()
    finally:
        writer.close()
    if not isinstance(logdir, str) or not logdir.startswith(str(root)):
        return
    with recorder.RunReader(writer.logdir) as reader:
        assert reader.read_scalars("x").values.tolist()[-1] == float(made)


# -- the verdict --------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equality with NaN equal to NaN, through dicts and lists."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_everything_accepted_is_on_disk_and_every_thread_alive(env):
    logdir, writers, expected = env
    for run, writer in writers.items():
        core = getattr(writer, "writer", writer)  # a facade's Writer
        assert core._thread.is_alive(), run
        assert core.flush(timeout=30) is True, run
        points: dict[str, list] = defaultdict(list)
        events: dict[str, list] = defaultdict(list)
        with recorder.RunReader(os.path.join(logdir, run)) as reader:
            for record in reader.iter_records():
                if record.kind == "scalars":
                    s = record.data
                    points[record.tag] += zip(
                        s.steps.tolist(), s.values.tolist(), s.walls.tolist(), strict=True
                    )
                elif record.kind in summaries_kinds:
                    events[record.kind].append(record)
        canaries = points.pop("canary", [])
        assert [p[1] for p in canaries] == [float(n) for n in range(expected.canaries[run])]
        assert points.keys() == expected.points[run].keys(), run
        for tag, want in expected.points[run].items():
            got = points[tag]
            assert len(got) == len(want), (run, tag)
            for (step, value, wall), (s, v, w) in zip(want, got, strict=True):
                # Wall times are kept to the microsecond, live and on disk alike.
                kept = None if wall is None else float(quantize_walls(np.array([wall]))[0])
                assert s == step and same(v, value) and (wall is None or w == kept), (run, tag)
        for kind, want in expected.events[run].items():
            got = events.pop(kind, [])
            assert len(got) == len(want), (run, kind)
            for (tag, step, wall, data), record in zip(want, got, strict=True):
                assert (record.tag, record.step) == (tag, step), (run, kind)
                assert wall is None or record.wall == wall, (run, kind)
                assert same(dict(record.data), data), (run, kind, tag)
        assert not events, (run, list(events))
    accepted = sum(len(p) for r in expected.points.values() for p in r.values())
    accepted_events = {k for r in expected.events.values() for k, v in r.items() if v}
    print(f"accepted: {accepted} points, event kinds {sorted(accepted_events)}")
    if sum(expected.canaries.values()) >= 300:  # the whole module ran: the test tested something
        assert accepted >= 20 and len(accepted_events) >= 5


summaries_kinds = {
    "histogram",
    "image",
    "text",
    "audio",
    "hparams",
    "pr_curve",
    "roc_curve",
}
