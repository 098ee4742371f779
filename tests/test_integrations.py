"""Framework integrations: each trains a tiny model built here with the real framework, and the
metrics the framework reported come back exactly through ``vdl-stream export``.

Every framework is optional (the ``integrations`` extra, part of ``test``): a test whose framework
is missing is skipped with a reason naming it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vdl_stream.cli import main


def exported(run_dir: Path, tmp_path: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's scalars as ``{tag: [(step, value), ...]}``, read back through ``vdl-stream export``."""
    out = tmp_path / f"export-{run_dir.name}.json"
    assert main(["export", str(run_dir), "--format", "json", "-o", str(out)]) == 0
    rows = json.loads(out.read_text())
    return {tag: [(step, value) for _wall, step, value in points] for tag, points in rows.items()}


def scalar_tags(series: dict[str, list[tuple[int, float]]]) -> set[str]:
    return {tag for tag in series if not tag.startswith("telemetry/")}


def as_float(value: Any) -> float:
    """A logged value as the writer stores it (float64)."""
    if isinstance(value, (list, tuple)):
        value = value[0]
    return float(np.asarray(value).item())


def test_importing_vdl_stream_imports_no_framework():
    code = (
        "import sys, vdl_stream, vdl_stream.integrations\n"
        "loaded = [m for m in ('torch', 'paddle', 'keras', 'lightning', 'transformers',"
        " 'pytorch_lightning', 'tensorflow', 'matplotlib', 'PIL') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- PaddlePaddle --------------------------------------------------------------------------------


def test_paddle_fit_metrics_come_back_exactly(tmp_path):
    paddle = pytest.importorskip("paddle")
    from vdl_stream.integrations.paddle import VisualDL

    class Capture(paddle.callbacks.Callback):
        """Records what Model.fit reports, the way Paddle's own VisualDL callback reads it."""

        def __init__(self) -> None:
            super().__init__()
            self.train: list[dict[str, Any]] = []
            self.eval: list[dict[str, Any]] = []

        def on_train_batch_end(self, step, logs=None):
            self.train.append(dict(logs))

        def on_eval_end(self, logs=None):
            self.eval.append(dict(logs))

    paddle.seed(0)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(96, 4)).astype("float32")
    ys = (xs.sum(axis=1) > 0).astype("int64")[:, None]
    data = paddle.io.TensorDataset([paddle.to_tensor(xs), paddle.to_tensor(ys)])
    net = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2))
    model = paddle.Model(net)
    model.prepare(
        paddle.optimizer.Adam(learning_rate=0.01, parameters=net.parameters()),
        paddle.nn.CrossEntropyLoss(),
        paddle.metric.Accuracy(),
    )
    capture = Capture()
    callback = VisualDL(str(tmp_path / "logs" / "fit"))
    model.fit(data, data, epochs=2, batch_size=32, verbose=0, callbacks=[capture, callback])
    assert callback.writer is None  # closed at the end of training

    series = exported(tmp_path / "logs" / "fit", tmp_path)
    assert scalar_tags(series) == {"train/loss", "train/acc", "eval/loss", "eval/acc"}
    for name in ("loss", "acc"):
        want = [(i + 1, as_float(logs[name])) for i, logs in enumerate(capture.train)]
        assert series[f"train/{name}"] == want
        want = [(epoch, as_float(logs[name])) for epoch, logs in enumerate(capture.eval)]
        assert series[f"eval/{name}"] == want
    assert len(series["train/loss"]) == 6  # 3 batches x 2 epochs
    assert all(math.isfinite(v) for _, v in series["train/loss"])


def test_paddle_callback_logs_on_rank_zero_only(tmp_path, monkeypatch):
    pytest.importorskip("paddle")
    from vdl_stream.integrations.paddle import VisualDL

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setenv("PADDLE_JOB_ID", "job-7")
    callback = VisualDL(str(tmp_path / "logs" / "fit"), telemetry=False)
    callback.set_params({"epochs": 1, "metrics": ["loss"]})
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    callback.on_train_batch_end(0, {"loss": [0.5]})
    callback.on_train_end()
    # Rank 1 may hold a run of its own (telemetry goes there), but no metric is anywhere.
    import recorder

    runs = {p.parent for p in tmp_path.rglob("*") if p.is_file()}
    for run_dir in runs:
        with recorder.RunReader(run_dir) as reader:
            assert reader.tags() == {}, run_dir


def test_paddle_callback_checks_its_directory_before_training(tmp_path):
    pytest.importorskip("paddle")
    from vdl_stream.integrations.paddle import VisualDL

    with pytest.raises(TypeError, match="logdir must be a str or path, got int"):
        VisualDL(3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nonsense'"):
        VisualDL(str(tmp_path / "run"), nonsense=1)


# -- PyTorch Lightning ---------------------------------------------------------------------------


def test_lightning_logger_metrics_and_hparams_come_back_exactly(tmp_path):
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("lightning.pytorch")
    import recorder
    from vdl_stream.compat import SummaryWriter
    from vdl_stream.integrations.lightning import VdlStreamLogger

    class Capture(pl.loggers.Logger):
        """A second logger of the same trainer: what Lightning handed to its loggers."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int | None, dict[str, float]]] = []

        name = "capture"
        version = "0"

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, {k: as_float(v) for k, v in metrics.items()}))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class Tiny(pl.LightningModule):
        def __init__(self, lr: float = 0.05, hidden: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train/loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    logger = VdlStreamLogger(tmp_path / "logs", run="tiny")
    capture = Capture()
    trainer = pl.Trainer(
        max_epochs=2,
        logger=[logger, capture],
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    assert isinstance(logger.experiment, SummaryWriter)
    trainer.fit(Tiny(), loader, loader)
    assert logger._experiment is None  # finalize() closed the run

    want: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in capture.rows:
        for key, value in metrics.items():
            want.setdefault(key, []).append((step, value))
    series = exported(tmp_path / "logs" / "tiny", tmp_path)
    assert {"train/loss", "val/loss", "epoch"} <= scalar_tags(series)
    assert {tag: series[tag] for tag in want} == want
    assert len(series["train/loss"]) == 8  # 4 batches x 2 epochs, one point each
    with recorder.RunReader(tmp_path / "logs" / "tiny") as reader:
        (record,) = list(reader.read_records(kind="hparams"))
    assert record.data["hparams"] == {"lr": 0.05, "hidden": 8}


def test_lightning_logger_logs_on_rank_zero_only(tmp_path, monkeypatch):
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.utilities import rank_zero_only

    from vdl_stream.integrations.lightning import VdlStreamLogger

    logger = VdlStreamLogger(tmp_path / "logs", run="ranks")
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger.log_hyperparams({"lr": 0.1}, {"best": 1.0})
    logger.log_metrics({"train/loss": 0.5}, step=3)
    logger.save()
    logger.finalize("success")
    assert logger._experiment is None and not (tmp_path / "logs").exists()


def test_lightning_logger_checks_arguments_and_flattens_hparams(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from vdl_stream.integrations import plain_hparams
    from vdl_stream.integrations.lightning import VdlStreamLogger

    with pytest.raises(ValueError, match="run"):
        VdlStreamLogger(tmp_path, run="")
    with pytest.raises(TypeError, match="logdir must be a str or path, got int"):
        VdlStreamLogger(3)
    flat = plain_hparams({"optim": {"lr": np.float32(0.5), "betas": (0.9, 0.99)}, "seed": None})
    assert flat == {"optim/lr": 0.5, "optim/betas": "(0.9, 0.99)", "seed": "None"}
    logger = VdlStreamLogger(tmp_path, run="graph")
    logger.log_graph(object())  # no graph kind yet: records nothing, raises nothing
    logger.finalize("success")


# -- Hugging Face transformers -------------------------------------------------------------------


def _hf_trainer(tmp_path: Path, callbacks: list[Any]) -> Any:
    """A Trainer of a tiny regression model built here (no download), logging every step."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            out = self.linear(x)
            loss = torch.nn.functional.mse_loss(out.squeeze(-1), labels)
            return {"loss": loss, "logits": out}

    torch.manual_seed(0)
    x = torch.randn(32, 4)
    rows = [{"x": x[i], "labels": x[i].sum()} for i in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=2,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        learning_rate=0.05,
        logging_steps=1,
        eval_strategy="epoch",
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    return transformers.Trainer(
        model=Tiny(), args=args, train_dataset=rows, eval_dataset=rows, callbacks=callbacks
    )


def _hf_capture() -> Any:
    transformers = pytest.importorskip("transformers")

    class Capture(transformers.TrainerCallback):
        """What the Trainer logged: ``{key: [(global_step, value), ...]}``."""

        def __init__(self) -> None:
            self.logs: dict[str, list[tuple[int, float]]] = {}

        def on_log(self, args, state, control, logs=None, **kwargs):
            for key, value in (logs or {}).items():
                if isinstance(value, (int, float)):
                    self.logs.setdefault(key, []).append((state.global_step, float(value)))

    return Capture()


def test_transformers_callback_metrics_and_hparams_come_back_exactly(tmp_path):
    capture = _hf_capture()
    from vdl_stream.integrations.transformers import VdlStreamCallback, metric_tag

    callback = VdlStreamCallback(tmp_path / "logs", run="hf")
    _hf_trainer(tmp_path, [capture, callback]).train()
    assert callback.writer is None  # closed at the end of training

    series = exported(tmp_path / "logs" / "hf", tmp_path)
    want = {metric_tag(key): points for key, points in capture.logs.items()}
    assert {"train/loss", "train/learning_rate", "eval/loss", "train/train_loss"} <= set(want)
    assert scalar_tags(series) == set(want)
    assert {tag: series[tag] for tag in want} == want
    assert len(want["train/loss"]) == 8  # 4 batches x 2 epochs
    import recorder

    with recorder.RunReader(tmp_path / "logs" / "hf") as reader:
        (record,) = list(reader.read_records(kind="hparams"))
    assert record.data["hparams"]["learning_rate"] == 0.05
    assert record.data["hparams"]["num_train_epochs"] == 2


def test_transformers_tensorboard_callback_accepts_our_summary_writer(tmp_path):
    capture = _hf_capture()
    from transformers.integrations import TensorBoardCallback

    from vdl_stream import SummaryWriter
    from vdl_stream.integrations.transformers import metric_tag

    writer = SummaryWriter(tmp_path / "logs" / "tb")
    _hf_trainer(tmp_path, [capture, TensorBoardCallback(tb_writer=writer)]).train()
    series = exported(tmp_path / "logs" / "tb", tmp_path)
    want = {metric_tag(key): points for key, points in capture.logs.items()}
    assert scalar_tags(series) == set(want)
    assert {tag: series[tag] for tag in want} == want


def test_transformers_callback_checks_arguments_and_logs_on_process_zero_only(tmp_path):
    transformers = pytest.importorskip("transformers")
    from vdl_stream.integrations.transformers import VdlStreamCallback, metric_tag

    with pytest.raises(TypeError, match="logdir must be a str or path, got int"):
        VdlStreamCallback(3)
    with pytest.raises(ValueError, match="run"):
        VdlStreamCallback("logs", run="")
    assert [metric_tag(k) for k in ("loss", "eval_acc", "test_f1", "evaluation")] == [
        "train/loss",
        "eval/acc",
        "test/f1",
        "train/evaluation",
    ]
    callback = VdlStreamCallback(tmp_path / "logs", run="other-rank")
    state = transformers.TrainerState()
    state.is_world_process_zero = False
    callback.on_train_begin(None, state, None)
    callback.on_log(None, state, None, logs={"loss": 1.0})
    assert callback.writer is None
    assert not (tmp_path / "logs").exists()


# -- Keras 3 (torch backend) ---------------------------------------------------------------------


def _keras() -> Any:
    # Keras picks its backend at import: torch is what the test extra installs.
    os.environ.setdefault("KERAS_BACKEND", "torch")
    pytest.importorskip("torch")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != os.environ["KERAS_BACKEND"]:
        pytest.skip(f"keras was imported with the {keras.backend.backend()} backend")
    return keras


def test_keras_callback_batch_and_epoch_logs_come_back_exactly(tmp_path):
    keras = _keras()
    from vdl_stream.integrations.keras import VdlStreamCallback

    class Capture(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[dict[str, float]] = []
            self.epochs: list[dict[str, float]] = []

        def on_train_batch_end(self, batch, logs=None):
            self.batches.append({k: as_float(v) for k, v in logs.items()})

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append({k: as_float(v) for k, v in logs.items()})

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    capture = Capture()
    callback = VdlStreamCallback(tmp_path / "logs", run="keras")
    model.fit(
        x,
        y,
        epochs=2,
        batch_size=16,
        validation_split=0.25,
        verbose=0,
        callbacks=[capture, callback],
    )
    assert callback.writer is None  # closed at the end of training

    want: dict[str, list[tuple[int, float]]] = {}
    for i, logs in enumerate(capture.batches):
        for key, value in logs.items():
            want.setdefault(f"train/batch_{key}", []).append((i + 1, value))
    for epoch, logs in enumerate(capture.epochs):
        for key, value in logs.items():
            tag = f"validation/epoch_{key[4:]}" if key.startswith("val_") else f"train/epoch_{key}"
            want.setdefault(tag, []).append((epoch, value))
    series = exported(tmp_path / "logs" / "keras", tmp_path)
    assert {"train/batch_loss", "train/epoch_mae", "validation/epoch_loss"} <= set(want)
    assert scalar_tags(series) == set(want)
    assert {tag: series[tag] for tag in want} == want
    assert len(want["train/batch_loss"]) == 6  # 3 batches x 2 epochs


def test_keras_callback_checks_arguments():
    _keras()
    from vdl_stream.integrations.keras import VdlStreamCallback

    with pytest.raises(ValueError, match="update_freq must be 'batch', 'epoch' or a positive int"):
        VdlStreamCallback("logs", update_freq=0)
    with pytest.raises(TypeError, match="logdir must be a str or path, got int"):
        VdlStreamCallback(3)
