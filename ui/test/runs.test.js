import assert from "node:assert/strict";
import { test } from "node:test";
import { colorFor, hashString, PALETTE } from "../src/dom.js";
import { aggregate, lastAtOrBefore } from "../src/groups.js";
import { DEFAULT_SELECTED, groupKey, RunsModel, SELECT_ALL_UP_TO } from "../src/runs.js";

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
