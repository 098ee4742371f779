"""The ``/ws/live`` send loop: a ``frames`` message is encoded once for every browser that takes
the same frames (h-live, docs/performance.md "Live latency")."""

from __future__ import annotations

import pytest
import trio

from vdl_stream import codec
from vdl_stream.broker import Subscriber
from vdl_stream.server import _frames_cache, _send_live


async def _drain(sub: Subscriber) -> list[bytes]:
    """What ``_send_live`` sends for ``sub`` as the page subscribes (``batch``), until its queue
    is closed and empty."""
    sent: list[bytes] = []

    async def send(message: bytes) -> None:
        sent.append(message)

    with trio.fail_after(5), pytest.raises(trio.EndOfChannel):
        await _send_live(sub, send, True)
    return sent


async def test_browsers_taking_the_same_frames_get_one_encoded_frames_message():
    frames = [codec.encode_message({"type": "data", "seq": i, "run": "r"}) for i in (1, 2, 3)]
    subs = [Subscriber(None, capacity=8) for _ in range(3)]
    for sub in subs[:2]:  # the broker offers the same frame objects to every subscriber alike
        for seq, frame in enumerate(frames, 1):
            sub.offer(seq, "r", frame)
    for seq, frame in enumerate(frames, 1):  # equal frames, but other objects
        subs[2].offer(seq, "r", bytes(bytearray(frame)))
    for sub in subs:
        sub.close()
    hits = _frames_cache.hits

    first, second, other = [await _drain(sub) for sub in subs]

    assert len(first) == len(second) == len(other) == 1
    assert second[0] is first[0]  # encoded once, sent to both
    assert codec.decode_message(first[0]) == {"type": "frames", "frames": frames}
    assert other[0] == first[0] and other[0] is not first[0]  # other frames: encoded anew
    assert _frames_cache.hits == hits + 1
