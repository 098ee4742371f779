"""Several brokers as one dashboard (``serve --bus``): a real redis-server, real serve processes.

Every test starts its own ``redis-server`` on 127.0.0.1 with a port of its own (no persistence),
and ``vdl-stream serve --bus`` subprocesses sharing one log directory, the way brokers on one host
share the truth. Brokers are SIGKILLed and Redis is restarted for real.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import trio
from trio_websocket import open_websocket_url

import recorder
from tests.conftest import ServeProcess, http_get, start_serve, stop_serve, wait_until
from vdl_stream import attach, codec
from vdl_stream.bus import Bus, check_bus_url
from vdl_stream.transport import WebSocketTransport

#: Lease ttl of the brokers under test: how long a killed broker's runs wait for another.
LEASE = "1.0"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A ``redis-server`` subprocess on 127.0.0.1 and a port of its own, without persistence."""

    def __init__(self, workdir: Path) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            pytest.fail("redis-server is not installed: run scripts/test.sh, which installs it")
        self.executable = executable
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again, on the same port) and wait until it answers PING (10 s at most)."""
        self.proc = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer within 10 s")

    def stop(self) -> None:
        """SIGKILL it (a crash: nothing is saved) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


class Brokers:
    """``vdl-stream serve --bus`` processes over one log directory; all stopped at the end."""

    def __init__(self, logdir: Path, redis: RedisServer, count: int) -> None:
        self.logdir = logdir
        self.redis = redis
        self.servers: list[ServeProcess] = []
        self.ports: list[int] = []
        for _ in range(count):
            self.ports.append(free_port())
            self.servers.append(self._start(len(self.servers)))

    def _start(self, index: int) -> ServeProcess:
        log = open(self.logdir.parent / f"broker{index}.log", "a")  # noqa: SIM115 (Popen's)
        try:
            return start_serve(
                self.logdir,
                "--bus",
                self.redis.url,
                "--bus-lease",
                LEASE,
                port=self.ports[index],
                stderr=log,
            )
        finally:
            log.close()

    @property
    def ws_urls(self) -> list[str]:
        return [s.ws_url for s in self.servers]

    def kill(self, index: int) -> None:
        self.servers[index].proc.kill()
        self.servers[index].proc.wait()

    def restart(self, index: int) -> None:
        """Start broker ``index`` again on its port (retrying while the port is still held)."""
        deadline = time.monotonic() + 20
        while True:
            try:
                self.servers[index] = self._start(index)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        for server in self.servers:
            stop_serve(server)


@pytest.fixture
def brokers(tmp_path: Path, redis_server: RedisServer) -> Iterator[callable]:
    started: list[Brokers] = []

    def make(count: int) -> Brokers:
        (tmp_path / "logs").mkdir(exist_ok=True)
        group = Brokers(tmp_path / "logs", redis_server, count)
        started.append(group)
        return group

    try:
        yield make
    finally:
        for group in started:
            group.stop()


@dataclass
class Watched:
    """What one ``/ws/live`` client saw: steps per run (snapshots and data), gaps."""

    steps: dict[str, set[float]] = field(default_factory=dict)
    data_frames: dict[str, int] = field(default_factory=dict)
    gaps: int = 0


async def watch(ws_url: str, seen: Watched) -> None:
    """Subscribe to every run on ``/ws/live`` and record what arrives (until cancelled); after a
    ``gap`` subscribe again, as the page does."""
    subscribe = codec.encode_message({"type": "subscribe", "runs": None, "max_points": 100_000})
    async with open_websocket_url(ws_url + "/ws/live", max_message_size=64 << 20) as ws:
        await ws.send_message(subscribe)
        while True:
            message = codec.decode_message(await ws.get_message())
            kind = message["type"]
            if kind == "gap":
                seen.gaps += 1
                await ws.send_message(subscribe)
            elif kind in ("data", "snapshot"):
                run = message["run"]
                if kind == "data":
                    seen.data_frames[run] = seen.data_frames.get(run, 0) + 1
                steps = seen.steps.setdefault(run, set())
                for _tag, s, _w, _v in message["scalars"]:
                    steps.update(np.frombuffer(s, dtype="<f8").tolist())


def disk_steps(logdir: Path, run: str, tag: str = "loss") -> np.ndarray:
    with recorder.RunReader(logdir / run) as reader:
        return reader.read_scalars(tag).steps


# -- arguments --------------------------------------------------------------------------------


def test_bus_url_and_arguments_are_checked():
    assert check_bus_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    for bad in ("http://x:6379", "redis://", "localhost:6379", 3):
        with pytest.raises(ValueError, match="--bus must be a redis://"):
            check_bus_url(bad)  # type: ignore[arg-type]
    from vdl_stream.broker import Broker

    with pytest.raises(ValueError, match="lease_ttl must be a positive number, got 0"):
        Bus(Broker("unused"), "redis://127.0.0.1:1/0", lease_ttl=0)
    with pytest.raises(ValueError, match="must start with ws:// or wss://, got 'http://a'"):
        WebSocketTransport(["ws://a:1", "http://a"])
    with pytest.raises(ValueError, match="non-empty list"):
        WebSocketTransport([])
    with pytest.raises(TypeError, match="url must be a str or a non-empty list of str"):
        attach(url=["ws://a:1", 3])  # type: ignore[list-item]


def test_serve_refuses_a_bad_bus_url(tmp_path):
    proc = subprocess.run(
        ["python3", "-m", "vdl_stream.cli", "serve", "--logdir", str(tmp_path), "--bus", "x:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--bus must be a redis://host:port/db URL, got 'x:1'" in proc.stderr


# -- one dashboard ----------------------------------------------------------------------------


async def test_a_browser_on_any_broker_sees_every_run_live(brokers):
    group = brokers(3)
    views = [Watched() for _ in group.servers]
    writers = [
        attach(url=url, run=f"run{i}", telemetry=False) for i, url in enumerate(group.ws_urls)
    ]
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for url, view in zip(group.ws_urls, views, strict=True):
                    nursery.start_soon(watch, url, view)

                def write() -> None:  # the writer's API is for training code: not in trio
                    for step in range(200):
                        for w in writers:
                            w.add_scalar("loss", float(step), step)
                        time.sleep(0.005)
                    for w in writers:
                        w.flush()

                await trio.to_thread.run_sync(write)

                def everyone_sees_everything() -> bool:
                    return all(
                        len(v.steps.get(f"run{i}", ())) == 200
                        for v in views
                        for i in range(len(writers))
                    )

                await wait_until(everyone_sees_everything, 30, "every browser to see every run")
                nursery.cancel_scope.cancel()
    finally:
        for w in writers:
            await trio.to_thread.run_sync(w.close)
    # Live through the bus (data frames from the other brokers), not only from snapshots.
    for index, view in enumerate(views):
        others = [f"run{i}" for i in range(len(writers)) if i != index]
        assert all(view.data_frames.get(run, 0) > 0 for run in others), view.data_frames
    for server in group.servers:
        status, stats = http_get(server.url + "/api/stats")
        assert status == 200
        assert stats["bus"]["connected"] is True
        assert stats["bus"]["received"] > 0 and stats["bus"]["published"] > 0
        assert stats["bus"]["dropped"] == 0


def test_a_publish_round_coalesces_consecutive_batches_of_a_run_into_one_entry():
    from vdl_stream.bus import _coalesce
    from vdl_stream.codec import Batch, ScalarColumns

    def batch(run: str, seq: int, tags: tuple[str, ...] = ("loss",)) -> Batch:
        steps = np.arange(seq * 10, seq * 10 + 10, dtype=np.int64)
        cols = [ScalarColumns(t, steps, steps * 0.5, steps * 2.0) for t in tags]
        return Batch(
            "w",
            seq,
            run,
            cols,
            [{"kind": "text", "tag": "t", "step": seq, "wall": 1.0, "text": "x"}],
        )

    items = [
        ("a", 1, batch("a", 1)),
        ("b", 0, b""),  # run b announced: its announcement goes first
        ("b", 1, batch("b", 1)),
        ("a", 2, batch("a", 2, ("loss", "acc"))),
        ("a", 3, batch("a", 3)),
        ("a", 5, batch("a", 5)),  # 4 was dropped from the queue: a hole receivers must see
        ("a", 6, batch("a", 6)),
    ]
    registry, entries = _coalesce(items)
    assert registry == ["b"]
    assert [(run, m, n) for run, m, n, _ in entries] == [("a", 1, 3), ("a", 5, 6), ("b", 1, 1)]
    first = codec.decode_batch(codec.decode_message(entries[0][3]))
    loss = next(c for c in first.scalars if c.tag == "loss")
    assert loss.steps.tolist() == list(range(10, 40))  # batches 1, 2, 3 in order
    assert loss.values.tolist() == [2.0 * s for s in range(10, 40)]
    acc = next(c for c in first.scalars if c.tag == "acc")
    assert acc.steps.tolist() == list(range(20, 30))
    assert [e["step"] for e in first.events] == [1, 2, 3]
    lone = codec.decode_batch(codec.decode_message(entries[2][3]))
    assert lone.run == "b" and lone.scalars[0].steps.tolist() == list(range(10, 20))


async def test_a_burst_reaches_another_broker_in_fewer_entries_every_point_in_order(brokers):
    """Batches sent back to back (a busy broker) are merged per run on the bus: fewer stream
    entries than batches, and a browser on the other broker still gets every point, in order."""
    group = brokers(2)
    view = Watched()
    order: list[float] = []
    batches, points = 200, 5  # fewer frames than a subscriber's queue holds: no gap possible
    subscribe = codec.encode_message({"type": "subscribe", "runs": None, "max_points": 100_000})

    async def watch_order(ws_url: str) -> None:
        async with open_websocket_url(ws_url + "/ws/live", max_message_size=64 << 20) as ws:
            await ws.send_message(subscribe)
            while True:
                message = codec.decode_message(await ws.get_message())
                if message["type"] == "gap":
                    view.gaps += 1
                    await ws.send_message(subscribe)
                elif message["type"] == "data" and message["run"] == "burst":
                    view.data_frames["burst"] = view.data_frames.get("burst", 0) + 1
                    for _tag, steps, _w, _v in message["scalars"]:
                        order.extend(np.frombuffer(steps, dtype="<f8").tolist())

    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_order, group.ws_urls[1])
            async with open_websocket_url(group.ws_urls[0] + "/ws/ingest") as ingest:
                for seq in range(1, batches + 1):
                    steps = np.arange((seq - 1) * points, seq * points, dtype=np.int64)
                    cols = [codec.ScalarColumns("loss", steps, steps * 0.0, steps * 1.0)]
                    batch = codec.Batch("burst-writer", seq, "burst", cols)
                    await ingest.send_message(codec.encode_batch(batch))
                acked = 0
                while acked < batches:
                    message = codec.decode_message(await ingest.get_message())
                    if message["type"] == "ack":
                        acked = message["seq"]
                    else:
                        pytest.fail(f"batch not acknowledged: {message}")
            await wait_until(
                lambda: len(order) >= batches * points or view.gaps > 0,
                30,
                "every point of the burst on the other broker",
            )
            nursery.cancel_scope.cancel()
    assert view.gaps == 0
    assert order == [float(s) for s in range(batches * points)]
    status, stats = http_get(group.servers[0].url + "/api/stats")
    assert status == 200
    bus = stats["bus"]
    assert bus["published"] >= batches and bus["dropped"] == 0
    assert bus["entries"] < bus["published"], bus  # merged while busy
    assert view.data_frames["burst"] <= bus["entries"]


async def test_a_run_is_refused_by_a_broker_that_does_not_hold_its_lease(brokers):
    group = brokers(2)
    first = attach(url=group.ws_urls[0], run="held", telemetry=False)
    try:
        first.add_scalar("loss", 1.0, 0)
        await trio.to_thread.run_sync(first.flush)
        # A writer of the same run on the other broker alone: refused (retryable) while the
        # first broker holds the lease; the transport keeps its batch.
        async with trio.open_nursery() as nursery:
            transport = await nursery.start(WebSocketTransport.run, group.ws_urls[1])
            batch = codec.Batch(
                "w2",
                1,
                "held",
                [codec.ScalarColumns("loss", np.array([1]), np.array([time.time()]), np.ones(1))],
            )
            await transport.send(batch)
            await wait_until(lambda: transport.statistics().refusals, 20, "the refusal")
            reasons = [e.reason for e in transport.take_errors()]
            assert Bus.LEASED_ELSEWHERE in reasons
            assert transport.statistics().queued_batches == 1  # kept for a later retry
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(first.close)
    _, stats = http_get(group.servers[1].url + "/api/stats")
    assert stats["bus"]["refused_leased"] >= 1
    assert list(disk_steps(group.logdir, "held")) == [0]


# -- failover ---------------------------------------------------------------------------------


def _write_steadily(writer, written: list[int], stop: threading.Event) -> None:
    """Log one step after another until ``stop`` (a few thousand a second); count them."""
    step = 0
    while not stop.is_set():
        writer.add_scalar("loss", float(step), step)
        step += 1
        written[0] = step
        if step % 20 == 0:
            time.sleep(0.005)


def _one_step(seq: int, run: str = "gap", writer: str = "w") -> codec.Batch:
    """Batch ``seq`` of ``writer``: one point of ``loss`` at step ``seq`` (``v``: 100 + seq)."""
    step = seq + (100 if writer == "v" else 0)
    cols = codec.ScalarColumns("loss", np.array([step]), np.array([time.time()]), np.ones(1))
    return codec.Batch(writer, seq, run, [cols])


async def test_a_batch_whose_connection_closes_while_the_persist_queue_is_full_is_written(
    tmp_path,
):
    """Regression (bench_bus failover, seed 15: one batch of a run lost): a writer's batch 4
    waited for room in a full persist queue when its connection closed (the writer had moved
    on after a refusal, and came back). Its ingest was cancelled and the batch dropped, while
    batch 5, sent on the writer's new connection with a copy of 4, waited behind it: 5 was
    written before 4, and 4's next copy read as a duplicate (the files held 5) on the broker
    that took the run next. Now a numbered batch reaches the queue whatever its connection."""
    from trio.testing import wait_all_tasks_blocked

    from vdl_stream.broker import Broker

    with trio.fail_after(20):
        broker = Broker(tmp_path, queue_size=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await broker.wait_written(await broker.ingest(_one_step(1, "r")))
            await broker._limiter.acquire()  # the persist thread waits: the queue fills up
            await broker.ingest(_one_step(2, "r"))
            await wait_all_tasks_blocked()
            await broker.ingest(_one_step(3, "r"))
            first = trio.CancelScope()
            numbers: dict[str, int] = {}
            both = trio.Event()

            async def old_connection() -> None:
                with first:
                    numbers["4"] = await broker.ingest(_one_step(4, "r"))

            async def new_connection() -> None:
                numbers["4 again"] = await broker.ingest(_one_step(4, "r"))
                numbers["5"] = await broker.ingest(_one_step(5, "r"))
                both.set()

            nursery.start_soon(old_connection)
            await wait_all_tasks_blocked()
            nursery.start_soon(new_connection)
            await wait_all_tasks_blocked()
            first.cancel()  # the old connection closes while 4 waits for room
            await wait_all_tasks_blocked()
            broker._limiter.release()
            await both.wait()
            await broker.wait_written(numbers["4 again"])  # 4 is in: no refusal
            await broker.wait_written(numbers["5"])
            broker.close()
            await broker.wait_closed()
    np.testing.assert_array_equal(disk_steps(tmp_path, "r"), [1, 2, 3, 4, 5])
    with recorder.RunReader(tmp_path / "r") as reader:
        order = [r.data["w"] for r in reader.read_records(kind="ingest")]
    assert order == sorted(order), order  # written in the writer's order


async def test_a_writer_leaving_a_broker_that_never_answers_its_close_moves_on(tmp_path):
    """Regression (bench_bus failover stall): a writer refused by a broker that is still busy
    answering the batches sent before the refusal, and so does not answer the close, waited
    for that answer (trio-websocket's default: 60 s) at every hop. It now moves on within
    seconds and its batches land on the next broker."""
    from functools import partial

    from trio_websocket import serve_websocket

    from vdl_stream.server import run_server

    async def stubborn(request) -> None:
        ws = await request.accept()
        first = codec.decode_message(await ws.get_message())
        reason = "the run is being written through another broker (it holds the run's lease)"
        for seq in range(first["seq"], first["seq"] + 20):  # the batches sent before it heard
            await ws.send_message(codec.encode_refused(first["writer"], seq, reason, True))
        await trio.sleep_forever()  # busy: reads nothing more, never answers the close

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                partial(serve_websocket, stubborn, "127.0.0.1", 0, ssl_context=None)
            )
            busy = f"ws://127.0.0.1:{server.port}"
            good = "ws" + (await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0)))[4:]
            transport = await nursery.start(WebSocketTransport.run, [busy, good])
            start = trio.current_time()
            for seq in range(1, 6):
                await transport.send(_one_step(seq, "r"))
            await transport.wait_acked(5)
            took = trio.current_time() - start
            assert transport.failovers >= 1
            assert took < 10, f"moving on took {took:.1f} s"
            nursery.cancel_scope.cancel()
    np.testing.assert_array_equal(disk_steps(tmp_path, "r"), [1, 2, 3, 4, 5])


async def test_a_refused_batch_holds_back_later_ones_until_every_refused_one_is_in(
    tmp_path, redis_server
):
    """Regression (bench_bus failover, seeds 15-18 under load): broker A refused batches 2 and 3
    while B held the run; B then wrote 2 (not 3) and let the run go. Batch 4, sent before the
    writer heard of the refusals, reached A once A could take the lease: A saw 2 (the first it
    had refused) in the files, took 4, and the re-sent 3 was then acknowledged as a duplicate
    of data already written. Lost. A must refuse 4 until 3 is in."""
    from vdl_stream.broker import Broker
    from vdl_stream.errors import RefusedError

    logdir = tmp_path / "logs"
    a, b = Broker(logdir), Broker(logdir)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for broker in (a, b):
                await nursery.start(broker.run)
                await nursery.start(Bus(broker, redis_server.url, lease_ttl=10).run)
            await b.wait_written(await b.ingest(_one_step(1)))  # B takes the run's lease
            for seq in (2, 3):  # the writer fails over to A while B still holds it
                with pytest.raises(RefusedError, match="another broker"):
                    await a.ingest(_one_step(seq))
            for seq in (1, 2, 3):  # a second writer, "v": B has none of it
                with pytest.raises(RefusedError, match="another broker"):
                    await a.ingest(_one_step(seq, writer="v"))
            await b.wait_written(await b.ingest(_one_step(2)))  # in flight on the old connection
            b.close()  # a clean stop: B releases the lease at once
            await b.wait_closed()
            await wait_until(
                lambda: redis_cli(redis_server, "exists", "vdl:lease:gap") == "0", 10, "release"
            )
            with pytest.raises(RefusedError, match="another broker"):
                await a.ingest(_one_step(4))  # 3 is not in the files: 4 must wait for it
            for seq in (3, 4):  # the writer goes again from its first unacknowledged batch
                await a.wait_written(await a.ingest(_one_step(seq)))
            # v re-sends from 1 on a new connection; its batch 4, sent on the old one before it
            # heard of the refusals, is still read there after 1 is back: refused until 2 and 3
            # are in (taken then, it would have made them duplicates).
            await a.wait_written(await a.ingest(_one_step(1, writer="v")))
            with pytest.raises(RefusedError, match="another broker"):
                await a.ingest(_one_step(4, writer="v"))
            for seq in (2, 3, 4):
                await a.wait_written(await a.ingest(_one_step(seq, writer="v")))
            a.close()
            await a.wait_closed()
    with recorder.RunReader(logdir / "gap") as reader:
        record = reader.last_record("ingest")
    assert record.data == {"w": 4, "v": 4}
    np.testing.assert_array_equal(disk_steps(logdir, "gap"), [1, 2, 3, 4, 101, 102, 103, 104])


def test_sigkilled_brokers_writers_fail_over_losing_and_duplicating_nothing(brokers):
    group = brokers(3)
    urls = group.ws_urls
    rng = random.Random(13)
    # Six writers spread over three brokers, each with every broker in its list, its own first.
    writers = [
        attach(url=urls[i % 3 :] + urls[: i % 3], run=f"fo{i}", telemetry=False) for i in range(6)
    ]
    counts = [[0] for _ in writers]
    stop = threading.Event()
    threads = [
        threading.Thread(target=_write_steadily, args=(w, n, stop), daemon=True)
        for w, n in zip(writers, counts, strict=True)
    ]
    try:
        for t in threads:
            t.start()
        for _ in range(2):  # at random moments while every writer is logging
            time.sleep(rng.uniform(0.3, 1.0))
            victim = rng.randrange(3)
            group.kill(victim)
            time.sleep(rng.uniform(0.2, 0.6))
            group.restart(victim)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)
        for w in writers:
            assert w.flush(60), "a writer's points were not all acknowledged within 60 s"
    finally:
        stop.set()
        for w in writers:
            w.close()
    group.stop()
    for i, (n,) in enumerate(counts):
        assert n > 1000  # they were writing all along
        # 0 lost, 0 duplicated: every step exactly once, in order.
        got = disk_steps(group.logdir, f"fo{i}")
        np.testing.assert_array_equal(got, np.arange(n))


# -- Redis restart ----------------------------------------------------------------------------


async def test_a_redis_restart_costs_live_frames_never_data(brokers, redis_server):
    group = brokers(2)
    view = Watched()
    writer = attach(url=group.ws_urls, run="rr", telemetry=False)
    steps = 3000
    try:
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, group.ws_urls[1], view)

                def write(first: int, last: int) -> None:
                    for step in range(first, last):
                        writer.add_scalar("loss", float(step), step)
                        if step % 20 == 0:
                            time.sleep(0.002)

                await trio.to_thread.run_sync(write, 0, 1000)
                await wait_until(
                    lambda: view.data_frames.get("rr", 0) > 0, 20, "live data across brokers"
                )
                redis_server.stop()
                await trio.to_thread.run_sync(write, 1000, 2000)
                await wait_until(lambda: view.gaps >= 1, 20, "a gap after losing Redis")
                redis_server.start()  # empty: its streams and leases are gone
                # Both brokers read the bus again before the rest is written: written while a
                # reader still backs off (up to 2 s), it reached the browser by its re-sync
                # snapshot alone, and no live frame was left to count (the test's flake).
                await wait_bus_connected(group, 20)
                frames = view.data_frames["rr"]
                await trio.to_thread.run_sync(write, 2000, steps)
                await trio.to_thread.run_sync(writer.flush)
                await wait_until(
                    lambda: len(view.steps.get("rr", ())) == steps,
                    30,
                    "the browser to hold every step again",
                )
                assert view.data_frames["rr"] > frames  # live again after the restart
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(writer.close)
    group.stop()
    np.testing.assert_array_equal(disk_steps(group.logdir, "rr"), np.arange(steps))


async def wait_bus_connected(group, deadline: float) -> None:
    """Wait until every broker of ``group`` reads the bus (``bus.connected`` in its stats);
    fail after ``deadline`` s."""
    end = trio.current_time() + deadline
    while True:
        stats = [
            (await trio.to_thread.run_sync(http_get, server.url + "/api/stats"))[1]
            for server in group.servers
        ]
        if all(st.get("bus", {}).get("connected") for st in stats):
            return
        if trio.current_time() > end:
            pytest.fail(f"timed out after {deadline} s waiting for the brokers to read the bus")
        await trio.sleep(0.05)


# -- the default path, start-up and clean close ---------------------------------------------------


def test_the_default_path_never_imports_coredis():
    code = (
        "import sys, vdl_stream, vdl_stream.cli, vdl_stream.server, vdl_stream.broker, "
        "vdl_stream.transport, vdl_stream.writer\n"
        "assert 'coredis' not in sys.modules, 'coredis imported without --bus'\n"
    )
    proc = subprocess.run(["python3", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_package_and_each_command_import_only_what_they_need():
    """``import vdl_stream`` is light (its public names load on first use), ``--help`` loads
    none of the stack, ``serve`` not the importers nor the writer, and every documented import
    still works."""
    heavy = ("numpy", "trio", "quart", "hypercorn", "trio_websocket", "vdl_stream.writer")
    code = (
        "import sys, vdl_stream\n"
        f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from vdl_stream.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from vdl_stream.cli import build_parser\n"
        "build_parser(['serve']).parse_args(['serve', '--logdir', 'x'])\n"
        "loaded = [m for m in ('vdl_stream.interop', 'vdl_stream.replay') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "import vdl_stream.server\n"
        "loaded = [m for m in ('vdl_stream.replay', 'vdl_stream.writer', 'vdl_stream.session',"
        " 'trio_websocket') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from vdl_stream import LogWriter, SummaryWriter, Writer, attach, __version__\n"
        "from vdl_stream.writer import Writer as W\n"
        "assert W is Writer is vdl_stream.Writer and callable(attach)\n"
        "assert vdl_stream.attach is attach and 'attach' in dir(vdl_stream)\n"
        "assert LogWriter.__module__ == SummaryWriter.__module__ == 'vdl_stream.compat'\n"
        "ns = {}\n"
        "exec('from vdl_stream import *', ns)\n"
        "assert {'attach', 'Writer', 'SummaryWriter', 'LogWriter'} <= set(ns), sorted(ns)\n"
        "try:\n"
        "    vdl_stream.nothing\n"
        "except AttributeError as exc:\n"
        "    assert \"has no attribute 'nothing'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('vdl_stream.nothing did not raise')\n"
    )
    proc = subprocess.run(["python3", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def redis_cli(redis: RedisServer, *command: str) -> str:
    return subprocess.run(
        ["redis-cli", "-p", str(redis.port), *command], capture_output=True, text=True, timeout=10
    ).stdout.strip()


def test_brokers_start_without_redis_and_take_runs_once_it_is_up(brokers, redis_server):
    redis_server.stop()
    group = brokers(2)  # they serve at once; runs wait for Redis (their leases)
    with attach(url=group.ws_urls, run="late", telemetry=False) as writer:
        for step in range(500):
            writer.add_scalar("loss", float(step), step)
        with pytest.warns(RuntimeWarning, match=r"the dashboard's bus \(Redis\) cannot be reached"):
            assert not writer.flush(2)  # no broker may take the run yet: nothing acknowledged
        redis_server.start()
        assert writer.flush(30)
    assert redis_cli(redis_server, "get", "vdl:lease:late")  # held by the broker that took it
    group.stop()
    np.testing.assert_array_equal(disk_steps(group.logdir, "late"), np.arange(500))


def test_a_clean_stop_releases_the_leases_at_once(brokers, redis_server):
    group = brokers(2)
    with attach(url=group.ws_urls, run="handover", telemetry=False) as writer:
        writer.add_scalar("loss", 0.0, 0)
        assert writer.flush(30)
        holder = redis_cli(redis_server, "get", "vdl:lease:handover")
        assert holder
        stop_serve(group.servers[0])  # SIGTERM: closes its runs, then deletes its leases
        assert redis_cli(redis_server, "exists", "vdl:lease:handover") == "0"
        writer.add_scalar("loss", 1.0, 1)
        assert writer.flush(30)  # the second broker took the run over
        assert redis_cli(redis_server, "get", "vdl:lease:handover") not in ("", holder)
    group.stop()
    np.testing.assert_array_equal(disk_steps(group.logdir, "handover"), [0, 1])


# -- across hosts, through the bucket -----------------------------------------------------------


def test_a_run_moves_between_brokers_with_their_own_disks_through_the_bucket(
    tmp_path, redis_server
):
    """Brokers on different hosts share Redis and a bucket, never a disk: each one that takes
    the run's lease continues it from the bucket, also one whose own disk holds an older copy
    (it wrote the run before), and the bucket ends with every step exactly once."""
    pytest.importorskip("obstore")
    from tests.s3_server import MotoServer, restore_env, set_env
    from vdl_stream import storage

    moto = MotoServer()
    old_env = set_env(moto.env())
    url = "s3://bucket/runs"
    ports = [free_port(), free_port()]
    servers: list[ServeProcess | None] = [None, None]

    def start(i: int) -> None:
        servers[i] = start_serve(
            url,  # type: ignore[arg-type]
            *("--cache-dir", str(tmp_path / f"host{i}"), "--bus", redis_server.url),
            *("--bus-lease", LEASE, "--head-interval", "1"),
            port=ports[i],
            stderr=open(tmp_path / f"host{i}.log", "a"),  # noqa: SIM115 (Popen's)
        )

    def stop(i: int) -> None:
        assert stop_serve(servers[i]) == 0  # a clean stop: publishes, releases the lease

    def log(writer, steps: range) -> None:
        for step in steps:
            writer.add_scalar("loss", float(step), step)
            if step % 50 == 0:
                writer.flush()
        assert writer.flush(60), "the steps were not acknowledged within 60 s"

    try:
        moto.create_bucket("bucket")
        start(0)
        start(1)
        urls = [f"ws://127.0.0.1:{p}" for p in (ports[1], ports[0])]
        writer = attach(url=urls, run="moved", telemetry=False)
        try:
            log(writer, range(0, 1000))  # through host 1
            stop(1)
            log(writer, range(1000, 2000))  # host 0 takes it over from the bucket
            start(1)  # its disk holds steps 0-999 only
            stop(0)
            log(writer, range(2000, 3000))  # host 1 again: from the bucket, not its disk
        finally:
            writer.close()
        stop(1)
        with storage.mirrored(url) as tmp, recorder.RunReader(tmp / "moved") as reader:
            steps = reader.read_scalars("loss").steps
        missing = np.setdiff1d(np.arange(3000), steps)
        assert not len(missing), f"lost {len(missing)} steps, from {missing[:3]} to {missing[-3:]}"
        np.testing.assert_array_equal(steps, np.arange(3000))  # and none twice
    finally:
        for server in servers:
            if server is not None:
                stop_serve(server)
        restore_env(old_env)
        moto.stop()


async def test_a_run_that_goes_quiet_is_settled_at_once_not_after_seconds(tmp_path, redis_server):
    """The last batch of a run that goes quiet has no later entry to carry its ``p``: once it is
    written, the publish loop adds a settlement (``b`` and ``p`` alone) after SETTLE_DELAY, and
    a receiver stops keeping that batch's frames (it kept them for UNSETTLED_SECONDS)."""
    import coredis

    from vdl_stream.broker import Broker
    from vdl_stream.bus import SETTLE_DELAY, UNSETTLED_SECONDS, _records
    from vdl_stream.codec import Batch, ScalarColumns

    steps = np.arange(10, dtype=np.int64)
    one = Batch("w", 1, "r", [ScalarColumns("loss", steps, steps * 1.0, steps * 2.0)], [])
    writer = Bus(Broker(tmp_path / "a"), redis_server.url)
    writer._held["r"] = float("inf")  # as if it held the run's lease
    receiver = Bus(Broker(tmp_path / "b"), redis_server.url)
    client = coredis.Redis.from_url(redis_server.url)
    with trio.fail_after(10):
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(writer._publish_loop)
            writer.publish(one)  # at ingest
            await wait_until(
                lambda: writer.statistics().entries == 1, 5, "the batch's entry to be added"
            )
            stream = f"vdl:bus:{writer.id}"
            (entry,) = await client.xrange(stream)
            receiver._fan_out("r", [r for _, r in _records(entry.field_values, 0.0)])
            assert len(receiver.unsettled("r")) == 1  # not yet written when it was published
            writer.settled("r")  # the persist task wrote it; no batch follows
            quiet = trio.current_time()
            await wait_until(
                lambda: writer.statistics().entries == 2, 5, "the run's settlement entry"
            )
            assert trio.current_time() - quiet >= SETTLE_DELAY * 0.9
            assert trio.current_time() - quiet < UNSETTLED_SECONDS
            entry = (await client.xrange(stream))[-1]
            ((run, settlement),) = _records(entry.field_values, 0.0)
            assert (run, settlement.source, settlement.n, settlement.written) == (
                "r",
                writer.id.encode(),
                -1,
                1,
            )
            sub = receiver.broker.subscribe()
            receiver._fan_out("r", [settlement])
            assert receiver.unsettled("r") == []
            assert sub.statistics().run_gaps == 0
            # One settlement per quiet spell: nothing more while the run stays quiet.
            await trio.sleep(SETTLE_DELAY * 2)
            assert writer.statistics().entries == 2
            nursery.cancel_scope.cancel()


async def test_a_round_of_several_runs_reaches_a_blocked_reader_in_one_xread(
    tmp_path, redis_server
):
    """Redis 7.0 answers a blocked multi-stream XREAD with only the stream that woke it. A
    publish round is one entry of its broker's stream, so a receiver blocked in XREAD gets
    every run of the round from the one XREAD that wakes (with a stream per run it got the
    first run alone, and the others only from its next XREAD, one request/answer later)."""
    import coredis

    from vdl_stream.broker import Broker
    from vdl_stream.bus import STREAM_EXPIRY
    from vdl_stream.codec import Batch, ScalarColumns

    runs = ["r1", "r2", "r3"]
    steps = np.arange(10, dtype=np.int64)
    writer = Bus(Broker(tmp_path / "a"), redis_server.url)
    receiver = Bus(Broker(tmp_path / "b"), redis_server.url)
    fanned: list[tuple[int, str]] = []  # (XREADs that returned so far, run) of each fan-out
    fan_out = receiver.broker._bus_fan_out

    def recording(run, scalars, events):
        fanned.append((receiver.statistics().reads, run))
        fan_out(run, scalars, events)

    receiver.broker._bus_fan_out = recording
    probe = coredis.Redis.from_url(redis_server.url)

    async def blocked() -> bool:
        return int((await probe.info("clients"))["blocked_clients"]) == 1

    with trio.fail_after(15):
        async with probe, trio.open_nursery() as nursery:
            nursery.start_soon(writer._publish_loop)
            nursery.start_soon(receiver._read_from_now)
            await wait_until(lambda: receiver._connected, 5, "the reader to start")
            for run in runs:
                writer._held[run] = float("inf")  # as if it held the runs' leases
                writer._register(run)
            await wait_until(
                lambda: all(run in receiver.broker._runs for run in runs), 5, "the announcements"
            )
            end = trio.current_time() + 5
            while not await blocked():  # the reader waits in XREAD BLOCK again
                assert trio.current_time() < end, "the reader never blocked"
                await trio.sleep(0.01)
            woken = receiver.statistics().reads + 1  # the number of the XREAD the round wakes
            for run in runs:  # one publish round: queued together, before the loop runs
                writer.publish(Batch("w", 1, run, [ScalarColumns("loss", steps, steps, steps)], []))
            await wait_until(lambda: len(fanned) == len(runs), 5, "every run fanned out")
            # A stopped broker's stream goes by itself, STREAM_EXPIRY after its last round.
            ttl = await probe.pttl(f"vdl:bus:{writer.id}")
            nursery.cancel_scope.cancel()
    assert sorted(fanned) == [(woken, run) for run in runs]
    assert writer.statistics().entries == 1  # the round: one entry
    assert STREAM_EXPIRY * 1000 - 10_000 < ttl <= STREAM_EXPIRY * 1000


async def test_a_publish_round_goes_without_waiting_for_the_previous_rounds_answer(
    tmp_path, redis_server
):
    """The publish loop writes a round and goes on; the ack loop reads the answers. While Redis
    holds every write (``CLIENT PAUSE ... WRITE``), a second round is still sent; both are
    counted published once Redis answers; and a round left unanswered past the command timeout
    is counted dropped, its connection closed, the next round sent on a new one."""
    import coredis
    from coredis import PureToken

    from vdl_stream.broker import Broker
    from vdl_stream.bus import COMMAND_TIMEOUT
    from vdl_stream.codec import Batch, ScalarColumns

    steps = np.arange(10, dtype=np.int64)
    writer = Bus(Broker(tmp_path / "a"), redis_server.url)

    def batch(seq: int) -> Batch:
        return Batch("w", seq, "r", [ScalarColumns("loss", steps, steps, steps)], [])

    admin = coredis.Redis.from_url(redis_server.url)
    with trio.fail_after(20):
        async with admin, trio.open_nursery() as nursery:
            nursery.start_soon(writer._publish_loop)
            await admin.client_pause(int(COMMAND_TIMEOUT * 1000), PureToken.WRITE)
            writer.publish(batch(1))
            await wait_until(lambda: writer.statistics().entries == 1, 5, "the first round sent")
            writer.publish(batch(2))
            await wait_until(lambda: writer.statistics().entries == 2, 5, "the second round sent")
            assert writer.statistics().published == 0  # Redis has answered neither yet
            await wait_until(lambda: writer.statistics().published == 2, 5, "both answered")
            # Unanswered past the command timeout: dropped, and the next round goes on anew.
            await admin.client_pause(int(COMMAND_TIMEOUT * 4000), PureToken.WRITE)
            writer.publish(batch(3))
            await wait_until(lambda: writer.statistics().dropped == 1, 10, "the round dropped")
            await admin.client_unpause()
            writer.publish(batch(4))
            await wait_until(lambda: writer.statistics().published == 3, 5, "a round on anew")
            nursery.cancel_scope.cancel()
