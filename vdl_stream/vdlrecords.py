"""VisualDL record files (``vdlrecords.<unix time>.log``), read without VisualDL or protobuf.

VisualDL 2.x (``visualdl/writer/record_writer.py``, ``RecordWriter.write``) writes each record as::

    length   u64 little-endian
    payload  length bytes: one serialized visualdl.Record

with no checksum, so damage inside a payload is found only when it does not decode. The messages
(``visualdl/proto/record.proto``, proto3; field numbers)::

    Record        values Value = 1 (repeated)
    Value         id int64 = 1 (the step), tag string = 2, timestamp int64 = 3 (milliseconds),
                  and one of: value float = 4, image Image = 5, audio Audio = 6,
                  embeddings = 7, histogram Histogram = 8, pr_curve = 9, meta_data MetaData = 10,
                  roc_curve = 11, text Text = 12, hparam = 13, tag_value TagValue = 14
    Image         encoded_image_string bytes = 4
    Audio         sample_rate float = 1, num_channels = 2, length_frames = 3,
                  encoded_audio_string bytes = 4, content_type string = 5
    Histogram     hist = 1, bin_edges = 2 (repeated double, packed)
    Text          encoded_text_string string = 1
    MetaData      display_name string = 1
    TagValue      tag string = 1, value float = 2       (add_scalars: main tag + sub tag)

``value`` becomes a scalar, ``tag_value`` the scalar ``<tag>/<sub tag>``, histogram/image/audio/
text their events, ``meta_data`` a run ``meta`` record; the rest is counted as skipped.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from .protowire import DecodeError, group_fields, last_field, packed_doubles, wire_fields
from .tfevents import EventBlock, histogram_event, image_format
from .tfrecord import BLOCK_BYTES, BLOCK_RECORDS, Corruption

#: A length above this is taken as damage, not as a record.
MAX_RECORD = 1 << 30
_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")
_SKIPPED = {
    7: "embeddings",
    9: "pr_curve",
    11: "roc_curve",
    13: "hparam",
}


def is_record_file(name: str) -> bool:
    """Return whether a file name looks like a VisualDL record file."""
    return name.startswith("vdlrecords.") and ".log" in name


def _png_size(data: bytes) -> tuple[int, int]:
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24 and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    return 0, 0


def decode_record(payload: bytes, block: EventBlock) -> None:
    """Decode one serialized ``visualdl.Record`` into ``block``.

    Raises:
        DecodeError: malformed bytes (or IndexError/struct.error/UnicodeDecodeError).
    """
    for fnum, wire, value in wire_fields(payload):
        if fnum != 1 or wire != 2:
            continue
        g = group_fields(wire_fields(value))
        step = last_field(g, 1, 0)
        if step >= 1 << 63:
            step -= 1 << 64
        tag = bytes(last_field(g, 2, b"")).decode()
        wall = last_field(g, 3, 0) / 1000.0
        if block.first_wall is None or wall < block.first_wall:
            block.first_wall = wall
        scalar = last_field(g, 4)
        if scalar is not None:
            block.add_scalar(tag, step, wall, _F32.unpack(scalar)[0])
            continue
        sub = last_field(g, 14)
        if sub is not None:
            sg = group_fields(wire_fields(sub))
            name = bytes(last_field(sg, 1, b"")).decode()
            raw = last_field(sg, 2)
            block.add_scalar(
                f"{tag}/{name}" if name else tag,
                step,
                wall,
                _F32.unpack(raw)[0] if raw is not None else 0.0,
            )
            continue
        event = _event(g)
        if event is None:
            kinds = [f for f in g if f > 3]
            block.skipped[
                _SKIPPED.get(kinds[0], f"value field {kinds[0]}") if kinds else "empty value"
            ] += 1
        elif event[0] == "meta":
            block.events.append(("meta", None, None, wall, event[1]))
        elif not tag:
            block.skipped["value without a tag"] += 1
        else:
            block.events.append((event[0], tag, step, wall, event[1]))


def _event(g: dict[int, list[tuple[int, Any]]]) -> tuple[str, dict[str, Any]] | None:
    histo = last_field(g, 8)
    if histo is not None:
        hg = group_fields(wire_fields(histo))
        counts = np.array(packed_doubles(hg.get(1, [])), dtype=np.float64)
        edges = np.array(packed_doubles(hg.get(2, [])), dtype=np.float64)
        if len(edges) != len(counts) + 1:
            raise DecodeError(f"histogram has {len(edges)} edges for {len(counts)} buckets")
        centers = (edges[:-1] + edges[1:]) / 2
        nonzero = np.nonzero(counts)[0]
        return "histogram", histogram_event(
            edges,
            counts,
            hmin=float(edges[nonzero[0]]) if len(nonzero) else None,
            hmax=float(edges[nonzero[-1] + 1]) if len(nonzero) else None,
            num=float(counts.sum()),
            total=float((centers * counts).sum()),
            sum_sq=float((centers * centers * counts).sum()),
        )
    image = last_field(g, 5)
    if image is not None:
        data = bytes(last_field(group_fields(wire_fields(image)), 4, b""))
        width, height = _png_size(data)
        return "image", {
            "format": image_format(data),
            "data": data,
            "width": width,
            "height": height,
        }
    text = last_field(g, 12)
    if text is not None:
        return "text", {"text": bytes(last_field(group_fields(wire_fields(text)), 1, b"")).decode()}
    audio = last_field(g, 6)
    if audio is not None:
        ag = group_fields(wire_fields(audio))
        rate = last_field(ag, 1)
        content_type = bytes(last_field(ag, 5, b"")).decode()
        return "audio", {
            "format": content_type.split("/")[-1] or "wav",
            "data": bytes(last_field(ag, 4, b"")),
            "sample_rate": _F32.unpack(rate)[0] if rate is not None else None,
            "channels": last_field(ag, 2, 0),
            "frames": last_field(ag, 3, 0),
        }
    meta = last_field(g, 10)
    if meta is not None:
        return "meta", {
            "display_name": bytes(last_field(group_fields(wire_fields(meta)), 1, b"")).decode()
        }
    return None


_DECODE_ERRORS = (DecodeError, IndexError, struct.error, UnicodeDecodeError, ValueError)


def decode_records(
    buf: bytes | mmap.mmap,
    start: int,
    size: int,
    block: EventBlock,
    max_records: int = BLOCK_RECORDS,
    max_bytes: int = BLOCK_BYTES,
) -> int:
    """Decode records of ``buf[start:size]`` into ``block``; return the offset reached.

    Stops before an incomplete record (a torn tail). A length over :data:`MAX_RECORD` is damage
    with no way to find the next record (the format has no checksums or markers): the rest is
    reported as one damaged stretch.
    """
    pos = start
    nbytes = 0
    while block.records < max_records and nbytes < max_bytes and pos + 8 <= size:
        (n,) = _U64.unpack_from(buf, pos)
        if n > MAX_RECORD:
            block.corrupt.append(
                Corruption(pos, size - pos, "record length out of range; rest of file skipped")
            )
            return size
        if pos + 8 + n > size:
            break
        block.records += 1
        try:
            decode_record(buf[pos + 8 : pos + 8 + n], block)
        except _DECODE_ERRORS as exc:
            block.corrupt.append(Corruption(pos, 8 + n, f"record does not decode: {exc}"))
        pos += 8 + n
        nbytes += n
    return pos


def read_record_file(path: str | os.PathLike[str]) -> Iterator[EventBlock]:
    """Yield :class:`~vdl_stream.tfevents.EventBlock` s decoded from a VisualDL record file.

    An incomplete record at the end is reported as a :class:`Corruption` with reason
    ``"truncated record at end of file"``.

    Raises:
        OSError: the file cannot be opened.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 0
            while pos < size:
                block = EventBlock()
                end = decode_records(mm, pos, size, block)
                if end == pos:
                    block.corrupt.append(
                        Corruption(pos, size - pos, "truncated record at end of file")
                    )
                    end = size
                block.end = end
                pos = end
                yield block
