import assert from "node:assert/strict";
import test from "node:test";
import { shareGrid } from "../src/align.js";

test("shareGrid keeps each column's min and max in order, on x values shared by every line", () => {
  // 0..99 on 10 columns: each column holds 10 points.
  const xs = Float64Array.from({ length: 100 }, (_, i) => i);
  const up = Float64Array.from(xs, (x) => x);
  const spike = Float64Array.from(xs, (x) => (x === 55 ? 1000 : x === 57 ? -1000 : 0));
  const grid = shareGrid([{ xs, ys: up }, { xs, ys: spike }], 10);
  assert.equal(grid.xs.length, 20);
  assert.equal(grid.xs[0], 0);
  assert.equal(grid.xs[19], 99);
  for (let i = 1; i < grid.xs.length; i++) assert.ok(grid.xs[i] > grid.xs[i - 1]);
  // Rising line: the first point of each column, then the last.
  assert.deepEqual(grid.ys[0].slice(0, 4), [0, 9, 10, 19]);
  // Column 5 (x 49.5..59.4): the max (at 55) comes before the min (at 57).
  const c = Math.floor((55 / 99) * 10);
  assert.deepEqual(grid.ys[1].slice(2 * c, 2 * c + 2), [1000, -1000]);
});

test("shareGrid leaves gaps (null) where a line has no points, and drops non-finite values", () => {
  const a = { xs: [0, 10], ys: [1, 2] };
  const b = { xs: [0, 1, 2, 3], ys: [5, NaN, Infinity, 6] };
  const grid = shareGrid([a, b], 5);
  assert.equal(grid.xs.length, 10);
  assert.deepEqual(grid.ys[0], [1, null, null, null, null, null, null, null, 2, null]);
  // b: column 0 holds x 0 and 1 (NaN dropped): one point; column 1 holds x 2 (Infinity, dropped) and 3.
  assert.deepEqual(grid.ys[1].slice(0, 4), [5, null, 6, null]);
  assert.deepEqual(grid.ys[1].slice(4), [null, null, null, null, null, null]);
});

test("shareGrid over one x, over nothing, and with a bad column count", () => {
  const one = shareGrid([{ xs: [7], ys: [3] }], 100);
  assert.deepEqual(Array.from(one.xs), [7, 7.5]);
  assert.deepEqual(one.ys, [[3, null]]);
  const none = shareGrid([{ xs: [], ys: [] }], 10);
  assert.equal(none.xs.length, 0);
  assert.deepEqual(none.ys, [[]]);
  assert.throws(() => shareGrid([], 0), /columns must be a positive integer, got 0/);
  assert.throws(() => shareGrid([], 2.5), /got 2.5/);
});

test("shareGrid fills the arrays of an earlier grid again when their sizes fit", () => {
  const a = { xs: [0, 1, 2, 3], ys: [1, 2, 3, 4] };
  const first = shareGrid([a, a], 2);
  const again = shareGrid([{ xs: [0, 3], ys: [9, 8] }, a], 2, undefined, undefined, first);
  assert.equal(again.xs, first.xs);
  assert.equal(again.ys[0], first.ys[0]);
  assert.deepEqual(again.ys[0], [9, null, 8, null]);
  assert.deepEqual(again.ys[1], shareGrid([a], 2).ys[0]);
  // Another width: new arrays.
  const wider = shareGrid([a], 4, undefined, undefined, again);
  assert.notEqual(wider.xs, again.xs);
  assert.equal(wider.ys[0].length, 8);
});
