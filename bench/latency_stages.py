"""Where the time goes between ``add_scalar`` and a ``/ws/live`` subscriber, stage by stage.

A ``vdl-stream serve`` subprocess and ``attach(url=...)`` writer subprocesses run with their own
functions wrapped (in those processes only; the project's code is not changed) so that each batch
is timestamped at every stage of the live path; subscribers stamp each ``data`` frame's arrival.
Batches are matched across processes by (writer, seq) and by the broker's seq. Every process
stamps with ``time.time()``, the wall clock all processes on the machine share.

The subscribers run as browsers do, each in a process of its own (a blocking socket read by
wsproto: a browser's network stack is native code), so a frame's arrival at one waits for its own
decoding and for a core, not for the other subscribers' decoding. With
``--subscribers-in-process`` they run as before h13-loop: trio tasks of one thread of this
process, reading their sockets one after another, so the tenth arrival of a frame includes nine
decodes before it (the ``first subscriber`` rows are then the nearest to a browser).

With ``--in-process`` there is no ``vdl-stream serve``: one writer runs its broker in its own
process (``attach(serve=True)``, the in-process transport) and serves the subscribers; its pump
hands batches straight to ``Broker.ingest`` (``batch -> ingest (in process)``), and the CPU lines
count that process as the writer's.

Stages (one row each; p50 / p99 / max over the batches after the first second):

- ``call -> batch``: the oldest point of a batch, from its ``add_scalar`` to the writer cutting the
  batch (the adaptive flush waits while its window is full: batches not yet acknowledged, or
  with ``--window-counts taken`` not yet taken by the broker), split by what the batch waited
  on: *link free* (a call found nothing in flight and asked the loop to wake the pump: the
  thread wake-up and the GIL, then the pump's task), *window full* (until an answer freed a
  place, then the pump), *points waiting* (the window had room when the last batch was handed
  over) or the flush interval's *timer*;
- ``batch -> encoded``: the pump's cut (the columns built), the hand-over to the transport
  (``batch -> send``) and its encoding (``send -> encoded``);
- ``encoded -> ingest``: on the wire and in the server's WebSocket receive path, until
  ``Broker.ingest`` starts (decoding included), of which the transport's send task taking the
  frame (``encoded -> socket write``) and its write to the socket (``socket write``);
- ``ingest``: ``Broker.ingest`` itself (fan-out to every subscriber's queue included);
- ``ingest -> written``: until the persist task has written the batch (``Broker._write`` returned),
  in three parts: until the persist thread takes it (the persist task's wake-up, the thread hop,
  and a write or housekeeping before it), the thread's write, and the way back to the event loop;
- ``written -> ack at writer``: the acknowledgement's way back;
- ``ingest -> taken at writer``: from ``Broker.ingest`` returning to the writer reading its
  ``taken`` (what frees a place in its window);
- ``offer -> taken to send``: from the fan-out to each subscriber's send task taking the frame
  from its queue (the event loop's backlog); a frame for a subscriber whose send task was idle
  is written by the fan-out itself (h12-loop) and counted apart (``written at offer``);
- ``offer -> subscriber``: from the fan-out to a subscriber's arrival (the server's send loop,
  hypercorn, the socket, the subscriber's decoding);
- ``add_scalar -> subscriber``: the whole path, for the oldest point of each frame;
- ``fsync``, ``compaction``, ``segment rotation``: the persist thread's housekeeping (each fsync
  round, each run of the recorder's compaction of sealed segments, each segment the broker
  starts); a batch arriving meanwhile waits for it, and the report says how many of the slowest
  1% of ``ingest -> written`` did;
- CPU: each process's CPU (the server's event loop and its threads apart) from the first batch to
  the writers' end, in cores, to tell a stage that waits from a machine that is saturated.

With ``--persist-only POINTS`` it measures the broker's persistence alone, in this process: batches
of POINTS points at ``--rate`` points/s, each ingested once the previous one is written (no
sockets, no subscribers), with the persist thread's fsync, compaction and rotation times. With
``--ingest-only BATCHES``, ``Broker.ingest`` alone (fan-out to ``--subscribers`` queues included).
With ``--fanout-only BATCHES``, the event loop's CPU a batch for the fan-out to ``--subscribers``
browsers and their WebSocket sends (broker and web server in process, subscribers in a child).
With ``--frame-costs``, what permessage-deflate costs per browser for one frame of three sizes.

Usage: python bench/latency_stages.py [--rate 10000] [--seconds 6] [--subscribers 10]
                                      [--writers 1] [--page] [--deflate] [--window N] [--json PATH]
                                      [--persist-only POINTS] [--ingest-only BATCHES]
                                       [--fanout-only BATCHES]
                                       [--frame-costs] [--no-compaction] [--keep]
                                       [--inline-write BYTES] [--window-counts taken|written]
                                       [--subscribers-in-process] [--in-process]
                                       [--run-per-writer]

All traffic is on 127.0.0.1; every process started is stopped in ``finally``, and the temporary
directory (the processes' rows, the run's log directory) is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# -- inside the traced processes ---------------------------------------------------------------------

_rows: list[tuple] = []
_frame_seqs: dict[int, int] = {}  # a writer's encoded batches: id(frame) -> seq


def _record(*row: object) -> None:
    _rows.append(row)


def _dump(path: str) -> None:
    _record("cpu", *_thread_cpu())
    with open(path, "w") as f:
        json.dump(_rows, f)


#: A writer's CPU seconds in each of its stages, in the thread that ran it (``_trace_writer``).
_stage_cpu: dict[str, float] = {}


def _timed_stage(name: str, fn: Any) -> Any:
    """``fn`` (a plain function or method), adding its thread's CPU to ``_stage_cpu[name]``."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        cpu = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _stage_cpu[name] = _stage_cpu.get(name, 0.0) + time.thread_time() - cpu

    return wrapped


def _task_cpu(tid: int) -> tuple[float, float]:
    """User and system CPU seconds of this process's thread ``tid`` (a native thread id)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _thread_cpu() -> tuple[float, float]:
    """This process's CPU seconds (user + system) in all, and its main thread's (the event loop
    in the server; the rest is trio's worker threads: persistence, reads, and in a writer the
    transport's thread)."""
    times = os.times()
    fields = Path(f"/proc/self/task/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    main = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return times.user + times.system, main


def _trace_server() -> None:
    """Wrap the server's stages; the rows are written to ``$TRACE_OUT`` at exit."""
    from vdl_stream import broker as b
    from vdl_stream import codec
    from vdl_stream import server as s

    ingest = b.Broker.ingest
    started: list[float] = []

    async def traced_ingest(self, batch):  # type: ignore[no-untyped-def]
        t = time.time()
        if not started:
            started.append(t)
            _record("cpu0", *_thread_cpu(), t)  # CPU from the first batch on (not start-up)
        seq = await ingest(self, batch)
        # The event loop's CPU so far (thread_time: this is the loop's thread), for its CPU per
        # batch between the first batch and the last, start-up and shutdown left out.
        _record(
            "ingest",
            batch.writer,
            batch.seq,
            seq,
            t,
            time.time(),
            # Scalar points only: Batch.count() adds the events, and every writer's run gets
            # two (its status markers: running, then closed), which read as 2 points more
            # ingested than logged per writer.
            sum(len(c) for c in batch.scalars),
            time.thread_time(),
            len(batch.events),
        )
        return seq

    write = b.Broker._write

    wake = b.Broker._wake_waiters
    woken = [0]  # the broker's written seq at the last wake

    def traced_wake(self):  # type: ignore[no-untyped-def]
        # "written" when the waiters are woken, for every seq written since the last wake: a
        # round of the persist task, or a batch that ingest wrote itself (h4-persist).
        t = time.time()
        for seq in range(woken[0] + 1, self._written_seq + 1):
            _record("written", seq, t)
        woken[0] = max(woken[0], self._written_seq)
        wake(self)

    async def traced_write(self, items):  # type: ignore[no-untyped-def]
        await write(self, items)

    b.Broker._wake_waiters = traced_wake

    sync = b.Broker._sync_runs

    offer = b.Subscriber.offer

    def traced_offer(self, seq, *args):  # type: ignore[no-untyped-def]
        _record("offer", seq, time.time())
        before = getattr(self, "_written_at_offer", 0)
        offer(self, seq, *args)
        if getattr(self, "_written_at_offer", 0) > before:  # written by the fan-out (h12-loop)
            _record("at offer", seq)

    from recorder import compaction

    def timed(kind: str, fn):  # type: ignore[no-untyped-def]
        def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
            t, cpu = time.time(), time.thread_time()  # a call runs in one thread
            try:
                return fn(*args, **kwargs)
            finally:
                _record(kind, t, time.time(), time.thread_time() - cpu)

        return wrapped

    # Housekeeping in the persist thread, which batches written behind it wait for (compaction:
    # in a thread of its own since h2-compact, beside the persist thread).
    compaction.Compactor.run = timed("compact", compaction.Compactor.run)
    if hasattr(compaction.Compactor, "step"):  # one unit of deferred compaction (h-compact)
        compaction.Compactor.step = timed("compact", compaction.Compactor.step)
    b.Broker._rotate = timed("rotate", b.Broker._rotate)
    process = getattr(compaction, "CompactionProcess", None)
    if process is not None:  # a compaction process of its own (h3-compact): its CPU counts
        close = process.close

        def counted_close(self):  # type: ignore[no-untyped-def]
            close(self)
            _record("compaction process", self.cpu_seconds, self.units, self.restarts)

        process.close = counted_close
    if os.environ.get("LATENCY_WRITE_AT_OFFER"):  # --write-at-offer (h12-loop)
        s.WRITE_AT_OFFER = os.environ["LATENCY_WRITE_AT_OFFER"] == "on"
    if os.environ.get("LATENCY_INLINE_WRITE"):  # --inline-write (h4-persist)
        b.INLINE_WRITE_BYTES = int(os.environ["LATENCY_INLINE_WRITE"])
    if os.environ.get("LATENCY_NO_COMPACTION"):
        # --no-compaction: the ceiling of the live path with no compaction at all (the run is
        # left as written, in small records), to tell compaction's share of the tail.
        import recorder

        init = recorder.RunWriter.__init__

        def uncompacted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            kwargs["compact_records"] = None
            init(self, *args, **kwargs)

        recorder.RunWriter.__init__ = uncompacted
    persist = b.Broker._persist

    def traced_persist(self, items):  # type: ignore[no-untyped-def]
        t = time.time()
        try:
            return persist(self, items)
        finally:
            _record("persisted", [seq for seq, _, _ in items], t, time.time())

    b.Broker._persist = traced_persist

    take = b.Subscriber._take

    def traced_take(self, seq, run, frame):  # type: ignore[no-untyped-def]
        _record("taken", seq, time.time())
        return take(self, seq, run, frame)

    b.Subscriber._take = traced_take
    # The writers' answers: how many acks each send to a writer carried (h4-live sends the
    # answers due together in one send).
    encode_ack = codec.encode_ack
    acks: set[int] = set()

    def traced_encode_ack(writer, seq):  # type: ignore[no-untyped-def]
        frame = encode_ack(writer, seq)
        acks.add(id(frame))
        return frame

    def counted_sends(name: str) -> None:
        send = getattr(s.WebSocketSession, name)

        async def traced(self, data):  # type: ignore[no-untyped-def]
            messages = (data,) if name == "send" else data
            n = sum(id(m) in acks for m in messages)
            if n:
                acks.difference_update(id(m) for m in messages)
                _record("answers", n)
            return await send(self, data)

        setattr(s.WebSocketSession, name, traced)

    if hasattr(s, "WebSocketSession"):  # served below quart (h3-send)
        codec.encode_ack = traced_encode_ack
        counted_sends("send")
        counted_sends("send_many")
    b.Broker.ingest = traced_ingest
    b.Broker._write = traced_write
    b.Broker._sync_runs = timed("fsync", sync)
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
        _frame_seqs[id(frame)] = batch.seq  # the spool holds the frame until its ack
        return frame

    decode = codec.decode_message

    def traced_decode(data):  # type: ignore[no-untyped-def]
        message = decode(data)
        kind = message.get("type")
        if kind == "ack":
            _record("acked", message["writer"], message["seq"], time.time())
        elif kind == "taken":
            _record("took", message["writer"], message["seq"], time.time())
        return message

    w.Writer._take_pending = traced_take
    codec.encode_batch = transport.codec.encode_batch = traced_encode
    codec.decode_message = transport.codec.decode_message = traced_decode
    _trace_writer_cycle(w, transport)
    _trace_writer_cpu(w, codec)


def _trace_writer_cpu(w: Any, codec: Any) -> None:
    """Count the CPU of the writer's background stages that run without a checkpoint (so that
    no other task's work falls inside): the batch cut, msgpack, the WebSocket framing and
    masking (wsproto's ``send``), and the answers' parsing (wsproto) and decoding (msgpack)."""
    import wsproto

    w.Writer._take_columns = _timed_stage("cut: buffers -> columns", w.Writer._take_columns)
    codec.encode_batch = _timed_stage("encode_batch (msgpack)", codec.encode_batch)
    codec.decode_message = _timed_stage("answers: msgpack decode", codec.decode_message)
    send, receive = wsproto.WSConnection.send, wsproto.WSConnection.receive_data
    wsproto.WSConnection.send = _timed_stage("framing and masking (wsproto)", send)
    wsproto.WSConnection.receive_data = _timed_stage("answers: wsproto parse", receive)
    events = wsproto.WSConnection.events

    def timed_events(self):  # type: ignore[no-untyped-def]
        # A generator: only the steps into it are counted, not what trio-websocket does with
        # each event between them.
        parse = _timed_stage("answers: wsproto parse", next)
        it = events(self)
        while True:
            try:
                event = parse(it)
            except StopIteration:
                return
            yield event

    wsproto.WSConnection.events = timed_events


def _trace_writer_cycle(w: Any, transport: Any) -> None:
    """Stamp what the writer's background thread waits on between a call and the socket
    (h13-loop): a call that finds the link free asks the loop to wake the pump (``wake asked``,
    in the training thread) and the loop runs ``_kick`` (``kick``); a full window frees a place
    (``window``, when ``wait_window`` returns); the pump cuts the batch (``batch``); ``_deliver``
    hands it to the transport (``send``); the transport's send task starts writing it to the
    socket and is done (``sent``)."""
    attend, kick = w.Writer._attend, w.Writer._kick

    def traced_attend(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self._idle:
            _record("wake asked", time.time())
        return attend(self, *args, **kwargs)

    def traced_kick(self):  # type: ignore[no-untyped-def]
        _record("kick", time.time())
        return kick(self)

    w.Writer._attend, w.Writer._kick = traced_attend, traced_kick
    for cls in (transport.WebSocketTransport, transport.InProcessTransport):
        wait_window, send = cls.wait_window, cls.send

        async def traced_wait(self, window, _wait=wait_window):  # type: ignore[no-untyped-def]
            full = not self.has_room(window)
            await _wait(self, window)
            _record("window", time.time(), full)

        async def traced_send(self, batch, _send=send):  # type: ignore[no-untyped-def]
            _record("send", batch.seq, time.time())
            return await _send(self, batch)

        cls.wait_window, cls.send = traced_wait, traced_send
    from trio_websocket import WebSocketConnection

    send_message = WebSocketConnection.send_message

    async def traced_send_message(self, message):  # type: ignore[no-untyped-def]
        t = time.time()
        await send_message(self, message)
        seq = _frame_seqs.pop(id(message), None)
        if seq is not None:
            _record("sent", seq, t, time.time())

    WebSocketConnection.send_message = traced_send_message


#: Seconds the server may take to exit once told to (its shutdown closes the runs).
SERVER_EXIT_S = 180


def _serve_main(argv: list[str]) -> None:
    import atexit

    from vdl_stream import cli, codec

    _trace_server()
    atexit.register(_dump, os.environ["TRACE_OUT"])
    # ``frames`` messages (subscribers with --page): each is encoded by one browser's send task.
    encode_frames, built = codec.encode_frames, [0]

    def counted(frames):  # type: ignore[no-untyped-def]
        built[0] += 1
        return encode_frames(frames)

    codec.encode_frames = counted
    atexit.register(lambda: _record("frames", built[0]))  # runs before _dump
    sys.exit(cli.main(["serve", *argv]))


def _writer_main(url: str, run: str, rate: int, seconds: float, ntags: int, window: str) -> None:
    """A traced writer logging ``rate`` points a second for ``seconds``: to the server at ``url``,
    or with ``url`` ``in-process:LOGDIR``, to a broker of its own serving the dashboard
    (``attach(serve=True)``, the in-process transport), whose URL it prints before it waits
    for a line on stdin (the subscribers are ready) to start logging."""
    from broker_clients import log_paced

    from vdl_stream import attach

    in_process = url.startswith("in-process:")
    if in_process:
        _trace_server()  # the broker runs in this process's background loop
    _trace_writer()
    counts = os.environ.get("LATENCY_WINDOW_COUNTS")  # see --window-counts
    if counts is not None:
        from vdl_stream import transport

        transport.TAKEN = counts == "taken"
    tags = [f"train/metric{i}" for i in range(ntags)]
    # "default": whatever attach() defaults to (a tree without the option runs too)
    options = {} if window == "default" else {"window": int(window)}
    if in_process:
        logdir = url.removeprefix("in-process:")
        writer = attach(logdir, run=run, serve=True, port=0, telemetry=False, **options)
        print(f"dashboard at {writer.url}", flush=True)
        sys.stdin.readline()  # the subscribers are ready
    else:
        writer = attach(url=url, run=run, telemetry=False, **options)
    # The training thread (the hot path) and the writer's background thread, apart.
    threads = {"training": threading.get_native_id(), "background": writer._thread.native_id}
    _stage_cpu.clear()  # from the first call on, as the process's CPU
    _record("cpu0", *_thread_cpu(), time.time())
    _record("threads0", {k: _task_cpu(t) for k, t in threads.items()})
    add = writer.add_scalar
    image = os.environ.get("LATENCY_IMAGE")  # see --image
    if image is not None:
        size = int(image)
        pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)

        def add(tag: str, value: float, step: int) -> None:
            writer.add_image(tag, pixels, step)

    _record("calls", log_paced(add, tags, rate, seconds))
    writer.flush(timeout=60)
    # Read before close: the background thread ends with it.
    _record("threads", {k: _task_cpu(t) for k, t in threads.items()})
    _record("stage cpu", dict(_stage_cpu))
    writer.close(timeout=30)
    _record("end", time.time())
    _dump(os.environ["TRACE_OUT"])


# -- the driver ------------------------------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    a = np.asarray(values) * 1e3
    return (
        f"p50 {np.percentile(a, 50):8.2f}  p99 {np.percentile(a, 99):8.2f}  max {a.max():8.2f} ms"
    )


def _subscribers(
    ws_url: str,
    n: int,
    page: bool,
    started: Any,
    stop: Any,
    arrivals: list,
    cpu: list,
    deflate: bool = False,
) -> None:
    """Run ``n`` subscribers (set ``started`` once all subscribed) until ``stop`` is set; append
    ``(seq, arrival, oldest wall)`` per data frame to ``arrivals``, and this thread's CPU seconds
    from the start to ``cpu``. With ``deflate`` they offer permessage-deflate, as browsers do."""
    import trio
    from trio_websocket import _impl, open_websocket_url

    from vdl_stream import codec

    if deflate:  # trio-websocket offers no extension: its handshake request gets one here
        from wsproto.events import Request
        from wsproto.extensions import PerMessageDeflate

        _impl.Request = lambda **kw: Request(**kw, extensions=[PerMessageDeflate()])

    ask = {"type": "subscribe", "runs": _live_runs()}
    if page:
        ask |= {"split": True, "batch": True}

    async def one(ready: trio.Semaphore) -> None:
        async with open_websocket_url(ws_url + "/ws/live", max_message_size=64 << 20) as ws:
            await ws.send_message(codec.encode_message(ask))
            ready.release()
            while not stop.is_set():
                with trio.move_on_after(0.2):
                    data = await ws.get_message()
                    _arrivals_of(data, time.time(), arrivals)

    async def main() -> None:
        ready = trio.Semaphore(0)
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one, ready)
            for _ in range(n):
                await ready.acquire()
            cpu.append(time.thread_time())
            started.set()  # the writers may start

    trio.run(main)
    cpu.append(time.thread_time())


def _arrivals_of(data: bytes, now: float, arrivals: list) -> None:
    """Append ``(seq, now, oldest wall)`` for each ``data`` frame in one message (a ``frames``
    message holds several)."""
    from vdl_stream import codec

    message = codec.decode_message(data)
    messages = [message]
    if message["type"] == "frames":
        messages = [codec.decode_message(f) for f in message["frames"]]
    for m in messages:
        walls = [np.frombuffer(c[2], "<f8") for c in m.get("scalars", [])]
        if m["type"] == "data" and walls:
            arrivals.append((m["seq"], now, float(np.concatenate(walls).min())))


def _live_runs() -> list[str]:
    """The runs the subscribers follow: ``live``, or with ``--run-per-writer`` each writer's own
    (``LATENCY_RUNS``, set by the driver for its children)."""
    return os.environ.get("LATENCY_RUNS", "live").split(",")


def _subscriber_main(ws_url: str, out: str, page: bool, deflate: bool) -> None:
    """One subscriber in a process of its own, as a browser is: a blocking socket read by
    wsproto (no event loop, as a browser's network thread is native code), which prints
    ``ready`` once subscribed, stamps each message's arrival with ``time.time()`` (the wall
    clock every process on the machine shares, as the writer stamps its points) as soon as it
    is whole, decodes it, and stops when stdin closes; then it writes its arrivals and its CPU
    seconds (from subscribing to the stop) to ``out`` as JSON."""
    import socket
    from urllib.parse import urlsplit

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, BytesMessage, Ping, RejectConnection, Request
    from wsproto.extensions import PerMessageDeflate

    from vdl_stream import codec

    where = urlsplit(ws_url)
    sock = socket.create_connection((where.hostname, where.port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = WSConnection(ConnectionType.CLIENT)
    extensions = [PerMessageDeflate()] if deflate else []
    host = f"{where.hostname}:{where.port}"
    sock.sendall(conn.send(Request(host=host, target="/ws/live", extensions=extensions)))
    ask = {"type": "subscribe", "runs": _live_runs()}
    if page:
        ask |= {"split": True, "batch": True}
    arrivals: list[tuple[int, float, float]] = []
    parts: list[bytes] = []
    subscribed = False
    cpu0 = 0.0
    while True:
        readable, _, _ = select.select([sock, sys.stdin], [], [])
        if sys.stdin in readable:
            break  # the driver closed it: stop
        data = sock.recv(1 << 20)
        if not data:
            break
        conn.receive_data(data)
        for event in conn.events():
            if isinstance(event, AcceptConnection):
                sock.sendall(conn.send(BytesMessage(data=codec.encode_message(ask))))
                subscribed = True
                cpu0 = time.thread_time()
                print("ready", flush=True)
            elif isinstance(event, RejectConnection):
                raise SystemExit(f"/ws/live refused the subscriber: {event.status_code}")
            elif isinstance(event, Ping):
                sock.sendall(conn.send(event.response()))
            elif isinstance(event, BytesMessage):
                parts.append(event.data)
                if event.message_finished:
                    now = time.time()
                    _arrivals_of(b"".join(parts), now, arrivals)
                    parts.clear()
    cpu = [cpu0, time.thread_time()] if subscribed else []
    sock.close()
    Path(out).write_text(json.dumps({"arrivals": arrivals, "cpu": cpu}))


def _start_subscriber_processes(
    me: list[str], ws_url: str, tmp: Path, args: argparse.Namespace, env: dict[str, str]
) -> list[subprocess.Popen]:
    """Start ``args.subscribers`` subscriber processes (``_subscriber_main``) and wait until
    each has subscribed; their rows go to ``tmp/subscriber<i>.json`` when their stdin closes."""
    flags = [*(["--page"] if args.page else []), *(["--deflate"] if args.deflate else [])]
    subs = [
        subprocess.Popen(
            [*me, "--subscriber", ws_url, str(tmp / f"subscriber{i}.json"), *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        for i in range(args.subscribers)
    ]
    deadline = time.monotonic() + 60
    for sub in subs:
        ready, _, _ = select.select([sub.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready or not sub.stdout.readline().startswith(b"ready"):
            raise SystemExit("the subscriber processes did not subscribe within 60 s")
    return subs


def _stop_subscriber_processes(
    subs: list[subprocess.Popen], tmp: Path, arrivals: list, sub_cpu: list
) -> None:
    """Close the subscribers' stdin, wait for them, and gather their arrivals and CPU spans."""
    for sub in subs:
        sub.stdin.close()
    for i, sub in enumerate(subs):
        sub.wait(30)
        rows = json.loads((tmp / f"subscriber{i}.json").read_text())
        arrivals.extend(tuple(r) for r in rows["arrivals"])
        if len(rows["cpu"]) == 2:
            sub_cpu.append(tuple(rows["cpu"]))


def persist_only(points: int, rate: int, seconds: float, ntags: int) -> dict[str, float]:
    """The broker's persistence alone, in this process (no sockets, no subscribers): batches of
    ``points`` points over ``ntags`` tags at ``rate`` points/s, each ingested once the previous one
    is written; print ``ingest -> written`` and the persist thread's housekeeping, and return the
    figures in ms. What it shows does not depend on the machine's load the way the socket
    stages do: the compaction time is CPU the persist thread spends while writes wait."""
    import trio

    from vdl_stream.broker import Broker
    from vdl_stream.codec import Batch, ScalarColumns

    _trace_server()
    _rows.clear()
    tags = [f"train/metric{i}" for i in range(ntags)]
    per_tag = max(1, points // ntags)
    waits: list[float] = []
    brokers: list[Broker] = []

    async def run(logdir: str) -> None:
        broker = Broker(logdir)
        brokers.append(broker)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            t0, seq = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                seq += 1
                steps = np.arange((seq - 1) * per_tag, seq * per_tag, dtype=np.int64)
                walls, values = np.full(per_tag, time.time()), steps.astype(np.float64)
                columns = [ScalarColumns(t, steps, walls, values) for t in tags]
                begin = time.perf_counter()
                await broker.wait_written(await broker.ingest(Batch("w", seq, "live", columns)))
                waits.append(time.perf_counter() - begin)
                await trio.sleep(max(0.0, t0 + seq * per_tag * ntags / rate - time.perf_counter()))
            broker.close()

    with tempfile.TemporaryDirectory(prefix="vdl-persist-") as logdir:
        cpu0 = time.process_time()
        trio.run(run, logdir)
        process_cpu = time.process_time() - cpu0
    stages = {
        "ingest -> written": waits,
        "  persist thread": [r[3] - r[2] for r in _rows if r[0] == "persisted"],
    }
    for name, kind in (("fsync", "fsync"), ("compaction", "compact"), ("rotation", "rotate")):
        stages[name] = [r[2] - r[1] for r in _rows if r[0] == kind]
    done = len(waits) * per_tag * ntags
    print(
        f"persistence alone: {len(waits)} batches of {per_tag * ntags:,} points in {seconds:g} s "
        f"({done / seconds:,.0f} points/s of {rate:,} asked); load "
        f"{Path('/proc/loadavg').read_text().split()[0]}"
    )
    for name, values in stages.items():
        total = f"  total {sum(values) * 1e3:7.0f} ms" if values else ""
        print(f"  {name:28s} n={len(values):7d}  {_ms(values)}{total}")
    compaction_cpu = sum(r[3] for r in _rows if r[0] == "compact")
    # A compaction process of its own (h3-compact): its CPU, start-up included, counts in both.
    child = getattr(brokers[0], "_compaction_process", None) if brokers else None
    child_cpu = 0.0 if child is None else child.cpu_seconds
    if child is not None:
        print(
            f"  compaction process: {child.units} blocks built, {child_cpu:.2f} s CPU,"
            f" {child.restarts} restarts"
        )
    total = process_cpu + child_cpu
    compaction_cpu += child_cpu
    print(
        f"  compaction CPU {compaction_cpu:.2f} s (its process's included) of {total:.2f} s"
        f" ({compaction_cpu / total:.1%}; this process {process_cpu:.2f} s) in {seconds:g} s"
    )
    return {
        f"{name} {q}": float(np.percentile(v, q) * 1e3)
        for name, v in stages.items()
        if v
        for q in (50, 99, 100)
    }


def ingest_only(subscribers: int, batches: int, ntags: int) -> dict[str, float]:
    """``Broker.ingest`` alone, in this process: ``batches`` batches of 3 points per tag (the
    size a 10,000 events/s writer sends), fanned out to ``subscribers`` queues drained between
    batches; print and return the wall time of one ingest in microseconds (median, mean)."""
    import trio

    from vdl_stream.broker import Broker
    from vdl_stream.codec import Batch, ScalarColumns

    tags = [f"train/metric{i}" for i in range(ntags)]
    took: list[float] = []

    async def run(logdir: str) -> None:
        broker = Broker(logdir)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            subs = [broker.subscribe(None, None) for _ in range(subscribers)]
            for seq in range(1, batches + 1):
                steps = np.arange(3 * seq, 3 * seq + 3, dtype=np.int64)
                walls, values = np.full(3, time.time()), steps.astype(np.float64)
                batch = Batch(
                    "w", seq, "live", [ScalarColumns(t, steps, walls, values) for t in tags]
                )
                begin = time.perf_counter()
                written = await broker.ingest(batch)
                took.append(time.perf_counter() - begin)
                for sub in subs:
                    while True:
                        try:
                            sub.receive_nowait()
                        except trio.WouldBlock:
                            break
                await broker.wait_written(written)
            broker.close()

    with tempfile.TemporaryDirectory(prefix="vdl-ingest-") as logdir:
        trio.run(run, logdir)
    a = np.asarray(took[100:]) * 1e6  # the first hundred warm up
    print(
        f"Broker.ingest with {subscribers} subscribers, {len(a)} batches of {3 * ntags} points: "
        f"median {np.median(a):.1f} us, mean {a.mean():.1f} us; load "
        f"{Path('/proc/loadavg').read_text().split()[0]}"
    )
    return {"median_us": float(np.median(a)), "mean_us": float(a.mean())}


_FANOUT_CHILD = r"""
import sys, trio
from trio_websocket import open_websocket_url
from vdl_stream import codec

async def one(url, ready):
    async with open_websocket_url(url, max_message_size=64 << 20) as ws:
        await ws.send_message(codec.encode_message({"type": "subscribe", "runs": ["live"]}))
        while codec.decode_message(await ws.get_message())["type"] != "synced":
            pass
        ready.release()
        while True:
            await ws.get_message()

async def main():
    ready = trio.Semaphore(0)
    async with trio.open_nursery() as nursery:
        for _ in range(int(sys.argv[2])):
            nursery.start_soon(one, sys.argv[1], ready)
        for _ in range(int(sys.argv[2])):
            await ready.acquire()
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes it
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def fanout_only(subscribers: int, batches: int, ntags: int) -> dict[str, float]:
    """The event loop's CPU a batch for the fan-out to ``subscribers`` browsers and their
    WebSocket sends: a broker and its web server in this process, the subscribers (raw
    ``/ws/live`` clients) in a child process, ``batches`` batches of 3 points per tag ingested
    in process at 200 a second. No writer, no socket on the way in: what the live path's send
    side costs the server, measured as the loop thread's CPU (which the machine's load changes
    far less than wall times). Print and return it in microseconds."""
    from functools import partial

    import trio

    import vdl_stream
    from vdl_stream import server
    from vdl_stream.broker import Broker
    from vdl_stream.codec import Batch, ScalarColumns
    from vdl_stream.server import serve_dashboard

    if os.environ.get("LATENCY_WRITE_AT_OFFER"):  # --write-at-offer (h12-loop)
        server.WRITE_AT_OFFER = os.environ["LATENCY_WRITE_AT_OFFER"] == "on"
    tags = [f"train/metric{i}" for i in range(ntags)]
    tree = str(Path(vdl_stream.__file__).resolve().parent.parent)  # the child imports the same
    result: dict[str, float] = {}

    async def run(logdir: str) -> None:
        broker = Broker(logdir)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            url = await nursery.start(partial(serve_dashboard, broker, "127.0.0.1", 0))
            live = "ws" + url.removeprefix("http").split("/?")[0].rstrip("/") + "/ws/live"
            child = subprocess.Popen(  # noqa: ASYNC220 (a start, before anything is measured)
                [sys.executable, "-c", _FANOUT_CHILD, live, str(subscribers)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": tree},
            )
            try:
                with trio.fail_after(60):
                    line = await trio.to_thread.run_sync(child.stdout.readline)
                if not line.startswith(b"ready"):
                    raise SystemExit(f"the subscribers did not subscribe: {line!r}")
                cpu0, t0 = time.thread_time(), trio.current_time()
                for seq in range(1, batches + 1):
                    steps = np.arange(3 * seq, 3 * seq + 3, dtype=np.int64)
                    walls, values = np.full(3, time.time()), steps * 0.5
                    columns = [ScalarColumns(t, steps, walls, values) for t in tags]
                    await broker.ingest(Batch("w", seq, "live", columns))
                    await trio.sleep_until(t0 + seq / 200)
                await trio.sleep(0.2)  # the last sends
                result["loop us a batch"] = (time.thread_time() - cpu0) / batches * 1e6
            finally:
                child.stdin.close()
                child.wait(10)
            broker.close()
            nursery.cancel_scope.cancel()

    with tempfile.TemporaryDirectory(prefix="vdl-fanout-") as logdir:
        trio.run(run, logdir)
    print(
        f"fan-out and sends to {subscribers} subscribers: {result['loop us a batch']:.0f} us of "
        f"event-loop CPU a batch ({batches} batches of {ntags} x 3 points, 200/s); load "
        f"{Path('/proc/loadavg').read_text().split()[0]}"
    )
    return result


def frame_costs(ntags: int, frames: int = 100) -> dict[str, float]:
    """What one ``data`` frame costs per browser in permessage-deflate (the fastest of 5 rounds), as the server compresses
    (zlib level 1, each browser's own compressor keeping its context), against compressing it
    once with a fresh compressor per message (``server_no_context_takeover``: the same bytes for
    every browser): frames of 3, 300 and 6,500 points per tag (about what a batch holds at 10k,
    300k and 1M events/s), values random (float64 mantissas compress little, as a loss's do)."""
    import zlib

    from vdl_stream import codec
    from vdl_stream.codec import ScalarColumns

    rng = np.random.default_rng(0)
    tags = [f"train/metric{i}" for i in range(ntags)]
    figures: dict[str, float] = {}
    for points in (3, 300, 6500):
        built = []
        for seq in range(frames):
            steps = np.arange(seq * points, (seq + 1) * points, dtype=np.int64)
            walls = np.full(points, 1.8e9 + seq * 0.003)
            cols = [ScalarColumns(t, steps, walls, rng.random(points)) for t in tags]
            built.append(codec.encode_live("data", seq + 1, "live", cols, []))
        sizes, times = {}, {}
        for name, fresh in (("kept context", False), ("fresh per message", True)):
            best = math.inf  # the fastest of 5 rounds: the machine's load only adds
            for _ in range(5):
                compressor = zlib.compressobj(1, zlib.DEFLATED, -15)
                total, begin = 0, time.perf_counter()
                for frame in built:
                    if fresh:
                        compressor = zlib.compressobj(1, zlib.DEFLATED, -15)
                    out = compressor.compress(frame) + compressor.flush(zlib.Z_SYNC_FLUSH)
                    total += len(out) - 4
                best = min(best, time.perf_counter() - begin)
            times[name] = best / frames * 1e6
            sizes[name] = total / frames
        size = sum(map(len, built)) / frames
        print(
            f"  {points:5d} points a tag: frame {size:10,.0f} B; deflate per browser, context kept "
            f"{sizes['kept context']:9,.0f} B in {times['kept context']:8.1f} us; once, fresh "
            f"{sizes['fresh per message']:9,.0f} B in {times['fresh per message']:8.1f} us"
        )
        figures |= {f"{points} {k} us": v for k, v in times.items()}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000, help="events/s in all")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--page", action="store_true", help="subscribe as the page does (batch)")
    parser.add_argument(
        "--deflate", action="store_true", help="subscribers offer permessage-deflate (as browsers)"
    )
    parser.add_argument(
        "--window", type=int, help="the writers' in-flight window (default: attach's default)"
    )
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (rows, log directory)"
    )
    parser.add_argument(
        "--persist-only",
        type=int,
        metavar="POINTS",
        help="only the broker's persistence, in process: batches of POINTS points at --rate",
    )
    parser.add_argument(
        "--ingest-only",
        type=int,
        metavar="BATCHES",
        help="only Broker.ingest, in process: BATCHES small batches to --subscribers queues",
    )
    parser.add_argument(
        "--fanout-only",
        type=int,
        metavar="BATCHES",
        help="only the fan-out and WebSocket sends, in process: event-loop CPU a batch",
    )
    parser.add_argument(
        "--frame-costs",
        action="store_true",
        help="only what permessage-deflate costs per browser for frames of three sizes",
    )
    parser.add_argument(
        "--no-compaction",
        action="store_true",
        help="the broker's run writers never compact (the ceiling without compaction)",
    )
    parser.add_argument(
        "--inline-write",
        type=int,
        metavar="BYTES",
        help="the broker's INLINE_WRITE_BYTES: ingest writes batches up to this size itself",
    )
    parser.add_argument(
        "--write-at-offer",
        choices=("on", "off"),
        help="the server's WRITE_AT_OFFER: a frame for an idle subscriber written by the "
        "fan-out itself (default: as the server has it)",
    )
    parser.add_argument(
        "--window-counts",
        choices=("taken", "written"),
        help="what the writers' window counts: batches not yet taken by the broker or not yet "
        "written (acknowledged); default: transport.TAKEN",
    )
    parser.add_argument(
        "--image",
        type=int,
        metavar="SIZE",
        help="each call logs a SIZE x SIZE RGB image (add_image: random uint8, a PNG of about"
        " 3 x SIZE^2 bytes) instead of a scalar; --rate is then images/s. For the writers' CPU"
        " per image (the stages' rows follow scalar points, and read n/a)",
    )
    parser.add_argument(
        "--run-per-writer",
        action="store_true",
        help="each writer logs a run of its own (live-0, live-1, ...: separate jobs, or ranks "
        "each with its own run), not all into one run with steps that interleave",
    )
    parser.add_argument(
        "--subscribers-in-process",
        action="store_true",
        help="run the subscribers as trio tasks of one thread in this process (the mode before "
        "h13-loop), not one process each as browsers are",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="one writer whose own broker serves the subscribers (attach(serve=True): the "
        "in-process transport), no vdl-stream serve",
    )
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--subscriber", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--writer", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.no_compaction:  # read by _trace_server, here and in the server's process
        os.environ["LATENCY_NO_COMPACTION"] = "1"
    if args.inline_write is not None:  # read by _trace_server, here and in the server's process
        os.environ["LATENCY_INLINE_WRITE"] = str(args.inline_write)
    if args.write_at_offer is not None:  # read by _trace_server, here and in the server's
        os.environ["LATENCY_WRITE_AT_OFFER"] = args.write_at_offer
    if args.window_counts is not None:  # read by the writers' processes
        os.environ["LATENCY_WINDOW_COUNTS"] = args.window_counts
    if args.image is not None:  # read by the writers' processes
        os.environ["LATENCY_IMAGE"] = str(args.image)
    if args.serve is not None:
        return _serve_main(args.serve)
    if args.subscriber is not None:
        return _subscriber_main(*args.subscriber, args.page, args.deflate)
    if args.writer is not None:
        url, run, rate, seconds, ntags, window = args.writer
        return _writer_main(url, run, int(rate), float(seconds), int(ntags), window)
    if args.frame_costs:
        print(f"permessage-deflate of one data frame ({args.tags} tags), zlib level 1:")
        figures = frame_costs(args.tags)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        return None
    if args.fanout_only is not None:
        figures = fanout_only(args.subscribers, args.fanout_only, args.tags)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        return None
    if args.ingest_only is not None:
        figures = ingest_only(args.subscribers, args.ingest_only, args.tags)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        return None
    if args.persist_only is not None:
        figures = persist_only(args.persist_only, args.rate, args.seconds, args.tags)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        return None

    tmp = Path(tempfile.mkdtemp(prefix="vdl-stages-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    if args.run_per_writer:
        runs = [f"live-{i}" for i in range(args.writers)]
        env["LATENCY_RUNS"] = os.environ["LATENCY_RUNS"] = ",".join(runs)
    me = [sys.executable, str(Path(__file__).resolve())]
    procs: list[subprocess.Popen] = []
    arrivals: list[tuple[int, float, float]] = []
    sub_cpu: list[tuple[float, float]] = []  # each subscriber process's (or the thread's) CPU span
    subs: list[subprocess.Popen] = []
    if args.in_process and args.writers != 1:
        raise SystemExit("--in-process runs one writer (its broker serves the subscribers)")
    try:
        with open(tmp / "serve.err", "wb") as err:
            if args.in_process:  # the writer's own broker serves: the writer is the server
                window = "default" if args.window is None else str(args.window)
                where = f"in-process:{tmp / 'logs'}"
                argv = ["--writer", where, "live", str(args.rate), str(args.seconds)]
                server = subprocess.Popen(
                    [*me, *argv, str(args.tags), window],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env={**env, "TRACE_OUT": str(tmp / "writer0.json")},
                )
            else:
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
        thread_cpu: list[float] = []
        thread = threading.Thread(
            target=_subscribers,
            args=(
                ws_url,
                args.subscribers,
                args.page,
                started,
                stop,
                arrivals,
                thread_cpu,
                args.deflate,
            ),
        )
        if args.subscribers_in_process:
            thread.start()
            if not started.wait(30):
                raise SystemExit("the subscribers did not subscribe within 30 s")
        else:
            subs = _start_subscriber_processes(me, ws_url, tmp, args, env)
        rate = str(args.rate // args.writers)
        if args.in_process:
            server.stdin.write(b"go\n")
            server.stdin.flush()
        for i in range(0 if args.in_process else args.writers):
            procs.append(
                subprocess.Popen(
                    [
                        *me,
                        "--writer",
                        ws_url,
                        f"live-{i}" if args.run_per_writer else "live",
                        rate,
                        str(args.seconds),
                        str(args.tags),
                        "default" if args.window is None else str(args.window),
                    ],
                    env={**env, "TRACE_OUT": str(tmp / f"writer{i}.json")},
                )
            )
        for proc in procs[0 if args.in_process else 1 :]:
            proc.wait(args.seconds + 120)
        time.sleep(1.0)  # the last frames in flight
        if args.subscribers_in_process:
            stop.set()
            thread.join(30)
            if len(thread_cpu) == 2:
                sub_cpu.append((thread_cpu[0], thread_cpu[1]))
        else:
            _stop_subscriber_processes(subs, tmp, arrivals, sub_cpu)
        if args.in_process:
            # The server's rows are the writer's own: its CPU rows stay the writer's.
            rows = json.loads((tmp / "writer0.json").read_text())
            server_rows = [r for r in rows if r[0] not in ("cpu0", "cpu")]
            (tmp / "server.json").write_text(json.dumps(server_rows))
        else:
            server.terminate()
            # Its shutdown closes the runs, and a run's close finishes its compaction and writes
            # its preview: for four writers' run at 50k-150k events/s under load ~10 that took
            # minutes (docs/performance.md, h14-million, "What is left").
            server.wait(SERVER_EXIT_S)
    finally:
        for proc in [*procs, *subs]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    try:
        report(tmp, args, arrivals, sub_cpu)
    finally:
        if args.keep:
            print(f"kept: {tmp} (the processes' rows, the run's log directory)")
        else:  # the log directory of a 1M events/s run is about 100 MB
            shutil.rmtree(tmp, ignore_errors=True)


def report(
    tmp: Path,
    args: argparse.Namespace,
    arrivals: list[tuple[int, float, float]],
    sub_cpu: list[tuple[float, float]],
) -> None:
    """Match the processes' rows and print one line per stage."""
    server = json.loads((tmp / "server.json").read_text())
    writers = [json.loads((tmp / f"writer{i}.json").read_text()) for i in range(args.writers)]
    ingest = {(r[1], r[2]): r for r in server if r[0] == "ingest"}
    written = {r[1]: r[2] for r in server if r[0] == "written"}
    persisted = {seq: (r[2], r[3]) for r in server if r[0] == "persisted" for seq in r[1]}
    offered: dict[int, float] = {}
    taken: dict[int, list[float]] = {}
    for r in server:
        if r[0] == "offer":
            offered.setdefault(r[1], r[2])
        elif r[0] == "taken":
            taken.setdefault(r[1], []).append(r[2])
    start = min((r[4] for r in ingest.values()), default=0.0) + 1.0  # the first second left out
    stages: dict[str, list[float]] = {
        k: []
        for k in (
            "call -> batch",
            "  link free: call -> wake asked",
            "  link free: wake asked -> kick",
            "  link free: kick -> batch",
            "  window full: call -> freed",
            "  window full: freed -> batch",
            "  points waiting: call -> batch",
            "  timer: call -> batch",
            "batch -> encoded",
            "  batch -> send",
            "  send -> encoded",
            "encoded -> ingest",
            "batch -> ingest (in process)",
            "  encoded -> socket write",
            "  socket write",
            "ingest",
            "ingest -> written",
            "  ingest -> persist thread",
            "  persist thread",
            "  thread -> written",
            "written -> ack at writer",
            "ingest -> taken at writer",
            "offer -> taken to send",
            "offer -> subscriber",
            "add_scalar -> subscriber",
            "offer -> first subscriber",
            "add_scalar -> first subscriber",
            "fsync",
            "compaction",
            "segment rotation",
        )
    }
    cycle_paths = {"link free": 0, "window full": 0, "points waiting": 0, "timer": 0}
    for rows in writers:
        _writer_cycle(rows, ingest, start, stages, cycle_paths)
        encoded = {(r[1], r[2]): r[3] for r in rows if r[0] == "encoded"}
        acked = {(r[1], r[2]): r[3] for r in rows if r[0] == "acked"}
        took = {(r[1], r[2]): r[3] for r in rows if r[0] == "took"}
        for r in rows:
            if r[0] != "batch":
                continue
            key, oldest, cut = (r[1], r[2]), r[3], r[4]
            got = ingest.get(key)
            if got is None or got[4] < start:
                continue
            stages["call -> batch"].append(cut - oldest)
            if key in encoded:
                stages["batch -> encoded"].append(encoded[key] - cut)
                stages["encoded -> ingest"].append(got[4] - encoded[key])
            else:  # in process: no socket between the pump and the broker
                stages["batch -> ingest (in process)"].append(got[4] - cut)
            stages["ingest"].append(got[5] - got[4])
            if key in took:
                stages["ingest -> taken at writer"].append(took[key] - got[5])
            if got[3] in written:
                stages["ingest -> written"].append(written[got[3]] - got[5])
                if got[3] in persisted:
                    begin, end = persisted[got[3]]
                    stages["  ingest -> persist thread"].append(begin - got[5])
                    stages["  persist thread"].append(end - begin)
                    stages["  thread -> written"].append(written[got[3]] - end)
                if key in acked:
                    stages["written -> ack at writer"].append(acked[key] - written[got[3]])
    for seq, times in taken.items():
        if seq in offered and offered[seq] >= start:
            stages["offer -> taken to send"].extend(t - offered[seq] for t in times)
    # Each subscriber is a process of its own, as a browser is (by default): an arrival waits
    # for its own decoding and for the cores, which ten processes share. With
    # --subscribers-in-process they are one thread reading their sockets one after another, so
    # the tenth arrival of a frame includes nine decodes before it, and the first arrival of
    # each frame is the nearest that mode comes to a browser.
    first: dict[int, tuple[float, float]] = {}
    for seq, now, oldest in arrivals:
        if now >= start:
            if seq in offered:
                stages["offer -> subscriber"].append(now - offered[seq])
            stages["add_scalar -> subscriber"].append(now - oldest)
            if seq not in first or now < first[seq][0]:
                first[seq] = (now, oldest)
    for seq, (now, oldest) in first.items():
        if seq in offered:
            stages["offer -> first subscriber"].append(now - offered[seq])
        stages["add_scalar -> first subscriber"].append(now - oldest)
    housekeeping = {"fsync": "fsync", "compaction": "compact", "segment rotation": "rotate"}
    for name, kind in housekeeping.items():
        stages[name] = [r[2] - r[1] for r in server if r[0] == kind]
    # The slowest 1% of "ingest -> written": how many were written behind housekeeping.
    spans = [(r[1], r[2]) for r in server if r[0] in housekeeping.values()]
    slow = sorted(
        ((written[r[3]] - r[5], r[5], written[r[3]]) for r in ingest.values() if r[3] in written),
        reverse=True,
    )[: max(1, len(ingest) // 100)]
    behind = sum(any(a < w and b > i for a, b in spans) for _, i, w in slow)
    calls = sum(r[1] for rows in writers for r in rows if r[0] == "calls")
    points = sum(r[6] for r in ingest.values())
    from vdl_stream.alerts import ALERTS_WRITER

    # Events: each writer's run status markers (running, closed), and the alerts the server's
    # detectors raise (batches of their own, ingested like a writer's).
    events = sum(r[8] for r in ingest.values() if len(r) > 8 and r[1] != ALERTS_WRITER)
    alerts = sum(r[8] for r in ingest.values() if len(r) > 8 and r[1] == ALERTS_WRITER)
    load = Path("/proc/loadavg").read_text().split()[0]
    print(
        f"add_scalar -> /ws/live by stage: {args.rate:,} events/s from {args.writers} writer(s)"
        f"{' (in process, its own broker serving)' if args.in_process else ''}, "
        f"{args.subscribers} subscribers ({_how(args)}){' (as the page)' if args.page else ''}"
        f"{' (deflate)' if args.deflate else ''}"
        f"{'' if args.window is None else f', window {args.window}'}"
        f"{'' if args.window_counts is None else f' counting {args.window_counts}'}; load {load}"
    )
    for name, values in stages.items():
        print(f"  {name:28s} n={len(values):7d}  {_ms(values)}")
    print(
        "  the writers' batches cut: "
        + ", ".join(f"{n:,} {path}" for path, n in cycle_paths.items())
        + " (link free: a call woke the pump; window full: an answer freed a place; points"
        " waiting: the window had room when the last batch was sent, and calls came meanwhile;"
        " timer: the flush interval)"
    )
    frames = next((r for r in server if r[0] == "frames"), None)
    if frames is not None and frames[1]:
        print(f"  frames messages encoded: {frames[1]:,}")
    print(
        f"  the slowest 1% of ingest -> written: {behind} of {len(slow)} waited for housekeeping"
        f" (fsync, compaction, rotation); points ingested {points:,} of {calls:,} logged"
        f" (and {events:,} status markers, {alerts:,} alerts)"
    )
    at_offer = sum(r[0] == "at offer" for r in server)
    offers = sum(r[0] == "offer" for r in server)
    print(f"  frames written at offer: {at_offer:,} of {offers:,} offered (the rest queued)")
    answers = [r[1] for r in server if r[0] == "answers"]
    if answers:
        print(
            f"  writers' acks: {sum(answers):,} in {len(answers):,} sends"
            f" ({sum(n > 1 for n in answers):,} sends of two or more)"
        )
    for row in (r for r in server if r[0] == "compaction process"):
        print(
            f"  compaction process: {row[2]} blocks built, {row[1]:.2f} s of CPU (start-up"
            f" included), {row[3]} restarts"
        )
    per_frame = None
    if sub_cpu and arrivals:
        per_frame = sum(end - begin for begin, end in sub_cpu) / len(arrivals) * 1e6
        print(f"  subscribers' CPU a data frame received: {per_frame:6.0f} us ({_how(args)})")
    _writer_split(writers, calls)
    cpu = _cpu_shares(server, writers, sub_cpu, _how(args))
    wall = cpu.pop("wall")
    print(f"CPU in cores over the writers' {wall:.1f} s ({os.cpu_count()} cores here):")
    for name, cores in cpu.items():
        print(f"  {name:28s} {cores:5.2f}")
    # The server's event-loop CPU per batch: what the machine's load changes least (the stages
    # above are wall times, which other processes on the cores stretch).
    loop = sorted(r[7] for r in ingest.values())
    per_batch = (loop[-1] - loop[0]) / max(1, len(loop) - 1) * 1e6 if loop else 0.0
    print(f"  server: event loop per batch {per_batch:6.0f} us of CPU over {len(loop):,} batches")
    # More, smaller batches cost the server per batch: the rate says how many it was sent.
    rate = len(loop) / wall if loop else 0.0
    print(f"  batches a second: {rate:6.0f} over the writers' {wall:.1f} s")
    if args.json:
        figures = {
            k: {q: float(np.percentile(v, q) * 1e3) for q in (50, 99)}
            for k, v in stages.items()
            if v
        }
        figures_all = {
            "load": load,
            "stages": figures,
            "cpu": cpu,
            "loop_us_per_batch": per_batch,
            "batches_per_s": rate,
            "subscriber_us_per_frame": per_frame,
            "subscribers": _how(args),
            "cycle_paths": cycle_paths,
            "acks": [sum(answers), len(answers)],
            "written_at_offer": [at_offer, offers],
            "behind": [behind, len(slow)],
        }
        Path(args.json).write_text(json.dumps(figures_all, indent=1))


def _writer_cycle(
    rows: list, ingest: dict, start: float, stages: dict[str, list[float]], paths: dict[str, int]
) -> None:
    """Split one writer's ``call -> batch`` and ``batch -> encoded`` by what each batch waited
    on (the rows of ``_trace_writer_cycle``): a batch cut after a ``kick`` went because a call
    found the link free, one after a full window's ``window`` row because an answer freed a
    place, one after a ``window`` row with room at once because calls came while the last batch
    was handed over, any other by the flush interval's timer."""
    events = sorted(
        (r[1], r[0] if r[0] != "window" or r[2] else "room")
        for r in rows
        if r[0] in ("wake asked", "kick", "window")
    )  # (time, kind): the training thread's and the loop's stamps of one process
    sends = {r[1]: r[2] for r in rows if r[0] == "send"}
    encoded = {r[2]: r[3] for r in rows if r[0] == "encoded"}
    sent = {r[1]: (r[2], r[3]) for r in rows if r[0] == "sent"}
    batches = sorted((r[4], r[2], r[3], r[1]) for r in rows if r[0] == "batch")
    i, previous = 0, 0.0
    for cut, seq, oldest, writer in batches:
        asked = kick = freed = room = None
        while i < len(events) and events[i][0] <= cut:
            t, kind = events[i]
            if t > previous:
                if kind == "wake asked":
                    asked = t
                elif kind == "kick":
                    kick = t
                elif kind == "room":
                    room = t
                else:
                    freed = t
            i += 1
        previous = cut
        got = ingest.get((writer, seq))
        if got is None or got[4] < start:
            continue
        if kick is not None and (freed is None or kick > freed):
            paths["link free"] += 1
            if asked is not None:
                stages["  link free: call -> wake asked"].append(asked - oldest)
                stages["  link free: wake asked -> kick"].append(kick - asked)
            stages["  link free: kick -> batch"].append(cut - kick)
        elif freed is not None:
            paths["window full"] += 1
            stages["  window full: call -> freed"].append(max(0.0, freed - oldest))
            stages["  window full: freed -> batch"].append(cut - max(freed, oldest))
        elif room is not None:
            paths["points waiting"] += 1
            stages["  points waiting: call -> batch"].append(cut - oldest)
        else:
            paths["timer"] += 1
            stages["  timer: call -> batch"].append(cut - oldest)
        if seq in sends:
            stages["  batch -> send"].append(sends[seq] - cut)
            if seq in encoded:
                stages["  send -> encoded"].append(encoded[seq] - sends[seq])
        if seq in sent and seq in encoded:
            stages["  encoded -> socket write"].append(sent[seq][0] - encoded[seq])
            stages["  socket write"].append(sent[seq][1] - sent[seq][0])


def _how(args: argparse.Namespace) -> str:
    """How the subscribers ran, for the report's lines."""
    return "one process" if args.subscribers_in_process else f"{args.subscribers} processes"


def _writer_split(writers: list[list], calls: int) -> None:
    """Print the writers' CPU a call in us (s per M calls), all writers together: the whole
    process (from its first call through its close), and from the first call through its last
    flush split by thread (user / system) and by the background thread's stages."""

    def row(rows: list, kind: str) -> list | None:
        return next((r for r in rows if r[0] == kind), None)

    if not calls or any(row(w, "threads") is None for w in writers):
        return  # --in-process, or a writer that did not get that far
    per_m = 1e6 / calls
    whole = sum(row(w, "cpu")[1] - row(w, "cpu0")[1] for w in writers)  # type: ignore[index]
    threads: dict[str, list[float]] = {}
    for w in writers:
        before, after = row(w, "threads0")[1], row(w, "threads")[1]  # type: ignore[index]
        for name, (user, system) in after.items():
            got = threads.setdefault(name, [0.0, 0.0])
            got[0] += user - before[name][0]
            got[1] += system - before[name][1]
    stages: dict[str, float] = {}
    for w in writers:
        for name, seconds in row(w, "stage cpu")[1].items():  # type: ignore[index]
            stages[name] = stages.get(name, 0.0) + seconds
    print(
        f"writers' CPU a call: {whole * per_m:.3f} us (s per M calls) through close; through"
        " the last flush (the threads' in ticks of 10 ms):"
    )
    for name, (user, system) in threads.items():
        print(
            f"  {name + ' thread':28s} {(user + system) * per_m:8.3f} us"
            f" (user {user * per_m:.3f}, system {system * per_m:.3f})"
        )
    background = sum(threads.get("background", (0.0, 0.0)))
    for name, seconds in stages.items():
        print(f"    {name:32s} {seconds * per_m:8.3f} us")
    rest = background - sum(stages.values())
    print(f"    {'the rest (pump, trio, sockets)':32s} {rest * per_m:8.3f} us")


def _cpu_shares(
    server: list, writers: list[list], sub_cpu: list[tuple[float, float]], how: str
) -> dict[str, float]:
    """CPU of each process (and of the server's event loop and threads) in cores: CPU seconds
    per wall second of the writers' span (from their first call to their close). The server's
    counts from its first batch to its exit, the subscribers' from subscribing to their stop
    (both a second or so longer, mostly idle)."""

    def row(rows: list, kind: str) -> list:
        return next((r for r in rows if r[0] == kind), [kind, 0.0, 0.0, 0.0])

    begin = min(row(w, "cpu0")[3] for w in writers)
    wall = max(max(row(w, "end")[1] for w in writers) - begin, 1e-9)
    s0, s1 = row(server, "cpu0"), row(server, "cpu")
    loop = (s1[2] - s0[2]) / wall
    shares = {"wall": wall, "server: event loop": loop}
    shares["server: threads (persist)"] = (s1[1] - s0[1]) / wall - loop
    for i, rows in enumerate(writers):
        w0, w1 = row(rows, "cpu0"), row(rows, "cpu")
        shares[f"writer {i}"] = (w1[1] - w0[1]) / wall
    if sub_cpu:
        shares[f"subscribers ({how})"] = sum(end - begin for begin, end in sub_cpu) / wall
    shares["all"] = sum(v for k, v in shares.items() if k != "wall")
    if not any(r[0] == "cpu" for r in server):  # --in-process: the server is the writer
        del shares["server: event loop"], shares["server: threads (persist)"]
        return shares
    server_cpu = s1[1] - s0[1]
    compaction = sum(r[3] for r in server if r[0] == "compact" and len(r) > 3)
    # The compaction process's CPU (its start-up included) is compaction's and the server's.
    child = sum(r[1] for r in server if r[0] == "compaction process")
    shares["server: compaction process"] = child / wall
    shares["all"] += child / wall
    compaction += child
    server_cpu += child
    # Compaction's share of the server's CPU (issue 10: <= 10% under live ingest); units that
    # began before the first batch count too (a slight overestimate).
    shares["compaction, share of server"] = compaction / server_cpu if server_cpu > 0 else 0.0
    return shares


if __name__ == "__main__":
    main()
