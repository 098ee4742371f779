"""A closed run's preview: each scalar tag downsampled once, so that a page of many runs reads no chunk.

A page showing a hundred runs asks for a few hundred points per tag (``PREVIEW_POINTS``); for a
short run each such read decodes whole 10,000-point chunks to keep 200 of them. At ``close()`` a
:class:`~recorder.RunWriter` writes ``preview.vdlp`` beside the digest: for every scalar tag of
at most ``PREVIEW_TAG_POINTS`` points, exactly what ``RunReader.read_scalars(tag,
max_points=PREVIEW_POINTS)`` returns over the whole run (longer tags are left out: their reads
use the chunks' level-of-detail summaries and stay cheap). It is written atomically (a
temporary file renamed over it) and names the data files it was read from with their sizes, as
the reader had read them; a :class:`~recorder.RunReader` answers that read from the preview
only while it has read exactly those files, whole: a run appended after it, a reader with a
limit short of the end, or a compaction since, reads the chunks as before (stale is ignored,
never wrong). A damaged preview (its checksum) or one of another version is ignored too.

Format (docs/record-format.md, "Preview"): the 8-byte magic ``b"\\x89VDLPRV\\n"``, a u32
little-endian CRC-32 (zlib) of the rest, then one msgpack map ``{"version": 1, "max_points": P,
"files": [[name, size], ...], "tags": {tag: [n, steps, walls, values]}}``, each column ``n``
little-endian int64 (steps) or float64 (walls, values) values as bytes.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgpack
import numpy as np

from recorder.framing import read_small, write_atomically
from recorder.records import ScalarSeries

if TYPE_CHECKING:
    from recorder.reader import RunReader

PREVIEW_NAME = "preview.vdlp"
PREVIEW_MAGIC = b"\x89VDLPRV\n"
PREVIEW_VERSION = 1
#: The points per tag of a preview, the only read a reader asks it for: the page's for a
#: selection of 100 runs or more (ui/src/runsdefault.js, ``pointsFor``).
PREVIEW_POINTS = 200
#: Tags of more points than this are left out of a preview (their reads use the level-of-detail
#: summaries of their chunks; reading them at ``close()`` would cost more than it saves).
PREVIEW_TAG_POINTS = 100_000
#: A preview file larger than this is not read (it cannot be one this module wrote).
PREVIEW_MAX_BYTES = 64 << 20
_CRC = struct.Struct("<I")
_HEAD = len(PREVIEW_MAGIC) + _CRC.size


@dataclass(frozen=True)
class Preview:
    """A run's preview (see the module docstring).

    Attributes:
        max_points: the ``max_points`` its series answer.
        files: the data files ``[(name, size), ...]`` (sorted) it was read from.
        tags: per scalar tag, its read-only series.
    """

    max_points: int
    files: list[tuple[str, int]]
    tags: dict[str, ScalarSeries]

    def encode(self) -> bytes:
        """The preview file's bytes."""
        body = msgpack.packb(
            {
                "version": PREVIEW_VERSION,
                "max_points": self.max_points,
                "files": [list(f) for f in self.files],
                "tags": {
                    tag: [
                        len(s.steps),
                        s.steps.astype("<i8", copy=False).tobytes(),
                        s.walls.astype("<f8", copy=False).tobytes(),
                        s.values.astype("<f8", copy=False).tobytes(),
                    ]
                    for tag, s in self.tags.items()
                },
            },
            use_bin_type=True,
        )
        return PREVIEW_MAGIC + _CRC.pack(zlib.crc32(body)) + body

    @classmethod
    def decode(cls, blob: bytes) -> Preview:
        """Parse a preview file's bytes; the columns are read-only views of ``blob``.

        Raises:
            ValueError: not a preview of this version, damaged (checksum) or malformed.
        """
        if not blob.startswith(PREVIEW_MAGIC) or len(blob) < _HEAD:
            raise ValueError("not a preview file (wrong magic number)")
        (crc,) = _CRC.unpack_from(blob, len(PREVIEW_MAGIC))
        body = memoryview(blob)[_HEAD:]
        if zlib.crc32(body) != crc:
            raise ValueError("damaged preview (checksum)")
        try:
            doc = msgpack.unpackb(body, raw=False)
            if doc["version"] != PREVIEW_VERSION:
                raise ValueError(f"preview version {doc['version']!r} is not {PREVIEW_VERSION}")
            tags = {}
            for tag, (n, steps, walls, values) in doc["tags"].items():
                if not isinstance(tag, str) or not all(
                    len(c) == 8 * n for c in (steps, walls, values)
                ):
                    raise ValueError(f"malformed preview: tag {tag!r}")
                tags[tag] = ScalarSeries(
                    np.frombuffer(steps, "<i8").astype(np.int64, copy=False),
                    np.frombuffer(walls, "<f8").astype(np.float64, copy=False),
                    np.frombuffer(values, "<f8").astype(np.float64, copy=False),
                )
            max_points = doc["max_points"]
            if not isinstance(max_points, int) or max_points < 2:
                raise ValueError(f"malformed preview: max_points {max_points!r}")
            return cls(max_points, sorted((str(n), int(s)) for n, s in doc["files"]), tags)
        except (KeyError, TypeError, IndexError, AttributeError, msgpack.UnpackException) as exc:
            raise ValueError(f"malformed preview: {type(exc).__name__}") from None


def load_preview(run_dir: str | os.PathLike[str]) -> Preview | None:
    """The run's preview file parsed; None when it is missing, damaged or of another version
    (whether it is current is for its reader to tell: :meth:`RunReader.read_scalars`). Never
    raises for a bad file; an unreadable run directory raises ``OSError``."""
    blob = read_small(os.path.join(os.fspath(run_dir), PREVIEW_NAME), PREVIEW_MAX_BYTES)
    if blob is None:
        return None
    try:
        return Preview.decode(blob)
    except ValueError:
        return None


def make_preview(reader: RunReader, tag_points: int = PREVIEW_TAG_POINTS) -> Preview | None:
    """The preview of what ``reader`` holds: ``reader.read_scalars(tag,
    max_points=PREVIEW_POINTS)`` of each scalar tag of at most ``tag_points`` points; None when
    the reader holds a file in part (a limit, a torn tail) or its files changed while it read."""
    max_points = PREVIEW_POINTS
    files = reader.files_read()
    if files is None:
        return None
    tags = {
        tag: reader.read_scalars(tag, max_points=max_points)
        for tag, info in reader.tags().items()
        if info.kind == "scalars" and info.count <= tag_points
    }
    if reader.files_read() != files:  # compaction replaced files meanwhile: the reads restarted
        return None
    return Preview(max_points, files, tags)


def write_preview(
    run_dir: str | os.PathLike[str], durable: bool = False, tag_points: int = PREVIEW_TAG_POINTS
) -> bool:
    """Read the run and write its preview (see the module docstring); return whether one was
    written (not for a run whose files are incomplete or changing). For a run closed before
    previews existed, as :func:`recorder.add_summaries` upgrades older runs; a closed run's
    writer does it at ``close()``. With ``durable`` the file is fsynced before it is renamed.

    Raises:
        NotARunError, FormatError: as :class:`RunReader`.
        OSError: the file could not be written.
    """
    from recorder.reader import RunReader  # reader.py imports this module

    with RunReader(run_dir) as reader:
        preview = make_preview(reader, tag_points)
    if preview is None:
        return False
    write_atomically(os.path.join(os.fspath(run_dir), PREVIEW_NAME), preview.encode(), durable)
    return True
