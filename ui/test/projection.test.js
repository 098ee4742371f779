import assert from "node:assert/strict";
import { test } from "node:test";
import { fuzzyGraph, nearestNeighbours, neighbourRecall, pca, principalComponents, rng, topEigen, umapLayout } from "../src/projection.js";

const close = (a, b, eps, what) => assert.ok(Math.abs(a - b) <= eps, `${what}: ${a} vs ${b}`);

test("topEigen finds the eigenpairs of [[2, 1], [1, 2]]: 3 along (1, 1)/√2, 1 along (1, -1)/√2", () => {
  const { vectors, values } = topEigen(new Float64Array([2, 1, 1, 2]), 2, 2);
  close(values[0], 3, 1e-9, "first eigenvalue");
  close(values[1], 1, 1e-9, "second eigenvalue");
  close(vectors[0][0], Math.SQRT1_2, 1e-6, "v1[0]");
  close(vectors[0][1], Math.SQRT1_2, 1e-6, "v1[1]");
  close(Math.abs(vectors[1][0]), Math.SQRT1_2, 1e-6, "v2[0]");
  close(vectors[1][0] * vectors[1][1], -0.5, 1e-6, "v2 is (1, -1)/√2 up to sign");
});

test("PCA of four points has the known axes, variances and coordinates", () => {
  // (±2, 0, 0) and (0, ±1, 0) shifted by (5, 5, 5): axis x with variance 8/3, axis y with 2/3.
  const data = new Float32Array([7, 5, 5, 3, 5, 5, 5, 6, 5, 5, 4, 5]);
  const { mean, components, variances, total } = principalComponents(data, 4, 3, 2);
  assert.deepEqual(Array.from(mean), [5, 5, 5]);
  close(variances[0], 8 / 3, 1e-9, "variance along x");
  close(variances[1], 2 / 3, 1e-9, "variance along y");
  close(total, 10 / 3, 1e-9, "total variance");
  close(components[0][0], 1, 1e-6, "first axis is +x");
  close(components[1][1], 1, 1e-6, "second axis is +y");
  const { coords, explained } = pca(data, 4, 3);
  const rounded = Array.from(coords, (v) => Math.round(v * 1e6) / 1e6 + 0);
  assert.deepEqual(rounded, [2, 0, -2, 0, 0, 1, 0, -1]);
  close(explained[0], 0.8, 1e-9, "explained by the first axis");
  close(explained[1], 0.2, 1e-9, "explained by the second axis");
});

test("PCA recovers a planted 2-D subspace in 64 dimensions, to sign", () => {
  const n = 2000;
  const d = 64;
  const random = rng(3);
  const gauss = () => Math.sqrt(-2 * Math.log(random() + 1e-12)) * Math.cos(2 * Math.PI * random());
  // Orthonormal u (along dims 0..1) and v (along dims 2..3), variances 25 and 4, noise 0.01.
  const u = new Float64Array(d);
  const v = new Float64Array(d);
  u[0] = u[1] = Math.SQRT1_2;
  v[2] = Math.SQRT1_2;
  v[3] = -Math.SQRT1_2;
  const data = new Float32Array(n * d);
  for (let i = 0; i < n; i++) {
    const s = 5 * gauss();
    const t = 2 * gauss();
    for (let a = 0; a < d; a++) data[i * d + a] = s * u[a] + t * v[a] + 0.1 * gauss();
  }
  const { components } = principalComponents(data, n, d, 2);
  const cos = (x, y) => x.reduce((acc, xi, i) => acc + xi * y[i], 0);
  assert.ok(Math.abs(cos(components[0], u)) > 0.999, "first component is u");
  assert.ok(Math.abs(cos(components[1], v)) > 0.999, "second component is v");
});

test("PCA from a sample of the rows finds the axes of the full matrix", () => {
  const n = 6000;
  const d = 16;
  const random = rng(9);
  const data = new Float32Array(n * d);
  for (let i = 0; i < n; i++) for (let a = 0; a < d; a++) data[i * d + a] = (random() - 0.5) * (a === 3 ? 10 : a === 5 ? 4 : 1);
  const full = principalComponents(data, n, d, 2);
  const sampled = principalComponents(data, n, d, 2, {}, 1000);
  for (let c = 0; c < 2; c++) {
    const cos = full.components[c].reduce((acc, v, i) => acc + v * sampled.components[c][i], 0);
    assert.ok(Math.abs(cos) > 0.995, `component ${c}: cos ${cos}`);
  }
  assert.deepEqual(Array.from(sampled.mean), Array.from(full.mean), "the mean is over every row");
  assert.equal(pca(data, n, d, { sample: 1000 }).coords.length, 2 * n, "every point projected");
});

test("PCA of one dimension or one point does not fail", () => {
  assert.deepEqual(Array.from(pca(new Float32Array([1, 2, 3]), 3, 1).coords), [-1, 0, 0, 0, 1, 0]);
  assert.deepEqual(Array.from(pca(new Float32Array([4, 4]), 1, 2).coords), [0, 0]);
});

function clusters(n, d, centres, seed = 5) {
  const random = rng(seed);
  const data = new Float32Array(n * d);
  const label = new Int32Array(n);
  const centre = Array.from({ length: centres }, () => Array.from({ length: d }, () => 10 * (random() - 0.5)));
  for (let i = 0; i < n; i++) {
    label[i] = i % centres;
    for (let a = 0; a < d; a++) data[i * d + a] = centre[label[i]][a] + (random() - 0.5);
  }
  return { data, label };
}

test("the approximate neighbour graph finds most true neighbours", () => {
  const n = 1500;
  const d = 16;
  const { data } = clusters(n, d, 6);
  const found = nearestNeighbours(data, n, d, 10);
  assert.equal(found.idx.length, n * 10);
  for (let i = 0; i < n; i++) {
    for (let p = 1; p < 10; p++) assert.ok(found.dist[i * 10 + p - 1] <= found.dist[i * 10 + p], "rows sorted");
    for (let p = 0; p < 10; p++) assert.notEqual(found.idx[i * 10 + p], i, "no self loops");
  }
  assert.ok(neighbourRecall(data, n, d, found, 100) > 0.9);
});

test("the UMAP-style layout keeps clusters apart and runs in slices", () => {
  const n = 600;
  const d = 8;
  const { data, label } = clusters(n, d, 3);
  const graph = fuzzyGraph(nearestNeighbours(data, n, d, 10), n);
  assert.ok(graph.heads.length >= n * 5 && graph.weights.every((w) => w > 0 && w <= 1));
  let clock = 0;
  const layout = umapLayout(graph, n, { init: pca(data, n, d).coords, epochs: 120, now: () => (clock += 1) });
  let slices = 0;
  while (layout.step(5)) slices++;
  assert.equal(layout.epoch, 120);
  assert.ok(slices >= 20, `ran in slices, not at once: ${slices}`);
  // Mean distance to the own cluster's centroid is much smaller than between centroids.
  const cx = [0, 0, 0];
  const cy = [0, 0, 0];
  const count = [0, 0, 0];
  const y = layout.positions;
  for (let i = 0; i < n; i++) {
    cx[label[i]] += y[2 * i];
    cy[label[i]] += y[2 * i + 1];
    count[label[i]]++;
  }
  for (let c = 0; c < 3; c++) {
    cx[c] /= count[c];
    cy[c] /= count[c];
  }
  let within = 0;
  for (let i = 0; i < n; i++) within += Math.hypot(y[2 * i] - cx[label[i]], y[2 * i + 1] - cy[label[i]]);
  within /= n;
  const between = Math.min(Math.hypot(cx[0] - cx[1], cy[0] - cy[1]), Math.hypot(cx[0] - cx[2], cy[0] - cy[2]), Math.hypot(cx[1] - cx[2], cy[1] - cy[2]));
  assert.ok(Number.isFinite(within) && between > 3 * within, `between ${between} within ${within}`);
});
