"""Faults on the write side: one run that cannot be persisted never stops the broker or the server.

Each fault is made real: a run directory locked by another writer, a file where a run would go, a
tmpfs that fills up (when the tests run as root and may mount; otherwise a file-size limit on the
server process), a low limit on open files, stalled browsers, batches that break the schema. The
first tests drive an in-process broker; the others a real ``vdl-stream serve`` subprocess, with a
healthy writer and a healthy browser on another run meanwhile, and check that the server stays up,
that the healthy browser's p99 latency stays within 50 ms, that its memory stays bounded and that
nothing acknowledged is lost or duplicated.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio
from trio_websocket import open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Message, Request

import recorder
from tests.conftest import http_get, http_request, start_serve, stop_serve
from vdl_stream import codec
from vdl_stream.broker import Broker, Subscriber, SubscriberLimitError
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.errors import RefusedError
from vdl_stream.transport import InProcessTransport, WebSocketTransport

WALL = 1.7e9


def scalars(tag: str, steps: range) -> ScalarColumns:
    s = np.arange(steps.start, steps.stop, dtype=np.int64)
    return ScalarColumns(tag, s, WALL + s.astype(np.float64), s * 0.5)


def batch(seq: int, run: str, writer: str = "w", points: int = 10, sync: bool = False) -> Batch:
    """Batch ``seq`` of ``writer``: ``points`` points of tag ``x``, steps continuing the last."""
    return Batch(
        writer, seq, run, [scalars("x", range((seq - 1) * points, seq * points))], [], sync
    )


def steps_of(run_dir: Path, tag: str = "x") -> list[int]:
    """The raw steps of ``tag`` in write order (restarts not applied, so duplicates show)."""
    with recorder.RunReader(run_dir) as reader:
        records = reader.read_records(kind="scalars", tag=tag)
    return [int(s) for r in records for s in r.data.steps]


# -- the in-process broker ------------------------------------------------------------------------


async def test_a_run_that_cannot_be_opened_is_refused_and_the_others_keep_going(tmp_path):
    (tmp_path / "clash").write_text("a file where the run directory would go")
    broker = Broker(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            bad = await broker.ingest(batch(1, "clash"))
            good = await broker.ingest(batch(1, "good", sync=True))
            with pytest.raises(RefusedError) as refused:
                await broker.wait_written(bad)
            assert not refused.value.retryable
            assert "clashes" in refused.value.reason and str(tmp_path) not in refused.value.reason
            await broker.wait_written(good, durable=True)
            with pytest.raises(RefusedError, match="clashes with the record format"):
                await broker.ingest(batch(1, "exp1/segment-000000.vdlr"))
            with pytest.raises(RefusedError, match="255 bytes"):
                await broker.ingest(batch(1, "x" * 300))
            assert broker.statistics().refusals == 3
            broker.close()
            await broker.wait_closed()
    assert steps_of(tmp_path / "good") == list(range(10))


async def test_open_run_raises_the_real_cause(tmp_path):
    """What attach() uses to report a locked or unwritable run at the call."""
    broker = Broker(tmp_path)
    holder = recorder.RunWriter(tmp_path / "held")
    with pytest.raises(recorder.RunLockedError, match="already open"):
        await broker.open_run("held")
    holder.close()
    await broker.open_run("held")
    assert broker.statistics().open_writers == 1
    (tmp_path / "file").write_text("x")
    with pytest.raises(recorder.RecorderError, match="not a directory"):
        await broker.open_run("file")
    with pytest.raises(RefusedError, match="clashes"):
        await broker.open_run("a/b.vdlr")
    await trio.to_thread.run_sync(broker._close_runs)


async def test_a_locked_run_is_refused_in_order_and_taken_when_resent(tmp_path):
    """Batch 2 is refused (the run is held); 3 is refused behind it; once free, 2 and 3 land once."""
    broker = Broker(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await broker.wait_written(await broker.ingest(batch(1, "r", sync=True)), durable=True)
            await trio.to_thread.run_sync(broker._close_runs)  # as if evicted: the run is free
            holder = recorder.RunWriter(tmp_path / "r")  # "another process" holds it now
            second = await broker.ingest(batch(2, "r"))
            third = await broker.ingest(batch(3, "r"))  # accepted before the refusal is known
            with pytest.raises(RefusedError) as refused:
                await broker.wait_written(second)
            assert refused.value.retryable and "another process" in refused.value.reason
            with pytest.raises(RefusedError):
                await broker.wait_written(third)  # behind the refused one: refused too
            with pytest.raises(RefusedError, match="another process"):
                await broker.ingest(batch(3, "r"))  # out of order: 2 must come first
            holder.close()
            for seq in (2, 3):
                await broker.wait_written(await broker.ingest(batch(seq, "r")))
            dup = await broker.ingest(batch(3, "r", sync=True))  # a re-sent copy
            await broker.wait_written(dup, durable=True)
            assert broker.statistics().duplicates == 1
            broker.close()
            await broker.wait_closed()
    assert steps_of(tmp_path / "r") == list(range(30))


async def test_in_process_transport_resends_refusals_and_reports_them_once(tmp_path):
    broker = Broker(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            transport = InProcessTransport(broker)
            holder = recorder.RunWriter(tmp_path / "held")
            for seq in range(1, 6):
                await transport.send(batch(seq, "held"))
                await trio.sleep(0.01)  # a training step
            with trio.move_on_after(0.5):
                await transport.wait_acked(5)  # cannot succeed while the run is held
            errors = transport.take_errors()
            assert [(e.retryable, "another process" in e.reason) for e in errors] == [(True, True)]
            assert transport.take_errors() == []  # each refusal once
            stats = transport.statistics()
            assert stats.queued_batches == 5 and stats.refusals >= 1
            holder.close()
            await transport.wait_acked(5)
            assert transport.statistics().queued_batches == 0
            await transport.aclose()
    assert steps_of(tmp_path / "held") == list(range(50))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_refusals_coming_and_going_lose_and_duplicate_nothing(tmp_path, seed):
    """The run is locked and freed at random while 200 batches stream: each lands exactly once."""
    rng = np.random.default_rng(seed)
    broker = Broker(tmp_path, max_open_writers=1)  # the run's writer is closed often
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            transport = InProcessTransport(broker)
            done = trio.Event()

            async def flip() -> None:
                holder = None
                other = 0
                while not done.is_set():
                    await trio.sleep(float(rng.uniform(0.005, 0.04)))
                    if holder is None:
                        # another run's batch closes the flaky run's writer, freeing its lock
                        other += 1
                        await broker.wait_written(await broker.ingest(batch(other, "other", "o")))
                        with contextlib.suppress(recorder.RecorderError):
                            holder = recorder.RunWriter(tmp_path / "flaky")
                    else:
                        holder.close()
                        holder = None
                if holder is not None:
                    holder.close()

            async with trio.open_nursery() as flipping:
                flipping.start_soon(flip)
                for seq in range(1, 201):
                    await transport.send(batch(seq, "flaky", points=5, sync=seq % 50 == 0))
                    if seq % 50 == 0:
                        with trio.move_on_after(0.05):
                            await transport.wait_acked(seq)
                    await trio.sleep(float(rng.uniform(0, 0.004)))
                done.set()
            await transport.wait_acked(200)
            assert transport.statistics().refusals > 0
            await transport.aclose()
    assert steps_of(tmp_path / "flaky") == list(range(1000))


async def test_non_retryable_refusals_end_that_batch_only(tmp_path):
    broker = Broker(tmp_path)
    bad = {"kind": "telemetry", "tag": None, "step": None, "wall": WALL, "fields": {}}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            transport = InProcessTransport(broker)
            (tmp_path / "f").write_text("not a run")
            await transport.send(batch(1, "f"))
            await transport.wait_acked(1)  # refused for good: nothing to wait for
            assert [e.retryable for e in transport.take_errors()] == [False]
            other = InProcessTransport(broker)
            await other.send(Batch("v", 1, "ok", [], [bad]))
            await other.send(batch(2, "ok", writer="v"))
            await other.wait_acked(2)
            await transport.aclose()
    with recorder.RunReader(tmp_path / "ok") as reader:
        assert len(reader.read_records(kind="telemetry")) == 1


async def test_a_batch_and_its_bookkeeping_never_straddle_a_new_segment(tmp_path):
    """Crash at every segment start (later segments lost), re-send everything: no point is
    duplicated, because no batch's data sits in an older segment than its ingest record."""
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 60, 120).tolist()
    # 20 writers make the ingest record large, as large as many batches' data
    batches = [Batch(f"writer-{i:02d}", 1, "r", []) for i in range(20)]
    step = 0
    for seq, n in enumerate(sizes, 1):
        batches.append(Batch("w", seq, "r", [scalars("x", range(step, step + n))]))
        step += n

    async def write(logdir: Path, wait: bool) -> None:
        broker = Broker(logdir, segment_bytes=4096)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.run)
                for b in batches:
                    seq = await broker.ingest(b)
                    if wait:
                        await broker.wait_written(seq)
                broker.close()
                await broker.wait_closed()

    await write(tmp_path / "logs", wait=True)
    segments = sorted((tmp_path / "logs" / "r").glob("segment-*.vdlr"))
    assert len(segments) > 10
    print(f"{len(batches)} batches over {len(segments)} segments")
    for k in range(1, len(segments)):
        crashed = tmp_path / f"crash-{k}"
        (crashed / "r").mkdir(parents=True)
        for segment in segments[:k]:  # segment k was being started when the process died
            shutil.copy(segment, crashed / "r" / segment.name)
        await write(crashed, wait=False)
        assert steps_of(crashed / "r") == list(range(step)), f"crash at segment {k}"


async def test_open_run_writers_are_bounded(tmp_path):
    broker = Broker(tmp_path, max_open_writers=4)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            for round_ in (1, 2):
                for i in range(20):
                    seq = await broker.ingest(batch(round_, f"run-{i}"))
                    await broker.wait_written(seq)
                    assert broker.statistics().open_writers <= 4
            broker.close()
            await broker.wait_closed()
    for i in range(20):
        assert steps_of(tmp_path / f"run-{i}") == list(range(20))


async def test_running_out_of_file_descriptors_is_refused_and_heals(tmp_path):
    """EMFILE for real (a low soft limit in this process, no bound on open writers): the batches
    that hit it are refused (retryable), the broker closes half its writers, every run lands."""
    broker = Broker(tmp_path, max_open_writers=4096)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            transports = [InProcessTransport(broker) for _ in range(60)]
            resource.setrlimit(resource.RLIMIT_NOFILE, (used + 40, hard))
            try:
                for i, transport in enumerate(transports):
                    await transport.send(batch(1, f"run-{i:02d}", sync=True))
                for transport in transports:
                    await transport.wait_acked(1)
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            errors = [e for t in transports for e in t.take_errors()]
            assert errors and all(e.retryable and "open files" in e.reason for e in errors)
            assert broker.statistics().refusals >= len(errors)
            print(f"EMFILE in process: {len(errors)} refusals reported, {broker.statistics()}")
            broker.close()
            await broker.wait_closed()
    for i in range(60):
        assert steps_of(tmp_path / f"run-{i:02d}") == list(range(10))


async def test_subscriber_queues_are_capped_in_bytes_and_subscribers_in_number(tmp_path):
    sub = Subscriber(None, capacity=1000, capacity_bytes=3000)
    for seq in range(1, 11):
        sub.offer(seq, "r", bytes(1024))
    stats = sub.statistics()
    assert (stats.depth, stats.bytes, stats.gaps, stats.dropped) == (2, 2048, 1, 8)
    for _ in range(2):
        await sub.receive()
    assert msgpack.unpackb(await sub.receive())["type"] == "gap"
    sub.offer(20, "r", bytes(10_000))  # larger than the cap, into an empty queue: still taken
    assert sub.statistics().depth == 1
    broker = Broker(tmp_path, max_subscribers=2)
    subs = [broker.subscribe(), broker.subscribe()]
    with pytest.raises(SubscriberLimitError):
        broker.subscribe()
    broker.unsubscribe(subs[0])
    broker.subscribe()
    assert broker.statistics().subscribers_refused == 1


def test_events_that_would_break_reads_are_refused_on_ingest():
    common = {"tag": "t", "step": 1, "wall": WALL}
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    bad_events = [
        ({"kind": "telemetry", "tag": None, "step": None, "wall": WALL, "fields": [1]}, "fields"),
        ({"kind": "telemetry", "tag": None, "wall": WALL, "fields": {"a": "x"}}, "fields"),
        ({"kind": "histogram", **common, "edges": b"abc", "counts": b""}, "edges"),
        ({"kind": "text", **common, "text": "hi", "extra": deep}, "deeper"),
        ({"kind": "meta", **common, "x": {1: 2}}, "key"),
    ]
    for event, text in bad_events:
        message = msgpack.unpackb(
            codec.encode_batch(Batch("w", 7, "r", [], [event])), strict_map_key=False
        )
        with pytest.raises(codec.BatchError, match=text) as refused:
            codec.decode_batch(message)
        assert (refused.value.writer, refused.value.seq) == ("w", 7)


# -- a real serve process -------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
#: The p99 latency a healthy browser must keep while another run is faulted.
P99_LIMIT = 0.050
#: The server's peak RSS in every serve case (about 60 MB at rest).
RSS_LIMIT_MB = 300
#: The bound when the machine is overloaded (load average above its CPU count).
P99_OVERLOADED = 0.500


@dataclass
class Serve:
    """A ``vdl-stream serve`` subprocess (optionally with resource limits) and its address."""

    proc: subprocess.Popen
    url: str
    logdir: Path
    stderr: Path

    @property
    def ws(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def stats(self) -> dict:
        status, body = http_get(self.url + "/api/stats")
        assert status == 200, body
        return body

    def rss_peak_mb(self) -> float:
        """The server's peak resident memory so far (VmHWM), in MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def alive(self) -> None:
        assert self.proc.poll() is None, self.stderr.read_text()[-3000:]
        assert http_get(self.url + "/api/runs")[0] == 200


@contextlib.contextmanager
def serve(logdir: Path, *, nofile: int | None = None, fsize: int | None = None) -> Iterator[Serve]:
    """Run ``vdl-stream serve`` over ``logdir`` with optional RLIMIT_NOFILE / RLIMIT_FSIZE."""

    def limits() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    stderr = logdir.parent / f"serve-{logdir.name}.err"
    with open(stderr, "wb") as err:
        try:
            server = start_serve(logdir, stderr=err, preexec_fn=limits)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc} {stderr.read_text()[-2000:]}") from None
    try:
        yield Serve(server.proc, server.url, logdir, stderr)
    finally:
        stop_serve(server)
        server.proc.stdout.close()


@dataclass
class Healthy:
    """A writer and a browser on a run no fault touches; what they saw."""

    run: str = "healthy"
    sent: int = 0
    acked: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    warm: trio.Event = field(default_factory=trio.Event)

    async def warmed_up(self) -> None:
        """Wait until the healthy run exists and flows (5 batches acked), then measure afresh:
        creating a run waits for the disk once, which is not what the faults are about."""
        await self.warm.wait()
        self.latencies.clear()

    async def enough(self, batches: int = 150, rate: float = 50.0) -> None:
        """Let the healthy pair run until about ``batches`` were sent (at ``rate`` a second)."""
        await trio.sleep(max(0.0, (batches - self.sent) / rate))

    def p99(self) -> float:
        return float(np.percentile(self.latencies, 99)) if self.latencies else float("inf")


async def healthy_traffic(
    server: Serve, healthy: Healthy, stop: trio.Event, *, rate: float = 50.0
) -> None:
    """Write ``healthy.run`` at ``rate`` batches/s and watch it live, until ``stop``."""
    subscribe = codec.encode_message({"type": "subscribe", "runs": [healthy.run]})

    async def browser(ws) -> None:
        while True:
            message = msgpack.unpackb(await ws.get_message())
            now = time.time()
            if message["type"] == "gap":
                await ws.send_message(subscribe)
            elif message["type"] == "data":
                for _tag, _steps, walls, _values in message["scalars"]:
                    healthy.latencies.extend((now - np.frombuffer(walls, "<f8")).tolist())

    all_acked = trio.Event()

    async def acks(ws) -> None:
        while True:
            message = msgpack.unpackb(await ws.get_message())
            assert message["type"] == "ack", message
            healthy.acked = message["seq"]
            if healthy.acked >= 5:
                healthy.warm.set()
            if stop.is_set() and healthy.acked >= healthy.sent:
                all_acked.set()

    async with (
        open_websocket_url(server.ws + "/ws/live", max_message_size=64 << 20) as live,
        open_websocket_url(server.ws + "/ws/ingest") as ingest,
        trio.open_nursery() as nursery,
    ):
        await live.send_message(subscribe)
        nursery.start_soon(browser, live)
        nursery.start_soon(acks, ingest)
        while not stop.is_set():
            healthy.sent += 1
            s = healthy.sent
            cols = ScalarColumns(
                "loss", np.array([s]), np.array([time.time()]), np.array([s * 1.0])
            )
            await ingest.send_message(codec.encode_batch(Batch("hw", s, healthy.run, [cols])))
            with trio.move_on_after(1 / rate):
                await stop.wait()
        if healthy.acked < healthy.sent:
            with trio.move_on_after(10):
                await all_acked.wait()
        nursery.cancel_scope.cancel()


def check_healthy(server: Serve, healthy: Healthy) -> None:
    """The healthy run got everything it sent, once, and its browser kept up."""
    assert healthy.acked == healthy.sent > 10
    assert server.rss_peak_mb() < RSS_LIMIT_MB
    status, body = http_get(f"{server.url}/api/scalars?run={healthy.run}&tag=loss")
    assert status == 200 and body["steps"] == list(range(1, healthy.sent + 1))
    assert len(healthy.latencies) >= (healthy.sent - 10) * 0.9
    p50 = float(np.percentile(healthy.latencies, 50))
    worst = sorted(range(len(healthy.latencies)), key=lambda i: -healthy.latencies[i])[:5]
    print("worst", [(i, round(healthy.latencies[i] * 1000, 1)) for i in worst])
    print(
        f"healthy run: {healthy.sent} batches acked, browser p50 {p50 * 1000:.1f} ms, "
        f"p99 {healthy.p99() * 1000:.1f} ms; server peak RSS {server.rss_peak_mb():.0f} MB"
    )
    # The 50 ms bound holds on a machine with CPU to spare; on one with more runnable tasks than
    # cores (a shared CI box) the scheduler alone stalls processes for 100-200 ms, so there only
    # a blocked event loop (seconds) fails the case.
    overloaded = os.getloadavg()[0] > (os.cpu_count() or 1)
    limit = P99_OVERLOADED if overloaded else P99_LIMIT
    assert healthy.p99() <= limit, f"healthy browser p99 {healthy.p99() * 1000:.1f} ms"


async def raw_answer(server: Serve, frame: bytes) -> dict:
    """Send one frame on a fresh /ws/ingest connection; return the answer."""
    async with open_websocket_url(server.ws + "/ws/ingest") as ws:
        await ws.send_message(frame)
        return msgpack.unpackb(await ws.get_message())


def test_serve_refuses_bad_runs_and_events_and_keeps_serving(tmp_path):
    """Name clashes, long names, a locked run and schema-breaking events, one after another."""
    logdir = tmp_path / "logs"
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    tele = {"kind": "telemetry", "tag": None, "step": None, "wall": WALL}
    bad_events = [
        {**tele, "fields": [1, 2]},
        {"kind": "histogram", "tag": "h", "step": 1, "wall": WALL, "edges": b"abc", "counts": b""},
        {"kind": "text", "tag": "t", "step": 1, "wall": WALL, "text": "x", "nested": deep},
    ]
    healthy = Healthy()
    with serve(logdir) as server:

        async def faults() -> None:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(healthy_traffic, server, healthy, stop)
                await healthy.warmed_up()
                with trio.fail_after(60):
                    await raw_answer(server, codec.encode_batch(batch(1, "exp1")))
                    for i, name in enumerate(
                        ["exp1/segment-000000.vdlr", "exp1/index.vdli", "y" * 300, "a\u202eb"]
                    ):
                        answer = await raw_answer(
                            server, codec.encode_batch(batch(1, name, f"n{i}"))
                        )
                        assert answer["type"] == "refused" and answer["retryable"] is False
                        assert answer["writer"] == f"n{i}" and answer["seq"] == 1
                    for i, event in enumerate(bad_events):
                        answer = await raw_answer(
                            server, codec.encode_batch(Batch(f"e{i}", 1, "events", [], [event]))
                        )
                        assert answer["type"] == "refused" and not answer["retryable"], answer
                    # off the loop: the healthy browser's timestamps are taken on it
                    holder = await trio.to_thread.run_sync(recorder.RunWriter, logdir / "held")
                    answer = await raw_answer(server, codec.encode_batch(batch(1, "held", "l")))
                    assert answer["type"] == "refused" and answer["retryable"] is True
                    assert "another process" in answer["reason"]
                    await trio.to_thread.run_sync(holder.close)
                    answer = await raw_answer(server, codec.encode_batch(batch(1, "held", "l")))
                    assert answer == {"type": "ack", "writer": "l", "seq": 1}
                    await healthy.enough()
                    stop.set()

        trio.run(faults)
        server.alive()
        check_healthy(server, healthy)
        for path in ("telemetry?run=events", "events?run=events&kind=text&tag=t"):
            assert http_request(f"{server.url}/api/{path}")[0] in (200, 404)
        for run in ("exp1", "held"):
            assert http_request(f"{server.url}/api/export?run={run}")[0] == 200
    assert not (logdir / "exp1" / "segment-000000.vdlr").is_dir()
    assert steps_of(logdir / "held") == list(range(10))


def test_serve_under_a_low_open_file_limit_takes_many_runs(tmp_path):
    """EMFILE: 400 runs under RLIMIT_NOFILE 256; run writers are closed least recently used."""
    logdir = tmp_path / "logs"
    runs = 400
    with serve(logdir, nofile=256) as server:

        async def many() -> None:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(healthy_traffic, server, healthy, stop)
                await healthy.warmed_up()
                with trio.fail_after(90):
                    async with open_websocket_url(server.ws + "/ws/ingest") as ws:
                        for i in range(runs):
                            frame = codec.encode_batch(batch(i + 1, f"r{i:03d}", "m"))
                            await ws.send_message(frame)
                        answers = [msgpack.unpackb(await ws.get_message()) for _ in range(runs)]
                    await healthy.enough()
                stop.set()
            assert [a["type"] for a in answers] == ["ack"] * runs, [
                a for a in answers if a["type"] != "ack"
            ][:3]

        healthy = Healthy()
        trio.run(many)
        server.alive()
        check_healthy(server, healthy)
        broker = server.stats()["broker"]
        print(f"EMFILE: {runs} runs under RLIMIT_NOFILE 256: {broker}")
        assert broker["open_writers"] <= 256 // 4  # a quarter of the limit
    for i in (0, runs // 2, runs - 1):
        assert steps_of(logdir / f"r{i:03d}") == list(range(i * 10, i * 10 + 10))


async def stalled_browser(
    host: str, port: int, tags: str, ready: trio.Semaphore, stop: trio.Event
) -> None:
    """Subscribe to ``/ws/live`` (tags ``tags``) with a tiny receive buffer, then never read."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        await sock.connect((host, port))
        conn = WSConnection(ConnectionType.CLIENT)
        await sock.send(conn.send(Request(host=f"{host}:{port}", target="/ws/live")))
        accepted = False
        while not accepted:
            conn.receive_data(await sock.recv(65536))
            accepted = any(isinstance(e, AcceptConnection) for e in conn.events())
        subscribe = {"type": "subscribe", "runs": ["big"], "tags": tags}
        await sock.send(conn.send(Message(data=codec.encode_message(subscribe))))
        ready.release()
        await stop.wait()
    finally:
        sock.close()


def test_stalled_browsers_with_large_events_keep_memory_bounded(tmp_path):
    """4 browsers that never read (each with its own tag filter, so no frame is shared), 150
    events of 1 MiB at 25 a second: each queue stops at its byte cap and gets a gap; RSS stays
    bounded."""
    logdir = tmp_path / "logs"
    healthy = Healthy()
    with serve(logdir) as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        base = server.rss_peak_mb()

        async def load() -> None:
            stop = trio.Event()
            ready = trio.Semaphore(0)
            async with trio.open_nursery() as nursery:
                for tags in ("t", "t,a", "t,b", "t,c"):  # distinct filters, each matching "t"
                    nursery.start_soon(stalled_browser, host, int(port), tags, ready, stop)
                for _ in range(4):
                    await ready.acquire()
                nursery.start_soon(healthy_traffic, server, healthy, stop)
                await healthy.warmed_up()
                with trio.fail_after(60):
                    async with open_websocket_url(
                        server.ws + "/ws/ingest", max_message_size=64 << 20
                    ) as ws:
                        event = {"kind": "text", "tag": "t", "wall": WALL, "text": "x" * (1 << 20)}
                        start = trio.current_time()
                        for seq in range(1, 151):  # 25 MiB/s: a heavy writer, not a saturated CPU
                            await trio.sleep_until(start + seq / 25)
                            frame = codec.encode_batch(
                                Batch("big", seq, "big", [], [{**event, "step": seq}])
                            )
                            await ws.send_message(frame)
                            assert msgpack.unpackb(await ws.get_message())["type"] == "ack"
                subscribers.extend((await trio.to_thread.run_sync(server.stats))["subscribers"])
                await healthy.enough()
                stop.set()

        subscribers: list[dict] = []
        trio.run(load)
        server.alive()
        check_healthy(server, healthy)
        growth = server.rss_peak_mb() - base
        stalled = [s for s in subscribers if s["gaps"]]
        print(f"stalled browsers: RSS grew {growth:.0f} MB; subscribers {subscribers}")
        assert growth < 150, f"RSS grew {growth:.0f} MB"
        assert len(stalled) == 4 and all(s["peak_bytes"] <= 8 << 20 for s in stalled), subscribers
    with recorder.RunReader(logdir / "big") as reader:
        assert len(reader.read_records(kind="text")) == 150


def small_disk(path: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` at ``path`` if this process may; return whether it did."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        timeout=20,
    )
    return done.returncode == 0


def fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    with contextlib.suppress(OSError), open(path, "wb") as f:
        while True:
            f.write(bytes(4096))
            f.flush()


def unmount(path: Path) -> None:
    """Unmount what :func:`small_disk` mounted (lazily: a server may still hold files there)."""
    subprocess.run(["umount", "-l", str(path)], timeout=20, check=False)


def test_serve_survives_a_full_disk_and_resumes_when_space_frees(tmp_path):
    """ENOSPC: the writer's batches are refused (retryable), spooled, re-sent once space frees;
    every point lands exactly once. Without mount rights a file-size limit stands in (EFBIG),
    and the test checks the refusal but cannot free the space."""
    disk = tmp_path / "disk"
    mounted = small_disk(disk, "3m")
    logdir = disk / "logs"
    logdir.mkdir()
    ballast = disk / "ballast"
    if mounted:
        ballast.write_bytes(bytes(2_600_000))  # leaves about 400 kB
    try:
        with serve(logdir, fsize=None if mounted else 300_000) as server:

            async def fill() -> None:
                async with trio.open_nursery() as nursery:
                    transport = await nursery.start(WebSocketTransport.run, server.ws)
                    step = 0
                    with trio.fail_after(60):
                        seq = 0
                        while not transport.statistics().refusals:
                            seq += 1
                            await transport.send(batch(seq, "full", "d", points=2000))
                            await trio.sleep(0.005)
                            assert seq < 2000, "the disk never filled"
                        errors = transport.take_errors()
                        assert errors[0].retryable
                        assert "disk full" in errors[0].reason or "cannot write" in errors[0].reason
                        for _ in range(50):  # training goes on for a second, the disk stays full
                            seq += 1
                            await transport.send(batch(seq, "full", "d", points=2000))
                            await trio.sleep(0.02)
                        stats = transport.statistics()
                        assert stats.refusals >= 2 and stats.retries >= 2, stats
                        assert stats.queued_batches >= 50, stats
                        refused = (await trio.to_thread.run_sync(server.stats))["broker"]
                        assert refused["refusals"] >= 2
                        server.alive()
                        if not mounted:
                            nursery.cancel_scope.cancel()
                            return
                        ballast.unlink()  # space frees: the transport's retries land
                        await transport.wait_acked(seq)
                        stats = transport.statistics()
                        assert stats.queued_batches == 0
                        print(f"full disk: {seq} batches of 2,000 points, {stats}")
                        step = seq
                    nursery.cancel_scope.cancel()
                assert step
                sent["seq"] = step

            sent: dict[str, int] = {}
            trio.run(fill)
            server.alive()
        if mounted:
            assert steps_of(logdir / "full") == list(range(sent["seq"] * 2000))
    finally:
        if mounted:
            unmount(disk)


async def test_a_run_started_on_a_full_disk_is_taken_once_space_frees(tmp_path):
    """In process: a new run on a full tmpfs is refused (retryable), then lands whole."""
    disk = tmp_path / "disk"
    if not small_disk(disk, "256k"):
        pytest.skip("needs root and mount for a tmpfs")
    try:
        ballast = disk / "ballast"
        fill(ballast)
        broker = Broker(disk / "logs")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.run)
                transport = InProcessTransport(broker)
                for seq in range(1, 4):
                    await transport.send(batch(seq, "new"))
                with trio.move_on_after(0.3):
                    await transport.wait_acked(3)
                (error,) = transport.take_errors()
                assert error.retryable and "disk full" in error.reason
                ballast.unlink()
                await transport.wait_acked(3)
                await transport.aclose()
        assert steps_of(disk / "logs" / "new") == list(range(30))
    finally:
        unmount(disk)


def test_a_disk_that_fills_and_frees_at_random_loses_and_duplicates_nothing(tmp_path):
    """Over a real serve: the disk is full, then not, at random, while 300 batches stream through
    a WebSocketTransport with a sync every 50; every point lands exactly once."""
    disk = tmp_path / "disk"
    if not small_disk(disk, "4m"):
        pytest.skip("needs root and mount for a tmpfs")
    logdir = disk / "logs"
    logdir.mkdir()
    ballast = disk / "ballast"
    rng = np.random.default_rng(7)
    try:
        with serve(logdir) as server:

            async def stream() -> None:
                done = trio.Event()

                async def flip() -> None:
                    while not done.is_set():
                        await trio.sleep(float(rng.uniform(0.01, 0.06)))
                        if ballast.exists():
                            ballast.unlink()
                        else:
                            stat = os.statvfs(disk)
                            free = stat.f_bavail * stat.f_frsize
                            with contextlib.suppress(OSError):
                                ballast.write_bytes(bytes(max(0, free - 8192)))
                    ballast.unlink(missing_ok=True)

                async with trio.open_nursery() as nursery:
                    transport = await nursery.start(WebSocketTransport.run, server.ws)
                    with trio.fail_after(60):
                        async with trio.open_nursery() as flipping:
                            flipping.start_soon(flip)
                            for seq in range(1, 301):
                                sync = seq % 50 == 0
                                await transport.send(
                                    batch(seq, "flaky", "f", points=200, sync=sync)
                                )
                                await trio.sleep(float(rng.uniform(0, 0.006)))
                            done.set()
                        await transport.wait_acked(300)
                    stats = transport.statistics()
                    print(f"disk filling and freeing: {stats}")
                    assert stats.refusals > 0 and stats.queued_batches == 0
                    nursery.cancel_scope.cancel()

            trio.run(stream)
            server.alive()
        assert steps_of(logdir / "flaky") == list(range(300 * 200))
    finally:
        unmount(disk)
