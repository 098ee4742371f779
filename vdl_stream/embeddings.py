"""High-dimensional embeddings: the ``embedding`` event of ``add_embedding`` / ``add_embeddings``.

One event holds one matrix of N points in D dimensions (float32, row-major), optional metadata
columns (one label per point per column, with a header naming each column) and an optional sprite
of thumbnails (one PNG, thumbnails row-major in a square-ish grid, as TensorBoard's projector lays
them out). The page projects the points itself (PCA, and a UMAP-style layout in a Web Worker), so
nothing is projected here: this module only validates and packs. The payload is written down in
docs/protocol.md ("Embeddings").

Browsers do not get the heavy parts in their live frames: :func:`for_browser` strips the matrix,
the metadata and the sprite (``codec.encode_live`` calls it), and the page fetches them from
``/api/blob?kind=embedding&part=matrix|metadata|sprite`` when it shows that embedding.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from . import codec, summaries

#: The event kind.
KIND = "embedding"
#: Most bytes of one embedding's matrix plus its sprite: the event must fit a wire frame.
MAX_EMBEDDING_BYTES = summaries.MAX_PAYLOAD_BYTES
#: Most points of one embedding.
MAX_POINTS = 1_000_000
#: Most metadata columns, and most characters of one label or header name.
MAX_COLUMNS = 64
MAX_LABEL_LENGTH = 1024
#: Most bytes of all labels of one embedding together (UTF-8, as stored).
MAX_METADATA_BYTES = 8 << 20
#: The sprite is at most this many pixels wide and high (TensorBoard's projector limit too).
MAX_SPRITE_SIDE = 8192
#: The header of a single metadata column given without ``metadata_header``.
DEFAULT_HEADER = "label"
#: The parts of an embedding that ``/api/blob`` serves, with their media types.
BLOB_PARTS = {
    "matrix": "application/octet-stream",
    "metadata": "application/json",
    "sprite": "image/png",
}
#: Keys of an embedding event that stay out of browsers' live frames (fetched on demand).
HEAVY_KEYS = ("data", "metadata", "sprite")


def embedding_matrix(mat: Any, name: str = "mat") -> np.ndarray:
    """Return ``mat`` (N points x D dimensions, any real dtype or tensor) as C-ordered ``<f4``.

    Raises:
        TypeError: not an array of real numbers.
        ValueError: not 2-D, empty, too large for one event, or holding NaN/Inf (or values beyond
            float32's range); the message names ``name``, the shape and the first bad position.
    """
    arr = summaries.as_numpy(mat, name)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D (N points x D dimensions), got shape {tuple(arr.shape)}"
        )
    n, d = arr.shape
    if n < 1 or d < 1:
        raise ValueError(
            f"{name} must hold at least one point of one dimension, got shape {(n, d)}"
        )
    if n > MAX_POINTS or 4 * n * d > MAX_EMBEDDING_BYTES:
        raise ValueError(
            f"{name} must have at most {MAX_POINTS} points and {MAX_EMBEDDING_BYTES} bytes as "
            f"float32, got shape {(n, d)} ({4 * n * d} bytes)"
        )
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype="<f4")
    bad = ~np.isfinite(out)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        value = float(arr[row, col])
        what = "NaN" if value != value else "Inf" if not np.isfinite(value) else "beyond float32"
        raise ValueError(
            f"{name} must hold finite float32 values, got {what} ({value!r}) at row {row}, "
            f"column {col} of shape {(n, d)} ({int(bad.sum())} bad value(s))"
        )
    return out


def _label(value: Any, where: str) -> str:
    """One metadata label as str (numbers and tensors' items formatted as ``str`` does)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        with contextlib.suppress(ValueError, TypeError):  # a multi-element array: str() it
            value = value.item()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = summaries.check_str(value if isinstance(value, str) else str(value), where)
    if len(text) > MAX_LABEL_LENGTH:
        raise ValueError(f"{where} must be at most {MAX_LABEL_LENGTH} characters, got {len(text)}")
    return text


def _rows(metadata: Any) -> list[Any]:
    if isinstance(metadata, (str, bytes)) or not hasattr(metadata, "__len__"):
        if hasattr(metadata, "tolist"):
            metadata = metadata.tolist()
        else:
            raise TypeError(
                f"metadata must be a list of labels (or of rows with metadata_header), got "
                f"{type(metadata).__name__} {summaries._short(metadata)}"
            )
    if hasattr(metadata, "tolist") and not isinstance(metadata, list):
        metadata = metadata.tolist()
    if isinstance(metadata, (str, bytes)):
        raise TypeError(f"metadata must be a list of labels, got a {type(metadata).__name__}")
    return list(metadata)


def metadata_columns(
    metadata: Any, metadata_header: Any, n: int
) -> tuple[list[str], list[list[str]]] | tuple[None, None]:
    """Return ``(header, columns)`` for ``n`` points, or ``(None, None)`` without metadata.

    ``metadata`` is a list of N labels (one column, named ``label`` or ``metadata_header[0]``),
    or with a ``metadata_header`` of K names, a list of N rows of K labels each (tensorboardX's
    convention). Labels may be str, numbers or anything ``str()`` formats.

    Raises:
        TypeError, ValueError: a bad argument, named with the bad row or length.
    """
    if metadata is None:
        if metadata_header is not None:
            raise ValueError("metadata_header needs metadata, got metadata=None")
        return None, None
    rows = _rows(metadata)
    if len(rows) != n:
        raise ValueError(f"metadata must have one entry per point of mat ({n}), got {len(rows)}")
    if metadata_header is None:
        header = [DEFAULT_HEADER]
        columns = [[_label(v, f"metadata[{i}]") for i, v in enumerate(rows)]]
    else:
        names = _rows(metadata_header)
        if not 1 <= len(names) <= MAX_COLUMNS:
            raise ValueError(
                f"metadata_header must name 1 to {MAX_COLUMNS} columns, got {len(names)}"
            )
        header = [_label(v, f"metadata_header[{i}]") for i, v in enumerate(names)]
        if len(set(header)) != len(header):
            raise ValueError(f"metadata_header must not repeat a name, got {header!r:.200}")
        if len(header) == 1 and rows and not _is_row(rows[0]):
            columns = [[_label(v, f"metadata[{i}]") for i, v in enumerate(rows)]]
        else:
            columns = [[] for _ in header]
            for i, row in enumerate(rows):
                cells = _rows(row) if _is_row(row) else None
                if cells is None or len(cells) != len(header):
                    got = f"{len(cells)} labels" if cells is not None else repr(row)[:40]
                    raise ValueError(
                        f"metadata[{i}] must be a row of {len(header)} labels (one per "
                        f"metadata_header name), got {got}"
                    )
                for column, cell in zip(columns, cells, strict=True):
                    column.append(_label(cell, f"metadata[{i}]"))
    total = sum(len(v.encode("utf-8")) for column in columns for v in column)
    if total > MAX_METADATA_BYTES:
        raise ValueError(f"metadata must be at most {MAX_METADATA_BYTES} bytes, got {total}")
    return header, columns


def _is_row(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or (
        hasattr(value, "__len__") and hasattr(value, "tolist") and getattr(value, "ndim", 0) >= 1
    )


def sprite(label_img: Any, n: int) -> tuple[bytes, int, int]:
    """Tile ``label_img`` (N, C, H, W), C of 1, 3 or 4 (or (N, H, W) grey), into one PNG sprite.

    Thumbnails go row-major into a grid of ``ceil(sqrt(N))`` columns. Values are uint8, or floats
    in [0, 1] (clipped; NaN is 0). Returns ``(png, thumbnail height, thumbnail width)``.

    Raises:
        TypeError, ValueError: a bad argument, named with its shape.
    """
    arr = summaries.as_numpy(label_img, "label_img")
    shape = tuple(arr.shape)
    if arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4 or arr.shape[1] not in (1, 3, 4):
        raise ValueError(
            f"label_img must be (N, C, H, W) with C of 1, 3 or 4 (or (N, H, W)), got shape {shape}"
        )
    if arr.shape[0] != n:
        raise ValueError(f"label_img must have one image per point of mat ({n}), got shape {shape}")
    _, c, h, w = arr.shape
    if h < 1 or w < 1:
        raise ValueError(f"label_img images must be at least 1x1, got shape {shape}")
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    if cols * w > MAX_SPRITE_SIDE or rows * h > MAX_SPRITE_SIDE:
        raise ValueError(
            f"label_img tiles into a {cols * w}x{rows * h} sprite, over {MAX_SPRITE_SIDE} pixels "
            f"a side: use smaller thumbnails, got shape {shape}"
        )
    if arr.dtype == np.uint8:
        pixels = arr
    else:
        with np.errstate(invalid="ignore"):
            scaled = np.nan_to_num(arr.astype(np.float64), nan=0.0) * 255.0
        pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    grid = np.zeros((rows * cols, h, w, c), dtype=np.uint8)
    grid[:n] = pixels.transpose(0, 2, 3, 1)
    tiled = (
        grid.reshape(rows, cols, h, w, c).transpose(0, 2, 1, 3, 4).reshape(rows * h, cols * w, c)
    )
    return summaries.encode_png(np.ascontiguousarray(tiled)), int(h), int(w)


def embedding_event(
    mat: Any,
    metadata: Any = None,
    label_img: Any = None,
    step: Any = 0,
    tag: str = "default",
    metadata_header: Any = None,
    wall: float = 0.0,
) -> dict[str, Any]:
    """Build an ``embedding`` event (see the module doc and docs/protocol.md).

    Args:
        mat: N x D real numbers (numpy, torch, paddle, jax, nested lists); NaN/Inf refused.
        metadata: None, N labels, or N rows of labels matching ``metadata_header``.
        label_img: None or N thumbnails (N, C, H, W), tiled into a PNG sprite.
        step: the training step (an int).
        tag: the embedding's name.
        metadata_header: None or the names of the metadata columns.
        wall: seconds since the epoch.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    codec.check_tag(tag)
    step = summaries.to_step(step, "global_step")
    wall = summaries.check_wall(wall, "walltime")
    matrix = embedding_matrix(mat)
    n, d = matrix.shape
    header, columns = metadata_columns(metadata, metadata_header, n)
    png, th, tw = (None, 0, 0) if label_img is None else sprite(label_img, n)
    if matrix.nbytes + (len(png) if png else 0) > MAX_EMBEDDING_BYTES:
        raise ValueError(
            f"mat ({matrix.nbytes} bytes) and the label_img sprite ({len(png or b'')} bytes) "
            f"together must be at most {MAX_EMBEDDING_BYTES} bytes"
        )
    return {
        "kind": KIND,
        "tag": tag,
        "step": step,
        "wall": wall,
        "data": matrix.tobytes(),
        "shape": [int(n), int(d)],
        "metadata_header": header,
        "metadata": columns,
        "sprite": png,
        "thumbnail": [th, tw] if png else None,
    }


def for_browser(event: dict[str, Any]) -> dict[str, Any]:
    """Return an embedding event without its heavy parts, for live frames; others unchanged.

    The matrix and sprite become their sizes (``data_bytes``, ``sprite_bytes``), the metadata
    columns go (``metadata_header`` stays); the page fetches them from ``/api/blob``.
    """
    if event.get("kind") != KIND:
        return event
    out = {k: v for k, v in event.items() if k not in HEAVY_KEYS}
    data, sprite_png = event.get("data"), event.get("sprite")
    out["data_bytes"] = len(data) if isinstance(data, bytes) else 0
    out["sprite_bytes"] = len(sprite_png) if isinstance(sprite_png, bytes) else 0
    return out


def blob_part(event: dict[str, Any], part: str) -> tuple[bytes | dict[str, Any], str] | None:
    """The ``part`` of an embedding event that ``/api/blob`` serves, with its media type.

    ``matrix``: the raw ``<f4`` bytes (shape in the event); ``metadata``: a JSON map
    ``{"shape", "header", "columns", "thumbnail"}``; ``sprite``: the PNG. None when the event
    has no such part.
    """
    if part == "matrix":
        return event["data"], BLOB_PARTS[part]
    if part == "metadata":
        body = {
            "shape": event.get("shape"),
            "header": event.get("metadata_header") or [],
            "columns": event.get("metadata") or [],
            "thumbnail": event.get("thumbnail"),
        }
        return body, BLOB_PARTS[part]
    if part == "sprite" and isinstance(event.get("sprite"), bytes):
        return event["sprite"], BLOB_PARTS[part]
    return None


def check(event: dict[str, Any]) -> None:
    """Validate an ``embedding`` event's own keys; raise ``codec.ProtocolError`` naming the key."""
    shape = event.get("shape")
    if not (
        isinstance(shape, list)
        and len(shape) == 2
        and all(type(v) is int and v > 0 for v in shape)
        and shape[0] <= MAX_POINTS
    ):
        raise codec.ProtocolError("embedding shape must be [N, D] of positive ints")
    n, d = shape
    data = event.get("data")
    if type(data) is not bytes or len(data) != 4 * n * d:
        raise codec.ProtocolError(f"embedding data must be {4 * n * d} bytes of float32 (N x D)")
    header, columns = event.get("metadata_header"), event.get("metadata")
    if header is None or columns is None:
        if header is not None or columns is not None:
            raise codec.ProtocolError("embedding metadata and metadata_header go together")
    elif not (
        isinstance(header, list)
        and 1 <= len(header) <= MAX_COLUMNS
        and all(type(h) is str for h in header)
        and isinstance(columns, list)
        and len(columns) == len(header)
        and all(
            isinstance(c, list) and len(c) == n and all(type(v) is str for v in c) for c in columns
        )
    ):
        raise codec.ProtocolError(
            "embedding metadata must be one array of N str per metadata_header name"
        )
    png, thumb = event.get("sprite"), event.get("thumbnail")
    if png is None or thumb is None:
        if png is not None or thumb is not None:
            raise codec.ProtocolError("embedding sprite and thumbnail go together")
    elif not (type(png) is bytes and png.startswith(b"\x89PNG")):
        raise codec.ProtocolError("embedding sprite must be PNG bin data")
    elif not (
        isinstance(thumb, list) and len(thumb) == 2 and all(type(v) is int and v > 0 for v in thumb)
    ):
        raise codec.ProtocolError("embedding thumbnail must be [height, width] of positive ints")
