import assert from "node:assert/strict";
import { test } from "node:test";
import { colorFor, hashString, PALETTE } from "../src/dom.js";
import { aggregate, bandEdges, lastAtOrBefore } from "../src/groups.js";
import { rememberKey, Remembered, REMEMBER_VERSION } from "../src/remember.js";
import { compareCells, DEFAULT_SELECTED, groupKey, RunsModel, SELECT_ALL_UP_TO } from "../src/runs.js";

function model(n, extra = () => ({})) {
  const m = new RunsModel();
  m.updateSummaries(
    Array.from({ length: n }, (_, i) => ({
      name: `run-${String(i).padStart(4, "0")}`,
      status: i % 3 === 0 ? "live" : "finished",
      start: 1000 + i,
      last_wall: 2000 + i,
      last_step: i * 10,
      host: `h${i % 2}`,
      hparams: { lr: 0.001 * (i + 1), optimizer: i % 2 ? "adam" : "sgd" },
      last: { "eval/accuracy": i / n, "train/loss": 1 - i / n },
      min: { "eval/accuracy": 0, "train/loss": 1 - i / n },
      max: { "eval/accuracy": i / n, "train/loss": 1 },
      ...extra(i),
    })),
  );
  return m;
}

test("run colours depend on the name only", () => {
  assert.equal(colorFor("b"), colorFor("b"));
  assert.ok(PALETTE.includes(colorFor("anything")));
  assert.equal(hashString("abc"), 0x1a47e90b);
  // Different names spread over the palette rather than sharing one colour.
  const used = new Set(Array.from({ length: 50 }, (_, i) => colorFor(`seed${i}`)));
  assert.ok(used.size >= 8, `${used.size} colours for 50 runs`);
  // Telemetry lines keep first-use order.
  assert.equal(colorFor("gpu0", "telemetry-test"), PALETTE[0]);
  assert.equal(colorFor("gpu1", "telemetry-test"), PALETTE[1]);
});

test("few runs are all selected and subscribed to as 'every run'", () => {
  const m = model(SELECT_ALL_UP_TO);
  m.selectDefault();
  assert.equal(m.selected, null);
  assert.equal(m.subscription(), null);
  assert.equal(m.drawn().length, SELECT_ALL_UP_TO);
});

test("many runs: the most recently active are selected; the subscription lists them", () => {
  const m = model(1000);
  m.selectDefault();
  assert.equal(m.selected.size, DEFAULT_SELECTED);
  assert.deepEqual(m.subscription(), Array.from({ length: DEFAULT_SELECTED }, (_, i) => `run-0${990 + i}`));
  m.setSelected(["run-0000"], true);
  assert.equal(m.subscription().length, DEFAULT_SELECTED + 1);
});

test("hiding or filtering narrows what is drawn and subscribed to", () => {
  const m = model(5);
  m.selectDefault();
  m.toggleHidden("run-0001");
  assert.deepEqual(m.subscription(), ["run-0000", "run-0002", "run-0003", "run-0004"]);
  assert.equal(m.tableRows().length, 4);
  m.showHidden = true;
  assert.equal(m.tableRows().length, 5);
  assert.equal(m.setCondition('optimizer == "adam" and lr < 0.003'), "");
  assert.deepEqual(m.drawn(), []); // run-0001 is adam with lr 0.002, but hidden
  m.toggleHidden("run-0001");
  assert.deepEqual(m.drawn(), ["run-0001"]);
  assert.equal(m.setCondition("lr <"), 'expected a field, number or string at the end of "lr <"');
  assert.deepEqual(m.drawn(), ["run-0001"]); // the last good condition stays
  assert.match(m.setCondition("eval/acc > 1"), /unknown field "eval\/acc"/);
  assert.equal(m.setCondition("eval/accuracy >= 0.6 and train/loss.min < 0.3"), "");
  assert.deepEqual(m.drawn(), ["run-0004"]);
  assert.equal(m.setCondition("eval/accuracy >= 0.6 and train/loss.min <= 0.4"), "");
  assert.deepEqual(m.drawn(), ["run-0003", "run-0004"]);
  m.setCondition("");
  m.setSearch("ADAM");
  assert.deepEqual(m.drawn(), ["run-0001", "run-0003"]);
});

test("sorting keeps pinned runs first and runs without the value last", () => {
  const m = model(4, (i) => (i === 2 ? { hparams: {} } : {}));
  m.sortBy("h:lr");
  m.sortBy("h:lr"); // descending
  assert.deepEqual(m.tableRows().map((r) => r.name), ["run-0003", "run-0001", "run-0000", "run-0002"]);
  m.togglePinned("run-0000");
  assert.deepEqual(m.tableRows().map((r) => r.name), ["run-0000", "run-0003", "run-0001", "run-0002"]);
  m.sortBy("m:eval/accuracy:last");
  assert.deepEqual(m.tableRows().map((r) => r.name), ["run-0000", "run-0001", "run-0002", "run-0003"]);
  m.sortBy("duration");
  assert.equal(m.tableRows().length, 4);
});

test("pinned runs pass every filter; brushes filter numeric and categorical columns", () => {
  const m = model(6);
  m.selectDefault();
  m.brushes.set("h:lr", [0.002, 0.004]);
  assert.deepEqual(m.drawn(), ["run-0001", "run-0002", "run-0003"]);
  m.brushes.set("h:optimizer", new Set(["adam"]));
  assert.deepEqual(m.drawn(), ["run-0001", "run-0003"]);
  m.togglePinned("run-0005");
  assert.deepEqual(m.drawn(), ["run-0001", "run-0003", "run-0005"]);
});

test("groups by an hparam or by the part of the name a pattern matches", () => {
  assert.equal(groupKey("a", { lr: 0.1 }, { kind: "hparam", key: "lr" }), "lr=0.1");
  assert.equal(groupKey("a", {}, { kind: "hparam", key: "lr" }), "a");
  assert.equal(groupKey("lr0.1-seed3", {}, { kind: "pattern", regex: /^(.*)-seed\d+$/u }), "lr0.1");
  assert.equal(groupKey("base-x", {}, { kind: "pattern", regex: /^[a-z]+/u }), "base");
  assert.equal(groupKey("x", {}, null), null);
});

test("aggregate: mean and min-max across runs at the same steps", () => {
  const a = { xs: Float64Array.from([0, 1, 2, 3]), ys: Float64Array.from([1, 2, 3, 4]) };
  const b = { xs: Float64Array.from([0, 1, 2]), ys: Float64Array.from([3, 4, NaN]) };
  const g = aggregate([a, b], 100);
  assert.deepEqual(Array.from(g.xs), [0, 1, 2, 3]);
  assert.deepEqual(Array.from(g.mean), [2, 3, 3, 4]);
  assert.deepEqual(Array.from(g.min), [1, 2, 3, 4]);
  assert.deepEqual(Array.from(g.max), [3, 4, 3, 4]);
  assert.deepEqual(Array.from(g.count), [2, 2, 1, 1]);
  // A run is not extended before its first point.
  const c = { xs: Float64Array.from([2, 3]), ys: Float64Array.from([10, 10]) };
  assert.deepEqual(Array.from(aggregate([a, c], 100).count), [1, 1, 2, 2]);
  assert.throws(() => aggregate([a], 0), /columns must be a positive integer, got 0/);
  assert.equal(aggregate([], 10).xs.length, 0);
});

test("aggregate over many points uses an even grid and holds each run's last value", () => {
  const n = 10_000;
  const xs = Float64Array.from({ length: n }, (_, i) => i);
  const g = aggregate([{ xs, ys: xs }, { xs, ys: Float64Array.from(xs, (x) => x + 2) }], 101);
  assert.equal(g.xs.length, 101);
  assert.equal(g.xs[0], 0);
  assert.equal(g.xs[100], n - 1);
  for (let i = 0; i < g.xs.length; i++) {
    const x = Math.floor(g.xs[i]);
    assert.equal(g.mean[i], x + 1);
    assert.equal(g.max[i] - g.min[i], 2);
  }
  assert.equal(lastAtOrBefore(xs, 5.5), 5);
  assert.equal(lastAtOrBefore(xs, -1), -1);
});

test("sweep axes: linear, logarithmic for learning rates, categories otherwise", async () => {
  const { axisScale, heatmapCells } = await import("../src/views/sweep.js");
  const lin = axisScale([1, 2, 3, undefined]);
  assert.equal(lin.kind, "linear");
  assert.equal(lin.toUnit(1), 0);
  assert.equal(lin.toUnit(3), 1);
  assert.equal(lin.toUnit(undefined), null);
  assert.equal(lin.fromUnit(0.5), 2);
  const log = axisScale([1e-5, 1e-3, 1e-1]);
  assert.equal(log.kind, "log");
  assert.ok(Math.abs(log.toUnit(1e-3) - 0.5) < 1e-12);
  assert.deepEqual(log.ticks.map((t) => t.value), [1e-5, 1e-4, 1e-3, 1e-2, 1e-1].map((v) => 10 ** Math.log10(v)));
  const cat = axisScale(["sgd", "adam", "adam", 3]);
  assert.equal(cat.kind, "category");
  assert.deepEqual(cat.categories, ["3", "adam", "sgd"]);
  assert.equal(cat.toUnit("adam"), 0.5);
  assert.equal(cat.toUnit("rmsprop"), null);
  const one = axisScale([5, 5]);
  assert.equal(one.toUnit(5), 0.5);

  const rows = [
    { hparams: { lr: 0.1, opt: "adam" }, metric: 1 },
    { hparams: { lr: 0.1, opt: "adam" }, metric: 3 },
    { hparams: { lr: 0.01, opt: "sgd" }, metric: 5 },
    { hparams: { lr: 0.01 }, metric: 7 },
    { hparams: { lr: 0.01, opt: "sgd" }, metric: Number.NaN },
  ];
  const h = heatmapCells(rows, "lr", "opt");
  assert.deepEqual(h.xs, ["0.01", "0.1"]);
  assert.deepEqual(h.ys, ["adam", "sgd"]);
  assert.deepEqual(h.cells.map((c) => [c.x, c.y, c.mean, c.n]).sort(), [[0, 1, 5, 1], [1, 0, 2, 2]]);
  assert.equal(h.min, 2);
  assert.equal(h.max, 5);
  // Many distinct numbers are cut into 10 bins.
  const many = heatmapCells(Array.from({ length: 40 }, (_, i) => ({ hparams: { a: i, b: "x" }, metric: i })), "a", "b");
  assert.equal(many.xs.length, 10);
  assert.equal(many.cells.length, 10);
  assert.equal(many.cells.reduce((s, c) => s + c.n, 0), 40);
});

test("pointsFor asks fewer history points per run as more runs are subscribed", async () => {
  const { pointsFor } = await import("../src/runs.js");
  assert.equal(pointsFor(1), 2000);
  assert.equal(pointsFor(20), 2000);
  assert.equal(pointsFor(50), 400);
  assert.equal(pointsFor(100), 200);
  assert.equal(pointsFor(1000), 200);
});

test("aggregate: std across runs is the population std, NaN-safe and exact for large close values", () => {
  const xs = [0, 1, 2];
  const agg = aggregate(
    [
      { xs, ys: [1, 2, NaN] },
      { xs, ys: [3, NaN, 5] },
      { xs, ys: [5, 4, Infinity] },
    ],
    100,
  );
  assert.deepEqual(Array.from(agg.mean), [3, 3, 5]);
  // step 0: 1, 3, 5 -> std sqrt(8/3); step 1: 2, 4 (NaN left out) -> 1; step 2: 5 alone -> 0.
  assert.ok(Math.abs(agg.std[0] - Math.sqrt(8 / 3)) < 1e-12);
  assert.equal(agg.std[1], 1);
  assert.equal(agg.std[2], 0);
  assert.deepEqual(Array.from(agg.count), [3, 2, 1]);
  for (const v of agg.std) assert.ok(Number.isFinite(v));
  // 1e9 + 0.001 and 1e9 - 0.001: a sum of squares would lose the spread entirely.
  const big = aggregate([{ xs: [0], ys: [1e9 + 0.001] }, { xs: [0], ys: [1e9 - 0.001] }], 10);
  assert.ok(Math.abs(big.std[0] - 0.001) < 1e-6, `std ${big.std[0]}`);
  // Only non-finite values at an x: no point there at all.
  const none = aggregate([{ xs: [0, 1], ys: [NaN, 2] }], 10);
  assert.deepEqual(Array.from(none.xs), [1]);
  assert.deepEqual(Array.from(none.std), [0]);
});

test("bandEdges: min-max or mean ± std, and a clear error for another band", () => {
  const agg = aggregate([{ xs: [0], ys: [1] }, { xs: [0], ys: [3] }, { xs: [0], ys: [8] }], 10);
  const mm = bandEdges(agg, "minmax");
  assert.deepEqual([mm.lower[0], mm.upper[0]], [1, 8]);
  const sd = bandEdges(agg, "std");
  const std = Math.sqrt(((1 - 4) ** 2 + (3 - 4) ** 2 + (8 - 4) ** 2) / 3);
  assert.ok(Math.abs(sd.lower[0] - (4 - std)) < 1e-12 && Math.abs(sd.upper[0] - (4 + std)) < 1e-12);
  assert.throws(() => bandEdges(agg, "iqr"), /band must be "minmax" or "std", got "iqr"/);
});

test("the runs model's saved state comes back in a new model, and a stale selection does not", () => {
  const a = model(30);
  a.selectDefault();
  a.setSelected(["run-0001", "run-0002"], true);
  a.togglePinned("run-0003");
  a.toggleHidden("run-0004");
  a.groupBy = { kind: "pattern", regex: /run-(\d)/u };
  a.band = "std";
  const saved = JSON.parse(JSON.stringify(a.saved()));
  const b = model(30);
  assert.equal(b.restore(saved), true);
  assert.deepEqual([...b.selected].sort(), [...a.selected].sort());
  assert.deepEqual([...b.pinned], ["run-0003"]);
  assert.deepEqual([...b.hidden], ["run-0004"]);
  assert.equal(b.groupBy.kind, "pattern");
  assert.equal(groupKey("run-0123", {}, b.groupBy), "0");
  assert.equal(b.band, "std");
  assert.deepEqual(b.subscription(), a.subscription());
  // A log directory with none of the saved runs: the selection is not taken (default instead),
  // pins and grouping are.
  const c = new RunsModel();
  c.addNames(["other-1", "other-2"]);
  assert.equal(c.restore(saved), false);
  assert.equal(c.selected, null);
  assert.equal(c.band, "std");
  // Every run selected is remembered as such.
  const d = model(3);
  d.selectDefault();
  const e = model(3);
  e.selected = new Set(["run-0000"]);
  assert.equal(e.restore(d.saved()), true);
  assert.equal(e.selected, null);
  // ... but not once the directory holds more runs than are selected all at once.
  const grown = model(SELECT_ALL_UP_TO + 1);
  assert.equal(grown.restore(d.saved()), false);
  grown.selectDefault();
  assert.equal(grown.selected.size, DEFAULT_SELECTED);
  // Malformed input is ignored piece by piece, never thrown.
  const f = model(3);
  for (const bad of [null, 3, "x", { selected: 5, pinned: "a", groupBy: { kind: "pattern", source: "(" }, band: "iqr" }]) assert.equal(f.restore(bad), false);
  assert.equal(f.groupBy, null);
  assert.equal(f.band, "minmax");
});

test("Remembered keeps the view per server, writes only changes and survives broken storage", () => {
  const data = new Map();
  let writes = 0;
  const storage = { getItem: (k) => data.get(k) ?? null, setItem: (k, v) => (writes++, data.set(k, v)) };
  const key = rememberKey({ origin: "http://127.0.0.1:6006", pathname: "/" });
  assert.equal(key, "vdl-stream:view:http://127.0.0.1:6006/");
  const r = new Remembered(key, storage);
  assert.equal(r.load(), null);
  assert.equal(r.save({ smoothing: 0.5 }), true);
  assert.equal(r.save({ smoothing: 0.5 }), false);
  assert.equal(writes, 1);
  assert.deepEqual(new Remembered(key, storage).load(), { v: REMEMBER_VERSION, smoothing: 0.5 });
  // Another server's page, another key; another layout version or junk: nothing.
  assert.equal(new Remembered(rememberKey({ origin: "http://127.0.0.1:6007", pathname: "/" }), storage).load(), null);
  data.set(key, JSON.stringify({ v: 99 }));
  assert.equal(new Remembered(key, storage).load(), null);
  data.set(key, "{not json");
  assert.equal(new Remembered(key, storage).load(), null);
  const broken = { getItem: () => { throw new Error("denied"); }, setItem: () => { throw new Error("quota"); } };
  const q = new Remembered(key, broken);
  const warn = console.warn;
  console.warn = () => {};
  try {
    assert.equal(q.load(), null);
    assert.equal(q.save({ smoothing: 0.1 }), false);
  } finally {
    console.warn = warn;
  }
  assert.equal(new Remembered(key, null).save({ a: 1 }), false);
  assert.throws(() => new Remembered("", storage), /key must be a non-empty string, got ""/);
});

test("the runs drawn lead the table: selected when the order settles, after the pinned ones", () => {
  const m = model(1000);
  m.selectDefault(); // the ten most recent: run-0990 .. run-0999
  const first = (n) => m.tableRows().slice(0, n).map((r) => r.name);
  const recent = Array.from({ length: DEFAULT_SELECTED }, (_, i) => `run-0${990 + i}`);
  assert.deepEqual(first(11), [...recent, "run-0000"]);
  assert.ok(m.leads("run-0995") && !m.leads("run-0000"));
  // One row's checkbox: the row stays where it is until the order settles again.
  m.setSelected(["run-0500"], true, { settle: false });
  m.setSelected(["run-0990"], false, { settle: false });
  assert.deepEqual(first(11), [...recent, "run-0000"]);
  // A sort settles it: the selection first, each part sorted.
  m.sortBy("h:lr");
  m.sortBy("h:lr"); // descending
  assert.deepEqual(first(11), ["run-0999", "run-0998", "run-0997", "run-0996", "run-0995", "run-0994", "run-0993", "run-0992", "run-0991", "run-0500", "run-0990"]);
  // All / None (setSelected settles by default); pinned runs stay on top.
  m.togglePinned("run-0001");
  m.setSearch("run-00");
  m.setSelected(m.tableRows().map((r) => r.name), true);
  m.setSearch("");
  assert.equal(m.selected.size, 110); // run-0000 .. run-0099, nine recent ones, run-0500
  const top = first(110);
  assert.equal(top[0], "run-0001");
  assert.deepEqual(new Set(top), m.selected);
  assert.ok(!m.selected.has(first(111)[110]));
  // Every run selected: no run leads, the sort alone orders.
  const few = model(5);
  few.selectDefault();
  assert.equal(few.front, null);
  assert.deepEqual(few.tableRows().map((r) => r.name), ["run-0000", "run-0001", "run-0002", "run-0003", "run-0004"]);
});

test("the table's name order is compareCells's, through one collator (no localeCompare per pair)", () => {
  const names = ["r10", "r2", "R1", "é3", "e3", "run-0100", "run-020", "b", "a-1", "a-02", "Z"];
  const m = new RunsModel();
  m.addNames(names);
  const had = String.prototype.localeCompare;
  let calls = 0;
  String.prototype.localeCompare = function (...args) {
    calls++;
    return had.apply(this, args);
  };
  let got;
  try {
    got = m.tableRows().map((r) => r.name);
  } finally {
    String.prototype.localeCompare = had;
  }
  assert.equal(calls, 0);
  assert.deepEqual(got, [...names].sort(compareCells));
  // compareCells (string hparam columns) through the same collator: localeCompare's order, no call
  const natural = [...names].sort((a, b) => had.call(a, b, undefined, { numeric: true }));
  String.prototype.localeCompare = function (...args) {
    calls++;
    return had.apply(this, args);
  };
  try {
    got = [...names].sort(compareCells);
  } finally {
    String.prototype.localeCompare = had;
  }
  assert.equal(calls, 0);
  assert.deepEqual(got, natural);
  m.sortBy("name");
  m.sortBy("name"); // descending
  assert.deepEqual(m.tableRows().map((r) => r.name), [...names].sort(compareCells).reverse());
});
