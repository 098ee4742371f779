"""PyTorch Lightning: :class:`VdlStreamLogger`, a ``Logger`` writing to vdl-stream.

::

    from vdl_stream.integrations.lightning import VdlStreamLogger

    trainer = lightning.Trainer(logger=VdlStreamLogger("vdl_logs", run="mnist"), max_epochs=3)

Works with ``lightning`` (``lightning.pytorch``) and with the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

try:
    from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
    from lightning.pytorch.utilities import rank_zero_only
except ImportError:  # the older package name
    from pytorch_lightning.loggers.logger import Logger, rank_zero_experiment
    from pytorch_lightning.utilities import rank_zero_only

from . import plain_hparams, summary_writer

__all__ = ["VdlStreamLogger"]


class VdlStreamLogger(Logger):
    """A Lightning ``Logger``: metrics, hyperparameters and (when recordable) the model graph.

    Only global rank 0 writes (every method is rank-zero-only, as Lightning's own loggers); the
    run is opened at the first use of :attr:`experiment`.

    Args:
        logdir: the root directory (what ``vdl-stream serve --logdir`` shows), or the directory
            the broker keeps runs in when ``url`` is given.
        run: the run name; default: attach()'s unique time-sortable name.
        prefix: put before every metric name, joined with ``-`` (as Lightning's loggers).
        **kwargs: ``attach()`` options: ``url``, ``serve``, ``token``, ``telemetry``, ...

    Checkpoints: :attr:`save_dir` is None, so Lightning puts checkpoints under the trainer's
    ``default_root_dir`` (``<default_root_dir>/<run>/checkpoints``), never inside the run.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        logdir: str | os.PathLike[str] = "vdl_logs",
        run: str | None = None,
        prefix: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"logdir must be a str or path, got {type(logdir).__name__}")
        if type(prefix) is not str:
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if run is None:
            from ..session import make_run_name
            from ..telemetry import distributed_env

            run = make_run_name(distributed_env()[2])  # the same on every rank of a job
        from .. import codec

        self._run = codec.check_run_name(run)
        self._logdir = os.fspath(logdir)
        self._prefix = prefix
        self._options = kwargs
        self._experiment: Any = None

    @property
    def name(self) -> str:
        """The run name."""
        return self._run

    @property
    def version(self) -> str:
        """Empty: a vdl-stream run has no versions (a resumed run continues in place)."""
        return ""

    @property
    def root_dir(self) -> str:
        """The root directory of the runs."""
        return self._logdir

    @property
    def log_dir(self) -> str:
        """The run's directory."""
        return os.path.join(self._logdir, self._run)

    @property
    def save_dir(self) -> None:
        """None: checkpoints do not go into the run directory (see the class doc)."""
        return None

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The run's :class:`vdl_stream.SummaryWriter` (opened on first use, on rank 0 only).

        Log anything the logger has no method for with it, e.g.
        ``self.logger.experiment.add_image("samples", grid, self.global_step)``.
        """
        if self._experiment is None:
            self._experiment = summary_writer(self._logdir, self._run, self._options)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log each metric as a scalar at ``step`` (0 when None); a dict value as ``name/key`` tags."""
        writer = self.experiment
        for key, value in metrics.items():
            tag = f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key
            if isinstance(value, Mapping):
                writer.add_scalars(tag, dict(value), step)
            else:
                writer.add_scalar(tag, value, step)

    @rank_zero_only
    def log_hyperparams(
        self,
        params: Mapping[str, Any] | Namespace,
        metrics: Mapping[str, Any] | None = None,
        step: int | None = None,
    ) -> None:
        """Record the hyperparameters (nested keys flattened as ``a/b``), with ``metrics`` when given.

        ``metrics`` are also logged as scalars at ``step``, as Lightning's TensorBoard logger does.
        """
        if isinstance(params, Namespace):
            params = vars(params)
        if metrics is not None and not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        self.experiment.add_hparams(plain_hparams(params), dict(metrics or {}))
        if metrics:
            self.log_metrics(metrics, step)

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Record the model graph when the writer can (``add_graph``); until then, nothing.

        ``input_array`` defaults to ``model.example_input_array``.
        """
        add_graph = getattr(self.experiment, "add_graph", None)
        if add_graph is None:
            return  # this vdl-stream has no graph kind yet
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is not None:
            add_graph(model, input_array)

    @rank_zero_only
    def save(self) -> None:
        """Wait until everything logged so far is persisted (Lightning calls this at checkpoints)."""
        if self._experiment is not None:
            self._experiment.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Flush and close the run (the trainer calls this at the end of fit/test)."""
        if self._experiment is not None:
            self._experiment.close()
            self._experiment = None
