"""The web server: the dashboard page, the WebSocket endpoints and the HTTP API, over one broker.

``run_server`` is the whole ``vdl-stream serve`` task tree (broker, then web server);
``serve_dashboard`` serves an existing broker, which is how ``attach(serve=True)`` uses it. The
broker is started by the caller's nursery, never in quart-trio's ``app.nursery``.

The app is two blueprints (:func:`pages_blueprint`, :func:`api_blueprint`) and the two WebSocket
endpoints, served below quart (:class:`WebSocketEndpoints`), behind one gate, :class:`Access`:
every request and every WebSocket handshake, including those of blueprints mounted later (``vdl-stream replay``'s), is checked for
its Host, its Origin and, on everything but the page itself, the token before any route sees it.
docs/security.md describes the model.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import resource
import socket
import struct
import sys
import termios
import time
import unicodedata
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import trio
from hypercorn.config import Config
from hypercorn.protocol import ws_stream
from hypercorn.trio import serve as hypercorn_serve
from quart import Blueprint, Response, jsonify, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage
from wsproto.extensions import PerMessageDeflate
from wsproto.frame_protocol import Opcode

from recorder import RecorderError

from . import __version__, codec, embeddings, masking, storage, telemetry
from .alerts import AlertEngine
from .broker import DEFAULT_CACHE_BYTES, Broker, SubscriberLimitError, default_read_processes
from .errors import InsecureBindError, PortInUseError, RefusedError
from .interop import (
    EXPORT_PROCESS_POINTS,
    EXPORT_PROCESSES,
    Export,
    child_threads,
    export_in_child,
    stream_export,
    stream_export_process,
)
from .run_summary import summaries_table_frame
from .webhooks import WebhookNotifier

log = logging.getLogger("vdl_stream.server")

#: Media types of the page's files, by suffix.
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
#: The page's files (ui/build.mjs): index.html, app.css, the ES modules app.js and laterviews.js
#: and the chunks they share (chunk-<hash>.js, named by the build), embed-worker.js (the
#: embeddings view's Web Worker). Listed once: ``/static/<name>`` serves these names only.
STATIC_FILES = frozenset(
    entry.name
    for entry in (resources.files("vdl_stream") / "static").iterdir()
    if entry.is_file() and Path(entry.name).suffix in STATIC_TYPES
)
# The page loads nothing from elsewhere and may connect only back to this server.
CSP = (
    "default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; "
    "style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
#: The paths served without the token: the page and its files, which read the token from the URL.
PUBLIC_PATHS = frozenset({"/", *(f"/static/{name}" for name in STATIC_FILES)})
SHUTDOWN_DEADLINE = 10.0
EXPORT_TYPES = {"csv": "text/csv; charset=utf-8", "json": "application/json"}
BLOB_TYPES = {"image": "image/png", "audio": "audio/wav"}
#: Media types of the other formats an event's ``data`` may have (add_video's GIFs).
BLOB_FORMAT_TYPES = {"gif": "image/gif"}
#: Addresses that mean "every interface": never a name a client can put in its Host header.
WILDCARD_HOSTS = {"", "0.0.0.0", "::"}
#: The port a URL without one means, per scheme (an Origin is http(s); a handshake ws(s)).
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
#: Close codes of the WebSocket limits (RFC 6455 section 7.4.1).
CLOSE_POLICY = 1008  # no subscribe / no batch in time
CLOSE_TRY_AGAIN_LATER = 1013  # too many browsers open
#: Seconds a writer refused for lack of room is asked to wait (the 503's Retry-After).
WRITER_RETRY_AFTER = 2
#: Runs one writer connection is remembered to have written (to mark them crashed if it is lost).
MAX_RUNS_PER_WRITER = 1024
#: The longest ``tags`` filter a subscriber may send.
MAX_TAG_FILTER = 200


# -- binding --------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Return whether ``host`` is a loopback address or ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(token: object) -> str | None:
    """Return ``token`` if it is usable as an access token (or None: no token), else raise.

    An empty or blank token is what ``--token "$UNSET"`` gives; accepting it would serve without
    authentication while the user believes a token protects the server.

    Raises:
        ValueError: ``token`` is empty, only whitespace, or not a str.
    """
    if token is None:
        return None
    if not isinstance(token, str):
        raise ValueError(f"token must be a str or None, got {type(token).__name__}")
    if not token.strip():
        raise ValueError(
            f"token must not be empty or blank, got {token!r}; "
            "is the variable that should hold it set?"
        )
    return token


def check_bind(host: str, token: str | None, *, insecure: bool = False) -> str | None:
    """Check what ``serve_dashboard`` is asked to bind before anything starts; return the token.

    ``attach(serve=True)`` and the command line reach this through :func:`serve_dashboard`.

    Raises:
        ValueError: the token is empty or blank (see :func:`check_token`).
        InsecureBindError: ``host`` is not loopback and neither ``token`` nor ``insecure`` is given.
    """
    token = check_token(token)
    if not is_loopback(host) and token is None and not insecure:
        raise InsecureBindError(
            f"refusing to serve on {host} without a token: anyone who can reach it could read "
            "and write your runs. Pass --token T (the page then needs ?token=T), or --insecure."
        )
    return token


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


# -- the gate: Host, Origin, token ------------------------------------------------------------------

# DNS labels of letters, digits, "-" and "_", joined by single dots; what werkzeug's IDNA check and
# every resolver accept. Bounded repeats over disjoint pieces: this regex cannot backtrack badly.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{1,5}")


def split_host(value: str) -> tuple[str, int | None] | None:
    """Split a Host header (or an Origin's authority) into a lower-case name and a port.

    ``name``, ``name:port``, ``1.2.3.4:port``, ``[::1]:port``; an IPv6 name comes back without
    brackets. Returns None for anything else (user info, paths, bad ports, non-ASCII names).
    """
    if len(value) > 260:
        return None
    value = value.lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        if not sep:
            return None
    else:
        name, colon, port_text = value.partition(":")
        rest = colon + port_text
        if not _HOST_NAME.fullmatch(name):
            return None
    if not rest:
        return name, None
    if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]) or int(rest[1:]) > 65535:
        return None
    return name, int(rest[1:])


def is_loopback_name(name: str) -> bool:
    """Return whether a Host name (from :func:`split_host`) is loopback: ``localhost``,
    127.0.0.0/8 or ``::1``. A DNS name that merely resolves to 127.0.0.1 is not: that is the
    DNS-rebinding attack."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def origin_matches(origin: str, host: str, scheme: str) -> bool:
    """Return whether ``origin`` (a browser's Origin header) is this server's own origin.

    ``host`` is the request's Host header and ``scheme`` its scheme (``http``/``https`` for a
    request, ``ws``/``wss`` for a handshake). The names must be equal ignoring case; the ports
    equal after applying each scheme's default port; an ``http`` page may open ``ws`` and an
    ``https`` page ``wss``. When the Host has no port (a proxy in front, whose scheme this
    server cannot see), the Origin must use its own scheme's default port. ``null`` (sandboxed
    frames, ``file:`` pages) never matches.
    """
    origin_scheme, sep, authority = origin.partition("://")
    origin_scheme = origin_scheme.lower()
    if not sep or origin_scheme not in DEFAULT_PORTS or "/" in authority:
        return False
    mine, theirs = split_host(host), split_host(authority)
    if mine is None or theirs is None or mine[0] != theirs[0]:
        return False
    origin_port = theirs[1] if theirs[1] is not None else DEFAULT_PORTS[origin_scheme]
    if mine[1] is None:
        return origin_port == DEFAULT_PORTS[origin_scheme]
    secure = scheme.lower() in ("https", "wss")
    return origin_port == mine[1] and (origin_scheme in ("https", "wss")) == secure


@dataclass(frozen=True)
class Denied:
    """Why the gate refused a request: the HTTP status and a message safe to show the client."""

    status: int
    message: str


class Access:
    """The one check every request and WebSocket handshake goes through: Host, Origin, token.

    Args:
        token: required on every path but the page (:data:`PUBLIC_PATHS`), as
            ``Authorization: Bearer T`` or ``?token=T``;
            None: no token.
        allowed_hosts: Host names accepted besides loopback (``localhost``, 127.0.0.0/8, ``[::1]``),
            any port; ``*`` accepts every name (only behind a proxy that checks Host itself).
        bind_host: the address the server listens on; accepted as a Host name unless it is a
            wildcard (``0.0.0.0``, ``::``).

    Raises:
        ValueError: an empty or blank token, or an allowed host that is not a plain host name.
    """

    def __init__(
        self,
        token: str | None = None,
        allowed_hosts: Iterable[str] = (),
        bind_host: str | None = None,
    ) -> None:
        self.token = check_token(token)
        names = set()
        for raw in allowed_hosts:
            names.add(check_allowed_host(raw))
        if bind_host is not None and bind_host not in WILDCARD_HOSTS:
            names.add(bind_host.lower().strip("[]"))
        self.allowed_hosts = frozenset(names)

    def host_allowed(self, host: str) -> bool:
        """Return whether a Host header names this server (see the class docstring)."""
        parsed = split_host(host)
        if parsed is None:
            return False
        return (
            is_loopback_name(parsed[0])
            or "*" in self.allowed_hosts
            or (parsed[0] in self.allowed_hosts)
        )

    def token_ok(self, headers: Any, args: Any) -> bool:
        """Return whether the request carries the token (always true without one)."""
        if self.token is None:
            return True
        given = args.get("token", "")
        scheme, _, credentials = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":  # auth schemes are case-insensitive (RFC 9110 11.1)
            given = credentials
        return hmac.compare_digest(given.encode(), self.token.encode())

    def check(self, path: str, scheme: str, headers: Any, args: Any) -> Denied | None:
        """Return why a request or handshake is refused, or None to let it through.

        ``headers`` and ``args`` are mappings with ``get`` (header names as sent, capitalised).
        """
        host = headers.get("Host", "")
        if not self.host_allowed(host):
            return Denied(
                403,
                f"Host {host[:80]!r} is not served here; start the server with --allow-host NAME "
                "to reach it by that name",
            )
        origin = headers.get("Origin")
        if origin is not None and not origin_matches(origin, host, scheme):
            return Denied(403, "cross-origin request refused")
        # An allow-list, not a prefix test: werkzeug serves //api/runs as /api/runs.
        if path not in PUBLIC_PATHS and not self.token_ok(headers, args):
            return Denied(401, "missing or wrong token")
        return None


class AccessGate:
    """ASGI middleware putting :meth:`Access.check` in front of every request and handshake.

    It runs before quart builds a request, so no route, error handler or blueprint (replay's
    included) sees a refused request, and a malformed Host never reaches werkzeug (whose own
    error for it escapes quart's handlers as an empty 500). A refused request gets its status and
    ``{"error": ...}``; a refused WebSocket handshake gets the status instead of ``101``.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        repeated = False
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.decode("latin-1").title()
            repeated |= name in headers and name in ("Host", "Origin", "Authorization")
            headers.setdefault(name, raw_value.decode("latin-1"))
        query = scope.get("query_string", b"").decode("latin-1")
        args = dict(reversed(parse_qsl(query, keep_blank_values=True, errors="replace")))
        if repeated:
            denied: Denied | None = Denied(400, "Host, Origin and Authorization may appear once")
        else:
            denied = self.access.check(scope["path"], scope["scheme"], headers, args)
        if denied is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await _send_denied(send, "http.response", denied)
        else:
            await receive()  # websocket.connect
            await _send_denied(send, "websocket.http.response", denied)


async def _send_denied(send: Any, prefix: str, denied: Denied) -> None:
    body = json.dumps({"error": denied.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"content-security-policy", CSP.encode()),
        (b"referrer-policy", b"no-referrer"),
    ]
    await send({"type": f"{prefix}.start", "status": denied.status, "headers": headers})
    await send({"type": f"{prefix}.body", "body": body, "more_body": False})


def check_allowed_host(raw: object) -> str:
    """Return an ``--allow-host`` value as the lower-case name it allows, or raise ``ValueError``."""
    if raw == "*":
        return "*"
    if not isinstance(raw, str) or (parsed := split_host(raw)) is None or parsed[1] is not None:
        raise ValueError(
            f"allowed host must be a host name or address without a port (or *), got {raw!r:.80}"
        )
    return parsed[0]


# -- limits ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Bounds on WebSockets (docs/security.md).

    Browsers and writers draw on separate pools, so idle connections of one kind can never lock
    out the other: ``max_websockets`` in all, of which at most ``max_browsers`` (and at most
    half) are ``/ws/live``; the rest are for ``/ws/ingest``. A WebSocket past its pool is closed
    at once with 1013 (try again later).

    Args:
        max_websockets: open WebSockets of both kinds together. None: half the process's
            open-file limit, at most 1024 (the other half stays for run files).
        max_browsers: open ``/ws/live`` connections at most.
        subscribe_timeout: seconds a ``/ws/live`` may stay open without a ``subscribe``
            (then closed with 1008).
        ingest_idle_timeout: seconds a ``/ws/ingest`` may stay open without its first batch
            (then closed with 1008; a writer reconnects by itself when it has data).
    """

    max_websockets: int | None = None
    max_browsers: int = 128
    subscribe_timeout: float = 5.0
    ingest_idle_timeout: float = 30.0

    def pools(self) -> tuple[int, int]:
        """Return how many browsers and how many writers may be connected at once."""
        total = self.max_websockets
        if total is None:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            total = 1024 if soft == resource.RLIM_INFINITY else max(4, min(1024, soft // 2))
        browsers = max(1, min(self.max_browsers, total // 2))
        return browsers, max(1, total - browsers)


# -- JSON helpers ---------------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    """JSON has no NaN or Infinity: they travel as null."""
    return x if x is not None and math.isfinite(x) else None


def _jsonable(event: dict[str, Any]) -> dict[str, Any]:
    """Make an event map JSON-ready: ``<f8`` columns become lists, media become their size."""
    out: dict[str, Any] = {}
    for key, value in event.items():
        if key in ("data", "sprite") and isinstance(value, bytes):
            out[f"{key}_bytes"] = len(value)  # fetch the media itself from /api/blob
        elif isinstance(value, bytes):
            out[key] = [_finite(v) for v in np.frombuffer(value, "<f8").tolist()]
        else:
            out[key] = _finite_tree(value)
    return out


def _finite_tree(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth, as None: JSON has no NaN or Infinity
    (hparams and their metrics may hold them; ingest bounds the nesting)."""
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, dict):
        return {k: _finite_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_tree(v) for v in value]
    return value


async def _embedding_blob(broker: Broker, name: str, tag: str) -> Any:
    """``/api/blob?kind=embedding``: ``part`` (matrix, metadata, sprite) of the event picked by
    ``step`` (the newest one of that step) or ``index`` (write order, negative from the end)."""
    part = request.args.get("part", "matrix")
    if part not in embeddings.BLOB_PARTS:
        return _error(
            400, f"part must be one of {sorted(embeddings.BLOB_PARTS)}, got {part[:20]!r}"
        )
    try:
        events = await broker.read_events(name, embeddings.KIND, tag)
        if "step" in request.args:
            step = int(request.args["step"])
            event = [e for e in events if e.get("step") == step][-1]
        else:
            event = events[int(request.args.get("index", "-1"))]
    except (KeyError, IndexError, ValueError):
        return _error(404, "no embedding of that step or index for that run and tag")
    found = embeddings.blob_part(event, part)
    if found is None:
        return _error(404, f"that embedding has no {part}")
    body, content_type = found
    if isinstance(body, dict):
        return jsonify(body)
    return Response(body, content_type=content_type)


def _error(status: int, message: str) -> tuple[Response, int]:
    return jsonify(error=message), status


def _bad_text(value: str) -> bool:
    """Return whether a query value holds characters no run or tag can contain: controls, format
    characters (bidi overrides, zero-width), line/paragraph separators, lone surrogates."""
    return any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in value)


def _query(name: str, default: str = "") -> str:
    """A query argument of the current request; raises ``_BadQuery`` for invisible characters."""
    value = request.args.get(name, default)
    if value and _bad_text(value):
        raise _BadQuery(f"{name} contains control or invisible characters")
    return value


class _BadQuery(Exception):
    """A query argument no run, tag or kind can match; answered with 400."""


# -- the subscriber's tag filter -------------------------------------------------------------------


class TagFilter:
    """A subscriber's tag filter: comma-separated globs, where ``*`` matches any run of characters.

    ``train/*`` keeps the tags under ``train/``, ``*loss*`` those containing ``loss``,
    ``train/*,eval/acc`` both. A glob matches the whole tag. Matching splits each glob at its
    ``*`` into literal pieces and finds them in order (greedy leftmost is exact for ``*``-only
    globs), so it takes time linear in the tag per piece and can never backtrack: unlike a regex,
    no filter can stall the event loop. It has the ``search(tag)`` and ``pattern`` that
    :class:`vdl_stream.broker.Subscriber` uses.
    """

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._globs = [g.strip().split("*") for g in pattern.split(",") if g.strip()]

    def search(self, tag: str) -> bool:
        """Return whether ``tag`` matches any of the globs."""
        return any(_glob_match(pieces, tag) for pieces in self._globs)

    def __repr__(self) -> str:
        return f"TagFilter({self.pattern!r})"


def _glob_match(pieces: list[str], tag: str) -> bool:
    first, *middle = pieces
    if not middle:
        return tag == first
    last = middle.pop()
    if len(tag) < len(first) + len(last) or not tag.startswith(first) or not tag.endswith(last):
        return False
    at, stop = len(first), len(tag) - len(last)
    for piece in middle:
        found = tag.find(piece, at, stop)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def tag_filter(raw: object) -> TagFilter | None:
    """Return the filter of a ``subscribe`` message's ``tags`` (None or "": every tag).

    Raises:
        codec.ProtocolError: ``tags`` is not a str of at most 200 characters.
    """
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or len(raw) > MAX_TAG_FILTER:
        raise codec.ProtocolError(
            f"subscribe tags must be nil or comma-separated globs of at most {MAX_TAG_FILTER} "
            "characters"
        )
    return TagFilter(raw)


# -- the app --------------------------------------------------------------------------------------


def create_app(
    broker: Broker,
    token: str | None = None,
    *,
    allowed_hosts: Iterable[str] = (),
    bind_host: str | None = None,
    limits: Limits | None = None,
) -> QuartTrio:
    """Build the quart-trio application serving ``broker``.

    Args:
        broker: the broker (or anything with its reading and subscribing methods).
        token: the access token of every path but the page's; None: none.
        allowed_hosts, bind_host: the Host names served besides loopback (see :class:`Access`).
        limits: the WebSocket limits; the defaults of :class:`Limits` when None.

    Raises:
        ValueError: an empty token or a malformed allowed host.
    """
    app = QuartTrio("vdl_stream")
    # Quart's documented place for middleware: everything app() serves passes the gate first.
    # /ws/live and /ws/ingest are served below quart (WebSocketEndpoints), behind the same gate.
    endpoints = WebSocketEndpoints(app.asgi_app, broker, limits or Limits())
    app.asgi_app = AccessGate(endpoints, Access(token, allowed_hosts, bind_host))  # type: ignore[method-assign]

    @app.after_request
    async def security_headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Any:
        return _error(error.code or 500, (error.name or "error").lower())

    @app.errorhandler(_BadQuery)
    async def bad_query(error: _BadQuery) -> Any:
        return _error(400, str(error))

    @app.errorhandler(Exception)
    async def internal_error(error: Exception) -> Any:
        # The client learns only that it failed; the traceback stays in the server's log.
        log.error("error serving %s", request.path, exc_info=error)
        return _error(500, "internal server error")

    app.register_blueprint(pages_blueprint())
    app.register_blueprint(api_blueprint(broker))
    return app


def pages_blueprint() -> Blueprint:
    """The dashboard page and its static files: ``/`` and ``/static/<name>``."""
    bp = Blueprint("pages", __name__)
    static = resources.files("vdl_stream") / "static"

    @bp.get("/")
    async def index() -> Response:
        return _static_response(static, "index.html")

    @bp.get("/static/<name>")
    async def static_file(name: str) -> Any:
        if name not in STATIC_FILES:
            return _error(404, "not found")
        return _static_response(static, name)

    return bp


def api_blueprint(broker: Broker) -> Blueprint:
    """The HTTP API over ``broker`` (docs/http-api.md): every ``/api/`` route but replay's."""
    bp = Blueprint("api", __name__)

    @bp.get("/api/runs")
    async def api_runs() -> Any:
        # One summary per run (docs/http-api.md, "Run summaries"), each encoded once per change.
        return Response(broker.summaries_json(), content_type="application/json")

    @bp.get("/api/tags")
    async def api_tags() -> Any:
        name = _query("run")
        try:
            tags = await broker.tags(name)
        except KeyError:
            return _error(404, f"no run named {name!r}")
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

    @bp.get("/api/scalars")
    async def api_scalars() -> Any:
        args = request.args
        name, tag = _query("run"), _query("tag")
        try:
            start = int(args["start"]) if "start" in args else None
            end = int(args["end"]) if "end" in args else None
            max_points = int(args["max_points"]) if "max_points" in args else None
        except ValueError:
            return _error(400, "start, end and max_points must be integers")
        if max_points is not None and max_points < 2:
            return _error(400, f"max_points must be at least 2, got {max_points}")
        missing = f"no run {name!r} with scalar tag {tag!r}"
        try:
            series = await broker.read_scalars(
                name, tag, start=start, end=end, max_points=max_points
            )
            # No points: an empty range of a real tag answers 200, a tag that is not one 404.
            if not len(series.steps):
                info = (await broker.tags(name)).get(tag)
                if info is None or info.kind != "scalars":
                    return _error(404, missing)
        except KeyError:
            return _error(404, missing)
        return jsonify(
            run=name,
            tag=tag,
            steps=series.steps.tolist(),
            wall_times=series.walls.tolist(),
            values=[_finite(v) for v in series.values.tolist()],
        )

    @bp.get("/api/events")
    async def api_events() -> Any:
        name, kind = _query("run"), _query("kind")
        tag = _query("tag") if "tag" in request.args else None
        try:
            events = await broker.read_events(name, kind, tag)
        except KeyError:
            return _error(404, f"no run {name!r} with events of kind {kind!r}")
        return jsonify(run=name, kind=kind, tag=tag, events=[_jsonable(e) for e in events])

    @bp.get("/api/blob")
    async def api_blob() -> Any:
        """The media of one image or audio event: ``run``, ``kind``, ``tag`` and ``index``."""
        name, kind, tag = _query("run"), _query("kind"), _query("tag")
        if kind == embeddings.KIND:  # embeddings block: the matrix, labels or sprite of one
            return await _embedding_blob(broker, name, tag)
        if kind not in BLOB_TYPES:
            return _error(400, f"kind must be one of {sorted(BLOB_TYPES)}, got {kind!r}")
        index_text = request.args.get("index", "-1")
        try:
            index = int(index_text)
            event = (await broker.read_events(name, kind, tag))[index]
        except (KeyError, IndexError, ValueError):
            return _error(404, f"no {kind} event {index_text[:20]!r} for that run and tag")
        content_type = BLOB_FORMAT_TYPES.get(event.get("format"), BLOB_TYPES[kind])
        return Response(event["data"], content_type=content_type)

    @bp.get("/api/telemetry")
    async def api_telemetry() -> Any:
        """Every telemetry field of a run over wall time: its ``@telemetry/`` scalar tags, and
        the ``telemetry`` events of a run written before those (converted in telemetry.py)."""
        name = _query("run")
        try:
            columns = telemetry.columns_from_events(await broker.read_events(name, "telemetry"))
            for tag, info in (await broker.tags(name)).items():
                if info.kind == "scalars" and telemetry.is_telemetry_tag(tag):
                    s = await broker.read_scalars(name, tag, start=None, end=None, max_points=None)
                    columns.append(codec.ScalarColumns(tag, s.steps, s.walls, s.values))
        except KeyError:
            return _error(404, f"no run named {name!r}")
        series = telemetry.series(columns)
        for s in series.values():
            s["values"] = [_finite(v) for v in s["values"]]
        return jsonify(run=name, series=series)

    @bp.get("/api/alerts")
    async def api_alerts() -> Any:
        """A run's alerts (docs/http-api.md, "Alerts"), oldest first; ``limit``: the newest N."""
        name = _query("run")
        limit_text = request.args.get("limit", "")
        try:
            limit = int(limit_text) if limit_text else None
            if limit is not None and limit < 1:
                raise ValueError
        except ValueError:
            return _error(400, f"limit must be a positive int, got {limit_text[:20]!r}")
        try:
            events = await broker.read_events(name, "alert")  # a replay source has it too
        except KeyError:
            return _error(404, f"no run named {name!r}")
        if limit is not None:
            events = events[-limit:]
        return jsonify(run=name, alerts=[_jsonable(e) for e in events])

    # Export child processes at once (interop.stream_export_process); more go in threads.
    export_slots = trio.Semaphore(EXPORT_PROCESSES)
    # A malformed VDL_STREAM_EXPORT_CHILD_THREADS fails here, at start, by name, rather than
    # cutting every large export short after its headers went out.
    child_threads()

    @bp.get("/api/export")
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
        # Streamed chunk by chunk in constant memory; the event loop never formats a row. A
        # large export is formatted by a child process on another core (off this process's
        # GIL), a small one in a worker thread (no process start). export_in_child() is cheap:
        # the count of stored points (a thread hop) only when it could send the export there.
        if export_in_child() and (
            await trio.to_thread.run_sync(export.stored_points) >= EXPORT_PROCESS_POINTS
        ):
            body = stream_export_process(export, export_slots)
        else:
            body = stream_export(export)
        response = Response(body, content_type=EXPORT_TYPES[fmt])
        # No time limit: Quart's RESPONSE_TIMEOUT (60 s) cut exports of tens of millions of
        # rows, or to a slow client, short mid-body.
        response.timeout = None
        response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    @bp.get("/api/stats")
    async def api_stats() -> Any:
        return jsonify(
            broker=broker.statistics().__dict__,
            # Under `vdl-stream replay` the source has no detectors.
            alerts=None
            if (a := getattr(broker, "alerts", None)) is None
            else a.statistics().__dict__,
            subscribers=[s.__dict__ for s in broker.subscriber_statistics()],
            store=_store_statistics(broker),
            bus=_bus_statistics(broker),
        )

    return bp


def _store_statistics(broker: Any) -> dict | None:
    """The object store sync's statistics, if the log directory is in one (a replay has none)."""
    stats = getattr(broker, "store_statistics", None)
    return None if stats is None else stats().__dict__


def _bus_statistics(broker: Any) -> dict | None:
    """The Redis bus's statistics, if this broker joined one (``--bus``; a replay has none)."""
    bus = getattr(broker, "_bus", None)
    return None if bus is None else bus.statistics().__dict__


class WebSocketSession:
    """One WebSocket, spoken in ASGI messages straight to the web server (hypercorn).

    ``/ws/live`` and ``/ws/ingest`` carry a message per batch and per browser, so they skip
    quart: no task and queue of its own between the server's receive and the handler, no signal
    sent per message, no request context (docs/performance.md, "(2026-12-01, h3-send)").

    Args:
        scope: the handshake's ASGI scope.
        receive, send: the server's ASGI callables for this connection.
    """

    __slots__ = ("_receive", "_send", "_wire", "accepted", "closed", "query")

    def __init__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self._receive = receive
        self._send = send
        self._wire: _Wire | None = None
        self.accepted = self.closed = False
        query = scope.get("query_string", b"").decode("latin-1")
        #: the handshake's query arguments (the first of a repeated name)
        self.query = dict(reversed(parse_qsl(query, keep_blank_values=True, errors="replace")))

    async def accept(self) -> None:
        """Complete the handshake (once)."""
        if not self.accepted:
            self.accepted = True
            await self._send({"type": "websocket.accept"})
            self._wire = _Wire.find(self._send) if WRITE_DIRECT else None
            # The client's frames unmasked with numpy: this connection's only, as this server
            # may run in a training process (attach(serve=True)) whose other wsproto users keep
            # wsproto's own masker (vdl_stream.masking).
            stream = getattr(self._send, "__self__", None)
            if type(stream) is ws_stream.WSStream:
                masking.unmask_connection(getattr(stream, "connection", None))

    async def send(self, data: bytes) -> None:
        """Send one binary message (dropped by the server once the connection is closed)."""
        if self._wire is None or not await self._wire.send((data,)):
            await self._send({"type": "websocket.send", "bytes": data})

    async def send_many(self, messages: Sequence[bytes]) -> None:
        """Send binary messages in order (on the socket with one system call where it can)."""
        if self._wire is None or not await self._wire.send(messages):
            for data in messages:
                await self._send({"type": "websocket.send", "bytes": data})

    def write_now(self, data: bytes) -> bool:
        """Write one binary message at once, without waiting, where it can go whole (written
        directly, :class:`_Wire`); return whether it went (False: nothing was written)."""
        return self._wire is not None and self._wire.write_now(data)

    async def receive(self) -> bytes | str | None:
        """Return the next message, or None once the peer is gone."""
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.receive":
                data = message.get("bytes")
                return message.get("text") if data is None else data
            if kind == "websocket.disconnect":
                self.closed = True
                return None

    async def close(self, code: int, reason: str = "") -> None:
        """Close with ``code`` and ``reason`` (once; a closed connection is left as it is)."""
        if not self.closed:
            self.closed = True
            await self._send({"type": "websocket.close", "code": code, "reason": reason})

    async def refuse(self, status: int, message: str, headers: Sequence[tuple[str, str]]) -> None:
        """Refuse the handshake with an HTTP ``status`` and ``{"error": message}``."""
        await self._receive()  # websocket.connect
        body = json.dumps({"error": message}).encode()
        fields = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        fields += [(name.lower().encode(), value.encode()) for name, value in headers]
        await self._send(
            {"type": "websocket.http.response.start", "status": status, "headers": fields}
        )
        await self._send({"type": "websocket.http.response.body", "body": body, "more_body": False})
        self.closed = True


#: Write WebSocket messages straight to hypercorn's socket (:class:`_Wire`): the event loop's CPU
#: for a batch at 10k events/s to about 0.64x, and on a quiet machine (load 0.6-1.8) a lower
#: p50 and p99 in each of four alternated pairs (docs/performance.md, "The evening's parts and
#: a short quiet pass"). Under heavy load the benchmark's subscribers (ten sockets
#: read by one Python process) fell behind more often with it (9 of 15 runs at load 1.6-15,
#: against 5 of 17): a server that answers sooner gets more, smaller batches from the writer,
#: so more frames to decode ("(2026-12-01, h4-live)"). False keeps hypercorn's send path.
WRITE_DIRECT = True

#: Seconds a browser may take nothing of a message written directly (:class:`_Wire`) before its
#: connection is cut. Long enough for a page that is busy or briefly throttled; a page that was
#: cut reconnects and subscribes again. hypercorn's own send path has no such bound.
STALLED_SEND_S = 60.0

#: Header of an unmasked, final, binary WebSocket frame (RFC 6455 5.2), by payload size.
_BINARY = 0x80 | Opcode.BINARY.value


def _frame_header(size: int) -> bytes:
    if size < 126:
        return bytes((_BINARY, size))
    if size < 1 << 16:
        return struct.pack("!BBH", _BINARY, 126, size)
    return struct.pack("!BBQ", _BINARY, 127, size)


def _untaken(parts: Sequence[bytes], written: int) -> bytes | memoryview:
    """What is left of ``parts`` once the socket took their first ``written`` bytes.

    Copied at most once, and only the rest: a view of the one part it lies in (usually the
    tail of a large frame, the header long written), or the untaken tail of one part joined
    with the parts after it. (``b"".join(parts)[written:]`` copied the whole frame, then the
    rest again: two copies of up to a megabyte on the event loop for each partial write.)
    """
    for i, part in enumerate(parts):
        if written < len(part):
            head = memoryview(part)[written:]
            return head if i == len(parts) - 1 else b"".join((head, *parts[i + 1 :]))
        written -= len(part)
    return b""


class _Wire:
    """The socket under one of hypercorn's HTTP/1.1 WebSockets, written without its send chain.

    Through ASGI, each message goes ``app_send`` -> wsproto -> the HTTP/1.1 protocol -> the
    connection's send lock and a shielded cancel scope -> ``send_all``, with three scheduler
    passes; at 10k events/s that chain, ten browsers and an ``ack`` a batch, was half of the
    event loop's CPU. Here a message is framed once, by wsproto's connection (so that its
    permessage-deflate context stays the server's), or for a message that goes uncompressed by a
    header put before the caller's bytes (the same ``bytes`` for every browser, not copied),
    and written with one ``writev`` while holding hypercorn's send lock, so that nothing it sends
    (a pong, a close) can come between; a part the socket did not take is sent with the lock
    still held. Found only on the shape it was written for (hypercorn's ``WSStream`` over
    HTTP/1.1 on a plain trio socket); anything else keeps the ASGI path.
    """

    __slots__ = ("deflate", "fd", "lock", "stream", "ws")

    def __init__(self, ws: Any, stream: trio.SocketStream, lock: trio.Lock) -> None:
        self.ws = ws
        self.stream = stream
        self.lock = lock
        self.fd = stream.socket.fileno()
        #: the client offered an extension (browsers offer permessage-deflate): a message of
        #: DEFLATE_FROM_BYTES or more goes to wsproto's connection, whose extension holds the
        #: compression context; smaller ones go uncompressed either way (QuickDeflate)
        self.deflate = bool(ws.handshake.extensions)

    @classmethod
    def find(cls, send: Any) -> _Wire | None:
        """Return the wire under an accepted WebSocket's ASGI ``send``, or None."""
        ws = getattr(send, "__self__", None)
        if type(ws) is not ws_stream.WSStream or not hasattr(ws, "connection"):
            return None
        protocol = getattr(ws.send, "__self__", None)
        server = getattr(getattr(protocol, "send", None), "__self__", None)
        stream = getattr(server, "stream", None)
        lock = getattr(server, "send_lock", None)
        if type(stream) is not trio.SocketStream or type(lock) is not trio.Lock:
            return None
        return cls(ws, stream, lock)

    async def send(self, messages: Sequence[bytes]) -> bool:
        """Write binary messages, in order, with one ``writev``; return False where the ASGI
        path must send them instead (the connection is closing, or the lock is held: they then
        queue behind what holds it)."""
        ws = self.ws
        connection = ws.connection
        if ws.closed or connection.state is not ConnectionState.OPEN:
            return False
        try:
            self.lock.acquire_nowait()
        except trio.WouldBlock:
            return False
        try:
            parts: list[bytes] = []
            for data in messages:
                if self.deflate and len(data) >= DEFLATE_FROM_BYTES:
                    parts.append(connection.send(BytesMessage(data=data)))
                else:  # what wsproto would write: a header and the bytes as they are
                    parts += (_frame_header(len(data)), data)
            size = sum(map(len, parts))
            try:
                written = os.writev(self.fd, parts)
            except BlockingIOError:
                written = 0
            except OSError:  # the peer is gone: the read side sees it and ends the connection
                return True
            if written < size:
                rest = _untaken(parts, written)
                # A frame goes whole, or not at all: shielded from the session's cancellation,
                # but not waiting for ever on a peer that takes nothing (a hung or hostile
                # browser would hold its pool place and this task for good). Past the deadline
                # the frame cannot be finished later, so the connection is cut; its read side
                # then ends the session.
                with (
                    trio.move_on_after(STALLED_SEND_S, shield=True) as scope,
                    contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                ):
                    await self.stream.send_all(rest)
                if scope.cancelled_caught:
                    with contextlib.suppress(OSError):
                        self.stream.socket.shutdown(socket.SHUT_RDWR)
        finally:
            self.lock.release()
        return True

    def write_now(self, data: bytes) -> bool:
        """Write one small binary message from synchronous code (the broker's fan-out,
        :attr:`Subscriber.direct`), if the socket takes it at once; return whether it went
        (False: nothing was written, and the caller queues it for the connection's send task).

        It is tried only where nothing can come between and the kernel takes it whole: the
        connection open, hypercorn's send lock free (no other message half written), the
        message under :data:`DIRECT_WRITE_BYTES` (under :data:`DEFLATE_FROM_BYTES` for a client
        with permessage-deflate, whose larger messages the connection's compression context
        must frame), and at most :data:`DIRECT_OUTQ_BYTES` not yet acknowledged on the socket
        (``SIOCOUTQ``), far under the smallest send buffer TCP gives a socket that is not short
        of memory: the kernel takes such a message whole, or nothing of it when the socket is
        full. Should it take part of one all the same (a system short of memory), the rest
        cannot wait for a task without another message possibly coming between (a pong
        hypercorn sends): the connection is cut, and the page reconnects.
        """
        ws = self.ws
        if (
            len(data) >= (DEFLATE_FROM_BYTES if self.deflate else DIRECT_WRITE_BYTES)
            or ws.closed
            or ws.connection.state is not ConnectionState.OPEN
            or self.lock.locked()
            or _OUTQ is None
        ):
            return False
        try:
            queued = fcntl.ioctl(self.fd, _OUTQ, _NO_BYTES)
        except OSError:
            return False
        if int.from_bytes(queued, sys.byteorder) > DIRECT_OUTQ_BYTES:
            return False
        header = _frame_header(len(data))
        try:
            written = os.writev(self.fd, (header, data))
        except BlockingIOError:
            return False
        except OSError:  # the peer is gone: the read side sees it and ends the connection
            return True
        if written < len(header) + len(data):
            log.warning("a live frame was cut short by the socket; closing that connection")
            with contextlib.suppress(OSError):
                self.stream.socket.shutdown(socket.SHUT_RDWR)
        return True


#: A live frame for a browser whose send task waits on an empty queue is written by the
#: broker's fan-out itself (:meth:`_Wire.write_now`): no task wake-up, queue hand-off and lock
#: per browser and batch. At 10k events/s to 10 subscribers, three pairs on a calmer machine:
#: the event loop's CPU a batch 0.69-0.94x, the p50 7.05-7.84 and 5.30 ms against 7.54-8.54 ms
#: (on two busy cores the end to end did not show it: docs/performance.md, "(2026-12-02,
#: h12-loop)", and the quiet pass after it). False: every frame goes through the send task.
WRITE_AT_OFFER = True

#: The largest message :meth:`_Wire.write_now` writes from the fan-out (to a client without
#: permessage-deflate), and the most bytes not yet acknowledged on the socket it writes behind:
#: with both, what the kernel holds for the socket stays far under the 16 kB send buffer TCP
#: starts a socket with (``tcp_wmem``), so that it takes the message whole or not at all.
DIRECT_WRITE_BYTES = 4096
DIRECT_OUTQ_BYTES = 4096
#: ``SIOCOUTQ`` (Linux's name for a socket's ``TIOCOUTQ``: its bytes not yet acknowledged),
#: and a buffer for its answer (an ``int``); without it, nothing is written from the fan-out.
_OUTQ = getattr(termios, "TIOCOUTQ", None)
_NO_BYTES = bytes(4)


class WebSocketEndpoints:
    """ASGI middleware serving ``/ws/live`` (browsers) and ``/ws/ingest`` (writers) itself, each
    within its pool of ``limits``; every other scope goes on to ``app`` (quart).

    It sits inside :class:`AccessGate`, so a handshake it sees passed the Host, Origin and token
    checks. Past its pool a browser is accepted and closed at once with 1013 (try again later): a
    page cannot read the status of a refused handshake, but it shows a close reason and
    reconnects with backoff. A writer is refused before the upgrade with 503 and ``Retry-After``;
    the transport reports that as an unreachable broker and backs off, where a close right after
    connecting would have it reconnect at once. A session that ends without closing closes with
    1000; one that fails is logged and closed by the server with 1011.
    """

    PATHS = ("/ws/live", "/ws/ingest")

    def __init__(self, app: Callable[..., Awaitable[None]], broker: Broker, limits: Limits) -> None:
        self.app = app
        self.broker = broker
        self.limits = limits
        self.caps = dict(zip(("browsers", "writers"), limits.pools(), strict=True))
        self.open_now = {"browsers": 0, "writers": 0}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket" or scope["path"] not in self.PATHS:
            await self.app(scope, receive, send)
            return
        ws = WebSocketSession(scope, receive, send)
        pool = "browsers" if scope["path"] == "/ws/live" else "writers"
        if self.open_now[pool] >= self.caps[pool]:
            reason = f"too many {pool} connected ({self.caps[pool]}); try again later"
            if pool == "writers":
                await ws.refuse(503, reason, [("Retry-After", str(WRITER_RETRY_AFTER))])
            else:
                await ws.accept()
                await ws.close(CLOSE_TRY_AGAIN_LATER, reason)
            return
        self.open_now[pool] += 1
        try:
            await ws.accept()
            if pool == "browsers":
                await self._live(ws)
            else:
                await _ingest_session(ws, self.broker, self.limits.ingest_idle_timeout)
            await ws.close(1000)
        finally:
            self.open_now[pool] -= 1

    async def _live(self, ws: WebSocketSession) -> None:
        broker = self.broker
        try:
            newest = parse_newest(ws.query)
        except codec.ProtocolError as exc:
            await ws.close(CLOSE_POLICY, str(exc)[:120])
            return
        hello: dict[str, Any] = {
            "type": "hello",
            "version": 1,
            "server": f"vdl-stream {__version__}",
        }
        runs = broker.runs()
        first = None
        if newest is not None and isinstance(broker, Broker):
            # The page's first selection, chosen here from the summaries it is about to get:
            # its snapshots leave right after the handshake, while the page builds itself.
            first = _Subscribe(
                _newest_runs(broker, runs, newest), None, newest.max_points, False, True, True
            )
            chosen = None if first.runs is None else sorted(first.runs)
            hello["subscribed"] = {"runs": chosen, "max_points": first.max_points}
        await ws.send(codec.encode_message(hello))
        await ws.send(codec.encode_message({"type": "runs", "runs": runs}))
        # Every run's summary now; later ones come with each subscription (see stream()). What
        # this frame holds is published first, so that later publications carry only changes
        # after it: a page that connected before the broker's first publication (within a
        # second of serve's start) was otherwise sent every run's summary again, 856 kB for
        # 1,000 runs, ahead of its first snapshot.
        publish = getattr(broker, "publish_summaries", None)
        if publish is not None:
            publish()
        since = broker.summary_tick
        await ws.send(_first_summaries(broker, ws.query.get("summaries")))
        await _live_session(ws, broker, self.limits.subscribe_timeout, since, first)


@dataclass(frozen=True)
class Newest:
    """A first subscription asked for in the ``/ws/live`` URL (docs/protocol.md, "The first
    subscription in the URL"): the ``count`` most recently active runs, or every run while
    there are at most ``all_up_to``, with ``max_points`` points per tag."""

    count: int
    all_up_to: int
    max_points: int


#: The ``/ws/live`` query arguments of a first subscription: (name, lowest, highest, default).
_NEWEST_ARGS = (
    ("newest", 1, 1000, None),
    ("all_up_to", 0, 100_000, 0),
    ("max_points", 2, 100_000, 2000),
)


def parse_newest(query: dict[str, str]) -> Newest | None:
    """The first subscription a ``/ws/live`` URL asks for (``?newest=N``, with ``all_up_to``
    and ``max_points``), or None when it asks for none.

    Raises:
        codec.ProtocolError: an argument that is not a decimal int in its range, or
            ``all_up_to`` / ``max_points`` without ``newest``.
    """
    values: dict[str, int] = {}
    for name, lowest, highest, default in _NEWEST_ARGS:
        text = query.get(name)
        if text is None:
            if default is not None:
                values[name] = default
            continue
        if re.fullmatch(r"[0-9]{1,7}", text) is None or not lowest <= int(text) <= highest:
            raise codec.ProtocolError(f"{name} must be an int in [{lowest}, {highest}]")
        values[name] = int(text)
    if "newest" not in values:
        if any(name in query for name, *_ in _NEWEST_ARGS):
            raise codec.ProtocolError("all_up_to and max_points need newest")
        return None
    return Newest(values["newest"], values["all_up_to"], values["max_points"])


def _newest_runs(broker: Broker, runs: list[str], newest: Newest) -> set[str] | None:
    """The runs of a first subscription: every run (None) while there are at most
    ``all_up_to``, else the ``count`` with the newest ``last_wall`` (runs without one last; ties
    by name), the page's default selection (ui/src/runs.js, ``selectDefault``)."""
    if len(runs) <= newest.all_up_to:
        return None
    walls = {s["name"]: s.get("last_wall") for s in broker.summaries()}

    def order(name: str) -> tuple[int, float, str]:
        wall = walls.get(name)
        return (1, 0.0, name) if wall is None else (0, -wall, name)

    return set(sorted(runs, key=order)[: newest.count])


class _TableCache:
    """The last ``summaries`` table frame, and the summary objects it was built from: a page
    that connects while no summary changed gets the same bytes (building the table costs about
    10 ms per 1,000 runs; the objects are the summaries' own, replaced on every change)."""

    def __init__(self) -> None:
        self.objs: list[dict[str, Any]] = []
        self.frame = b""


_table_cache = _TableCache()


def _first_summaries(broker: Any, form: str | None) -> bytes:
    """The ``summaries`` frame sent on connect: every run's summary, as a table when the page
    asked for one (``/ws/live?summaries=table``, docs/protocol.md) and the server keeps
    summaries as objects (``Broker.summaries``), else as the list of summary objects."""
    summaries = getattr(broker, "summaries", None)
    if form != "table" or summaries is None:
        return broker.summaries_frame()
    objs = summaries()
    cache = _table_cache
    if len(objs) != len(cache.objs) or any(
        a is not b for a, b in zip(objs, cache.objs, strict=True)
    ):
        try:
            cache.frame = summaries_table_frame(objs)
        except ValueError:  # a column with more distinct values than u2 indices hold: the list
            return broker.summaries_frame()
        cache.objs = objs
    return cache.frame


def _export(path: Path, fmt: str, pattern: str | None) -> Export:
    """Open a run's export (blocking): the pattern is checked and the run opened here, so errors
    are answered before the response starts."""
    return Export(path, fmt, pattern)


def _static_response(static: Any, name: str) -> Response:
    response = Response((static / name).read_bytes(), content_type=STATIC_TYPES[Path(name).suffix])
    response.headers["Cache-Control"] = "no-cache"
    return response


#: Live frames go to a browser whose subscription has ``batch`` at once while it gets fewer than
#: LIVE_RATE messages a second (with bursts of LIVE_BURST); past that, the frames queued meanwhile
#: wait for the next message, at most 1 / LIVE_RATE s, and travel in one ``frames`` message
#: (docs/protocol.md). A point is not held back by a timer when the link is quiet, and a page shown
#: 50 live runs gets at most 200 messages a second rather than one per run and batch.
LIVE_RATE = 200.0
LIVE_BURST = 20
#: Bounds of one ``frames`` message: frames, and bytes (a frame over it still goes, alone).
LIVE_BATCH_FRAMES = 512
LIVE_BATCH_BYTES = 4 << 20
#: Frames queued for a browser without ``batch`` written with one system call at most (each
#: frame two parts of a ``writev``, whose limit is 1,024 parts here).
LIVE_WRITE_FRAMES = 256


@dataclass(frozen=True)
class _Subscribe:
    """One checked ``subscribe`` message."""

    runs: set[str] | None
    tags: TagFilter | None
    max_points: int
    keep: bool
    split: bool
    batch: bool


def _parse_subscribe(message: dict[str, Any]) -> _Subscribe:
    """Check a ``subscribe`` message (docs/protocol.md); ``codec.ProtocolError`` names what is
    wrong."""
    if message["type"] != "subscribe":
        raise codec.ProtocolError(f"unexpected message type {message['type']!r:.40}")
    runs = message.get("runs")
    if runs is not None and not (isinstance(runs, list) and all(isinstance(r, str) for r in runs)):
        raise codec.ProtocolError("subscribe runs must be nil or an array of str")
    max_points = message.get("max_points", 2000)
    if type(max_points) is not int or not 2 <= max_points <= 100_000:
        raise codec.ProtocolError("subscribe max_points must be an int in [2, 100000]")
    flags = {}
    for key in ("keep", "split", "batch"):
        flags[key] = message.get(key, False)
        if type(flags[key]) is not bool:
            raise codec.ProtocolError(f"subscribe {key} must be a bool")
    return _Subscribe(
        None if runs is None else set(runs), tag_filter(message.get("tags")), max_points, **flags
    )


async def _send_live(
    sub: Any,
    send: Callable[[bytes], Awaitable[None]],
    batch: bool,
    send_many: Callable[[list[bytes]], Awaitable[None]] | None = None,
    write_now: Callable[[bytes], bool] | None = None,
) -> None:
    """Send ``sub``'s live frames as they come; with ``batch``, at most :data:`LIVE_RATE`
    messages a second (bursts of :data:`LIVE_BURST`), each holding every frame queued by then (a
    lone frame goes as itself). Without ``batch``, the frames queued by then go as one message
    each, together through ``send_many`` when given (one system call for a backlog). While
    this task waits on an empty queue, ``write_now`` (where given, and ``sub`` takes it:
    :attr:`Subscriber.direct`) sends a frame from the fan-out itself, without waking it; with
    ``batch``, only while two tokens are left, so that a frame it leaves queued finds the one
    this task needs to send it at once, as it would have."""
    take = getattr(sub, "receive_nowait", None)
    tokens, stamp = float(LIVE_BURST), trio.current_time()

    def refilled(now: float) -> float:
        """The bucket's tokens at ``now``."""
        return min(float(LIVE_BURST), tokens + (now - stamp) * LIVE_RATE)

    direct = None if take is None or not hasattr(sub, "direct") else write_now
    if direct is not None and batch:
        write = direct

        def paced(frame: bytes) -> bool:
            nonlocal tokens, stamp
            now = trio.current_time()
            left = refilled(now)
            if left < 2.0 or not write(frame):
                return False
            tokens, stamp = left - 1.0, now
            return True

        direct = paced

    while True:
        if batch:
            # A token bucket: waited for before a frame is taken, as a re-subscribe cancels
            # this task at any wait, and a frame taken must be sent (a re-subscription waits
            # for the frame going out).
            now = trio.current_time()
            tokens, stamp = refilled(now), now
            if tokens < 1.0:
                await trio.sleep((1.0 - tokens) / LIVE_RATE)
                continue
        if direct is None:
            frame = await sub.receive()
        else:
            sub.direct = direct  # only while waiting: a frame taken goes before any other
            try:
                frame = await sub.receive()
            finally:
                sub.direct = None
        if take is None or (not batch and send_many is None):
            await send(frame)
            continue
        frames, size, ended = [frame], len(frame), False
        most = LIVE_BATCH_FRAMES if batch else LIVE_WRITE_FRAMES
        while len(frames) < most and size < LIVE_BATCH_BYTES:
            try:
                frame = take()
            except trio.WouldBlock:
                break
            except trio.EndOfChannel:
                ended = True
                break
            frames.append(frame)
            size += len(frame)
        if not batch:
            await send_many(frames)  # type: ignore[misc]
        else:
            tokens -= 1.0
            await send(frames[0] if len(frames) == 1 else codec.encode_frames(frames))
        if ended:
            raise trio.EndOfChannel


@dataclass
class _Stream:
    """One subscription's stream task, as its connection's receive loop sees it."""

    scope: trio.CancelScope
    done: trio.Event
    #: a frame is going out (handed to the server, not yet written)
    sending: bool = False
    #: a re-subscription asked the stream to end once its frame is out
    stop: bool = False

    def end(self) -> None:
        """End the stream now, or after the frame going out (a frame cut off halfway would leave
        the browser's permessage-deflate state out of step with the server's: every later frame
        would fail to decode)."""
        if self.sending:
            self.stop = True
        else:
            self.scope.cancel()


async def _live_session(
    ws: WebSocketSession,
    broker: Broker,
    subscribe_timeout: float = 5.0,
    summaries_since: int | None = None,
    first: _Subscribe | None = None,
) -> None:
    """Serve one browser: (re)subscribe on request, stream snapshot then live frames.

    A browser that sends no ``subscribe`` within ``subscribe_timeout`` seconds is closed (1008):
    an open WebSocket costs a file descriptor, and an idle one would hold it forever. ``first``
    (the URL's first subscription, :func:`parse_newest`) is served as if the browser had sent it
    at once.

    Each subscription first gets the summaries published since publication ``summaries_since``
    (those sent on connect are older; ones dropped with a gap are re-sent this way), then its
    snapshots, then ``synced``, then live frames (summaries among them). A ``subscribe`` with
    ``keep`` changes the connection's subscription in place: only the runs the browser lacks get
    snapshots (:meth:`Broker.resubscribe`).
    """
    # The summaries the browser may lack are those published after publication
    # ``summaries_since``. A subscriber's queue gets every summary published after it subscribed
    # (publication ``sub_tick``), so once a stream sent the older ones, a ``keep``
    # re-subscription of the same subscriber, which lost nothing, needs only those after
    # ``sub_tick``: none of them again (each click in the runs table re-sent every summary
    # changed since the connection opened, 856 kB for a sweep of 1,000 runs).
    sub_tick = 0
    sent: tuple[Any, int] | None = None  # (subscriber, publication) the summaries went up to

    async def stream(sub: Any, ask: _Subscribe, missing: list[str] | None, me: _Stream) -> None:
        nonlocal sent

        async def send_whole(frame: bytes) -> None:
            await send_all_whole([frame])

        def write_now(frame: bytes) -> bool:
            # Not once the stream is ending (a re-subscription): its frames wait in the queue.
            return not (me.stop or me.scope.cancel_called) and ws.write_now(frame)

        async def send_all_whole(frames: list[bytes]) -> None:
            # A frame is never cut off by a re-subscription (``_Stream.end``): no cancel scope
            # and deadline a frame, which cost the event loop as much as the send's own
            # framing. Only the connection's end cancels a send, and nothing follows it then.
            if me.stop:
                me.scope.cancel()
                await trio.lowlevel.checkpoint()  # raises Cancelled
            me.sending = True
            await ws.send_many(frames)
            me.sending = False

        try:
            since = summaries_since
            if sent is not None and sent[0] is sub and not sub.lost:
                since = sent[1]
            # Subscribed first, so a summary published from now on reaches ``sub``.
            if (frame := broker.summaries_frame(since)) is not None:
                await send_whole(frame)
            sent = (sub, sub_tick)
            if isinstance(broker, Broker):
                await broker.send_snapshot(
                    sub, send_whole, ask.max_points, runs=missing, split=ask.split
                )
            else:  # a replay: whole snapshots of every run
                await broker.send_snapshot(sub, send_whole, ask.max_points)
            # Runs that could not be read were left out: the page stops waiting for them.
            await send_whole(codec.encode_message({"type": "synced", "seq": sub.after_seq}))
            await _send_live(
                sub, send_whole, ask.batch, send_all_whole, write_now if WRITE_AT_OFFER else None
            )
        except trio.EndOfChannel:
            await ws.close(1001, "server shutting down")
        finally:
            me.done.set()

    sub: Any = None
    try:
        async with trio.open_nursery() as nursery:
            current: _Stream | None = None
            while True:
                try:
                    if first is not None:
                        ask, first = first, None
                    else:
                        # Only the first subscribe has a deadline; a subscribed browser is busy.
                        with trio.move_on_after(
                            subscribe_timeout if current is None else math.inf
                        ) as waiting:
                            data = await ws.receive()
                        if waiting.cancelled_caught:
                            raise codec.ProtocolError(
                                f"no subscribe within {subscribe_timeout:g} s"
                            )
                        if data is None:  # the browser is gone
                            nursery.cancel_scope.cancel()
                            return
                        ask = _parse_subscribe(codec.decode_message(data))
                except codec.ProtocolError as exc:
                    await ws.close(CLOSE_POLICY, str(exc)[:120])
                    nursery.cancel_scope.cancel()
                    return
                if current is not None:
                    # The previous stream ends (each frame is sent whole) before ``sub`` changes.
                    current.end()
                    await current.done.wait()
                missing = None
                if (
                    ask.keep
                    and sub is not None
                    and isinstance(broker, Broker)
                    and _same_tags(sub.tags, ask.tags)
                ):
                    missing = broker.resubscribe(sub, ask.runs, ask.max_points)
                if missing is None:
                    if sub is not None:
                        broker.unsubscribe(sub)
                        sub = None
                    try:
                        sub = broker.subscribe(ask.runs, ask.tags)  # type: ignore[arg-type]
                        sub_tick = broker.summary_tick
                    except SubscriberLimitError as exc:
                        await ws.close(1013, str(exc)[:120])  # 1013: try again later
                        nursery.cancel_scope.cancel()
                        return
                current = _Stream(trio.CancelScope(), trio.Event())
                nursery.start_soon(_in_scope, current.scope, stream, sub, ask, missing, current)
    finally:
        if sub is not None:
            broker.unsubscribe(sub)


async def _in_scope(scope: trio.CancelScope, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Run ``fn(*args)`` inside ``scope`` (so that the caller can cancel that task alone)."""
    with scope:
        await fn(*args)


def _same_tags(a: Any, b: TagFilter | None) -> bool:
    """Whether two tag filters (a subscriber's and a ``subscribe``'s) are the same (None:
    every tag)."""
    return getattr(a, "pattern", None) == getattr(b, "pattern", None)


#: The most answers (``ack``, ``refused``) one send takes to a writer: a bound on one
#: ``writev``; more wait for the next.
MAX_ANSWERS_A_SEND = 64

#: A batch waiting for its answer: writer, its seq, the broker's seq, durable, and the refusal
#: if it was refused before it was written.
_Unanswered = tuple[str, int, int, bool, RefusedError | None]


async def _ingest_session(ws: WebSocketSession, broker: Broker, idle_after: float) -> None:
    """Serve one writer: ingest its batches in order, answer each once persisted or refused.

    Every batch gets exactly one answer, in the order the batches came: ``ack`` once it is
    written (and fsynced when it asked to sync), or ``refused`` with the reason and whether
    sending it again may succeed. A frame that is not a batch, or whose ``writer``/``seq`` is
    broken, closes the connection with 1008 (there is no batch to answer), and so does a writer
    that sends nothing within ``idle_after`` seconds of connecting. A writer that connected with
    ``?taken=1`` also gets ``taken`` as soon as its batch was ingested (numbered, fanned out and
    queued for its write), ahead of the ``ack``: its window frees a place then (transport.TAKEN).
    """
    send, receive = trio.open_memory_channel[_Unanswered](1024)
    # Runs this connection wrote: when it ends, those without a close marker read as crashed.
    runs: set[str] = set()
    try:
        await _ingest_batches(ws, broker, send, receive, runs, idle_after)
    finally:
        broker.writer_lost(runs)


async def _ingest_batches(
    ws: WebSocketSession,
    broker: Broker,
    send: trio.MemorySendChannel[_Unanswered],
    receive: trio.MemoryReceiveChannel[_Unanswered],
    runs: set[str],
    idle_after: float,
) -> None:

    async def answer_of(item: _Unanswered) -> bytes:
        writer, seq, broker_seq, durable, refusal = item
        if refusal is None:
            try:
                await broker.wait_written(broker_seq, durable=durable)
            except RefusedError as exc:
                refusal = exc
        if refusal is None:
            return codec.encode_ack(writer, seq)
        return codec.encode_refused(writer, seq, refusal.reason, refusal.retryable)

    def due(item: _Unanswered) -> bool:
        """Whether ``item``'s answer is known now (answer_of would not wait)."""
        _, _, broker_seq, durable, refusal = item
        return refusal is not None or (not durable and broker.written(broker_seq))

    async def answer() -> None:
        # The answers that are due together go together, in order, in one send (one system
        # call with the direct writes): a persist round writes every batch queued behind the
        # one it was writing, and the writer's window frees its places at once.
        later: _Unanswered | None = None
        while True:
            if later is None:
                try:
                    later = await receive.receive()
                except trio.EndOfChannel:
                    return
            answers = [await answer_of(later)]
            later = None
            while len(answers) < MAX_ANSWERS_A_SEND:
                try:
                    item = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if not due(item):
                    later = item
                    break
                answers.append(await answer_of(item))
            await ws.send_many(answers)

    # The writer asked to hear when a batch is taken: its window counts those not yet taken.
    say_taken = ws.query.get("taken") == "1"
    with trio.move_on_after(idle_after) as waiting:
        data = await ws.receive()
    if waiting.cancelled_caught:
        await ws.close(CLOSE_POLICY, f"nothing received within {idle_after:g} s")
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        async with send:
            while data is not None:  # None: the writer is gone
                try:
                    message = codec.decode_message(data)
                    if message["type"] != "batch":
                        raise codec.ProtocolError(
                            f"unexpected message type {message['type']!r:.40}"
                        )
                    batch = codec.decode_batch(message)
                except codec.BatchError as exc:
                    refusal = RefusedError(f"bad batch: {exc}"[:200], retryable=False)
                    await send.send((exc.writer, exc.seq, 0, False, refusal))
                    data = await ws.receive()
                    continue
                except codec.ProtocolError as exc:
                    await ws.close(CLOSE_POLICY, str(exc)[:120])
                    break
                if len(runs) < MAX_RUNS_PER_WRITER:
                    runs.add(batch.run)
                try:
                    broker_seq = await broker.ingest(batch)
                except RefusedError as exc:
                    await send.send((batch.writer, batch.seq, 0, False, exc))
                    data = await ws.receive()
                    continue
                except trio.ClosedResourceError:
                    await ws.close(1001, "server shutting down")
                    break
                if say_taken:
                    # First: with the direct writes it leaves before this task yields again (to
                    # the subscribers' sends the fan-out woke), and it frees the writer's window.
                    await ws.send(codec.encode_taken(batch.writer, batch.seq))
                for notice in broker.take_notices(batch.writer):
                    await ws.send(codec.encode_notice(batch.writer, notice))
                await send.send((batch.writer, batch.seq, broker_seq, batch.sync, None))
                data = await ws.receive()
        nursery.cancel_scope.cancel()


def _url(host: str, port: int) -> str:
    """The URL to print for a server bound to ``host``: a wildcard bind is reached from this
    machine through loopback (a Host of ``0.0.0.0`` is not served, and not every system can
    connect to it)."""
    if host in WILDCARD_HOSTS:
        host = "::1" if host == "::" else "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _AcceptErrorsOnce(logging.Filter):
    """Let trio's "accept returned EMFILE" errors through once a minute, as one line.

    When the process runs out of file descriptors trio's listener retries accept() every 100 ms
    and logs each failure with a traceback; the log would fill with identical lines.
    """

    INTERVAL = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._last = -math.inf
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "accept returned" not in record.getMessage():
            return True
        now = time.monotonic()
        if now - self._last < self.INTERVAL:
            self._suppressed += 1
            return False
        self._last = now
        error = record.exc_info[1] if record.exc_info else None
        cause = getattr(error, "strerror", None) or "out of resources"
        record.msg = (
            "cannot accept new connections: %s; they wait until others close "
            "(raise the limit with ulimit -n, or lower --max-connections)%s"
        )
        more = f" [{self._suppressed} repeats in the last minute]" if self._suppressed else ""
        record.args = (cause, more)
        record.exc_info = record.exc_text = None
        self._suppressed = 0
        return True


async def serve_dashboard(
    broker: Broker,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    *,
    insecure: bool = False,
    allowed_hosts: Iterable[str] = (),
    limits: Limits | None = None,
    sock: socket.socket | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    blueprints: Sequence[Blueprint] = (),
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard and WebSocket endpoints for ``broker`` until cancelled.

    Reports the dashboard URL through ``task_status``. When ``shutdown_trigger`` returns, stops
    accepting and gives open connections ``graceful_timeout`` to finish. ``blueprints`` are
    mounted on the app too (``vdl-stream replay`` adds its control endpoints this way); the
    Host, Origin and token checks cover them. ``allowed_hosts`` are Host names served besides
    loopback and ``host`` itself; ``limits`` bound the WebSockets. ``sock``, a socket already
    bound with :func:`bind_socket` to ``host``, is served instead of binding a new one.

    Raises:
        ValueError: an empty or blank ``token``, or a malformed allowed host.
        PortInUseError: the port is taken.
        InsecureBindError: ``host`` is not loopback and neither ``token`` nor ``insecure`` is given.
    """
    token = check_bind(host, token, insecure=insecure)
    app = create_app(broker, token, allowed_hosts=allowed_hosts, bind_host=host, limits=limits)
    for blueprint in blueprints:
        app.register_blueprint(blueprint)
    if sock is None:
        sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns the socket from here on
    config.websocket_max_message_size = codec.MAX_FRAME_BYTES
    config.accesslog = None  # access logs would carry ?token= query strings
    config.loglevel = "WARNING"  # our own start-up line says where we listen
    config.graceful_timeout = 2.0
    # hypercorn offers its WebSockets this extension by name; it has no setting for the level.
    ws_stream.PerMessageDeflate = QuickDeflate
    accept_log = logging.getLogger("trio.serve_listeners")
    once = _AcceptErrorsOnce()
    accept_log.addFilter(once)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(hypercorn_serve, app, config, shutdown_trigger=shutdown_trigger)
            )
            task_status.started(_url(host, bound_port))
    finally:
        accept_log.removeFilter(once)


#: Messages to a browser below this many bytes go uncompressed (:class:`QuickDeflate`): a live
#: frame at 10k events/s (10 tags of 3 points, 972 bytes) cost each browser 10-20 us of deflate on
#: the event loop to save 640 bytes that travel in the same single segment anyway.
DEFLATE_FROM_BYTES = 1400


class QuickDeflate(PerMessageDeflate):
    """permessage-deflate at zlib level 1 instead of the default 6, and none for a message under
    :data:`DEFLATE_FROM_BYTES`.

    Frames are mostly packed float64 columns, which level 6 shrinks no further than level 1
    (a 0.96 MB snapshot frame: 511 kB against 517 kB) at three times the CPU (45 against 15 ms
    here), and the compression runs on the event loop, in front of every other browser's frames.
    """

    def frame_outbound(self, proto: Any, opcode: Any, rsv: Any, data: bytes, fin: bool) -> Any:
        if fin and opcode is not Opcode.CONTINUATION and len(data) < DEFLATE_FROM_BYTES:
            # A whole message this small fits one TCP segment compressed or not: sent as it is
            # (RSV1 clear, which RFC 7692 allows for any message; the browser's inflater keeps
            # its context for the compressed ones), it costs neither side a deflate.
            return rsv, data
        if self._compressor is None:  # made here, as the base class would, but at level 1
            bits = self.client_max_window_bits if proto.client else self.server_max_window_bits
            self._compressor = zlib.compressobj(1, zlib.DEFLATED, -int(bits))
        return super().frame_outbound(proto, opcode, rsv, data, fin)


async def _until_closed(
    broker: Broker, service: Callable[..., Awaitable[None]], *, task_status: Any
) -> None:
    """Run ``service`` (started with ``nursery.start``) until ``broker`` is closed."""
    async with trio.open_nursery() as nursery:
        await nursery.start(service)
        task_status.started()
        await broker.wait_closed()
        nursery.cancel_scope.cancel()


async def run_server(
    logdir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    *,
    insecure: bool = False,
    allowed_hosts: Iterable[str] = (),
    limits: Limits | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    bus: str | None = None,
    bus_lease: float | None = None,
    alerts: AlertEngine | bool | None = None,
    webhooks: WebhookNotifier | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]] = trio.sleep_forever,
    cache_dir: str | Path | None = None,
    foreign: bool = True,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``vdl-stream serve``: a broker over ``logdir`` and its web server.

    With ``foreign`` (the default; not with an object store) the TensorBoard event files and
    VisualDL record files under ``logdir`` are followed as read-only runs, their mirrors kept
    under ``cache_dir`` (:mod:`vdl_stream.foreign`, docs/interop.md).

    ``logdir`` may be an object store URL (``s3://bucket/prefix``, ``gs://``, ``az://``): the
    broker then keeps its runs' heads in ``cache_dir`` (by default under ``$VDL_STREAM_CACHE``
    or ``~/.cache/vdl-stream``), publishes them to the store and serves the store's other runs
    (vdl_stream/storage.py).

    ``bus``, a ``redis://`` URL, joins this broker to the others on that Redis (``--bus``,
    :mod:`vdl_stream.bus`; ``bus_lease`` is the run leases' time to live in seconds).

    ``alerts`` is the detector engine that watches ingest (docs/alerts.md); one with the default
    rules when None or True, none at all when False. ``webhooks``, when given, is started too (the engine's ``notify`` feeds it).

    Reports the dashboard URL through ``task_status``. When ``shutdown_trigger`` returns it shuts
    down in order, within a deadline: stop ingest, drain and fsync every run, close subscribers
    (they get close code 1001), then stop the web server. The arguments are checked and the port
    bound before the broker reads the log directory, so a bad one fails at once.
    ``cache_bytes`` is the budget of the broker's read cache (see
    :class:`~vdl_stream.broker.Broker`).

    Raises:
        ValueError, PortInUseError, InsecureBindError: as :func:`serve_dashboard`.
    """
    check_bind(host, token, insecure=insecure)
    Access(token, allowed_hosts, host)  # a bad --allow-host fails before anything starts
    sync = None
    if storage.is_store_url(logdir):  # runs in an object store (docs/object-storage.md)
        local = storage.cache_dir(str(logdir), cache_dir)
        sync = storage.StoreSync(storage.ObstoreClient(str(logdir)), local)
        logdir = local
    if alerts is None or alerts is True:
        alerts = AlertEngine()
    sock = bind_socket(host, port)
    try:
        broker = Broker(
            logdir,
            cache_bytes=cache_bytes,
            prepare_write=None if sync is None else sync.prepare_write,
            # Not over an object store: its runs' bytes are fetched by this process's readers.
            read_processes=default_read_processes() if sync is None else 0,
        )
        web_stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            if sync is not None:
                broker.store_statistics = sync.statistics
                await nursery.start(sync.run, broker.wait_closed)
            if bus is not None:  # several brokers, one dashboard (vdl_stream/bus.py)
                from .bus import LEASE_TTL, Bus

                await nursery.start(Bus(broker, bus, lease_ttl=bus_lease or LEASE_TTL).run)
            await nursery.start(broker.follow)
            if foreign and sync is None:  # foreign block: TensorBoard/VisualDL files (foreign.py)
                from .foreign import ForeignRuns, cache_root

                broker.foreign = ForeignRuns(logdir, cache_root(logdir, cache_dir))
                await nursery.start(_until_closed, broker, partial(broker.foreign.run, broker))
            if alerts is not False:
                await nursery.start(alerts.run, broker)
            if webhooks is not None:
                await nursery.start(_until_closed, broker, webhooks.run)
            url = await nursery.start(
                partial(
                    serve_dashboard,
                    broker,
                    host,
                    port,
                    token,
                    insecure=insecure,
                    allowed_hosts=allowed_hosts,
                    limits=limits,
                    sock=sock,
                    shutdown_trigger=web_stop.wait,
                )
            )
            # The first page's summaries table is built now, before the URL is given out, not
            # on the event loop between that page's `runs` and `summaries` frames (20-25 ms of
            # CPU per 1,000 runs; a sweep's summaries do not change until a run does, so the
            # page gets these bytes: docs/performance.md, h6-cold).
            _first_summaries(broker, "table")
            # What start-up built (modules, the app, the broker's indexes: about 60,000 objects)
            # lives as long as the server: out of the collector's reach, a full collection no
            # longer walks it (one took 15-50 ms in the middle of a 10k events/s run, a pause
            # every live frame queued behind; docs/performance.md, "10k events/s to the browser").
            # Only here, the ``serve`` process's: a training process serving its own dashboard
            # (session.py) keeps its heap as its program left it.
            gc.freeze()
            task_status.started(url)
            await shutdown_trigger()
            with trio.move_on_after(SHUTDOWN_DEADLINE) as deadline:
                broker.close()
                await broker.wait_closed()
            web_stop.set()
            if deadline.cancelled_caught:
                nursery.cancel_scope.cancel()
    finally:
        if sock.fileno() != -1:  # never handed to the web server
            sock.close()
