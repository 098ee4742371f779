// Full-resolution history from the HTTP API (docs/http-api.md), for zooming into a stretch of a run
// that reached the page downsampled (snapshots carry at most max_points per tag) or that the ring
// buffer has already dropped.

/**
 * Fetch the points of one scalar series with start <= step <= end, downsampled by the server to at
 * most `maxPoints` (keeping every bucket's minimum and maximum).
 *
 * @param {object} q
 * @param {string} q.run
 * @param {string} q.tag
 * @param {number} q.start first step (inclusive)
 * @param {number} q.end last step (inclusive)
 * @param {number} q.maxPoints at least 2
 * @param {string|null} [q.token] sent as a Bearer token
 * @param {AbortSignal} [q.signal]
 * @param {typeof fetch} [q.fetchImpl] injectable for tests
 * @returns {Promise<{steps: Float64Array, walls: Float64Array, values: Float64Array}>} null values
 *   (NaN and infinities, which JSON cannot carry) become NaN
 * @throws {Error} on an HTTP error status, naming it
 */
export async function fetchScalars({ run, tag, start, end, maxPoints, token = null, signal, fetchImpl = fetch }) {
  const params = new URLSearchParams({ run, tag, start: String(Math.floor(start)), end: String(Math.ceil(end)), max_points: String(Math.max(2, Math.round(maxPoints))) });
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetchImpl(`/api/scalars?${params}`, { headers, signal });
  if (!response.ok) throw new Error(`/api/scalars answered ${response.status}`);
  const body = await response.json();
  const column = (list) => Float64Array.from(list ?? [], (v) => (typeof v === "number" ? v : NaN));
  const steps = column(body.steps);
  const walls = column(body.wall_times);
  const values = column(body.values);
  if (walls.length !== steps.length || values.length !== steps.length) {
    throw new Error(`/api/scalars columns differ in length: ${steps.length}, ${walls.length}, ${values.length}`);
  }
  return { steps, walls, values };
}

/**
 * Whether the page lacks points of a series in the step range [x0, x1]: the range reaches into
 * history that arrived downsampled, or before the oldest point the ring buffer still holds.
 * @param {{historyEnd: number, historyDownsampled: boolean, buffer: {dropped: number}, column: Function}} series
 * @param {number} x0
 * @param {number} x1
 */
export function needsHistory(series, x0, x1) {
  if (series.historyDownsampled && x0 <= series.historyEnd) return true;
  if (series.buffer.dropped > 0 && series.length > 0 && x0 < series.column(0)[0]) return true;
  return false;
}

/**
 * Put fetched points in place of the received ones within [start, end]: rows of the received
 * columns outside the range are kept, and the fetched rows go in between. Every argument is
 * `{xs, ys, ...}` of parallel arrays with xs ascending; the result has the same keys.
 * @param {Record<string, ArrayLike<number>>} received must have `xs`
 * @param {Record<string, ArrayLike<number>>} fetched same keys as `received`
 * @param {number} start
 * @param {number} end
 */
export function spliceRange(received, fetched, start, end) {
  const xs = received.xs;
  let before = 0;
  while (before < xs.length && xs[before] < start) before++;
  let after = before;
  while (after < xs.length && xs[after] <= end) after++;
  const out = {};
  for (const key of Object.keys(received)) {
    const a = received[key];
    const b = fetched[key];
    const col = new Float64Array(before + b.length + (a.length - after));
    col.set(Array.prototype.slice.call(a, 0, before), 0);
    col.set(b, before);
    col.set(Array.prototype.slice.call(a, after), before + b.length);
    out[key] = col;
  }
  return out;
}
