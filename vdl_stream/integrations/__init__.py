"""Framework integrations: a callback or logger per training stack, each writing through vdl-stream.

Import the module of your framework; none is imported by ``import vdl_stream`` (or by this
package), so vdl-stream keeps working where a framework is missing:

- :mod:`vdl_stream.integrations.paddle`: ``VisualDL``, a ``paddle.Model.fit`` callback;
- :mod:`vdl_stream.integrations.lightning`: ``VdlStreamLogger``, a PyTorch Lightning ``Logger``;
- :mod:`vdl_stream.integrations.transformers`: ``VdlStreamCallback``, a Hugging Face
  ``TrainerCallback``;
- :mod:`vdl_stream.integrations.keras`: ``VdlStreamCallback``, a Keras 3 callback.

See docs/integrations.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

#: Joins the keys of nested hyperparameters: ``{"optim": {"lr": 0.1}}`` -> ``optim/lr``.
HPARAM_SEPARATOR = "/"


def plain_hparams(
    params: Mapping[str, Any], prefix: str = ""
) -> dict[str, str | int | float | bool]:
    """Flatten a framework's hyperparameters into what ``add_hparams`` records.

    Nested mappings become ``outer/inner`` keys; numpy scalars and one-element tensors become
    numbers; values that are not str, int, float or bool (None, lists, classes, enums) become their
    ``str()``, as TensorBoard's loggers do, so that no hyperparameter makes the call fail.
    """
    flat: dict[str, str | int | float | bool] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(plain_hparams(value, name + HPARAM_SEPARATOR))
            continue
        if hasattr(value, "item") and getattr(value, "size", 1) == 1 and not isinstance(value, str):
            # Not a one-element array after all: recorded as text below.
            with contextlib.suppress(TypeError, ValueError, RuntimeError):
                value = value.item()
        flat[name] = value if type(value) in (str, int, float, bool) else str(value)
    return flat


def summary_writer(logdir: Any, run: str | None, options: Mapping[str, Any]) -> Any:
    """Open a :class:`vdl_stream.SummaryWriter` with run ``run`` in ``logdir`` (a root directory).

    ``run`` None gives attach()'s default name (unique, time-sortable, the same on every rank).
    """
    from ..compat import SummaryWriter
    from ..session import make_run_name
    from ..telemetry import distributed_env

    if run is None:
        run = make_run_name(distributed_env()[2])
    return SummaryWriter(logdir, run=run, **options)
