import assert from "node:assert/strict";
import { test } from "node:test";
import { formatCount, formatTensor, graphModel, itemOf, layoutGraph, searchNodes, visibleGraph } from "../src/graphlayout.js";

const T = (shape) => ({ shape, dtype: "float32" });
// x -> a/conv -> a/add (also from x) -> a/b/relu -> fc -> out: a residual inside scope a.
const graph = {
  nodes: [
    { name: "x", op: "Input", scope: "", params: 0, outputs: [T([1, 3])] },
    { name: "a.conv", op: "Conv2d", scope: "a", params: 84, outputs: [T([1, 3])] },
    { name: "add", op: "add", scope: "a", params: 0, outputs: [T([1, 3])] },
    { name: "a.b.relu", op: "ReLU", scope: "a/b", params: 0, outputs: [T([1, 3])] },
    { name: "a.b.relu2", op: "ReLU", scope: "a/b", params: 0, outputs: [T([1, 3])] },
    { name: "fc", op: "Linear", scope: "", params: 8, outputs: [T([1, 2])] },
    { name: "out", op: "Output", scope: "", params: 0, outputs: [T([1, 2])] },
  ],
  edges: [[0, 1, 0], [1, 2, 0], [0, 2, 0], [2, 3, 0], [3, 4, 0], [4, 5, 0], [5, 6, 0]],
};

test("scopes count their ops and parameters, nested", () => {
  const m = graphModel(graph);
  assert.deepEqual([...m.scopes.keys()], ["a", "a/b"]);
  assert.equal(m.scopes.get("a").count, 4);
  assert.equal(m.scopes.get("a").params, 84);
  assert.deepEqual([...m.scopes.get("a").children], ["a/b"]);
  assert.deepEqual(m.ancestors[3], ["a", "a/b"]);
});

test("collapsed scopes merge their ops and edges; expanding shows them", () => {
  const m = graphModel(graph);
  const closed = visibleGraph(m, new Set());
  assert.deepEqual(closed.items.map((i) => i.id), ["n:0", "s:a", "n:5", "n:6"]);
  // x->conv and x->add both become x->a: one edge of count 2
  assert.deepEqual(closed.edges.map((e) => [e.from, e.to, e.count]), [["n:0", "s:a", 2], ["s:a", "n:5", 1], ["n:5", "n:6", 1]]);
  const open = visibleGraph(m, new Set(["a"]));
  assert.deepEqual(open.items.map((i) => i.id), ["n:0", "n:1", "n:2", "s:a/b", "n:5", "n:6"]);
  assert.equal(itemOf(m, new Set(["a", "a/b"]), 4), "n:4");
});

test("a scope of one op shows the op itself", () => {
  const m = graphModel({ nodes: [{ name: "c", op: "Conv", scope: "s", outputs: [T([1])] }], edges: [] });
  assert.equal(itemOf(m, new Set(), 0), "n:0");
});

test("layout puts every edge downward, spans long edges with points, and keeps boxes apart", () => {
  const m = graphModel(graph);
  const vis = visibleGraph(m, new Set(["a", "a/b"]));
  const lay = layoutGraph(vis, () => ({ w: 80, h: 30 }));
  for (const r of lay.routes) {
    assert.ok(r.points[0].y < r.points[r.points.length - 1].y);
    assert.equal(r.points.length, lay.boxes.get(r.edge.to).layer - lay.boxes.get(r.edge.from).layer + 1);
  }
  // the residual x -> add spans two layers: a bend point between them
  assert.equal(lay.boxes.get("n:2").layer, 2);
  const byLayer = new Map();
  for (const b of lay.boxes.values()) byLayer.set(b.layer, [...(byLayer.get(b.layer) ?? []), b]);
  for (const boxes of byLayer.values()) {
    boxes.sort((p, q) => p.x - q.x);
    for (let k = 1; k < boxes.length; k++) assert.ok(boxes[k].x - boxes[k - 1].x >= 80);
  }
  assert.ok(lay.width >= 80 && lay.height > 0);
});

test("crossing reduction untangles two parallel chains", () => {
  // a1->b2, a2->b1 drawn in order would cross; barycenters swap b1 and b2
  const nodes = ["a1", "a2", "b1", "b2"].map((name) => ({ name, op: "op", scope: "", outputs: [T([1])] }));
  const vis = visibleGraph(graphModel({ nodes, edges: [[0, 3, 0], [1, 2, 0]] }), new Set());
  const lay = layoutGraph(vis, () => ({ w: 50, h: 20 }));
  const x = (id) => lay.boxes.get(id).x;
  assert.equal(x("n:0") < x("n:1"), x("n:3") < x("n:2"));
});

test("a collapsed scope that closes a cycle still lays out (the edge is reversed)", () => {
  const nodes = [
    { name: "s1", op: "a", scope: "s", outputs: [T([1])] },
    { name: "m", op: "b", scope: "", outputs: [T([1])] },
    { name: "s2", op: "c", scope: "s", outputs: [T([1])] },
  ];
  const vis = visibleGraph(graphModel({ nodes, edges: [[0, 1, 0], [1, 2, 0]] }), new Set());
  assert.deepEqual(vis.edges.map((e) => [e.from, e.to]), [["s:s", "n:1"], ["n:1", "s:s"]]);
  const lay = layoutGraph(vis, () => ({ w: 50, h: 20 }));
  assert.deepEqual(lay.routes.map((r) => r.reversed), [false, true]);
});

test("search, counts and tensors format for labels", () => {
  const m = graphModel(graph);
  assert.deepEqual(searchNodes(m, "relu"), [3, 4]);
  assert.deepEqual(searchNodes(m, "LINEAR"), [5]);
  assert.deepEqual(searchNodes(m, "  "), []);
  assert.equal(formatCount(25557032), "25.6M");
  assert.equal(formatCount(4096), "4.1K");
  assert.equal(formatTensor({ shape: [null, 3, "batch"], dtype: "float32" }), "?×3×batch float32");
  assert.equal(formatTensor({ shape: null, dtype: null }), "?");
});

test("a malformed payload gives an empty model, not an exception", () => {
  const m = graphModel({ nodes: "x", edges: [[0, 9, 0]] });
  assert.equal(m.nodes.length, 0);
  assert.equal(visibleGraph(m, new Set()).items.length, 0);
  assert.equal(layoutGraph(visibleGraph(m, new Set()), () => ({ w: 1, h: 1 })).boxes.size, 0);
});
