"""RunWriter: appends records to a run directory, with an explicit fsync schedule."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import math
import numbers
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from recorder import codec, framing
from recorder.catalog import INDEX_NAME, Catalog, Entry, encode_index, list_segments, segment_name
from recorder.compaction import (
    MIN_RECORDS,
    SMALL_RECORD,
    CompactionProcess,
    Compactor,
    SegmentCapture,
)
from recorder.digest import LATEST_MAX_BYTES, Digest, data_files, load_digest, write_digest
from recorder.preview import PREVIEW_TAG_POINTS, write_preview
from recorder.records import NotARunError, Position, RecorderError, RunLockedError, ScalarSeries

SYNC_MODES = ("flush", "interval", "never")
# Points of one tag coalesced into one on-disk chunk, at most.
CHUNK_POINTS = 1 << 16
# Tags with fewer points than this pending at a flush share one group chunk (when there are two or
# more of them), so frequent small flushes do not cost a record per tag.
GROUP_BELOW = 256
# Index rows a writer keeps in memory, at most; a run with more records gets no new index (readers
# then scan the segments past the old index, if any), so a long-lived writer stays bounded.
INDEX_MAX_ROWS = 1_000_000
# Buffered bytes (estimated) above which an append writes the buffer to the OS on its own.
BUFFER_BYTES = 32 << 20
# Records in the current segment at which flush() seals it and compacts it into a block: at most
# this many records are scanned by a reader opening the run (about 20 s of a live run).
COMPACT_RECORDS = 2048
# Units of compaction work (a sealed segment, a full group of blocks) a writer opened with
# ``defer_compaction=True`` lets wait for :meth:`RunWriter.compact`; past it, flush() does the
# excess itself, so a writer that is never given an idle moment still compacts and its run stays
# quick to open (at most this many extra segments of small records to scan).
DEFERRED_MAX = 4


@dataclass(frozen=True)
class WriterStatistics:
    """Counters of a :class:`RunWriter` since it was opened.

    Attributes:
        records: records written to the OS (a scalar chunk counts once).
        scalar_points: scalar points written to the OS.
        pending_records: records buffered, not yet written (scalar chunks not counted).
        pending_points: scalar points buffered, not yet written.
        bytes: bytes written to segments (headers included).
        segments: segment files in the run.
        fsyncs: fsync calls made on segment files.
        flushes: calls to :meth:`RunWriter.flush` (explicit or from sync/close).
        truncated_bytes: bytes of torn tail cut off when the run was reopened.
        position: end of the flushed data.
        compactions: segments compacted into blocks.
        merges: blocks merged into larger ones.
        compaction_seconds: CPU time spent compacting and merging (the CPU of the threads that
            ran the units, whichever they were).
        compaction_backlog: units of compaction work waiting (sealed segments, full groups of
            blocks to merge); only a writer opened with ``defer_compaction=True`` lets any wait
            past a flush.
        inline_compactions: units of compaction work (segments compacted, merges) done inside
            :meth:`RunWriter.flush` or :meth:`RunWriter.sync` rather than :meth:`RunWriter.compact`
            or :meth:`RunWriter.close`.
    """

    records: int
    scalar_points: int
    pending_records: int
    pending_points: int
    bytes: int
    segments: int
    fsyncs: int
    flushes: int
    truncated_bytes: int
    position: Position
    compactions: int = 0
    merges: int = 0
    compaction_seconds: float = 0.0
    compaction_backlog: int = 0
    inline_compactions: int = 0


class _PendingScalars:
    """Points of one tag waiting to be written as one chunk (or a few, past CHUNK_POINTS)."""

    __slots__ = ("count", "smax", "steps", "tag", "values", "walls")

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.steps: list[np.ndarray] = []
        self.walls: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.count = 0
        self.smax: int | None = None

    def add(
        self, steps: np.ndarray, walls: np.ndarray, values: np.ndarray, top: int | None = None
    ) -> None:
        """Add a column of points; ``top`` is its largest step where the caller knows it."""
        self.steps.append(steps)
        self.walls.append(walls)
        self.values.append(values)
        self.count += len(steps)
        if top is None:
            top = int(steps.max())
        self.smax = top if self.smax is None else max(self.smax, top)

    def encode(self) -> list[tuple[bytes, tuple, None, tuple, tuple]]:
        """Encoded chunks, each with its entry fields ``(kind, tag, step, wall, count, smin, smax,
        vmin, vmax)``, no part rows, and its points ``([tag], [count], steps, walls, values)``
        (twice: for compaction and for the digest)."""
        steps = np.concatenate(self.steps) if len(self.steps) > 1 else self.steps[0]
        walls = np.concatenate(self.walls) if len(self.walls) > 1 else self.walls[0]
        values = np.concatenate(self.values) if len(self.values) > 1 else self.values[0]
        out = []
        for lo in range(0, self.count, CHUNK_POINTS):
            hi = lo + CHUNK_POINTS
            s, w = steps[lo:hi], walls[lo:hi]
            v = values[lo:hi]
            payload, (smin, smax, vmin, vmax) = codec.encode_scalars(self.tag, s, w, v)
            fields = (
                codec.SCALARS,
                self.tag,
                int(s[0]),
                float(w[0]),
                len(s),
                smin,
                smax,
                vmin,
                vmax,
            )
            points = ([self.tag], [len(s)], s, w, v)
            out.append((payload, fields, None, points, points))
        return out


class _PendingGroup:
    """Small pending slots of several tags, written as one group chunk."""

    __slots__ = ("slots",)

    def __init__(self, slots: list[_PendingScalars]) -> None:
        self.slots = slots

    def encode(self) -> list[tuple[bytes, tuple, list, tuple, tuple]]:
        """The encoded group chunk with its entry fields, part columns, its points ``(tags,
        counts, steps, walls, values)``, and the same points for the digest (a few points as
        Python lists, see :func:`codec.encode_small_group`)."""
        slots = self.slots
        series = ScalarSeries(
            np.concatenate([a for slot in slots for a in slot.steps]),
            np.concatenate([a for slot in slots for a in slot.walls]),
            np.concatenate([a for slot in slots for a in slot.values]),
        )
        return _encode_group([slot.tag for slot in slots], [slot.count for slot in slots], series)


class _PendingBatch:
    """The scalars of one :meth:`RunWriter.append_scalar_batch` call that will make a group
    chunk on their own, as they are: several distinct tags of fewer than ``GROUP_BELOW`` points
    each, appended when no scalar was pending. Until another scalar append comes (which turns
    it into one slot per tag, :meth:`slots`), nothing per tag is built: for a live batch of a
    few points a tag that was most of the append's cost."""

    __slots__ = ("counts", "series", "tags")

    def __init__(self, tags: list[str], counts: list[int], series: ScalarSeries) -> None:
        self.tags = tags
        self.counts = counts
        self.series = series

    def slots(self) -> list[_PendingScalars]:
        """One slot per tag, as :meth:`RunWriter.append_scalars` would have made them."""
        out = []
        steps, walls, values = self.series
        lo = 0
        for tag, count in zip(self.tags, self.counts, strict=True):
            hi = lo + count
            slot = _PendingScalars(tag)
            slot.add(steps[lo:hi], walls[lo:hi], values[lo:hi])
            out.append(slot)
            lo = hi
        return out

    def encode(self) -> list[tuple[bytes, tuple, list, tuple, tuple]]:
        """As :meth:`_PendingGroup.encode`, from the joined columns with no copy."""
        return _encode_group(self.tags, self.counts, self.series)


def _encode_group(
    tags: list[str], counts: list[int], series: ScalarSeries
) -> list[tuple[bytes, tuple, list, tuple, tuple]]:
    """A group chunk of ``counts[i]`` points of each ``tags[i]``, as :meth:`_PendingGroup.encode`
    returns it."""
    points = (tags, counts, *series)
    small = None
    if len(series.steps) <= codec.SMALL_GROUP_POINTS:
        small = codec.encode_small_group(tags, counts, series)
    if small is not None:
        payload, (smin, smax, vmin, vmax), rows, lists = small
        summary_points = (tags, counts, *lists)  # the digest reads them as Python numbers
    else:
        payload, (smin, smax, vmin, vmax), rows = codec.encode_group_series(tags, counts, series)
        summary_points = points
    fields = (
        codec.SCALARS, None, int(series.steps[0]), float(series.walls[0]),
        len(series.steps), smin, smax, vmin, vmax,
    )  # fmt: skip
    return [(payload, fields, rows, points, summary_points)]


def _group_small(queue: list) -> list:
    """Replace the small scalar slots of ``queue`` by one group at the place of the first.

    Only tags with a single slot in the queue are grouped, so each tag's chunks stay in the order
    they were appended (a restart must come after the points it supersedes).
    """
    slots = [item for item in queue if isinstance(item, _PendingScalars)]
    per_tag = Counter(slot.tag for slot in slots)
    small = [
        i
        for i, item in enumerate(queue)
        if isinstance(item, _PendingScalars) and item.count < GROUP_BELOW and per_tag[item.tag] == 1
    ]
    if len(small) < 2:
        return queue
    group = _PendingGroup([queue[i] for i in small])
    drop = set(small[1:])
    out = [item for i, item in enumerate(queue) if i not in drop]
    out[small[0]] = group
    return out


def _array(name: str, value: Any, dtype: type) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if dtype is np.int64 and arr.dtype.kind not in "iu" and len(arr):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if dtype is np.float64 and arr.dtype.kind not in "iuf" and len(arr):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if arr.dtype == dtype and _frozen(arr):
        return arr  # nobody can change it while it waits for the flush: no copy
    return np.array(arr, dtype=dtype)  # a copy: the caller may reuse its buffers


def _frozen(arr: np.ndarray) -> bool:
    """Whether ``arr``'s memory cannot change: read-only down to its owner, which is the array
    itself or an immutable ``bytes`` (a decoded frame)."""
    owner: object = arr
    while isinstance(owner, np.ndarray):
        if owner.flags.writeable:
            return False
        owner = owner.base
    return owner is None or isinstance(owner, bytes)


class RunWriter:
    """Appends records to the run directory ``run_dir``.

    Creates the directory if missing. If it already holds segments, the run is reopened for
    append: a torn tail (an incomplete last record, left by a crash) is truncated back to the last
    valid record first. One writer per run at a time (an advisory lock on its ``writer.lock``).

    Durability: :meth:`append_scalars` and :meth:`append_record` only buffer. :meth:`flush` hands
    the buffer to the OS (readers see it; it survives the process being killed, not a power loss)
    and fsyncs according to ``sync``. :meth:`sync` and :meth:`close` fsync always (close: unless
    ``sync="never"``); after they return the data is durable.

    Args:
        run_dir: the run directory.
        sync: ``"flush"``: every flush() fsyncs; ``"interval"``: a flush() fsyncs when at least
            ``sync_interval`` seconds passed since the last fsync; ``"never"``: only sync() does.
        sync_interval: seconds, for ``sync="interval"``.
        segment_bytes: a segment is closed and a new one started before it would grow past this
            (a single larger record gets a segment of its own).
        compact_records: when the current segment holds this many records, ``flush()`` (or
            ``sync()``) seals it and compacts it into a block (large columnar chunks, events in
            batches, an index with chunk summaries), so that opening the run reads block indexes
            and at most this many records; ``close()`` compacts the rest once the run has blocks.
            None: never compact (the run is then read as written).
        defer_compaction: False (the default): ``flush()``/``sync()`` compact what they seal,
            inline. True: they only seal and queue it, and the owner calls :meth:`compact` when
            it has time (a server between writes, or a thread of its own: :meth:`compact` may
            run beside appends and flushes), so a flush never waits for compaction, unless more
            than ``DEFERRED_MAX`` units of work wait: then the flush does the excess itself
            (while another thread runs a unit, only past ``2 * DEFERRED_MAX``). ``close()``
            compacts what waits either way.
        compaction_process: build compaction's new blocks in this process of its own (shared
            by any number of writers; see :class:`~recorder.CompactionProcess`), wherever a
            unit runs (:meth:`compact`, a flush past the bound, :meth:`close`), so that their
            CPU is off this process's GIL: the process reads its input back from the files and
            writes the block under a temporary name, and this writer swaps it in. Until the
            process is ready, and if it dies (it is started again), units are built here.
            None (the default): always here.

    Threads: one thread at a time appends, flushes, syncs and closes; :meth:`compact` alone may
    be called from another thread meanwhile (see there).

    Raises:
        ValueError: a bad argument.
        RecorderError: ``run_dir`` is a file, or the run is open in another writer.
        FormatError: an existing segment is not readable by this version.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        sync: str = "interval",
        sync_interval: float = 1.0,
        segment_bytes: int = 64 << 20,
        compact_records: int | None = COMPACT_RECORDS,
        defer_compaction: bool = False,
        compaction_process: CompactionProcess | None = None,
    ) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, got {sync!r}")
        if (
            not isinstance(sync_interval, numbers.Real)
            or isinstance(sync_interval, bool)
            or not sync_interval >= 0
        ):
            raise ValueError(f"sync_interval must be a number >= 0, got {sync_interval!r}")
        if not isinstance(segment_bytes, int) or segment_bytes <= framing.HEADER_SIZE:
            raise ValueError(
                f"segment_bytes must be an int > {framing.HEADER_SIZE}, got {segment_bytes!r}"
            )
        if compact_records is not None and (
            not isinstance(compact_records, int)
            or isinstance(compact_records, bool)
            or compact_records < 1
        ):
            raise ValueError(
                f"compact_records must be None or an int >= 1, got {compact_records!r}"
            )
        if not isinstance(defer_compaction, bool):
            raise ValueError(f"defer_compaction must be a bool, got {defer_compaction!r}")
        self._dir = os.fspath(run_dir)
        self._compact_records = compact_records
        self._defer = defer_compaction
        if compaction_process is not None and not isinstance(compaction_process, CompactionProcess):
            raise ValueError(
                f"compaction_process must be None or a CompactionProcess, got {compaction_process!r}"
            )
        self._process = compaction_process
        self._inline = 0
        self._compaction: Compactor | None = None
        self._fresh: SegmentCapture | None = None
        self._seg_records = 0
        self._sync_mode = sync
        self._sync_interval = float(sync_interval)
        self._segment_bytes = segment_bytes
        self._closed = True
        # Encoded events as (payload, entry fields), and per-tag scalar slots, in append order.
        self._queue: list[
            tuple[bytes, tuple] | _PendingScalars | _PendingGroup | _PendingBatch
        ] = []
        self._open_slots: dict[str, _PendingScalars] = {}
        # The queue's _PendingBatch, if any, and its place: at most one, and no slot beside it.
        self._batch: _PendingBatch | None = None
        self._batch_at = 0
        self._pending_bytes = 0
        self._pending_points = 0
        self._pending_records = 0
        self._records = self._points = self._bytes = 0
        self._fsyncs = self._flushes = self._truncated = 0
        self._dir_dirty = False
        self._unsynced = False
        self._last_fsync = time.monotonic()
        self._fd = -1

        if os.path.exists(self._dir) and not os.path.isdir(self._dir):
            raise NotARunError(f"{self._dir}: not a directory")
        os.makedirs(self._dir, exist_ok=True)
        self._dir_fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        self._lock_fd = -1
        try:
            self._lock_fd = lock_run(self._dir)
            self._open_run()
            # The run's digest (recorder/digest.py): continued when current, else none is kept.
            files = data_files(self._dir)
            self._digest: Digest | None = load_digest(self._dir, files) if files else Digest()
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            os.close(self._dir_fd)
            unlock_run(self._lock_fd)
            raise
        self._closed = False

    def _open_run(self) -> None:
        self._created: dict[int, float] = {}
        if self._compact_records is not None:
            self._compaction = Compactor(
                self._dir,
                self._dir_fd,
                self._created,
                min_records=min(MIN_RECORDS, self._compact_records),
            )
            self._compaction.process = self._process
            self._compaction.recover()  # finish a swap a killed writer left half done
        catalog = Catalog(self._dir, keep_data=False)
        try:
            catalog.load_index()
            catalog.update()
        finally:
            catalog.close()
        self._entries: list[Entry] | None = catalog.entries
        if len(self._entries) > INDEX_MAX_ROWS or catalog.blocks:
            self._entries = None  # too many to index, or blocks (their footers index them)
        self._created.update(
            {n: s.created for n, s in catalog.segments.items() if s.created is not None}
        )
        for state in catalog.blocks.values():
            self._created.update({int(n): float(c) for n, c, _ in state.footer.segments})
        numbers = list_segments(self._dir)
        if not numbers:
            last_block = max((b.footer.last for b in catalog.blocks.values()), default=-1)
            self._new_segment(last_block + 1)
            return
        records = Counter(e.segment for e in catalog.entries if e.segment >= 0)
        if self._compaction is not None:
            for n in numbers[:-1]:  # sealed segments an earlier writer did not compact
                state = catalog.segments[n]
                self._compaction.seal(n, state.valid_end, records[n], None)
        last = numbers[-1]
        state = catalog.segments[last]
        path = os.path.join(self._dir, segment_name(last))
        self._fd = os.open(path, os.O_RDWR)
        if state.created is None:  # torn header: the crash came right after creating the file
            self._truncated += os.fstat(self._fd).st_size
            os.ftruncate(self._fd, 0)
            created = time.time()
            os.pwrite(self._fd, framing.encode_header(last, created), 0)
            self._created[last] = created
            self._segment, self._offset = last, framing.HEADER_SIZE
        else:
            self._segment, self._offset = last, state.valid_end
            size = os.fstat(self._fd).st_size
            if size > self._offset:
                self._truncated += size - self._offset
                os.ftruncate(self._fd, self._offset)
        if self._truncated:
            os.fsync(self._fd)
            self._fsyncs += 1
        self._seg_records = records[last]
        if self._compaction is not None:
            # Records an earlier writer left in this segment are read back when it is compacted.
            self._fresh = SegmentCapture(last, complete=records[last] == 0)

    def _new_segment(self, number: int) -> None:
        path = os.path.join(self._dir, segment_name(number))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        created = time.time()
        header = framing.encode_header(number, created)
        try:
            framing.write_all(fd, header)
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._segment, self._offset = number, len(header)
        self._seg_records = 0
        if self._compaction is not None:
            self._fresh = SegmentCapture(number)
        self._created[number] = created
        self._bytes += len(header)
        self._dir_dirty = True
        self._unsynced = True

    def _check_open(self) -> None:
        if self._closed:
            raise RecorderError(f"{self._dir}: the RunWriter is closed")

    def append_scalars(
        self, tag: str, steps: np.ndarray, walls: np.ndarray, values: np.ndarray
    ) -> None:
        """Buffer scalar points of ``tag``: steps int64, walls float64 (Unix seconds), values float64.

        Points of one tag are coalesced into large columnar chunks at :meth:`flush`; tags with only
        a few points pending share one group chunk, so frequent flushes stay cheap. A batch whose
        first step is below a step already buffered starts a new chunk, so a restart (training
        resumed from a checkpoint) stays visible to readers, which let it supersede the older points.

        The arrays are copied, since the caller may reuse them, except read-only ones that own
        their memory or view an immutable ``bytes`` (a decoded frame), already of the column's
        dtype: those are kept as they are until the flush (the caller must not make them
        writable again).

        Raises:
            ValueError: ``tag`` is not a non-empty str; arrays are not 1-D or have different
                lengths.
            TypeError: an array has a non-numeric dtype.
            RecorderError: the writer is closed.
        """
        self._check_open()
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"tag must be a non-empty str, got {tag!r}")
        s = _array("steps", steps, np.int64)
        w = _array("walls", walls, np.float64)
        v = _array("values", values, np.float64)
        if not len(s) == len(w) == len(v):
            raise ValueError(
                f"steps, walls and values must have equal lengths, got {len(s)}, {len(w)}, {len(v)}"
            )
        if not len(s):
            return
        if self._batch is not None:
            self._expand_batch()
        self._slot_for(tag, s[0], len(s)).add(s, w, v)
        self._pending_points += len(s)
        self._pending_bytes += 24 * len(s)
        if self._pending_bytes > BUFFER_BYTES:
            self._write_pending()

    def append_scalar_batch(
        self,
        tags: list[str],
        counts: list[int],
        steps: np.ndarray,
        walls: np.ndarray,
        values: np.ndarray,
    ) -> None:
        """Buffer the scalar points of several tags at once, joined tag-major: the first
        ``counts[0]`` points are ``tags[0]``'s, the next ``counts[1]`` ``tags[1]``'s, and so on.

        The same as :meth:`append_scalars` called for each tag in turn (the same chunks, the same
        bytes on disk), at a fraction of the cost for many small columns (a live batch of ten
        tags of a point each): the columns are checked and converted once, not per tag. A tag
        may appear more than once; a count of 0 adds nothing.

        The arrays are copied or kept as :meth:`append_scalars` says (a caller that joined them
        for this call can make them read-only, so that they are kept).

        Raises:
            ValueError: ``tags`` and ``counts`` differ in length, a tag is not a non-empty str,
                a count is not an int >= 0, the counts do not add up to the columns' length;
                arrays are not 1-D or have different lengths.
            TypeError: an array has a non-numeric dtype.
            RecorderError: the writer is closed.
        """
        self._check_open()
        if len(tags) != len(counts):
            raise ValueError(
                f"tags and counts must have equal lengths, got {len(tags)} and {len(counts)}"
            )
        # Type sets and C-level all/min first (a live batch has ten tags), a loop only to name
        # the bad value.
        if not (set(map(type, tags)) <= {str} and all(tags)):
            for tag in tags:
                if not isinstance(tag, str) or not tag:
                    raise ValueError(f"tag must be a non-empty str, got {tag!r}")
        if not (set(map(type, counts)) <= {int} and (not counts or min(counts) >= 0)):
            for count in counts:
                if (
                    type(count) is not int
                    and (not isinstance(count, numbers.Integral) or isinstance(count, bool))
                ) or count < 0:
                    raise ValueError(f"counts must hold ints >= 0, got {count!r}")
            counts = [int(count) for count in counts]  # e.g. NumPy integers: msgpack takes ints
        s = _array("steps", steps, np.int64)
        w = _array("walls", walls, np.float64)
        v = _array("values", values, np.float64)
        n = len(s)
        if not n == len(w) == len(v):
            raise ValueError(
                f"steps, walls and values must have equal lengths, got {n}, {len(w)}, {len(v)}"
            )
        total = sum(counts)
        if total != n:
            raise ValueError(f"counts must add up to the columns' length {n}, got {total}")
        if not n:
            return
        if 0 in counts:  # an empty column adds nothing
            tags = [tag for tag, count in zip(tags, counts, strict=True) if count]
            counts = [count for count in counts if count]
        if self._batch is not None:
            self._expand_batch()
        if self._pending_bytes + 24 * n > BUFFER_BYTES:
            # The buffer fills inside this batch: tag by tag, so that it is written to the OS
            # exactly where append_scalars would write it (the same chunks either way).
            lo = 0
            for tag, count in zip(tags, counts, strict=True):
                self.append_scalars(tag, s[lo : lo + count], w[lo : lo + count], v[lo : lo + count])
                lo += count
            return
        if (
            not self._open_slots
            and len(tags) > 1
            and max(counts) < GROUP_BELOW
            and len(set(tags)) == len(tags)
        ):
            # Nothing else pending, and a group chunk on its own at the flush: kept whole (a
            # live batch), unless another scalar append comes first (_expand_batch).
            self._batch = _PendingBatch(list(tags), list(counts), ScalarSeries(s, w, v))
            self._batch_at = len(self._queue)
            self._queue.append(self._batch)
            self._pending_points += n
            self._pending_bytes += 24 * n
            return
        # Each tag's first and largest step, as Python ints: one or two NumPy calls for all the
        # tags rather than an element read and a max per tag.
        ends = list(itertools.accumulate(counts))
        starts = [e - c for e, c in zip(ends, counts, strict=True)]
        if n <= codec.SMALL_GROUP_POINTS:
            all_steps = s.tolist()
            firsts = [all_steps[a] for a in starts]
            tops = [max(all_steps[a:e]) for a, e in zip(starts, ends, strict=True)]
        else:
            firsts = s[starts].tolist()
            tops = np.maximum.reduceat(s, starts).tolist()
        for tag, lo, hi, first, top in zip(tags, starts, ends, firsts, tops, strict=True):
            self._slot_for(tag, first, hi - lo).add(s[lo:hi], w[lo:hi], v[lo:hi], top)
        self._pending_points += n
        self._pending_bytes += 24 * n
        if self._pending_bytes > BUFFER_BYTES:
            self._write_pending()

    def _slot_for(self, tag: str, first: int, count: int) -> _PendingScalars:
        """The open slot ``count`` points of ``tag`` starting at step ``first`` go into: the
        tag's open one, or a new one where they would restart its steps (a restart stays
        visible to readers) or overfill it."""
        slot = self._open_slots.get(tag)
        if slot is None or first < slot.smax or slot.count + count > CHUNK_POINTS:
            slot = self._open_slots[tag] = _PendingScalars(tag)
            self._queue.append(slot)
        return slot

    def _expand_batch(self) -> None:
        """Turn the pending batch into one slot per tag, in its place in the queue, as
        :meth:`append_scalars` would have made them (another scalar append is coming)."""
        batch, self._batch = self._batch, None
        assert batch is not None and self._queue[self._batch_at] is batch
        slots = batch.slots()
        self._queue[self._batch_at : self._batch_at + 1] = slots
        for slot in slots:
            self._open_slots[slot.tag] = slot

    def append_record(
        self, kind: str, tag: str | None, step: int | None, wall: float, data: dict
    ) -> None:
        """Buffer one non-scalar event (histogram, image, text, hparams, telemetry, meta, ...).

        ``data`` is encoded with msgpack right away (later changes to it are not recorded).
        ``kind="meta"`` records are merged into :attr:`RunReader.meta`.

        Raises:
            ValueError: a bad ``kind`` (``"scalars"`` is reserved), ``tag``, ``step`` or ``wall``.
            TypeError: ``data`` is not a dict or not msgpack-serialisable.
            RecorderError: the writer is closed.
        """
        self._check_open()
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"kind must be a non-empty str, got {kind!r}")
        if kind == codec.SCALARS:
            raise ValueError('kind "scalars" is reserved: use append_scalars()')
        if tag is not None and (not isinstance(tag, str) or not tag):
            raise ValueError(f"tag must be None or a non-empty str, got {tag!r}")
        # The plain types first: the ABC checks behind them cost a microsecond a call.
        if (
            step is not None
            and type(step) is not int
            and (not isinstance(step, numbers.Integral) or isinstance(step, bool))
        ):
            raise ValueError(f"step must be None or an int, got {step!r}")
        if (
            type(wall) is not float
            and (not isinstance(wall, numbers.Real) or isinstance(wall, bool))
        ) or math.isnan(wall):
            raise ValueError(f"wall must be a number (Unix seconds), got {wall!r}")
        if not isinstance(data, dict):
            raise TypeError(f"data must be a dict, got {type(data).__name__}")
        try:
            payload = codec.encode_record(
                kind, tag, None if step is None else int(step), float(wall), data
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"data is not msgpack-serialisable: {exc}") from None
        if len(payload) > framing.MAX_PAYLOAD:
            raise ValueError(f"record is {len(payload)} bytes, over {framing.MAX_PAYLOAD}")
        step = None if step is None else int(step)
        if self._digest is not None:
            # A copy of what was recorded: the caller may change ``data`` later.
            kept = None
            if kind == "meta" or (tag is None and len(payload) <= LATEST_MAX_BYTES):
                kept = msgpack.unpackb(payload, raw=False, strict_map_key=False)[4]
            self._digest.add_record(kind, tag, float(wall), kept, len(payload))
        self._queue.append((payload, (kind, tag, step, float(wall), 1, step, step, None, None)))
        self._pending_records += 1
        self._pending_bytes += len(payload)
        if self._pending_bytes > BUFFER_BYTES:
            self._write_pending()

    def _write_pending(self) -> None:
        """Write the buffer to the OS, rotating segments by size."""
        # No open slot, no slot to group (a pending batch is a group chunk already).
        queue = _group_small(self._queue) if self._open_slots else self._queue
        self._queue = []
        self._open_slots.clear()
        self._batch = None
        self._pending_bytes = self._pending_points = self._pending_records = 0
        # Each frame as its three pieces (head, payload, tail), written with one pwritev: the
        # payload is never copied into a frame, nor frames into one buffer.
        batch: list[bytes] = []
        batch_bytes = 0
        new_entries: list[Entry] = []
        caps: list = []
        for item in queue:
            encoded = item.encode() if not isinstance(item, tuple) else [(*item, None, None, None)]
            for payload, fields, parts, points, summary_points in encoded:
                if self._digest is not None and points is not None:
                    # From the chunk's own summary, computed for the index anyway.
                    self._digest.add_chunk(fields, parts, summary_points)
                head, tail = framing.frame_parts(payload)
                size = len(payload) + framing.FRAME_OVERHEAD
                at = self._offset + batch_bytes
                if at + size > self._segment_bytes and at > framing.HEADER_SIZE:
                    self._commit(batch, batch_bytes, new_entries, caps)
                    batch, batch_bytes, new_entries, caps = [], 0, [], []
                    self._rotate()
                    at = self._offset
                new_entries.append(Entry(self._segment, at, len(payload), *fields, None, parts))
                batch += (head, payload, tail)
                batch_bytes += size
                if self._fresh is not None:
                    # What compaction needs, kept from the write: no decoding later.
                    caps.append((at + size, fields, payload if points is None else points))
        self._commit(batch, batch_bytes, new_entries, caps)

    def _commit(self, pieces: list[bytes], nbytes: int, entries: list[Entry], caps: list) -> None:
        if not pieces:
            return
        start = self._offset
        try:
            _pwritev_all(self._fd, pieces, start)
        except BaseException:
            # Leave no torn record behind a failed write (e.g. a full disk).
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            raise
        self._offset += nbytes
        self._bytes += nbytes
        self._records += len(entries)
        self._seg_records += len(entries)
        if self._fresh is not None:
            if self._offset > SMALL_RECORD * max(self._seg_records, MIN_RECORDS):
                # Large records (a bulk load): this segment will not be compacted; keep nothing.
                self._fresh = None
            else:
                self._fresh.add(caps)
        self._points += sum(e.count for e in entries if e.kind == codec.SCALARS)
        if self._entries is not None:
            self._entries.extend(entries)
            if len(self._entries) > INDEX_MAX_ROWS:
                self._entries = None  # too many to index: readers will scan
        self._unsynced = True

    def _rotate(self) -> None:
        if self._sync_mode != "never" and self._unsynced:
            os.fsync(self._fd)  # the finished segment is durable before the next one starts
            self._fsyncs += 1
        if self._compaction is not None:
            self._compaction.seal(self._segment, self._offset, self._seg_records, self._fresh)
        self._new_segment(self._segment + 1)

    def _fsync(self) -> None:
        os.fsync(self._fd)
        self._fsyncs += 1
        if self._dir_dirty:
            os.fsync(self._dir_fd)
            self._dir_dirty = False
        self._unsynced = False
        self._last_fsync = time.monotonic()

    def flush(self) -> Position:
        """Write everything buffered to the OS, then fsync per the ``sync`` schedule.

        After it returns, readers see the data and it survives the writer process being killed;
        it is durable against power loss only if this call fsynced (``sync="flush"``, or
        ``sync="interval"`` with the interval elapsed). Returns the end position.
        """
        self._check_open()
        self._flushes += 1
        # Compact before writing: the sealed segment then holds only what earlier flushes wrote,
        # which a follower polling between flushes has read whole (it keeps its catalog).
        self._maybe_compact()
        self._write_pending()
        if self._unsynced and (
            self._sync_mode == "flush"
            or (
                self._sync_mode == "interval"
                and time.monotonic() - self._last_fsync >= self._sync_interval
            )
        ):
            self._fsync()
        return self.position()

    def sync(self) -> Position:
        """Flush and fsync now (the data, and the directory after a new segment).

        After it returns everything appended so far is durable, whatever the ``sync`` mode.
        Returns the end position.
        """
        self._check_open()
        self._flushes += 1
        self._maybe_compact()
        self._write_pending()
        self._fsync()
        return self.position()

    def _maybe_compact(self) -> None:
        """Seal the current segment once it holds ``compact_records`` records, and compact what
        is sealed (a few milliseconds every ``compact_records`` records; a merge of four blocks
        now and then); with ``defer_compaction``, only what waits past ``DEFERRED_MAX`` units."""
        compaction = self._compaction
        if compaction is None:
            return
        if self._seg_records >= self._compact_records:
            self._rotate()
        if self._defer:
            # Bounded: the oldest work first, until no more than DEFERRED_MAX units wait. While
            # another thread runs a unit the flush leaves the excess to it (no wait), unless
            # twice the bound waits: then compaction is falling behind and the flush takes turns.
            while (waiting := compaction.backlog()) > DEFERRED_MAX and compaction.step(
                wait=waiting > 2 * DEFERRED_MAX
            ):
                self._inline += 1
        elif compaction.pending:
            before = compaction.compactions + compaction.merges
            compaction.run()
            self._inline += compaction.compactions + compaction.merges - before
        if compaction.blocks:
            self._entries = None

    def compact(self, budget_s: float | None = None) -> bool:
        """Do compaction work that waits (with ``defer_compaction=True``, what flushes sealed),
        one unit at a time: a sealed segment compacted into a block, a group of blocks merged, or
        a block of an older writer given its summaries. Each unit is a crash-safe swap (the new
        file written whole and fsynced before the old ones go), so a crash between or inside
        units loses nothing. Returns whether work is left.

        Thread safety: this is the one method that may be called from another thread than the
        one appending and flushing, while they run (a compaction thread beside the writing
        thread). A unit reads, encodes, writes and fsyncs without holding up the writer: appends
        and flushes wait only for the brief swap of the compaction state (the queue of sealed
        segments, the list of blocks), never for a unit's I/O, except a flush finding more than
        ``2 * DEFERRED_MAX`` units waiting, and :meth:`close`, which waits for the unit under way.
        Once :meth:`close` has begun, a call does no more work and returns False.

        Args:
            budget_s: start no new unit once this many seconds (wall time) have passed; at least
                one unit is done, and a unit is never split (a merge of large blocks can take
                much longer than the budget). None: do everything that waits.

        Raises:
            ValueError: a bad ``budget_s``.
            RecorderError: the writer is closed.
        """
        self._check_open()
        if budget_s is not None and (
            not isinstance(budget_s, numbers.Real)
            or isinstance(budget_s, bool)
            or not budget_s >= 0
        ):
            raise ValueError(f"budget_s must be None or a number >= 0, got {budget_s!r}")
        compaction = self._compaction
        if compaction is None:
            return False
        deadline = None if budget_s is None else time.monotonic() + budget_s
        while compaction.step():
            if deadline is not None and time.monotonic() >= deadline:
                break
        # The index rows (self._entries) are the writing thread's: its next flush drops them
        # once blocks exist, never this thread.
        return not compaction.closed and self.compaction_waiting

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has begun (or the writer was dropped); safe from any thread."""
        return self._closed or (self._compaction is not None and self._compaction.closed)

    @property
    def compaction_waiting(self) -> bool:
        """Whether :meth:`compact` has work to do (cheaper than :meth:`statistics`, which an
        owner would otherwise build after every flush to learn it)."""
        compaction = self._compaction
        return compaction is not None and (
            compaction.backlog() > 0 or bool(compaction.unsummarised)
        )

    def position(self) -> Position:
        """The end of the flushed data (buffered appends are not included)."""
        return Position(self._segment, self._offset)

    def statistics(self) -> WriterStatistics:
        """Counters since the writer was opened (see :class:`WriterStatistics`)."""
        return WriterStatistics(
            records=self._records,
            scalar_points=self._points,
            pending_records=self._pending_records,
            pending_points=self._pending_points,
            bytes=self._bytes,
            segments=self._segment + 1,
            fsyncs=self._fsyncs,
            flushes=self._flushes,
            truncated_bytes=self._truncated,
            position=self.position(),
            compactions=0 if self._compaction is None else self._compaction.compactions,
            merges=0 if self._compaction is None else self._compaction.merges,
            compaction_seconds=0.0 if self._compaction is None else self._compaction.seconds,
            compaction_backlog=0 if self._compaction is None else self._compaction.backlog(),
            inline_compactions=self._inline,
        )

    def close(self) -> None:
        """Flush, fsync (unless ``sync="never"``) and write the index. Idempotent.

        A run of more than ``INDEX_MAX_ROWS`` records gets no new index (readers scan instead).

        If the flush fails the files are closed anyway and the error propagates.
        """
        if self._closed:
            return
        try:
            self._write_pending()
            compaction = self._compaction
            if compaction is not None:
                # No unit of another thread's compact() from here on: the rest is done here,
                # and the index is not written behind a block swapped in meanwhile.
                compaction.shut()
                compaction.run()
                if compaction.blocks and self._seg_records:
                    # A compacted run is left whole in blocks: opening reads their indexes only.
                    self._rotate()
                    compaction.run()
                if compaction.blocks:
                    self._entries = None
            durable = self._sync_mode != "never"
            if durable:
                self._fsync()
            self._write_index(durable)
            if self._digest is not None:
                with contextlib.suppress(OSError):  # only a shortcut: readers can do without
                    write_digest(self._dir, self._digest, durable)
            # The page's many-runs read of each short tag, read back once (recorder/preview.py);
            # not for a run whose tags are all long (opening a long run costs up to 0.3 s, and
            # its reads use the chunks' summaries), as far as a digest tells.
            digest = self._digest
            if digest is None or any(
                t.count <= PREVIEW_TAG_POINTS for t in digest.scalars.values()
            ):
                with contextlib.suppress(OSError, RecorderError):  # a shortcut too
                    write_preview(self._dir, durable)
        finally:
            self._closed = True
            if self._compaction is not None:
                self._compaction.shut()  # a unit under way elsewhere still uses the descriptors
            os.close(self._fd)
            os.close(self._dir_fd)
            unlock_run(self._lock_fd)

    def _write_index(self, durable: bool) -> None:
        if self._entries is None:
            return
        segments = [
            (n, self._created[n], self._offset if n == self._segment else _size(self._dir, n))
            for n in sorted(self._created)
        ]
        blob = encode_index(segments, self._entries, time.time())
        framing.write_atomically(os.path.join(self._dir, INDEX_NAME), blob, durable)
        if durable:
            os.fsync(self._dir_fd)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A writer dropped without close() still releases its descriptors (no index, no fsync).
        if not getattr(self, "_closed", True):
            self._closed = True
            if self._compaction is not None:
                self._compaction.shut()  # a unit under way in another thread uses the descriptors
            os.close(self._fd)
            os.close(self._dir_fd)
            unlock_run(self._lock_fd)


def _size(run_dir: str, number: int) -> int:
    return os.stat(os.path.join(run_dir, segment_name(number))).st_size


#: Buffers one pwritev call takes at most (IOV_MAX on Linux and macOS).
_IOV_MAX = 1024


def _pwritev_all(fd: int, pieces: list[bytes], offset: int) -> None:
    """Write ``pieces`` back to back at ``offset`` with pwritev (no joined copy), resuming
    after a short write."""
    first = 0
    while first < len(pieces):
        written = os.pwritev(fd, pieces[first : first + _IOV_MAX], offset)
        offset += written
        while first < len(pieces) and written >= len(pieces[first]):
            written -= len(pieces[first])
            first += 1
        if written:  # a short write ended inside this piece
            pieces[first] = memoryview(pieces[first])[written:]


# -- the run lock -------------------------------------------------------------------------------

#: The lock file of a run directory (docs/record-format.md); readers ignore it.
LOCK_NAME = "writer.lock"


def lock_run(run_dir: str) -> int:
    """Take the run's lock: an exclusive, non-blocking ``flock`` on ``run_dir/writer.lock``.

    The file holds the holder's process id and host name, for the error a second writer gets and
    for :func:`writers_gone`. The lock belongs to
    the returned descriptor: it is held until :func:`unlock_run` (or the process ends, even killed),
    and conflicts between two writers of one process as much as between two processes.

    Raises:
        RunLockedError: another writer holds the run; the message names the directory and the pid.
        OSError: the lock file cannot be created (read-only directory, no permission).
    """
    fd = os.open(os.path.join(run_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").split()[:1]
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        pid = f" (process {holder[0]})" if holder and holder[0].isdigit() else ""
        raise RunLockedError(
            f"{run_dir}: the run is already open in another RunWriter{pid}"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {_HOST}\n".encode("utf-8", "replace"), 0)
    except BaseException:
        os.close(fd)  # e.g. a full disk: never keep a lock nobody can release
        raise
    return fd


def unlock_run(fd: int) -> None:
    """Release a lock taken by :func:`lock_run` (closing its descriptor); ``-1`` is ignored."""
    if fd >= 0:
        os.close(fd)  # the flock goes with the last descriptor of its open file


#: This machine's name, as a run's lock file records it (no spaces: the file splits on them).
_HOST = "".join(socket.gethostname().split()) or "-"


def _proc_locks() -> dict[str, set[int]] | None:
    """The file locks held on this machine, from Linux's ``/proc/locks``: ``"maj:min:inode"`` ->
    the process ids holding one; None where that cannot be read (another system)."""
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    held: dict[str, set[int]] = {}
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 26911 fe:00:2149000 0 EOF" ("1: -> FLOCK ..." waits)
        parts = line.split()
        if len(parts) >= 6 and parts[1] != "->":
            with contextlib.suppress(ValueError):
                held.setdefault(parts[5], set()).add(int(parts[4]))
    return held


def _lock_ident(st: os.stat_result) -> str:
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def lock_holders(path: str | os.PathLike[str]) -> set[int] | None:
    """The process ids holding a lock on ``path`` (a run's ``writer.lock``), from Linux's
    ``/proc/locks``; an empty set when none (or no such file), None where that cannot be told.

    Read-only: taking the lock to test it could make a writer opening the run fail.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return set()
    except OSError:
        return None
    held = _proc_locks()
    return None if held is None else held.get(_lock_ident(st), set())


def _process_gone(pid: int) -> bool:
    """Whether process ``pid`` of this machine has ended (a zombie, killed and not yet reaped by
    its parent, has ended too)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    # "pid (comm) S ...": the state follows the last ")" (comm may hold spaces and parentheses)
    state = stat.rfind(b")") + 2
    return stat[state : state + 1] == b"Z"


def writers_gone(run_dirs: list[str]) -> list[bool]:
    """For each run directory, whether its last writer ended without letting go of the run the
    way :meth:`RunWriter.close` does: its lock file names a process of this machine, no process
    holds the lock, and that process has ended (killed, or crashed). One read of the lock table
    for all of them.

    False where that cannot be told: no lock file, a writer on another machine (a shared file
    system) or from before the file named its host, no ``/proc``. A writer that closed its
    ``RunWriter`` and runs on (a broker closing idle runs) is not gone. Whether the run was
    closed cleanly is the caller's to tell (the close marker of vdl_stream's writer): a clean
    close lets go of the lock too.
    """
    held = _proc_locks()
    out = []
    for run_dir in run_dirs:
        gone = False
        if held is not None:
            try:
                with open(os.path.join(run_dir, LOCK_NAME), "rb") as f:
                    st = os.fstat(f.fileno())
                    holder = f.read(256).split()
            except OSError:
                holder = []
            if (
                len(holder) == 2
                and holder[0].isdigit()
                and holder[1].decode("utf-8", "replace") == _HOST
                and not held.get(_lock_ident(st))
            ):
                gone = _process_gone(int(holder[0]))
        out.append(gone)
    return out
