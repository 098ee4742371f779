import assert from "node:assert/strict";
import { test } from "node:test";
import { liveUrl } from "../src/connection.js";
import { RunsModel } from "../src/runs.js";
import { DEFAULT_SELECTED, firstSubscription, pointsFor, SELECT_ALL_UP_TO, sameSubscription } from "../src/runsdefault.js";

test("the URL's first subscription asks for the default selection unless the page remembers another", () => {
  const ask = { newest: String(DEFAULT_SELECTED), all_up_to: String(SELECT_ALL_UP_TO), max_points: String(pointsFor(DEFAULT_SELECTED)) };
  assert.deepEqual(firstSubscription(null), ask);
  assert.deepEqual(firstSubscription({ v: 1, smoothing: 0.5 }), ask);
  // "Every run" and pins or grouping do not change which runs are drawn first.
  assert.deepEqual(firstSubscription({ runs: { selected: null, pinned: ["a"], hidden: [], groupBy: null } }), ask);
  assert.equal(firstSubscription({ runs: { selected: ["a"], pinned: [], hidden: [] } }), null);
  assert.equal(firstSubscription({ runs: { selected: null, pinned: [], hidden: ["a"] } }), null);
  assert.equal(
    liveUrl({ protocol: "http:", host: "h" }, null, { summaries: "table", ...ask }),
    "ws://h/ws/live?summaries=table&newest=10&all_up_to=20&max_points=2000",
  );
});

test("sameSubscription: the same runs in any order and the same points; null only with null", () => {
  assert.equal(sameSubscription({ runs: ["b", "a"], max_points: 2000 }, ["a", "b"], 2000), true);
  assert.equal(sameSubscription({ runs: null, max_points: 2000 }, null, 2000), true);
  assert.equal(sameSubscription({ runs: ["a", "b"], max_points: 2000 }, ["a", "b"], 1000), false);
  assert.equal(sameSubscription({ runs: ["a", "b"], max_points: 2000 }, ["a", "c"], 2000), false);
  assert.equal(sameSubscription({ runs: ["a", "a"], max_points: 2000 }, ["a", "b"], 2000), false);
  assert.equal(sameSubscription({ runs: null, max_points: 2000 }, ["a"], 2000), false);
  assert.equal(sameSubscription({ runs: ["a"], max_points: 2000 }, null, 2000), false);
  assert.equal(sameSubscription(null, null, 2000), false);
  assert.equal(sameSubscription(undefined, ["a"], 2000), false);
  assert.equal(sameSubscription({ runs: "a", max_points: 2000 }, ["a"], 2000), false);
});

test("the page's default selection of many runs is what the server's newest order picks", () => {
  // The server (vdl_stream/server.py, _newest_runs): newest last_wall first, runs without one
  // last, ties by name. The page's selectDefault must agree, or it subscribes again.
  const model = new RunsModel();
  const names = Array.from({ length: 30 }, (_, i) => `r${String(i).padStart(2, "0")}`);
  model.addNames(names);
  const walls = { r03: 50, r04: 50, r10: 90, r11: 10, r12: 70, r13: 70, r20: 5, r21: 60, r22: 40, r23: 30, r24: 20 };
  model.updateSummaries(names.filter((n) => n in walls).map((name) => ({ name, last_wall: walls[name], hparams: {}, last: {} })));
  model.selectDefault();
  const want = ["r10", "r12", "r13", "r21", "r03", "r04", "r22", "r23", "r24", "r11"];
  assert.deepEqual(model.subscription(), [...want].sort());
  assert.equal(sameSubscription({ runs: want, max_points: 2000 }, model.subscription(), pointsFor(model.subscription().length)), true);
});
