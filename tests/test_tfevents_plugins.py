"""``vdl-stream import`` (and ``serve``'s following) bring TensorBoard pr_curves and hparams."""

from __future__ import annotations

import os

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import compute_curve

import recorder
from vdl_stream import codec, interop

WALL = 1_700_000_000.0


def test_import_brings_pr_curves_and_hparams_of_tensorboardx(tmp_path):
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 200)
    predictions = rng.random(200)
    src = tmp_path / "tb" / "train"
    with SummaryWriter(str(src)) as w:
        w.add_pr_curve("pr", labels, predictions, 3, num_thresholds=11, walltime=WALL)
        w.add_hparams({"lr": 0.01, "opt": "adam", "layers": 4, "bn": True}, {"hp/acc": 0.75}, "h")
    report = interop.import_runs([str(tmp_path / "tb")], tmp_path / "logs")
    assert set(report.runs) == {"train", "train/h"}
    with recorder.RunReader(tmp_path / "logs" / "train") as reader:
        (record,) = reader.read_records("pr_curve", "pr")
    curve = {**record.data, "kind": "pr_curve", "tag": "pr", "step": 3, "wall": WALL}
    codec.check_event(curve)  # what a writer's add_pr_curve makes, in the wire schema
    assert (record.step, record.wall) == (3, WALL)
    expected = compute_curve(labels, predictions, num_thresholds=11)  # tp fp tn fn prec rec
    names = ("tp", "fp", "tn", "fn", "precision", "recall")
    for row, name in zip(expected, names, strict=True):
        assert np.allclose(np.frombuffer(record.data[name], "<f8"), row, rtol=1e-6), name
    assert record.data["num_thresholds"] == 11
    assert np.frombuffer(record.data["thresholds"], "<f8").tolist() == [i / 10 for i in range(11)]
    with recorder.RunReader(tmp_path / "logs" / "train" / "h") as reader:
        (hp,) = reader.read_records("hparams")
        acc = reader.read_scalars("hp/acc")
    assert hp.data["hparams"] == {"lr": 0.01, "opt": "adam", "layers": 4.0, "bn": True}
    assert hp.data["metrics"] == ["hp/acc"]
    assert acc.values.tolist() == [0.75]
    codec.check_event({**hp.data, "kind": "hparams", "tag": None, "step": None, "wall": hp.wall})
    assert report.skipped["hparams experiment"] == 1
    assert report.skipped["hparams session end"] == 1
    assert not report.corrupt
    assert os.listdir(src)  # the sources are left as they were
