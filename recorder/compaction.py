"""Compaction of a live run: sealed segments of small records become blocks; blocks merge.

The writer (:class:`~recorder.RunWriter`) drives it from ``flush()``/``sync()``: when its current
segment holds ``compact_records`` records it seals it (starts the next segment) and hands it here.
The records are taken from what the writer kept while writing them (no decoding), or read back
from disk for segments an earlier writer left. Four adjacent blocks of one level merge into one of
the next level, up to :data:`MAX_LEVEL`.

Every change is crash-safe the way Prometheus TSDB swaps blocks: the new file is written whole
under a temporary name, fsynced, renamed into place and the directory fsynced; only then are the
files it replaces deleted. Readers take the largest block and ignore files inside it, so at any
moment the directory holds one complete state; a writer reopening the run finishes an interrupted
swap (:meth:`Compactor.recover`).

Threads: the work of a unit (reading, encoding, writing and fsyncing the new block, deleting the
old files) may run in another thread than the writer's appends and flushes. Two locks keep them
apart: :attr:`Compactor.lock` guards only the state the two share (the queue of sealed segments and
the list of blocks), held for a queue operation or the swap of the list, never across I/O; units
themselves are serialised among themselves by a second lock, so a flush that must do compaction work
(past the deferred bound) and a compaction thread never run two units at once.

Processes: a unit's new block may be built by a :class:`CompactionProcess` instead (the broker's
are), off the owner's GIL: it reads its input back from the files and writes the block under a
temporary name of its own; the owner swaps it in exactly as above. Losing that process at any
moment loses nothing: the unit is queued again and done again (here while another starts).
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import numpy as np

from recorder import blocks, codec, framing
from recorder.catalog import INDEX_NAME, SEGMENT_RE, segment_name
from recorder.records import FormatError, ScalarSeries

# Blocks of one level merged into one of the next, and the highest level. A level-3 block of a
# run written at the live cadence spans ~20 minutes: about one full chunk per tag.
MERGE_FAN = 4
MAX_LEVEL = 3
# Blocks are merged only while the inputs stay below this many bytes (bounds a flush's work).
MERGE_MAX_BYTES = 128 << 20
# A sealed segment is compacted when it holds at least this many records, averaging less than
# SMALL_RECORD bytes: segments of large chunks (a bulk load) are already what compaction makes.
MIN_RECORDS = 32
SMALL_RECORD = 64 << 10
TMP_SUFFIX = ".tmp"
# Seconds a unit waits for its CompactionProcess to finish starting (its imports) before it is
# built in the owner's thread instead. Building it there holds the owner's GIL for the whole
# unit: at 1M events/s a first unit built in the broker's process took 1.3-4.8 s, and every
# batch waited in the event loop's receive path behind it (docs/performance.md, h14-million).
PROCESS_START_WAIT = 10.0
# The niceness the compaction process adds to its owner's (``nice(2)``): compaction is
# background work, and where the cores are short the kernel gives them to the live path first
# (the event loop, the persist thread, the writers). Its backlog stays bounded by the writer
# (``DEFERRED_MAX``) and is caught up once the load drops.
PROCESS_NICE = 10


class SegmentCapture:
    """What a writer wrote into one segment, kept for compacting it without reading it back.

    A segment's capture lives until the segment is compacted, thousands of records later, so
    it keeps nothing per record that the cyclic garbage collector tracks: each event is one
    tuple of atoms (which the collector stops tracking at its first pass), and the scalar
    chunks' points go into flat columns (lists of strs and ints, and NumPy arrays, which are
    not tracked). A tuple of lists per chunk, as it was, was tracked until compaction and
    promoted to the oldest generation, whose growth is what sets off full collections.
    """

    __slots__ = ("complete", "counts", "ends", "events", "number", "parts", "points", "tags")

    def __init__(self, number: int, complete: bool = True) -> None:
        self.number = number
        self.complete = complete  # False: the segment holds records of an earlier writer
        self.events: list[tuple] = []  # (end offset, kind, tag, step, wall, payload)
        # Scalar chunks: each one's end offset and number of parts; each part's tag and count;
        # the points' three columns, one array of each per chunk.
        self.ends: list[int] = []
        self.parts: list[int] = []
        self.tags: list[str] = []
        self.counts: list[int] = []
        self.points: tuple[list, list, list] = ([], [], [])

    def add(self, items: list) -> None:
        """Keep the records just written: ``(end offset, entry fields, payload)`` for an event,
        ``(end offset, entry fields or None, (tags, counts, steps, walls, values))`` for a
        scalar chunk."""
        for end, fields, data in items:
            if isinstance(data, tuple):
                tags, counts, *columns = data
                self.ends.append(end)
                self.parts.append(len(tags))
                self.tags.extend(tags)
                self.counts.extend(counts)
                for col, arr in zip(self.points, columns, strict=True):
                    col.append(arr)
            else:
                kind, tag, step, wall = fields[:4]
                self.events.append((end, kind, tag, step, wall, data))


class Compactor:
    """Compaction state of one run directory, owned by its writer.

    :meth:`seal` and :meth:`backlog` (the writer's side) and :meth:`step` (one unit, from any
    thread) may be called concurrently; a unit holds :attr:`lock` only to take its work from the
    queue and to publish its new block, so the writer never waits for a unit's I/O. :meth:`run`
    and :meth:`shut` are the owner's.

    Args:
        run_dir: the run directory.
        dir_fd: a descriptor of it (for fsync).
        created: segment number -> creation time (the writer's map, kept up to date by it).
        min_records: a sealed segment with fewer records is left as it is.
    """

    def __init__(
        self, run_dir: str, dir_fd: int, created: dict[int, float], min_records: int = MIN_RECORDS
    ) -> None:
        self.run_dir = run_dir
        self.min_records = min_records
        self.dir_fd = dir_fd
        self.created = created
        self.blocks: list[list[int]] = []  # [first, last, level, bytes], in segment order
        self.pending: list[tuple[int, int, int, SegmentCapture | None]] = []
        self.compactions = 0
        self.merges = 0
        self.seconds = 0.0  # CPU time spent compacting (process time)
        self.unmergeable: set[tuple[int, int]] = set()
        # Blocks an older writer left without level-of-detail summaries: one gets them per run.
        self.unsummarised: list[str] = []
        # Test hook: called with a stage name at each step of a swap ("written", "renamed",
        # "removed"), so tests can kill the process between them.
        self.hook: Callable[[str], None] | None = None
        # The state shared with the writer's thread (pending, blocks): held briefly, never
        # across I/O. Units are serialised by _unit; past shut() no unit starts.
        self.lock = threading.Lock()
        self._unit = threading.Lock()
        self.closed = False
        # Where units build their blocks: a process of its own (off this process's GIL; it
        # reads its input from the files) while it is ready, else this thread (the owner's).
        self.process: CompactionProcess | None = None
        self.lost = 0  # units whose process ended before it answered (done again)

    # -- recovery -------------------------------------------------------------------------------

    def recover(self) -> None:
        """Finish what a killed writer left: delete temporary files, and files a block covers
        (the block is complete: it was renamed into place only once written and fsynced)."""
        names = os.listdir(self.run_dir)
        found = {}
        for name in names:
            if name.endswith(TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.run_dir, name))
                continue
            rng = blocks.parse_block_name(name)
            if rng is not None:
                found[name] = rng
        chosen: list[tuple[int, int, str]] = []
        stale = []
        for name, (a, b) in sorted(found.items(), key=lambda kv: (kv[1][0], -kv[1][1])):
            if chosen and a <= chosen[-1][1]:
                stale.append(name)
            else:
                chosen.append((a, b, name))
        for name in names:
            match = SEGMENT_RE.match(name)
            if match and any(a <= int(match.group(1)) <= b for a, b, _ in chosen):
                stale.append(name)
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.run_dir, name))
        if stale:
            os.fsync(self.dir_fd)
        for a, b, name in chosen:
            path = os.path.join(self.run_dir, name)
            fd = os.open(path, os.O_RDONLY)
            try:
                footer = blocks.read_footer(fd)
            except blocks.BlockError as exc:
                raise FormatError(f"{path}: {exc}") from None
            finally:
                os.close(fd)
            self.blocks.append([a, b, footer.level, os.path.getsize(path)])
            if blocks.LOD_SLICE is not None and not blocks.has_summaries(footer):
                self.unsummarised.append(name)

    def seal(self, number: int, size: int, records: int, capture: SegmentCapture | None) -> None:
        """Queue a sealed segment (no record will be appended to it) for compaction."""
        with self.lock:
            self.pending.append((number, size, records, capture))

    def shut(self) -> None:
        """Wait for a unit under way in another thread, and let :meth:`step` start no more (the
        owner is closing: its descriptors go next). :meth:`run` stays the owner's to call."""
        with self._unit:
            self.closed = True

    # -- running --------------------------------------------------------------------------------

    def run(self) -> None:
        """Compact the queued sealed segments, then merge blocks while a level is full (the
        owner's thread; waits for a unit another thread has under way)."""
        with self._unit:
            if self._claim() is None:
                return
            while self._one_unit():
                pass
            self._summarise_one()

    def step(self, wait: bool = True) -> bool:
        """Do one unit of the queued work: compact one sealed segment, else merge one full group
        of blocks, else give one block its summaries; return whether any work was done.

        Safe to call from another thread than the writer's while it appends and flushes: the
        unit reads, encodes and fsyncs without :attr:`lock`, which it holds only to take its work
        and to swap in its block. Each unit is one crash-safe swap (:meth:`_install`), the same
        as :meth:`run` makes, so stopping between units leaves the run in a state :meth:`run`
        could have left too.

        Args:
            wait: whether to wait for a unit another thread has under way; False: return False
                at once then.
        """
        if not self._unit.acquire(blocking=wait):
            return False
        try:
            if self.closed:
                return False
            return self._one_unit() or self._summarise_one()
        finally:
            self._unit.release()

    def _one_unit(self) -> bool:
        """Do the next unit, if any (holding ``_unit``), in :attr:`process` when it is ready,
        else here; return whether there was one. A unit whose process was lost is queued again
        as it was (the files are as before it) and counts as done: the next call does it again,
        here while a fresh process starts."""
        start = time.thread_time()  # this thread's CPU: another may be writing meanwhile
        # A unit waits for the process to be up (its imports: a fraction of a second, longer on
        # a busy machine) rather than being built here, holding this process's GIL for seconds;
        # only a process that does not come up within PROCESS_START_WAIT leaves it to us.
        process = self.process
        if process is not None and not process.ready(timeout=PROCESS_START_WAIT):
            process = None
        cpu = 0.0 if process is None else process.cpu_seconds
        try:
            unit = self._claim(take=True)
            if unit is None:
                return False
            try:
                self._do(unit, process)
            except CompactionProcessLost:
                self._requeue(unit)
                self.lost += 1
            return True
        finally:
            # The process's CPU is compaction's too: counted, not hidden in another pid.
            extra = 0.0 if process is None else process.cpu_seconds - cpu
            self.seconds += time.thread_time() - start + extra

    def _claim(self, take: bool = False) -> tuple | None:
        """The next unit, ``("sealed", (number, size, records, capture))`` (oldest first; taken
        off the queue if ``take``) or ``("merge", group)``, or None (under :attr:`lock`)."""
        with self.lock:
            if self.pending:
                return ("sealed", self.pending.pop(0) if take else self.pending[0])
            group = self._full_group()
            return None if group is None else ("merge", group)

    def _requeue(self, unit: tuple) -> None:
        """Put a unit whose process was lost back where it was (a merge needs nothing: its
        group is found again in the list of blocks, which did not change)."""
        kind, work = unit
        if kind == "sealed":
            with self.lock:
                self.pending.insert(0, work)

    def _do(self, unit: tuple, process: CompactionProcess | None = None) -> None:
        kind, work = unit
        if kind == "sealed":
            # Compacted or (few or large records) let be: either way a unit, so a flush over the
            # deferred bound does no more than it must.
            self._compact_sealed(*work, process)
        else:
            self._merge(work, process)

    def backlog(self) -> int:
        """Units of work queued: sealed segments waiting, plus full groups of blocks waiting to
        merge (counted without overlap, one level at a time). A unit under way is not counted."""
        with self.lock:
            return len(self.pending) + sum(1 for _ in self._full_groups())

    def _summarise_one(self) -> bool:
        """Give one block an older writer left its summaries (a resumed run catches up one block
        per compaction, so no flush does more than one block's work for it); return whether one
        was rewritten."""
        live = {blocks.block_name(b[0], b[1]) for b in self.blocks}
        while self.unsummarised:
            name = self.unsummarised.pop()
            if name not in live:
                continue  # merged meanwhile: the merged block has them
            size = rewrite_with_summaries(self.run_dir, name, self.dir_fd)
            if size is not None:
                with self.lock:
                    self.blocks = [
                        [*b[:3], size] if blocks.block_name(b[0], b[1]) == name else b
                        for b in self.blocks
                    ]
            return True
        return False

    def _compact_sealed(
        self,
        number: int,
        size: int,
        records: int,
        capture: SegmentCapture | None,
        process: CompactionProcess | None = None,
    ) -> None:
        """Compact a sealed segment taken from :attr:`pending`, unless it holds few or large
        records (then it is left as it is)."""
        if records < self.min_records or size > SMALL_RECORD * records:
            return
        self._compact_segment(number, size, capture, process)

    def _compact_segment(
        self,
        number: int,
        size: int,
        capture: SegmentCapture | None,
        process: CompactionProcess | None = None,
    ) -> None:
        segments = [[number, self.created[number], size]]
        name = blocks.block_name(number, number)
        if process is not None:
            # The process reads the sealed segment back from the files (it is complete on
            # disk: sealed segments take no more appends), rather than this process's capture.
            built = process.build("segment", self.run_dir, name, segments=segments)
        else:
            builder = blocks.BlockBuilder(segments)
            path = os.path.join(self.run_dir, segment_name(number))
            if capture is not None and capture.complete:
                _feed_capture(builder, capture)
            elif not _feed_segment(builder, path, size):
                builder = None
            built = None if builder is None else _write_new(builder, self.run_dir, name, 0)
        if built is None:
            return  # damaged: left for readers to report
        nbytes = self._install(built, number, number, [segment_name(number)])
        with self.lock:  # a new list: the writer's thread may be reading the old one
            self.blocks = sorted([*self.blocks, [number, number, 0, nbytes]])
        self.compactions += 1

    def _full_group(self) -> list[list[int]] | None:
        """The first group :meth:`_full_groups` finds, or None."""
        return next(self._full_groups(), None)

    def _full_groups(self) -> Iterator[list[list[int]]]:
        """Groups of ``MERGE_FAN`` adjacent blocks of one level below ``MAX_LEVEL`` within
        ``MERGE_MAX_BYTES``, in order and without overlap (a group too large is passed over)."""
        run: list[list[int]] = []
        for block in self.blocks:
            if (
                run
                and run[-1][1] + 1 == block[0]
                and run[-1][2] == block[2]
                and (run[-1][0], run[-1][1]) not in self.unmergeable
            ):
                run.append(block)
            else:
                run = [block]
            if len(run) == MERGE_FAN and block[2] < MAX_LEVEL:
                if sum(b[3] for b in run) <= MERGE_MAX_BYTES:
                    yield run
                run = []

    def _merge(self, group: list[list[int]], process: CompactionProcess | None = None) -> None:
        spans = [(b[0], b[1]) for b in group]
        name = blocks.block_name(group[0][0], group[-1][1])
        if process is not None:
            built = process.build("merge", self.run_dir, name, spans=spans, level=group[0][2] + 1)
        else:
            built = _build_merge(self.run_dir, name, spans, group[0][2] + 1)
        if built is None:
            for span in spans:
                self.unmergeable.add(span)
            return
        first, last, level = spans[0][0], spans[-1][1], group[0][2] + 1
        old = [blocks.block_name(a, b) for a, b in spans]
        nbytes = self._install(built, first, last, old)
        with self.lock:
            kept = [b for b in self.blocks if b not in group]
            self.blocks = sorted([*kept, [first, last, level, nbytes]])
        self.merges += 1

    def _install(self, built: tuple[str, int], first: int, last: int, old: list[str]) -> int:
        """Swap in a block written whole and fsynced under a temporary name (``built``: that
        name and the block's size; by this thread or a compaction process), then delete the
        files it replaces; return its size."""
        tmp, size = built
        path = os.path.join(self.run_dir, blocks.block_name(first, last))
        self._stage("written")
        os.replace(tmp, path)
        os.fsync(self.dir_fd)  # the block is in place, durably, before anything goes
        self._stage("renamed")
        # The index lists segments a block now replaces: it would be stale. A closing writer
        # writes none while the run has blocks (their footers are its index).
        for victim in [*old, INDEX_NAME]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.run_dir, victim))
            if victim != INDEX_NAME:
                self._stage("removing")
        os.fsync(self.dir_fd)
        self._stage("removed")
        return size

    def _stage(self, name: str) -> None:
        if self.hook is not None:
            self.hook(name)


def _write_new(
    builder: blocks.BlockBuilder,
    run_dir: str,
    name: str,
    level: int,
    tmp: str | None = None,
    created: float | None = None,
) -> tuple[str, int]:
    """Write the block ``name`` whole under a temporary name (``tmp``, or the block's name with
    :data:`TMP_SUFFIX`) and fsync it; return that name and the block's size. ``created`` is the
    footer's creation time (now by default). Nothing is left behind if this fails."""
    tmp = tmp or os.path.join(run_dir, name) + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        size = builder.write(fd, level, time.time() if created is None else created)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp, size


def _build_segment(
    run_dir: str, name: str, segments: list, tmp: str | None = None
) -> tuple[str, int] | None:
    """Write the level-0 block ``name`` of one sealed segment, read back from its file (see
    :func:`_write_new`); None if a record of it is damaged (nothing is written)."""
    number, _, size = segments[0]
    builder = blocks.BlockBuilder(segments)
    if not _feed_segment(builder, os.path.join(run_dir, segment_name(number)), size):
        return None
    return _write_new(builder, run_dir, name, 0, tmp)


def _build_merge(
    run_dir: str, name: str, spans: list, level: int, tmp: str | None = None
) -> tuple[str, int] | None:
    """Write the block ``name`` of level ``level`` merging the blocks of ``spans`` (their first
    and last segments, in order; see :func:`_write_new`); None if one is damaged."""
    fds: list[int] = []
    try:
        for first, last in spans:
            fds.append(os.open(os.path.join(run_dir, blocks.block_name(first, last)), os.O_RDONLY))
        footers = [(fd, blocks.read_footer(fd)) for fd in fds]
        segments = [s for _, f in footers for s in f.segments]
        builder = blocks.BlockBuilder(segments)
        ok = all(
            _feed_block(builder, fd, footer, int(builder.origins.bases[i]))
            for (fd, footer), i in zip(footers, _first_indexes(footers), strict=True)
        )
    finally:
        for fd in fds:
            os.close(fd)
    return _write_new(builder, run_dir, name, level, tmp) if ok else None


class CompactionProcessLost(RuntimeError):
    """The compaction process ended (killed, crashed) before it answered; the unit it had was
    not done and is queued again, and the files are as they were before it."""


class CompactionProcessError(RuntimeError):
    """The compaction process could not do a unit (a full disk, say): the message is its
    error's. The unit is dropped, as a unit failing in the owner's thread is."""


class CompactionProcess:
    """A process of its own that builds compaction's new blocks, off its owner's GIL.

    A unit of compaction (:meth:`Compactor.step`) asks it to build one block: a sealed segment
    read back from its file, or a merge of blocks. The process writes the block whole under a
    temporary name of its own (``<block>.<pid>.tmp``), fsyncs it and answers with its size; the
    owner then swaps it in exactly as it swaps in a block it built itself (rename, directory
    fsync, old files deleted, directory fsynced), holding the run's lock. The process never
    renames or deletes anything, so whenever it dies the files hold the state before the unit
    plus, at worst, a temporary file that no reader looks at (the owner deletes it, and a writer
    reopening the run deletes every one).

    The process is started by :meth:`ready` (a unit waits up to :data:`PROCESS_START_WAIT` for it
    to come up, then builds in its owner's thread) and again by the next call after it ended
    (:attr:`restarts`); a build it did not answer raises :class:`CompactionProcessLost`. It runs
    ``nice`` steps below its owner (:data:`PROCESS_NICE`), so that compaction takes only the CPU
    the live path leaves. After
    ``max_losses`` losses in a row without an answer between them it is no longer
    :attr:`usable` and units are built in the owner's thread instead. The process exits the
    moment its owner dies, mid-build too: it holds the read end of a pipe (its *lifeline*) whose
    only write end the owner keeps, and a thread of its own waits for that end to close, so it
    never writes into a run another writer has reopened. (Not ``PR_SET_PDEATHSIG``: that signal
    follows the *thread* that started the process, and a worker thread that retires would take
    the process with it.)

    One build at a time (a lock serialises them); safe to call from any thread. :meth:`close`
    ends the process (also as a context manager).

    Args:
        max_losses: losses in a row after which builds stay in the owner's thread.
        nice: the niceness added to the owner's for the process (0: the owner's priority).

    Raises:
        ValueError: ``max_losses`` below 1 or ``nice`` not an int from 0 to 19.
    """

    def __init__(self, max_losses: int = 3, nice: int = PROCESS_NICE) -> None:
        if type(max_losses) is not int or max_losses < 1:
            raise ValueError(f"max_losses must be an int >= 1, got {max_losses!r}")
        if type(nice) is not int or not 0 <= nice <= 19:
            raise ValueError(f"nice must be an int from 0 to 19, got {nice!r}")
        self.max_losses = max_losses
        self.nice = nice
        self.restarts = 0  # processes started after a loss
        self.losses = 0  # in a row, without an answer between
        self.units = 0  # blocks built
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._lifeline: int | None = None  # the write end of the running process's lifeline
        self._up = False  # the running process sent its "ready" message
        self._done_cpu = 0.0  # CPU of the processes that ended
        self._cpu = 0.0  # the running process's CPU as of its last answer
        self._lock = threading.Lock()
        self._closed = False
        # Test hook: a path; the process then stops in every build with the block written and
        # fsynced, not answered, after writing its pid into that file (so a test can kill it
        # there). It stays stopped until its input closes.
        self.hold: str | None = None

    @property
    def usable(self) -> bool:
        """Whether units should be built here (not closed, not lost ``max_losses`` in a row)."""
        return not self._closed and self.losses < self.max_losses

    @property
    def cpu_seconds(self) -> float:
        """CPU time (user + system) of every process started, from its start (its imports
        included) to its last answer."""
        return self._done_cpu + self._cpu

    def ready(self, timeout: float = 0.0) -> bool:
        """Start the process if none runs, and return whether it is ready for a :meth:`build`
        (started and its imports done), waiting at most ``timeout`` seconds for that (by
        default not at all). False once not :attr:`usable`."""
        with self._lock:
            if not self.usable:
                return False
            if self._proc is None:
                self._start()
            if self._up:
                return True
            proc = self._proc
            if not select.select([proc.stdout], [], [], timeout)[0]:
                return False
            try:
                self._cpu = _receive(proc.stdout)["cpu"]  # its "ready" message
            except (OSError, ValueError, EOFError, KeyError):
                self._lose(proc)  # ended as it started: the next call starts another
                return False
            self._up = True
            return True

    def build(self, op: str, run_dir: str, name: str, **params: Any) -> tuple[str, int] | None:
        """Have the process build the block ``name`` of ``run_dir`` (``op``: ``"segment"`` with
        ``segments``, or ``"merge"`` with ``spans`` and ``level``); return its temporary name
        and size, or None when its input is damaged (nothing written).

        Raises:
            CompactionProcessLost: the process ended before it answered (the next build starts
                another).
            CompactionProcessError: it could not build the block (its error's message).
            RuntimeError: the process is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the compaction process is closed")
            proc = self._proc if self._up else None
            if proc is None:
                raise RuntimeError("the compaction process is not ready (see ready())")
            tmp = f"{os.path.join(run_dir, name)}.{proc.pid}{TMP_SUFFIX}"
            request = {"op": op, "run_dir": run_dir, "name": name, "tmp": tmp, **params}
            if self.hold:
                request["hold"] = self.hold
            try:
                _send(proc.stdin, request)
                reply = _receive(proc.stdout)
            except (OSError, ValueError, EOFError) as exc:
                self._lose(proc)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)  # complete or not, no block was swapped in from it
                raise CompactionProcessLost(
                    f"the compaction process {proc.pid} ended (exit status {proc.returncode})"
                ) from exc
            self.losses = 0
            self._cpu = reply["cpu"]
            if "error" in reply:
                raise CompactionProcessError(reply["error"])
            if reply["size"] is None:
                return None
            self.units += 1
            return tmp, reply["size"]

    def _start(self) -> None:
        # The same recorder as this process's, wherever it is imported from.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        # Both ends non-inheritable (os.pipe's default): the read end goes to this process only
        # (pass_fds), and no other child keeps the write end, so it closes exactly when we do.
        lifeline, self._lifeline = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(lifeline), str(self.nice)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": path},
                pass_fds=(lifeline,),
            )
        except BaseException:
            os.close(self._lifeline)
            self._lifeline = None
            raise
        finally:
            os.close(lifeline)
        self.pid = self._proc.pid
        self._cpu = 0.0
        self._up = False

    def _lose(self, proc: subprocess.Popen) -> None:
        """The process ended or broke its pipe: reap it, count it, start afresh next time."""
        with contextlib.suppress(OSError):
            proc.kill()
        self._reap(proc)
        self.losses += 1
        self.restarts += 1

    def _reap(self, proc: subprocess.Popen) -> None:
        for f in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                f.close()
        proc.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        self._done_cpu += self._cpu
        self._cpu = 0.0
        self._proc = None
        self._up = False

    def close(self) -> None:
        """End the process (it exits when its input closes; killed after 5 s). Idempotent;
        waits for a build under way."""
        with self._lock:
            self._closed = True
            proc = self._proc
            if proc is None:
                return
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
            self._reap(proc)

    def __enter__(self) -> CompactionProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _send(f: Any, message: dict) -> None:
    data = msgpack.packb(message, use_bin_type=True)
    f.write(struct.pack("<I", len(data)) + data)
    f.flush()


def _receive(f: Any) -> dict:
    head = f.read(4)
    if len(head) < 4:
        raise EOFError("the compaction process closed its pipe")
    (n,) = struct.unpack("<I", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError("the compaction process closed its pipe mid-answer")
    return msgpack.unpackb(data, raw=False)


# The compaction process: ``python -c _WORKER <lifeline fd> <nice>``; requests on stdin, answers
# on stdout.
_WORKER = (
    "import sys; from recorder.compaction import serve_builds; "
    "serve_builds(int(sys.argv[1]), int(sys.argv[2]))"
)


def _exit_with_owner(lifeline: int) -> None:
    """Wait for the owner's end of the lifeline to close (its death, or close()), then exit at
    once, whatever the process is doing."""
    while True:
        try:
            if not os.read(lifeline, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os._exit(0)


def serve_builds(lifeline: int, nice: int = 0) -> None:
    """The compaction process's loop: build the blocks its owner asks for until its input
    closes (see :class:`CompactionProcess`), ``nice`` steps below the priority it started with.
    Exits as soon as the ``lifeline`` pipe's write end, held by the owner alone, closes."""
    if nice:
        os.nice(nice)  # after the imports (a unit waits for them), before the first build
    threading.Thread(target=_exit_with_owner, args=(lifeline,), daemon=True).start()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers' pipe
    times = os.times()
    _send(stdout, {"cpu": times.user + times.system})  # ready: imports done
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        try:
            if request["op"] == "segment":
                built = _build_segment(
                    request["run_dir"], request["name"], request["segments"], request["tmp"]
                )
            else:
                built = _build_merge(
                    request["run_dir"],
                    request["name"],
                    request["spans"],
                    request["level"],
                    request["tmp"],
                )
            reply: dict[str, Any] = {"size": None if built is None else built[1]}
            if request.get("hold"):
                # Tests (CompactionProcess.hold): stopped with the block written and fsynced,
                # not answered, until killed or the owner closes our input.
                with open(request["hold"] + ".part", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(request["hold"] + ".part", request["hold"])
                stdin.read(1)
        except Exception as exc:  # told to the owner, who decides; this process carries on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        times = os.times()
        reply["cpu"] = times.user + times.system
        _send(stdout, reply)


def rewrite_with_summaries(run_dir: str, name: str, dir_fd: int) -> int | None:
    """Rewrite the block ``name`` with level-of-detail summaries, crash-safely (a new file under
    a temporary name, fsynced, renamed over the old one, directory fsynced); return its new size,
    or None when it has them already or is damaged (left as it is). The caller holds the run's
    lock. The points, events and origins stay the same; readers that had the old file notice a
    different file under the name and read the new one."""
    path = os.path.join(run_dir, name)
    fd = os.open(path, os.O_RDONLY)
    try:
        footer = blocks.read_footer(fd)
        if blocks.has_summaries(footer):
            return None
        builder = blocks.BlockBuilder(footer.segments)
        if not _feed_block(builder, fd, footer, 0):
            return None
    except blocks.BlockError:
        return None
    finally:
        os.close(fd)
    tmp, size = _write_new(builder, run_dir, name, footer.level, created=footer.created)
    os.replace(tmp, path)
    os.fsync(dir_fd)
    return size


def add_summaries(run_dir: str | os.PathLike[str]) -> int:
    """Give every block of a run written before level-of-detail summaries existed its summaries
    (what a writer resuming the run does one block per compaction); return how many blocks were
    rewritten. Readers may be reading the run meanwhile.

    Raises:
        RunLockedError: a writer holds the run.
        NotADirectoryError: ``run_dir`` is not a directory.
    """
    from recorder.writer import lock_run, unlock_run  # the writer imports this module

    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise NotADirectoryError(f"run_dir is not a directory: {run_dir!r}")
    lock = lock_run(run_dir)
    try:
        dir_fd = os.open(run_dir, os.O_RDONLY)
        try:
            done = 0
            for name in sorted(os.listdir(run_dir)):
                if blocks.parse_block_name(name) is not None:
                    done += rewrite_with_summaries(run_dir, name, dir_fd) is not None
            return done
        finally:
            os.close(dir_fd)
    finally:
        unlock_run(lock)


def _first_indexes(footers: list) -> list[int]:
    out, k = [], 0
    for _, footer in footers:
        out.append(k)
        k += len(footer.segments)
    return out


def _feed_capture(builder: blocks.BlockBuilder, capture: SegmentCapture) -> None:
    for end, kind, tag, step, wall, payload in capture.events:
        builder.add_event(kind, tag, step, wall, payload, end)
    tags = capture.tags
    if not tags:
        return
    part_counts = np.array(capture.counts, np.int64)
    part_ends = np.repeat(np.array(capture.ends, np.int64), capture.parts)
    steps, walls, values = (np.concatenate(col) for col in capture.points)
    names = sorted(set(tags))
    index = {name: i for i, name in enumerate(names)}
    part_tags = np.fromiter((index[t] for t in tags), np.int64, len(tags))
    point_tags = np.repeat(part_tags, part_counts)
    for i, name in enumerate(names):
        parts = part_tags == i
        points = point_tags == i
        builder.add_scalars(
            name,
            ScalarSeries(steps[points], walls[points], values[points]),
            part_counts[parts],
            part_ends[parts],
        )


def _feed_segment(builder: blocks.BlockBuilder, path: str, size: int) -> bool:
    """Feed the records of a sealed segment read from disk; False if any is damaged."""
    with open(path, "rb") as f:
        data = f.read(size)
    try:
        framing.decode_header(data[: framing.HEADER_SIZE])
    except framing.HeaderError:
        return False
    scan = framing.scan_frames(data, framing.HEADER_SIZE, sealed=True)
    if scan.damaged or scan.end != len(data):
        return False
    # Gathered as a writer's capture would hold them, then fed the same way: the points of every
    # record joined once and split by tag with numpy, not sliced record by record.
    capture = SegmentCapture(-1)
    items = []
    for offset, length in scan.frames:
        payload = framing.payload_of(data, offset, length)
        end = offset + framing.FRAME_OVERHEAD + length
        try:
            kind, tag, step, wall, body = codec.decode_payload(payload)
            if kind == codec.SCALARS:
                series = codec.decode_scalars(body)
                tags, counts = (body["tags"], body["c"]) if tag is None else ([tag], [len(series)])
                items.append((end, None, (tags, counts, *series)))
            else:
                items.append((end, (kind, tag, step, wall), bytes(payload)))
        except codec.PayloadError:
            return False
    capture.add(items)
    _feed_capture(builder, capture)
    return True


def _feed_block(builder: blocks.BlockBuilder, fd: int, footer: blocks.Footer, shift: int) -> bool:
    """Feed the records of a block (origins shifted into the merged block's); False if damaged."""
    c, ev = footer.chunks, footer.events
    try:
        for i in range(len(c["offset"])):
            data = _read_record(fd, c["offset"][i], c["length"][i])
            if data is None:
                return False
            series = codec.decode_scalars(data)
            counts, origins = blocks.chunk_origins(data)
            builder.add_scalars(c["tag"][i], series, counts, origins + shift)
        for i in range(len(ev["offset"])):
            data = _read_record(fd, ev["offset"][i], ev["length"][i])
            if data is None:
                return False
            n = data["n"]
            origins = codec.decode_ints(data["oo"], n).tolist()
            steps, walls = data["st"], np.frombuffer(data["wl"], "<f8").tolist()
            if not (len(data["p"]) == len(steps) == len(walls) == n):
                return False
            kind, tag = data["kind"], ev["tag"][i]
            for payload, step, wall, origin in zip(data["p"], steps, walls, origins, strict=True):
                builder.add_event(kind, tag, step, wall, payload, origin + shift)
    except (codec.PayloadError, KeyError, TypeError):
        return False
    return True


def _read_record(fd: int, offset: int, length: int) -> dict | None:
    payload = framing.check_frame(os.pread(fd, framing.FRAME_OVERHEAD + length, offset))
    if payload is None:
        return None
    return codec.decode_payload(payload)[4]
