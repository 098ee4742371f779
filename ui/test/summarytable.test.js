import assert from "node:assert/strict";
import { test } from "node:test";
import { encode } from "@msgpack/msgpack";
import { decodeFrame } from "../src/decode.js";
import { expandSummaryTable, MISSING } from "../src/summarytable.js";

const f8 = (values) => new Uint8Array(Float64Array.from(values, (v) => (v === null ? NaN : v)).buffer);
const u2 = (values) => {
  const out = new Uint8Array(values.length * 2);
  const view = new DataView(out.buffer);
  values.forEach((v, i) => view.setUint16(i * 2, v, true));
  return out;
};

// Two runs: "a" with hparams and two tags (one last value NaN), "b" with one tag and no hparams.
function table() {
  return {
    names: ["a", "b"],
    status: [["finished", "live"], u2([0, 1])],
    start: f8([10, 20]),
    last_wall: f8([15, null]),
    last_step: f8([99, 3]),
    host: [["node01"], u2([0, MISSING])],
    hparams: [
      ["lr", [0.01], u2([0, MISSING])],
      ["note", [null], u2([0, MISSING])],
    ],
    tags: ["eval/acc", "train/loss"],
    // tag-major: eval/acc for a, b, then train/loss for a, b
    last: f8([0.9, null, null, 2.5]),
    min: f8([0.1, null, 0.4, 2.5]),
    max: f8([0.95, null, 3.0, 2.5]),
    has: new Uint8Array([1, 0, 1, 1]),
  };
}

test("a summaries table expands to the summary objects", () => {
  assert.deepEqual(expandSummaryTable(table()), [
    {
      name: "a",
      status: "finished",
      start: 10,
      last_wall: 15,
      last_step: 99,
      host: "node01",
      hparams: { lr: 0.01, note: null },
      last: { "eval/acc": 0.9, "train/loss": null },
      min: { "eval/acc": 0.1, "train/loss": 0.4 },
      max: { "eval/acc": 0.95, "train/loss": 3.0 },
    },
    {
      name: "b",
      status: "live",
      start: 20,
      last_wall: null,
      last_step: 3,
      host: null,
      hparams: {},
      last: { "train/loss": 2.5 },
      min: { "train/loss": 2.5 },
      max: { "train/loss": 2.5 },
    },
  ]);
});

test("without `has` every run has every tag", () => {
  const t = { ...table(), has: null };
  const [, b] = expandSummaryTable(t);
  assert.deepEqual(Object.keys(b.last), ["eval/acc", "train/loss"]);
  assert.equal(b.last["eval/acc"], null);
});

test("a summaries frame with a table decodes as one with the list", () => {
  const msg = decodeFrame(encode({ type: "summaries", table: table() }));
  assert.equal(msg.type, "summaries");
  assert.deepEqual(msg.runs.map((r) => r.name), ["a", "b"]);
  assert.equal(msg.table, undefined);
});

test("malformed tables are refused with the column named", () => {
  assert.throws(() => expandSummaryTable({ ...table(), start: f8([1]) }), /summaries table start must have 2 values, got 1/);
  assert.throws(() => expandSummaryTable({ ...table(), host: [["x"], u2([0])] }), /summaries table host must have 2 indices, got 1/);
  assert.throws(() => expandSummaryTable({ ...table(), last: f8([1, 2, 3]) }), /summaries table last must have 4 values, got 3/);
  assert.throws(() => expandSummaryTable({ ...table(), status: "x" }), /summaries table status must be \[values, indices\]/);
  assert.throws(() => expandSummaryTable({ ...table(), hparams: [["lr", [1]]] }), /hparams\[0\] must be \[name, values, indices\]/);
  assert.throws(() => expandSummaryTable(null), /summaries table must be a map with names/);
});
