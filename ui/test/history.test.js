import assert from "node:assert/strict";
import { test } from "node:test";
import { fetchScalars, needsHistory, spliceRange } from "../src/history.js";

test("fetchScalars asks /api/scalars with the range and token, and turns nulls into NaN", async () => {
  let asked = null;
  const fetchImpl = async (url, init) => {
    asked = { url, init };
    return { ok: true, json: async () => ({ steps: [10, 11], wall_times: [1, 2], values: [0.5, null] }) };
  };
  const out = await fetchScalars({ run: "r 1", tag: "a/b", start: 9.5, end: 20.2, maxPoints: 800, token: "s", fetchImpl });
  assert.equal(asked.url, "/api/scalars?run=r+1&tag=a%2Fb&start=9&end=21&max_points=800");
  assert.equal(asked.init.headers.Authorization, "Bearer s");
  assert.deepEqual(Array.from(out.steps), [10, 11]);
  assert.ok(Number.isNaN(out.values[1]));
});

test("fetchScalars names the HTTP status on failure", async () => {
  const fetchImpl = async () => ({ ok: false, status: 401 });
  await assert.rejects(fetchScalars({ run: "r", tag: "t", start: 0, end: 1, maxPoints: 2, fetchImpl }), /answered 401/);
});

test("needsHistory: only ranges that reach downsampled or dropped history", () => {
  const series = (historyEnd, historyDownsampled, dropped, first) => ({
    historyEnd,
    historyDownsampled,
    length: 1,
    buffer: { dropped },
    column: () => [first],
  });
  assert.equal(needsHistory(series(1000, true, 0, 0), 500, 600), true);
  assert.equal(needsHistory(series(1000, true, 0, 0), 1001, 1200), false);
  assert.equal(needsHistory(series(1000, false, 0, 0), 500, 600), false);
  assert.equal(needsHistory(series(-Infinity, false, 5, 300), 100, 200), true);
});

test("spliceRange replaces the received rows inside the range only", () => {
  const received = { xs: [0, 10, 20, 30, 40], ys: [0, 1, 2, 3, 4] };
  const fetched = { xs: [10, 15, 20, 25, 30], ys: [9, 9, 9, 9, 9] };
  const out = spliceRange(received, fetched, 10, 30);
  assert.deepEqual(Array.from(out.xs), [0, 10, 15, 20, 25, 30, 40]);
  assert.deepEqual(Array.from(out.ys), [0, 9, 9, 9, 9, 9, 4]);
});
