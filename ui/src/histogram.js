// Canvas drawing of how a distribution changes over steps, for one run and tag: a ridgeline
// ("offset" view, as TensorBoard draws it: one filled curve per step, newest in front) or a heatmap
// (steps across, values up, counts as color). Pure drawing; the view decides when to draw.

/** Most histograms drawn as ridges; longer lists are sampled evenly, always keeping the newest. */
export const MAX_RIDGES = 40;

/**
 * Pick at most `max` items evenly from a list, always keeping the last.
 * @template T
 * @param {T[]} list
 * @param {number} max
 * @returns {T[]}
 */
export function sampleEvenly(list, max) {
  if (list.length <= max) return list.slice();
  const out = [];
  for (let i = 0; i < max; i++) out.push(list[Math.round((i * (list.length - 1)) / (max - 1))]);
  return out;
}

/**
 * Spread histogram counts onto `bins` equal bins over [lo, hi], sharing each source bin's count
 * in proportion to its overlap.
 * @param {Float64Array} edges n+1 ascending edges
 * @param {Float64Array} counts n counts
 * @param {number} lo
 * @param {number} hi
 * @param {number} bins
 * @returns {Float64Array}
 */
export function rebin(edges, counts, lo, hi, bins) {
  const out = new Float64Array(bins);
  const width = (hi - lo) / bins || 1;
  for (let i = 0; i < counts.length; i++) {
    const a = edges[i];
    const b = edges[i + 1];
    const c = counts[i];
    if (!(c > 0)) continue;
    if (!(b > a)) {
      const k = Math.min(bins - 1, Math.max(0, Math.floor((a - lo) / width)));
      out[k] += c;
      continue;
    }
    const first = Math.max(0, Math.floor((a - lo) / width));
    const last = Math.min(bins - 1, Math.floor((b - lo) / width));
    for (let k = first; k <= last; k++) {
      const overlap = Math.min(b, lo + (k + 1) * width) - Math.max(a, lo + k * width);
      if (overlap > 0) out[k] += (c * overlap) / (b - a);
    }
  }
  return out;
}

/** The value range covered by a list of histograms, as [lo, hi] (finite edges only). */
export function valueRange(hists) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const h of hists) {
    for (const e of [h.edges[0], h.edges[h.edges.length - 1]]) {
      if (Number.isFinite(e)) {
        if (e < lo) lo = e;
        if (e > hi) hi = e;
      }
    }
  }
  if (!(hi > lo)) {
    lo = Number.isFinite(lo) ? lo - 0.5 : 0;
    hi = lo + 1;
  }
  return [lo, hi];
}

// A perceptually ordered color ramp (after viridis), for the heatmap.
const RAMP = [
  [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
];
function ramp(t) {
  const x = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const f = x - i;
  const [a, b] = [RAMP[i], RAMP[i + 1]];
  return `rgb(${Math.round(a[0] + (b[0] - a[0]) * f)},${Math.round(a[1] + (b[1] - a[1]) * f)},${Math.round(a[2] + (b[2] - a[2]) * f)})`;
}

/**
 * Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
 * @param {number} lo
 * @param {number} hi
 * @param {number} count roughly how many ticks
 */
export function niceTicks(lo, hi, count) {
  const span = hi - lo;
  const step0 = span / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) ?? step0;
  const ticks = [];
  const first = Math.ceil(lo / step);
  for (let i = first; i * step <= hi + step * 1e-9; i++) ticks.push(i === 0 ? 0 : +(i * step).toPrecision(12));
  return ticks;
}

/**
 * Vertical positions of ridge baselines, spaced by step (not evenly): the oldest at `top`, the
 * newest at `bottom`; evenly when every step is the same.
 * @param {number[]} steps ascending
 * @param {number} top
 * @param {number} bottom
 * @returns {number[]}
 */
export function ridgeBases(steps, top, bottom) {
  const n = steps.length;
  if (n === 1) return [bottom];
  const first = steps[0];
  const span = steps[n - 1] - first;
  return steps.map((s, i) => top + (span > 0 ? (s - first) / span : i / (n - 1)) * (bottom - top));
}

/**
 * Which ridges get a step label: the newest always, then each older one that clears the last
 * label by `gap` pixels (baselines are spaced by step, so labels are too).
 * @param {number[]} bases baseline y of each ridge, ascending (oldest first)
 * @param {number} gap
 * @returns {number[]} indices, newest first
 */
export function labelledRidges(bases, gap = 14) {
  const out = [];
  let last = Infinity;
  for (let i = bases.length - 1; i >= 0; i--) {
    if (last - bases[i] >= gap) {
      out.push(i);
      last = bases[i];
    }
  }
  return out;
}

/**
 * Horizontal edges of heatmap columns, placed by step: column i spans from its step to the next
 * one's, the newest as wide as the average gap. Returns n+1 edges from `left` to `right`.
 * @param {number[]} steps ascending
 * @param {number} left
 * @param {number} right
 */
export function columnEdges(steps, left, right) {
  const n = steps.length;
  const gap = n > 1 ? (steps[n - 1] - steps[0]) / (n - 1) : 1;
  const first = steps[0];
  const end = steps[n - 1] + (gap > 0 ? gap : 1);
  const span = end - first;
  const edges = steps.map((s) => left + ((s - first) / span) * (right - left));
  edges.push(right);
  return { edges, first, end };
}

/**
 * Draw histograms on a canvas.
 * @param {HTMLCanvasElement} canvas sized by CSS; the backing store is resized for the pixel ratio
 * @param {{step: number, edges: Float64Array, counts: Float64Array}[]} hists sorted by step
 * @param {object} opts
 * @param {"ridgeline"|"heatmap"} opts.mode
 * @param {string} opts.color run color (ridgeline)
 * @param {string} opts.fg text color
 * @param {(v: number) => string} opts.format tick label format
 * @param {string} [opts.countLabel] caption of the heatmap's color bar
 * @returns {{mode: string, shown: object[], lo: number, hi: number, plot: {left: number, top: number, width: number, height: number}, bases?: number[], edges?: number[]}}
 *   what was drawn, for hit-testing the pointer
 */
export function drawHistograms(canvas, hists, { mode, color, fg, format, countLabel = "" }) {
  const ratio = globalThis.devicePixelRatio || 1;
  const cssW = canvas.clientWidth || 400;
  const cssH = canvas.clientHeight || 240;
  canvas.width = Math.round(cssW * ratio);
  canvas.height = Math.round(cssH * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, cssW, cssH);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = fg;
  ctx.strokeStyle = fg;

  // The heatmap keeps 44 px on the right for its color bar.
  const bar = mode === "heatmap" ? 44 : 0;
  const plot = { left: 8, top: 8, width: cssW - 8 - 56 - bar, height: cssH - 8 - 22 };
  const shown = mode === "heatmap" ? sampleEvenly(hists, Math.max(1, Math.floor(plot.width / 3))) : sampleEvenly(hists, MAX_RIDGES);
  const [lo, hi] = valueRange(shown);
  const info = { mode, shown, lo, hi, plot };
  if (shown.length === 0) return info;

  if (mode === "heatmap") {
    const { edges, first, end } = columnEdges(
      shown.map((h) => h.step),
      plot.left,
      plot.left + plot.width,
    );
    info.edges = edges;
    drawHeatmap(ctx, shown, lo, hi, plot, edges);
    drawColorBar(ctx, cssW - bar + 4, plot.top, plot.height, fg, countLabel);
    ctx.globalAlpha = 0.8;
    ctx.fillStyle = fg;
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    for (const v of niceTicks(lo, hi, 5)) {
      const y = plot.top + plot.height - ((v - lo) / (hi - lo)) * plot.height;
      ctx.fillText(format(v), plot.left + plot.width + 4, y);
    }
    // Steps across, at their true positions.
    ctx.textBaseline = "top";
    ctx.textAlign = "center";
    const ticks = niceTicks(first, end, Math.max(2, Math.floor(plot.width / 70))).filter((s) => s >= first && s < end && Number.isInteger(s));
    for (const s of ticks) {
      const x = plot.left + ((s - first) / (end - first)) * plot.width;
      ctx.fillRect(x, plot.top + plot.height, 1, 3);
      ctx.fillText(String(s), Math.min(plot.left + plot.width - 10, Math.max(plot.left + 10, x)), plot.top + plot.height + 6);
    }
  } else {
    info.bases = drawRidges(ctx, shown, lo, hi, plot, color);
    ctx.globalAlpha = 0.8;
    ctx.fillStyle = fg;
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const v of niceTicks(lo, hi, 6)) {
      const x = plot.left + ((v - lo) / (hi - lo)) * plot.width;
      ctx.fillText(format(v), x, plot.top + plot.height + 6);
    }
  }
  ctx.globalAlpha = 1;
  return info;
}

function drawRidges(ctx, shown, lo, hi, plot, color) {
  const n = shown.length;
  // Each ridge may rise to a third of the plot; baselines step down from the oldest (top) to the
  // newest, spaced by step.
  const ridgeH = n === 1 ? plot.height : plot.height / 3;
  const bases = ridgeBases(
    shown.map((h) => h.step),
    plot.top + ridgeH,
    plot.top + plot.height,
  );
  const bins = Math.max(10, Math.min(200, Math.floor(plot.width / 3)));
  const rebinned = shown.map((h) => rebin(h.edges, h.counts, lo, hi, bins));
  let max = 0;
  for (const r of rebinned) for (const c of r) if (c > max) max = c;
  if (!(max > 0)) max = 1;
  const fg = ctx.fillStyle;
  for (let i = 0; i < n; i++) {
    const base = bases[i];
    const r = rebinned[i];
    ctx.beginPath();
    ctx.moveTo(plot.left, base);
    for (let k = 0; k < bins; k++) {
      const x = plot.left + ((k + 0.5) / bins) * plot.width;
      ctx.lineTo(x, base - (r[k] / max) * ridgeH);
    }
    ctx.lineTo(plot.left + plot.width, base);
    ctx.closePath();
    const age = n === 1 ? 1 : i / (n - 1);
    ctx.globalAlpha = 0.25 + 0.6 * age;
    ctx.fillStyle = color;
    ctx.fill();
    ctx.globalAlpha = 1;
    ctx.strokeStyle = "rgba(255,255,255,0.7)";
    ctx.lineWidth = 0.8;
    ctx.stroke();
  }
  // The step of each labelled ridge at its baseline, with a tick.
  ctx.fillStyle = fg;
  ctx.globalAlpha = 0.8;
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  for (const i of labelledRidges(bases)) {
    ctx.fillRect(plot.left + plot.width, bases[i], 3, 1);
    ctx.fillText(String(shown[i].step), plot.left + plot.width + 5, bases[i]);
  }
  ctx.globalAlpha = 1;
  ctx.fillStyle = fg;
  return bases;
}

function drawHeatmap(ctx, shown, lo, hi, plot, edges) {
  const n = shown.length;
  const bins = Math.max(10, Math.min(120, Math.floor(plot.height / 3)));
  const binH = plot.height / bins;
  const rebinned = shown.map((h) => rebin(h.edges, h.counts, lo, hi, bins));
  // Normalise per step, so a column shows the shape of that step's distribution.
  for (let i = 0; i < n; i++) {
    const r = rebinned[i];
    let max = 0;
    for (const c of r) if (c > max) max = c;
    const x = edges[i];
    const w = Math.max(1, Math.ceil(edges[i + 1] - x));
    for (let k = 0; k < bins; k++) {
      ctx.fillStyle = ramp(max > 0 ? r[k] / max : 0);
      ctx.fillRect(x, plot.top + plot.height - (k + 1) * binH, w, Math.ceil(binH));
    }
  }
}

// The heatmap's key: the color ramp from 0 (bottom) to the step's largest count (top).
function drawColorBar(ctx, x, top, height, fg, caption) {
  const steps = 32;
  for (let i = 0; i < steps; i++) {
    ctx.fillStyle = ramp((i + 0.5) / steps);
    ctx.fillRect(x, top + height - ((i + 1) * height) / steps, 10, Math.ceil(height / steps) + 0.5);
  }
  ctx.fillStyle = fg;
  ctx.globalAlpha = 0.8;
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  for (const [v, text] of [[0, "0"], [0.5, "½"], [1, "1"]]) ctx.fillText(text, x + 13, top + height - v * height);
  if (caption) {
    ctx.save();
    ctx.translate(x + 34, top + height / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "center";
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillText(caption, 0, 0, height);
    ctx.restore();
  }
  ctx.globalAlpha = 1;
}
