"""Secure defaults: loopback bind, tokens, Origin checks, size limits, paths, graceful shutdown."""

from __future__ import annotations

import signal
import subprocess
import sys
from functools import partial

import msgpack
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.conftest import http_get, start_serve
from vdl_stream import codec
from vdl_stream.codec import Batch
from vdl_stream.server import run_server
from vdl_stream.transport import WebSocketTransport


def test_a_public_address_without_a_token_is_refused(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vdl_stream.cli",
            "serve",
            "--logdir",
            str(tmp_path),
            "--host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing to serve on 0.0.0.0 without a token" in done.stderr
    assert "--token" in done.stderr and "--insecure" in done.stderr


@pytest.fixture
async def secured(nursery, tmp_path):
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0, "s3cret"))
    return url


async def test_http_api_requires_the_token(secured):
    with trio.fail_after(20):
        get = partial(trio.to_thread.run_sync, http_get)
        assert (await get(secured + "/api/runs"))[0] == 401
        assert (await get(secured + "/api/runs?token=wrong"))[0] == 401
        assert (await get(secured + "/api/runs?token=s3cret")) == (200, {"runs": []})
        status, _ = await get(secured + "/api/runs", {"Authorization": "Bearer s3cret"})
        assert status == 200


async def test_websockets_require_the_token(secured):
    ws = "ws" + secured.removeprefix("http")
    with trio.fail_after(20):
        for path in ("/ws/ingest", "/ws/live"):
            with pytest.raises(ConnectionRejected) as rejected:
                async with open_websocket_url(ws + path):
                    pass
            assert rejected.value.status_code == 401
        async with open_websocket_url(ws + "/ws/live?token=s3cret") as live:
            assert msgpack.unpackb(await live.get_message())["type"] == "hello"
        async with open_websocket_url(
            ws + "/ws/ingest", extra_headers=[("Authorization", "Bearer s3cret")]
        ) as ingest:
            await ingest.send_message(codec.encode_batch(Batch("w", 1, "r")))
            assert msgpack.unpackb(await ingest.get_message()) == {
                "type": "ack",
                "writer": "w",
                "seq": 1,
            }


async def test_cross_origin_websockets_are_refused(nursery, tmp_path):
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
    ws = "ws" + url.removeprefix("http") + "/ws/live"
    host = url.removeprefix("http://")
    with trio.fail_after(20):
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(ws, extra_headers=[("Origin", "http://evil.example")]):
                pass
        assert rejected.value.status_code == 403
        async with open_websocket_url(ws, extra_headers=[("Origin", f"http://{host}")]) as ok:
            assert msgpack.unpackb(await ok.get_message())["type"] == "hello"


async def test_oversize_frames_and_escaping_runs_close_that_client(nursery, tmp_path):
    logdir = tmp_path / "logs"
    url = await nursery.start(partial(run_server, logdir, "127.0.0.1", 0))
    ws = "ws" + url.removeprefix("http") + "/ws/ingest"
    with trio.fail_after(30):
        async with open_websocket_url(ws, max_message_size=1 << 20) as client:
            await client.send_message(b"\x00" * (codec.MAX_FRAME_BYTES + 1))
            with pytest.raises(ConnectionClosed) as closed:
                await client.get_message()
            assert closed.value.reason.code == 1009  # refused by size, never decoded
        async with open_websocket_url(ws) as client:
            frame = msgpack.packb({"type": "batch", "writer": "w", "seq": 1, "run": "../escape"})
            await client.send_message(frame)
            with pytest.raises(ConnectionClosed) as closed:
                await client.get_message()
            assert closed.value.reason.code == 1008
            assert "run must be a relative path" in closed.value.reason.reason
    assert not (tmp_path / "escape").exists()
    status, body = await trio.to_thread.run_sync(http_get, url + "/api/tags?run=../../etc")
    assert status == 404 and "/" not in body["error"].replace("../../etc", "")


def test_sigterm_closes_browsers_with_1001_and_exits_cleanly(tmp_path):
    server = start_serve(tmp_path)

    async def watch() -> int:
        with trio.fail_after(30):
            async with open_websocket_url(
                "ws" + server.url.removeprefix("http") + "/ws/live"
            ) as live:
                await live.send_message(codec.encode_message({"type": "subscribe", "runs": None}))
                await live.get_message()
                server.proc.send_signal(signal.SIGTERM)
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await live.get_message()
                return closed.value.reason.code

    assert trio.run(watch) == 1001
    assert server.proc.wait(20) == 0


async def test_remote_writer_sends_its_token(secured, tmp_path):
    async with trio.open_nursery() as nursery:
        transport = await nursery.start(
            partial(WebSocketTransport.run, "ws" + secured.removeprefix("http"), "s3cret")
        )
        await transport.send(Batch("w", 1, "tok", sync=True))
        with trio.fail_after(20):
            await transport.wait_acked(1)  # never acknowledged without the token
        nursery.cancel_scope.cancel()
    assert (tmp_path / "tok").is_dir()  # the server took the batch into the run
