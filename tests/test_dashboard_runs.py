"""The runs table, groups and the hparam sweep views in headless Chromium against a real
``vdl-stream serve``: sorting, the condition filter (and its errors), select / pin / hide, the
subscription to the drawn runs only, the default selection with many runs, virtualised rows, group
means with bands, and parallel-coordinate brushing. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServeProcess, http_get, start_serve, stop_serve
from tests.test_dashboard import ARTIFACTS
from vdl_stream import attach

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from runs_data import write_runs

READY = "() => window.vdl && window.vdl.sync.phase === 'ready'"
#: (name, lr, optimizer): six runs of a small sweep.
SWEEP = [
    ("a-sgd-1", 0.1, "sgd"),
    ("b-adam-1", 0.001, "adam"),
    ("c-adam-2", 0.005, "adam"),
    ("d-sgd-2", 0.01, "sgd"),
    ("e-adam-3", 0.05, "adam"),
    ("f-sgd-3", 0.0005, "sgd"),
]
STEPS = 40


def accuracy(index: int, step: int) -> float:
    """The eval/accuracy logged by run number ``index`` at ``step`` (exact in binary)."""
    return (index + 1) * 0.125 + step / 64


ROWS_JS = (
    "[...document.querySelectorAll('.rt-body [data-run]')]"
    ".sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top))"
    ".map(r => r.dataset.run)"
)


def wait_sorted_rows(page, expected: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Wait until the table's rows are ``expected`` (in any order): the table re-renders on the
    next frame after a filter changes, later than the filter's own error state under load."""
    page.wait_for_function(
        f"(want) => JSON.stringify({ROWS_JS}.sort()) === JSON.stringify(want)", arg=sorted(expected)
    )


def wait_stable_box(page, selector: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Wait until the element's box is laid out and the same over two animation frames (the page
    has laid out what it was still adding), so a drag measured from it lands where it aims; that
    box, in viewport pixels. Measured in the page rather than by ``bounding_box()`` afterwards,
    which answers None when a redraw replaced the element in between."""
    box = page.wait_for_function(
        """(sel) => new Promise((done) => {
          const box = () => {
            const el = document.querySelector(sel);
            if (!el) return null;
            const r = el.getBoundingClientRect();
            return r.width > 0 && r.height > 0
              ? {x: r.x, y: r.y, width: r.width, height: r.height} : null;
          };
          const first = box();
          requestAnimationFrame(() => requestAnimationFrame(() => {
            const again = box();
            done(first && again && JSON.stringify(first) === JSON.stringify(again) ? again : null);
          }));
        })""",
        arg=selector,
    )
    return box.json_value()


def wait_rows(page, expected: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Wait until the table's rows are ``expected``, top to bottom (a sort re-renders the table
    on the next frame)."""
    page.wait_for_function(
        f"(want) => JSON.stringify({ROWS_JS}) === JSON.stringify(want)", arg=expected
    )


def after_frames(page) -> None:  # type: ignore[no-untyped-def]
    """Return once the page has rendered two more frames: what a change made it lay out (a
    re-render on the next frame, a resize's observers) is on the page by then."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def rows(page) -> list[str]:  # type: ignore[no-untyped-def]
    """Run names of the table's rows in the DOM, top to bottom."""
    return page.evaluate(f"() => {ROWS_JS}")


def subscribed_to(runs: list[str]) -> str:
    """A condition: the page's subscription is exactly ``runs``."""
    return f"() => JSON.stringify(window.vdl.connection.runs) === {json.dumps(json.dumps(runs, separators=(',', ':')))}"


def drawn_lines(page, tag: str = "eval/accuracy") -> list[str]:  # type: ignore[no-untyped-def]
    """Labels of the solid lines of a scalar chart (raw lines and band edges left out)."""
    page.evaluate("() => window.vdl.drawAll()")
    return page.evaluate(
        f"() => window.vdl.charts.get({tag!r}).series.slice(1)"
        ".filter(s => s.alpha === 1).map(s => s.label).sort()"
    )


@pytest.fixture
def sweep_server(tmp_path: Path) -> Iterator[ServeProcess]:
    """A server over six finished runs with hparams (lr, optimizer) and one scalar tag."""
    server = start_serve(tmp_path / "logs")
    try:
        for i, (name, lr, opt) in enumerate(SWEEP):
            with attach(url=server.ws_url, run=name, telemetry=False) as writer:
                writer.add_hparams({"lr": lr, "optimizer": opt}, ["eval/accuracy"])
                for step in range(STEPS):
                    writer.add_scalar("eval/accuracy", accuracy(i, step), step)
        yield server
    finally:
        stop_serve(server)


def open_page(browser, server: ServeProcess, width: int = 1500):  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    page.goto(server.url + "/")
    page.wait_for_function(READY, timeout=20_000)
    page.wait_for_function(
        f"() => document.querySelectorAll('.rt-body [data-run]').length === {len(SWEEP)}"
        " && window.vdl.runsModel.summaries.size === 6",
        timeout=15_000,
    )
    return page


def open_newest_ten(browser, server: ServeProcess):  # type: ignore[no-untyped-def]
    """The page of a log directory of many runs, once it drew its default ten and is synced;
    ``page.errors`` collects its uncaught errors."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    page.goto(server.url + "/")
    page.wait_for_function(
        "() => window.vdl && (window.vdl.connection.runs || []).length === 10"
        " && window.vdl.sync.phase === 'ready'",
        timeout=30_000,
    )
    return page


def test_the_runs_table_sorts_filters_and_selects(sweep_server, browser):
    page = open_page(browser, sweep_server)
    try:
        names = [name for name, _, _ in SWEEP]
        assert rows(page) == names  # by name at first
        # Few runs: every run is selected, and the page subscribes to "every run".
        assert page.evaluate("() => window.vdl.connection.runs") is None
        assert drawn_lines(page) == names
        row = page.locator('.rt-body [data-run="b-adam-1"]')
        assert row.locator(".rt-cell").nth(3).inner_text() != ""  # duration column filled
        assert "finished" in row.inner_text()

        # Sort by lr, then reversed; by the last accuracy.
        page.click('.rt-head [data-column="h:lr"]')
        by_lr = [n for n, _, _ in sorted(SWEEP, key=lambda r: r[1])]
        page.wait_for_function(
            "() => document.querySelector('.rt-head [data-column=\"h:lr\"]').ariaSort === 'ascending'"
        )
        wait_rows(page, by_lr)
        page.click('.rt-head [data-column="h:lr"]')
        wait_rows(page, by_lr[::-1])
        assert page.get_attribute('.rt-head [data-column="h:lr"]', "aria-sort") == "descending"
        page.click('.rt-head [data-column="m:eval/accuracy:last"]')
        wait_rows(page, names)  # accuracy grows with the run's index

        # A condition: the table, the charts and the subscription follow it.
        page.fill("input.run-condition", 'lr < 0.01 and optimizer == "adam"')
        expected = ["b-adam-1", "c-adam-2"]
        page.wait_for_function(subscribed_to(expected))
        assert sorted(rows(page)) == expected
        assert drawn_lines(page) == expected
        # Runs no longer subscribed are emptied in the page.
        page.wait_for_function(
            "() => window.vdl.series('a-sgd-1', 'eval/accuracy').steps.length === 0"
        )
        assert (
            page.evaluate("() => window.vdl.series('b-adam-1', 'eval/accuracy').steps.length")
            == STEPS
        )

        # A bad condition says what is wrong and the last good one stays in force.
        page.fill("input.run-condition", "lr < 0.01 and")
        error = page.locator(".run-condition-error")
        error.wait_for(state="visible")
        assert "expected a field, number or string at the end" in error.inner_text()
        assert sorted(rows(page)) == expected
        page.fill("input.run-condition", "lrr > 1")
        page.wait_for_function(
            "() => document.querySelector('.run-condition-error').textContent.includes('lrr')"
        )
        assert error.inner_text() == 'unknown field "lrr" at 1: no run has it'
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "runs-table-error.png"))
        page.fill("input.run-condition", "eval/accuracy > 0.9")
        page.wait_for_function("() => document.querySelector('.run-condition-error').hidden")
        # Last accuracies: (i + 1) / 8 + 39 / 64, above 0.9 from run 2 on.
        wait_sorted_rows(page, names[2:])
        page.fill("input.run-condition", "")
        page.wait_for_function("() => window.vdl.connection.runs === null")

        # Unselect one run: it leaves the charts and the subscription.
        page.click('.rt-head [data-column="name"]')
        page.locator('.rt-body [data-run="d-sgd-2"] input.run-select').uncheck()
        page.wait_for_function(
            "() => Array.isArray(window.vdl.connection.runs) && !window.vdl.connection.runs.includes('d-sgd-2')"
        )
        assert drawn_lines(page) == [n for n in names if n != "d-sgd-2"]
        page.locator('.rt-body [data-run="d-sgd-2"] input.run-select').check()
        page.wait_for_function("() => window.vdl.connection.runs.length === 6")
        page.wait_for_function(
            "() => window.vdl.series('d-sgd-2', 'eval/accuracy').steps.length === 40"
        )
        assert drawn_lines(page) == names

        # Pin the last row: it goes to the top, whatever the sort.
        page.click('.rt-body [data-run="f-sgd-3"] button.run-pin')
        page.wait_for_function(
            "() => document.querySelector('.rt-body [data-run=\"f-sgd-3\"]').style.top === '0px'"
        )
        assert rows(page)[0] == "f-sgd-3"
        assert (
            page.get_attribute('.rt-body [data-run="f-sgd-3"] button.run-pin', "aria-pressed")
            == "true"
        )

        # Hide one: out of the table and the charts, back (dimmed) with "show hidden".
        page.click('.rt-body [data-run="a-sgd-1"] button.run-hide')
        page.wait_for_function("() => !document.querySelector('.rt-body [data-run=\"a-sgd-1\"]')")
        assert "a-sgd-1" not in drawn_lines(page)
        page.check("input.runs-show-hidden")
        page.locator('.rt-body [data-run="a-sgd-1"].hidden-run').wait_for()

        # Colours come from the name: the same in the table and the chart.
        swatch = page.evaluate(
            "() => getComputedStyle(document.querySelector('.rt-body [data-run=\"c-adam-2\"] .swatch')).backgroundColor"
        )
        stroke = page.evaluate(
            "() => window.vdl.charts.get('eval/accuracy').series.find(s => s.label === 'c-adam-2').stroke()"
        )
        assert swatch.replace(" ", "") == hex_to_rgb(stroke)
        page.screenshot(path=str(ARTIFACTS / "runs-table.png"))
        assert page.errors == []
    finally:
        page.close()


def hex_to_rgb(color: str) -> str:
    h = color.lstrip("#")
    return "rgb({},{},{})".format(*(int(h[i : i + 2], 16) for i in (0, 2, 4)))


# The runs table's rows reach the bottom of its box.
FILLED = """() => {
  const box = document.querySelector('.runs-table');
  const rows = [...document.querySelectorAll('.rt-body [data-run]')];
  return rows.length > 0 && box.clientHeight > 200
    && Math.max(...rows.map(r => r.getBoundingClientRect().bottom)) >= box.getBoundingClientRect().bottom;
}"""


def test_many_runs_show_the_most_recent_and_scroll_virtually(tmp_path, browser):
    facts = write_runs(tmp_path / "logs", n_runs=300, tags=3, points=200)
    assert len(facts["runs"]) == 300
    server = start_serve(tmp_path / "logs")
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    try:
        page.goto(server.url + "/")
        # The summaries come as a table (docs/protocol.md) and read as GET /api/runs says.
        page.wait_for_function("() => window.vdl && window.vdl.runsModel.summaries.size === 300")
        assert sockets and "/ws/live?summaries=table&newest=10&" in sockets[0]
        status, body = http_get(server.url + "/api/runs")
        assert status == 200
        held = page.evaluate("() => [...window.vdl.runsModel.summaries.values()]")
        assert sorted(held, key=lambda r: r["name"]) == body["runs"]
        # The rows built fill the table's box (its height is known only once the rows made it
        # grow: the table is drawn again then).
        page.wait_for_function(FILLED, timeout=5_000)
        # Re-subscribe while the first snapshots stream in, twice: the server cancels a stream
        # in the middle of its frames, and every frame must still decode.
        page.wait_for_function(
            "() => window.vdl && Array.isArray(window.vdl.connection.runs)", timeout=30_000
        )
        page.fill("input.run-search", "s01-")
        page.wait_for_timeout(200)
        page.fill("input.run-search", "")
        page.wait_for_function(READY, timeout=30_000)
        page.wait_for_function("() => window.vdl.runsModel.names.size === 300", timeout=15_000)
        # Runs start an hour apart: the ten newest are the last ten by index.
        newest = [f"s02-r{i:04d}-" for i in range(290, 300)]
        page.wait_for_function(
            "() => (window.vdl.connection.runs || []).length === 10"
            " && window.vdl.sync.phase === 'ready'",
            timeout=30_000,
        )
        subscribed = page.evaluate("() => window.vdl.connection.runs")
        assert len(subscribed) == 10
        assert sorted(r[:10] for r in subscribed) == newest
        # Only the subscribed runs' data reached the page.
        held = page.evaluate(
            "() => [...window.vdl.store.runs.values()].filter(r => r.scalars.size > 0).map(r => r.name)"
        )
        assert sorted(held) == sorted(subscribed)
        page.wait_for_function("() => window.vdl.charts.get('train/loss')")
        assert len(drawn_lines(page, "train/loss")) == 10
        # The runs on the charts are the table's first rows, checked, a line under the last.
        page.wait_for_function(
            "(want) => JSON.stringify("
            + ROWS_JS
            + ".slice(0, 10).sort()) === JSON.stringify(want)",
            arg=sorted(subscribed),
        )
        first = rows(page)[:11]
        checked = page.evaluate(
            "(names) => names.map(n => document.querySelector("
            '`.rt-body [data-run="${n}"] input.run-select`).checked)',
            first,
        )
        assert checked == [True] * 10 + [False]
        split = page.evaluate(
            "() => [...document.querySelectorAll('.rt-body .rt-split')].map(r => r.dataset.run)"
        )
        assert split == [first[9]]
        # 300 rows, but only those in view are in the DOM; scrolling to the end shows the last
        # (by name) of the runs not drawn.
        in_dom = page.evaluate("() => document.querySelectorAll('.rt-body [data-run]').length")
        assert 10 <= in_dom <= 80

        page.evaluate(
            "() => { const s = document.querySelector('.runs-table'); s.scrollTop = s.scrollHeight; }"
        )
        page.wait_for_function(
            "() => [...document.querySelectorAll('.rt-body [data-run]')].some(r => r.dataset.run.startsWith('s02-r0289'))"
        )
        page.wait_for_timeout(200)
        page.screenshot(path=str(ARTIFACTS / "runs-table-300.png"))
        # Select every run the condition keeps: the subscription follows.
        page.fill("input.run-condition", 'optimizer == "adam" and lr < 0.001')
        page.wait_for_function("() => window.vdl.runsModel.conditionText !== ''")
        page.click("button.runs-all")
        expected = page.evaluate("() => window.vdl.runsModel.tableRows().map(r => r.name).sort()")
        assert len(expected) > 10
        page.wait_for_function(subscribed_to(expected), timeout=10_000)
        page.wait_for_function(READY, timeout=30_000)
        assert page.evaluate("() => window.vdl.stats.badFrames") == 0
    finally:
        page.close()
        stop_serve(server)


def test_re_subscribing_while_snapshots_stream_keeps_every_frame_decodable(tmp_path, browser):
    # Large snapshots (10 tags x 2,000 points a run, ~0.5 MB a frame) keep the server's sends
    # waiting on the socket, so that changing the selection cancels a stream halfway through.
    write_runs(tmp_path / "logs", n_runs=25, tags=10, points=20_000)
    server = start_serve(tmp_path / "logs")
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        page.goto(server.url + "/")
        page.wait_for_function(
            "() => window.vdl && Array.isArray(window.vdl.connection.runs)", timeout=30_000
        )
        for text in ("s00-r001", "s00-r002", "", "s00-r001", ""):
            page.fill("input.run-search", text)
            page.wait_for_timeout(250)
        page.wait_for_function(
            "() => (window.vdl.connection.runs || []).length === 10"
            " && window.vdl.sync.phase === 'ready'",
            timeout=60_000,
        )
        assert page.evaluate("() => window.vdl.stats.badFrames") == 0
        page.wait_for_function(
            "() => { window.vdl.drawAll(); const u = window.vdl.charts.get('train/loss');"
            " return u && u.series.slice(1).filter(s => s.alpha === 1).length === 10; }",
            timeout=30_000,
        )
    finally:
        page.close()
        stop_serve(server)


def test_groups_draw_a_mean_with_a_band_and_follow_new_points(sweep_server, browser):
    page = open_page(browser, sweep_server)
    try:
        # Raw values, so that the mean can be checked exactly.
        page.evaluate(
            "() => { const s = document.querySelector('.side input[type=range]'); s.value = '0';"
            " s.dispatchEvent(new Event('input')); }"
        )
        page.wait_for_function("() => window.vdl.state.smoothing === 0")
        page.select_option("select.run-group", "h:optimizer")
        page.wait_for_function("() => window.vdl.charts.get('eval/accuracy')?.bands?.length === 2")
        u_labels = drawn_lines(page)
        assert u_labels == ["optimizer=adam (mean of 3)", "optimizer=sgd (mean of 3)"]
        data = page.evaluate(
            "() => { const u = window.vdl.charts.get('eval/accuracy');"
            " return {xs: Array.from(u.data[0]), labels: u.series.map(s => s.label),"
            " ys: u.data.slice(1).map(c => Array.from(c))}; }"
        )
        adam = [i for i, (_, _, opt) in enumerate(SWEEP) if opt == "adam"]
        mean_col = data["ys"][data["labels"].index("optimizer=adam (mean of 3)") - 1]
        max_col = data["ys"][data["labels"].index("optimizer=adam (mean of 3) max") - 1]
        min_col = data["ys"][data["labels"].index("optimizer=adam (mean of 3) min") - 1]
        for k, step in enumerate(data["xs"]):
            values = [accuracy(i, int(step)) for i in adam]
            assert mean_col[k] == pytest.approx(sum(values) / 3)
            assert max_col[k] == max(values) and min_col[k] == min(values)

        # Group by a name pattern: the capture group is the key.
        page.select_option("select.run-group", "pattern")
        page.fill("input.run-group-pattern", r"-(\d)$")
        page.wait_for_function("() => window.vdl.charts.get('eval/accuracy')?.bands?.length === 3")
        assert drawn_lines(page) == ["1 (mean of 2)", "2 (mean of 2)", "3 (mean of 2)"]
        page.fill("input.run-group-pattern", "(")
        assert (
            page.evaluate(
                "() => document.querySelector('input.run-group-pattern').validationMessage"
            )
            != ""
        )

        # Live: new points of a grouped run extend its group.
        page.select_option("select.run-group", "h:optimizer")
        with attach(url=sweep_server.ws_url, run="b-adam-1", telemetry=False) as writer:
            for step in range(STEPS, STEPS + 20):
                writer.add_scalar("eval/accuracy", accuracy(1, step), step)
        page.wait_for_function(
            f"() => {{ window.vdl.drawAll(); const u = window.vdl.charts.get('eval/accuracy');"
            f" return u.data[0][u.data[0].length - 1] === {STEPS + 19}; }}",
            timeout=15_000,
        )
        page.evaluate("() => window.vdl.drawAll()")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "runs-groups.png"))
        assert page.errors == []
    finally:
        page.close()


def test_brushing_parallel_coordinates_filters_the_runs(sweep_server, browser):
    page = open_page(browser, sweep_server)
    try:
        page.locator(".view.hparams").scroll_into_view_if_needed()
        lr_axis = 'svg.parallel .pc-axis[data-column="h:lr"] .pc-hit'
        page.locator(lr_axis).wait_for()
        lines = page.locator("svg.parallel path.pc-line[data-run]")
        assert lines.count() == 6
        box = wait_stable_box(page, lr_axis)
        # lr is on a log axis from 5e-4 (bottom) to 0.1 (top); keep the upper part (lr >= ~0.005).
        x = box["x"] + box["width"] / 2
        page.mouse.move(x, box["y"] + 2)
        page.mouse.down()
        page.mouse.move(x, box["y"] + box["height"] * 0.35, steps=5)
        page.mouse.up()
        page.wait_for_function("() => window.vdl.runsModel.brushes.has('h:lr')")
        lo, hi = page.evaluate("() => window.vdl.runsModel.brushes.get('h:lr')")
        kept = sorted(name for name, lr, _ in SWEEP if lo <= lr <= hi)
        assert 1 <= len(kept) < 6, (
            lo,
            hi,
            box,
            wait_stable_box(page, lr_axis),
        )  # a shift mid-drag?
        page.wait_for_function(subscribed_to(kept))
        assert sorted(rows(page)) == kept
        assert drawn_lines(page) == kept
        assert page.locator("svg.parallel path.pc-line.out").count() == 6 - len(kept)
        assert page.locator("svg.parallel .pc-brush").count() == 1
        # The heat map and scatter are there, with a cell per (lr, optimizer) kept.
        assert page.locator("svg.hp-heatmap rect.heat-cell").count() == len(kept)
        assert page.locator("svg.scatter circle.scatter-point").count() == 6
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(".view.hparams").screenshot(path=str(ARTIFACTS / "runs-parallel.png"))
        # A click on the axis clears its brush (measured again: the views above it shrink when
        # fewer runs are drawn, so the axis may have moved).
        box = wait_stable_box(page, lr_axis)
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.8)
        page.wait_for_function("() => window.vdl.connection.runs === null")
        assert page.locator("svg.parallel path.pc-line.out").count() == 0
        assert page.errors == []
    finally:
        page.close()


def set_smoothing(page, value: float) -> None:  # type: ignore[no-untyped-def]
    """Move the smoothing slider to ``value`` and wait until the page applied it."""
    page.evaluate(
        "(v) => { const s = document.querySelector('.side input[type=range]'); s.value = String(v);"
        " s.dispatchEvent(new Event('input')); }",
        value,
    )
    page.wait_for_function("(v) => window.vdl.state.smoothing === v", arg=value)


def test_the_selection_pins_hidden_runs_groups_and_smoothing_survive_a_reload(
    sweep_server, browser
):
    page = open_page(browser, sweep_server)
    try:
        # One run unselected, one pinned, one hidden, grouped by optimizer with a ±std band,
        # smoothing 0.3.
        page.locator('.rt-body [data-run="d-sgd-2"] input.run-select').uncheck()
        page.click('.rt-body [data-run="f-sgd-3"] button.run-pin')
        page.click('.rt-body [data-run="a-sgd-1"] button.run-hide')
        page.select_option("select.run-group", "h:optimizer")
        page.select_option("select.run-group-band", "std")
        set_smoothing(page, 0.3)
        drawn = ["b-adam-1", "c-adam-2", "e-adam-3", "f-sgd-3"]
        page.wait_for_function(subscribed_to(drawn))
        page.wait_for_function(
            "() => window.vdl.charts.get('eval/accuracy')?.bands?.length === 2", timeout=15_000
        )
        before = page.evaluate("() => window.vdl.runsModel.saved()")

        page.reload()
        page.wait_for_function(READY, timeout=20_000)
        # The page subscribes to the remembered runs at once (not "every run" first).
        page.wait_for_function(subscribed_to(drawn), timeout=15_000)
        assert page.evaluate("() => window.vdl.runsModel.saved()") == before
        assert page.evaluate("() => window.vdl.state.smoothing") == 0.3
        assert page.input_value(".side input[type=range]") == "0.3"
        assert page.input_value("select.run-group") == "h:optimizer"
        assert page.input_value("select.run-group-band") == "std"
        page.wait_for_function(
            "() => document.querySelector('.rt-body [data-run=\"f-sgd-3\"]')?.style.top === '0px'",
            timeout=15_000,
        )
        assert (
            page.get_attribute('.rt-body [data-run="f-sgd-3"] button.run-pin', "aria-pressed")
            == "true"
        )
        assert page.locator('.rt-body [data-run="a-sgd-1"]').count() == 0  # hidden
        assert not page.locator('.rt-body [data-run="d-sgd-2"] input.run-select').is_checked()
        page.wait_for_function(
            "() => window.vdl.charts.get('eval/accuracy')?.bands?.length === 2", timeout=15_000
        )
        assert drawn_lines(page) == ["optimizer=adam (mean of 3)", "optimizer=sgd (mean of 1)"]

        # Kept under this server's own key (another port, another view).
        stored = page.evaluate("() => Object.keys(localStorage)")
        assert stored == [f"vdl-stream:view:{sweep_server.url}/"]
        assert page.errors == []
    finally:
        page.close()


def test_groups_draw_a_std_band_around_the_mean(sweep_server, browser):
    page = open_page(browser, sweep_server)
    try:
        set_smoothing(page, 0)
        page.select_option("select.run-group", "h:optimizer")
        page.wait_for_function("() => window.vdl.charts.get('eval/accuracy')?.bands?.length === 2")
        assert page.is_visible("select.run-group-band")
        page.select_option("select.run-group-band", "std")
        page.wait_for_function(
            "() => window.vdl.charts.get('eval/accuracy').series.some(s => s.label.endsWith(' +std'))"
        )
        data = page.evaluate(
            "() => { window.vdl.drawAll(); const u = window.vdl.charts.get('eval/accuracy');"
            " return {xs: Array.from(u.data[0]), labels: u.series.map(s => s.label),"
            " ys: u.data.slice(1).map(c => Array.from(c)), bands: u.bands.length}; }"
        )
        assert data["bands"] == 2
        label = "optimizer=sgd (mean of 3)"
        col = {
            part: data["ys"][data["labels"].index(f"{label}{part}") - 1]
            for part in ("", " +std", " -std")
        }
        sgd = [i for i, (_, _, opt) in enumerate(SWEEP) if opt == "sgd"]
        assert len(data["xs"]) == STEPS
        for k, step in enumerate(data["xs"]):
            values = [accuracy(i, int(step)) for i in sgd]
            mean = sum(values) / 3
            std = (sum((v - mean) ** 2 for v in values) / 3) ** 0.5
            assert col[""][k] == pytest.approx(mean)
            assert col[" +std"][k] == pytest.approx(mean + std)
            assert col[" -std"][k] == pytest.approx(mean - std)
        page.evaluate(
            "() => document.querySelector('[data-tag=\"eval/accuracy\"]').scrollIntoView({block: 'center'})"
        )
        page.evaluate("() => window.vdl.drawAll()")
        ARTIFACTS.mkdir(exist_ok=True)
        # The tooltip reads each group's mean, its band and how many runs are in it.
        box = page.locator('[data-tag="eval/accuracy"] .u-over').bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        tooltip = page.locator(".tooltip[role=tooltip]")
        tooltip.wait_for(state="visible", timeout=5_000)
        assert page.locator(".tooltip[role=tooltip] thead").inner_text().split() == [
            "mean",
            "±",
            "std",
            "runs",
        ]
        step = int(page.locator(".tooltip[role=tooltip] .tt-title").inner_text().split()[-1])
        rows = page.locator(".tooltip[role=tooltip] tbody tr")
        assert rows.count() == 2
        by_label = {
            rows.nth(i).get_attribute("data-run"): rows.nth(i)
            .locator("td.tt-value")
            .all_inner_texts()
            for i in range(2)
        }
        cells = by_label[label]
        values = [accuracy(i, step) for i in sgd]
        mean = sum(values) / 3
        std = (sum((v - mean) ** 2 for v in values) / 3) ** 0.5
        assert float(cells[0]) == pytest.approx(mean, rel=1e-4)
        assert cells[1].startswith("± ") and float(cells[1][2:]) == pytest.approx(std, rel=1e-4)
        assert cells[2] == "3"
        chart_box = page.locator('[data-tag="eval/accuracy"]').bounding_box()
        tip_box = tooltip.bounding_box()
        left = min(chart_box["x"], tip_box["x"])
        top = min(chart_box["y"], tip_box["y"])
        right = max(chart_box["x"] + chart_box["width"], tip_box["x"] + tip_box["width"])
        bottom = max(chart_box["y"] + chart_box["height"], tip_box["y"] + tip_box["height"])
        page.screenshot(
            path=str(ARTIFACTS / "runs-groups-std.png"),
            clip={"x": left, "y": top, "width": right - left, "height": bottom - top},
        )
        page.mouse.move(5, 5)
        # Back to min-max: the band edges are the runs' extremes again.
        page.select_option("select.run-group-band", "minmax")
        page.wait_for_function(
            "() => window.vdl.charts.get('eval/accuracy').series.some(s => s.label.endsWith(' max'))"
        )
        assert page.errors == []
    finally:
        page.close()


def test_many_runs_join_a_chart_in_place_on_one_shared_grid(tmp_path, browser):
    write_runs(tmp_path / "logs", n_runs=40, tags=2, points=3000)
    server = start_serve(tmp_path / "logs")
    page = open_newest_ten(browser, server)
    errors = page.errors
    try:
        set_smoothing(page, 0)
        page.wait_for_function(
            "() => { window.vdl.drawAll(); const u = window.vdl.charts.get('train/acc');"
            " return u && u.series.length === 11; }",
            timeout=15_000,
        )
        builds = page.evaluate("() => window.vdl.chartWrappers.get('train/acc').builds")
        # 10 -> 40 runs: the chart's uPlot instance takes the 30 new lines in place.
        page.click("button.runs-all")
        page.wait_for_function(
            "() => (window.vdl.connection.runs || []).length === 40"
            " && window.vdl.sync.phase === 'ready'",
            timeout=30_000,
        )
        page.wait_for_function(
            "() => { window.vdl.drawAll(); return window.vdl.charts.get('train/acc').series.length === 41; }",
            timeout=15_000,
        )
        chart = page.evaluate(
            """() => { const c = window.vdl.chartWrappers.get('train/acc'); const u = c.plot;
              return {builds: c.builds, width: c.width, xs: Array.from(u.data[0]),
                      labels: u.series.slice(1).map(s => s.label),
                      ys: u.data.slice(1).map(col => Array.from(col))}; }"""
        )
        assert chart["builds"] == builds
        assert len(chart["labels"]) == 40
        # One shared x column of two rows per pixel column, not the union of 40 runs' steps.
        assert len(chart["xs"]) == 2 * chart["width"]
        assert chart["xs"] == sorted(chart["xs"])
        # Each run keeps its extremes: the drawn values are its own, its lowest and highest among them.
        for label in chart["labels"][::7]:
            col = [v for v in chart["ys"][chart["labels"].index(label)] if v is not None]
            values = page.evaluate("(run) => window.vdl.series(run, 'train/acc').values", label)
            finite = [v for v in values if v == v and abs(v) != float("inf")]
            assert set(col) <= set(finite)
            assert min(col) == min(finite) and max(col) == max(finite)
        # One run less: removed in place too.
        page.locator(f'.rt-body [data-run="{chart["labels"][0]}"] input.run-select').uncheck()
        page.wait_for_function(
            "() => { window.vdl.drawAll(); return window.vdl.charts.get('train/acc').series.length === 40; }",
            timeout=15_000,
        )
        assert page.evaluate("() => window.vdl.chartWrappers.get('train/acc').builds") == builds
        page.evaluate(
            "() => document.querySelector('[data-tag=\"train/acc\"]').scrollIntoView({block: 'center'})"
        )
        page.evaluate("() => window.vdl.drawAll()")
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator('[data-tag="train/acc"]').screenshot(path=str(ARTIFACTS / "runs-40-lines.png"))
        assert errors == []
    finally:
        page.close()
        stop_serve(server)


# The header's height, the vertical centres of its visible controls (one row: all the same) and
# whether the view buttons scroll sideways.
HEADER_ROW_JS = """() => {
  const header = document.querySelector('header.top');
  const tabs = document.querySelector('nav.tabs');
  const mids = [...header.children].filter(e => e.offsetParent !== null && !e.matches('.report-panel'))
    .map(e => { const r = e.getBoundingClientRect(); return r.top + r.height / 2; });
  return { height: header.getBoundingClientRect().height, spread: Math.max(...mids) - Math.min(...mids),
           controls: mids.length, tabsScroll: tabs.scrollWidth > tabs.clientWidth + 1 };
}"""


def test_the_drawn_runs_lead_the_table_and_the_header_is_one_row(sweep_server, browser):
    page = open_page(browser, sweep_server, width=1400)
    try:
        names = [name for name, _, _ in SWEEP]
        assert rows(page) == names
        # One row's checkbox: the row stays where it is (no jump from under the pointer).
        page.locator('.rt-body [data-run="a-sgd-1"] input.run-select').uncheck()
        page.locator('.rt-body [data-run="c-adam-2"] input.run-select').uncheck()
        page.wait_for_function(subscribed_to(["b-adam-1", "d-sgd-2", "e-adam-3", "f-sgd-3"]))
        after_frames(page)
        assert rows(page) == names
        # A sort settles the order: the runs drawn first, a line under the last of them.
        page.click('.rt-head [data-column="name"]')
        drawn = ["b-adam-1", "d-sgd-2", "e-adam-3", "f-sgd-3"]
        wait_rows(page, [*drawn, "a-sgd-1", "c-adam-2"])
        assert page.evaluate(
            "() => [...document.querySelectorAll('.rt-body .rt-split')].map(r => r.dataset.run)"
        ) == ["f-sgd-3"]
        # The header is one row at 1,400 px (all ten view buttons in it) and on a phone.
        one = page.evaluate(HEADER_ROW_JS)
        assert one["height"] < 56 and one["spread"] <= 2 and one["controls"] >= 6, one
        assert not one["tabsScroll"], one
        page.screenshot(path=str(ARTIFACTS / "runs-lead-1400.png"))
        page.set_viewport_size({"width": 390, "height": 844})
        after_frames(page)
        phone = page.evaluate(HEADER_ROW_JS)
        assert phone["height"] < 56 and phone["spread"] <= 2 and phone["controls"] >= 5, phone
        page.screenshot(path=str(ARTIFACTS / "runs-lead-phone.png"))
        assert page.errors == []
    finally:
        page.close()


Y_SCALE_JS = "(tag) => { const s = window.vdl.charts.get(tag).scales.y; return [s.min, s.max]; }"


def test_a_diverging_run_is_left_off_the_default_y_range_and_named(tmp_path, browser):
    # Of the sweep's 40 runs the page draws the newest ten, s00-r0030..39; two of them (31 and
    # 32, sgd with a large learning rate) diverge: their losses reach 5e11, then NaN.
    write_runs(tmp_path / "logs", n_runs=40, tags=2, points=400)
    diverged = ["s00-r0031-sgd", "s00-r0032-sgd"]
    server = start_serve(tmp_path / "logs")
    page = open_newest_ten(browser, server)
    errors = page.errors
    try:
        assert set(diverged) <= set(page.evaluate("() => window.vdl.connection.runs"))
        page.wait_for_function(
            "() => { window.vdl.drawAll(); const u = window.vdl.charts.get('train/loss');"
            " return u && u.series.slice(1).filter(s => s.alpha === 1).length === 10; }",
            timeout=15_000,
        )
        chart = page.locator('[data-tag="train/loss"]')
        button = chart.locator("button.offscale")
        # The default range is the eight healthy runs' (losses from 2.5 down), the two named.
        lo, hi = page.evaluate(Y_SCALE_JS, "train/loss")
        assert 2.5 < hi < 5 and lo < 0.5
        assert button.is_visible() and "2" in button.inner_text()
        assert all(name in button.get_attribute("title") for name in diverged)
        assert chart.get_attribute("data-offscale") == "2"
        assert button.get_attribute("aria-pressed") == "false"
        # A chart without such a run shows its whole range and no button.
        assert page.locator('[data-tag="train/acc"]').get_attribute("data-offscale") == "0"
        assert not page.locator('[data-tag="train/acc"] button.offscale').is_visible()
        page.evaluate(
            "() => document.querySelector('[data-tag=\"train/loss\"]').scrollIntoView({block: 'center'})"
        )
        page.evaluate("() => window.vdl.drawAll()")
        ARTIFACTS.mkdir(exist_ok=True)
        chart.screenshot(path=str(ARTIFACTS / "runs-offscale.png"))
        # The toggle: the full range, then the robust one again.
        button.click()
        page.wait_for_function(
            f"() => {{ window.vdl.drawAll(); return ({Y_SCALE_JS})('train/loss')[1] > 1e11; }}",
            timeout=10_000,
        )
        assert button.get_attribute("aria-pressed") == "true"
        assert chart.get_attribute("data-offscale") == "2"
        chart.screenshot(path=str(ARTIFACTS / "runs-offscale-full.png"))
        button.click()
        page.wait_for_function(
            f"() => {{ window.vdl.drawAll(); return ({Y_SCALE_JS})('train/loss')[1] < 5; }}",
            timeout=10_000,
        )
        assert button.get_attribute("aria-pressed") == "false"
        # "Ignore outliers" (percentiles) replaces the robust range: the button goes.
        chart.locator("button.yrange-btn").click()
        chart.locator("input.clip").check()
        page.wait_for_function(
            "() => { window.vdl.drawAll(); return document.querySelector("
            "'[data-tag=\"train/loss\"]').dataset.offscale === '0'; }",
            timeout=10_000,
        )
        assert not button.is_visible()
        assert errors == []
    finally:
        page.close()
        stop_serve(server)


def test_a_click_subscribes_within_its_own_task(sweep_server, browser):
    # The page subscribes at the end of the click's task, before the frame the click dirtied is
    # laid out and drawn (a timer ran after that frame: 50-200 ms later with 100 runs).
    page = open_page(browser, sweep_server)
    try:
        page.click("button.runs-none")
        page.wait_for_function(subscribed_to([]), timeout=10_000)
        counts = page.evaluate(
            """() => new Promise((resolve) => {
              document.querySelector('button.runs-all').click();
              const now = () => (window.vdl.connection.runs || []).length;
              const inTask = [];
              queueMicrotask(() => inTask.push(now()));  // after the page's own microtask
              setTimeout(() => resolve({ inTask: inTask[0], later: now() }), 0);
            })"""
        )
        assert counts == {"inTask": len(SWEEP), "later": len(SWEEP)}
        page.wait_for_function(READY, timeout=20_000)
        assert drawn_lines(page) == sorted(name for name, _, _ in SWEEP)
        assert page.errors == []
    finally:
        page.close()


# Per chart: on screen, within the scheduler's margin below or above it (NEAR_VIEW_PX), or further.
CHART_PLACES_JS = """() => {
  const H = window.innerHeight, out = {};
  for (const [tag, c] of window.vdl.chartWrappers) {
    const r = c.element.getBoundingClientRect();
    out[tag] = r.bottom > 0 && r.top < H ? 'screen' : r.bottom > -200 && r.top < H + 200 ? 'near' : 'far';
  }
  return out;
}"""


def test_charts_on_screen_draw_first_and_one_out_of_view_draws_when_scrolled_to(tmp_path, browser):
    # A frame draws the charts on screen; those only near it (drawn ahead of a scroll) wait for
    # the next drawing frame; those further off wait until they are scrolled to.
    write_runs(tmp_path / "logs", n_runs=40, tags=10, points=300)
    server = start_serve(tmp_path / "logs")
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(server.url + "/")
        page.wait_for_function(
            "() => window.vdl && (window.vdl.connection.runs || []).length === 10"
            " && window.vdl.sync.phase === 'ready' && window.vdl.chartWrappers.size === 10",
            timeout=30_000,
        )
        # Scrolled so that the first chart below the screen is within the margin.
        page.evaluate(
            """() => { const H = window.innerHeight;
              const tops = [...window.vdl.chartWrappers.values()].map(c => c.element.getBoundingClientRect().top);
              window.scrollBy(0, Math.min(...tops.filter(t => t >= H)) - H - 60); }"""
        )
        page.wait_for_function(
            f"() => new Set(Object.values(({CHART_PLACES_JS})())).size === 3", timeout=10_000
        )
        places = page.evaluate(CHART_PLACES_JS)
        # The runs a chart draws (its smoothed lines; the faint raw ones left out).
        lines = (
            "(t) => { const u = window.vdl.charts.get(t);"
            " return u ? u.series.slice(1).filter(s => s.alpha === 1).length : 0; }"
        )
        shown = sorted(t for t, p in places.items() if p != "far")
        # Drawn where they are now: the ten runs on every chart on screen or near it.
        page.wait_for_function(
            f"() => {json.dumps(shown)}.every(t => ({lines})(t) === 10)", timeout=10_000
        )
        # The scheduler's own idea of the screen (a second IntersectionObserver) is the layout's.
        page.wait_for_function(
            f"() => {{ const p = ({CHART_PLACES_JS})();"
            " return [...window.vdl.chartWrappers].every(([t, c]) => c.onScreen === (p[t] === 'screen')); }",
            timeout=10_000,
        )
        # Each chart's renders, with the drawing frame they were in.
        page.evaluate(
            """() => { window.__renders = [];
              for (const [tag, c] of window.vdl.chartWrappers) { const render = c.render;
                c.render = function () { window.__renders.push([window.vdl.scheduler.stats.frames, tag]);
                  return render.call(this); }; } }"""
        )
        page.click("button.runs-all")
        near = sorted(t for t, p in places.items() if p == "near")
        far = sorted(t for t, p in places.items() if p == "far")
        page.wait_for_function(
            f"() => window.vdl.sync.phase === 'ready' && {json.dumps(near)}.every(t => ({lines})(t) === 40)",
            timeout=30_000,
        )
        renders = page.evaluate("() => window.__renders")
        first = renders[0][0]
        drawn_first = {tag for frame, tag in renders if frame == first}
        assert drawn_first and drawn_first <= {t for t, p in places.items() if p == "screen"}
        assert set(near) <= {tag for frame, tag in renders if frame > first}
        # Not drawn out of view: the charts further off have not drawn the 40 runs.
        assert all(page.evaluate(f"({lines})", t) < 40 for t in far)
        page.evaluate(f"() => window.vdl.chartWrappers.get({far[-1]!r}).element.scrollIntoView()")
        page.wait_for_function(f"() => ({lines})({far[-1]!r}) === 40", timeout=10_000)
        assert errors == []
    finally:
        page.close()
        stop_serve(server)


# Before the page's scripts: each WebSocket made, with what the page had built by then.
SOCKETS_JS = """(() => {
  const made = window.__sockets = [];
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      made.push({ socket: this, url: this.url, views: document.querySelectorAll('[data-view]').length,
                  vdl: window.vdl !== undefined, sent: 0 });
    }
    send(data) {
      made.find((m) => m.socket === this).sent++;
      super.send(data);
    }
  };
})();"""


def open_scripted(context, server: ServeProcess, script: str, also: str = "true"):  # type: ignore[no-untyped-def]
    """A page of ``context`` with ``script`` run before the page's, once it drew its default
    ten, is synced and ``also`` (a JS expression) holds: (page, its uncaught errors)."""
    context.add_init_script(script=script)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_function(
        "() => window.vdl && (window.vdl.connection.runs || []).length === 10"
        f" && window.vdl.sync.phase === 'ready' && ({also})",
        timeout=30_000,
    )
    return page, errors


def test_the_socket_opens_before_the_page_is_built_and_the_newest_ten_are_subscribed(
    tmp_path, browser
):
    # The /ws/live socket is opened by the bundle's first module, before the views are built
    # (the runs and summaries frames travel while the page builds itself), and it is the page's
    # only socket: the Connection adopts it. Its URL asks for the default selection (the newest
    # ten of 30 runs), which the page then finds is its own: it sends no subscribe at all, the
    # newest ten are drawn, and the table fills with every run.
    write_runs(tmp_path / "logs", n_runs=30, tags=2, points=50)
    server = start_serve(tmp_path / "logs")
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    try:
        page, errors = open_scripted(context, server, SOCKETS_JS)
        made = page.evaluate(
            "() => window.__sockets.map(s => ({ url: s.url, views: s.views, vdl: s.vdl,"
            " adopted: s.socket === window.vdl.connection._ws, sent: s.sent }))"
        )
        assert len(made) == 1, made
        assert made[0]["url"].endswith(
            "/ws/live?summaries=table&newest=10&all_up_to=20&max_points=2000"
        )
        assert made[0]["views"] == 0 and made[0]["vdl"] is False, made[0]
        assert made[0]["adopted"] is True
        assert page.evaluate("() => window.vdl.stats.sockets") == 1
        subscribed = page.evaluate("() => window.vdl.connection.runs")
        assert sorted(r[:10] for r in subscribed) == [f"s00-r{i:04d}-" for i in range(20, 30)]
        page.wait_for_function(
            "() => window.vdl.runsModel.summaries.size === 30"
            " && document.querySelectorAll('.rt-body [data-run]').length > 0",
            timeout=15_000,
        )
        page.wait_for_function("() => window.vdl.charts.get('train/loss')", timeout=15_000)
        assert len(drawn_lines(page, "train/loss")) == 10
        assert page.evaluate("() => window.__sockets[0].sent") == 0
        # Another selection re-subscribes as before: one subscribe, the added run drawn.
        other = page.evaluate(
            "() => [...document.querySelectorAll('.rt-body [data-run]')].map(r => r.dataset.run)"
            ".find(n => !window.vdl.connection.runs.includes(n))"
        )
        page.locator(f'.rt-body [data-run="{other}"] input.run-select').check()
        page.wait_for_function(
            f"() => window.vdl.connection.runs.includes({other!r})"
            " && window.vdl.sync.phase === 'ready' && window.vdl.store.series("
            f"{other!r}, 'train/loss')",
            timeout=15_000,
        )
        assert len(drawn_lines(page, "train/loss")) == 11
        assert page.evaluate("() => window.__sockets[0].sent") == 1
        assert errors == []
    finally:
        context.close()
        stop_serve(server)


#: Records the page's reads of element positions, sizes and scroll offsets: on which element (the
#: runs table, a view's box or another), in which event (a scroll's) or idle callback.
LAYOUT_READS_JS = """(() => {
  const reads = window.__layoutReads = [];
  let idle = false;
  const requestIdle = window.requestIdleCallback;
  window.requestIdleCallback = (fn, opts) => requestIdle((deadline) => {
    idle = true;
    try { fn(deadline); } finally { idle = false; }
  }, opts);
  const note = (element, what) => {
    if (window.__testReading) return;  // the test's own checks
    const on = element.closest('.runs-table') ? 'table'
      : element.matches('.view') ? 'view' : 'other';
    reads.push({ on, what, event: window.event ? window.event.type : null, idle });
  };
  const rect = Element.prototype.getBoundingClientRect;
  Element.prototype.getBoundingClientRect = function () {
    note(this, 'getBoundingClientRect');
    return rect.call(this);
  };
  for (const key of ['offsetHeight', 'offsetTop', 'clientHeight', 'scrollTop', 'scrollHeight']) {
    const proto = key.startsWith('offset') ? HTMLElement.prototype : Element.prototype;
    const d = Object.getOwnPropertyDescriptor(proto, key);
    Object.defineProperty(proto, key, { ...d, get() { note(this, key); return d.get.call(this); } });
  }
})();"""


def test_a_cold_load_reads_the_layout_only_where_it_is_clean(tmp_path, browser):
    # On a cold load of 1,000 runs a read of a position or scroll offset made after the page
    # changed forces a style and layout of the whole page, which the frame then lays out again:
    # the runs table's renders read none (the scroll offset kept from its scroll events, the
    # height from its ResizeObserver), and the header's view marker reads the views' positions
    # when the page is idle. The table still shows the rows in view after a scroll, and after a
    # search leaves fewer rows than the offset scrolled to; the marker still marks the first view.
    write_runs(tmp_path / "logs", n_runs=300, tags=2, points=50)
    server = start_serve(tmp_path / "logs")
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    try:
        page, errors = open_scripted(
            context, server, LAYOUT_READS_JS, "window.vdl.runsModel.summaries.size === 300"
        )
        page.wait_for_function(
            f"() => {{ window.__testReading = true; try {{ return ({FILLED})(); }}"
            " finally { window.__testReading = false; } }",
            timeout=10_000,
        )
        page.wait_for_function("() => window.vdl.charts.get('train/loss')", timeout=15_000)
        assert len(drawn_lines(page, "train/loss")) == 10
        page.wait_for_function(
            "() => document.querySelector('.tabs button[data-view=scalars]')"
            ".getAttribute('aria-current') === 'true'",
            timeout=5_000,
        )
        reads = page.evaluate("() => window.__layoutReads.slice()")
        table = [r for r in reads if r["on"] == "table" and r["event"] != "scroll"]
        view = [r for r in reads if r["on"] == "view" and not r["idle"] and r["event"] != "scroll"]
        assert table == [], table[:5]
        assert view == [], view[:5]
        assert any(r["on"] == "view" and r["idle"] for r in reads)

        # Scrolled to the end, the table shows the last rows; a search then leaves ten rows,
        # fewer than the offset scrolled to, and they are shown.
        page.evaluate(
            "() => { const s = document.querySelector('.runs-table'); s.scrollTop = s.scrollHeight; }"
        )
        last = page.evaluate("() => window.vdl.runsModel.tableRows().slice(-1)[0].name")
        page.wait_for_function(
            '(name) => document.querySelector(`.rt-body [data-run="${name}"]`) !== null',
            arg=last,
        )
        page.fill("input.run-search", "-r000")
        page.wait_for_function(
            "() => document.querySelectorAll('.rt-body [data-run]').length === 10"
            " && window.vdl.runsModel.tableRows().length === 10",
            timeout=10_000,
        )
        shown = page.evaluate(
            "() => [...document.querySelectorAll('.rt-body [data-run]')].map(r => r.dataset.run).sort()"
        )
        assert [n[:10] for n in shown] == [f"s00-r{i:04d}-" for i in range(10)]
        assert errors == []
    finally:
        context.close()
        stop_serve(server)


# Before the page's scripts: once `window.__slow` is set, the socket's messages reach the page one
# every 45 ms, in order (a server that reads a selection slowly, at a known pace).
SLOW_MESSAGES_JS = """(() => {
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    set onmessage(fn) {
      const queue = [];
      let timer = 0;
      const next = () => {
        timer = 0;
        fn.call(this, queue.shift());
        if (queue.length) timer = setTimeout(next, 45);
      };
      super.onmessage = (ev) => {
        if (!window.__slow && queue.length === 0) return fn.call(this, ev);
        queue.push(ev);
        if (!timer) timer = setTimeout(next, 45);
      };
    }
    get onmessage() { return super.onmessage; }
  };
})();"""


def test_a_selection_of_many_runs_draws_no_partial_lines_in_its_first_two_seconds(
    tmp_path, browser
):
    # While the snapshots of a selection of more than 20 runs come in, the charts are first drawn
    # when the last one is in, or 2 s after the selection began if it is not (app.js,
    # LOADING_FIRST_DRAW_MS; frames.js, loadingDelay): 40 snapshots 45 ms apart take 1.8 s, and
    # the redraw due 1 s in (the rest then 0.8 s away) drew the lines in so far before.
    write_runs(tmp_path / "logs", n_runs=40, tags=4, points=300)
    server = start_serve(tmp_path / "logs")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page, errors = open_scripted(
            context, server, SLOW_MESSAGES_JS, also="window.vdl.chartWrappers.size === 4"
        )
        lines = (
            "(t) => { const u = window.vdl.charts.get(t);"
            " return u ? u.series.slice(1).filter(s => s.alpha === 1).length : 0; }"
        )
        # Every chart's renders: ms since the click, and the selection's phase then.
        page.evaluate(
            """() => { window.__renders = [];
              for (const [tag, c] of window.vdl.chartWrappers) { const render = c.render;
                c.render = function () {
                  window.__renders.push([performance.now() - window.__click, window.vdl.sync.phase, tag]);
                  return render.call(this); }; } }"""
        )
        page.evaluate(
            "() => { window.__slow = true; window.__click = performance.now();"
            " document.querySelector('button.runs-all').click(); }"
        )
        page.wait_for_function(
            f"() => window.vdl.sync.phase === 'ready'"
            f" && [...window.vdl.chartWrappers.keys()].every(t => ({lines})(t) === 40)",
            timeout=30_000,
        )
        renders = page.evaluate("() => window.__renders")
        loading = [(round(ms), tag) for ms, phase, tag in renders if phase == "loading"]
        assert all(ms >= 1_950 for ms, _ in loading), loading
        ready = [tag for _, phase, tag in renders if phase == "ready"]
        assert sorted(set(ready)) == sorted(
            page.evaluate("() => [...window.vdl.chartWrappers.keys()]")
        )
        assert errors == []
    finally:
        context.close()
        stop_serve(server)
