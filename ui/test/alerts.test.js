import assert from "node:assert/strict";
import { test } from "node:test";
import { AlertBook, alertKey, markersFor } from "../src/views/alerts.js";

function memoryStorage() {
  const data = new Map();
  return { getItem: (k) => data.get(k) ?? null, setItem: (k, v) => data.set(k, String(v)) };
}

const nan = { kind: "alert", tag: null, series: "train/loss", step: 300, wall: 100.5, rule: "nan", level: "error", title: "NaN", message: "m", value: null };
const stall = { kind: "alert", tag: null, series: null, step: 299, wall: 120, rule: "stall", level: "warn", title: "Stall", message: "m", value: 3 };

test("AlertBook keeps each alert once, whether it came in a snapshot or a data frame", () => {
  const book = new AlertBook(memoryStorage());
  assert.equal(book.take({ type: "data", run: "r", events: [nan, { kind: "text", text: "x" }] }).length, 1);
  assert.equal(book.take({ type: "snapshot", run: "r", events: [nan, stall] }).length, 1);
  assert.deepEqual(book.all().map((a) => a.rule), ["stall", "nan"]); // newest first
  assert.equal(book.all()[0].key, alertKey("r", stall));
});

test("acknowledgements and mutes persist, and muted alerts lose their markers", () => {
  const storage = memoryStorage();
  const book = new AlertBook(storage);
  book.take({ type: "data", run: "r", events: [nan, stall] });
  book.take({ type: "data", run: "other", events: [nan] });
  const all = () => true;
  assert.deepEqual(markersFor(book, "train/loss", "step", all).map((m) => m.x).sort(), [299, 300, 300]);
  assert.deepEqual(markersFor(book, "train/acc", "step", all).map((m) => m.x), [299]); // the run-level one
  assert.deepEqual(markersFor(book, "train/loss", "wall", (run) => run === "r").map((m) => m.x).sort(), [100.5, 120]);
  const [newest] = book.all();
  book.acknowledge(newest);
  book.mute(book.runs.get("r")[0]); // nan on train/loss of r
  assert.equal(book.unread().length, 1);
  assert.deepEqual(markersFor(book, "train/loss", "step", (run) => run === "r").map((m) => m.x), [299]);
  const again = new AlertBook(storage);
  again.take({ type: "snapshot", run: "r", events: [nan, stall] });
  assert.equal(again.isMuted("r", again.runs.get("r")[0]), true);
  assert.equal(again.isAcked(again.runs.get("r")[1]), true);
});
