// A uPlot chart that pulls its lines from a source callback when the frame scheduler says so.
// It owns the uPlot instance (rebuilt only when the set of lines changes), drag-to-zoom with a reset,
// the value readout under the cursor, click-to-pin shared with its sync group, and PNG export.
import uPlot from "uplot";
import { el, fileName } from "./dom.js";
import { t } from "./i18n.js";

const HEIGHT = 220;

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
   * @param {[number, number]} [opts.yRange] fixed y range instead of auto
   * @param {(x: number) => ({x: number, values: {label: string, color: string, value: number}[]}|null)} [opts.lookup]
   *   the values to read out at an x (default: the drawn points nearest the cursor)
   * @param {boolean} [opts.logY]
   * @param {(v: number) => string} [opts.formatY] y tick and readout format
   * @param {object} [opts.dataset] data attributes of the chart element (default `{tag: key}`)
   *
   * A Line is `{label, color, xs, ys, alpha?, width?, legend?}`; lines with the same `xs` object
   * share x values (uPlot's aligned data); others are joined.
   */
  constructor({ key, title, source, syncKey, group, xKind = "step", logY = false, formatY = formatValue, dataset = { tag: key }, xLabel = "", yRange = null, lookup = null }) {
    this.key = key;
    this.source = source;
    this.syncKey = syncKey;
    this.group = group;
    this.xKind = xKind;
    this.logY = logY;
    this.formatY = formatY;
    this.xLabel = xLabel;
    this.yRange = yRange;
    this.lookup = lookup;
    /** Visible x range after a drag zoom, or null for everything. */
    this.zoom = null;
    /** @type {uPlot|null} */
    this.plot = null;
    this.renders = 0;
    this._signature = "";
    this._lines = [];
    this._downX = null;

    this.plotBox = el("div", { class: "plot" });
    this.readout = el("div", { class: "readout" });
    this.titleEl = el("span", { class: "chart-title", text: title, title });
    this.resetBtn = el("button", { class: "icon", type: "button", title: t("reset"), text: "⤢", on: { click: () => this.group.resetZoom() } });
    this.pngBtn = el("button", { class: "icon", type: "button", title: t("savePng"), text: "PNG", on: { click: () => this.savePng() } });
    this.element = el(
      "section",
      { class: "chart", dataset, "aria-label": title },
      el("header", {}, this.titleEl, el("span", { class: "chart-tools" }, this.resetBtn, this.pngBtn)),
      this.plotBox,
      this.readout,
    );
    this.resetBtn.hidden = true;
    group.charts.add(this);
    this._resize = new ResizeObserver((entries) => this._onResize(entries[entries.length - 1].contentRect.width));
    this._resize.observe(this.plotBox);
  }

  /**
   * Pixel columns available for data: what downsampling aims for. Taken from the ResizeObserver,
   * so that drawing one chart after another never forces a layout in between.
   */
  get width() {
    if (this._width === undefined) this._width = this.plotBox.clientWidth;
    return Math.max(50, Math.round(this._width || 600));
  }

  /** Pull lines from the source and draw them (called by the frame scheduler). */
  render() {
    const lines = this.source(this);
    this._lines = lines;
    const signature = `${this.xKind}|${this.logY}|` + lines.map((l) => `${l.label}\u0000${l.color}\u0000${l.alpha ?? 1}`).join("\u0001");
    const data = alignedData(lines, this.logY);
    if (!this.plot || signature !== this._signature) {
      this._signature = signature;
      this._build(lines, data);
    } else {
      this.plot.setData(data, this.zoom === null);
    }
    if (this.zoom) this.plot.setScale("x", { min: this.zoom[0], max: this.zoom[1] });
    this._applyPin();
    this._updateReadout();
    this.renders++;
  }

  /** Undo a drag zoom of this chart only (see SyncGroup.resetZoom for the whole group). */
  resetZoom() {
    if (this.zoom === null) return;
    this.zoom = null;
    this.resetBtn.hidden = true;
    this.onChange?.();
  }

  /** Download the chart (title and plot) as a PNG file named after its tag. */
  savePng() {
    if (!this.plot) return;
    const src = this.plot.ctx.canvas;
    const ratio = src.width / this.plot.width || 1;
    const pad = Math.round(28 * ratio);
    const canvas = document.createElement("canvas");
    canvas.width = src.width;
    canvas.height = src.height + pad;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = getComputedStyle(this.element).backgroundColor || "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.fillStyle = getComputedStyle(this.element).color || "#000";
    ctx.font = `${Math.round(14 * ratio)}px system-ui, sans-serif`;
    ctx.fillText(this.titleEl.textContent, 8 * ratio, 19 * ratio);
    ctx.drawImage(src, 0, pad);
    const a = el("a", { download: fileName(this.key, "png"), href: canvas.toDataURL("image/png") });
    document.body.append(a);
    a.click();
    a.remove();
  }

  /** Remove the chart and its observers. */
  destroy() {
    this._resize.disconnect();
    this.group.charts.delete(this);
    this.plot?.destroy();
    this.plot = null;
    this.element.remove();
  }

  /** Set the title text (for language switches). */
  setTitle(title) {
    this.titleEl.textContent = title;
    this.titleEl.title = title;
  }

  _build(lines, data) {
    this.plot?.destroy();
    const xKind = this.xKind;
    const formatY = this.formatY;
    const opts = {
      width: this.width,
      height: HEIGHT,
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
        x: { time: xKind === "wall", range: (u, min, max) => singlePointRange(u, min, max, xKind === "step" ? 1 : 30) },
        y: this.logY ? { distr: 3 } : this.yRange ? { auto: false, range: this.yRange } : {},
      },
      axes: [
        {
          stroke: "var(--muted)",
          grid: { stroke: "rgba(128,128,128,0.15)" },
          ticks: { stroke: "rgba(128,128,128,0.3)" },
          ...(xKind === "relative" ? { values: (u, ticks) => ticks.map(formatDuration) } : {}),
          // Date-time labels are wide and two lines high; others need one short line.
          ...(xKind === "wall" ? { space: 90, size: 48 } : { space: 64, size: 32 }),
        },
        {
          stroke: "var(--muted)",
          grid: { stroke: "rgba(128,128,128,0.15)" },
          ticks: { stroke: "rgba(128,128,128,0.3)" },
          size: 64,
          // On a log scale uPlot puts ticks at 1..9 x 10^k; label the powers of ten only.
          values: this.logY ? (u, ticks) => ticks.map((v) => (isPowerOfTen(v) ? formatY(v) : "")) : (u, ticks) => ticks.map(formatY),
        },
      ],
      series: [
        { label: "x" },
        ...lines.map((l) => ({
          label: l.label,
          stroke: l.color,
          width: l.width ?? 1.5,
          alpha: l.alpha ?? 1,
          spanGaps: true,
          // uPlot's default: dots only where points are sparse enough to tell apart.
        })),
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
    this.plot.over.addEventListener("mousedown", (e) => (this._downX = e.clientX));
    this.plot.over.addEventListener("click", (e) => this._onClick(e));
    this.plot.over.addEventListener("dblclick", () => this.group.resetZoom());
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

  _updateReadout() {
    const u = this.plot;
    if (!u) return;
    const idx = u.cursor.idx;
    if ((idx === null || idx === undefined) && !this.readout.firstChild) return; // nothing shown, nothing to show
    const parts = [];
    if (idx !== null && idx !== undefined && u.data[0].length) {
      // The source's own lookup reads the received points (not the downsampled ones drawn), at the
      // cursor's x itself, so every chart of a group reports the same step.
      const cursorX = this.group.x ?? u.posToVal(u.cursor.left, "x");
      const found = this.lookup?.(cursorX) ?? null;
      const x = found ? found.x : u.data[0][idx];
      const values = found
        ? found.values
        : this._lines.flatMap((line, i) => (line.legend === false ? [] : [{ label: line.label, color: line.color, value: nearest(u.data[i + 1], idx) }]));
      parts.push(el("span", { class: "rx", text: this._formatX(x) }));
      for (const { label, color, value } of values) {
        parts.push(el("span", { class: "rv" }, el("i", { style: { background: color } }), `${label} ${this.formatY(value)}`));
      }
      if (this.group.x !== null) parts.push(el("span", { class: "rpin", text: t("pinned") }));
    }
    this.readout.replaceChildren(...parts);
  }

  _formatX(x) {
    if (this.xKind === "wall") return new Date(x * 1000).toLocaleString();
    if (this.xKind === "relative") return formatDuration(x);
    if (this.xKind === "value") return `${this.xLabel} ${formatValue(x)}`;
    return `${t("step")} ${x}`;
  }

  _onResize(width) {
    this._width = width;
    if (!this.plot) return;
    const w = this.width;
    if (Math.abs(w - this.plot.width) > 1) {
      this.plot.setSize({ width: w, height: HEIGHT });
      this.onChange?.();
    }
  }
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
 * a log scale, become null gaps.
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
    if (!Number.isFinite(v) || (logY && v <= 0)) {
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
