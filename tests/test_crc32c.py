"""CRC-32C of TensorBoard records: google-crc32c (C) and the numpy fallback give the same answers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vdl_stream import tfrecord

pytestmark = pytest.mark.skipif(
    tfrecord._google_crc32c is None, reason="google-crc32c (C) is not installed"
)


def test_google_is_the_default_backend_when_installed():
    assert tfrecord.CRC_BACKEND == "google"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=5000), min_size=1, max_size=40))
def test_both_backends_agree_with_the_reference(chunks):
    buf = b"".join(chunks)
    lengths = [len(c) for c in chunks]
    offsets = np.cumsum([0, *lengths])[:-1]
    google = tfrecord.crc32c_many(buf, offsets, lengths, backend="google")
    pure = tfrecord.crc32c_many(buf, offsets, lengths, backend="numpy")
    assert google.tolist() == pure.tolist() == [tfrecord.crc32c(c) for c in chunks]


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=1, max_size=20000), st.data())
def test_backends_agree_on_scattered_overlapping_records(buf, data):
    """Records in any order, overlapping, far apart (the path that copies record by record)."""
    pairs = data.draw(
        st.lists(
            st.integers(0, len(buf) - 1).flatmap(
                lambda o: st.tuples(st.just(o), st.integers(0, len(buf) - o))
            ),
            min_size=1,
            max_size=30,
        )
    )
    offsets = [o for o, _ in pairs]
    lengths = [n for _, n in pairs]
    google = tfrecord.crc32c_many(buf, offsets, lengths, backend="google")
    pure = tfrecord.crc32c_many(buf, offsets, lengths, backend="numpy")
    assert google.tolist() == pure.tolist() == [tfrecord.crc32c(buf[o : o + n]) for o, n in pairs]


def test_a_long_record_and_a_sparse_span():
    rng = np.random.default_rng(5)
    buf = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    offsets, lengths = [0, (3 << 20) - 100], [1 << 20, 100]  # far apart: copied one by one
    google = tfrecord.crc32c_many(buf, offsets, lengths, backend="google")
    pure = tfrecord.crc32c_many(buf, offsets, lengths, backend="numpy")
    assert google.tolist() == pure.tolist()
    assert google[1] == tfrecord.crc32c(buf[-100:].tobytes())


def test_a_bad_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="backend must be 'google', 'numpy' or None, got 'zlib'"):
        tfrecord.crc32c_many(b"abc", [0], [3], backend="zlib")
