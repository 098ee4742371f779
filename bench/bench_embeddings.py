"""Benchmark of the embeddings projector (issue 15) in headless Chromium.

    python bench/bench_embeddings.py            # 10,000 x 128 with 16x16 thumbnails, 3 page loads
    python bench/bench_embeddings.py --quick    # 3,000 x 128, one page load, 2 s hover window

A run holding one ``add_embedding`` of ``--points`` x ``--dims`` (``--classes`` Gaussian clusters,
two label columns, ``--thumb`` px thumbnails) is written with ``vdl_stream.attach`` into a
temporary log directory and served by a real ``vdl-stream serve`` subprocess on 127.0.0.1. Each of
``--repeat`` page loads (a fresh browser context, 1400x1000) opens the page, scrolls to the
Embeddings view and measures:

* PCA: from the moment the matrix and labels have arrived (``/api/blob`` bodies read) to the
  first frame that draws the PCA scatter (``timings.arrived`` -> ``timings.pcaShown``), and from
  the view starting its fetch (``timings.event``); the worker's own PCA time.
* UMAP while it runs: the method is switched; once the neighbour graph is built and the first
  positions arrive (the layout animating), for ``--window`` seconds the mouse moves over
  the canvas (real input events, every 30 ms to a random point's position, half of them dragging
  to pan) while the page records every animation frame's interval (rAF) and long tasks
  (PerformanceObserver), and the DevTools ``Performance.getMetrics`` main-thread busy share
  (d TaskDuration / d wall). The view's own counters give the cost of each draw and hit test.
* UMAP total time (switch -> last epoch drawn) and the hover card showing a label afterwards.

``--profile`` also takes a CPU profile of the first load's window (the main thread's self time by
function: ``(idle)``, ``(program)`` for Chromium's native work, the view's functions).

Results: a Markdown table on stdout and the record in bench/out/embeddings.json (or ``--out``).
Every wait is bounded; the server and the browser are stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import CHROMIUM_ARGS, start_serve, stop_serve  # noqa: E402
from vdl_stream import attach  # noqa: E402

FRAME_PROBE = """
() => {
  const probe = { frames: [], longtasks: [] };
  window.__embedProbe = probe;
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) probe.longtasks.push(e.duration);
    }).observe({ type: "longtask" });
  } catch (err) {}
  const tick = (t) => {
    probe.frames.push(t);
    if (!probe.stop) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}
"""


def write_run(logdir: Path, n: int, d: int, classes: int, thumb: int) -> float:
    """Write run ``emb`` with one embedding; return the seconds ``add_embedding`` took."""
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(classes, d))
    cls = rng.integers(0, classes, n)
    mat = (centres[cls] + rng.normal(size=(n, d))).astype(np.float32)
    rows = [[f"class{c}", f"item{i}"] for i, c in enumerate(cls)]
    images = None
    if thumb:
        images = np.zeros((n, 3, thumb, thumb), np.uint8)
        images[:, 0] = (cls * 25 % 256)[:, None, None]
        images[:, 2] = (np.arange(n) % 256)[:, None, None]
    with attach(logdir, run="emb", telemetry=False) as w:
        start = time.perf_counter()
        w.add_embedding(mat, rows, images, 1, "features", ["class", "name"])
        took = time.perf_counter() - start
    return took


def metrics(cdp) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def self_times(profile: dict, top: int = 8) -> list[tuple[str, float]]:
    """The share of samples per function of a CDP CPU profile (self time), largest first."""
    nodes = {node["id"]: node["callFrame"] for node in profile["nodes"]}
    times: Counter[str] = Counter()
    for sample, delta in zip(profile["samples"], profile["timeDeltas"], strict=False):
        times[nodes[sample]["functionName"] or "(anonymous)"] += delta
    total = sum(times.values()) or 1
    return [(name, t / total) for name, t in times.most_common(top)]


def one_load(
    browser,
    url: str,
    n: int,
    window: float,
    seed: int,
    shots: Path | None = None,
    profile: bool = False,
) -> dict:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.goto(url + "/")
        page.wait_for_function("() => window.vdl && window.vdl.connected", timeout=30_000)
        page.wait_for_function(
            "() => document.querySelector('.embed-panel') && "
            "!document.querySelector('.embed-panel').hidden",
            timeout=30_000,
        )
        page.locator('.tabs button[data-view="embeddings"]').click()
        page.wait_for_function(
            "n => { const s = vdl.embeddings.state(); return s.shown && s.n === n && "
            "s.timings.pcaShown; }",
            arg=n,
            timeout=60_000,
        )
        state = page.evaluate("vdl.embeddings.state()")
        tm = state["timings"]
        out = {
            "pca_after_arrival_ms": tm["pcaShown"] - tm["arrived"],
            "pca_after_fetch_start_ms": tm["pcaShown"] - tm["event"],
            "fetch_ms": tm["arrived"] - tm["event"],
            "pca_worker_ms": tm["pcaWorkerMs"],
        }
        page.locator(".embed-canvas").scroll_into_view_if_needed()
        box = page.locator(".embed-canvas").bounding_box()
        if shots:
            page.locator(".embed-panel").screenshot(path=str(shots / f"embeddings-pca-{n}.png"))
        rnd = random.Random(seed)
        page.locator("select.embed-method").select_option("umap")
        # The neighbour graph is built first (no positions yet); the window starts with the layout.
        page.wait_for_function(
            "() => vdl.embeddings.state().timings.firstPositions", timeout=300_000
        )
        page.evaluate("vdl.embeddings.resetCosts()")
        page.evaluate(FRAME_PROBE)
        if profile:  # sampled every 0.5 ms; costs a little of the window's main thread
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 500})
            cdp.send("Profiler.start")
        before = metrics(cdp)
        t0 = time.perf_counter()
        moves = 0
        while time.perf_counter() - t0 < window:
            p = page.evaluate(f"vdl.embeddings.pointOnPage({rnd.randrange(n)})")
            if p is None:
                continue
            x = min(max(p["x"], box["x"] + 2), box["x"] + box["width"] - 2)
            y = min(max(p["y"], box["y"] + 2), box["y"] + box["height"] - 2)
            if moves % 20 == 10:  # a short drag: pan
                page.mouse.down()
                page.mouse.move(x + 30, y + 10, steps=3)
                page.mouse.up()
            else:
                page.mouse.move(x, y)
            moves += 1
            time.sleep(0.03)
        after = metrics(cdp)
        if profile:
            out["profile"] = self_times(cdp.send("Profiler.stop")["profile"])
        probe = page.evaluate(
            "(() => { const p = window.__embedProbe; p.stop = true; return p; })()"
        )
        during = page.evaluate("vdl.embeddings.state()")
        intervals = [b - a for a, b in zip(probe["frames"], probe["frames"][1:], strict=False)]
        costs = during["costs"]
        out.update(
            {
                "window_s": after["Timestamp"] - before["Timestamp"],
                "layout_running_at_end": not during["done"],
                "epoch_at_end": during["epoch"],
                "busy_share": (after["TaskDuration"] - before["TaskDuration"])
                / max(after["Timestamp"] - before["Timestamp"], 1e-9),
                "frames": len(probe["frames"]),
                "frame_p50_ms": percentile(intervals, 0.5),
                "frame_p95_ms": percentile(intervals, 0.95),
                "frame_max_ms": max(intervals) if intervals else float("nan"),
                "longtasks": len(probe["longtasks"]),
                "longtask_max_ms": max(probe["longtasks"], default=0.0),
                "mouse_moves": moves,
                "draws": costs["draws"],
                "draw_mean_ms": costs["drawMs"] / max(costs["draws"], 1),
                "draw_max_ms": costs["drawMaxMs"],
                "hit_tests": costs["hovers"],
                "hit_test_mean_ms": costs["hoverMs"] / max(costs["hovers"], 1),
                "hit_test_max_ms": costs["hoverMaxMs"],
            }
        )
        page.wait_for_function("() => vdl.embeddings.state().done", timeout=300_000)
        done = page.evaluate("vdl.embeddings.state().timings")
        out["umap_ms"] = done["umapMs"]
        out["graph_ms"] = done["firstPositions"] - done["umapStart"]
        # After the layout: hovering a point shows its label.
        page.dblclick(".embed-canvas")
        page.wait_for_timeout(100)
        p = page.evaluate("vdl.embeddings.pointOnPage(7)")
        page.mouse.move(p["x"], p["y"])
        page.wait_for_function("() => vdl.embeddings.state().tip !== null", timeout=10_000)
        out["hover_label_ok"] = "name: item" in page.locator(".embed-tip").inner_text()
        if shots:
            page.locator(".embed-panel").screenshot(path=str(shots / f"embeddings-umap-{n}.png"))
        out["page_errors"] = errors
        return out
    finally:
        context.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--thumb", type=int, default=16, help="thumbnail side in px (0: none)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=float, default=4.0, help="seconds of mouse input")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "embeddings.json")
    parser.add_argument("--screenshots", type=Path, help="save the first load's panel here")
    parser.add_argument(
        "--profile", action="store_true", help="CPU profile of the first load's window"
    )
    args = parser.parse_args()
    if args.quick:
        args.points, args.repeat, args.window = 3000, 1, 2.0
    executable = shutil.which("chromium")
    if executable is None:
        print("chromium is not installed", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        logdir = Path(tmp) / "logs"
        write_s = write_run(logdir, args.points, args.dims, args.classes, args.thumb)
        server = start_serve(logdir)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
                try:
                    loads = [
                        one_load(
                            browser,
                            server.url,
                            args.points,
                            args.window,
                            seed,
                            args.screenshots if seed == 0 else None,
                            args.profile and seed == 0,
                        )
                        for seed in range(args.repeat)
                    ]
                finally:
                    browser.close()
        finally:
            stop_serve(server)

    def med(key: str) -> float:
        return statistics.median(load[key] for load in loads)

    record = {
        "points": args.points,
        "dims": args.dims,
        "thumb": args.thumb,
        "repeat": args.repeat,
        "add_embedding_s": write_s,
        "machine": platform.platform(),
        "loads": loads,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    rows = [
        ("PCA drawn after the data arrived", f"{med('pca_after_arrival_ms'):.0f} ms", "≤ 1,000 ms"),
        (
            "PCA drawn after the view began fetching",
            f"{med('pca_after_fetch_start_ms'):.0f} ms",
            "",
        ),
        ("PCA in the worker", f"{med('pca_worker_ms'):.0f} ms", ""),
        (
            "UMAP: neighbour graph (switch to first positions)",
            f"{med('graph_ms') / 1000:.1f} s",
            "",
        ),
        ("UMAP: switch to last epoch", f"{med('umap_ms') / 1000:.1f} s", ""),
        ("main-thread busy while the layout animates + mouse", f"{med('busy_share'):.0%}", ""),
        (
            "frame interval p50 / p95",
            f"{med('frame_p50_ms'):.1f} / {med('frame_p95_ms'):.1f} ms",
            "",
        ),
        ("longest frame", f"{med('frame_max_ms'):.0f} ms", ""),
        ("long tasks (> 50 ms) in the window", f"{med('longtasks'):.0f}", ""),
        ("one draw, mean / max", f"{med('draw_mean_ms'):.2f} / {med('draw_max_ms'):.1f} ms", ""),
        (
            "one hit test, mean / max",
            f"{med('hit_test_mean_ms'):.2f} / {med('hit_test_max_ms'):.2f} ms",
            "",
        ),
    ]
    print(
        f"\n{args.points:,} points x {args.dims} dims, {args.thumb}px thumbnails, "
        f"median of {args.repeat} page load(s); add_embedding took {write_s:.2f} s\n"
    )
    print("| measure | value | target |\n|---|---|---|")
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")
    if "profile" in loads[0]:
        shares = ", ".join(f"{name} {share:.0%}" for name, share in loads[0]["profile"])
        print(f"\nmain thread over the first load's window (CPU profile, self time): {shares}")
    ok = all(load["hover_label_ok"] and not load["page_errors"] for load in loads)
    print(f"\nhover shows the label after the layout: {ok}; record: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
