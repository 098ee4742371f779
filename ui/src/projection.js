// Projections of N points in D dimensions to the plane: PCA, and a UMAP-style layout on an
// approximate k-nearest-neighbour graph. Plain functions over typed arrays (row-major Float32Array
// of N*D values), no DOM and no worker API, so Node's test runner checks them and the embeddings
// worker (embedworker.js) runs them off the main thread.

/** A seeded uniform generator in [0, 1) (mulberry32): layouts are the same for the same data. */
export function rng(seed = 1) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Principal components of `data` (N x D, row-major): the mean, the covariance, and the top `k`
 * eigenvectors by subspace (power) iteration, with each vector's sign fixed so that its largest
 * entry is positive. The covariance costs N*D*D/2 multiply-adds (82 M for 10,000 x 128).
 * @param {Float32Array|Float64Array} data
 * @param {number} n points
 * @param {number} d dimensions
 * @param {number} [k] components (at most d)
 * @param {object} [eigen] options of topEigen (`maxIter`, `tol`)
 * @param {number} [sample] estimate the covariance from this many rows (seeded sample) when there
 *   are more; the mean is always over every row
 * @returns {{mean: Float64Array, components: Float64Array[], variances: number[], total: number}}
 *   `variances[i]` is the variance along component i; `total` the sum over all dimensions.
 */
export function principalComponents(data, n, d, k = 2, eigen = {}, sample = Infinity) {
  const mean = new Float64Array(d);
  for (let i = 0; i < n; i++) {
    const o = i * d;
    for (let a = 0; a < d; a++) mean[a] += data[o + a];
  }
  for (let a = 0; a < d; a++) mean[a] /= Math.max(n, 1);
  const rows = sampleRows(n, sample);
  const m = rows ? rows.length : n;
  // Upper triangle of X^T X over centred rows; one row is centred into `x` once.
  const cov = new Float64Array(d * d);
  const x = new Float64Array(d);
  for (let r = 0; r < m; r++) {
    const o = (rows ? rows[r] : r) * d;
    for (let a = 0; a < d; a++) x[a] = data[o + a] - mean[a];
    for (let a = 0; a < d; a++) {
      const xa = x[a];
      if (xa === 0) continue;
      const row = a * d;
      for (let b = a; b < d; b++) cov[row + b] += xa * x[b];
    }
  }
  const scale = 1 / Math.max(m - 1, 1);
  let total = 0;
  for (let a = 0; a < d; a++) {
    for (let b = a; b < d; b++) {
      const v = cov[a * d + b] * scale;
      cov[a * d + b] = v;
      cov[b * d + a] = v;
    }
    total += cov[a * d + a];
  }
  const { vectors, values } = topEigen(cov, d, Math.min(k, d), eigen);
  while (vectors.length < k) {
    vectors.push(new Float64Array(d));
    values.push(0);
  }
  return { mean, components: vectors, variances: values, total };
}

/** `sample` distinct row indices of `n`, sorted (a seeded partial shuffle), or null for all. */
function sampleRows(n, sample) {
  if (!(sample < n)) return null;
  const random = rng(11);
  const all = new Int32Array(n);
  for (let i = 0; i < n; i++) all[i] = i;
  for (let i = 0; i < sample; i++) {
    const j = i + Math.floor(random() * (n - i));
    const t = all[i];
    all[i] = all[j];
    all[j] = t;
  }
  return all.subarray(0, sample).sort();
}

/**
 * The top `m` eigenvectors of the symmetric `d` x `d` matrix `a`, by orthogonal iteration (block
 * power iteration with Gram-Schmidt) until the subspace stops moving.
 */
export function topEigen(a, d, m, { maxIter = 1000, tol = 1e-12 } = {}) {
  const random = rng(7);
  let vs = [];
  for (let j = 0; j < m; j++) {
    const v = new Float64Array(d);
    for (let i = 0; i < d; i++) v[i] = random() - 0.5;
    vs.push(v);
  }
  orthonormalize(vs);
  const w = new Float64Array(d);
  for (let iter = 0; iter < maxIter; iter++) {
    const next = vs.map((v) => {
      const out = new Float64Array(d);
      for (let r = 0; r < d; r++) {
        let s = 0;
        const o = r * d;
        for (let c = 0; c < d; c++) s += a[o + c] * v[c];
        out[r] = s;
      }
      return out;
    });
    orthonormalize(next);
    let moved = 0;
    for (let j = 0; j < m; j++) {
      let dot = 0;
      for (let i = 0; i < d; i++) dot += next[j][i] * vs[j][i];
      moved = Math.max(moved, 1 - Math.abs(dot));
    }
    vs = next;
    if (moved < tol) break;
  }
  const values = vs.map((v) => {
    for (let r = 0; r < d; r++) {
      let s = 0;
      for (let c = 0; c < d; c++) s += a[r * d + c] * v[c];
      w[r] = s;
    }
    let dot = 0;
    for (let i = 0; i < d; i++) dot += w[i] * v[i];
    return dot;
  });
  for (const v of vs) {
    let big = 0;
    for (let i = 1; i < d; i++) if (Math.abs(v[i]) > Math.abs(v[big]) + 1e-12) big = i;
    if (v[big] < 0) for (let i = 0; i < d; i++) v[i] = -v[i];
  }
  return { vectors: vs, values };
}

function orthonormalize(vs) {
  for (let j = 0; j < vs.length; j++) {
    const v = vs[j];
    for (let p = 0; p < j; p++) {
      let dot = 0;
      for (let i = 0; i < v.length; i++) dot += v[i] * vs[p][i];
      for (let i = 0; i < v.length; i++) v[i] -= dot * vs[p][i];
    }
    let norm = 0;
    for (let i = 0; i < v.length; i++) norm += v[i] * v[i];
    norm = Math.sqrt(norm);
    if (norm < 1e-300) {
      // A rank-deficient matrix: any unit vector orthogonal to the others will do.
      v.fill(0);
      v[j % v.length] = 1;
      if (j > 0) return orthonormalize(vs);
    } else for (let i = 0; i < v.length; i++) v[i] /= norm;
  }
}

/**
 * Rows the covariance of `pca` is estimated from when there are more (TensorBoard's projector
 * samples too): the axes of 4,096 points of a 10,000 x 128 matrix agree with the full ones to
 * within a degree or so, for 2.4 times less work; every point is still projected.
 */
export const PCA_SAMPLE = 4096;

/**
 * Project `data` on its first two principal components.
 * @returns {{coords: Float32Array, explained: number[]}} 2N interleaved x, y; the fraction of
 *   the total variance along each axis.
 */
export function pca(data, n, d, { sample = PCA_SAMPLE } = {}) {
  const { mean, components, variances, total } = principalComponents(data, n, d, 2, {}, sample);
  const coords = new Float32Array(2 * n);
  const [u, v] = components;
  for (let i = 0; i < n; i++) {
    const o = i * d;
    let x = 0;
    let y = 0;
    for (let a = 0; a < d; a++) {
      const c = data[o + a] - mean[a];
      x += c * u[a];
      y += c * v[a];
    }
    coords[2 * i] = x;
    coords[2 * i + 1] = y;
  }
  return { coords, explained: variances.map((s) => (total > 0 ? s / total : 0)) };
}

function dist2(data, d, i, j) {
  let s0 = 0;
  let s1 = 0;
  const oi = i * d;
  const oj = j * d;
  let a = 0;
  for (; a + 1 < d; a += 2) {
    const t0 = data[oi + a] - data[oj + a];
    const t1 = data[oi + a + 1] - data[oj + a + 1];
    s0 += t0 * t0;
    s1 += t1 * t1;
  }
  if (a < d) {
    const t = data[oi + a] - data[oj + a];
    s0 += t * t;
  }
  return s0 + s1;
}

// A bounded max-heap of (distance, index) per point, stored flat: the k nearest found so far.
class Neighbours {
  constructor(n, k) {
    this.n = n;
    this.k = k;
    this.idx = new Int32Array(n * k).fill(-1);
    this.dist = new Float64Array(n * k).fill(Infinity);
  }

  /** Offer j as a neighbour of i at squared distance s; returns whether it was taken. */
  push(i, j, s) {
    const { k, idx, dist } = this;
    const o = i * k;
    if (s >= dist[o]) return false;
    for (let p = 0; p < k; p++) if (idx[o + p] === j) return false;
    // Replace the root (the farthest) and sift down.
    let p = 0;
    for (;;) {
      const l = 2 * p + 1;
      const r = l + 1;
      let big = p;
      let bigDist = s;
      if (l < k && dist[o + l] > bigDist) {
        big = l;
        bigDist = dist[o + l];
      }
      if (r < k && dist[o + r] > bigDist) {
        big = r;
        bigDist = dist[o + r];
      }
      if (big === p) break;
      dist[o + p] = dist[o + big];
      idx[o + p] = idx[o + big];
      p = big;
    }
    dist[o + p] = s;
    idx[o + p] = j;
    return true;
  }
}

/**
 * Approximate k nearest neighbours: leaves of random-projection trees give candidates, then
 * rounds of neighbour-of-neighbour descent refine them (as pynndescent does).
 * @returns {{idx: Int32Array, dist: Float64Array}} N*k, distances Euclidean (not squared), each
 *   row sorted nearest first.
 */
export function nearestNeighbours(data, n, d, k, { trees = 5, leafSize = 40, rounds = 2, seed = 42 } = {}) {
  k = Math.min(k, n - 1);
  const heap = new Neighbours(n, Math.max(k, 1));
  const random = rng(seed);
  const order = new Int32Array(n);
  const side = new Float64Array(n);
  const plane = new Float64Array(d);
  for (let t = 0; t < trees && k > 0; t++) {
    for (let i = 0; i < n; i++) order[i] = i;
    const stack = [[0, n]];
    while (stack.length) {
      const [lo, hi] = stack.pop();
      if (hi - lo <= leafSize) {
        for (let p = lo; p < hi; p++) {
          for (let q = p + 1; q < hi; q++) {
            const i = order[p];
            const j = order[q];
            const s = dist2(data, d, i, j);
            heap.push(i, j, s);
            heap.push(j, i, s);
          }
        }
        continue;
      }
      // The hyperplane halfway between two random points of the node.
      const a = order[lo + Math.floor(random() * (hi - lo))];
      let b = order[lo + Math.floor(random() * (hi - lo))];
      if (a === b) b = order[a === order[lo] ? hi - 1 : lo];
      let offset = 0;
      for (let c = 0; c < d; c++) {
        plane[c] = data[a * d + c] - data[b * d + c];
        offset += plane[c] * (data[a * d + c] + data[b * d + c]) * 0.5;
      }
      let left = lo;
      for (let p = lo; p < hi; p++) {
        const i = order[p];
        let s = -offset;
        for (let c = 0; c < d; c++) s += plane[c] * data[i * d + c];
        side[i] = s;
      }
      // Partition; a tie (duplicates, a degenerate plane) goes by a coin so both sides fill.
      let right = hi - 1;
      while (left <= right) {
        const i = order[left];
        const goLeft = side[i] < 0 || (side[i] === 0 && random() < 0.5);
        if (goLeft) left++;
        else {
          order[left] = order[right];
          order[right] = i;
          right--;
        }
      }
      if (left === lo || left === hi) left = (lo + hi) >> 1; // all on one side: split anyway
      stack.push([lo, left], [left, hi]);
    }
  }
  // Neighbour descent: a neighbour of a neighbour is likely a neighbour.
  // A pair (i -> j -> m) is looked at again only when one of its two links is new since the
  // previous round: old-old pairs were compared already (NN-descent's "new" flags).
  let fresh = new Uint8Array(n * k).fill(1);
  let previous = null;
  for (let round = 0; round < rounds && k > 0; round++) {
    let updates = 0;
    const snapshot = heap.idx.slice();
    if (previous) {
      fresh = new Uint8Array(n * k);
      for (let i = 0; i < n; i++) {
        const o = i * k;
        for (let p = 0; p < k; p++) {
          let seen = false;
          for (let q = 0; q < k && !seen; q++) seen = previous[o + q] === snapshot[o + p];
          fresh[o + p] = seen ? 0 : 1;
        }
      }
    }
    previous = snapshot;
    // seen[m] === i: m is already a neighbour of i, or was compared with i in this round (many
    // neighbours of neighbours are shared: a distance is computed once per pair and round).
    const seen = new Int32Array(n).fill(-1);
    for (let i = 0; i < n; i++) {
      seen[i] = i;
      for (let p = 0; p < k; p++) if (snapshot[i * k + p] >= 0) seen[snapshot[i * k + p]] = i;
      for (let p = 0; p < k; p++) {
        const j = snapshot[i * k + p];
        if (j < 0) continue;
        const newIJ = fresh[i * k + p];
        for (let q = 0; q < k; q++) {
          const m = snapshot[j * k + q];
          if (m < 0 || seen[m] === i || !(newIJ || fresh[j * k + q])) continue;
          seen[m] = i;
          const s = dist2(data, d, i, m);
          if (heap.push(i, m, s)) updates++;
          if (heap.push(m, i, s)) updates++;
        }
      }
    }
    if (updates < 0.001 * n * k) break;
  }
  // Sort each row nearest first, distances un-squared.
  const idx = new Int32Array(n * k);
  const dist = new Float64Array(n * k);
  const pairs = [];
  for (let i = 0; i < n; i++) {
    pairs.length = 0;
    for (let p = 0; p < k; p++) pairs.push([heap.dist[i * k + p], heap.idx[i * k + p]]);
    pairs.sort((x, y) => x[0] - y[0]);
    for (let p = 0; p < k; p++) {
      idx[i * k + p] = pairs[p][1];
      dist[i * k + p] = Math.sqrt(pairs[p][0]);
    }
  }
  return { idx, dist, k };
}

/**
 * UMAP's fuzzy graph: per point a bandwidth so that its k memberships sum to log2(k), then the
 * fuzzy union of the directed graph and its transpose. Returns undirected edges and weights.
 */
export function fuzzyGraph({ idx, dist, k }, n) {
  const target = Math.log2(Math.max(k, 2));
  const weights = new Map();
  for (let i = 0; i < n; i++) {
    const o = i * k;
    let rho = 0;
    for (let p = 0; p < k; p++) if (dist[o + p] > 0) {
      rho = dist[o + p];
      break;
    }
    let lo = 0;
    let hi = Infinity;
    let sigma = 1;
    for (let it = 0; it < 64; it++) {
      let s = 0;
      for (let p = 0; p < k; p++) s += Math.exp(-Math.max(0, dist[o + p] - rho) / sigma);
      if (Math.abs(s - target) < 1e-5) break;
      if (s > target) {
        hi = sigma;
        sigma = (lo + hi) / 2;
      } else {
        lo = sigma;
        sigma = hi === Infinity ? sigma * 2 : (lo + hi) / 2;
      }
    }
    sigma = Math.max(sigma, 1e-3 * (rho || 1));
    for (let p = 0; p < k; p++) {
      const j = idx[o + p];
      if (j < 0 || j === i) continue;
      const w = Math.exp(-Math.max(0, dist[o + p] - rho) / sigma);
      const key = i < j ? i * n + j : j * n + i;
      const prev = weights.get(key);
      // Fuzzy union: a + b - ab over the two directions.
      weights.set(key, prev === undefined ? w : prev + w - prev * w);
    }
  }
  const m = weights.size;
  const heads = new Int32Array(m);
  const tails = new Int32Array(m);
  const w = new Float32Array(m);
  let e = 0;
  for (const [key, value] of weights) {
    heads[e] = Math.floor(key / n);
    tails[e] = key % n;
    w[e] = value;
    e++;
  }
  return { heads, tails, weights: w };
}

/** UMAP's curve parameters for min_dist 0.1 and spread 1 (fitted once, as umap-learn does). */
export const CURVE_A = 1.577;
export const CURVE_B = 0.8951;

/**
 * A UMAP-style layout, advanced in slices so that a caller can show it while it moves:
 * `layout.step(ms)` runs epochs for about `ms` milliseconds and returns whether any are left.
 * @param {object} opts `init` (2N Float32Array, e.g. the PCA coordinates), `epochs`, `seed`,
 *   `negatives` (repulsive samples per attraction).
 */
export function umapLayout(graph, n, { init, epochs = 300, seed = 1, negatives = 5, now = () => Date.now() } = {}) {
  const { heads, tails, weights } = graph;
  const m = heads.length;
  const y = new Float32Array(2 * n);
  // Start from the given layout scaled into [-10, 10], as umap-learn scales its spectral start.
  let lo = Infinity;
  let hi = -Infinity;
  if (init) for (let i = 0; i < 2 * n; i++) {
    lo = Math.min(lo, init[i]);
    hi = Math.max(hi, init[i]);
  }
  const random = rng(seed);
  const span = hi > lo ? hi - lo : 1;
  for (let i = 0; i < 2 * n; i++) {
    y[i] = init ? (20 * (init[i] - lo)) / span - 10 + (random() - 0.5) * 1e-3 : random() * 20 - 10;
  }
  let wmax = 0;
  for (let e = 0; e < m; e++) wmax = Math.max(wmax, weights[e]);
  // An edge is sampled every `period` epochs: the strongest every epoch, weak ones rarely.
  const period = new Float32Array(m);
  const nextAt = new Float32Array(m);
  for (let e = 0; e < m; e++) {
    period[e] = weights[e] > 0 ? wmax / weights[e] : Infinity;
    nextAt[e] = period[e];
  }
  const a = CURVE_A;
  const b = CURVE_B;
  let epoch = 0;
  const clip = (v) => (v > 4 ? 4 : v < -4 ? -4 : v);
  const runEpoch = () => {
    const alpha = 1 - epoch / epochs;
    for (let e = 0; e < m; e++) {
      if (nextAt[e] > epoch + 1) continue;
      nextAt[e] += period[e];
      const i = heads[e];
      const j = tails[e];
      let dx = y[2 * i] - y[2 * j];
      let dy = y[2 * i + 1] - y[2 * j + 1];
      let d2 = dx * dx + dy * dy;
      if (d2 > 0) {
        const pw = Math.pow(d2, b - 1); // d2^b is pw * d2: one pow per attraction
        const g = (-2 * a * b * pw) / (a * pw * d2 + 1);
        const gx = clip(g * dx) * alpha;
        const gy = clip(g * dy) * alpha;
        y[2 * i] += gx;
        y[2 * i + 1] += gy;
        y[2 * j] -= gx;
        y[2 * j + 1] -= gy;
      }
      for (let s = 0; s < negatives; s++) {
        const r = Math.floor(random() * n);
        if (r === i) continue;
        dx = y[2 * i] - y[2 * r];
        dy = y[2 * i + 1] - y[2 * r + 1];
        d2 = dx * dx + dy * dy;
        if (d2 > 0) {
          const g = (2 * b) / ((0.001 + d2) * (a * Math.pow(d2, b) + 1));
          y[2 * i] += clip(g * dx) * alpha;
          y[2 * i + 1] += clip(g * dy) * alpha;
        } else {
          y[2 * i] += 4 * alpha * (random() - 0.5) * 0.01;
        }
      }
    }
    epoch++;
  };
  return {
    positions: y,
    get epoch() {
      return epoch;
    },
    epochs,
    /** Run epochs for about `ms` milliseconds (at least one); return whether any are left. */
    step(ms = 16) {
      const start = now();
      do {
        if (epoch >= epochs) return false;
        runEpoch();
      } while (now() - start < ms);
      return epoch < epochs;
    },
  };
}

/**
 * The fraction of each point's `k` true nearest neighbours (brute force) that `found` holds: the
 * recall of an approximate graph (tests and the benchmark).
 */
export function neighbourRecall(data, n, d, found, sample = 200) {
  const { idx, k } = found;
  let hit = 0;
  const step = Math.max(1, Math.floor(n / sample));
  let total = 0;
  for (let i = 0; i < n; i += step) {
    const all = [];
    for (let j = 0; j < n; j++) if (j !== i) all.push([dist2(data, d, i, j), j]);
    all.sort((x, y) => x[0] - y[0]);
    const truth = new Set(all.slice(0, k).map((p) => p[1]));
    for (let p = 0; p < k; p++) if (truth.has(idx[i * k + p])) hit++;
    total += k;
  }
  return hit / total;
}
