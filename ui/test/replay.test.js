import assert from "node:assert/strict";
import { test } from "node:test";
import { decodeFrame } from "../src/decode.js";
import { Store } from "../src/store.js";
import { encode } from "@msgpack/msgpack";
import {
  estimatePosition,
  latestStep,
  newerStatus,
  parseSpeedValue,
  ReplayBar,
  ReplayError,
  replayCommand,
  SCRUB_MAX,
  scrubValue,
  scrubWall,
  speedLabel,
  speedOptions,
} from "../src/views/replay.js";

const STATUS = { playing: true, finished: false, speed: 10, position: 1050, step: 49, start: 1000, end: 1100, fed: 5, total: 9, runs: ["r"], version: 3 };

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

function fakeFetch(status, body, calls) {
  return async (url, init) => {
    calls.push({ url, init });
    return { status, ok: status >= 200 && status < 300, json: async () => (body === undefined ? JSON.parse("<") : body) };
  };
}

test("replayCommand POSTs JSON with the token and answers the decoded status", async () => {
  const calls = [];
  assert.deepEqual(await replayCommand({ action: "seek", wall: 1010 }, { token: "s3", fetchImpl: fakeFetch(200, STATUS, calls) }), STATUS);
  assert.equal(calls[0].url, "/api/replay");
  assert.equal(calls[0].init.method, "POST");
  assert.equal(calls[0].init.headers["Content-Type"], "application/json");
  assert.equal(calls[0].init.headers.Authorization, "Bearer s3");
  assert.deepEqual(JSON.parse(calls[0].init.body), { action: "seek", wall: 1010 });
  await replayCommand({ action: "pause" }, { fetchImpl: fakeFetch(200, STATUS, calls) });
  assert.equal(calls[1].init.headers.Authorization, undefined);
});

test("replayCommand reports the server's error, a missing replay, a broken status, or no answer as status 0", async () => {
  await assert.rejects(replayCommand({ action: "speed", speed: -1 }, { fetchImpl: fakeFetch(400, { error: "speed must be a positive number or 'max', got -1" }, []) }), (err) => err instanceof ReplayError && err.status === 400 && /speed must be/.test(err.message));
  await assert.rejects(replayCommand({ action: "play" }, { fetchImpl: fakeFetch(404, undefined, []) }), (err) => err.status === 404 && /answered 404/.test(err.message));
  await assert.rejects(replayCommand({ action: "play" }, { fetchImpl: fakeFetch(200, { ...STATUS, position: null }, []) }), (err) => err instanceof ReplayError && /position/.test(err.message));
  const down = async () => {
    throw new TypeError("Failed to fetch");
  };
  await assert.rejects(replayCommand({ action: "play" }, { fetchImpl: down }), (err) => err.status === 0 && /Failed to fetch/.test(err.message));
});

test("of a pushed status and a command's answer that cross, the higher version wins", () => {
  assert.equal(newerStatus(null, STATUS), STATUS);
  const older = { ...STATUS, version: 2, position: 1000 };
  assert.equal(newerStatus(STATUS, older), STATUS);
  const newer = { ...STATUS, version: 4 };
  assert.equal(newerStatus(STATUS, newer), newer);
  const same = { ...STATUS };
  assert.equal(newerStatus(STATUS, same), same); // a tie takes the incoming one
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

// The bar without a DOM: dom.js's el() needs `document`, so a minimal stand-in is enough here.
function withFakeDocument(fn) {
  const saved = globalThis.document;
  const node = () => {
    const n = { children: [], dataset: {}, attributes: {}, style: {}, hidden: false, textContent: "", value: "", title: "", classList: { toggle() {}, add() {} } };
    n.setAttribute = (k, v) => {
      n.attributes[k] = v;
      if (k === "hidden") n.hidden = true;
    };
    n.append = (...c) => n.children.push(...c);
    n.appendChild = (c) => n.children.push(c);
    n.replaceChildren = (...c) => (n.children = c);
    n.addEventListener = () => {};
    return n;
  };
  globalThis.document = { createElement: node, createTextNode: (text) => ({ text }), hidden: false, activeElement: null };
  try {
    return fn();
  } finally {
    if (saved === undefined) delete globalThis.document;
    else globalThis.document = saved;
  }
}

test("the bar appears with the first pushed status, follows every newer one and never polls", () => {
  withFakeDocument(() => {
    let now = 0;
    const calls = [];
    const bar = new ReplayBar({ store: new Store(), token: null }, { fetchImpl: fakeFetch(200, STATUS, calls), now: () => now });
    try {
      assert.equal(bar.state, "absent");
      assert.equal(bar.element.hidden, true);
      bar.onMessage({ type: "data", run: "r", scalars: [], events: [] }); // not a status
      assert.equal(bar.state, "absent");
      const frame = decodeFrame(encode({ type: "replay", ...STATUS, playing: false }));
      bar.onMessage(frame);
      assert.equal(bar.state, "active");
      assert.equal(bar.element.hidden, false);
      assert.equal(bar.element.dataset.state, "paused");
      assert.equal(bar.scrub.value, String(SCRUB_MAX / 2));
      bar.onMessage({ type: "replay", status: { ...STATUS, version: 5, position: 1075 } });
      assert.equal(bar.element.dataset.state, "playing");
      now = 1000; // a second later at 10x: ten recorded seconds on
      assert.equal(bar.position(), 1085);
      bar.onMessage({ type: "replay", status: { ...STATUS, version: 4, position: 1000 } }); // stale
      assert.equal(bar.status.version, 5);
      bar.onMessage({ type: "replay", status: { ...STATUS, version: 6, finished: true, position: 1100 } });
      assert.equal(bar.element.dataset.state, "finished");
      assert.equal(bar.statusFrames, 3 + 1);
      assert.equal(calls.length, 0);
      assert.equal(bar.requests, 0);
    } finally {
      clearInterval(bar._timer);
    }
  });
});

test("a seek shows its target until the server answers, then the answer", async () => {
  await withFakeDocument(async () => {
    const calls = [];
    let answer;
    const fetchImpl = (url, init) => {
      calls.push(JSON.parse(init.body));
      return new Promise((resolve) => (answer = resolve));
    };
    const bar = new ReplayBar({ store: new Store(), token: "t" }, { fetchImpl, now: () => 0 });
    try {
      bar.onMessage({ type: "replay", status: { ...STATUS, playing: false } });
      const done = bar.seek({ wall: 1025 });
      assert.equal(bar.position(), 1025);
      bar.onMessage({ type: "replay", status: { ...STATUS, playing: false, version: 4, position: 1050 } }); // pushed before the seek
      assert.equal(bar.position(), 1025);
      answer({ status: 200, ok: true, json: async () => ({ ...STATUS, playing: false, version: 5, position: 1025 }) });
      assert.equal((await done).position, 1025);
      assert.equal(bar.position(), 1025);
      assert.deepEqual(calls, [{ action: "seek", wall: 1025 }]);
      assert.equal(bar.requests, 1);
    } finally {
      clearInterval(bar._timer);
    }
  });
});
