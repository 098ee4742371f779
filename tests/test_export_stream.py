"""Streaming export: the same bytes as the row-by-row writer, in constant memory, off the loop."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import recorder
from recorder.reader_pool import usable_cores
from tests.conftest import http_get, http_request
from vdl_stream.interop import CSV_HEADER, Export, _csv_cell
from vdl_stream.server import run_server

REPO = Path(__file__).resolve().parent.parent


def reference(run_dir: Path, fmt: str, pattern: str | None = None) -> bytes:
    """The export as the row-by-row writer produced it before streaming (the byte-exact spec)."""
    import re

    regex = re.compile(pattern) if pattern else None
    tags: list[tuple[str, list]] = []
    with recorder.RunReader(run_dir) as reader:
        for tag in sorted(t for t, i in reader.tags().items() if i.kind == "scalars"):
            if regex is None or regex.search(tag):
                s = reader.read_scalars(tag)
                tags.append(
                    (
                        tag,
                        list(
                            zip(s.steps.tolist(), s.walls.tolist(), s.values.tolist(), strict=True)
                        ),
                    )
                )
        fields: dict[str, list] = {}
        for record in reader.read_records(kind="telemetry"):
            data = record.data
            prefix = f"telemetry/{data.get('host', 'host')}/rank{data.get('rank', 0)}/"
            for name, value in (data.get("fields") or {}).items():
                if regex is None or regex.search(prefix + name):
                    fields.setdefault(prefix + name, []).append((None, record.wall, float(value)))
        tags.extend(sorted(fields.items()))
    out = io.StringIO()
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["tag", "step", "wall_time", "value"])
        for tag, rows in tags:
            for step, wall, value in rows:
                w.writerow([tag, "" if step is None else step, repr(wall), repr(value)])
    else:
        out.write("{")
        for i, (tag, rows) in enumerate(tags):
            out.write(("," if i else "") + "\n" + json.dumps(tag) + ": [")
            out.write(
                ", ".join(
                    f"[{wall!r}, {'null' if step is None else step}, "
                    f"{repr(value) if math.isfinite(value) else 'null'}]"
                    for step, wall, value in rows
                )
            )
            out.write("]")
        out.write("\n}\n")
    return out.getvalue().encode()


@pytest.fixture(scope="module")
def tricky(tmp_path_factory) -> Path:
    """A run with restarts, NaN and infinities, extreme magnitudes, odd tag names, telemetry."""
    run = tmp_path_factory.mktemp("logs") / "tricky"
    rng = np.random.default_rng(7)
    specials = np.array([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 5e-324, 1.7976931348623157e308,
                         1e16, 1e15, 123456789012345678.0, 1e-5, 1e-4, 0.1, -2.5, 3.0])  # fmt: skip
    with recorder.RunWriter(run, sync="never") as w:
        for tag in ("loss", 'a,"quoted"\ntag', "100%/sure", "ünïcode/λ"):
            steps = np.arange(1000)
            values = np.concatenate([specials, rng.standard_normal(1000 - len(specials)) * 1e3])
            w.append_scalars(tag, steps, 1.7e9 + rng.random(1000) * 1e5, values)
        back = np.arange(500, 600)  # a restart: steps 500.. are superseded
        w.append_scalars("loss", back, np.full(100, 1.8e9), -back.astype(float))
        for i in range(30):
            fields = {"gpu0/util": float(i), "cpu/percent": i * 0.1, "ram/used": 2.0**40 + i}
            data = {"host": "node-1", "rank": 0, "fields": fields}
            w.append_record("telemetry", None, None, 1.75e9 + i, data)
    return run


@pytest.fixture(params=["orjson", "repr"])
def formatter(request, monkeypatch):
    """Both ways of formatting numbers: orjson (when installed) and Python's repr()."""
    from vdl_stream import interop

    if request.param == "repr":
        monkeypatch.setattr(interop, "_orjson", None)
    elif interop._orjson is None:
        pytest.skip("orjson is not installed")
    return request.param


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize(("chunk_rows", "threads"), [(1, 0), (7, 3), (65536, 0), (65536, 1)])
def test_streamed_export_is_byte_identical_to_the_row_writer(
    tricky, fmt, chunk_rows, threads, formatter
):
    with Export(tricky, fmt, chunk_rows=chunk_rows, threads=threads) as export:
        chunks = list(export)
    assert all(type(chunk) is bytes for chunk in chunks)  # as documented (an ASGI body is bytes)
    got = b"".join(chunks)
    assert got == reference(tricky, fmt)
    assert export.rows == 3 * 1000 + 600 + 3 * 30 and export.tags == 4 + 3
    if fmt == "json":
        json.loads(got.replace(b"nan", b"null"))  # valid JSON apart from NaN wall times
    else:
        assert len(list(csv.reader(io.StringIO(got.decode())))) == 1 + export.rows


def test_numbers_are_formatted_as_repr_writes_them(formatter):
    from vdl_stream.interop import _csv_rows, _json_rows

    rng = np.random.default_rng(3)
    n = 200_000
    x = 10.0 ** rng.uniform(-30, 30, n) * rng.choice([-1.0, 1.0], n)
    x[:1000] = rng.random(1000)
    edges = [1e-4, -1e-4, np.nextafter(1e-4, 0), 1e16, np.nextafter(1e16, 0), 0.0, -0.0,
             np.nan, np.inf, -np.inf, 5e-324, 1.7976931348623157e308, 9007199254740993.0]  # fmt: skip
    x[1000 : 1000 + len(edges)] = edges
    steps = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    expected = "".join(
        f"t,{s},{w!r},{v!r}\n"
        for s, w, v in zip(steps.tolist(), x.tolist(), x[::-1].tolist(), strict=True)
    )
    assert bytes(_csv_rows("t", steps, x, x[::-1].copy())).decode() == expected
    expected = ", ".join(
        f"[{w!r}, null, {repr(v) if math.isfinite(v) else 'null'}]"
        for w, v in zip(x.tolist(), x[::-1].tolist(), strict=True)
    )
    assert bytes(_json_rows(None, x, x[::-1].copy())).decode() == expected


#: Values where repr() and orjson part ways, or that stress the layout: exponent notation and its
#: edges, signed zeros, subnormals, the extremes, integers above 2**53.
EDGES = [1e-4, -1e-4, float(np.nextafter(1e-4, 0)), 1e16, float(np.nextafter(1e16, 0)), 0.0, -0.0,
         math.nan, math.inf, -math.inf, 5e-324, -5e-324, 2.2250738585072014e-308,
         1.7976931348623157e308, 9007199254740993.0, 1e15, 123456789.12345679, 0.1, -2.5]  # fmt: skip
F8 = st.one_of(st.floats(width=64, allow_nan=True, allow_infinity=True), st.sampled_from(EDGES))
I8 = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.integers(-1000, 10**6), st.sampled_from([0, -1, 2**53])
)


def reference_rows(fmt: str, tag: str, steps: list | None, walls: list, values: list) -> str:
    """Rows as the row-by-row writer formats them (repr() of every float)."""
    cell = _csv_cell(tag)
    steps = [None] * len(walls) if steps is None else steps
    if fmt == "csv":
        return "".join(
            f"{cell},{'' if s is None else s},{w!r},{v!r}\n"
            for s, w, v in zip(steps, walls, values, strict=True)
        )
    return ", ".join(
        f"[{w!r}, {'null' if s is None else s}, {repr(v) if math.isfinite(v) else 'null'}]"
        for s, w, v in zip(steps, walls, values, strict=True)
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(I8, F8, F8), min_size=1, max_size=80),
    with_steps=st.booleans(),
    tag=st.sampled_from(["t", "loss", 'a,"q"\nb', "ünï/λ", "x" * 70, "%d%r"]),
)
def test_fast_rows_are_repr_rows_for_any_f8(rows, with_steps, tag):
    """The orjson + numpy layout gives the bytes of repr() formatting, whatever the numbers."""
    from vdl_stream import interop

    if interop._orjson is None:
        pytest.skip("orjson is not installed")
    s = np.array([r[0] for r in rows], np.int64) if with_steps else None
    w = np.array([r[1] for r in rows], np.float64)
    v = np.array([r[2] for r in rows], np.float64)
    steps = s.tolist() if with_steps else None
    csv_rows = reference_rows("csv", tag, steps, w.tolist(), v.tolist()).encode()
    json_rows = b"head" + reference_rows("json", tag, steps, w.tolist(), v.tolist()).encode()
    for few in (interop._FEW_FIELDS, 0):  # respelled one by one, and by the numpy passes
        with mock.patch.object(interop, "_FEW_FIELDS", few):
            assert interop._csv_rows(_csv_cell(tag), s, w, v) == csv_rows
            assert interop._json_rows(s, w, v, b"head") == json_rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    digits=st.integers(1, 19),
    negative=st.booleans(),
    picks=st.lists(st.floats(0, 1), min_size=1, max_size=60),
    walls=st.lists(F8, min_size=60, max_size=60),
    values=st.lists(F8, min_size=60, max_size=60),
    tag=st.sampled_from(["", "t", "lo", "los", "loss", 'a,"q"\nb', "ünï/λ", "x" * 70]),
)
def test_steps_of_one_width_are_laid_out_in_slots_as_repr(
    digits, negative, picks, walls, values, tag
):
    """Steps all of one width (a block of a counter) go through the slot rows (_json_slots,
    _csv_slots): every width 1 to 20 with the sign, the ends of each width, any floats beside
    them, CSV tag cells of every length modulo a word (the step's words start after them)."""
    from vdl_stream import interop

    if interop._orjson is None:
        pytest.skip("orjson is not installed")
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    if negative:
        low, high = -min(high, 2**63 - 1), -max(low, 1)
    high = min(high, 2**63 - 1)
    steps = [low, high] + [min(high, low + int(p * (high - low))) for p in picks]
    n = len(steps)
    s, w, v = np.array(steps, np.int64), np.array(walls[:n]), np.array(values[:n])
    assert interop._step_width(s) == len(str(low))  # the slot path is taken
    expected = reference_rows("json", "t", steps, walls[:n], values[:n])
    assert interop._json_rows(s, w, v, b"head") == b"head" + expected.encode()
    assert interop._json_rows(None, w, v) == reference_rows("json", "t", None, w.tolist(),
                                                             v.tolist()).encode()  # fmt: skip
    cell = _csv_cell(tag)
    expected = reference_rows("csv", tag, steps, walls[:n], values[:n])
    assert interop._csv_rows(cell, s, w, v) == expected.encode()
    expected = reference_rows("csv", tag, None, w.tolist(), v.tolist())
    assert interop._csv_rows(cell, None, w, v) == expected.encode()


#: Microseconds of walls at the edges of :func:`_micro_walls`: 1 s, powers of ten, fractions with
#: every count of trailing zeros, the last microsecond below 2**33 s.
MICRO_EDGES = [10**6, 10**6 + 1, 10**7, 10**12, 9_999_999_999, 1_790_001_638_420_000,
               1_790_001_638_000_000, 1_790_001_638_100_000, 1_790_001_638_999_999,
               1_790_001_638_000_001, 8_589_934_591_999_999, 8_589_934_590_000_000]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    digits=st.integers(1, 10),
    picks=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 6)), min_size=1, max_size=60),
    edges=st.lists(st.sampled_from(MICRO_EDGES), max_size=3),
)
def test_walls_in_whole_microseconds_are_formatted_as_repr(digits, picks, edges):
    """Wall times as the recorder stores them (whole microseconds, ``us / 1e6``) are formatted
    from digit tables (_micro_walls), in JSON and CSV rows: any integer width from 1 to 10
    digits, fractions with 0 to 6 places, the edges; walls of mixed widths or not whole
    microseconds take orjson's digits."""
    from vdl_stream import interop

    if interop._orjson is None:
        pytest.skip("orjson is not installed")
    low = max(10 ** (digits - 1), 1)
    high = min(10**digits, int(interop._MICRO_WALLS_BELOW))
    us = [
        int(low + p * (high - low - 1)) * 10**6 + int(p * 999_999) // 10**places * 10**places
        for p, places in picks
    ]
    w = np.array(us, np.int64) / 1e6
    assert interop._micro_walls(w) is not None
    within = (np.array(us, np.int64) % 10**9 + 1_790_000_000 * 10**6) / 1e6  # 1,000 s at most
    for walls in (w, within, np.array(us + edges, np.int64) / 1e6, w + 1e-7, w - 0.5):
        n = len(walls)
        fields = interop._micro_walls(walls)
        if fields is not None:
            _check_wall_fields(walls, (fields[0], fields[1], fields[2] - 1), b"], [%s", 3)
            _check_csv_wall_fields(walls, interop._micro_walls(walls, bracket=False))
        steps = np.arange(n, dtype=np.int64) + 10**6
        values = np.linspace(-1, 1, n)
        expected = reference_rows("json", "t", steps.tolist(), walls.tolist(), values.tolist())
        assert interop._json_rows(steps, walls, values) == expected.encode()
        expected = reference_rows("csv", "t", steps.tolist(), walls.tolist(), values.tolist())
        assert interop._csv_rows("t", steps, walls, values) == expected.encode()


#: Seconds where a block's walls change digits: powers of ten (the integer part's width), and the
#: fourth, fifth and eighth digits from the end of seconds since the epoch (the upper digits a
#: block shares: their value, and each of their words); 1 and 0 are the edges below.
WALL_BOUNDARIES = [0, 1, 10, 1000, 10**4, 10**5, 10**8, 10**9, 1_790_001_000, 1_790_010_000,
                   1_800_000_000, 2**33 - 1000]  # fmt: skip


def _check_wall_fields(walls: np.ndarray, fields: tuple, form: bytes, before: int) -> None:
    """Assert _micro_walls' ``fields`` of ``walls``, with the ``before`` bytes in front of each,
    are ``form % repr(wall)``: JSON's ``[w`` with the row before's ``], `` in front (what
    _json_slots copies with it), or CSV's ``,w``; the comma after each, counted in its length
    and brought by the step's or the value's item, is left out of ``fields``' lengths here."""
    text, starts, lengths = fields
    got = [bytes(text[a - before : a + k]) for a, k in zip(starts, lengths, strict=True)]
    assert got == [form % repr(x).encode() for x in walls.tolist()]


def _check_csv_wall_fields(walls: np.ndarray, fields: tuple) -> None:
    """Assert _micro_walls' CSV ``fields`` of ``walls`` are ``,w`` (the step's comma before the
    wall, what _csv_slots copies with it), their lengths counting the comma after the wall that
    the value's item brings."""
    text, starts, lengths = fields
    _check_wall_fields(walls, (text, starts, lengths - 1), b",%s", 1)


def _check_walls(walls: np.ndarray) -> None:
    """Assert ``walls`` are formatted as repr() writes them, in _micro_walls' fields where it
    takes them (it must where they are whole microseconds of one integer width from 1 s to 2**33
    s) and in JSON and CSV rows."""
    from vdl_stream import interop

    listed = walls.tolist()
    us = np.rint(walls * 1e6)
    widths = {len(str(int(x))) for x in listed}
    fast = bool(
        (us / 1e6 == walls).all() and walls.min() >= 1 and walls.max() < 2**33 and len(widths) == 1
    )
    fields = interop._micro_walls(walls)
    assert (fields is not None) == fast
    if fields is not None:
        _check_wall_fields(walls, (fields[0], fields[1], fields[2] - 1), b"], [%s", 3)
        _check_csv_wall_fields(walls, interop._micro_walls(walls, bracket=False))
    n = len(walls)
    steps = np.arange(n, dtype=np.int64) + 7
    values = np.linspace(-1, 1, n)
    expected = reference_rows("json", "t", steps.tolist(), listed, values.tolist())
    assert interop._json_rows(steps, walls, values) == expected.encode()
    expected = reference_rows("csv", "t", steps.tolist(), listed, values.tolist())
    assert interop._csv_rows("t", steps, walls, values) == expected.encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    boundary=st.sampled_from(WALL_BOUNDARIES),
    offsets=st.lists(
        st.integers(-3 * 10**6, 3 * 10**6)  # a few seconds either side
        | st.integers(-70_000 * 10**6, 70_000 * 10**6)  # past _FEW_UPPER thousands of seconds
        | st.sampled_from([-1, 0, 1, -(10**6), 10**6]),
        min_size=1,
        max_size=60,
    ),
    whole=st.booleans(),
    ordered=st.booleans(),
)
def test_walls_across_a_digit_boundary_are_formatted_as_repr(boundary, offsets, whole, ordered):
    """A block's walls that cross a boundary of their digits (9999.999999 -> 10000.0, a wall
    crossing 10**k or 2**33 s, the upper digits a block shares changing value or word) are
    formatted as repr() writes them, as are whole seconds, zero and negative walls (not
    _micro_walls': below 1 s), in any order."""
    from vdl_stream import interop

    if interop._orjson is None:
        pytest.skip("orjson is not installed")
    us = [boundary * 10**6 + o for o in offsets]
    if whole:
        us = [u // 10**6 * 10**6 for u in us]
    if ordered:
        us.sort()
    _check_walls(np.array(us, np.int64) / 1e6)


@pytest.mark.parametrize("seconds", [0.5, 1_311, 63_000, 64_000, 200_000])
def test_walls_sharing_their_upper_digits_take_each_path(seconds):
    """Walls of a block sharing one value of their upper digits (all but the last three of the
    integer part: one broadcast), a few (formatted once each: a broadcast down each run of one
    value where sorted, else a gather from a table of them), or more than _FEW_UPPER (digit by
    digit) are formatted as repr() writes them, in order and out of order."""
    from vdl_stream import interop

    if interop._orjson is None:
        pytest.skip("orjson is not installed")
    n = 4096
    us = 1_790_000_000 * 10**6 + np.linspace(0, seconds * 10**6, n).astype(np.int64)
    us[1::7] += 3  # fractions of every length
    walls = us / 1e6
    upper = np.unique(us // 10**9)
    assert len(upper) == (1 if seconds < 1000 else int(seconds // 1000) + 1)
    _check_walls(walls)
    # Out of order: the same values in more runs than _FEW_UPPER (sorted walls' runs are
    # broadcast one by one; these are gathered from the table).
    shuffled = np.random.default_rng(7).permutation(walls)
    runs = 1 + np.count_nonzero(np.diff(shuffled // 1000))
    assert runs > interop._FEW_UPPER or len(upper) == 1
    _check_walls(shuffled)


def test_steps_of_mixed_widths_take_the_field_layout():
    """Steps whose widths differ (a block crossing a power of ten, signs mixed, the int64
    minimum) are laid out field by field, with the same bytes."""
    from vdl_stream import interop

    if interop._orjson is None:
        pytest.skip("orjson is not installed")
    for steps in ([9, 10], [-1, 1], [-5, 0], [99_999, 100_000], [-(2**63), -(2**63) + 1]):
        assert interop._step_width(np.array(steps, np.int64)) is None
        w = np.array([1.5, 1790001638.42])
        expected = reference_rows("json", "t", steps, w.tolist(), [0.1, math.nan])
        assert interop._json_rows(np.array(steps), w, np.array([0.1, math.nan])) == (
            expected.encode()
        )
        expected = reference_rows("csv", "t", steps, w.tolist(), [0.1, math.nan])
        assert interop._csv_rows("t", np.array(steps), w, np.array([0.1, math.nan])) == (
            expected.encode()
        )


def test_columns_of_small_and_huge_values_are_respelled_as_repr(formatter):
    """Whole columns in exponent notation (a learning rate below 1e-4, counters from 1e16):
    orjson's spelling rewritten in numpy, every kind at once, signs and exponent widths mixed."""
    from vdl_stream.interop import _csv_rows, _json_rows

    rng = np.random.default_rng(12)
    n = 20_000
    parts = [
        3e-5 * (1 + np.cos(np.arange(n // 4) * 1e-3)) + 1e-7,  # 1e-7 .. 6e-5: e-0X and 0.0000X
        10.0 ** rng.uniform(-12, -4, n // 4),  # one- and two-digit negative exponents
        10.0 ** rng.uniform(16, 308, n // 4),  # e+NN, e+NNN
        rng.choice(np.array(EDGES), n // 4),
    ]
    x = np.concatenate(parts) * rng.choice([1.0, -1.0], n)
    rng.shuffle(x)
    steps = np.arange(n, dtype=np.int64)
    expected = reference_rows("csv", "lr", steps.tolist(), x.tolist(), x[::-1].tolist())
    assert _csv_rows("lr", steps, x, x[::-1].copy()) == expected.encode()
    expected = reference_rows("json", "lr", None, x[::-1].tolist(), x.tolist())
    assert _json_rows(None, x[::-1].copy(), x) == expected.encode()


@pytest.mark.parametrize("sep", [b"", b","])
def test_a_compact_column_has_a_comma_before_each_field_but_the_first(sep):
    """_numbers' fields with no ``pre`` and ``sep`` none or a comma: the byte before each but
    the first is a comma, orjson's or one written before a respelled field (exponent notation,
    non-finite), so _csv_slots takes a value's item with the comma before it; with no ``sep``
    the fields are the digits alone."""
    from vdl_stream.interop import _numbers

    rng = np.random.default_rng(13)
    x = rng.choice(np.array(EDGES), 3000) * 10.0 ** rng.integers(-8, 20, 3000)
    x[::3] = rng.standard_normal(1000)
    text, starts, lengths = _numbers(x, sep)
    got = [bytes(text[a - 1 : a + k]) for a, k in zip(starts, lengths, strict=True)]
    assert got[0][1:] == repr(float(x[0])).encode() + sep
    assert got[1:] == [b",%s%s" % (repr(v).encode(), sep) for v in x[1:].tolist()]


def test_a_block_of_rows_of_every_width():
    """Fields of 1 to 24 bytes side by side, shorter and longer than a word, in one block."""
    from vdl_stream.interop import _csv_rows, _json_rows

    rng = np.random.default_rng(11)
    raw = (rng.random(5000) * 10.0 ** rng.integers(-4, 16, 5000)).tolist()
    places = rng.integers(0, 17, 5000).tolist()
    w = np.array([round(x, d) for x, d in zip(raw, places, strict=True)])
    v = rng.choice(np.array(EDGES), 5000) * rng.choice([1.0, -1.0], 5000)
    s = rng.integers(-(10 ** rng.integers(0, 19, 5000)), 10 ** rng.integers(0, 19, 5000))
    expected = reference_rows("csv", "t", s.tolist(), w.tolist(), v.tolist())
    assert _csv_rows("t", s, w, v) == expected.encode()
    expected = reference_rows("json", "t", None, w.tolist(), v.tolist())
    assert _json_rows(None, w, v) == expected.encode()


def test_closing_an_export_early_stops_its_workers(long_run):
    export = Export(long_run, "json", chunk_rows=1 << 14, threads=2)
    chunks = iter(export)
    assert next(chunks) == b"{" and next(chunks).startswith(b'\n"loss": [[')
    export.close()
    deadline = time.monotonic() + 30
    while any(t.name.startswith("vdl-export") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "export worker threads still running"
        time.sleep(0.01)  # polling a condition under a deadline
    with pytest.raises(ValueError, match="threads must be an int >= 0 or None, got -1"):
        Export(long_run, "csv", threads=-1)


def test_a_child_formats_wherever_there_are_two_cores():
    """However busy the cores: on busy ones the child costs what formatting in the server would
    (docs/performance.md, "Export through the server")."""
    from vdl_stream.interop import export_in_child

    assert export_in_child(2) and export_in_child(16)
    assert not export_in_child(1)
    assert export_in_child() == (usable_cores() >= 2)


def test_an_export_counts_the_cores_it_may_run_on(monkeypatch):
    """A process pinned to one core (taskset, a container's cpuset) formats in no child and in
    one process, however many the machine has."""
    from vdl_stream import interop

    monkeypatch.delenv(interop.CHILD_PROCESSES_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert usable_cores() == 1
    assert not interop.export_in_child() and interop.child_processes() == 1
    assert interop.child_threads() == 1 and interop.export_threads(load=0.0) == 0


def test_the_child_formats_in_a_thread_per_core_beyond_two():
    from vdl_stream.interop import EXPORT_THREADS_MAX, child_threads

    assert child_threads(1) == child_threads(2) == child_threads(3) == 1
    assert child_threads(4) == 2 and child_threads(64) == EXPORT_THREADS_MAX
    assert 1 <= child_threads() <= EXPORT_THREADS_MAX


def test_the_child_threads_can_be_set_for_a_comparison(monkeypatch):
    from vdl_stream.interop import CHILD_THREADS_ENV, child_threads

    monkeypatch.setenv(CHILD_THREADS_ENV, "0")
    assert child_threads(16) == 0
    monkeypatch.setenv(CHILD_THREADS_ENV, "3")
    assert child_threads(2) == 3
    monkeypatch.setenv(CHILD_THREADS_ENV, "-1")
    with pytest.raises(ValueError, match=r"VDL_STREAM_EXPORT_CHILD_THREADS .*'-1'"):
        child_threads()


def test_threads_by_default_are_the_idle_cores():
    """Formatting threads only where at least two cores are idle, at most EXPORT_THREADS_MAX."""
    from vdl_stream import interop
    from vdl_stream.interop import EXPORT_THREADS_MAX, export_threads

    assert export_threads(2, 0.2) == 2  # a quiet 2-core machine
    assert export_threads(2, 0.6) == 0 and export_threads(2, 9.0) == 0  # busy: the GIL costs more
    assert export_threads(16, 3.0) == EXPORT_THREADS_MAX == 4
    assert export_threads(4, 1.4) == 3
    assert export_threads(1, 0.0) == 0
    assert 0 <= export_threads() <= EXPORT_THREADS_MAX and interop._load() >= 0


def test_a_pattern_and_no_match(tricky):
    with Export(tricky, "json", "^loss$|gpu") as export:
        assert b"".join(export) == reference(tricky, "json", "^loss$|gpu")
    with Export(tricky, "json", "nothing") as export:
        assert b"".join(export) == b"{\n}\n" and export.tags == 0
    with pytest.raises(ValueError, match="fmt must be one of"):
        Export(tricky, "xml")


def write_long_run(path: Path, points: int) -> None:
    with recorder.RunWriter(path, sync="never") as w:
        step = 0
        for lo in range(0, points, 1 << 20):
            s = np.arange(lo, min(points, lo + (1 << 20)))
            w.append_scalars("loss", s, 1.7e9 + s * 0.02, np.sin(s * 1e-3))
            step += len(s)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("long") / "long"
    write_long_run(run, 3_000_000)
    return run


def test_cli_export_runs_in_constant_memory(long_run, tmp_path):
    """3M points: the whole export would hold hundreds of MB; the stream holds a chunk."""
    out = tmp_path / "out.csv"
    probe = (
        "import sys; from vdl_stream.cli import main; "
        "code = main(['export', sys.argv[1], '-o', sys.argv[2]]); "
        # VmHWM, not ru_maxrss: that one keeps the forking parent's peak across exec
        "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]); sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(long_run), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    peak_mb = int(done.stdout.split()[-1]) // 1024
    assert "exported 3,000,000 rows" in done.stderr
    assert peak_mb < 120, f"peak RSS {peak_mb} MB"
    with open(out, "rb") as f:
        assert f.readline() == b"tag,step,wall_time,value\n"
        assert f.readline() == f"loss,0,{1.7e9!r},0.0\n".encode()
        f.seek(-64, os.SEEK_END)
        last = f.read().splitlines()[-1].decode().split(",")
    assert last[:2] == ["loss", "2999999"] and float(last[3]) == math.sin(2999999 * 1e-3)


def test_cli_export_to_a_fifo_writes_it_in_place(tricky, tmp_path):
    """``-o`` naming a FIFO or a device (``/dev/null``) writes it: a rename of a temporary file
    over it (what a regular file gets) would replace it, as root even ``/dev/null``."""
    from vdl_stream.cli import main

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    hold = os.open(fifo, os.O_WRONLY)  # the reader sees no end before the export's
    os.set_blocking(read, True)
    got: list = []
    reader = threading.Thread(target=read_pipe, args=(read, got))
    reader.start()
    try:
        assert main(["export", str(tricky), "--tag", "^loss$", "-o", str(fifo)]) == 0
    finally:
        os.close(hold)
        reader.join(60)  # it closes ``read``
    assert not reader.is_alive()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert not os.path.exists(str(fifo) + ".tmp")
    assert b"".join(got) == reference(tricky, "csv", "^loss$")


def read_export(url: str, keep: int = 1 << 21) -> tuple[int, str, int, bytes]:
    """GET an export ``url`` (blocking), read in 1 MB pieces: its status, content type, count
    of newlines and first ``keep`` bytes. The body is never held whole: joining 150 MB would
    hold this process's GIL (and so the server's event loop, in the same process) for a while."""
    import urllib.request

    lines, head = 0, b""
    with urllib.request.urlopen(url, timeout=30) as response:
        while piece := response.read(1 << 20):
            lines += piece.count(b"\n")
            if len(head) < keep:
                head += piece[: keep - len(head)]
        return response.status, response.headers["Content-Type"], lines, head


async def test_http_export_streams_without_stalling_the_loop(long_run, nursery):
    """3M rows (through a child process where there are two cores, in worker threads
    elsewhere): the server's event loop keeps its timers and answers /api/stats meanwhile.

    The loop is this test's own (the server runs in its nursery): a task sleeping 10 ms at a time
    measures how late each wake-up comes. The client reads the body in pieces, so nothing in this
    process holds the GIL for long but what the test is about (the /api/stats latencies it used
    to bound also counted the client's join of the whole body, and swung with the machine's
    load)."""
    url = await nursery.start(partial(run_server, long_run.parent, "127.0.0.1", 0))
    statuses: list[int] = []
    late: list[float] = []
    done = trio.Event()

    async def poll_stats() -> None:
        while not done.is_set():
            status, _ = await trio.to_thread.run_sync(http_get, url + "/api/stats")
            statuses.append(status)
            await trio.sleep(0.02)

    async def tick() -> None:
        while not done.is_set():
            t0 = trio.current_time()
            await trio.sleep(0.01)
            late.append(trio.current_time() - t0 - 0.01)

    with trio.fail_after(120):
        async with trio.open_nursery() as inner:
            inner.start_soon(poll_stats)
            inner.start_soon(tick)
            status, kind, lines, head = await trio.to_thread.run_sync(
                read_export, url + "/api/export?run=long&format=csv"
            )
            done.set()
    assert status == 200 and kind.startswith("text/csv")
    assert lines == 1 + 3_000_000
    with Export(long_run, "csv", chunk_rows=1 << 20) as export:
        chunks = iter(export)
        first = next(chunks) + next(chunks)
    assert len(first) < len(head) and head.startswith(first)
    assert len(statuses) >= 5 and set(statuses) == {200}, statuses
    # Wake-ups come 0.01-0.17 s late on these 2 shared cores at a load average of 9-11 (the
    # process waits for a core, or for the GIL); an export formatted in the loop holds it for
    # seconds.
    assert len(late) >= 10 and max(late) < 1.0, sorted(late)[-5:]


@pytest.mark.skipif(
    not hasattr(__import__("resource"), "RUSAGE_THREAD"), reason="per-thread page faults: Linux"
)
async def test_the_relay_reuses_its_buffers(long_run, nursery, monkeypatch):
    """3M rows of JSON (150 MB) through a child: the server's event loop, which passes the
    child's output on, faults few pages in. Each 1 MB chunk and h11's copy of it with its
    header came fresh from the kernel with glibc's default thresholds (about 260 page faults
    per MB, a fifth of the server's CPU through a long export); kept, they are reused."""
    import resource

    from vdl_stream.interop import _keep_freed_memory

    monkeypatch.setattr("vdl_stream.server.export_in_child", lambda: True)
    # glibc's starting thresholds, as in a fresh server: this test process has freed large
    # arrays already (writing the run), which raised glibc's dynamic ones
    _keep_freed_memory(False)
    url = await nursery.start(partial(run_server, long_run.parent, "127.0.0.1", 0))

    def read_body() -> int:
        size = 0
        buf = bytearray(1 << 20)
        with urllib.request.urlopen(url + "/api/export?run=long&format=json", timeout=60) as r:
            while n := r.readinto(buf):
                size += n
        return size

    # this thread is the server's event loop: what it faults in is the relay's, and the loop's
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    with trio.fail_after(120):
        size = await trio.to_thread.run_sync(read_body)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    _keep_freed_memory(False)  # the server's setting goes with it
    assert size > 100 << 20
    assert faults < 32 * size / 2**20, f"{faults} page faults relaying {size / 2**20:.0f} MB"


async def test_http_export_is_not_cut_by_the_response_timeout(long_run, nursery, monkeypatch):
    """Quart ends a response after RESPONSE_TIMEOUT (60 s by default): an export of tens of
    millions of rows, or to a slow client, lasts longer. Here the limit is 0.2 s."""
    from quart_trio import QuartTrio

    config = {**QuartTrio.default_config, "RESPONSE_TIMEOUT": 0.2}
    monkeypatch.setattr(QuartTrio, "default_config", config)
    url = await nursery.start(partial(run_server, long_run.parent, "127.0.0.1", 0))
    with trio.fail_after(120):
        status, _, body = await trio.to_thread.run_sync(
            http_request, url + "/api/export?run=long&format=json"
        )
    assert status == 200 and body.endswith(b"]\n}\n") and body.count(b"], [") == 3_000_000 - 1


@pytest.fixture(scope="module")
def alerted(tmp_path_factory) -> Path:
    """A run with scalars, telemetry and alerts: detector ones (with and without a series or a
    value) and one from training code without a step, recorded as the broker records them."""
    from vdl_stream.alerts import alert_event

    run = tmp_path_factory.mktemp("logs") / "alerted"
    events = [
        alert_event("NaN or Inf: train/loss", "", "error", step=5, wall=1.7e9 + 5, rule="nan",
                    series="train/loss", value=math.nan),
        alert_event("Spike: train/loss", "z 40", step=3, wall=1.7e9 + 3, rule="spike",
                    series="train/loss", value=12.5),
        alert_event("Run stalled", "no data", step=9, wall=1.7e9 + 9, rule="stall", value=130.0),
        alert_event("checkpoint failed", "disk full", "error", wall=1.7e9 + 10),
        alert_event("NaN or Inf: train/loss", "", "error", step=8, wall=1.7e9 + 8, rule="nan",
                    series="train/loss"),
    ]  # fmt: skip
    with recorder.RunWriter(run, sync="never") as w:
        w.append_scalars(
            "train/loss", np.arange(10), 1.7e9 + np.arange(10.0), np.linspace(1, 0, 10)
        )
        w.append_record(
            "telemetry", None, None, 1.7e9, {"host": "h", "rank": 0, "fields": {"x": 1.0}}
        )
        for e in events:
            data = {k: v for k, v in e.items() if k not in ("kind", "tag", "step", "wall")}
            w.append_record("alert", None, e["step"], e["wall"], data)
    return run


ALERT_CSV = (
    "alert/nan/train/loss,5,1700000005.0,\n"
    "alert/nan/train/loss,8,1700000008.0,\n"
    "alert/spike/train/loss,3,1700000003.0,12.5\n"
    "alert/stall,9,1700000009.0,130.0\n"
    "alert/user,,1700000010.0,\n"
)
ALERT_JSON = (
    ',\n"alert/nan/train/loss": [[1700000005.0, 5, null], [1700000008.0, 8, null]],'
    '\n"alert/spike/train/loss": [[1700000003.0, 3, 12.5]],'
    '\n"alert/stall": [[1700000009.0, 9, 130.0]],'
    '\n"alert/user": [[1700000010.0, null, null]]'
    "\n}\n"
)


@pytest.mark.parametrize("chunk_rows", [1, 65536])
def test_export_keeps_alerts_after_the_other_tags(alerted, chunk_rows):
    with Export(alerted, "csv", chunk_rows=chunk_rows) as export:
        got = b"".join(export)
    # The rows of a run without alerts are unchanged: the alerts only follow them.
    assert got == reference(alerted, "csv") + ALERT_CSV.encode()
    assert export.rows == 10 + 1 + 5 and export.tags == 2 + 4
    with Export(alerted, "json", chunk_rows=chunk_rows) as export:
        got = b"".join(export)
    assert got == reference(alerted, "json")[: -len("\n}\n")] + ALERT_JSON.encode()
    doc = json.loads(got)
    assert doc["alert/stall"] == [[1.7e9 + 9, 9, 130.0]] and doc["train/loss"][0][1] == 0
    with Export(alerted, "json", "^alert/nan") as export:
        assert json.loads(b"".join(export)) == {"alert/nan/train/loss": doc["alert/nan/train/loss"]}


def test_cli_export_keeps_alerts(alerted):
    result = subprocess.run(
        [sys.executable, "-m", "vdl_stream.cli", "export", str(alerted), "--tag", "^alert/"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == CSV_HEADER + ALERT_CSV
    assert "exported 5 rows" in result.stderr


async def test_http_export_keeps_alerts(alerted, nursery):
    url = await nursery.start(partial(run_server, alerted.parent, "127.0.0.1", 0))
    with trio.fail_after(30):
        status, kind, body = await trio.to_thread.run_sync(
            http_request, url + "/api/export?run=alerted&format=json&tag=%5Ealert%2F"
        )
    assert status == 200 and kind.startswith("application/json")
    assert body == b"{" + ALERT_JSON.removeprefix(",").encode()


def test_cli_export_threads_change_nothing_but_speed(tricky, tmp_path, capsys):
    from vdl_stream.cli import main

    for n in ("0", "3"):
        out = tmp_path / f"threads{n}.json"
        assert (
            main(["export", str(tricky), "--format", "json", "--threads", n, "-o", str(out)]) == 0
        )
        assert out.read_bytes() == reference(tricky, "json")
    assert main(["export", str(tricky), "--threads", "-1", "-o", str(tmp_path / "x")]) == 2
    assert "--threads must be >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


split_only = pytest.mark.skipif(
    not (hasattr(os, "fork") and hasattr(os, "splice")), reason="splitting needs fork and splice"
)


def read_pipe(fd: int, into: list) -> None:
    """Read the pipe ``fd`` to its end into ``into`` (a reading thread's target), then close it."""
    with os.fdopen(fd, "rb") as f:
        into.append(f.read())


@split_only
@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("processes", [2, 3])
def test_an_export_split_over_processes_is_byte_identical(tricky, tmp_path, fmt, processes):
    """Blocks of 7 rows (about 600 of them), dealt out in turn to 2 or 3 processes: the helpers'
    blocks come back in order, spliced into a file and into a pipe, between this process's own
    and its unformatted heads (`{`, `]`): the row writer's bytes."""
    from vdl_stream.interop import write_export

    with Export(tricky, fmt) as whole:
        counts = (len(b"".join(whole)) and whole.rows, whole.tags)
    out = tmp_path / "out"
    with Export(tricky, fmt, chunk_rows=7, threads=0) as export, open(out, "wb") as f:
        f.write(b"kept before: ")  # a file's offset carries on across writes and splices
        write_export(export, f, processes)
        assert (export.rows, export.tags) == counts  # counted in this process too
    assert out.read_bytes() == b"kept before: " + reference(tricky, fmt)
    read, write = os.pipe()
    got: list[bytes] = []
    reader = threading.Thread(target=read_pipe, args=(read, got))
    reader.start()
    try:
        with Export(tricky, fmt, chunk_rows=7, threads=0) as export, open(write, "wb") as f:
            write_export(export, f, processes)
    finally:
        reader.join(60)
    assert got == [reference(tricky, fmt)]


@split_only
@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("chunk_rows", [1, 65536])
def test_a_split_export_keeps_alerts_and_counts(alerted, tmp_path, fmt, chunk_rows):
    """Alerts (formatted by the first process) after the tags, with parts of one row dealt out
    too: the same bytes, rows and tags as one process."""
    from vdl_stream.interop import write_export

    with Export(alerted, fmt, chunk_rows=chunk_rows) as whole:
        want = b"".join(whole)
    out = tmp_path / "out"
    with Export(alerted, fmt, chunk_rows=chunk_rows, threads=0) as export, open(out, "wb") as f:
        write_export(export, f, 2)
        assert (export.rows, export.tags) == (whole.rows, whole.tags) == (16, 6)
    assert out.read_bytes() == want


@split_only
def test_each_process_of_a_split_export_decodes_only_its_parts(tmp_path, monkeypatch):
    """Six chunks of 65,536 points, split over two processes: each chunk is decoded once, by the
    process formatting it (each process decoding all of them was 1.2 s of CPU per 50M rows)."""
    from recorder import codec
    from vdl_stream.interop import write_export

    n = 6 * 65_536
    with recorder.RunWriter(tmp_path / "run", sync="never") as w:
        w.append_scalars("a", np.arange(n), 1.7e9 + np.arange(n) * 0.25, np.arange(n) * 0.5)
    log = os.open(tmp_path / "decoded", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    decode = codec.decode_scalars

    def logged(data, at=None):
        os.write(log, b"%d %d\n" % (os.getpid(), data["n"]))
        return decode(data, at)

    monkeypatch.setattr(codec, "decode_scalars", logged)
    try:
        with Export(tmp_path / "run", "csv", threads=0) as export:
            with open(tmp_path / "out", "wb") as f:
                write_export(export, f, 2)
            assert export.rows == n
    finally:
        os.close(log)
    by_process: dict[int, int] = {}
    for line in (tmp_path / "decoded").read_text().split("\n")[:-1]:
        pid, points = map(int, line.split())
        by_process[pid] = by_process.get(pid, 0) + points
    assert sorted(by_process.values()) == [3 * 65_536, 3 * 65_536], by_process
    assert (tmp_path / "out").read_bytes() == reference(tmp_path / "run", "csv")


@split_only
def test_a_failing_helper_process_fails_the_export(tricky, tmp_path, monkeypatch, capfd):
    """A helper that fails mid-way: the export raises (not a short document), the helper's
    error is on the shared stderr, and no process is left behind."""
    import psutil

    from vdl_stream import interop

    parent = os.getpid()
    rows = interop._json_rows

    def failing_in_helpers(*args, **kwargs):
        if os.getpid() != parent:
            raise MemoryError("helper out of memory")
        return rows(*args, **kwargs)

    def running_children() -> set[int]:
        return {c.pid for c in psutil.Process().children() if c.status() != psutil.STATUS_ZOMBIE}

    # Other tests' processes (the browser's driver) may be this process's children too.
    before = running_children()
    monkeypatch.setattr(interop, "_json_rows", failing_in_helpers)
    with (
        Export(tricky, "json", chunk_rows=7, threads=0) as export,
        open(tmp_path / "out", "wb") as f,
        pytest.raises(RuntimeError, match="helper process ended before its blocks did"),
    ):
        interop.write_export(export, f, 2)
    assert "MemoryError: helper out of memory" in capfd.readouterr().err
    assert not running_children() - before
    from vdl_stream.cli import main

    out = tmp_path / "cli.json"
    command = ["export", str(tricky), "--format", "json", "--processes", "2", "-o", str(out)]
    assert main(command) == 1  # the helper fails on its first block (one a tag here)
    err = capfd.readouterr().err
    assert "vdl-stream export: an export helper process ended" in err
    assert not out.exists() and not (tmp_path / "cli.json.tmp").exists()
    with pytest.raises(ValueError, match="processes must be an int >= 1, got 0"):
        interop.write_export(export, f, 0)


@split_only
def test_cli_export_processes_change_nothing_but_speed(tricky, tmp_path):
    """The command, its output a pipe (what /api/export reads) or a file."""
    command = [sys.executable, "-m", "vdl_stream.cli", "export", str(tricky), "--format", "json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [*command, "--processes", "3"], capture_output=True, timeout=120, cwd=REPO, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference(tricky, "json")
    assert b"exported 3,690 rows" in done.stderr
    out = tmp_path / "out.csv"
    done = subprocess.run(
        [*command[:-2], "--processes", "2", "-o", str(out)], timeout=120, cwd=REPO, env=env
    )
    assert done.returncode == 0 and out.read_bytes() == reference(tricky, "csv")
    for bad, says in (
        (["--processes", "0"], "--processes must be >= 1, got 0"),
        (["--processes", "2", "--threads", "1"], "--threads and --processes above 1 exclude"),
    ):
        done = subprocess.run(
            [*command, *bad], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
        )
        assert done.returncode == 2 and says in done.stderr and not done.stdout


def test_cli_export_splits_over_processes_by_default(tricky, tmp_path, monkeypatch, capsys):
    """Without ``--processes`` or ``--threads`` the command formats in the processes
    /api/export's child takes (two on two cores: threads in one process overlap only numpy's
    passes, under one GIL); ``--threads`` keeps one process; the bytes are the same."""
    from vdl_stream import interop
    from vdl_stream.cli import main

    monkeypatch.delenv(interop.CHILD_PROCESSES_ENV, raising=False)
    taken = []
    write = interop.write_export

    def recording(export, out, processes=1):
        taken.append(processes)
        write(export, out, processes)

    monkeypatch.setattr(interop, "write_export", recording)
    out = tmp_path / "out.json"
    assert main(["export", str(tricky), "--format", "json", "-o", str(out)]) == 0
    assert out.read_bytes() == reference(tricky, "json")
    assert main(["export", str(tricky), "--threads", "0", "-o", str(out)]) == 0
    assert out.read_bytes() == reference(tricky, "csv")
    monkeypatch.setenv(interop.CHILD_PROCESSES_ENV, "3")
    assert main(["export", str(tricky), "-o", str(out)]) == 0
    assert out.read_bytes() == reference(tricky, "csv")
    assert taken == [2 if (os.cpu_count() or 1) >= 2 and interop._can_split() else 1, 1, 3]
    buffer = io.BytesIO()  # no file descriptor to splice to: formatted in this process
    with Export(tricky, "json", chunk_rows=7, threads=0) as export:
        interop.write_export(export, buffer, 2)
    assert buffer.getvalue() == reference(tricky, "json") and taken[-1] == 2
    monkeypatch.setenv(interop.CHILD_PROCESSES_ENV, "0")
    assert main(["export", str(tricky), "-o", str(tmp_path / "x")]) == 2
    assert (
        "VDL_STREAM_EXPORT_CHILD_PROCESSES must be an int >= 1, got '0'" in capsys.readouterr().err
    )
    assert not (tmp_path / "x").exists()


# Run as ``python -c`` by the test below: the export as /api/export's child runs it, then which
# modules it imported, and in which process numpy.ma was (np.unique imports it on first use).
_STARTUP_PROBE = """
import os, sys

class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy.ma":
            os.write(2, b"numpy.ma in %d\\n" % os.getpid())

sys.meta_path.insert(0, Probe())
from vdl_stream import cli
code = cli.main(sys.argv[1:])
late = sorted(m for m in ("trio", "vdl_stream.storage", "vdl_stream.tfevents") if m in sys.modules)
os.write(2, b"pid %d imported %r\\n" % (os.getpid(), late))
sys.exit(code)
"""


@split_only
def test_an_export_childs_start_imports_only_what_a_local_run_needs(tricky):
    """An /api/export child's imports come before its first row, while the server's other
    core waits: a local run's export imports neither the object store's module (and trio
    with it) nor the import command's readers, and numpy.ma once, before the fork."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", _STARTUP_PROBE, "export", str(tricky), "--processes", "2"]
    done = subprocess.run(command, capture_output=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference(tricky, "csv")
    lines = done.stderr.decode().splitlines()
    pid = next(line.split()[1] for line in lines if line.startswith("pid "))
    assert f"pid {pid} imported []" in lines, lines
    assert [line for line in lines if line.startswith("numpy.ma")] == [f"numpy.ma in {pid}"]


def test_the_child_formats_in_two_processes_where_there_are_two_cores(monkeypatch):
    from vdl_stream import interop
    from vdl_stream.interop import CHILD_PROCESSES_ENV, child_processes

    monkeypatch.delenv(CHILD_PROCESSES_ENV, raising=False)
    split = interop._can_split()
    assert child_processes(1) == 1
    assert child_processes(2) == child_processes(16) == (2 if split else 1)
    monkeypatch.setenv(CHILD_PROCESSES_ENV, "3")
    assert child_processes(1) == 3
    for bad in ("0", "-1", "x"):
        monkeypatch.setenv(CHILD_PROCESSES_ENV, bad)
        with pytest.raises(ValueError, match=rf"VDL_STREAM_EXPORT_CHILD_PROCESSES .*'{bad}'"):
            child_processes()


@pytest.mark.parametrize(
    ("fmt", "pattern", "processes"),
    [("csv", None, "1"), ("json", None, "1"), ("json", "^loss$|gpu", "1"), ("json", None, "3")],
)
async def test_http_export_from_a_child_process_is_byte_identical(
    tricky, nursery, monkeypatch, fmt, pattern, processes
):
    """A large export (here: any) is formatted by a `vdl-stream export` child process (in one
    process, or split over three): the same bytes as the row-by-row writer."""
    from urllib.parse import quote

    from vdl_stream.interop import CHILD_PROCESSES_ENV

    monkeypatch.setenv(CHILD_PROCESSES_ENV, processes)
    monkeypatch.setattr("vdl_stream.server.EXPORT_PROCESS_POINTS", 0)
    monkeypatch.setattr("vdl_stream.server.export_in_child", lambda: True)
    url = await nursery.start(partial(run_server, tricky.parent, "127.0.0.1", 0))
    query = f"run=tricky&format={fmt}" + (f"&tag={quote(pattern)}" if pattern else "")
    with trio.fail_after(60):
        status, _, body = await trio.to_thread.run_sync(http_request, f"{url}/api/export?{query}")
    assert status == 200
    assert body == reference(tricky, fmt, pattern)


def export_children() -> list:
    """This process's `vdl-stream export` children still running."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "export" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            pass
    return found


async def test_a_client_leaving_mid_export_ends_its_child_process(long_run, nursery, monkeypatch):
    """3M points go through a child process; a client that reads a little and hangs up
    leaves no process behind, and the server serves on."""
    monkeypatch.setattr("vdl_stream.server.export_in_child", lambda: True)
    url = await nursery.start(partial(run_server, long_run.parent, "127.0.0.1", 0))
    host, port = url.removeprefix("http://").split(":")
    with trio.fail_after(60):
        stream = await trio.open_tcp_stream(host, int(port))
        request = f"GET /api/export?run=long&format=json HTTP/1.1\r\nHost: {host}\r\n\r\n"
        await stream.send_all(request.encode())
        got = b""
        while len(got) < 1 << 16:  # the child is formatting: rows have come
            got += await stream.receive_some(1 << 16)
        assert got.startswith(b"HTTP/1.1 200") and b'"loss": [[' in got
        from vdl_stream.interop import child_processes

        # the child and its helper processes (where it splits the export), the server first
        children = export_children()
        assert len(children) == child_processes(), "no child process formats this export"
        if len(children) > 1:
            from vdl_stream.interop import EXPORT_CHILD_NICE

            nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + EXPORT_CHILD_NICE)
            assert [c.nice() for c in children] == [nice] * len(children)
        await stream.aclose()
        for _ in range(1500):  # polling a condition, 30 s at most
            if not export_children():
                break
            await trio.sleep(0.02)
        else:
            pytest.fail("the export's child process outlived its client")
        status, body = await trio.to_thread.run_sync(http_get, url + "/api/stats")
    assert status == 200 and "broker" in body


async def test_a_failing_child_export_says_why(tricky, tmp_path):
    """The run went between the server's check and the child's start: the body ends in an
    error that names it, and the slot is given back."""
    import shutil

    from vdl_stream.interop import stream_export_process

    run = tmp_path / "going"
    shutil.copytree(tricky, run)
    slots = trio.Semaphore(1)
    export = Export(run, "csv")
    shutil.rmtree(run)
    with trio.fail_after(60), pytest.raises(RuntimeError, match="export child exited with 2: "):
        async for _ in stream_export_process(export, slots):
            pass
    assert not export_children() and slots.value == 1


async def test_the_childs_output_goes_on_in_chunks_of_one_size():
    """Whatever sizes the child writes, the server passes on chunks of EXPORT_PIPE_CHUNK bytes
    (but the last): buffers of one size, which malloc reuses (chunks of every size fragmented
    the server's heap, and its memory crept up through a long export)."""
    from vdl_stream.interop import EXPORT_PIPE_CHUNK, _child_output, _open_child

    sizes = (1, 70_000, EXPORT_PIPE_CHUNK, 300_001, 5, 3 * EXPORT_PIPE_CHUNK + 7)
    script = (
        "import os, sys\n"
        f"for i, n in enumerate({sizes!r}):\n"
        "    data = bytes([65 + i]) * n\n"
        "    while data:\n"
        "        data = data[os.write(1, data):]\n"
    )
    process, errors = await _open_child([sys.executable, "-c", script])
    with trio.fail_after(60):
        chunks = [chunk async for chunk in _child_output(process, errors)]
    assert b"".join(chunks) == b"".join(bytes([65 + i]) * n for i, n in enumerate(sizes))
    assert {len(c) for c in chunks[:-1]} == {EXPORT_PIPE_CHUNK}
    assert 0 < len(chunks[-1]) <= EXPORT_PIPE_CHUNK and process.returncode == 0


#: A child that writes more to its stderr than a pipe holds (64 KB) before any output, then its
#: output, and exits with the code given.
NOISY_CHILD = (
    "import os, sys\n"
    "data = b''.join(b'warning %07d\\n' % i for i in range(20_000))  # 320 KB\n"
    "while data:\n"
    "    data = data[os.write(2, data):]\n"
    "os.write(2, b'the last word')\n"
    "os.write(1, b'rows')\n"
    "sys.exit(int(sys.argv[1]))\n"
)


@pytest.mark.parametrize("code", [0, 3])
async def test_a_child_writing_much_to_stderr_is_read_to_the_end(code):
    """The child's stderr is read while its output is: 320 KB of warnings (five pipes' worth)
    before the output neither hang the export (the child blocked on a full stderr pipe, and
    its output never ended) nor fill the server's memory: a failure names the last of it."""
    from vdl_stream.interop import _STDERR_TAIL, _child_output, _open_child

    process, errors = await _open_child([sys.executable, "-c", NOISY_CHILD, str(code)])
    with trio.fail_after(60):
        if code:
            with pytest.raises(RuntimeError, match=r"(?s)exited with 3: .*the last word$") as info:
                [chunk async for chunk in _child_output(process, errors)]
            assert len(str(info.value)) < _STDERR_TAIL + 100
        else:
            assert [chunk async for chunk in _child_output(process, errors)] == [b"rows"]
    assert process.returncode == code


async def test_exports_past_the_child_slots_are_formatted_in_process(tricky):
    from vdl_stream.interop import stream_export_process

    slots = trio.Semaphore(0)  # none free
    with trio.fail_after(60):
        body = b"".join([c async for c in stream_export_process(Export(tricky, "json"), slots)])
    assert body == reference(tricky, "json") and slots.value == 0


async def test_no_python_to_start_means_an_export_in_process(tricky, monkeypatch):
    """Where the child cannot start (an embedded interpreter has no Python executable), the
    export is formatted in the server: the same bytes."""
    from vdl_stream import interop

    monkeypatch.setattr(interop.sys, "executable", str(tricky / "no-python-here"))
    slots = trio.Semaphore(1)
    with trio.fail_after(60):
        export = Export(tricky, "csv")
        body = b"".join([c async for c in interop.stream_export_process(export, slots)])
    assert body == reference(tricky, "csv") and slots.value == 1
