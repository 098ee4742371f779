"""The dashboard's views in headless Chromium against a real ``vdl-stream serve``: linked cursors,
reconnecting, untrusted text, and a full-page screenshot for people to look at."""

from __future__ import annotations

import numpy as np

from tests.conftest import start_serve, stop_serve
from tests.test_dashboard import ARTIFACTS
from vdl_stream import attach

CONNECTED = "() => window.vdl && window.vdl.connected"


def series_length(run: str, tag: str, n: int) -> str:
    return f"() => window.vdl.series({run!r}, {tag!r}).steps.length === {n}"


def test_hovering_one_chart_moves_the_cursor_on_the_others(serve_process, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function(CONNECTED, timeout=15_000)
        with attach(url=serve_process.ws_url, run="cursor", telemetry=False) as writer:
            for step in range(200):
                writer.add_scalar("train/loss", 1 / (step + 1), step)
                writer.add_scalar("train/acc", step / 200, step)
        page.wait_for_function(series_length("cursor", "train/acc", 200), timeout=15_000)
        page.evaluate("() => window.vdl.drawAll()")
        box = page.locator('[data-tag="train/loss"] .u-over').bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        page.wait_for_function(
            "() => { const u = window.vdl.charts.get('train/acc'); return u.cursor.idx != null; }",
            timeout=5_000,
        )
        steps = page.evaluate(
            "() => ['train/loss', 'train/acc'].map(t => {"
            " const u = window.vdl.charts.get(t); return u.data[0][u.cursor.idx]; })"
        )
        assert steps[0] == steps[1]
        assert 60 <= steps[0] <= 140  # the middle of the x range
    finally:
        page.close()


def test_the_page_reconnects_and_resumes_after_a_server_restart(tmp_path, browser):
    server = start_serve(tmp_path / "logs")
    port = int(server.url.rsplit(":", 1)[1])
    page = browser.new_page()
    try:
        page.goto(server.url + "/")
        page.wait_for_function(CONNECTED, timeout=15_000)
        with attach(url=server.ws_url, run="r", telemetry=False) as writer:
            for step in range(50):
                writer.add_scalar("loss", float(step), step)
        page.wait_for_function(series_length("r", "loss", 50), timeout=15_000)
        stop_serve(server)
        page.wait_for_function("() => !window.vdl.connected", timeout=15_000)
        assert page.locator(".conn").get_attribute("data-state") != "open"
        server = start_serve(tmp_path / "logs", port=port)
        page.wait_for_function(CONNECTED, timeout=30_000)
        with attach(url=server.ws_url, run="r", telemetry=False) as writer:
            for step in range(50, 80):
                writer.add_scalar("loss", float(step), step)
        page.wait_for_function(series_length("r", "loss", 80), timeout=15_000)
        assert page.evaluate("() => window.vdl.series('r', 'loss').steps") == list(range(80))
        assert page.evaluate("() => window.vdl.stats.reconnects") >= 1
    finally:
        page.close()
        stop_serve(server)


def test_html_in_tags_and_text_is_shown_as_text(serve_process, browser):
    evil_tag = '<img src=x onerror="window.__pwned=1">'
    evil_text = "<script>window.__pwned=2</script><b>bold?</b>"
    page = browser.new_page()
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function(CONNECTED, timeout=15_000)
        with attach(url=serve_process.ws_url, run="xss", telemetry=False) as writer:
            writer.add_scalar(evil_tag, 1.0, 0)
            writer.add_text("notes", evil_text, 0)
        page.wait_for_function(series_length("xss", evil_tag, 1), timeout=15_000)
        page.evaluate("() => window.vdl.showView('text')")
        entry = page.locator('[data-text-tag="notes"][data-run="xss"] .entry-text')
        entry.wait_for(timeout=15_000)
        assert entry.inner_text() == evil_text
        assert entry.locator("b, script").count() == 0
        title = page.locator(".chart .chart-title").filter(has_text="onerror")
        assert title.inner_text() == evil_tag
        assert page.evaluate("() => window.__pwned") is None
    finally:
        page.close()


def test_full_dashboard_screenshot(serve_process, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, locale="zh-CN")
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function(CONNECTED, timeout=15_000)
        rng = np.random.default_rng(0)
        with attach(url=serve_process.ws_url, run="训练-1", telemetry_interval=0.1) as writer:
            for step in range(500):
                writer.add_scalar("train/损失", 2 * np.exp(-step / 100) + 0.05 * rng.random(), step)
                writer.add_scalar("train/accuracy", 1 - np.exp(-step / 80), step)
                if step % 50 == 0:
                    writer.add_histogram("weights/fc", rng.normal(step / 500, 1, 2000), step)
            image = (np.linspace(0, 1, 32 * 48 * 3).reshape(32, 48, 3) * 255).astype(np.uint8)
            writer.add_image("samples/输入", image, 500)
            writer.add_text("notes", "学习率 0.1, batch 64", 500)
            labels = rng.integers(0, 2, 500)
            writer.add_pr_curve(
                "eval/pr", labels, np.clip(labels * 0.6 + rng.random(500) * 0.5, 0, 1), 500
            )
            writer.add_hparams({"lr": 0.1, "batch": 64}, ["train/accuracy"])
        page.wait_for_function(series_length("训练-1", "train/损失", 500), timeout=15_000)
        page.wait_for_timeout(500)
        page.evaluate("() => window.vdl.drawAll()")
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / "dashboard-full.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 50_000
        assert page.locator('[data-tag="train/损失"]').count() == 1
        assert page.locator("html").get_attribute("lang") in ("zh", "zh-CN")
    finally:
        page.close()


# From the page's first script: once the first scalar chart is drawn, what the page had asked for
# by then (the drawing frame's afterDraw, before the page's own, which loads the later views when
# idle): whether the later views were loaded, and the scripts fetched.
RECORD_AT_FIRST_CHART = """
Object.defineProperty(window, 'vdl', { configurable: true, get() { return this.__vdl; }, set(v) {
  this.__vdl = v;
  const drawn = () => [...v.chartWrappers.values()].some((c) => c.renders > 0);
  v.scheduler.afterDraw(() => {
    window.__atFirstChart = {
      later: String(v.laterViews?.state),
      scripts: performance.getEntriesByType('resource').map((e) => e.name).filter((n) => n.endsWith('.js')),
    };
  }, Infinity, drawn);
} });
"""


def test_the_first_charts_are_drawn_before_the_later_views_are_loaded(serve_process, browser):
    """The first load evaluates app.js and its shared chunk only; the views below the charts
    (laterviews.js) are fetched after the first charts are drawn, and a view opened before they
    are in says that it loads, then shows its data."""
    with attach(url=serve_process.ws_url, run="lazy", telemetry=False) as writer:
        rng = np.random.default_rng(0)
        for step in range(100):
            writer.add_scalar("train/loss", 1 / (step + 1), step)
            if step % 20 == 0:
                writer.add_histogram("weights/fc", rng.normal(0, 1, 500), step)
        writer.add_hparams({"lr": 0.1, "batch": 64}, ["train/loss"])
        assert writer.flush(timeout=20)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(script=RECORD_AT_FIRST_CHART)
    # laterviews.js is held until released below: the page must draw its charts without it.
    held = []
    context.route("**/static/laterviews.js", lambda route: held.append(route))
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function("() => window.__atFirstChart !== undefined", timeout=15_000)
        first = page.evaluate("() => window.__atFirstChart")
        assert first["later"] == "pending"
        assert [u.rsplit("/", 1)[1] for u in first["scripts"] if "laterviews" in u] == []
        assert any(u.endswith("/static/app.js") for u in first["scripts"])
        # Then, the page idle, it asks for the later views (held here).
        page.wait_for_function("() => window.vdl.laterViews.state === 'loading'", timeout=15_000)
        for _ in range(100):  # the route's handler runs while Playwright waits: 5 s at most
            if held:
                break
            page.wait_for_timeout(50)
        assert len(held) == 1
        # Opened now, the hparams view says that it loads.
        page.evaluate("() => window.vdl.goToView('hparams')")
        note = page.locator('.view[data-pending="hparams"] .view-loading')
        note.wait_for(state="visible", timeout=5_000)
        assert page.locator(".hparams-table").count() == 0
        held[0].continue_()
        # Loaded: the view shows the run's hparams, and the histograms view the run's histogram
        # (both came before the view was built).
        page.locator(".hparams-table td", has_text="0.1").first.wait_for(timeout=15_000)
        page.locator('[data-hist-tag="weights/fc"]').wait_for(timeout=15_000)
        assert page.evaluate("() => window.vdl.laterViews.state") == "loaded"
        assert note.count() == 0
        assert errors == []
    finally:
        context.close()
