// The model graph view (issue 15): a `graph` event (add_graph) drawn as a layered diagram on one
// canvas. Scopes (modules) start collapsed into one box each, unless the graph is small; a click on
// a box opens it, a click on an open scope's label closes it. Drag pans, the wheel zooms, the
// search box lights matching ops and Enter jumps to the next one (opening its scopes). Hovering a
// box lists its op, shapes and parameters. The page keeps the newest graph of each (run, tag): the
// store does not hold graph events, the view takes them from the connection's frames.
import { colorFor, el } from "../dom.js";
import { formatCount, formatTensor, graphModel, itemOf, layoutGraph, searchNodes, visibleGraph } from "../graphlayout.js";
import { t, tf } from "../i18n.js";

/** Graphs kept (the newest of each run and tag); beyond this the first received is dropped. */
export const MAX_GRAPHS = 50;
/** Graphs of at most this many nodes start with every scope open. */
export const EXPAND_ALL_UP_TO = 60;
const BOX_H = 38;
const FONT = "12px system-ui, sans-serif";
const SMALL = "11px system-ui, sans-serif";
const MIN_SCALE = 0.05;
const MAX_SCALE = 4;
/** The smallest scale at which labels and the shapes on edges are drawn readably. */
const READABLE_SCALE = 0.8;

/** A stable colour per op type (the run palette, hashed by name). */
const opColor = (op) => colorFor(`op:${op}`);

export class GraphView {
  /** @param {object} ctx shared page context: `scheduler`, `shown` */
  constructor(ctx) {
    this.ctx = ctx;
    /** @type {Map<string, object>} `${run}\u0000${tag}` -> newest graph event */
    this.graphs = new Map();
    this.key = null;
    this.model = null;
    this.expanded = new Set();
    this.view = { scale: 1, tx: 0, ty: 0 };
    this.matches = [];
    this.matchAt = -1;
    this.selected = null;
    this.stats = { layouts: 0, draws: 0, receivedAt: null, firstDrawAt: null, lastLayoutMs: 0, lastDrawMs: 0 };
    this.empty = el("p", { class: "empty", text: t("noGraph") });
    this.select = el("select", { class: "graph-select", on: { change: (e) => this.show(e.target.value) } });
    this.search = el("input", { type: "search", class: "graph-search", spellcheck: "false", on: { input: () => this._onSearch(), keydown: (e) => e.key === "Enter" && this.jump(e.shiftKey ? -1 : 1) } });
    this.found = el("span", { class: "graph-found" });
    this.expandBtn = el("button", { type: "button", on: { click: () => this.expandAll() } });
    this.collapseBtn = el("button", { type: "button", on: { click: () => this.collapseAll() } });
    this.fitBtn = el("button", { type: "button", on: { click: () => this.fit() } });
    this.summary = el("span", { class: "graph-summary" });
    this.canvas = el("canvas", { class: "graph-canvas", tabindex: "0" });
    this.tip = el("div", { class: "tooltip graph-tip", hidden: true });
    this.box = el("div", { class: "graph-box" }, this.canvas);
    this.panel = el(
      "section",
      { class: "chart graph-panel", hidden: true },
      el("div", { class: "graph-tools" }, this.select, this.search, this.found, this.expandBtn, this.collapseBtn, this.fitBtn, this.summary),
      this.box,
    );
    this.element = el("div", { class: "view graph" }, this.empty, this.panel, this.tip);
    this.item = { element: this.box, render: () => this.draw() };
    ctx.scheduler.observe(this.item);
    this._wire();
    this.relabel();
  }

  /** Take the `graph` events of a snapshot or data frame. */
  onMessage(msg) {
    const carries = msg.type === "snapshot" || msg.type === "snapshot_events" || msg.type === "data";
    if (!carries || !Array.isArray(msg.events)) return;
    let added = false;
    for (const ev of msg.events) {
      if (ev?.kind !== "graph" || !Array.isArray(ev.nodes)) continue;
      const key = `${msg.run}\u0000${ev.tag ?? ""}`;
      const old = this.graphs.get(key);
      if (old && (old.step ?? 0) > (ev.step ?? 0)) continue;
      this.graphs.delete(key); // re-inserted last: the Map's order is the order of arrival
      this.graphs.set(key, { ...ev, run: msg.run });
      added = true;
      for (const first of this.graphs.keys()) {
        if (this.graphs.size <= MAX_GRAPHS) break;
        if (first !== this.key && first !== key) this.graphs.delete(first);
      }
      if (this.key === null || this.key === key) this.key = key;
    }
    if (!added) return;
    this.stats.receivedAt ??= performance.now();
    this._options();
    this.show(this.key, true);
  }

  /** Apply the run toggles and the tag filter: the selector lists the graphs that pass. */
  refresh() {
    this._options();
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noGraph");
    this.search.placeholder = t("graphSearch");
    this.expandBtn.textContent = t("graphExpandAll");
    this.collapseBtn.textContent = t("graphCollapseAll");
    this.fitBtn.textContent = t("graphFit");
    this.canvas.setAttribute("aria-label", t("graph"));
    this._onSearch(false);
    this._summary();
    if (this.model) this._layout(false); // scope boxes' labels are in the interface language
  }

  _options() {
    const keys = [...this.graphs.keys()].filter((k) => {
      const g = this.graphs.get(k);
      return this.ctx.shown(g.run, g.tag ?? "");
    });
    keys.sort();
    this.select.replaceChildren(...keys.map((k) => el("option", { value: k, text: `${this.graphs.get(k).run} · ${this.graphs.get(k).tag}` })));
    this.select.hidden = keys.length < 2;
    if (this.key !== null) this.select.value = this.key;
    this.panel.hidden = this.graphs.size === 0;
    this.empty.hidden = this.graphs.size > 0;
  }

  /** Show the graph of `key` (`run\u0000tag`); `keep` keeps the open scopes and view if it is the same. */
  show(key, keep = false) {
    const ev = this.graphs.get(key);
    if (!ev) return;
    const same = keep && this.key === key && this.model !== null;
    this.key = key;
    this.model = graphModel(ev);
    if (!same) {
      this.expanded = new Set();
      if (this.model.nodes.length <= EXPAND_ALL_UP_TO) for (const path of this.model.scopes.keys()) this.expanded.add(path);
      this.selected = null;
    }
    this._layout(!same);
    this._onSearch(false);
    this._summary();
  }

  _summary() {
    if (!this.model) return;
    const params = this.model.nodes.reduce((s, n) => s + (Number(n.params) || 0), 0);
    this.summary.textContent = tf("graphSummary", { nodes: this.model.nodes.length, edges: this.model.edges.length, params: formatCount(params), framework: this.model.graph.framework ?? "" });
  }

  /** Lay out the shown graph again (after opening or closing scopes); `fit` resets the view. */
  _layout(fit) {
    const t0 = performance.now();
    const ctx2d = this.canvas.getContext("2d");
    this.vis = visibleGraph(this.model, this.expanded);
    this.labels = new Map();
    for (const it of this.vis.items) {
      const lines = this._lines(it);
      ctx2d.font = FONT;
      let w = ctx2d.measureText(lines[0]).width;
      ctx2d.font = SMALL;
      for (const line of lines.slice(1)) w = Math.max(w, ctx2d.measureText(line).width);
      this.labels.set(it.id, { lines, w: Math.min(260, Math.max(70, w + 20)) });
    }
    // Room between layers for the frames of open scopes (each level adds its padding and label).
    this.layout = layoutGraph(this.vis, (it) => ({ w: this.labels.get(it.id).w, h: BOX_H }), { gapY: this.expanded.size ? 56 : 44 });
    this.stats.layouts++;
    this.tip.hidden = true;
    this.stats.lastLayoutMs = performance.now() - t0;
    if (fit) this.fit(false);
    this.ctx.scheduler.mark(this.item);
    // On screen: draw in the next frame, not after the charts' 100 ms redraw interval (the
    // scheduler's visibility lags a frame or more behind a panel just un-hidden).
    const r = this.box.getBoundingClientRect();
    if (r.height > 0 && r.bottom > 0 && r.top < window.innerHeight) this._redraw();
  }

  _lines(it) {
    if (it.scope) {
      const s = it.scope;
      const top = [...s.ops.entries()].sort((a, b) => b[1] - a[1])[0];
      const second = tf("graphScopeOps", { count: s.count, op: top ? top[0] : "" });
      return [`⊞ ${s.name}`, s.params ? `${second} · ${formatCount(s.params)}` : second];
    }
    const n = this.model.nodes[it.index];
    const name = String(n.name);
    const short = name.length > 28 ? `…${name.slice(-27)}` : name;
    return [String(n.op), n.params ? `${short} · ${formatCount(n.params)}` : short];
  }

  /**
   * Fit the graph in the canvas: its whole width, and its height too unless that would make the
   * labels unreadable (a tall graph then starts at its top, readable, and is panned).
   */
  fit(redraw = true) {
    if (!this.layout) return;
    const { width, height } = this._size();
    const margin = 24;
    const byWidth = (width - 2 * margin) / Math.max(1, this.layout.width);
    const byHeight = (height - 2 * margin) / Math.max(1, this.layout.height);
    const scale = Math.max(MIN_SCALE, Math.min(1, byWidth, Math.max(byHeight, READABLE_SCALE)));
    this.view = { scale, tx: (width - this.layout.width * scale) / 2, ty: margin };
    if (redraw) this.ctx.scheduler.mark(this.item);
  }

  _size() {
    return { width: this.box.clientWidth || 800, height: this.box.clientHeight || 600 };
  }

  /** Open every scope. */
  expandAll() {
    if (!this.model) return;
    for (const path of this.model.scopes.keys()) this.expanded.add(path);
    this._layout(true);
  }

  /** Close every scope. */
  collapseAll() {
    if (!this.model) return;
    this.expanded.clear();
    this._layout(true);
  }

  /** Open (`open` true) or close a scope by its path. */
  toggle(path, open = !this.expanded.has(path)) {
    if (!this.model?.scopes.has(path)) return;
    if (open) this.expanded.add(path);
    else for (const p of [...this.expanded]) if (p === path || p.startsWith(`${path}/`)) this.expanded.delete(p);
    const anchor = this.layout?.boxes.get(`s:${path}`);
    this._layout(false);
    // Keep the place clicked under the pointer's area: centre on the scope's first node.
    if (anchor) this._centre(itemOf(this.model, this.expanded, this.model.scopes.get(path).first), anchor);
    this.ctx.scheduler.mark(this.item);
  }

  _centre(id, previous = null) {
    const b = this.layout.boxes.get(id);
    if (!b) return;
    const { width, height } = this._size();
    const { scale } = this.view;
    if (previous) {
      const sx = previous.x * scale + this.view.tx;
      const sy = previous.y * scale + this.view.ty;
      this.view.tx = sx - b.x * scale;
      this.view.ty = sy - b.y * scale;
    } else {
      this.view.tx = width / 2 - b.x * scale;
      this.view.ty = height / 2 - b.y * scale;
    }
  }

  _onSearch(reset = true) {
    if (!this.model) return;
    this.tip.hidden = true;
    this.matches = searchNodes(this.model, this.search.value);
    if (reset) this.matchAt = -1;
    this.found.textContent = this.search.value.trim() ? tf("graphFound", { at: this.matchAt + 1, count: this.matches.length }) : "";
    this.ctx.scheduler.mark(this.item);
  }

  /** Jump to the next (or previous) search match: open its scopes and centre it. */
  jump(delta = 1) {
    if (!this.matches.length) return;
    this.matchAt = (this.matchAt + delta + this.matches.length) % this.matches.length;
    const i = this.matches[this.matchAt];
    let opened = false;
    for (const path of this.model.ancestors[i]) {
      if (!this.expanded.has(path)) {
        this.expanded.add(path);
        opened = true;
      }
    }
    if (opened) this._layout(false);
    this.selected = itemOf(this.model, this.expanded, i);
    if (this.view.scale < 0.6) this.view.scale = 0.8;
    this._centre(this.selected);
    this._onSearch(false);
  }

  // ---- drawing ----------------------------------------------------------------------------------

  draw() {
    if (!this.layout || this.panel.hidden) return;
    const t0 = performance.now();
    const { width, height } = this._size();
    const dpr = window.devicePixelRatio || 1;
    if (this.canvas.width !== Math.round(width * dpr) || this.canvas.height !== Math.round(height * dpr)) {
      this.canvas.width = Math.round(width * dpr);
      this.canvas.height = Math.round(height * dpr);
      this.canvas.style.width = `${width}px`;
      this.canvas.style.height = `${height}px`;
    }
    const c = this.canvas.getContext("2d");
    const css = getComputedStyle(this.element);
    const fg = css.getPropertyValue("--fg").trim() || "#1c1e21";
    const muted = css.getPropertyValue("--muted").trim() || "#5f6670";
    const panel = css.getPropertyValue("--panel").trim() || "#fff";
    const accent = css.getPropertyValue("--accent").trim() || "#1f6feb";
    c.setTransform(dpr, 0, 0, dpr, 0, 0);
    c.clearRect(0, 0, width, height);
    const { scale, tx, ty } = this.view;
    c.setTransform(dpr * scale, 0, 0, dpr * scale, dpr * tx, dpr * ty);
    // What is on screen, in layout coordinates (boxes outside are skipped).
    const x0 = -tx / scale - 300;
    const x1 = (width - tx) / scale + 300;
    const y0 = -ty / scale - 100;
    const y1 = (height - ty) / scale + 100;
    this._drawScopes(c, muted, fg);
    // edges
    c.lineWidth = 1.2 / Math.max(scale, 0.5);
    c.strokeStyle = muted;
    c.fillStyle = muted;
    c.font = SMALL;
    c.textAlign = "left";
    const labelled = new Set(); // one shape label per source: its edges fan out with one tensor
    for (const r of this.layout.routes) {
      const p = r.points;
      const top = p[0].y;
      const bottom = p[p.length - 1].y;
      if (bottom < y0 || top > y1) continue;
      c.beginPath();
      c.moveTo(p[0].x, p[0].y);
      for (let k = 1; k < p.length; k++) {
        const a = p[k - 1];
        const b = p[k];
        const dy = (b.y - a.y) / 2;
        c.bezierCurveTo(a.x, a.y + dy, b.x, b.y - dy, b.x, b.y);
      }
      c.stroke();
      const head = r.reversed ? p[0] : p[p.length - 1];
      const dir = r.reversed ? -1 : 1;
      c.beginPath();
      c.moveTo(head.x, head.y);
      c.lineTo(head.x - 4, head.y - 7 * dir);
      c.lineTo(head.x + 4, head.y - 7 * dir);
      c.fill();
      if (scale >= 0.7 && r.edge.tensor?.shape && !labelled.has(r.edge.from)) {
        labelled.add(r.edge.from);
        const a = p[0];
        const b = p[1];
        c.fillText(formatTensor({ shape: r.edge.tensor.shape }), (a.x + b.x) / 2 + 5, (a.y + b.y) / 2 + 4);
      }
    }
    // boxes
    const hits = new Set(this.matches.map((i) => itemOf(this.model, this.expanded, i)));
    c.textAlign = "center";
    c.textBaseline = "middle";
    for (const it of this.vis.items) {
      const b = this.layout.boxes.get(it.id);
      if (b.x + b.w / 2 < x0 || b.x - b.w / 2 > x1 || b.y + b.h / 2 < y0 || b.y - b.h / 2 > y1) continue;
      const left = b.x - b.w / 2;
      const topY = b.y - b.h / 2;
      const op = it.scope ? null : String(this.model.nodes[it.index].op);
      c.beginPath();
      c.roundRect(left, topY, b.w, b.h, it.scope ? 8 : 4);
      c.fillStyle = panel;
      c.fill();
      c.lineWidth = hits.has(it.id) || this.selected === it.id ? 3 : 1.2;
      c.strokeStyle = this.selected === it.id ? accent : hits.has(it.id) ? "#e8a317" : it.scope ? muted : opColor(op);
      if (it.scope) c.setLineDash([5, 3]);
      c.stroke();
      c.setLineDash([]);
      if (!it.scope) {
        c.fillStyle = opColor(op);
        c.fillRect(left, topY + 3, 4, b.h - 6);
      }
      if (scale < 0.25) continue; // text too small to read: boxes only
      const { lines } = this.labels.get(it.id);
      c.fillStyle = fg;
      c.font = FONT;
      c.fillText(lines[0], b.x, b.y - 7, b.w - 8);
      c.fillStyle = muted;
      c.font = SMALL;
      c.fillText(lines[1], b.x, b.y + 9, b.w - 8);
    }
    c.textBaseline = "alphabetic";
    this.stats.draws++;
    this.stats.lastDrawMs = performance.now() - t0;
    if (this.stats.firstDrawAt === null) this.stats.firstDrawAt = performance.now();
  }

  /** Open scopes: a frame around their shown boxes, labelled with the scope's name (click closes). */
  _drawScopes(c, muted, fg) {
    this.frames = [];
    const bounds = new Map();
    for (const it of this.vis.items) {
      const b = this.layout.boxes.get(it.id);
      const paths = it.scope ? this.model.ancestors[it.scope.first].slice(0, it.scope.depth - 1) : this.model.ancestors[it.index];
      for (const path of paths) {
        if (!this.expanded.has(path)) break;
        const f = bounds.get(path) ?? { x0: Infinity, y0: Infinity, x1: -Infinity, y1: -Infinity };
        f.x0 = Math.min(f.x0, b.x - b.w / 2);
        f.x1 = Math.max(f.x1, b.x + b.w / 2);
        f.y0 = Math.min(f.y0, b.y - b.h / 2);
        f.y1 = Math.max(f.y1, b.y + b.h / 2);
        bounds.set(path, f);
      }
    }
    // Innermost first: each frame, padded and with room for its label, widens its parent's, so
    // nested labels never sit on each other.
    const sorted = [...bounds.keys()].sort((a, b) => this.model.scopes.get(b).depth - this.model.scopes.get(a).depth);
    const PAD = 5;
    const LABEL = 13;
    const rects = new Map();
    for (const path of sorted) {
      const f = bounds.get(path);
      const frame = { path, x: f.x0 - PAD, y: f.y0 - PAD - LABEL, w: f.x1 - f.x0 + 2 * PAD, h: f.y1 - f.y0 + 2 * PAD + LABEL };
      rects.set(path, frame);
      const parent = path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : null;
      const pf = parent !== null ? bounds.get(parent) : undefined;
      if (pf) {
        pf.x0 = Math.min(pf.x0, frame.x);
        pf.y0 = Math.min(pf.y0, frame.y);
        pf.x1 = Math.max(pf.x1, frame.x + frame.w);
        pf.y1 = Math.max(pf.y1, frame.y + frame.h);
      }
    }
    c.font = SMALL;
    c.textAlign = "left";
    c.textBaseline = "alphabetic";
    for (const path of sorted.reverse()) {
      const depth = this.model.scopes.get(path).depth;
      const frame = rects.get(path);
      this.frames.push(frame);
      c.fillStyle = depth % 2 ? "rgba(127,127,127,0.06)" : "rgba(127,127,127,0.10)";
      c.strokeStyle = muted;
      c.lineWidth = 0.6;
      c.beginPath();
      c.roundRect(frame.x, frame.y, frame.w, frame.h, 8);
      c.fill();
      c.stroke();
      c.fillStyle = fg;
      c.fillText(`⊟ ${this.model.scopes.get(path).name}`, frame.x + 6, frame.y + 11);
    }
  }

  // ---- interaction ------------------------------------------------------------------------------

  /** The item or open-scope label under a point of the canvas (CSS pixels), or null. */
  hitTest(px, py) {
    if (!this.layout) return null;
    const x = (px - this.view.tx) / this.view.scale;
    const y = (py - this.view.ty) / this.view.scale;
    for (const it of this.vis.items) {
      const b = this.layout.boxes.get(it.id);
      if (Math.abs(x - b.x) <= b.w / 2 && Math.abs(y - b.y) <= b.h / 2) return { item: it };
    }
    // The label strip of an open scope, innermost first.
    for (const f of [...(this.frames ?? [])].reverse()) {
      if (x >= f.x && x <= f.x + f.w && y >= f.y && y <= f.y + 16) return { frame: f };
    }
    return null;
  }

  _wire() {
    const cv = this.canvas;
    let drag = null;
    cv.addEventListener("pointerdown", (e) => {
      drag = { x: e.clientX, y: e.clientY, tx: this.view.tx, ty: this.view.ty, moved: false };
      cv.setPointerCapture(e.pointerId);
    });
    cv.addEventListener("pointermove", (e) => {
      if (drag) {
        const dx = e.clientX - drag.x;
        const dy = e.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        if (drag.moved) {
          this.view.tx = drag.tx + dx;
          this.view.ty = drag.ty + dy;
          this.tip.hidden = true;
          this._redraw();
          return;
        }
      }
      this._hover(e);
    });
    cv.addEventListener("pointerup", (e) => {
      const d = drag;
      drag = null;
      if (!d || d.moved) return;
      const r = cv.getBoundingClientRect();
      const hit = this.hitTest(e.clientX - r.left, e.clientY - r.top);
      if (hit?.item?.scope) this.toggle(hit.item.scope.path, true);
      else if (hit?.frame) this.toggle(hit.frame.path, false);
      else if (hit?.item) {
        this.selected = hit.item.id;
        this._redraw();
      }
    });
    cv.addEventListener("pointerleave", () => (this.tip.hidden = true));
    cv.addEventListener(
      "wheel",
      (e) => {
        e.preventDefault();
        const r = cv.getBoundingClientRect();
        const px = e.clientX - r.left;
        const py = e.clientY - r.top;
        const scale = Math.min(MAX_SCALE, Math.max(MIN_SCALE, this.view.scale * Math.exp(-e.deltaY * 0.0015)));
        this.view.tx = px - ((px - this.view.tx) * scale) / this.view.scale;
        this.view.ty = py - ((py - this.view.ty) * scale) / this.view.scale;
        this.view.scale = scale;
        this._redraw();
      },
      { passive: false },
    );
  }

  // Pan and zoom draw at once (one frame), not through the 100 ms chart schedule.
  _redraw() {
    if (this._frame) return;
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      this.draw();
    });
  }

  _hover(e) {
    const r = this.canvas.getBoundingClientRect();
    const hit = this.hitTest(e.clientX - r.left, e.clientY - r.top);
    if (!hit?.item) {
      this.tip.hidden = true;
      this.canvas.style.cursor = hit?.frame ? "pointer" : "grab";
      return;
    }
    this.canvas.style.cursor = hit.item.scope ? "pointer" : "default";
    this.tip.replaceChildren(...this._describe(hit.item));
    this.tip.hidden = false;
    const w = this.tip.offsetWidth;
    const left = e.clientX + 14 + w > window.innerWidth ? e.clientX - 14 - w : e.clientX + 14;
    this.tip.style.left = `${Math.max(0, left)}px`;
    this.tip.style.top = `${Math.min(e.clientY + 14, window.innerHeight - this.tip.offsetHeight - 4)}px`;
  }

  /** The tooltip's rows for an item. */
  _describe(it) {
    const row = (k, v) => el("tr", {}, el("th", { text: k }), el("td", { class: "tt-name", text: v }));
    if (it.scope) {
      const s = it.scope;
      const ops = [...s.ops.entries()].sort((a, b) => b[1] - a[1]).slice(0, 6).map(([op, n]) => `${op} ×${n}`).join(", ");
      return [el("table", {}, row(t("graphScope"), s.path), row(t("graphOps"), `${s.count}: ${ops}`), row(t("graphParams"), s.params.toLocaleString()), row("", t("graphClickOpen")))];
    }
    const n = this.model.nodes[it.index];
    const rows = [row(t("graphOp"), String(n.op)), row(t("graphName"), String(n.name))];
    if (n.scope) rows.push(row(t("graphScope"), String(n.scope)));
    (n.inputs ?? []).slice(0, 6).forEach((x, k) => rows.push(row(k ? "" : t("graphInputs"), formatTensor(x))));
    (n.outputs ?? []).slice(0, 6).forEach((x, k) => rows.push(row(k ? "" : t("graphOutputs"), formatTensor(x))));
    if (n.params) rows.push(row(t("graphParams"), Number(n.params).toLocaleString()));
    for (const [k, v] of Object.entries(n.attrs ?? {}).slice(0, 6)) rows.push(row(k, String(v)));
    return [el("table", {}, ...rows)];
  }

  /** Test and debugging hook (`vdl.graph`). */
  hook() {
    return {
      /** Keys (`run\u0000tag`) of the graphs held. */
      keys: () => [...this.graphs.keys()],
      show: (key) => this.show(key),
      /** The boxes shown: id, label lines, and centre/size in canvas CSS pixels. */
      boxes: () =>
        (this.vis?.items ?? []).map((it) => {
          const b = this.layout.boxes.get(it.id);
          const { scale, tx, ty } = this.view;
          return { id: it.id, scope: it.scope?.path ?? null, lines: this.labels.get(it.id).lines, x: b.x * scale + tx, y: b.y * scale + ty, w: b.w * scale, h: b.h * scale };
        }),
      edges: () => this.vis?.edges.length ?? 0,
      expanded: () => [...this.expanded].sort(),
      matches: () => this.matches.slice(),
      selected: () => this.selected,
      toggle: (path, open) => this.toggle(path, open),
      expandAll: () => this.expandAll(),
      collapseAll: () => this.collapseAll(),
      draw: () => this.draw(),
      scale: () => this.view.scale,
      stats: this.stats,
    };
  }
}
