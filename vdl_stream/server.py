"""The web server: the dashboard page, the WebSocket endpoints and the HTTP API, over one broker.

``run_server`` is the whole ``vdl-stream serve`` task tree (broker, then web server);
``serve_dashboard`` serves an existing broker, which is how ``attach(serve=True)`` uses it. The
broker is started by the caller's nursery, never in quart-trio's ``app.nursery``.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import math
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from quart import Blueprint, Response, jsonify, request, websocket
from quart_trio import QuartTrio

from recorder import RecorderError

from . import __version__, codec
from .broker import DEFAULT_CACHE_BYTES, Broker
from .errors import InsecureBindError, PortInUseError
from .interop import Export, stream_export

log = logging.getLogger("vdl_stream.server")

STATIC_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
# The page loads nothing from elsewhere and may connect only back to this server.
CSP = (
    "default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; "
    "style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
SHUTDOWN_DEADLINE = 10.0
EXPORT_TYPES = {"csv": "text/csv; charset=utf-8", "json": "application/json"}
BLOB_TYPES = {"image": "image/png", "audio": "audio/wav"}


def is_loopback(host: str) -> bool:
    """Return whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket, turning "address in use" into a one-line :class:`PortInUseError`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                errno.EADDRINUSE,
                f"port {port} on {host} is already in use; choose another with --port "
                "(or port= in attach()), or 0 for any free port",
            ) from None
        raise
    sock.listen(1024)
    return sock


def _token_ok(expected: str | None, headers: Any, args: Any) -> bool:
    if expected is None:
        return True
    given = args.get("token", "")
    auth = headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        given = auth[len("Bearer ") :]
    return hmac.compare_digest(given.encode(), expected.encode())


def _origin_ok(headers: Any) -> bool:
    """Browsers send Origin on WebSockets; refuse pages from other sites (cross-site hijacking)."""
    origin = headers.get("Origin")
    return origin is None or urlsplit(origin).netloc == headers.get("Host", "")


def _finite(x: float | None) -> float | None:
    """JSON has no NaN or Infinity: they travel as null."""
    return x if x is not None and math.isfinite(x) else None


def _jsonable(event: dict[str, Any]) -> dict[str, Any]:
    """Make an event map JSON-ready: ``<f8`` columns become lists, media become their size."""
    out: dict[str, Any] = {}
    for key, value in event.items():
        if key == "data" and isinstance(value, bytes):
            out["data_bytes"] = len(value)  # fetch the media itself from /api/blob
        elif isinstance(value, bytes):
            out[key] = [_finite(v) for v in np.frombuffer(value, "<f8").tolist()]
        elif isinstance(value, float):
            out[key] = _finite(value)
        else:
            out[key] = value
    return out


def create_app(broker: Broker, token: str | None = None) -> QuartTrio:
    """Build the quart-trio application serving ``broker``."""
    app = QuartTrio("vdl_stream")
    static = resources.files("vdl_stream") / "static"

    @app.before_request
    async def require_token() -> Any:
        if request.path.startswith("/api/") and not _token_ok(token, request.headers, request.args):
            return jsonify(error="missing or wrong token"), 401
        return None

    @app.after_request
    async def security_headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.get("/")
    async def index() -> Response:
        return _static_response(static, "index.html")

    @app.get("/static/<name>")
    async def static_file(name: str) -> Response:
        if name not in STATIC_TYPES:
            return Response("not found", 404)
        return _static_response(static, name)

    @app.get("/api/runs")
    async def api_runs() -> Any:
        return jsonify(runs=broker.runs())

    @app.get("/api/tags")
    async def api_tags() -> Any:
        name = request.args.get("run", "")
        try:
            tags = await broker.tags(name)
        except KeyError:
            return jsonify(error=f"no run named {name!r}"), 404
        return jsonify(
            run=name,
            tags={
                tag: {
                    "kind": i.kind,
                    "count": i.count,
                    "step_min": i.step_min,
                    "step_max": i.step_max,
                    "min": _finite(i.vmin),
                    "max": _finite(i.vmax),
                }
                for tag, i in tags.items()
            },
        )

    @app.get("/api/scalars")
    async def api_scalars() -> Any:
        args = request.args
        name, tag = args.get("run", ""), args.get("tag", "")
        try:
            start = int(args["start"]) if "start" in args else None
            end = int(args["end"]) if "end" in args else None
            max_points = int(args["max_points"]) if "max_points" in args else None
        except ValueError:
            return jsonify(error="start, end and max_points must be integers"), 400
        if max_points is not None and max_points < 2:
            return jsonify(error=f"max_points must be at least 2, got {max_points}"), 400
        try:
            series = await broker.read_scalars(
                name, tag, start=start, end=end, max_points=max_points
            )
        except KeyError:
            return jsonify(error=f"no run {name!r} with tag {tag!r}"), 404
        return jsonify(
            run=name,
            tag=tag,
            steps=series.steps.tolist(),
            wall_times=series.walls.tolist(),
            values=[_finite(v) for v in series.values.tolist()],
        )

    @app.get("/api/events")
    async def api_events() -> Any:
        args = request.args
        name, kind, tag = args.get("run", ""), args.get("kind", ""), args.get("tag")
        try:
            events = await broker.read_events(name, kind, tag)
        except KeyError:
            return jsonify(error=f"no run {name!r} with events of kind {kind!r}"), 404
        return jsonify(run=name, kind=kind, tag=tag, events=[_jsonable(e) for e in events])

    @app.get("/api/blob")
    async def api_blob() -> Any:
        """The media of one image or audio event: ``run``, ``kind``, ``tag`` and ``index``."""
        args = request.args
        name, kind, tag = args.get("run", ""), args.get("kind", ""), args.get("tag", "")
        if kind not in BLOB_TYPES:
            return jsonify(error=f"kind must be one of {sorted(BLOB_TYPES)}, got {kind!r}"), 400
        try:
            index = int(args.get("index", "-1"))
            event = (await broker.read_events(name, kind, tag))[index]
        except (KeyError, IndexError, ValueError):
            return jsonify(error=f"no {kind} event {args.get('index')!r} for that run and tag"), 404
        return Response(event["data"], content_type=BLOB_TYPES[kind])

    @app.get("/api/telemetry")
    async def api_telemetry() -> Any:
        name = request.args.get("run", "")
        try:
            events = await broker.read_events(name, "telemetry")
        except KeyError:
            return jsonify(error=f"no run named {name!r}"), 404
        series: dict[str, dict[str, list[float | None]]] = {}
        for event in events:
            source = f"{event.get('host', '?')}/rank{event.get('rank', 0)}"
            for field, value in event.get("fields", {}).items():
                s = series.setdefault(f"{source}/{field}", {"wall_times": [], "values": []})
                s["wall_times"].append(event["wall"])
                s["values"].append(_finite(value))
        return jsonify(run=name, series=series)

    @app.get("/api/export")
    async def api_export() -> Any:
        """A run's scalars and telemetry as CSV (``tag,step,wall_time,value``) or JSON."""
        args = request.args
        name, fmt, pattern = args.get("run", ""), args.get("format", "csv"), args.get("tag")
        if fmt not in EXPORT_TYPES:
            return jsonify(error=f"format must be csv or json, got {fmt!r}"), 400
        try:
            path = broker.run_path(name)
            export = await trio.to_thread.run_sync(_export, path, fmt, pattern)
        except (KeyError, RecorderError):
            return jsonify(error=f"no run named {name!r}"), 404
        except re.error as exc:
            return jsonify(error=f"tag is not a valid regex: {exc}"), 400
        filename = name.replace("/", "_") + "." + fmt
        # Streamed chunk by chunk, each formatted in a worker thread: constant memory, and the
        # event loop never waits on a long run.
        response = Response(stream_export(export), content_type=EXPORT_TYPES[fmt])
        response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    @app.get("/api/stats")
    async def api_stats() -> Any:
        return jsonify(
            broker=broker.statistics().__dict__,
            subscribers=[s.__dict__ for s in broker.subscriber_statistics()],
        )

    @app.websocket("/ws/live")
    async def ws_live() -> Any:
        if not _origin_ok(websocket.headers):
            return Response("cross-origin WebSocket refused", 403)
        if not _token_ok(token, websocket.headers, websocket.args):
            return Response("missing or wrong token", 401)
        await websocket.accept()
        await websocket.send(
            codec.encode_message(
                {"type": "hello", "version": 1, "server": f"vdl-stream {__version__}"}
            )
        )
        await websocket.send(codec.encode_message({"type": "runs", "runs": broker.runs()}))
        await _live_session(broker)
        return None

    @app.websocket("/ws/ingest")
    async def ws_ingest() -> Any:
        if not _origin_ok(websocket.headers):
            return Response("cross-origin WebSocket refused", 403)
        if not _token_ok(token, websocket.headers, websocket.args):
            return Response("missing or wrong token", 401)
        await websocket.accept()
        await _ingest_session(broker)
        return None

    return app


def _export(path: Path, fmt: str, pattern: str | None) -> Export:
    """Open a run's export (blocking): the pattern is checked and the run opened here, so errors
    are answered before the response starts."""
    return Export(path, fmt, pattern)


def _static_response(static: Any, name: str) -> Response:
    response = Response((static / name).read_bytes(), content_type=STATIC_TYPES[name])
    response.headers["Cache-Control"] = "no-cache"
    return response


async def _live_session(broker: Broker) -> None:
    """Serve one browser: (re)subscribe on request, stream snapshot then live frames."""

    async def stream(
        runs: set[str] | None,
        tags: re.Pattern[str] | None,
        max_points: int,
        scope: trio.CancelScope,
    ) -> None:
        with scope:
            sub = broker.subscribe(runs, tags)
            try:
                await broker.send_snapshot(sub, websocket.send, max_points)
                while True:
                    await websocket.send(await sub.receive())
            except trio.EndOfChannel:
                await websocket.close(1001, "server shutting down")
            finally:
                broker.unsubscribe(sub)

    async with trio.open_nursery() as nursery:
        current: trio.CancelScope | None = None
        while True:
            try:
                message = codec.decode_message(await websocket.receive())
                if message["type"] != "subscribe":
                    raise codec.ProtocolError(f"unexpected message type {message['type']!r:.40}")
                runs = message.get("runs")
                if runs is not None and not (
                    isinstance(runs, list) and all(isinstance(r, str) for r in runs)
                ):
                    raise codec.ProtocolError("subscribe runs must be nil or an array of str")
                max_points = message.get("max_points", 2000)
                if type(max_points) is not int or not 2 <= max_points <= 100_000:
                    raise codec.ProtocolError("subscribe max_points must be an int in [2, 100000]")
                tags = _tag_pattern(message.get("tags"))
            except codec.ProtocolError as exc:
                await websocket.close(1008, str(exc)[:120])
                nursery.cancel_scope.cancel()
                return
            if current is not None:
                current.cancel()
            current = trio.CancelScope()
            nursery.start_soon(
                stream, None if runs is None else set(runs), tags, max_points, current
            )


def _tag_pattern(raw: object) -> re.Pattern[str] | None:
    """Compile a subscriber's tag pattern (a regular expression searched in each tag)."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or len(raw) > 200:
        raise codec.ProtocolError("subscribe tags must be nil or a regex of at most 200 characters")
    try:
        return re.compile(raw)
    except re.error as exc:
        raise codec.ProtocolError(f"subscribe tags is not a valid regex: {exc}") from None


async def _ingest_session(broker: Broker) -> None:
    """Serve one writer: ingest its batches in order, acknowledge each once persisted."""
    send, receive = trio.open_memory_channel[tuple[str, int, int, bool]](1024)

    async def acknowledge() -> None:
        async for writer, seq, broker_seq, durable in receive:
            await broker.wait_persisted(broker_seq, durable=durable)
            await websocket.send(codec.encode_ack(writer, seq))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(acknowledge)
        async with send:
            while True:
                data = await websocket.receive()
                try:
                    message = codec.decode_message(data)
                    if message["type"] != "batch":
                        raise codec.ProtocolError(
                            f"unexpected message type {message['type']!r:.40}"
                        )
                    batch = codec.decode_batch(message)
                except codec.ProtocolError as exc:
                    await websocket.close(1008, str(exc)[:120])
                    nursery.cancel_scope.cancel()
                    return
                try:
                    broker_seq = await broker.ingest(batch)
                except trio.ClosedResourceError:
                    await websocket.close(1001, "server shutting down")
                    nursery.cancel_scope.cancel()
                    return
                await send.send((batch.writer, batch.seq, broker_seq, batch.sync))


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve_dashboard(
    broker: Broker,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    *,
    insecure: bool = False,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    blueprints: Sequence[Blueprint] = (),
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard and WebSocket endpoints for ``broker`` until cancelled.

    Reports the dashboard URL through ``task_status``. When ``shutdown_trigger`` returns, stops
    accepting and gives open connections ``graceful_timeout`` to finish. ``blueprints`` are
    mounted on the app too (``vdl-stream replay`` adds its control endpoints this way).

    Raises:
        PortInUseError: the port is taken.
        InsecureBindError: ``host`` is not loopback and neither ``token`` nor ``insecure`` is given.
    """
    if not is_loopback(host) and token is None and not insecure:
        raise InsecureBindError(
            f"refusing to serve on {host} without a token: anyone who can reach it could read "
            "and write your runs. Pass --token T (the page then needs ?token=T), or --insecure."
        )
    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns the socket from here on
    config.websocket_max_message_size = codec.MAX_FRAME_BYTES
    config.accesslog = None  # access logs would carry ?token= query strings
    config.loglevel = "WARNING"  # our own start-up line says where we listen
    config.graceful_timeout = 2.0
    app = create_app(broker, token)
    for blueprint in blueprints:
        app.register_blueprint(blueprint)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(hypercorn_serve, app, config, shutdown_trigger=shutdown_trigger)
        )
        task_status.started(_url(host, bound_port))


async def run_server(
    logdir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    *,
    insecure: bool = False,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    shutdown_trigger: Callable[[], Awaitable[object]] = trio.sleep_forever,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``vdl-stream serve``: a broker over ``logdir`` and its web server.

    Reports the dashboard URL through ``task_status``. When ``shutdown_trigger`` returns it shuts
    down in order, within a deadline: stop ingest, drain and fsync every run, close subscribers
    (they get close code 1001), then stop the web server. ``cache_bytes`` is the budget of the
    broker's read cache (see :class:`~vdl_stream.broker.Broker`).
    """
    broker = Broker(logdir, cache_bytes=cache_bytes)
    web_stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await nursery.start(broker.follow)
        url = await nursery.start(
            partial(
                serve_dashboard,
                broker,
                host,
                port,
                token,
                insecure=insecure,
                shutdown_trigger=web_stop.wait,
            )
        )
        task_status.started(url)
        await shutdown_trigger()
        with trio.move_on_after(SHUTDOWN_DEADLINE) as deadline:
            broker.close()
            await broker.wait_closed()
        web_stop.set()
        if deadline.cancelled_caught:
            nursery.cancel_scope.cancel()
