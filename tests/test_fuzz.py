"""Malformed, truncated, oversize and schema-breaking frames at /ws/ingest: the server stays up,
each bad client is closed, and a well-behaved writer streaming meanwhile loses nothing."""

from __future__ import annotations

import msgpack
import numpy as np
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed, open_websocket_url

import recorder
from tests.conftest import http_request, start_serve, stop_serve
from vdl_stream import codec
from vdl_stream.codec import Batch, ScalarColumns

GOOD = codec.encode_batch(
    Batch("fuzz", 1, "r", [ScalarColumns("t", np.arange(3), np.ones(3), np.ones(3))])
)
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
batch_like = st.fixed_dictionaries(
    {"type": st.just("batch")},
    optional={
        "writer": msgpack_values,
        "seq": msgpack_values,
        "run": msgpack_values,
        "scalars": msgpack_values,
        "events": st.lists(
            st.dictionaries(st.sampled_from(["kind", "tag", "step", "wall"]), msgpack_values)
        ),
    },
)
# A valid writer, seq and run with fuzzed events of real kinds: refused, or accepted and readable.
event_like = st.fixed_dictionaries(
    {"kind": st.sampled_from(sorted(codec.EVENT_KINDS)), "wall": st.just(1.7e9)},
    optional={
        key: msgpack_values
        for key in ("tag", "step", "fields", "edges", "counts", "text", "data", "hparams", "x")
    },
)
body_breaking = st.builds(
    lambda seq, events: msgpack.packb(
        {"type": "batch", "writer": "fz", "seq": seq, "run": "fz-run", "events": events},
        use_bin_type=True,
    ),
    st.integers(1, 2**40),
    st.lists(event_like, min_size=1, max_size=3),
)
frames = st.one_of(
    st.binary(max_size=300),  # garbage
    st.integers(1, len(GOOD) - 1).map(lambda n: GOOD[:n]),  # truncated
    batch_like.map(lambda m: msgpack.packb(m, use_bin_type=True)),  # schema-breaking
    msgpack_values.map(lambda v: msgpack.packb(v, use_bin_type=True)),
    body_breaking,
)


def test_fuzzed_ingest_never_hurts_a_good_writer(tmp_path):
    server = start_serve(tmp_path)
    ws = "ws" + server.url.removeprefix("http") + "/ws/ingest"
    sent = {"seq": 0}
    state = {}

    async def good_writer_sends(n: int) -> None:
        async with open_websocket_url(ws) as good:
            for _ in range(n):
                sent["seq"] += 1
                s = sent["seq"]
                cols = ScalarColumns("loss", np.array([s]), np.array([1.7e9]), np.array([s * 0.5]))
                await good.send_message(codec.encode_batch(Batch("good", s, "good-run", [cols])))
                assert msgpack.unpackb(await good.get_message())["seq"] == s

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames)
    def throw(frame):
        async def one() -> None:
            with trio.fail_after(20):
                async with open_websocket_url(ws) as bad:
                    await bad.send_message(frame)
                    try:
                        reply = msgpack.unpackb(await bad.get_message())
                        # only a frame that happens to be a valid batch is acknowledged; a batch
                        # with a valid writer and seq but a broken body is refused for good
                        assert reply["type"] in ("ack", "refused"), reply
                        if reply["type"] == "refused":
                            assert reply["retryable"] is False and reply["reason"]
                        state[reply["type"]] = state.get(reply["type"], 0) + 1
                    except ConnectionClosed as closed:
                        assert closed.reason.code in (1008, 1009), closed.reason
                        assert len(closed.reason.reason or "") <= 123
                await good_writer_sends(1)

        trio.run(one)

    try:
        throw()
        trio.run(good_writer_sends, 5)
        assert server.proc.poll() is None  # still up
        # whatever was accepted can be read back: no read of it fails
        for path in [f"events?run=fz-run&kind={k}" for k in sorted(codec.EVENT_KINDS)] + [
            "telemetry?run=fz-run",
            "export?run=fz-run",
            "export?run=fz-run&format=json",
        ]:
            status = http_request(f"{server.url}/api/{path}")[0]
            assert status in (200, 404), (path, status)
    finally:
        stop_serve(server)
    with recorder.RunReader(tmp_path / "good-run") as reader:
        steps = reader.read_scalars("loss").steps.tolist()
    assert steps == list(range(1, sent["seq"] + 1))
