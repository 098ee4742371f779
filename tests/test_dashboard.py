"""The dashboard in a real headless Chromium against a real ``vdl-stream serve``."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import trio

import recorder
from vdl_stream import attach
from vdl_stream.broker import Broker
from vdl_stream.server import serve_dashboard

# Predicates are passed as functions, never as expression strings: Playwright evaluates strings
# with eval(), which the page's Content-Security-Policy rightly forbids.
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def test_logged_points_arrive_live_in_the_chart(serve_process, browser):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function("() => window.vdl && window.vdl.connected", timeout=15_000)
        with attach(url=serve_process.ws_url, run="live-run") as writer:
            for step in range(300):
                writer.add_scalar("train/loss", 1.0 / (step + 1), step)
            assert writer.flush(timeout=20)
            page.wait_for_function(
                "() => window.vdl.series('live-run', 'train/loss').steps.length === 300",
                timeout=15_000,
            )
            received = page.evaluate("window.vdl.series('live-run', 'train/loss')")
            assert received["steps"] == list(range(300))
            assert received["values"] == [1.0 / (s + 1) for s in range(300)]
            # more points while the page is open: they are pushed, no reload
            for step in range(300, 350):
                writer.add_scalar("train/loss", -1.0, step)
            writer.flush(timeout=20)
            page.wait_for_function(
                "() => window.vdl.series('live-run', 'train/loss').steps.length === 350",
                timeout=15_000,
            )
        # the chart itself draws those points: uPlot's data is [xs, ...ys]
        page.wait_for_function(
            "() => { const u = window.vdl.charts.get('train/loss');"
            " return u && u.data[0].length > 0 && u.data[0][u.data[0].length - 1] === 349; }",
            timeout=15_000,
        )
        drawn = page.evaluate(
            "(() => { const u = window.vdl.charts.get('train/loss');"
            " return [Array.from(u.data[0]), Array.from(u.data[1])]; })()"
        )
        assert drawn[0][0] == 0 and drawn[0][-1] == 349
        assert drawn[1][-1] == -1.0
        assert page.locator('[data-tag="train/loss"]').count() == 1
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-live.png"), full_page=True)
        assert errors == []
        assert all(u.startswith(serve_process.url) for u in requests), requests
    finally:
        page.close()


# -- the page while it loads -------------------------------------------------------------------

# Every text the scalars view's placeholder shows, recorded from the first paint (an init script
# runs before the page's own).
RECORD_PLACEHOLDER = """
window.__placeholder = [];
new MutationObserver(() => {
  const p = document.querySelector('.view.scalars > .empty');
  const text = !p || p.hidden ? '' : p.textContent;
  if (window.__placeholder[window.__placeholder.length - 1] !== text) window.__placeholder.push(text);
}).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
"""
NO_DATA = "No data yet"


class SlowBroker(Broker):
    """A real broker whose snapshot frames wait for the test: the frame of the first run until
    ``gates[0]`` is set, the next one until ``gates[1]`` (as reading long runs from disk once
    took 20 s)."""

    def __init__(self, logdir: Path) -> None:
        super().__init__(logdir)
        self.gates = [trio.Event(), trio.Event()]

    async def send_snapshot(self, sub, send, max_points=2000, **options):  # type: ignore[no-untyped-def]
        sent = 0

        async def slow_send(frame: bytes) -> None:
            nonlocal sent
            await self.gates[min(sent, len(self.gates) - 1)].wait()
            sent += 1
            await send(frame)

        await super().send_snapshot(sub, slow_send, max_points, **options)


@contextmanager
def slow_server(logdir: Path) -> Iterator[tuple[str, SlowBroker, trio.lowlevel.TrioToken]]:
    """Serve ``logdir`` through a :class:`SlowBroker` on 127.0.0.1 in a thread; stop it after."""
    started: queue.Queue = queue.Queue()

    async def main() -> None:
        broker = SlowBroker(logdir)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(broker.follow)
            url = await nursery.start(
                partial(serve_dashboard, broker, "127.0.0.1", 0, shutdown_trigger=stop.wait)
            )
            started.put((url, broker, trio.lowlevel.current_trio_token(), stop))
            await stop.wait()
            for gate in broker.gates:
                gate.set()
            broker.close()
            with trio.move_on_after(10):
                await broker.wait_closed()
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    url, broker, token, stop = started.get(timeout=30)
    try:
        yield url, broker, token
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(15)
        assert not thread.is_alive()


def test_the_page_says_it_is_loading_until_the_snapshots_are_in(tmp_path, browser):
    for run in ("a", "b"):
        with recorder.RunWriter(tmp_path / "logs" / run) as w:
            steps = np.arange(1000)
            w.append_scalars("train/loss", steps, 1.7e9 + steps, 1 / (steps + 1.0))
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.add_init_script(RECORD_PLACEHOLDER)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    placeholder = page.locator(".view.scalars > .empty")
    note = page.locator("header .sync-note")
    try:
        with slow_server(tmp_path / "logs") as (url, broker, token):
            page.goto(url + "/")
            page.wait_for_function("() => window.vdl && window.vdl.sync.phase === 'loading'")
            assert page.evaluate("() => window.vdl.sync") == {
                "phase": "loading",
                "total": 2,
                "done": 0,
            }
            assert placeholder.inner_text() == "Loading 2 runs… (0/2)"
            assert note.inner_text() == "Loading 0/2"
            assert placeholder.get_attribute("data-sync") == "loading"
            assert page.locator("body").get_attribute("data-sync") == "loading"
            # the other views do not claim to have nothing either
            assert not page.locator(".view.system > .empty").is_visible()
            assert not page.locator(".view.histograms > .empty").is_visible()
            page.wait_for_timeout(1000)  # a snapshot that takes its time: still loading
            assert placeholder.inner_text() == "Loading 2 runs… (0/2)"
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-loading.png"))
            page.evaluate("() => window.vdl.setLanguage('zh')")
            assert placeholder.inner_text() == "正在加载 2 个运行…（0/2）"
            assert note.inner_text() == "加载中 0/2"
            page.evaluate("() => window.vdl.setLanguage('en')")

            trio.from_thread.run_sync(broker.gates[0].set, trio_token=token)  # one run read
            page.wait_for_function("() => window.vdl.sync.done === 1")
            # run a is drawn; the header still says that b is on its way
            page.locator('[data-tag="train/loss"]').wait_for()
            # The note follows the snapshots at most every 250 ms (app.js, SYNC_NOTE_MS).
            page.wait_for_function(
                "() => document.querySelector('header .sync-note').textContent === 'Loading 1/2'"
            )
            assert note.is_visible()
            assert note.get_attribute("title") == "Loading 2 runs… (1/2)"
            assert not placeholder.is_visible()
            page.screenshot(path=str(ARTIFACTS / "dashboard-loading-partial.png"))
            trio.from_thread.run_sync(broker.gates[1].set, trio_token=token)
            page.wait_for_function(
                "() => window.vdl.sync.phase === 'ready'"
                " && window.vdl.series('b', 'train/loss').steps.length === 1000"
                " && window.vdl.series('a', 'train/loss').steps.length === 1000"
            )
            assert page.evaluate("() => window.vdl.sync") == {
                "phase": "ready",
                "total": 2,
                "done": 2,
            }
            page.locator('[data-tag="train/loss"]').wait_for()
            assert not placeholder.is_visible() and not note.is_visible()
            # ready: now it may say so (once the later views are in: after the first charts)
            page.locator(".view.system > .empty").wait_for(timeout=10_000)
        seen = page.evaluate("() => window.__placeholder")
        assert "Loading 2 runs… (0/2)" in seen, seen
        assert not [t for t in seen if t.startswith(NO_DATA)], seen  # never, while runs exist
        assert errors == []
    finally:
        page.close()


def test_an_empty_server_says_no_data_once_it_has_said_so(serve_process, browser):
    page = browser.new_page()
    page.add_init_script(RECORD_PLACEHOLDER)
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function("() => window.vdl && window.vdl.sync.phase === 'ready'")
        placeholder = page.locator(".view.scalars > .empty")
        assert placeholder.inner_text().startswith(NO_DATA)
        assert placeholder.get_attribute("data-sync") == "ready"
        seen = [t for t in page.evaluate("() => window.__placeholder") if t]  # '': not built yet
        assert seen[0] == "Connecting…" and seen[-1].startswith(NO_DATA), seen
        assert len([t for t in seen if t.startswith(NO_DATA)]) == 1, seen
    finally:
        page.close()


# -- the first charts before the rest of the snapshot ------------------------------------------

# Records, from the page's first script on, how many scalar charts had been drawn when the store
# first took a histogram (the split snapshot's events frame): `window.vdl` is set at the end
# of the page's script, before any frame of the socket is handed over.
RECORD_FIRST_EVENTS = """
Object.defineProperty(window, 'vdl', { configurable: true, get() { return this.__vdl; }, set(v) {
  this.__vdl = v;
  v.store.subscribe((change) => {
    if (change.kind === 'histogram' && change.tags.length && window.__eventsAfterFrames === undefined)
      window.__eventsAfterFrames = [...v.chartWrappers.values()].filter((c) => c.renders > 0).length;
  });
} });
"""


def test_the_first_charts_are_drawn_before_the_snapshot_events_are_taken(serve_process, browser):
    """A split snapshot's events frame comes right behind its scalars frame; the page holds it
    (and what follows) until the charts in view are drawn, then takes it in order."""
    with attach(url=serve_process.ws_url, run="held", telemetry=False) as writer:
        rng = np.random.default_rng(0)
        for step in range(400):
            for k in range(4):
                writer.add_scalar(f"train/m{k}", float(step * k), step)
            if step % 20 == 0:
                writer.add_histogram("weights/fc", rng.normal(0, 1, 5_000), step)
        assert writer.flush(timeout=20)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(script=RECORD_FIRST_EVENTS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function(
            "() => window.__eventsAfterFrames !== undefined"
            " && window.vdl.series('held', 'train/m3').steps.length === 400",
            timeout=15_000,
        )
        # The four charts are on screen (1400 x 1000): drawn together, before the histograms.
        assert page.evaluate("() => window.__eventsAfterFrames") == 4
        assert page.evaluate("() => window.vdl.connection.stats.held") >= 1
        # What was held was taken afterwards, all of it: the run's 20 histogram steps.
        page.wait_for_function(
            "() => window.vdl.store.runs.get('held').histograms.get('weights/fc').length === 20",
            timeout=5_000,
        )
        assert errors == []
    finally:
        context.close()
