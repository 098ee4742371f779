"""PaddlePaddle: :class:`VisualDL`, a drop-in for ``paddle.callbacks.VisualDL`` writing to vdl-stream.

::

    from vdl_stream.integrations.paddle import VisualDL

    model.fit(train_data, eval_data, epochs=2, callbacks=[VisualDL("vdl_logs/mnist")])

It logs what Paddle's own callback logs: every metric of ``model.prepare`` (``loss`` and the
metrics' names) as ``train/<name>`` after each training batch, at the global batch count (1, 2, ...)
as step, and as ``eval/<name>`` after each evaluation, at the epoch (0, 1, ...) as step.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

import paddle

from ..compat import LogWriter, _plan

__all__ = ["VisualDL"]


def _metric_value(value: Any) -> Any:
    """The value Paddle's callback logs: the first of a list or tuple, a number as is, else None."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    if isinstance(value, numbers.Number):
        return value
    return None


class VisualDL(paddle.callbacks.Callback):
    """A ``paddle.Model`` callback logging training and evaluation metrics to vdl-stream.

    Equivalent to ``paddle.callbacks.VisualDL(log_dir)``: the same tags and steps, and the run
    directory named the same way (``log_dir``'s last component is the run name, its parent the
    directory that ``vdl-stream serve --logdir`` shows). The run is opened at the first value and
    closed at the end of training (or of ``model.evaluate``). Only rank 0 of a distributed job
    logs (vdl-stream's own rule; Paddle's callback uses the local rank).

    Args:
        log_dir: the run's directory, as for :class:`vdl_stream.LogWriter`.
        **kwargs: :class:`vdl_stream.LogWriter` options: ``attach()`` options such as ``url``,
            ``serve`` or ``token``, and ``run`` (then ``log_dir`` is the root directory).

    Raises:
        TypeError, ValueError: a bad ``log_dir`` or option (checked here, before training).
    """

    def __init__(self, log_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.log_dir = log_dir
        self._options = kwargs
        # Check the directory and options now, so that a mistake does not surface mid-training.
        _plan(log_dir, None, dict(kwargs))
        self.writer: LogWriter | None = None
        self.epochs: int | None = None
        self.steps: int | None = None
        self.epoch = 0
        self.train_step = 0
        self.train_metrics: list[str] = []
        self.eval_metrics: list[str] = []
        self._is_fit = False

    def _open(self) -> LogWriter:
        if self.writer is None:
            self.writer = LogWriter(self.log_dir, **self._options)
        return self.writer

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _updates(self, logs: dict[str, Any], mode: str) -> None:
        metrics = self.train_metrics if mode == "train" else self.eval_metrics
        step = self.train_step if mode == "train" else self.epoch
        for name in metrics:
            if name in logs:
                value = _metric_value(logs[name])
                if value is not None:
                    self._open().add_scalar(f"{mode}/{name}", value, step)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Read the epochs and metric names of this ``fit``."""
        self.epochs = self.params.get("epochs")
        self.train_metrics = list(self.params.get("metrics") or [])
        self._is_fit = True
        self.train_step = 0

    def on_epoch_begin(self, epoch: int | None = None, logs: dict[str, Any] | None = None) -> None:
        """Remember the epoch: the step of the evaluation that follows it."""
        self.steps = self.params.get("steps")
        self.epoch = 0 if epoch is None else epoch

    def on_train_batch_end(self, step: int, logs: dict[str, Any] | None = None) -> None:
        """Log ``train/<metric>`` at the global batch count."""
        self.train_step += 1
        self._updates(logs or {}, "train")

    def on_eval_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Read the evaluation's metric names."""
        logs = logs or {}
        self.eval_metrics = list(logs.get("metrics") or [])

    def on_eval_end(self, logs: dict[str, Any] | None = None) -> None:
        """Log ``eval/<metric>`` at the epoch; close the run after a lone ``model.evaluate``."""
        self._updates(logs or {}, "eval")
        if not self._is_fit:
            self._close()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Flush and close the run."""
        self._close()
        self._is_fit = False
