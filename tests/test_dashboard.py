"""The dashboard in a real headless Chromium against a real ``vdl-stream serve``."""

from __future__ import annotations

from pathlib import Path

from vdl_stream import attach

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
