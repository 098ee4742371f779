"""Secure defaults: loopback bind, tokens, Origin checks, size limits, paths, graceful shutdown."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import re
import resource
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    open_websocket_url,
    wrap_client_stream,
)

from tests.conftest import ServeProcess, http_get, http_request, start_serve, stop_serve
from vdl_stream import attach, codec
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.errors import InsecureBindError, unwrap
from vdl_stream.server import (
    Access,
    Limits,
    TagFilter,
    origin_matches,
    run_server,
    serve_dashboard,
)
from vdl_stream.server import _url as server_url
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


async def test_every_path_but_the_page_requires_the_token(secured):
    get = partial(trio.to_thread.run_sync, raw_get)
    host = {"Host": secured.removeprefix("http://")}
    with trio.fail_after(20):
        for path in ("//api/runs", "/api//runs", "/%61pi/runs", "/api/runs/", "///ws/live", "/x"):
            status, body = await get(secured, path, host)
            assert status == 401 and json.loads(body) == {"error": "missing or wrong token"}, path
        for path in ("/", "/static/app.js", "/static/app.css"):
            assert (await get(secured, path, host))[0] == 200, path


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
            # The batch is refused with the reason (docs/protocol.md); a server without refusals
            # closed the connection with 1008 instead. Either way the client learns why.
            try:
                answer = msgpack.unpackb(await client.get_message())
            except ConnectionClosed as closed:
                assert closed.reason.code == 1008
                assert "run must be a relative path" in closed.reason.reason
            else:
                assert answer["type"] == "refused" and answer["seq"] == 1
                assert "run must be a relative path" in answer["reason"]
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


# -- issue 11: empty tokens, DNS rebinding, Origin, idle and capped WebSockets, ReDoS ----------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vdl_stream.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("token", ["", "   "])
def test_an_empty_token_is_refused_not_served_without_auth(tmp_path, token):
    done = _cli("serve", "--logdir", str(tmp_path), "--host", "0.0.0.0", "--token", token)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "token must not be empty" in done.stderr
    with pytest.raises(ValueError, match="token must not be empty"):
        attach(tmp_path, serve=True, host="0.0.0.0", port=0, token=token, telemetry=False)


def test_replay_checks_its_bind_token_and_hosts_in_one_line(tmp_path):
    for args, message in (
        (("--host", "0.0.0.0", "--token", ""), "token must not be empty"),
        (("--host", "0.0.0.0"), "without a token"),
        (("--allow-host", "x:80"), "allow"),
    ):
        done = _cli("replay", str(tmp_path), *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_attach_checks_the_bind_at_the_call_and_serves_allowed_hosts(tmp_path):
    with pytest.raises(InsecureBindError, match="without a token"):
        attach(tmp_path, serve=True, host="0.0.0.0", port=0, telemetry=False)
    with attach(
        tmp_path, "r", serve=True, port=0, telemetry=False, allowed_hosts=["dash.example"]
    ) as w:
        assert raw_get(w.url, "/api/runs", {"Host": "dash.example"})[0] == 200
        assert raw_get(w.url, "/api/runs", {"Host": "evil.example"})[0] == 403


def raw_get(base: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET with exactly these headers (Host included, or none), blocking; return status, body."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def ws_handshake(base: str, path: str, host: str, origin: str | None = None) -> int:
    """Open a WebSocket with this Host (and Origin); return 101 if accepted, else the status."""
    parts = urlsplit(base)
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    headers = [] if origin is None else [("Origin", origin)]
    try:
        async with trio.open_nursery() as nursery:
            conn = await wrap_client_stream(nursery, stream, host, path, extra_headers=headers)
            await conn.aclose()
        return 101
    except BaseException as exc:  # the refusal arrives from trio-websocket's reader task
        rejected = unwrap(exc)
        if not isinstance(rejected, ConnectionRejected):
            raise
        return rejected.status_code
    finally:
        await stream.aclose()


async def test_dns_rebinding_hosts_are_refused_on_http_and_websockets(nursery, tmp_path):
    url = await nursery.start(
        partial(run_server, tmp_path, "127.0.0.1", 0, allowed_hosts=["dash.example"])
    )
    port = urlsplit(url).port
    get = partial(trio.to_thread.run_sync, raw_get)
    refused = [
        "evil.example",
        f"evil.example:{port}",
        f"localhost.evil.example:{port}",
        f"127.0.0.1.nip.io:{port}",
        f"dash.example.evil:{port}",
        f"0.0.0.0:{port}",
        f"[::2]:{port}",
    ]
    served = [
        "localhost",
        f"LocalHost:{port}",
        f"127.0.0.1:{port}",
        f"127.8.9.10:{port}",
        f"[::1]:{port}",
        f"DASH.example:{port}",
    ]
    with trio.fail_after(60):
        for host in refused:
            for path in ("/", "/static/app.js", "/api/runs", "/nope"):
                status, body = await get(url, path, {"Host": host})
                assert status == 403, (host, path)
                assert "--allow-host" in json.loads(body)["error"]
            for path in ("/ws/live", "/ws/ingest"):
                assert await ws_handshake(url, path, host, f"http://{host}") == 403, (host, path)
        for host in served:
            assert (await get(url, "/api/runs", {"Host": host}))[0] == 200, host
            assert await ws_handshake(url, "/ws/live", host, f"http://{host}") == 101, host
        assert (await get(url, "/api/runs", {}))[0] in (400, 403)  # no Host at all


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "same"),
    [
        ("http://127.0.0.1:8040", "127.0.0.1:8040", "ws", True),
        ("HTTP://127.0.0.1:8040", "127.0.0.1:8040", "ws", True),
        ("http://LOCALHOST:8040", "localhost:8040", "ws", True),
        ("http://localhost:8040", "LocalHost:8040", "http", True),
        ("http://[::1]:8040", "[::1]:8040", "ws", True),
        ("http://localhost", "localhost:80", "ws", True),
        ("https://localhost", "localhost:443", "wss", True),
        ("https://dash.example", "dash.example", "ws", True),  # TLS proxy in front
        ("http://dash.example", "dash.example", "ws", True),
        ("https://127.0.0.1:8040", "127.0.0.1:8040", "ws", False),  # scheme differs
        ("http://127.0.0.1:8040", "127.0.0.1:8040", "wss", False),
        ("http://127.0.0.1:8041", "127.0.0.1:8040", "ws", False),
        ("http://127.0.0.1", "127.0.0.1:8040", "ws", False),
        ("http://dash.example:8040", "dash.example", "ws", False),
        ("http://localhost:8040", "127.0.0.1:8040", "ws", False),  # another origin
        ("http://evil.example:8040", "127.0.0.1:8040", "ws", False),
        ("http://127.0.0.1:8040@evil.example", "127.0.0.1:8040", "ws", False),
        ("http://127.0.0.1:8040/", "127.0.0.1:8040", "ws", False),
        ("ftp://127.0.0.1:8040", "127.0.0.1:8040", "ws", False),
        ("null", "127.0.0.1:8040", "ws", False),
        ("", "127.0.0.1:8040", "ws", False),
        ("127.0.0.1:8040", "127.0.0.1:8040", "ws", False),
    ],
)
def test_origin_matrix(origin, host, scheme, same):
    assert origin_matches(origin, host, scheme) is same


def test_a_wildcard_bind_reports_a_loopback_url():
    # The printed URL must be one this server answers (a Host of 0.0.0.0 is refused); tests
    # bind loopback only, so this checks the URL rather than serving on every interface.
    assert server_url("0.0.0.0", 8040) == "http://127.0.0.1:8040"
    assert server_url("::", 8040) == "http://[::1]:8040"
    assert server_url("10.0.0.5", 8040) == "http://10.0.0.5:8040"
    assert Access(bind_host="0.0.0.0").host_allowed(urlsplit(server_url("0.0.0.0", 1)).netloc)


def test_the_bind_address_is_a_host_name_unless_it_is_a_wildcard():
    assert Access(bind_host="10.0.0.5").host_allowed("10.0.0.5:8040")
    assert Access(bind_host="gpu-box").host_allowed("GPU-BOX")
    assert Access(bind_host="::1").host_allowed("[::1]:8040")
    for wildcard in ("0.0.0.0", "::"):
        assert not Access(bind_host=wildcard).host_allowed(f"{wildcard}:8040")
        assert not Access(bind_host=wildcard).host_allowed("[::]:8040")
    assert Access(allowed_hosts=["*"]).host_allowed("anything.example:1")
    assert not Access(allowed_hosts=["*"]).host_allowed("bad host")  # still a well-formed Host
    with pytest.raises(ValueError, match="allowed host must be a host name"):
        Access(allowed_hosts=["gpu-box:8040"])
    with pytest.raises(ValueError, match="token must not be empty"):
        Access(token="")


def test_browsers_and_writers_have_their_own_pools():
    assert Limits(max_websockets=100, max_browsers=10).pools() == (10, 90)
    assert Limits(max_websockets=100, max_browsers=500).pools() == (50, 50)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    browsers, writers = Limits().pools()
    assert browsers + writers == min(1024, soft // 2)


async def test_cross_origin_requests_are_refused_on_every_route(nursery, tmp_path):
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
    host = url.removeprefix("http://")
    get = partial(trio.to_thread.run_sync, raw_get)
    with trio.fail_after(30):
        for origin, expected in [
            (f"http://{host}", 200),
            (f"HTTP://{host.upper()}", 200),
            ("null", 403),
            (f"https://{host}", 403),
            ("http://evil.example", 403),
        ]:
            assert (await get(url, "/api/runs", {"Host": host, "Origin": origin}))[0] == expected
            for path in ("/ws/live", "/ws/ingest"):
                want = 101 if expected == 200 else 403
                assert await ws_handshake(url, path, host, origin) == want, (origin, path)


async def test_errors_answer_json_without_internals(nursery, recorded_run):
    url = await nursery.start(partial(run_server, recorded_run, "127.0.0.1", 0))
    get = partial(trio.to_thread.run_sync, http_get)
    with trio.fail_after(30):
        assert await get(url + "/api/scalars?run=r&tag=no/such/tag") == (
            404,
            {"error": "no run 'r' with scalar tag 'no/such/tag'"},
        )
        status, body = await get(url + "/api/scalars?run=r&tag=loss&start=10**9")
        assert status == 400
        status, body = await get(url + "/api/scalars?run=r&tag=loss&start=1000000")
        assert status == 200 and body["steps"] == []  # an empty range of a real tag
        assert await get(url + "/api/nowhere") == (404, {"error": "not found"})
        post = partial(urllib.request.Request, method="POST")
        status, kind, body = await trio.to_thread.run_sync(
            http_request_object, post(url + "/api/runs", data=b"{}")
        )
        assert (status, kind, json.loads(body)) == (
            405,
            "application/json",
            {"error": "method not allowed"},
        )
        for name in ("r\u202e", "r\u2028", "\u200br", "r%00"):
            query = urllib.parse.quote(name) if "%" not in name else name
            status, body = await get(f"{url}/api/tags?run={query}")
            assert status == 400 and "invisible" in body["error"], name
            status, body = await get(f"{url}/api/scalars?run=r&tag=lo{query}ss")
            assert status == 400, name


def http_request_object(request: urllib.request.Request) -> tuple[int, str, bytes]:
    """Send a prepared request (blocking); return status, content type and body."""
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def test_start_up_errors_are_one_line_and_the_port_comes_first(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    done = _cli("serve", "--logdir", str(not_a_dir), "--port", "0")
    assert done.returncode == 2
    assert done.stderr == f"vdl-stream: --logdir {not_a_dir} is not a directory\n"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The port is bound before the log directory is read (reading a large one takes long),
        # so a taken port is what is reported, at once, though this log directory is unreadable.
        started = time.monotonic()
        done = _cli("serve", "--logdir", str(not_a_dir / "sub"), "--port", str(port))
    assert done.returncode == 2 and time.monotonic() - started < 20
    assert done.stderr.startswith(f"vdl-stream: port {port} on 127.0.0.1 is already in use")
    assert done.stderr.count("\n") == 1
    done = _cli("serve", "--logdir", str(tmp_path), "--allow-host", "x:80")
    assert done.returncode == 2 and "--allow-host" in done.stderr


async def test_an_internal_error_answers_json_500(nursery, tmp_path, caplog):
    broker = Broker(tmp_path)

    def explode() -> bytes:
        raise RuntimeError("secret /srv/path detail")

    broker.summaries_json = explode  # type: ignore[method-assign]  (what /api/runs answers with)
    await nursery.start(broker.run)
    url = await nursery.start(partial(serve_dashboard, broker, "127.0.0.1", 0))
    with trio.fail_after(20):
        status, kind, body = await trio.to_thread.run_sync(http_request, url + "/api/runs")
    assert status == 500 and kind == "application/json"
    assert json.loads(body) == {"error": "internal server error"}
    assert "secret /srv/path detail" in caplog.text  # the detail stays in the server's log


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("logs")
    with attach(logdir, run="r", telemetry=False) as w:
        for step in range(20):
            w.add_scalar("loss", 1.0 / (step + 1), step)
    return logdir


async def test_websockets_that_never_speak_are_closed(nursery, tmp_path):
    limits = Limits(subscribe_timeout=0.5, ingest_idle_timeout=1.0)
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0, limits=limits))
    ws = "ws" + url.removeprefix("http")
    with trio.fail_after(20):
        async with open_websocket_url(ws + "/ws/live") as idle:
            started = trio.current_time()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await idle.get_message()
            assert closed.value.reason.code == 1008 and "no subscribe" in closed.value.reason.reason
            assert trio.current_time() - started < 5
        async with open_websocket_url(ws + "/ws/ingest") as idle:
            with pytest.raises(ConnectionClosed) as closed:
                await idle.get_message()
            assert closed.value.reason.code == 1008
        # A browser that subscribed and a writer that sent a batch are not idle.
        async with open_websocket_url(ws + "/ws/live") as live:
            await live.send_message(codec.encode_message({"type": "subscribe", "runs": None}))
            async with open_websocket_url(ws + "/ws/ingest") as writer:
                await writer.send_message(codec.encode_batch(Batch("w", 1, "r")))
                assert msgpack.unpackb(await writer.get_message())["type"] == "ack"
                await trio.sleep(1.5)  # past both timeouts
                await writer.send_message(codec.encode_batch(Batch("w", 2, "r", sync=True)))
                assert msgpack.unpackb(await writer.get_message())["seq"] == 2
            # Still open past the subscribe timeout: a new subscribe gets run r's snapshot.
            await live.send_message(codec.encode_message({"type": "subscribe", "runs": ["r"]}))
            while (message := msgpack.unpackb(await live.get_message()))["type"] != "snapshot":
                pass
            assert message["run"] == "r"


async def test_open_websockets_are_capped_per_kind(nursery, tmp_path):
    limits = Limits(max_websockets=4, max_browsers=2)
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0, limits=limits))
    ws = "ws" + url.removeprefix("http")
    with trio.fail_after(20):
        async with open_websocket_url(ws + "/ws/live") as a, open_websocket_url(ws + "/ws/live"):
            async with open_websocket_url(ws + "/ws/live") as third:
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await third.get_message()
                assert closed.value.reason.code == 1013
                assert "too many browsers connected (2)" in closed.value.reason.reason
            async with (
                open_websocket_url(ws + "/ws/ingest") as w1,  # writers have their own pool
                open_websocket_url(ws + "/ws/ingest"),
            ):
                with pytest.raises(ConnectionRejected) as rejected:
                    async with open_websocket_url(ws + "/ws/ingest"):
                        pass
                assert rejected.value.status_code == 503
                assert (b"retry-after", b"2") in rejected.value.headers
                assert json.loads(rejected.value.body) == {
                    "error": "too many writers connected (2); try again later"
                }
                await w1.send_message(codec.encode_batch(Batch("w", 1, "r")))
                assert msgpack.unpackb(await w1.get_message())["type"] == "ack"
            await a.aclose()
        async with open_websocket_url(ws + "/ws/live") as again:  # a place is free again
            assert msgpack.unpackb(await again.get_message())["type"] == "hello"


async def test_a_writer_refused_for_room_gets_in_when_a_place_frees(nursery, tmp_path):
    limits = Limits(max_websockets=2, max_browsers=1)  # one place for writers
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0, limits=limits))
    ws = "ws" + url.removeprefix("http")
    with trio.fail_after(30):
        async with trio.open_nursery() as inner:
            async with open_websocket_url(ws + "/ws/ingest") as first:
                await first.send_message(codec.encode_batch(Batch("w1", 1, "a", sync=True)))
                await first.get_message()
                with pytest.warns(RuntimeWarning, match="503"):
                    transport = await inner.start(WebSocketTransport.run, ws)
                    await transport.send(Batch("w2", 1, "b", sync=True))
                    with trio.move_on_after(1):
                        await transport.wait_acked(1)
                assert not (tmp_path / "b").exists()  # refused while the place is taken
            await transport.wait_acked(1)  # backed off, then got the freed place
            inner.cancel_scope.cancel()
    assert (tmp_path / "b").is_dir()


def start_limited_serve(logdir: Path, nofile: int, *extra: str) -> ServeProcess:
    """``vdl-stream serve`` in a child whose open-file limit is ``nofile``."""
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
        "from vdl_stream.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--logdir", str(logdir), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = proc.stdout.readline()
    if " at http" not in line:
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r} {proc.stderr.read()!r}")
    return ServeProcess(line.rsplit(" at ", 1)[1].strip().rstrip("/"), logdir, proc)


def open_idle_handshakes(url: str, count: int) -> list[socket.socket]:
    """Open ``count`` WebSocket handshakes (4 in 5 to /ws/live) that never say anything more."""
    parts = urlsplit(url)
    sockets = []
    for i in range(count):
        path = "/ws/ingest" if i % 5 == 4 else "/ws/live"
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        sock.sendall(request.encode())
        sockets.append(sock)
    return sockets


async def subscribe_until_snapshot(ws_url: str, deadline: float) -> int:
    """Subscribe to everything, retrying while refused (1013); return the attempts it took."""
    attempts = 0
    with trio.fail_after(deadline):
        while True:
            attempts += 1
            try:
                async with open_websocket_url(
                    ws_url + "/ws/live", connect_timeout=deadline
                ) as live:
                    await live.send_message(
                        codec.encode_message({"type": "subscribe", "runs": None})
                    )
                    while msgpack.unpackb(await live.get_message())["type"] != "snapshot":
                        pass
                    return attempts
            except ConnectionClosed as exc:
                assert exc.reason.code == 1013, exc.reason  # full: try again later, as it says
            await trio.sleep(0.2)


def test_a_thousand_idle_websockets_leave_the_server_usable(recorded_run, tmp_path):
    server = start_limited_serve(recorded_run, 256)
    idle: list[socket.socket] = []
    try:
        attack = time.monotonic()
        idle = open_idle_handshakes(server.url, 1000)
        started = time.monotonic()
        attempts = trio.run(subscribe_until_snapshot, server.ws_url, 30)
        # Idle browsers are closed after the 5 s subscribe timeout; the rest were refused at once.
        took = time.monotonic() - started
        print(
            f"\n1,000 idle handshakes sent in {started - attack:.1f} s; then a snapshot in "
            f"{took:.1f} s ({attempts} attempts)"
        )
        assert took < 20
        assert server.proc.poll() is None
    finally:
        for sock in idle:
            sock.close()
        assert stop_serve(server) == 0
    errors = server.proc.stderr.read()
    assert "Traceback" not in errors and errors.count("cannot accept") <= 1


# The web server alone (a broker with nothing to follow), so the only thing short of descriptors
# is the listener; the broker's own behaviour on EMFILE is tested with the fault-injection suite.
WEB_ONLY = """
import resource, sys, trio
from functools import partial
resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))
from vdl_stream.broker import Broker
from vdl_stream.server import Limits, serve_dashboard

async def main():
    broker = Broker(sys.argv[1])
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        limits = Limits(max_websockets=1000, max_browsers=1000)  # above the open-file limit
        url = await nursery.start(partial(serve_dashboard, broker, "127.0.0.1", 0, limits=limits))
        print("serving at", url, flush=True)

trio.run(main)
"""


def test_running_out_of_file_descriptors_is_logged_once(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", WEB_ONLY, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("serving at http://"), proc.communicate(timeout=20)
    url = line.rsplit(" ", 1)[-1].strip()
    server = ServeProcess(url, tmp_path, proc)
    idle: list[socket.socket] = []

    async def connect() -> None:
        with trio.fail_after(60):
            async with open_websocket_url(server.ws_url + "/ws/live", connect_timeout=60) as live:
                assert msgpack.unpackb(await live.get_message())["type"] == "hello"

    try:
        idle = open_idle_handshakes(url, 400)
        trio.run(connect)  # once the idle ones are timed out, the listener accepts again
        assert proc.poll() is None
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        errors = proc.communicate(timeout=20)[1]
    assert errors.count("cannot accept new connections: Too many open files") == 1, errors
    assert "Traceback" not in errors and "accept returned" not in errors


@given(
    st.lists(st.sampled_from(["train/*", "*loss*", "a*b", "*", "ab", "*/*a", "", "a**b"]))
    .map(",".join)
    .filter(bool),
    st.text(alphabet="ab/lostrain", max_size=12),
)
def test_tag_globs_match_like_the_equivalent_regex(pattern, tag):
    regexes = [
        "".join(".*" if c == "*" else re.escape(c) for c in glob)
        for glob in pattern.split(",")
        if glob
    ]
    expected = any(re.fullmatch(r, tag, re.DOTALL) for r in regexes)
    assert TagFilter(pattern).search(tag) is expected


def test_a_backtracking_filter_takes_linear_time():
    tag = "x" * 256  # the longest tag
    started = time.perf_counter()
    for _ in range(1000):
        assert not TagFilter("(.|.)*!,*a*a*a*a*a*a*a*a*a*a*b").search(tag)
    assert time.perf_counter() - started < 0.5  # a regex of this shape takes seconds per tag


async def test_a_redos_filter_does_not_delay_other_subscribers(tmp_path):
    server = start_serve(tmp_path)
    latencies: list[float] = []
    evil = "x" * 24  # "(.|.)*!" as a regex backtracks 2**24 times on this tag
    sent: dict[int, float] = {}

    def batch(seq: int) -> bytes:
        cols = ScalarColumns(evil, np.array([seq]), np.array([1.7e9]), np.array([1.0]))
        return codec.encode_batch(Batch("w", seq, "r", [cols]))

    async def snapshot(live) -> None:
        while msgpack.unpackb(await live.get_message())["type"] != "snapshot":
            pass

    try:
        with trio.fail_after(60):
            async with open_websocket_url(server.ws_url + "/ws/ingest") as writer:
                await writer.send_message(batch(1))
                await writer.get_message()
                async with (
                    open_websocket_url(server.ws_url + "/ws/live") as healthy,
                    open_websocket_url(server.ws_url + "/ws/live") as attacker,
                ):
                    for live, tags in ((attacker, "(.|.)*!"), (healthy, None)):
                        subscribe = {"type": "subscribe", "runs": None, "tags": tags}
                        await live.send_message(codec.encode_message(subscribe))
                        await snapshot(live)

                    async def receive() -> None:
                        while len(latencies) < 299:
                            frame = msgpack.unpackb(await healthy.get_message())
                            if frame["type"] == "data":
                                seq = int(np.frombuffer(frame["scalars"][0][1], "<f8")[0])
                                latencies.append(time.perf_counter() - sent[seq])

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(receive)
                        for seq in range(2, 301):
                            sent[seq] = time.perf_counter()
                            await writer.send_message(batch(seq))
                            await trio.sleep(0.01)
    finally:
        stop_serve(server)
    latencies.sort()
    assert len(latencies) == 299
    p50, p99 = (latencies[int(q * len(latencies))] * 1000 for q in (0.5, 0.99))
    print(f"\nhealthy subscriber beside '(.|.)*!': p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    # A backtracking match of this tag alone takes seconds and would hold the event loop for every
    # frame, so these bounds catch a ReDoS with a wide margin while staying clear of a loaded
    # machine's scheduling noise (the healthy latency itself is a benchmark figure, not a test's).
    assert p50 <= 200, latencies[len(latencies) // 2]
    assert p99 <= 1000, latencies[-5:]


HOST_NAMES = ["localhost", "127.0.0.1", "127.1.2.3", "[::1]", "dash.example"]
OTHER_NAMES = [
    "evil.example",
    "localhost.evil.example",
    "127.0.0.1.evil.example",
    "dash.example.evil",
    "xlocalhost",
    "0.0.0.0",
    "[::2]",
    "10.0.0.1",
    "localhost.",
]


@st.composite
def host_and_origin(draw, port: int) -> tuple[str, str | None, bool]:
    """A Host and an Origin header built from parts, with whether the server must serve them."""
    flip = draw(st.randoms(use_true_random=False))

    def cased(name: str) -> str:
        return "".join(c.upper() if flip.random() < 0.5 else c for c in name)

    name = draw(st.sampled_from(HOST_NAMES + OTHER_NAMES))
    host_port = draw(st.one_of(st.none(), st.just(port), st.integers(1, 65535)))
    host = cased(name) + ("" if host_port is None else f":{host_port}")
    allowed = name in HOST_NAMES
    kind = draw(st.sampled_from(["none", "null", "built", "text"]))
    if kind == "none":
        return host, None, allowed
    if kind == "null":
        return host, "null", False
    if kind == "text":
        text = draw(st.text(alphabet=string.ascii_letters + string.digits + ":/.[]@-", max_size=30))
        return host, text, allowed and text.lower() == f"http://{host.lower()}"
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "ws", "ftp"]))
    origin_name = draw(st.sampled_from([name, name, *HOST_NAMES, *OTHER_NAMES]))
    origin_port = draw(st.one_of(st.none(), st.just(port), st.just(host_port), st.integers(1, 9)))
    origin = f"{scheme}://{cased(origin_name)}" + ("" if origin_port is None else f":{origin_port}")
    default = {"http": 80, "ws": 80, "https": 443}.get(scheme.lower())
    effective = origin_port if origin_port is not None else default
    if default is None or origin_name != name:
        same = False
    elif host_port is None:  # behind a proxy: the Origin's own default port
        same = effective == default
    else:
        same = effective == host_port and scheme.lower() in ("http", "ws")
    return host, origin, allowed and same


@pytest.fixture(scope="module")
def gated_server(tmp_path_factory):
    server = start_serve(tmp_path_factory.mktemp("gated"), "--allow-host", "dash.example")
    yield server
    stop_serve(server)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_only_allowed_hosts_and_origins_pass(gated_server, data):
    port = urlsplit(gated_server.url).port
    host, origin, allowed = data.draw(host_and_origin(port))
    headers = {"Host": host} | ({} if origin is None else {"Origin": origin})
    status, _ = raw_get(gated_server.url, "/api/runs", headers)
    assert (status == 200) is allowed, (host, origin, status)
    assert status in (200, 400, 403)


def raw_handshake(base: str, path: str, headers: dict[str, str]) -> int:
    """Send a WebSocket handshake with exactly these headers (blocking); return the status."""
    parts = urlsplit(base)
    lines = [f"GET {path} HTTP/1.1"] + [f"{name}: {value}" for name, value in headers.items()]
    lines += [
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
        "Sec-WebSocket-Version: 13",
    ]
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), path=st.sampled_from(["/ws/live", "/ws/ingest"]))
def test_only_allowed_hosts_and_origins_open_websockets(gated_server, data, path):
    port = urlsplit(gated_server.url).port
    host, origin, allowed = data.draw(host_and_origin(port))
    headers = {"Host": host} | ({} if origin is None else {"Origin": origin})
    status = raw_handshake(gated_server.url, path, headers)
    assert status == (101 if allowed else 403), (host, origin, status)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(alphabet=string.ascii_letters + string.digits + ":.[]-_@%", max_size=40))
def test_arbitrary_host_headers_pass_only_when_allowed(gated_server, host):
    status, _ = raw_get(gated_server.url, "/api/runs", {"Host": host})
    name = re.sub(r":[0-9]{1,5}$", "", host.lower())
    if status == 200:
        assert name in HOST_NAMES or (
            name.startswith("127.") and name.count(".") == 3 and ipaddress.ip_address(name)
        ), host
    else:
        assert status in (400, 403)
