import assert from "node:assert/strict";
import { test } from "node:test";
import { curvePoints } from "../src/views/curves.js";
import { compareCells } from "../src/runs.js";

test("curvePoints orders a PR curve by recall, keeping precision paired", () => {
  const ev = { kind: "pr_curve", recall: Float64Array.from([1, 0.6, 0.2]), precision: Float64Array.from([0.5, 0.8, 1]) };
  const { xs, ys } = curvePoints(ev);
  assert.deepEqual(Array.from(xs), [0.2, 0.6, 1]);
  assert.deepEqual(Array.from(ys), [1, 0.8, 0.5]);
});

test("curvePoints uses FPR and TPR for ROC curves", () => {
  const ev = { kind: "roc_curve", fpr: Float64Array.from([1, 0]), tpr: Float64Array.from([1, 0.4]) };
  assert.deepEqual(Array.from(curvePoints(ev).xs), [0, 1]);
  assert.deepEqual(Array.from(curvePoints(ev).ys), [0.4, 1]);
});

test("compareCells sorts numbers numerically, strings naturally, missing last", () => {
  const cells = ["b10", 3, undefined, "b9", 0.5, true, null];
  const sorted = [...cells].sort(compareCells);
  assert.deepEqual(sorted.slice(0, 3), [0.5, true, 3]);
  assert.deepEqual(sorted.slice(3, 5), ["b9", "b10"]);
  assert.ok(sorted.slice(5).every((v) => v === undefined || v === null));
});
