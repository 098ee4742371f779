"""Benchmark of the model graph (issue 15, "Model graph"): a torchvision-style ResNet-50 built in
code (tests/graph_models.py), logged with ``add_graph`` and drawn by the page.

    python bench/bench_graph.py            # 10 page loads
    python bench/bench_graph.py --quick    # 3 page loads

Parts:

* convert: ``graphs.model_graph(resnet50(), input)`` (torch.fx trace + shape propagation at
  224x224), ``--convert`` times; the event's msgpack size.
* page: the run holding that graph is served by a real ``vdl-stream serve`` subprocess; each load
  is a fresh browser context in a 1400x1000 viewport that shows the graph view as soon as the page
  script has built it (as a click on the header's Graph button does). Measured from navigation
  start (``performance.now()`` in the page) to the first draw of the graph, collapsed by scope:
  connect, runs list, subscribe, the snapshot holding the graph event, decode, layout, draw.
  Then, in the same page: "expand all" (177 ops, 192 edges: layout + first draw) and a redraw
  of the full graph at a pan (what every drag frame costs).

Results: a Markdown summary on stdout and the record in bench/out/graph.json (or --out). Every
wait is bounded; the server and the browser are stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import torch  # noqa: E402

from tests.conftest import CHROMIUM_ARGS, start_serve, stop_serve  # noqa: E402
from tests.graph_models import resnet50  # noqa: E402
from vdl_stream import attach, graphs  # noqa: E402

# Shows the graph view as soon as the page's script has built it, like a click on its button.
SHOW_GRAPH = """
const timer = setInterval(() => {
  const view = document.querySelector('.view.graph');
  if (!view) return;
  clearInterval(timer);
  view.scrollIntoView({block: 'start'});
}, 5);
"""


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def bench_convert(model: torch.nn.Module, repeat: int) -> dict:
    x = torch.randn(1, 3, 224, 224)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        graph = graphs.model_graph(model, x)
        times.append(time.perf_counter() - t0)
    return {
        "seconds": times,
        "median_s": median(times),
        "nodes": len(graph["nodes"]),
        "edges": len(graph["edges"]),
        "params": sum(n["params"] for n in graph["nodes"]),
        "msgpack_bytes": len(msgpack.packb(graph)),
    }


def bench_page(url: str, loads: int) -> dict:
    from playwright.sync_api import sync_playwright

    results = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                try:
                    page = context.new_page()
                    page.add_init_script(SHOW_GRAPH)
                    page.goto(url + "/")
                    page.wait_for_function(
                        "() => window.vdl && window.vdl.graph.stats.firstDrawAt !== null",
                        timeout=30_000,
                    )
                    first = page.evaluate(
                        "() => ({drawn: window.vdl.graph.stats.firstDrawAt,"
                        " received: window.vdl.graph.stats.receivedAt,"
                        " boxes: window.vdl.graph.boxes().length})"
                    )
                    expand = page.evaluate(
                        """() => {
                          const g = window.vdl.graph;
                          const t0 = performance.now();
                          g.expandAll();
                          g.draw();
                          const total = performance.now() - t0;
                          const t1 = performance.now();
                          g.draw();
                          return {total, layout: g.stats.lastLayoutMs,
                                  redraw: performance.now() - t1, boxes: g.boxes().length,
                                  edges: g.edges()};
                        }"""
                    )
                    results.append({"first_draw_ms": first["drawn"], **first, "expand": expand})
                finally:
                    context.close()
        finally:
            browser.close()
    return {
        "loads": results,
        "first_draw_ms_median": median([r["first_draw_ms"] for r in results]),
        "first_draw_ms_max": max(r["first_draw_ms"] for r in results),
        "received_ms_median": median([r["received"] for r in results]),
        "received_to_drawn_ms_median": median([r["drawn"] - r["received"] for r in results]),
        "expand_all_ms_median": median([r["expand"]["total"] for r in results]),
        "expand_layout_ms_median": median([r["expand"]["layout"] for r in results]),
        "redraw_full_ms_median": median([r["expand"]["redraw"] for r in results]),
        "boxes_collapsed": results[0]["boxes"],
        "boxes_expanded": results[0]["expand"]["boxes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 page loads, 2 conversions")
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--convert", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "graph.json")
    args = parser.parse_args()
    loads = 3 if args.quick else args.loads
    model = resnet50()
    convert = bench_convert(model, 2 if args.quick else args.convert)
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp) / "logs"
        with attach(logdir, run="resnet50", telemetry=False) as w:
            w.add_graph(model, torch.randn(1, 3, 224, 224))
        server = start_serve(logdir)
        try:
            page = bench_page(server.url, loads)
        finally:
            stop_serve(server)
    record = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_avg": os.getloadavg(),
        "convert": convert,
        "page": page,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print("| measure | median | |")
    print("|---|---|---|")
    print(
        f"| convert ResNet-50 (fx + shapes, 224x224) | {convert['median_s'] * 1000:.0f} ms | "
        f"{convert['nodes']} nodes, {convert['edges']} edges, {convert['params']:,} params, "
        f"{convert['msgpack_bytes'] / 1024:.1f} KiB |"
    )
    print(
        f"| navigation -> graph drawn (collapsed, {page['boxes_collapsed']} boxes) | "
        f"{page['first_draw_ms_median']:.0f} ms | max {page['first_draw_ms_max']:.0f} ms "
        f"of {loads} loads; graph event received at {page['received_ms_median']:.0f} ms, "
        f"drawn {page['received_to_drawn_ms_median']:.0f} ms later |"
    )
    print(
        f"| expand all ({page['boxes_expanded']} boxes): layout + draw | "
        f"{page['expand_all_ms_median']:.1f} ms | layout {page['expand_layout_ms_median']:.1f} ms |"
    )
    print(
        f"| redraw of the expanded graph (a pan frame) | {page['redraw_full_ms_median']:.1f} ms | |"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
