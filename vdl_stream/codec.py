"""The wire codec: msgpack frames with columnar scalar batches.

Plain functions over bytes and numpy arrays, with no I/O, so that every transport (the in-process
channel, the WebSocket client, the server) shares one tested definition of the format. The format
itself is written down in docs/protocol.md.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import msgpack
import numpy as np

from recorder.codec import bytes_view, quantize_walls

PROTOCOL_VERSION = 1
#: A batch's walls up to this many bytes in all are checked and quantized joined, in one pass
#: (:func:`decode_batch`); larger ones tag by tag.
JOINED_WALLS_BYTES = 64 << 10
#: Frames larger than this are refused before they are decoded.
MAX_FRAME_BYTES = 32 << 20
#: Tags longer than this are refused at the call site.
MAX_TAG_LENGTH = 256
EVENT_KINDS = frozenset(
    {
        "histogram",
        "image",
        "text",
        "audio",
        "hparams",
        "pr_curve",
        "roc_curve",
        "telemetry",
        "meta",
        "alert",
        "graph",
        "embedding",  # vdl_stream/embeddings.py
    }
)
#: Alert levels, least severe first (``alert`` events; docs/alerts.md).
ALERT_LEVELS = ("info", "warn", "error")
#: Alert titles and messages are at most this many characters.
MAX_ALERT_TEXT = 4096

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Tags starting with this are telemetry on the scalar path (docs/protocol.md, "Telemetry
#: scalars"): written by the writer's sampler only, refused from every other caller.
RESERVED_TAG_PREFIX = "@telemetry/"
_RUN_PART = re.compile(r"^[^\x00-\x1f\x7f/\\:]+$")
#: Run names are at most this many characters, each part at most this many bytes of UTF-8.
MAX_RUN_LENGTH = 512
MAX_RUN_PART_BYTES = 255
# Invisible or unencodable: controls, formats (bidi, zero-width), surrogates, line/para separators.
_RUN_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Parts that could be taken for (or collide with) a file of a run directory: segments, the index,
# any later .vdl* file, the run lock and temporary files.
_RUN_RESERVED = re.compile(r"\.(vdl[a-z0-9]*|lock|tmp)(\.|$)", re.IGNORECASE)


class ProtocolError(ValueError):
    """A frame broke the wire schema. The message is safe to show to the remote peer."""


class BatchError(ProtocolError):
    """A ``batch`` frame names its writer and seq correctly but its content breaks the schema.

    The server refuses that one batch (a ``refused`` frame, not retryable) instead of closing the
    connection, so the writer drops it, hears why, and its later batches still land.
    """

    def __init__(self, message: str, writer: str, seq: int) -> None:
        super().__init__(message)
        self.writer = writer
        self.seq = seq


#: Nesting deeper than this (maps and arrays inside an event) is refused: readers recurse.
MAX_EVENT_DEPTH = 8
#: Keys of an event map (and of maps inside it) are str of at most this many characters.
MAX_KEY_LENGTH = 256
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


@dataclass
class ScalarColumns:
    """The points of one tag in one batch, as parallel arrays."""

    tag: str
    steps: np.ndarray  # int64
    walls: np.ndarray  # float64, seconds since the epoch
    values: np.ndarray  # float64, NaN and Inf allowed

    def __len__(self) -> int:
        return len(self.steps)


def concat_columns(tag: str, parts: list[ScalarColumns]) -> ScalarColumns:
    """``parts`` (columns of ``tag``, in order) as one column; a single part is returned as is."""
    if len(parts) == 1:
        return parts[0]
    return ScalarColumns(
        tag,
        np.concatenate([p.steps for p in parts]),
        np.concatenate([p.walls for p in parts]),
        np.concatenate([p.values for p in parts]),
    )


def join_batches(
    batches: Iterable[tuple[list[ScalarColumns], list[dict[str, Any]]]],
) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
    """The ``(scalars, events)`` of several batches of a run as those of one: each tag's columns
    concatenated in order (tags in order of first appearance), the events in order."""
    by_tag: dict[str, list[ScalarColumns]] = {}
    events: list[dict[str, Any]] = []
    for scalars, evs in batches:
        for cols in scalars:
            by_tag.setdefault(cols.tag, []).append(cols)
        events.extend(evs)
    return [concat_columns(tag, parts) for tag, parts in by_tag.items()], events


@dataclass
class Batch:
    """What a writer publishes at once: columnar scalars and other events of one run."""

    writer: str
    seq: int
    run: str
    scalars: list[ScalarColumns] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    sync: bool = False

    def count(self) -> int:
        """Return the number of events in the batch, scalar points included."""
        return sum(len(c) for c in self.scalars) + len(self.events)


def check_tag(tag: object, name: str = "tag", *, reserved: bool = False) -> str:
    """Return ``tag`` if it is a valid tag, else raise ``TypeError``/``ValueError`` naming ``name``.

    ``reserved``: accept a tag in the telemetry namespace (:data:`RESERVED_TAG_PREFIX`), as the
    wire's scalar columns may hold; every user-facing call refuses it.
    """
    if type(tag) is not str:
        raise TypeError(f"{name} must be a non-empty str, got {type(tag).__name__} {tag!r:.80}")
    if not tag:
        raise ValueError(f"{name} must be a non-empty str, got ''")
    if len(tag) > MAX_TAG_LENGTH:
        raise ValueError(f"{name} must be at most {MAX_TAG_LENGTH} characters, got {len(tag)}")
    if _CONTROL.search(tag):
        raise ValueError(f"{name} must not contain control characters, got {tag!r:.80}")
    if not tag.isascii() and not _encodable(tag):
        raise ValueError(f"{name} must be encodable as UTF-8 (no lone surrogates), got {tag!r:.80}")
    if not reserved and tag.startswith(RESERVED_TAG_PREFIX):
        raise ValueError(
            f"{name} must not start with {RESERVED_TAG_PREFIX!r} (reserved for telemetry), "
            f"got {tag!r:.80}"
        )
    return tag


def _encodable(text: str) -> bool:
    """Whether ``text`` has a UTF-8 encoding (lone surrogates have none, and msgpack fails on them)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_run_name(run: object) -> str:
    """Return ``run`` if it is a safe relative run path (``a`` or ``a/b``), else raise ``ValueError``.

    Run names become directories under the log directory and names in the dashboard, so they must
    stay inside the log directory, be storable on every common file system, and read the same on
    screen as on disk. Refused, each with a message naming the bad value:

    - anything but a non-empty ``str`` of at most 512 characters;
    - an absolute path, a backslash or ``:``, and empty, ``.`` or ``..`` parts;
    - a part over 255 bytes of UTF-8 (the file-name limit of ext4, XFS, APFS and NTFS);
    - control, format, separator and surrogate characters (Unicode categories Cc, Cf, Cs, Zl, Zp:
      bidi overrides such as U+202E, zero-width characters, U+2028, lone surrogates);
    - a part that clashes with a file of the record format: ``*.vdlr``, ``*.vdli`` and any other
      ``.vdl*`` extension, lock files (``*.lock``) and temporary files (``*.tmp``).

    A wrong type is a ``ValueError`` too, so that a decoder catches one exception type.
    """
    if type(run) is not str or not run:
        raise ValueError(f"run must be a non-empty str, got {run!r:.80}")
    if len(run) > MAX_RUN_LENGTH:
        raise ValueError(f"run must be at most {MAX_RUN_LENGTH} characters, got {len(run)}")
    for part in run.split("/"):
        if part in ("", ".", "..") or not _RUN_PART.match(part):
            raise ValueError(f"run must be a relative path of plain names, got {run!r:.80}")
        if not part.isascii():
            for char in part:
                if unicodedata.category(char) in _RUN_BAD_CATEGORIES:
                    raise ValueError(
                        f"run must not contain invisible, control or unencodable characters, "
                        f"got {char!r} (U+{ord(char):04X}) in {run!r:.80}"
                    )
            if len(part.encode("utf-8")) > MAX_RUN_PART_BYTES:
                raise ValueError(
                    f"run parts must be at most {MAX_RUN_PART_BYTES} bytes of UTF-8, "
                    f"got {len(part.encode('utf-8'))} in {run!r:.80}"
                )
        elif len(part) > MAX_RUN_PART_BYTES:
            raise ValueError(
                f"run parts must be at most {MAX_RUN_PART_BYTES} bytes of UTF-8, "
                f"got {len(part)} in {run!r:.80}"
            )
        if _RUN_RESERVED.search(part):
            raise ValueError(
                f"run part {part!r:.80} clashes with the record format's file names "
                f"(*.vdl*, *.lock, *.tmp), got {run!r:.80}"
            )
    return run


def scalar_columns(tag: str, flat: list[int | float], end: int | None = None) -> ScalarColumns:
    """One tag's points as columns, from the writer's flat buffer ``[step, value, wall, ...]``
    (its first ``end`` items when given, a multiple of 3: the buffer may be growing).

    Three conversions from Python numbers (one per column, no Python work per point); the
    arrays are made read-only, so the recorder may keep them without a copy (see "The scalar
    path, copy by copy" in docs/performance.md). Wall times are taken to the microsecond
    (:func:`recorder.codec.quantize_walls`), as the files keep them, so a browser sees the same
    value live as after a reload.

    Raises:
        OverflowError, TypeError, ValueError: an item is not a number of its column's type
            (a step outside int64); the writer's calls let none through.
    """
    return tags_scalar_columns([(tag, flat, len(flat) if end is None else end)])[0]


def tags_scalar_columns(parts: list[tuple[str, list[int | float], int]]) -> list[ScalarColumns]:
    """Several tags' points as columns: ``parts`` holds each tag, its flat buffer and how many
    of its first items to take (as :func:`scalar_columns`).

    The same three conversions as one tag's, made once for all the tags, so that a batch costs
    three numpy conversions and one rounding of the walls however many tags it holds (each a
    tag cost about 9 us, on every point's way: h13-loop); each tag's columns are read-only
    views of the three arrays. Per point, each item is read once by its column's conversion,
    as for one tag.

    Raises:
        OverflowError, TypeError, ValueError: as :func:`scalar_columns`.
    """
    n = sum(end for _, _, end in parts) // 3
    if len(parts) == 1:
        _, flat, end = parts[0]
        columns = [flat[i:end:3] for i in range(3)]
    else:
        columns = [chain.from_iterable([f[i:end:3] for _, f, end in parts]) for i in range(3)]
    steps = np.fromiter(columns[0], np.int64, n)
    values = np.fromiter(columns[1], np.float64, n)
    walls = quantize_walls(np.fromiter(columns[2], np.float64, n))
    for column in (steps, walls, values):
        column.flags.writeable = False
    if len(parts) == 1:
        return [ScalarColumns(parts[0][0], steps, walls, values)]
    taken, i = [], 0
    for tag, _, end in parts:
        k = end // 3
        taken.append(ScalarColumns(tag, steps[i : i + k], walls[i : i + k], values[i : i + k]))
        i += k
    return taken


def columns_from_points(points: list[tuple[str, int, float, float]]) -> list[ScalarColumns]:
    """Group ``(tag, step, value, wall)`` tuples by tag into columns, keeping arrival order
    (:func:`scalar_columns` of each tag's points)."""
    by_tag: dict[str, list[int | float]] = {}
    for tag, step, value, wall in points:
        by_tag.setdefault(tag, []).extend((step, value, wall))
    return [scalar_columns(tag, flat) for tag, flat in by_tag.items()]


def _packb(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode_batch(batch: Batch) -> bytes:
    """Encode a writer's batch as one ``batch`` frame."""
    return _packb(
        {
            "type": "batch",
            "writer": batch.writer,
            "seq": batch.seq,
            "run": batch.run,
            "scalars": [
                [
                    c.tag,
                    bytes_view(c.steps, "<i8"),
                    bytes_view(c.walls, "<f8"),
                    bytes_view(c.values, "<f8"),
                ]
                for c in batch.scalars
            ],
            "events": batch.events,
            "sync": batch.sync,
        }
    )


def encode_ack(writer: str, seq: int) -> bytes:
    """Encode the broker's acknowledgement of every batch of ``writer`` up to ``seq``."""
    return _packb({"type": "ack", "writer": writer, "seq": seq})


def encode_notice(writer: str, message: str) -> bytes:
    """Encode something the broker tells ``writer`` that is not about one batch, e.g. that
    another writer logs one of its series at once; the writer warns with ``message``."""
    return _packb({"type": "notice", "writer": writer, "message": message})


def encode_taken(writer: str, seq: int) -> bytes:
    """Encode the broker's word that it took (ingested and fanned out) every batch of ``writer``
    up to ``seq``; sent only to a writer that asked (``/ws/ingest?taken=1``, docs/protocol.md).
    Not an acknowledgement: a taken batch is kept until its ``ack``."""
    return _packb({"type": "taken", "writer": writer, "seq": seq})


def encode_refused(writer: str, seq: int, reason: str, retryable: bool) -> bytes:
    """Encode the broker's refusal of batch ``seq`` of ``writer`` (see docs/protocol.md)."""
    return _packb(
        {"type": "refused", "writer": writer, "seq": seq, "reason": reason, "retryable": retryable}
    )


def encode_message(message: dict[str, Any]) -> bytes:
    """Encode a control message (``hello``, ``runs``, ``gap``, ``subscribe``...) as a frame."""
    return _packb(message)


def encode_live(
    kind: str,
    seq: int,
    run: str,
    scalars: list[ScalarColumns],
    events: list[dict[str, Any]],
    *,
    events_follow: bool = False,
) -> bytes:
    """Encode a ``snapshot`` or ``data`` frame for browsers; steps travel as f8 there.

    ``events_follow``: a snapshot's scalars, whose events come next in a ``snapshot_events``
    frame (docs/protocol.md).
    """
    message = {
        "type": kind,
        "seq": seq,
        "run": run,
        "scalars": [
            [
                c.tag,
                bytes_view(c.steps, "<f8"),
                bytes_view(c.walls, "<f8"),
                bytes_view(c.values, "<f8"),
            ]
            for c in scalars
        ],
        "events": [event_for_browser(e) for e in events],
    }
    if events_follow:
        message["events_follow"] = True
    return _packb(message)


def encode_frames(frames: list[bytes]) -> bytes:
    """Encode several encoded frames as one ``frames`` message (a live tick's worth: the
    client handles each in order, as if it had come alone)."""
    return _packb({"type": "frames", "frames": frames})


def event_for_browser(event: dict[str, Any]) -> dict[str, Any]:
    """Embeddings travel to browsers without their matrix, labels and sprite (fetched on demand
    from ``/api/blob``), so a snapshot stays small; every other event as it is."""
    if event.get("kind") != "embedding":
        return event
    from .embeddings import for_browser

    return for_browser(event)


def decode_message(data: bytes | bytearray | memoryview | str | None) -> dict[str, Any]:
    """Decode one frame into a map with a ``type``; raise ``ProtocolError`` on anything else.

    ``None`` is what quart hands over for an empty frame.
    """
    if not data:
        raise ProtocolError("empty frame")
    if isinstance(data, str):
        raise ProtocolError("frames must be binary msgpack, got a text frame")
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"malformed msgpack: {type(exc).__name__}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a frame must be a map with a str 'type'")
    return message


def _column(raw: object, dtype: str, what: str) -> np.ndarray:
    if not isinstance(raw, bytes) or len(raw) % 8:
        raise ProtocolError(f"{what} must be bin data of 8-byte elements")
    return np.frombuffer(raw, dtype=dtype)


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _check_value(value: object, where: str, depth: int) -> None:
    """Refuse what msgpack decodes but readers cannot hold: deep nesting, non-str keys."""
    if depth > MAX_EVENT_DEPTH:
        raise ProtocolError(f"event value {where} nests deeper than {MAX_EVENT_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str or len(key) > MAX_KEY_LENGTH:
                raise ProtocolError(f"event value {where} has a key that is not a short str")
            _check_value(item, where, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_value(item, where, depth + 1)
    elif type(value) is bytes and depth > 1:
        # Readers turn an event's bin values into arrays of floats, or media; nested ones would
        # have no JSON form.
        raise ProtocolError(f"event value {where} holds bin data below the top level")
    elif type(value) is int and not _INT64_MIN <= value <= _UINT64_MAX:
        raise ProtocolError(f"event value {where} is an int outside 64 bits")


def _f8_array(event: dict[str, Any], key: str, kind: str, count: int | None = None) -> int:
    """Check that ``event[key]`` is ``<f8`` bytes (of ``count`` elements if given); return its length."""
    raw = event.get(key)
    if type(raw) is not bytes or len(raw) % 8:
        raise ProtocolError(f"{kind} {key} must be bin data of 8-byte floats")
    n = len(raw) // 8
    if count is not None and n != count:
        raise ProtocolError(f"{kind} {key} must hold {count} floats, got {n}")
    return n


def _require(event: dict[str, Any], key: str, kind: str, ok: Any, what: str) -> None:
    if not ok(event.get(key)):
        raise ProtocolError(f"{kind} {key} must be {what}")


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value <= _UINT64_MAX


def _optional_number(value: object) -> bool:
    return value is None or _is_number(value)


def _check_histogram(event: dict[str, Any]) -> None:
    edges = _f8_array(event, "edges", "histogram")
    if edges < 2:
        raise ProtocolError("histogram edges must hold at least 2 floats")
    _f8_array(event, "counts", "histogram", edges - 1)
    for key in ("num", "nan", "inf"):
        _require(event, key, "histogram", _count, "a non-negative int")
    for key in ("min", "max", "sum", "sum_sq"):
        _require(event, key, "histogram", _optional_number, "a number or nil")


def _check_media(event: dict[str, Any], kind: str, formats: tuple[str, ...]) -> None:
    _require(event, "data", kind, lambda v: type(v) is bytes, "bin data")
    _require(event, "format", kind, lambda v: v in formats, f"one of {list(formats)}")


def _check_image(event: dict[str, Any]) -> None:
    # gif: add_video's animated GIFs (and GIFs imported from event files).
    _check_media(event, "image", ("png", "gif"))
    for key in ("width", "height"):
        _require(event, key, "image", lambda v: type(v) is int and v > 0, "a positive int")


def _check_audio(event: dict[str, Any]) -> None:
    _check_media(event, "audio", ("wav",))
    for key in ("sample_rate", "channels"):
        _require(event, key, "audio", lambda v: type(v) is int and v > 0, "a positive int")
    for key in ("frames", "clipped"):
        _require(event, key, "audio", _count, "a non-negative int")


def _check_text(event: dict[str, Any]) -> None:
    _require(event, "text", "text", lambda v: type(v) is str, "a str")


def _str_map(value: object, ok: Any) -> bool:
    return isinstance(value, dict) and all(
        type(k) is str and len(k) <= MAX_KEY_LENGTH and ok(v) for k, v in value.items()
    )


def _check_hparams(event: dict[str, Any]) -> None:
    _require(
        event,
        "hparams",
        "hparams",
        lambda v: _str_map(v, lambda x: type(x) in (str, int, float, bool)),
        "a map of str to str, int, float or bool",
    )
    _require(
        event,
        "metrics",
        "hparams",
        lambda v: isinstance(v, list) and all(type(m) is str for m in v),
        "an array of str",
    )
    _require(
        event,
        "metric_values",
        "hparams",
        lambda v: v is None or _str_map(v, _is_number),
        "nil or a map of str to numbers",
    )


def _check_curve(event: dict[str, Any], kind: str, keys: tuple[str, ...]) -> None:
    n = _f8_array(event, "thresholds", kind)
    for key in keys:
        _f8_array(event, key, kind, n)
    _require(event, "num_thresholds", kind, lambda v: v == n, f"the number of thresholds, {n}")


def _check_telemetry(event: dict[str, Any]) -> None:
    _require(event, "fields", "telemetry", lambda v: _str_map(v, _is_number), "a map of numbers")
    _require(event, "host", "telemetry", lambda v: v is None or type(v) is str, "a str")
    _require(event, "rank", "telemetry", lambda v: v is None or type(v) is int, "an int")


def _short_str(limit: int) -> Any:
    return lambda v: type(v) is str and len(v) <= limit


def _check_alert(event: dict[str, Any]) -> None:
    """An alert is untagged (a tag holds one kind): the tag it is about travels as ``series``."""
    _require(event, "tag", "alert", lambda v: v is None, "nil (the tag it is about is series)")
    _require(event, "rule", "alert", lambda v: type(v) is str and 0 < len(v) <= 64, "a short str")
    _require(event, "level", "alert", lambda v: v in ALERT_LEVELS, f"one of {list(ALERT_LEVELS)}")
    _require(event, "message", "alert", _short_str(MAX_ALERT_TEXT), "a str")
    _require(event, "title", "alert", _short_str(MAX_ALERT_TEXT), "a str")
    _require(event, "value", "alert", _optional_number, "a number or nil")
    series = event.get("series")
    if series is not None:
        try:
            check_tag(series, "alert series")
        except (TypeError, ValueError) as exc:
            raise ProtocolError(str(exc)) from None


# -- graph events (model graphs, vdl_stream.graphs; docs/protocol.md "graph events") --------------

#: A graph event holds at most this many nodes, and this many edges.
MAX_GRAPH_NODES = 20_000
MAX_GRAPH_EDGES = 100_000


def _graph_tensor(value: object) -> bool:
    if not isinstance(value, dict) or set(value) != {"shape", "dtype"}:
        return False
    shape, dtype = value["shape"], value["dtype"]
    return (dtype is None or type(dtype) is str) and (
        shape is None
        or (
            type(shape) is list
            and all(d is None or type(d) is str or (type(d) is int and d >= 0) for d in shape)
        )
    )


def _check_graph(event: dict[str, Any]) -> None:
    """Nodes are maps of the documented keys; edges are [src, dst, slot] within the nodes."""
    _require(event, "framework", "graph", _short_str(64), "a short str")
    _require(event, "name", "graph", _short_str(MAX_TAG_LENGTH), "a str")
    nodes, edges = event.get("nodes"), event.get("edges")
    if type(nodes) is not list or len(nodes) > MAX_GRAPH_NODES:
        raise ProtocolError(f"graph nodes must be an array of at most {MAX_GRAPH_NODES} maps")
    if type(edges) is not list or len(edges) > MAX_GRAPH_EDGES:
        raise ProtocolError(f"graph edges must be an array of at most {MAX_GRAPH_EDGES} arrays")
    for k, node in enumerate(nodes):
        if not (
            isinstance(node, dict)
            and type(node.get("name")) is str
            and type(node.get("op")) is str
            and type(node.get("scope")) is str
            and _count(node.get("params"))
            and type(node.get("inputs")) is list
            and all(_graph_tensor(t) for t in node["inputs"])
            and type(node.get("outputs")) is list
            and len(node["outputs"]) > 0
            and all(_graph_tensor(t) for t in node["outputs"])
            and isinstance(node.get("attrs", {}), dict)
            and all(type(v) is str for v in node.get("attrs", {}).values())
        ):
            raise ProtocolError(
                f"graph node {k} must be a map of name, op, scope (str), params (a count), "
                "inputs and outputs (arrays of {shape, dtype}), attrs (a map of str)"
            )
    n = len(nodes)
    for edge in edges:
        if not (
            type(edge) is list
            and len(edge) == 3
            and all(type(x) is int for x in edge)
            and 0 <= edge[0] < n
            and 0 <= edge[1] < n
            and 0 <= edge[2] < len(nodes[edge[0]]["outputs"])
        ):
            raise ProtocolError(
                f"graph edge {edge!r:.60} must be [src, dst, slot] within the nodes"
            )


def _check_meta(event: dict[str, Any]) -> None:
    """``meta`` holds free-form keys; the depth and key checks apply."""


def _check_embedding(event: dict[str, Any]) -> None:
    from .embeddings import check

    check(event)


_CURVES = {
    "pr_curve": ("tp", "fp", "tn", "fn", "precision", "recall"),
    "roc_curve": ("tp", "fp", "tn", "fn", "tpr", "fpr"),
}
_KIND_CHECKS = {
    "histogram": _check_histogram,
    "image": _check_image,
    "audio": _check_audio,
    "text": _check_text,
    "hparams": _check_hparams,
    "pr_curve": lambda e: _check_curve(e, "pr_curve", _CURVES["pr_curve"]),
    "roc_curve": lambda e: _check_curve(e, "roc_curve", _CURVES["roc_curve"]),
    "telemetry": _check_telemetry,
    "meta": _check_meta,
    "alert": _check_alert,
    "graph": _check_graph,
    "embedding": _check_embedding,
}
#: Bin values that are not ``<f8`` arrays; every other bin value of an event is one.
_OPAQUE_BINS = frozenset({"data", "sprite"})  # sprite: an embedding's thumbnails (PNG)


def check_event(event: object) -> dict[str, Any]:
    """Validate a non-scalar event map, common keys and the keys of its kind (see docs/protocol.md).

    Everything a reader later relies on is checked here, so an event that is accepted can always
    be read back: bin values other than media ``data`` (and an embedding's ``sprite``) are ``<f8`` arrays, telemetry ``fields`` is
    a map of numbers, histogram ``counts`` has one element fewer than ``edges``, nesting is at most
    :data:`MAX_EVENT_DEPTH` deep, map keys are short str.

    Raises:
        ProtocolError: the event breaks the schema; the message names the kind and key.
    """
    if not isinstance(event, dict):
        raise ProtocolError("an event must be a map")
    kind = event.get("kind")
    if kind not in EVENT_KINDS:
        raise ProtocolError(f"unknown event kind {kind!r:.40}")
    tag = event.get("tag")
    if tag is not None:
        try:
            check_tag(tag)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad event tag: {exc}") from None
    step = event.get("step")
    if step is not None and (type(step) is not int or not _INT64_MIN <= step < 2**63):
        raise ProtocolError("event step must be an int64 or nil")
    wall = event.get("wall")
    if type(wall) not in (int, float) or not math.isfinite(wall):
        raise ProtocolError("event wall must be a finite number")
    for key, value in event.items():
        if type(key) is not str or len(key) > MAX_KEY_LENGTH:
            raise ProtocolError(f"{kind} event keys must be str of at most {MAX_KEY_LENGTH} chars")
        if type(value) is bytes and key not in _OPAQUE_BINS and len(value) % 8:
            raise ProtocolError(f"{kind} {key} must be bin data of 8-byte floats")
        _check_value(value, f"{kind} {key}", 1)
    _KIND_CHECKS[kind](event)
    return event


def decode_batch(message: dict[str, Any]) -> Batch:
    """Turn a decoded ``batch`` map into a :class:`Batch`, checking every field of the schema.

    Raises:
        BatchError: ``writer`` and ``seq`` are valid but the rest breaks the schema (the server
            refuses that batch alone).
        ProtocolError: ``writer`` or ``seq`` is missing or invalid (the server closes the
            connection: there is no batch to refuse).
    """
    writer = message.get("writer")
    seq = message.get("seq")
    if type(writer) is not str or not writer or len(writer) > 128:
        raise ProtocolError("batch writer must be a non-empty str of at most 128 characters")
    if type(seq) is not int or not 1 <= seq < 2**63:
        raise ProtocolError("batch seq must be a positive int64")
    try:
        return _decode_batch_body(message, writer, seq)
    except BatchError:
        raise
    except ProtocolError as exc:
        raise BatchError(str(exc), writer, seq) from None


def decode_checked_batch(message: dict[str, Any]) -> Batch:
    """Turn a decoded ``batch`` map that a broker encoded (:func:`encode_batch`) from batches it
    had checked with :func:`decode_batch` back into a :class:`Batch`, checking its shape only:
    the bus's receivers (vdl_stream/bus.py), where checking every name again, and the walls
    (finite, quantized to the microsecond: already so), was a third of the work per entry.

    Raises:
        ProtocolError: a field is missing or of the wrong shape (the entry is skipped).
    """
    try:
        writer, seq, run = message["writer"], message["seq"], message["run"]
        raw_scalars, events = message["scalars"], message["events"]
        if type(run) is not str or not isinstance(events, list):
            raise ProtocolError("not a batch frame")
        scalars = []
        for tag, raw_steps, raw_walls, raw_values in raw_scalars:
            steps = _column(raw_steps, "<i8", "steps")
            walls = _column(raw_walls, "<f8", "walls")
            values = _column(raw_values, "<f8", "values")
            if type(tag) is not str or not len(steps) == len(walls) == len(values):
                raise ProtocolError("not a batch frame")
            scalars.append(ScalarColumns(tag, steps, walls, values))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"not a batch frame: {type(exc).__name__}") from None
    if not all(isinstance(e, dict) for e in events):
        raise ProtocolError("not a batch frame")
    return Batch(writer, seq, run, scalars, events, bool(message.get("sync", False)))


def _decode_batch_body(message: dict[str, Any], writer: str, seq: int) -> Batch:
    try:
        run = check_run_name(message.get("run"))
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    raw_scalars = message.get("scalars", [])
    raw_events = message.get("events", [])
    if not isinstance(raw_scalars, list) or not isinstance(raw_events, list):
        raise ProtocolError("batch scalars and events must be arrays")
    checked = []
    for entry in raw_scalars:
        if not isinstance(entry, list) or len(entry) != 4:
            raise ProtocolError("a scalars entry must be [tag, steps, walls, values]")
        try:
            tag = check_tag(entry[0], reserved=True)  # telemetry scalars travel in columns too
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad scalar tag: {exc}") from None
        steps = _column(entry[1], "<i8", "steps")
        values = _column(entry[3], "<f8", "values")
        raw_walls = entry[2]
        if not isinstance(raw_walls, bytes) or len(raw_walls) != 8 * len(steps):
            _column(raw_walls, "<f8", "walls")  # its own message when not 8-byte bin data
            raise ProtocolError(f"columns of tag {tag!r:.80} differ in length")
        if len(values) != len(steps):
            raise ProtocolError(f"columns of tag {tag!r:.80} differ in length")
        checked.append((tag, steps, raw_walls, values))
    events = [check_event(e) for e in raw_events]
    return Batch(writer, seq, run, _scalar_columns(checked), events, bool(message.get("sync")))


def _scalar_columns(
    checked: list[tuple[str, np.ndarray, bytes, np.ndarray]],
) -> list[ScalarColumns]:
    """The batch's scalar columns, with every tag's walls checked finite and quantized to the
    microsecond (as the files keep them: live and on disk agree bit for bit).

    A small batch's walls are joined and checked in one pass, not with about ten numpy calls per
    tag: at 10k events/s a batch holds 10 tags of a few points, and the per-call cost was most of
    its decoding (0.2 ms a batch on the server's event loop, docs/performance.md). Past
    :data:`JOINED_WALLS_BYTES` each tag goes alone, as the join would only add a copy of large
    columns. Walls are read-only views, as steps and values are of the frame: the recorder keeps
    them, no copy."""
    if sum(len(raw) for _, _, raw, _ in checked) <= JOINED_WALLS_BYTES:
        groups = [checked] if checked else []
    else:
        groups = [[one] for one in checked]
    scalars = []
    for group in groups:
        walls = np.frombuffer(b"".join(raw for _, _, raw, _ in group), "<f8")
        if not np.isfinite(walls).all():
            for tag, _, raw, _ in group:
                if not np.isfinite(np.frombuffer(raw, "<f8")).all():
                    raise ProtocolError(f"walls of tag {tag!r:.80} must be finite")
        walls = quantize_walls(walls)
        walls.flags.writeable = False
        start = 0
        for tag, steps, _, values in group:
            end = start + len(steps)
            scalars.append(ScalarColumns(tag, steps, walls[start:end], values))
            start = end
    return scalars
