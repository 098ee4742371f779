// Min/max downsampling for drawing: per pixel column keep the points with the smallest and the
// largest value (in their original order), so spikes survive at any zoom level, and always keep
// the first and the newest point exactly. The result is a list of row indices, so every column of
// a series (x, raw value, smoothed value) is gathered at the same rows.

/**
 * First index `i` in sorted `xs` with `xs[i] >= x` (xs.length when none).
 * @param {ArrayLike<number>} xs ascending
 * @param {number} x
 */
export function lowerBound(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (xs[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Index of the element of sorted, non-empty `xs` nearest to x (the earlier one on a tie).
 * @param {ArrayLike<number>} xs ascending
 * @param {number} x
 */
export function nearestIndex(xs, x) {
  const i = lowerBound(xs, x);
  if (i === 0) return 0;
  if (i === xs.length) return xs.length - 1;
  return x - xs[i - 1] <= xs[i] - x ? i - 1 : i;
}

/**
 * First index `i` in sorted `xs` with `xs[i] > x` (xs.length when none).
 * @param {ArrayLike<number>} xs ascending
 * @param {number} x
 */
export function upperBound(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (xs[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Choose the rows to draw.
 *
 * @param {ArrayLike<number>} xs x of each row, normally ascending (steps, wall times); when not
 *   (a run restarted from an earlier step) rows are bucketed by position and the range is ignored
 * @param {ArrayLike<number>} ys y of each row; a non-finite y is kept only where its column has no
 *   finite one
 * @param {number} columns pixel columns available (at least 1)
 * @param {number} [xMin] left edge of the visible range (default: first x)
 * @param {number} [xMax] right edge of the visible range (default: last x)
 * @param {boolean} [ascending] whether xs is ascending, when the caller knows (saves a pass)
 * @param {import("./extremes.js").BlockExtremes} [extremes] block summaries of ys (same length):
 *   with them a column's lowest and highest rows are found from whole blocks and the rows at the
 *   column's ends, so the cost follows the columns rather than the rows; the result is the same
 * @returns {Uint32Array} ascending row indices, at most 2 per column plus the neighbours just
 *   outside the range (so lines reach the edges), the first row and the last row
 */
export function minMaxIndices(xs, ys, columns, xMin, xMax, ascending = isAscending(xs), extremes = null) {
  const n = xs.length;
  if (n === 0) return new Uint32Array(0);
  columns = Math.max(1, Math.floor(columns));
  if (!ascending) return byPosition(ys, columns);
  let lo = 0;
  let hi = n;
  if (xMin !== undefined && xMax !== undefined && xMin <= xMax) {
    lo = Math.max(0, lowerBound(xs, xMin) - 1);
    hi = Math.min(n, upperBound(xs, xMax) + 1);
  }
  if (hi - lo <= columns * 2) return range(lo, hi, n);

  const x0 = xMin !== undefined ? Math.max(xMin, xs[lo]) : xs[lo];
  const x1 = xMax !== undefined ? Math.min(xMax, xs[hi - 1]) : xs[hi - 1];
  const width = x1 - x0 || 1;
  const out = new Uint32Array(columns * 2 + 4);
  let k = 0;
  const emit = (i) => {
    if (k === 0 || i > out[k - 1]) out[k++] = i;
  };
  emit(0);
  if (lo > 0) emit(lo);

  const bucketOf = (i) => {
    const b = Math.floor(((xs[i] - x0) / width) * columns);
    return b >= columns ? columns - 1 : b < 0 ? 0 : b;
  };
  const emitPair = (iMin, iMax) => {
    if (iMin === iMax) emit(iMin);
    else if (iMin < iMax) { emit(iMin); emit(iMax); }
    else { emit(iMax); emit(iMin); }
  };
  // A column's rows are contiguous (bucketOf never decreases along ascending xs, as long as the
  // range is finite), so its end can be found by search and its inside read from the summaries.
  if (extremes && extremes.length === n && Number.isFinite(x0) && Number.isFinite(x1) && width > 0) {
    const found = new Int32Array(2);
    for (let start = lo; start < hi; ) {
      const end = bucketEnd(bucketOf, start, hi);
      // The column's first row is kept unless a later finite row is lower (higher): the full
      // scan's rule, which also lets a finite row replace a leading NaN.
      let iMin = start;
      let iMax = start;
      extremes.scan(ys, start + 1, end, found);
      if (found[0] >= 0 && !(ys[found[0]] >= ys[start])) iMin = found[0];
      if (found[1] >= 0 && !(ys[found[1]] <= ys[start])) iMax = found[1];
      emitPair(iMin, iMax);
      start = end;
    }
  } else {
    let bucket = -1;
    let iMin = -1;
    let iMax = -1;
    for (let i = lo; i < hi; i++) {
      const b = bucketOf(i);
      if (b !== bucket) {
        if (iMin >= 0) emitPair(iMin, iMax);
        bucket = b;
        iMin = iMax = -1;
      }
      const y = ys[i];
      if (iMin < 0) { iMin = iMax = i; continue; }
      if (!Number.isFinite(y)) continue;
      if (!(y >= ys[iMin])) iMin = i;
      if (!(y <= ys[iMax])) iMax = i;
    }
    if (iMin >= 0) emitPair(iMin, iMax);
  }
  if (hi < n) emit(hi - 1);
  emit(n - 1);
  return out.slice(0, k);
}

// The first row after `start` (and before `hi`) in a later column than `start`'s, or `hi`: a
// galloping search, so a column of m rows costs O(log m) bucket computations.
function bucketEnd(bucketOf, start, hi) {
  const b = bucketOf(start);
  let inside = start; // known to be in column b
  let step = 1;
  while (inside + step < hi && bucketOf(inside + step) === b) {
    inside += step;
    step *= 2;
  }
  let lo = inside + 1;
  let end = Math.min(hi, inside + step);
  while (lo < end) {
    const mid = (lo + end) >>> 1;
    if (bucketOf(mid) === b) lo = mid + 1;
    else end = mid;
  }
  return lo;
}

/**
 * Gather `src[idx[i]]` for every index into a new Float64Array.
 * @param {ArrayLike<number>} src
 * @param {Uint32Array} idx
 */
export function gather(src, idx) {
  const out = new Float64Array(idx.length);
  for (let i = 0; i < idx.length; i++) out[i] = src[idx[i]];
  return out;
}

function range(lo, hi, n) {
  const withFirst = lo > 0 ? 1 : 0;
  const withLast = hi < n ? 1 : 0;
  const out = new Uint32Array(hi - lo + withFirst + withLast);
  let k = 0;
  if (withFirst) out[k++] = 0;
  for (let i = lo; i < hi; i++) out[k++] = i;
  if (withLast) out[k++] = n - 1;
  return out;
}

/** Whether xs never decreases. */
export function isAscending(xs) {
  for (let i = 1; i < xs.length; i++) if (!(xs[i] >= xs[i - 1])) return false;
  return true;
}

// For x that is not ascending (a run restarted from an earlier step), bucket by row position
// instead of by x: that keeps the rows in order and still bounds the output.
function byPosition(ys, columns) {
  const n = ys.length;
  if (n <= columns * 2) return range(0, n, n);
  const per = Math.ceil(n / columns);
  const out = [];
  for (let start = 0; start < n; start += per) {
    const end = Math.min(n, start + per);
    let iMin = start;
    let iMax = start;
    for (let i = start + 1; i < end; i++) {
      if (!(ys[i] >= ys[iMin])) iMin = i;
      if (!(ys[i] <= ys[iMax])) iMax = i;
    }
    const pair = iMin < iMax ? [iMin, iMax] : [iMax, iMin];
    for (const i of pair) if (out[out.length - 1] !== i) out.push(i);
  }
  if (out[0] !== 0) out.unshift(0);
  if (out[out.length - 1] !== n - 1) out.push(n - 1);
  return Uint32Array.from(out);
}
