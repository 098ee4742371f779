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
 * Draw histograms on a canvas.
 * @param {HTMLCanvasElement} canvas sized by CSS; the backing store is resized for the pixel ratio
 * @param {{step: number, edges: Float64Array, counts: Float64Array}[]} hists sorted by step
 * @param {object} opts
 * @param {"ridgeline"|"heatmap"} opts.mode
 * @param {string} opts.color run color (ridgeline)
 * @param {string} opts.fg text color
 * @param {(v: number) => string} opts.format tick label format
 * @returns {{mode: string, shown: object[], lo: number, hi: number, plot: {left: number, top: number, width: number, height: number}}}
 *   what was drawn, for hit-testing the pointer
 */
export function drawHistograms(canvas, hists, { mode, color, fg, format }) {
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

  const plot = { left: 8, top: 8, width: cssW - 8 - 56, height: cssH - 8 - 22 };
  const shown = mode === "heatmap" ? sampleEvenly(hists, Math.max(1, Math.floor(plot.width / 3))) : sampleEvenly(hists, MAX_RIDGES);
  const [lo, hi] = valueRange(shown);
  const info = { mode, shown, lo, hi, plot };
  if (shown.length === 0) return info;

  if (mode === "heatmap") drawHeatmap(ctx, shown, lo, hi, plot);
  else drawRidges(ctx, shown, lo, hi, plot, color);

  // x axis (values) for the ridgeline, y axis (values) for the heatmap; steps on the other.
  ctx.globalAlpha = 0.8;
  ctx.fillStyle = fg;
  if (mode === "heatmap") {
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    for (const v of niceTicks(lo, hi, 5)) {
      const y = plot.top + plot.height - ((v - lo) / (hi - lo)) * plot.height;
      ctx.fillText(format(v), plot.left + plot.width + 4, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const first = shown[0].step;
    const last = shown[shown.length - 1].step;
    ctx.textAlign = "left";
    ctx.fillText(String(first), plot.left, plot.top + plot.height + 6);
    ctx.textAlign = "right";
    ctx.fillText(String(last), plot.left + plot.width, plot.top + plot.height + 6);
  } else {
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
  // Each ridge may rise to a third of the plot; baselines step down from the oldest (top) to the newest.
  const ridgeH = n === 1 ? plot.height : plot.height / 3;
  const offset = n === 1 ? 0 : (plot.height - ridgeH) / (n - 1);
  const bins = Math.max(10, Math.min(200, Math.floor(plot.width / 3)));
  const rebinned = shown.map((h) => rebin(h.edges, h.counts, lo, hi, bins));
  let max = 0;
  for (const r of rebinned) for (const c of r) if (c > max) max = c;
  if (!(max > 0)) max = 1;
  const fg = ctx.fillStyle;
  // Label the newest ridge, then every k-th older one so that labels stay 14 px apart.
  const labelEvery = offset > 0 ? Math.max(1, Math.ceil(14 / offset)) : 1;
  for (let i = 0; i < n; i++) {
    const base = plot.top + ridgeH + i * offset;
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
    // Label the newest ridge, and older ones only where they clear the previous label by 14 px.
    if ((n - 1 - i) % labelEvery === 0) {
      ctx.fillStyle = fg;
      ctx.globalAlpha = 0.8;
      ctx.textAlign = "left";
      ctx.textBaseline = "middle";
      ctx.fillText(String(shown[i].step), plot.left + plot.width + 4, base);
      ctx.globalAlpha = 1;
    }
  }
  ctx.fillStyle = fg;
}

function drawHeatmap(ctx, shown, lo, hi, plot) {
  const n = shown.length;
  const bins = Math.max(10, Math.min(120, Math.floor(plot.height / 3)));
  const colW = plot.width / n;
  const binH = plot.height / bins;
  const rebinned = shown.map((h) => rebin(h.edges, h.counts, lo, hi, bins));
  // Normalise per step, so a column shows the shape of that step's distribution.
  for (let i = 0; i < n; i++) {
    const r = rebinned[i];
    let max = 0;
    for (const c of r) if (c > max) max = c;
    for (let k = 0; k < bins; k++) {
      ctx.fillStyle = ramp(max > 0 ? r[k] / max : 0);
      ctx.fillRect(plot.left + i * colW, plot.top + plot.height - (k + 1) * binH, Math.ceil(colW), Math.ceil(binH));
    }
  }
}
