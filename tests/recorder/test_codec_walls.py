"""Wall times have one truth: what a writer publishes live is what a reader decodes from disk."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from recorder import codec

EPOCHISH = st.floats(min_value=0.0, max_value=4.1e9, allow_nan=False)  # to the year 2100


@settings(max_examples=300, deadline=None)
@given(base=EPOCHISH, offsets=st.lists(st.floats(0.0, 4000.0), min_size=1, max_size=50))
def test_decoded_walls_are_the_quantized_walls_bit_for_bit(base, offsets):
    walls = base + np.asarray(offsets)
    live = codec.quantize_walls(walls)
    for given_walls in (walls, live):  # raw or already quantized by the writer
        enc = codec._encode_walls(given_walls)
        assert enc[0] == "us"
        decoded = codec._decode_walls(enc, len(walls))
        assert decoded.tobytes() == live.tobytes()
    assert np.abs(live - walls).max() <= 1e-6  # half a microsecond, and float rounding


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_quantizing_any_finite_wall_stays_finite_and_close(walls):
    walls = np.asarray(walls)
    quantized = codec.quantize_walls(walls)
    assert np.isfinite(quantized).all()
    # Within a microsecond where microseconds are representable (|wall| < 2**53 / 1e6 s, about
    # 285 years), else within a few units in the last place.
    with np.errstate(over="ignore"):  # the spacing next to the largest float is inf
        bound = np.maximum(1e-6, 4 * np.spacing(np.abs(walls)))
    assert (np.abs(quantized - walls) <= bound).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_any_quantized_walls_come_back_bit_for_bit(walls):
    live = codec.quantize_walls(np.asarray(walls))
    decoded = codec._decode_walls(codec._encode_walls(live), len(live))
    assert decoded.tobytes() == live.tobytes()
