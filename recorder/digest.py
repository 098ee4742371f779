"""A run's digest: what a run holds in a few hundred bytes, so that listing many runs reads no data.

A :class:`RunWriter` keeps a :class:`Digest` of everything appended (each scalar tag's count, step
range, finite minimum and maximum and newest point; the time range of the run; the merged
``meta``; the newest small untagged record of each kind) and writes it at ``close()`` to
``digest.vdld`` in the run directory, atomically (a temporary file renamed over it). The file
names the data files (segments and blocks, with their sizes) it describes, so a reader knows it is
stale, rather than wrong, once anything was appended after it: :func:`load_digest` returns None
then, as it does for a missing or damaged file.

A writer reopening a run continues a digest that is current and otherwise keeps none (a run
appended by a writer that was killed has no current digest until a writer closes it after a full
read elsewhere; readers fall back to reading the run).

Format (docs/record-format.md, "Digest"): the 8-byte magic ``b"\\x89VDLDIG\\n"``, then one msgpack
map ``{"version": 2, "files": [[name, size], ...], "scalars": {tag: [count, step_min, step_max,
vmin, vmax, last_step, last_wall, last_value]}, "kinds": {kind: [records, first_wall, last_wall]},
"meta": {...},
"latest": {kind: [wall, data]}}``. ``vmin``/``vmax`` are over finite values only (None when a tag
has none), like the index's chunk summaries.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from recorder.blocks import BLOCK_RE
from recorder.catalog import SEGMENT_RE
from recorder.framing import HEADER_SIZE, read_small, write_atomically

DIGEST_NAME = "digest.vdld"
DIGEST_MAGIC = b"\x89VDLDIG\n"
DIGEST_VERSION = 2
#: Untagged records larger than this (encoded) are not kept as a kind's newest record.
LATEST_MAX_BYTES = 16 << 10
#: A digest file larger than this is not read (it cannot be one this module wrote).
DIGEST_MAX_BYTES = 64 << 20


@dataclass
class TagDigest:
    """One scalar tag: count, step range, finite min/max (None: no finite value), newest point."""

    count: int = 0
    step_min: int | None = None
    step_max: int | None = None
    vmin: float | None = None
    vmax: float | None = None
    last_step: int | None = None
    last_wall: float | None = None
    last_value: float | None = None

    def as_list(self) -> list:
        return [
            self.count, self.step_min, self.step_max, self.vmin, self.vmax,
            self.last_step, self.last_wall, self.last_value,
        ]  # fmt: skip


@dataclass
class Digest:
    """What a run holds, kept up to date append by append (see the module docstring).

    Attributes:
        scalars: per scalar tag, a :class:`TagDigest`.
        kinds: per record kind (``"scalars"`` for scalar points), ``[count, first wall,
            last wall]``: how many, and the smallest and largest wall time among them.
        meta: the ``meta`` records merged in order (as ``RunReader.meta``).
        latest: per kind, ``(wall, data)`` of the newest untagged record of at most
            ``LATEST_MAX_BYTES`` (``hparams``, ``telemetry``, ...).
        files: the data files ``[(name, size), ...]`` it describes (set when written or loaded).
    """

    scalars: dict[str, TagDigest] = field(default_factory=dict)
    kinds: dict[str, list] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    latest: dict[str, tuple[float, Any]] = field(default_factory=dict)
    files: list[tuple[str, int]] = field(default_factory=list)

    def _walls(self, kind: str, n: int, lo: float | None, hi: float | None) -> None:
        row = self.kinds.get(kind)
        if row is None:
            self.kinds[kind] = [n, lo, hi]
            return
        row[0] += n
        if lo is not None and (row[1] is None or lo < row[1]):
            row[1] = lo
        if hi is not None and (row[2] is None or hi > row[2]):
            row[2] = hi

    def walls(self, kinds: Any = None) -> tuple[float | None, float | None]:
        """The smallest and largest wall time of the records of ``kinds`` (None: every kind)."""
        rows = [r for k, r in self.kinds.items() if kinds is None or k in kinds]
        los = [r[1] for r in rows if r[1] is not None]
        his = [r[2] for r in rows if r[2] is not None]
        return (min(los) if los else None, max(his) if his else None)

    @property
    def first_wall(self) -> float | None:
        """The smallest wall time of any record (None: none)."""
        return self.walls()[0]

    @property
    def last_wall(self) -> float | None:
        """The largest wall time of any record (None: none)."""
        return self.walls()[1]

    def add_scalars(
        self, tag: str, steps: np.ndarray, walls: np.ndarray, values: np.ndarray
    ) -> None:
        """Take in a non-empty batch of points of ``tag`` (int64, float64, float64 arrays)."""
        finite = values[np.isfinite(values)]
        vmin = float(finite.min()) if len(finite) else None
        vmax = float(finite.max()) if len(finite) else None
        self._tag(tag, len(steps), int(steps.min()), int(steps.max()), vmin, vmax)
        self._last(tag, steps, walls, values, len(steps) - 1)
        self._chunk_walls(walls)

    def add_chunk(self, fields: tuple, parts: list | None, points: tuple) -> None:
        """Take in a scalar chunk as the writer encodes it: its index fields ``(kind, tag, step,
        wall, count, smin, smax, vmin, vmax)``, its part columns (a group chunk) or None, and its
        points ``(tags, counts, steps, walls, values)``: NumPy arrays (a few NumPy calls a
        chunk), or Python lists for a chunk of a few points (the part columns then lists too,
        as :func:`recorder.codec.encode_small_group` gives them)."""
        tags, counts, steps, walls, values = points
        if parts is None:
            _, tag, _, _, count, smin, smax, vmin, vmax = fields
            self._tag(tag, count, smin, smax, vmin, vmax)
            self._last(tag, steps, walls, values, len(steps) - 1)
        else:
            _, _, _, _, smins, smaxs, vmins, vmaxs = parts
            isnan = math.isnan
            for i, end in enumerate(itertools.accumulate(counts)):
                tag = tags[i]
                lo, hi = float(vmins[i]), float(vmaxs[i])
                self._tag(
                    tag, int(counts[i]), int(smins[i]), int(smaxs[i]),
                    None if isnan(lo) else lo, None if isnan(hi) else hi,
                )  # fmt: skip
                self._last(tag, steps, walls, values, end - 1)
        self._chunk_walls(walls)

    def _tag(
        self, tag: str, count: int, smin: int, smax: int, vmin: float | None, vmax: float | None
    ) -> None:
        t = self.scalars.get(tag)
        if t is None:
            t = self.scalars[tag] = TagDigest()
        t.count += count
        # Comparisons rather than min() and max() calls (a live flush has a chunk part per
        # tag); they keep the earlier of two equal values, as min() and max() do.
        if t.step_min is None or smin < t.step_min:
            t.step_min = smin
        if t.step_max is None or smax > t.step_max:
            t.step_max = smax
        if vmin is not None and (t.vmin is None or vmin < t.vmin):
            t.vmin = vmin
        if vmax is not None and (t.vmax is None or vmax > t.vmax):
            t.vmax = vmax

    def _last(self, tag: str, steps: Any, walls: Any, values: Any, i: int) -> None:
        t = self.scalars[tag]
        t.last_step, t.last_wall, t.last_value = int(steps[i]), float(walls[i]), float(values[i])

    def _chunk_walls(self, walls: np.ndarray | list[float]) -> None:
        if isinstance(walls, list):
            # A few walls (encode_small_group, which left any mix of 0.0 and -0.0 to NumPy).
            finite = (
                walls if all(map(math.isfinite, walls)) else [w for w in walls if math.isfinite(w)]
            )
            if not finite:
                self._walls("scalars", len(walls), None, None)
            else:
                self._walls("scalars", len(walls), min(finite), max(finite))
            return
        lo, hi = float(walls.min()), float(walls.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            finite = walls[np.isfinite(walls)]
            if not len(finite):
                self._walls("scalars", len(walls), None, None)
                return
            lo, hi = float(finite.min()), float(finite.max())
        self._walls("scalars", len(walls), lo, hi)

    def add_record(
        self, kind: str, tag: str | None, wall: float, data: dict | None, size: int
    ) -> None:
        """Take in one non-scalar record of ``size`` encoded bytes (``data`` is needed only for
        ``meta`` records and untagged ones of at most ``LATEST_MAX_BYTES``)."""
        finite = math.isfinite(wall)
        self._walls(kind, 1, wall if finite else None, wall if finite else None)
        if kind == "meta" and data is not None:
            self.meta.update(data)
        if tag is None and size <= LATEST_MAX_BYTES and data is not None:
            self.latest[kind] = (wall, data)

    def encode(self) -> bytes:
        """The digest file's bytes."""
        body = {
            "version": DIGEST_VERSION,
            "files": [list(f) for f in self.files],
            "scalars": {tag: t.as_list() for tag, t in self.scalars.items()},
            "kinds": self.kinds,
            "meta": self.meta,
            "latest": {kind: list(v) for kind, v in self.latest.items()},
        }
        return DIGEST_MAGIC + msgpack.packb(body, use_bin_type=True)

    @classmethod
    def decode(cls, blob: bytes) -> Digest:
        """Parse a digest file's bytes.

        Raises:
            ValueError: not a digest of this version, or malformed.
        """
        if not blob.startswith(DIGEST_MAGIC):
            raise ValueError("not a digest file (wrong magic number)")
        try:
            body = msgpack.unpackb(blob[len(DIGEST_MAGIC) :], raw=False, strict_map_key=False)
            if body["version"] != DIGEST_VERSION:
                raise ValueError(f"digest version {body['version']!r} is not {DIGEST_VERSION}")
            return cls(
                scalars={tag: TagDigest(*row) for tag, row in body["scalars"].items()},
                kinds={str(k): list(v) for k, v in body["kinds"].items()},
                meta=dict(body["meta"]),
                latest={kind: (v[0], v[1]) for kind, v in body["latest"].items()},
                files=[(str(n), int(s)) for n, s in body["files"]],
            )
        except (KeyError, TypeError, IndexError, AttributeError, msgpack.UnpackException) as exc:
            raise ValueError(f"malformed digest: {type(exc).__name__}") from None


def data_files(run_dir: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """The run's data files (blocks, and segments holding a record) as sorted ``(name, size)``
    pairs. Segments holding only a header are left out: a writer reopening a compacted run starts
    one, which changes nothing the digest describes."""
    out = []
    with os.scandir(run_dir) as it:
        for item in it:
            segment = SEGMENT_RE.match(item.name)
            if segment or BLOCK_RE.match(item.name):
                size = item.stat(follow_symlinks=False).st_size
                if not segment or size > HEADER_SIZE:
                    out.append((item.name, size))
    return sorted(out)


def write_digest(run_dir: str | os.PathLike[str], digest: Digest, durable: bool) -> None:
    """Write ``digest`` as the run's digest, describing its data files as they are now."""
    digest.files = data_files(run_dir)
    write_atomically(os.path.join(os.fspath(run_dir), DIGEST_NAME), digest.encode(), durable)


def load_digest(
    run_dir: str | os.PathLike[str], files: list[tuple[str, int]] | None = None
) -> Digest | None:
    """The run's digest if it describes the run's data files as they are (or as ``files`` says
    they are); None when it is missing, stale, damaged or of another version. Never raises for
    a bad file; an unreadable run directory raises ``OSError``."""
    blob = read_small(os.path.join(os.fspath(run_dir), DIGEST_NAME), DIGEST_MAX_BYTES)
    if blob is None:
        return None
    try:
        digest = Digest.decode(blob)
    except ValueError:
        return None
    if digest.files != (data_files(run_dir) if files is None else sorted(files)):
        return None
    return digest
