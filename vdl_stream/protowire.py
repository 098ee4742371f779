"""The protobuf wire format, decoded by hand (no protobuf package), and TensorFlow's TensorProto.

Enough of it for TensorBoard's event files (vdl_stream.tfevents), VisualDL's records
(vdl_stream.vdlrecords) and TensorFlow GraphDefs (vdl_stream.graphs): fields of a message as
``(number, wire type, value)``, grouped by number, packed repeated numbers, and tensors::

    TensorProto   dtype = 1, tensor_shape = 2 { dim = 2 { size = 1 } }, tensor_content bytes = 4,
                  float_val = 5, double_val = 6, int_val = 7, string_val = 8, int64_val = 10
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = struct.Struct("<f")
F64 = struct.Struct("<d")


class DecodeError(ValueError):
    """A payload is not a well-formed protobuf message of the expected type."""


def varint(b: bytes, pos: int) -> tuple[int, int]:
    """Decode the varint at ``pos``; return its value and the position after it."""
    result = 0
    shift = 0
    while True:
        byte = b[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def skip(b: bytes, pos: int, wire: int) -> int:
    """Return the position after the value of wire type ``wire`` at ``pos`` (not decoded)."""
    if wire == 0:
        return varint(b, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        n, pos = varint(b, pos)
        return pos + n
    if wire == 5:
        return pos + 4
    raise DecodeError(f"unsupported wire type {wire}")


def wire_fields(b: bytes) -> list[tuple[int, int, Any]]:
    """Split a message into ``(field, wire type, value)``; length-delimited values as bytes."""
    out = []
    pos = 0
    n = len(b)
    while pos < n:
        key, pos = varint(b, pos)
        fnum, wire = key >> 3, key & 7
        if wire == 0:
            v, pos = varint(b, pos)
        elif wire == 1:
            v = b[pos : pos + 8]
            pos += 8
        elif wire == 2:
            k, pos = varint(b, pos)
            v = b[pos : pos + k]
            pos += k
        elif wire == 5:
            v = b[pos : pos + 4]
            pos += 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        if pos > n:
            raise DecodeError("message truncated")
        out.append((fnum, wire, v))
    return out


def packed_doubles(items: list[tuple[int, Any]]) -> list[float]:
    """Repeated double values, packed (wire 2) or not (wire 1)."""
    out: list[float] = []
    for wire, v in items:
        if wire == 2:
            if len(v) % 8:
                raise DecodeError("packed doubles not a multiple of 8 bytes")
            out.extend(np.frombuffer(v, dtype="<f8").tolist())
        elif wire == 1:
            out.append(F64.unpack(v)[0])
    return out


def _floats(items: list[tuple[int, Any]]) -> list[float]:
    out: list[float] = []
    for wire, v in items:
        if wire == 2:
            if len(v) % 4:
                raise DecodeError("packed floats not a multiple of 4 bytes")
            out.extend(np.frombuffer(v, dtype="<f4").astype(np.float64).tolist())
        elif wire == 5:
            out.append(F32.unpack(v)[0])
    return out


def _varints(items: list[tuple[int, Any]], signed64: bool = True) -> list[int]:
    out: list[int] = []
    for wire, v in items:
        if wire == 2:
            pos = 0
            while pos < len(v):
                x, pos = varint(v, pos)
                out.append(x)
        elif wire == 0:
            out.append(v)
    if signed64:
        out = [x - (1 << 64) if x >= 1 << 63 else x for x in out]
    return out


def group_fields(fields: list[tuple[int, int, Any]]) -> dict[int, list[tuple[int, Any]]]:
    """Group :func:`wire_fields` output by field number: ``{field: [(wire type, value), ...]}``."""
    out: dict[int, list[tuple[int, Any]]] = {}
    for fnum, wire, v in fields:
        out.setdefault(fnum, []).append((wire, v))
    return out


def last_field(g: dict[int, list[tuple[int, Any]]], fnum: int, default: Any = None) -> Any:
    """The value of field ``fnum`` (the last one wins, as protobuf merges), or ``default``."""
    items = g.get(fnum)
    return items[-1][1] if items else default


# TensorFlow DataType numbers and their numpy little-endian types.
_DTYPES = {
    1: "<f4",  # DT_FLOAT
    2: "<f8",  # DT_DOUBLE
    3: "<i4",  # DT_INT32
    4: "u1",  # DT_UINT8
    5: "<i2",  # DT_INT16
    6: "i1",  # DT_INT8
    9: "<i8",  # DT_INT64
    10: "u1",  # DT_BOOL
    19: "<f2",  # DT_HALF
}
DT_STRING = 7


@dataclass
class Tensor:
    """A decoded TensorProto: ``dtype`` number, ``shape``, and numbers or byte strings."""

    dtype: int
    shape: tuple[int, ...]
    numbers: np.ndarray | None = None
    strings: list[bytes] | None = None


def decode_tensor(b: bytes) -> Tensor:
    """Decode a TensorProto of a numeric or string dtype.

    Raises:
        DecodeError: malformed bytes, or a dtype this decoder does not know.
    """
    g = group_fields(wire_fields(b))
    dtype = last_field(g, 1, 0)
    shape: list[int] = []
    shape_msg = last_field(g, 2)
    if shape_msg is not None:
        for wire, dim in group_fields(wire_fields(shape_msg)).get(2, []):
            if wire == 2:
                shape.append(last_field(group_fields(wire_fields(dim)), 1, 0))
    if dtype == DT_STRING:
        return Tensor(dtype, tuple(shape), strings=[v for w, v in g.get(8, []) if w == 2])
    np_type = _DTYPES.get(dtype)
    if np_type is None:
        raise DecodeError(f"tensor dtype {dtype} is not supported")
    content = last_field(g, 4)
    if content:
        numbers = np.frombuffer(content, dtype=np_type).astype(np.float64)
    elif dtype == 1:
        numbers = np.array(_floats(g.get(5, [])), dtype=np.float64)
    elif dtype == 2:
        numbers = np.array(packed_doubles(g.get(6, [])), dtype=np.float64)
    elif dtype == 9:
        numbers = np.array(_varints(g.get(10, [])), dtype=np.float64)
    elif dtype == 19:  # half_val: the bits of each half in an int32
        bits = np.array(_varints(g.get(13, []), signed64=False), dtype=np.uint16)
        numbers = bits.view("<f2").astype(np.float64)
    else:
        vals = _varints(g.get(7, []))
        numbers = np.array([x - (1 << 32) if x >= 1 << 31 else x for x in vals], np.float64)
    return Tensor(dtype, tuple(shape), numbers=numbers)
