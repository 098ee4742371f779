"""Restarts applied in time linear in a tag's pieces: the same results as the rule replayed point
by point (and as the quadratic scan the reader used before), and each piece decoded at most once
however many restarts a run holds."""

from __future__ import annotations

import os
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_testing import BASE_WALL, same_series
from test_recorder_groups import operations, run_ops

from recorder import RunReader, RunWriter, ScalarSeries, codec
from recorder.catalog import INDEX_NAME, segment_name
from recorder.downsample import downsample
from recorder.reader import superseded_from

_MAX = int(np.iinfo(np.int64).max)


def scanned_ceilings(pieces: list[list[int]]) -> list[int]:
    """The reader's former ``_ceilings``, kept as a reference: for every candidate restart, the
    largest step kept before it, found by scanning every piece before it."""
    firsts = np.array([p[0] for p in pieces], np.int64)
    smins = np.array([min(p) for p in pieces], np.int64)
    smaxs = np.array([max(p) for p in pieces], np.int64)
    ceil = np.full(len(pieces), _MAX, np.int64)
    before = np.maximum.accumulate(smaxs)
    for j in (np.flatnonzero(firsts[1:] < before[:-1]) + 1).tolist():
        c = ceil[:j]
        whole = smaxs[:j] < c
        kept = int(smaxs[:j][whole].max()) if whole.any() else None
        for i in np.flatnonzero(~whole & (smins[:j] < c)).tolist():
            below = [s for s in pieces[i] if s < c[i]]
            if below:
                kept = max(below) if kept is None else max(kept, max(below))
        if kept is not None and int(firsts[j]) < kept:
            np.minimum(c, firsts[j], out=c)
    return ceil.tolist()


def replayed(pieces: list[list[int]]) -> list[tuple[int, int]]:
    """The rule replayed point by point: ``(piece, step)`` of every point kept, in order."""
    kept: list[tuple[int, int]] = []
    for i, steps in enumerate(pieces):
        if kept and steps[0] < max(s for _, s in kept):
            kept = [(j, s) for j, s in kept if s < steps[0]]
        kept += [(i, s) for s in steps]
    return kept


piece_lists = st.lists(
    st.lists(st.integers(0, 40), min_size=1, max_size=6), min_size=1, max_size=40
)


@settings(max_examples=300, deadline=None)
@given(piece_lists)
def test_ceilings_equal_the_scan_and_the_replay(pieces):
    """Pieces of any steps (repeated, going back inside a piece, restarting or not)."""
    firsts = np.array([p[0] for p in pieces], np.int64)
    smaxs = np.array([max(p) for p in pieces], np.int64)
    ceil = superseded_from(firsts, smaxs)
    assert ceil[1:].tolist() == scanned_ceilings(pieces)
    assert ceil[0] == min(ceil[1:])  # (held points: none here)
    kept = [(i, s) for i, p in enumerate(pieces) for s in p if s < ceil[i + 1]]
    assert kept == replayed(pieces)
    # Folded in two goes, as a tailing reader folds a tag: the points held, then the rest (none
    # at all when the new chunks were all found damaged).
    none = np.empty(0, np.int64)
    assert superseded_from(none, none, max(smaxs)).tolist() == [_MAX]
    for cut in range(1, len(pieces)):
        top = max(s for _, s in replayed(pieces[:cut]))
        held = superseded_from(firsts[cut:], smaxs[cut:], top)
        assert held[1:].tolist() == ceil[cut + 1 :].tolist()
        assert [(i, s) for i, s in replayed(pieces[:cut]) if s < held[0]] == [
            (i, s) for i, s in kept if i < cut
        ]


def expected(ops, lost: set[int]) -> dict[str, ScalarSeries]:
    """read_scalars of each tag, the batches ``lost`` (damaged) left out."""
    kept: dict[str, list[tuple[int, float]]] = {}
    for i, (tag, first, n, _) in enumerate(ops):
        points = kept.setdefault(tag, [])
        if i in lost:
            continue
        if points and first < max(s for s, _ in points):
            points[:] = [p for p in points if p[0] < first]
        points += [(first + k, i * 1000.0 + k) for k in range(n)]
    out = {}
    for tag, points in kept.items():
        steps = np.array([s for s, _ in points], np.int64)
        values = np.array([v for _, v in points], np.float64)
        out[tag] = ScalarSeries(steps, BASE_WALL + steps * 0.5, values)
    return out


def damage(run, ops, lost: set[int]) -> None:
    """Flip a byte inside the record of each batch in ``lost`` (one record per batch)."""
    with RunReader(run) as r:
        records = [e for e in r._catalog.entries if e.parts is not None or e.kind == "scalars"]
    assert len(records) == len(ops)
    for i in lost:
        e = records[i]
        path = run / segment_name(e.segment)
        blob = bytearray(path.read_bytes())
        blob[e.offset + e.length // 2] ^= 0x20
        path.write_bytes(bytes(blob))


def check_every_read(r: RunReader, want: dict[str, ScalarSeries], max_points: int) -> None:
    for tag, series in want.items():
        got = list(r.iter_scalars(tag, max_chunk_points=7))
        steps = np.concatenate([p.steps for p in got]) if got else np.empty(0, np.int64)
        assert steps.tolist() == series.steps.tolist(), tag
        assert same_series(
            r.read_scalars(tag, max_points=max_points), downsample(series, max_points)
        )
        assert same_series(r.read_scalars(tag), series), tag


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations(), st.sampled_from([None, 2, 5]), st.integers(2, 60), st.data())
def test_every_read_applies_restarts_as_the_rule(tmp_path_factory, ops, compact, points, data):
    """Runs of chunks and group parts, compacted as written or not, with restarts and repeated
    steps; and without compaction, some records damaged: every read equals the replay."""
    run = tmp_path_factory.mktemp("r") / "run"
    lost: set[int] = set()
    if compact is None:
        lost = set(data.draw(st.sets(st.integers(0, len(ops) - 1), max_size=3)))
        ops = [(tag, first, n, True) for tag, first, n, _ in ops]  # a record per batch
    with RunWriter(run, sync="never", compact_records=compact) as w:
        run_ops(w, ops)
    want = expected(ops, lost)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the damage reported
        if lost:
            damage(run, ops, lost)
            with RunReader(run) as r:  # the index used: damage found as pieces are read
                for tag, series in want.items():
                    assert same_series(r.read_scalars(tag), series), tag
            os.remove(run / INDEX_NAME)  # scanned: damage found before any read
        with RunReader(run) as r:
            if compact is None:  # a record per batch, the damaged ones not read (a damaged
                # last record reads as a torn tail: pending rather than corrupt)
                assert r.statistics().records == len(ops) - len(lost)
            check_every_read(r, want, points)


def test_thousands_of_restarts_decode_each_piece_once(tmp_path, monkeypatch):
    """Four writers logging one tag with step counters of their own: a restart at most of 4,000
    records. Every read decodes each piece at most once (the scan decoded the pieces before
    each restart that straddled its ceiling again, some thousands of times each)."""
    run = tmp_path / "run"
    tops = [0, 0, 0, 0]
    with RunWriter(run, sync="never") as w:
        for i in range(4000):
            k, n = i % 4, 256 + i % 7  # chunks (GROUP_BELOW points or more)
            steps = np.arange(tops[k], tops[k] + n)
            tops[k] += n
            w.append_scalars("loss", steps, BASE_WALL + steps, steps * 0.5)
            w.flush()
    decoded: list[int] = []
    decode, decode_into = codec.decode_scalars, codec.decode_scalars_into

    def counting(data, at=None):
        decoded.append(data["n"])
        return decode(data, at)

    def counting_into(data, *cols):
        decoded.append(data["n"])
        return decode_into(data, *cols)

    monkeypatch.setattr(codec, "decode_scalars", counting)
    monkeypatch.setattr(codec, "decode_scalars_into", counting_into)
    reads = {
        "snapshot": lambda r: r.read_scalars("loss", max_points=2000),
        "iter_scalars": lambda r: list(r.iter_scalars("loss")),
        "parts": lambda r: [read() for _, read in r.iter_scalar_parts("loss")],
        "read_scalars": lambda r: r.read_scalars("loss"),
    }
    for name, read in reads.items():
        with RunReader(run) as r:
            pieces = len(r._pieces("loss")[0])
            assert pieces >= 3000  # (a restart is a chunk boundary, compacted or not)
            decoded.clear()
            read(r)
            assert len(decoded) <= pieces, name
