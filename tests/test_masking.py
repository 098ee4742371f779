"""WebSocket masking with numpy: wsproto's bytes, on the one connection it is given."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from trio_websocket import open_websocket_url
from wsproto import frame_protocol
from wsproto.frame_protocol import FrameProtocol

from tests.conftest import start_broker_server
from vdl_stream import codec, masking
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.transport import WebSocketTransport

N = masking.NUMPY_UNMASK_FROM


@given(
    key=st.binary(min_size=4, max_size=4),
    data=st.binary(max_size=3 * N),
    cuts=st.lists(st.integers(0, 3 * N), max_size=4),
)
def test_the_quick_masker_unmasks_as_wsproto_does_in_any_parts(key, data, cuts):
    """``QuickMasker`` gives wsproto's bytes for a payload given in parts of any sizes (wsproto
    unmasks a frame part by part as it arrives), short and numpy-sized parts alike."""
    # wsproto's own, whatever serve installed in this process (serve_dashboard replaces it).
    wsproto_masker = masking._WSPROTO_MASKER
    assert wsproto_masker.__module__ == "wsproto.frame_protocol"
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    parts = [data[a:b] for a, b in itertools.pairwise(bounds)]
    ours, theirs = masking.QuickMasker(key), wsproto_masker(key)
    got = [ours.process(p) for p in parts]
    assert all(type(g) is bytearray for g in got)
    assert b"".join(got) == b"".join(theirs.process(p) for p in parts)


def _frames(protocol: type[FrameProtocol], parts: list[bytes], keys: list[bytes]) -> list[bytes]:
    """The frames a client's ``protocol`` builds for one message sent in ``parts`` (the last
    one finishing it), each frame masked with the next of ``keys``."""
    drawn = iter(keys)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "urandom", lambda n: next(drawn))
        # wsproto's own masker for its frames, also where serve installed QuickMasker.
        patch.setattr(frame_protocol, "XorMaskerSimple", masking._WSPROTO_MASKER)
        frames = protocol(client=True, extensions=[])
        return [
            bytes(frames.send_data(part, fin=i == len(parts) - 1)) for i, part in enumerate(parts)
        ]


@given(
    parts=st.lists(st.binary(max_size=3 * N), min_size=1, max_size=4),
    keys=st.lists(st.binary(min_size=4, max_size=4), min_size=4, max_size=4),
)
def test_a_writers_frames_are_wsprotos_bit_for_bit_in_any_split(parts, keys):
    """``QuickMaskingFrames`` builds wsproto's very bytes (header, key, masked payload) for a
    message sent whole or in fragments of any sizes, under and over ``NUMPY_UNMASK_FROM``."""
    assert _frames(masking.QuickMaskingFrames, parts, keys) == _frames(FrameProtocol, parts, keys)


@pytest.mark.parametrize("size", [N - 1, N, N + 3, 65535, 65536, 800_001])
def test_a_writers_frames_are_wsprotos_at_each_length_encoding(size):
    """The same at the sizes where the length's encoding (16 or 64 bits) or the masker
    changes, and for an image-sized payload; text messages too."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    keys = [b"\x9a\x01\xff\x37"]
    assert _frames(masking.QuickMaskingFrames, [data], keys) == _frames(FrameProtocol, [data], keys)
    text = [data.hex()[:size]]
    assert _frames(masking.QuickMaskingFrames, text, keys) == _frames(FrameProtocol, text, keys)


@given(
    parts=st.lists(st.binary(max_size=3 * N), min_size=1, max_size=3),
    keys=st.lists(st.binary(min_size=4, max_size=4), min_size=3, max_size=3),
    cuts=st.lists(st.integers(0, 10 * N), max_size=6),
)
def test_the_server_unmasks_as_wsproto_does_in_any_split(parts, keys, cuts):
    """``QuickUnmaskingFrames`` reads the frames wsproto reads (payloads, fragments and
    flags) from a client's bytes arriving in pieces of any sizes, cut anywhere in a header, a
    key or a payload."""
    sent = b"".join(_frames(FrameProtocol, parts, keys))
    bounds = [0, *sorted(c for c in cuts if c <= len(sent)), len(sent)]

    def received(quick: bool) -> list[tuple[object, bytes, bool, bool]]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(frame_protocol, "XorMaskerSimple", masking._WSPROTO_MASKER)
            frames = FrameProtocol(client=False, extensions=[])
            if quick:
                frames._frame_decoder.__class__ = masking.QuickUnmaskingFrames
            got = []
            for a, b in itertools.pairwise(bounds):
                frames.receive_bytes(sent[a:b])
                got += [
                    (f.opcode, f.payload, f.frame_finished, f.message_finished)
                    for f in frames.received_frames()
                ]
            return got

    assert received(quick=True) == received(quick=False)


async def test_the_writer_masks_its_own_connection_only(tmp_path, monkeypatch):
    """A ``WebSocketTransport`` builds its large frames with ``QuickMaskingFrames``, the server
    unmasks them with ``QuickMasker`` on that connection, and the broker ingests the batch
    exactly as it was sent; wsproto's module and another client connection in the same process
    keep wsproto's own code (the server, as ``attach(serve=True)`` runs it, in a training
    process, changes nothing module-wide either)."""
    built: list[int] = []
    serialize = masking.QuickMaskingFrames._serialize_frame

    def counted(self, opcode, payload=b"", fin=True):  # type: ignore[no-untyped-def]
        built.append(len(payload))
        return serialize(self, opcode, payload, fin)

    monkeypatch.setattr(masking.QuickMaskingFrames, "_serialize_frame", counted)
    unmasked = 0
    process = masking.QuickMasker.process

    def unmasking(self, data):  # type: ignore[no-untyped-def]
        nonlocal unmasked
        unmasked += len(data)
        return process(self, data)

    monkeypatch.setattr(masking.QuickMasker, "process", unmasking)
    wsprotos = FrameProtocol._serialize_frame
    rng = np.random.default_rng(16)
    steps = np.arange(20_000, dtype=np.int64)
    walls, values = 1.7e9 + steps * 1e-3, rng.standard_normal(20_000)
    batch = Batch("w", 1, "r", [ScalarColumns("loss", steps, walls, values)])
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, url = await start_broker_server(nursery, tmp_path)
            ws_url = "ws" + url.removeprefix("http")
            sender = await nursery.start(WebSocketTransport.run, ws_url)
            async with open_websocket_url(ws_url + "/ws/ingest") as other:
                await sender.send(batch)
                await sender.wait_acked(1)
                assert type(other._wsproto.connection._proto) is FrameProtocol
            assert FrameProtocol._serialize_frame is wsprotos
            assert frame_protocol.XorMaskerSimple is masking._WSPROTO_MASKER
            # Through it twice: the writer's masking and the server's unmasking.
            assert unmasked >= 2 * len(codec.encode_batch(batch))
            assert max(built) >= len(codec.encode_batch(batch)) > 400_000
            got = await broker.read_scalars("r", "loss", start=None, end=None, max_points=None)
            assert got.steps.tolist() == steps.tolist()
            assert got.values.tolist() == values.tolist()
            assert got.walls.tolist() == walls.tolist()
            broker.close()
            nursery.cancel_scope.cancel()


def test_a_connection_of_another_shape_is_left_to_wsproto():
    """``mask_connection`` changes nothing it does not recognise (a server's end, no
    wsproto connection yet) and says so."""

    class Handshaking:  # a trio-websocket connection before its handshake: no connection
        _wsproto = type("W", (), {"connection": None})()

    assert masking.mask_connection(Handshaking()) is False
    server_end = FrameProtocol(client=False, extensions=[])
    holder = type("W", (), {"connection": type("C", (), {"_proto": server_end})()})()

    class Served:
        _wsproto = holder

    assert masking.mask_connection(Served()) is False
    assert type(server_end) is FrameProtocol
