"""The first ``summaries`` frame of ``/ws/live``: as a table (``?summaries=table``, what the page
asks for) and as the list of summary objects, from a fresh ``vdl-stream serve`` over the cached
many-runs log directory (bench/runs_data.py, generated once under bench/out/runs/).

    python bench/dashboard_summaries.py                  # 1,000 runs x 10 tags x 10,000 points
    python bench/dashboard_summaries.py --rounds 5

Each round opens one connection of each form, alternating which goes first, and takes the
milliseconds from the socket being open until the ``summaries`` frame is read, and its size. The
first table after the start is built by the server (later ones are the same bytes while no summary
changes): it is reported on its own. Medians over the rounds otherwise. A plain WebSocket client
(no permessage-deflate), so the figures are the server's and the loopback's, not a browser's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import msgpack
import trio
from trio_websocket import open_websocket_url

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from runs_data import cached_runs  # noqa: E402

from tests.conftest import start_serve, stop_serve  # noqa: E402


async def first_summaries(ws_url: str, query: str) -> tuple[float, int]:
    """Milliseconds from open until the first ``summaries`` frame is read, and its bytes."""
    with trio.fail_after(60):
        async with open_websocket_url(ws_url + "/ws/live" + query, max_message_size=1 << 26) as ws:
            t0 = time.perf_counter()
            while True:
                frame = await ws.get_message()
                if msgpack.unpackb(frame, raw=False).get("type") == "summaries":
                    return (time.perf_counter() - t0) * 1e3, len(frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=10_000, help="points per tag and run")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    logdir = cached_runs(n_runs=args.runs, tags=10, points=args.points)
    server = start_serve(logdir)
    forms = {"table": "?summaries=table", "list": ""}
    got: dict[str, list[tuple[float, int]]] = {k: [] for k in forms}
    try:
        for r in range(args.rounds + 1):
            order = list(forms) if r % 2 == 0 else list(reversed(forms))
            for form in order:
                got[form].append(trio.run(first_summaries, server.ws_url, forms[form]))
    finally:
        stop_serve(server)
    first_table = got["table"].pop(0)  # built by the server on this first connection
    got["list"].pop(0)
    print(f"{args.runs} runs, {args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    print(
        f"table, first after the start (built): {first_table[0]:.1f} ms, {first_table[1]:,} bytes"
    )
    for form, rows in got.items():
        ms = [m for m, _ in rows]
        print(
            f"{form}: median {statistics.median(ms):.1f} ms ({min(ms):.1f}-{max(ms):.1f}),"
            f" {rows[0][1]:,} bytes"
        )


if __name__ == "__main__":
    main()
