import assert from "node:assert/strict";
import { test } from "node:test";
import { FRAME_MS, FrameScheduler, loadingDelay, MAX_BUDGET_WAIT_MS, NEAR_VIEW_PX, remainingMs } from "../src/frames.js";

function setup() {
  const frames = [];
  const scheduler = new FrameScheduler({ requestFrame: (cb) => frames.push(cb) });
  const runFrame = () => frames.splice(0).forEach((cb) => cb());
  const item = (name) => ({ element: { name }, renders: 0, render() { this.renders++; } });
  return { scheduler, frames, runFrame, item };
}

// A scheduler on a clock the test moves (`clock.now`, ms), its frames run by `runFrame`.
function timed(options = {}) {
  const clock = { now: 0 };
  const frames = [];
  const scheduler = new FrameScheduler({ requestFrame: (cb) => frames.push(cb), now: () => clock.now, ...options });
  const runFrame = () => frames.splice(0).forEach((cb) => cb());
  return { scheduler, frames, runFrame, clock };
}

test("many marks in one frame draw an item once", () => {
  const { scheduler, frames, runFrame, item } = setup();
  const a = item("a");
  scheduler.observe(a);
  for (let i = 0; i < 100; i++) scheduler.mark(a);
  assert.equal(frames.length, 1);
  runFrame();
  assert.equal(a.renders, 1);
  runFrame();
  assert.equal(a.renders, 1);
});

test("hidden items stay dirty and are drawn when visible again", () => {
  const { scheduler, runFrame, item } = setup();
  const a = item("a");
  scheduler.observe(a);
  runFrame();
  a.visible = false;
  scheduler.mark(a);
  runFrame();
  assert.equal(a.renders, 1);
  scheduler._observed([{ target: a.element, isIntersecting: true }], "visible");
  runFrame();
  assert.equal(a.renders, 2);
});

test("pause draws nothing; resume draws what changed", () => {
  const { scheduler, runFrame, item } = setup();
  const a = item("a");
  const b = item("b");
  scheduler.observe(a);
  scheduler.observe(b);
  runFrame();
  scheduler.setPaused(true);
  scheduler.mark(a);
  runFrame();
  assert.equal(a.renders, 1);
  scheduler.setPaused(false);
  runFrame();
  assert.equal(a.renders, 2);
  assert.equal(b.renders, 1);
});

test("drawAll draws hidden items too, without marking them visible", () => {
  const { scheduler, runFrame, item } = setup();
  const a = item("a");
  scheduler.observe(a);
  runFrame();
  scheduler._observed([{ target: a.element, isIntersecting: false }], "visible");
  scheduler.mark(a);
  scheduler.drawAll();
  assert.equal(a.renders, 2);
  assert.equal(a.visible, false);
  scheduler.mark(a);
  runFrame();
  assert.equal(a.renders, 2);
});

test("minInterval spaces drawing frames apart", async () => {
  const { scheduler, frames, runFrame, clock } = timed({ minInterval: 30 });
  const a = { element: {}, renders: 0, render() { this.renders++; } };
  scheduler.observe(a);
  runFrame();
  assert.equal(a.renders, 1);
  clock.now = 10;
  scheduler.mark(a);
  assert.equal(frames.length, 0); // waits for the interval instead of asking for a frame now
  await new Promise((r) => setTimeout(r, 40));
  assert.equal(frames.length, 1);
  runFrame();
  assert.equal(a.renders, 2);
});

test("with an IntersectionObserver, an item is drawn only once the observer reports it in view", () => {
  const observers = [];
  const saved = globalThis.IntersectionObserver;
  globalThis.IntersectionObserver = class {
    constructor(callback) {
      this.callback = callback;
      this.targets = [];
      observers.push(this);
    }
    observe(target) {
      this.targets.push(target);
    }
    unobserve() {}
  };
  try {
    const { scheduler, runFrame, item } = setup();
    const above = item("above");
    const below = item("below");
    scheduler.observe(above);
    scheduler.observe(below);
    runFrame();
    // Nothing drawn before the first report (no widths read before the layout has them).
    assert.equal(above.renders + below.renders, 0);
    const [observer] = observers;
    assert.deepEqual(observer.targets, [above.element, below.element]);
    observer.callback([
      { target: above.element, isIntersecting: true },
      { target: below.element, isIntersecting: false },
    ]);
    runFrame();
    assert.equal(above.renders, 1);
    assert.equal(below.renders, 0);
    // Scrolled to: drawn then.
    observer.callback([{ target: below.element, isIntersecting: true }]);
    runFrame();
    assert.equal(below.renders, 1);
  } finally {
    globalThis.IntersectionObserver = saved;
  }
});

// Fake IntersectionObservers for the scheduler's two: [0] the view and its margin, [1] the screen.
function withObservers(fn) {
  const observers = [];
  const saved = globalThis.IntersectionObserver;
  globalThis.IntersectionObserver = class {
    constructor(callback, options) {
      this.callback = callback;
      this.options = options;
      observers.push(this);
    }
    observe() {}
    unobserve() {}
  };
  try {
    fn(observers);
  } finally {
    globalThis.IntersectionObserver = saved;
  }
}

test("charts on screen draw first; a chart only near the view waits one drawing frame", () => {
  withObservers((observers) => {
    const { scheduler, frames, runFrame, item } = setup();
    const [near, screen] = observers;
    assert.equal(near.options.rootMargin, `${NEAR_VIEW_PX}px 0px`);
    assert.equal(screen.options, undefined);
    const shown = item("shown");
    const below = item("below");
    const far = item("far");
    for (const i of [shown, below, far]) scheduler.observe(i);
    near.callback([
      { target: shown.element, isIntersecting: true },
      { target: below.element, isIntersecting: true },
      { target: far.element, isIntersecting: false },
    ]);
    screen.callback([
      { target: shown.element, isIntersecting: true },
      { target: below.element, isIntersecting: false },
      { target: far.element, isIntersecting: false },
    ]);
    runFrame();
    assert.deepEqual([shown.renders, below.renders, far.renders], [1, 0, 0]);
    // The one left waiting asked for a frame of its own.
    assert.equal(frames.length, 1);
    runFrame();
    assert.deepEqual([shown.renders, below.renders, far.renders], [1, 1, 0]);
    // Both changing every frame: the near one is drawn every other frame, never starved.
    for (let k = 0; k < 4; k++) {
      scheduler.mark(shown);
      scheduler.mark(below);
      runFrame();
    }
    assert.equal(shown.renders, 5);
    assert.equal(below.renders, 3);
    // Nothing on screen to draw: the near one is drawn at once.
    runFrame();
    scheduler.mark(below);
    const before = below.renders;
    runFrame();
    assert.equal(below.renders, before + 1);
    // drawAll does not wait.
    scheduler.mark(shown);
    scheduler.mark(below);
    scheduler.mark(far);
    scheduler.drawAll();
    assert.deepEqual([shown.renders, below.renders, far.renders], [6, before + 2, 1]);
    runFrame(); // the frame asked for before drawAll: nothing left to draw
    // Scrolled to: a chart coming on screen is drawn first.
    scheduler.mark(shown);
    scheduler.mark(far);
    near.callback([{ target: far.element, isIntersecting: true }]);
    screen.callback([
      { target: far.element, isIntersecting: true },
      { target: shown.element, isIntersecting: false },
    ]);
    runFrame();
    assert.deepEqual([shown.renders, far.renders], [6, 2]);
    runFrame();
    assert.equal(shown.renders, 7);
  });
});

test("holdNear keeps a chart only near the view waiting until the frame after it ends", () => {
  withObservers((observers) => {
    let loading = true;
    const frames = [];
    const scheduler = new FrameScheduler({ requestFrame: (cb) => frames.push(cb), holdNear: () => loading });
    const [near, screen] = observers;
    const runFrame = () => frames.splice(0).forEach((cb) => cb());
    const shown = { element: {}, renders: 0, render() { this.renders++; } };
    const below = { element: {}, renders: 0, render() { this.renders++; } };
    scheduler.observe(shown);
    scheduler.observe(below);
    near.callback([{ target: shown.element, isIntersecting: true }, { target: below.element, isIntersecting: true }]);
    screen.callback([{ target: shown.element, isIntersecting: true }, { target: below.element, isIntersecting: false }]);
    // Snapshots arriving: every frame has the chart on screen to draw, the one below waits.
    for (let k = 0; k < 3; k++) {
      scheduler.mark(shown);
      scheduler.mark(below);
      runFrame();
    }
    assert.deepEqual([shown.renders, below.renders], [3, 0]);
    // The last one in: the frame it ends in draws the chart on screen alone, the next one the other.
    loading = false;
    scheduler.mark(shown);
    scheduler.flush();
    assert.deepEqual([shown.renders, below.renders], [4, 0]);
    runFrame();
    assert.deepEqual([shown.renders, below.renders], [4, 1]);
  });
});

test("a drawing budget spaces frames by the time drawing took", () => {
  const { scheduler, frames, runFrame, clock } = timed({ budget: 0.25 });
  const timers = [];
  const realSetTimeout = globalThis.setTimeout;
  globalThis.setTimeout = (fn, ms) => timers.push({ fn, ms });
  try {
    // Each draw takes 40 ms: at a quarter of the time, the next may start 160 ms after it ended.
    const slow = { element: {}, render() { clock.now += 40; } };
    scheduler.observe(slow);
    runFrame();
    // The cost is known when the next frame begins (the rasterizing and commit come after the
    // drawing calls): here at once, so the drawing calls' 40 ms are the cost.
    assert.equal(frames.length, 1);
    runFrame();
    assert.equal(scheduler.drawCost, 40);
    assert.equal(scheduler.interval(), 160);
    scheduler.mark(slow);
    assert.equal(frames.length, 0);
    assert.equal(timers.length, 1);
    assert.equal(timers[0].ms, 160);
    // A minInterval above what the budget asks wins.
    scheduler.minInterval = 500;
    assert.equal(scheduler.interval(), 500);
    // However slow the drawing, the budget spaces frames by at most MAX_BUDGET_WAIT_MS.
    scheduler.minInterval = 0;
    scheduler.drawCost = 5000;
    assert.equal(scheduler.interval(), MAX_BUDGET_WAIT_MS);
  } finally {
    globalThis.setTimeout = realSetTimeout;
  }
  assert.throws(() => new FrameScheduler({ budget: 0 }), /budget must be in \(0, 1\], got 0/);
});

test("the budget counts the frame until the next one began: rasterizing and commit too", () => {
  const { scheduler, frames, runFrame, clock } = timed({ budget: 0.25 });
  const chart = { element: {}, render() { clock.now += 10; } };
  scheduler.observe(chart);
  runFrame(); // draws: 10 ms of calls
  assert.equal(scheduler.drawCost, 0); // not known yet
  clock.now += 70 + FRAME_MS; // the commit held the thread 70 ms, then a display frame
  runFrame();
  assert.equal(scheduler.drawCost, 80);
  assert.equal(scheduler.interval(), 320);
  assert.ok(Math.abs(scheduler.stats.settleMs - 70) < 1e-9);
  // A change while a frame's cost is not known yet waits for it, then for the interval it sets.
  const timers = [];
  const realSetTimeout = globalThis.setTimeout;
  globalThis.setTimeout = (fn, ms) => timers.push({ fn, ms });
  try {
    scheduler.mark(chart);
    assert.equal(frames.length, 0); // spaced from the last draw by a timer
    assert.equal(timers.length, 1);
    clock.now += 320;
    timers.splice(0).forEach((t) => t.fn());
    runFrame(); // draws, then asks for the settle frame
    scheduler.mark(chart);
    assert.equal(frames.length, 1); // only the settle frame: the next draw waits for its cost
    assert.equal(timers.length, 0);
    clock.now += 200 + FRAME_MS;
    runFrame();
    assert.equal(timers.length, 1); // now spaced by the cost just learnt
    assert.ok(scheduler.drawCost > 80);
  } finally {
    globalThis.setTimeout = realSetTimeout;
  }
  // Without a budget, the drawing calls alone are counted, at once.
  const plain = new FrameScheduler({ requestFrame: (cb) => frames.push(cb), now: () => clock.now });
  plain.observe(chart);
  runFrame();
  assert.equal(frames.length, 0);
  assert.equal(plain.drawCost, 10);
});

test("restart counts the interval from now", async () => {
  const { scheduler, frames, runFrame, clock } = timed({ minInterval: 30 });
  const a = { element: {}, renders: 0, render() { this.renders++; } };
  scheduler.observe(a);
  runFrame();
  clock.now = 1000; // long idle: a mark draws in the next frame...
  scheduler.mark(a);
  assert.equal(frames.length, 1);
  scheduler.restart(); // ...unless a batch begins before it: then it waits a whole interval
  runFrame();
  assert.equal(a.renders, 1);
  assert.equal(frames.length, 0);
  await new Promise((r) => setTimeout(r, 45));
  clock.now = 1031;
  runFrame();
  assert.equal(a.renders, 2);
  // flush draws at once, whatever the restart said.
  scheduler.restart();
  scheduler.mark(a);
  scheduler.flush();
  assert.equal(a.renders, 3);
});

test("remainingMs: the rest of a batch at the rate so far", () => {
  assert.equal(remainingMs(0, 100, 500), Infinity);
  assert.equal(remainingMs(50, 100, 800), 800);
  assert.equal(remainingMs(80, 100, 800), 200);
  assert.equal(remainingMs(100, 100, 800), 0);
  assert.equal(remainingMs(120, 100, 800), 0);
  assert.equal(remainingMs(10, 100, -5), 0);
});

test("loadingDelay: a large selection's first redraw waits for the whole load until firstMs", () => {
  const limits = { firstMs: 2000, waitMs: 500, redrawMs: 1000 };
  // The redraw due at 1 s with 60 of 100 runs in (the rest due in 667 ms): put off to 2 s, where
  // the rule before drew at once (the rest not within 500 ms).
  assert.equal(loadingDelay({ elapsedMs: 1000, sinceDrawMs: 1000, done: 60, total: 100, drawn: false }, limits), 1000);
  assert.equal(loadingDelay({ elapsedMs: 1500, sinceDrawMs: 1500, done: 0, total: 100, drawn: false }, limits), 500);
  // From firstMs on: drawn now unless the rest is due within waitMs, and then never past
  // firstMs + redrawMs.
  assert.equal(loadingDelay({ elapsedMs: 2000, sinceDrawMs: 2000, done: 50, total: 100, drawn: false }, limits), 0);
  assert.equal(loadingDelay({ elapsedMs: 2000, sinceDrawMs: 2000, done: 80, total: 100, drawn: false }, limits), 500);
  assert.equal(loadingDelay({ elapsedMs: 2800, sinceDrawMs: 2800, done: 85, total: 100, drawn: false }, limits), 200);
  assert.equal(loadingDelay({ elapsedMs: 3000, sinceDrawMs: 3000, done: 90, total: 100, drawn: false }, limits), 0);
  // After a redraw of this selection, the rule as before: the rest due within waitMs waits, up to
  // twice redrawMs after that redraw.
  assert.equal(loadingDelay({ elapsedMs: 1200, sinceDrawMs: 1000, done: 60, total: 100, drawn: true }, limits), 0);
  assert.equal(loadingDelay({ elapsedMs: 1800, sinceDrawMs: 1000, done: 90, total: 100, drawn: true }, limits), 200);
  assert.equal(loadingDelay({ elapsedMs: 2000, sinceDrawMs: 1900, done: 90, total: 100, drawn: true }, limits), 100);
  assert.equal(loadingDelay({ elapsedMs: 2400, sinceDrawMs: 1000, done: 100, total: 100, drawn: true }, limits), 0);
});

test("defer puts a paced frame off; flush and drawAll do not wait for it", async () => {
  let wait = 30;
  const asked = [];
  const { scheduler, frames, runFrame, clock } = timed({ defer: (since) => (asked.push(since), wait) });
  const a = { element: {}, renders: 0, render() { this.renders++; } };
  scheduler.observe(a);
  clock.now = 500;
  scheduler.restart(); // the time since the last draw counts from here
  clock.now = 620;
  runFrame(); // put off: nothing drawn, no frame asked for until the wait is over
  assert.deepEqual(asked, [120]);
  assert.equal(a.renders, 0);
  assert.equal(frames.length, 0);
  scheduler.mark(a); // a mark meanwhile asks for no second frame
  assert.equal(frames.length, 0);
  await new Promise((r) => setTimeout(r, 45));
  assert.equal(frames.length, 1);
  wait = 0;
  runFrame();
  assert.equal(a.renders, 1);
  wait = 1000;
  scheduler.mark(a);
  scheduler.flush();
  assert.equal(a.renders, 2);
  scheduler.mark(a);
  scheduler.drawAll();
  assert.equal(a.renders, 3);
});

test("afterDraw calls once after the next frame that draws, or at its timeout", async () => {
  const { scheduler, runFrame, item } = setup();
  const calls = [];
  scheduler.afterDraw(() => calls.push("drawn"));
  const a = item("a");
  a.visible = false;
  scheduler.observe(a);
  a.visible = false; // not in view: the frame draws nothing
  runFrame();
  assert.deepEqual(calls, [], "a frame that drew nothing");
  a.visible = true;
  scheduler.mark(a);
  runFrame();
  assert.equal(a.renders, 1);
  assert.deepEqual(calls, ["drawn"]);
  scheduler.mark(a);
  runFrame();
  assert.deepEqual(calls, ["drawn"], "once");

  scheduler.afterDraw(() => calls.push("late"), 5);
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.deepEqual(calls, ["drawn", "late"], "no frame drew: at the timeout");
  scheduler.mark(a);
  runFrame();
  assert.deepEqual(calls, ["drawn", "late"], "not again after its timeout");
});

test("afterDraw waits for a drawing frame after which its condition holds", () => {
  const { scheduler, runFrame, item } = setup();
  const a = item("a");
  const b = item("b");
  scheduler.observe(a);
  runFrame();
  const calls = [];
  scheduler.afterDraw(() => calls.push("b drawn"), Infinity, () => b.renders > 0);
  scheduler.mark(a);
  runFrame();
  assert.deepEqual(calls, [], "a frame drew, not b");
  scheduler.observe(b);
  runFrame();
  assert.deepEqual(calls, ["b drawn"]);
});
