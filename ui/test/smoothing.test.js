import assert from "node:assert/strict";
import { test } from "node:test";
import { DEFAULT_SMOOTHING, Ema, smooth } from "../src/smoothing.js";

// TensorBoard's reference implementation (tf_scalar_dashboard), written out independently.
function tensorboard(values, weight) {
  let last = 0;
  let n = 0;
  return values.map((v) => {
    if (!Number.isFinite(v)) return v;
    last = last * weight + (1 - weight) * v;
    n++;
    const debias = weight === 1 ? 1 : 1 - Math.pow(weight, n);
    return last / debias;
  });
}

const close = (a, b) => a.every((x, i) => (Number.isNaN(x) && Number.isNaN(b[i])) || Math.abs(x - b[i]) < 1e-12);

test("default weight is 0.6", () => {
  assert.equal(DEFAULT_SMOOTHING, 0.6);
});

test("debiased: the first smoothed value equals the first raw value", () => {
  assert.equal(smooth([5, 1, 1])[0], 5);
  // without debiasing it would be 0.4 * 5 = 2
});

test("matches TensorBoard's debiased EMA", () => {
  const values = [1, 3, 2, 8, -4, 0.5, 7, 7, 7, 2];
  for (const w of [0, 0.3, 0.6, 0.95]) {
    assert.ok(close(Array.from(smooth(values, w)), tensorboard(values, w)), `weight ${w}`);
  }
  assert.deepEqual(Array.from(smooth([1, 2], 0.6)), [1, (0.24 * 1 + 0.4 * 2) / 0.64]);
});

test("a constant series stays constant", () => {
  for (const v of Array.from(smooth(new Array(50).fill(3.5), 0.9))) assert.ok(Math.abs(v - 3.5) < 1e-12);
});

test("non-finite values pass through without entering the average", () => {
  const out = Array.from(smooth([1, NaN, Infinity, 1], 0.6));
  assert.ok(Number.isNaN(out[1]));
  assert.equal(out[2], Infinity);
  assert.ok(Math.abs(out[3] - 1) < 1e-12);
});

test("incremental fill equals smoothing all at once", () => {
  const values = Array.from({ length: 100 }, (_, i) => Math.sin(i) * 10 + i);
  const ema = new Ema(0.8);
  const out = new Float64Array(values.length);
  ema.fill(values.slice(0, 37), out);
  const rest = new Float64Array(values.length - 37);
  ema.fill(values.slice(37), rest);
  out.set(rest, 37);
  assert.ok(close(Array.from(out), Array.from(smooth(values, 0.8))));
});

test("weight outside [0, 1) is refused", () => {
  assert.throws(() => new Ema(1), /weight must be in \[0, 1\), got 1/);
  assert.throws(() => new Ema(-0.1), /got -0.1/);
  assert.throws(() => new Ema(NaN), /got NaN/);
});

test("a continuing EMA picks up where a full smoothing left off (once the debiasing has faded)", () => {
  const values = Array.from({ length: 100 }, (_, i) => Math.sin(i / 3) * 5 + i / 10);
  const full = smooth(values, 0.7);
  const tail = new Float64Array(50);
  Ema.continuing(0.7, full[49]).fill(values.slice(50), tail);
  // 0.7^50 ~ 2e-8: what is left of the debiasing is far below this tolerance.
  for (let i = 0; i < tail.length; i++) assert.ok(Math.abs(tail[i] - full[50 + i]) < 1e-6, `index ${i}: ${tail[i]} vs ${full[50 + i]}`);
  assert.equal(Ema.continuing(0.7, NaN).next(2), 2); // no seed: an ordinary debiased start
});

test("the debias divisor stops being computed once it is 1, bit for bit the same", () => {
  // Once 1 - w^n rounds to 1 the smoothing skips Math.pow; every value must still be the one the
  // per-point divisor gives, exactly (long enough for w = 0.99 to reach it at the 3,725th point).
  let seed = 7;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const values = Array.from({ length: 6000 }, (_, i) => (i % 997 === 5 ? NaN : random() * 100 - 50));
  for (const w of [0, 0.3, 0.6, 0.9, 0.99]) {
    const whole = Array.from(smooth(values, w));
    assert.deepEqual(whole, tensorboard(values, w), `weight ${w}`);
    const ema = new Ema(w); // in pieces, as live appends smooth
    const pieces = [];
    for (let at = 0; at < values.length; at += 37) for (const v of values.slice(at, at + 37)) pieces.push(ema.next(v));
    assert.deepEqual(pieces, whole, `weight ${w}, in pieces`);
  }
});

test("Math.pow is called only while the debias divisor differs from 1", () => {
  const pow = Math.pow;
  let calls = 0;
  Math.pow = (a, b) => {
    calls++;
    return pow(a, b);
  };
  try {
    smooth(new Float64Array(1000).fill(1), 0.6);
  } finally {
    Math.pow = pow;
  }
  // 1 - 0.6^n is 1 from n = 74 on: 74 calls, not 1,000
  assert.equal(calls, 74);
});
