"""Where the time goes between ``add_scalar`` and a ``/ws/live`` subscriber, stage by stage.

A ``vdl-stream serve`` subprocess and ``attach(url=...)`` writer subprocesses run with their own
functions wrapped (in those processes only; the project's code is not changed) so that each batch
is timestamped at every stage of the live path; subscribers in this process stamp each ``data``
frame's arrival. Batches are matched across processes by (writer, seq) and by the broker's seq.

Stages (one row each; p50 / p99 / max over the batches after the first second):

- ``call -> batch``: the oldest point of a batch, from its ``add_scalar`` to the writer cutting the
  batch (the adaptive flush waits while a batch is in flight, i.e. unacknowledged);
- ``batch -> encoded``: the batch is encoded for the socket;
- ``encoded -> ingest``: on the wire and in the server's WebSocket receive path, until
  ``Broker.ingest`` starts (decoding included);
- ``ingest``: ``Broker.ingest`` itself (fan-out to every subscriber's queue included);
- ``ingest -> written``: until the persist task has written the batch (``Broker._write`` returned);
- ``written -> ack at writer``: the acknowledgement's way back;
- ``offer -> subscriber``: from the fan-out to a subscriber's arrival (the server's send loop,
  hypercorn, the socket, the subscriber's decoding);
- ``add_scalar -> subscriber``: the whole path, for the oldest point of each frame;
- ``fsync``: each fsync round of the persist task (it holds the persist thread: a batch arriving
  meanwhile waits for it).

Usage: python bench/latency_stages.py [--rate 10000] [--seconds 6] [--subscribers 10]
                                      [--writers 1] [--page] [--window N] [--json PATH]

All traffic is on 127.0.0.1; every process started is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# -- inside the traced processes ---------------------------------------------------------------------

_rows: list[tuple] = []


def _record(*row: object) -> None:
    _rows.append(row)


def _dump(path: str) -> None:
    with open(path, "w") as f:
        json.dump(_rows, f)


def _trace_server() -> None:
    """Wrap the server's stages; the rows are written to ``$TRACE_OUT`` at exit."""
    from vdl_stream import broker as b
    from vdl_stream import codec
    from vdl_stream import server as s

    ingest = b.Broker.ingest

    async def traced_ingest(self, batch):  # type: ignore[no-untyped-def]
        t = time.time()
        seq = await ingest(self, batch)
        _record("ingest", batch.writer, batch.seq, seq, t, time.time())
        return seq

    write = b.Broker._write

    async def traced_write(self, items):  # type: ignore[no-untyped-def]
        await write(self, items)
        t = time.time()
        for seq, _batch, _sync in items:
            _record("written", seq, t)

    sync = b.Broker._sync_runs

    def traced_sync(self):  # type: ignore[no-untyped-def]
        t = time.time()
        try:
            return sync(self)
        finally:
            _record("fsync", t, time.time())

    offer = b.Subscriber.offer

    def traced_offer(self, seq, *args):  # type: ignore[no-untyped-def]
        _record("offer", seq, time.time())
        return offer(self, seq, *args)

    b.Broker.ingest = traced_ingest
    b.Broker._write = traced_write
    b.Broker._sync_runs = traced_sync
    b.Subscriber.offer = traced_offer
    assert s.Broker is b.Broker and codec is not None


def _trace_writer() -> None:
    """Wrap the writer's stages; the rows are written to ``$TRACE_OUT`` at exit."""
    from vdl_stream import codec, transport
    from vdl_stream import writer as w

    take = w.Writer._take_pending

    def traced_take(self, *, sync):  # type: ignore[no-untyped-def]
        t = time.time()
        # Each tag's buffer is flat [step, value, wall, ...]: its first wall is its oldest.
        walls = [buffer[2] for _, buffer in self._buffers if buffer]
        oldest = min(walls) if walls else None
        seq = take(self, sync=sync)
        if oldest is not None:
            _record("batch", self._id, seq, oldest, t)
        return seq

    encode = codec.encode_batch

    def traced_encode(batch):  # type: ignore[no-untyped-def]
        frame = encode(batch)
        _record("encoded", batch.writer, batch.seq, time.time())
        return frame

    decode = codec.decode_message

    def traced_decode(data):  # type: ignore[no-untyped-def]
        message = decode(data)
        if message.get("type") == "ack":
            _record("acked", message["writer"], message["seq"], time.time())
        return message

    w.Writer._take_pending = traced_take
    codec.encode_batch = transport.codec.encode_batch = traced_encode
    codec.decode_message = transport.codec.decode_message = traced_decode


def _serve_main(argv: list[str]) -> None:
    import atexit

    from vdl_stream import cli

    _trace_server()
    atexit.register(_dump, os.environ["TRACE_OUT"])
    sys.exit(cli.main(["serve", *argv]))


def _writer_main(url: str, run: str, rate: int, seconds: float, ntags: int, window: str) -> None:
    from broker_clients import log_paced

    from vdl_stream import attach

    _trace_writer()
    tags = [f"train/metric{i}" for i in range(ntags)]
    # "default": whatever attach() defaults to (a tree without the option runs too)
    options = {} if window == "default" else {"window": int(window)}
    writer = attach(url=url, run=run, telemetry=False, **options)
    log_paced(writer.add_scalar, tags, rate, seconds)
    writer.flush(timeout=60)
    writer.close(timeout=30)
    _dump(os.environ["TRACE_OUT"])


# -- the driver ------------------------------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    a = np.asarray(values) * 1e3
    return (
        f"p50 {np.percentile(a, 50):8.2f}  p99 {np.percentile(a, 99):8.2f}  max {a.max():8.2f} ms"
    )


def _subscribers(ws_url: str, n: int, page: bool, started: Any, stop: Any, arrivals: list) -> None:
    """Run ``n`` subscribers (set ``started`` once all subscribed) until ``stop`` is set; append
    ``(seq, arrival, oldest wall)`` per data frame to ``arrivals``."""
    import trio
    from trio_websocket import open_websocket_url

    from vdl_stream import codec

    ask = {"type": "subscribe", "runs": ["live"]}
    if page:
        ask |= {"split": True, "batch": True}

    async def one(ready: trio.Semaphore) -> None:
        async with open_websocket_url(ws_url + "/ws/live", max_message_size=64 << 20) as ws:
            await ws.send_message(codec.encode_message(ask))
            ready.release()
            while not stop.is_set():
                with trio.move_on_after(0.2):
                    data = await ws.get_message()
                    now = time.time()
                    message = codec.decode_message(data)
                    messages = [message]
                    if message["type"] == "frames":
                        messages = [codec.decode_message(f) for f in message["frames"]]
                    for m in messages:
                        walls = [np.frombuffer(c[2], "<f8") for c in m.get("scalars", [])]
                        if m["type"] == "data" and walls:
                            arrivals.append((m["seq"], now, float(np.concatenate(walls).min())))

    async def main() -> None:
        ready = trio.Semaphore(0)
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one, ready)
            for _ in range(n):
                await ready.acquire()
            started.set()  # the writers may start

    trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000, help="events/s in all")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--page", action="store_true", help="subscribe as the page does (batch)")
    parser.add_argument(
        "--window", type=int, help="the writers' in-flight window (default: attach's default)"
    )
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--writer", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        return _serve_main(args.serve)
    if args.writer is not None:
        url, run, rate, seconds, ntags, window = args.writer
        return _writer_main(url, run, int(rate), float(seconds), int(ntags), window)

    import threading

    tmp = Path(tempfile.mkdtemp(prefix="vdl-stages-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    me = [sys.executable, str(Path(__file__).resolve())]
    procs: list[subprocess.Popen] = []
    arrivals: list[tuple[int, float, float]] = []
    try:
        with open(tmp / "serve.err", "wb") as err:
            server = subprocess.Popen(
                [*me, "--serve", "--logdir", str(tmp / "logs"), "--port", "0"],
                stdout=subprocess.PIPE,
                stderr=err,
                env={**env, "TRACE_OUT": str(tmp / "server.json")},
            )
        procs.append(server)
        ready, _, _ = select.select([server.stdout], [], [], 30)
        line = server.stdout.readline().decode() if ready else ""
        if " at http" not in line:
            raise SystemExit(f"serve did not start: {line!r}; see {tmp / 'serve.err'}")
        url = line.rsplit(" at ", 1)[1].strip().split("/?")[0].rstrip("/")
        ws_url = "ws" + url.removeprefix("http")
        started, stop = threading.Event(), threading.Event()
        subs = threading.Thread(
            target=_subscribers,
            args=(ws_url, args.subscribers, args.page, started, stop, arrivals),
        )
        subs.start()
        if not started.wait(30):
            raise SystemExit("the subscribers did not subscribe within 30 s")
        rate = str(args.rate // args.writers)
        for i in range(args.writers):
            procs.append(
                subprocess.Popen(
                    [
                        *me,
                        "--writer",
                        ws_url,
                        "live",
                        rate,
                        str(args.seconds),
                        str(args.tags),
                        "default" if args.window is None else str(args.window),
                    ],
                    env={**env, "TRACE_OUT": str(tmp / f"writer{i}.json")},
                )
            )
        for proc in procs[1:]:
            proc.wait(args.seconds + 120)
        time.sleep(1.0)  # the last frames in flight
        stop.set()
        subs.join(30)
        server.terminate()
        server.wait(30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    report(tmp, args, arrivals)


def report(tmp: Path, args: argparse.Namespace, arrivals: list[tuple[int, float, float]]) -> None:
    """Match the processes' rows and print one line per stage."""
    server = json.loads((tmp / "server.json").read_text())
    writers = [json.loads((tmp / f"writer{i}.json").read_text()) for i in range(args.writers)]
    ingest = {(r[1], r[2]): r for r in server if r[0] == "ingest"}
    written = {r[1]: r[2] for r in server if r[0] == "written"}
    offered: dict[int, float] = {}
    for r in server:
        if r[0] == "offer":
            offered.setdefault(r[1], r[2])
    start = min((r[4] for r in ingest.values()), default=0.0) + 1.0  # the first second left out
    stages: dict[str, list[float]] = {
        k: []
        for k in (
            "call -> batch",
            "batch -> encoded",
            "encoded -> ingest",
            "ingest",
            "ingest -> written",
            "written -> ack at writer",
            "offer -> subscriber",
            "add_scalar -> subscriber",
            "fsync",
        )
    }
    for rows in writers:
        encoded = {(r[1], r[2]): r[3] for r in rows if r[0] == "encoded"}
        acked = {(r[1], r[2]): r[3] for r in rows if r[0] == "acked"}
        for r in rows:
            if r[0] != "batch":
                continue
            key, oldest, cut = (r[1], r[2]), r[3], r[4]
            got = ingest.get(key)
            if got is None or got[4] < start or key not in encoded:
                continue
            stages["call -> batch"].append(cut - oldest)
            stages["batch -> encoded"].append(encoded[key] - cut)
            stages["encoded -> ingest"].append(got[4] - encoded[key])
            stages["ingest"].append(got[5] - got[4])
            if got[3] in written:
                stages["ingest -> written"].append(written[got[3]] - got[5])
                if key in acked:
                    stages["written -> ack at writer"].append(acked[key] - written[got[3]])
    for seq, now, oldest in arrivals:
        if now >= start:
            if seq in offered:
                stages["offer -> subscriber"].append(now - offered[seq])
            stages["add_scalar -> subscriber"].append(now - oldest)
    stages["fsync"] = [r[2] - r[1] for r in server if r[0] == "fsync"]
    load = Path("/proc/loadavg").read_text().split()[0]
    print(
        f"add_scalar -> /ws/live by stage: {args.rate:,} events/s from {args.writers} writer(s), "
        f"{args.subscribers} subscribers{' (as the page)' if args.page else ''}"
        f"{'' if args.window is None else f', window {args.window}'}; load {load}"
    )
    for name, values in stages.items():
        print(f"  {name:28s} n={len(values):7d}  {_ms(values)}")
    if args.json:
        figures = {
            k: {q: float(np.percentile(v, q) * 1e3) for q in (50, 99)}
            for k, v in stages.items()
            if v
        }
        Path(args.json).write_text(json.dumps({"load": load, "stages": figures}, indent=1))


if __name__ == "__main__":
    main()
