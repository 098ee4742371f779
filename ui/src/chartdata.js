// What a chart's tools work on, without the DOM: the data a chart shows as CSV or JSON (every
// received point, not the downsampled drawing), and the y range that ignores outliers.
import { SMOOTHED, STEP, VALUE, WALL } from "./store.js";

/** Column order of exported series; a series has any of these (plus `run`). */
export const COLUMNS = ["step", "wall", "value", "smoothed", "x", "y", "left", "right", "count"];

/**
 * The scalar series a chart of `tag` shows: one entry per visible run, every received point.
 * @param {import("./store.js").Store} store
 * @param {{hiddenRuns: Set<string>}} state
 * @param {string} tag
 * @returns {{run: string, step: number[], wall: number[], value: number[], smoothed: number[]}[]}
 */
export function scalarSeries(store, state, tag) {
  const out = [];
  for (const run of store.runNames()) {
    if (state.hiddenRuns.has(run)) continue;
    const s = store.series(run, tag);
    if (!s || s.length === 0) continue;
    out.push({
      run,
      step: Array.from(s.column(STEP)),
      wall: Array.from(s.column(WALL)),
      value: Array.from(s.column(VALUE)),
      smoothed: Array.from(s.column(SMOOTHED)),
    });
  }
  return out;
}

/**
 * The histograms of one run and tag as one series of bucket rows: per step, each bucket's
 * `left` and `right` edge and its `count`.
 * @param {string} run
 * @param {{step: number, wall?: number, edges: ArrayLike<number>, counts: ArrayLike<number>}[]} hists
 * @returns {{run: string, step: number[], wall: number[], left: number[], right: number[], count: number[]}}
 */
export function histogramSeries(run, hists) {
  const out = { run, step: [], wall: [], left: [], right: [], count: [] };
  for (const h of hists) {
    for (let i = 0; i < h.counts.length; i++) {
      out.step.push(h.step);
      out.wall.push(h.wall ?? NaN);
      out.left.push(h.edges[i]);
      out.right.push(h.edges[i + 1]);
      out.count.push(h.counts[i]);
    }
  }
  return out;
}

/** The columns (in COLUMNS order) that any of `series` has. */
function columnsOf(series) {
  return COLUMNS.filter((c) => series.some((s) => Array.isArray(s[c]) || ArrayBuffer.isView(s[c])));
}

function csvField(v) {
  const s = String(v);
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

function csvNumber(v) {
  if (v === null || v === undefined) return "";
  return String(v); // shortest round-trip form; NaN and ±Infinity as such (Python's float() reads them)
}

/**
 * Series as CSV, one row per point: `run,<columns>` (RFC 4180 quoting, CRLF-free `\n` lines).
 * @param {{run: string}[]} series with number arrays per column (see COLUMNS)
 */
export function seriesCsv(series) {
  const cols = columnsOf(series);
  const lines = [["run", ...cols].join(",")];
  for (const s of series) {
    const n = Math.max(...cols.map((c) => s[c]?.length ?? 0));
    const name = csvField(s.run);
    for (let i = 0; i < n; i++) lines.push([name, ...cols.map((c) => csvNumber(s[c]?.[i]))].join(","));
  }
  return lines.join("\n") + "\n";
}

/**
 * Series as JSON: `{...meta, series: [{run, step: [...], ...}]}`. Non-finite numbers, which JSON
 * cannot hold, become null.
 * @param {object} meta e.g. `{chart, x, smoothing, exported}`
 * @param {{run: string}[]} series
 */
export function seriesJson(meta, series) {
  const cols = columnsOf(series);
  const clean = series.map((s) => {
    const o = { run: s.run };
    for (const c of cols) if (s[c]) o[c] = Array.from(s[c], (v) => (Number.isFinite(v) ? v : null));
    return o;
  });
  return JSON.stringify({ ...meta, series: clean });
}

/**
 * The range of the finite values of `columns` between the `lo` and `hi` quantiles (TensorBoard's
 * "ignore outliers in chart scaling"), or null when there are none.
 * @param {ArrayLike<number|null>[]} columns
 * @param {number} [lo] lower quantile, e.g. 0.01
 * @param {number} [hi] upper quantile, e.g. 0.99
 * @param {boolean} [positive] only values > 0 (a log scale)
 * @returns {[number, number]|null}
 */
export function quantileRange(columns, lo = 0.01, hi = 0.99, positive = false) {
  let n = 0;
  for (const col of columns) n += col.length;
  const values = new Float64Array(n);
  let k = 0;
  for (const col of columns) {
    for (let i = 0; i < col.length; i++) {
      const v = col[i];
      if (v !== null && Number.isFinite(v) && (!positive || v > 0)) values[k++] = v;
    }
  }
  if (k === 0) return null;
  const sorted = values.subarray(0, k).sort();
  const at = (q) => {
    const pos = q * (k - 1);
    const i = Math.floor(pos);
    const f = pos - i;
    return i + 1 < k ? sorted[i] + (sorted[i + 1] - sorted[i]) * f : sorted[i];
  };
  return [at(lo), at(hi)];
}

/** How far out a line's top (bottom) must lie to be off the default scale: this many times the
 * lines' spread (the larger of the tops' interquartile range and a typical line's own span). */
export const ROBUST_FENCE = 3;
/** The default scale leaves lines out only when that narrows it at least this many times: a
 * diverging run whose loss reaches 1e11 squashes every other line flat; a run a little above the
 * rest does not. */
export const ROBUST_GAIN = 5;

/**
 * The default y range of many lines, robust to a few that run off (a diverging run, one spike):
 * each column's finite extremes (between rows `i0` and `i1`) are compared with the others'; a
 * column whose top lies more than ROBUST_FENCE spreads above the third quartile of the tops (or
 * whose bottom as far below the first quartile of the bottoms) is left out of the range, when at
 * least four columns have values, at most a quarter of them are left out, and the range narrows
 * at least ROBUST_GAIN times. With `log`, only values > 0 count, compared in decades.
 * @param {ArrayLike<number|null>[]} columns
 * @param {{i0?: number, i1?: number, log?: boolean}} [opts]
 * @returns {{range: [number, number], above: number[], below: number[]}|null} the range and the
 *   indices of the columns left out above and below it; null when no column has a value
 */
export function robustRange(columns, { i0 = 0, i1 = Infinity, log = false } = {}) {
  const ids = [];
  const tops = [];
  const bottoms = [];
  columns.forEach((col, c) => {
    let lo = Infinity;
    let hi = -Infinity;
    const end = Math.min(col.length - 1, i1);
    for (let i = Math.max(0, i0); i <= end; i++) {
      const v = col[i];
      if (v === null || !Number.isFinite(v) || (log && !(v > 0))) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (hi < lo) return;
    ids.push(c);
    tops.push(log ? Math.log10(hi) : hi);
    bottoms.push(log ? Math.log10(lo) : lo);
  });
  const n = ids.length;
  if (n === 0) return null;
  const back = (v) => (log ? 10 ** v : v);
  const whole = () => [back(Math.min(...bottoms)), back(Math.max(...tops))];
  if (n < 4) return { range: whole(), above: [], below: [] };
  const quantile = (sorted, q) => {
    const pos = q * (sorted.length - 1);
    const i = Math.floor(pos);
    return i + 1 < sorted.length ? sorted[i] + (sorted[i + 1] - sorted[i]) * (pos - i) : sorted[i];
  };
  const byValue = (a, b) => a - b;
  const t = [...tops].sort(byValue);
  const b = [...bottoms].sort(byValue);
  const span = quantile(tops.map((top, k) => top - bottoms[k]).sort(byValue), 0.5);
  const fenceHi = quantile(t, 0.75) + ROBUST_FENCE * Math.max(quantile(t, 0.75) - quantile(t, 0.25), span);
  const fenceLo = quantile(b, 0.25) - ROBUST_FENCE * Math.max(quantile(b, 0.75) - quantile(b, 0.25), span);
  const above = [];
  const below = [];
  let lo = Infinity;
  let hi = -Infinity;
  for (let k = 0; k < n; k++) {
    if (tops[k] > fenceHi) above.push(ids[k]);
    else hi = Math.max(hi, tops[k]);
    if (bottoms[k] < fenceLo) below.push(ids[k]);
    else lo = Math.min(lo, bottoms[k]);
  }
  const [allLo, allHi] = [Math.min(...bottoms), Math.max(...tops)];
  const narrowed = hi >= lo && (allHi - allLo) >= ROBUST_GAIN * Math.max(hi - lo, Number.MIN_VALUE);
  const out = new Set([...above, ...below]).size;
  if (!(above.length + below.length > 0 && out <= n / 4 && narrowed)) return { range: whole(), above: [], below: [] };
  return { range: [back(lo), back(hi)], above, below };
}

/**
 * Parse a y-range input: "" means automatic (null); anything else must be a finite number.
 * @param {string} text
 * @returns {number|null}
 * @throws {RangeError} naming the bad value
 */
export function parseBound(text) {
  const s = String(text).trim();
  if (s === "") return null;
  const v = Number(s);
  if (!Number.isFinite(v)) throw new RangeError(`y range bound must be a number, got ${JSON.stringify(s)}`);
  return v;
}

/** Save text as a file named `name` (a download, made in the page: no request). */
export function saveText(name, mime, text) {
  const url = URL.createObjectURL(new Blob([text], { type: mime }));
  const a = document.createElement("a");
  a.download = name;
  a.href = url;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
