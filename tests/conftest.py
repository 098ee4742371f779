"""Shared fixtures: a real ``vdl-stream serve`` process and a real Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` until it is true; fail the test after ``timeout`` seconds. For state
    another thread or process changes, which has no event a test could wait on."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not met within {timeout:g} s: {what or condition}"
        time.sleep(0.005)


async def wait_until(condition: Callable[[], object], deadline: float, what: str) -> None:
    """In trio: check ``condition`` every 20 ms until true; fail naming ``what`` after
    ``deadline`` s. For state another task changes with no event to wait on."""
    import trio

    end = trio.current_time() + deadline
    while not condition():
        if trio.current_time() > end:
            pytest.fail(f"timed out after {deadline} s waiting for {what}")
        await trio.sleep(0.02)


def http_request(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    """GET ``url`` (blocking, 10 s at most); return status, content type and body, errors included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """GET a JSON ``url``; return the status and the decoded body (strict JSON: no NaN)."""
    status, _, body = http_request(url, headers)
    return status, json.loads(body or b"{}", parse_constant=_not_json)


def _not_json(name: str) -> None:
    raise ValueError(f"the server answered {name}, which is not JSON")


@dataclass
class ServeProcess:
    """A ``vdl-stream serve`` subprocess on 127.0.0.1 with a free port."""

    url: str
    logdir: Path
    proc: subprocess.Popen

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")


def start_serve(
    logdir: Path,
    *extra: str,
    port: int = 0,
    stderr: Any = subprocess.PIPE,
    preexec_fn: Callable[[], None] | None = None,
) -> ServeProcess:
    """Start ``vdl-stream serve`` and wait (at most 30 s) for the line that gives its URL.

    ``stderr`` (a pipe, or an open file) and ``preexec_fn`` (resource limits set in the child) go
    to :class:`subprocess.Popen`.
    """
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vdl_stream.cli",
            "serve",
            "--logdir",
            str(logdir),
            "--port",
            str(port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=preexec_fn,
    )
    line = proc.stdout.readline()  # "vdl-stream X: serving DIR at http://127.0.0.1:PORT/"
    if " at http" not in line:
        proc.kill()
        said = proc.stderr.read() if proc.stderr is not None else "(stderr in its file)"
        raise RuntimeError(f"serve did not start: {line!r} {said!r}")
    url = line.rsplit(" at ", 1)[1].strip().split("/?")[0].rstrip("/")
    return ServeProcess(url, logdir, proc)


def stop_serve(server: ServeProcess) -> int:
    """SIGTERM the server and wait for its graceful exit (killing it after 15 s)."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[ServeProcess]:
    """A running ``vdl-stream serve`` over a fresh log directory, stopped after the test."""
    server = start_serve(tmp_path / "logs")
    try:
        yield server
    finally:
        stop_serve(server)


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: run scripts/test.sh, which installs it")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class HeldWrites:
    """Holds the broker's writes (``Broker._persist``, in its worker thread) until :attr:`open`
    is set; :attr:`rounds` lists each write round's batch count as it arrives."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from vdl_stream.broker import Broker

        self.open = threading.Event()
        self.rounds: list[int] = []
        persist = Broker._persist

        def held(broker: Broker, items):  # type: ignore[no-untyped-def]
            self.rounds.append(len(items))
            assert self.open.wait(30), "the test never opened the writes"
            return persist(broker, items)

        monkeypatch.setattr(Broker, "_persist", held)
        # Every batch through the worker thread: one that ingest wrote itself (a small batch)
        # would hold the event loop, not just the writes.
        monkeypatch.setattr(Broker, "_write_here", lambda broker, items: False)


async def start_broker_server(nursery: Any, logdir: Path, **server: Any) -> tuple[Any, str]:
    """A broker on ``logdir`` and its web server on 127.0.0.1 (a free port, ``server`` passed to
    :func:`vdl_stream.server.serve_dashboard`), both run in ``nursery``; returns the broker and
    the server's URL."""
    from vdl_stream.broker import Broker
    from vdl_stream.server import serve_dashboard

    broker = Broker(logdir)
    await nursery.start(broker.run)
    url = await nursery.start(partial(serve_dashboard, broker, "127.0.0.1", 0, **server))
    return broker, url
