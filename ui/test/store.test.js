import assert from "node:assert/strict";
import { test } from "node:test";
import { EVENTS_PER_TAG, SMOOTHED, STEP, Store, VALUE } from "../src/store.js";

const cols = (steps, values) => ({
  tag: "loss",
  steps: Float64Array.from(steps),
  walls: Float64Array.from(steps, (s) => 1000 + s),
  values: Float64Array.from(values),
});

test("data appends and snapshot replaces a run's points", () => {
  const store = new Store();
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols([0, 1], [5, 4])], events: [] });
  store.apply({ type: "data", seq: 2, run: "a", scalars: [cols([2], [3])], events: [] });
  assert.deepEqual(Array.from(store.series("a", "loss").column(STEP)), [0, 1, 2]);
  store.apply({ type: "snapshot", seq: 5, run: "a", scalars: [cols([0, 10], [9, 8])], events: [] });
  assert.deepEqual(Array.from(store.series("a", "loss").column(VALUE)), [9, 8]);
  assert.deepEqual(store.runNames(), ["a"]);
});

test("the smoothed column restarts after a snapshot and follows setSmoothing", () => {
  const store = new Store();
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols([0, 1], [100, 100])], events: [] });
  store.apply({ type: "snapshot", seq: 2, run: "a", scalars: [cols([0, 1], [2, 4])], events: [] });
  const s = store.series("a", "loss");
  assert.equal(s.column(SMOOTHED)[0], 2); // debiased, not pulled towards the old 100
  store.setSmoothing(0);
  assert.deepEqual(Array.from(s.column(SMOOTHED)), [2, 4]);
});

test("listeners hear which tags changed", () => {
  const store = new Store();
  const seen = [];
  store.subscribe((c) => seen.push(`${c.kind}:${c.run}:${c.tags.join(",")}`));
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols([0], [1])], events: [] });
  assert.ok(seen.includes("scalars:a:loss"), seen.join(" "));
});

test("events are kept sorted by step, deduplicated by step and bounded", () => {
  const store = new Store();
  const ev = (step) => ({ kind: "text", tag: "notes", step, wall: step, text: `s${step}` });
  store.apply({ type: "data", seq: 1, run: "a", scalars: [], events: [ev(3), ev(1), ev(2), ev(2)] });
  assert.deepEqual(store.runs.get("a").texts.get("notes").map((e) => e.step), [1, 2, 3]);
  const many = Array.from({ length: EVENTS_PER_TAG + 10 }, (_, i) => ev(100 + i));
  store.apply({ type: "data", seq: 2, run: "a", scalars: [], events: many });
  const list = store.runs.get("a").texts.get("notes");
  assert.equal(list.length, EVENTS_PER_TAG);
  assert.equal(list[list.length - 1].step, 100 + EVENTS_PER_TAG + 9);
});

test("telemetry fields become per-source series over wall time", () => {
  const store = new Store();
  const tel = (wall, util) => ({ kind: "telemetry", host: "n1", rank: 0, wall, fields: { "gpu0/util": util, note: "x" } });
  store.apply({ type: "data", seq: 1, run: "a", scalars: [], events: [tel(1, 50), tel(2, 60)] });
  const series = [...store.runs.get("a").telemetry.values()];
  assert.equal(series.length, 1);
  assert.equal(series[0].field, "gpu0/util");
  assert.equal(series[0].source, "n1#0");
  assert.deepEqual(Array.from(series[0].buffer.column(1)), [50, 60]);
});

test("runs messages announce runs before they have data", () => {
  const store = new Store();
  store.apply({ type: "runs", runs: ["x", "y", 3] });
  assert.deepEqual(store.announced, ["x", "y"]);
});

test("series track whether steps stay ascending, and a snapshot resets it", () => {
  const store = new Store();
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols([0, 1, 2], [1, 1, 1])], events: [] });
  const s = store.series("a", "loss");
  assert.equal(s.stepsAscending, true);
  store.apply({ type: "data", seq: 2, run: "a", scalars: [cols([1], [1])], events: [] });
  assert.equal(s.stepsAscending, false);
  store.apply({ type: "snapshot", seq: 3, run: "a", scalars: [cols([0, 5], [1, 1])], events: [] });
  assert.equal(s.stepsAscending, true);
});

test("images keep fewer events per tag than text", async () => {
  const { MEDIA_PER_TAG } = await import("../src/store.js");
  const store = new Store();
  const img = (step) => ({ kind: "image", tag: "i", step, wall: step, format: "png", data: new Uint8Array(1) });
  store.apply({ type: "data", seq: 1, run: "a", scalars: [], events: Array.from({ length: MEDIA_PER_TAG + 5 }, (_, i) => img(i)) });
  assert.equal(store.runs.get("a").images.get("i").length, MEDIA_PER_TAG);
  assert.ok(MEDIA_PER_TAG < EVENTS_PER_TAG);
});
