"""TensorBoard event files: the Event/Summary protobufs inside TFRecord files.

No TensorFlow and no protobuf package: the records are framed by vdl_stream.tfrecord (masked
CRC-32C) and the few messages needed are decoded by hand (vdl_stream.protowire). The core is
I/O-free (functions over bytes and numpy arrays); only :func:`read_event_file` touches a file.

Decoded (field numbers from tensorflow/core/util/event.proto and framework/summary.proto)::

    Event         wall_time double = 1, step int64 = 2, graph_def bytes = 4 (a GraphDef: see
                  vdl_stream.graphs.graphdef_graph), summary Summary = 5 (others are skipped)
    Summary       value Value = 1 (repeated)
    Value         tag string = 1, simple_value float = 2, image Image = 4, histo HistogramProto = 5,
                  audio Audio = 6, tensor TensorProto = 8, metadata SummaryMetadata = 9
    Metadata      plugin_data PluginData = 1 { plugin_name string = 1 }
    Histogram     min = 1, max = 2, num = 3, sum = 4, sum_squares = 5 (double),
                  bucket_limit = 6, bucket = 7 (repeated double, packed or not)
    Image         height int32 = 1, width int32 = 2, colorspace int32 = 3, encoded_image_string = 4
    Audio         sample_rate float = 1, num_channels = 2, length_frames = 3 (int64),
                  encoded_audio_string = 4, content_type string = 5
    TensorProto   see vdl_stream.protowire

What becomes what: ``simple_value`` and one-element numeric tensors of the ``scalars`` plugin (or of
no plugin) are scalars; ``histo`` and ``histograms``-plugin tensors (``[k, 3]`` rows of left edge,
right edge, count) are histograms; ``image`` and ``images``-plugin tensors (``[width, height,
encoded...]``) are images (the first image of a batch); ``text``-plugin string tensors are text
(elements joined by newlines); ``audio`` is audio; ``pr_curves``-plugin tensors are pr_curve events
and ``hparams``-plugin session start summaries hparams events (see "pr_curve and hparams" below); a
``graph_def`` is a ``graph`` event (tag ``graph``). Everything else (run metadata, session logs,
other plugins) is counted as skipped, by name.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .protowire import (
    F32,
    F64,
    DecodeError,
    Tensor,
    decode_tensor,
    group_fields,
    last_field,
    packed_doubles,
    skip,
    varint,
    wire_fields,
)
from .tfrecord import (
    BLOCK_RECORDS,
    FOOTER,
    HEADER,
    Corruption,
    Frames,
    scan_frames,
)


def image_format(data: bytes) -> str:
    """Name the encoding of an image from its first bytes: png, jpeg, gif, webp or unknown."""
    if data.startswith(b"\x89PNG"):
        return "png"
    if data.startswith(b"\xff\xd8"):
        return "jpeg"
    if data.startswith(b"GIF8"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "unknown"


def histogram_event(
    edges: np.ndarray,
    counts: np.ndarray,
    *,
    hmin: float | None,
    hmax: float | None,
    num: float,
    total: float,
    sum_sq: float,
) -> dict[str, Any]:
    """Build the data of a ``histogram`` event (docs/protocol.md) from bucket edges and counts."""
    return {
        "edges": np.asarray(edges, dtype="<f8").tobytes(),
        "counts": np.asarray(counts, dtype="<f8").tobytes(),
        "num": int(num),
        "nan": 0,
        "inf": 0,
        "min": hmin,
        "max": hmax,
        "sum": float(total),
        "sum_sq": float(sum_sq),
    }


_HUGE = 1e300  # TensorFlow's outer bucket limits are +-DBL_MAX


def _histo(b: bytes) -> dict[str, Any]:
    g = group_fields(wire_fields(b))

    def dbl(f: int) -> float:
        v = last_field(g, f)
        return F64.unpack(v)[0] if v is not None else 0.0

    hmin, hmax, num, total, sum_sq = dbl(1), dbl(2), dbl(3), dbl(4), dbl(5)
    limits = np.array(packed_doubles(g.get(6, [])), dtype=np.float64)
    counts = np.array(packed_doubles(g.get(7, [])), dtype=np.float64)
    if len(limits) != len(counts):
        raise DecodeError(f"histogram has {len(limits)} limits and {len(counts)} buckets")
    # bucket i covers (limits[i-1], limits[i]]; the first starts at the minimum.
    left = hmin if not len(limits) or hmin <= limits[0] else limits[0]
    edges = np.concatenate([[left], limits])
    if num:
        edges[edges >= _HUGE] = hmax
        edges[edges <= -_HUGE] = hmin
    return histogram_event(edges, counts, hmin=hmin, hmax=hmax, num=num, total=total, sum_sq=sum_sq)


def _tensor_histogram(t: Tensor) -> dict[str, Any]:
    if t.numbers is None or t.numbers.size % 3:
        raise DecodeError("a histograms tensor must have shape [k, 3]")
    rows = t.numbers.reshape(-1, 3)
    counts = rows[:, 2]
    edges = np.concatenate([rows[:1, 0], rows[:, 1]]) if len(rows) else np.zeros(1)
    centers = (rows[:, 0] + rows[:, 1]) / 2
    nonzero = rows[counts > 0]
    return histogram_event(
        edges,
        counts,
        hmin=float(nonzero[0, 0]) if len(nonzero) else None,
        hmax=float(nonzero[-1, 1]) if len(nonzero) else None,
        num=float(counts.sum()),
        total=float((centers * counts).sum()),
        sum_sq=float((centers * centers * counts).sum()),
    )


# -- events ------------------------------------------------------------------------------------


@dataclass
class EventBlock:
    """What a run of records decoded into.

    Attributes:
        scalars: tag -> ``(steps, walls, values)`` sequences (lists or arrays), in file order.
        events: ``(kind, tag, step, wall, data)`` tuples of non-scalar events, in file order;
            ``data`` is the event's kind-specific map (docs/protocol.md).
        corrupt: damaged stretches skipped (framing) or records that did not decode.
        skipped: counts of records or values not imported, by what they were.
        records: records read (valid framing), including skipped ones.
        end: the file offset up to which this block consumed bytes.
        first_wall: the smallest wall time seen (None when no event had one).
    """

    scalars: dict[str, tuple[list[int], list[float], list[float]]] = field(default_factory=dict)
    events: list[tuple[str, str | None, int | None, float, dict[str, Any]]] = field(
        default_factory=list
    )
    corrupt: list[Corruption] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    records: int = 0
    end: int = 0
    first_wall: float | None = None
    # The metric tags of the hparams experiment summary seen last (tensorboardX writes it just
    # before the session start summary that holds the values); carried from block to block.
    hparam_metrics: list[str] = field(default_factory=list)
    # The index of the record being decoded, and per tag the record index of every point (kept
    # so that points decoded in bulk can be merged back into file order).
    index: int = 0
    order: dict[str, list[int]] = field(default_factory=dict)

    def add_scalar(self, tag: str, step: int, wall: float, value: float) -> None:
        """Append one scalar point of ``tag``."""
        cols = self.scalars.get(tag)
        if cols is None:
            cols = self.scalars[tag] = ([], [], [])
            self.order[tag] = []
        cols[0].append(step)
        cols[1].append(wall)
        cols[2].append(value)
        self.order[tag].append(self.index)

    def scalar_count(self) -> int:
        """The number of scalar points in the block."""
        return sum(len(cols[0]) for cols in self.scalars.values())


def _decode_value(block: EventBlock, v: bytes, step: int, wall: float) -> None:
    """Decode one Summary.Value into ``block``."""
    # Fast path for tensorboardX's add_scalar: tag (field 1) then simple_value (field 2), nothing else.
    if v[0] == 0x0A:
        n = v[1]
        if n < 0x80 and len(v) == n + 7 and v[n + 2] == 0x15:
            block.add_scalar(v[2 : n + 2].decode(), step, wall, F32.unpack_from(v, n + 3)[0])
            return
    g = group_fields(wire_fields(v))
    tag = last_field(g, 1, b"").decode()
    if not tag:
        tag = last_field(g, 7, b"").decode()  # node_name, in very old files
    if not tag:
        block.skipped["value without a tag"] += 1
        return
    plugin = ""
    content = b""
    meta = last_field(g, 9)
    if meta is not None:
        pdata = last_field(group_fields(wire_fields(meta)), 1)
        if pdata is not None:
            pg = group_fields(wire_fields(pdata))
            plugin = last_field(pg, 1, b"").decode()
            content = last_field(pg, 2, b"")
    if plugin == "hparams":  # pr_curve and hparams block (below)
        _hparams_value(block, tag, content, wall)
        return
    simple = last_field(g, 2)
    if simple is not None:
        block.add_scalar(tag, step, wall, F32.unpack(simple)[0])
        return
    histo = last_field(g, 5)
    if histo is not None:
        block.events.append(("histogram", tag, step, wall, _histo(histo)))
        return
    image = last_field(g, 4)
    if image is not None:
        ig = group_fields(wire_fields(image))
        data = last_field(ig, 4, b"")
        block.events.append(
            (
                "image",
                tag,
                step,
                wall,
                {
                    "format": image_format(data),
                    "data": bytes(data),
                    "width": last_field(ig, 2, 0),
                    "height": last_field(ig, 1, 0),
                    "channels": last_field(ig, 3, 0),
                },
            )
        )
        return
    audio = last_field(g, 6)
    if audio is not None:
        ag = group_fields(wire_fields(audio))
        rate = last_field(ag, 1)
        block.events.append(
            (
                "audio",
                tag,
                step,
                wall,
                {
                    "format": (last_field(ag, 5, b"audio/wav").decode().split("/")[-1] or "wav"),
                    "data": bytes(last_field(ag, 4, b"")),
                    "sample_rate": F32.unpack(rate)[0] if rate is not None else None,
                    "channels": last_field(ag, 2, 0),
                    "frames": last_field(ag, 3, 0),
                },
            )
        )
        return
    tensor = last_field(g, 8)
    if tensor is None:
        block.skipped["value of another type"] += 1
        return
    t = decode_tensor(tensor)
    if plugin in ("scalars", "") and t.numbers is not None and t.numbers.size == 1:
        block.add_scalar(tag, step, wall, float(t.numbers[0]))
    elif plugin == "histograms" and t.numbers is not None:
        block.events.append(("histogram", tag, step, wall, _tensor_histogram(t)))
    elif plugin == "images" and t.strings is not None and len(t.strings) >= 3:
        data = bytes(t.strings[2])
        block.events.append(
            (
                "image",
                tag,
                step,
                wall,
                {
                    "format": image_format(data),
                    "data": data,
                    "width": int(t.strings[0] or 0),
                    "height": int(t.strings[1] or 0),
                },
            )
        )
    elif plugin == "pr_curves" and t.numbers is not None and _is_pr_curve(t.numbers):
        block.events.append(("pr_curve", tag, step, wall, _pr_curve(t)))
    elif plugin == "text" and t.strings is not None:
        text = "\n".join(s.decode("utf-8", "replace") for s in t.strings)
        block.events.append(("text", tag, step, wall, {"text": text}))
    else:
        block.skipped[f"plugin {plugin or 'none'}"] += 1


# -- pr_curve and hparams ------------------------------------------------------------------------
#
# pr_curves plugin: a float tensor of shape [6, num_thresholds], rows TP, FP, TN, FN, precision,
# recall, at thresholds i / (num_thresholds - 1) (tensorboard/plugins/pr_curve/summary.py).
#
# hparams plugin: no tensor worth reading; the plugin data's ``content`` is an HParamsPluginData
# (tensorboard/plugins/hparams/plugin_data.proto, api.proto)::
#
#     HParamsPluginData  version int32 = 1, experiment = 2, session_start_info = 3,
#                        session_end_info = 4
#     Experiment         hparam_infos = 4, metric_infos MetricInfo = 5 (repeated)
#     MetricInfo         name MetricName = 1 { group string = 1, tag string = 2 }
#     SessionStartInfo   hparams map<string, google.protobuf.Value> = 1 (entries key = 1, value = 2)
#     Value              null_value = 1, number_value double = 2, string_value = 3, bool_value = 4
#
# The experiment names the metric tags; the session start info holds the values, and becomes one
# ``hparams`` event (the metrics' values are the run's scalars of those tags).


def _is_pr_curve(numbers: np.ndarray) -> bool:
    """Whether a pr_curves tensor has 6 rows of at least 2 thresholds (else it is skipped)."""
    return numbers.size >= 12 and numbers.size % 6 == 0


def _pr_curve(t: Tensor) -> dict[str, Any]:
    numbers = t.numbers if t.numbers is not None else np.zeros(0)
    if numbers.size % 6 or numbers.size < 12:
        raise DecodeError(f"a pr_curves tensor must have shape [6, n >= 2], got {numbers.size}")
    rows = numbers.reshape(6, -1)
    n = rows.shape[1]
    f8 = [np.ascontiguousarray(r, dtype="<f8").tobytes() for r in rows]
    return {
        "thresholds": (np.arange(n, dtype="<f8") / (n - 1)).tobytes(),
        "tp": f8[0],
        "fp": f8[1],
        "tn": f8[2],
        "fn": f8[3],
        "precision": f8[4],
        "recall": f8[5],
        "num_thresholds": n,
    }


def _hparam_value(b: bytes) -> Any:
    g = group_fields(wire_fields(b))
    if 2 in g:
        return F64.unpack(last_field(g, 2))[0]
    if 3 in g:
        return bytes(last_field(g, 3)).decode()
    if 4 in g:
        return bool(last_field(g, 4))
    return None


def _hparams_value(block: EventBlock, tag: str, content: bytes, wall: float) -> None:
    """Decode the HParamsPluginData of a value of the hparams plugin into ``block``."""
    g = group_fields(wire_fields(content))
    experiment = last_field(g, 2)
    if experiment is not None:
        metrics = []
        for wire, info in group_fields(wire_fields(experiment)).get(5, []):
            name = last_field(group_fields(wire_fields(info)), 1)
            if wire == 2 and name is not None:
                ng = group_fields(wire_fields(name))
                group = bytes(last_field(ng, 1, b"")).decode()
                mtag = bytes(last_field(ng, 2, b"")).decode()
                if mtag:
                    metrics.append(f"{group}/{mtag}" if group else mtag)
        block.hparam_metrics = metrics
        block.skipped["hparams experiment"] += 1
        return
    start = last_field(g, 3)
    if start is None:
        block.skipped["hparams session end"] += 1
        return
    hparams: dict[str, Any] = {}
    for wire, entry in group_fields(wire_fields(start)).get(1, []):
        if wire != 2:
            continue
        eg = group_fields(wire_fields(entry))
        key = bytes(last_field(eg, 1, b"")).decode()
        value = _hparam_value(last_field(eg, 2, b""))
        if key and value is not None:
            hparams[key] = value
    block.events.append(
        (
            "hparams",
            None,
            None,
            wall,
            {"hparams": hparams, "metrics": list(block.hparam_metrics), "metric_values": None},
        )
    )


def decode_event(payload: bytes, block: EventBlock) -> None:
    """Decode one serialized ``tensorflow.Event`` into ``block``.

    Raises:
        DecodeError: the payload is not a well-formed Event (also IndexError/struct.error/
            UnicodeDecodeError from deep inside; :func:`decode_records` turns all into damage).
    """
    pos = 0
    n = len(payload)
    wall = 0.0
    step = 0
    summary = None
    graph_def = None
    what = None
    while pos < n:
        key = payload[pos]
        if key == 0x09:
            wall = F64.unpack_from(payload, pos + 1)[0]
            pos += 9
        elif key == 0x10:
            step, pos = varint(payload, pos + 1)
            if step >= 1 << 63:
                step -= 1 << 64
        elif key == 0x2A:
            k, pos = varint(payload, pos + 1)
            summary = payload[pos : pos + k]
            pos += k
        else:
            key, pos = varint(payload, pos)
            if key == 0x22:  # graph_def bytes = 4: imported as a graph event (vdl_stream.graphs)
                k, pos = varint(payload, pos)
                graph_def = payload[pos : pos + k]
                pos += k
                continue
            if key >> 3 == 3:
                what = "file_version"
            elif what is None:
                what = {
                    4: "graph_def",
                    6: "log_message",
                    7: "session_log",
                    8: "tagged_run_metadata",
                    9: "meta_graph_def",
                }.get(key >> 3, f"event field {key >> 3}")
            pos = skip(payload, pos, key & 7)
    if pos != n:
        raise DecodeError("event truncated")
    if block.first_wall is None or wall < block.first_wall:
        block.first_wall = wall
    if graph_def is not None:
        from .graphs import graphdef_graph

        block.events.append(("graph", "graph", step, wall, graphdef_graph(bytes(graph_def))))
        return
    if summary is None:
        block.skipped[what or "empty event"] += 1
        return
    spos = 0
    sn = len(summary)
    while spos < sn:
        key, spos = varint(summary, spos)
        if key == 0x0A:
            k, spos = varint(summary, spos)
            _decode_value(block, summary[spos : spos + k], step, wall)
            spos += k
        else:
            spos = skip(summary, spos, key & 7)
    if spos != sn:
        raise DecodeError("summary truncated")


_DECODE_ERRORS = (DecodeError, IndexError, struct.error, UnicodeDecodeError, ValueError)


def _bulk_scalars(
    data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode, all at once, the records that are exactly one ``simple_value`` Event.

    That is the layout tensorboardX and TensorFlow 1 write for every ``add_scalar``::

        09 wall(8) 10 step(varint) 2a L1 0a L2 0a T tag(T) 15 value(4)

    with one-byte lengths. Returns ``(ok, tags, tag index, steps, walls, values)`` where ``ok``
    marks the records decoded here; every other record goes through :func:`decode_event`.
    """
    size = len(data)
    ok = (lengths >= 20) & (lengths < 128 + 16)
    at = np.minimum(offsets, size - 1)

    def byte(pos: np.ndarray) -> np.ndarray:
        return data[np.minimum(pos, size - 1)].astype(np.int64)

    ok &= (byte(at) == 0x09) & (byte(at + 9) == 0x10)
    k = np.arange(10)
    vb = data[np.minimum(at[:, None] + 10 + k, size - 1)].astype(np.uint64)
    cont = vb >= 0x80
    ok &= ~cont.all(axis=1)
    vlen = np.argmin(cont, axis=1) + 1
    parts = (vb & np.uint64(0x7F)) << (7 * k).astype(np.uint64)
    parts[k[None, :] >= vlen[:, None]] = 0
    steps = np.bitwise_or.reduce(parts, axis=1).view(np.int64)
    p = at + 10 + vlen
    l1, l2, t = byte(p + 1), byte(p + 3), byte(p + 5)
    ok &= (byte(p) == 0x2A) & (byte(p + 2) == 0x0A) & (byte(p + 4) == 0x0A)
    ok &= (l1 == l2 + 2) & (l2 == t + 7) & (l1 < 0x80) & (t > 0)
    ok &= byte(p + 6 + t) == 0x15
    ok &= p + 2 + l1 == at + lengths
    empty = np.zeros(0, dtype=np.int64)
    if not ok.any():
        return ok, [], empty, empty, np.zeros(0), np.zeros(0)
    sel = np.nonzero(ok)[0]
    at, p, t, steps = at[sel], p[sel], t[sel], steps[sel]
    walls = data[at[:, None] + 1 + np.arange(8)].copy().view("<f8").ravel()
    values = data[(p + 7 + t)[:, None] + np.arange(4)].copy().view("<f4").ravel()
    width = int(t.max())
    keys = np.zeros((len(sel), width + 1), dtype=np.uint8)
    keys[:, 0] = t
    cols = np.arange(width)
    raw = data[np.minimum((p + 6)[:, None] + cols, size - 1)]
    raw[cols[None, :] >= t[:, None]] = 0
    keys[:, 1:] = raw
    uniq, inverse = np.unique(keys.view(f"V{width + 1}").ravel(), return_inverse=True)
    tags = []
    bad = np.zeros(len(uniq), dtype=bool)
    for i, key in enumerate(uniq.tolist()):
        try:
            tags.append(key[1 : 1 + key[0]].decode())
        except UnicodeDecodeError:
            tags.append("")
            bad[i] = True
    if bad.any():  # leave undecodable tags to the record-by-record path, which reports them
        drop = bad[inverse]
        ok[sel[drop]] = False
        keep = ~drop
        inverse, steps, walls, values = inverse[keep], steps[keep], walls[keep], values[keep]
    return ok, tags, inverse, steps, walls, values.astype(np.float64)


def decode_records(
    buf: bytes | mmap.mmap,
    frames: Frames,
    block: EventBlock,
    base: int = 0,
    data: np.ndarray | None = None,
) -> EventBlock:
    """Decode the payloads ``frames`` found in ``buf`` into ``block`` (damage recorded there).

    Plain scalar events are decoded in bulk with numpy; every other record one by one. Points of
    a tag stay in file order either way.
    """
    block.corrupt.extend(frames.corrupt)
    offsets, lengths = frames.offsets, frames.lengths
    if data is None:
        data = np.frombuffer(buf, dtype=np.uint8)
    if len(offsets):
        ok, tags, inverse, steps, walls, values = _bulk_scalars(data, offsets, lengths)
    else:
        ok, tags, inverse = np.zeros(0, dtype=bool), [], np.zeros(0, dtype=np.int64)
    first = block.records
    slow = np.nonzero(~ok)[0]
    for i, o, n in zip(slow.tolist(), offsets[slow].tolist(), lengths[slow].tolist(), strict=True):
        block.index = first + i
        try:
            decode_event(buf[o : o + n], block)
        except _DECODE_ERRORS as exc:
            block.corrupt.append(Corruption(base + o - HEADER, n + HEADER + FOOTER, str(exc)))
    block.records += len(offsets)
    if tags:
        index = first + np.nonzero(ok)[0]
        walls_min = float(walls.min())
        if block.first_wall is None or walls_min < block.first_wall:
            block.first_wall = walls_min
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse, minlength=len(tags)))
        lo = 0
        for tag, hi in zip(tags, bounds.tolist(), strict=True):
            pick = order[lo:hi]
            lo = hi
            if not len(pick):
                continue
            cols = (steps[pick], walls[pick], values[pick])
            if tag in block.scalars:  # merge with points decoded one by one, by record index
                mine = block.scalars[tag]
                at = np.concatenate([index[pick], np.array(block.order[tag], dtype=np.int64)])
                merged = np.argsort(at, kind="stable")
                cols = tuple(
                    np.concatenate([a, np.asarray(b, dtype=a.dtype)])[merged]
                    for a, b in zip(cols, mine, strict=True)
                )
            block.scalars[tag] = cols
            block.order[tag] = []  # (bulk points need no index once merged)
    block.end = base + frames.end
    return block


def read_event_file(path: str | os.PathLike[str], block_records: int = BLOCK_RECORDS) -> Any:
    """Yield :class:`EventBlock` s decoded from a TensorBoard event file, in file order.

    Checksums are verified; damaged records are skipped and listed in ``corrupt``. An incomplete
    record at the end (the file was still being written, or cut off) is reported as a
    :class:`Corruption` with reason ``"truncated record at end of file"``.

    Raises:
        OSError: the file cannot be opened.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            data = np.frombuffer(mm, dtype=np.uint8)
            try:
                pos = 0
                metrics: list[str] = []
                while pos < size:
                    frames = scan_frames(data, pos, max_records=block_records)
                    block = EventBlock(hparam_metrics=metrics)
                    block = decode_records(mm, frames, block, data=data)
                    metrics = block.hparam_metrics
                    if frames.end == pos and not frames.corrupt and not len(frames.offsets):
                        block.corrupt.append(
                            Corruption(pos, size - pos, "truncated record at end of file")
                        )
                        block.end = size
                        yield block
                        break
                    pos = frames.end
                    yield block
            finally:
                del data  # release the buffer before the mmap closes


def is_event_file(name: str) -> bool:
    """Return whether a file name looks like a TensorBoard event file."""
    return "tfevents" in name and not name.endswith((".tmp", ".lock"))
