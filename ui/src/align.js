// Many lines on one shared x grid: with dozens of runs in a chart, each run downsampled on its own
// keeps different x values, and uPlot's aligned data (one x column for every line) becomes the
// union of them all: 100 runs x 1,200 points each is 100 columns of ~100,000 rows, mostly gaps,
// joined and walked on every redraw. On a grid of two rows per pixel column every run keeps its
// minimum and maximum of each column (in the order they occur), so the drawing is the same to the
// pixel and the data is 100 columns of 2 x width rows. Pure functions; no DOM.

/**
 * Put ascending lines on a shared grid of `columns` pixel columns over [x0, x1], two rows per
 * column: each line's smallest and largest finite value in that column, in the order they occur
 * (a column with one point fills the first row). Rows a line has no point in are gaps.
 * The first row sits at x0 and the last at x1, so the x range drawn is the data's own. Gaps are
 * null rather than NaN, so that the chart takes the columns as they are (chart.js alignedData).
 *
 * @param {{xs: ArrayLike<number>, ys: ArrayLike<number>}[]} lines ascending xs each
 * @param {number} columns pixel columns (a positive integer)
 * @param {number} [x0] start of the grid (default: the smallest x of the lines)
 * @param {number} [x1] end of the grid (default: the largest x of the lines)
 * @param {{xs?: Float64Array, ys?: (number|null)[][]}} [reuse] the arrays of an earlier grid to
 *   fill again where their sizes fit (a chart redrawn with 50 live runs four times a second would
 *   otherwise make 50 arrays of 2 x width rows each time); the result may be `reuse`'s arrays
 * @returns {{xs: Float64Array, ys: (number|null)[][]}} one ys per line, in order
 * @throws {RangeError} when columns is not a positive integer
 */
export function shareGrid(lines, columns, x0, x1, reuse) {
  if (!Number.isInteger(columns) || columns < 1) throw new RangeError(`columns must be a positive integer, got ${columns}`);
  let lo = Infinity;
  let hi = -Infinity;
  for (const { xs } of lines) {
    if (xs.length === 0) continue;
    lo = Math.min(lo, xs[0]);
    hi = Math.max(hi, xs[xs.length - 1]);
  }
  const from = x0 ?? lo;
  const to = x1 ?? hi;
  if (!(to >= from) || !Number.isFinite(from) || !Number.isFinite(to)) return { xs: new Float64Array(0), ys: lines.map(() => []) };
  // A single x (one step so far): one column.
  const n = to > from ? columns : 1;
  const step = (to - from) / n;
  const xs = reuse?.xs?.length === 2 * n ? reuse.xs : new Float64Array(2 * n);
  for (let b = 0; b < n; b++) {
    xs[2 * b] = from + (b + 0.25) * step;
    xs[2 * b + 1] = from + (b + 0.75) * step;
  }
  xs[0] = from;
  xs[2 * n - 1] = to;
  if (n === 1) xs[1] = to > from ? to : from + 0.5; // strictly ascending for uPlot
  const scale = step > 0 ? 1 / step : 0;
  const ys = lines.map((line, i) => {
    const old = reuse?.ys?.[i];
    return fillColumns(line, n, from, to, scale, Array.isArray(old) && old.length === 2 * n ? old.fill(null) : new Array(2 * n).fill(null));
  });
  return { xs, ys };
}

function fillColumns({ xs, ys }, n, from, to, scale, out) {
  let b = -1;
  let iMin = -1;
  let iMax = -1;
  const flush = () => {
    if (b < 0 || iMin < 0) return;
    if (iMin === iMax) out[2 * b] = ys[iMin];
    else if (iMin < iMax) {
      out[2 * b] = ys[iMin];
      out[2 * b + 1] = ys[iMax];
    } else {
      out[2 * b] = ys[iMax];
      out[2 * b + 1] = ys[iMin];
    }
  };
  for (let i = 0; i < xs.length; i++) {
    const x = xs[i];
    if (x < from || x > to) continue;
    const v = ys[i];
    if (!Number.isFinite(v)) continue;
    let c = Math.floor((x - from) * scale);
    if (c >= n) c = n - 1;
    if (c !== b) {
      flush();
      b = c;
      iMin = iMax = i;
      continue;
    }
    if (v < ys[iMin]) iMin = i;
    if (v > ys[iMax]) iMax = i;
  }
  flush();
  return out;
}
