"""TensorBoard event files: CRC-32C, TFRecord framing, and Event decoding of tensorboardX's files."""

from __future__ import annotations

import glob
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboardX import SummaryWriter
from tensorboardX.proto.summary_pb2 import HistogramProto, Summary, SummaryMetadata
from tensorboardX.proto.tensor_pb2 import TensorProto
from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto

from vdl_stream import tfevents, tfrecord

WALL = 1_700_000_000.0
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", 3, 2) + b"rest-of-png"


def test_crc32c_known_vectors():
    assert tfrecord.crc32c(b"") == 0
    assert tfrecord.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert tfrecord.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720, B.4
    assert tfrecord.crc32c(b"\xff" * 32) == 0x62A8AB43


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=5000), min_size=1, max_size=40))
def test_crc32c_many_matches_the_reference(chunks):
    buf = b"".join(chunks)
    lengths = [len(c) for c in chunks]
    offsets = np.cumsum([0, *lengths])[:-1]
    got = tfrecord.crc32c_many(buf, offsets, lengths)
    assert got.tolist() == [tfrecord.crc32c(c) for c in chunks]


def test_crc32c_many_on_many_small_records():
    rng = np.random.default_rng(1)
    chunks = [
        rng.integers(0, 256, rng.integers(4, 300), dtype=np.uint8).tobytes() for _ in range(500)
    ]
    lengths = [len(c) for c in chunks]
    got = tfrecord.crc32c_many(b"".join(chunks), np.cumsum([0, *lengths])[:-1], lengths)
    assert got.tolist() == [tfrecord.crc32c(c) for c in chunks]


def test_crc32c_many_on_long_records():
    rng = np.random.default_rng(2)
    chunks = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (100_003, 4096, 65_536)]
    lengths = [len(c) for c in chunks]
    got = tfrecord.crc32c_many(b"".join(chunks), np.cumsum([0, *lengths])[:-1], lengths)
    assert got.tolist() == [tfrecord.crc32c(c) for c in chunks]


def test_masked_crc_matches_tensorboardx():
    from tensorboardX.crc32c import crc32c as tbx_crc

    for data in (b"", b"a", b"hello world" * 30):
        masked = ((tbx_crc(data) >> 15) | (tbx_crc(data) << 17)) & 0xFFFFFFFF
        assert tfrecord.masked_crc32c(data) == (masked + 0xA282EAD8) & 0xFFFFFFFF


def _records(payloads: list[bytes]) -> bytes:
    return b"".join(tfrecord.encode_record(p) for p in payloads)


def test_scan_frames_stops_at_a_torn_tail_at_every_cut():
    payloads = [bytes([i]) * (i * 7 + 1) for i in range(6)]
    data = _records(payloads)
    ends = np.cumsum([len(tfrecord.encode_record(p)) for p in payloads])
    for cut in range(len(data) + 1):
        frames = tfrecord.scan_frames(data[:cut])
        whole = int(np.searchsorted(ends, cut, side="right"))
        got = [data[o : o + n] for o, n in zip(frames.offsets, frames.lengths, strict=True)]
        assert got == payloads[:whole], cut
        assert frames.corrupt == []
        assert frames.end == (int(ends[whole - 1]) if whole else 0)


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=1, max_value=255))
def test_a_flipped_byte_loses_at_most_the_records_it_hits(where, flip):
    payloads = [f"record {i} ".encode() * (i % 5 + 1) for i in range(12)]
    data = bytearray(_records(payloads))
    at = where % len(data)
    data[at] ^= flip
    frames = tfrecord.scan_frames(bytes(data))
    got = [bytes(data[o : o + n]) for o, n in zip(frames.offsets, frames.lengths, strict=True)]
    assert all(p in payloads for p in got)  # nothing damaged is ever passed on
    assert len(got) >= len(payloads) - 2
    assert frames.corrupt, "the damage is reported"
    assert frames.end == len(data)


def test_header_damage_resynchronises_on_the_next_record():
    payloads = [b"a" * 10, b"b" * 20, b"c" * 30]
    data = bytearray(_records(payloads))
    data[len(tfrecord.encode_record(payloads[0])) + 2] ^= 0x40  # the length of record 2
    frames = tfrecord.scan_frames(bytes(data))
    got = [bytes(data[o : o + n]) for o, n in zip(frames.offsets, frames.lengths, strict=True)]
    assert got == [payloads[0], payloads[2]]
    assert [c.reason for c in frames.corrupt] == ["header checksum mismatch"]


def _event_file(tmp_path) -> str:
    (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    return path


def _read(path) -> tfevents.EventBlock:
    out = tfevents.EventBlock()
    for block in tfevents.read_event_file(path):
        for tag, cols in block.scalars.items():
            mine = out.scalars.setdefault(tag, ([], [], []))
            for a, b in zip(mine, cols, strict=True):
                a.extend(b)
        out.events.extend(block.events)
        out.corrupt.extend(block.corrupt)
        out.skipped.update(block.skipped)
        out.records += block.records
    return out


def test_tensorboardx_scalars_decode_exactly(tmp_path):
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.normal(size=300) * 1e3, [math.nan, math.inf, -math.inf, 0.0]])
    walls = WALL + np.cumsum(rng.random(len(values)))
    with SummaryWriter(str(tmp_path)) as w:
        for i, (v, t) in enumerate(zip(values, walls, strict=True)):
            w.add_scalar("a/loss", v, i * 3, walltime=t)
            w.add_scalar("b", -v, 2**40 + i, walltime=t)
    got = _read(_event_file(tmp_path))
    steps, wall, vals = got.scalars["a/loss"]
    assert steps == [i * 3 for i in range(len(values))]
    assert wall == walls.tolist()
    # simple_value is a float32: TensorBoard itself sees the float32 of what was logged
    np.testing.assert_array_equal(vals, values.astype(np.float32).astype(np.float64))
    assert got.scalars["b"][0][0] == 2**40
    assert got.corrupt == []
    assert got.skipped == {"file_version": 1}


def _add(w: SummaryWriter, value: Summary.Value, step: int, wall: float) -> None:
    w._get_file_writer().add_summary(Summary(value=[value]), step, wall)


def _meta(plugin: str) -> SummaryMetadata:
    return SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=plugin))


def _shape(*dims: int) -> TensorShapeProto:
    return TensorShapeProto(dim=[TensorShapeProto.Dim(size=d) for d in dims])


def test_tensor_encoded_values_decode(tmp_path):
    with SummaryWriter(str(tmp_path)) as w:
        f32 = TensorProto(dtype=1, float_val=[0.25])  # DT_FLOAT, TB2 style
        _add(w, Summary.Value(tag="f", tensor=f32, metadata=_meta("scalars")), 1, WALL)
        content = np.array([1 / 3], dtype="<f8").tobytes()  # DT_DOUBLE as tensor_content
        f64 = TensorProto(dtype=2, tensor_content=content)
        _add(w, Summary.Value(tag="d", tensor=f64, metadata=_meta("scalars")), 2, WALL + 1)
        dv = TensorProto(dtype=2, double_val=[2.5])
        _add(w, Summary.Value(tag="d", tensor=dv, metadata=_meta("scalars")), 3, WALL + 2)
        rows = np.array([[0, 1, 4], [1, 2, 6], [2, 3, 0]], dtype=np.float64)
        hist = TensorProto(dtype=2, tensor_content=rows.tobytes(), tensor_shape=_shape(3, 3))
        _add(w, Summary.Value(tag="h", tensor=hist, metadata=_meta("histograms")), 4, WALL + 3)
        img = TensorProto(dtype=7, string_val=[b"3", b"2", PNG], tensor_shape=_shape(3))
        _add(w, Summary.Value(tag="i", tensor=img, metadata=_meta("images")), 5, WALL + 4)
        txt = TensorProto(dtype=7, string_val=["héllo".encode(), b"world"], tensor_shape=_shape(2))
        _add(w, Summary.Value(tag="t", tensor=txt, metadata=_meta("text")), 6, WALL + 5)
        pr = TensorProto(dtype=1, float_val=[1, 2, 3])
        _add(w, Summary.Value(tag="p", tensor=pr, metadata=_meta("pr_curves")), 7, WALL + 6)
    got = _read(_event_file(tmp_path))
    assert got.scalars["f"] == ([1], [WALL], [0.25])
    assert got.scalars["d"] == ([2, 3], [WALL + 1, WALL + 2], [1 / 3, 2.5])
    kinds = {e[1]: e for e in got.events}
    h = kinds["h"][4]
    assert np.frombuffer(h["edges"], "<f8").tolist() == [0, 1, 2, 3]
    assert np.frombuffer(h["counts"], "<f8").tolist() == [4, 6, 0]
    assert (h["num"], h["min"], h["max"]) == (10, 0.0, 2.0)
    assert kinds["i"][4] == {"format": "png", "data": PNG, "width": 3, "height": 2}
    assert kinds["t"][2:] == (6, WALL + 5, {"text": "héllo\nworld"})
    assert got.skipped["plugin pr_curves"] == 1


def test_histogram_proto_decodes_with_its_buckets(tmp_path):
    values = np.linspace(-2, 3, 501)
    with SummaryWriter(str(tmp_path)) as w:
        w.add_histogram("w", values, 9, walltime=WALL)
        proto = HistogramProto(
            min=-1.0,
            max=4.0,
            num=3,
            sum=5.0,
            sum_squares=17.0,
            bucket_limit=[0.0, 1.0, 1.7976931348623157e308],
            bucket=[1, 0, 2],
        )
        _add(w, Summary.Value(tag="tf", histo=proto), 10, WALL + 1)
    got = _read(_event_file(tmp_path))
    (_, tag, step, wall, h), (_, _, _, _, tf) = got.events
    assert (tag, step, wall) == ("w", 9, WALL)
    assert h["num"] == 501 and h["min"] == -2.0 and h["max"] == 3.0
    assert math.isclose(h["sum"], values.sum()) and math.isclose(h["sum_sq"], (values**2).sum())
    got_counts = np.frombuffer(h["counts"], "<f8")
    assert got_counts.sum() == 501
    assert len(np.frombuffer(h["edges"], "<f8")) == len(got_counts) + 1
    # TensorFlow's outer limit (DBL_MAX) is clamped to the maximum, the first bucket starts at min
    assert np.frombuffer(tf["edges"], "<f8").tolist() == [-1.0, 0.0, 1.0, 4.0]
    assert np.frombuffer(tf["counts"], "<f8").tolist() == [1, 0, 2]


def test_images_and_text_from_tensorboardx(tmp_path):
    with SummaryWriter(str(tmp_path)) as w:
        image = Summary.Image(height=2, width=3, colorspace=3, encoded_image_string=PNG)
        _add(w, Summary.Value(tag="img", image=image), 4, WALL + 1)
        w.add_text("note", "hello **md**", 5, walltime=WALL + 2)
    got = _read(_event_file(tmp_path))
    (img, text) = got.events
    assert img == (
        "image",
        "img",
        4,
        WALL + 1,
        {"format": "png", "data": PNG, "width": 3, "height": 2, "channels": 3},
    )
    assert text == ("text", "note/text_summary", 5, WALL + 2, {"text": "hello **md**"})


def test_a_record_that_does_not_decode_is_reported(tmp_path):
    path = tmp_path / "events.out.tfevents.1.host"
    summary = Summary(value=[Summary.Value(tag="x", simple_value=1)]).SerializeToString()
    event = b"\x09" + struct.pack("<d", WALL) + b"\x10\x05\x2a" + bytes([len(summary)]) + summary
    broken = b"\x2a\x7f\x00"  # a summary claiming 127 bytes, holding one
    path.write_bytes(tfrecord.encode_record(event) + tfrecord.encode_record(broken))
    got = _read(path)
    assert got.scalars == {"x": ([5], [WALL], [1.0])}
    assert len(got.corrupt) == 1
    assert got.records == 2


def test_an_empty_or_cut_file_is_not_an_error(tmp_path):
    empty = tmp_path / "events.out.tfevents.0.a"
    empty.write_bytes(b"")
    assert list(tfevents.read_event_file(empty)) == []
    cut = tmp_path / "events.out.tfevents.0.b"
    cut.write_bytes(tfrecord.encode_record(b"\x09" + struct.pack("<d", WALL))[:-3])
    blocks = list(tfevents.read_event_file(cut))
    assert [c.reason for b in blocks for c in b.corrupt] == ["truncated record at end of file"]


@pytest.mark.parametrize("name", ["events.out.tfevents.1.host", "x.tfevents.2"])
def test_event_file_names(name):
    assert tfevents.is_event_file(name)
    assert not tfevents.is_event_file("vdlrecords.1.log")


def test_bulk_and_one_by_one_decoding_keep_file_order(tmp_path):
    """Plain scalar events are decoded in bulk, others one by one; a tag mixing both stays in order."""
    long_tag = "t" * 200  # a two-byte length: not the bulk layout
    expected: dict[str, list] = {"mix": [], "损失": [], long_tag: []}
    with SummaryWriter(str(tmp_path)) as w:
        for i in range(300):
            step = -5 + i * 2**35 if i % 7 else i  # large and negative steps: long varints
            if i % 3:
                w.add_scalar("mix", i, step, walltime=WALL + i)
            else:
                t = TensorProto(dtype=1, float_val=[i])
                _add(
                    w, Summary.Value(tag="mix", tensor=t, metadata=_meta("scalars")), step, WALL + i
                )
            expected["mix"].append((step, WALL + i, float(i)))
            w.add_scalar("损失", -i, i, walltime=WALL + i)
            expected["损失"].append((i, WALL + i, float(-i)))
            w.add_scalar(long_tag, i / 4, i, walltime=WALL + i)
            expected[long_tag].append((i, WALL + i, i / 4))
    path = _event_file(tmp_path)
    for block_records in (7, 65536):  # block edges anywhere
        got: dict[str, list] = {}
        for block in tfevents.read_event_file(path, block_records=block_records):
            for tag, (s, wl, v) in block.scalars.items():
                got.setdefault(tag, []).extend(
                    zip(
                        np.asarray(s).tolist(),
                        np.asarray(wl).tolist(),
                        np.asarray(v).tolist(),
                        strict=True,
                    )
                )
        assert got == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=60), min_size=1, max_size=8))
def test_garbage_with_valid_checksums_is_reported_never_raised(payloads):
    """Any payload, however wrong, ends up decoded, skipped or reported as damage."""
    data = _records(payloads)
    frames = tfrecord.scan_frames(data)
    assert len(frames.offsets) == len(payloads)
    block = tfevents.decode_records(data, frames, tfevents.EventBlock())
    assert block.records == len(payloads)
    assert len(block.corrupt) <= len(payloads)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_visualdl_garbage_is_reported_never_raised(data):
    from vdl_stream import vdlrecords

    block = tfevents.EventBlock()
    end = vdlrecords.decode_records(data, 0, len(data), block)
    assert 0 <= end <= len(data)
    assert block.records >= len(block.corrupt) - 1


def test_visualdl_fixture_cut_at_every_offset_never_raises(tmp_path):
    from vdl_stream import vdlrecords

    data = (Path(__file__).parent / "data" / "visualdl" / "vdlrecords.1700000000.log").read_bytes()
    whole = None
    for cut in [*range(0, len(data), 7), len(data)]:
        block = tfevents.EventBlock()
        end = vdlrecords.decode_records(data[:cut], 0, cut, block)
        assert end <= cut and block.corrupt == []
        points = block.scalar_count()
        assert whole is None or points >= whole  # more bytes never give fewer points
        whole = points
    assert whole == 150
