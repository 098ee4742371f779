// The histograms view: one card per (tag, run) showing the distribution over steps, as a
// ridgeline or a heatmap (a switch at the top of the view), redrawn live through the scheduler.
import { formatValue } from "../chart.js";
import { clear, colorFor, el, fileName, insertSorted } from "../dom.js";
import { drawHistograms } from "../histogram.js";
import { t } from "../i18n.js";

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
    });
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
    const readout = el("div", { class: "readout" });
    const png = el("button", { class: "icon", type: "button", text: "PNG", on: { click: () => savePng(canvas, tag) } });
    const element = el(
      "section",
      { class: "chart hist", dataset: { histTag: tag, run } },
      el("header", {}, el("i", { class: "swatch", style: { background: colorFor(run) } }), el("span", { class: "chart-title", text: tag, title: `${tag} — ${run}` }), el("span", { class: "run-label", text: run }), png),
      canvas,
      readout,
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
        });
      },
    };
    canvas.addEventListener("mousemove", (e) => {
      const info = card.info;
      if (!info || info.shown.length === 0) return;
      const r = canvas.getBoundingClientRect();
      const x = e.clientX - r.left - info.plot.left;
      const y = e.clientY - r.top - info.plot.top;
      let h;
      if (info.mode === "heatmap") {
        h = info.shown[Math.min(info.shown.length - 1, Math.max(0, Math.floor((x / info.plot.width) * info.shown.length)))];
        const v = info.hi - (y / info.plot.height) * (info.hi - info.lo);
        readout.textContent = `${t("step")} ${h.step} · ${formatValue(v)}`;
      } else {
        const n = info.shown.length;
        const i = n === 1 ? 0 : Math.round(((y - info.plot.height / 3) / (info.plot.height * (2 / 3))) * (n - 1));
        h = info.shown[Math.min(n - 1, Math.max(0, i))];
        const v = info.lo + (x / info.plot.width) * (info.hi - info.lo);
        readout.textContent = `${t("step")} ${h.step} · ${formatValue(v)}`;
      }
    });
    canvas.addEventListener("mouseleave", () => clear(readout));
    this.cards.set(key, card);
    insertSorted(this.grid, this.cards, key, element);
    element.hidden = !this.ctx.shown(run, tag);
    this.ctx.scheduler.observe(card);
    this.empty.hidden = true;
    return card;
  }
}

function savePng(canvas, tag) {
  const a = el("a", { download: fileName(tag, "png"), href: canvas.toDataURL("image/png") });
  document.body.append(a);
  a.click();
  a.remove();
}
