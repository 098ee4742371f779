import assert from "node:assert/strict";
import { test } from "node:test";
import { PALETTE } from "../src/dom.js";
import { colorColumn, matrixFromBytes, rgba32, searchLabels } from "../src/views/embeddings.js";

test("colorColumn colours the most frequent categories in label order and greys the rest", () => {
  const values = ["b", "a10", "b", "a2", "b", "a10"];
  const { index, colors, legend } = colorColumn(values);
  assert.deepEqual(legend.map((l) => l.label), ["a2", "a10", "b"]);
  assert.deepEqual(Array.from(index), [2, 1, 2, 0, 2, 1]);
  assert.equal(colors[0], PALETTE[0]);
  const many = Array.from({ length: 30 }, (_, i) => `k${i % 25}`);
  const wide = colorColumn(many);
  assert.equal(wide.legend.length, PALETTE.length + 1, "20 categories and 'other'");
  assert.equal(wide.legend.at(-1).label, null);
  assert.equal(wide.index.filter((c) => c === wide.colors.length - 1).length, 5, "five values share 'other'");
  assert.ok(!wide.legend.some((l) => ["k20", "k21", "k22", "k23", "k24"].includes(l.label)), "the rarest are 'other'");
});

test("colorColumn gives a column of many numbers a gradient from its minimum to its maximum", () => {
  const values = Array.from({ length: 40 }, (_, i) => String(i * 0.5));
  const { index, colors, legend } = colorColumn(values);
  assert.equal(index[0], 0);
  assert.equal(index[39], colors.length - 1);
  assert.deepEqual(legend.map((l) => l.label), ["0", "19.5"]);
});

test("searchLabels matches any column, case-insensitively; an empty query is no search", () => {
  const columns = [
    ["Cat", "dog", "cow"],
    ["x1", "x2", "CATalog"],
  ];
  assert.deepEqual(Array.from(searchLabels(columns, 3, "cat")), [1, 0, 1]);
  assert.equal(searchLabels(columns, 3, "  "), null);
});

test("matrixFromBytes checks the size against the shape", () => {
  const m = matrixFromBytes(new Float32Array([1, 2, 3, 4, 5, 6]).buffer, 2, 3);
  assert.deepEqual(Array.from(m), [1, 2, 3, 4, 5, 6]);
  assert.throws(() => matrixFromBytes(new ArrayBuffer(20), 2, 3), /expected 24 bytes, got 20/);
});

test("rgba32 packs CSS colours as little-endian RGBA pixels", () => {
  assert.equal(rgba32("#1f77b4"), 0xffb4771f);
  assert.equal(rgba32("rgb(1, 2, 3)"), 0xff030201);
  assert.equal(rgba32("rgba(140, 146, 154, 0.25)"), (64 * 2 ** 24 + (154 << 16) + (146 << 8) + 140) >>> 0);
});
