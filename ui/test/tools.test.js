// Chart tools, histograms' step placement, badges and the report layout (issue 12, items 5-7).
import assert from "node:assert/strict";
import { test } from "node:test";
import { histogramSeries, parseBound, quantileRange, robustRange, seriesCsv, seriesJson } from "../src/chartdata.js";
import { columnEdges, labelledRidges, ridgeBases } from "../src/histogram.js";
import { gridLayout, stamp } from "../src/report.js";
import { placeBox, sortRows } from "../src/tooltip.js";
import { curveAuc, curvePoints, distinctXs, positiveShare } from "../src/views/curves.js";
import { pickHistogram } from "../src/views/histograms.js";
import { badgeState } from "../src/views/replay.js";

test("sortRows puts the largest value first and rows without a value last, in their order", () => {
  const rows = [{ value: 1 }, { value: NaN, k: "a" }, { value: 3 }, { value: null, k: "b" }, { value: -2 }];
  assert.deepEqual(
    sortRows(rows).map((r) => r.k ?? r.value),
    [3, 1, -2, "a", "b"],
  );
});

test("placeBox puts the box beside the pointer and flips it to stay in the viewport", () => {
  assert.deepEqual(placeBox(100, 100, 200, 80, 1000, 800), { left: 114, top: 114 });
  assert.deepEqual(placeBox(900, 760, 200, 80, 1000, 800), { left: 686, top: 666 });
  // wider than the space on either side: kept inside
  const p = placeBox(500, 10, 990, 50, 1000, 800);
  assert.equal(p.left, 4);
});

test("quantileRange ignores outliers beyond the 1st and 99th percentile", () => {
  const values = Array.from({ length: 1000 }, (_, i) => i / 1000);
  values[500] = 1e9;
  values[501] = -1e9;
  const [lo, hi] = quantileRange([values, [null, NaN, Infinity]]);
  assert.ok(lo > -0.1 && lo < 0.02, lo);
  assert.ok(hi > 0.98 && hi < 1.1, hi);
  assert.deepEqual(quantileRange([[2, 3, 4]], 0, 1), [2, 4]);
  assert.deepEqual(quantileRange([[-1, 0, 5]], 0, 1, true), [5, 5]);
  assert.equal(quantileRange([[NaN]]), null);
});

test("seriesCsv writes one row per point with quoted run names; seriesJson nulls non-finite values", () => {
  const series = [
    { run: 'a,"b"', step: [0, 1], wall: [10.5, 11], value: [0.1, NaN], smoothed: [0.1, 0.1] },
    { run: "c", step: [5], wall: [12], value: [1e-9], smoothed: [1e-9] },
  ];
  assert.equal(seriesCsv(series), 'run,step,wall,value,smoothed\n"a,""b""",0,10.5,0.1,0.1\n"a,""b""",1,11,NaN,0.1\nc,5,12,1e-9,1e-9\n');
  const json = JSON.parse(seriesJson({ chart: "loss" }, series));
  assert.equal(json.chart, "loss");
  assert.deepEqual(json.series[0].value, [0.1, null]);
  assert.deepEqual(json.series[1], { run: "c", step: [5], wall: [12], value: [1e-9], smoothed: [1e-9] });
  // curves export x and y
  assert.equal(seriesCsv([{ run: "r", x: [0, 1], y: [1, 0.5] }]), "run,x,y\nr,0,1\nr,1,0.5\n");
});

test("histogramSeries lists every bucket of every step", () => {
  const hists = [
    { step: 0, wall: 5, edges: [0, 1, 2], counts: [3, 4] },
    { step: 10, edges: [-1, 1], counts: [7] },
  ];
  assert.equal(seriesCsv([histogramSeries("r", hists)]), "run,step,wall,left,right,count\nr,0,5,0,1,3\nr,0,5,1,2,4\nr,10,NaN,-1,1,7\n");
});

test("parseBound reads a number or nothing, and names a bad value", () => {
  assert.equal(parseBound(" "), null);
  assert.equal(parseBound("-1.5e2"), -150);
  assert.throws(() => parseBound("abc"), /y range bound must be a number, got "abc"/);
  assert.throws(() => parseBound("Infinity"), RangeError);
});

test("curveAuc: ROC by trapezoids closed at (0,0) and (1,1); PR step-wise", () => {
  // labels [1,0,1,0], scores [0.9,0.8,0.3,0.2]: 3 of 4 pairs ordered right
  const roc = { kind: "roc_curve", fpr: Float64Array.from([1, 0.5, 0.5, 0, 0]), tpr: Float64Array.from([1, 1, 0.5, 0.5, 0]) };
  const { xs, ys } = curvePoints(roc);
  assert.equal(curveAuc("roc_curve", xs, ys), 0.75);
  assert.equal(curveAuc("roc_curve", [0.5], [1]), 0.5 * 1 / 2 + 0.5 * 1); // closed at both ends
  const pr = { kind: "pr_curve", recall: Float64Array.from([1, 1, 0.5, 0.5, 0]), precision: Float64Array.from([0.5, 2 / 3, 0.5, 1, 0]) };
  const p = curvePoints(pr);
  assert.equal(curveAuc("pr_curve", p.xs, p.ys), 0.5 + 0.5 * (2 / 3));
  assert.ok(Number.isNaN(curveAuc("pr_curve", [], [])));
});

test("curvePoints leaves out PR points without a precision; distinctXs keeps every point joinable", () => {
  const ev = { kind: "pr_curve", recall: [1, 0.5, 0], precision: [0.5, 1, 0], tp: [2, 1, 0], fp: [2, 0, 0] };
  const { xs, ys } = curvePoints(ev);
  assert.deepEqual(Array.from(xs), [0.5, 1]);
  assert.deepEqual(Array.from(ys), [1, 0.5]);
  const d = distinctXs(Float64Array.from([0, 0.5, 0.5, 0.5, 1]));
  assert.ok(d.every((v, i) => i === 0 || v > d[i - 1]));
  assert.ok(Math.abs(d[3] - 0.5) < 1e-8);
});

test("positiveShare is the chance precision of a PR curve", () => {
  const ev = { tp: [3, 1], fn: [1, 3], fp: [6, 0], tn: [10, 16] };
  assert.equal(positiveShare(ev), 4 / 20);
  assert.ok(Number.isNaN(positiveShare({})));
});

test("ridge baselines are spaced by step, and labels skip ridges too close to the last one", () => {
  const bases = ridgeBases([0, 10, 20, 100], 50, 150);
  assert.deepEqual(bases, [50, 60, 70, 150]);
  assert.deepEqual(ridgeBases([7], 0, 80), [80]);
  assert.deepEqual(ridgeBases([5, 5, 5], 0, 10), [0, 5, 10]);
  assert.deepEqual(labelledRidges(bases, 14), [3, 2, 0]); // 60 is within 14 px of 70
  assert.deepEqual(labelledRidges([0, 20, 40], 14), [2, 1, 0]);
});

test("heatmap columns are placed by step; pickHistogram finds the column or the ridge", () => {
  const { edges, first, end } = columnEdges([0, 10, 40], 0, 100);
  assert.equal(first, 0);
  assert.equal(end, 60); // the newest column is as wide as the average gap (20)
  assert.deepEqual(edges.map((e) => Math.round(e * 100) / 100), [0, 16.67, 66.67, 100]);
  const shown = [{ step: 0 }, { step: 10 }, { step: 40 }];
  assert.equal(pickHistogram({ mode: "heatmap", shown, edges }, 20, 0), 1);
  assert.equal(pickHistogram({ mode: "heatmap", shown, edges }, 99, 0), 2);
  assert.equal(pickHistogram({ mode: "ridgeline", shown, bases: [50, 60, 150] }, 0, 55), 1);
  assert.equal(pickHistogram({ mode: "ridgeline", shown, bases: [50, 60, 150] }, 0, 200), 2);
});

test("the badge never says live while paused or replaying", () => {
  assert.equal(badgeState("open", false, "absent"), "live");
  assert.equal(badgeState("open", true, "absent"), "paused");
  assert.equal(badgeState("open", false, "playing"), "replay");
  assert.equal(badgeState("open", true, "playing"), "replay-paused");
  assert.equal(badgeState("open", false, "paused"), "replay-paused");
  assert.equal(badgeState("open", false, "finished"), "replay-paused");
  assert.equal(badgeState("connecting", false, "playing"), "connecting");
  assert.equal(badgeState("closed", true, "absent"), "closed");
});

test("gridLayout makes rows as tall as their tallest box", () => {
  const { positions, height } = gridLayout([100, 50, 80], 2, 300, 10);
  assert.deepEqual(positions, [{ x: 0, y: 0 }, { x: 310, y: 0 }, { x: 0, y: 110 }]);
  assert.equal(height, 190);
  assert.equal(gridLayout([], 2, 300, 10).height, 0);
  assert.equal(stamp(new Date(2026, 10, 30, 9, 5, 7)), "20261130-090507");
});

// Loss curves of `n` runs (2.5 down to 0.05-0.3), 200 points each; `diverge` of them blow up to 4e11.
function losses(n, diverge = []) {
  return Array.from({ length: n }, (_, r) =>
    Array.from({ length: 200 }, (_, i) => {
      const floor = 0.05 + (0.25 * r) / n;
      const v = floor + (2.5 - floor) * Math.exp((-i / 200) * 8);
      return diverge.includes(r) && i > 150 ? 2.5 * 10 ** ((i - 150) / 4.5) : v;
    }),
  );
}

test("robustRange leaves a diverging run out of the default scale, and names it", () => {
  const cols = losses(10, [3]);
  const r = robustRange(cols);
  assert.deepEqual(r.above, [3]);
  assert.deepEqual(r.below, []);
  assert.equal(r.range[0], Math.min(...cols[0]));
  assert.ok(Math.abs(r.range[1] - 2.5) < 1e-9);
  // 100 runs, two diverged (as in the sweep); nulls and NaN (a run ending in NaN) are skipped.
  const many = losses(100, [7, 42]);
  many[42][199] = NaN;
  many[5][10] = null;
  assert.deepEqual(robustRange(many).above, [7, 42]);
  // On a log scale too, in decades.
  assert.deepEqual(robustRange(cols, { log: true }).above, [3]);
});

test("robustRange keeps every line when none runs off far, or too many would be left out", () => {
  // Healthy curves: the whole range.
  const healthy = robustRange(losses(10));
  assert.deepEqual([healthy.above, healthy.below], [[], []]);
  assert.equal(healthy.range[1], 2.5);
  // Fewer than four lines: nothing is called an outlier.
  assert.deepEqual(robustRange(losses(3, [1])).above, []);
  // A third of the runs diverge: that is the data, not a few outliers.
  assert.deepEqual(robustRange(losses(9, [0, 1, 2])).above, []);
  // A run a little above the rest stays in; far above, it is left out.
  const cols = losses(8);
  cols[2] = cols[2].map((v) => v + 5);
  assert.deepEqual(robustRange(cols).above, []);
  cols[2] = cols[2].map((v) => v + 50);
  assert.deepEqual(robustRange(cols).above, [2]);
  // Beyond the fence but narrowing the scale less than ROBUST_GAIN times: kept.
  const ramps = Array.from({ length: 8 }, () => [0, 0.5, 1]);
  ramps[1] = [0, 2, 4.5];
  assert.deepEqual(robustRange(ramps).above, []);
  ramps[1] = [0, 2, 5.5];
  assert.deepEqual(robustRange(ramps).above, [1]);
  // A spike far below (a bad reading) is left out below.
  const low = losses(8);
  low[4][100] = -1e9;
  const r = robustRange(low);
  assert.deepEqual([r.above, r.below], [[], [4]]);
  assert.ok(r.range[0] > 0);
  // Only the rows in view count (a zoom), and a column without values is skipped.
  const zoomed = losses(10, [3]);
  assert.deepEqual(robustRange(zoomed, { i0: 0, i1: 100 }).above, []);
  assert.equal(robustRange([[null, NaN], []]), null);
});
