"""Hugging Face transformers: :class:`VdlStreamCallback`, a ``TrainerCallback`` writing to vdl-stream.

::

    from vdl_stream.integrations.transformers import VdlStreamCallback

    trainer = Trainer(model, args, ..., callbacks=[VdlStreamCallback("vdl_logs", run="bert")])

Set ``report_to="none"`` in ``TrainingArguments`` unless TensorBoard files are wanted as well.
``TensorBoardCallback(tb_writer=vdl_stream.SummaryWriter(...))`` works too: it logs the same
scalars (and the arguments as text) through vdl-stream's ``SummaryWriter``.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from . import plain_hparams, summary_writer

__all__ = ["VdlStreamCallback", "metric_tag"]


def metric_tag(key: str) -> str:
    """The tag of a ``Trainer`` log key, as transformers' TensorBoard callback names it:
    ``eval_loss`` -> ``eval/loss``, ``test_acc`` -> ``test/acc``, anything else ``train/<key>``."""
    for prefix in ("eval", "test"):
        if key.startswith(prefix + "_"):
            return f"{prefix}/{key[len(prefix) + 1 :]}"
    return f"train/{key}"


class VdlStreamCallback(TrainerCallback):
    """Log a ``Trainer``'s metrics and hyperparameters to vdl-stream, on the world-process-zero only.

    At ``on_train_begin`` the ``TrainingArguments`` (and the model's config, when it has one) are
    recorded as the run's hyperparameters; at every ``on_log`` each number is a scalar at
    ``state.global_step`` (tags as :func:`metric_tag`), and the run is flushed, as the
    TensorBoard callback does; ``on_train_end`` closes the run.

    Args:
        logdir: the root directory (what ``vdl-stream serve --logdir`` shows), or the broker's
            when ``url`` is given.
        run: the run name; default: attach()'s unique time-sortable name. During a hyperparameter
            search each trial is the sub-run ``<run>/<trial name>``.
        **kwargs: ``attach()`` options: ``url``, ``serve``, ``token``, ``telemetry``, ...
    """

    def __init__(
        self, logdir: str | os.PathLike[str] = "vdl_logs", run: str | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"logdir must be a str or path, got {type(logdir).__name__}")
        if run is not None:
            from .. import codec

            codec.check_run_name(run)
        self.logdir, self.run = logdir, run
        self._options = kwargs
        self.writer: Any = None

    def _open(self, state: Any) -> Any:
        if self.writer is None:
            run = self.run
            trial = getattr(state, "trial_name", None) if state.is_hyper_param_search else None
            if trial:
                from ..session import make_run_name
                from ..telemetry import distributed_env

                run = f"{run or make_run_name(distributed_env()[2])}/{trial}"
            self.writer = summary_writer(self.logdir, run, self._options)
        return self.writer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the run and record the training arguments and model config as hyperparameters."""
        if not state.is_world_process_zero:
            return
        hparams = dict(args.to_sanitized_dict())
        config = getattr(kwargs.get("model"), "config", None)
        if config is not None and hasattr(config, "to_diff_dict"):
            hparams["model_config"] = config.to_diff_dict()
        self._open(state).add_hparams(plain_hparams(hparams), {})

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Log every number of ``logs`` at ``state.global_step``; texts as text."""
        if not state.is_world_process_zero or not logs:
            return
        writer = self._open(state)
        for key, value in logs.items():
            if isinstance(value, numbers.Real):
                writer.add_scalar(metric_tag(key), value, state.global_step)
            elif isinstance(value, str):
                writer.add_text(metric_tag(key), value, state.global_step)
        writer.flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the run."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
