// "Export report": the chosen views as a PDF (the browser's print, with print CSS: every chart
// drawn, a head with the runs, their colors, the smoothing and the time of export) or as one PNG
// (the charts' canvases composed onto one canvas under the same head). Nothing is fetched.
import { chartFor } from "./chart.js";
import { colorFor, el } from "./dom.js";
import { language, t, tf } from "./i18n.js";

/** Width of the composed PNG (CSS pixels; drawn at the device pixel ratio) and its columns. */
const PNG_WIDTH = 1200;
const PNG_COLUMNS = 2;
const PAD = 16;
const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "PingFang SC", "Noto Sans CJK SC", sans-serif';

/**
 * A file-name stamp for a time: `20261130-142501` (local time).
 * @param {Date} date
 */
export function stamp(date) {
  const p = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}${p(date.getMonth() + 1)}${p(date.getDate())}-${p(date.getHours())}${p(date.getMinutes())}${p(date.getSeconds())}`;
}

/**
 * Lay out `count` boxes in `columns` columns of `width`: the top-left of each box and the total
 * height, given each box's height (rows are as tall as their tallest box).
 * @param {number[]} heights
 * @param {number} columns
 * @param {number} width column width
 * @param {number} gap
 * @returns {{positions: {x: number, y: number}[], height: number}}
 */
export function gridLayout(heights, columns, width, gap) {
  const positions = [];
  let y = 0;
  for (let i = 0; i < heights.length; i += columns) {
    const row = heights.slice(i, i + columns);
    row.forEach((_, j) => positions.push({ x: j * (width + gap), y }));
    y += Math.max(...row) + gap;
  }
  return { positions, height: Math.max(0, y - gap) };
}

export class Report {
  /**
   * @param {object} ctx shared page context: `store`, `state`, `scheduler`
   * @param {Record<string, {element: HTMLElement}>} views by name, in page order
   */
  constructor(ctx, views) {
    this.ctx = ctx;
    this.views = views;
    this.checks = new Map();
    this.list = el("div", { class: "report-views" });
    this.heading = el("h2");
    this.pdfBtn = el("button", { type: "button", class: "report-pdf", on: { click: () => this.print(this.chosen()) } });
    this.pngBtn = el("button", { type: "button", class: "report-png", on: { click: () => this.savePng(this.chosen()) } });
    this.closeBtn = el("button", { type: "button", class: "report-close", on: { click: () => this.close() } });
    this.message = el("p", { class: "report-msg", role: "status" });
    this.panel = el("div", { class: "report-panel", role: "dialog", hidden: true }, this.heading, this.list, el("div", { class: "row" }, this.pdfBtn, this.pngBtn, this.closeBtn), this.message);
    /** The head shown above the views while printing (and only then). */
    this.head = el("section", { class: "report-head", hidden: true });
    this._afterPrint = () => this.finishPrint();
    this.relabel();
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.heading.textContent = t("reportViews");
    this.pdfBtn.textContent = t("reportPdf");
    this.pngBtn.textContent = t("reportPng");
    this.closeBtn.textContent = t("reportClose");
    for (const [name, { text }] of this.checks) text.textContent = t(name);
  }

  /** Show the panel, with the views that are shown and not empty ticked. */
  open() {
    this.message.textContent = "";
    this.list.replaceChildren(
      ...Object.entries(this.views).map(([name, view]) => {
        const input = el("input", { type: "checkbox", value: name, checked: !view.element.hidden && this._sections(name).length > 0 });
        const text = el("span", { text: t(name) });
        this.checks.set(name, { input, text });
        return el("label", { class: "check", dataset: { view: name } }, input, text);
      }),
    );
    this.panel.hidden = false;
  }

  /** Hide the panel. */
  close() {
    this.panel.hidden = true;
  }

  /** The names of the views ticked in the panel. */
  chosen() {
    return [...this.checks].filter(([, c]) => c.input.checked).map(([name]) => name);
  }

  /**
   * What the report says about the page: title, time, smoothing, x axis and the runs shown.
   * @returns {{title: string, exported: Date, smoothing: number, xKind: string, runs: {name: string, color: string}[]}}
   */
  meta() {
    const { store, state } = this.ctx;
    const names = [...new Set([...(store.announced ?? []), ...store.runNames()])].sort();
    return {
      title: t("reportTitle"),
      exported: new Date(),
      smoothing: state.smoothing,
      xKind: state.xKind,
      runs: names.filter((n) => !state.hiddenRuns.has(n)).map((name) => ({ name, color: colorFor(name) })),
    };
  }

  /**
   * Get the page ready to print the views `names` (print CSS hides everything else): every chart
   * drawn, the report head filled in. `finishPrint()` undoes it (the `afterprint` event calls it).
   * @param {string[]} names
   * @returns {object} the meta shown in the head
   */
  preparePrint(names) {
    this._checkNames(names);
    const meta = this.meta();
    for (const [name, view] of Object.entries(this.views)) {
      if (names.includes(name)) {
        view.element.dataset.report = "";
        view.element.dataset.wasHidden = String(view.element.hidden);
        view.element.hidden = false;
      } else delete view.element.dataset.report;
    }
    this.head.replaceChildren(
      el("h1", { text: meta.title }),
      el("p", { class: "report-meta", text: [tf("reportExported", { time: meta.exported.toLocaleString(language() === "zh" ? "zh-CN" : "en") }), tf("reportSmoothing", { w: meta.smoothing.toFixed(2) }), tf("reportXAxis", { x: xName(meta.xKind) })].join(" · ") }),
      el(
        "ul",
        { class: "report-runs" },
        ...meta.runs.map((r) => el("li", { dataset: { run: r.name } }, el("i", { class: "swatch", style: { background: r.color } }), r.name)),
      ),
    );
    this.head.hidden = false;
    document.body.classList.add("report-print");
    this.ctx.scheduler.drawAll();
    return meta;
  }

  /** Undo preparePrint. */
  finishPrint() {
    document.body.classList.remove("report-print");
    this.head.hidden = true;
    for (const view of Object.values(this.views)) {
      if ("report" in view.element.dataset && view.element.dataset.wasHidden === "true") view.element.hidden = true;
      delete view.element.dataset.report;
      delete view.element.dataset.wasHidden;
    }
  }

  /** Print the views `names` with the browser's print dialog (save as PDF there). */
  print(names) {
    this.preparePrint(names);
    window.addEventListener("afterprint", this._afterPrint, { once: true });
    this.close();
    window.print();
  }

  /**
   * Compose the views `names` onto one canvas: the head (title, time, smoothing, runs in their
   * colors), then each view's title and its charts, two to a row.
   * @param {string[]} names
   * @returns {HTMLCanvasElement}
   */
  canvas(names) {
    this._checkNames(names);
    this.ctx.scheduler.drawAll();
    const meta = this.meta();
    const ratio = globalThis.devicePixelRatio || 1;
    const style = getComputedStyle(document.body);
    const bg = style.backgroundColor || "#fff";
    const fg = style.color || "#000";
    const colW = (PNG_WIDTH - PAD * (PNG_COLUMNS + 1)) / PNG_COLUMNS;
    const blocks = [];
    for (const name of names) {
      const images = this._sections(name)
        .map((section) => snapshotOf(section))
        .filter(Boolean);
      if (!images.length) continue;
      const heights = images.map((c) => (c.height / c.width) * colW);
      blocks.push({ title: t(name), images, heights, grid: gridLayout(heights, PNG_COLUMNS, colW, PAD) });
    }
    const runRows = Math.ceil(meta.runs.length / 4);
    const headH = 40 + 22 + runRows * 20 + PAD;
    const bodyH = blocks.reduce((h, b) => h + 30 + b.grid.height + PAD, 0);
    const canvas = document.createElement("canvas");
    canvas.width = Math.round(PNG_WIDTH * ratio);
    canvas.height = Math.round((headH + Math.max(bodyH, 30) + PAD) * ratio);
    const c = canvas.getContext("2d");
    c.scale(ratio, ratio);
    c.fillStyle = bg;
    c.fillRect(0, 0, PNG_WIDTH, canvas.height / ratio);
    c.fillStyle = fg;
    c.textBaseline = "alphabetic";
    c.font = `600 20px ${FONT}`;
    c.fillText(meta.title, PAD, 30);
    c.font = `13px ${FONT}`;
    c.fillText(
      [tf("reportExported", { time: meta.exported.toLocaleString(language() === "zh" ? "zh-CN" : "en") }), tf("reportSmoothing", { w: meta.smoothing.toFixed(2) }), tf("reportXAxis", { x: xName(meta.xKind) })].join(" · "),
      PAD,
      52,
    );
    const runW = (PNG_WIDTH - 2 * PAD) / 4;
    meta.runs.forEach((r, i) => {
      const x = PAD + (i % 4) * runW;
      const y = 62 + Math.floor(i / 4) * 20;
      c.fillStyle = r.color;
      c.fillRect(x, y + 3, 12, 12);
      c.fillStyle = fg;
      c.fillText(r.name, x + 18, y + 14, runW - 24);
    });
    let y = headH;
    if (!blocks.length) {
      c.fillText(t("reportEmpty"), PAD, y + 20);
    }
    for (const b of blocks) {
      c.fillStyle = fg;
      c.font = `600 16px ${FONT}`;
      c.fillText(b.title, PAD, y + 20);
      y += 30;
      b.images.forEach((img, i) => {
        const p = b.grid.positions[i];
        c.drawImage(img, PAD + p.x, y + p.y, colW, b.heights[i]);
      });
      y += b.grid.height + PAD;
    }
    return canvas;
  }

  /** Download the PNG report as `vdl-stream-report-<time>.png`. */
  savePng(names) {
    const canvas = this.canvas(names);
    const a = el("a", { download: `vdl-stream-report-${stamp(new Date())}.png`, href: canvas.toDataURL("image/png") });
    document.body.append(a);
    a.click();
    a.remove();
    this.close();
  }

  /** The `window.vdl.report` hook (docs/dashboard.md). */
  hook() {
    return {
      open: () => this.open(),
      meta: () => this.meta(),
      preparePrint: (names) => this.preparePrint(names),
      finishPrint: () => this.finishPrint(),
      /** The PNG report of `names` as `{dataUrl, width, height}` (device pixels). */
      png: (names) => {
        const canvas = this.canvas(names);
        return { dataUrl: canvas.toDataURL("image/png"), width: canvas.width, height: canvas.height };
      },
    };
  }

  _checkNames(names) {
    if (!Array.isArray(names)) throw new TypeError(`names must be an array of view names, got ${names}`);
    for (const name of names) {
      if (!(name in this.views)) throw new RangeError(`view must be one of ${Object.keys(this.views).join(", ")}, got ${JSON.stringify(name)}`);
    }
  }

  // The chart cards of a view that are not hidden, in page order.
  _sections(name) {
    return [...this.views[name].element.querySelectorAll("section.chart")].filter((s) => !s.hidden && !s.closest("[hidden]"));
  }
}

function xName(xKind) {
  return t(xKind === "wall" ? "xWall" : xKind === "relative" ? "xRelative" : "xStep");
}

// One card as a canvas: a uPlot chart's own snapshot, or the card's title over its canvas or image.
function snapshotOf(section) {
  const chart = chartFor(section);
  if (chart) return chart.snapshot();
  const media = section.querySelector("canvas, img");
  if (!media || !(media.width > 0)) return null;
  const ratio = globalThis.devicePixelRatio || 1;
  const w = media instanceof HTMLCanvasElement ? media.width : media.naturalWidth;
  const h = media instanceof HTMLCanvasElement ? media.height : media.naturalHeight;
  if (!(w > 0 && h > 0)) return null;
  const width = Math.max(w, Math.round(300 * ratio));
  const scale = width / w;
  const pad = Math.round(28 * ratio);
  const out = document.createElement("canvas");
  out.width = width;
  out.height = Math.round(h * scale) + pad;
  const c = out.getContext("2d");
  const style = getComputedStyle(section);
  c.fillStyle = style.backgroundColor || "#fff";
  c.fillRect(0, 0, out.width, out.height);
  c.fillStyle = style.color || "#000";
  c.font = `600 ${Math.round(14 * ratio)}px ${FONT}`;
  const title = section.querySelector(".chart-title")?.getAttribute("title") ?? "";
  c.fillText(title, 8 * ratio, 19 * ratio, out.width - 16 * ratio);
  try {
    c.drawImage(media, 0, pad, out.width, out.height - pad);
  } catch {
    return null; // an image that cannot be drawn (not decoded): left out
  }
  return out;
}
