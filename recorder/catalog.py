"""What a run directory holds: its segments, the records in them, and the index that lists them.

A :class:`Catalog` is the shared inner part of :class:`~recorder.RunReader` and
:class:`~recorder.RunWriter` (which uses it once, on reopening a run). It reads segments
incrementally, verifies every frame it scans, and loads the index when one matches the segments, in
which case the indexed records are verified lazily, when their payload is first read.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from recorder import blocks, codec, framing
from recorder.records import CorruptionWarning, FormatError, Position

SEGMENT_RE = re.compile(r"^segment-(\d{6,})\.vdlr$")
INDEX_NAME = "index.vdli"
INDEX_VERSION = 1
# Event payloads larger than this are not kept in memory after scanning (read again on demand).
KEEP_EVENT_BYTES = 16 << 10


# Run directories whose files are not all on local disk (mirrors of runs in an object store,
# recorder/store.py): run directory -> fill(file name, offset, size), which returns those bytes
# (fetching them if needed), or None for a file that is whole on disk. Catalog.load reads records
# through it; block headers and footers are always on disk.
_SOURCES: dict[str, Callable[[str, int, int], bytes | None]] = {}


def register_source(run_dir: str, fill: Callable[[str, int, int], bytes | None]) -> None:
    """Have catalogs of ``run_dir`` read records through ``fill(name, offset, size)``."""
    _SOURCES[os.path.abspath(run_dir)] = fill


def unregister_source(run_dir: str) -> None:
    """Undo :func:`register_source`."""
    _SOURCES.pop(os.path.abspath(run_dir), None)


def segment_name(number: int) -> str:
    """File name of segment ``number``."""
    return f"segment-{number:06d}.vdlr"


def list_segments(run_dir: str) -> list[int]:
    """Numbers of the segment files in ``run_dir``, ascending."""
    numbers = []
    with os.scandir(run_dir) as it:
        for item in it:
            match = SEGMENT_RE.match(item.name)
            if match and item.is_file():
                numbers.append(int(match.group(1)))
    return sorted(numbers)


class Entry:
    """Where one record is and what it summarises (one index row)."""

    __slots__ = (
        "_first",
        "_last",
        "_src",
        "batch",
        "count",
        "data",
        "kind",
        "length",
        "lod",
        "offset",
        "parts",
        "segment",
        "seq",
        "smax",
        "smin",
        "step",
        "tag",
        "vmax",
        "vmin",
        "wall",
        "window",
    )

    def __init__(
        self,
        segment: int,
        offset: int,
        length: int,
        kind: str,
        tag: str | None,
        step: int | None,
        wall: float,
        count: int,
        smin: int | None,
        smax: int | None,
        vmin: float | None,
        vmax: float | None,
        data: Any = None,
        parts: list | None = None,
    ) -> None:
        self.segment = segment
        self.offset = offset
        self.length = length
        self.kind = kind
        self.tag = tag
        self.step = step
        self.wall = wall
        self.count = count
        self.smin = smin
        self.smax = smax
        self.vmin = vmin
        self.vmax = vmax
        self.data = data
        self.parts = parts  # a group chunk's part columns (codec.group_parts), else None
        self.seq = -1  # its number in write order, set by a reader
        self.batch = False  # a block's batch of events (data: the batch map)
        self.window: tuple[int, int] | None = None  # block records: origins kept (lo, hi]
        # A block record's summary frame (offset, payload length), if it has one: a chunk's
        # level-of-detail summary, or a batch's event index.
        self.lod: tuple[int, int] | None = None
        # The file holding it, and its origins: the positions just after the records its data
        # came from (first, last). For a record in a segment (computed when asked for) both are
        # its end; a block's record covers many.
        self._src: str | None = None
        self._first: Position | None = None
        self._last: Position | None = None

    @property
    def src(self) -> str:
        """The name of the file holding the record."""
        if self._src is None:
            self._src = segment_name(self.segment)
        return self._src

    @src.setter
    def src(self, name: str) -> None:
        self._src = name

    @property
    def first(self) -> Position:
        """The origin of its first piece of data (for a segment's record: its end)."""
        return self.last if self._first is None else self._first

    @first.setter
    def first(self, pos: Position) -> None:
        self._first = pos

    @property
    def last(self) -> Position:
        """The origin of its last piece of data (for a segment's record: its end)."""
        if self._last is None:
            self._last = Position(self.segment, self.offset + framing.FRAME_OVERHEAD + self.length)
        return self._last

    @last.setter
    def last(self, pos: Position) -> None:
        self._last = pos

    @classmethod
    def from_payload(cls, segment: int, offset: int, length: int, decoded: tuple) -> Entry:
        """Build the entry of a decoded payload ``(kind, tag, step, wall, data)``."""
        kind, tag, step, wall, data = decoded
        if kind == codec.SCALARS:
            parts = None
            if tag is None:
                parts = codec.group_parts(data["tags"], data["c"], codec.decode_scalars(data))
            return cls(
                segment, offset, length, kind, tag, step, wall, data["n"], data["smin"],
                data["smax"], data.get("vmin"), data.get("vmax"), data, parts,
            )  # fmt: skip
        return cls(segment, offset, length, kind, tag, step, wall, 1, step, step, None, None, data)

    def row(self) -> list:
        """The index row of this entry."""
        return [
            self.segment, self.offset, self.length, self.kind, self.tag, self.step, self.wall,
            self.count, self.smin, self.smax, self.vmin, self.vmax,
            None if self.parts is None else [
                c.tolist() if isinstance(c, np.ndarray) else c for c in self.parts
            ],
        ]  # fmt: skip

    @property
    def end(self) -> Position:
        """Position just after this record (for a block's record: after the last it came from)."""
        return self.last


@dataclass
class SegmentState:
    """Scanning state of one segment file."""

    number: int
    path: str
    fd: int
    created: float | None = None  # None until the header has been read
    scanned: int = 0  # bytes accounted for (valid records or reported damage)
    valid_end: int = 0  # end of the last valid record
    pending: int = 0  # bytes after ``scanned`` not yet decided (torn tail)


class SourceGone(Exception):
    """A file the catalog listed was replaced by compaction; the reader rebuilds its catalog."""


@dataclass
class BlockState:
    """A block file of the run, as far as it was read."""

    name: str
    path: str
    footer: blocks.Footer
    origins: blocks.Origins
    read_to: int = -1  # linear origin up to which its records were taken (-1: none)
    # The file's identity (device, inode) when its footer was read: a block rewritten under the
    # same name (summaries added by recorder.add_summaries) is another file.
    identity: tuple[int, int] | None = None
    size: int = 0  # the file's size when its footer was read

    @property
    def end(self) -> int:
        return int(self.origins.bases[-1])


# Sealed files (blocks, old segments) kept open at once for reading records, at most.
OPEN_FILES = 4


class Catalog:
    """The records of one run directory, read incrementally.

    A run holds segments (the log: records as flushed) and, once compaction ran, blocks that
    replace runs of sealed segments. The catalog lists the *layout* (the largest blocks, and the
    segments no block covers), reads block indexes and scans segments. When a file it listed is
    gone (compaction replaced it), its methods raise :class:`SourceGone`, and its owner builds a
    new catalog.

    Args:
        run_dir: the run directory (must exist).
        keep_data: keep decoded payloads in memory once read: scalar chunks (until a reader has
            folded them into its arrays) and events up to KEEP_EVENT_BYTES; larger events
            (images, audio) are read again from disk when asked for. A writer reopening a run
            only needs the summaries.
    """

    def __init__(self, run_dir: str, *, keep_data: bool = True) -> None:
        self.run_dir = run_dir
        self.keep_data = keep_data
        self.entries: list[Entry] = []
        self.segments: dict[int, SegmentState] = {}
        self.blocks: dict[str, BlockState] = {}
        self.damaged_records = 0
        self.damaged_bytes = 0
        self.bytes_read = 0
        self.index_used = False
        self.end = Position(0, 0)  # the end of what was read
        self._files: OrderedDict[str, int] = OrderedDict()  # sealed files open for reading
        self._pinned: list[dict[str, int]] = []
        self._fill = _SOURCES.get(os.path.abspath(run_dir))

    @property
    def remote(self) -> bool:
        """Whether the run's records are fetched from an object store (a mirror) as read."""
        return self._fill is not None

    def close(self) -> None:
        """Close the open files."""
        for state in self.segments.values():
            if state.fd >= 0:
                os.close(state.fd)
                state.fd = -1
        while self._files:
            os.close(self._files.popitem()[1])

    def open_files(self) -> int:
        """File descriptors held (the newest segment's, and a few sealed files')."""
        return sum(s.fd >= 0 for s in self.segments.values()) + len(self._files)

    @property
    def pending_bytes(self) -> int:
        """Bytes at segment ends not yet forming a complete record."""
        return sum(s.pending for s in self.segments.values())

    def _damage(self, path: str, offset: int, nbytes: int, why: str) -> None:
        self.damaged_records += 1
        self.damaged_bytes += nbytes
        warnings.warn(
            f"{path}: skipped {nbytes} damaged bytes at offset {offset} ({why})",
            CorruptionWarning,
            stacklevel=4,
        )

    def report_damage(self, entry: Entry, why: str) -> None:
        """Count and warn about a record found damaged after its checksum passed."""
        path = os.path.join(self.run_dir, entry.src)
        self._damage(path, entry.offset, framing.FRAME_OVERHEAD + entry.length, why)

    def pin(self) -> dict[str, int]:
        """Open every file the entries refer to and keep them open until :meth:`unpin`, so that a
        long iteration reads them even if compaction removes them meanwhile.

        Raises:
            SourceGone: one is gone already (build a new catalog, then pin again).
        """
        pinned: dict[str, int] = {}
        try:
            for name in {e.src for e in self.entries}:
                try:
                    fd = os.open(os.path.join(self.run_dir, name), os.O_RDONLY)
                except FileNotFoundError:
                    raise SourceGone(name) from None
                self._check_identity(name, fd)  # closes it when it raises
                pinned[name] = fd
        except BaseException:
            for fd in pinned.values():
                os.close(fd)
            raise
        self._pinned.append(pinned)
        return pinned

    def unpin(self, pinned: dict[str, int]) -> None:
        """Close the files of a :meth:`pin`."""
        self._pinned.remove(pinned)
        for fd in pinned.values():
            os.close(fd)

    def _fd(self, name: str) -> int:
        """A descriptor of the file ``name`` for preads: the newest segment's, or a sealed file's
        (opened on demand, a few kept). Raises SourceGone when compaction removed it."""
        for pinned in self._pinned:
            if name in pinned:
                return pinned[name]
        match = SEGMENT_RE.match(name)
        if match:
            state = self.segments.get(int(match.group(1)))
            if state is not None and state.fd >= 0:
                return state.fd
        fd = self._files.get(name)
        if fd is not None:
            self._files.move_to_end(name)
            return fd
        try:
            fd = os.open(os.path.join(self.run_dir, name), os.O_RDONLY)
        except FileNotFoundError:
            raise SourceGone(name) from None
        self._check_identity(name, fd)
        self._files[name] = fd
        while len(self._files) > OPEN_FILES:
            os.close(self._files.popitem(last=False)[1])
        return fd

    def _check_identity(self, name: str, fd: int) -> None:
        """Raise SourceGone (closing ``fd``) if the block ``name`` is not the file whose footer
        this catalog read (it was rewritten under the same name)."""
        state = self.blocks.get(name)
        if state is None or state.identity is None:
            return
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != state.identity:
            os.close(fd)
            raise SourceGone(name)

    def fd_of(self, entry: Entry) -> int | None:
        """A descriptor of the file holding ``entry``, for preads until the next call that may
        open another file; None when reads must go through :meth:`pread` (a run mirrored from
        an object store, whose files may not be whole on disk). Raises SourceGone when
        compaction replaced the file."""
        fd = self._fd(entry.src)
        return None if self._fill is not None else fd

    def pread(self, entry: Entry, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of the file holding ``entry`` (no checksum: the caller
        verifies). Raises SourceGone when compaction replaced the file."""
        fd = self._fd(entry.src)
        data = None
        if self._fill is not None:  # a mirror of a run in an object store
            data = self._fill(entry.src, offset, size)
        if data is None:
            data = os.pread(fd, size, offset)
        self.bytes_read += len(data)
        return data

    def load_lod(self, entry: Entry) -> blocks.Lod | None:
        """The level-of-detail summary of a block chunk, verified; None if it has none or it is
        damaged (the chunk itself is then read whole, which reports damage if it has any).

        Raises:
            SourceGone: the file holding it was replaced by compaction.
        """
        if entry.lod is None:
            return None
        offset, length = entry.lod
        payload = framing.check_frame(self.pread(entry, offset, framing.FRAME_OVERHEAD + length))
        if payload is None:
            return None
        try:
            lod = blocks.decode_lod(payload)
        except codec.PayloadError:
            return None
        return lod if lod.n == entry.count else None

    def load_event_index(self, entry: Entry) -> blocks.EventIndex | None:
        """The event index of a block's batch, verified; None if it has none or it is damaged
        (the batch is then read whole).

        Raises:
            SourceGone: the file holding it was replaced by compaction.
        """
        if entry.lod is None or not entry.batch:
            return None
        offset, length = entry.lod
        payload = framing.check_frame(self.pread(entry, offset, framing.FRAME_OVERHEAD + length))
        if payload is None:
            return None
        try:
            return blocks.decode_event_index(payload, entry.count)
        except codec.PayloadError:
            return None

    def _open_segment(self, number: int) -> SegmentState:
        state = self.segments.get(number)
        if state is None:
            path = os.path.join(self.run_dir, segment_name(number))
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise SourceGone(segment_name(number)) from None
            state = SegmentState(number, path, fd)
            self.segments[number] = state
        elif state.fd < 0:
            try:
                state.fd = os.open(state.path, os.O_RDONLY)
            except FileNotFoundError:
                raise SourceGone(segment_name(number)) from None
        return state

    def _seal(self, state: SegmentState) -> None:
        """Close the descriptor of a segment a later file follows (read again on demand)."""
        if state.fd >= 0:
            os.close(state.fd)
            state.fd = -1

    def _read_header(self, state: SegmentState, sealed: bool) -> bool:
        """Read the header of ``state`` if not done yet; False while it is still incomplete."""
        if state.created is not None:
            return True
        head = os.pread(state.fd, framing.HEADER_SIZE, 0)
        try:
            if len(head) < framing.HEADER_SIZE and not sealed:
                if head[: len(framing.MAGIC)] != framing.MAGIC[: len(head)]:
                    raise framing.HeaderError("wrong magic number: not a vdl-stream recorder file")
                return False  # the writer is creating it (or crashed doing so)
            _, number, created = framing.decode_header(head)
        except framing.HeaderError as exc:
            raise FormatError(f"{state.path}: {exc}") from None
        if number != state.number:
            raise FormatError(
                f"{state.path}: header says segment {number}, file name says {state.number}"
            )
        state.created = created
        state.scanned = state.valid_end = framing.HEADER_SIZE
        return True

    def layout(self) -> tuple[list[tuple[int, int, str | None]], dict[str, tuple[int, int]]]:
        """The files that make up the run now, in order: ``(first segment, last segment, block
        name or None for a segment)``; and every block file present with its range."""
        segments, found = [], {}
        with os.scandir(self.run_dir) as it:
            for item in it:
                match = SEGMENT_RE.match(item.name)
                if match:
                    segments.append(int(match.group(1)))
                    continue
                rng = blocks.parse_block_name(item.name)
                if rng is not None:
                    found[item.name] = rng
        # A block inside a larger one is an input of a merge not yet deleted; segments inside a
        # block are compacted ones not yet deleted: the larger file wins (it is complete, since
        # the writer renames it into place only once written and fsynced).
        chosen: list[tuple[int, int, str]] = []
        for name, (a, b) in sorted(found.items(), key=lambda kv: (kv[1][0], -kv[1][1])):
            if chosen and a <= chosen[-1][1]:
                continue
            chosen.append((a, b, name))
        out: list[tuple[int, int, str | None]] = list(chosen)
        k = 0
        for n in sorted(segments):
            while k < len(chosen) and chosen[k][1] < n:
                k += 1
            if k < len(chosen) and chosen[k][0] <= n <= chosen[k][1]:
                continue
            out.append((n, n, None))
        out.sort(key=lambda x: x[0])
        return out, found

    def update(self, limit: Position | None = None) -> list[Entry]:
        """Read newly appended records (up to ``limit``); return the new entries, in order.

        Raises:
            FormatError: a segment has a wrong magic, a newer version or a damaged header.
            SourceGone: compaction replaced files this catalog had read; build a new one.
        """
        layout, _ = self.layout()
        for first, last, name in layout:
            if name is not None and name not in self.blocks:
                self._adopt(first, last, name)
        names = {name for _, _, name in layout if name is not None}
        if any(name not in names for name in self.blocks):
            raise SourceGone("a block was merged")
        raw = {a for a, _, name in layout if name is None}
        if any(n not in raw for n in self.segments):
            raise SourceGone("a segment was compacted")
        new: list[Entry] = []
        for i, (first, _last, name) in enumerate(layout):
            if limit is not None and first > limit.segment:
                break
            if name is not None:
                self._update_block(name, limit, new)
                continue
            state = self._open_segment(first)
            limited = limit is not None and first == limit.segment
            sealed = i + 1 < len(layout) and not limited
            # The header first, the size after: a size taken before a header the writer
            # completed meanwhile would look like a cut tail below, and the header would be
            # rescanned as a damaged record.
            header = self._read_header(state, sealed)
            size = os.fstat(state.fd).st_size
            if limited:
                # A limit inside the header (a reader that saw the segment before its header
                # was written) reads no record, but the header counts as read.
                size = min(size, max(limit.offset, framing.HEADER_SIZE) if header else limit.offset)
            if not header:
                state.pending = size
                self.end = max(self.end, Position(first, 0))
                continue
            if size < state.scanned:
                # A writer reopened the run and cut off a damaged tail this reader had skipped;
                # what it appends next starts at the last valid record.
                state.scanned = min(state.valid_end, size)
            if size > state.scanned:
                self._scan(state, size, sealed, new)
            else:
                state.pending = 0
            self.end = max(self.end, Position(first, state.scanned))
            if i + 1 < len(layout) and state.pending == 0:
                self._seal(state)
        self.entries.extend(new)
        return new

    def extent(self) -> list[tuple[str, int]] | None:
        """The data files this catalog read, each whole, as sorted ``(name, size)`` pairs (the
        form of :func:`recorder.digest.data_files`; a segment holding only its header is left
        out); None when it holds one in part (a limit short of its end, a torn tail pending)."""
        out = []
        for name, block in self.blocks.items():
            if block.read_to != block.end:
                return None
            out.append((name, block.size))
        for number, state in self.segments.items():
            if state.pending or state.created is None:
                return None
            if state.scanned > framing.HEADER_SIZE:
                out.append((segment_name(number), state.scanned))
        return sorted(out)

    def _adopt(self, first: int, last: int, name: str) -> None:
        """Take a new block that replaced files this catalog had read *completely* as read: its
        records are those already listed, so nothing needs reading again. Entries of the replaced
        files stay as they are; loading one whose file is gone raises SourceGone (the owner then
        rebuilds the catalog). Files read in part are left for SourceGone to handle."""
        known = [n for n in self.segments if first <= n <= last]
        inner = [b for b, st in self.blocks.items() if first <= st.footer.first <= last]
        if not known and not inner:
            return  # nothing of it was read: update() reads it
        path = os.path.join(self.run_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SourceGone(name) from None
        try:
            footer = blocks.read_footer(fd)
            st = os.fstat(fd)
        except blocks.BlockError as exc:
            raise FormatError(f"{path}: {exc}") from None
        finally:
            os.close(fd)
        sizes = {int(n): int(size) for n, _, size in footer.segments}
        for n in known:
            state = self.segments[n]
            if state.pending or state.scanned != sizes.get(n) or self.end < Position(n, sizes[n]):
                return
        if any(self.blocks[b].read_to != self.blocks[b].end for b in inner):
            return
        covered = {n for b in inner for n, _, _ in self.blocks[b].footer.segments} | set(known)
        if covered != set(sizes):
            return  # a part of it was never read here
        for n in known:
            self._seal(self.segments.pop(n))
        for b in inner:
            del self.blocks[b]
        state = BlockState(name, path, footer, blocks.Origins(footer.segments))
        state.identity, state.size = (st.st_dev, st.st_ino), st.st_size
        state.read_to = state.end
        self.blocks[name] = state

    def _update_block(self, name: str, limit: Position | None, out: list[Entry]) -> None:
        state = self.blocks.get(name)
        if state is None:
            try:
                fd = self._fd(name)
                footer = blocks.read_footer(fd)
            except blocks.BlockError as exc:
                raise FormatError(f"{os.path.join(self.run_dir, name)}: {exc}") from None
            state = BlockState(
                name, os.path.join(self.run_dir, name), footer, blocks.Origins(footer.segments)
            )
            st = os.fstat(fd)
            state.identity, state.size = (st.st_dev, st.st_ino), st.st_size
            self.blocks[name] = state
        hi = state.end if limit is None else min(state.end, state.origins.linear(limit))
        lo = max(state.read_to, state.origins.linear(self.end))
        if hi > lo:
            out.extend(self._block_entries(state, lo, hi))
        state.read_to = max(state.read_to, hi)
        if state.read_to >= 0:
            self.end = max(self.end, state.origins.position(state.read_to))

    def _block_entries(self, state: BlockState, lo: int, hi: int) -> list[Entry]:
        """Entries of the records of a block with origins in ``(lo, hi]``, in origin order."""
        footer = state.footer
        to_pos = state.origins.position
        rows: list[tuple[int, Entry]] = []
        c = footer.chunks
        lod_offsets = c.get("lod_offset")
        lod_lengths = c.get("lod_length")
        for i in range(len(c["offset"])):
            o_first, o_last = c["o_first"][i], c["o_last"][i]
            if o_last <= lo or o_first > hi:
                continue
            e = Entry(
                -1, c["offset"][i], c["length"][i], codec.SCALARS, c["tag"][i],
                c["first_step"][i], c["first_wall"][i], c["count"][i], c["smin"][i],
                c["smax"][i], c["vmin"][i], c["vmax"][i],
            )  # fmt: skip
            e.src = state.name
            e.first, e.last = to_pos(o_first), to_pos(o_last)
            if o_first <= lo or o_last > hi:
                e.window = (lo, hi)
                if not self._window_summary(e, state):
                    continue
            elif lod_offsets is not None and lod_offsets[i] is not None:
                e.lod = (int(lod_offsets[i]), int(lod_lengths[i]))
            rows.append((o_first, e))
        ev = footer.events
        idx_offsets = ev.get("idx_offset")
        idx_lengths = ev.get("idx_length")
        for i in range(len(ev["offset"])):
            o_first, o_last = ev["o_first"][i], ev["o_last"][i]
            if o_last <= lo or o_first > hi:
                continue
            e = Entry(
                -1, ev["offset"][i], ev["length"][i], ev["kind"][i], ev["tag"][i],
                ev["first_step"][i], ev["first_wall"][i], ev["count"][i], ev["smin"][i],
                ev["smax"][i], None, None,
            )  # fmt: skip
            e.src = state.name
            e.batch = True
            e.first, e.last = to_pos(o_first), to_pos(o_last)
            if o_first <= lo or o_last > hi:
                e.window = (lo, hi)
                if not self._window_summary(e, state):
                    continue
            elif idx_offsets is not None and idx_offsets[i] is not None:
                e.lod = (int(idx_offsets[i]), int(idx_lengths[i]))
            rows.append((o_first, e))
        rows.sort(key=lambda r: r[0])
        return [e for _, e in rows]

    def _window_summary(self, e: Entry, state: BlockState) -> bool:
        """Fill in the summary of a block record cut by a window; False if nothing is left."""
        data = self.load(e, keep=False)
        if data is None or data["n"] == 0:
            return False
        to_pos = state.origins.position
        if e.batch:
            origins = codec.decode_ints(data["oo"], data["n"])
            events = [codec.decode_payload(p) for p in data["p"]]
            steps = [ev[2] for ev in events if ev[2] is not None]
            e.count = len(events)
            e.step, e.wall = events[0][2], events[0][3]
            e.smin, e.smax = (min(steps), max(steps)) if steps else (None, None)
        else:
            series = codec.decode_scalars(data)
            _, origins = blocks.chunk_origins(data)
            e.count = len(series.steps)
            e.step, e.wall = int(series.steps[0]), float(series.walls[0])
            e.smin, e.smax, e.vmin, e.vmax = codec.scalar_summary(series.steps, series.values)
        e.first, e.last = to_pos(int(origins[0])), to_pos(int(origins[-1]))
        return True

    def _scan(self, state: SegmentState, size: int, sealed: bool, out: list[Entry]) -> None:
        start = state.scanned
        data = os.pread(state.fd, size - start, start)
        self.bytes_read += len(data)
        scan = framing.scan_frames(data, 0, sealed=sealed)
        for offset, nbytes in scan.damaged:
            self._damage(state.path, start + offset, nbytes, "checksum mismatch")
        for offset, length in scan.frames:
            payload = framing.payload_of(data, offset, length)
            try:
                decoded = codec.decode_payload(payload)
                entry = Entry.from_payload(state.number, start + offset, length, decoded)
            except codec.PayloadError as exc:
                self._damage(state.path, start + offset, framing.FRAME_OVERHEAD + length, str(exc))
                continue
            if not self._keeps(entry):
                entry.data = None
            out.append(entry)
        state.scanned = start + scan.end
        if scan.frames:
            state.valid_end = start + scan.valid_end
        state.pending = size - state.scanned

    def _keeps(self, entry: Entry) -> bool:
        return self.keep_data and (entry.kind == codec.SCALARS or entry.length <= KEEP_EVENT_BYTES)

    def load(self, entry: Entry, *, keep: bool = True) -> Any:
        """The decoded data of ``entry``, reading and verifying it if needed; None if damaged.

        With ``keep=False`` the data is not kept in memory (a streaming read). A block's record
        cut by a window comes back cut to it.

        Raises:
            SourceGone: the file holding it was replaced by compaction.
        """
        if entry.data is not None:
            return entry.data
        fd = self._fd(entry.src)
        frame = None
        if self._fill is not None:
            frame = self._fill(entry.src, entry.offset, framing.FRAME_OVERHEAD + entry.length)
        if frame is None:
            frame = os.pread(fd, framing.FRAME_OVERHEAD + entry.length, entry.offset)
        self.bytes_read += len(frame)
        payload = framing.check_frame(frame)
        why = "checksum mismatch"
        if payload is not None:
            try:
                decoded = codec.decode_payload(payload)
                data = decoded[4]
                kind = data["kind"] if entry.batch and isinstance(data, dict) else decoded[0]
                if entry.window is not None:
                    data = _cut(entry, data)
            except (codec.PayloadError, KeyError, TypeError) as exc:
                why = str(exc)
            else:
                if kind == entry.kind and decoded[1] == entry.tag:
                    if keep and self._keeps(entry):
                        entry.data = data
                    return data
                why = "record does not match the index"
        self._damage(os.path.join(self.run_dir, entry.src), entry.offset, len(frame), why)
        return None

    def load_index(self, limit: Position | None = None) -> bool:
        """Adopt the index file if it matches the segments; return whether it was used.

        A missing index is normal (a live run); a damaged or stale one is reported with a warning
        and ignored, and the records are then found by scanning the segments. With ``limit``, only
        the records ending at or before it are adopted. A run with blocks has block indexes
        instead: the index file (written before compaction) is then ignored.
        """
        path = os.path.join(self.run_dir, INDEX_NAME)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return False
        if self.layout()[1]:
            return False
        try:
            segments, rows = _decode_index(blob)
            states = []
            for number, created, size in segments:
                state = self._open_segment(number)
                self._read_header(state, sealed=True)
                if state.created != created or os.fstat(state.fd).st_size < size:
                    raise ValueError(f"segment {number} changed since the index was written")
                states.append((state, size))
            entries = [Entry(*row[:12], None, row[12]) for row in rows]
        except (ValueError, TypeError, FormatError, OSError, SourceGone) as exc:
            warnings.warn(
                f"{path}: ignoring the index ({exc}); rebuilding it from the segments",
                CorruptionWarning,
                stacklevel=3,
            )
            self.close()
            self.segments.clear()
            return False
        if limit is not None:
            entries = [e for e in entries if e.end <= limit]
        for state, size in states:
            if limit is not None and Position(state.number, size) > limit:
                if state.number > limit.segment:
                    continue  # scanned from its header by a later update()
                ends = [e.end.offset for e in entries if e.segment == state.number]
                size = max(ends, default=framing.HEADER_SIZE)
            state.scanned = state.valid_end = size
        self.entries.extend(entries)
        self.index_used = True
        return True


def _cut(entry: Entry, data: dict) -> dict:
    """The data of a block record keeping only what came from origins in ``entry.window``."""
    lo, hi = entry.window
    if entry.batch:
        origins = codec.decode_ints(data["oo"], data["n"])
        keep = np.flatnonzero((origins > lo) & (origins <= hi))
        if not len(keep):
            return {"n": 0}
        return {
            "kind": data["kind"],
            "n": len(keep),
            "p": [data["p"][i] for i in keep.tolist()],
            "oo": codec.encode_ints(origins[keep]),
            "st": [data["st"][i] for i in keep.tolist()],
            "wl": np.frombuffer(data["wl"], "<f8")[keep].tobytes(),
        }
    series = codec.decode_scalars(data)
    counts, origins = blocks.chunk_origins(data)
    per_point = np.repeat(origins, counts)
    keep = (per_point > lo) & (per_point <= hi)
    if not keep.any():
        return {"n": 0}
    cut = codec.scalar_data(*(col[keep] for col in series))
    pieces = (origins > lo) & (origins <= hi)
    cut["k"] = int(pieces.sum())
    cut["oc"] = codec.encode_ints(counts[pieces])
    cut["oo"] = codec.encode_ints(origins[pieces])
    return cut


def _decode_index(blob: bytes) -> tuple[list, list]:
    try:
        framing.decode_header(blob[: framing.HEADER_SIZE], magic=framing.INDEX_MAGIC)
    except framing.HeaderError as exc:
        raise ValueError(str(exc)) from None
    payload = framing.check_frame(blob[framing.HEADER_SIZE :])
    if payload is None:
        raise ValueError("checksum mismatch")
    obj = msgpack.unpackb(payload, raw=False)
    if not isinstance(obj, dict) or obj.get("version") != INDEX_VERSION:
        raise ValueError("unknown index layout")
    segments, rows = obj["segments"], obj["rows"]
    if any(len(row) != 13 for row in rows):
        raise ValueError("malformed index row")
    return segments, rows


def encode_index(
    segments: list[tuple[int, float, int]], entries: list[Entry], created: float
) -> bytes:
    """The bytes of an index file listing ``entries`` and covering ``(number, created, size)``."""
    payload = msgpack.packb(
        {
            "version": INDEX_VERSION,
            "segments": [list(s) for s in segments],
            "rows": [e.row() for e in entries],
        },
        use_bin_type=True,
    )
    return framing.encode_header(0, created, magic=framing.INDEX_MAGIC) + framing.encode_frame(
        payload
    )
