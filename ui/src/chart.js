// A uPlot chart that pulls its lines from a source callback when the frame scheduler says so.
// It owns the uPlot instance (rebuilt only when the set of lines changes), drag-to-zoom with a reset,
// the floating tooltip of the values under the cursor, click-to-pin shared with its sync group, and
// its tools: CSV/JSON/PNG downloads, fullscreen, a manual y range and outlier clipping.
import uPlot from "uplot";
import { parseBound, quantileRange, robustRange, saveText, seriesCsv, seriesJson } from "./chartdata.js";
import { el, fileName } from "./dom.js";
import { onLanguage, t, tf } from "./i18n.js";
import { icon } from "./icons.js";
import { hideTooltip, showTooltip, sortRows } from "./tooltip.js";

/** Height of a chart's canvas (axes and their titles included), CSS pixels. */
export const HEIGHT = 240;
/** Quantiles kept by "ignore outliers": values outside them do not widen the y scale. */
export const CLIP_QUANTILES = [0.01, 0.99];
const AXIS_FONT = "11px system-ui, sans-serif";
/** Line dash patterns, for lines that share a color (the devices of one run); CSS border styles alike. */
export const DASHES = [[], [6, 3], [2, 2], [10, 3, 2, 3]];
const DASH_CSS = ["solid", "dashed", "dotted", "double"];

/** Live charts, relabeled on a language switch. */
const charts = new Set();
const byElement = new WeakMap();

/**
 * The Chart whose element is `element`, or null (the report finds charts through the page).
 * @param {Element} element
 * @returns {Chart|null}
 */
export function chartFor(element) {
  return byElement.get(element) ?? null;
}
onLanguage(() => {
  for (const chart of charts) chart.relabel();
});

/**
 * What the charts of one cursor-sync group share besides uPlot's cursor sync: a pinned cursor
 * (clicking a chart pins the cursor at that x on all of them; clicking again releases it) and the
 * zoom reset (a drag zoom reaches every chart of the group through uPlot's synced selection).
 */
export class SyncGroup {
  constructor() {
    /** The pinned x value, or null. */
    this.x = null;
    this.charts = new Set();
  }

  /** Pin every chart at `x`, or release when `x` is null. */
  set(x) {
    this.x = x;
    for (const chart of this.charts) chart._applyPin();
  }

  /** Undo the zoom of every chart of the group. */
  resetZoom() {
    for (const chart of this.charts) chart.resetZoom();
  }
}

/**
 * Format a relative time in seconds as `1h02m`, `3m05s` or `12.5s`.
 * @param {number} s
 */
export function formatDuration(s) {
  if (!Number.isFinite(s)) return "";
  const sign = s < 0 ? "-" : "";
  s = Math.abs(s);
  if (s < 60) return `${sign}${+s.toFixed(s < 10 ? 2 : 1)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${sign}${m}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${sign}${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
}

/** A compact number for readouts: up to 5 significant digits, exponent for very small/large. */
export function formatValue(v) {
  if (v === null || v === undefined) return "–";
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3).replace(/\.?0+e/, "e");
  return String(+v.toPrecision(5));
}

/** A byte count as `1.5 GiB`. */
export function formatBytes(v) {
  if (!Number.isFinite(v)) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${+v.toFixed(v >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

/** Drawn on every chart after uPlot draws it: `draw(chart, u)` (the alert markers, views/alerts.js). */
export const chartHooks = { draw: null };

export class Chart {
  /**
   * @param {object} opts
   * @param {string} opts.key identifies the chart (`data-tag` of its element)
   * @param {string} opts.title shown above the plot (as text)
   * @param {(chart: Chart) => Line[]} opts.source the lines to draw, given this chart's width and zoom
   * @param {string} opts.syncKey uPlot cursor.sync key: charts with the same key share the cursor
   * @param {SyncGroup} opts.group the SyncGroup of that sync key
   * @param {"step"|"relative"|"wall"|"value"} [opts.xKind] how x is shown
   * @param {string} [opts.xLabel] name of x in the readout, for xKind "value"
   * @param {() => string} [opts.xTitle] the x axis title (default: step, relative time or wall time)
   * @param {() => string} [opts.yTitle] the y axis title (default: the chart's title)
   * @param {[number, number]} [opts.yRange] fixed y range instead of auto
   * @param {boolean} [opts.robust] the automatic y range leaves out the few lines that run far off
   *   (chartdata.js, robustRange), names them in a button, which toggles the full range
   * @param {[number, number]} [opts.xRange] fixed x range instead of the data's
   * @param {(x: number) => ({x: number, values: {label: string, color: string, value: number, raw?: number, smoothed?: number, cells?: (number|string)[]}[], head?: string[]}|null)} [opts.lookup]
   *   the values to read out at an x (default: the drawn points nearest the cursor); values with
   *   `raw` and `smoothed` show both; with `head`, each value's `cells` under those column names
   * @param {() => object[]} [opts.exportData] the series to download as CSV/JSON (see
   *   chartdata.js; default: the drawn lines as `{run, x, y}`)
   * @param {boolean} [opts.legend] show a legend of the lines under the plot
   * @param {boolean} [opts.logY]
   * @param {(v: number) => string} [opts.formatY] y tick and readout format
   * @param {object} [opts.dataset] data attributes of the chart element (default `{tag: key}`)
   *
   * A Line is `{label, color, xs, ys, alpha?, width?, dash?, legend?, legendText?, legendData?}`;
   * lines with the same `xs` object share x values (uPlot's aligned data); others are joined.
   * `legend: false` keeps a line out of the legend and the tooltip.
   */
  constructor({
    key,
    title,
    source,
    syncKey,
    group,
    xKind = "step",
    logY = false,
    formatY = formatValue,
    dataset = { tag: key },
    xLabel = "",
    xTitle = null,
    yTitle = null,
    yRange = null,
    robust = false,
    xRange = null,
    lookup = null,
    exportData = null,
    legend = false,
  }) {
    this.key = key;
    this.source = source;
    this.syncKey = syncKey;
    this.group = group;
    this.xKind = xKind;
    this.logY = logY;
    this.formatY = formatY;
    this.xLabel = xLabel;
    this.xTitle = xTitle;
    this.yTitle = yTitle;
    this.yRange = yRange;
    this.xRange = xRange;
    this.lookup = lookup;
    this.exportData = exportData;
    this.showLegend = legend;
    /** Visible x range after a drag zoom, or null for everything. */
    this.zoom = null;
    /** Manual y bounds (null: automatic) and whether outliers are left out of the y scale. */
    this.yMin = null;
    this.yMax = null;
    this.clip = false;
    /** Whether lines far off are left out of the automatic y range (`robust`), unless `fullRange`. */
    this.robust = robust;
    this.fullRange = false;
    /** The lines left out of the y range at the last draw (their labels), or that would be. */
    this.offScale = [];
    /** Whether the chart fills the window. */
    this.fullscreen = false;
    /** @type {uPlot|null} */
    this.plot = null;
    this.renders = 0;
    /** How many times the uPlot instance was built (lines coming and going do not rebuild it). */
    this.builds = 0;
    this._keys = [];
    this._keysChanged = false;
    this._signature = "";
    this._lines = [];
    this._downX = null;
    this._hover = false;
    this._pointer = { clientX: 0, clientY: 0 };
    this._height = HEIGHT;

    this.plotBox = el("div", { class: "plot" });
    this.titleEl = el("span", { class: "chart-title", text: title, title });
    const tool = (cls, text, fn) => el("button", { class: `icon ${cls}`, type: "button", on: { click: fn } }, text);
    this.resetBtn = tool("reset", "⤢", () => this.group.resetZoom());
    this.yBtn = tool("yrange-btn", icon("yrange"), () => this.toggleYPanel());
    this.csvBtn = tool("dl-csv", "CSV", () => this.saveCsv());
    this.jsonBtn = tool("dl-json", "JSON", () => this.saveJson());
    this.pngBtn = tool("dl-png", "PNG", () => this.savePng());
    this.fullBtn = tool("fullscreen-btn", icon("fullscreen"), () => this.setFullscreen(!this.fullscreen));
    this.offScaleBtn = el("button", { class: "offscale", type: "button", hidden: true, on: { click: () => this.setFullRange(!this.fullRange) } });
    const bound = (cls) =>
      el("input", { type: "text", inputmode: "decimal", class: cls, size: "7", spellcheck: "false", on: { input: () => this._onYInput() } });
    this.yMinInput = bound("ymin");
    this.yMaxInput = bound("ymax");
    this.clipInput = el("input", { type: "checkbox", class: "clip", on: { change: () => this._onYInput() } });
    this.yError = el("span", { class: "yrange-error", role: "alert" });
    this._yLabels = { min: el("span"), max: el("span"), clip: el("span") };
    this.yPanel = el(
      "div",
      { class: "yrange", hidden: true },
      el("label", {}, this._yLabels.min, this.yMinInput),
      el("label", {}, this._yLabels.max, this.yMaxInput),
      el("label", { class: "check" }, this.clipInput, this._yLabels.clip),
      this.yError,
    );
    this.legendEl = el("div", { class: "legend", hidden: !legend });
    // Kept for callers that set its text; the values under the cursor are in the floating tooltip.
    this.readout = el("div", { class: "readout", hidden: true });
    this.element = el(
      "section",
      { class: "chart", dataset, "aria-label": title },
      el("header", {}, this.titleEl, el("span", { class: "chart-tools" }, this.offScaleBtn, this.resetBtn, this.yBtn, this.csvBtn, this.jsonBtn, this.pngBtn, this.fullBtn)),
      this.yPanel,
      this.plotBox,
      this.legendEl,
    );
    this.resetBtn.hidden = true;
    this._relabelTools();
    group.charts.add(this);
    charts.add(this);
    byElement.set(this.element, this);
    this._resize = new ResizeObserver((entries) => {
      const r = entries[entries.length - 1].contentRect;
      this._onResize(r.width, r.height);
    });
    this._resize.observe(this.plotBox);
    // Captured on the way down, before uPlot's own handler moves the cursor (and the tooltip).
    this.plotBox.addEventListener(
      "mousemove",
      (e) => {
        this._pointer = { clientX: e.clientX, clientY: e.clientY };
        this._hover = true;
        if (this.group.x !== null) this._updateReadout(); // pinned: uPlot does not move the cursor
      },
      true,
    );
    this._onKey = (e) => {
      if (e.key === "Escape") this.setFullscreen(false);
    };
  }

  /**
   * Pixel columns available for data: what downsampling aims for. Taken from the ResizeObserver,
   * so that drawing one chart after another never forces a layout in between.
   */
  get width() {
    if (this._width === undefined) this._width = this.plotBox.clientWidth;
    return Math.max(50, Math.round(this._width || 600));
  }

  /**
   * Pull lines from the source and draw them (called by the frame scheduler). The uPlot instance
   * is built once per axis setup (x kind, log scale, height, titles, y range); lines that come or
   * go (runs selected, snapshots arriving) are added to or removed from it, so a chart of 100 runs
   * does not rebuild its axes, canvas and 100 series each time one more run arrives.
   */
  render() {
    const lines = this.source(this);
    const frame = `${this.xKind}|${this.logY}|${this._height}`;
    const keys = lines.map(seriesKey);
    const data = alignedData(lines, this.logY);
    if (!this.plot || frame !== this._signature || !this._reconcile(lines, keys)) {
      this._signature = frame;
      this._keys = keys;
      this._build(lines, data);
      this.builds++;
    } else {
      if (this._keysChanged) this._renderLegend(lines);
      this.plot.setData(data, this.zoom === null);
    }
    this._lines = lines;
    if (this.zoom) this.plot.setScale("x", { min: this.zoom[0], max: this.zoom[1] });
    this._applyPin();
    this._updateReadout();
    this.renders++;
  }

  // Bring the uPlot instance's series in line with `keys` (deleting the lines that went, adding
  // the new ones where they belong); false when that is not possible in place (lines reordered or
  // named twice): then the caller rebuilds. Sets `_keysChanged`.
  _reconcile(lines, keys) {
    const have = this._keys;
    this._keysChanged = false;
    if (keys.length === have.length && keys.every((k, i) => k === have[i])) return true;
    const wanted = new Set(keys);
    if (wanted.size !== keys.length) return false;
    const kept = have.filter((k) => wanted.has(k));
    // The kept lines must stay in the same order, so that new ones only need inserting.
    let j = 0;
    for (const k of keys) if (j < kept.length && k === kept[j]) j++;
    if (j !== kept.length) return false;
    const u = this.plot;
    for (let i = have.length - 1; i >= 0; i--) if (!wanted.has(have[i])) u.delSeries(i + 1);
    const now = kept;
    for (let i = 0; i < keys.length; i++) {
      if (now[i] === keys[i]) continue;
      u.addSeries(seriesOptions(lines[i]), i + 1);
      now.splice(i, 0, keys[i]);
    }
    this._keys = now;
    this._keysChanged = true;
    return true;
  }

  /** Undo a drag zoom of this chart only (see SyncGroup.resetZoom for the whole group). */
  resetZoom() {
    if (this.zoom === null) return;
    this.zoom = null;
    this.resetBtn.hidden = true;
    this.onChange?.();
  }

  /**
   * Set the y scale: manual bounds (null: automatic) and outlier clipping.
   * @param {{min?: number|null, max?: number|null, clip?: boolean}} range
   */
  setYRange({ min = this.yMin, max = this.yMax, clip = this.clip } = {}) {
    this.yMin = min;
    this.yMax = max;
    this.clip = Boolean(clip);
    this.yMinInput.value = min === null ? "" : String(min);
    this.yMaxInput.value = max === null ? "" : String(max);
    this.clipInput.checked = this.clip;
    this.yError.textContent = "";
    this._yChanged();
  }

  /**
   * Show every line in the automatic y range (true), or leave the few far off out of it (false,
   * the default of a `robust` chart).
   * @param {boolean} on
   */
  setFullRange(on) {
    this.fullRange = Boolean(on);
    this._showOffScale(this.offScale);
    this._yChanged();
  }

  /** Show or hide the y range controls. */
  toggleYPanel(shown = this.yPanel.hidden) {
    this.yPanel.hidden = !shown;
    this.yBtn.classList.toggle("active", shown || this._yCustom());
  }

  /** Fill the window with this chart (true) or put it back (false); Escape also puts it back. */
  setFullscreen(on) {
    on = Boolean(on);
    if (on === this.fullscreen) return;
    this.fullscreen = on;
    this.element.classList.toggle("fullscreen", on);
    document.body.classList.toggle("has-fullscreen", on || document.querySelector(".chart.fullscreen") !== null);
    this.fullBtn.classList.toggle("active", on);
    if (on) document.addEventListener("keydown", this._onKey);
    else document.removeEventListener("keydown", this._onKey);
    hideTooltip(this);
    if (!on) this._setHeight(HEIGHT);
    // In fullscreen the plot's height follows its box (ResizeObserver, _onResize).
  }

  /** The series the chart shows, for downloads: `exportData()` or the drawn lines. */
  data() {
    if (this.exportData) return this.exportData();
    return this._lines
      .filter((l) => l.legend !== false)
      .map((l) => ({ run: l.label, x: Array.from(l.xs), y: Array.from(l.ys, (v) => (v === null ? NaN : v)) }));
  }

  /** Download what the chart shows as CSV (`<key>.csv`): one row per point, `run,step,wall,value,smoothed`. */
  saveCsv() {
    saveText(fileName(this.key, "csv"), "text/csv", seriesCsv(this.data()));
  }

  /** Download what the chart shows as JSON (`<key>.json`): `{chart, title, x, exported, series}`. */
  saveJson() {
    const meta = { chart: this.key, title: this.titleEl.textContent, x: this.xKind, exported: new Date().toISOString() };
    saveText(fileName(this.key, "json"), "application/json", seriesJson(meta, this.data()));
  }

  /**
   * The chart (title, plot with its axes, legend) drawn on one canvas, for PNG downloads and the
   * report; null before the first drawing.
   * @returns {HTMLCanvasElement|null}
   */
  snapshot() {
    if (!this.plot) return null;
    const src = this.plot.ctx.canvas;
    const ratio = src.width / this.plot.width || 1;
    const pad = Math.round(28 * ratio);
    const legend = this._lines.filter((l) => l.legend !== false && this.showLegend);
    const legendH = legend.length ? Math.round(18 * ratio) * Math.ceil(legend.length / 3) + Math.round(6 * ratio) : 0;
    const canvas = document.createElement("canvas");
    canvas.width = src.width;
    canvas.height = src.height + pad + legendH;
    const ctx = canvas.getContext("2d");
    const style = getComputedStyle(this.element);
    ctx.fillStyle = style.backgroundColor || "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.fillStyle = style.color || "#000";
    ctx.font = `600 ${Math.round(14 * ratio)}px system-ui, sans-serif`;
    ctx.fillText(this.titleEl.textContent, 8 * ratio, 19 * ratio);
    ctx.drawImage(src, 0, pad);
    ctx.font = `${Math.round(12 * ratio)}px system-ui, sans-serif`;
    const colW = canvas.width / 3;
    legend.forEach((l, i) => {
      const x = (i % 3) * colW + 8 * ratio;
      const y = src.height + pad + Math.floor(i / 3) * 18 * ratio + 12 * ratio;
      ctx.fillStyle = l.color;
      ctx.fillRect(x, y - 5 * ratio, 12 * ratio, 3 * ratio);
      ctx.fillStyle = style.color || "#000";
      ctx.fillText(l.legendText ?? l.label, x + 18 * ratio, y, colW - 30 * ratio);
    });
    return canvas;
  }

  /** Download the chart (title, plot, legend) as a PNG file named after its key. */
  savePng() {
    const canvas = this.snapshot();
    if (!canvas) return;
    const a = el("a", { download: fileName(this.key, "png"), href: canvas.toDataURL("image/png") });
    document.body.append(a);
    a.click();
    a.remove();
  }

  /** Remove the chart and its observers. */
  destroy() {
    this.setFullscreen(false);
    hideTooltip(this);
    this._resize.disconnect();
    this.group.charts.delete(this);
    charts.delete(this);
    this.plot?.destroy();
    this.plot = null;
    this.element.remove();
  }

  /** Set the title text (for language switches). */
  setTitle(title) {
    if (title === this.titleEl.textContent) return;
    this.titleEl.textContent = title;
    this.titleEl.title = title;
    this._signature = ""; // the y axis title is the chart's title
    this.onChange?.();
  }

  /** Re-apply interface strings after a language switch (axis titles are drawn: rebuild). */
  relabel() {
    this._relabelTools();
    this._signature = "";
    this.onChange?.();
  }

  _relabelTools() {
    this._showOffScale(this.offScale, true);
    this.resetBtn.title = t("reset");
    this.yBtn.title = t("yRange");
    this.csvBtn.title = t("saveCsv");
    this.jsonBtn.title = t("saveJson");
    this.pngBtn.title = t("savePng");
    this.fullBtn.title = t("fullscreen");
    for (const b of [this.resetBtn, this.yBtn, this.csvBtn, this.jsonBtn, this.pngBtn, this.fullBtn]) b.setAttribute("aria-label", b.title);
    this._yLabels.min.textContent = t("yMin");
    this._yLabels.max.textContent = t("yMax");
    this._yLabels.clip.textContent = t("ignoreOutliers");
    this.yMinInput.placeholder = t("auto");
    this.yMaxInput.placeholder = t("auto");
  }

  _yCustom() {
    return this.yMin !== null || this.yMax !== null || this.clip;
  }

  _onYInput() {
    let min;
    let max;
    try {
      min = parseBound(this.yMinInput.value);
      max = parseBound(this.yMaxInput.value);
      if (min !== null && max !== null && !(max > min)) throw new RangeError(`y max must be above y min, got ${min} and ${max}`);
    } catch (err) {
      this.yError.textContent = `${t("badBound")}: ${err.message}`;
      return;
    }
    this.yError.textContent = "";
    this.yMin = min;
    this.yMax = max;
    this.clip = this.clipInput.checked;
    this._yChanged();
  }

  _yChanged() {
    this.yBtn.classList.toggle("active", !this.yPanel.hidden || this._yCustom());
    this.element.dataset.yrange = this._yCustom() ? `${this.yMin ?? ""}:${this.yMax ?? ""}:${this.clip ? "clip" : ""}` : "";
    this._signature = "";
    this.onChange?.();
  }

  // The y range: the data's (or the fixed yRange), narrowed to the 1st-99th percentile when
  // clipping outliers, with the manual bounds on top.
  _yScale(u, dataMin, dataMax) {
    let lo = dataMin;
    let hi = dataMax;
    let auto;
    if (this.yRange && !this.clip) auto = this.yRange;
    else {
      if (this.clip) {
        const q = quantileRange(u.data.slice(1), CLIP_QUANTILES[0], CLIP_QUANTILES[1], this.logY);
        if (q) [lo, hi] = q;
        if (this.offScale.length) this._showOffScale([]); // the percentiles replace the robust range
      } else if (this.robust) {
        // Only the rows in the x window count (uPlot's auto range does the same).
        const [i0, i1] = u.series[0].idxs ?? [];
        const r = robustRange(u.data.slice(1), { i0: i0 ?? 0, i1: i1 ?? Infinity, log: this.logY });
        const off = new Set();
        for (const c of r ? [...r.above, ...r.below] : []) off.add(String(u.series[c + 1].label).replace(/ \(raw\)$/, ""));
        this._showOffScale([...off]);
        if (r && !this.fullRange) [lo, hi] = r.range;
      }
      if (lo === null || hi === null || !Number.isFinite(lo) || !Number.isFinite(hi)) [lo, hi] = this.logY ? [1, 10] : [0, 1];
      auto = this.logY ? uPlot.rangeLog(lo, hi, 10, true) : uPlot.rangeNum(lo, hi, 0.1, true);
    }
    let min = this.yMin ?? auto[0];
    let max = this.yMax ?? auto[1];
    if (!(max > min)) {
      // one manual bound beyond the data: keep a span on the other side
      const span = Math.abs(auto[1] - auto[0]) || 1;
      if (this.yMin !== null) max = min + span;
      else min = max - span;
    }
    return [min, max];
  }

  // The button naming the lines left out of the y range (or that would be, under the full range).
  _showOffScale(labels, relabel = false) {
    const same = labels.length === this.offScale.length && labels.every((l, i) => l === this.offScale[i]);
    if (same && !relabel && this.offScaleBtn.getAttribute("aria-pressed") === String(this.fullRange)) return;
    this.offScale = labels;
    const b = this.offScaleBtn;
    b.hidden = labels.length === 0;
    b.textContent = tf("offScale", { n: labels.length });
    b.title = `${tf("offScaleRuns", { runs: labels.join(", ") })} ${t(this.fullRange ? "offScaleClip" : "offScaleShow")}`;
    b.setAttribute("aria-pressed", String(this.fullRange));
    b.classList.toggle("active", this.fullRange);
    this.element.dataset.offscale = String(labels.length);
  }

  _axisTitles() {
    const x =
      this.xTitle?.() ??
      (this.xKind === "wall" ? t("xWall") : this.xKind === "relative" ? t("axisRelative") : this.xKind === "value" ? this.xLabel : t("xStep"));
    const y = this.yTitle?.() ?? this.titleEl.textContent;
    // The y title runs along the plot's height: cut it to what fits (about 6.5 px a character).
    const room = Math.max(8, Math.floor((this._height - 60) / 6.5));
    return { x, y: y.length > room ? `${y.slice(0, room - 1)}…` : y };
  }

  _build(lines, data) {
    this.plot?.destroy();
    const xKind = this.xKind;
    const formatY = this.formatY;
    const titles = this._axisTitles();
    const xRange = this.xRange;
    const opts = {
      width: this.width,
      height: this._height,
      legend: { show: false },
      cursor: {
        sync: { key: this.syncKey, setSeries: false, scales: ["x", null] },
        drag: { x: true, y: false, setScale: false },
        // Shift + drag pans instead of selecting a range to zoom into.
        bind: {
          mousedown: (u, target, handler) => (e) => {
            if (e.shiftKey && e.button === 0) {
              this._startPan(e);
              return null;
            }
            return handler(e);
          },
        },
        y: false,
        points: { size: 6 },
      },
      scales: {
        // A single point would otherwise get an arbitrary range (uPlot gives a time axis 1,000 days).
        x: { time: xKind === "wall", range: xRange ? () => [...xRange] : (u, min, max) => singlePointRange(u, min, max, xKind === "step" ? 1 : 30) },
        y: { ...(this.logY ? { distr: 3 } : {}), range: (u, min, max) => this._yScale(u, min, max) },
      },
      axes: [
        {
          stroke: "var(--muted)",
          grid: { stroke: "rgba(128,128,128,0.15)" },
          ticks: { stroke: "rgba(128,128,128,0.3)" },
          ...(xKind === "relative" ? { values: (u, ticks) => ticks.map(formatDuration) } : {}),
          // Date-time labels are wide and two lines high; others need one short line.
          ...(xKind === "wall" ? { space: 90, size: 44 } : { space: 64, size: 26 }),
          label: titles.x,
          labelSize: 16,
          labelFont: AXIS_FONT,
          font: AXIS_FONT,
        },
        {
          stroke: "var(--muted)",
          grid: { stroke: "rgba(128,128,128,0.15)" },
          ticks: { stroke: "rgba(128,128,128,0.3)" },
          // As wide as its widest label ("91 MiB/s" is not cut to "·91 MiB/s").
          size: fitAxis,
          label: titles.y,
          labelSize: 16,
          labelFont: AXIS_FONT,
          font: AXIS_FONT,
          // On a log scale uPlot puts ticks at 1..9 x 10^k; label the powers of ten only.
          values: this.logY ? (u, ticks) => ticks.map((v) => (isPowerOfTen(v) ? formatY(v) : "")) : (u, ticks) => ticks.map(formatY),
        },
      ],
      series: [
        { label: "x" },
        ...lines.map(seriesOptions),
      ],
      hooks: {
        setCursor: [() => this._updateReadout()],
        setSelect: [(u) => this._onSelect(u)],
        draw: [(u) => chartHooks.draw?.(this, u)],
      },
    };
    // A stroke given as a CSS variable is not understood by canvas; resolve it once here.
    const muted = getComputedStyle(document.documentElement).getPropertyValue("--muted").trim() || "#666";
    for (const axis of opts.axes) axis.stroke = muted;
    this.plot = new uPlot(opts, data, this.plotBox);
    const over = this.plot.over;
    over.addEventListener("mousedown", (e) => (this._downX = e.clientX));
    over.addEventListener("click", (e) => this._onClick(e));
    over.addEventListener("dblclick", () => this.group.resetZoom());
    over.addEventListener("mouseenter", () => (this._hover = true));
    over.addEventListener("mouseleave", () => {
      this._hover = false;
      hideTooltip(this);
    });
    this._renderLegend(lines);
  }

  _renderLegend(lines) {
    if (!this.showLegend) return;
    const shown = lines.filter((l) => l.legend !== false);
    this.legendEl.replaceChildren(
      ...shown.map((l) =>
        el(
          "span",
          { class: "legend-item", dataset: { label: l.label, ...(l.legendData ?? {}) }, title: l.legendText ?? l.label },
          el("i", { class: "legend-line", style: { borderTopColor: l.color, borderTopStyle: DASH_CSS[dashIndex(l.dash)] } }),
          el("span", { text: l.legendText ?? l.label }),
        ),
      ),
    );
  }

  _onSelect(u) {
    if (u.select.width < 4) return;
    const min = u.posToVal(u.select.left, "x");
    const max = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    this.zoom = [min, max];
    this.resetBtn.hidden = false;
    this.onChange?.();
  }

  _startPan(e) {
    const u = this.plot;
    const { min, max } = u.scales.x;
    if (!(max > min)) return;
    e.preventDefault();
    const x0 = e.clientX;
    const perPx = (max - min) / u.over.clientWidth;
    const move = (ev) => {
      const shift = (ev.clientX - x0) * perPx;
      this.zoom = [min - shift, max - shift];
      this.resetBtn.hidden = false;
      this.onChange?.();
    };
    const up = () => {
      document.removeEventListener("mousemove", move);
      document.removeEventListener("mouseup", up);
    };
    document.addEventListener("mousemove", move);
    document.addEventListener("mouseup", up);
  }

  _onClick(e) {
    // A drag (zoom or pan) also ends in a click; only a click that stayed put pins.
    if (this._downX === null || Math.abs(e.clientX - this._downX) > 3) return;
    const u = this.plot;
    if (this.group.x !== null) {
      this.group.set(null);
      return;
    }
    const idx = u.cursor.idx;
    if (idx === null || idx === undefined) return;
    this.group.set(u.data[0][idx]);
  }

  // Keep a pinned cursor on its x value through redraws, and lock it so hovering does not move it.
  // uPlot has no public lock setter; `cursor._lock` is what its own `cursor.lock` click toggles.
  _applyPin() {
    const u = this.plot;
    if (!u) return;
    const x = this.group.x;
    if (x === null) {
      if (u.cursor._lock) {
        u.cursor._lock = false;
        this.element.classList.remove("pinned");
        u.setCursor({ left: -10, top: -10 }, true, false);
      }
      return;
    }
    u.cursor._lock = true;
    this.element.classList.add("pinned");
    const left = u.valToPos(x, "x");
    u.setCursor({ left, top: u.over.clientHeight / 2 }, true, false);
  }

  /** Show the tooltip of the values under the cursor, when the mouse is over this chart. */
  _updateReadout() {
    const u = this.plot;
    if (!u) return;
    const idx = u.cursor.idx;
    if (!this._hover || idx === null || idx === undefined || !u.data[0].length || u.cursor.left < 0) {
      hideTooltip(this);
      return;
    }
    // The source's own lookup reads the received points (not the downsampled ones drawn), at the
    // cursor's x itself, so every chart of a group reports the same step.
    const cursorX = this.group.x ?? u.posToVal(u.cursor.left, "x");
    const found = this.lookup?.(cursorX) ?? null;
    const x = found ? found.x : u.data[0][idx];
    const values = found
      ? found.values
      : this._lines.flatMap((line, i) => (line.legend === false ? [] : [{ label: line.legendText ?? line.label, color: line.color, value: nearest(u.data[i + 1], idx) }]));
    const both = values.some((v) => v.raw !== undefined && v.smoothed !== undefined);
    // A lookup may name its own columns (`head`) and give each row its `cells` (numbers formatted
    // here, text as it is): a group's mean and its band.
    const head = found?.head ?? null;
    const cellsOf = (v) =>
      head ? v.cells.map((c) => (typeof c === "number" ? this.formatY(c) : c)) : both ? [this.formatY(v.smoothed), this.formatY(v.raw)] : [this.formatY(v.value)];
    const rows = sortRows(values).map((v) => ({ ...v, cells: cellsOf(v) }));
    const title = this._formatX(x) + (this.group.x !== null ? ` · ${t("pinned")}` : "");
    showTooltip(this, this._pointer, title, rows, head ?? (both ? [t("smoothed"), t("raw")] : []));
  }

  _formatX(x) {
    if (this.xKind === "wall") return new Date(x * 1000).toLocaleString();
    if (this.xKind === "relative") return formatDuration(x);
    if (this.xKind === "value") return `${this.xLabel} ${formatValue(x)}`;
    return `${t("step")} ${x}`;
  }

  _onResize(width, height) {
    this._width = width;
    if (this.fullscreen && height > 0 && Math.abs(height - this._height) > 1) this._setHeight(Math.max(HEIGHT, Math.floor(height)));
    if (!this.plot) return;
    const w = this.width;
    if (Math.abs(w - this.plot.width) > 1) {
      this.plot.setSize({ width: w, height: this._height });
      this.onChange?.();
    }
  }

  _setHeight(h) {
    if (h === this._height) return;
    this._height = h;
    this._signature = ""; // the y title is cut to the height
    this.onChange?.();
  }
}

// What identifies a line's uPlot series: a line whose key changes is removed and added anew.
function seriesKey(l) {
  return `${l.label}\u0000${l.color}\u0000${l.alpha ?? 1}\u0000${l.width ?? 1.5}\u0000${l.dash ?? ""}\u0000${l.legendText ?? ""}`;
}

// uPlot series options of a line. uPlot's default points: dots only where points are sparse
// enough to tell apart.
function seriesOptions(l) {
  return {
    label: l.label,
    stroke: l.color,
    width: l.width ?? 1.5,
    alpha: l.alpha ?? 1,
    spanGaps: true,
    ...(l.dash?.length ? { dash: l.dash } : {}),
  };
}

function dashIndex(dash) {
  if (!dash?.length) return 0;
  const i = DASHES.findIndex((d) => d.join() === dash.join());
  return i < 0 ? 1 : i;
}

// uPlot axis size: room for the widest tick label (each line of a two-line one), its tick and gap.
// uPlot calls it again with the labels of each layout pass; past the second it keeps its answer.
function fitAxis(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1 && axis._size) return axis._size;
  let widest = 0;
  if (values) {
    u.ctx.save();
    u.ctx.font = axis.font?.[0] ?? AXIS_FONT;
    for (const v of values) for (const line of String(v ?? "").split("\n")) widest = Math.max(widest, u.ctx.measureText(line).width);
    u.ctx.restore();
    widest /= uPlot.pxRatio || 1;
  }
  return Math.ceil(Math.max(32, widest + (axis.ticks?.size ?? 10) + (axis.gap ?? 5) + 6));
}

// The value at idx, or the nearest defined one within a few rows (runs logged at different steps
// leave holes in joined data).
function nearest(ys, idx) {
  if (!ys) return null;
  for (let d = 0; d < 64; d++) {
    const a = ys[idx - d];
    if (a !== undefined && a !== null) return a;
    const b = ys[idx + d];
    if (b !== undefined && b !== null) return b;
  }
  return null;
}

/**
 * Build uPlot's aligned data `[xs, ...ys]` from lines: lines sharing an `xs` form one table; more
 * than one table (runs at different steps) are joined on x. Non-finite values, and values <= 0 on
 * a log scale, become null gaps (ys that already hold nulls for gaps, as align.js makes them, are
 * taken as they are).
 * @param {object[]} lines
 * @param {boolean} logY
 */
export function alignedData(lines, logY) {
  if (lines.length === 0) return [[]];
  const tables = new Map();
  for (const line of lines) {
    if (!tables.has(line.xs)) tables.set(line.xs, [line.xs]);
    tables.get(line.xs).push(cleanYs(line.ys, logY));
  }
  const list = [...tables.values()];
  if (list.length === 1 && ascending(list[0][0])) return list[0];
  return uPlot.join(list);
}

function cleanYs(ys, logY) {
  let ok = true;
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (v !== null && (!Number.isFinite(v) || (logY && v <= 0))) {
      ok = false;
      break;
    }
  }
  if (ok) return ys;
  return Array.from(ys, (v) => (Number.isFinite(v) && !(logY && v <= 0) ? v : null));
}

// The x range: the data's own, except around a lone point, which gets `pad` on each side.
function singlePointRange(u, min, max, pad) {
  const xs = u.data[0];
  if (xs.length === 1 || min === max) {
    const x = xs.length ? xs[0] : min;
    return [x - pad, x + pad];
  }
  return [min, max];
}

function isPowerOfTen(v) {
  if (!(v > 0)) return false;
  const e = Math.log10(v);
  return Math.abs(e - Math.round(e)) < 1e-9;
}

function ascending(xs) {
  for (let i = 1; i < xs.length; i++) if (!(xs[i] > xs[i - 1])) return false;
  return true;
}
