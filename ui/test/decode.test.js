import assert from "node:assert/strict";
import { test } from "node:test";
import { decode, encode } from "@msgpack/msgpack";
import { decodeEvent, decodeFrame, decodeReplayStatus, decodeScalars, encodeSubscribe, f8 } from "../src/decode.js";

const bytesOf = (values) => new Uint8Array(new Float64Array(values).buffer);

test("f8 reads little-endian doubles, including NaN and infinities", () => {
  const out = f8(bytesOf([1.5, -2, NaN, Infinity, 2 ** 53]));
  assert.ok(out instanceof Float64Array);
  assert.deepEqual(Array.from(out), [1.5, -2, NaN, Infinity, 2 ** 53]);
});

test("f8 copies from an unaligned offset", () => {
  const backing = new Uint8Array(8 * 3 + 3);
  backing.set(bytesOf([3.25, 4.5, -7]), 3);
  const view = backing.subarray(3);
  assert.equal(view.byteOffset % 8, 3);
  assert.deepEqual(Array.from(f8(view)), [3.25, 4.5, -7]);
});

test("f8 refuses a length that is not a multiple of 8 and non-bytes", () => {
  assert.throws(() => f8(new Uint8Array(7), "steps"), /steps must have a multiple of 8 bytes, got 7/);
  assert.throws(() => f8([1, 2], "values"), /values must be f8 bytes, got list/);
});

test("decodeScalars returns one typed column set per tag", () => {
  const [s] = decodeScalars([["train/loss", bytesOf([0, 1]), bytesOf([10, 11]), bytesOf([0.5, 0.25])]]);
  assert.equal(s.tag, "train/loss");
  assert.deepEqual(Array.from(s.steps), [0, 1]);
  assert.deepEqual(Array.from(s.walls), [10, 11]);
  assert.deepEqual(Array.from(s.values), [0.5, 0.25]);
});

test("decodeScalars copies a frame's columns into one buffer, each column its own view", () => {
  // One ArrayBuffer per frame, not three per tag: a selection of 100 runs decodes 3,000 columns.
  const frame = encode({
    scalars: [
      ["a", bytesOf([1, 2, 3]), bytesOf([10, 20, 30]), bytesOf([0.5, NaN, -1])],
      ["b", bytesOf([]), bytesOf([]), bytesOf([])],
      ["c", bytesOf([7]), bytesOf([70]), bytesOf([Infinity])],
    ],
  });
  const shifted = new Uint8Array(frame.length + 3); // the bins at offsets no double is aligned to
  shifted.set(frame, 3);
  const [a, b, c] = decodeScalars(decode(shifted.subarray(3)).scalars);
  assert.deepEqual([Array.from(a.steps), Array.from(a.walls), Array.from(a.values)], [[1, 2, 3], [10, 20, 30], [0.5, NaN, -1]]);
  assert.deepEqual([b.steps.length, b.walls.length, b.values.length], [0, 0, 0]);
  assert.deepEqual([Array.from(c.steps), Array.from(c.walls), Array.from(c.values)], [[7], [70], [Infinity]]);
  const columns = [a, b, c].flatMap((s) => [s.steps, s.walls, s.values]);
  for (const column of columns) {
    assert.ok(column instanceof Float64Array);
    assert.equal(column.buffer, a.steps.buffer);
  }
  assert.equal(a.steps.buffer.byteLength, 8 * 12);
  a.values[0] = 99; // no column overlaps another
  assert.deepEqual([a.walls[2], c.steps[0]], [30, 7]);
});

test("decodeScalars refuses columns of different lengths and bad tags", () => {
  assert.throws(() => decodeScalars([["a", bytesOf([0, 1]), bytesOf([1]), bytesOf([1, 2])]]), /differ in length/);
  assert.throws(() => decodeScalars([[3, bytesOf([]), bytesOf([]), bytesOf([])]]), /tag must be a non-empty str, got number/);
  assert.throws(() => decodeScalars([["a", bytesOf([])]]), /must be \[tag, steps, walls, values\]/);
});

test("decodeFrame decodes a data frame end to end from msgpack", () => {
  const frame = encode({
    type: "data",
    seq: 7,
    run: "r1",
    scalars: [["loss", bytesOf([5]), bytesOf([100.5]), bytesOf([0.125])]],
    events: [{ kind: "histogram", tag: "w", step: 5, wall: 100.5, edges: bytesOf([0, 1, 2]), counts: bytesOf([3, 4]) }],
  });
  const msg = decodeFrame(frame.buffer.slice(frame.byteOffset, frame.byteOffset + frame.byteLength));
  assert.equal(msg.type, "data");
  assert.equal(msg.seq, 7);
  assert.deepEqual(Array.from(msg.scalars[0].values), [0.125]);
  assert.deepEqual(Array.from(msg.events[0].edges), [0, 1, 2]);
  assert.deepEqual(Array.from(msg.events[0].counts), [3, 4]);
});

test("decodeFrame passes other types through and refuses non-maps", () => {
  assert.deepEqual(decodeFrame(encode({ type: "gap", seq: 3 })), { type: "gap", seq: 3 });
  assert.throws(() => decodeFrame(encode([1, 2])), /frame must be a map with a str type, got list/);
  assert.throws(() => decodeFrame(encode({ seq: 1 })), /frame must be a map with a str type/);
});

test("decodeEvent checks histogram shapes", () => {
  assert.throws(() => decodeEvent({ kind: "histogram", edges: bytesOf([0, 1]), counts: bytesOf([1, 2]) }), /counts\+1/);
  const text = { kind: "text", tag: "t", text: "<b>x</b>" };
  assert.equal(decodeEvent(text), text);
});

test("encodeSubscribe produces the protocol's subscribe map", () => {
  assert.deepEqual(decode(encodeSubscribe()), { type: "subscribe", runs: null, max_points: 2000 });
  assert.deepEqual(decode(encodeSubscribe(["a"], 500)), { type: "subscribe", runs: ["a"], max_points: 500 });
});

test("decodeEvent decodes PR and ROC curve columns and checks their lengths", () => {
  const cols = ["thresholds", "tp", "fp", "tn", "fn"];
  const pr = { kind: "pr_curve", tag: "pr", step: 1, wall: 1, num_thresholds: 2 };
  for (const c of [...cols, "precision", "recall"]) pr[c] = bytesOf([0, 1]);
  const out = decodeEvent(pr);
  assert.deepEqual(Array.from(out.recall), [0, 1]);
  pr.recall = bytesOf([0]);
  assert.throws(() => decodeEvent(pr), /pr_curve recall must have 2 elements, got 1/);
  const roc = { kind: "roc_curve", tag: "roc", step: 1, wall: 1 };
  for (const c of cols) roc[c] = bytesOf([0, 1]);
  roc.tpr = bytesOf([1, 0]);
  assert.throws(() => decodeEvent(roc), /roc_curve fpr must be f8 bytes, got undefined/);
});

const REPLAY = { playing: true, finished: false, speed: 10, position: 1050, step: 49, start: 1000, end: 1100, fed: 5, total: 9, runs: ["r"], version: 3 };

test("a replay frame becomes {type: 'replay', status} with the documented fields", () => {
  const msg = decodeFrame(encode({ type: "replay", ...REPLAY }));
  assert.deepEqual(msg, { type: "replay", status: REPLAY });
  assert.equal(decodeFrame(encode({ type: "replay", ...REPLAY, speed: "max" })).status.speed, "max");
  assert.equal(decodeReplayStatus({ ...REPLAY, end: 900 }).end, 1000); // never before the start
  assert.equal(decodeReplayStatus({ ...REPLAY, step: null }).step, null);
  assert.equal(decodeReplayStatus({ ...REPLAY, version: undefined }).version, 0);
  assert.throws(() => decodeFrame(encode({ type: "replay", ...REPLAY, position: null })), /replay position must be a finite number, got nil/);
  assert.throws(() => decodeReplayStatus({ ...REPLAY, speed: 0 }), /speed/);
  assert.throws(() => decodeReplayStatus("nope"), TypeError);
});

test("a reset frame must list its runs as strs", () => {
  assert.deepEqual(decodeFrame(encode({ type: "reset", seq: 4, runs: ["a", "b/c"] })), { type: "reset", seq: 4, runs: ["a", "b/c"] });
  assert.throws(() => decodeFrame(encode({ type: "reset", seq: 4 })), /reset.runs must be a list of str, got undefined/);
  assert.throws(() => decodeFrame(encode({ type: "reset", seq: 4, runs: [1] })), /reset.runs/);
});

test("encodeSubscribe adds keep, split and batch only when asked", () => {
  assert.deepEqual(decode(encodeSubscribe(["a"], 200, { keep: true, split: true, batch: true })), {
    type: "subscribe",
    runs: ["a"],
    max_points: 200,
    keep: true,
    split: true,
    batch: true,
  });
  assert.deepEqual(decode(encodeSubscribe(null, 2000, { keep: false })), { type: "subscribe", runs: null, max_points: 2000 });
});

test("decodeFrame unpacks a frames message into decoded frames, leaving out a bad one", () => {
  const data = encode({ type: "data", seq: 2, run: "r", scalars: [["loss", bytesOf([1]), bytesOf([2]), bytesOf([3])]], events: [] });
  const events = encode({ type: "snapshot_events", seq: 1, run: "r", events: [{ kind: "histogram", tag: "w", step: 1, wall: 2, edges: bytesOf([0, 1]), counts: bytesOf([5]) }] });
  const msg = decodeFrame(encode({ type: "frames", frames: [events, encode([1]), data, encode({ type: "gap", seq: 3 })] }));
  assert.equal(msg.type, "frames");
  assert.equal(msg.badFrames, 1);
  assert.deepEqual(msg.frames.map((f) => f.type), ["snapshot_events", "data", "gap"]);
  assert.deepEqual(msg.frames[0].scalars, []);
  assert.deepEqual(Array.from(msg.frames[0].events[0].counts), [5]);
  assert.deepEqual(Array.from(msg.frames[1].scalars[0].values), [3]);
  assert.throws(() => decodeFrame(encode({ type: "frames", frames: 3 })), /frames.frames must be a list/);
});
