// The curves view: PR curves (precision over recall) and ROC curves (true over false positive
// rate), one chart per kind and tag, runs overlaid, with a step slider that follows the newest step
// until moved back.
import { Chart } from "../chart.js";
import { colorFor, el, insertSorted } from "../dom.js";
import { t } from "../i18n.js";

const KINDS = {
  pr_curve: { list: "prCurves", x: "recall", y: "precision", title: "PR" },
  roc_curve: { list: "rocCurves", x: "fpr", y: "tpr", title: "ROC" },
};

/**
 * The points of a curve event as ascending x with matching y (the event's columns run by
 * threshold, along which recall and FPR fall).
 * @param {object} ev a decoded pr_curve or roc_curve event
 * @returns {{xs: Float64Array, ys: Float64Array}}
 */
export function curvePoints(ev) {
  const spec = KINDS[ev.kind];
  const x = ev[spec.x];
  const y = ev[spec.y];
  const order = Array.from(x.keys()).sort((a, b) => x[a] - x[b] || y[b] - y[a]);
  return { xs: Float64Array.from(order, (i) => x[i]), ys: Float64Array.from(order, (i) => y[i]) };
}

export class CurvesView {
  /** @param {object} ctx shared page context: `store`, `scheduler`, `state`, `syncGroup(key)` */
  constructor(ctx) {
    this.ctx = ctx;
    this.cards = new Map();
    this.empty = el("p", { class: "empty", text: t("noCurves") });
    this.grid = el("div", { class: "grid" });
    this.element = el("div", { class: "view curves" }, this.empty, this.grid);
    ctx.store.subscribe((change) => {
      if (!(change.kind in KINDS)) return;
      const run = ctx.store.runs.get(change.run);
      if (!run) return;
      for (const tag of run[KINDS[change.kind].list].keys()) this._card(change.kind, tag);
      for (const card of this.cards.values()) ctx.scheduler.mark(card.chart);
    });
  }

  /** Apply the run toggles and the tag filter. */
  refresh() {
    for (const card of this.cards.values()) {
      card.chart.element.hidden = !this.ctx.shown(null, card.tag);
      this.ctx.scheduler.mark(card.chart);
    }
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noCurves");
    for (const card of this.cards.values()) this.ctx.scheduler.mark(card.chart);
  }

  // Every step logged for this curve by a visible run, ascending.
  _steps(kind, tag) {
    const { store, state } = this.ctx;
    const steps = new Set();
    for (const name of store.runNames()) {
      if (state.hiddenRuns.has(name)) continue;
      for (const ev of store.runs.get(name)[KINDS[kind].list].get(tag) ?? []) steps.add(ev.step);
    }
    return [...steps].sort((a, b) => a - b);
  }

  _card(kind, tag) {
    const key = `${kind}:${tag}`;
    let card = this.cards.get(key);
    if (card) return card;
    const spec = KINDS[kind];
    const slider = el("input", { type: "range", min: "0", max: "0", step: "1", value: "0", class: "step-slider", "aria-label": `${spec.title} ${tag}` });
    const stepLabel = el("span", { class: "readout" });
    card = { kind, tag, follow: true, steps: [] };
    const chart = new Chart({
      key,
      title: `${spec.title} · ${tag}`,
      dataset: { curve: kind, curveTag: tag },
      syncKey: `curve:${key}`,
      group: this.ctx.syncGroup(`curve:${key}`),
      xKind: "value",
      xLabel: spec.x,
      yRange: [0, 1],
      source: () => this._lines(card, slider, stepLabel),
    });
    chart.onChange = () => this.ctx.scheduler.mark(chart);
    chart.element.append(slider, stepLabel);
    slider.addEventListener("input", () => {
      card.follow = Number(slider.value) >= Number(slider.max);
      this.ctx.scheduler.mark(chart);
    });
    card.chart = chart;
    this.cards.set(key, card);
    insertSorted(this.grid, this.cards, key, chart.element, (c) => c.chart.element);
    chart.element.hidden = !this.ctx.shown(null, tag);
    this.ctx.scheduler.observe(chart);
    this.empty.hidden = true;
    return card;
  }

  // For each visible run, the curve at the newest step at or before the slider's step.
  _lines(card, slider, stepLabel) {
    const { store, state } = this.ctx;
    const steps = this._steps(card.kind, card.tag);
    slider.max = String(Math.max(0, steps.length - 1));
    slider.disabled = steps.length <= 1;
    if (card.follow) slider.value = slider.max;
    const step = steps[Number(slider.value)];
    stepLabel.textContent = step === undefined ? "" : `${t("step")} ${step}`;
    const lines = [];
    for (const name of store.runNames()) {
      if (state.hiddenRuns.has(name)) continue;
      const list = store.runs.get(name)[KINDS[card.kind].list].get(card.tag) ?? [];
      let ev = null;
      for (const e of list) if (e.step <= step) ev = e;
      if (!ev) continue;
      const { xs, ys } = curvePoints(ev);
      lines.push({ label: name, color: colorFor(name), xs, ys });
    }
    return lines;
  }
}
