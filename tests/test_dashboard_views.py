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
