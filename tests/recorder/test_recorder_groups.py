"""Small flushes: group chunks, restarts across them, and agreement of every read path."""

from __future__ import annotations

import os
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_testing import BASE_WALL

from recorder import RunReader, RunWriter
from recorder.catalog import INDEX_NAME, segment_name
from recorder.writer import GROUP_BELOW

TAGS = ["a", "b", "c", "d"]


@st.composite
def operations(draw) -> list[tuple[str, int, int, bool]]:
    """Batches ``(tag, first step, points, flush after)``; some restart below earlier steps."""
    top = dict.fromkeys(TAGS, -1)
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        tag = draw(st.sampled_from(TAGS))
        n = draw(st.one_of(st.integers(1, 20), st.integers(GROUP_BELOW - 5, GROUP_BELOW + 50)))
        if top[tag] >= 0 and draw(st.integers(0, 4)) == 0:
            first = draw(st.integers(0, top[tag]))  # a restart, or a repeat of the last step
        else:
            first = top[tag] + draw(st.integers(0, 3))  # 0: the last step again
        top[tag] = max(top[tag], first + n - 1)
        ops.append((tag, first, n, draw(st.booleans())))
    return ops


def expected(ops) -> dict[str, tuple[list[int], list[float]]]:
    """What read_scalars must return: a batch starting below the largest step kept supersedes
    the points at or above its start."""
    kept: dict[str, list[tuple[int, float]]] = {}
    for i, (tag, first, n, _) in enumerate(ops):
        points = kept.get(tag, [])
        if points and first < max(p[0] for p in points):
            points = [p for p in points if p[0] < first]
        points += [(first + k, i * 1000.0 + k) for k in range(n)]
        kept[tag] = points
    return {tag: ([s for s, _ in pts], [v for _, v in pts]) for tag, pts in kept.items()}


def run_ops(w: RunWriter, ops, on_flush=None) -> None:
    for i, (tag, first, n, flush) in enumerate(ops):
        steps = np.arange(first, first + n)
        w.append_scalars(tag, steps, BASE_WALL + steps * 0.5, i * 1000.0 + np.arange(n))
        if flush:
            w.flush()
            if on_flush is not None:
                on_flush()


def check(r: RunReader, ops) -> None:
    want = expected(ops)
    tags = r.tags()
    assert set(tags) == set(want)
    for tag, (steps, values) in want.items():
        s = r.read_scalars(tag)
        assert s.steps.tolist() == steps, tag
        assert s.values.tolist() == values, tag
        assert np.allclose(s.walls, BASE_WALL + s.steps * 0.5, rtol=0, atol=1e-6)
        appended = sum(n for t, _, n, _ in ops if t == tag)
        assert tags[tag].count == appended
        assert tags[tag].step_max == max(f + n - 1 for t, f, n, _ in ops if t == tag)
    raw = {}
    for rec in r.iter_records():
        raw.setdefault(rec.tag, []).extend(rec.data.values.tolist())
    for tag in want:  # replay returns every point ever written, each tag in append order
        batches = [(i, n) for i, (t, _, n, _) in enumerate(ops) if t == tag]
        assert raw[tag] == [i * 1000.0 + k for i, n in batches for k in range(n)]


settings_ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@settings_
@given(operations())
def test_every_read_path_agrees_with_the_restart_rule(tmp_path_factory, ops):
    run = tmp_path_factory.mktemp("g") / "run"
    w = RunWriter(run, sync="never")
    readers: list[RunReader] = []

    def follow():
        if not readers:
            readers.append(RunReader(run))
        else:
            readers[0].refresh()
            readers[0].read_scalars(ops[0][0])  # fold as we go, like a live view

    run_ops(w, ops, follow)
    w.flush()
    check(RunReader(run), ops)  # scanning, no index
    if readers:
        readers[0].refresh()
        check(readers[0], ops)  # followed flush by flush
    w.close()
    indexed = RunReader(run)
    assert indexed.statistics().index_used
    check(indexed, ops)


def test_small_flushes_share_one_group_chunk_per_flush(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        for step in range(50):
            for t in range(20):
                w.append_scalars(f"tag{t}", [step], [BASE_WALL + step], [float(t * 100 + step)])
            w.flush()
    r = RunReader(run)
    assert r.statistics().records == 50  # one record per flush, not one per tag
    size = os.path.getsize(run / segment_name(0))
    assert size / 1000 < 30  # bytes per point with 1 point per tag per flush
    for t in range(20):
        s = r.read_scalars(f"tag{t}")
        assert s.steps.tolist() == list(range(50))
        assert s.values.tolist() == [float(t * 100 + step) for step in range(50)]
    assert r.tags()["tag7"].vmin == 700.0 and r.tags()["tag7"].vmax == 749.0
    assert [rec.tag for rec in r.read_records("scalars", "tag3")] == ["tag3"] * 50


def test_a_damaged_group_chunk_costs_its_points_only(tmp_path):
    run = tmp_path / "run"
    with RunWriter(run) as w:
        for step in range(3):
            for t in ("x", "y"):
                w.append_scalars(t, [step], [BASE_WALL], [1.0])
            w.flush()
    for with_index in (True, False):
        seg = run / segment_name(0)
        blob = bytearray(seg.read_bytes())
        if with_index:
            frame = (len(blob) - 32) // 3
            blob[32 + frame + frame // 2] ^= 0x10  # inside the second group
            seg.write_bytes(bytes(blob))
        else:
            os.remove(run / INDEX_NAME)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = RunReader(run)  # scanning finds the damage here, the index path when reading
            xs = r.read_scalars("x").steps.tolist()
            ys = r.read_scalars("y").steps.tolist()
        assert xs == ys == [0, 2]
        assert r.statistics().corrupt_records == 1 and len(caught) == 1
        assert r.tags()["x"].count == 2
        assert [rec.step for rec in r.iter_records()] == [0, 0, 2, 2]
