"""The values the recorder hands out: positions, scalar series, records, tag summaries, errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class RecorderError(Exception):
    """Base class of every error the recorder raises on purpose."""


class FormatError(RecorderError):
    """A file in a run directory is not a segment this version can read.

    Raised for a wrong magic number (a foreign file), a newer format version, or a damaged segment
    header. The message names the file.
    """


class NotARunError(RecorderError):
    """A path given as a run directory is not one. The message names the path."""


class RunLockedError(RecorderError):
    """Another :class:`~recorder.RunWriter` (in this process or another) has the run open.

    The message names the run directory and, where known, the holder's process id.
    """


class CorruptionWarning(UserWarning):
    """Damaged bytes were skipped while reading a run (the damage is also counted in statistics)."""


class Position(NamedTuple):
    """A point in a run's byte stream: the end of the flushed data.

    Positions are comparable (segment first, then offset) and hashable. Treat them as opaque.
    """

    segment: int
    offset: int


class ScalarSeries(NamedTuple):
    """Columns of scalar points: ``steps`` int64, ``walls`` float64 (Unix seconds), ``values`` float64."""

    steps: np.ndarray
    walls: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:  # the length of the series, not of the 3-tuple
        return len(self.steps)


@dataclass(frozen=True)
class Record:
    """One recorded event.

    Attributes:
        kind: what it is (``"histogram"``, ``"text"``, ``"meta"``, ... or ``"scalars"`` for a chunk
            of scalar points).
        tag: the tag, or None for untagged kinds.
        step: the training step (for a scalar chunk: its first step), or None.
        wall: wall time in Unix seconds (for a scalar chunk: its first wall time).
        data: the event's data as a dict (msgpack round trip: tuples come back as lists), or a
            :class:`ScalarSeries` for ``kind == "scalars"``.
    """

    kind: str
    tag: str | None
    step: int | None
    wall: float
    data: Any


@dataclass(frozen=True)
class TagInfo:
    """Summary of one tag as stored.

    Counts and ranges cover every stored point, including points later superseded by a restart
    (see :meth:`RunReader.read_scalars`). ``vmin`` and ``vmax`` are over finite values only and are
    None for non-scalar kinds or when no finite value was recorded. ``step_min``/``step_max`` are None
    when no record of the tag has a step.
    """

    kind: str
    count: int
    step_min: int | None
    step_max: int | None
    vmin: float | None
    vmax: float | None
