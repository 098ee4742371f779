"""The parts of a run's group chunks, as columns, so that reading a tag's share is vectorised.

A group chunk holds a few points of each of several tags (what a writer flushing often produces).
Handling its parts one Python object at a time would cost microseconds per part; here they are rows
of NumPy columns, and the points of loaded groups sit in one table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from recorder import codec
from recorder.catalog import Entry
from recorder.records import ScalarSeries

_INT_COLUMNS = ("count", "first", "smin", "smax")


class PartTable:
    """Every part of every group chunk seen, in write order."""

    def __init__(self) -> None:
        self.tag_ids: dict[str, int] = {}
        self.names: list[str] = []
        self.groups: list[Entry] = []
        self._number: dict[int, int] = {}  # id(group entry) -> its number
        self._pending: list[tuple[int, int, list]] = []  # (group number, seq, part columns)
        self.cols: dict[str, np.ndarray] = {
            "tag": np.empty(0, np.int64),
            "seq": np.empty(0, np.int64),
            "group": np.empty(0, np.int64),
            "local": np.empty(0, np.int64),  # offset of the part's points in its group
            "start": np.empty(0, np.int64),  # offset in the points table, -1 until loaded
            "count": np.empty(0, np.int64),
            "first": np.empty(0, np.int64),
            "wall": np.empty(0, np.float64),
            "smin": np.empty(0, np.int64),
            "smax": np.empty(0, np.int64),
            "vmin": np.empty(0, np.float64),
            "vmax": np.empty(0, np.float64),
        }
        self._group_parts: list[int] = []  # first part row of each group
        self._order: np.ndarray | None = None
        self._bounds: np.ndarray | None = None
        self.steps = np.empty(0, np.int64)
        self.walls = np.empty(0, np.float64)
        self.values = np.empty(0, np.float64)
        self.n = 0

    def __len__(self) -> int:
        self._consolidate()
        return len(self.cols["tag"])

    def add(self, entry: Entry, seq: int) -> None:
        """Register the group chunk ``entry``, the ``seq``-th record of the run."""
        self._number[id(entry)] = len(self.groups)
        self._pending.append((len(self.groups), seq, entry.parts))
        self.groups.append(entry)

    def drop(self, entry: Entry) -> None:
        """Forget the parts of a group chunk found damaged."""
        self._consolidate()
        g = self._number[id(entry)]
        lo = self._group_parts[g]
        self.cols["tag"][lo : lo + len(entry.parts[0])] = -1
        self._order = None

    def _tag_id(self, name: str) -> int:
        tid = self.tag_ids.get(name)
        if tid is None:
            tid = self.tag_ids[name] = len(self.names)
            self.names.append(name)
        return tid

    def _consolidate(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        sizes = [len(parts[0]) for _, _, parts in pending]
        first_row = len(self.cols["tag"])
        for size in sizes:
            self._group_parts.append(first_row)
            first_row += size
        new: dict[str, Any] = {
            "tag": np.array([self._tag_id(t) for _, _, parts in pending for t in parts[0]]),
            "seq": np.repeat([seq for _, seq, _ in pending], sizes),
            "group": np.repeat([g for g, _, _ in pending], sizes),
        }
        for i, name in enumerate(("count", "first", "wall", "smin", "smax", "vmin", "vmax"), 1):
            dtype = np.int64 if name in _INT_COLUMNS else np.float64
            new[name] = np.concatenate(
                [np.asarray(parts[i], dtype=dtype) for _, _, parts in pending]
            )
        ends = np.cumsum(new["count"])
        group_ends = np.cumsum(sizes) - 1
        group_base = np.repeat(np.concatenate([[0], ends[group_ends][:-1]]), sizes)
        new["local"] = ends - new["count"] - group_base
        new["start"] = np.full(len(new["tag"]), -1, np.int64)
        for name, col in new.items():
            self.cols[name] = np.concatenate([self.cols[name], col.astype(self.cols[name].dtype)])
        self._order = None

    def tag_names(self) -> list[str]:
        """Names of the tags with at least one live part."""
        self._consolidate()
        live = np.unique(self.cols["tag"][self.cols["tag"] >= 0])
        return [self.names[i] for i in live]

    def rows_of(self, tag: str) -> np.ndarray:
        """Row numbers of the live parts of ``tag``, in write order."""
        self._consolidate()
        tid = self.tag_ids.get(tag)
        if tid is None:
            return np.empty(0, np.int64)
        if self._order is None:
            tags = self.cols["tag"]
            self._order = np.argsort(tags, kind="stable")
            self._bounds = np.searchsorted(tags[self._order], np.arange(len(self.names) + 1))
        return self._order[self._bounds[tid] : self._bounds[tid + 1]]

    def load(self, rows: np.ndarray, loader: Callable[[Entry], Any]) -> bool:
        """Make sure the points of ``rows`` are in the table; False if a group turned out damaged
        (its parts are then dropped: ask :meth:`rows_of` again)."""
        missing = np.unique(self.cols["group"][rows[self.cols["start"][rows] < 0]])
        ok = True
        for g in missing.tolist():
            entry = self.groups[g]
            lo = self._group_parts[g]
            hi = lo + len(entry.parts[0])
            data = loader(entry)
            series = None
            if data is not None:
                try:
                    series = codec.decode_scalars(data)
                except codec.PayloadError:
                    series = None
            if series is None:
                entry.length = -1  # dead for every query
                self.cols["tag"][lo:hi] = -1
                self._order = None
                ok = False
                continue
            base = self._append_points(series)
            self.cols["start"][lo:hi] = base + self.cols["local"][lo:hi]
            entry.data = None  # the table holds it now
        return ok

    def _append_points(self, series: ScalarSeries) -> int:
        base, k = self.n, len(series.steps)
        if base + k > len(self.steps):
            cap = max(base + k, 2 * len(self.steps))
            for name in ("steps", "walls", "values"):
                old = getattr(self, name)
                new = np.empty(cap, old.dtype)
                new[:base] = old[:base]
                setattr(self, name, new)
        self.steps[base : base + k] = series.steps
        self.walls[base : base + k] = series.walls
        self.values[base : base + k] = series.values
        self.n = base + k
        return base

    def unload(self) -> None:
        """Forget the loaded points (they are read again from disk when asked for)."""
        self._consolidate()
        self.cols["start"][:] = -1
        self.steps = np.empty(0, np.int64)
        self.walls = np.empty(0, np.float64)
        self.values = np.empty(0, np.float64)
        self.n = 0

    def nbytes(self) -> int:
        """Bytes held by the loaded points and the part columns."""
        return (
            self.steps.nbytes
            + self.walls.nbytes
            + self.values.nbytes
            + sum(c.nbytes for c in self.cols.values())
        )

    def gather(self, rows: np.ndarray) -> ScalarSeries:
        """The points of ``rows`` (loaded), concatenated in the order given."""
        counts = self.cols["count"][rows]
        starts = self.cols["start"][rows]
        out_starts = np.cumsum(counts) - counts
        idx = np.arange(int(counts.sum())) + np.repeat(starts - out_starts, counts)
        return ScalarSeries(self.steps[idx], self.walls[idx], self.values[idx])

    def slice_of(self, row: int) -> ScalarSeries:
        """The points of one loaded part."""
        start = int(self.cols["start"][row])
        end = start + int(self.cols["count"][row])
        return ScalarSeries(self.steps[start:end], self.walls[start:end], self.values[start:end])
