"""The drop-in facades, end to end: VisualDL / tensorboardX code -> attach() -> broker -> disk."""

from __future__ import annotations

import io
import math
import os
import wave

import numpy as np
import pytest

import recorder
from tests.test_summaries import decode_png
from vdl_stream.compat import LogWriter, SummaryWriter, split_logdir

QUIET = {"telemetry": False}  # an attach() option passed through the facades' **kwargs

RNG = np.random.default_rng(7)
WEIGHTS = RNG.normal(size=(3, 1000)).astype(np.float32)
IMAGE_HWC = RNG.integers(0, 256, size=(8, 12, 3), dtype=np.uint8)
AUDIO = (0.3 * np.sin(np.arange(400) / 5)).astype(np.float32)
LABELS = RNG.integers(0, 2, 200)
PREDICTIONS = RNG.random(200)


def train_with_visualdl(writer: LogWriter) -> None:
    """A training loop as written for VisualDL 2.x, with its keyword names."""
    for step in range(3):
        writer.add_scalar(tag="train/loss", value=np.float32(1.0 / (step + 1)), step=step)
        writer.add_scalars(main_tag="lr", tag_scalar_dict={"a": 0.1, "b": 0.2}, step=step)
        writer.add_histogram(tag="w", values=WEIGHTS[step], step=step, buckets=10)
    writer.add_image(tag="input", img=IMAGE_HWC, step=2)
    writer.add_text(tag="notes", text_string="epoch done", step=2)
    writer.add_audio(tag="voice", audio_array=AUDIO, step=2, sample_rate=16000)
    writer.add_hparams(hparams_dict={"lr": 0.1, "opt": "sgd"}, metrics_list=["train/loss"])
    writer.add_pr_curve(tag="pr", labels=LABELS, predictions=PREDICTIONS, step=2, num_thresholds=10)


def train_with_tensorboard(writer: SummaryWriter) -> None:
    """The same loop as written for tensorboardX / torch.utils.tensorboard."""
    for step in range(3):
        writer.add_scalar("train/loss", scalar_value=np.float32(1.0 / (step + 1)), global_step=step)
        writer.add_scalars("lr", {"a": 0.1, "b": 0.2}, global_step=step)
        writer.add_histogram("w", WEIGHTS[step], global_step=step, bins=10)
    writer.add_image("input", IMAGE_HWC.transpose(2, 0, 1), global_step=2)  # CHW by default
    writer.add_text("notes", "epoch done", global_step=2)
    writer.add_audio("voice", AUDIO, global_step=2, sample_rate=16000)
    writer.add_hparams({"lr": 0.1, "opt": "sgd"}, {"train/loss": 1 / 3})
    writer.add_pr_curve("pr", LABELS, PREDICTIONS, global_step=2, num_thresholds=10)


def read_run(path: os.PathLike[str]) -> dict:
    """What a run holds, in comparable form."""
    with recorder.RunReader(path) as reader:
        out = {
            tag: reader.read_scalars(tag).values.tolist()
            for tag, info in reader.tags().items()
            if info.kind == "scalars"
        }
        for kind in ("histogram", "image", "text", "audio", "pr_curve", "hparams"):
            out[kind] = [(r.tag, r.step, r.data) for r in reader.read_records(kind=kind)]
    return out


def test_the_same_snippet_through_both_facades_records_the_same_run(tmp_path):
    with LogWriter(logdir=tmp_path / "vdl" / "exp", **QUIET) as vdl:
        train_with_visualdl(vdl)
    with SummaryWriter(log_dir=tmp_path / "tb" / "exp", **QUIET) as tb:
        train_with_tensorboard(tb)
    assert recorder.list_runs(tmp_path / "vdl") == recorder.list_runs(tmp_path / "tb") == ["exp"]
    a, b = read_run(tmp_path / "vdl" / "exp"), read_run(tmp_path / "tb" / "exp")

    assert a["train/loss"] == pytest.approx([1.0, 0.5, 1 / 3])
    assert a["lr/a"] == [0.1] * 3 and a["lr/b"] == [0.2] * 3
    for key in ("train/loss", "lr/a", "lr/b", "histogram", "image", "text", "audio", "pr_curve"):
        assert a[key] == b[key], key
    assert [(tag, step) for tag, step, _ in a["histogram"]] == [("w", 0), ("w", 1), ("w", 2)]
    counts = np.frombuffer(a["histogram"][1][2]["counts"], "<f8")
    assert counts.tolist() == np.histogram(WEIGHTS[1].astype(np.float64), 10)[0].tolist()
    (image,) = a["image"]
    assert np.array_equal(decode_png(image[2]["data"]), IMAGE_HWC)
    assert a["text"][0][2]["text"] == "epoch done"
    with wave.open(io.BytesIO(a["audio"][0][2]["data"])) as wav:
        assert (wav.getframerate(), wav.getnframes()) == (16000, 400)
    # the two libraries' hparams shapes are both kept: metric tags, or final values
    (vdl_hparams,), (tb_hparams,) = a["hparams"], b["hparams"]
    assert vdl_hparams[2] == {
        "hparams": {"lr": 0.1, "opt": "sgd"},
        "metrics": ["train/loss"],
        "metric_values": None,
    }
    assert tb_hparams[2]["metric_values"] == {"train/loss": pytest.approx(1 / 3)}


def test_logdir_last_component_is_the_run(tmp_path):
    with LogWriter(str(tmp_path / "log" / "scalar_test"), **QUIET) as writer:
        writer.add_scalar("x", 1.0, 0)
        assert writer.writer.run == "scalar_test"
        assert writer.logdir == str(tmp_path / "log" / "scalar_test")
    assert recorder.list_runs(tmp_path / "log") == ["scalar_test"]
    assert split_logdir("relative/dir") == (os.path.abspath("relative"), "dir")
    with pytest.raises(ValueError, match="run must be a relative path"):
        split_logdir(tmp_path / "bad:name")


def test_run_keyword_makes_logdir_the_root(tmp_path):
    with SummaryWriter(tmp_path, run="exp/seed1", **QUIET) as writer:
        writer.add_scalar("x", 2.0, 5)
    assert recorder.list_runs(tmp_path) == ["exp/seed1"]


def test_default_directories_follow_each_library(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with LogWriter(comment="baseline", **QUIET) as vdl:
        vdl.add_scalar("x", 1.0, 0)
    with SummaryWriter(comment="_lr0.1", **QUIET) as tb:
        tb.add_scalar("x", 1.0, 0)
    vdl_run, tb_run = vdl.writer.run, tb.writer.run
    assert vdl_run.endswith(".baseline") and tb_run.endswith("_lr0.1")  # as each library names
    assert vdl_run[:8].isdigit() and tb_run[:8].isdigit()  # attach()'s sortable unique names
    assert recorder.list_runs(tmp_path / "runs") == sorted([vdl_run, tb_run])
    assert tb.get_logdir() == tb.log_dir == os.path.join("runs", tb.writer.run)


def test_tensorboard_defaults_global_step_zero_and_bins(tmp_path):
    values = np.random.default_rng(0).normal(size=5000)
    with SummaryWriter(logdir=tmp_path / "run", **QUIET) as writer:  # tensorboardX's older name
        writer.add_scalar("x", 3.0)
        writer.add_histogram("tf", values)
        writer.add_histogram("auto", values, 1, bins="auto")
        writer.add_histogram("capped", values, 1, bins=200, max_bins=50)
        writer.add_images("batch", np.zeros((3, 1, 4, 4), np.float32))
        writer.add_text("t", "hello")
        with pytest.raises(TypeError, match="explicit edges are not supported"):
            writer.add_histogram("edges", values, 1, bins=[0, 1, 2])
        with pytest.raises(ValueError, match="bins must be an int, 'tensorflow' or a numpy"):
            writer.add_histogram("bad", values, 1, bins="nope")
        # Without a finite value the name is checked all the same (it went through, once).
        with pytest.raises(ValueError, match="bins must be an int, 'tensorflow' or a numpy"):
            writer.add_histogram("bad", np.full(3, np.nan), 1, bins="")
        writer.add_histogram("auto_nan", np.full(3, np.nan), 1, bins="auto")
        with pytest.raises(ValueError, match="bins must be from 1 to 10000, got 0"):
            writer.add_histogram("bad", values, 1, bins=0)
        with pytest.raises(TypeError, match=r"explicit edges are not supported.* got ndarray"):
            writer.add_histogram("bad", values, 1, bins=np.array([0.0, 1.0]))
        writer.add_histogram("np_int", values, 1, bins=np.int64(7))
    with recorder.RunReader(tmp_path / "run") as reader:
        assert reader.read_scalars("x").steps.tolist() == [0]
        buckets = {
            r.tag: len(np.frombuffer(r.data["counts"], "<f8"))
            for r in reader.read_records(kind="histogram")
        }
        assert buckets == {
            "tf": 30,
            "auto": len(np.histogram_bin_edges(values, "auto")) - 1,
            "capped": 50,
            "np_int": 7,
            "auto_nan": 1,
        }
        (batch,) = reader.read_records(kind="image")
        assert (batch.step, batch.data["width"], batch.data["height"]) == (0, 12, 4)
        assert reader.read_records(kind="text")[0].step == 0


def test_visualdl_walltime_in_milliseconds_or_seconds(tmp_path):
    with LogWriter(tmp_path / "run", **QUIET) as writer:
        writer.add_scalar("ms", 1.0, 0, walltime=1_700_000_000_123)  # VisualDL's own unit
        writer.add_scalar("s", 1.0, 0, walltime=1_700_000_000.5)
        writer.add_text("t", "x", 0, walltime=1_700_000_000_000)
        with pytest.raises(ValueError, match="walltime must be a finite number"):
            writer.add_scalar("bad", 1.0, 0, walltime=math.inf)
    with recorder.RunReader(tmp_path / "run") as reader:
        assert reader.read_scalars("ms").walls.tolist() == [pytest.approx(1_700_000_000.123)]
        assert reader.read_scalars("s").walls.tolist() == [1_700_000_000.5]
        assert reader.read_records(kind="text")[0].wall == 1_700_000_000.0
        assert "bad" not in reader.tags()


def test_visualdl_caps_pr_thresholds_and_logs_roc(tmp_path):
    with LogWriter(tmp_path / "run", **QUIET) as writer:
        writer.add_pr_curve("pr", LABELS, PREDICTIONS, 0, num_thresholds=500)
        writer.add_roc_curve("roc", LABELS, PREDICTIONS, 0, num_thresholds=20)
    with recorder.RunReader(tmp_path / "run") as reader:
        (pr,) = reader.read_records(kind="pr_curve")
        (roc,) = reader.read_records(kind="roc_curve")
    assert pr.data["num_thresholds"] == 127
    assert len(np.frombuffer(roc.data["fpr"], "<f8")) == 20


def test_visualdl_1x_modes_are_sub_runs(tmp_path):
    writer = LogWriter(tmp_path / "exp", sync_cycle=10, **QUIET)
    with writer.mode("train") as logger:
        loss = logger.scalar("loss")
        hist = logger.histogram("w", num_buckets=4)
    with writer.mode("test"):
        acc = writer.scalar("acc")  # the 1.x form that uses the writer inside the block
        notes = writer.text("notes")
    images = writer.mode("train").image("samples", num_samples=2)
    for step in range(4):
        loss.add_record(step, 1.0 / (step + 1))  # after the with block, as 1.x tutorials do
        acc.add_record(step, step / 4)
    hist.add_record(3, [1.0, 2.0, 3.0, 4.0])
    notes.add_record(1, "ok")
    for _ in range(2):
        images.start_sampling()
        while (index := images.is_sample_taken()) >= 0:
            images.set_sample(index, [2, 3, 3], list(np.full(18, 200.0)))  # floats in 0..255
        images.finish_sampling()
    writer.add_scalar("outside", 1.0, 0)
    writer.close()

    assert recorder.list_runs(tmp_path) == ["exp", "exp/test", "exp/train"]
    with recorder.RunReader(tmp_path / "exp" / "train") as reader:
        assert reader.read_scalars("loss").values.tolist() == [1.0, 0.5, 1 / 3, 0.25]
        (h,) = reader.read_records(kind="histogram")
        assert np.frombuffer(h.data["counts"], "<f8").tolist() == [1, 1, 1, 1]
        shots = [(r.tag, r.step) for r in reader.read_records(kind="image")]
        assert shots == [("samples/0", 0), ("samples/1", 0), ("samples/0", 1), ("samples/1", 1)]
        pixels = decode_png(reader.read_records(kind="image")[0].data["data"])
        assert pixels.shape == (2, 3, 3) and (pixels == 200).all()
    with recorder.RunReader(tmp_path / "exp" / "test") as reader:
        assert reader.read_scalars("acc").values.tolist() == [0.0, 0.25, 0.5, 0.75]
        assert reader.read_records(kind="text")[0].data["text"] == "ok"
    with recorder.RunReader(tmp_path / "exp") as reader:
        assert set(reader.tags()) == {"outside"}


def test_display_name_is_run_meta(tmp_path):
    with LogWriter(tmp_path / "run", display_name="ResNet-50 baseline", **QUIET) as writer:
        writer.add_scalar("x", 1.0, 0)
    with recorder.RunReader(tmp_path / "run") as reader:
        assert reader.meta["display_name"] == "ResNet-50 baseline"


def test_bad_input_raises_at_the_call_site_and_loses_nothing(tmp_path):
    with SummaryWriter(tmp_path / "run", **QUIET) as writer:
        writer.add_image("img", np.zeros((3, 4, 4), np.uint8), 0)
        with pytest.raises(ValueError, match=r"dataformats='CHW' .* got shape \(5, 4, 4\)"):
            writer.add_image("img", np.zeros((5, 4, 4), np.uint8), 1)
        with pytest.raises(TypeError, match=r"tag_scalar_dict\['b'\] must be a real number"):
            writer.add_scalars("m", {"a": 1.0, "b": "x"}, 1)  # checked whole: nothing logged
        with pytest.raises(TypeError, match="text_string must be a str, got int"):
            writer.add_text("t", 42, 1)
        with pytest.raises(TypeError, match="hparam_dict and metric_dict must be dicts"):
            writer.add_hparams({"lr": 0.1}, ["acc"])
        writer.add_image("img", np.ones((3, 4, 4), np.float32), 2)
        writer.flush()
        with recorder.RunReader(tmp_path / "run") as reader:  # durable after flush()
            assert [r.step for r in reader.read_records(kind="image")] == [0, 2]
            assert "m/a" not in reader.tags() and "t" not in reader.tags()


def test_unknown_keywords_are_refused_and_library_only_ones_accepted(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        LogWriter(tmp_path / "a", colour="red")
    with pytest.raises(TypeError, match="unexpected keyword argument 'flush_every'"):
        SummaryWriter(tmp_path / "b", flush_every=3)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with LogWriter(
        tmp_path / "c", max_queue=1, flush_secs=1, write_to_disk=True, file_name="f", **QUIET
    ) as writer:
        writer.add_scalar("x", 1.0, 0)
    assert recorder.list_runs(tmp_path) == ["c"]


def test_facade_arguments_are_checked_at_the_call(tmp_path):
    with pytest.raises(TypeError, match="comment must be a str, got int 3"):
        SummaryWriter(comment=3, **QUIET)
    with pytest.raises(ValueError, match="display_name must be encodable"):
        LogWriter(tmp_path / "r", display_name="a\ud800", **QUIET)
    with LogWriter(tmp_path / "v", **QUIET) as writer, writer.mode("m"):
        images = writer.image("i")
        images.start_sampling()
        with pytest.raises(TypeError, match="image_shape must be a list of 2 or 3 ints"):
            images.set_sample(0, None, [0.0])
        with pytest.raises(TypeError, match="image_shape must be a list"):
            images.set_sample(0, [2.5, 1], [0.0])
        with pytest.raises(ValueError, match=r"image_shape must be 2 or 3 positive sizes"):
            images.set_sample(0, [-1, -1], [0.0])
        images.set_sample(0, [1, 1], [0.5])
        images.finish_sampling()
    with recorder.RunReader(tmp_path / "v" / "m") as reader:
        assert [r.tag for r in reader.read_records(kind="image")] == ["i"]
