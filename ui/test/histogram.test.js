import assert from "node:assert/strict";
import { test } from "node:test";
import { niceTicks, rebin, sampleEvenly, valueRange } from "../src/histogram.js";

test("rebin conserves the total count", () => {
  const edges = Float64Array.from([-1, -0.3, 0.2, 0.9, 2]);
  const counts = Float64Array.from([5, 10, 2, 7]);
  const out = rebin(edges, counts, -1, 2, 13);
  const total = out.reduce((a, b) => a + b, 0);
  assert.ok(Math.abs(total - 24) < 1e-9, `total ${total}`);
});

test("rebin onto the same bins is the identity, and shares partial overlaps", () => {
  const edges = Float64Array.from([0, 1, 2, 3]);
  const counts = Float64Array.from([4, 0, 6]);
  assert.deepEqual(Array.from(rebin(edges, counts, 0, 3, 3)), [4, 0, 6]);
  assert.deepEqual(Array.from(rebin(Float64Array.from([0, 2]), Float64Array.from([8]), 0, 4, 4)), [4, 4, 0, 0]);
});

test("rebin puts a zero-width bucket (all values equal) in one bin", () => {
  const out = rebin(Float64Array.from([1, 1]), Float64Array.from([9]), 0, 2, 4);
  assert.deepEqual(Array.from(out), [0, 0, 9, 0]);
});

test("sampleEvenly bounds the count and keeps the first and last", () => {
  const list = Array.from({ length: 1000 }, (_, i) => i);
  const out = sampleEvenly(list, 40);
  assert.equal(out.length, 40);
  assert.equal(out[0], 0);
  assert.equal(out[39], 999);
  assert.deepEqual(sampleEvenly([1, 2], 40), [1, 2]);
});

test("valueRange spans all histograms and widens a single point", () => {
  const h = (a, b) => ({ edges: Float64Array.from([a, b]) });
  assert.deepEqual(valueRange([h(-1, 0), h(2, 3)]), [-1, 3]);
  assert.deepEqual(valueRange([h(5, 5)]), [4.5, 5.5]);
});

test("niceTicks gives round values and an exact zero", () => {
  const ticks = niceTicks(-0.06, 0.05, 5);
  assert.ok(ticks.includes(0), ticks.join(","));
  for (const v of ticks) assert.equal(+v.toFixed(6), v);
  assert.deepEqual(niceTicks(0, 100, 5), [0, 20, 40, 60, 80, 100]);
});
