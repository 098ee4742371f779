"""Whole segments under property tests: round trip, cut at every offset, byte flips, tailing."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_testing import BASE_WALL, same_records

from recorder import Record, RunReader, RunWriter, ScalarSeries
from recorder.catalog import INDEX_NAME, segment_name

scalar_values = st.floats(allow_nan=True, allow_infinity=True, width=64)
plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.binary(max_size=10),
)
event_data = st.dictionaries(
    st.text(max_size=5),
    st.recursive(plain, lambda inner: st.lists(inner, max_size=3), max_leaves=6),
    max_size=4,
)


@st.composite
def scalar_record(draw, tag: str) -> Record:
    n = draw(st.integers(1, 20))
    first = draw(st.integers(-1000, 1000))
    stride = draw(st.sampled_from([0, 1, 7, None]))
    if stride is None:
        steps = np.array(draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n)))
    else:
        steps = first + stride * np.arange(n)
    walls = BASE_WALL + np.cumsum(draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)))
    values = np.array(draw(st.lists(scalar_values, min_size=n, max_size=n)))
    data = ScalarSeries(steps.astype(np.int64), walls, values)
    return Record("scalars", tag, int(steps[0]), float(walls[0]), data)


@st.composite
def records(draw) -> list[list[Record]]:
    """Units of records, each unit written as one frame (appended, then flushed): an event, a
    scalar chunk, or a group chunk of a few points of several tags."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        choice = draw(st.sampled_from(["scalars", "group", "event"]))
        if choice == "scalars":
            out.append([draw(scalar_record(draw(st.sampled_from(["loss", "acc", "lr"]))))])
        elif choice == "group":
            tags = draw(st.lists(st.sampled_from(["g1", "g2", "g3"]), min_size=2, unique=True))
            out.append([draw(scalar_record(tag)) for tag in tags])
        else:
            kind = draw(st.sampled_from(["text", "histogram", "meta", "ack"]))
            tag = None if kind in ("meta", "ack") else kind + draw(st.sampled_from(["1", "2"]))
            step = draw(st.one_of(st.none(), st.integers(0, 10**9)))
            wall = draw(st.floats(0, 2e9))
            out.append([Record(kind, tag, step, wall, draw(event_data))])
    return out


def flat(units: list[list[Record]]) -> list[Record]:
    return [rec for unit in units for rec in unit]


def write(run_dir, units: list[list[Record]]) -> list[int]:
    """Write each unit as one frame; return the end offset of each in segment 0."""
    ends = []
    with RunWriter(run_dir, sync="never") as w:
        for unit in units:
            for rec in unit:
                if rec.kind == "scalars":
                    w.append_scalars(rec.tag, *rec.data)
                else:
                    w.append_record(rec.kind, rec.tag, rec.step, rec.wall, rec.data)
            ends.append(w.flush().offset)
    assert len(ends) == len(set(ends))  # one frame per unit
    os.remove(os.path.join(run_dir, INDEX_NAME))
    return ends


def read_all(run_dir) -> tuple[list[Record], RunReader]:
    r = RunReader(run_dir)
    return list(r.iter_records()), r


common = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@common
@given(records())
def test_every_record_round_trips(tmp_path, items):
    run = tmp_path / "rt"
    shutil.rmtree(run, ignore_errors=True)
    write(run, items)
    got, _ = read_all(run)
    assert same_records(got, flat(items))


@common
@given(records())
def test_cut_at_every_offset_yields_exactly_the_complete_records(tmp_path, items):
    src = tmp_path / "src"
    shutil.rmtree(src, ignore_errors=True)
    ends = write(src, items)
    blob = (src / segment_name(0)).read_bytes()
    cut_dir = tmp_path / "cut"
    cut_dir.mkdir(exist_ok=True)
    seg = cut_dir / segment_name(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn tail is never reported as damage
        for cut in range(len(blob) + 1):
            seg.write_bytes(blob[:cut])
            got, r = read_all(cut_dir)
            complete = sum(1 for e in ends if e <= cut)
            assert same_records(got, flat(items[:complete])), cut
            assert r.statistics().corrupt_records == 0
            r.close()


@settings(max_examples=60, deadline=None)
@given(records(), st.data())
def test_random_byte_flips_are_detected_never_returned(tmp_path_factory, items, data):
    src = tmp_path_factory.mktemp("flip")
    ends = write(src, items)
    seg = src / segment_name(0)
    blob = bytearray(seg.read_bytes())
    header = 32
    flips = data.draw(
        st.lists(st.integers(header, len(blob) - 1), min_size=1, max_size=3, unique=True)
    )
    for pos in flips:
        blob[pos] ^= data.draw(st.integers(1, 255))
    seg.write_bytes(bytes(blob))
    starts = [header, *ends[:-1]]
    touched = {
        i for i, (a, b) in enumerate(zip(starts, ends, strict=True)) for p in flips if a <= p < b
    }
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got, r = read_all(src)
    assert same_records(got, flat([unit for i, unit in enumerate(items) if i not in touched]))
    stats = r.statistics()
    assert stats.corrupt_records > 0 or stats.pending_bytes > 0


@settings(max_examples=25, deadline=None)
@given(records(), st.data())
def test_tailing_a_growing_file_split_mid_header_and_mid_payload(tmp_path_factory, items, data):
    src = tmp_path_factory.mktemp("src")
    ends = write(src, items)
    blob = (src / segment_name(0)).read_bytes()
    drawn = data.draw(st.lists(st.integers(1, len(blob)), max_size=12))
    cuts = sorted({*drawn, 5, len(blob)})  # 5: inside the segment header
    live = tmp_path_factory.mktemp("live")
    seg = live / segment_name(0)
    seg.write_bytes(blob[:3])  # the writer has not finished the segment header yet
    r = RunReader(live)
    seen: list[Record] = []
    done = 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for cut in cuts:
            with open(seg, "ab") as f:
                f.write(blob[done:cut])
            done = max(done, cut)
            r.refresh()
            seen = list(r.iter_records())
            complete = sum(1 for e in ends if e <= done)
            assert same_records(seen, flat(items[:complete]))
    assert same_records(seen, flat(items))


def test_tailing_a_live_writer_in_the_same_process(tmp_path):
    w = RunWriter(tmp_path / "run")
    r = RunReader(tmp_path / "run")
    for i in range(20):
        w.append_scalars("x", np.arange(i * 5, i * 5 + 5), np.full(5, BASE_WALL), np.ones(5))
        if i % 3 == 0:
            w.append_record("text", "t", i, BASE_WALL, {"i": i})
        w.flush()
        assert r.refresh()
        assert r.read_scalars("x").steps.tolist() == list(range(i * 5 + 5))
        assert [rec.data["i"] for rec in r.read_records("text")] == list(range(0, i + 1, 3))
    assert not r.refresh()
    w.close()
