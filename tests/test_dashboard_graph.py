"""The model graph view in headless Chromium against a real ``vdl-stream serve``: a ResNet-50 graph
is drawn collapsed by scope, a click on a scope box expands it, the search jumps to an op inside
closed scopes, and hovering shows shapes and parameters. Screenshots go to test-artifacts/."""

from __future__ import annotations

import pytest

from tests.test_dashboard import ARTIFACTS
from vdl_stream import attach

torch = pytest.importorskip("torch")

CONNECTED = "() => window.vdl && window.vdl.connected"
# Scrolled at once (the header's button scrolls smoothly: boxes would move under the clicks).
SHOW_GRAPH = "() => document.querySelector('.view.graph').scrollIntoView({block: 'start'})"


def box(page, scope: str | None = None, label: str | None = None) -> dict:
    """A drawn box of the graph (by scope path or first label line), in page coordinates."""
    boxes = page.evaluate("() => window.vdl.graph.boxes()")
    for b in boxes:
        if (scope is not None and b["scope"] == scope) or (
            label is not None and b["lines"][0] == label
        ):
            origin = page.locator(".graph-canvas").bounding_box()
            return b | {"px": origin["x"] + b["x"], "py": origin["y"] + b["y"]}
    raise AssertionError(f"no box {scope or label!r} among {[b['id'] for b in boxes]}")


def test_the_page_draws_a_resnet50_graph_expands_a_scope_and_searches(serve_process, browser):
    from tests.graph_models import resnet50

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function(CONNECTED, timeout=15_000)
        with attach(url=serve_process.ws_url, run="resnet", telemetry=False) as writer:
            writer.add_graph(resnet50(), torch.randn(1, 3, 224, 224))
        page.wait_for_function("() => window.vdl.graph.keys().length === 1", timeout=15_000)
        page.evaluate(SHOW_GRAPH)
        page.wait_for_function("() => window.vdl.graph.stats.draws > 0", timeout=15_000)
        # Collapsed by scope: x, conv1, bn1, relu, maxpool, layer1-4, avgpool, flatten, fc, output.
        boxes = page.evaluate("() => window.vdl.graph.boxes()")
        assert len(boxes) == 13
        assert [b["scope"] for b in boxes if b["scope"]] == ["layer1", "layer2", "layer3", "layer4"]
        summary = page.locator(".graph-summary").inner_text()
        assert "177 ops" in summary and "25.6M parameters" in summary
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(".view.graph").screenshot(path=str(ARTIFACTS / "graph-resnet50.png"))

        # A click on layer1's box opens it: its three Bottleneck blocks appear as scopes.
        layer1 = box(page, scope="layer1")
        page.mouse.click(layer1["px"], layer1["py"])
        page.wait_for_function(
            "() => window.vdl.graph.expanded().includes('layer1')", timeout=5_000
        )
        scopes = [b["scope"] for b in page.evaluate("() => window.vdl.graph.boxes()") if b["scope"]]
        assert scopes == ["layer1/0", "layer1/1", "layer1/2", "layer2", "layer3", "layer4"]
        # Hovering a block lists its ops and parameters (Bottleneck 0 of layer1: 75,008).
        block = box(page, scope="layer1/0")
        page.mouse.move(block["px"], block["py"])
        tip = page.locator(".graph-tip")
        tip.wait_for(state="visible", timeout=5_000)
        assert "layer1/0" in tip.inner_text() and "75,008" in tip.inner_text()
        page.locator(".view.graph").screenshot(path=str(ARTIFACTS / "graph-resnet50-layer1.png"))

        # The search finds an op inside closed scopes; Enter opens them and selects it.
        page.locator(".graph-search").fill("layer3.5.conv2")
        page.locator(".graph-search").press("Enter")
        page.wait_for_function("() => window.vdl.graph.selected() !== null", timeout=5_000)
        assert page.evaluate("() => window.vdl.graph.matches().length") == 1
        assert {"layer3", "layer3/5"} <= set(page.evaluate("() => window.vdl.graph.expanded()"))
        assert page.locator(".graph-found").inner_text() == "1/1"
        page.evaluate("() => window.vdl.graph.draw()")
        page.locator(".view.graph").screenshot(path=str(ARTIFACTS / "graph-resnet50-search.png"))
        # The selected op is on screen, centred; hovering it shows its shapes and parameters.
        selected = page.evaluate(
            "() => { const g = window.vdl.graph; const id = g.selected();"
            " return g.boxes().find((b) => b.id === id); }"
        )
        canvas = page.locator(".graph-canvas").bounding_box()
        assert abs(selected["x"] - canvas["width"] / 2) < 2
        assert abs(selected["y"] - canvas["height"] / 2) < 2
        page.mouse.move(canvas["x"] + selected["x"], canvas["y"] + selected["y"])
        tip.wait_for(state="visible", timeout=5_000)
        text = tip.inner_text()
        assert "layer3.5.conv2" in text and "1×256×14×14 float32" in text and "589,824" in text

        # Expand all: every op is its own box, every edge drawn.
        page.mouse.move(5, 5)
        page.locator(".graph-tools button").first.click()
        page.wait_for_function("() => window.vdl.graph.boxes().length === 177", timeout=5_000)
        assert page.evaluate("() => window.vdl.graph.edges()") == 192
        page.evaluate("() => window.vdl.graph.draw()")
        page.locator(".view.graph").screenshot(path=str(ARTIFACTS / "graph-resnet50-expanded.png"))
    finally:
        page.close()


def test_a_small_graph_starts_expanded_and_collapses_on_its_scope_label(serve_process, browser):
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x)) + x

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x)

    page = browser.new_page(viewport={"width": 1000, "height": 800})
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function(CONNECTED, timeout=15_000)
        with attach(url=serve_process.ws_url, run="small", telemetry=False) as writer:
            writer.add_graph(Net(), torch.ones(2, 4), tag="net")
        page.wait_for_function("() => window.vdl.graph.keys().length === 1", timeout=15_000)
        page.evaluate(SHOW_GRAPH)
        page.wait_for_function("() => window.vdl.graph.stats.draws > 0", timeout=15_000)
        assert page.evaluate("() => window.vdl.graph.expanded()") == ["block"]
        assert len(page.evaluate("() => window.vdl.graph.boxes()")) == 5
        # The open scope's label strip sits just above its first box: a click there closes it.
        first = box(page, label="Linear")
        page.mouse.click(first["px"] - first["w"] / 2 + 4, first["py"] - first["h"] / 2 - 14)
        page.wait_for_function("() => window.vdl.graph.expanded().length === 0", timeout=5_000)
        assert [b["scope"] for b in page.evaluate("() => window.vdl.graph.boxes()")] == [
            None,
            "block",
            None,
        ]
    finally:
        page.close()
