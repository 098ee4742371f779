// The embeddings view (issue 15): one projector panel. Pick a run · tag · step; the matrix and its
// labels are fetched from /api/blob when the panel is on screen, projected in a Web Worker
// (static/embed-worker.js: PCA at once, then a UMAP-style layout whose positions stream in so the
// scatter animates), and drawn on a canvas with pan and zoom, colour by a metadata column, labels
// and thumbnails on hover, and search by label. The main thread only draws and hit-tests.
import { el, PALETTE } from "../dom.js";
import { t, tf } from "../i18n.js";

/** Categories coloured individually; the rest share the "other" grey. */
const MAX_CATEGORIES = PALETTE.length;
const OTHER = "#9aa0a6";
const DIM = "rgba(140, 146, 154, 0.25)";
/** Point half-size and hover radius, in CSS pixels. */
const POINT = 2;
const HOVER_PX = 8;
const HEIGHT = 520;
/** Largest side of the hover thumbnail, in CSS pixels. */
const THUMB_PX = 96;

const packed = new Map();
/**
 * A CSS colour (`#rrggbb`, `rgb(r, g, b)` or `rgba(r, g, b, a)`) as one little-endian RGBA pixel
 * of an ImageData's Uint32Array view.
 */
export function rgba32(css) {
  let v = packed.get(css);
  if (v !== undefined) return v;
  let r = 0;
  let g = 0;
  let b = 0;
  let a = 255;
  const hex = /^#([0-9a-f]{6})$/i.exec(css);
  const fn = /^rgba?\(\s*(\d+),\s*(\d+),\s*(\d+)(?:,\s*([\d.]+))?\s*\)$/i.exec(css);
  if (hex) {
    const x = parseInt(hex[1], 16);
    [r, g, b] = [(x >> 16) & 255, (x >> 8) & 255, x & 255];
  } else if (fn) {
    [r, g, b] = [Number(fn[1]), Number(fn[2]), Number(fn[3])];
    if (fn[4] !== undefined) a = Math.round(Number(fn[4]) * 255);
  }
  v = ((a << 24) | (b << 16) | (g << 8) | r) >>> 0;
  packed.set(css, v);
  return v;
}

/** Parse the `part=matrix` body: N*D little-endian float32s. */
export function matrixFromBytes(buffer, n, d) {
  if (buffer.byteLength !== 4 * n * d) throw new Error(`expected ${4 * n * d} bytes, got ${buffer.byteLength}`);
  // Float32Array reads the platform's byte order; every browser platform is little-endian.
  return new Float32Array(buffer);
}

/**
 * Colours for one metadata column: the MAX_CATEGORIES most frequent values coloured, in label
 * order (the rest "other"), or, for a column of more distinct numbers than that, a gradient.
 * @returns {{index: Uint16Array, colors: string[], legend: {label: string, color: string}[]}}
 */
export function colorColumn(values) {
  const n = values.length;
  const counts = new Map();
  for (const v of values) counts.set(v, (counts.get(v) ?? 0) + 1);
  const index = new Uint16Array(n);
  const numeric = counts.size > MAX_CATEGORIES && [...counts.keys()].every((v) => v.trim() !== "" && Number.isFinite(Number(v)));
  if (numeric) {
    const nums = values.map(Number);
    let lo = Infinity;
    let hi = -Infinity;
    for (const x of nums) {
      lo = Math.min(lo, x);
      hi = Math.max(hi, x);
    }
    const steps = 32;
    const colors = Array.from({ length: steps }, (_, i) => gradient(i / (steps - 1)));
    for (let i = 0; i < n; i++) index[i] = hi > lo ? Math.round(((nums[i] - lo) / (hi - lo)) * (steps - 1)) : 0;
    return { index, colors, legend: [{ label: String(lo), color: colors[0] }, { label: String(hi), color: colors[steps - 1] }] };
  }
  const byLabel = (a, b) => a.localeCompare(b, undefined, { numeric: true });
  const ranked = [...counts.entries()].sort((a, b) => b[1] - a[1] || byLabel(a[0], b[0]));
  // The most frequent values get colours, in label order (class2 before class10).
  const kept = ranked.slice(0, MAX_CATEGORIES).map(([v]) => v).sort(byLabel);
  const slot = new Map(kept.map((v, i) => [v, i]));
  const colors = [...PALETTE.slice(0, kept.length), OTHER];
  const other = colors.length - 1;
  for (let i = 0; i < n; i++) index[i] = slot.get(values[i]) ?? other;
  const legend = kept.map((v, i) => ({ label: v, color: colors[i] }));
  if (ranked.length > MAX_CATEGORIES) legend.push({ label: null, color: OTHER });
  return { index, colors, legend };
}

// Blue to yellow through green (viridis-like), t in [0, 1].
function gradient(x) {
  const stops = [
    [68, 1, 84],
    [59, 82, 139],
    [33, 145, 140],
    [94, 201, 98],
    [253, 231, 37],
  ];
  const f = Math.min(Math.max(x, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(f), stops.length - 2);
  const u = f - i;
  const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * u));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

/** The points whose label in any column contains `query` (case-insensitive), as 0/1 bytes. */
export function searchLabels(columns, n, query) {
  const q = query.trim().toLowerCase();
  if (!q) return null;
  const hit = new Uint8Array(n);
  for (const column of columns) for (let i = 0; i < n; i++) if (!hit[i] && column[i].toLowerCase().includes(q)) hit[i] = 1;
  return hit;
}

export class EmbeddingsView {
  /**
   * @param {object} ctx shared page context: `store`, `token`, `shown`
   * @param {object} [opts] `workerUrl`, `fetchImpl` (tests)
   */
  constructor(ctx, { workerUrl = "/static/embed-worker.js", fetchImpl = (...args) => fetch(...args) } = {}) {
    this.ctx = ctx;
    this.workerUrl = workerUrl;
    this._fetch = fetchImpl;
    this.worker = null;
    this.job = 0;
    /** @type {Map<string, {run: string, tag: string}>} */
    this.sources = new Map();
    this.selected = null; // {run, tag, step, follow}
    this.data = null; // the loaded embedding, see _load
    this.method = "pca";
    this.colorBy = -1;
    this.coloring = null;
    this.matches = null;
    this.hover = -1;
    this.view = { cx: 0, cy: 0, scale: 1, auto: true };
    this.phase = "idle";
    this.progress = { epoch: 0, epochs: 0, done: false, ms: 0 };
    this.timings = {};
    this.visible = typeof IntersectionObserver === "undefined";
    /** Main-thread cost of drawing and hit-testing, for the benchmark (milliseconds). */
    this.costs = { draws: 0, drawMs: 0, drawMaxMs: 0, hovers: 0, hoverMs: 0, hoverMaxMs: 0 };
    this._frame = 0;
    this._drag = null;
    this._mouse = null;

    this.empty = el("p", { class: "empty", text: t("noEmbeddings") });
    this.sourceSelect = el("select", { class: "embed-source", on: { change: () => this._pick(this.sourceSelect.value) } });
    this.methodSelect = el("select", { class: "embed-method", on: { change: () => this.setMethod(this.methodSelect.value) } });
    this.colorSelect = el("select", { class: "embed-color", on: { change: () => this._setColor(Number(this.colorSelect.value)) } });
    this.searchInput = el("input", { type: "search", class: "embed-search", spellcheck: "false", on: { input: () => this._search() } });
    this.status = el("span", { class: "embed-status", role: "status" });
    this.labels = {};
    const label = (key, control) => el("label", { class: "embed-field" }, (this.labels[key] = el("span", { text: t(key) })), control);
    this.canvas = el("canvas", { class: "embed-canvas", tabindex: "0" });
    this.tip = el("div", { class: "embed-tip", hidden: true });
    this.legend = el("div", { class: "embed-legend" });
    this.hint = el("span", { class: "embed-hint", text: t("embedHint") });
    // Not shown: the title "Export report" writes above the scatter.
    this.title = el("span", { class: "chart-title", hidden: true });
    this.panel = el(
      "section",
      { class: "chart embed-panel", hidden: true },
      el("div", { class: "embed-controls" }, label("embedSource", this.sourceSelect), label("embedMethod", this.methodSelect), label("embedColor", this.colorSelect), label("embedSearch", this.searchInput)),
      el("div", { class: "embed-info" }, this.title, this.status, this.hint),
      el("div", { class: "embed-stage" }, this.canvas, this.tip),
      this.legend,
    );
    this.element = el("div", { class: "view embeddings none" }, this.empty, this.panel);
    this._relabelMethods();
    this._wireCanvas();

    ctx.store.subscribe((change) => {
      if (change.kind !== "embedding") return;
      this._sources(change.run);
    }, { current: true });
    if (!this.visible) {
      new IntersectionObserver((entries) => {
        this.visible = entries.some((e) => e.isIntersecting);
        if (this.visible) this._maybeLoad();
      }).observe(this.element);
    }
    // The canvas width comes from the observer, so a frame never reads layout (a forced reflow of
    // the whole page after the status line changed would cost more than drawing 10,000 points).
    this._width = 0;
    if (typeof ResizeObserver !== "undefined") {
      new ResizeObserver((entries) => {
        this._width = entries[entries.length - 1].contentRect.width;
        this._schedule();
      }).observe(this.canvas);
    }
  }

  /** Apply the run toggles and the tag filter (they pick what the source list offers). */
  refresh() {
    this._fillSources();
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noEmbeddings");
    for (const [key, node] of Object.entries(this.labels)) node.textContent = t(key);
    this.hint.textContent = t("embedHint");
    this._relabelMethods();
    this._fillColors();
    this._fillSources();
    this._showStatus();
    this._renderLegend();
  }

  /** Switch the projection: `pca` or `umap`. */
  setMethod(method) {
    if (method !== "pca" && method !== "umap") return;
    this.method = method;
    this.methodSelect.value = method;
    this.view.auto = true;
    if (!this.data) return;
    if (method === "umap" && !this.data.umapDone) {
      this.data.umap = null;
      this.timings.umapStart = performance.now();
      this.timings.firstPositions = undefined;
      this._post({ type: "umap", job: this.job });
    } else if (method === "pca" && !this.data.umapDone) {
      this._post({ type: "stop", job: this.job });
      this.phase = this.data.pca ? "pca" : this.phase;
    }
    this._showStatus();
    this._schedule();
  }

  /** For tests and the benchmark (`window.vdl.embeddings`). */
  hook() {
    return {
      state: () => ({
        run: this.selected?.run ?? null,
        tag: this.selected?.tag ?? null,
        step: this.selected?.step ?? null,
        n: this.data?.n ?? 0,
        d: this.data?.d ?? 0,
        method: this.method,
        phase: this.phase,
        shown: this._coords() !== null,
        ...this.progress,
        timings: { ...this.timings },
        matches: this.matches ? this.matches.reduce((a, b) => a + b, 0) : null,
        hover: this.hover,
        tip: this.tip.hidden ? null : this.tip.textContent,
        costs: { ...this.costs },
      }),
      resetCosts: () => {
        for (const key of Object.keys(this.costs)) this.costs[key] = 0;
      },
      /** Where point `i` is on the page (CSS pixels), or null when it is not drawn. */
      pointOnPage: (i) => {
        const coords = this._coords();
        if (!coords) return null;
        const r = this.canvas.getBoundingClientRect();
        const [x, y] = this._toScreen(coords[2 * i], coords[2 * i + 1]);
        return { x: r.left + x, y: r.top + y };
      },
      labelOf: (i) => this.data?.columns.map((c) => c[i]) ?? [],
      setMethod: (m) => this.setMethod(m),
      search: (q) => {
        this.searchInput.value = q;
        this._search();
      },
    };
  }

  // ---- sources ---------------------------------------------------------------------------------

  _sources(run) {
    const entry = this.ctx.store.runs.get(run);
    if (entry) for (const tag of entry.embeddings.keys()) this.sources.set(`${run}\u0000${tag}`, { run, tag });
    this._fillSources();
  }

  _list(run, tag) {
    return this.ctx.store.runs.get(run)?.embeddings.get(tag) ?? [];
  }

  // Options: one per (run, tag, step), newest step first within a (run, tag).
  _fillSources() {
    const options = [];
    for (const [key, { run, tag }] of [...this.sources].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
      if (!this.ctx.shown(run, tag)) continue;
      const list = this._list(run, tag);
      for (let i = list.length - 1; i >= 0; i--) {
        const ev = list[i];
        const text = `${run} · ${tag} · ${t("step")} ${ev.step} (${ev.shape?.[0] ?? "?"} × ${ev.shape?.[1] ?? "?"})`;
        options.push(el("option", { value: `${key}\u0000${ev.step}`, text }));
      }
    }
    this.empty.hidden = options.length > 0;
    this.panel.hidden = options.length === 0;
    // Like the alerts panel, the view takes no room until some run has an embedding: a page
    // without any keeps the layout it had before the view existed.
    const any = [...this.sources.values()].some(({ run, tag }) => this._list(run, tag).length > 0);
    this.element.classList.toggle("none", !any);
    this.sourceSelect.replaceChildren(...options);
    if (!options.length) return;
    // Follow the newest step of the chosen (run, tag) until another step is picked.
    let sel = this.selected;
    const offered = (x) => options.some((o) => o.value.startsWith(`${x.run}\u0000${x.tag}\u0000`));
    if (!sel || !offered(sel)) {
      const first = options[0].value.split("\u0000");
      sel = { run: first[0], tag: first[1], step: Number(first[2]), follow: true };
    } else if (sel.follow) {
      const list = this._list(sel.run, sel.tag);
      if (list.length) sel = { ...sel, step: list[list.length - 1].step };
    }
    this.selected = sel;
    this.sourceSelect.value = `${sel.run}\u0000${sel.tag}\u0000${sel.step}`;
    this._maybeLoad();
  }

  _pick(value) {
    const [run, tag, step] = value.split("\u0000");
    const list = this._list(run, tag);
    const newest = list.length ? list[list.length - 1].step : Number(step);
    this.selected = { run, tag, step: Number(step), follow: Number(step) === newest };
    this._maybeLoad();
  }

  _event(sel) {
    return this._list(sel.run, sel.tag).find((ev) => ev.step === sel.step) ?? null;
  }

  // ---- loading and the worker -----------------------------------------------------------------

  _maybeLoad() {
    const sel = this.selected;
    if (!sel || !this.visible) return;
    const ev = this._event(sel);
    if (!ev) return;
    // An event logged again at the same step replaces it: its wall time tells them apart.
    const key = `${sel.run}\u0000${sel.tag}\u0000${sel.step}\u0000${ev.wall}`;
    if (this.data?.key === key || this._loading === key) return;
    this._loading = key;
    this._load(key, sel, ev).catch((err) => {
      if (this._loading !== key) return;
      this._loading = null;
      this.phase = "error";
      this.error = String(err?.message ?? err);
      this._showStatus();
    });
  }

  async _load(key, sel, ev) {
    const [n, d] = ev.shape;
    this.phase = "loading";
    this.timings = { event: performance.now() };
    this._showStatus(n, d);
    const query = `run=${encodeURIComponent(sel.run)}&kind=embedding&tag=${encodeURIComponent(sel.tag)}&step=${sel.step}`;
    const headers = this.ctx.token ? { Authorization: `Bearer ${this.ctx.token}` } : {};
    const get = async (part) => {
      const response = await this._fetch(`/api/blob?${query}&part=${part}`, { headers, cache: "no-store" });
      if (!response.ok) throw new Error(`${part}: HTTP ${response.status}`);
      return response;
    };
    const [matrixResponse, metaResponse] = await Promise.all([get("matrix"), get("metadata")]);
    const [buffer, meta] = await Promise.all([matrixResponse.arrayBuffer(), metaResponse.json()]);
    if (this._loading !== key) return;
    const matrix = matrixFromBytes(buffer, n, d);
    this.timings.arrived = performance.now();
    this.job++;
    this.data = {
      key,
      n,
      d,
      header: meta.header ?? [],
      columns: meta.columns ?? [],
      thumb: meta.thumbnail ?? null,
      sprite: null,
      pca: null,
      umap: null,
      umapDone: false,
      explained: [0, 0],
    };
    this._loading = null;
    this.matches = searchLabels(this.data.columns, n, this.searchInput.value);
    this.hover = -1;
    this.tip.hidden = true;
    this.view.auto = true;
    this.phase = "pca";
    this.progress = { epoch: 0, epochs: 0, done: false, ms: 0 };
    this._fillColors(true);
    this._ensureWorker();
    this._post({ type: "load", job: this.job, data: matrix, n, d }, [matrix.buffer]);
    if (this.method === "umap") {
      this.timings.umapStart = performance.now();
      this._post({ type: "umap", job: this.job });
    }
    if (ev.sprite_bytes > 0 && this.data.thumb) {
      const data = this.data;
      get("sprite")
        .then((r) => r.blob())
        .then((blob) => createImageBitmap(blob))
        .then((bitmap) => {
          if (this.data === data) data.sprite = bitmap;
          else bitmap.close();
        })
        .catch(() => {}); // thumbnails are optional: labels still show
    }
  }

  _ensureWorker() {
    if (this.worker) return;
    this.worker = new Worker(this.workerUrl);
    this.worker.onmessage = (e) => this._onWorker(e.data);
    this.worker.onerror = (e) => {
      this.phase = "error";
      this.error = e.message || "worker failed";
      this._showStatus();
    };
  }

  _post(msg, transfer = []) {
    this.worker?.postMessage(msg, transfer);
  }

  _onWorker(msg) {
    if (msg.job !== this.job || !this.data) return;
    const data = this.data;
    if (msg.type === "pca") {
      data.pca = msg.coords;
      data.explained = msg.explained;
      this.timings.pcaWorkerMs = msg.ms;
      this._wantFirstDraw = true;
    } else if (msg.type === "phase") {
      this.phase = msg.phase;
    } else if (msg.type === "positions") {
      data.umap = msg.coords;
      data.umapDone = msg.done;
      this.timings.firstPositions ??= performance.now();
      this.progress = { epoch: msg.epoch, epochs: msg.epochs, done: msg.done, ms: msg.ms };
      this.phase = msg.done ? "umap" : "layout";
      if (msg.done && this.timings.umapStart) this.timings.umapMs = performance.now() - this.timings.umapStart;
    } else if (msg.type === "error") {
      this.phase = "error";
      this.error = msg.message;
    }
    // The status line is rewritten with the next frame, not per message.
    this._statusDirty = true;
    this._schedule();
  }

  _coords() {
    if (!this.data) return null;
    if (this.method === "umap" && this.data.umap) return this.data.umap;
    return this.data.pca;
  }

  // ---- status, colours, search ----------------------------------------------------------------

  _relabelMethods() {
    this.methodSelect.replaceChildren(el("option", { value: "pca", text: t("methodPca") }), el("option", { value: "umap", text: t("methodUmap") }));
    this.methodSelect.value = this.method;
  }

  _showStatus(n = this.data?.n, d = this.data?.d) {
    const sel = this.selected;
    const method = this.method === "umap" ? "UMAP" : "PCA";
    this.title.setAttribute("title", sel ? `${sel.run} · ${sel.tag} · ${t("step")} ${sel.step} · ${method}` : "");
    const pct = (x) => (100 * x).toFixed(1);
    let text = "";
    if (this.phase === "loading") text = tf("embedLoading", { n, d });
    else if (this.phase === "error") text = tf("embedError", { message: this.error ?? "" });
    else if (this.method === "umap" && this.phase === "graph") text = t("embedGraph");
    else if (this.method === "umap" && this.phase === "layout") text = tf("embedLayout", this.progress);
    else if (this.method === "umap" && this.data?.umapDone) text = tf("embedDone", { n, s: ((this.timings.umapMs ?? this.progress.ms) / 1000).toFixed(1) });
    else if (this.data?.pca) text = tf("embedPca", { n, d, x: pct(this.data.explained[0]), y: pct(this.data.explained[1]) });
    if (this.matches) text += ` · ${tf("embedMatches", { n: this.matches.reduce((a, b) => a + b, 0) })}`;
    this.status.textContent = text;
  }

  _fillColors(reset = false) {
    const header = this.data?.header ?? [];
    if (reset) {
      // The first column whose values repeat (a class, not an id) colours the points at first.
      this.colorBy = header.findIndex((_, c) => new Set(this.data.columns[c]).size <= Math.max(MAX_CATEGORIES * 3, 1) && new Set(this.data.columns[c]).size < this.data.n);
    }
    this.colorSelect.replaceChildren(el("option", { value: "-1", text: t("embedNoColor") }), ...header.map((h, c) => el("option", { value: String(c), text: h })));
    this.colorSelect.value = String(this.colorBy);
    if (reset) this._setColor(this.colorBy);
  }

  _setColor(column) {
    this.colorBy = column;
    const values = this.data?.columns[column];
    this.coloring = values ? colorColumn(values) : null;
    if (this.coloring) {
      // Points grouped by colour, so a frame sets each fill style once.
      const { index, colors } = this.coloring;
      const counts = new Int32Array(colors.length + 1);
      for (let i = 0; i < index.length; i++) counts[index[i] + 1]++;
      for (let c = 0; c < colors.length; c++) counts[c + 1] += counts[c];
      const order = new Int32Array(index.length);
      const at = counts.slice();
      for (let i = 0; i < index.length; i++) order[at[index[i]]++] = i;
      this.coloring.order = order;
      this.coloring.starts = counts;
    }
    this._renderLegend();
    this._schedule();
  }

  _renderLegend() {
    const legend = this.coloring?.legend ?? [];
    this.legend.replaceChildren(
      ...legend.map(({ label, color }) => el("span", { class: "embed-key" }, el("i", { class: "swatch", style: { background: color } }), label === null ? t("embedOther") : label || "∅")),
    );
  }

  _search() {
    this.matches = this.data ? searchLabels(this.data.columns, this.data.n, this.searchInput.value) : null;
    this._showStatus();
    this._schedule();
  }

  // ---- drawing ---------------------------------------------------------------------------------

  _schedule() {
    if (this._frame || typeof requestAnimationFrame === "undefined") return;
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      this._draw();
    });
  }

  _size() {
    const dpr = globalThis.devicePixelRatio || 1;
    const w = Math.max(1, this._width || this.canvas.clientWidth);
    const h = HEIGHT;
    if (this.canvas.width !== Math.round(w * dpr) || this.canvas.height !== Math.round(h * dpr)) {
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(h * dpr);
    }
    return { w, h, dpr };
  }

  _fit(coords, w, h) {
    let x0 = Infinity;
    let x1 = -Infinity;
    let y0 = Infinity;
    let y1 = -Infinity;
    for (let i = 0; i < coords.length; i += 2) {
      const x = coords[i];
      const y = coords[i + 1];
      if (x < x0) x0 = x;
      if (x > x1) x1 = x;
      if (y < y0) y0 = y;
      if (y > y1) y1 = y;
    }
    const sx = x1 > x0 ? (w * 0.9) / (x1 - x0) : 1;
    const sy = y1 > y0 ? (h * 0.9) / (y1 - y0) : 1;
    this.view.cx = (x0 + x1) / 2 || 0;
    this.view.cy = (y0 + y1) / 2 || 0;
    this.view.scale = Math.min(sx, sy);
  }

  _toScreen(x, y) {
    const { w, h } = this._lastSize ?? { w: this.canvas.clientWidth, h: HEIGHT };
    return [w / 2 + (x - this.view.cx) * this.view.scale, h / 2 - (y - this.view.cy) * this.view.scale];
  }

  _draw() {
    const start = performance.now();
    if (this._mouse) {
      // At most one hit test per frame, however many pointer events came in.
      const [x, y] = this._mouse;
      this._mouse = null;
      this._hitTest(x, y);
      const ms = performance.now() - start;
      this.costs.hovers++;
      this.costs.hoverMs += ms;
      this.costs.hoverMaxMs = Math.max(this.costs.hoverMaxMs, ms);
    }
    if (this._statusDirty) {
      this._statusDirty = false;
      this._showStatus();
    }
    this._paint();
    const ms = performance.now() - start;
    this.costs.draws++;
    this.costs.drawMs += ms;
    this.costs.drawMaxMs = Math.max(this.costs.drawMaxMs, ms);
  }

  _paint() {
    const coords = this._coords();
    const { w, h, dpr } = this._size();
    this._lastSize = { w, h };
    const g = this.canvas.getContext("2d");
    g.setTransform(1, 0, 0, 1, 0, 0);
    g.clearRect(0, 0, this.canvas.width, this.canvas.height);
    if (!coords) return;
    if (this.view.auto) this._fit(coords, w, h);
    const { cx, cy, scale } = this.view;
    const ox = w / 2 - cx * scale;
    const oy = h / 2 + cy * scale;
    const n = coords.length / 2;
    // Points are written straight into the pixels and put once: 10,000 anti-aliased rectangles
    // through the path API cost the (software) rasterizer several times more than this.
    const W = this.canvas.width;
    const H = this.canvas.height;
    if (this._image?.width !== W || this._image?.height !== H) {
      this._image = g.createImageData(W, H);
      this._pixels = new Uint32Array(this._image.data.buffer);
    }
    const px = this._pixels;
    px.fill(0);
    const sx = scale * dpr;
    const bx = ox * dpr;
    const by = oy * dpr;
    const plot = (i, color, r) => {
      const x = Math.round(bx + coords[2 * i] * sx);
      const y = Math.round(by - coords[2 * i + 1] * sx);
      const x0 = Math.max(0, x - r);
      const x1 = Math.min(W, x + r);
      const y1 = Math.min(H, y + r);
      if (x1 <= x0) return;
      for (let yy = Math.max(0, y - r); yy < y1; yy++) {
        const row = yy * W;
        for (let k = row + x0; k < row + x1; k++) px[k] = color;
      }
    };
    const matches = this.matches;
    const r = Math.max(1, Math.round(POINT * dpr));
    if (matches) {
      const dim = rgba32(DIM);
      for (let i = 0; i < n; i++) if (!matches[i]) plot(i, dim, r);
    }
    const size = matches ? r + Math.max(1, Math.round(dpr)) : r;
    if (this.coloring) {
      const { order, starts, colors } = this.coloring;
      for (let c = 0; c < colors.length; c++) {
        const color = rgba32(colors[c]);
        for (let p = starts[c]; p < starts[c + 1]; p++) {
          const i = order[p];
          if (!matches || matches[i]) plot(i, color, size);
        }
      }
    } else {
      const color = rgba32(PALETTE[0]);
      for (let i = 0; i < n; i++) if (!matches || matches[i]) plot(i, color, size);
    }
    g.putImageData(this._image, 0, 0);
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    if (this.hover >= 0 && this.hover < n) {
      const [x, y] = [ox + coords[2 * this.hover] * scale, oy - coords[2 * this.hover + 1] * scale];
      this._ink ??= getComputedStyle(this.canvas).color || "#000";
      g.strokeStyle = this._ink;
      g.lineWidth = 2;
      g.beginPath();
      g.arc(x, y, POINT + 4, 0, 2 * Math.PI);
      g.stroke();
      this._placeTip(x, y, w);
    }
    if (this._wantFirstDraw && coords === this.data.pca) {
      this._wantFirstDraw = false;
      this.timings.pcaShown = performance.now();
    }
  }

  // ---- pan, zoom, hover -----------------------------------------------------------------------

  _wireCanvas() {
    const c = this.canvas;
    const local = (e) => {
      const r = c.getBoundingClientRect();
      return [e.clientX - r.left, e.clientY - r.top];
    };
    c.addEventListener("pointerdown", (e) => {
      c.setPointerCapture?.(e.pointerId);
      this._drag = { at: local(e), cx: this.view.cx, cy: this.view.cy, moved: false };
    });
    c.addEventListener("pointermove", (e) => {
      const [x, y] = local(e);
      if (this._drag) {
        const dx = x - this._drag.at[0];
        const dy = y - this._drag.at[1];
        if (Math.abs(dx) + Math.abs(dy) > 2) this._drag.moved = true;
        if (this._drag.moved) {
          this.view.auto = false;
          this.view.cx = this._drag.cx - dx / this.view.scale;
          this.view.cy = this._drag.cy + dy / this.view.scale;
          this._schedule();
          return;
        }
      }
      this._hoverAt(x, y);
    });
    const end = () => (this._drag = null);
    c.addEventListener("pointerup", end);
    c.addEventListener("pointercancel", end);
    c.addEventListener("pointerleave", () => {
      this._mouse = null;
      if (this.hover >= 0) {
        this.hover = -1;
        this.tip.hidden = true;
        this._schedule();
      }
    });
    c.addEventListener(
      "wheel",
      (e) => {
        if (!this._coords()) return;
        e.preventDefault();
        const [x, y] = local(e);
        const { w, h } = this._lastSize ?? this._size();
        // Zoom about the cursor: the data point under it stays under it.
        const dataX = this.view.cx + (x - w / 2) / this.view.scale;
        const dataY = this.view.cy - (y - h / 2) / this.view.scale;
        const factor = Math.exp(-e.deltaY * 0.0015);
        this.view.scale *= factor;
        this.view.cx = dataX - (x - w / 2) / this.view.scale;
        this.view.cy = dataY + (y - h / 2) / this.view.scale;
        this.view.auto = false;
        this._schedule();
      },
      { passive: false },
    );
    c.addEventListener("dblclick", () => {
      this.view.auto = true;
      this._schedule();
    });
  }

  _hoverAt(x, y) {
    this._mouse = [x, y];
    this._schedule();
  }

  _hitTest(x, y) {
    const coords = this._coords();
    if (!coords) return;
    const { w, h } = this._lastSize ?? { w: this.canvas.clientWidth, h: HEIGHT };
    const { cx, cy, scale } = this.view;
    const ox = w / 2 - cx * scale;
    const oy = h / 2 + cy * scale;
    let best = -1;
    let bestD = HOVER_PX * HOVER_PX;
    const n = coords.length / 2;
    const matches = this.matches;
    for (let i = 0; i < n; i++) {
      if (matches && !matches[i]) continue;
      const dx = ox + coords[2 * i] * scale - x;
      const dy = oy - coords[2 * i + 1] * scale - y;
      const d2 = dx * dx + dy * dy;
      if (d2 < bestD) {
        bestD = d2;
        best = i;
      }
    }
    if (best === this.hover) return;
    this.hover = best;
    if (best < 0) this.tip.hidden = true;
    else this._fillTip(best);
  }

  _fillTip(i) {
    const data = this.data;
    const lines = data.header.length
      ? data.header.map((h, c) => el("div", { class: "embed-tip-row" }, el("b", { text: `${h}: ` }), data.columns[c][i]))
      : [el("div", { class: "embed-tip-row", text: tf("embedPoint", { i }) })];
    const children = [];
    if (data.sprite && data.thumb) {
      const [th, tw] = data.thumb;
      const cols = Math.ceil(Math.sqrt(data.n));
      const k = Math.min(THUMB_PX / th, THUMB_PX / tw, 4);
      const thumb = el("canvas", { class: "embed-thumb", width: String(Math.max(1, Math.round(tw * k))), height: String(Math.max(1, Math.round(th * k))) });
      const g = thumb.getContext("2d");
      g.imageSmoothingEnabled = false;
      g.drawImage(data.sprite, (i % cols) * tw, Math.floor(i / cols) * th, tw, th, 0, 0, thumb.width, thumb.height);
      children.push(thumb);
    }
    this.tip.replaceChildren(...children, el("div", {}, ...lines));
    this.tip.hidden = false;
  }

  _placeTip(x, y, w) {
    // Right of the point, or left of it on the right half: CSS shifts it by its own width, so
    // nothing here reads layout.
    const flip = x > w / 2;
    this.tip.style.left = `${x + (flip ? -14 : 14)}px`;
    this.tip.style.top = `${Math.max(0, y - 10)}px`;
    this.tip.style.transform = flip ? "translateX(-100%)" : "";
  }
}
