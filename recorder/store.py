"""Runs on object storage: the layout of a run's objects, publishing a local run, reading one back.

An object store cannot append, so a run lives in two places. Its *head* is the run directory a
writer appends to on local disk (crash-safe as ever). What the writer has sealed, compacted block
files and sealed segments, never changes again, and is published as immutable objects named by
their content; a small *manifest* object names the files that make up the run now. A publisher
uploads the new objects first and the manifest last (one PUT replaces it whole), so a reader that
reads the manifest never sees a half state; objects a newer manifest no longer names are deleted
after a grace period, so a reader holding an older manifest can still read them.

A reader never downloads a run whole: :class:`RunMirror` makes a local directory in which each
block is a sparse file holding only its header and footer (one ranged read per block), and
segments are fetched whole (they are the small, uncompacted tail). :class:`RangeCache` fetches the
bytes of a record when :class:`~recorder.catalog.Catalog` is about to read them (a hook in
``Catalog.load``), and bounds the bytes fetched, all mirrored runs together. A
:class:`~recorder.RunReader` on the mirror directory then reads the run as it reads any other.

Object layout under the store's prefix (docs/object-storage.md)::

    <run>/manifest.vdlm                       JSON, rewritten whole on every change
    <run>/<file name>.<16 hex digits>         a file of the run, immutable (blake2b-64 of its bytes)

The store itself is anything with the five methods of :class:`ObjectStore` (``vdl_stream.storage``
adapts obstore, the Rust ``object_store`` crate: S3, GCS, Azure). Plain blocking calls; no threads
of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from recorder import blocks, framing
from recorder.catalog import SEGMENT_RE, Catalog, register_source, segment_name, unregister_source

MANIFEST = "manifest.vdlm"
MANIFEST_FORMAT = "vdl-stream-manifest"
MANIFEST_VERSION = 1
# A local run directory that mirrors a run in the store holds this file (readers ignore it).
MIRROR_MARKER = ".vdl-mirror"
FILE_RE = re.compile(r"^(?:block-\d{6,}-\d{6,}\.vdlb|segment-\d{6,}\.vdlr)$")
OBJECT_RE = re.compile(r"^(block-\d{6,}-\d{6,}\.vdlb|segment-\d{6,}\.vdlr)\.[0-9a-f]{16}$")
# Objects no manifest names any more are deleted this long after they were replaced.
GRACE_SECONDS = 60.0
# Sealed files larger than this are uploaded from the file (a multipart upload), not from memory.
STREAM_BYTES = 8 << 20
# A fetch for a record reads at least this many bytes (the next records come with it).
MIN_FETCH = 1 << 20
# What a manifest may claim, at most: a reader fetches segments and block footers whole.
MAX_FILE = 1 << 40
MAX_SEGMENT = 1 << 30
MAX_FOOTER = 256 << 20
_TRAILER = struct.Struct("<QII8s")  # a block's trailer (docs/record-format.md, "Block file")


class StoreError(OSError):
    """The object store could not be reached or refused a request (the message says which)."""


class ManifestError(ValueError):
    """A manifest object is not one this version reads (the message says why)."""


@dataclass(frozen=True)
class ObjectInfo:
    """An object found by :meth:`ObjectStore.list`."""

    key: str
    size: int
    etag: str | None = None
    modified: float | None = None  # Unix seconds


class ObjectStore(Protocol):
    """The five blocking calls the run layout needs from an object store.

    Keys are relative to the store's prefix and use ``/``. ``get`` and ``get_ranges`` raise
    :class:`FileNotFoundError` for a missing key; any other failure is an :class:`OSError`.
    """

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """Write the object ``key`` whole (atomically replacing an older one), from bytes or
        from a file open for reading at its start."""

    def get(self, key: str) -> bytes:
        """Read the object ``key`` whole."""

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Read byte ranges ``[start, end)`` of the object ``key``."""

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``."""

    def delete(self, keys: Sequence[str]) -> None:
        """Delete the objects ``keys`` (missing ones are not an error)."""


@dataclass(frozen=True)
class FileRef:
    """A file of a run as the manifest names it.

    Attributes:
        name: its file name in the run directory.
        key: the object holding its bytes.
        size: its size in bytes.
        tail: for a block, the offset of its footer frame (header and ``[tail, size)`` are what
            a reader fetches to open it); None for a segment.
    """

    name: str
    key: str
    size: int
    tail: int | None = None


@dataclass
class Manifest:
    """What makes up a run in the store now (the files of its layout, in order)."""

    run: str
    files: list[FileRef]
    generation: int = 0
    written: float = 0.0

    def encode(self) -> bytes:
        """The manifest as the JSON bytes of its object."""
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "version": MANIFEST_VERSION,
                "run": self.run,
                "generation": self.generation,
                "written": self.written,
                "files": [[f.name, f.key, f.size, f.tail] for f in self.files],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, blob: bytes, run: str) -> Manifest:
        """Parse and check a manifest object of ``run``.

        Raises:
            ManifestError: not JSON, another format, a newer version, another run, or a file
                entry that is malformed or names an object outside the run.
        """
        try:
            obj = json.loads(blob)
        except (UnicodeDecodeError, ValueError):
            raise ManifestError("not a vdl-stream manifest (not JSON)") from None
        if not isinstance(obj, dict) or obj.get("format") != MANIFEST_FORMAT:
            raise ManifestError("not a vdl-stream manifest (no format field)")
        version = obj.get("version")
        if not isinstance(version, int) or version > MANIFEST_VERSION:
            raise ManifestError(f"manifest version {version!r} is newer than this reader reads")
        if obj.get("run") != run:
            raise ManifestError(f"manifest names run {obj.get('run')!r}, found under {run!r}")
        files = []
        for item in obj.get("files", None) or []:
            try:
                name, key, size, tail = item
            except (TypeError, ValueError):
                raise ManifestError(f"malformed file entry {item!r:.80}") from None
            match = OBJECT_RE.match(key[len(run) + 1 :]) if isinstance(key, str) else None
            if (
                not isinstance(name, str)
                or not FILE_RE.match(name)
                or not key.startswith(run + "/")
                or match is None
                or match.group(1) != name
                or type(size) is not int
                or not framing.HEADER_SIZE <= size <= MAX_FILE
                or not (tail is None or (type(tail) is int and 0 < tail < size))
                or (tail is None and size > MAX_SEGMENT)
                or (tail is not None and size - tail > MAX_FOOTER)
            ):
                raise ManifestError(f"malformed file entry {item!r:.80}")
            files.append(FileRef(name, key, size, tail))
        return cls(run, files, int(obj.get("generation", 0)), float(obj.get("written", 0.0)))


def manifest_key(run: str) -> str:
    """The key of ``run``'s manifest."""
    return f"{run}/{MANIFEST}"


def object_key(run: str, name: str, data: bytes) -> str:
    """The key of the object holding file ``name`` of ``run`` with content ``data``."""
    return f"{run}/{name}.{hashlib.blake2b(data, digest_size=8).hexdigest()}"


def _streamed_ref(run: str, name: str, f: BinaryIO, size: int, block: bool) -> FileRef:
    """The :class:`FileRef` of the open file ``f`` of ``size`` bytes, read in pieces (a large
    sealed file is uploaded from the file, never held in memory)."""
    digest = hashlib.blake2b(digest_size=8)
    left = size
    while left > 0:
        piece = f.read(min(left, 1 << 20))
        if not piece:
            break
        digest.update(piece)
        left -= len(piece)
    f.seek(0)
    tail = None
    if block and size >= framing.HEADER_SIZE + blocks.TRAILER_SIZE:
        trailer = os.pread(f.fileno(), blocks.TRAILER_SIZE, size - blocks.TRAILER_SIZE)
        tail = _trailer_offset(trailer, size)
    return FileRef(name, f"{run}/{name}.{digest.hexdigest()}", size - left, tail)


def find_runs(infos: Sequence[ObjectInfo]) -> tuple[dict[str, ObjectInfo], list[str]]:
    """Sort the objects of a listing: ``(run -> its manifest object, foreign keys)``.

    A foreign key is one this layout never writes (a stray file, another tool's data); readers
    skip it.
    """
    runs: dict[str, ObjectInfo] = {}
    foreign: list[str] = []
    for info in infos:
        run, _, leaf = info.key.rpartition("/")
        parts = run.split("/")
        if not run or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            foreign.append(info.key)
        elif leaf == MANIFEST:
            runs[run] = info
        elif not OBJECT_RE.match(leaf):
            foreign.append(info.key)
    return runs, foreign


def read_manifest(store: ObjectStore, run: str) -> Manifest | None:
    """The manifest of ``run`` in ``store``, or None if it has none.

    Raises:
        ManifestError: the object is not a manifest this version reads.
        OSError: the store failed.
    """
    try:
        blob = store.get(manifest_key(run))
    except FileNotFoundError:
        return None
    return Manifest.decode(blob, run)


def footer_offset(data: bytes) -> int | None:
    """Where a block's footer frame starts (from its trailer), or None if the trailer is bad."""
    if len(data) < framing.HEADER_SIZE + blocks.TRAILER_SIZE:
        return None
    return _trailer_offset(data[len(data) - blocks.TRAILER_SIZE :], len(data))


def _trailer_offset(trailer: bytes, size: int) -> int | None:
    offset, _length, _crc, magic = _TRAILER.unpack(trailer)
    if magic != blocks.TRAILER_MAGIC or not framing.HEADER_SIZE <= offset < size:
        return None
    return offset


def _valid_prefix(data: bytes) -> bytes:
    """``data`` (a segment being written) cut after its last complete, valid frame."""
    if len(data) <= framing.HEADER_SIZE:
        return data
    scan = framing.scan_frames(data, framing.HEADER_SIZE, sealed=False)
    return data[: scan.end]


@dataclass
class PublishStatistics:
    """What a :class:`RunPublisher` did so far."""

    manifests: int = 0
    objects: int = 0
    bytes: int = 0
    deleted: int = 0


class RunPublisher:
    """Publishes one local run directory to the store, as its writer seals and compacts files.

    Call :meth:`publish` whenever the directory may have changed (it reads only the directory
    listing when nothing did). Sealed files (blocks, and segments before the newest) are uploaded
    once; the newest segment, the head, is uploaded (its complete records) at most every
    ``head_interval`` seconds, or at every call with ``final=True``.

    Args:
        store: the object store.
        run: the run's name (its key prefix).
        run_dir: the local run directory.
        head_interval: seconds between two uploads of the head segment.
        grace: seconds an object no manifest names any more is kept before deletion.
        announce: called with each new manifest just before it is PUT, so that the caller can
            record what it is about to publish (a process killed between the PUT and its own
            record of it must not find its copy of the run looking superseded).
    """

    def __init__(
        self,
        store: ObjectStore,
        run: str,
        run_dir: str,
        *,
        head_interval: float = 10.0,
        grace: float = GRACE_SECONDS,
        announce: Callable[[Manifest], None] | None = None,
    ) -> None:
        self.store = store
        self.run = run
        self.announce = announce
        self.run_dir = run_dir
        self.head_interval = head_interval
        self.grace = grace
        self.published: dict[str, FileRef] | None = None  # None: not read from the store yet
        self.generation = 0
        self.stats = PublishStatistics()
        self._head_time = -float("inf")
        self._garbage: list[tuple[float, str]] = []

    def adopt(self, manifest: Manifest | None) -> None:
        """Take ``manifest`` as what the store holds (no request)."""
        self.published = {} if manifest is None else {f.name: f for f in manifest.files}
        self.generation = 0 if manifest is None else manifest.generation

    def pending(self) -> bool:
        """Whether the head has changed since it was last published (a final publish is due)."""
        return self.published is None or self._head_changed()

    def _head_changed(self) -> bool:
        try:
            layout = Catalog(self.run_dir, keep_data=False).layout()[0]
        except FileNotFoundError:
            return False
        if not layout or layout[-1][2] is not None:
            return False
        name = segment_name(layout[-1][0])
        old = (self.published or {}).get(name)
        try:
            return old is None or os.path.getsize(os.path.join(self.run_dir, name)) != old.size
        except FileNotFoundError:
            return False

    def publish(self, *, final: bool = False, now: float | None = None) -> bool:
        """Upload what changed, then the manifest; delete objects replaced long enough ago.

        Returns whether a new manifest was published. A file that compaction removed while it
        was being read ends the call early (the next call sees the new layout).

        Raises:
            OSError: the store failed (nothing is lost: the local run keeps everything, and the
                next call starts over).
        """
        now = time.monotonic() if now is None else now
        if self.published is None:
            self.adopt(read_manifest(self.store, self.run))
            self._sweep()
        assert self.published is not None
        uploads: list[tuple[FileRef, bytes | BinaryIO]] = []
        try:
            return self._publish(final, now, uploads)
        finally:
            for _, data in uploads:
                if not isinstance(data, bytes):
                    data.close()

    def _publish(
        self, final: bool, now: float, uploads: list[tuple[FileRef, bytes | BinaryIO]]
    ) -> bool:
        assert self.published is not None
        layout = Catalog(self.run_dir, keep_data=False).layout()[0]
        refs: list[FileRef] = []
        for i, (first, _last, block) in enumerate(layout):
            name = block if block is not None else segment_name(first)
            head = block is None and i == len(layout) - 1
            old = self.published.get(name)
            path = os.path.join(self.run_dir, name)
            try:
                size = os.path.getsize(path)
                if (
                    head
                    and old is not None
                    and not final
                    and now - self._head_time < self.head_interval
                ):
                    # Published later: readers see the older head meanwhile. A new head (once
                    # per compaction) goes at once: a run is only a run with a segment.
                    refs.append(old)
                    continue
                if old is not None and old.size == size:
                    refs.append(old)
                    continue
                if not head and size > STREAM_BYTES:
                    # Uploaded from the open file (still readable if compaction deletes it).
                    f = open(path, "rb")  # noqa: SIM115 (closed by publish())
                    uploads.append((_streamed_ref(self.run, name, f, size, block is not None), f))
                    refs.append(uploads[-1][0])
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return False  # compacted meanwhile
            if head:
                data = _valid_prefix(data)
                if old is not None and old.size == len(data):
                    refs.append(old)
                    continue
            ref = FileRef(
                name,
                object_key(self.run, name, data),
                len(data),
                footer_offset(data) if block is not None else None,
            )
            refs.append(ref)
            uploads.append((ref, data))
        if any(SEGMENT_RE.match(r.name) for r, _ in uploads):
            self._head_time = now
        changed = uploads or [r.name for r in refs] != list(self.published)
        if changed:
            for ref, data in uploads:
                self.store.put(ref.key, data)
                self.stats.objects += 1
                self.stats.bytes += ref.size
            manifest = Manifest(self.run, refs, self.generation + 1, time.time())
            if self.announce is not None:
                self.announce(manifest)
            self.store.put(manifest_key(self.run), manifest.encode())
            self.stats.manifests += 1
            kept = {r.key for r in refs}
            self._garbage.extend((now, f.key) for f in self.published.values() if f.key not in kept)
            self.published = {r.name: r for r in refs}
            self.generation = manifest.generation
        self._collect(now)
        return bool(changed)

    def _sweep(self) -> None:
        """Delete objects of this run that its manifest does not name and that are older than
        the grace period: left by a publisher that stopped before deleting what it replaced."""
        assert self.published is not None
        named = {f.key for f in self.published.values()}
        cutoff = time.time() - self.grace
        orphans = [
            o.key
            for o in self.store.list(self.run + "/")
            if OBJECT_RE.match(o.key[len(self.run) + 1 :])
            and o.key not in named
            and o.modified is not None
            and o.modified < cutoff
        ]
        if orphans:
            self.store.delete(orphans)
            self.stats.deleted += len(orphans)

    def _collect(self, now: float) -> None:
        due = [key for t, key in self._garbage if now - t >= self.grace]
        if not due:
            return
        self.store.delete(due)
        self.stats.deleted += len(due)
        gone = set(due)
        self._garbage = [(t, k) for t, k in self._garbage if k not in gone]


class _Sparse:
    """A block file of a mirror: which byte ranges are present."""

    __slots__ = ("key", "lock", "pinned", "ranges", "size", "store", "used")

    def __init__(self, store: ObjectStore, key: str, size: int, pinned: list) -> None:
        self.store = store
        self.key = key
        self.size = size
        self.pinned = pinned  # [(offset, bytes)]: header and footer, never evicted
        self.ranges: list[list[int]] = [[o, o + len(b)] for o, b in pinned]
        self.lock = threading.Lock()
        self.used = time.monotonic()

    def missing(self, lo: int, hi: int) -> bool:
        return not any(a <= lo and hi <= b for a, b in self.ranges)

    def add(self, lo: int, hi: int) -> int:
        """Mark ``[lo, hi)`` present; return how many bytes were new."""
        before = self.filled()
        merged: list[list[int]] = []
        for a, b in sorted([*self.ranges, [lo, hi]]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.ranges = merged
        return self.filled() - before

    def filled(self) -> int:
        return sum(b - a for a, b in self.ranges)


@dataclass
class CacheStatistics:
    """What a :class:`RangeCache` holds and fetched."""

    files: int = 0
    bytes: int = 0
    budget: int = 0
    fetches: int = 0
    fetched_bytes: int = 0
    evictions: int = 0


class RangeCache:
    """Bytes of mirrored block files, fetched from the store on demand, bounded in total.

    Each block file of a mirror is a sparse local file of its full size. Its header and footer are
    written when it is mirrored and stay; the bytes of a record are fetched (at least
    ``min_fetch`` of them) when a reader is about to read it. Past ``budget`` bytes, the least
    recently used files (not the one being filled) are emptied back to header and footer.
    Readers read records through :meth:`fill`, under the file's lock, so an eviction never
    shows them a hole. Thread-safe.

    Args:
        budget: bytes of fetched records kept, all files together.
        min_fetch: the least a fetch reads.
    """

    def __init__(self, budget: int = 256 << 20, min_fetch: int = MIN_FETCH) -> None:
        if type(budget) is not int or budget <= 0:
            raise ValueError(f"budget must be a positive int, got {budget!r}")
        self.budget = budget
        self.min_fetch = min_fetch
        self._files: OrderedDict[str, _Sparse] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._stats = CacheStatistics(budget=budget)

    def add(self, path: str, store: ObjectStore, key: str, size: int, pinned: list) -> None:
        """Track the sparse file ``path`` (the object ``key`` of ``size`` bytes) whose ``pinned``
        ``[(offset, bytes)]`` are written."""
        with self._lock:
            old = self._files.pop(path, None)
            if old is not None:
                self._bytes -= old.filled() - _pinned_bytes(old)
            self._files[path] = _Sparse(store, key, size, pinned)

    def forget(self, path: str) -> None:
        """Stop tracking ``path`` (deleted, or made whole)."""
        with self._lock:
            old = self._files.pop(path, None)
            if old is not None:
                self._bytes -= old.filled() - _pinned_bytes(old)

    def fill(self, path: str, offset: int, size: int) -> bytes | None:
        """Return bytes ``[offset, offset + size)`` of ``path``, fetching them if they are not
        present (blocking); None for a file this cache does not track (whole on disk).

        Raises:
            OSError: the store failed (the reader reports the run as unreadable for now).
        """
        with self._lock:
            sparse = self._files.get(path)
            if sparse is None:
                return None
            self._files.move_to_end(path)
        sparse.used = time.monotonic()
        with sparse.lock:  # no eviction of this file between the check and the read
            if not sparse.missing(offset, offset + size):
                fd = os.open(path, os.O_RDONLY)
                try:
                    return os.pread(fd, size, offset)
                finally:
                    os.close(fd)
            lo = offset
            hi = min(sparse.size, max(offset + size, offset + self.min_fetch))
            for a, _b in sparse.ranges:  # stop at bytes already present
                if lo < a < hi and a >= offset + size:
                    hi = a
            (data,) = sparse.store.get_ranges(sparse.key, [(lo, hi)])
            if len(data) != hi - lo:
                raise StoreError(f"{sparse.key}: short read ({len(data)} of {hi - lo} bytes)")
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, lo)
            finally:
                os.close(fd)
            grown = sparse.add(lo, hi)
        with self._lock:
            self._bytes += grown
            self._stats.fetches += 1
            self._stats.fetched_bytes += hi - lo
        self._evict(keep=path)
        return bytes(data[offset - lo : offset - lo + size])

    def _evict(self, keep: str) -> None:
        while True:
            with self._lock:
                if self._bytes <= self.budget:
                    return
                victim = next(
                    (
                        (p, s)
                        for p, s in self._files.items()
                        if p != keep and s.filled() > _pinned_bytes(s)
                    ),
                    None,
                )
                if victim is None:
                    return
                path, sparse = victim
                self._files.move_to_end(path)
            with sparse.lock:
                freed = sparse.filled() - _pinned_bytes(sparse)
                with contextlib.suppress(FileNotFoundError):
                    # Same inode (readers keep their descriptors, and read through fill()): the
                    # file becomes all holes, then its header and footer are written back.
                    fd = os.open(path, os.O_WRONLY)
                    try:
                        os.ftruncate(fd, 0)
                        os.ftruncate(fd, sparse.size)
                        for off, data in sparse.pinned:
                            os.pwrite(fd, data, off)
                    finally:
                        os.close(fd)
                sparse.ranges = [[o, o + len(b)] for o, b in sparse.pinned]
            with self._lock:
                self._bytes -= freed
                self._stats.evictions += 1

    def statistics(self) -> CacheStatistics:
        """Files tracked, bytes held, fetches and evictions so far."""
        with self._lock:
            s = self._stats
            return CacheStatistics(
                len(self._files), self._bytes, s.budget, s.fetches, s.fetched_bytes, s.evictions
            )


def _pinned_bytes(sparse: _Sparse) -> int:
    return sum(len(b) for _, b in sparse.pinned)


@dataclass
class MirrorStatistics:
    """What a :class:`RunMirror` fetched."""

    refreshes: int = 0
    objects: int = 0
    bytes: int = 0
    files: dict = field(default_factory=dict)


class RunMirror:
    """A local directory that mirrors a run in the store, for :class:`~recorder.RunReader`.

    :meth:`apply` brings the directory to a manifest: new files are put in place first (blocks as
    sparse files holding header and footer, segments whole; a head segment that grew is extended
    by a ranged read of the new bytes), then files the manifest no longer names are deleted, the
    order compaction uses locally, so a reader following the directory sees one complete state at
    every moment. Never writes into a directory that is not a mirror.

    Args:
        store: the object store.
        run: the run's name.
        run_dir: the local directory (created, and marked as a mirror).
        cache: where the bytes of its blocks are fetched and bounded.
    """

    def __init__(self, store: ObjectStore, run: str, run_dir: str, cache: RangeCache) -> None:
        self.store = store
        self.run = run
        self.run_dir = run_dir
        self.cache = cache
        self.files: dict[str, FileRef] = {}
        self.stats = MirrorStatistics()
        self.generation = -1
        self._lock = threading.Lock()
        register_source(run_dir, self._fill)

    def _fill(self, name: str, offset: int, size: int) -> bytes | None:
        return self.cache.fill(os.path.join(self.run_dir, name), offset, size)

    @staticmethod
    def is_mirror(run_dir: str) -> bool:
        """Whether ``run_dir`` is a mirror directory (not a run a local writer owns)."""
        return os.path.exists(os.path.join(run_dir, MIRROR_MARKER))

    def refresh(self) -> bool:
        """Read the run's manifest and apply it; return whether the directory changed.

        Raises:
            ManifestError, OSError: as :func:`read_manifest` and :meth:`apply`.
        """
        manifest = read_manifest(self.store, self.run)
        if manifest is None:
            return False
        return self.apply(manifest)

    def apply(self, manifest: Manifest) -> bool:
        """Bring the directory to ``manifest``; return whether anything changed.

        Raises:
            OSError: the store failed; the directory stays in its last complete state.
            RecorderError: the directory exists and is not a mirror (a local writer's run).
        """
        from recorder.records import RecorderError

        with self._lock:
            if manifest.generation == self.generation and self.files:
                return False
            os.makedirs(self.run_dir, exist_ok=True)
            marker = os.path.join(self.run_dir, MIRROR_MARKER)
            if not os.path.exists(marker):
                if any(SEGMENT_RE.match(n) for n in os.listdir(self.run_dir)):
                    raise RecorderError(f"{self.run_dir}: a local run, not a mirror")
                with open(marker, "w") as f:
                    f.write(self.run + "\n")
            changed = False
            for ref in manifest.files:
                old = self.files.get(ref.name)
                if old is not None and old.key == ref.key:
                    continue
                self._place(ref, old)
                self.files[ref.name] = ref
                changed = True
            names = {f.name for f in manifest.files}
            for name in [n for n in self.files if n not in names]:
                path = os.path.join(self.run_dir, name)
                self.cache.forget(path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                del self.files[name]
                changed = True
            self.generation = manifest.generation
            self.stats.refreshes += 1
            return changed

    def _place(self, ref: FileRef, old: FileRef | None) -> None:
        path = os.path.join(self.run_dir, ref.name)
        if ref.tail is None:  # a segment: fetched whole, or only what the head grew by
            if old is not None and old.size < ref.size and os.path.exists(path):
                (data,) = self.store.get_ranges(ref.key, [(old.size, ref.size)])
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, data, old.size)
                finally:
                    os.close(fd)
            else:
                data = self.store.get(ref.key)
                _write_new(path, [(0, data)], len(data))
        else:  # a block: a sparse file with its header and footer
            pinned_ranges = [(0, framing.HEADER_SIZE), (ref.tail, ref.size)]
            parts = self.store.get_ranges(ref.key, pinned_ranges)
            pinned = list(zip([0, ref.tail], [bytes(p) for p in parts], strict=True))
            _write_new(path, pinned, ref.size)
            self.cache.add(path, self.store, ref.key, ref.size, pinned)
        self.stats.objects += 1
        self.stats.bytes += ref.size if ref.tail is None else ref.size - ref.tail + 32

    def hydrate(self) -> None:
        """Fetch every byte of the mirrored files and make the directory an ordinary local run
        (for a writer to continue it). Raises OSError when the store fails."""
        with self._lock:
            for ref in self.files.values():
                path = os.path.join(self.run_dir, ref.name)
                if ref.tail is not None:
                    self.cache.fill(path, 0, ref.size)
                    self.cache.forget(path)
            unregister_source(self.run_dir)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.run_dir, MIRROR_MARKER))

    def close(self) -> None:
        """Stop fetching for this directory (its files stay as they are)."""
        unregister_source(self.run_dir)
        for name in self.files:
            self.cache.forget(os.path.join(self.run_dir, name))


def download_run(store: ObjectStore, run: str, run_dir: str) -> Manifest | None:
    """Fetch every file of ``run`` whole into the empty or missing directory ``run_dir`` (a
    writer continuing the run there). Returns the manifest, or None if the store has no such run.

    Raises:
        ManifestError, OSError: as :func:`read_manifest`; a failed fetch.
    """
    manifest = read_manifest(store, run)
    if manifest is None:
        return None
    download_files(store, manifest, run_dir)
    return manifest


def download_files(store: ObjectStore, manifest: Manifest, run_dir: str) -> None:
    """Fetch every file ``manifest`` names whole into ``run_dir`` (made if missing), each
    through a temporary name.

    Raises:
        OSError: a failed fetch.
    """
    os.makedirs(run_dir, exist_ok=True)
    for ref in manifest.files:
        data = store.get(ref.key)
        _write_new(os.path.join(run_dir, ref.name), [(0, data)], len(data))


def _write_new(path: str, pieces: list[tuple[int, bytes]], size: int) -> None:
    """Create ``path`` of ``size`` bytes holding ``pieces`` (holes elsewhere), atomically."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        for off, data in pieces:
            os.pwrite(fd, data, off)
    finally:
        os.close(fd)
    os.replace(tmp, path)
