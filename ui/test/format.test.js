import assert from "node:assert/strict";
import { test } from "node:test";
import { alignedData, formatBytes, formatDuration, formatValue } from "../src/chart.js";
import { formatFor, splitField } from "../src/views/system.js";
import { tagGroup } from "../src/views/scalars.js";

test("formatValue is compact and exact enough to read", () => {
  assert.equal(formatValue(0.123456789), "0.12346");
  assert.equal(formatValue(0.0001), "1e-4");
  assert.equal(formatValue(12345678), "1.235e+7");
  assert.equal(formatValue(null), "–");
  assert.equal(formatValue(NaN), "NaN");
});

test("formatBytes and formatDuration", () => {
  assert.equal(formatBytes(512), "512 B");
  assert.equal(formatBytes(1536), "1.5 KiB");
  assert.equal(formatBytes(141 * 2 ** 30), "141 GiB");
  assert.equal(formatDuration(5), "5s");
  assert.equal(formatDuration(125), "2m05s");
  assert.equal(formatDuration(3 * 3600 + 7 * 60), "3h07m");
});

test("alignedData joins runs logged at different steps and turns bad values into gaps", () => {
  const a = Float64Array.from([0, 2]);
  const b = Float64Array.from([1, 2]);
  const data = alignedData(
    [
      { xs: a, ys: Float64Array.from([1, NaN]) },
      { xs: b, ys: Float64Array.from([5, 6]) },
    ],
    false,
  );
  assert.deepEqual(Array.from(data[0]), [0, 1, 2]);
  assert.deepEqual(Array.from(data[1]), [1, undefined, null]);
  assert.deepEqual(Array.from(data[2]), [undefined, 5, 6]);
  const log = alignedData([{ xs: a, ys: Float64Array.from([0, 3]) }], true);
  assert.deepEqual(log[1], [null, 3]);
});

test("telemetry fields map to one chart per metric and the unit's format", () => {
  assert.deepEqual(splitField("gpu7/util"), { metric: "gpu/util", device: "gpu7" });
  assert.deepEqual(splitField("cpu/percent"), { metric: "cpu/percent", device: "cpu" });
  assert.equal(formatFor("gpu/mem_used")(2 ** 30), "1 GiB");
  assert.equal(formatFor("net/sent_bytes_per_s")(2048), "2 KiB/s");
  assert.equal(formatFor("gpu/temp")(65), "65");
});

test("scalar tags are grouped by their first path component", () => {
  assert.equal(tagGroup("train/loss"), "train");
  assert.equal(tagGroup("loss"), "");
  assert.equal(tagGroup("/odd"), "");
});
