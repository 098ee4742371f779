"""How long ``vdl-stream serve`` takes to answer a subscribe with snapshots, without a browser.

bench/bench_dashboard.py uses it to split a page load's wait for data into the server's part and
the page's part. A plain WebSocket client (trio-websocket): connect to ``/ws/live``, send the
page's own ``subscribe`` (all runs, ``max_points`` per tag), time until the snapshot frames of
every announced run have arrived.
"""

from __future__ import annotations

import time

import msgpack
import trio
from trio_websocket import open_websocket_url


async def _snapshot(ws_url: str, max_points: int) -> dict:
    t0 = time.perf_counter()
    async with open_websocket_url(ws_url + "/ws/live") as ws:
        connected = time.perf_counter()
        await ws.send_message(
            msgpack.packb({"type": "subscribe", "runs": None, "max_points": max_points})
        )
        sent = time.perf_counter()
        runs: set[str] | None = None
        got: set[str] = set()
        nbytes = 0
        while runs is None or not runs <= got:
            data = await ws.get_message()
            msg = msgpack.unpackb(data, raw=False)
            if msg["type"] == "runs":
                runs = set(msg["runs"])
            elif msg["type"] == "snapshot":
                got.add(msg["run"])
                nbytes += len(data)
        done = time.perf_counter()
    return {
        "connect_s": connected - t0,
        "snapshot_s": done - sent,
        "bytes": nbytes,
        "runs": len(got),
    }


def snapshot_time(ws_url: str, max_points: int = 2000, timeout: float = 60.0) -> dict:
    """Connect, subscribe to everything and time the snapshots (at most ``timeout`` seconds).

    Returns ``connect_s``, ``snapshot_s`` (subscribe sent to the last snapshot received),
    ``bytes`` and ``runs``. Raises ``trio.TooSlowError`` past the timeout.
    """

    async def main() -> dict:
        with trio.fail_after(timeout):
            return await _snapshot(ws_url, max_points)

    return trio.run(main)
