"""The event builders of vdl_stream.summaries: every kind decoded back, checked by hand, refused."""

from __future__ import annotations

import io
import math
import struct
import wave
import zlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vdl_stream import codec, summaries


def f8(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, "<f8")


def assert_wire_ready(event: dict) -> None:
    """The event passes the protocol's checks and survives msgpack unchanged."""
    codec.check_event(event)
    assert msgpack.unpackb(msgpack.packb(event, use_bin_type=True), raw=False) == event


# -- a small PNG decoder, independent of the encoder ----------------------------------------------


def decode_png(data: bytes) -> np.ndarray:
    """Decode an 8-bit non-interlaced PNG into HWC uint8, checking signature and CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert pos == len(data)
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, color, compression, filtering, interlace = struct.unpack(
        ">IIBBBBB", chunks[0][1]
    )
    assert (depth, compression, filtering, interlace) == (8, 0, 0, 0)
    channels = {0: 1, 2: 3, 6: 4}[color]
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = width * channels
    assert len(raw) == height * (1 + stride)
    rows = np.frombuffer(raw, np.uint8).reshape(height, 1 + stride)
    out = np.zeros((height, stride), np.uint8)
    prior = np.zeros(stride, np.uint8)
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:]
        if kind == 0:
            out[y] = line
        elif kind == 2:
            out[y] = line + prior  # uint8 wraps mod 256
        else:
            raise AssertionError(f"filter {kind} not handled by this test decoder")
        prior = out[y]
    return out.reshape(height, width, channels)


# -- histogram --------------------------------------------------------------------------------


# Up to 64 bins the edges are computed in Python floats, above in numpy: both paths.
@pytest.mark.parametrize("buckets", [1, 7, 10, 30, 64, 65, 1000])
def test_histogram_matches_numpy_on_random_data(buckets):
    values = np.random.default_rng(buckets).normal(size=10_000).astype(np.float32)
    event = summaries.histogram_event("w", values, 3, 12.5, buckets)
    counts, edges = np.histogram(values.astype(np.float64), bins=buckets)
    assert f8(event["counts"]).tolist() == counts.tolist()
    np.testing.assert_allclose(f8(event["edges"]), edges, rtol=1e-12)
    assert (event["kind"], event["tag"], event["step"], event["wall"]) == (
        "histogram",
        "w",
        3,
        12.5,
    )
    assert event["min"] == float(values.min()) and event["max"] == float(values.max())
    assert event["sum"] == pytest.approx(float(values.astype(np.float64).sum()))
    assert event["sum_sq"] == pytest.approx(float(np.square(values.astype(np.float64)).sum()))
    assert_wire_ready(event)


def test_histogram_integer_values_fall_on_their_edges_as_numpy():
    values = np.arange(11)  # every value sits exactly on an edge of 10 bins over [0, 10]
    event = summaries.histogram_event("ints", values, 0, 0.0, 10)
    assert f8(event["counts"]).tolist() == [1] * 9 + [2]
    assert f8(event["edges"]).tolist() == list(np.histogram(values, 10)[1])


def test_histogram_records_nan_and_inf_and_bins_the_rest():
    values = [1.0, 2.0, math.nan, math.inf, -math.inf, 3.0]
    event = summaries.histogram_event("w", values, 0, 0.0, 2)
    assert (event["num"], event["nan"], event["inf"]) == (6, 1, 2)
    assert f8(event["counts"]).tolist() == [1, 2]
    assert f8(event["edges"]).tolist() == [1.0, 2.0, 3.0]
    assert (event["min"], event["max"], event["sum"], event["sum_sq"]) == (1.0, 3.0, 6.0, 14.0)


def test_histogram_single_value_empty_and_all_nan():
    one = summaries.histogram_event("w", [4.0, 4.0], 0, 0.0, 4)
    assert f8(one["edges"]).tolist() == [3.5, 3.75, 4.0, 4.25, 4.5]
    assert f8(one["counts"]).tolist() == [0, 0, 2, 0]
    for values in ([], [math.nan, math.nan]):
        event = summaries.histogram_event("w", values, 0, 0.0, 3)
        assert f8(event["counts"]).tolist() == [0, 0, 0]
        assert event["min"] is None and event["max"] is None and event["num"] == len(values)
        assert_wire_ready(event)


def test_histogram_extreme_ranges_do_not_overflow():
    big = np.finfo(np.float64).max
    event = summaries.histogram_event("w", [-big, 0.0, big], 0, 0.0, 4)
    assert f8(event["counts"]).tolist() == [1, 0, 1, 1]
    assert np.isfinite(f8(event["edges"])).all()
    assert event["sum_sq"] == math.inf
    tiny = summaries.histogram_event("w", [0.0, 5e-324], 0, 0.0, 4)
    assert f8(tiny["counts"]).sum() == 2


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(np.float64, st.integers(0, 60), elements=st.floats(width=64)),
    st.integers(1, 50),
)
def test_histogram_invariants(values, buckets):
    event = summaries.histogram_event("w", values, 0, 0.0, buckets)
    counts, edges = f8(event["counts"]), f8(event["edges"])
    finite = values[np.isfinite(values)]
    assert len(counts) == buckets and len(edges) == buckets + 1
    assert (counts >= 0).all() and counts.sum() == finite.size
    assert event["nan"] == np.isnan(values).sum() and event["inf"] == np.isinf(values).sum()
    if finite.size:
        assert np.isfinite(edges).all() and (np.diff(edges) >= 0).all()
        assert edges[0] <= finite.min() and finite.max() <= edges[-1]
        assert (event["min"], event["max"]) == (finite.min(), finite.max())


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"tag": ""}, ValueError, "tag must be a non-empty str"),
        ({"values": ["a", "b"]}, TypeError, "values must be an array of numbers"),
        ({"step": 1.5}, TypeError, "step must be an int, got float"),
        ({"wall": "now"}, TypeError, "walltime must be a real number"),
        ({"wall": math.nan}, ValueError, "walltime must be a finite number"),
        ({"buckets": 0}, ValueError, "buckets must be from 1 to 10000, got 0"),
        ({"buckets": 2.5}, TypeError, "buckets must be an int, got float 2.5"),
    ],
)
def test_histogram_bad_input(kwargs, error, text):
    args = {"tag": "w", "values": [1.0], "step": 0, "wall": 0.0, "buckets": 10} | kwargs
    with pytest.raises(error, match=text):
        summaries.histogram_event(**args)


# -- image ------------------------------------------------------------------------------------


def test_image_hwc_uint8_round_trips():
    img = np.random.default_rng(0).integers(0, 256, size=(17, 23, 3), dtype=np.uint8)
    event = summaries.image_event("img", img, 5, 1.0)
    assert (event["format"], event["width"], event["height"]) == ("png", 23, 17)
    assert np.array_equal(decode_png(event["data"]), img)
    assert_wire_ready(event)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_image_chw_keeps_channels(channels):
    chw = np.random.default_rng(channels).integers(0, 256, (channels, 6, 9), dtype=np.uint8)
    decoded = decode_png(summaries.image_event("img", chw, 0, 0.0, "CHW")["data"])
    assert np.array_equal(decoded, chw.transpose(1, 2, 0))


def test_image_hw_grey_and_float_scaling():
    grey = np.array([[0.0, 0.5, 1.0], [2.0, -1.0, math.nan]], dtype=np.float32)
    event = summaries.image_event("g", grey, 0, 0.0, "HW")
    assert decode_png(event["data"])[..., 0].tolist() == [[0, 128, 255], [255, 0, 0]]
    assert (event["width"], event["height"]) == (3, 2)


def test_image_batch_is_tiled_like_tensorboardx():
    from tensorboardX.utils import convert_to_HWC

    batch = np.random.default_rng(1).integers(0, 256, size=(10, 3, 4, 5), dtype=np.uint8)
    event = summaries.image_event("grid", batch, 0, 0.0, "NCHW")
    assert (event["width"], event["height"]) == (8 * 5, 2 * 4)  # 8 per row, 2 rows
    decoded = decode_png(event["data"])
    assert np.array_equal(decoded, convert_to_HWC(batch, "NCHW"))
    assert np.array_equal(decoded[4:8, 5:10], batch[9].transpose(1, 2, 0))  # 10th: row 2, col 2
    assert not decoded[4:8, 10:].any()  # the rest of the last row is black


def test_image_nhwc_and_permuted_letters():
    nhwc = np.random.default_rng(2).random((3, 4, 6, 3))
    a = summaries.image_event("x", nhwc, 0, 0.0, "NHWC")
    b = summaries.image_event("x", nhwc.transpose(0, 3, 1, 2), 0, 0.0, "nchw")
    assert a["data"] == b["data"] and (a["width"], a["height"]) == (18, 4)
    c = summaries.image_event("x", nhwc[0].transpose(1, 0, 2), 0, 0.0, "WHC")
    assert decode_png(c["data"]).tolist() == decode_png(a["data"])[:, :6].tolist()


def test_image_accepts_tensor_like_objects():
    class FakeTensor:  # a torch-like tensor: detach().cpu().numpy()
        def __init__(self, arr):
            self.arr = arr

        def detach(self):
            return self

        def cpu(self):
            return self

        def numpy(self):
            return self.arr

    img = np.full((2, 2, 3), 7, np.uint8)
    event = summaries.image_event("t", FakeTensor(img), 0, 0.0)
    assert decode_png(event["data"]).tolist() == img.tolist()


@settings(max_examples=50, deadline=None)
@given(
    hnp.arrays(
        np.uint8,
        st.tuples(st.integers(1, 20), st.integers(1, 20), st.sampled_from([1, 3, 4])),
    )
)
def test_image_png_round_trip_property(img):
    assert np.array_equal(decode_png(summaries.image_event("p", img, 0, 0.0)["data"]), img)


@pytest.mark.parametrize(
    ("img", "fmt", "error", "text"),
    [
        (np.zeros((5, 8, 8), np.uint8), "CHW", ValueError, r"dataformats='CHW' must have C .* got shape \(5, 8, 8\)"),
        (np.zeros((8, 8, 3), np.uint8), "NCHW", ValueError, r"dataformats='NCHW' must have 4 dimensions, got shape \(8, 8, 3\)"),
        (np.zeros((8, 8), np.uint8), "HWC", ValueError, r"dataformats='HWC' must have 3 dimensions, got shape \(8, 8\)"),
        (np.zeros((0, 8, 3), np.uint8), "HWC", ValueError, r"must not be empty, got shape \(0, 8, 3\)"),
        (np.zeros((0, 8), np.uint8), "HW", ValueError, r"dataformats='HW' must not be empty, got shape \(0, 8\)"),
        (np.broadcast_to(np.uint8(0), (9000, 9000, 3)), "HWC", ValueError, r"img must have at most 67108864 values .* got shape \(9000, 9000, 3\)"),
        (np.zeros((8, 8, 3), np.int64), "HWC", ValueError, "img must be uint8 .* got dtype int64"),
        (np.zeros((8, 8, 3), np.uint8), "HWX", ValueError, "dataformats must be one of HW, HWC, CHW, NHWC, NCHW"),
        (np.zeros((8, 8, 3), np.uint8), 3, ValueError, "dataformats must be one of .* got 3"),
        ("not an image", "HWC", TypeError, "img must be an array of numbers or a tensor, got str"),
    ],
)  # fmt: skip
def test_image_bad_input_names_dataformats_and_shape(img, fmt, error, text):
    with pytest.raises(error, match=text):
        summaries.image_event("img", img, 0, 0.0, fmt)


# -- text -------------------------------------------------------------------------------------


def test_text_event_and_optional_step():
    event = summaries.text_event("notes", "# hello\n*world* ✓", None, 2.0)
    assert (event["text"], event["step"], event["kind"]) == ("# hello\n*world* ✓", None, "text")
    assert_wire_ready(event)
    assert summaries.text_event("notes", "", 4, 2.0)["step"] == 4


@pytest.mark.parametrize("bad", [b"bytes", 3, None, ["a"]])
def test_text_must_be_str(bad):
    with pytest.raises(TypeError, match=f"text_string must be a str, got {type(bad).__name__}"):
        summaries.text_event("t", bad, 0, 0.0)


# -- audio ------------------------------------------------------------------------------------


def read_wav(data: bytes) -> tuple[int, int, int, np.ndarray]:
    with wave.open(io.BytesIO(data), "rb") as wav:
        frames = wav.readframes(wav.getnframes())
        assert wav.getsampwidth() == 2
        return (
            wav.getframerate(),
            wav.getnchannels(),
            wav.getnframes(),
            np.frombuffer(frames, "<i2"),
        )


def test_audio_mono_float_becomes_16_bit_pcm():
    t = np.arange(800) / 8000
    samples = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    event = summaries.audio_event("a", samples, 2, 1.0, 8000)
    rate, channels, frames, pcm = read_wav(event["data"])
    assert (rate, channels, frames) == (8000, 1, 800)
    assert pcm.tolist() == np.rint(samples.astype(np.float64) * 32767).astype(int).tolist()
    assert (event["format"], event["sample_rate"], event["channels"], event["frames"]) == (
        "wav",
        8000,
        1,
        800,
    )
    assert event["clipped"] == 0
    assert_wire_ready(event)


def test_audio_stereo_both_layouts_and_int16():
    left = np.array([0, 1000, -1000, 32767], np.int16)
    right = np.array([5, 6, 7, -32768], np.int16)
    frames_first = summaries.audio_event("s", np.stack([left, right], 1), 0, 0.0, 16000)
    channels_first = summaries.audio_event("s", np.stack([left, right]), 0, 0.0, 16000)
    assert frames_first["data"] == channels_first["data"]
    rate, channels, frames, pcm = read_wav(frames_first["data"])
    assert (rate, channels, frames) == (16000, 2, 4)
    assert pcm.reshape(4, 2).T.tolist() == [left.tolist(), right.tolist()]


def test_audio_out_of_range_is_clipped_and_counted():
    event = summaries.audio_event("a", [2.0, -3.0, math.nan, 0.25, math.inf], 0, 0.0)
    assert read_wav(event["data"])[3].tolist() == [32767, -32767, 0, 8192, 32767]
    assert event["clipped"] == 4


@pytest.mark.parametrize(
    ("audio", "rate", "error", "text"),
    [
        (np.zeros((3, 100)), 8000, ValueError, r"mono .* or stereo .* got shape \(3, 100\)"),
        (np.zeros((2, 3, 4)), 8000, ValueError, r"got shape \(2, 3, 4\)"),
        (np.zeros(0), 8000, ValueError, "at least one frame"),
        (np.zeros(10, np.int32), 8000, ValueError, "audio_array must be float .* or int16, got dtype int32"),
        (np.zeros(10), 0, ValueError, "sample_rate must be from 1 to 1000000, got 0"),
        (np.zeros(10), 44100.0, TypeError, "sample_rate must be an int, got float 44100.0"),
        ("loud", 8000, TypeError, "audio_array must be an array of numbers"),
    ],
)  # fmt: skip
def test_audio_bad_input(audio, rate, error, text):
    with pytest.raises(error, match=text):
        summaries.audio_event("a", audio, 0, 0.0, rate)


# -- hparams ----------------------------------------------------------------------------------


def test_hparams_with_metric_tags_visualdl_form():
    event = summaries.hparams_event(
        {"lr": 0.1, "layers": np.int64(4), "opt": "adam", "bn": True},
        ["train/loss", "val/acc"],
        3.0,
    )
    assert event["hparams"] == {"lr": 0.1, "layers": 4, "opt": "adam", "bn": True}
    assert type(event["hparams"]["layers"]) is int
    assert event["metrics"] == ["train/loss", "val/acc"] and event["metric_values"] is None
    assert (event["kind"], event["tag"], event["step"]) == ("hparams", None, None)
    assert_wire_ready(event)


def test_hparams_with_metric_values_tensorboardx_form():
    event = summaries.hparams_event(
        {"lr": 0.1}, {"hparam/acc": np.float32(0.5), "loss": math.nan}, 0.0
    )
    assert event["metrics"] == ["hparam/acc", "loss"]
    assert event["metric_values"]["hparam/acc"] == 0.5 and math.isnan(
        event["metric_values"]["loss"]
    )


@pytest.mark.parametrize(
    ("hparams", "metrics", "error", "text"),
    [
        ([("lr", 1)], [], TypeError, "hparams_dict must be a dict, got list"),
        ({"lr": [0.1]}, [], TypeError, r"hparams_dict\['lr'\] must be a str, int, float or bool, got list"),
        ({"lr": None}, [], TypeError, r"hparams_dict\['lr'\] .* got NoneType"),
        ({"big": 1 << 70}, [], ValueError, r"hparams_dict\['big'\] must fit in 64 bits"),
        ({3: 1}, [], TypeError, "hparams_dict key must be a non-empty str, got int"),
        ({"lr": 1}, "loss", TypeError, "metrics_list must be a list of metric tags or a dict .* got str"),
        ({"lr": 1}, ["ok", ""], ValueError, r"metrics_list\[1\] must be a non-empty str"),
        ({"lr": 1}, {"acc": "high"}, TypeError, r"metric_dict\['acc'\] must be a real number"),
    ],
)  # fmt: skip
def test_hparams_bad_input(hparams, metrics, error, text):
    with pytest.raises(error, match=text):
        summaries.hparams_event(hparams, metrics, 0.0)


# -- PR and ROC curves ------------------------------------------------------------------------

LABELS = [1, 0, 1, 1, 0, 0]
PREDICTIONS = [0.95, 0.85, 0.65, 0.35, 0.25, 0.05]


def test_pr_curve_matches_a_hand_computation():
    # 5 thresholds 0, .25, .5, .75, 1; bucket = floor(p * 4): 3, 3, 2, 1, 1, 0.
    # At threshold 0.5 the positives are 0.95 (1), 0.85 (0), 0.65 (1): tp 2, fp 1, fn 1, tn 2.
    event = summaries.pr_curve_event("pr", LABELS, PREDICTIONS, 9, 1.0, num_thresholds=5)
    assert f8(event["thresholds"]).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert f8(event["tp"]).tolist() == [3, 3, 2, 1, 0]
    assert f8(event["fp"]).tolist() == [3, 2, 1, 1, 0]
    assert f8(event["tn"]).tolist() == [0, 1, 2, 2, 3]
    assert f8(event["fn"]).tolist() == [0, 0, 1, 2, 3]
    np.testing.assert_allclose(f8(event["precision"]), [0.5, 0.6, 2 / 3, 0.5, 0.0])
    np.testing.assert_allclose(f8(event["recall"]), [1.0, 1.0, 2 / 3, 1 / 3, 0.0])
    assert (event["kind"], event["tag"], event["step"], event["num_thresholds"]) == (
        "pr_curve",
        "pr",
        9,
        5,
    )
    assert_wire_ready(event)


def test_roc_curve_matches_a_hand_computation():
    event = summaries.roc_curve_event("roc", LABELS, PREDICTIONS, 0, 1.0, num_thresholds=5)
    np.testing.assert_allclose(f8(event["tpr"]), [1.0, 1.0, 2 / 3, 1 / 3, 0.0])
    np.testing.assert_allclose(f8(event["fpr"]), [1.0, 2 / 3, 1 / 3, 1 / 3, 0.0])
    assert event["kind"] == "roc_curve" and "precision" not in event
    assert_wire_ready(event)


def test_pr_curve_weights_scale_counts_not_rates():
    plain = summaries.pr_curve_event("pr", LABELS, PREDICTIONS, 0, 0.0, 5)
    doubled = summaries.pr_curve_event("pr", LABELS, PREDICTIONS, 0, 0.0, 5, weights=2)
    assert (f8(doubled["tp"]) == 2 * f8(plain["tp"])).all()
    assert doubled["precision"] == plain["precision"]
    only_first = summaries.pr_curve_event("pr", LABELS, PREDICTIONS, 0, 0.0, 5, [1, 0, 0, 0, 0, 0])
    assert f8(only_first["tp"]).tolist() == [1, 1, 1, 1, 0]
    assert f8(only_first["fp"]).tolist() == [0, 0, 0, 0, 0]


def test_pr_curve_agrees_with_tensorboardx():
    from tensorboardX.summary import compute_curve

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 1000).astype(bool)
    predictions = rng.random(1000)
    event = summaries.pr_curve_event("pr", labels, predictions, 0, 0.0, 127)
    tp, fp, tn, fn, precision, recall = compute_curve(labels, predictions, 127)
    for key, expected in zip(
        ("tp", "fp", "tn", "fn", "precision", "recall"),
        (tp, fp, tn, fn, precision, recall),
        strict=True,
    ):
        np.testing.assert_allclose(f8(event[key]), expected, err_msg=key)


@pytest.mark.parametrize(
    ("labels", "predictions", "kwargs", "error", "text"),
    [
        ([1, 2], [0.1, 0.2], {}, ValueError, "labels must be 0 or 1 .* got 2.0"),
        ([1, 0], [0.1, 1.5], {}, ValueError, r"predictions must be probabilities in \[0, 1\], got 1.5"),
        ([1, 0], [0.1, math.nan], {}, ValueError, "predictions must be probabilities .* got nan"),
        ([1, 0, 1], [0.1, 0.2], {}, ValueError, "same, non-zero number of elements, got 3 and 2"),
        ([], [], {}, ValueError, "got 0 and 0"),
        ([1], [0.5], {"num_thresholds": 1}, ValueError, "num_thresholds must be from 2 to 10000, got 1"),
        ([1], [0.5], {"weights": [1, 2]}, ValueError, "weights must be one number or one per label"),
        ([1], [0.5], {"weights": -1}, ValueError, "weights must be finite and non-negative, got -1.0"),
        (["a"], [0.5], {}, TypeError, "labels must be an array of numbers"),
    ],
)  # fmt: skip
def test_curves_bad_input(labels, predictions, kwargs, error, text):
    for build in (summaries.pr_curve_event, summaries.roc_curve_event):
        with pytest.raises(error, match=text):
            build("c", labels, predictions, 0, 0.0, **kwargs)
