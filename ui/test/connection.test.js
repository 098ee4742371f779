import assert from "node:assert/strict";
import { test } from "node:test";
import { backoffMs, liveUrl, takeToken } from "../src/connection.js";

test("liveUrl follows the page's scheme and host and encodes the token", () => {
  assert.equal(liveUrl({ protocol: "http:", host: "127.0.0.1:8040" }, null), "ws://127.0.0.1:8040/ws/live");
  assert.equal(liveUrl({ protocol: "https:", host: "x.org" }, "a b&c"), "wss://x.org/ws/live?token=a%20b%26c");
  assert.equal(liveUrl({ protocol: "http:", host: "h" }, "t", { summaries: "table" }), "ws://h/ws/live?token=t&summaries=table");
  assert.equal(liveUrl({ protocol: "http:", host: "h" }, null, { summaries: "table" }), "ws://h/ws/live?summaries=table");
});

test("backoff doubles from 250 ms to a 10 s cap, with bounded jitter", () => {
  assert.deepEqual([0, 1, 2, 3].map((a) => backoffMs(a, () => 0)), [250, 500, 1000, 2000]);
  assert.equal(backoffMs(50, () => 0), 10_000);
  assert.equal(backoffMs(50, () => 1), 13_000);
});

test("takeToken moves ?token= into storage and strips it from the URL", () => {
  const store = new Map();
  const storage = { setItem: (k, v) => store.set(k, v), getItem: (k) => store.get(k) ?? null };
  let replaced = null;
  const history = { state: null, replaceState: (_s, _t, url) => (replaced = url) };
  const token = takeToken({ href: "http://h:1/?token=s3cret&x=1#top" }, history, storage);
  assert.equal(token, "s3cret");
  assert.equal(replaced, "/?x=1#top");
  assert.equal(takeToken({ href: "http://h:1/" }, history, storage), "s3cret");
});

test("a gap naming runs re-subscribes with keep (those runs alone are sent again); one without runs afresh", async () => {
  const { decode } = await import("@msgpack/msgpack");
  const { Connection, isRunList } = await import("../src/connection.js");
  const had = globalThis.WebSocket;
  globalThis.WebSocket = { OPEN: 1 }; // Node 20 has none: only readyState's constant is read
  try {
    const sent = [];
    const got = [];
    const conn = new Connection({ url: "ws://h/ws/live", onMessage: (m) => got.push(m.type), onState: () => {} });
    conn._ws = { readyState: 1, send: (bytes) => sent.push(decode(bytes)) };
    conn.runs = ["a", "b"];
    conn._handle({ type: "gap", seq: 5, runs: ["b"] });
    conn._handle({ type: "gap", seq: 6 });
    conn._handle({ type: "gap", seq: 7, runs: [1] }); // not a list of names: afresh
    assert.deepEqual(sent.map((m) => [m.runs, m.keep === true]), [[["a", "b"], true], [["a", "b"], false], [["a", "b"], false]]);
    assert.deepEqual(got, ["gap", "gap", "gap"]);
    assert.equal(conn.stats.gaps, 3);
    assert.equal(isRunList(["x"]), true);
    assert.equal(isRunList(undefined), false);
  } finally {
    globalThis.WebSocket = had;
  }
});

test("start() adopts a socket from preopen() while it connects, and opens its own otherwise", async () => {
  const { Connection } = await import("../src/connection.js");
  const had = globalThis.WebSocket;
  const made = [];
  class FakeSocket {
    static CONNECTING = 0;
    static OPEN = 1;
    constructor(url) {
      this.url = url;
      this.readyState = FakeSocket.CONNECTING;
      this.closed = false;
      made.push(this);
    }
    close() {
      this.closed = true;
      this.readyState = 3;
    }
  }
  globalThis.WebSocket = FakeSocket;
  try {
    const url = "ws://h/ws/live";
    const states = [];
    const early = Connection.preopen(url);
    assert.equal(early.binaryType, "arraybuffer");
    const conn = new Connection({ url, onMessage: () => {}, onState: (s) => states.push(s), autoSubscribe: false });
    conn.start({ socket: early });
    assert.equal(made.length, 1, "the early socket is the connection's: no second one");
    assert.equal(conn.stats.sockets, 1);
    assert.ok(typeof early.onopen === "function" && typeof early.onmessage === "function");
    early.readyState = FakeSocket.OPEN;
    early.onopen();
    assert.deepEqual(states, ["connecting", "open"]);
    assert.equal(conn.connected, true);

    // One that closed before start() is closed for good and replaced.
    const stale = Connection.preopen(url);
    stale.readyState = 3;
    const other = new Connection({ url, onMessage: () => {}, onState: () => {} });
    other.start({ socket: stale });
    assert.equal(made.length, 3);
    assert.notEqual(made[2], stale);
    assert.equal(stale.closed, true);
  } finally {
    globalThis.WebSocket = had;
  }
});

test("assume() keeps the runs the server subscribed from the URL for gaps, and sends nothing", async () => {
  const { decode } = await import("@msgpack/msgpack");
  const { Connection } = await import("../src/connection.js");
  const had = globalThis.WebSocket;
  globalThis.WebSocket = { OPEN: 1 };
  try {
    const sent = [];
    const conn = new Connection({ url: "ws://h/ws/live", onMessage: () => {}, onState: () => {} });
    conn._ws = { readyState: 1, send: (bytes) => sent.push(decode(bytes)) };
    conn.assume(["a", "b"]);
    assert.deepEqual(sent, []);
    assert.deepEqual(conn.runs, ["a", "b"]);
    conn._handle({ type: "gap", seq: 1, runs: ["a"] });
    assert.deepEqual(sent.map((m) => [m.runs, m.keep]), [[["a", "b"], true]]);
  } finally {
    globalThis.WebSocket = had;
  }
});

test("hold() queues the frames that arrive, undecoded, and hands them over in order in a later task once released", async () => {
  const { encode } = await import("@msgpack/msgpack");
  const { Connection } = await import("../src/connection.js");
  const had = globalThis.WebSocket;
  const made = [];
  globalThis.WebSocket = class {
    static CONNECTING = 0;
    static OPEN = 1;
    constructor() {
      this.readyState = 0;
      made.push(this);
    }
  };
  try {
    const got = [];
    const conn = new Connection({ url: "ws://h/ws/live", onMessage: (m) => got.push(m.type), onState: () => {}, autoSubscribe: false });
    conn.start();
    const ws = made[0];
    const frame = (type) => ({ data: new Uint8Array(encode({ type, run: "r" })).buffer });
    ws.onmessage(frame("snapshot"));
    assert.deepEqual(got, ["snapshot"]);
    const release = conn.hold();
    const second = conn.hold();
    ws.onmessage(frame("snapshot_events"));
    ws.onmessage(frame("data"));
    assert.deepEqual(got, ["snapshot"], "held: not decoded or handed over");
    assert.equal(conn.stats.held, 2);
    release();
    release(); // twice: still one release
    await new Promise((resolve) => setTimeout(resolve, 5));
    assert.deepEqual(got, ["snapshot"], "the other hold is still on");
    second();
    ws.onmessage(frame("synced")); // after the release, before the queue's task: behind the queue
    assert.deepEqual(got, ["snapshot"], "handed over in a task of its own, not in the caller's");
    await new Promise((resolve) => setTimeout(resolve, 5));
    assert.deepEqual(got, ["snapshot", "snapshot_events", "data", "synced"]);
    assert.equal(conn.stats.held, 3);
    ws.onmessage(frame("data"));
    assert.equal(got.length, 5, "nothing held: at once");

    // A socket that closes while frames are held hands them over before its close.
    conn.hold();
    ws.onmessage(frame("gap_not"));
    const states = [];
    conn.onState = (s) => states.push([s, got.length]);
    ws.onclose({ code: 1006, reason: "" });
    assert.deepEqual(got.slice(5), ["gap_not"]);
    assert.deepEqual(states[0], ["closed", 6]);
    conn.close();
  } finally {
    globalThis.WebSocket = had;
  }
});
