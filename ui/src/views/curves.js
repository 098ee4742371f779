// The curves view: PR curves (precision over recall) and ROC curves (true over false positive
// rate), one chart per kind and tag, runs overlaid, with a step slider that follows the newest step
// until moved back. Axes are named, each run's area under the curve is in the legend, and the
// chance level is drawn dashed: the diagonal for ROC, the share of positives for PR.
import { Chart, formatValue } from "../chart.js";
import { colorFor, el, insertSorted } from "../dom.js";
import { t } from "../i18n.js";

const KINDS = {
  pr_curve: { list: "prCurves", x: "recall", y: "precision", title: "PR" },
  roc_curve: { list: "rocCurves", x: "fpr", y: "tpr", title: "ROC" },
};
const CHANCE_COLOR = "rgba(128,128,128,0.8)";

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
  // Along a curve, points of equal x are passed rising for ROC (TPR rises before FPR does) and
  // falling for PR (precision falls while only false positives are added).
  const roc = ev.kind === "roc_curve";
  // A PR point with nothing predicted positive (tp + fp = 0) has no precision: left out.
  const keep = Array.from(x.keys()).filter((i) => roc || !(ev.tp && ev.fp && ev.tp[i] + ev.fp[i] === 0));
  const order = keep.sort((a, b) => x[a] - x[b] || (roc ? y[a] - y[b] : y[b] - y[a]));
  return { xs: Float64Array.from(order, (i) => x[i]), ys: Float64Array.from(order, (i) => y[i]) };
}

/**
 * A copy of ascending `xs` with repeated values moved up by a hair (1e-9 per repeat), so that
 * uPlot, which joins the runs' curves on x, keeps every point of a vertical or horizontal step.
 * @param {Float64Array} xs ascending
 */
export function distinctXs(xs) {
  const out = Float64Array.from(xs);
  for (let i = 1; i < out.length; i++) if (out[i] <= out[i - 1]) out[i] = out[i - 1] + 1e-9;
  return out;
}

/**
 * The area under a curve of ascending x (non-finite points skipped). ROC: trapezoids, the curve
 * closed at (0, 0) and (1, 1), where every ROC curve starts and ends. PR: the step-wise area (what
 * scikit-learn calls average precision): each rise in recall times the precision where it is
 * reached (the highest of that recall's points), so the undefined precision at recall 0 and
 * straight-line optimism between points do not count.
 * @param {"pr_curve"|"roc_curve"} kind
 * @param {ArrayLike<number>} xs
 * @param {ArrayLike<number>} ys
 * @returns {number} NaN for no points (ROC: fewer than two after closing)
 */
export function curveAuc(kind, xs, ys) {
  const px = [];
  const py = [];
  for (let i = 0; i < xs.length; i++) {
    if (Number.isFinite(xs[i]) && Number.isFinite(ys[i])) {
      px.push(xs[i]);
      py.push(ys[i]);
    }
  }
  if (kind === "pr_curve") {
    if (!px.length) return NaN;
    let area = 0;
    let prev = 0;
    for (let i = 0; i < px.length; ) {
      let best = py[i];
      let j = i + 1;
      while (j < px.length && px[j] === px[i]) best = Math.max(best, py[j++]);
      if (px[i] > prev) {
        area += (px[i] - prev) * best;
        prev = px[i];
      }
      i = j;
    }
    return area;
  }
  if (!(px[0] === 0 && py[0] === 0)) {
    px.unshift(0);
    py.unshift(0);
  }
  if (!(px[px.length - 1] === 1 && py[py.length - 1] === 1)) {
    px.push(1);
    py.push(1);
  }
  let area = 0;
  for (let i = 1; i < px.length; i++) area += ((px[i] - px[i - 1]) * (py[i] + py[i - 1])) / 2;
  return area;
}

/**
 * The precision of a classifier that guesses: the share of positives (tp + fn at any threshold),
 * or NaN when the event has no counts.
 * @param {object} ev a decoded pr_curve event
 */
export function positiveShare(ev) {
  const tp = ev.tp?.[0];
  const fn = ev.fn?.[0];
  const fp = ev.fp?.[0];
  const tn = ev.tn?.[0];
  const total = tp + fn + fp + tn;
  return total > 0 ? (tp + fn) / total : NaN;
}

const CHANCE_XS = Float64Array.from([0, 1]);

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
    }, { current: true });
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
      xTitle: () => t(spec.x),
      yTitle: () => t(spec.y),
      xRange: [0, 1],
      yRange: [0, 1],
      legend: true,
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
    let share = NaN;
    for (const name of store.runNames()) {
      if (state.hiddenRuns.has(name)) continue;
      const list = store.runs.get(name)[KINDS[card.kind].list].get(card.tag) ?? [];
      let ev = null;
      for (const e of list) if (e.step <= step) ev = e;
      if (!ev) continue;
      const { xs, ys } = curvePoints(ev);
      const auc = curveAuc(card.kind, xs, ys);
      if (Number.isNaN(share) && card.kind === "pr_curve") share = positiveShare(ev);
      lines.push({ label: name, color: colorFor(name), xs: distinctXs(xs), ys, legendText: `${name}  ${t("auc")} ${formatValue(auc)}`, legendData: { run: name, auc: String(auc) } });
    }
    // Chance: the diagonal of ROC; for PR the share of positives (of the first run shown).
    const chance = card.kind === "roc_curve" ? [0, 1] : Number.isFinite(share) ? [share, share] : null;
    if (lines.length && chance) {
      lines.push({ label: t("chance"), color: CHANCE_COLOR, xs: CHANCE_XS, ys: Float64Array.from(chance), width: 1, dash: [5, 4], legend: false });
    }
    return lines;
  }
}
