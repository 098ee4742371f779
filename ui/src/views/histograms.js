// The histograms view: one card per (tag, run) showing the distribution over steps, as a
// ridgeline or a heatmap (a switch at the top of the view), redrawn live through the scheduler.
import { formatValue } from "../chart.js";
import { histogramSeries, saveText, seriesCsv, seriesJson } from "../chartdata.js";
import { colorFor, el, fileName, insertSorted } from "../dom.js";
import { drawHistograms } from "../histogram.js";
import { t } from "../i18n.js";
import { hideTooltip, showTooltip } from "../tooltip.js";

export class HistogramsView {
  /** @param {object} ctx shared page context: `store`, `scheduler`, `state` */
  constructor(ctx) {
    this.ctx = ctx;
    this.mode = "ridgeline";
    /** @type {Map<string, object>} `${tag}\u0000${run}` -> card */
    this.cards = new Map();
    this.modeButtons = ["ridgeline", "heatmap"].map((mode) =>
      el("button", { type: "button", dataset: { mode }, on: { click: () => this.setMode(mode) } }),
    );
    this.empty = el("p", { class: "empty" });
    this.grid = el("div", { class: "grid" });
    this.element = el("div", { class: "view histograms" }, el("div", { class: "toolbar" }, ...this.modeButtons), this.empty, this.grid);
    ctx.store.subscribe((change) => {
      if (change.kind === "histogram") this._touch(change.run);
    }, { current: true });
    this.relabel();
  }

  /** Switch between "ridgeline" and "heatmap". */
  setMode(mode) {
    this.mode = mode;
    for (const b of this.modeButtons) b.classList.toggle("active", b.dataset.mode === mode);
    for (const card of this.cards.values()) this.ctx.scheduler.mark(card);
  }

  /** Apply the run toggles and the tag filter (hidden cards are not drawn either). */
  refresh() {
    for (const card of this.cards.values()) {
      card.element.hidden = !this.ctx.shown(card.run, card.tag);
      this.ctx.scheduler.mark(card);
    }
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    for (const b of this.modeButtons) {
      b.textContent = t(b.dataset.mode);
      b.classList.toggle("active", b.dataset.mode === this.mode);
    }
    this.empty.textContent = t("noHist");
    for (const card of this.cards.values()) for (const b of card.element.querySelectorAll("button[data-tip]")) b.title = t(b.dataset.tip);
    this.empty.hidden = this.cards.size > 0;
  }

  _touch(runName) {
    const run = this.ctx.store.runs.get(runName);
    if (!run) return;
    for (const tag of run.histograms.keys()) {
      const key = `${tag}\u0000${runName}`;
      let card = this.cards.get(key);
      if (!card) card = this._create(tag, runName, key);
      this.ctx.scheduler.mark(card);
    }
    // A snapshot may have emptied the run: redraw its cards too.
    for (const card of this.cards.values()) if (card.run === runName) this.ctx.scheduler.mark(card);
  }

  _create(tag, run, key) {
    const canvas = el("canvas", { class: "hist-canvas" });
    const png = el("button", { class: "icon dl-png", type: "button", text: "PNG", title: t("savePng"), dataset: { tip: "savePng" }, on: { click: () => savePng(canvas, tag) } });
    // Every histogram held for this run and tag, one row per bucket.
    const data = () => [histogramSeries(run, this.ctx.store.runs.get(run)?.histograms.get(tag) ?? [])];
    const csv = el("button", { class: "icon dl-csv", type: "button", text: "CSV", title: t("saveCsv"), dataset: { tip: "saveCsv" }, on: { click: () => saveText(fileName(`${tag}_${run}`, "csv"), "text/csv", seriesCsv(data())) } });
    const json = el("button", {
      class: "icon dl-json",
      type: "button",
      text: "JSON",
      title: t("saveJson"), dataset: { tip: "saveJson" },
      on: { click: () => saveText(fileName(`${tag}_${run}`, "json"), "application/json", seriesJson({ chart: tag, run, kind: "histogram", exported: new Date().toISOString() }, data())) },
    });
    const element = el(
      "section",
      { class: "chart hist", dataset: { histTag: tag, run } },
      el("header", {}, el("i", { class: "swatch", style: { background: colorFor(run) } }), el("span", { class: "chart-title", text: tag, title: `${tag} — ${run}` }), el("span", { class: "run-label", text: run }), el("span", { class: "chart-tools" }, csv, json, png)),
      canvas,
    );
    const card = {
      element,
      run,
      tag,
      info: null,
      render: () => {
        const hists = this.ctx.store.runs.get(run)?.histograms.get(tag) ?? [];
        card.info = drawHistograms(canvas, hists, {
          mode: this.mode,
          color: colorFor(run),
          fg: getComputedStyle(element).color,
          format: formatValue,
          countLabel: t("countScale"),
        });
      },
    };
    // The step and value under the pointer, in the page's floating tooltip (no layout change).
    canvas.addEventListener("mousemove", (e) => {
      const info = card.info;
      if (!info || info.shown.length === 0) return;
      const r = canvas.getBoundingClientRect();
      const x = e.clientX - r.left;
      const y = e.clientY - r.top;
      const h = info.shown[pickHistogram(info, x, y)];
      const v = info.mode === "heatmap" ? info.hi - ((y - info.plot.top) / info.plot.height) * (info.hi - info.lo) : info.lo + ((x - info.plot.left) / info.plot.width) * (info.hi - info.lo);
      showTooltip(card, e, `${t("step")} ${h.step}`, [{ label: run, color: colorFor(run), value: v, cells: [formatValue(v)] }]);
    });
    canvas.addEventListener("mouseleave", () => hideTooltip(card));
    this.cards.set(key, card);
    insertSorted(this.grid, this.cards, key, element);
    element.hidden = !this.ctx.shown(run, tag);
    this.ctx.scheduler.observe(card);
    this.empty.hidden = true;
    return card;
  }
}

/**
 * The index (into `info.shown`) of the histogram under a point of the canvas: the heatmap column
 * containing x, or the ridge whose baseline is the first at or below y.
 * @param {{mode: string, shown: object[], bases?: number[], edges?: number[]}} info from drawHistograms
 * @param {number} x CSS pixels from the canvas's left
 * @param {number} y CSS pixels from its top
 */
export function pickHistogram(info, x, y) {
  const n = info.shown.length;
  if (info.mode === "heatmap" && info.edges) {
    for (let i = 0; i < n; i++) if (x < info.edges[i + 1]) return i;
    return n - 1;
  }
  const bases = info.bases ?? [];
  for (let i = 0; i < bases.length; i++) if (bases[i] >= y) return i;
  return n - 1;
}

function savePng(canvas, tag) {
  const a = el("a", { download: fileName(tag, "png"), href: canvas.toDataURL("image/png") });
  document.body.append(a);
  a.click();
  a.remove();
}
