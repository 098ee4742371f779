"""RunReader: reads (and tails) a run directory without ever writing to it; list_runs."""

from __future__ import annotations

import itertools
import os
import time
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from recorder import blocks, codec, framing
from recorder.catalog import SEGMENT_RE, Catalog, Entry, SourceGone, list_segments
from recorder.downsample import downsample, extreme_indices
from recorder.parts import PartTable
from recorder.preview import PREVIEW_POINTS, Preview, load_preview
from recorder.records import (
    CorruptionWarning,
    NotARunError,
    Position,
    Record,
    RecorderError,
    ScalarSeries,
    TagInfo,
)

_T = TypeVar("_T")
#: ``np.iinfo(np.int64)``'s bounds (each ``np.iinfo`` call builds an object: 2 µs a tag read).
_I64_MIN, _I64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
#: :func:`superseded_from`'s step for points that no restart supersedes.
NOT_SUPERSEDED = _I64_MAX
# A read that compaction interrupted (it replaced files meanwhile) starts over at least
# _RETRIES times, and for as long as RETRY_SECONDS allow: a writer that compacts small runs
# every few milliseconds can interrupt many reads in a row, but not for seconds.
_RETRIES = 8
RETRY_SECONDS = 5.0
# Decoded group chunks a reader keeps for streaming reads (least recently used dropped first).
GROUP_CACHE_BYTES = 8 << 20
# Group parts of a tag a downsampled read loads at once (beyond it, they are streamed).
PARTS_AT_ONCE = 8192
# A downsampled read of at most this many points (of a tag not loaded) decodes them all and
# downsamples them at once: for a short tag that is cheaper than bucketing chunk by chunk (a sweep
# of 1,000 runs of 10,000 points a tag), and it holds at most this many points at a time.
SMALL_DOWNSAMPLE = 1 << 16
# Downsampled reads kept for asking again (a page reloaded, a run selected again), in points; they
# are forgotten as soon as the reader reads anything new or finds damage.
DOWNSAMPLED_POINTS = 1 << 18


@dataclass(frozen=True)
class ReaderStatistics:
    """Counters of a :class:`RunReader`.

    Attributes:
        records: complete valid records known.
        scalar_points: scalar points in those records (superseded ones included).
        corrupt_records: damaged records (or damaged regions) skipped; each also raised a
            :class:`~recorder.CorruptionWarning`.
        corrupt_bytes: bytes skipped in those.
        pending_bytes: bytes at the end of segments not yet forming a complete record (a torn
            tail, or a record being written).
        segments: segments read, as files or as blocks covering them.
        bytes_read: bytes read from segment files.
        index_used: whether the index file matched the segments and was used.
    """

    records: int
    scalar_points: int
    corrupt_records: int
    corrupt_bytes: int
    pending_bytes: int
    segments: int
    bytes_read: int
    index_used: bool


class _TagSeries:
    """A tag's points with restarts applied, in growable arrays kept between queries.

    New points go past the visible length and a restart builds new arrays, so a series handed out
    earlier (read-only views) never changes under its holder.
    """

    __slots__ = ("consumed", "monotonic", "n", "rows_consumed", "smax", "steps", "values", "walls")

    def __init__(self) -> None:
        self.consumed = 0  # chunks of the tag folded in
        self.rows_consumed = 0  # group parts of the tag folded in
        self.n = 0
        self.smax: int | None = None
        self.monotonic = True  # steps non-decreasing
        self.steps = np.empty(0, dtype=np.int64)
        self.walls = np.empty(0, dtype=np.float64)
        self.values = np.empty(0, dtype=np.float64)

    def _resize(self, capacity: int, keep: np.ndarray | slice) -> None:
        cols = []
        for col in (self.steps, self.walls, self.values):
            kept = col[: self.n][keep]
            new = np.empty(max(capacity, len(kept)), dtype=col.dtype)
            new[: len(kept)] = kept
            cols.append(new)
        self.steps, self.walls, self.values = cols
        self.n = len(kept)

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more points."""
        need = self.n + extra
        if need > len(self.steps):
            self._resize(max(need, 2 * len(self.steps)), slice(None))

    def restart(
        self, start: int, counts: np.ndarray, firsts: np.ndarray, smaxs: np.ndarray, top: int | None
    ) -> None:
        """Apply the restarts among the pieces appended from point ``start`` on (``counts``
        points each, first steps ``firsts``, largest steps ``smaxs``; ``top`` the largest step
        held before them) to every point held, in one pass over the points whatever the number
        of restarts."""
        limits = superseded_from(firsts, smaxs, top)
        if limits[0] == NOT_SUPERSEDED:  # (the smallest: no restart at all)
            return
        keep = self.steps[: self.n] < np.repeat(limits, [start, *counts.tolist()])
        self._resize(len(self.steps), keep)  # new arrays: a series handed out stays as it was
        steps = self.steps[: self.n]
        self.smax = int(steps.max()) if self.n else None
        self.monotonic = bool(self.n < 2 or (steps[1:] >= steps[:-1]).all())

    def add(self, data: dict, count: int, smax: int) -> None:
        """Decode one chunk after the points held (room must have been reserved)."""
        lo, hi = self.n, self.n + count
        codec.decode_scalars_into(data, self.steps[lo:hi], self.walls[lo:hi], self.values[lo:hi])
        new = self.steps[lo:hi]
        if self.monotonic:
            self.monotonic = bool(
                (lo == 0 or new[0] >= self.steps[lo - 1]) and (new[1:] >= new[:-1]).all()
            )
        self.n = hi
        self.smax = smax if self.smax is None else max(self.smax, smax)

    def extend(self, pieces: ScalarSeries, counts: np.ndarray, firsts: np.ndarray) -> None:
        """Append consecutive pieces (chunks or group parts: ``counts`` points each, starting at
        step ``firsts``) at once, restarts applied (:meth:`restart`)."""
        total = len(pieces.steps)
        if not total:
            return
        offsets = np.cumsum(counts) - counts
        start, top = self.n, self.smax
        self.reserve(total)
        self._append(pieces, 0, total)
        self.restart(start, counts, firsts, np.maximum.reduceat(pieces.steps, offsets), top)

    def _append(self, pieces: ScalarSeries, lo: int, hi: int) -> None:
        """Copy ``pieces[lo:hi]`` after the points held (room reserved), no restart among them."""
        if hi <= lo:
            return
        start, end = self.n, self.n + hi - lo
        self.steps[start:end] = pieces.steps[lo:hi]
        self.walls[start:end] = pieces.walls[lo:hi]
        self.values[start:end] = pieces.values[lo:hi]
        new = self.steps[start:end]
        if self.monotonic:
            self.monotonic = bool(
                (start == 0 or new[0] >= self.steps[start - 1]) and (new[1:] >= new[:-1]).all()
            )
        self.n = end
        top = int(new.max())
        self.smax = top if self.smax is None else max(self.smax, top)

    def view(self) -> ScalarSeries:
        """The points, as views of the buffers (the caller makes them read-only before handing
        them out; NumPy reductions run several times slower on read-only arrays)."""
        n = self.n
        return ScalarSeries(self.steps[:n], self.walls[:n], self.values[:n])


def superseded_from(firsts: np.ndarray, smaxs: np.ndarray, top: int | None = None) -> np.ndarray:
    """Where the restarts among a tag's pieces cut, by the rule of :meth:`RunReader.read_scalars`
    (a replay applies it too).

    From the summaries alone, in time linear in the pieces: a restart keeps nothing at or above
    its first step, which its own largest step is not below, so right after it the largest step
    kept is its own; between restarts that largest step only grows. Only a piece starting below
    the largest step of every point before it (superseded or not) can be a restart.

    Args:
        firsts, smaxs: the first and the largest step of each piece (chunk or group part), in
            write order (int64 arrays of one length).
        top: the largest step of the points held before the pieces; None if none are held.

    Returns:
        ``out`` (int64, one longer than ``firsts``): ``out[i + 1]`` is the step from which piece
        ``i``'s points are superseded by later restarts, ``out[0]`` that of the points held
        before; :data:`NOT_SUPERSEDED` where nothing supersedes. ``out[0]`` is the smallest.
    """
    n = len(firsts)
    out = np.full(n + 1, _I64_MAX, np.int64)
    if not n or (n == 1 and top is None):  # nothing before the piece (a tag of one chunk)
        return out
    below = _I64_MIN if top is None else top
    seen = np.maximum.accumulate(smaxs)
    before = np.empty(n, np.int64)
    before[0] = below
    np.maximum(seen[:-1], below, out=before[1:])
    candidates = np.flatnonzero(firsts < before)
    if not len(candidates):
        return out
    # Candidate k's segment runs to the next candidate: no restart inside it.
    segments = np.maximum.reduceat(smaxs, candidates).tolist()
    first = int(candidates[0])
    kept = max(below, int(seen[first - 1])) if first else below
    restarts = []
    for j, segment, step in zip(
        candidates.tolist(), segments, firsts[candidates].tolist(), strict=True
    ):
        if step < kept:
            restarts.append(j)
            kept = segment
        else:
            kept = max(kept, segment)
    out[restarts] = firsts[restarts]
    return np.minimum.accumulate(out[::-1])[::-1]


def _piece_runs(
    refs: list, whole: np.ndarray, skip: np.ndarray
) -> Iterator[tuple[list[int], None] | tuple[None, int]]:
    """A tag's pieces not skipped, in order: ``(rows, None)`` for a run of consecutive whole
    group parts (read together), ``(None, i)`` for any other piece ``refs[i]``."""
    rows: list[int] = []
    for i in np.flatnonzero(~skip).tolist():
        ref = refs[i]
        if isinstance(ref, int) and whole[i]:
            rows.append(ref)
            continue
        if rows:
            yield rows, None
            rows = []
        yield None, i
    if rows:
        yield rows, None


def _attempts() -> Iterator[int]:
    """Attempts at a read that compaction may interrupt: at least ``_RETRIES``, then more until
    ``RETRY_SECONDS`` have passed since the first."""
    deadline = time.monotonic() + RETRY_SECONDS
    n = 0
    while n < _RETRIES or time.monotonic() < deadline:
        yield n
        n += 1


class RunReader:
    """Reads a run directory, and follows it while another process appends to it.

    Never writes into the run directory (a damaged or missing index is rebuilt in memory only).
    Reads compacted runs (blocks) and follows a writer that compacts: a reader whose files were
    replaced rebuilds its catalog from the new layout up to where it had read, so nothing is
    returned twice or lost. It keeps the newest segment's file open and at most a few sealed files
    (opened again on demand); long iterations hold the run's files until they end.
    The constructor reads everything complete so far; :meth:`refresh` picks up what was appended
    since. Damaged records are skipped with a :class:`~recorder.CorruptionWarning` and counted in
    :meth:`statistics`; an incomplete last record is left pending until it is complete.

    Args:
        run_dir: the run directory.
        limit: read nothing that ends after this position (a snapshot of a live run).

    Raises:
        NotARunError: ``run_dir`` does not exist, is not a directory, or holds no segment files.
        FormatError: a segment has a wrong magic number, a newer format version or a damaged
            header (the message names the file).
    """

    def __init__(self, run_dir: str | os.PathLike[str], limit: Position | None = None) -> None:
        self._dir = os.fspath(run_dir)
        if not os.path.isdir(self._dir):
            raise NotARunError(f"{self._dir}: not a run directory (no such directory)")
        if not list_segments(self._dir):
            raise NotARunError(f"{self._dir}: not a run directory (no segment-*.vdlr files)")
        self._catalog = Catalog(self._dir)
        self._closed = False
        # The run's preview file (recorder/preview.py) and the files this reader had read when
        # it read it: read again only once the reader has read more.
        self._preview_file: Preview | None = None
        self._preview_seen: list[tuple[str, int]] | None = None
        self._reset()
        try:
            for _ in _attempts():
                try:
                    self._catalog.load_index(limit)
                    self._add(self._catalog.entries)
                    self._add(self._catalog.update(limit))
                    break
                except SourceGone:
                    self._catalog.close()
                    self._catalog = Catalog(self._dir)
                    self._reset()
            else:
                raise RecorderError(f"{self._dir}: the run kept changing while being opened")
        except BaseException:
            self._catalog.close()
            raise

    def _reset(self) -> None:
        self._by_tag: dict[str, list[Entry]] = {}
        self._parts = PartTable()
        # Group chunks decoded by streaming reads, shared by every tag's pass (each tag of a live
        # tail has a part in every group: without it a snapshot decodes each group once per tag).
        self._groups: OrderedDict[int, ScalarSeries] = OrderedDict()
        self._groups_bytes = 0
        self._seq = 0
        self._tag_series: dict[str, _TagSeries] = {}
        self._meta: dict = {}
        self._meta_done = 0
        self._forget_downsampled()

    def _forget_downsampled(self) -> None:
        """Drop the downsampled reads kept: what the reader holds changed."""
        # (tag, start, end, max_points) -> the series read, least recently used first
        self._downsampled: OrderedDict[tuple, ScalarSeries] = OrderedDict()
        self._downsampled_points = 0

    def _rebase(self, upto: Position | None = None) -> None:
        """Rebuild the catalog after compaction replaced files it had read: read the new layout
        up to where the old catalog had read (``upto``), so that nothing is returned twice by a
        later :meth:`poll`. Damage already reported is not reported again."""
        old = self._catalog
        upto = old.end if upto is None else upto
        for _ in _attempts():
            cat = Catalog(self._dir)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", CorruptionWarning)
                    cat.update(upto)
            except SourceGone:
                cat.close()
                continue
            break
        else:
            raise RecorderError(f"{self._dir}: the run kept changing while being read")
        cat.damaged_records = old.damaged_records
        cat.damaged_bytes = old.damaged_bytes
        cat.bytes_read += old.bytes_read
        old.close()
        self._catalog = cat
        self._reset()
        self._add(cat.entries)

    def _retry(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn``; if compaction replaced a file meanwhile, rebase and run it again."""
        for _ in _attempts():
            try:
                return fn()
            except SourceGone:
                self._rebase()
        raise RecorderError(f"{self._dir}: the run kept changing while being read")

    def _add(self, entries: list[Entry]) -> None:
        if entries:
            self._forget_downsampled()
        for e in entries:
            e.seq = self._seq
            self._seq += 1
            if e.parts is not None:
                self._parts.add(e, e.seq)
            elif e.tag is not None:
                self._by_tag.setdefault(e.tag, []).append(e)

    def _check_open(self) -> None:
        if self._closed:
            raise RecorderError(f"{self._dir}: the RunReader is closed")

    def poll(self, limit: Position | None = None) -> list[Record]:
        """Read records appended since the last call and return them, in write order.

        For following a live run: scalar chunks come as in :meth:`iter_records`. Records that
        turn out damaged are skipped (and counted).
        """
        self._check_open()
        start = self._catalog.end
        for _ in _attempts():
            try:
                new = self._catalog.update(limit)
                self._add(new)
                return [r for _, r in _in_write_order(self._keyed_records(new))]
            except SourceGone:
                self._rebase(start)  # what was read before this call, in the new layout
        raise RecorderError(f"{self._dir}: the run kept changing while being read")

    def position(self) -> Position:
        """The end of what this reader has read: pass it as ``limit`` to read no further."""
        return self._catalog.end

    def refresh(self, limit: Position | None = None) -> bool:
        """Read records appended since the last call; return True if there were any.

        Args:
            limit: read no record that ends after this position (e.g. a writer's flushed
                position), or everything complete when None.
        """
        self._check_open()

        def update() -> bool:
            new = self._catalog.update(limit)
            self._add(new)
            return bool(new)

        return self._retry(update)

    def _live(self, entries: list[Entry]) -> list[Entry]:
        return [e for e in entries if e.length >= 0]

    def _load(self, entry: Entry) -> object:
        """The data of ``entry``; None (and the entry is dropped) if it turned out damaged."""
        data = self._catalog.load(entry)
        if data is None:
            self._kill(entry)
        return data

    def _kill(self, entry: Entry) -> None:
        """Drop a record found damaged from every later query."""
        entry.length = -1
        if entry.parts is not None:
            self._parts.drop(entry)
            self._drop_decoded()
        else:
            self._tag_series.pop(entry.tag, None)
            self._forget_downsampled()

    def _drop_decoded(self) -> None:
        """Forget every tag's decoded series and the downsampled reads kept from them."""
        self._tag_series.clear()
        self._forget_downsampled()

    def _scalars_of(self, entry: Entry) -> ScalarSeries | None:
        data = self._load(entry)
        if data is None:
            return None
        try:
            return codec.decode_scalars(data)
        except codec.PayloadError as exc:
            self._catalog.report_damage(entry, str(exc))
            self._kill(entry)
            return None

    def tags(self) -> dict[str, TagInfo]:
        """Every tag with its kind, count, step range and (scalars) finite value range.

        A tag used with several kinds (say scalars and text) is summarised by the kind of its first
        record; :meth:`read_scalars` and :meth:`read_records` still return the others.
        """
        self._check_open()
        out = {}
        cols = self._parts.cols
        grouped = set(self._parts.tag_names())
        for tag in sorted(set(self._by_tag) | grouped):
            live = self._live(self._by_tag.get(tag, []))
            rows = self._parts.rows_of(tag) if tag in grouped else None
            if live and (rows is None or live[0].seq < cols["seq"][rows[0]]):
                kind = live[0].kind
            else:
                kind = codec.SCALARS
            live = [e for e in live if e.kind == kind]
            count = sum(e.count for e in live)
            steps = [e.smin for e in live if e.smin is not None]
            steps_hi = [e.smax for e in live if e.smax is not None]
            lo = [e.vmin for e in live if e.vmin is not None]
            hi = [e.vmax for e in live if e.vmax is not None]
            if kind == codec.SCALARS and rows is not None:
                count += int(cols["count"][rows].sum())
                steps.append(int(cols["smin"][rows].min()))
                steps_hi.append(int(cols["smax"][rows].max()))
                for bucket, col, pick in ((lo, "vmin", np.min), (hi, "vmax", np.max)):
                    finite = cols[col][rows]
                    finite = finite[~np.isnan(finite)]
                    if len(finite):
                        bucket.append(float(pick(finite)))
            out[tag] = TagInfo(
                kind=kind,
                count=count,
                step_min=min(steps) if steps else None,
                step_max=max(steps_hi) if steps_hi else None,
                vmin=min(lo) if lo else None,
                vmax=max(hi) if hi else None,
            )
        return out

    def _series(self, tag: str) -> tuple[ScalarSeries, bool]:
        """The tag's points with restarts applied, and whether its steps are non-decreasing."""
        entries = [e for e in self._by_tag.get(tag, ()) if e.kind == codec.SCALARS]
        state = self._tag_series.get(tag)
        if state is None:
            state = self._tag_series[tag] = _TagSeries()
        rows = self._parts.rows_of(tag)
        if state.rows_consumed < len(rows):
            if not self._fold_with_parts(tag, state, entries, rows):
                return self._series(tag)
        elif state.consumed < len(entries):
            loaded = []
            for e in entries[state.consumed :]:
                data = self._load(e) if e.length >= 0 else None
                if data is not None:
                    loaded.append((e, data))
            if tag not in self._tag_series:  # a damaged chunk was found: start over without it
                return self._series(tag)
            start, top = state.n, state.smax
            state.reserve(sum(e.count for e, _ in loaded))
            for e, data in loaded:
                try:
                    state.add(data, e.count, e.smax)
                except codec.PayloadError as exc:
                    self._catalog.report_damage(e, str(exc))
                    self._kill(e)
                    return self._series(tag)
                e.data = None  # the arrays hold it now; replay reads it again from disk
            state.restart(
                start,
                np.array([e.count for e, _ in loaded], np.int64),
                np.array([e.step for e, _ in loaded], np.int64),
                np.array([e.smax for e, _ in loaded], np.int64),
                top,
            )
            state.consumed = len(entries)
        return state.view(), state.monotonic

    def _fold_with_parts(
        self, tag: str, state: _TagSeries, entries: list[Entry], rows: np.ndarray
    ) -> bool:
        """Fold new chunks and group parts of ``tag`` into ``state`` in write order; False if
        damage was found (the caller starts over)."""
        new_rows = rows[state.rows_consumed :]
        if not self._parts.load(new_rows, self._catalog.load):
            self._drop_decoded()
            return False
        loaded = []
        for e in entries[state.consumed :]:
            series = self._scalars_of(e) if e.length >= 0 else None
            if series is not None:
                loaded.append((e, series))
        if tag not in self._tag_series:
            return False
        cols = self._parts.cols
        cuts = np.searchsorted(cols["seq"][new_rows], [e.seq for e, _ in loaded]).tolist()
        pieces, counts, firsts = [], [], []
        prev = 0
        for (e, series), cut in zip([*loaded, (None, None)], [*cuts, len(new_rows)], strict=True):
            if cut > prev:
                part_rows = new_rows[prev:cut]
                pieces.append(self._parts.gather(part_rows))
                counts.append(cols["count"][part_rows])
                firsts.append(cols["first"][part_rows])
                prev = cut
            if e is not None:
                pieces.append(series)
                counts.append(np.array([len(series.steps)]))
                firsts.append(np.array([int(series.steps[0])]))
                e.data = None
        state.extend(
            ScalarSeries(*(np.concatenate(c) for c in zip(*pieces, strict=True))),
            np.concatenate(counts),
            np.concatenate(firsts),
        )
        state.consumed = len(entries)
        state.rows_consumed = len(rows)
        return True

    def read_scalars(
        self,
        tag: str,
        start: int | None = None,
        end: int | None = None,
        max_points: int | None = None,
    ) -> ScalarSeries:
        """The scalar points of ``tag`` in write order, restarts applied.

        When a chunk starts at a step below the largest step kept before it for the tag (training
        resumed from a checkpoint), it supersedes every earlier point at a step at or after its
        first step; the file keeps both. As in TensorBoard, only a step going back is a restart:
        a chunk starting at the same step as the last one keeps both (steps may repeat).

        Args:
            tag: the tag; an unknown tag gives an empty series.
            start, end: keep points with ``start <= step <= end`` (None: unbounded).
            max_points: at most this many points (>= 2): the first, the last, and per bucket the
                minimum and the maximum, so spikes survive.

        Returns:
            Read-only arrays (they may share memory with the reader's cache).

        Raises:
            ValueError: ``max_points`` below 2, or a tag that holds only records of another kind.
        """
        self._check_open()
        if max_points is not None and (not isinstance(max_points, int) or max_points < 2):
            raise ValueError(f"max_points must be an int >= 2 or None, got {max_points!r}")
        self._check_scalar_tag(tag)
        if max_points is not None and tag not in self._tag_series:
            # Not loaded: downsample one chunk at a time rather than load the whole series.
            key = (tag, start, end, max_points)
            kept = self._downsampled.get(key)
            if kept is not None:  # asked before, and nothing read or found damaged since
                self._downsampled.move_to_end(key)
                return kept
            if start is None and end is None:
                previewed = self._previewed(tag, max_points)
                if previewed is not None:
                    return previewed
            series = self._retry(lambda: self._downsample_stream(tag, start, end, max_points))
            for col in series:
                col.flags.writeable = False
            self._keep_downsampled(key, series)
            return series
        series, monotonic = self._retry(lambda: self._series(tag))
        if start is not None or end is not None:
            steps = series.steps
            if monotonic:
                lo = 0 if start is None else int(np.searchsorted(steps, start, "left"))
                hi = len(steps) if end is None else int(np.searchsorted(steps, end, "right"))
                series = ScalarSeries(*(col[lo:hi] for col in series))
            else:
                keep = np.ones(len(steps), dtype=bool)
                if start is not None:
                    keep &= steps >= start
                if end is not None:
                    keep &= steps <= end
                series = ScalarSeries(*(col[keep] for col in series))
        if max_points is not None:
            series = downsample(series, max_points)
        for col in series:
            col.flags.writeable = False  # they may be views of the cache
        return series

    def read_scalars_kept(self, tag: str, max_points: int) -> ScalarSeries | None:
        """``read_scalars(tag, max_points=max_points)`` if it needs no file read: the same read
        kept from before (nothing read since), or ``tag`` loaded whole; None otherwise.

        Raises:
            ValueError: as :meth:`read_scalars`.
        """
        self._check_open()
        if tag in self._tag_series or (tag, None, None, max_points) in self._downsampled:
            return self.read_scalars(tag, max_points=max_points)
        return self._previewed(tag, max_points)  # what read_scalars would answer from it, or None

    def files_read(self) -> list[tuple[str, int]] | None:
        """The data files the reader has read, each whole, as sorted ``(name, size)`` pairs;
        None when it holds one in part (a ``limit`` short of its end, a torn tail pending)."""
        self._check_open()
        return self._catalog.extent()

    def _previewed(self, tag: str, max_points: int) -> ScalarSeries | None:
        """``read_scalars(tag, max_points=max_points)`` from the run's preview file when it
        holds that read and describes exactly the files this reader has read, whole; else None
        (recorder/preview.py)."""
        if max_points != PREVIEW_POINTS:  # previews hold no other read: no file read for it
            return None
        files = self._catalog.extent()  # a few µs: checked at every read, never out of date
        if files is None:
            return None
        if files != self._preview_seen:  # the first ask, or the reader read more since
            self._preview_seen = files
            try:
                self._preview_file = load_preview(self._dir)
            except OSError:  # only a shortcut: the read goes on from the chunks
                self._preview_file = None
        preview = self._preview_file
        if preview is None or preview.max_points != max_points or preview.files != files:
            return None
        return preview.tags.get(tag)

    def keep_scalars(self, tag: str, max_points: int, series: ScalarSeries) -> None:
        """Keep ``series`` as the answer to ``read_scalars(tag, max_points=max_points)``, so
        that asking again reads nothing: for a read done elsewhere (a :class:`ReaderPool`
        process's reader of the same run up to this reader's :meth:`position`), which gives the
        same points. Dropped, as every kept read, once the reader reads more."""
        self._check_open()
        for col in series:
            col.flags.writeable = False
        self._keep_downsampled((tag, None, None, max_points), series)

    def _keep_downsampled(self, key: tuple, series: ScalarSeries) -> None:
        """Keep a downsampled read for asking again, within ``DOWNSAMPLED_POINTS``."""
        n = len(series.steps)
        if n > DOWNSAMPLED_POINTS:
            return
        self._downsampled[key] = series
        self._downsampled_points += n
        while self._downsampled_points > DOWNSAMPLED_POINTS:
            _, old = self._downsampled.popitem(last=False)
            self._downsampled_points -= len(old.steps)

    def cached_bytes(self) -> int:
        """Bytes of decoded data this reader holds: series buffers, group points, kept payloads.

        An estimate for a cache budget: NumPy buffers exactly, kept payloads by their size on disk.
        """
        self._check_open()
        total = self._parts.nbytes() + self._groups_bytes
        if self._preview_file is not None:
            total += sum(col.nbytes for s in self._preview_file.tags.values() for col in s)
        for series in self._downsampled.values():
            total += sum(col.nbytes for col in series)
        for state in self._tag_series.values():
            total += state.steps.nbytes + state.walls.nbytes + state.values.nbytes
        for e in self._catalog.entries:
            if e.data is not None:
                total += e.length
        return total

    def drop_cache(self) -> None:
        """Free the decoded data this reader holds; later reads load it again from disk.

        What the reader knows about the run (its records, tags and summaries) stays.
        """
        self._check_open()
        self._drop_decoded()
        self._parts.unload()
        self._groups.clear()
        self._preview_file = self._preview_seen = None
        self._groups_bytes = 0
        for e in self._catalog.entries:
            if e.parts is None or e.data is not None:
                e.data = None
        self._meta_done = 0
        self._meta = {}

    def _pieces(self, tag: str) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        """The chunks and group parts of ``tag`` in write order, with their first steps and step
        ranges: ``(refs, firsts, smins, smaxs)``; a ref is an Entry or a part row number."""
        entries = [
            e for e in self._by_tag.get(tag, ()) if e.kind == codec.SCALARS and e.length >= 0
        ]
        rows = self._parts.rows_of(tag)
        cols = self._parts.cols
        keys = [(e.seq, 0) for e in entries] + [(int(s), 1) for s in cols["seq"][rows].tolist()]
        refs: list = [*entries, *rows.tolist()]
        firsts = np.array([e.step for e in entries] + cols["first"][rows].tolist(), dtype=np.int64)
        smins = np.array([e.smin for e in entries] + cols["smin"][rows].tolist(), dtype=np.int64)
        smaxs = np.array([e.smax for e in entries] + cols["smax"][rows].tolist(), dtype=np.int64)
        if entries and len(rows):
            order = sorted(range(len(keys)), key=keys.__getitem__)
            refs = [refs[i] for i in order]
            firsts, smins, smaxs = firsts[order], smins[order], smaxs[order]
        return refs, firsts, smins, smaxs

    def _chunk_downsampled(self, ref: Entry, max_points: int) -> ScalarSeries:
        """``downsample`` of the points of one chunk, decoding only the steps and walls of the
        points kept (new arrays); an empty series if the chunk is damaged (reported, and left
        out as a full read leaves it out)."""
        data = ref.data if ref.data is not None else self._catalog.load(ref, keep=False)
        try:
            if data is None:
                raise codec.PayloadError("")  # reported by the catalog's load already
            values = codec.scalar_values(data)
            keep = extreme_indices(values, max_points)  # every index when few enough
            return codec.decode_scalars(data, at=keep)
        except codec.PayloadError as exc:
            if data is not None:
                self._catalog.report_damage(ref, str(exc))
            self._kill(ref)
            return ScalarSeries(np.empty(0, np.int64), np.empty(0), np.empty(0))

    def _piece_points(self, ref) -> ScalarSeries | None:
        """The points of one chunk or group part, decoded without keeping them; None if damaged."""
        if not isinstance(ref, int):
            data = ref.data if ref.data is not None else self._catalog.load(ref, keep=False)
            if data is None:
                self._kill(ref)
                return None
            try:
                return codec.decode_scalars(data)
            except codec.PayloadError as exc:
                self._catalog.report_damage(ref, str(exc))
                self._kill(ref)
                return None
        cols = self._parts.cols
        if cols["start"][ref] >= 0:
            return self._parts.slice_of(ref)
        g = int(cols["group"][ref])
        series = self._groups.get(g)
        if series is not None:
            self._groups.move_to_end(g)
        else:
            entry = self._parts.groups[g]
            data = self._catalog.load(entry, keep=False) if entry.length >= 0 else None
            try:
                series = codec.decode_scalars(data) if data is not None else None
            except codec.PayloadError as exc:
                self._catalog.report_damage(entry, str(exc))
                series = None
            if series is None:
                if entry.length >= 0:
                    self._kill(entry)
                return None
            self._groups[g] = series
            self._groups_bytes += sum(col.nbytes for col in series)
            while self._groups_bytes > GROUP_CACHE_BYTES and len(self._groups) > 1:
                _, old = self._groups.popitem(last=False)
                self._groups_bytes -= sum(col.nbytes for col in old)
        lo = int(cols["local"][ref])
        hi = lo + int(cols["count"][ref])
        return ScalarSeries(*(col[lo:hi] for col in series))

    def _parts_points(self, rows: list[int]) -> ScalarSeries | None:
        """The points of consecutive group parts of one tag, concatenated; None if one is
        damaged. Up to PARTS_AT_ONCE parts (a live run's tail holds a part per tag per flush)
        are loaded into the part table, shared by every tag's read, and gathered at once; more
        are read one at a time, keeping nothing."""
        rows_arr = np.array(rows, np.int64)
        if len(rows) <= PARTS_AT_ONCE:
            if not self._parts.load(rows_arr, self._catalog.load):
                self._drop_decoded()
                return None
            return self._parts.gather(rows_arr)
        pieces = [self._piece_points(r) for r in rows]
        return None if any(p is None for p in pieces) else _concat(pieces)

    def iter_scalars(
        self,
        tag: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_chunk_points: int = 65536,
    ) -> Iterator[ScalarSeries]:
        """The points of ``tag`` as :meth:`read_scalars` returns them, a bounded piece at a time.

        Decodes one stored chunk at a time and keeps nothing, so memory stays bounded whatever the
        length of the run: the pieces yielded, concatenated, equal ``read_scalars(tag, start=start,
        end=end)``. Each has between 1 and ``max_chunk_points`` points. Restarts are applied from
        the chunk summaries (only chunks a restart cuts are decoded ahead).

        Raises:
            ValueError: ``max_chunk_points`` is not an int >= 1, or the tag holds only records of
                another kind.
        """
        self._check_open()
        _check_chunk_points(max_chunk_points)
        self._check_scalar_tag(tag)
        return self._pinned(lambda: self._iter_scalars(tag, start, end, max_chunk_points))

    def _pinned(self, make: Callable[[], Iterator[_T]]) -> Iterator[_T]:
        """Run the iterator ``make()`` returns with the run's files held open, so that
        compaction removing them meanwhile does not cut it short."""
        while True:
            try:
                pinned = self._catalog.pin()
                break
            except SourceGone:
                self._rebase()
        catalog = self._catalog
        try:
            yield from make()
        finally:
            catalog.unpin(pinned)

    def iter_scalar_parts(
        self, tag: str, *, max_chunk_points: int = 65536
    ) -> Iterator[tuple[int, Callable[[], ScalarSeries]]]:
        """The points of ``tag`` as :meth:`read_scalars` returns them, in parts of about
        ``max_chunk_points`` points, each decoded only when asked for: ``(count, read)`` pairs.

        A part is consecutive stored chunks (or group parts) of ``count`` stored points in all,
        at most ``max_chunk_points``, or a slice of that many of a larger chunk; ``count`` is
        known without decoding anything. ``read()`` returns the part's points with restarts
        applied: at most ``count`` of them, possibly none (all superseded, or a damaged chunk
        left out). The reads of every pair, in order and concatenated, equal
        ``read_scalars(tag)``. A consumer that wants only some parts (a process formatting
        every other part of an export) skips decoding the others. Call each ``read`` while the
        iterator is suspended at its pair: the run's files are held open until it moves on.

        Raises:
            ValueError: ``max_chunk_points`` is not an int >= 1, or the tag holds only records
                of another kind.
        """
        self._check_open()
        _check_chunk_points(max_chunk_points)
        self._check_scalar_tag(tag)
        return self._pinned(lambda: self._grouped_parts(tag, max_chunk_points))

    def _grouped_parts(
        self, tag: str, limit: int
    ) -> Iterator[tuple[int, Callable[[], ScalarSeries]]]:
        group: list[Callable[[], ScalarSeries]] = []
        held = 0
        pieces = self._scalar_parts(tag, None, None)
        piece = next(pieces, None)
        while piece is not None:
            count, read = piece
            piece = next(pieces, None)  # a group is read before the pieces move past it
            if count <= limit:
                group.append(read)
                held += count
            if group and (count > limit or piece is None or held + piece[0] > limit):
                yield held, partial(_read_all, group)
                group, held = [], 0
            if count > limit:  # written past the chunk size (older runs): sliced, decoded once
                whole = _Once(read)
                for lo in range(0, count, limit):
                    yield min(limit, count - lo), partial(whole.slice, lo, lo + limit)

    def _scalar_parts(
        self, tag: str, start: int | None, end: int | None
    ) -> Iterator[tuple[int, Callable[[], ScalarSeries]]]:
        refs, firsts, smins, smaxs = self._pieces(tag)
        ceil = superseded_from(firsts, smaxs)[1:]
        lo = _I64_MIN if start is None else start
        hi = _I64_MAX if end is None else end
        counts = self._parts.cols["count"]
        for i, ref in enumerate(refs):
            if smaxs[i] < lo or smins[i] > hi or smins[i] >= ceil[i]:
                continue
            count = int(counts[ref]) if isinstance(ref, int) else ref.count
            yield count, partial(self._kept_points, ref, int(ceil[i]), lo, hi)

    def _kept_points(self, ref: Entry | int, ceil: int, lo: int, hi: int) -> ScalarSeries:
        """The points of one piece with steps in ``[lo, hi]`` and below ``ceil`` (where a later
        restart supersedes them); an empty series if the piece is damaged."""
        points = self._piece_points(ref)
        if points is None:
            return ScalarSeries(np.empty(0, np.int64), np.empty(0), np.empty(0))
        steps = points.steps
        keep = (steps < ceil) & (steps >= lo) & (steps <= hi)
        if not keep.all():
            points = ScalarSeries(*(col[keep] for col in points))
        return points

    def _iter_scalars(
        self, tag: str, start: int | None, end: int | None, limit: int
    ) -> Iterator[ScalarSeries]:
        pending: list[ScalarSeries] = []
        held = 0
        for _, read in self._scalar_parts(tag, start, end):
            points = read()
            while len(points.steps):
                room = limit - held
                piece = ScalarSeries(*(col[:room] for col in points))
                pending.append(piece)
                held += len(piece.steps)
                points = ScalarSeries(*(col[room:] for col in points))
                if held == limit:
                    yield _concat(pending)
                    pending, held = [], 0
        if held:
            yield _concat(pending)

    def _downsample_stream(
        self,
        tag: str,
        start: int | None,
        end: int | None,
        max_points: int,
        use_lod: bool = True,
    ) -> ScalarSeries:
        """``downsample(read_scalars(tag, start, end), max_points)``, computed one chunk at a
        time: memory is bounded by a chunk and the buckets, nothing is kept. Chunks wholly in
        range and not cut by a restart are counted from their summaries, and a block chunk with a
        level-of-detail summary is not decoded at all when the buckets are at least two of its
        slices wide: its slices' extremes stand for their points, and only the slices a bucket
        edge (or the first or last point) falls in are read, a column range at a time. A tag of at
        most ``SMALL_DOWNSAMPLE`` points in range is decoded whole and downsampled at once, unless
        the run is a mirror of one in an object store."""
        refs, firsts, smins, smaxs = self._pieces(tag)
        # A mirror fetches what it decodes: there the slices' summaries cost fewer bytes.
        small = 0 if self._catalog.remote else SMALL_DOWNSAMPLE
        if (
            start is None
            and end is None
            and len(refs) == 1
            and not isinstance(refs[0], int)
            and refs[0].count <= max(max_points, small)
            and smaxs[0] < _I64_MAX  # (else the chunk is skipped below)
        ):
            # A tag of one chunk, read whole (a finished run written in bulk: 1,000 of them when
            # 100 runs of a sweep are selected): nothing to cut, skip or bucket, so straight to
            # the pick below, without the pieces' arithmetic (a fifth of such a read's CPU).
            return self._chunk_downsampled(refs[0], max_points)
        ceil = superseded_from(firsts, smaxs)[1:]
        cols = self._parts.cols
        counts = np.array(
            [cols["count"][r] if isinstance(r, int) else r.count for r in refs], np.int64
        )
        lo = _I64_MIN if start is None else start
        hi = _I64_MAX if end is None else end
        skip = (smaxs < lo) | (smins > hi) | (smins >= ceil)
        whole = ~skip & (smins >= lo) & (smaxs <= hi) & (smaxs < ceil)
        cut: dict[int, ScalarSeries | None] = {}  # pieces cut by the range or a restart

        def kept(i: int) -> ScalarSeries | None:
            if i in cut:
                return cut[i]
            points = self._piece_points(refs[i])
            if points is None or whole[i]:
                return points
            st = points.steps
            keep = (st < ceil[i]) & (st >= lo) & (st <= hi)
            cut[i] = ScalarSeries(*(col[keep] for col in points))
            return cut[i]

        sizes = np.where(whole, counts, 0)
        for i in np.flatnonzero(~skip & ~whole).tolist():
            points = kept(i)
            sizes[i] = 0 if points is None else len(points.steps)
        n = int(sizes.sum())
        if n <= max(max_points, small):
            alone = np.flatnonzero(~skip).tolist()
            if len(alone) == 1 and whole[alone[0]] and not isinstance(refs[alone[0]], int):
                # One whole chunk (a bulk-written tag): picked from its values, and only the
                # picks' steps and walls decoded.
                return self._chunk_downsampled(refs[alone[0]], max_points)
            pieces: list[ScalarSeries] = []
            for rows, i in _piece_runs(refs, whole, skip):
                if rows is not None:
                    points = self._parts_points(rows)
                    if points is None:
                        return self._downsample_stream(tag, start, end, max_points, use_lod)
                    pieces.append(points)
                elif (points := kept(i)) is not None:
                    pieces.append(points)  # (a damaged piece is left out, as a full read does)
            if not pieces:
                return ScalarSeries(np.empty(0, np.int64), np.empty(0), np.empty(0))
            return _downsample_pieces(pieces, max_points)
        buckets = (max_points - 2) // 2
        size = -(-(n - 2) // buckets) if buckets else n
        full = (n - 2) // size if buckets else 0
        grid = _Buckets(n, size, full, bool(buckets))
        try:
            g = 0
            for rows, i in _piece_runs(refs, whole, skip):
                if rows is not None:
                    points = self._parts_points(rows)
                    if points is None:
                        return self._downsample_stream(tag, start, end, max_points, use_lod)
                    grid.add_points(points, g)
                    g += len(points.steps)
                    continue
                ref = refs[i]
                if use_lod and whole[i] and not isinstance(ref, int) and ref.lod is not None:
                    lod = self._catalog.load_lod(ref)
                    if lod is not None and size >= 2 * lod.size and buckets:
                        grid.add_lod(_LodChunk(self._catalog, ref, lod), g)
                        g += int(counts[i])
                        continue
                points = kept(i)
                if points is None:
                    # Found damaged while counting whole: the count is off; start over without it.
                    return self._downsample_stream(tag, start, end, max_points, use_lod)
                grid.add_points(points, g)
                g += len(points.steps)
            if g != n:
                return self._downsample_stream(tag, start, end, max_points, use_lod)
            return grid.result()
        except _LodMismatch:
            # A summary disagrees with its chunk's bytes: read the chunks whole (their frame
            # checksums then report any damage).
            return self._downsample_stream(tag, start, end, max_points, use_lod=False)

    def _check_scalar_tag(self, tag: str) -> None:
        entries = self._by_tag.get(tag)
        if (
            entries
            and all(e.kind != codec.SCALARS for e in entries)
            and not len(self._parts.rows_of(tag))
        ):
            raise ValueError(f"tag {tag!r} holds {entries[0].kind!r} records, not scalars")

    def _records_of(self, entry: Entry) -> list[Record]:
        """The records of one entry: one, or one per part of a group chunk; none if damaged."""
        return [r for _, r in self._keyed_records_of(entry)]

    def _keyed_records_of(self, entry: Entry) -> list[tuple[Position, Record]]:
        """The records of one entry, each with its origin (the position just after the record
        it was written as), by which records of different files merge into write order."""
        if entry.length < 0:
            return []
        if entry.batch:
            data = self._load(entry)
            if data is None:
                return []
            try:
                events, origins = blocks.batch_events(data)
            except codec.PayloadError as exc:
                self._catalog.report_damage(entry, str(exc))
                self._kill(entry)
                return []
            to_pos = self._catalog.blocks[entry.src].origins.position
            return [
                (to_pos(int(o)), Record(*ev))
                for ev, o in zip(events, origins.tolist(), strict=True)
            ]
        if entry.kind != codec.SCALARS:
            data = self._load(entry)
            return (
                []
                if data is None
                else [(entry.last, Record(entry.kind, entry.tag, entry.step, entry.wall, data))]
            )
        series = self._scalars_of(entry)
        if series is None:
            return []
        if entry.parts is None:
            return [(entry.first, Record(entry.kind, entry.tag, entry.step, entry.wall, series))]
        tags, counts = entry.parts[0], np.asarray(entry.parts[1])
        ends = np.cumsum(counts).tolist()
        out = []
        for tag, lo, hi in zip(tags, [0, *ends[:-1]], ends, strict=True):
            part = ScalarSeries(*(col[lo:hi] for col in series))
            record = Record(codec.SCALARS, tag, int(part.steps[0]), float(part.walls[0]), part)
            out.append((entry.first, record))
        return out

    def _keyed_records(self, entries: list[Entry]) -> list[tuple[Position, Record]]:
        return [item for e in entries for item in self._keyed_records_of(e)]

    def last_record(self, kind: str) -> Record | None:
        """The newest intact record of a non-scalar ``kind``, or None; reads only that record."""
        self._check_open()

        def newest() -> Record | None:
            found = None
            for e in reversed(self._catalog.entries):
                if e.length >= 0 and e.kind == kind and e.kind != codec.SCALARS:
                    if found is not None and e.last < found[0]:
                        break  # entries are in write order but for a block's records
                    records = self._keyed_records_of(e)
                    if records and (found is None or records[-1][0] > found[0]):
                        found = records[-1]
                    if found is not None and not e.src.startswith("block-"):
                        break
            return None if found is None else found[1]

        return self._retry(newest)

    def read_records(
        self, kind: str | None = None, tag: str | None = None, *, limit: int | None = None
    ) -> list[Record]:
        """Records of ``kind`` and/or ``tag`` (None: any), in write order.

        Scalar chunks are included only when asked for with ``kind="scalars"`` or by their tag.

        Args:
            limit: return at most this many of the records, evenly spread over them and always
                with the last (``np.linspace`` picks over write order), as a dashboard thins a
                long history. With an event ``kind``, only the picked records are decoded, so the
                cost follows ``limit``, not the length of the run.

        Raises:
            ValueError: ``limit`` is not a positive int.
        """
        self._check_open()
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ValueError(f"limit must be a positive int or None, got {limit!r}")
        if limit is not None and kind not in (None, codec.SCALARS):
            return self._retry(lambda: self._read_some_events(kind, tag, limit))
        records = self._retry(lambda: self._read_records(kind, tag))
        return records if limit is None else [records[i] for i in _spread(len(records), limit)]

    def _read_some_events(self, kind: str, tag: str | None, limit: int) -> list[Record]:
        """:meth:`read_records` of an event kind with a ``limit``: counts come from the index
        rows, and a block's batch of events decodes only the events picked from it."""
        pool = self._by_tag.get(tag, []) if tag is not None else self._catalog.entries
        entries = [
            e for e in pool if e.length >= 0 and e.kind == kind and (tag is None or e.tag == tag)
        ]
        # Python's sum: a kind absent or held by a record or two (a run's hparams) is the
        # common case, four times per run of a snapshot.
        counts = [e.count if e.batch else 1 for e in entries]
        total = sum(counts)
        if total <= limit or any(e.window is not None for e in entries):
            records = self._read_records(kind, tag)  # cut batches count what they keep only
            return [records[i] for i in _spread(len(records), limit)]
        picks = _spread(total, limit)
        starts = np.concatenate([[0], np.cumsum(counts)])
        which = np.searchsorted(starts, picks, "right") - 1
        out: list[tuple[Position, Record]] = []
        for i in np.unique(which).tolist():
            entry = entries[i]
            local = picks[which == i] - starts[i]
            if not entry.batch:
                out.extend(self._keyed_records_of(entry))
                continue
            picked = self._picked_events(entry, local)
            if picked is not None:
                out.extend(picked)
                continue
            data = self._load(entry)
            if data is None:
                continue
            try:
                payloads = blocks.batch_payloads(data)
                origins = codec.decode_ints(data["oo"], data["n"])
                decoded = [codec.decode_payload(payloads[j]) for j in local.tolist()]
            except (codec.PayloadError, KeyError, IndexError, TypeError) as exc:
                self._catalog.report_damage(entry, str(exc))
                self._kill(entry)
                continue
            to_pos = self._catalog.blocks[entry.src].origins.position
            out.extend(
                (to_pos(int(origins[j])), Record(*ev))
                for j, ev in zip(local.tolist(), decoded, strict=True)
            )
        return [r for _, r in _in_write_order(out)]

    def _picked_events(
        self, entry: Entry, local: np.ndarray
    ) -> list[tuple[Position, Record]] | None:
        """The events ``local`` of a block's batch, each read alone through the batch's event
        index (its payload checked against the index's crc32); None when the batch has no index
        or anything does not match (the caller reads the batch whole, which reports damage)."""
        if entry.data is not None:
            return None  # held already
        index = self._catalog.load_event_index(entry)
        if index is None:
            return None
        base = entry.offset + framing.FRAME_OVERHEAD - 4  # the batch's payload
        to_pos = self._catalog.blocks[entry.src].origins.position
        out = []
        for j in local.tolist():
            payload = self._catalog.pread(entry, base + int(index.at[j]), int(index.length[j]))
            if zlib.crc32(payload) != int(index.crc[j]):
                return None
            try:
                decoded = codec.decode_payload(payload)
            except codec.PayloadError:
                return None
            if decoded[0] != entry.kind or decoded[1] != entry.tag:
                return None
            out.append((to_pos(int(index.origins[j])), Record(*decoded)))
        return out

    def _read_records(self, kind: str | None, tag: str | None) -> list[Record]:
        if tag is not None and kind not in (None, codec.SCALARS):
            entries = self._by_tag.get(tag, [])
        else:
            entries = self._catalog.entries
        out = []
        for e in entries:
            if e.length < 0 or (kind is not None and e.kind != kind):
                continue
            if kind is None and tag is None and e.kind == codec.SCALARS:
                continue
            if tag is not None and (e.tag != tag if e.parts is None else tag not in e.parts[0]):
                continue
            out.extend(
                item for item in self._keyed_records_of(e) if tag is None or item[1].tag == tag
            )
        return [r for _, r in _in_write_order(out)]

    def iter_records(
        self, from_step: int | None = None, from_wall: float | None = None
    ) -> Iterator[Record]:
        """Every record in write order, for replay.

        Scalar chunks come as ``Record(kind="scalars", tag, step=first step, wall=first wall,
        data=ScalarSeries)``, raw (restarts not applied); a group chunk comes as one such record
        per tag in it. With ``from_step``/``from_wall``, records with a step (or wall time) below
        it are skipped and scalar chunks are cut to the points at or after it; records without a
        step pass the ``from_step`` filter.
        """
        self._check_open()
        yield from self._pinned(
            lambda: self._iter_records(list(self._catalog.entries), from_step, from_wall)
        )

    def _iter_records(
        self, entries: list[Entry], from_step: int | None, from_wall: float | None
    ) -> Iterator[Record]:
        # Records of a block come tag by tag; those of one block are merged into write order
        # by their origins before they are yielded (a block holds a bounded span of the run).
        held: list[tuple[Position, Record]] = []
        src = None
        for e in entries:
            if e.src != src:
                yield from (r for _, r in _in_write_order(held))
                held, src = [], e.src
            held.extend(self._filtered(e, from_step, from_wall))
        yield from (r for _, r in _in_write_order(held))

    def _filtered(
        self, e: Entry, from_step: int | None, from_wall: float | None
    ) -> Iterator[tuple[Position, Record]]:
        if e.length < 0:
            return
        if e.kind == codec.SCALARS:
            if from_step is not None and e.smax < from_step:
                return
        elif not e.batch and (
            (from_step is not None and e.step is not None and e.step < from_step)
            or (from_wall is not None and e.wall < from_wall)
        ):
            return
        for key, record in self._keyed_records_of(e):
            if e.batch and (
                (from_step is not None and record.step is not None and record.step < from_step)
                or (from_wall is not None and record.wall < from_wall)
            ):
                continue
            if e.kind == codec.SCALARS and (from_step is not None or from_wall is not None):
                s = record.data
                keep = np.ones(len(s.steps), dtype=bool)
                if from_step is not None:
                    keep &= s.steps >= from_step
                if from_wall is not None:
                    keep &= s.walls >= from_wall
                if not keep.any():
                    continue
                if not keep.all():
                    s = ScalarSeries(*(col[keep] for col in s))
                    record = Record(e.kind, record.tag, int(s.steps[0]), float(s.walls[0]), s)
            yield key, record

    @property
    def meta(self) -> dict:
        """The data of every ``kind="meta"`` record merged in write order (later keys win)."""
        self._check_open()

        def merged() -> dict:
            entries = self._catalog.entries
            new = [e for e in entries[self._meta_done :] if e.kind == "meta" and e.length >= 0]
            for _, record in _in_write_order(self._keyed_records(new)):
                if isinstance(record.data, dict):
                    self._meta.update(record.data)
            self._meta_done = len(entries)
            return dict(self._meta)

        return self._retry(merged)

    def statistics(self) -> ReaderStatistics:
        """Counters of what was read (see :class:`ReaderStatistics`)."""
        c = self._catalog
        live = [e for e in c.entries if e.length >= 0]
        return ReaderStatistics(
            records=sum(e.count if e.batch else 1 for e in live),
            scalar_points=sum(e.count for e in live if e.kind == codec.SCALARS),
            corrupt_records=c.damaged_records,
            corrupt_bytes=c.damaged_bytes,
            pending_bytes=c.pending_bytes,
            segments=len(c.segments) + sum(len(b.footer.segments) for b in c.blocks.values()),
            bytes_read=c.bytes_read,
            index_used=c.index_used,
        )

    def close(self) -> None:
        """Close the segment files. Idempotent."""
        if not self._closed:
            self._closed = True
            self._catalog.close()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A reader dropped without close() (a follower a server forgot) still releases its
        # descriptors; a long-lived process would otherwise run out of them.
        if not getattr(self, "_closed", True):
            self.close()


class _LodMismatch(Exception):
    """A chunk's bytes do not match the checksums in its summary."""


class _LodChunk:
    """Reads single slices of a block chunk's columns, checked against its summary."""

    def __init__(self, catalog: Catalog, entry: Entry, lod: blocks.Lod) -> None:
        self.catalog = catalog
        self.entry = entry
        self.lod = lod
        # Where the chunk's payload starts (after the frame's length and its checksum).
        self.base = entry.offset + framing.FRAME_OVERHEAD - 4

    def _bounds(self, j: int) -> tuple[int, int]:
        size = self.lod.size
        return j * size, min((j + 1) * size, self.lod.n)

    def read_slices(self, slices: list[int]) -> np.ndarray:
        """The values of the given slices, concatenated (one pread each, on one descriptor)."""
        fd = self.catalog.fd_of(self.entry)
        size = self.lod.size
        start = self.base + self.lod.cv
        parts = []
        for j in slices:
            a, b = j * size, min((j + 1) * size, self.lod.n)
            if fd is None:
                data = self.catalog.pread(self.entry, start + 8 * a, 8 * (b - a))
            else:
                data = os.pread(fd, 8 * (b - a), start + 8 * a)
                self.catalog.bytes_read += len(data)
            if zlib.crc32(data) != int(self.lod.crc[j]):
                raise _LodMismatch(self.entry.src)
            parts.append(data)
        return np.frombuffer(b"".join(parts), "<f8")

    def steps_walls(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """The steps and wall times of slice ``j``."""
        a, b = self._bounds(j)
        cs, cw = self.lod.cs, self.lod.cw
        sdata = b""
        if cs[0] == "range":
            steps = cs[1] + cs[2] * np.arange(a, b, dtype=np.int64)
        else:
            width = 4 if cs[0] == "u4" else 8
            rel = cs[2] if width == 4 else cs[1]
            sdata = self.catalog.pread(self.entry, self.base + rel + width * a, width * (b - a))
        wwidth = 4 if cw[0] == "us" else 8
        wrel = cw[2] if wwidth == 4 else cw[1]
        wdata = self.catalog.pread(self.entry, self.base + wrel + wwidth * a, wwidth * (b - a))
        if zlib.crc32(sdata + wdata) != int(self.lod.crcsw[j]):
            raise _LodMismatch(self.entry.src)
        if cs[0] == "u4":
            steps = np.frombuffer(sdata, "<u4").astype(np.int64) + cs[1]
        elif cs[0] == "i8":
            steps = np.frombuffer(sdata, "<i8")
        # exactly as codec.decode_scalars computes them
        walls = codec.decode_us(wdata, cw[1]) if wwidth == 4 else np.frombuffer(wdata, "<f8")
        return steps, walls


class _Buckets:
    """The buckets of :func:`recorder.downsample.extreme_indices` over ``n`` points, filled
    with candidates for each bucket's minimum and maximum: points, or a summary slice's extremes
    (which stand for the slice's points when the slice lies in one bucket). In order of index,
    the first minimum (maximum) among a bucket's candidates is the first of its points, which is
    what np.argmin (argmax) picks (NaN first)."""

    # Points of consecutive decoded pieces gathered before they are bucketed (bounds memory).
    GATHER = 1 << 16

    def __init__(self, n: int, size: int, full: int, any_buckets: bool) -> None:
        self.n, self.size, self.full, self.any = n, size, full, any_buckets
        # Candidate columns, as lists of arrays: global index, value, step, wall, and for a
        # candidate whose step and wall are still to be read, its chunk (index into
        # self.chunks), slice and local index (chunk -1: read already).
        self.cand: dict[str, list[tuple]] = {"min": [], "max": [], "ends": []}
        self.chunks: list[_LodChunk] = []
        self._at: list[int] = []  # global index of each chunk's first point
        self._held: list[ScalarSeries] = []
        self._held_at = 0  # global index of the first point held
        self._held_n = 0

    def _bucket_of(self, index: np.ndarray) -> np.ndarray:
        return np.minimum((index - 1) // self.size, self.full)

    def add_points(self, points: ScalarSeries, g: int) -> None:
        """Add decoded points at global indices ``g, g + 1, ...``."""
        if self._held and self._held_at + self._held_n != g:
            self._flush()
        if not self._held:
            self._held_at = g
        self._held.append(points)
        self._held_n += len(points.steps)
        if self._held_n >= self.GATHER:
            self._flush()

    def _flush(self) -> None:
        if not self._held:
            return
        steps, walls, values = self._held[0] if len(self._held) == 1 else _concat(self._held)
        g = self._held_at
        self._held, self._held_n = [], 0
        for name, pos in self._extremes(g, values).items():
            none = np.full(len(pos), -1, np.int64)
            self.cand[name].append((pos + g, values[pos], steps[pos], walls[pos], none, none, none))

    def _extremes(self, g: int, values: np.ndarray) -> dict[str, np.ndarray]:
        """Positions in ``values`` (the points at global indices ``g, g + 1, ...``) of the first
        and last point if there, and of each bucket's first minimum and first maximum among
        them: whole buckets by one argmin/argmax over a (buckets, size) view, the cut ones at the
        ends alone."""
        k = len(values)
        ends = [p for p in (-g, self.n - 1 - g) if 0 <= p < k]
        out = {"ends": np.array(sorted(set(ends)), np.int64)}
        a, b = max(g, 1), min(g + k, self.n - 1)  # inner points: [a, b)
        if not self.any or a >= b:
            return out
        size, full = self.size, self.full
        last = 1 + full * size  # where the last bucket (the rest) starts
        cuts = [a]
        edge = 1 + ((a - 1) // size + 1) * size  # the next bucket's start after a
        whole = None
        if edge < min(b, last):
            cuts.append(edge)
            stop = min(b, last)
            count = (stop - edge) // size
            if count:
                whole = (edge, count)
                cuts.append(edge + count * size)
        if a < last < b:
            cuts.append(last)
        cuts = [*sorted({c for c in cuts if a <= c < b}), b]
        lows, highs = [], []
        for lo, hi in itertools.pairwise(cuts):
            seg = values[lo - g : hi - g]
            if whole is not None and lo == whole[0]:
                grid = seg.reshape(whole[1], size)
                base = np.arange(whole[1], dtype=np.int64) * size + (lo - g)
                lows.append(grid.argmin(axis=1) + base)
                highs.append(grid.argmax(axis=1) + base)
            else:
                lows.append(np.array([int(seg.argmin()) + lo - g]))
                highs.append(np.array([int(seg.argmax()) + lo - g]))
        out["min"], out["max"] = np.concatenate(lows), np.concatenate(highs)
        return out

    def add_lod(self, chunk: _LodChunk, g: int) -> None:
        """Add a block chunk's points at global indices ``g, g + 1, ...`` from its summary
        (chunks are taken in by :meth:`result`, all at once)."""
        self.chunks.append(chunk)
        self._at.append(g)

    def _take_chunks(self) -> None:
        """The extremes of the summary slices that lie in one bucket, and of the points of the
        others that may hold a bucket's minimum or maximum (read one slice at a time)."""
        groups = []
        for size in sorted({c.lod.size for c in self.chunks}):
            which = [i for i, c in enumerate(self.chunks) if c.lod.size == size]
            lods = [self.chunks[i].lod for i in which]
            counts = np.array([len(lod.imin) for lod in lods], np.int64)
            chunk_of = np.repeat(np.array(which, np.int64), counts)
            slice_of = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            n_of = np.repeat(np.array([lod.n for lod in lods], np.int64), counts)
            at = np.repeat(np.array([self._at[i] for i in which], np.int64), counts)
            starts = slice_of * size
            stops = np.minimum(starts + size, n_of)
            first, last = at + starts, at + stops - 1  # global indices of each slice's ends
            split = (first == 0) | (last == self.n - 1)
            if self.any:
                split |= self._bucket_of(first) != self._bucket_of(last)
            cut = np.flatnonzero(split)
            groups.append((lods, cut, (chunk_of, slice_of, starts, stops, first, last)))
            if not self.any:
                continue
            clean = np.flatnonzero(~split)
            none = np.full(len(clean), -1, np.int64)
            for name in ("min", "max"):
                cols = [
                    np.concatenate([getattr(lod, col + name) for lod in lods])[clean]
                    for col in ("i", "v", "s", "w")
                ]
                self.cand[name].append((at[clean] + cols[0], *cols[1:], none, none, none))
        bests = self._bests() if self.any else None
        for lods, cut, rows in groups:
            if bests is not None and len(cut):
                cut = cut[self._may_matter(lods, cut, rows[4], rows[5], *bests)]
            if len(cut):
                self._take_cut(cut, *rows)

    def _bests(self) -> tuple[np.ndarray, np.ndarray]:
        """Each bucket's least and greatest candidate value so far (NaN if one is NaN; +inf and
        -inf for a bucket without candidates)."""
        out = []
        for name, reduce, none in (("min", np.minimum, np.inf), ("max", np.maximum, -np.inf)):
            best = np.full(self.full + 1, none)
            for index, values, *_ in self.cand[name]:
                inner = (index > 0) & (index < self.n - 1)
                with np.errstate(invalid="ignore"):  # a NaN propagates (no warning wanted)
                    reduce.at(best, self._bucket_of(index[inner]), values[inner])
            out.append(best)
        return out[0], out[1]

    def _may_matter(self, lods, cut, first, last, low, high) -> np.ndarray:
        """Which of the slices ``cut`` (each across a bucket edge, or holding the first or the
        last point) must be read: one holding an end, or whose summary extreme may be the
        minimum or maximum of a bucket it lies in, given the other candidates (``low`` and
        ``high`` from :meth:`_bests`). A slice whose minimum is above a bucket's least candidate
        holds none of the bucket's first minimum (ties and NaN are read: the first of equal
        values, or a NaN, may lie in it), and likewise for the maximum; so skipping it changes
        nothing in the result."""
        vmin = np.concatenate([lod.vmin for lod in lods])[cut]
        vmax = np.concatenate([lod.vmax for lod in lods])[cut]
        f, l = first[cut], last[cut]  # noqa: E741
        need = (f == 0) | (l == self.n - 1) | np.isnan(vmin) | np.isnan(vmax)
        for index in (np.maximum(f, 1), np.minimum(l, self.n - 2)):  # the buckets it lies in
            b = np.clip(self._bucket_of(index), 0, self.full)
            need |= ~np.isnan(low[b]) & (vmin <= low[b])
            need |= ~np.isnan(high[b]) & (vmax >= high[b])
        return need

    def _take_cut(self, cut, chunk_of, slice_of, starts, stops, first, last) -> None:
        """The points of the slices ``cut`` (rows of the other arrays), read one slice at a time:
        each slice is cut where a bucket starts, and where the inner points start (index 1) and
        end (index n - 1); each piece's first minimum and first maximum are candidates (a piece
        holding the first or the last point is that point alone)."""
        values = np.concatenate(
            [
                self.chunks[c].read_slices(js)
                for c, js in _runs_by_chunk(chunk_of[cut], slice_of[cut])
            ]
        )
        lengths = stops[cut] - starts[cut]
        offsets = np.cumsum(lengths) - lengths
        f, l = first[cut], last[cut]  # noqa: E741
        # Where pieces start, as global indices: each slice's start, and the edges inside it.
        edges = [f]
        if self.any:
            k = np.minimum((l - 1) // self.size, self.full)  # the last bucket starting in it
            edge = 1 + k * self.size
            edges.append(np.where((k >= 1) & (edge > f) & (edge <= l), edge, f))
        for point in (1, self.n - 1):
            edges.append(np.where((f < point) & (point <= l), point, f))
        at = np.unique(np.concatenate([e - f + offsets for e in edges]))  # positions in values
        lows, highs = _segment_extremes(values, at)
        piece_slice = np.searchsorted(offsets, at, "right") - 1
        for name, pos in (("min", lows), ("max", highs)):
            k = piece_slice
            index = f[k] + pos - offsets[k]
            if not self.any:
                keep = (index == 0) | (index == self.n - 1)
                pos, k, index = pos[keep], k[keep], index[keep]
            zeros = np.zeros(len(pos), np.int64)
            self.cand[name].append(
                (index, values[pos], zeros, zeros.astype(np.float64), chunk_of[cut][k],
                 slice_of[cut][k], starts[cut][k] + pos - offsets[k])
            )  # fmt: skip

    def result(self) -> ScalarSeries:
        """The points picked: the first, the last, and each bucket's minimum and maximum."""
        self._flush()
        self._take_chunks()
        picked = []
        for name in ("ends", "min", "max"):
            if not self.cand[name]:
                continue
            cols = [np.concatenate(c) for c in zip(*self.cand[name], strict=True)]
            if name != "ends":
                order = np.argsort(cols[0], kind="stable")
                cols = [c[order] for c in cols]
                bucket = self._bucket_of(cols[0])
                bucket[cols[0] == 0] = -1  # the first and the last point: buckets of their own
                bucket[cols[0] == self.n - 1] = self.full + 1
                heads = _segment_extremes(cols[1], _run_starts(bucket))[name == "max"]
                cols = [c[heads] for c in cols]
            picked.append(cols)
        g, v, s, w, c, j, loc = (np.concatenate(col) for col in zip(*picked, strict=True))
        g, first = np.unique(g, return_index=True)
        v, s, w, c, j, loc = (col[first] for col in (v, s, w, c, j, loc))
        pending = np.flatnonzero(c >= 0)
        if len(pending):
            key = c[pending] * (1 << 32) + j[pending]
            order = np.argsort(key, kind="stable")
            for run in np.split(pending[order], _run_starts(key[order])[1:]):
                ci, ji = int(c[run[0]]), int(j[run[0]])
                steps, walls = self.chunks[ci].steps_walls(ji)
                p = loc[run] - ji * self.chunks[ci].lod.size
                s[run], w[run] = steps[p], walls[p]
        return ScalarSeries(s.astype(np.int64), w.astype(np.float64), v)


def _runs_by_chunk(chunks: np.ndarray, slices: np.ndarray) -> Iterator[tuple[int, list[int]]]:
    """``(chunk, its slices)`` for each run of equal consecutive ``chunks``."""
    bounds = [*_run_starts(chunks).tolist(), len(chunks)]
    for a, b in itertools.pairwise(bounds):
        yield int(chunks[a]), slices[a:b].tolist()


def _run_starts(keys: np.ndarray) -> np.ndarray:
    """Where each run of equal consecutive ``keys`` starts."""
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])


def _segment_extremes(values: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per segment of ``values`` (segments start at ``starts``), the position of its first
    minimum and of its first maximum, as np.argmin/np.argmax pick them (NaN first)."""
    ends = np.r_[starts[1:], len(values)]
    nan = np.isnan(values)
    out = []
    for reduce in (np.minimum, np.maximum):
        best = np.repeat(reduce.reduceat(values, starts), ends - starts)  # NaN propagates
        hit = np.flatnonzero((values == best) | (nan & np.isnan(best)))
        out.append(hit[np.searchsorted(hit, starts)])
    return out[0], out[1]


def _spread(n: int, limit: int) -> np.ndarray:
    """Indices of at most ``limit`` of ``n`` items, evenly spread, the first and last included."""
    if n <= limit:
        return np.arange(n)
    return np.linspace(0, n - 1, limit).round().astype(np.int64)


def _in_write_order(items: list[tuple[Position, Record]]) -> list[tuple[Position, Record]]:
    """Records keyed by origin, sorted into write order (stable: parts of a group keep theirs)."""
    if all(items[i][0] <= items[i + 1][0] for i in range(len(items) - 1)):
        return items
    return sorted(items, key=lambda item: item[0])


def _downsample_pieces(pieces: list[ScalarSeries], max_points: int) -> ScalarSeries:
    """``downsample(_concat(pieces), max_points)``, copying only the points kept: the values
    are joined (or, one piece, used as they are) to pick the points, and the steps and walls are
    taken at the picks alone (a sweep's 10,000-point tag read for 200 points copies 200 of each,
    not 10,000). The result never shares memory with the pieces."""
    if len(pieces) == 1:
        whole = pieces[0]
        if len(whole.values) <= max_points:
            return _concat(pieces)
        keep = extreme_indices(whole.values, max_points)
        return ScalarSeries(whole.steps[keep], whole.walls[keep], whole.values[keep])
    values = np.concatenate([p.values for p in pieces])
    if len(values) <= max_points:
        return _concat(pieces)
    keep = extreme_indices(values, max_points)
    # Which piece each pick is in, and where in it.
    bounds = np.cumsum([len(p.values) for p in pieces])
    which = np.searchsorted(bounds, keep, side="right")
    at = keep - np.concatenate(([0], bounds[:-1]))[which]
    steps = np.empty(len(keep), np.int64)
    walls = np.empty(len(keep), np.float64)
    for j in np.unique(which).tolist():
        mine = which == j
        steps[mine] = pieces[j].steps[at[mine]]
        walls[mine] = pieces[j].walls[at[mine]]
    return ScalarSeries(steps, walls, values[keep])


def _read_all(reads: list[Callable[[], ScalarSeries]]) -> ScalarSeries:
    """The points of consecutive pieces, read in turn (one piece's own arrays when one)."""
    if len(reads) == 1:
        return reads[0]()
    return _concat([read() for read in reads])


class _Once:
    """A piece's points, decoded at the first slice asked for and kept for the others (the
    slices of one piece are read in turn, then this is dropped)."""

    def __init__(self, read: Callable[[], ScalarSeries]) -> None:
        self._read: Callable[[], ScalarSeries] | None = read
        self._points: ScalarSeries | None = None

    def slice(self, lo: int, hi: int) -> ScalarSeries:
        if self._points is None:
            assert self._read is not None
            self._points, self._read = self._read(), None
        return ScalarSeries(*(col[lo:hi] for col in self._points))


def _concat(pieces: list[ScalarSeries]) -> ScalarSeries:
    """One series of the pieces, copied (never a view of a decoded buffer)."""
    return ScalarSeries(*(np.concatenate(cols) for cols in zip(*pieces, strict=True)))


def list_runs(logdir: str | os.PathLike[str]) -> list[str]:
    """Names of the runs under ``logdir``, relative and "/"-separated (e.g. ``"exp1/train"``), sorted.

    A run is a directory holding segment files; runs may be nested at any depth. ``logdir`` itself
    is not listed. A missing ``logdir`` has no runs.

    Raises:
        NotADirectoryError: ``logdir`` exists but is not a directory.
    """
    root = os.fspath(logdir)
    if not os.path.exists(root):
        return []
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root}: logdir is not a directory")
    runs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        if rel != "." and any(SEGMENT_RE.match(name) for name in filenames):
            runs.append(rel.replace(os.sep, "/"))
    return sorted(runs)


def _check_chunk_points(max_chunk_points: object) -> None:
    """Refuse a ``max_chunk_points`` that is not an int >= 1 (a bool is not one)."""
    if (
        not isinstance(max_chunk_points, int)
        or isinstance(max_chunk_points, bool)
        or max_chunk_points < 1
    ):
        raise ValueError(f"max_chunk_points must be an int >= 1, got {max_chunk_points!r}")
