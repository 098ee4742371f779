"""``vdl-stream import`` / ``export``: TensorBoard and VisualDL logs into runs, runs out as CSV/JSON."""

from __future__ import annotations

import csv
import glob
import io
import json
import math
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboardX import SummaryWriter
from tensorboardX.proto.summary_pb2 import Summary

import recorder
from vdl_stream import interop, tfevents, tfrecord
from vdl_stream.cli import main

WALL = 1_700_000_000.0
DATA = Path(__file__).parent / "data"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", 3, 2) + b"rest-of-png"


def write_tb_logs(root: Path) -> dict:
    """Two runs as TensorBoard users have them; returns what was logged."""
    rng = np.random.default_rng(3)
    logged = {}
    for run, n in (("train", 500), ("eval", 40)):
        values = rng.normal(size=n) * 10
        walls = WALL + np.cumsum(rng.random(n) * 2)
        with SummaryWriter(str(root / run)) as w:
            for i in range(n):
                w.add_scalar("loss", values[i], i * 10, walltime=walls[i])
            w.add_histogram("weights", rng.normal(size=1000), 7, walltime=WALL + 3)
            image = Summary.Image(height=2, width=3, colorspace=3, encoded_image_string=PNG)
            w._get_file_writer().add_summary(
                Summary(value=[Summary.Value(tag="sample", image=image)]), 8, WALL + 4
            )
            w.add_text("notes", f"{run} notes", 9, walltime=WALL + 5)
        logged[run] = (np.arange(n) * 10, walls, values.astype(np.float32).astype(np.float64))
    return logged


def test_import_keeps_every_value_step_and_wall_time(tmp_path, capsys):
    logged = write_tb_logs(tmp_path / "tb")
    assert main(["import", str(tmp_path / "tb"), "--logdir", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    assert "imported 2 run(s)" in err and "0 damaged" in err
    assert recorder.list_runs(tmp_path / "runs") == ["eval", "train"]
    for run, (steps, walls, values) in logged.items():
        event_file = glob.glob(str(tmp_path / "tb" / run / "events.out.tfevents.*"))[0]
        with recorder.RunReader(tmp_path / "runs" / run) as reader:
            series = reader.read_scalars("loss")
            assert series.steps.tolist() == steps.tolist()
            # the recorder keeps wall times to the microsecond (docs/record-format.md)
            assert np.abs(series.walls - walls).max() <= 1e-6
            assert series.values.tolist() == values.tolist()
            expected = {e[1]: e for b in tfevents.read_event_file(event_file) for e in b.events}
            (hist,) = reader.read_records(kind="histogram")
            assert (hist.tag, hist.step, hist.wall) == ("weights", 7, WALL + 3)
            assert hist.data == expected["weights"][4]
            assert np.frombuffer(hist.data["counts"], "<f8").sum() == 1000
            (image,) = reader.read_records(kind="image")
            assert (image.step, image.data["data"], image.data["format"]) == (8, PNG, "png")
            (text,) = reader.read_records(kind="text")
            assert (text.tag, text.data["text"]) == ("notes/text_summary", f"{run} notes")
            assert reader.meta["imported_from"] == ["tensorboard"]


def test_a_step_going_back_is_a_restart(tmp_path):
    with SummaryWriter(str(tmp_path / "tb" / "r")) as w:
        for step in range(10):
            w.add_scalar("x", step, step, walltime=WALL + step)
        for step in range(5, 15):  # resumed from the checkpoint of step 5
            w.add_scalar("x", 100 + step, step, walltime=WALL + 20 + step)
        w.add_scalar("x", 7, 14, walltime=WALL + 40)  # an equal step is no restart
    assert (
        main(["import", str(tmp_path / "tb"), "--logdir", str(tmp_path / "runs"), "--quiet"]) == 0
    )
    with recorder.RunReader(tmp_path / "runs" / "r") as reader:
        series = reader.read_scalars("x")
    assert series.steps.tolist() == [*range(15), 14]
    assert series.values.tolist() == [0, 1, 2, 3, 4, *[100 + s for s in range(5, 15)], 7]


def test_damaged_and_truncated_records_are_reported_and_skipped(tmp_path, capsys):
    with SummaryWriter(str(tmp_path / "tb" / "r")) as w:
        for step in range(100):
            w.add_scalar("x", step, step, walltime=WALL + step)
    (path,) = glob.glob(str(tmp_path / "tb" / "r" / "events.out.tfevents.*"))
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x10  # inside one record
    tail = tfrecord.encode_record(b"\x09" + struct.pack("<d", WALL) + b"\x10\x01")
    Path(path).write_bytes(bytes(data) + tail[:-5])  # and a record cut short at the end
    assert main(["import", str(tmp_path / "tb"), "--logdir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "2 damaged record(s) skipped" in err
    assert "truncated record at end of file" in err
    assert "checksum mismatch" in err
    with recorder.RunReader(tmp_path / "runs" / "r") as reader:
        steps = reader.read_scalars("x").steps.tolist()
    assert len(steps) >= 98 and set(steps) <= set(range(100))


def test_bad_input_is_refused_with_a_message(tmp_path, capsys):
    write_tb_logs(tmp_path / "tb")
    runs = str(tmp_path / "runs")
    assert main(["import", str(tmp_path / "nope"), "--logdir", runs]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert main(["import", str(tmp_path / "notes.txt"), "--logdir", runs]) == 2
    assert "not a TensorBoard event file" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "tb"), "--logdir", runs, "--quiet"]) == 0
    assert main(["import", str(tmp_path / "tb"), "--logdir", runs]) == 2
    assert "already exists" in capsys.readouterr().err


def test_progress_bar_on_stderr(tmp_path, capsys):
    write_tb_logs(tmp_path / "tb")
    assert (
        main(["import", str(tmp_path / "tb"), "--logdir", str(tmp_path / "r"), "--progress"]) == 0
    )
    err = capsys.readouterr().err
    assert "\rimport [" in err and "100%" in err and "events" in err


def test_visualdl_records_import(tmp_path, capsys):
    """The checked-in file was written by VisualDL 2.5.3 (tests/data/make_visualdl_fixture.py)."""
    assert main(["import", str(DATA / "visualdl"), "--logdir", str(tmp_path)]) == 0
    assert "0 damaged" in capsys.readouterr().err
    steps = np.arange(50)
    walls = (1_700_000_000_000 + steps * 250) / 1000
    f32 = lambda x: np.asarray(x, np.float32).astype(np.float64).tolist()  # noqa: E731
    with recorder.RunReader(tmp_path / "visualdl") as reader:
        loss = reader.read_scalars("train/loss")
        assert loss.steps.tolist() == steps.tolist()
        assert loss.walls.tolist() == walls.tolist()
        assert loss.values.tolist() == f32(1.0 / (steps + 1))
        assert reader.read_scalars("lr/a").values.tolist() == f32(steps * 0.5)
        assert reader.read_scalars("lr/b").values.tolist() == f32(-steps * 0.25)
        (hist,) = reader.read_records(kind="histogram")
        counts, edges = np.histogram(np.sin(np.arange(1000) * 0.01), bins=10)
        assert (hist.tag, hist.step, hist.wall) == ("weights", 10, 1_700_000_002.5)
        assert np.frombuffer(hist.data["counts"], "<f8").tolist() == counts.tolist()
        assert np.frombuffer(hist.data["edges"], "<f8").tolist() == edges.tolist()
        (text,) = reader.read_records(kind="text")
        assert (text.tag, text.step, text.data["text"]) == ("notes", 20, "hello from VisualDL")
        (image,) = reader.read_records(kind="image")
        assert image.data["format"] == "png" and (image.data["width"], image.data["height"]) == (
            4,
            4,
        )
        assert reader.meta["display_name"] == "fixture"
        assert reader.meta["imported_from"] == ["visualdl"]


def test_visualdl_cut_file_keeps_what_is_whole(tmp_path, capsys):
    src = tmp_path / "vdl" / "r"
    src.mkdir(parents=True)
    data = (DATA / "visualdl" / "vdlrecords.1700000000.log").read_bytes()
    (src / "vdlrecords.1700000000.log").write_bytes(data[: len(data) - 30])
    assert main(["import", str(tmp_path / "vdl"), "--logdir", str(tmp_path / "runs")]) == 1
    assert "truncated record at end of file" in capsys.readouterr().err
    with recorder.RunReader(tmp_path / "runs" / "r") as reader:
        assert len(reader.read_scalars("train/loss")) == 50


@pytest.fixture
def imported(tmp_path) -> Path:
    write_tb_logs(tmp_path / "tb")
    assert (
        main(["import", str(tmp_path / "tb"), "--logdir", str(tmp_path / "runs"), "--quiet"]) == 0
    )
    run = tmp_path / "runs" / "train"
    with recorder.RunWriter(run) as w:  # add telemetry and non-finite values, as a live run has
        w.append_record(
            "telemetry",
            None,
            None,
            WALL + 1,
            {"host": "n1", "rank": 0, "fields": {"gpu0/util": 87.5}},
        )
        w.append_scalars("odd", [1, 2, 3], [WALL, WALL + 1, WALL + 2], [math.nan, math.inf, 0.1])
    return run


def test_export_csv_round_trips_every_value(imported, capsys):
    out = imported.parent / "train.csv"
    assert main(["export", str(imported), "--format", "csv", "-o", str(out)]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["tag", "step", "wall_time", "value"]
    by_tag: dict[str, list] = {}
    for tag, step, wall, value in rows[1:]:
        by_tag.setdefault(tag, []).append((step, float(wall), float(value)))
    with recorder.RunReader(imported) as reader:
        loss = reader.read_scalars("loss")
    assert [int(s) for s, _, _ in by_tag["loss"]] == loss.steps.tolist()
    assert [w for _, w, _ in by_tag["loss"]] == loss.walls.tolist()
    assert [v for _, _, v in by_tag["loss"]] == loss.values.tolist()
    odd = by_tag["odd"]
    assert math.isnan(odd[0][2]) and odd[1][2] == math.inf and odd[2][2] == 0.1
    assert by_tag["telemetry/n1/rank0/gpu0/util"] == [("", WALL + 1, 87.5)]


def test_export_json_to_stdout_with_a_tag_filter(imported, capsys):
    assert main(["export", str(imported), "--format", "json", "--tag", "^(loss|odd)$"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc) == ["loss", "odd"]
    with recorder.RunReader(imported) as reader:
        loss = reader.read_scalars("loss")
    assert doc["loss"] == [
        [w, s, v]
        for s, w, v in zip(
            loss.steps.tolist(), loss.walls.tolist(), loss.values.tolist(), strict=True
        )
    ]
    assert doc["odd"] == [[WALL, 1, None], [WALL + 1, 2, None], [WALL + 2, 3, 0.1]]


def test_export_refuses_bad_input(imported, tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["export", str(imported), "--tag", "("]) == 2
    assert "--tag is not a valid regular expression" in capsys.readouterr().err
    assert main(["export", str(imported), "--tag", "nothing-matches"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "tag,step,wall_time,value\n" and "no scalar tags" in captured.err


def test_import_directory_of_event_files_names_the_run_after_it(tmp_path):
    src = tmp_path / "my_exp"
    with SummaryWriter(str(src)) as w:
        w.add_scalar("x", 1.0, 1, walltime=WALL)
    shutil.copytree(DATA / "visualdl", src / "vdl")
    assert main(["import", str(src), "--logdir", str(tmp_path / "runs"), "--quiet"]) == 0
    assert recorder.list_runs(tmp_path / "runs") == ["my_exp", "vdl"]
    assert os.path.isdir(tmp_path / "runs" / "my_exp")


def test_files_given_one_by_one_join_their_directory_run(tmp_path):
    for i in range(2):
        with SummaryWriter(str(tmp_path / "exp"), filename_suffix=f".{i}") as w:
            w.add_scalar("x", float(i), i, walltime=WALL + i)
    files = sorted(glob.glob(str(tmp_path / "exp" / "events.out.tfevents.*")))
    assert len(files) == 2
    assert main(["import", *files, "--logdir", str(tmp_path / "runs"), "--quiet"]) == 0
    with recorder.RunReader(tmp_path / "runs" / "exp") as reader:
        assert reader.read_scalars("x").values.tolist() == [0.0, 1.0]


def test_import_brings_tensorboard_projector_embeddings(tmp_path):
    rng = np.random.default_rng(3)
    feat, pairs = rng.random((5, 3)), rng.random((4, 2))
    writer = SummaryWriter(str(tmp_path / "tb" / "run1"))
    writer.add_scalar("loss", 1.0, 0)
    writer.add_embedding(feat, metadata=list("abcde"), global_step=3, tag="feat")
    writer.add_embedding(
        pairs,
        metadata=[["x", 1], ["y", 2], ["z", 3], ["w", 4]],
        metadata_header=["n", "k"],
        tag="two",
    )
    faces = rng.random((5, 3, 4, 4))
    writer.add_embedding(rng.random((5, 2)), label_img=faces, global_step=7, tag="faces")
    writer.close()
    (tmp_path / "tb" / "run1" / "00000" / "broken").mkdir()
    with open(tmp_path / "tb" / "run1" / "projector_config.pbtxt", "a") as f:  # a missing file
        f.write('embeddings {\ntensor_name: "gone:00001"\ntensor_path: "00000/broken/t.tsv"\n}\n')
    report = interop.import_runs([str(tmp_path / "tb")], tmp_path / "out")
    assert report.runs["run1"] == (1, 3)
    assert report.skipped["projector embedding (unreadable)"] == 1
    with recorder.RunReader(tmp_path / "out" / "run1") as reader:
        got = {r.tag: r for r in reader.read_records(kind="embedding")}
    assert set(got) == {"feat", "two", "faces"} and (got["feat"].step, got["two"].step) == (3, 0)
    # The sprite's tiles come back as tensorboardX drew them (the same tiling, 3 columns for 5).
    from PIL import Image

    ours = np.asarray(Image.open(io.BytesIO(got["faces"].data["sprite"])).convert("RGB"))
    theirs = np.asarray(Image.open(tmp_path / "tb" / "run1" / "00007" / "faces" / "sprite.png"))
    assert got["faces"].data["thumbnail"] == [4, 4]
    np.testing.assert_array_equal(ours[:8, :12], theirs[:8, :12, :3])
    assert len(np.unique(theirs[:4, 4:8])) > 1  # a real tile, not a flat one
    np.testing.assert_array_equal(
        np.frombuffer(got["feat"].data["data"], "<f4").reshape(5, 3), feat.astype(np.float32)
    )
    assert got["feat"].data["metadata"] == [list("abcde")]
    assert got["two"].data["metadata_header"] == ["n", "k"]
    assert got["two"].data["metadata"] == [["x", "y", "z", "w"], ["1", "2", "3", "4"]]
