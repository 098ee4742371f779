// The block summaries and the downsampling that reads them must give exactly what the full scan
// gives: every case below compares the two (or the summaries against a brute-force search).
import assert from "node:assert/strict";
import { test } from "node:test";
import { minMaxIndices } from "../src/downsample.js";
import { BlockExtremes } from "../src/extremes.js";
import { RingBuffer } from "../src/ringbuffer.js";
import { Series, SERIES_CAPACITY, STEP, VALUE } from "../src/store.js";

function randomFrom(seed) {
  return () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
}

// A ring of (x, y) rows with its summary, fed the way Series feeds them.
class Summarised {
  constructor(capacity) {
    this.ring = new RingBuffer(2, capacity);
    this.extremes = new BlockExtremes(capacity);
  }

  push(xs, ys) {
    this.ring.push(xs, ys);
    this.extremes.append(ys);
  }

  get xs() {
    return this.ring.column(0);
  }

  get ys() {
    return this.ring.column(1);
  }
}

const same = (s, columns, xMin, xMax, what) => {
  const fast = minMaxIndices(s.xs, s.ys, columns, xMin, xMax, true, s.extremes);
  const full = minMaxIndices(s.xs, s.ys, columns, xMin, xMax, true);
  assert.deepEqual(Array.from(fast), Array.from(full), what);
};

// The first lowest and first highest finite value of ys[from..to), by brute force.
function bruteExtremes(ys, from, to) {
  let lo = -1;
  let hi = -1;
  for (let i = from; i < to; i++) {
    if (!Number.isFinite(ys[i])) continue;
    if (lo < 0 || ys[i] < ys[lo]) lo = i;
    if (hi < 0 || ys[i] > ys[hi]) hi = i;
  }
  return [lo, hi];
}

// Values with ties, NaN and infinities, including whole blocks without a finite value.
function nastyValue(random, i) {
  const r = random();
  if (Math.floor(i / 40) % 17 === 3) return NaN; // a run of 40: whole 16-row blocks
  if (r < 0.02) return NaN;
  if (r < 0.03) return Infinity;
  if (r < 0.04) return -Infinity;
  if (r < 0.5) return Math.floor(random() * 5); // many equal values: the first must win
  return Math.sin(i / 300) * 10 + random();
}

test("summaries give the first lowest and highest finite value of any range", () => {
  const random = randomFrom(7);
  for (const capacity of [1, 15, 16, 300, 5000, 70_000]) {
    const s = new Summarised(capacity);
    let step = 0;
    for (let round = 0; round < 12; round++) {
      const size = Math.floor(random() * capacity * 0.7) + 1;
      const xs = Float64Array.from({ length: size }, () => step++);
      s.push(xs, xs.map((x) => nastyValue(random, x)));
      const ys = s.ys;
      const out = new Int32Array(2);
      for (let q = 0; q < 40; q++) {
        const a = Math.floor(random() * ys.length);
        const b = a + Math.floor(random() * (ys.length - a + 1));
        s.extremes.scan(ys, a, b, out);
        assert.deepEqual(Array.from(out), bruteExtremes(ys, a, b), `capacity ${capacity}, round ${round}, rows ${a}..${b}`);
      }
    }
  }
});

test("downsampling with summaries equals the full scan on random data", () => {
  const random = randomFrom(99);
  const s = new Summarised(100_000);
  const xs = Float64Array.from({ length: 100_000 }, (_, i) => i);
  s.push(xs, xs.map(() => random() * 2 - 1));
  for (const columns of [1, 2, 7, 50, 333, 640, 1400, 49_999]) same(s, columns, undefined, undefined, `${columns} columns`);
});

test("downsampling with summaries equals the full scan while the ring wraps", () => {
  const random = randomFrom(2024);
  const capacity = 3000;
  const s = new Summarised(capacity);
  let step = 0;
  for (let round = 0; round < 200; round++) {
    // Mostly small appends, sometimes one larger than the whole ring.
    const size = random() < 0.05 ? capacity + Math.floor(random() * 500) : Math.floor(random() * 400);
    const xs = Float64Array.from({ length: size }, () => step++);
    s.push(xs, xs.map((x) => Math.sin(x / 50) + random() * 0.1));
    same(s, 1 + Math.floor(random() * 600), undefined, undefined, `round ${round}`);
  }
  assert.ok(s.ring.dropped > 10 * capacity);
});

test("downsampling with summaries equals the full scan with NaN, infinities and ties", () => {
  const random = randomFrom(31337);
  const s = new Summarised(20_000);
  const xs = Float64Array.from({ length: 30_000 }, (_, i) => i);
  s.push(xs, xs.map((x) => nastyValue(random, x)));
  for (const columns of [3, 64, 200, 700, 2000]) same(s, columns, undefined, undefined, `${columns} columns`);
  // A non-finite value first in a column: the full scan keeps it against finite ones in one
  // direction (-Infinity as the lowest, +Infinity as the highest) and replaces a leading NaN.
  const t = new Summarised(1000);
  const steps = Float64Array.from({ length: 1000 }, (_, i) => i);
  const values = Float64Array.from({ length: 1000 }, (_, i) => i % 7);
  for (let c = 0; c < 100; c++) values[c * 10] = [NaN, Infinity, -Infinity, 3][c % 4];
  t.push(steps, values);
  same(t, 100, undefined, undefined, "non-finite first rows");
});

test("downsampling with summaries equals the full scan over zoomed x ranges", () => {
  const random = randomFrom(5);
  const s = new Summarised(50_000);
  // Irregular x: gaps, and repeated steps (rows with the same x).
  let x = 0;
  const xs = Float64Array.from({ length: 60_000 }, () => (x += random() < 0.1 ? 0 : random() < 0.01 ? 500 : 1));
  s.push(xs, xs.map((v) => nastyValue(random, v)));
  const first = s.xs[0];
  const last = s.xs[s.xs.length - 1];
  for (let q = 0; q < 200; q++) {
    const a = first - 1000 + random() * (last - first + 2000);
    const b = a + random() * (last - first) * (q % 2 ? 1 : 0.01);
    same(s, 1 + Math.floor(random() * 800), a, b, `zoom ${a}..${b}`);
  }
  same(s, 300, first, last, "the whole range");
  same(s, 300, first + 0.5, first + 0.5, "an empty range");
  // Infinite x at the ends (x is only required to be ascending).
  const inf = new Summarised(5000);
  const xsInf = Float64Array.from({ length: 5000 }, (_, i) => (i < 3 ? -Infinity : i > 4990 ? Infinity : i));
  inf.push(xsInf, xsInf.map((v, i) => Math.sin(i / 9)));
  same(inf, 100, undefined, undefined, "infinite x at both ends");
  same(inf, 100, -Infinity, 2000, "a zoom from -Infinity");
  same(inf, 100, 10, 4000, "a zoom inside");
});

test("downsampling with summaries reads a small part of the rows", () => {
  const n = 262_144;
  const s = new Summarised(n);
  const xs = Float64Array.from({ length: n }, (_, i) => i);
  s.push(xs, xs.map((x) => Math.sin(x / 1000)));
  let reads = 0;
  const counted = new Proxy(s.ys, {
    get(target, key) {
      if (typeof key === "string" && key !== "length") reads++;
      const v = target[key];
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
  const fast = minMaxIndices(s.xs, counted, 700, undefined, undefined, true, s.extremes);
  assert.ok(reads < n / 5, `${reads} values read of ${n}`);
  assert.deepEqual(Array.from(fast), Array.from(minMaxIndices(s.xs, s.ys, 700, undefined, undefined, true)));
});

test("a summary that does not match the values is not used", () => {
  const s = new Summarised(1000);
  const xs = Float64Array.from({ length: 1000 }, (_, i) => i);
  s.push(xs, xs.map((x) => x % 13));
  const other = new BlockExtremes(1000);
  other.append(new Float64Array(10));
  const withWrong = minMaxIndices(s.xs, s.ys, 20, undefined, undefined, true, other);
  assert.deepEqual(Array.from(withWrong), Array.from(minMaxIndices(s.xs, s.ys, 20)));
});

test("a series keeps its summaries through wrapping and clearing", () => {
  const series = new Series("run", "tag", 0.6);
  const random = randomFrom(11);
  let step = 0;
  const append = (size) => {
    const steps = Float64Array.from({ length: size }, () => step++);
    series.append(steps, steps, steps.map((x) => Math.cos(x / 777) + random()));
  };
  const check = (what) => {
    const fast = minMaxIndices(series.column(STEP), series.column(VALUE), 640, undefined, undefined, series.stepsAscending, series.extremes);
    const full = minMaxIndices(series.column(STEP), series.column(VALUE), 640, undefined, undefined, true);
    assert.deepEqual(Array.from(fast), Array.from(full), what);
  };
  append(SERIES_CAPACITY - 5);
  check("nearly full");
  for (let i = 0; i < 30; i++) append(1000 + i * 37);
  assert.ok(series.buffer.dropped > 0);
  check("wrapped");
  series.clear();
  step = 0;
  append(5000);
  check("cleared and refilled");
  assert.equal(series.extremes.length, 5000);
});

test("a NaN step makes the series not ascending", () => {
  const series = new Series("run", "tag", 0.6);
  series.append([1, 2], [1, 2], [0, 0]);
  series.append([NaN], [3], [0]);
  assert.equal(series.stepsAscending, false);
  assert.equal(series.wallsAscending, true);
});

test("the block tables grow with the rows, and stay exact across growth and wrapping", () => {
  // A snapshot of 200 points in a series of the page's capacity takes a few slots, not 140 KB.
  const small = new BlockExtremes(SERIES_CAPACITY);
  small.append(Float64Array.from({ length: 200 }, (_, i) => Math.sin(i)));
  const bytes = small._levels.reduce((n, l) => n + l.minAt.byteLength + l.maxAt.byteLength, 0);
  assert.ok(bytes <= 4 * 64 * 2 * small._levels.length, `tables of ${bytes} bytes`);
  // One row at a time through many doublings and twice around the ring.
  const random = randomFrom(31);
  const capacity = 16 * 200;
  const s = new Summarised(capacity);
  const out = new Int32Array(2);
  for (let i = 0; i < 2.5 * capacity; i++) {
    s.push(Float64Array.of(i), Float64Array.of(nastyValue(random, i)));
    if (i % 97 !== 0) continue;
    const ys = s.ys;
    const a = Math.floor(random() * ys.length);
    const b = a + Math.floor(random() * (ys.length - a + 1));
    s.extremes.scan(ys, a, b, out);
    assert.deepEqual(Array.from(out), bruteExtremes(ys, a, b), `row ${i}, rows ${a}..${b}`);
  }
});

test("the levels' first tables share one array, and a grown level keeps its summaries", () => {
  const ex = new BlockExtremes(1 << 18);
  const buffers = new Set(ex._levels.flatMap((level) => [level.minAt.buffer, level.maxAt.buffer]));
  assert.equal(buffers.size, 1);
  // 64 slots of 16 rows to begin with: 2,000 rows grow the finest level's tables.
  const values = Float64Array.from({ length: 2000 }, (_, i) => Math.sin(i * 0.37) * (i % 97));
  ex.append(values);
  assert.ok(ex._levels[0].minAt.length > 64);
  const out = new Int32Array(2);
  for (const [from, to] of [[0, 2000], [17, 1999], [1000, 1601]]) {
    ex.scan(values, from, to, out);
    let lo = from;
    let hi = from;
    for (let i = from; i < to; i++) {
      if (values[i] < values[lo]) lo = i;
      if (values[i] > values[hi]) hi = i;
    }
    assert.deepEqual([...out], [lo, hi]);
  }
});
