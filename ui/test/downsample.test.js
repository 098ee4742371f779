import assert from "node:assert/strict";
import { test } from "node:test";
import { gather, lowerBound, minMaxIndices, upperBound } from "../src/downsample.js";

const series = (n, f) => {
  const xs = Float64Array.from({ length: n }, (_, i) => i);
  const ys = Float64Array.from({ length: n }, (_, i) => f(i));
  return { xs, ys };
};
const isStrictlyAscending = (idx) => idx.every((v, i) => i === 0 || v > idx[i - 1]);

test("short series are returned whole", () => {
  const { xs, ys } = series(10, (i) => i * i);
  assert.deepEqual(Array.from(minMaxIndices(xs, ys, 100)), [...Array(10).keys()]);
  assert.equal(minMaxIndices([], [], 10).length, 0);
});

test("output is bounded by the pixel columns and ascending", () => {
  const { xs, ys } = series(1_000_000, (i) => Math.sin(i / 1000) + ((i * 7919) % 13) / 13);
  const idx = minMaxIndices(xs, ys, 500);
  assert.ok(idx.length <= 2 * 500 + 4, `${idx.length} rows`);
  assert.ok(idx.length > 500);
  assert.ok(isStrictlyAscending(idx));
});

test("the first and the newest point are always exact", () => {
  const { xs, ys } = series(10_000, (i) => (i % 2 ? 1 : -1));
  const idx = minMaxIndices(xs, ys, 37);
  assert.equal(idx[0], 0);
  assert.equal(idx[idx.length - 1], 9999);
  assert.equal(gather(ys, idx)[idx.length - 1], ys[9999]);
});

test("spikes survive: the min and max of every column are kept", () => {
  const { xs, ys } = series(100_000, () => 0);
  ys[12_345] = 1000;
  ys[77_777] = -1000;
  const drawn = gather(ys, minMaxIndices(xs, ys, 100));
  assert.ok(drawn.includes(1000));
  assert.ok(drawn.includes(-1000));
});

test("global extremes equal those of the full series", () => {
  const { xs, ys } = series(50_000, (i) => Math.sin(i * 0.37) * Math.log(i + 2));
  const drawn = gather(ys, minMaxIndices(xs, ys, 64));
  assert.equal(Math.max(...drawn), Math.max(...ys));
  assert.equal(Math.min(...drawn), Math.min(...ys));
});

test("a zoomed range is sampled finely and keeps one neighbour on each side", () => {
  const { xs, ys } = series(100_000, (i) => i);
  const idx = minMaxIndices(xs, ys, 200, 5000, 5100);
  const inRange = Array.from(idx).filter((i) => xs[i] >= 5000 && xs[i] <= 5100);
  assert.equal(inRange.length, 101); // every point of the zoomed range
  assert.ok(idx.includes(4999) && idx.includes(5101));
  assert.equal(idx[idx.length - 1], 99_999);
  const wide = minMaxIndices(xs, ys, 200, 0, 99_999);
  assert.ok(wide.length <= 404);
});

test("non-finite values do not hide the finite extremes", () => {
  const { xs, ys } = series(10_000, (i) => (i === 500 ? NaN : i % 100));
  const drawn = gather(ys, minMaxIndices(xs, ys, 10));
  assert.ok(drawn.includes(99));
  assert.ok(drawn.includes(0));
});

test("x that goes backwards (a restarted run) is bucketed by position", () => {
  const xs = Float64Array.from({ length: 10_000 }, (_, i) => i % 6000);
  const ys = Float64Array.from({ length: 10_000 }, (_, i) => i);
  const idx = minMaxIndices(xs, ys, 50);
  assert.ok(idx.length <= 104);
  assert.ok(isStrictlyAscending(idx));
  assert.equal(idx[idx.length - 1], 9999);
});

test("lowerBound finds the first element not below x", () => {
  const xs = [1, 2, 2, 5];
  assert.equal(lowerBound(xs, 0), 0);
  assert.equal(lowerBound(xs, 2), 1);
  assert.equal(lowerBound(xs, 3), 3);
  assert.equal(lowerBound(xs, 9), 4);
});

test("upperBound finds the first element above x", () => {
  const xs = [1, 2, 2, 5];
  assert.equal(upperBound(xs, 0), 0);
  assert.equal(upperBound(xs, 2), 3);
  assert.equal(upperBound(xs, 5), 4);
});

test("nearestIndex picks the closest element, the earlier on a tie", async () => {
  const { nearestIndex } = await import("../src/downsample.js");
  const xs = [0, 10, 20];
  assert.equal(nearestIndex(xs, -5), 0);
  assert.equal(nearestIndex(xs, 4), 0);
  assert.equal(nearestIndex(xs, 5), 0);
  assert.equal(nearestIndex(xs, 6), 1);
  assert.equal(nearestIndex(xs, 99), 2);
});
