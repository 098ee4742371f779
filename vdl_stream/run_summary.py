"""Run summaries: one small object per run (status, times, last step, host, hparams, each scalar
tag's last/min/max), kept up to date as batches arrive, never by reading a run's history again.

The object is the one of docs/http-api.md, "Run summaries". A summary starts from what the run
already holds on disk, read cheaply: the recorder's digest (``recorder/digest.py``, written when a
writer closes the run) when it is current, else one streaming pass over the run
(:meth:`RunSummary.from_reader`); from then on every batch the broker fans out updates it
(:meth:`RunSummary.add`, a few NumPy reductions per scalar column).

Status:

* ``finished``: the run's newest ``meta`` event with a ``status`` key says ``"closed"`` (the close
  marker ``vdl_stream.Writer.close()`` sends; a writer resuming the run sends ``"running"``).
* ``crashed``: not closed, and either the writer's connection was lost without the close marker
  (and nothing arrived since), or the process of this machine that wrote a followed run ended
  without closing it (``recorder.writers_gone``, asked by the broker's follow loop), or nothing
  arrived for ``crash_after`` seconds (default :data:`CRASH_AFTER`, 120 s: Aim declares a run
  failed once its promised check-in is overdue beyond a 100 s grace period; we have no promised
  interval, so we take a little more than that).
  Idleness is measured with the server's clock (when the data arrived; for a run not followed live,
  its files' modification time), never with the writer's wall times.
* ``live`` otherwise.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np

import recorder
from recorder.digest import Digest

from .codec import EVENT_KINDS, RESERVED_TAG_PREFIX, ScalarColumns

#: Seconds without news after which a run that was not closed is ``crashed``.
CRASH_AFTER = 120.0
#: The ``meta`` key and values of the close marker.
STATUS_KEY = "status"
CLOSED = "closed"
RUNNING = "running"
STATUSES = ("live", "finished", "crashed")
#: Batches a summary keeps before folding them in (it also folds whenever it is read).
FOLD_BATCHES = 256
#: ... or once the batches kept hold this many scalar points (so what is kept stays small).
FOLD_POINTS = 1 << 16
#: A tag's kept columns are joined for one reduction when they hold at most this many points.
CONCAT_POINTS = 8192
#: Event kinds logged without a tag, whose times count for a run read from disk.
UNTAGGED_KINDS = ("meta", "hparams", "telemetry")
# Versions are unique across summaries, so a summary replaced by a new object is seen as changed.
_versions = itertools.count(1)


def _num(x: float | None) -> float | None:
    """JSON (and the page) has no NaN or Infinity: they travel as null."""
    return x if x is not None and math.isfinite(x) else None


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


class RunSummary:
    """The summary of one run, updated in place (event loop only; not thread-safe).

    Attributes:
        name: the run.
        start, last_wall: the smallest and largest wall time of any event (None: none yet).
        last_step: the largest step of any scalar point.
        host: the ``host`` of the newest ``meta`` event naming one (else of a telemetry event).
        hparams: the ``hparams`` map of the newest ``hparams`` event.
        tags: ``{tag: [last, min, max]}``; ``last`` may be NaN or infinite, ``min``/``max`` are
            over finite values (None: no finite value yet).
        closed: the newest status ``meta`` event is the close marker.
        heard: when the server last learnt something of the run (``time.time()``).
        disconnected: the writer's connection ended without the close marker, nothing since.
        version: bumped by every change (the broker publishes changed summaries by it).
    """

    __slots__ = (
        "_cache",
        "_kept_columns",
        "_kept_events",
        "_pending",
        "_pending_points",
        "closed",
        "disconnected",
        "heard",
        "host",
        "hparams",
        "last_step",
        "last_wall",
        "name",
        "start",
        "tags",
        "telemetry_host",
        "version",
    )

    def __init__(self, name: str, heard: float) -> None:
        self.name = name
        self.start: float | None = None
        self.last_wall: float | None = None
        self.last_step: int | None = None
        self.host: str | None = None
        self.telemetry_host: str | None = None
        self.hparams: dict[str, Any] = {}
        self.tags: dict[str, list] = {}
        self.closed = False
        self.heard = heard
        self.disconnected = False
        self.version = next(_versions)
        self._cache: tuple[int, str, bytes, dict, bytes] | None = None
        # What the batches taken in and not folded yet hold (see add): their columns, each as
        # (tag, steps, walls, values), and their events, in order; and how many batches (at
        # most FOLD_BATCHES) and points they are.
        self._kept_columns: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
        self._kept_events: list[dict[str, Any]] = []
        self._pending = 0
        self._pending_points = 0

    # -- building -------------------------------------------------------------------------------

    def _walls(self, lo: float | None, hi: float | None) -> None:
        self.start = _min(self.start, lo)
        self.last_wall = _max(self.last_wall, hi)

    def _meta(self, data: dict[str, Any]) -> None:
        host = data.get("host")
        if isinstance(host, str):
            self.host = host
        status = data.get(STATUS_KEY)
        if status == CLOSED:
            self.closed = True
        elif status is not None:
            self.closed = False

    def add(
        self, scalars: Iterable[ScalarColumns], events: Iterable[dict[str, Any]], now: float
    ) -> None:
        """Take in a batch as the broker fans it out (scalar columns and event maps).

        Cheap: the batch is kept, and folded in with the others kept (one NumPy reduction per
        tag over all of them) when the summary is next read, or once ``FOLD_BATCHES`` batches or
        ``FOLD_POINTS`` points are kept.
        """
        # Kept in two flat lists, each column as a tuple of its tag and arrays, not as the
        # batch's ScalarColumns in a list in a tuple: kept batches live until the next fold,
        # long enough in a live run to be promoted to the collector's oldest generation, and
        # promotions are what set off its full collections (each a pause of every thread of a
        # training process that logs through attach()). A tuple of a str and NumPy arrays is
        # no longer tracked once a collection has seen it; ScalarColumns stay tracked.
        kept = self._kept_columns
        for c in scalars:
            kept.append((c.tag, c.steps, c.walls, c.values))
            self._pending_points += len(c.steps)
        self._kept_events.extend(events)
        self._pending += 1
        self.heard = max(self.heard, now)
        self.disconnected = False
        self.version = next(_versions)
        if self._pending >= FOLD_BATCHES or self._pending_points >= FOLD_POINTS:
            self._fold()

    def _fold(self) -> None:
        """Fold the kept batches into the summary, in their order."""
        if not self._pending:
            return
        columns, self._kept_columns = self._kept_columns, []
        events, self._kept_events = self._kept_events, []
        self._pending = self._pending_points = 0
        by_tag: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        for tag, steps, walls, values in columns:
            if len(steps):
                by_tag.setdefault(tag, []).append((steps, walls, values))
        self._fold_events(events)
        for tag, cols in by_tag.items():
            if len(cols) > 1 and sum(len(c[0]) for c in cols) <= CONCAT_POINTS:
                # Many small columns (live writers' flushes): one reduction over all of them.
                cols = [tuple(np.concatenate(col) for col in zip(*cols, strict=True))]
            for steps, walls, values in cols:  # large columns one by one: no copy of them
                self._fold_column(tag, steps, walls, values)

    def _fold_column(
        self, tag: str, steps: np.ndarray, walls: np.ndarray, values: np.ndarray
    ) -> None:
        lo, hi = float(values.min()), float(values.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            # NaN or ±Inf among them (else min and max would be finite): the finite ones only.
            finite = values[np.isfinite(values)]
            lo = float(finite.min()) if len(finite) else None
            hi = float(finite.max()) if len(finite) else None
        row = self.tags.get(tag)
        if row is None:
            self.tags[tag] = [float(values[-1]), lo, hi]
        else:
            row[0] = float(values[-1])
            row[1] = _min(row[1], lo)
            row[2] = _max(row[2], hi)
        top = int(steps.max())
        self.last_step = top if self.last_step is None else max(self.last_step, top)
        self._walls(float(walls.min()), float(walls.max()))

    def _fold_events(self, events: Iterable[dict[str, Any]]) -> None:
        for event in events:
            wall = event.get("wall")
            if isinstance(wall, (int, float)) and math.isfinite(wall):
                self._walls(float(wall), float(wall))
            kind = event.get("kind")
            if kind == "meta":
                self._meta(event)
            elif kind == "hparams" and isinstance(event.get("hparams"), dict):
                self.hparams = dict(event["hparams"])
            elif kind == "telemetry" and isinstance(event.get("host"), str):
                self.telemetry_host = event["host"]

    def lost_writer(self) -> None:
        """The connection of a writer of this run ended: crashed unless it sent the close marker."""
        self._fold()
        if not self.closed and not self.disconnected:
            self.disconnected = True
            self.version = next(_versions)

    @classmethod
    def from_digest(cls, name: str, digest: Digest, heard: float) -> RunSummary:
        """The summary of a run whose recorder digest is current."""
        s = cls(name, heard)
        for tag, t in digest.scalars.items():
            if tag.startswith(RESERVED_TAG_PREFIX):  # telemetry (issue 16), not a training tag
                s.telemetry_host = tag[len(RESERVED_TAG_PREFIX) :].split("/", 1)[0]
                continue
            s.tags[tag] = [t.last_value, t.vmin, t.vmax]
            if t.step_max is not None:
                s.last_step = t.step_max if s.last_step is None else max(s.last_step, t.step_max)
        # Events and scalars only: bookkeeping records (the broker's "ingest") are not events.
        s.start, s.last_wall = digest.walls(("scalars", *EVENT_KINDS))
        s._meta(digest.meta)
        hp = digest.latest.get("hparams")
        if hp is not None and isinstance(hp[1], dict) and isinstance(hp[1].get("hparams"), dict):
            s.hparams = dict(hp[1]["hparams"])
        tm = digest.latest.get("telemetry")
        if tm is not None and isinstance(tm[1], dict) and isinstance(tm[1].get("host"), str):
            s.telemetry_host = tm[1]["host"]
        return s

    @classmethod
    def from_reader(cls, name: str, reader: recorder.RunReader, heard: float) -> RunSummary:
        """The summary of what ``reader`` holds (blocking: per scalar tag, the chunks holding its
        first and last step; the first and newest record of each event kind and tag)."""
        s = cls(name, heard)
        for tag, info in reader.tags().items():
            if info.kind != "scalars":
                # The first and the newest event of the tag (only those two are decoded).
                for record in reader.read_records(kind=info.kind, tag=tag, limit=2):
                    s._walls(record.wall, record.wall)
                continue
            # The points at the first and the last step: only the chunks holding those steps are
            # decoded (the whole tag, streamed, should a restart have superseded the last step).
            tail = reader.read_scalars(tag, start=info.step_max, end=info.step_max, max_points=2)
            if not len(tail.steps):
                tail = reader.read_scalars(tag, max_points=2)
                if not len(tail.steps):
                    continue
            head = reader.read_scalars(tag, start=info.step_min, end=info.step_min, max_points=2)
            first = float(head.walls.min()) if len(head.walls) else float(tail.walls.min())
            # Every scalar's walls count towards the run's time range, telemetry's too (as
            # from_digest and the live path count them).
            s._walls(first, float(tail.walls.max()))
            if tag.startswith(RESERVED_TAG_PREFIX):
                # Telemetry (issue 16): its host; not a training tag.
                s.telemetry_host = tag[len(RESERVED_TAG_PREFIX) :].split("/", 1)[0]
                continue
            s.tags[tag] = [float(tail.values[-1]), info.vmin, info.vmax]
            s.last_step = _max(s.last_step, int(tail.steps.max()))
        for kind in UNTAGGED_KINDS:  # events without a tag are not in tags()
            for record in reader.read_records(kind=kind, limit=2):
                if record.tag is None:
                    s._walls(record.wall, record.wall)
        s._meta(reader.meta)
        record = reader.last_record("hparams")
        if record is not None and isinstance(record.data.get("hparams"), dict):
            s.hparams = dict(record.data["hparams"])
        record = reader.last_record("telemetry")
        if record is not None and isinstance(record.data.get("host"), str):
            s.telemetry_host = record.data["host"]
        return s

    # -- reading --------------------------------------------------------------------------------

    def status(self, now: float, crash_after: float = CRASH_AFTER) -> str:
        """``live``, ``finished`` or ``crashed`` at time ``now`` (see the module docstring)."""
        self._fold()
        if self.closed:
            return "finished"
        if self.disconnected or now - self.heard > crash_after:
            return "crashed"
        return "live"

    def _build(self, status: str) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": status,
            "start": _num(self.start),
            "last_wall": _num(self.last_wall),
            "last_step": self.last_step,
            "host": self.host if self.host is not None else self.telemetry_host,
            "hparams": {k: _num(v) if isinstance(v, float) else v for k, v in self.hparams.items()},
            "last": {tag: _num(row[0]) for tag, row in self.tags.items()},
            "min": {tag: _num(row[1]) for tag, row in self.tags.items()},
            "max": {tag: _num(row[2]) for tag, row in self.tags.items()},
        }

    def _cached(self, status: str) -> tuple[int, str, bytes, dict, bytes]:
        if self._cache is None or self._cache[:2] != (self.version, status):
            obj = self._build(status)
            text = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
            packed = msgpack.packb(obj, use_bin_type=True)
            self._cache = (self.version, status, text, obj, packed)
        return self._cache

    def prime(self, now: float, crash_after: float = CRASH_AFTER) -> None:
        """Encode the summary now (e.g. in a worker thread, before the event loop sees it), so
        the first answer that lists it costs no encoding."""
        self._cached(self.status(now, crash_after))

    def to_json(self, now: float, crash_after: float = CRASH_AFTER) -> dict[str, Any]:
        """The summary object of docs/http-api.md (shared: do not change it)."""
        return self._cached(self.status(now, crash_after))[3]

    def json_bytes(self, now: float, crash_after: float = CRASH_AFTER) -> bytes:
        """:meth:`to_json` as JSON text, encoded once per change."""
        return self._cached(self.status(now, crash_after))[2]

    def msgpack_bytes(self, now: float, crash_after: float = CRASH_AFTER) -> bytes:
        """:meth:`to_json` as msgpack, encoded once per change."""
        return self._cached(self.status(now, crash_after))[4]


def summaries_frame(packed: list[bytes]) -> bytes:
    """The ``summaries`` frame ``{"type": "summaries", "runs": [...]}`` holding the summaries
    already encoded with msgpack in ``packed`` (joined, not encoded again)."""
    head = msgpack.packb({"type": "summaries", "runs": []}, use_bin_type=True)
    # The empty array (0x90) ends the map; an array header of the right length replaces it.
    n = len(packed)
    if n < 16:
        header = bytes([0x90 | n])
    elif n < 1 << 16:
        header = b"\xdc" + n.to_bytes(2, "big")
    else:
        header = b"\xdd" + n.to_bytes(4, "big")
    return b"".join([head[:-1], header, *packed])  # one copy of the frame


#: Index of a missing value in an interned column of a summaries table (u2, little-endian).
TABLE_MISSING = 0xFFFF


def _interned(values: list[Any]) -> list[Any]:
    """``[distinct values, u2 indices]``: each value once, then where each run's is (0xFFFF:
    the run has none). Values are told apart by type too (``True`` is not ``1``)."""
    distinct: list[Any] = []
    at: dict[Any, int] = {}
    index = [TABLE_MISSING] * len(values)
    for i, v in enumerate(values):
        if v is _ABSENT:
            continue
        # A str is its own key; other values go with their type (``True`` is not ``1``).
        key: Any = v if type(v) is str else (type(v), v)
        try:
            k = at.get(key)
        except TypeError:  # a list or map: by its JSON text
            key = (type(v), json.dumps(v, sort_keys=True))
            k = at.get(key)
        if k is None:
            if len(distinct) >= TABLE_MISSING:
                raise ValueError(f"a summaries table column has more than {TABLE_MISSING} values")
            k = at[key] = len(distinct)
            distinct.append(v)
        index[i] = k
    return [distinct, np.array(index, dtype="<u2").tobytes()]


_ABSENT = object()


def _rows(maps: list[dict[str, Any]], keys: list[str]) -> tuple[list[tuple], bool]:
    """Each map's values of ``keys`` as a tuple (``_ABSENT`` where a map lacks a key), and
    whether every map had every key. One C call per map (``itemgetter``) where it has them all:
    1,000 runs of 10 tags would otherwise cost 30,000 ``dict.get`` per column set."""
    if not keys:
        return [()] * len(maps), True
    get = operator.itemgetter(*keys)
    single = len(keys) == 1
    rows: list[tuple] = []
    complete = True
    for m in maps:
        try:
            row = get(m)
            rows.append((row,) if single else row)
        except KeyError:
            complete = False
            rows.append(tuple(m.get(k, _ABSENT) for k in keys))
    return rows, complete


def summaries_table(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run summaries ``objs`` (as :meth:`RunSummary.to_json` gives them) as columns: the
    compact body of a ``summaries`` frame (docs/protocol.md, "Summaries as a table").

    Numbers go as raw little-endian f8 columns (NaN: null), strings and hparam values interned
    with u2 indices, and each scalar tag's last/min/max as one f8 column of ``tags x runs``
    (tag-major), with ``has`` (u1, same shape) saying which runs have the tag at all. A page
    decodes it with a few array copies instead of one value at a time.

    Raises:
        ValueError: a column has more than 65,535 distinct values.
    """
    n = len(objs)
    empty: dict[str, Any] = {}

    def f8(key: str) -> bytes:
        return np.array([o.get(key) for o in objs], dtype="<f8").tobytes()

    hparams = [o.get("hparams", empty) for o in objs]
    hparam_keys = sorted({k for h in hparams for k in h})
    tags = sorted({t for o in objs for t in o.get("last", empty)})
    t = len(tags)
    has = None
    stats = {}
    for agg in ("last", "min", "max"):
        rows, complete = _rows([o.get(agg, empty) for o in objs], tags)
        if not complete:
            if agg == "last":
                has = np.array([[v is not _ABSENT for v in r] for r in rows], dtype="u1")
            rows = [tuple(None if v is _ABSENT else v for v in r) for r in rows]
        # Run-major rows to tag-major columns: tag i's runs at [i*n, (i+1)*n).
        stats[agg] = np.ascontiguousarray(np.array(rows, dtype="<f8").reshape(n, t).T).tobytes()
    hp_rows, _ = _rows(hparams, hparam_keys)
    hp_columns = list(zip(*hp_rows, strict=True)) if n else [()] * len(hparam_keys)
    return {
        "names": [o["name"] for o in objs],
        "status": _interned([o.get("status") for o in objs]),
        "start": f8("start"),
        "last_wall": f8("last_wall"),
        "last_step": f8("last_step"),
        "host": _interned([o.get("host") for o in objs]),
        "hparams": [
            [k, *_interned(list(column))] for k, column in zip(hparam_keys, hp_columns, strict=True)
        ],
        "tags": tags,
        **stats,
        "has": None if has is None else np.ascontiguousarray(has.reshape(n, t).T).tobytes(),
    }


def summaries_table_frame(objs: list[dict[str, Any]]) -> bytes:
    """The ``summaries`` frame ``{"type": "summaries", "table": ...}`` of ``objs`` (see
    :func:`summaries_table`)."""
    return msgpack.packb({"type": "summaries", "table": summaries_table(objs)}, use_bin_type=True)
