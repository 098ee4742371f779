// Model graphs (`graph` events, docs/protocol.md): the scope tree, the graph shown for a set of
// expanded scopes, and a layered (Sugiyama-style) layout of it. No DOM: tested under node.
//
// Layout steps, each simple and linear-ish so that a ResNet-50 expanded in full (~180 ops, ~200
// edges) lays out in a few milliseconds:
// 1. layering: items in graph order (converters emit topological order), longest path;
// 2. long edges are split by dummy points, one per layer crossed;
// 3. crossing reduction: barycenter sweeps down and up;
// 4. x: each item pulled toward its neighbours' mean, then overlaps pushed apart in order.

/**
 * Index a graph payload: each node's scope ancestors, and per scope its nodes, params and ops.
 * @param {{nodes: object[], edges: number[][]}} graph
 */
export function graphModel(graph) {
  const nodes = Array.isArray(graph?.nodes) ? graph.nodes : [];
  const edges = Array.isArray(graph?.edges) ? graph.edges.filter((e) => Array.isArray(e) && e[0] in nodes && e[1] in nodes) : [];
  /** @type {Map<string, {path: string, name: string, depth: number, count: number, params: number, ops: Map<string, number>, first: number, children: Set<string>}>} */
  const scopes = new Map();
  const ancestors = nodes.map((node, i) => {
    const scope = typeof node.scope === "string" ? node.scope : "";
    const parts = scope ? scope.split("/") : [];
    const paths = [];
    for (let k = 1; k <= parts.length; k++) {
      const path = parts.slice(0, k).join("/");
      paths.push(path);
      let s = scopes.get(path);
      if (!s) {
        s = { path, name: parts[k - 1], depth: k, count: 0, params: 0, ops: new Map(), first: i, children: new Set() };
        scopes.set(path, s);
        if (k > 1) scopes.get(paths[k - 2]).children.add(path);
      }
      s.count++;
      s.params += Number(node.params) || 0;
      s.ops.set(node.op, (s.ops.get(node.op) ?? 0) + 1);
    }
    return paths;
  });
  return { graph, nodes, edges, scopes, ancestors };
}

/** Node names or op types containing `query` (case-insensitive): their indices. */
export function searchNodes(model, query) {
  const q = String(query ?? "").trim().toLowerCase();
  if (!q) return [];
  const hits = [];
  model.nodes.forEach((n, i) => {
    if (String(n.name).toLowerCase().includes(q) || String(n.op).toLowerCase().includes(q)) hits.push(i);
  });
  return hits;
}

/**
 * The item node `i` is shown as: the outermost collapsed scope holding it (a scope of a single op
 * shows the op itself), or the node.
 * @returns {string} `s:<path>` or `n:<index>`
 */
export function itemOf(model, expanded, i) {
  for (const path of model.ancestors[i]) {
    if (expanded.has(path)) continue;
    if (model.scopes.get(path).count === 1) break;
    return `s:${path}`;
  }
  return `n:${i}`;
}

/**
 * The graph shown for a set of expanded scope paths: items (nodes and collapsed scopes, in graph
 * order) and the edges between them, merged (`count` edges of the model each).
 */
export function visibleGraph(model, expanded) {
  const byId = new Map();
  const itemIds = model.nodes.map((node, i) => {
    const id = itemOf(model, expanded, i);
    if (!byId.has(id)) {
      const scope = id.startsWith("s:") ? model.scopes.get(id.slice(2)) : null;
      byId.set(id, { id, index: scope ? -1 : i, scope, order: byId.size });
    }
    return id;
  });
  const edgeMap = new Map();
  for (const [src, dst, slot] of model.edges) {
    const a = itemIds[src];
    const b = itemIds[dst];
    if (a === b) continue;
    const key = `${a}\u0000${b}`;
    const e = edgeMap.get(key);
    if (e) e.count++;
    else edgeMap.set(key, { from: a, to: b, count: 1, tensor: model.nodes[src].outputs?.[slot] ?? null });
  }
  return { items: [...byId.values()], edges: [...edgeMap.values()] };
}

/**
 * Lay out a visible graph top to bottom.
 * @param {{items: object[], edges: object[]}} vis
 * @param {(item: object) => {w: number, h: number}} size each item's box
 * @param {object} [opts] `gapX`, `gapY` (pixels between boxes), `sweeps` (crossing reduction)
 * @returns {{boxes: Map<string, {x: number, y: number, w: number, h: number, layer: number}>,
 *   routes: {edge: object, points: {x: number, y: number}[], reversed: boolean}[], width: number, height: number}}
 *   x, y: the box's centre
 */
export function layoutGraph(vis, size, { gapX = 24, gapY = 44, sweeps = 4 } = {}) {
  const { items, edges } = vis;
  const order = new Map(items.map((it, k) => [it.id, k]));
  // 1. layering (edges against graph order are reversed: a collapsed scope can close a cycle)
  const layerOf = new Array(items.length).fill(0);
  const forward = edges.map((e) => {
    const a = order.get(e.from);
    const b = order.get(e.to);
    return a < b ? { a, b, edge: e, reversed: false } : { a: b, b: a, edge: e, reversed: true };
  });
  forward.sort((p, q) => p.b - q.b);
  const incoming = items.map(() => []);
  for (const f of forward) incoming[f.b].push(f);
  for (let k = 0; k < items.length; k++) for (const f of incoming[k]) layerOf[k] = Math.max(layerOf[k], layerOf[f.a] + 1);
  const depth = items.length ? Math.max(...layerOf) + 1 : 0;
  // 2. dummy points for long edges: vertices [0, n) are items, the rest dummies
  const vLayer = layerOf.slice();
  const up = items.map(() => []);
  const down = items.map(() => []);
  const chains = [];
  for (const f of forward) {
    let prev = f.a;
    const chain = [f.a];
    for (let l = layerOf[f.a] + 1; l < layerOf[f.b]; l++) {
      const v = vLayer.length;
      vLayer.push(l);
      up.push([]);
      down.push([]);
      down[prev].push(v);
      up[v].push(prev);
      chain.push(v);
      prev = v;
    }
    down[prev].push(f.b);
    up[f.b].push(prev);
    chain.push(f.b);
    chains.push({ f, chain });
  }
  const layers = Array.from({ length: depth }, () => []);
  for (let v = 0; v < vLayer.length; v++) layers[vLayer[v]].push(v);
  const pos = new Float64Array(vLayer.length);
  const renumber = (layer) => layer.forEach((v, k) => (pos[v] = k));
  layers.forEach(renumber);
  // 3. crossing reduction
  const sortBy = (layer, nbrs) => {
    const key = new Map();
    for (const v of layer) {
      const ns = nbrs[v];
      key.set(v, ns.length ? ns.reduce((s, u) => s + pos[u], 0) / ns.length : pos[v]);
    }
    layer.sort((p, q) => key.get(p) - key.get(q) || pos[p] - pos[q]);
    renumber(layer);
  };
  for (let s = 0; s < sweeps; s++) {
    for (let l = 1; l < depth; l++) sortBy(layers[l], up);
    for (let l = depth - 2; l >= 0; l--) sortBy(layers[l], down);
  }
  // 4. x coordinates
  const width = new Float64Array(vLayer.length);
  const height = new Float64Array(vLayer.length);
  items.forEach((it, k) => {
    const s = size(it);
    width[k] = s.w;
    height[k] = s.h;
  });
  for (let v = items.length; v < vLayer.length; v++) width[v] = 8;
  const x = new Float64Array(vLayer.length);
  for (const layer of layers) {
    let cursor = 0;
    for (const v of layer) {
      x[v] = cursor + width[v] / 2;
      cursor += width[v] + gapX;
    }
    const shift = cursor / 2;
    for (const v of layer) x[v] -= shift;
  }
  const place = (layer, nbrs) => {
    const want = layer.map((v) => (nbrs[v].length ? nbrs[v].reduce((s, u) => s + x[u], 0) / nbrs[v].length : x[v]));
    const left = want.slice();
    for (let k = 1; k < layer.length; k++) left[k] = Math.max(want[k], left[k - 1] + (width[layer[k - 1]] + width[layer[k]]) / 2 + gapX);
    const right = want.slice();
    for (let k = layer.length - 2; k >= 0; k--) right[k] = Math.min(want[k], right[k + 1] - (width[layer[k + 1]] + width[layer[k]]) / 2 - gapX);
    layer.forEach((v, k) => (x[v] = (left[k] + right[k]) / 2));
    for (let k = 1; k < layer.length; k++) x[layer[k]] = Math.max(x[layer[k]], x[layer[k - 1]] + (width[layer[k - 1]] + width[layer[k]]) / 2 + gapX);
  };
  for (let s = 0; s < 3; s++) {
    for (let l = 1; l < depth; l++) place(layers[l], up);
    for (let l = depth - 2; l >= 0; l--) place(layers[l], down);
  }
  // y: each layer as tall as its tallest box
  const layerH = layers.map((layer) => layer.reduce((m, v) => Math.max(m, height[v]), 0));
  const layerY = [];
  let yCursor = 0;
  for (let l = 0; l < depth; l++) {
    layerY.push(yCursor + layerH[l] / 2);
    yCursor += layerH[l] + gapY;
  }
  let minX = Infinity;
  let maxX = -Infinity;
  for (let v = 0; v < vLayer.length; v++) {
    minX = Math.min(minX, x[v] - width[v] / 2);
    maxX = Math.max(maxX, x[v] + width[v] / 2);
  }
  if (!Number.isFinite(minX)) minX = maxX = 0;
  const boxes = new Map();
  items.forEach((it, k) => boxes.set(it.id, { x: x[k] - minX, y: layerY[layerOf[k]], w: width[k], h: height[k], layer: layerOf[k] }));
  const routes = chains.map(({ f, chain }) => {
    const points = chain.map((v, k) => {
      const y = layerY[vLayer[v]];
      const h = v < items.length ? height[v] / 2 : 0;
      return { x: x[v] - minX, y: k === 0 ? y + h : k === chain.length - 1 ? y - h : y };
    });
    return { edge: f.edge, points, reversed: f.reversed };
  });
  return { boxes, routes, width: maxX - minX, height: Math.max(0, yCursor - gapY) };
}

/** "25.6M", "4.1K", "12": parameter counts for labels. */
export function formatCount(n) {
  const v = Number(n) || 0;
  if (v >= 1e9) return `${(v / 1e9).toFixed(1)}B`;
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}K`;
  return String(v);
}

/** "1×64×56×56 float32": a tensor of the payload as text ("?" for unknown dims). */
export function formatTensor(t) {
  if (!t || !Array.isArray(t.shape)) return t?.dtype ?? "?";
  const dims = t.shape.map((d) => (d === null || d === undefined ? "?" : String(d))).join("×");
  return t.dtype ? `${dims} ${t.dtype}` : dims;
}
