// Groups of runs drawn as one line: the mean across the group's runs with a min–max or ±std band,
// aligned on x (step or time). Pure functions over typed arrays; no DOM.

/**
 * Index of the last element of ascending `xs` that is <= x, or -1.
 * @param {ArrayLike<number>} xs
 * @param {number} x
 */
export function lastAtOrBefore(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (xs[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/**
 * Mean, minimum, maximum and standard deviation across runs at common x values.
 *
 * Each run contributes at an x inside its own range (never extrapolated past its first or newest
 * point) its value at the last point at or before that x, so runs logged at the same steps are
 * compared step by step, and runs logged at different steps are compared at the same x. The x
 * values are every x of the runs when they hold few points in all (at most 4 x `columns`), else
 * `columns` evenly spaced values over the range. Non-finite values (a diverged run's NaN) are left
 * out, of the mean and the spread alike. `std` is the population standard deviation of the runs'
 * values at that x (0 where one run has a value); `count` how many runs have one.
 *
 * @param {{xs: ArrayLike<number>, ys: ArrayLike<number>}[]} runs ascending xs
 * @param {number} columns how many x values to aim for (a chart's pixel width)
 * @param {number} [x0] start of the range (default: the smallest x)
 * @param {number} [x1] end of the range (default: the largest x)
 * @returns {{xs: Float64Array, mean: Float64Array, min: Float64Array, max: Float64Array, std: Float64Array, count: Uint32Array}}
 * @throws {RangeError} when columns is not a positive integer
 */
export function aggregate(runs, columns, x0, x1) {
  if (!Number.isInteger(columns) || columns < 1) throw new RangeError(`columns must be a positive integer, got ${columns}`);
  let lo = Infinity;
  let hi = -Infinity;
  let total = 0;
  for (const { xs } of runs) {
    if (xs.length === 0) continue;
    lo = Math.min(lo, xs[0]);
    hi = Math.max(hi, xs[xs.length - 1]);
    total += xs.length;
  }
  const empty = { xs: new Float64Array(0), mean: new Float64Array(0), min: new Float64Array(0), max: new Float64Array(0), std: new Float64Array(0), count: new Uint32Array(0) };
  if (total === 0) return empty;
  const from = x0 ?? lo;
  const to = x1 ?? hi;
  if (!(to >= from)) return empty;
  let grid;
  if (total <= 4 * columns) {
    const all = new Float64Array(total);
    let k = 0;
    for (const { xs } of runs) for (let i = 0; i < xs.length; i++) if (xs[i] >= from && xs[i] <= to) all[k++] = xs[i];
    const sorted = all.subarray(0, k).sort();
    let n = 0;
    for (let i = 0; i < sorted.length; i++) if (i === 0 || sorted[i] !== sorted[i - 1]) sorted[n++] = sorted[i];
    grid = Float64Array.from(sorted.subarray(0, n));
  } else {
    const n = Math.max(2, columns);
    grid = new Float64Array(n);
    for (let i = 0; i < n; i++) grid[i] = from + ((to - from) * i) / (n - 1);
  }
  // Welford's running mean and sum of squared deviations: no cancellation when the values are
  // large and close (a loss of 1e6 +- 1e-3), unlike a sum of squares.
  const mean = new Float64Array(grid.length);
  const m2 = new Float64Array(grid.length);
  const min = new Float64Array(grid.length).fill(Infinity);
  const max = new Float64Array(grid.length).fill(-Infinity);
  const count = new Uint32Array(grid.length);
  for (const { xs, ys } of runs) {
    if (xs.length === 0) continue;
    const first = xs[0];
    const last = xs[xs.length - 1];
    // Grid x ascend, so the point index only moves forward: one binary search per run.
    let j = lastAtOrBefore(xs, grid[0]);
    for (let g = 0; g < grid.length; g++) {
      const x = grid[g];
      if (x < first || x > last) continue;
      while (j + 1 < xs.length && xs[j + 1] <= x) j++;
      const v = ys[j];
      if (!Number.isFinite(v)) continue;
      const n = ++count[g];
      const d = v - mean[g];
      mean[g] += d / n;
      m2[g] += d * (v - mean[g]);
      if (v < min[g]) min[g] = v;
      if (v > max[g]) max[g] = v;
    }
  }
  let n = 0;
  for (let g = 0; g < grid.length; g++) if (count[g] > 0) n++;
  const out = {
    xs: new Float64Array(n),
    mean: new Float64Array(n),
    min: new Float64Array(n),
    max: new Float64Array(n),
    std: new Float64Array(n),
    count: new Uint32Array(n),
  };
  let k = 0;
  for (let g = 0; g < grid.length; g++) {
    if (count[g] === 0) continue;
    out.xs[k] = grid[g];
    out.mean[k] = mean[g];
    out.min[k] = min[g];
    out.max[k] = max[g];
    out.std[k] = Math.sqrt(Math.max(0, m2[g] / count[g]));
    out.count[k] = count[g];
    k++;
  }
  return out;
}

/**
 * The lower and upper edge of a group's band: the runs' min and max, or the mean ± one standard
 * deviation.
 * @param {{mean: Float64Array, min: Float64Array, max: Float64Array, std: Float64Array}} agg see aggregate
 * @param {"minmax"|"std"} band
 * @returns {{lower: Float64Array, upper: Float64Array}}
 * @throws {RangeError} for another band
 */
export function bandEdges(agg, band) {
  if (band === "minmax") return { lower: agg.min, upper: agg.max };
  if (band !== "std") throw new RangeError(`band must be "minmax" or "std", got ${JSON.stringify(band)}`);
  const lower = new Float64Array(agg.mean.length);
  const upper = new Float64Array(agg.mean.length);
  for (let i = 0; i < lower.length; i++) {
    lower[i] = agg.mean[i] - agg.std[i];
    upper[i] = agg.mean[i] + agg.std[i];
  }
  return { lower, upper };
}
