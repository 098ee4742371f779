import assert from "node:assert/strict";
import { test } from "node:test";
import { FrameScheduler } from "../src/frames.js";

function setup() {
  const frames = [];
  const scheduler = new FrameScheduler({ requestFrame: (cb) => frames.push(cb) });
  const runFrame = () => frames.splice(0).forEach((cb) => cb());
  const item = (name) => ({ element: { name }, renders: 0, render() { this.renders++; } });
  return { scheduler, frames, runFrame, item };
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
  scheduler._onIntersect([{ target: a.element, isIntersecting: true }]);
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
