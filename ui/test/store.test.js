import assert from "node:assert/strict";
import { test } from "node:test";
import { EVENTS_PER_TAG, SMOOTHED, STEP, Store, VALUE, WALL } from "../src/store.js";

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
  assert.deepEqual(Array.from(series[0].column(VALUE)), [50, 60]);
  assert.deepEqual(Array.from(series[0].column(WALL)), [1, 2]);
  assert.equal(store.scalarTags().length, 0);
});

test("telemetry scalars (@telemetry/ tags) fill the same series as old telemetry events, apart from the training tags", () => {
  const store = new Store();
  const col = (tag, walls, values) => ({ tag, steps: new Float64Array(walls.map((w) => w * 1000)), walls: new Float64Array(walls), values: new Float64Array(values) });
  store.apply({ type: "snapshot", seq: 1, run: "a", scalars: [col("@telemetry/n1/rank0/gpu0/util", [1], [50]), col("loss", [1], [0.5])], events: [{ kind: "telemetry", host: "n1", rank: 0, wall: 0.5, fields: { "gpu0/util": 40 } }] });
  store.apply({ type: "data", seq: 2, run: "a", scalars: [col("@telemetry/n1/rank0/gpu0/util", [2], [60]), col("@telemetry/n1/rank1/cpu/percent", [2], [7]), col("@telemetry/bad", [2], [1])], events: [] });
  const run = store.runs.get("a");
  assert.deepEqual(store.scalarTags(), ["loss"]);
  const util = run.telemetry.get("@telemetry/n1/rank0/gpu0/util");
  assert.equal(util.source, "n1#0");
  assert.equal(util.field, "gpu0/util");
  assert.deepEqual(Array.from(util.column(VALUE)), [50, 40, 60]);
  assert.equal(run.telemetry.get("@telemetry/n1/rank1/cpu/percent").source, "n1#1");
  assert.equal(run.telemetry.size, 2);
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

test("loading: the runs listed after connecting are awaited, snapshot by snapshot", () => {
  const store = new Store();
  const phases = [];
  store.subscribe((c) => c.kind === "sync" && phases.push(store.syncState()));
  assert.deepEqual(store.syncState(), { phase: "connecting", total: 0, done: 0 });
  store.beginSync(null); // the socket opened
  store.apply({ type: "hello", version: 1 });
  store.apply({ type: "runs", runs: ["a", "b", "c"] });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 3, done: 0 });
  store.apply({ type: "snapshot", seq: 4, run: "b", scalars: [cols([0], [1])], events: [] });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 3, done: 1 });
  store.apply({ type: "runs", runs: ["a", "b", "c", "d"] }); // a later run: no snapshot of it comes
  store.apply({ type: "snapshot", seq: 4, run: "a", scalars: [], events: [] });
  store.apply({ type: "snapshot", seq: 4, run: "c", scalars: [], events: [] });
  assert.deepEqual(store.syncState(), { phase: "ready", total: 3, done: 3 });
  assert.deepEqual(
    phases.map((p) => `${p.phase}:${p.done}/${p.total}`),
    ["connecting:0/0", "loading:0/3", "loading:1/3", "loading:2/3", "ready:3/3"],
  );
});

test("loading: a server with no runs is ready at once, and data ends the loading", () => {
  const store = new Store();
  store.beginSync(null);
  store.apply({ type: "runs", runs: [] });
  assert.equal(store.syncState().phase, "ready"); // the server said there is nothing
  store.beginSync(null); // reconnect
  store.apply({ type: "runs", runs: ["a", "b"] });
  store.apply({ type: "snapshot", seq: 1, run: "a", scalars: [], events: [] });
  assert.equal(store.syncState().phase, "loading");
  // data only ever follows the snapshots of a subscription: the rest were not for this page
  store.apply({ type: "data", seq: 2, run: "a", scalars: [cols([1], [2])], events: [] });
  assert.equal(store.syncState().phase, "ready");
});

test("a gap awaits every known run's snapshot again", () => {
  const store = new Store();
  store.beginSync(null);
  store.apply({ type: "runs", runs: ["a"] });
  store.apply({ type: "snapshot", seq: 1, run: "a", scalars: [], events: [] });
  store.apply({ type: "gap", seq: 9 });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 1, done: 0 });
  store.apply({ type: "snapshot", seq: 10, run: "a", scalars: [], events: [] });
  assert.equal(store.syncState().phase, "ready");
});

test("a gap naming runs awaits only their snapshots again; the other runs stay", () => {
  const store = new Store();
  store.beginSync(null);
  store.apply({ type: "runs", runs: ["a", "b"] });
  store.apply({ type: "snapshot", seq: 1, run: "a", scalars: [cols([0, 1], [1, 2])], events: [] });
  store.apply({ type: "snapshot", seq: 1, run: "b", scalars: [cols([0, 1], [3, 4])], events: [] });
  store.apply({ type: "gap", seq: 9, runs: ["b"] });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 1, done: 0 });
  assert.equal(store.held.has("a"), true);
  assert.equal(store.held.has("b"), false);
  assert.notEqual(store.series("a", "loss"), undefined); // its points stay: nothing of it is re-sent
  store.apply({ type: "snapshot", seq: 10, run: "b", scalars: [cols([0, 1, 2], [3, 4, 5])], events: [] });
  assert.equal(store.syncState().phase, "ready");
});

test("reset: fresh snapshots of the listed runs replace them, other runs are emptied", () => {
  const store = new Store();
  store.beginSync(null);
  store.apply({ type: "runs", runs: ["a", "b"] });
  store.apply({ type: "snapshot", seq: 1, run: "a", scalars: [cols([0, 1, 2, 3], [4, 3, 2, 1])], events: [{ kind: "text", tag: "n", step: 3, wall: 1003, text: "late" }] });
  store.apply({ type: "snapshot", seq: 1, run: "b", scalars: [cols([0, 1], [1, 1])], events: [] });
  store.apply({ type: "data", seq: 2, run: "a", scalars: [cols([4], [0])], events: [] });
  store.apply({ type: "reset", seq: 7, runs: ["a"] });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 1, done: 0 });
  assert.equal(store.series("b", "loss").length, 0); // not in the reset: emptied
  assert.equal(store.series("a", "loss").length, 5); // kept on screen until its snapshot comes
  store.apply({ type: "snapshot", seq: 7, run: "a", scalars: [cols([0, 1], [4, 3])], events: [] });
  assert.deepEqual(Array.from(store.series("a", "loss").column(STEP)), [0, 1]);
  assert.equal(store.runs.get("a").texts.size, 0);
  assert.equal(store.syncState().phase, "ready");
  assert.deepEqual(store.runNames(), ["a", "b"]); // runs stay known
});

test("a subscription to some runs: the others are emptied, synced ends the loading, a gap re-awaits them", () => {
  const store = new Store();
  store.apply({ type: "runs", runs: ["a", "b", "c"] });
  for (const run of ["a", "b", "c"]) store.apply({ type: "snapshot", seq: 1, run, scalars: [cols([0, 1], [1, 2])], events: [] });
  assert.equal(store.syncState().phase, "ready");
  const summaries = [];
  store.subscribe((c) => c.kind === "summaries" && summaries.push(c.summaries));
  store.subscribeTo(["a", "c"]);
  assert.equal(store.series("b", "loss"), undefined); // its buffers are gone
  assert.equal(store.series("a", "loss").length, 2); // kept until its snapshot replaces it
  assert.deepEqual(store.syncState(), { phase: "loading", total: 2, done: 0 });
  store.apply({ type: "snapshot", seq: 2, run: "a", scalars: [cols([0], [1])], events: [] });
  // A run the server could not read sends no snapshot: `synced` says the history is in anyway.
  store.apply({ type: "synced", seq: 2 });
  assert.equal(store.syncState().phase, "ready");
  store.apply({ type: "gap", seq: 3 });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 2, done: 0 });
  store.apply({ type: "summaries", runs: [{ name: "a", status: "live" }] });
  assert.deepEqual(summaries, [[{ name: "a", status: "live" }]]);
  store.subscribeTo(null);
  assert.deepEqual(store.syncState(), { phase: "loading", total: 3, done: 0 });
});

test("split snapshots: the scalars replace the run at once, its events follow and are added", () => {
  const store = new Store();
  store.subscribeTo(["a"]);
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols([0, 1, 2], [1, 1, 1])], events: [] });
  const hist = { kind: "text", tag: "notes", step: 1, wall: 1001, text: "hello" };
  store.apply({ type: "snapshot", seq: 5, run: "a", scalars: [cols([0, 5], [9, 8])], events: [], events_follow: true });
  assert.deepEqual(Array.from(store.series("a", "loss").column(STEP)), [0, 5]); // replaced
  assert.equal(store.held.has("a"), false); // not whole yet: a keep subscription re-asks for it
  store.apply({ type: "snapshot_events", seq: 5, run: "a", scalars: [], events: [hist] });
  assert.equal(store.runs.get("a").texts.get("notes")[0].text, "hello");
  assert.deepEqual(Array.from(store.series("a", "loss").column(STEP)), [0, 5]); // scalars untouched
  assert.equal(store.held.get("a"), 2000);
});

test("keep: only the runs not held are awaited; frames of dropped runs are ignored", () => {
  const store = new Store();
  store.apply({ type: "runs", runs: ["a", "b", "c"] });
  store.subscribeTo(["a", "b"], { keep: true });
  for (const run of ["a", "b"]) store.apply({ type: "snapshot", seq: 1, run, scalars: [cols([0, 1], [1, 2])], events: [] });
  assert.equal(store.syncState().phase, "ready");
  store.subscribeTo(["b", "c"], { keep: true });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 1, done: 0 }); // c only
  assert.equal(store.series("a", "loss"), undefined); // dropped
  // A frame of a that was on the way before the server heard the new subscription:
  store.apply({ type: "data", seq: 2, run: "a", scalars: [cols([2], [3])], events: [] });
  assert.equal(store.series("a", "loss"), undefined);
  store.apply({ type: "data", seq: 2, run: "b", scalars: [cols([2], [3])], events: [] });
  assert.equal(store.series("b", "loss").length, 3); // b kept its history and goes on live
  // More points per tag than b was held with: b is read again, so it is awaited too.
  store.maxPoints = 4000;
  store.subscribeTo(["b", "c"], { keep: true });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 2, done: 0 });
  // A gap: nothing held counts, every run is awaited again.
  store.maxPoints = 2000;
  store.apply({ type: "snapshot", seq: 3, run: "b", scalars: [], events: [] });
  store.apply({ type: "gap", seq: 4 });
  store.subscribeTo(["b", "c"], { keep: true });
  assert.deepEqual(store.syncState(), { phase: "loading", total: 2, done: 0 });
});

test("subscribe with current hears, after a microtask, what the store holds already", async () => {
  const store = new Store();
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols([0, 1], [5, 4])], events: [{ kind: "histogram", tag: "w", step: 0, edges: [0, 1], counts: [1] }, { kind: "text", tag: "note", step: 0, text: "hi" }] });
  store.apply({ type: "data", seq: 2, run: "b", scalars: [], events: [{ kind: "hparams", step: 0, hparams: { lr: 0.1 }, metrics: [] }] });
  const heard = [];
  store.subscribe((change) => heard.push(`${change.kind}:${change.run}:${change.tags.join(",")}`), { current: true });
  assert.deepEqual(heard, []); // not inside the subscriber's constructor
  await Promise.resolve();
  assert.deepEqual(heard, ["runs:null:", "scalars:a:loss", "histogram:a:w", "text:a:note", "hparams:b:", "sync:null:"]);
  // Then live changes, as any listener.
  store.apply({ type: "data", seq: 3, run: "a", scalars: [cols([2], [3])], events: [] });
  assert.equal(heard.at(-1), "scalars:a:loss");
});

test("subscribe with current hears nothing of the past once unsubscribed", async () => {
  const store = new Store();
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols([0], [5])], events: [] });
  const heard = [];
  const off = store.subscribe((change) => heard.push(change.kind), { current: true });
  off();
  await Promise.resolve();
  assert.deepEqual(heard, []);
});
