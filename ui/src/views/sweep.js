// Hyperparameter sweep views under the hparams table: parallel coordinates over hparams and metrics
// (drag along an axis to brush: the runs outside the range leave the table and the charts), a
// metric-vs-hparam scatter and a heat map of a metric over two hparams. SVG built with
// createElementNS; names and values only ever become text nodes or attributes.
import { formatValue } from "../chart.js";
import { colorFor, el } from "../dom.js";
import { t } from "../i18n.js";

const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "text") node.textContent = v;
    else if (k === "on") for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    else node.setAttribute(k, String(v));
  }
  for (const c of children) if (c) node.append(c);
  return node;
}

/**
 * A scale from an axis' values to [0, 1]: numeric (logarithmic when every value is positive and
 * they span more than two decades, as learning rates do), or categorical (distinct values evenly
 * spaced, in natural order) when any value is not a number.
 * @param {any[]} values the axis' values (undefined / null left out)
 * @returns {{kind: "linear"|"log"|"category", toUnit: (v: any) => number|null, fromUnit: (u: number) => number, categories: string[], ticks: {value: any, unit: number}[]}}
 */
export function axisScale(values) {
  const present = values.filter((v) => v !== undefined && v !== null && !(typeof v === "number" && !Number.isFinite(v)));
  const numeric = present.length > 0 && present.every((v) => typeof v === "number");
  if (!numeric) {
    const categories = [...new Set(present.map(String))].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    const n = categories.length;
    const unit = (i) => (n <= 1 ? 0.5 : i / (n - 1));
    return {
      kind: "category",
      categories,
      toUnit: (v) => {
        const i = categories.indexOf(String(v));
        return v === undefined || v === null || i < 0 ? null : unit(i);
      },
      fromUnit: (u) => u,
      ticks: categories.map((c, i) => ({ value: c, unit: unit(i) })),
    };
  }
  const lo = Math.min(...present);
  const hi = Math.max(...present);
  const log = lo > 0 && hi / lo > 100;
  const f = log ? Math.log10 : (x) => x;
  const g = log ? (x) => 10 ** x : (x) => x;
  let a = f(lo);
  let b = f(hi);
  if (a === b) {
    a -= 1;
    b += 1;
  }
  const toUnit = (v) => (typeof v === "number" && Number.isFinite(v) && (!log || v > 0) ? (f(v) - a) / (b - a) : null);
  const ticks = [];
  if (log) {
    // Powers of ten inside the range (learning rates read as 1e-4, 1e-3, ...).
    for (let e = Math.ceil(a - 1e-9); e <= b + 1e-9; e++) ticks.push({ value: 10 ** e, unit: (e - a) / (b - a) });
  } else {
    for (let i = 0; i <= 4; i++) ticks.push({ value: g(a + ((b - a) * i) / 4), unit: i / 4 });
  }
  return { kind: log ? "log" : "linear", categories: [], toUnit, fromUnit: (u) => g(a + u * (b - a)), ticks };
}

/**
 * The cells of a heat map of `metric` over two hparams: the mean of the metric of the runs at each
 * pair of values (numeric hparams with more than 12 distinct values are cut into 10 even bins).
 * @param {{hparams: object, metric: number|undefined}[]} rows
 * @param {string} xKey
 * @param {string} yKey
 * @returns {{xs: string[], ys: string[], cells: {x: number, y: number, mean: number, n: number}[], min: number, max: number}}
 */
export function heatmapCells(rows, xKey, yKey) {
  const binner = (key) => {
    const values = rows.map((r) => r.hparams[key]).filter((v) => v !== undefined && v !== null);
    const numeric = values.length > 0 && values.every((v) => typeof v === "number");
    const distinct = [...new Set(values.map((v) => (numeric ? v : String(v))))];
    if (numeric) distinct.sort((a, b) => a - b);
    else distinct.sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    if (!numeric || distinct.length <= 12) return { labels: distinct.map((v) => (numeric ? formatValue(v) : v)), index: (v) => distinct.indexOf(numeric ? v : String(v)) };
    const lo = distinct[0];
    const hi = distinct[distinct.length - 1];
    const bins = 10;
    const labels = Array.from({ length: bins }, (_, i) => `${formatValue(lo + ((hi - lo) * i) / bins)}…`);
    return { labels, index: (v) => (typeof v === "number" ? Math.min(bins - 1, Math.floor(((v - lo) / (hi - lo)) * bins)) : -1) };
  };
  const bx = binner(xKey);
  const by = binner(yKey);
  const sums = new Map();
  for (const r of rows) {
    if (typeof r.metric !== "number" || !Number.isFinite(r.metric)) continue;
    const x = bx.index(r.hparams[xKey]);
    const y = by.index(r.hparams[yKey]);
    if (x < 0 || y < 0) continue;
    const key = `${x},${y}`;
    const cell = sums.get(key) ?? { x, y, sum: 0, n: 0 };
    cell.sum += r.metric;
    cell.n++;
    sums.set(key, cell);
  }
  const cells = [...sums.values()].map(({ x, y, sum, n }) => ({ x, y, mean: sum / n, n }));
  const means = cells.map((c) => c.mean);
  return { xs: bx.labels, ys: by.labels, cells, min: Math.min(...means), max: Math.max(...means) };
}

// Viridis-like ramp for the heat map (5 stops, interpolated).
const RAMP = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];
function rampColor(u) {
  const x = Math.max(0, Math.min(1, u)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const f = x - i;
  const c = RAMP[i].map((v, k) => Math.round(v + (RAMP[i + 1][k] - v) * f));
  return `rgb(${c.join(",")})`;
}

const PC_HEIGHT = 280;
const PAD = { top: 30, bottom: 26, left: 40, right: 64 };

export class SweepPanels {
  /**
   * @param {object} ctx the page context: `runs` (RunsModel), `store`
   * @param {() => void} onBrush called after a brush changed (the page redraws and re-subscribes)
   */
  constructor(ctx, onBrush) {
    this.ctx = ctx;
    this.onBrush = onBrush;
    /** A pending idle redraw (render), or 0. */
    this._soon = 0;
    this.parallelBox = el("div", { class: "pc-box" });
    this.parallelTitle = el("h3", {});
    this.parallelHelp = el("p", { class: "hint" });
    this.scatterTitle = el("h3", {});
    this.heatTitle = el("h3", {});
    this.scatterMetric = el("select", { class: "scatter-metric", on: { change: () => this.renderNow() } });
    this.scatterParam = el("select", { class: "scatter-hparam", on: { change: () => this.renderNow() } });
    this.heatMetric = el("select", { class: "heat-metric", on: { change: () => this.renderNow() } });
    this.heatX = el("select", { class: "heat-x", on: { change: () => this.renderNow() } });
    this.heatY = el("select", { class: "heat-y", on: { change: () => this.renderNow() } });
    this.scatterBox = el("div", { class: "scatter-box" });
    this.heatBox = el("div", { class: "heat-box" });
    this.empty = el("p", { class: "empty" });
    this.element = el(
      "div",
      { class: "sweep" },
      this.empty,
      el("section", { class: "sweep-panel parallel-panel" }, this.parallelTitle, this.parallelHelp, this.parallelBox),
      el("div", { class: "sweep-row" },
        el("section", { class: "sweep-panel" }, this.scatterTitle, el("div", { class: "row sweep-controls" }, this.scatterMetric, this.scatterParam), this.scatterBox),
        el("section", { class: "sweep-panel" }, this.heatTitle, el("div", { class: "row sweep-controls" }, this.heatMetric, this.heatX, this.heatY), this.heatBox),
      ),
    );
    this.relabel();
  }

  relabel() {
    this.parallelTitle.textContent = t("parallel");
    this.parallelHelp.textContent = t("parallelHelp");
    this.scatterTitle.textContent = t("scatter");
    this.heatTitle.textContent = t("heatmapTitle");
    this.empty.textContent = t("noRunsWithHparams");
    this._selectsKey = "";
  }

  /** The runs with hparams that pass the search and condition (brushes aside), as rows. */
  rows() {
    const model = this.ctx.runs;
    const out = [];
    for (const name of [...model.names].sort()) {
      if (model.hidden.has(name) || !model.passes(name, false)) continue;
      const row = model.row(name);
      if (Object.keys(row.hparams).length === 0) continue;
      out.push({ name, row, brushed: model.passes(name, true) });
    }
    return out;
  }

  /** The parallel-coordinate axes: every hparam, then the table's metric columns (last values). */
  axes() {
    const model = this.ctx.runs;
    return [...model.hparamNames().map((k) => `h:${k}`), ...model.shownMetrics().map((tag) => `m:${tag}:last`)];
  }

  /**
   * Redraw soon: once the page is idle (at most a second later), so that a page opening over
   * 1,000 runs draws its first charts before these panels (a few hundred milliseconds of SVG).
   * Calls before then draw once.
   */
  render() {
    if (this._soon) return;
    const run = () => {
      this._soon = 0;
      this.renderNow();
    };
    this._soon = typeof requestIdleCallback === "function" ? requestIdleCallback(run, { timeout: 1000 }) : setTimeout(run, 0);
  }

  /** Redraw now (after the user changed a brush or a choice). */
  renderNow() {
    if (this._soon) {
      if (typeof cancelIdleCallback === "function") cancelIdleCallback(this._soon);
      else clearTimeout(this._soon);
      this._soon = 0;
    }
    const rows = this.rows();
    this.empty.hidden = rows.length > 0;
    for (const panel of this.element.querySelectorAll(".sweep-panel")) panel.hidden = rows.length === 0;
    if (rows.length === 0) return;
    this._fillSelects();
    this._renderParallel(rows);
    this._renderScatter(rows);
    this._renderHeatmap(rows);
  }

  _fillSelects() {
    const model = this.ctx.runs;
    const params = model.hparamNames();
    const tags = model.metricTags();
    const key = JSON.stringify([params, tags]);
    if (key === this._selectsKey) return;
    this._selectsKey = key;
    const fill = (select, values, label, preferred) => {
      const old = select.value;
      select.replaceChildren(...values.map((v) => el("option", { value: v, text: label(v) })));
      select.value = values.includes(old) ? old : preferred ?? values[0] ?? "";
    };
    const metric = model.shownMetrics()[0];
    fill(this.scatterMetric, tags, (v) => `${t("metric")}: ${v}`, metric);
    fill(this.heatMetric, tags, (v) => `${t("metric")}: ${v}`, metric);
    fill(this.scatterParam, params, (v) => `${t("hparamX")}: ${v}`);
    fill(this.heatX, params, (v) => `${t("hparamX")}: ${v}`, params[0]);
    fill(this.heatY, params, (v) => `${t("hparamY")}: ${v}`, params[1] ?? params[0]);
  }

  _width(box) {
    return Math.max(320, box.clientWidth || 640);
  }

  _renderParallel(rows) {
    const model = this.ctx.runs;
    const axes = this.axes();
    const width = this._width(this.parallelBox);
    const height = PC_HEIGHT;
    const plotH = height - PAD.top - PAD.bottom;
    const xOf = (i) => PAD.left + (axes.length <= 1 ? 0 : ((width - PAD.left - PAD.right) * i) / (axes.length - 1));
    const scales = axes.map((c) => axisScale(rows.map((r) => model.columnValue(r.row, c))));
    const yOf = (u) => PAD.top + (1 - u) * plotH;
    const lines = [];
    // Brushed-out runs first (grey, underneath), then the kept ones in their colours.
    const ordered = [...rows.filter((r) => !r.brushed), ...rows.filter((r) => r.brushed)];
    for (const r of ordered) {
      let d = "";
      let pen = "M";
      axes.forEach((c, i) => {
        const u = scales[i].toUnit(model.columnValue(r.row, c));
        if (u === null) {
          pen = "M";
          return;
        }
        d += `${pen}${xOf(i).toFixed(1)},${yOf(u).toFixed(1)}`;
        pen = "L";
      });
      if (!d) continue;
      lines.push(
        svg("path", { d, class: r.brushed ? "pc-line" : "pc-line out", stroke: r.brushed ? colorFor(r.name) : "var(--line)", "data-run": r.name }, svg("title", { text: r.name })),
      );
    }
    const axisNodes = axes.map((c, i) => {
      const scale = scales[i];
      const x = xOf(i);
      const brush = model.brushes.get(c);
      const g = svg("g", { class: `pc-axis${brush ? " brushed" : ""}`, "data-column": c });
      g.append(svg("line", { x1: x, x2: x, y1: PAD.top, y2: PAD.top + plotH, class: "pc-axis-line" }));
      const label = c.startsWith("h:") ? c.slice(2) : c.slice(2, c.lastIndexOf(":"));
      g.append(svg("text", { x, y: PAD.top - 12, "text-anchor": "middle", class: "pc-label", text: label }));
      const ticks = scale.kind === "category" && scale.ticks.length > 12 ? scale.ticks.filter((_, k) => k % Math.ceil(scale.ticks.length / 12) === 0) : scale.ticks;
      for (const tick of ticks) {
        g.append(svg("text", { x: x + 4, y: yOf(tick.unit) + 3, class: "pc-tick", text: scale.kind === "category" ? tick.value : formatValue(tick.value) }));
      }
      if (brush) {
        const [u0, u1] = this._brushUnits(scale, brush);
        g.append(svg("rect", { x: x - 7, width: 14, y: yOf(u1), height: Math.max(2, yOf(u0) - yOf(u1)), class: "pc-brush" }));
      }
      // A wide transparent hit area to drag on.
      g.append(svg("rect", { x: x - 12, width: 24, y: PAD.top - 4, height: plotH + 8, class: "pc-hit", on: { mousedown: (e) => this._startBrush(e, c, scale, x, plotH) } }));
      return g;
    });
    this.parallelBox.replaceChildren(svg("svg", { class: "parallel", width, height, viewBox: `0 0 ${width} ${height}` }, svg("g", { class: "pc-lines" }, ...lines), ...axisNodes));
  }

  // The unit range [lo, hi] a brush covers on its scale.
  _brushUnits(scale, brush) {
    if (brush instanceof Set) {
      const units = [...brush].map((v) => scale.toUnit(v)).filter((u) => u !== null);
      return units.length ? [Math.min(...units) - 0.02, Math.max(...units) + 0.02] : [0, 0];
    }
    const lo = scale.toUnit(brush[0]) ?? 0;
    const hi = scale.toUnit(brush[1]) ?? 1;
    return [Math.max(0, lo), Math.min(1, hi)];
  }

  // Drag along an axis: a live rectangle follows the pointer; on release the range becomes the
  // axis' brush (values for a numeric axis, the categories inside it otherwise).
  _startBrush(e, column, scale, x, plotH) {
    e.preventDefault();
    const svgEl = e.currentTarget.ownerSVGElement;
    // A live summary can redraw the view mid-drag, detaching this svg (its rect is then all
    // zeros): measure against where it stood while it is gone, so the brush keeps its range.
    let top = svgEl.getBoundingClientRect().top;
    const topNow = () => (svgEl.isConnected ? (top = svgEl.getBoundingClientRect().top) : top);
    const y0 = e.clientY - top;
    const rect = svg("rect", { x: x - 7, width: 14, y: y0, height: 0, class: "pc-brush live" });
    svgEl.append(rect);
    const unitAt = (y) => Math.max(0, Math.min(1, 1 - (y - PAD.top) / plotH));
    let y1 = y0;
    const move = (ev) => {
      y1 = ev.clientY - topNow();
      rect.setAttribute("y", String(Math.min(y0, y1)));
      rect.setAttribute("height", String(Math.abs(y1 - y0)));
    };
    const up = () => {
      document.removeEventListener("mousemove", move);
      document.removeEventListener("mouseup", up);
      const model = this.ctx.runs;
      if (Math.abs(y1 - y0) < 3) {
        model.brushes.delete(column); // a click clears the axis' brush
      } else {
        const u0 = unitAt(Math.max(y0, y1));
        const u1 = unitAt(Math.min(y0, y1));
        if (scale.kind === "category") {
          model.brushes.set(column, new Set(scale.ticks.filter((tk) => tk.unit >= u0 && tk.unit <= u1).map((tk) => tk.value)));
        } else {
          model.brushes.set(column, [scale.fromUnit(u0), scale.fromUnit(u1)]);
        }
      }
      model.version++;
      this.onBrush();
      this.renderNow();
    };
    document.addEventListener("mousemove", move);
    document.addEventListener("mouseup", up);
  }

  _renderScatter(rows) {
    const model = this.ctx.runs;
    const metric = this.scatterMetric.value;
    const param = this.scatterParam.value;
    const width = this._width(this.scatterBox);
    const height = 240;
    const pts = rows.map((r) => ({ name: r.name, brushed: r.brushed, x: r.row.hparams[param], y: model.columnValue(r.row, `m:${metric}:last`) })).filter((p) => p.x !== undefined && typeof p.y === "number");
    const sx = axisScale(pts.map((p) => p.x));
    const sy = axisScale(pts.map((p) => p.y));
    const plotW = width - 60 - 16;
    const plotH = height - 16 - 36;
    const X = (u) => 60 + u * plotW;
    const Y = (u) => 16 + (1 - u) * plotH;
    const nodes = [
      svg("line", { x1: 60, x2: 60 + plotW, y1: 16 + plotH, y2: 16 + plotH, class: "axis" }),
      svg("line", { x1: 60, x2: 60, y1: 16, y2: 16 + plotH, class: "axis" }),
      svg("text", { x: 60 + plotW / 2, y: height - 4, "text-anchor": "middle", class: "axis-title", text: param }),
      svg("text", { x: 12, y: 16 + plotH / 2, "text-anchor": "middle", class: "axis-title", transform: `rotate(-90 12 ${16 + plotH / 2})`, text: metric }),
    ];
    for (const tk of sx.ticks.slice(0, 14)) nodes.push(svg("text", { x: X(tk.unit), y: 16 + plotH + 14, "text-anchor": "middle", class: "pc-tick", text: sx.kind === "category" ? tk.value : formatValue(tk.value) }));
    for (const tk of sy.ticks) nodes.push(svg("text", { x: 56, y: Y(tk.unit) + 3, "text-anchor": "end", class: "pc-tick", text: formatValue(tk.value) }));
    for (const p of pts) {
      const ux = sx.toUnit(p.x);
      const uy = sy.toUnit(p.y);
      if (ux === null || uy === null) continue;
      nodes.push(svg("circle", { cx: X(ux).toFixed(1), cy: Y(uy).toFixed(1), r: 4, fill: p.brushed ? colorFor(p.name) : "var(--line)", class: "scatter-point", "data-run": p.name }, svg("title", { text: `${p.name}: ${param} ${p.x}, ${metric} ${formatValue(p.y)}` })));
    }
    this.scatterBox.replaceChildren(svg("svg", { class: "scatter", width, height, viewBox: `0 0 ${width} ${height}` }, ...nodes));
  }

  _renderHeatmap(rows) {
    const model = this.ctx.runs;
    const metric = this.heatMetric.value;
    const xKey = this.heatX.value;
    const yKey = this.heatY.value;
    const data = rows.filter((r) => r.brushed).map((r) => ({ hparams: r.row.hparams, metric: model.columnValue(r.row, `m:${metric}:last`) }));
    const { xs, ys, cells, min, max } = heatmapCells(data, xKey, yKey);
    const width = this._width(this.heatBox);
    const height = 240;
    const left = 70;
    const bottom = 36;
    const barW = 50;
    const plotW = width - left - barW - 10;
    const plotH = height - 10 - bottom;
    const cw = plotW / Math.max(1, xs.length);
    const ch = plotH / Math.max(1, ys.length);
    const nodes = [];
    for (const c of cells) {
      const u = max > min ? (c.mean - min) / (max - min) : 0.5;
      const x = left + c.x * cw;
      const y = 10 + (ys.length - 1 - c.y) * ch;
      nodes.push(svg("rect", { x, y, width: Math.max(1, cw - 1), height: Math.max(1, ch - 1), fill: rampColor(u), class: "heat-cell", "data-x": xs[c.x], "data-y": ys[c.y], "data-mean": c.mean }, svg("title", { text: `${xKey} ${xs[c.x]}, ${yKey} ${ys[c.y]}: ${metric} ${formatValue(c.mean)} (${c.n})` })));
      if (cw > 34 && ch > 14) nodes.push(svg("text", { x: x + cw / 2, y: y + ch / 2 + 4, "text-anchor": "middle", class: u > 0.6 ? "heat-text dark" : "heat-text", text: formatValue(c.mean) }));
    }
    xs.forEach((label, i) => nodes.push(svg("text", { x: left + (i + 0.5) * cw, y: 10 + plotH + 14, "text-anchor": "middle", class: "pc-tick", text: label })));
    ys.forEach((label, i) => nodes.push(svg("text", { x: left - 4, y: 10 + (ys.length - 1 - i + 0.5) * ch + 3, "text-anchor": "end", class: "pc-tick", text: label })));
    nodes.push(svg("text", { x: left + plotW / 2, y: height - 4, "text-anchor": "middle", class: "axis-title", text: xKey }));
    nodes.push(svg("text", { x: 10, y: 10 + plotH / 2, "text-anchor": "middle", class: "axis-title", transform: `rotate(-90 10 ${10 + plotH / 2})`, text: yKey }));
    // Colour bar: the metric's range.
    if (cells.length) {
      const bx = left + plotW + 12;
      for (let i = 0; i < 20; i++) nodes.push(svg("rect", { x: bx, y: 10 + (plotH * (19 - i)) / 20, width: 10, height: plotH / 20 + 0.5, fill: rampColor(i / 19) }));
      nodes.push(svg("text", { x: bx + 13, y: 18, class: "pc-tick", text: formatValue(max) }));
      nodes.push(svg("text", { x: bx + 13, y: 10 + plotH, class: "pc-tick", text: formatValue(min) }));
    }
    this.heatBox.replaceChildren(svg("svg", { class: "hp-heatmap", width, height, viewBox: `0 0 ${width} ${height}` }, ...nodes));
  }
}
