"""``vdl-stream replay``: recorded runs served again as live data, read where they lie.

The data path::

    RunReader.iter_records()  ->  RunTimeline (columns in memory, a cursor)  ->  Replayer (the clock)
        ->  ReplaySource (fan-out and snapshots, in the broker's place)  ->  /ws/live  ->  browser

The recorded runs are read once, at start, and never written (:class:`recorder.RunReader` never
writes); nothing is copied to disk and no broker runs. :class:`ReplaySource` stands in for the
broker in :mod:`vdl_stream.server`: a browser subscribes to it as to a broker, gets snapshots of the
runs *as they stood at the replay position* (downsampled as live snapshots are), then ``data``
frames as the replay plays. A seek or a restart only moves the cursor, and is announced on the same
socket: a ``reset`` frame, then fresh snapshots. The replay status (position, step, speed,
playing, span) is pushed there too, as a ``replay`` frame, whenever it changes (docs/protocol.md).

Control: :class:`Replayer` has ``play()``, ``pause()``, ``set_speed()``, ``seek()`` and
``status()``; :func:`replay_blueprint` exposes them as ``GET/POST /api/replay`` (docs/interop.md).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import trio

import recorder
from recorder.downsample import downsample
from recorder.reader import NOT_SUPERSEDED, superseded_from

from . import codec
from .broker import (
    SNAPSHOT_EVENTS,
    UNTAGGED_SNAPSHOT,
    Subscriber,
    SubscriberLimitError,
    SubscriberStatistics,
)
from .codec import ScalarColumns
from .errors import RefusedError
from .run_summary import RunSummary, summaries_frame

#: Real seconds between two feeds while playing (the pacing granularity).
TICK = 0.05
#: Scalar points per batch, at most (per run).
BATCH_POINTS = 1 << 16
#: Non-scalar events per batch, at most (per run).
BATCH_EVENTS = 1024
#: While playing, the status is pushed at least this often (real seconds), so that a page's
#: position and counts stay right at speed "max", where it cannot extrapolate.
STATUS_INTERVAL = 1.0
#: Snapshot frame lists kept for subscribers asking at the same cut (after a seek, every page
#: asks for the same one).
SNAPSHOT_CACHE = 4
#: A snapshot of runs holding at most this many points (taken) is built on the event loop: it
#: takes well under a millisecond, less than the hop to a worker thread.
INLINE_POINTS = 1 << 14

#: Chunk positions (one per chunk of a timeline, in ``RunTimeline.chunks`` order) and the number
#: of events taken: where a timeline's cursor stood. Immutable, so another thread can read it.
Cursor = tuple[tuple[int, ...], int]


# -- the timeline (no I/O, no trio) ------------------------------------------------------------


class _Chunk:
    """One recorded stretch of a tag's points and how far it has been taken."""

    __slots__ = ("index", "pos", "release", "steps", "tag", "values", "walls")

    def __init__(self, tag: str, series: recorder.ScalarSeries) -> None:
        self.tag = tag
        self.steps = series.steps
        self.walls = series.walls
        self.values = series.values
        # When each point is released: its wall time, made non-decreasing so that points keep
        # their recorded order (a step going back inside a chunk must not look like a restart).
        self.release = np.maximum.accumulate(series.walls) if len(series.walls) else series.walls
        self.pos = 0
        self.index = 0  # position in RunTimeline.chunks


def _thin(indices: np.ndarray, limit: int) -> np.ndarray:
    """At most ``limit`` of ``indices``, evenly spread, always keeping the last (as the broker)."""
    if len(indices) <= limit:
        return indices
    return indices[np.linspace(0, len(indices) - 1, limit).round().astype(np.int64)]


class RunTimeline:
    """The records of one run, ordered for replay, with a cursor.

    Everything is in memory and never changes after construction except the cursor (``pos`` of
    each chunk, ``epos``), so the ``*_at`` methods, given a :class:`Cursor` taken with
    :meth:`cursor`, may run in another thread while the cursor moves on.

    Args:
        name: the run name the replay publishes under.
        records: the run's records in write order (from :meth:`recorder.RunReader.iter_records`);
            kinds that are not dashboard events (e.g. the broker's bookkeeping) are dropped.
        path: the recorded run directory (what ``/api/export`` reads), if any.
    """

    def __init__(self, name: str, records: list[recorder.Record], path: str | None = None) -> None:
        self.name = name
        self.path = path
        # Consecutive chunks of a tag are joined (a live run has one per flush) unless the next
        # one starts at or below a step already seen: that may be a restart, and stays a chunk of
        # its own so that snapshots apply it as the recorder does.
        groups: list[tuple[str, list[recorder.ScalarSeries]]] = []
        open_groups: dict[str, tuple[list[recorder.ScalarSeries], list[int]]] = {}
        events: list[dict[str, Any]] = []
        for r in records:
            if r.kind == "scalars":
                if not len(r.data):
                    continue
                first, top = int(r.data.steps[0]), int(r.data.steps.max())
                group = open_groups.get(r.tag)
                if group is None or first <= group[1][0]:
                    group = open_groups[r.tag] = ([], [top])
                    groups.append((r.tag, group[0]))
                group[0].append(r.data)
                group[1][0] = max(group[1][0], top)
            elif r.kind in codec.EVENT_KINDS:
                events.append(
                    {**r.data, "kind": r.kind, "tag": r.tag, "step": r.step, "wall": r.wall}
                )
        chunks = [
            _Chunk(
                tag,
                parts[0]
                if len(parts) == 1
                else recorder.ScalarSeries(
                    *(np.concatenate(cols) for cols in zip(*parts, strict=True))
                ),
            )
            for tag, parts in groups
        ]
        #: tag -> its chunks in write order (what a snapshot joins, restarts applied)
        self.by_tag: dict[str, list[_Chunk]] = {}
        for c in chunks:
            self.by_tag.setdefault(c.tag, []).append(c)
        self.chunks = sorted(chunks, key=lambda c: float(c.release[0]))  # stable among equals
        for i, c in enumerate(self.chunks):
            c.index = i
        events.sort(key=lambda e: e["wall"])
        self.events = events
        self.event_walls = np.array([e["wall"] for e in events], dtype=np.float64)
        by_kind_tag: dict[tuple[str, str | None], list[int]] = {}
        for i, e in enumerate(events):
            by_kind_tag.setdefault((e["kind"], e["tag"]), []).append(i)
        #: (kind, tag) -> indices into ``events``, ascending
        self.event_groups = {k: np.array(v, dtype=np.int64) for k, v in by_kind_tag.items()}
        self.epos = 0
        self.points = sum(len(c.steps) for c in self.chunks)

    # -- the cursor ------------------------------------------------------------------------------

    def rewind(self) -> None:
        """Move the cursor back to the start."""
        self.move_to(-math.inf)

    def move_to(self, wall: float) -> None:
        """Move the cursor to just before ``wall``: every record released earlier counts as taken."""
        for c in self.chunks:
            c.pos = int(np.searchsorted(c.release, wall, side="left"))
        self.epos = int(np.searchsorted(self.event_walls, wall, side="left"))

    def cursor(self) -> Cursor:
        """Where the cursor stands now (immutable)."""
        return tuple(c.pos for c in self.chunks), self.epos

    def taken(self) -> int:
        """Scalar points and events taken so far."""
        return sum(c.pos for c in self.chunks) + self.epos

    def newest(self) -> tuple[float, int] | None:
        """Release time and step of the newest point (or stepped event) taken, or None."""
        best: tuple[float, int] | None = None
        for c in self.chunks:
            if c.pos and (best is None or c.release[c.pos - 1] >= best[0]):
                best = (float(c.release[c.pos - 1]), int(c.steps[c.pos - 1]))
        for i in range(self.epos - 1, -1, -1):
            e = self.events[i]
            if e["step"] is not None:
                if best is None or e["wall"] > best[0]:
                    best = (float(e["wall"]), int(e["step"]))
                break
        return best

    def span(self) -> tuple[float, float] | None:
        """The first and last wall time recorded, or None for an empty run."""
        walls = [float(c.release[0]) for c in self.chunks] + [
            float(c.release[-1]) for c in self.chunks
        ]
        if len(self.event_walls):
            walls += [float(self.event_walls[0]), float(self.event_walls[-1])]
        return (min(walls), max(walls)) if walls else None

    def next_wall(self) -> float | None:
        """The wall time of the next record not yet taken, or None when all were taken."""
        best = None
        for c in self.chunks:
            if c.pos < len(c.release):
                w = float(c.release[c.pos])
                best = w if best is None else min(best, w)
        if self.epos < len(self.event_walls):
            w = float(self.event_walls[self.epos])
            best = w if best is None else min(best, w)
        return best

    def wall_of_step(self, step: int) -> float | None:
        """The earliest wall time of a record at or after ``step``, or None when there is none."""
        best = None
        for c in self.chunks:
            at = np.nonzero(c.steps >= step)[0]
            if len(at):
                w = float(c.release[at[0]])
                best = w if best is None else min(best, w)
        for e in self.events:
            if e["step"] is not None and e["step"] >= step:
                best = e["wall"] if best is None else min(best, e["wall"])
                break
        return best

    def take(
        self, until: float, max_points: int = BATCH_POINTS, max_events: int = BATCH_EVENTS
    ) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
        """Take what was recorded at or before wall time ``until`` (at most the given amounts)."""
        scalars = []
        budget = max_points
        for c in self.chunks:
            if budget <= 0:
                break
            if c.pos >= len(c.release) or c.release[c.pos] > until:
                continue
            hi = int(np.searchsorted(c.release, until, side="right"))
            hi = min(hi, c.pos + budget)
            scalars.append(
                ScalarColumns(c.tag, c.steps[c.pos : hi], c.walls[c.pos : hi], c.values[c.pos : hi])
            )
            budget -= hi - c.pos
            c.pos = hi
        hi = int(np.searchsorted(self.event_walls, until, side="right"))
        hi = min(hi, self.epos + max_events)
        events = self.events[self.epos : hi]
        self.epos = max(self.epos, hi)
        return scalars, events

    def done(self) -> bool:
        """Whether every record was taken."""
        return self.next_wall() is None

    # -- the run as it stood at a cursor (thread-safe) --------------------------------------------

    def series_at(self, cursor: Cursor, tag: str) -> recorder.ScalarSeries | None:
        """The points of ``tag`` taken by ``cursor``, restarts applied as the recorder applies
        them (:meth:`recorder.RunReader.read_scalars`); None for a tag the run has no points of."""
        chunks = self.by_tag.get(tag)
        if chunks is None:
            return None
        positions = cursor[0]
        taken = [(c, positions[c.index]) for c in chunks if positions[c.index]]
        # Where later restarts cut each chunk taken, from its first and largest steps: one pass
        # over the chunks however many restarts (four writers' own step counters make most).
        limits = (
            superseded_from(
                np.fromiter((c.steps[0] for c, _ in taken), np.int64, len(taken)),
                np.fromiter((c.steps[:n].max() for c, n in taken), np.int64, len(taken)),
            )
            if len(taken) > 1
            else None  # one chunk (a finished run's tag, compacted): no restart
        )
        pieces = [(c.steps[:n], c.walls[:n], c.values[:n]) for c, n in taken]
        if limits is not None and limits[0] != NOT_SUPERSEDED:  # (the smallest: some restart)
            cut = []
            for piece, limit in zip(pieces, limits[1:].tolist(), strict=True):
                if limit != NOT_SUPERSEDED:
                    keep = piece[0] < limit
                    if not keep.any():
                        continue
                    piece = (piece[0][keep], piece[1][keep], piece[2][keep])
                cut.append(piece)
            pieces = cut
        if not pieces:
            empty = np.zeros(0)
            return recorder.ScalarSeries(empty.astype(np.int64), empty, empty)
        if len(pieces) == 1:
            return recorder.ScalarSeries(*pieces[0])
        return recorder.ScalarSeries(*(np.concatenate(cols) for cols in zip(*pieces, strict=True)))

    def scalars_at(
        self,
        cursor: Cursor,
        tag: str,
        start: int | None = None,
        end: int | None = None,
        max_points: int | None = None,
    ) -> recorder.ScalarSeries | None:
        """:meth:`series_at`, with ``start <= step <= end`` and downsampling as the recorder does."""
        series = self.series_at(cursor, tag)
        if series is None:
            return None
        if start is not None or end is not None:
            keep = np.ones(len(series.steps), dtype=bool)
            if start is not None:
                keep &= series.steps >= start
            if end is not None:
                keep &= series.steps <= end
            series = recorder.ScalarSeries(*(col[keep] for col in series))
        if max_points is not None:
            series = downsample(series, max_points)
        return series

    def events_at(self, cursor: Cursor, kind: str, tag: str | None = None) -> list[dict[str, Any]]:
        """The events of ``kind`` (and ``tag``; None: any) taken by ``cursor``, in wall order."""
        epos = cursor[1]
        picked = [
            idx[: int(np.searchsorted(idx, epos))]
            for (k, t), idx in self.event_groups.items()
            if k == kind and (tag is None or t == tag)
        ]
        if not picked:
            return []
        return [self.events[i] for i in np.sort(np.concatenate(picked))]

    def snapshot_at(
        self, cursor: Cursor, max_points: int
    ) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
        """What a live snapshot of the run holds at ``cursor``: every scalar tag downsampled to
        ``max_points``, and the newest events thinned per (kind, tag) with the broker's limits."""
        scalars = []
        for tag in self.by_tag:
            s = self.scalars_at(cursor, tag, max_points=max_points)
            if s is not None and len(s.steps):
                scalars.append(ScalarColumns(tag, s.steps, s.walls, s.values))
        epos = cursor[1]
        picked = []
        for (kind, tag), idx in self.event_groups.items():
            limit = SNAPSHOT_EVENTS if tag is not None else UNTAGGED_SNAPSHOT.get(kind)
            n = int(np.searchsorted(idx, epos))
            if limit is not None and n:
                picked.append(_thin(idx[:n], limit))
        # ``events`` are in wall order, so index order is wall order, as in a live snapshot.
        order = np.sort(np.concatenate(picked)) if picked else []
        return scalars, [self.events[i] for i in order]

    def tags_at(self, cursor: Cursor) -> dict[str, recorder.TagInfo]:
        """The tags taken by ``cursor``, as :meth:`recorder.RunReader.tags` describes them."""
        out: dict[str, recorder.TagInfo] = {}
        positions = cursor[0]
        for tag, chunks in self.by_tag.items():
            parts = [
                (c.steps[: positions[c.index]], c.values[: positions[c.index]]) for c in chunks
            ]
            parts = [p for p in parts if len(p[0])]
            if not parts:
                continue
            finite = [v[np.isfinite(v)] for _, v in parts]
            finite = [v for v in finite if len(v)]
            out[tag] = recorder.TagInfo(
                kind="scalars",
                count=sum(len(s) for s, _ in parts),
                step_min=min(int(s.min()) for s, _ in parts),
                step_max=max(int(s.max()) for s, _ in parts),
                vmin=min(float(v.min()) for v in finite) if finite else None,
                vmax=max(float(v.max()) for v in finite) if finite else None,
            )
        for (kind, tag), idx in self.event_groups.items():
            if tag is None:
                continue
            taken = [self.events[i] for i in idx[: int(np.searchsorted(idx, cursor[1]))]]
            if not taken:
                continue
            steps = [e["step"] for e in taken if e["step"] is not None]
            out[tag] = recorder.TagInfo(
                kind=kind,
                count=len(taken),
                step_min=min(steps) if steps else None,
                step_max=max(steps) if steps else None,
                vmin=None,
                vmax=None,
            )
        return out


def find_runs(path: str) -> dict[str, str]:
    """Map run names to run directories for ``path``: a run directory, or a log directory of runs.

    Raises:
        recorder.NotARunError: ``path`` is neither (or holds no runs).
    """
    try:
        with recorder.RunReader(path):
            pass
        return {os.path.basename(os.path.abspath(path)) or "run": path}
    except recorder.NotARunError:
        pass
    try:
        names = recorder.list_runs(path)
    except NotADirectoryError:
        names = []
    if not names:
        raise recorder.NotARunError(f"{path}: neither a run directory nor a log directory of runs")
    return {name: os.path.join(path, *name.split("/")) for name in names}


def load_timelines(path: str) -> list[RunTimeline]:
    """Read every run under ``path`` into memory (blocking; never writes to ``path``)."""
    out = []
    for name, run_dir in find_runs(path).items():
        with recorder.RunReader(run_dir) as reader:
            out.append(RunTimeline(name, list(reader.iter_records()), run_dir))
    return out


# -- the status --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayStatus:
    """Where a replay stands.

    Attributes:
        playing: False while paused (or before start).
        finished: every record has been fed.
        speed: recorded seconds per real second (``math.inf`` for "max").
        position: the recorded wall time reached (Unix seconds).
        step: the step of the newest point fed (of any run), or None before the first.
        start, end: the recorded time range (the span).
        fed: scalar points and events the replay stands past (what a page holds, before
            downsampling).
        total: scalar points and events in the replay.
        runs: the replayed run names.
        version: increases with every change of the status; of two statuses, the one with the
            higher version is the newer (a pushed frame and a command's answer can cross).
    """

    playing: bool
    finished: bool
    speed: float
    position: float
    step: int | None
    start: float
    end: float
    fed: int
    total: int
    runs: tuple[str, ...]
    version: int

    def to_json(self) -> dict[str, Any]:
        """A JSON- and msgpack-safe dict (speed ``"max"`` instead of infinity)."""
        d = dict(self.__dict__)
        d["speed"] = "max" if math.isinf(self.speed) else self.speed
        d["runs"] = list(self.runs)
        return d


def parse_speed(raw: object) -> float:
    """Turn ``"max"`` or a positive number (str or number) into a speed; raise ValueError."""
    if isinstance(raw, str) and raw.strip().lower() == "max":
        return math.inf
    try:
        speed = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"speed must be a positive number or 'max', got {raw!r:.40}") from None
    if not (speed > 0) or math.isnan(speed):
        raise ValueError(f"speed must be a positive number or 'max', got {raw!r:.40}")
    return speed


# -- the source the web server serves (trio) ----------------------------------------------------


@dataclass(frozen=True)
class ReplayStatistics:
    """Counters of a :class:`ReplaySource` (what ``/api/stats`` shows under replay)."""

    batches: int
    events: int
    seq: int
    resets: int
    runs: int
    subscribers: int


class ReplaySubscriber:
    """One browser's subscription to a replay: the broker's :class:`~vdl_stream.broker.Subscriber`
    (its bounded queue and gap policy) plus what a replay adds: after a seek, :meth:`receive`
    returns a ``reset`` frame and fresh snapshots before anything else, and whenever the status
    changed, its newest ``replay`` frame (statuses coalesce: only the newest is sent)."""

    def __init__(
        self,
        source: ReplaySource,
        runs: set[str] | None,
        capacity: int,
        tags: re.Pattern[str] | None,
        capacity_bytes: int = 8 << 20,
    ) -> None:
        self._source = source
        self._queue = Subscriber(runs, capacity, tags, capacity_bytes)
        self._queue.after_seq = source.seq
        self.runs = runs
        self.tags = tags
        self.max_points = 2000
        self.generation = source.generation
        self.status_version = -1
        self._pending: deque[bytes] = deque()
        self._waiting: trio.CancelScope | None = None

    @property
    def after_seq(self) -> int:
        """The source's seq when this subscription began (its ``synced`` frame names it)."""
        return self._queue.after_seq

    def wants(self, run: str) -> bool:
        """Return whether this subscription covers ``run``."""
        return self._queue.wants(run)

    def select(
        self, scalars: list[ScalarColumns], events: list[dict[str, Any]]
    ) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
        """Keep what the tag pattern matches (as the broker's subscribers do)."""
        return self._queue.select(scalars, events)

    def offer(self, seq: int, run: str | None, frame: bytes) -> None:
        """Queue a frame if there is room (the broker's gap policy applies); never blocks."""
        self._queue.offer(seq, run, frame)

    def synced(self, seq: int, generation: int, runs: list[str]) -> None:
        """A snapshot at ``seq`` of ``runs`` was taken: queued frames it covers are skipped."""
        self.generation = generation
        self._queue.after_seq = seq
        for name in runs:
            self._queue.covered[name] = seq

    async def receive(self) -> bytes:
        """Return the next frame to send: after a seek, ``reset`` and snapshots; a newer status;
        else queued data (or ``gap``). Raises ``trio.EndOfChannel`` once closed and drained."""
        while True:
            if self._pending:
                return self._pending.popleft()
            if not self._source.closed:
                if self.generation != self._source.generation:
                    self._pending.extend(await self._source.resync_frames(self))
                    continue
                if self.status_version != self._source.status_version:
                    self.status_version = self._source.status_version
                    return self._source.status_frame()
            with trio.CancelScope() as scope:  # wake() cancels it: a seek or a new status
                self._waiting = scope
                try:
                    return await self._queue.receive()
                finally:
                    self._waiting = None

    def wake(self) -> None:
        """Interrupt a pending :meth:`receive` so that it looks at the source again."""
        if self._waiting is not None:
            self._waiting.cancel()

    def close(self) -> None:
        """Stop accepting frames; a pending ``receive`` ends with ``trio.EndOfChannel``."""
        self._queue.close()
        self.wake()

    def statistics(self) -> SubscriberStatistics:
        """Queue depth, peak, capacity and sent/dropped/gap counts (as the broker's)."""
        return self._queue.statistics()


class ReplaySource:
    """What ``vdl-stream replay`` serves in place of a broker: a fan-out over recorded runs.

    It implements the part of :class:`vdl_stream.broker.Broker` that :mod:`vdl_stream.server` uses
    (``subscribe``, ``snapshot``, ``send_snapshot``, ``unsubscribe``, ``runs``, ``tags``, ``read_scalars``,
    ``read_events``, ``run_path``, ``statistics``, ``subscriber_statistics``), answering every
    read *as the runs stood at the replay position*. ``ingest`` refuses: a replay takes no writers.
    Its :class:`Replayer` feeds it with :meth:`publish`, and announces a moved cursor with
    :meth:`reset` and a changed status with :meth:`status_changed`.

    Args:
        timelines: the replayed runs (their cursors are the replay position).
        status: returns the replay's current status (for ``replay`` frames).
        subscriber_queue: capacity of each subscriber's queue, in frames.
        subscriber_bytes: capacity of each subscriber's queue, in bytes of encoded frames (a page
            that falls behind gets a ``gap`` and re-syncs from a snapshot, as from a broker).
        max_subscribers: :meth:`subscribe` raises :class:`~vdl_stream.broker.SubscriberLimitError`
            past this many.
    """

    def __init__(
        self,
        timelines: list[RunTimeline],
        status: Callable[[], ReplayStatus],
        *,
        subscriber_queue: int = 256,
        subscriber_bytes: int = 8 << 20,
        max_subscribers: int = 256,
    ) -> None:
        self._timelines = {t.name: t for t in timelines}
        self._status = status
        self._subscriber_queue = subscriber_queue
        self._subscriber_bytes = subscriber_bytes
        self._max_subscribers = max_subscribers
        self._subscribers: set[ReplaySubscriber] = set()
        self.seq = 0
        #: bumped by every :meth:`reset` (a seek or restart)
        self.generation = 0
        #: bumped by every :meth:`status_changed`
        self.status_version = 0
        self.closed = False
        self._batches = self._events = 0
        self._limiter = trio.CapacityLimiter(1)
        self._cache: OrderedDict[tuple[Any, ...], list[bytes]] = OrderedDict()

    # -- fed by the Replayer --------------------------------------------------------------------

    def publish(self, run: str, scalars: list[ScalarColumns], events: list[dict[str, Any]]) -> int:
        """Give newly replayed data of ``run`` the next seq and offer it to its subscribers
        (one encoding per distinct tag pattern; never blocks). Returns the seq."""
        self.seq += 1
        self._batches += 1
        self._events += sum(len(c) for c in scalars) + len(events)
        frames: dict[str | None, bytes | None] = {}
        for sub in self._subscribers:
            if sub.wants(run):
                key = None if sub.tags is None else sub.tags.pattern
                if key not in frames:
                    picked = sub.select(scalars, events)
                    frames[key] = (
                        codec.encode_live("data", self.seq, run, *picked) if any(picked) else None
                    )
                if frames[key] is not None:
                    sub.offer(self.seq, run, frames[key])  # type: ignore[arg-type]
        return self.seq

    def reset(self) -> None:
        """The cursor moved (a seek or a restart): every subscriber re-syncs with a ``reset``
        frame and snapshots at the new position before any further data."""
        self.generation += 1
        for sub in self._subscribers:
            sub.wake()

    def status_changed(self) -> None:
        """The status changed: every subscriber sends the newest ``replay`` frame next."""
        self.status_version += 1
        for sub in self._subscribers:
            sub.wake()

    def status_frame(self) -> bytes:
        """The ``replay`` frame of the current status."""
        return codec.encode_message({"type": "replay", **self._status().to_json()})

    # -- snapshots --------------------------------------------------------------------------------

    async def snapshot(self, sub: ReplaySubscriber, max_points: int = 2000) -> list[bytes]:
        """The frames a fresh subscriber starts with: the status, then a snapshot of every run it
        wants as it stood at the replay position (downsampled to ``max_points`` per tag)."""
        sub.max_points = max_points
        sub.status_version = self.status_version
        status = self.status_frame()
        _, frames = await self._frames_at_cursor(sub)
        return [status, *frames]

    async def send_snapshot(
        self, sub: ReplaySubscriber, send: Callable[[bytes], Awaitable[Any]], max_points: int = 2000
    ) -> None:
        """:meth:`snapshot`, handed to ``send`` frame by frame (as the broker's ``send_snapshot``:
        what the web server calls)."""
        for frame in await self.snapshot(sub, max_points):
            await send(frame)

    async def resync_frames(self, sub: ReplaySubscriber) -> list[bytes]:
        """After a seek: a ``reset`` frame naming the runs whose snapshots follow, then those."""
        seq, frames = await self._frames_at_cursor(sub)
        names = [name for name in self._timelines if sub.wants(name)]
        return [
            codec.encode_message({"type": "reset", "seq": seq, "runs": names}),
            *frames,
            codec.encode_message({"type": "synced", "seq": seq}),  # every snapshot is in
        ]

    async def _frames_at_cursor(self, sub: ReplaySubscriber) -> tuple[int, list[bytes]]:
        """The seq and snapshot frames of every run ``sub`` wants, at the cursor as it is now."""
        while True:
            # Cursors and seq are taken together, between two feeds: the snapshot covers exactly
            # the frames up to ``seq``.
            seq, generation = self.seq, self.generation
            cursors = {n: t.cursor() for n, t in self._timelines.items() if sub.wants(n)}
            key = (
                seq,
                generation,
                sub.max_points,
                tuple(cursors),
                None if sub.tags is None else sub.tags.pattern,
            )
            frames = self._cache.get(key)
            if frames is None:
                build = partial(self._build, cursors, seq, sub.max_points, sub.select)
                taken = sum(sum(c[0]) + c[1] for c in cursors.values())
                if taken <= INLINE_POINTS:
                    frames = build()
                else:
                    frames = await trio.to_thread.run_sync(build, limiter=self._limiter)
                self._cache[key] = frames
                while len(self._cache) > SNAPSHOT_CACHE:
                    self._cache.popitem(last=False)
            if generation == self.generation:  # else a seek came meanwhile: take the new cursor
                sub.synced(seq, generation, list(cursors))
                return seq, frames

    def _build(
        self,
        cursors: dict[str, Cursor],
        seq: int,
        max_points: int,
        select: Callable[..., tuple[list[ScalarColumns], list[dict[str, Any]]]],
    ) -> list[bytes]:
        """Snapshot frames for ``cursors`` (blocking: numpy work, in a worker thread)."""
        frames = []
        for name, cursor in cursors.items():
            scalars, events = select(*self._timelines[name].snapshot_at(cursor, max_points))
            frames.append(codec.encode_live("snapshot", seq, name, scalars, events))
        return frames

    # -- the broker's interface for vdl_stream.server ---------------------------------------------

    def subscribe(
        self, runs: set[str] | None = None, tags: re.Pattern[str] | None = None
    ) -> ReplaySubscriber:
        """Register a subscriber to ``runs`` (None: all) and tags matching ``tags`` (None: all).

        Raises:
            SubscriberLimitError: ``max_subscribers`` are subscribed already.
        """
        if len(self._subscribers) >= self._max_subscribers:
            raise SubscriberLimitError(
                f"the server already serves {self._max_subscribers} live subscribers"
            )
        sub = ReplaySubscriber(self, runs, self._subscriber_queue, tags, self._subscriber_bytes)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: ReplaySubscriber) -> None:
        """Remove a subscriber and close its queue."""
        self._subscribers.discard(sub)
        sub.close()

    def runs(self) -> list[str]:
        """The replayed run names, sorted (all of them, from the start: a run the replay has not
        reached yet is listed with no data)."""
        return sorted(self._timelines)

    # Run summaries (docs/http-api.md): a replay lists its runs as finished, with no figures yet.
    summary_tick = 0

    def _summaries(self) -> list[RunSummary]:
        out = []
        for name in sorted(self._timelines):
            summary = RunSummary(name, time.time())
            summary.closed = True
            out.append(summary)
        return out

    def summaries_json(self) -> bytes:
        """``{"runs": [summary, ...]}`` as JSON text (every run, finished, no figures)."""
        now = time.time()
        return b'{"runs":[' + b",".join(s.json_bytes(now) for s in self._summaries()) + b"]}"

    def summaries_frame(self, since: int | None = None) -> bytes | None:
        """The ``summaries`` frame of every run (``since`` None); later ones never change."""
        if since is not None:
            return None
        now = time.time()
        return summaries_frame([s.msgpack_bytes(now) for s in self._summaries()])

    def run_path(self, name: str) -> Any:
        """The recorded directory of a replayed run (``/api/export`` reads it whole, read-only)."""
        path = self._timelines[name].path
        if path is None:
            raise KeyError(name)
        return path

    async def ingest(self, batch: codec.Batch) -> int:
        """Refuse: a replay serves recorded runs and takes no writers."""
        raise RefusedError(
            "this server replays recorded runs and takes no writers", retryable=False
        )

    async def read_scalars(
        self, name: str, tag: str, *, start: int | None, end: int | None, max_points: int | None
    ) -> recorder.ScalarSeries:
        """One tag of one run as it stood at the replay position (``KeyError``: no such run or
        scalar tag)."""
        timeline = self._timelines[name]
        if tag not in timeline.by_tag:
            raise KeyError(tag)
        series = await trio.to_thread.run_sync(
            partial(timeline.scalars_at, timeline.cursor(), tag, start, end, max_points),
            limiter=self._limiter,
        )
        assert series is not None
        return series

    async def read_events(
        self, name: str, kind: str, tag: str | None = None
    ) -> list[dict[str, Any]]:
        """The events of one kind (and tag) of a run up to the replay position, in wall order."""
        timeline = self._timelines[name]
        if kind not in codec.EVENT_KINDS:
            raise KeyError(kind)
        return timeline.events_at(timeline.cursor(), kind, tag)

    async def tags(self, name: str) -> dict[str, recorder.TagInfo]:
        """The tags of a run as it stood at the replay position."""
        timeline = self._timelines[name]
        return await trio.to_thread.run_sync(
            timeline.tags_at, timeline.cursor(), limiter=self._limiter
        )

    def statistics(self) -> ReplayStatistics:
        """Counters; cheap enough to poll."""
        return ReplayStatistics(
            self._batches,
            self._events,
            self.seq,
            self.generation,
            len(self._timelines),
            len(self._subscribers),
        )

    def subscriber_statistics(self) -> list[SubscriberStatistics]:
        """The statistics of every subscriber."""
        return [s.statistics() for s in self._subscribers]

    def close(self) -> None:
        """Close every subscriber (their pages get close code 1001 once they drained)."""
        self.closed = True
        for sub in list(self._subscribers):
            sub.close()


# -- the replayer (trio) -----------------------------------------------------------------------


class Replayer:
    """The replay clock: feeds timelines into its :attr:`source`, paced by their recorded wall
    times scaled by ``speed``.

    Args:
        timelines: the runs to replay (one shared clock: runs start as far apart as recorded).
        speed: recorded seconds per real second; ``math.inf`` feeds as fast as it can.
        max_gap: a recorded pause longer than this many real seconds is shortened to it.
        start_paused: wait for :meth:`play` before feeding.
        source_options: passed to :class:`ReplaySource` (``subscriber_queue``,
            ``subscriber_bytes``, ``max_subscribers``).

    Attributes:
        source: the :class:`ReplaySource` to serve (``serve_replay`` does).
        finished: a ``trio.Event`` set once everything has been fed (replaced by a seek back).
    """

    def __init__(
        self,
        timelines: list[RunTimeline],
        *,
        speed: float = 1.0,
        max_gap: float = 3.0,
        start_paused: bool = False,
        **source_options: int,
    ) -> None:
        self.timelines = timelines
        self.speed = parse_speed(speed)
        if not max_gap > 0:
            raise ValueError(f"max_gap must be a positive number, got {max_gap!r}")
        self.max_gap = max_gap
        spans = [s for s in (t.span() for t in timelines) if s is not None]
        self.start = min(s[0] for s in spans) if spans else 0.0
        self.end = max(s[1] for s in spans) if spans else 0.0
        self.total = sum(t.points + len(t.events) for t in timelines)
        self.batches = 0
        self.source = ReplaySource(timelines, self.status, **source_options)
        self._playing = not start_paused
        self._anchor_wall = self.start  # recorded time at _anchor_clock
        self._anchor_clock: float | None = None
        self._seek_to: float | None = None
        self._version = 0
        self._pushed = -math.inf  # trio time of the last status push
        self._changed = trio.Event()
        self.finished = trio.Event()

    @property
    def fed(self) -> int:
        """Scalar points and events the replay stands past."""
        return sum(t.taken() for t in self.timelines)

    # -- control (sync, called from the same trio loop) ---------------------------------------

    def _now(self) -> float:
        if not self._playing or self._anchor_clock is None:
            return self._anchor_wall
        if math.isinf(self.speed):
            return math.inf
        return self._anchor_wall + (trio.current_time() - self._anchor_clock) * self.speed

    def _touch(self) -> None:
        """The status changed: push it to every page."""
        self._version += 1
        self._pushed = trio.current_time()
        self.source.status_changed()

    def _reanchor(self, wall: float | None = None) -> None:
        self._anchor_wall = min(self._now(), self.end) if wall is None else wall
        self._anchor_clock = trio.current_time()
        self._changed.set()
        self._touch()

    def play(self) -> None:
        """Resume (or start) feeding."""
        if not self._playing:
            self._playing = True
            self._reanchor(self._anchor_wall)

    def pause(self) -> None:
        """Stop feeding; the position stays where it is."""
        if self._playing:
            self._reanchor()
            self._playing = False
            self._touch()

    def set_speed(self, speed: float | str) -> None:
        """Change the speed (a positive number, or ``"max"``/``math.inf``); raise ValueError."""
        value = parse_speed(speed)
        self._reanchor()
        self.speed = value
        self._touch()

    def seek(self, *, wall: float | None = None, step: int | None = None) -> None:
        """Jump to a recorded wall time, or to the first record at or after ``step``.

        Every page then shows the runs as they stood just before the target (a ``reset`` frame
        and fresh snapshots); feeding goes on from there (if playing). The status reports the
        target as the position at once.

        Raises:
            ValueError: neither or both of ``wall`` and ``step``, or a non-finite wall.
        """
        if (wall is None) == (step is None):
            raise ValueError("seek needs exactly one of wall and step")
        if step is not None:
            found = [w for w in (t.wall_of_step(step) for t in self.timelines) if w is not None]
            target = min(found) if found else self.end
        else:
            assert wall is not None
            if not math.isfinite(wall):
                raise ValueError(f"wall must be a finite number, got {wall!r}")
            target = wall
        target = min(max(target, self.start), self.end)
        self._seek_to = target
        if self.finished.is_set():
            self.finished = trio.Event()
        self._reanchor(target)

    def status(self) -> ReplayStatus:
        """Where the replay stands (see :class:`ReplayStatus`)."""
        newest = [n for n in (t.newest() for t in self.timelines) if n is not None]
        return ReplayStatus(
            playing=self._playing,
            finished=self.finished.is_set(),
            speed=self.speed,
            position=min(self._now(), self.end),
            step=max(newest)[1] if newest else None,
            start=self.start,
            end=self.end,
            fed=self.fed,
            total=self.total,
            runs=tuple(t.name for t in self.timelines),
            version=self._version,
        )

    # -- feeding -------------------------------------------------------------------------------

    async def _feed(self, until: float) -> None:
        """Feed every timeline up to recorded time ``until``, in bounded batches; a seek stops it."""
        for t in self.timelines:
            while self._seek_to is None:
                scalars, events = t.take(until)
                if not scalars and not events:
                    break
                self.source.publish(t.name, scalars, events)
                self.batches += 1
                # let pages' sockets, commands and seeks in between two batches
                await trio.lowlevel.checkpoint()

    def _next_wall(self) -> float | None:
        walls = [w for w in (t.next_wall() for t in self.timelines) if w is not None]
        return min(walls) if walls else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Feed until cancelled: pace, honour pause/speed/seek, then wait for a seek at the end."""
        self._anchor_clock = trio.current_time()
        task_status.started()
        while True:
            self._changed = trio.Event()
            if self._seek_to is not None:
                target, self._seek_to = self._seek_to, None
                # At the end means all of it (not all but what was recorded at the last instant).
                for t in self.timelines:
                    t.move_to(math.inf if target >= self.end else target)
                if self._next_wall() is None:
                    self.finished.set()
                self.source.reset()
                self._touch()
                continue
            if not self._playing:
                await self._changed.wait()
                continue
            await self._feed(self._now())
            if self._seek_to is not None:
                continue
            nxt = self._next_wall()
            if nxt is None:
                self._anchor_wall = self.end
                self._anchor_clock = trio.current_time()
                if not self.finished.is_set():
                    self.finished.set()
                    self._touch()
                await self._changed.wait()
                continue
            wait = (nxt - self._now()) / self.speed
            if wait > self.max_gap:  # shorten long recorded pauses
                self._reanchor(nxt - self.max_gap * self.speed)
                wait = self.max_gap
            if trio.current_time() - self._pushed >= STATUS_INTERVAL:
                self._touch()
            with trio.move_on_after(min(max(TICK, wait), STATUS_INTERVAL)):
                await self._changed.wait()


# -- HTTP control ------------------------------------------------------------------------------


def replay_blueprint(replayer: Replayer) -> Any:
    """A quart blueprint serving ``GET /api/replay`` (status) and ``POST /api/replay`` (control).

    POST takes a JSON object ``{"action": "play" | "pause" | "speed" | "seek", "speed": number |
    "max", "step": int, "wall": float}`` and answers with the status, or 400 and ``{"error": ...}``.
    Only ``application/json`` bodies are accepted (a cross-site form cannot send one without a
    preflight). Token checks are the app's (``/api/`` paths). Pages learn of every change from
    the ``replay`` frames on ``/ws/live``; they never poll.
    """
    from quart import Blueprint, jsonify, request

    bp = Blueprint("replay", __name__)

    @bp.get("/api/replay")
    async def status() -> Any:
        return jsonify(replayer.status().to_json())

    @bp.post("/api/replay")
    async def control() -> Any:
        if request.mimetype != "application/json":
            return jsonify(error="send the command as application/json"), 415
        body = await request.get_json(silent=True)
        if not isinstance(body, dict):
            return jsonify(error="the body must be a JSON object"), 400
        action = body.get("action")
        try:
            if action == "play":
                replayer.play()
            elif action == "pause":
                replayer.pause()
            elif action == "speed":
                replayer.set_speed(body.get("speed"))
            elif action == "seek":
                step, wall = body.get("step"), body.get("wall")
                if step is not None and (type(step) is not int):
                    raise ValueError(f"step must be an integer, got {step!r:.40}")
                if wall is not None and type(wall) not in (int, float):
                    raise ValueError(f"wall must be a number, got {wall!r:.40}")
                replayer.seek(step=step, wall=None if wall is None else float(wall))
            else:
                raise ValueError(
                    f"action must be one of play, pause, speed, seek; got {action!r:.40}"
                )
        except ValueError as exc:
            return jsonify(error=str(exc)), 400
        return jsonify(replayer.status().to_json())

    return bp


async def serve_replay(
    replayer: Replayer,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    *,
    insecure: bool = False,
    allowed_hosts: Sequence[str] = (),
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard over ``replayer.source`` plus the replay control endpoints.

    The same app as ``vdl-stream serve`` (:func:`vdl_stream.server.serve_dashboard`) with
    :func:`replay_blueprint` mounted. Reports the URL through ``task_status``.

    Raises:
        PortInUseError: the port is taken.
        InsecureBindError: a non-loopback ``host`` without ``token`` or ``insecure``.
    """
    from .server import serve_dashboard

    await serve_dashboard(
        replayer.source,  # type: ignore[arg-type]  (it implements what the server uses of a Broker)
        host,
        port,
        token,
        insecure=insecure,
        allowed_hosts=allowed_hosts,
        shutdown_trigger=shutdown_trigger,
        blueprints=[replay_blueprint(replayer)],
        task_status=task_status,
    )


# -- command line ------------------------------------------------------------------------------


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``vdl-stream replay`` to ``parser``."""
    parser.add_argument(
        "path",
        metavar="PATH",
        help="a run directory or a log directory of runs (or its URL s3://bucket/prefix)",
    )
    parser.add_argument(
        "--speed",
        default="1",
        help="recorded seconds per real second, or 'max' (default: 1)",
    )
    parser.add_argument(
        "--from",
        dest="from_step",
        type=int,
        metavar="STEP",
        help="start at this step (what came before is shown at once)",
    )
    parser.add_argument(
        "--max-gap",
        type=float,
        default=3.0,
        help="shorten recorded pauses to at most this many real seconds (default: 3)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8040, help="port (default: 8040; 0: any free)")
    parser.add_argument("--token", help="require this token from browsers")
    parser.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without --token"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this Host name (repeatable; loopback names always are)",
    )
    parser.add_argument("--paused", action="store_true", help="start paused (play from the page)")
    parser.add_argument(
        "--exit", action="store_true", help="exit when everything has been replayed"
    )


def run_replay(args: argparse.Namespace) -> int:
    """Run ``vdl-stream replay``; return 0, or 2 on bad input."""
    from .server import check_allowed_host, check_bind

    try:
        # The bind and its token are checked before anything is read: one line, exit 2.
        check_bind(args.host, args.token, insecure=args.insecure)
        allowed_hosts = [check_allowed_host(name) for name in args.allow_host]
        speed = parse_speed(args.speed)
        if not args.max_gap > 0:
            raise ValueError(f"--max-gap must be a positive number, got {args.max_gap!r}")
    except ValueError as exc:
        print(f"vdl-stream replay: {exc}", file=sys.stderr)
        return 2
    from . import storage

    # PATH may be in an object store: replayed from a temporary mirror, kept until the end.
    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(storage.local_path(args.path))
            timelines = load_timelines(path)
        except (OSError, ImportError, ValueError, recorder.RecorderError) as exc:
            print(f"vdl-stream replay: {exc}", file=sys.stderr)
            return 2
        return _replay(args, timelines, speed, allowed_hosts)
    raise AssertionError("unreachable")  # pragma: no cover


def _replay(
    args: argparse.Namespace, timelines: list[RunTimeline], speed: float, allowed_hosts: list[str]
) -> int:
    from . import __version__
    from .errors import InsecureBindError, PortInUseError, unwrap

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                replayer = Replayer(timelines, speed=speed, max_gap=args.max_gap, start_paused=True)
                if args.from_step is not None:
                    replayer.seek(step=args.from_step)
                web_stop = trio.Event()
                feeding = trio.CancelScope()

                async def feed(task_status: trio.TaskStatus[None]) -> None:
                    with feeding:
                        await replayer.run(task_status=task_status)

                await nursery.start(feed)
                url = await nursery.start(
                    partial(
                        serve_replay,
                        replayer,
                        args.host,
                        args.port,
                        args.token,
                        insecure=args.insecure,
                        allowed_hosts=allowed_hosts,
                        shutdown_trigger=web_stop.wait,
                    )
                )
                suffix = f"/?token={args.token}" if args.token else "/"
                names = ", ".join(t.name for t in timelines)
                print(f"vdl-stream {__version__}: replaying {names} at {url}{suffix}", flush=True)
                if not args.paused:
                    replayer.play()

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        return

                async with trio.open_nursery() as waiting:

                    async def first(fn: Callable[[], Awaitable[object]]) -> None:
                        await fn()
                        waiting.cancel_scope.cancel()

                    waiting.start_soon(first, stop_on_signal)
                    if args.exit:
                        waiting.start_soon(first, replayer.finished.wait)
                status = replayer.status()
                print(f"replayed {status.fed:,} of {status.total:,} points and events", flush=True)
                feeding.cancel()
                replayer.source.close()  # pages are closed with 1001
                web_stop.set()
                nursery.cancel_scope.deadline = trio.current_time() + 5

    try:
        trio.run(main)
    except BaseException as exc:
        error = unwrap(exc)
        if isinstance(error, (PortInUseError, InsecureBindError)):
            print(
                f"vdl-stream replay: {error.strerror if isinstance(error, OSError) else error}",
                file=sys.stderr,
            )
            return 2
        raise
    return 0
