"""The page's replay bar in headless Chromium against a real ``vdl-stream replay``: it appears only
under replay (the first pushed ``replay`` frame shows it), follows the status the server pushes,
pause stops the charts, a seek back shows every chart as the run stood then on the same socket,
and play goes on from there. A page under ``vdl-stream serve`` asks nothing about replay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import recorder
from tests.test_dashboard import ARTIFACTS
from vdl_stream import attach

WALL = 1_700_000_000.0
POINTS = 1000
SPACING = 0.02  # recorded seconds between steps: 20 s of run, 50 steps per second at 1x
HIST_EVERY = 20
TELEMETRY_EVERY = 10
SCRUB_MAX = 10_000  # ui/src/views/replay.js

ACTIVE = "() => window.vdl && window.vdl.replay.state === 'active'"
CONNECTED = "() => window.vdl && window.vdl.connected"


def record_run(logdir: Path, run: str = "r") -> None:
    """A run at known wall times: two scalar tags, a histogram every HIST_EVERY steps, texts and
    images every 250 steps, and a telemetry sample every TELEMETRY_EVERY steps."""
    rng = np.random.default_rng(0)
    with attach(logdir, run=run, telemetry=False) as writer:
        for step in range(POINTS):
            wall = WALL + step * SPACING
            writer.add_scalar("train/loss", 1 / (step + 1), step, walltime=wall)
            writer.add_scalar("train/acc", step / POINTS, step, walltime=wall)
            if step % HIST_EVERY == 0:
                writer.add_histogram("weights", rng.normal(step, 1, 200), step, walltime=wall)
            if step % 250 == 0:
                writer.add_text("notes", f"at step {step}", step, walltime=wall)
                image = np.full((8, 8, 3), step % 256, dtype=np.uint8)
                writer.add_image("samples", image, step, walltime=wall)
    # Telemetry at known wall times too (a sampler stamps the time of day): appended as the
    # broker records the samples a writer sends.
    with recorder.RunWriter(logdir / run) as w:
        for step in range(0, POINTS, TELEMETRY_EVERY):
            fields = {"gpu0/util": float(step % 100), "cpu/percent": 50.0}
            w.append_record(
                "telemetry",
                None,
                None,
                WALL + step * SPACING,
                {"host": "node-1", "rank": 0, "fields": fields},
            )


@contextmanager
def replay_process(path: Path, *extra: str) -> Iterator[str]:
    """Run ``vdl-stream replay PATH --port 0 ...``; yield its URL; SIGTERM it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vdl_stream.cli", "replay", str(path), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline()  # "vdl-stream X: replaying r at http://127.0.0.1:PORT/"
        assert " at http" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield line.rsplit(" at ", 1)[1].strip()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def server_status(url: str) -> dict:
    """GET /api/replay from the test itself (not through the page)."""
    with urllib.request.urlopen(url.rstrip("/") + "/api/replay", timeout=10) as response:
        return json.loads(response.read())


def server_command(url: str, **body: object) -> dict:
    """POST /api/replay from the test itself: the page hears of it only through /ws/live."""
    request = urllib.request.Request(
        url.rstrip("/") + "/api/replay",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def steps(page, tag: str = "train/acc") -> list[int]:
    return page.evaluate(f"() => window.vdl.series('r', {tag!r}).steps")


def watch_sockets(page) -> list[str]:
    """Record the URL of every WebSocket the page opens."""
    opened: list[str] = []
    page.on("websocket", lambda ws: opened.append(ws.url))
    return opened


def test_the_bar_appears_under_replay_with_its_controls(tmp_path, browser):
    record_run(tmp_path / "logs")
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        with replay_process(tmp_path / "logs" / "r", "--paused", "--speed", "60") as url:
            page.goto(url)
            page.wait_for_function(ACTIVE, timeout=15_000)
            bar = page.locator(".replay-bar")
            assert bar.is_visible()
            assert bar.get_attribute("data-state") == "paused"
            status = page.evaluate("() => window.vdl.replay.status")
            assert status["start"] == WALL
            assert abs(status["end"] - (WALL + (POINTS - 1) * SPACING)) < 1e-6
            assert status["runs"] == ["r"] and status["playing"] is False
            assert status["step"] is None and status["version"] >= 0
            # the server's own --speed 60 is offered between the standard speeds, and selected
            speeds = page.locator("select.replay-speed option").evaluate_all(
                "(options) => options.map((o) => o.value)"
            )
            assert speeds == ["1", "10", "60", "100", "1000", "max"]
            assert page.locator("select.replay-speed").input_value() == "60"
            assert page.locator("input.replay-scrub").input_value() == "0"
            assert "Play" in page.locator("button.replay-play").inner_text()
            # it never asks: the status came on the socket, and nothing more is requested
            page.wait_for_timeout(2500)
            assert page.evaluate("() => window.vdl.replay.requests") == 0
            assert page.evaluate("() => window.vdl.replay.statusFrames") >= 1
            assert not [u for u in requests if "/api/" in u], requests
            page.evaluate("() => window.vdl.setLanguage('zh')")
            assert "播放" in page.locator("button.replay-play").inner_text()
    finally:
        page.close()


def test_no_bar_and_no_replay_request_under_serve(serve_process, browser):
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    failed: list[tuple[str, int]] = []
    page.on("response", lambda r: r.status >= 400 and failed.append((r.url, r.status)))
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function(CONNECTED, timeout=15_000)
        page.wait_for_function("() => window.vdl.sync.phase === 'ready'", timeout=15_000)
        page.wait_for_timeout(1500)  # a poll would have been due by now
        assert page.locator(".replay-bar").count() == 1
        assert not page.locator(".replay-bar").is_visible()
        assert page.evaluate("() => window.vdl.replay.state") == "absent"
        assert page.evaluate("() => window.vdl.replay.requests") == 0
        assert page.evaluate("() => window.vdl.replay.status") is None
        assert not [u for u in requests if "/api/replay" in u], requests
        assert failed == [], failed  # no 404 in the console
        assert not [m for m in console if m.startswith("error")], console
    finally:
        page.close()


def test_the_token_goes_with_the_replay_commands(tmp_path, browser):
    record_run(tmp_path / "logs")
    page = browser.new_page()
    try:
        with replay_process(tmp_path / "logs" / "r", "--paused", "--token", "s3cret") as url:
            assert url.endswith("/?token=s3cret")
            page.goto(url)
            page.wait_for_function(ACTIVE, timeout=15_000)
            assert "token" not in page.url
            page.locator("select.replay-speed").select_option("max")
            page.wait_for_function("() => window.vdl.replay.status.speed === 'max'", timeout=10_000)
            page.locator("button.replay-play").click()
            page.wait_for_function(
                f"() => window.vdl.series('r', 'train/acc').steps.length === {POINTS}",
                timeout=15_000,
            )
            assert page.evaluate("() => window.vdl.replay.error") == ""
            assert page.evaluate("() => window.vdl.replay.requests") == 2
    finally:
        page.close()


def test_the_bar_follows_the_pushed_status(tmp_path, browser):
    """Commands sent by someone else (here the test, over HTTP) reach the page on its socket."""
    record_run(tmp_path / "logs")
    page = browser.new_page()
    try:
        with replay_process(tmp_path / "logs" / "r", "--paused") as url:
            page.goto(url)
            page.wait_for_function(ACTIVE, timeout=15_000)
            bar = page.locator(".replay-bar")
            frames = page.evaluate("() => window.vdl.replay.statusFrames")

            server_command(url, action="play")  # at 1x the run takes 20 s
            page.wait_for_function(
                "() => document.querySelector('.replay-bar').dataset.state === 'playing'",
                timeout=5_000,
            )
            assert page.locator("button.replay-play").get_attribute("data-playing") == "true"

            answer = server_command(url, action="speed", speed=100)
            page.wait_for_function(
                "() => document.querySelector('select.replay-speed').value === '100'",
                timeout=5_000,
            )
            assert page.evaluate("() => window.vdl.replay.status.version") >= answer["version"]
            # at 100x the rest takes at most 0.2 s: the bar shows the end, and "Replay again"
            page.wait_for_function(
                "() => document.querySelector('.replay-bar').dataset.state === 'finished'",
                timeout=10_000,
            )
            assert page.locator("input.replay-scrub").input_value() == str(SCRUB_MAX)
            assert "Replay again" in page.locator("button.replay-play").inner_text()

            server_command(url, action="pause")
            page.wait_for_function("() => !window.vdl.replay.status.playing", timeout=5_000)
            server_command(url, action="seek", step=500)  # someone seeks: the bar goes there
            target = WALL + 500 * SPACING
            value = round(500 / (POINTS - 1) * SCRUB_MAX)
            page.wait_for_function(
                "() => Math.abs(document.querySelector('input.replay-scrub').value"
                f" - {value}) <= 1",
                timeout=5_000,
            )
            page.wait_for_function(
                "() => window.vdl.series('r', 'train/acc').steps.length === 500", timeout=5_000
            )
            assert abs(page.evaluate("() => window.vdl.replay.position") - target) < 1e-3
            assert bar.get_attribute("data-state") == "paused"
            assert page.locator(".replay-step").inner_text().endswith("499")
            assert page.evaluate("() => window.vdl.replay.statusFrames") >= frames + 4
            assert page.evaluate("() => window.vdl.replay.requests") == 0
            assert page.evaluate("() => window.vdl.stats.sockets") == 1

            # a page opened now gets the run as it stands at the replay position
            late = browser.new_page()
            try:
                late.goto(url)
                late.wait_for_function(ACTIVE, timeout=15_000)
                late.wait_for_function(
                    "() => window.vdl.sync.phase === 'ready'"
                    " && window.vdl.series('r', 'train/acc').steps.length === 500",
                    timeout=10_000,
                )
                assert steps(late) == list(range(500))
                hist = late.evaluate(
                    "() => window.vdl.store.runs.get('r').histograms.get('weights')"
                    ".map(h => h.step)"
                )
                assert hist == list(range(0, 500, HIST_EVERY))
                assert abs(late.evaluate("() => window.vdl.replay.position") - target) < 1e-3
                scrub = int(late.locator("input.replay-scrub").input_value())
                assert abs(scrub - value) <= 1
            finally:
                late.close()
    finally:
        page.close()


def test_pause_seek_back_and_play_from_the_bar(tmp_path, browser):
    record_run(tmp_path / "logs")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sockets = watch_sockets(page)
    play = page.locator("button.replay-play")
    try:
        with replay_process(tmp_path / "logs" / "r", "--paused") as url:
            page.goto(url)
            page.wait_for_function(ACTIVE, timeout=15_000)
            page.wait_for_function(CONNECTED, timeout=15_000)
            assert steps(page) == []  # started paused: nothing fed

            # play (1x: 50 steps a second)
            play.click()
            page.wait_for_function(
                "() => window.vdl.series('r', 'train/acc').steps.length >= 100", timeout=15_000
            )
            assert play.get_attribute("data-playing") == "true"

            # pause: the points stop advancing, and so does the scrubber
            play.click()
            page.wait_for_function(
                "() => window.vdl.replay.status.playing === false", timeout=10_000
            )
            page.wait_for_timeout(300)  # frames already on the way
            paused_at = len(steps(page))
            scrub_at = page.locator("input.replay-scrub").input_value()
            page.wait_for_timeout(1500)
            assert len(steps(page)) == paused_at < POINTS
            assert page.locator("input.replay-scrub").input_value() == scrub_at
            assert play.get_attribute("data-playing") == "false"
            assert page.locator(".replay-bar").get_attribute("data-state") == "paused"

            # seek back with the scrubber to step 40: announced on the same socket (reset,
            # fresh snapshots), no reconnect
            value = round(40 / (POINTS - 1) * SCRUB_MAX)
            target = WALL + value / SCRUB_MAX * (POINTS - 1) * SPACING
            expected = max(s for s in range(POINTS) if WALL + s * SPACING < target)
            t0 = time.monotonic()
            page.locator("input.replay-scrub").fill(str(value))
            page.wait_for_function(
                "() => { const s = window.vdl.series('r', 'train/acc').steps;"
                f" return s.length > 0 && s[s.length - 1] <= {expected}; }}",
                timeout=10_000,
            )
            took = time.monotonic() - t0
            assert abs(expected - 40) <= 1
            page.wait_for_timeout(300)  # nothing after the target may follow
            for tag in ("train/acc", "train/loss"):
                assert steps(page, tag) == list(range(expected + 1)), tag
            assert took < 5, took
            # every chart as it stood then: the drawn scalar chart, the histograms, the text
            page.evaluate("() => window.vdl.drawAll()")
            drawn = page.evaluate(
                "() => { const u = window.vdl.charts.get('train/acc'); return u.data[0]; }"
            )
            assert max(drawn) == expected
            hist_steps = page.evaluate(
                "() => window.vdl.store.runs.get('r').histograms.get('weights').map(h => h.step)"
            )
            assert hist_steps == list(range(0, expected + 1, HIST_EVERY))
            texts = page.evaluate(
                "() => window.vdl.store.runs.get('r').texts.get('notes').map(e => e.text)"
            )
            assert texts == ["at step 0"]
            images = page.evaluate(
                "() => window.vdl.store.runs.get('r').images.get('samples').map(e => e.step)"
            )
            assert images == [0]
            telemetry_walls = page.evaluate(
                "() => [...window.vdl.store.runs.get('r').telemetry.values()]"
                ".filter(t => t.field === 'gpu0/util')"  # column 1: wall times
                ".flatMap(t => Array.from(t.column(1)))"
            )
            assert telemetry_walls == [
                WALL + s * SPACING for s in range(0, expected + 1, TELEMETRY_EVERY)
            ]
            system = page.evaluate(
                "() => { const u = window.vdl.systemCharts.get('gpu/util'); return u.data[0]; }"
            )
            assert max(system) == WALL + (expected // TELEMETRY_EVERY) * TELEMETRY_EVERY * SPACING
            page.locator('[data-hist-tag="weights"][data-run="r"] canvas').wait_for(timeout=5_000)
            # the server is there, and the bar shows it (the status pushed after the seek too)
            assert abs(server_status(url)["position"] - target) < 1e-3
            version = server_status(url)["version"]
            page.wait_for_function(
                f"() => window.vdl.replay.status.version >= {version}", timeout=5_000
            )
            assert abs(page.evaluate("() => window.vdl.replay.status.position") - target) < 1e-3
            assert abs(int(page.locator("input.replay-scrub").input_value()) - value) <= 1
            assert page.locator(".replay-step").inner_text().endswith(str(expected))
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-replay.png"))

            # play resumes from there, at 100x, to the end
            page.locator("select.replay-speed").select_option("100")
            page.wait_for_function("() => window.vdl.replay.status.speed === 100", timeout=10_000)
            play.click()
            page.wait_for_function(
                f"() => window.vdl.series('r', 'train/acc').steps.length === {POINTS}",
                timeout=15_000,
            )
            assert steps(page) == list(range(POINTS))
            page.wait_for_function(
                "() => document.querySelector('.replay-bar').dataset.state === 'finished'",
                timeout=10_000,
            )
            assert page.locator("input.replay-scrub").input_value() == str(SCRUB_MAX)

            # at the end, the button replays from the start (a restart: reset and empty
            # snapshots, then data again, on the same socket)
            assert "Replay again" in play.inner_text()
            resets = page.evaluate("() => window.vdl.stats.frames")
            play.click()
            page.wait_for_function(
                f"() => window.vdl.series('r', 'train/acc').steps.length < {POINTS}"
                f" || window.vdl.stats.frames > {resets} + 3",
                timeout=10_000,
            )
            page.wait_for_function(
                "() => document.querySelector('.replay-bar').dataset.state === 'finished'"
                f" && window.vdl.series('r', 'train/acc').steps.length === {POINTS}",
                timeout=15_000,
            )
            assert steps(page) == list(range(POINTS))
            # one WebSocket all along: seeks and the restart never closed it
            assert page.evaluate("() => window.vdl.stats.sockets") == 1
            assert page.evaluate("() => window.vdl.stats.reconnects") == 0
            assert len(sockets) == 1, sockets
        assert errors == []
    finally:
        page.close()
