"""WebSocket masking (RFC 6455 5.3) four bytes at a time with numpy, for both ends of the socket.

Every frame a client sends is masked: XORed with a 4-byte key that the frame carries. wsproto does
it in pure Python, with four strided slices, byte translations and assignments, and copies the
payload several times around it: 156 us for a writer's 127 kB batch at 1M events/s and 3.4 ms for
an 800 kB image, holding the GIL (docs/performance.md, "The writer's socket path").

- A writer masks what it sends with :func:`mask_connection`, on its own connection only.
- The server unmasks what a ``/ws/live`` or ``/ws/ingest`` client sends with
  :func:`unmask_connection`, on that connection only.

Both are installed one connection at a time, never as wsproto's module-wide masker: a writer runs
in the user's training process, and so does a server started by ``attach(serve=True)``, where
other code may use wsproto too; that code keeps wsproto's own. Both give the bytes wsproto gives,
for any key, payload and split of a payload into parts.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np
from wsproto.frame_protocol import (
    FrameDecoder,
    FrameProtocol,
    Opcode,
    RsvBits,
    XorMaskerSimple,
)

#: Payloads shorter than this are masked by wsproto's own code: below it, setting up the numpy
#: arrays costs more than the four byte translations it replaces.
NUMPY_UNMASK_FROM = 1024

_WSPROTO_MASKER = XorMaskerSimple


class QuickMasker:
    """wsproto's ``XorMaskerSimple`` with the same results, XORing a large payload four bytes
    at a time with numpy.

    wsproto unmasks every client frame with four strided slices, byte translations and
    assignments: 148 us of the server's event loop for a 127 kB batch from a writer at 1M
    events/s, 19 us here. It keeps wsproto's contract: ``process`` may be called on successive
    parts of one payload, each part continuing with the key where the previous one stopped, and
    returns a new ``bytearray``.

    Args:
        masking_key: the frame's 4-byte masking key.
    """

    __slots__ = ("_key",)

    def __init__(self, masking_key: bytes | bytearray) -> None:
        self._key = bytes(masking_key)

    def process(self, data: bytes | bytearray) -> bytearray:
        """Return ``data`` XORed with the key, continuing from the previous call's position."""
        key, n = self._key, len(data)
        if n < NUMPY_UNMASK_FROM:
            out = _WSPROTO_MASKER(key).process(data)
        else:
            out = bytearray(n)
            words = n // 4
            np.bitwise_xor(
                np.frombuffer(data, np.uint32, words),
                np.frombuffer(key, np.uint32)[0],
                out=np.frombuffer(out, np.uint32, words),
            )
            for i in range(4 * words, n):  # at most three bytes left
                out[i] = data[i] ^ key[i - 4 * words]
        turn = n % 4
        self._key = key[turn:] + key[:turn]
        return out


class QuickMaskingFrames(FrameProtocol):
    """wsproto's client ``FrameProtocol``, building a large frame with one numpy pass and one
    copy: its header, a fresh key and the masked payload joined into the ``bytes`` that
    wsproto's connection passes on as they are.

    wsproto's own ``_serialize_frame`` copies a payload into a ``bytearray``, masks it with
    :class:`~wsproto.frame_protocol.XorMaskerSimple` and copies the frame twice more, then its
    connection copies it into ``bytes``. Frames under :data:`NUMPY_UNMASK_FROM`, control frames,
    and every frame of a connection with an extension (whose ``frame_outbound`` may change the
    payload) are left to wsproto.
    """

    def _serialize_frame(
        self, opcode: Opcode, payload: bytes | bytearray = b"", fin: bool = True
    ) -> Any:
        n = len(payload)
        if not self.client or self.extensions or opcode.iscontrol() or n < NUMPY_UNMASK_FROM:
            return super()._serialize_frame(opcode, payload, fin)
        first = self._make_fin_rsv_opcode(fin, RsvBits(False, False, False), opcode)
        # The mask bit, and the length in 16 or 64 bits (n is 1,024 or more here).
        header = (
            struct.pack("!BBH", first, 0x80 | 126, n)
            if n < 1 << 16
            else struct.pack("!BBQ", first, 0x80 | 127, n)
        )
        key = os.urandom(4)  # a fresh, unpredictable key for every frame, as RFC 6455 asks
        return b"".join((header, key, QuickMasker(key).process(payload)))


def mask_connection(connection: Any) -> bool:
    """Build the frames that one trio-websocket client connection sends with
    :class:`QuickMaskingFrames`; return whether it could (False leaves it as it was).

    Only that connection changes: wsproto's module, and every other connection in the process,
    keep wsproto's own code. Found only on the shape it was written for (a trio-websocket
    ``WebSocketConnection`` whose wsproto connection is open, with wsproto's own
    ``FrameProtocol`` on the client side); anything else is left to wsproto.

    Args:
        connection: an open ``trio_websocket.WebSocketConnection`` (the client's end).
    """
    ws = getattr(getattr(connection, "_wsproto", None), "connection", None)
    frames = getattr(ws, "_proto", None)
    if type(frames) is not FrameProtocol or not frames.client:
        return False
    frames.__class__ = QuickMaskingFrames
    return True


class QuickUnmaskingFrames(FrameDecoder):
    """wsproto's server-side ``FrameDecoder``, unmasking each frame with :class:`QuickMasker`
    instead of wsproto's ``XorMaskerSimple`` (the same bytes).

    wsproto makes a frame's masker when it reads the frame's header; this one is put in its
    place there, before any of the frame's payload is unmasked.
    """

    def parse_header(self) -> bool:
        """Read a frame's header as wsproto does, then give the frame a :class:`QuickMasker`."""
        done = super().parse_header()
        masker = self.masker
        if done and type(masker) is XorMaskerSimple:
            self.masker = QuickMasker(masker._masking_key)  # type: ignore[assignment]
        return done


def unmask_connection(connection: Any) -> bool:
    """Unmask the frames one server-side wsproto connection receives with
    :class:`QuickUnmaskingFrames`; return whether it could (False leaves it as it was).

    Only that connection changes, as with :func:`mask_connection`. Found only on the shape it was
    written for (a ``wsproto.connection.Connection`` on the server's side, with wsproto's own
    ``FrameDecoder``).

    Args:
        connection: an open server-side ``wsproto.connection.Connection`` (hypercorn's
            ``WSStream.connection``).
    """
    decoder = getattr(getattr(connection, "_proto", None), "_frame_decoder", None)
    if type(decoder) is not FrameDecoder or decoder.client:
        return False
    decoder.__class__ = QuickUnmaskingFrames
    return True
