"""Keras 3: :class:`VdlStreamCallback`, a callback writing ``fit``'s logs to vdl-stream.

::

    from vdl_stream.integrations.keras import VdlStreamCallback

    model.fit(x, y, epochs=3, validation_split=0.2, callbacks=[VdlStreamCallback("vdl_logs")])

Any Keras 3 backend works (torch, jax, tensorflow); Keras reads ``KERAS_BACKEND`` at its import.
Tags follow Keras' TensorBoard callback, whose ``train`` and ``validation`` runs become tag prefixes
here: ``train/batch_<metric>`` after each batch (step: the global batch count, from 1),
``train/epoch_<metric>`` and ``validation/epoch_<metric>`` after each epoch (step: the epoch,
from 0).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

import keras

from . import summary_writer

__all__ = ["VdlStreamCallback"]


class VdlStreamCallback(keras.callbacks.Callback):
    """Log Keras ``fit`` metrics per batch and per epoch to vdl-stream (rank 0 only).

    Args:
        logdir: the root directory (what ``vdl-stream serve --logdir`` shows), or the broker's
            when ``url`` is given.
        run: the run name; default: attach()'s unique time-sortable name.
        update_freq: ``"batch"`` (every batch), an int N (every N-th batch) or ``"epoch"`` (no
            batch logs), as Keras' TensorBoard callback.
        **kwargs: ``attach()`` options: ``url``, ``serve``, ``token``, ``telemetry``, ...

    The run is opened when training begins and closed when it ends; several ``fit`` calls with
    one callback continue the same run, the batch count going on.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str] = "vdl_logs",
        run: str | None = None,
        update_freq: str | int = "batch",
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"logdir must be a str or path, got {type(logdir).__name__}")
        if run is not None:
            from .. import codec

            codec.check_run_name(run)
        if update_freq == "batch":
            update_freq = 1
        if update_freq != "epoch" and (type(update_freq) is not int or update_freq < 1):
            raise ValueError(
                f"update_freq must be 'batch', 'epoch' or a positive int, got {update_freq!r:.40}"
            )
        self.logdir, self.run, self.update_freq = logdir, run, update_freq
        self._options = kwargs
        self.writer: Any = None
        self._global_batch = 0

    def _open(self) -> Any:
        if self.writer is None:
            self.writer = summary_writer(self.logdir, self.run, self._options)
            self.run = self.writer.writer.run  # a later fit continues this run
        return self.writer

    def _log(self, logs: Mapping[str, Any] | None, name: Any, step: int) -> None:
        if not isinstance(logs, Mapping):
            return  # Keras does not promise a dict
        writer = self._open()
        for key, value in logs.items():
            if isinstance(value, numbers.Number) or getattr(value, "size", None) == 1:
                writer.add_scalar(name(key), value, step)

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        """Open the run."""
        self._open()

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Log ``train/batch_<metric>`` at the global batch count (every ``update_freq``-th)."""
        self._global_batch += 1
        if self.update_freq != "epoch" and self._global_batch % self.update_freq == 0:
            self._log(logs, lambda key: f"train/batch_{key}", self._global_batch)

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Log ``train/epoch_<metric>`` and ``validation/epoch_<metric>`` at the epoch."""
        self._log(
            logs,
            lambda key: (
                f"validation/epoch_{key[4:]}" if key.startswith("val_") else f"train/epoch_{key}"
            ),
            epoch,
        )

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        """Flush and close the run."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
