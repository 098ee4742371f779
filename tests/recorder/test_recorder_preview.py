"""A closed run's preview (recorder/preview.py): each short scalar tag's ``read_scalars(tag,
max_points=PREVIEW_POINTS)`` written at close, answered from it by a reader that read exactly the
files it names, and identical to the read without it; stale, damaged or partial: never used."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_testing import BASE_WALL

import recorder.reader as reader_module
import recorder.writer as writer_module
from recorder import RunReader, RunWriter, framing
from recorder.preview import (
    PREVIEW_NAME,
    PREVIEW_POINTS,
    Preview,
    load_preview,
    write_preview,
)

SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.5, math.nan, math.inf, -math.inf]


def identical(a, b) -> bool:
    """Same steps, and walls and values bit for bit (NaN included), with the same dtypes."""
    return (
        a.steps.dtype == b.steps.dtype == np.int64
        and a.walls.dtype == b.walls.dtype == a.values.dtype == b.values.dtype == np.float64
        and np.array_equal(a.steps, b.steps)
        and a.walls.tobytes() == b.walls.tobytes()
        and a.values.tobytes() == b.values.tobytes()
    )


def read_all(path, max_points: int = PREVIEW_POINTS) -> tuple[dict, int]:
    """Every scalar tag read at ``max_points`` by a fresh reader, and the bytes it read for them."""
    with RunReader(path) as r:
        before = r.statistics().bytes_read
        out = {
            tag: r.read_scalars(tag, max_points=max_points)
            for tag, info in r.tags().items()
            if info.kind == "scalars"
        }
        return out, r.statistics().bytes_read - before


def without_preview(path) -> dict:
    """The read path's answer: the preview file moved aside for the read."""
    aside = os.path.join(path, "aside")
    os.replace(os.path.join(path, PREVIEW_NAME), aside)
    try:
        return read_all(path)[0]
    finally:
        os.replace(aside, os.path.join(path, PREVIEW_NAME))


def write_run(path, batches, **kw) -> None:
    w = RunWriter(path, sync="never", **kw)
    for tag, steps, values, flush in batches:
        steps = np.asarray(steps, np.int64)
        walls = BASE_WALL + steps.astype(np.float64) * 0.5
        w.append_scalars(tag, steps, walls, np.asarray(values, np.float64))
        if flush:
            w.flush()
    w.close()


@st.composite
def runs(draw) -> list[tuple]:
    """Batches of up to three tags: one point, a few, or several thousand; values with ties,
    NaN and infinities; restarts (a batch starting below the tag's last step); flushes."""
    out = []
    last: dict[str, int] = {}
    for _ in range(draw(st.integers(1, 8))):
        tag = draw(st.sampled_from(["loss", "acc", "lr"]))
        n = draw(st.sampled_from([1, 3, 150, 201, 2500, 7000]))
        start = last.get(tag, 0)
        if draw(st.booleans()) and start > 10:
            start = draw(st.integers(0, start - 1))  # a restart from a checkpoint
        steps = np.arange(start, start + n)
        seed = draw(st.integers(0, 2**16))
        values = np.random.default_rng(seed).normal(size=n)
        for i in draw(st.lists(st.integers(0, n - 1), max_size=4)):
            values[i] = SPECIAL[i % len(SPECIAL)]
        out.append((tag, steps, values, draw(st.booleans())))
        last[tag] = start + n
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=runs(), compact=st.sampled_from([None, 2]))
def test_a_closed_runs_reads_at_the_preview_points_are_the_preview_and_equal_the_read_path(
    tmp_path_factory, batches, compact
):
    path = str(tmp_path_factory.mktemp("run") / "r")
    write_run(path, batches, compact_records=compact)
    preview = load_preview(path)
    assert preview is not None and preview.max_points == PREVIEW_POINTS
    expected = without_preview(path)
    assert set(preview.tags) == set(expected)
    for tag, s in expected.items():
        assert identical(preview.tags[tag], s), tag
    got, read = read_all(path)
    assert read == 0  # answered from the preview: no chunk read
    for tag, s in expected.items():
        assert identical(got[tag], s), tag
        assert not got[tag].values.flags.writeable


def test_a_run_appended_after_close_reads_its_chunks(tmp_path):
    path = str(tmp_path / "r")
    write_run(path, [("loss", np.arange(5000), np.arange(5000.0), True)])
    w = RunWriter(
        path, sync="never"
    )  # reopened, appended, flushed, not closed: the preview is stale
    w.append_scalars("loss", np.array([5000]), np.array([BASE_WALL]), np.array([-7.0]))
    w.flush()
    try:
        got, read = read_all(path)
        assert read > 0
        assert got["loss"].steps[-1] == 5000 and got["loss"].values[-1] == -7.0
    finally:
        w.close()
    got, read = read_all(path)  # closed again: a new preview, with the point
    assert read == 0 and got["loss"].values[-1] == -7.0


def test_a_reader_follows_a_run_past_its_preview(tmp_path):
    path = str(tmp_path / "r")
    write_run(path, [("loss", np.arange(3000), np.arange(3000.0), True)])
    with RunReader(path) as r:
        first = r.read_scalars("loss", max_points=PREVIEW_POINTS)
        assert first.steps[-1] == 2999
        w = RunWriter(path, sync="never")
        w.append_scalars("loss", np.array([3000]), np.array([BASE_WALL]), np.array([9.0]))
        w.flush()
        r.refresh()
        after = r.read_scalars("loss", max_points=PREVIEW_POINTS)
        assert after.steps[-1] == 3000 and after.values[-1] == 9.0
        w.close()


def test_a_reader_with_a_limit_short_of_the_end_reads_its_chunks(tmp_path):
    path = str(tmp_path / "r")
    write_run(path, [("loss", np.arange(100), np.arange(100.0), True)] * 1)
    w = RunWriter(path, sync="never")
    middle = w.position()
    w.append_scalars("loss", np.arange(100, 200), BASE_WALL + np.arange(100.0), np.ones(100))
    w.close()
    with RunReader(path, limit=middle) as r:
        s = r.read_scalars("loss", max_points=PREVIEW_POINTS)
    assert s.steps[-1] == 99


def test_a_damaged_or_foreign_preview_is_ignored(tmp_path):
    path = str(tmp_path / "r")
    write_run(path, [("loss", np.arange(1000), np.arange(1000.0), True)])
    file = Path(path) / PREVIEW_NAME
    expected = without_preview(path)["loss"]
    blob = bytearray(file.read_bytes())
    for at in (0, 10, len(blob) // 2, len(blob) - 1):
        bad = bytearray(blob)
        bad[at] ^= 0x40
        file.write_bytes(bad)
        assert load_preview(path) is None
        got, read = read_all(path)
        assert read > 0 and identical(got["loss"], expected)
    file.write_bytes(blob[: len(blob) // 2])  # cut short
    assert load_preview(path) is None
    # A preview of other points per tag does not answer this read.
    preview = Preview.decode(bytes(blob))
    file.write_bytes(Preview(300, preview.files, preview.tags).encode())
    got, read = read_all(path)
    assert read > 0 and identical(got["loss"], expected)


def test_a_preview_leaves_out_long_tags_and_an_older_run_gets_one(tmp_path):
    path = str(tmp_path / "r")
    write_run(
        path,
        [
            ("short", np.arange(50), np.arange(50.0), True),
            ("long", np.arange(5000), np.arange(5000.0), True),
        ],
    )
    os.remove(os.path.join(path, PREVIEW_NAME))  # a run closed before previews
    assert read_all(path)[1] > 0
    assert write_preview(path, tag_points=1000)
    preview = load_preview(path)
    assert set(preview.tags) == {"short"}
    got, _ = read_all(path)
    assert identical(got["short"], preview.tags["short"])
    assert got["long"].steps[-1] == 4999 and len(got["long"].steps) <= PREVIEW_POINTS


def test_write_preview_refuses_a_run_with_a_torn_tail(tmp_path):
    path = str(tmp_path / "r")
    write_run(path, [("loss", np.arange(10), np.arange(10.0), True)])
    os.remove(os.path.join(path, PREVIEW_NAME))
    segment = os.path.join(path, "segment-000000.vdlr")
    with open(segment, "ab") as f:
        f.write(framing.MAGIC[:3])  # a record being written
    assert not write_preview(path)
    assert not os.path.exists(os.path.join(path, PREVIEW_NAME))


def test_a_run_of_long_tags_only_gets_no_preview_at_close(tmp_path, monkeypatch):
    # Its close would open the run for nothing (a long run's open costs up to 0.3 s).
    monkeypatch.setattr(writer_module, "PREVIEW_TAG_POINTS", 40)
    write_run(str(tmp_path / "long"), [("loss", np.arange(50), np.arange(50.0), True)])
    assert not (tmp_path / "long" / PREVIEW_NAME).exists()
    write_run(
        str(tmp_path / "mixed"), [("a", np.arange(50), np.zeros(50), True), ("b", [0], [1.0], True)]
    )
    assert (tmp_path / "mixed" / PREVIEW_NAME).exists()


def test_a_preview_that_cannot_be_read_leaves_the_read_to_the_chunks(tmp_path, monkeypatch):
    path = str(tmp_path / "r")
    write_run(path, [("loss", np.arange(1000), np.arange(1000.0), True)])
    expected = without_preview(path)["loss"]

    def unreadable(run_dir):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(reader_module, "load_preview", unreadable)
    got, read = read_all(path)
    assert read > 0 and identical(got["loss"], expected)
