"""vdl-stream: a streaming training dashboard.

Training code calls :func:`attach` and logs with the VisualDL / TensorBoard method names it
already knows; a broker persists every event and pushes it to browsers within milliseconds.
"""

__version__ = "0.1.0"

from .compat import LogWriter, SummaryWriter
from .session import attach
from .writer import Writer

__all__ = ["LogWriter", "SummaryWriter", "Writer", "__version__", "attach"]
