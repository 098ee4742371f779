"""The wire codec, without sockets: round trips, schema checks and refusals."""

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vdl_stream import codec
from vdl_stream.codec import Batch, ProtocolError, ScalarColumns

tags = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)
floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@given(
    st.lists(
        st.tuples(tags, st.integers(-(2**62), 2**62), floats, st.floats(0, 2e9)),
        max_size=60,
    ),
    st.integers(1, 2**40),
    st.booleans(),
)
def test_batch_round_trip(points, seq, sync):
    batch = Batch("w1", seq, "exp/run-1", codec.columns_from_points(points), [], sync)
    back = codec.decode_batch(codec.decode_message(codec.encode_batch(batch)))
    assert (back.writer, back.seq, back.run, back.sync) == ("w1", seq, "exp/run-1", sync)
    assert [c.tag for c in back.scalars] == [c.tag for c in batch.scalars]
    for a, b in zip(batch.scalars, back.scalars, strict=True):
        np.testing.assert_array_equal(a.steps, b.steps)
        np.testing.assert_array_equal(a.walls, b.walls)
        # NaN == NaN bit-for-bit: compare the raw bytes
        assert a.values.tobytes() == b.values.tobytes()


def test_columns_group_by_tag_in_arrival_order():
    points = [("a", 1, 0.5, 10.0), ("b", 1, 2.0, 10.0), ("a", 2, math.nan, 11.0)]
    cols = codec.columns_from_points(points)
    assert [c.tag for c in cols] == ["a", "b"]
    assert cols[0].steps.tolist() == [1, 2]
    assert cols[0].walls.tolist() == [10.0, 11.0]
    assert math.isnan(cols[0].values[1])
    assert cols[0].steps.dtype == np.int64


def test_live_frame_sends_steps_as_f8():
    cols = [ScalarColumns("loss", np.array([3, 4]), np.array([1.0, 2.0]), np.array([0.1, 0.2]))]
    frame = msgpack.unpackb(codec.encode_live("data", 7, "r", cols, []))
    assert frame["type"] == "data" and frame["seq"] == 7 and frame["run"] == "r"
    tag, steps, walls, values = frame["scalars"][0]
    assert np.frombuffer(walls, "<f8").tolist() == [1.0, 2.0]
    assert tag == "loss"
    assert np.frombuffer(steps, "<f8").tolist() == [3.0, 4.0]
    assert np.frombuffer(values, "<f8").tolist() == [0.1, 0.2]


@pytest.mark.parametrize(
    ("tag", "error", "text"),
    [
        (3, TypeError, "tag must be a non-empty str, got int 3"),
        ("", ValueError, "non-empty"),
        ("x" * 257, ValueError, "at most 256"),
        ("a\nb", ValueError, "control characters"),
    ],
)
def test_check_tag_names_the_problem(tag, error, text):
    with pytest.raises(error, match=text):
        codec.check_tag(tag)


@pytest.mark.parametrize("run", ["", "/abs", "a/../b", "..", "a//b", "a\\b", "c:x", "a/./b", 3])
def test_run_names_cannot_escape_the_logdir(run):
    with pytest.raises(ValueError, match="run must be"):
        codec.check_run_name(run)


def test_run_names_may_nest():
    assert codec.check_run_name("exp1/train") == "exp1/train"
    assert codec.check_run_name("运行-1") == "运行-1"


def _batch_message(**overrides):
    message = {
        "type": "batch",
        "writer": "w",
        "seq": 1,
        "run": "r",
        "scalars": [["t", b"\0" * 8, b"\0" * 8, b"\0" * 8]],
        "events": [],
    }
    message.update(overrides)
    return message


@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        ({"writer": ""}, "writer"),
        ({"seq": 0}, "seq"),
        ({"seq": "1"}, "seq"),
        ({"run": "../x"}, "run must be"),
        ({"scalars": [["t", b"\0" * 8, b"\0" * 16, b"\0" * 8]]}, "differ in length"),
        ({"scalars": [["t", b"\0" * 7, b"\0" * 8, b"\0" * 8]]}, "8-byte"),
        ({"scalars": [[5, b"", b"", b""]]}, "bad scalar tag"),
        ({"scalars": [["t", b""]]}, r"\[tag, steps, walls, values\]"),
        ({"events": [{"kind": "nope", "wall": 1.0}]}, "unknown event kind"),
        ({"events": [{"kind": "text", "tag": "t", "step": 1.5, "wall": 1.0}]}, "step"),
        ({"events": [{"kind": "text", "tag": "t", "wall": math.inf}]}, "wall"),
        ({"events": "x"}, "arrays"),
    ],
)
def test_decode_batch_refuses_schema_breaks(overrides, text):
    with pytest.raises(ProtocolError, match=text):
        codec.decode_batch(_batch_message(**overrides))


def test_decode_message_refusals():
    for empty in (b"", None):
        with pytest.raises(ProtocolError, match="empty frame"):
            codec.decode_message(empty)
    with pytest.raises(ProtocolError, match="text frame"):
        codec.decode_message("{}")
    with pytest.raises(ProtocolError, match="malformed msgpack"):
        codec.decode_message(b"\xc1")
    with pytest.raises(ProtocolError, match="map with a str 'type'"):
        codec.decode_message(msgpack.packb([1, 2]))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        codec.decode_message(b"\0" * (codec.MAX_FRAME_BYTES + 1))


@given(st.binary(max_size=200))
def test_decode_never_raises_anything_but_protocol_error(data):
    try:
        batch = codec.decode_batch(codec.decode_message(data))
    except ProtocolError as exc:
        assert str(exc)
    else:
        assert isinstance(batch, Batch)


_COMMON = {"tag": "t", "step": 1, "wall": 1.7e9}
_TELEMETRY = {"kind": "telemetry", "tag": None, "step": None, "wall": 1.7e9}


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("event", "text"),
    [
        ({**_TELEMETRY, "fields": [1.0]}, "telemetry fields must be a map of numbers"),
        ({**_TELEMETRY, "fields": {"gpu0/util": "high"}}, "telemetry fields"),
        ({**_TELEMETRY, "fields": {"a": 1.0}, "rank": "0"}, "telemetry rank"),
        ({"kind": "histogram", **_COMMON, "edges": b"abc", "counts": b""}, "8-byte floats"),
        ({"kind": "histogram", **_COMMON, "edges": b"\0" * 24, "counts": b"\0" * 24}, "hold 2"),
        ({"kind": "image", **_COMMON, "format": "png", "width": 1, "height": 1}, "image data"),
        ({"kind": "image", **_COMMON, "data": b"x", "format": "bmp"}, "image format"),
        (
            {"kind": "audio", **_COMMON, "data": b"", "format": "wav", "sample_rate": 0},
            "sample_rate",
        ),
        ({"kind": "text", **_COMMON, "text": 5}, "text text must be a str"),
        ({**_TELEMETRY, "kind": "hparams", "hparams": {"lr": [1]}}, "hparams"),
        ({"kind": "pr_curve", **_COMMON, "thresholds": b"\0" * 16, "tp": b"\0" * 8}, "pr_curve tp"),
        ({"kind": "text", **_COMMON, "text": "x", "deep": _nested(1000)}, "deeper than 8"),
        ({"kind": "meta", **_COMMON, "m": {3: 4}}, "not a short str"),
        ({"kind": "meta", **_COMMON, "m": [b"\0" * 8]}, "bin data below the top level"),
        ({"kind": "text", **_COMMON, "text": "x", "n": 2**70}, "outside 64 bits"),
        ({"kind": "text", "tag": "t", "step": 2**63, "wall": 1.0, "text": "x"}, "int64"),
    ],
)
def test_every_event_kind_is_checked_before_it_is_accepted(event, text):
    """Events that msgpack decodes but that would make later reads fail are refused on ingest."""
    with pytest.raises(codec.BatchError, match=text) as refused:
        codec.decode_batch(_batch_message(events=[event]))
    assert (refused.value.writer, refused.value.seq) == ("w", 1)  # answered with a refusal


def test_broken_writer_or_seq_is_a_protocol_error_not_a_refusal():
    for overrides in ({"writer": 3}, {"seq": -1}, {"seq": 2**63}):
        with pytest.raises(ProtocolError) as error:
            codec.decode_batch(_batch_message(**overrides, run="../x"))
        assert not isinstance(error.value, codec.BatchError)


def test_non_finite_scalar_wall_times_are_refused():
    walls = np.array([1.0, math.nan]).tobytes()
    with pytest.raises(codec.BatchError, match="walls of tag 't' must be finite"):
        codec.decode_batch(_batch_message(scalars=[["t", b"\0" * 16, walls, b"\0" * 16]]))


@pytest.mark.parametrize("joined_limit", [codec.JOINED_WALLS_BYTES, 0])
def test_each_tag_of_a_batch_gets_its_own_walls_quantized_and_the_bad_one_is_named(
    joined_limit, monkeypatch
):
    # The walls of a batch are checked and quantized in one pass over all its tags (the server's
    # event loop decodes ~100 batches/s of 10 small tags): each tag must still get exactly its
    # own walls, and a non-finite wall must name its tag, not the first one (large batches: tag
    # by tag, as with a limit of 0).
    monkeypatch.setattr(codec, "JOINED_WALLS_BYTES", joined_limit)
    walls = {f"t{i}": 1.7e9 + np.arange(i + 1) / 3.0 + i + 1e-7 for i in range(4)}
    entries = [
        [tag, np.arange(len(w), dtype="<i8").tobytes(), w.tobytes(), w.tobytes()]
        for tag, w in walls.items()
    ]
    batch = codec.decode_batch(_batch_message(scalars=entries))
    assert [c.tag for c in batch.scalars] == list(walls)
    for columns, w in zip(batch.scalars, walls.values(), strict=True):
        assert np.array_equal(columns.walls, np.rint(w * 1e6) / 1e6)
        assert not columns.walls.flags.writeable
        assert np.array_equal(columns.values, w)  # the values untouched
    entries[2][2] = np.array([1.0, math.inf, 2.0]).tobytes()
    with pytest.raises(codec.BatchError, match="walls of tag 't2' must be finite"):
        codec.decode_batch(_batch_message(scalars=entries))
    assert codec.decode_batch(_batch_message(scalars=[])).scalars == []


def test_refused_frame():
    frame = msgpack.unpackb(codec.encode_refused("w", 9, "disk full", True))
    assert frame == {
        "type": "refused",
        "writer": "w",
        "seq": 9,
        "reason": "disk full",
        "retryable": True,
    }


def test_live_walls_are_the_walls_the_files_give_back(tmp_path):
    # One truth: the writer's columns (and a raw writer's batch, as the broker decodes it) carry
    # the wall times a reader decodes from disk, bit for bit.
    import recorder

    walls = 1.7e9 + np.arange(50) / 3.0 + 1e-7
    points = [("t", i, float(i), float(w)) for i, w in enumerate(walls)]
    (live,) = codec.columns_from_points(points)
    batch = codec.Batch(
        "w" * 16, 1, "r", [codec.ScalarColumns("t", live.steps, walls, live.values)]
    )
    (decoded,) = codec.decode_batch(codec.decode_message(codec.encode_batch(batch))).scalars
    with recorder.RunWriter(tmp_path / "r") as writer:
        writer.append_scalars("t", live.steps, walls, live.values)
    with recorder.RunReader(tmp_path / "r") as reader:
        disk = reader.read_scalars("t").walls
    assert live.walls.tobytes() == decoded.walls.tobytes() == disk.tobytes()
