"""vdl-stream: a streaming training dashboard.

Training code calls :func:`attach` and logs with the VisualDL / TensorBoard method names it
already knows; a broker persists every event and pushes it to browsers within milliseconds.

The public names are loaded on first use (PEP 562): ``import vdl_stream`` alone costs nothing,
so ``vdl-stream serve`` and ``vdl-stream --help`` do not pay for the writer facade (numpy, trio
and the WebSocket client) before they need it. ``from vdl_stream import attach`` works as before.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ below
    from .compat import LogWriter, SummaryWriter
    from .session import attach
    from .writer import Writer

#: public name -> the module that defines it
_LAZY = {
    "LogWriter": ".compat",
    "SummaryWriter": ".compat",
    "attach": ".session",
    "Writer": ".writer",
}

__all__ = ["LogWriter", "SummaryWriter", "Writer", "__version__", "attach"]


def __getattr__(name: str) -> Any:
    """Import a public name's module at its first use and cache the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vdl_stream' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
