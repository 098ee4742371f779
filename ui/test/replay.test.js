import assert from "node:assert/strict";
import { test } from "node:test";
import { reconnectDelay } from "../src/connection.js";
import { STEP, Store } from "../src/store.js";
import {
  estimatePosition,
  latestStep,
  parseSpeedValue,
  parseStatus,
  ReplayError,
  replayRequest,
  Resync,
  SCRUB_MAX,
  scrubValue,
  scrubWall,
  speedLabel,
  speedOptions,
} from "../src/views/replay.js";

const STATUS = { playing: true, finished: false, speed: 10, position: 1050, start: 1000, end: 1100, fed: 5, total: 9, runs: ["r"] };

test("the scrubber maps the recorded range onto 0..SCRUB_MAX and back", () => {
  assert.equal(scrubValue(1000, 1000, 1100), 0);
  assert.equal(scrubValue(1100, 1000, 1100), SCRUB_MAX);
  assert.equal(scrubValue(1025, 1000, 1100), SCRUB_MAX / 4);
  assert.equal(scrubValue(900, 1000, 1100), 0); // clamped
  assert.equal(scrubValue(2000, 1000, 1100), SCRUB_MAX);
  assert.equal(scrubWall(0, 1000, 1100), 1000);
  assert.equal(scrubWall(SCRUB_MAX, 1000, 1100), 1100);
  assert.equal(scrubWall("2500", 1000, 1100), 1025); // input values are strings
  assert.equal(scrubWall(-5, 1000, 1100), 1000);
  assert.equal(scrubWall(SCRUB_MAX * 2, 1000, 1100), 1100);
  for (const v of [0, 1, 1234, 9999, SCRUB_MAX]) assert.equal(scrubValue(scrubWall(v, 1.7e9, 1.7e9 + 3600), 1.7e9, 1.7e9 + 3600), v);
});

test("a run of one instant (start == end) puts the scrubber at an end, never NaN", () => {
  assert.equal(scrubValue(5, 5, 5), SCRUB_MAX);
  assert.equal(scrubValue(4, 5, 5), 0);
  assert.equal(scrubWall(SCRUB_MAX / 2, 5, 5), 5);
});

test("the position moves on by the speed while playing, up to the end", () => {
  assert.equal(estimatePosition(STATUS, 2), 1070);
  assert.equal(estimatePosition(STATUS, 60), 1100);
  assert.equal(estimatePosition({ ...STATUS, playing: false }, 2), 1050);
  assert.equal(estimatePosition({ ...STATUS, finished: true }, 2), 1050);
  assert.equal(estimatePosition({ ...STATUS, speed: "max" }, 2), 1050);
  assert.equal(estimatePosition(STATUS, -1), 1050);
});

test("speeds: the standard ones, plus the server's own in order", () => {
  assert.deepEqual(speedOptions(10), [1, 10, 100, 1000, "max"]);
  assert.deepEqual(speedOptions("max"), [1, 10, 100, 1000, "max"]);
  assert.deepEqual(speedOptions(60), [1, 10, 60, 100, 1000, "max"]);
  assert.deepEqual(speedOptions(0.5), [0.5, 1, 10, 100, 1000, "max"]);
  assert.equal(speedLabel(10), "10×");
  assert.equal(speedLabel(1 / 3), "0.3333×");
  assert.equal(speedLabel("max", "最快"), "最快");
  assert.equal(parseSpeedValue("max"), "max");
  assert.equal(parseSpeedValue("100"), 100);
});

test("parseStatus keeps the documented fields and refuses broken ones", () => {
  assert.deepEqual(parseStatus(STATUS), STATUS);
  assert.equal(parseStatus({ ...STATUS, speed: "max" }).speed, "max");
  assert.equal(parseStatus({ ...STATUS, end: 900 }).end, 1000); // never before the start
  assert.throws(() => parseStatus({ ...STATUS, position: null }), /position/);
  assert.throws(() => parseStatus({ ...STATUS, speed: 0 }), /speed/);
  assert.throws(() => parseStatus("nope"), ReplayError);
});

function fakeFetch(status, body, calls) {
  return async (url, init) => {
    calls.push({ url, init });
    return { status, ok: status >= 200 && status < 300, json: async () => (body === undefined ? JSON.parse("<") : body) };
  };
}

test("replayRequest: GET with the token, POST as JSON, 404 means no replay", async () => {
  const calls = [];
  assert.deepEqual(await replayRequest(undefined, { token: "s3", fetchImpl: fakeFetch(200, STATUS, calls) }), STATUS);
  assert.equal(calls[0].url, "/api/replay");
  assert.equal(calls[0].init.method, undefined);
  assert.equal(calls[0].init.headers.Authorization, "Bearer s3");
  await replayRequest({ action: "seek", wall: 1010 }, { fetchImpl: fakeFetch(200, STATUS, calls) });
  assert.equal(calls[1].init.method, "POST");
  assert.equal(calls[1].init.headers["Content-Type"], "application/json");
  assert.equal(calls[1].init.headers.Authorization, undefined);
  assert.deepEqual(JSON.parse(calls[1].init.body), { action: "seek", wall: 1010 });
  assert.equal(await replayRequest(undefined, { fetchImpl: fakeFetch(404, undefined, calls) }), null);
});

test("replayRequest reports the server's error, or no answer as status 0", async () => {
  await assert.rejects(replayRequest({ action: "speed", speed: -1 }, { fetchImpl: fakeFetch(400, { error: "speed must be a positive number or 'max', got -1" }, []) }), (err) => err instanceof ReplayError && err.status === 400 && /speed must be/.test(err.message));
  await assert.rejects(replayRequest(undefined, { fetchImpl: fakeFetch(500, undefined, []) }), (err) => err.status === 500 && /answered 500/.test(err.message));
  const down = async () => {
    throw new TypeError("Failed to fetch");
  };
  await assert.rejects(replayRequest(undefined, { fetchImpl: down }), (err) => err.status === 0 && /Failed to fetch/.test(err.message));
});

const cols = (tag, steps) => ({ tag, steps: Float64Array.from(steps), walls: Float64Array.from(steps, (s) => 1000 + s), values: Float64Array.from(steps) });

test("latestStep is the newest step of any series the page holds", () => {
  const store = new Store();
  assert.equal(latestStep(store), null);
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols("loss", [0, 1, 7]), cols("acc", [0, 3])], events: [] });
  store.apply({ type: "data", seq: 1, run: "b", scalars: [cols("loss", [2])], events: [] });
  assert.equal(latestStep(store), 7);
  store.apply({ type: "snapshot", seq: 2, run: "a", scalars: [cols("loss", [0, 4])], events: [] });
  assert.equal(latestStep(store), 4);
});

test("clearRun empties one run's points and events and tells the views", () => {
  const store = new Store();
  store.apply({ type: "data", seq: 1, run: "a", scalars: [cols("loss", [0, 1, 2])], events: [{ kind: "text", tag: "n", step: 2, wall: 1, text: "x" }] });
  store.apply({ type: "data", seq: 1, run: "b", scalars: [cols("loss", [0, 1])], events: [] });
  const changes = [];
  store.subscribe((c) => changes.push(`${c.kind}:${c.run}`));
  store.clearRun("a");
  store.clearRun("nope");
  assert.equal(store.series("a", "loss").length, 0);
  assert.equal(store.runs.get("a").texts.size, 0);
  assert.equal(store.series("b", "loss").length, 2);
  assert.ok(changes.includes("scalars:a") && changes.includes("text:a"));
  assert.ok(!changes.some((c) => c.endsWith(":b") || c.endsWith(":nope")));
});

test("after a reconnect, a run the fresh broker does not list loses its old points before new ones come", () => {
  const store = new Store();
  for (const run of ["a", "b", "c"]) store.apply({ type: "data", seq: 9, run, scalars: [cols("loss", [0, 1, 2, 3])], events: [] });
  const resync = new Resync(store);
  assert.equal(resync.seen({ type: "runs", runs: [] }), false); // not after a reconnect: ignored
  resync.opened();
  assert.equal(resync.seen({ type: "runs", runs: ["a"] }), true);
  assert.deepEqual([...resync.stale].sort(), ["b", "c"]);
  assert.equal(resync.seen({ type: "runs", runs: [] }), false); // only the first list counts
  // "a" gets a snapshot as usual; "b" is replayed again by data frames: old points go first
  const data = { type: "data", seq: 1, run: "b", scalars: [cols("loss", [0, 1])], events: [] };
  resync.seen(data);
  store.apply(data);
  assert.deepEqual(Array.from(store.series("b", "loss").column(STEP)), [0, 1]);
  resync.seen({ ...data, scalars: [cols("loss", [2])] }); // later frames append
  store.apply({ ...data, scalars: [cols("loss", [2])] });
  assert.deepEqual(Array.from(store.series("b", "loss").column(STEP)), [0, 1, 2]);
  // "c" keeps its old points (no blank charts) until it expires
  assert.equal(store.series("c", "loss").length, 4);
  resync.expire();
  assert.equal(store.series("c", "loss").length, 0);
  assert.equal(store.series("a", "loss").length, 4);
});

test("a replay's 1001 close is followed by an immediate reconnect, then the usual backoff", () => {
  assert.equal(reconnectDelay(0, 1001, true, () => 0), 0);
  assert.equal(reconnectDelay(1, 1001, true, () => 0), 500);
  assert.equal(reconnectDelay(0, 1006, true, () => 0), 250);
  assert.equal(reconnectDelay(0, 1001, false, () => 0), 250);
});
