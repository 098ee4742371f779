"""Framing and payload codec, without files: round trips, truncation, corruption."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recorder import codec, framing
from recorder.downsample import extreme_indices

payloads = st.lists(
    st.binary(min_size=1, max_size=40).map(lambda b: bytes([framing.PAYLOAD_MARKER]) + b),
    min_size=1,
    max_size=8,
)


def frames_of(items: list[bytes]) -> tuple[bytes, list[int]]:
    """Concatenated frames and the end offset of each."""
    out, ends = b"", []
    for p in items:
        out += framing.encode_frame(p)
        ends.append(len(out))
    return out, ends


@settings(max_examples=50, deadline=None)
@given(payloads)
def test_frames_round_trip(items):
    data, _ = frames_of(items)
    scan = framing.scan_frames(data)
    got = [bytes(framing.payload_of(data, off, n)) for off, n in scan.frames]
    assert got == items
    assert scan.end == scan.valid_end == len(data)
    assert scan.damaged == []


@settings(max_examples=30, deadline=None)
@given(payloads)
def test_cut_at_every_offset_yields_the_complete_frames_before_it(items):
    data, ends = frames_of(items)
    for cut in range(len(data) + 1):
        scan = framing.scan_frames(data[:cut])
        complete = [e for e in ends if e <= cut]
        assert len(scan.frames) == len(complete)
        assert scan.damaged == []  # a torn tail is not damage
        assert scan.end == (complete[-1] if complete else 0)


@settings(max_examples=100, deadline=None)
@given(payloads, st.data())
def test_byte_flip_loses_only_the_damaged_frame(items, data):
    blob, ends = frames_of(items)
    pos = data.draw(st.integers(0, len(blob) - 1))
    flip = data.draw(st.integers(1, 255))
    damaged = bytearray(blob)
    damaged[pos] ^= flip
    hit = next(i for i, e in enumerate(ends) if pos < e)
    scan = framing.scan_frames(bytes(damaged))
    got = [bytes(framing.payload_of(damaged, off, n)) for off, n in scan.frames]
    assert got == items[:hit] + items[hit + 1 :]
    # the damage is reported, or (last frame) left pending like a torn tail
    if hit == len(items) - 1:
        assert not scan.damaged and scan.end == ends[hit] - len(framing.encode_frame(items[hit]))
    else:
        assert scan.damaged and scan.end == len(blob)
    sealed = framing.scan_frames(bytes(damaged), sealed=True)
    assert sealed.damaged and sealed.end == len(blob)


def test_writer_truncation_point_is_the_last_valid_frame():
    data, ends = frames_of([b"\x95one", b"\x95two"])
    garbage = data + b"\x00" * 20
    scan = framing.scan_frames(garbage)
    assert scan.valid_end == ends[-1] == scan.end
    bad_last = bytearray(data)
    bad_last[-1] ^= 0xFF  # the last frame is complete but its checksum fails
    scan = framing.scan_frames(bytes(bad_last))
    assert scan.valid_end == ends[0]


def test_header_round_trip_and_errors():
    head = framing.encode_header(7, 1234.5)
    assert len(head) == framing.HEADER_SIZE
    assert framing.decode_header(head) == (framing.FORMAT_VERSION, 7, 1234.5)
    with pytest.raises(framing.HeaderError, match="truncated"):
        framing.decode_header(head[:5])
    with pytest.raises(framing.HeaderError, match="magic"):
        framing.decode_header(b"PK\x03\x04" + head[4:])
    with pytest.raises(framing.HeaderError, match="magic"):
        framing.decode_header(b"\x89VDLX")  # even a short prefix is judged
    newer = bytearray(head)
    newer[8] = framing.FORMAT_VERSION + 1
    with pytest.raises(framing.HeaderError, match="newer"):
        framing.decode_header(bytes(newer))
    flipped = bytearray(head)
    flipped[20] ^= 1
    with pytest.raises(framing.HeaderError, match="checksum"):
        framing.decode_header(bytes(flipped))


def test_frame_layout_matches_the_documented_bytes():
    frame = framing.encode_frame(b"\x95abc")
    assert frame[:4] == (4).to_bytes(4, "little")
    assert frame[4:8] == zlib.crc32(frame[:4]).to_bytes(4, "little")
    assert frame[8:12] == b"\x95abc"
    assert frame[12:] == zlib.crc32(b"\x95abc").to_bytes(4, "little")


def decode(payload: bytes):
    kind, tag, step, wall, data = codec.decode_payload(payload)
    return kind, tag, step, wall, codec.decode_scalars(data)


@pytest.mark.parametrize(
    ("steps", "encoding"),
    [
        (np.arange(0, 5000, 5), "range"),
        (np.array([3]), "range"),
        (np.array([5, 1, 9, 2]), "u4"),
        (np.array([0, 2**40, -(2**40)]), "i8"),
    ],
)
def test_step_encodings_round_trip(steps, encoding):
    steps = steps.astype(np.int64)
    walls = 1.79e9 + np.arange(len(steps)) * 0.25
    values = np.linspace(-1, 1, len(steps))
    payload, _ = codec.encode_scalars("t", steps, walls, values)
    assert codec.decode_payload(payload)[4]["s"][0] == encoding
    _, tag, first, wall, got = decode(payload)
    assert tag == "t" and first == steps[0] and wall == walls[0]
    assert np.array_equal(got.steps, steps) and np.array_equal(got.values, values)


def test_walls_keep_microseconds_or_fall_back_to_f8():
    rng = np.random.default_rng(0)
    walls = 1.79e9 + np.sort(rng.uniform(0, 4000, 1000))
    payload, _ = codec.encode_scalars("t", np.arange(1000), walls, np.zeros(1000))
    assert codec.decode_payload(payload)[4]["w"][0] == "us"
    assert np.abs(decode(payload)[4].walls - walls).max() <= 1e-6
    for odd in (np.array([1.79e9, 1.79e9 + 5000.0]), np.array([1.79e9, math.nan])):
        payload, _ = codec.encode_scalars("t", np.arange(2), odd, np.zeros(2))
        assert codec.decode_payload(payload)[4]["w"][0] == "f8"
        assert np.array_equal(decode(payload)[4].walls, odd, equal_nan=True)


def test_nan_and_inf_values_survive_and_summary_ignores_them():
    values = np.array([math.nan, math.inf, -math.inf, 2.0, -3.0])
    payload, summary = codec.encode_scalars("t", np.arange(5), np.full(5, 1.79e9), values)
    assert np.array_equal(decode(payload)[4].values, values, equal_nan=True)
    assert summary == (0, 4, -3.0, 2.0)
    _, only_nan = codec.encode_scalars("t", np.arange(1), np.full(1, 1.79e9), np.array([math.nan]))
    assert only_nan[2:] == (None, None)


def test_scalar_points_cost_at_most_12_bytes_in_the_common_case():
    n = 10_000
    payload, _ = codec.encode_scalars(
        "loss", np.arange(n), 1.79e9 + np.arange(n) * 0.01, np.random.default_rng(1).random(n)
    )
    assert len(payload) + framing.FRAME_OVERHEAD <= 12 * n + 200


@pytest.mark.parametrize(
    "bad", [b"\x95", b"\x94\x01\x02\x03\x04", b"\xc1", b"\x95\x01\xc0\xc0\x00\x80"]
)
def test_malformed_payloads_raise_payload_error(bad):
    with pytest.raises(codec.PayloadError):
        codec.decode_payload(bad)


def test_malformed_scalar_chunk_raises_payload_error():
    payload, _ = codec.encode_scalars("t", np.arange(4), np.full(4, 1.0), np.zeros(4))
    data = codec.decode_payload(payload)[4]
    data["s"] = ["zigzag", 1]
    with pytest.raises(codec.PayloadError):
        codec.decode_scalars(data)
    data["s"], data["n"] = ["range", 0, 1], 4
    data["w"] = ["f8", b"\x00" * 8]
    with pytest.raises(codec.PayloadError, match="lengths"):
        codec.decode_scalars(data)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=300),
    st.integers(2, 50),
)
def test_downsampling_keeps_ends_and_extremes(values, max_points):
    values = np.array(values)
    keep = extreme_indices(values, max_points)
    assert len(keep) <= max_points
    assert np.all(np.diff(keep) > 0)
    assert keep[0] == 0 and keep[-1] == len(values) - 1
    kept = values[keep]
    if max_points >= 4 or len(values) <= max_points:
        assert kept.max() == values.max() and kept.min() == values.min()


def test_downsampling_shows_a_single_spike_among_ten_million_points():
    values = np.zeros(10_000_000)
    values[6_543_210] = 1e6
    values[1_234_567] = -5.0
    keep = extreme_indices(values, 2000)
    assert 6_543_210 in keep and 1_234_567 in keep and len(keep) <= 2000


@pytest.mark.parametrize(
    ("parts", "encoding"),
    [
        ([("a", [0, 1, 2]), ("b", [7]), ("c", [10, 20, 30, 40])], "ranges"),
        ([("a", [0, 1, 5]), ("b", [7, 8])], "u4"),  # a part that is no progression
        ([("a", [3]), ("b", [9]), ("c", [4])], "u4"),  # one point a part: ranges cost more
    ],
)
def test_group_chunks_round_trip(parts, encoding):
    cols = [
        (tag, np.array(s, np.int64), 1.79e9 + np.arange(len(s)) * 0.5, np.arange(len(s)) * 1.5)
        for tag, s in parts
    ]
    payload, summary, columns = codec.encode_group(cols)
    kind, tag, step, _, data = codec.decode_payload(payload)
    assert (kind, tag, step) == ("scalars", None, parts[0][1][0])
    assert data["s"][0] == encoding and data["tags"] == [p[0] for p in parts]
    got = codec.decode_scalars(data)
    assert got.steps.tolist() == [x for _, s in parts for x in s]
    out = (np.empty(data["n"], np.int64), np.empty(data["n"]), np.empty(data["n"]))
    codec.decode_scalars_into(data, *out)
    assert out[0].tolist() == got.steps.tolist()
    assert columns[0] == [p[0] for p in parts]
    assert columns[1].tolist() == [len(s) for _, s in parts]
    assert columns[2].tolist() == [s[0] for _, s in parts]
    assert summary[:2] == (min(min(s) for _, s in parts), max(max(s) for _, s in parts))


def test_malformed_group_chunk_is_refused():
    cols = [
        ("a", np.arange(3), np.full(3, 1.79e9), np.zeros(3)),
        ("b", np.arange(2), np.full(2, 1.79e9), np.zeros(2)),
    ]
    payload, _, _ = codec.encode_group(cols)
    data = codec.decode_payload(payload)[4]
    data["c"] = [3, 3]
    with pytest.raises(codec.PayloadError, match="group chunk parts"):
        codec._check_scalar_data(data, group=True)
