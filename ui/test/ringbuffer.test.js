import assert from "node:assert/strict";
import { test } from "node:test";
import { FIRST_ROWS, RingBuffer } from "../src/ringbuffer.js";

const col = (rb, c) => Array.from(rb.column(c));

test("keeps rows in order while below capacity, growing as needed", () => {
  const rb = new RingBuffer(2, 10_000);
  for (let i = 0; i < 1000; i++) rb.pushRow(i, i * 2);
  assert.equal(rb.length, 1000);
  assert.deepEqual(col(rb, 0).slice(0, 3), [0, 1, 2]);
  assert.deepEqual(col(rb, 1).slice(-2), [1996, 1998]);
  assert.equal(rb.dropped, 0);
});

test("drops the oldest rows beyond capacity, across many wraps", () => {
  const rb = new RingBuffer(1, 7);
  for (let i = 0; i < 100; i++) rb.pushRow(i);
  assert.deepEqual(col(rb, 0), [93, 94, 95, 96, 97, 98, 99]);
  assert.equal(rb.dropped, 93);
  assert.equal(rb.last(0), 99);
});

test("bulk push of columns matches row-by-row pushes", () => {
  const a = new RingBuffer(2, 50);
  const b = new RingBuffer(2, 50);
  let next = 0;
  for (const size of [3, 17, 1, 40, 60, 5, 49, 2]) {
    const xs = Float64Array.from({ length: size }, (_, i) => next + i);
    const ys = xs.map((x) => -x);
    a.push(xs, ys);
    for (let i = 0; i < size; i++) b.pushRow(xs[i], ys[i]);
    next += size;
    assert.deepEqual(col(a, 0), col(b, 0));
    assert.deepEqual(col(a, 1), col(b, 1));
  }
  assert.equal(a.length, 50);
  assert.equal(a.last(0), next - 1);
  assert.equal(a.dropped, next - 50);
});

test("a push larger than the capacity keeps its newest rows", () => {
  const rb = new RingBuffer(1, 4);
  rb.pushRow(-1);
  rb.push([0, 1, 2, 3, 4, 5]);
  assert.deepEqual(col(rb, 0), [2, 3, 4, 5]);
  assert.equal(rb.dropped, 3);
});

test("plain arrays are accepted and columns must agree in length", () => {
  const rb = new RingBuffer(2, 8);
  rb.push([1, 2], [3, 4]);
  assert.deepEqual(col(rb, 1), [3, 4]);
  assert.throws(() => rb.push([1], [1, 2]), /columns differ in length: 1 and 2/);
  assert.throws(() => rb.push([1]), /push needs 2 columns, got 1/);
});

test("clear empties it, and bad arguments are refused", () => {
  const rb = new RingBuffer(1, 3);
  rb.push([1, 2, 3]);
  rb.clear();
  assert.equal(rb.length, 0);
  assert.equal(rb.last(0), undefined);
  assert.throws(() => new RingBuffer(0), /columns must be a positive int, got 0/);
  assert.throws(() => new RingBuffer(1, 2.5), /capacity must be a positive int, got 2.5/);
});

test("memory stays bounded at a quarter above the capacity", () => {
  const rb = new RingBuffer(1, 4000);
  for (let i = 0; i < 100_000; i++) rb.pushRow(i);
  assert.ok(rb._cols[0].length <= 5000, `backing array has ${rb._cols[0].length} rows`);
  assert.equal(rb.column(0)[0], 96_000);
  const bulk = new RingBuffer(2, 4000);
  for (let i = 0; i < 100; i++) bulk.push(new Float64Array(3999), new Float64Array(3999));
  assert.ok(bulk._cols[0].length <= 5000, `backing array has ${bulk._cols[0].length} rows`);
});

test("random pushes always hold exactly the newest rows (model check)", () => {
  let seed = 12345;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (const capacity of [1, 3, 64, 1000]) {
    const rb = new RingBuffer(2, capacity);
    const model = [];
    let next = 0;
    for (let round = 0; round < 300; round++) {
      const size = Math.floor(random() * capacity * 1.5);
      const xs = Float64Array.from({ length: size }, () => next++);
      rb.push(xs, xs.map((x) => x * 10));
      model.push(...xs);
      const expected = model.slice(-capacity);
      assert.deepEqual(col(rb, 0), expected, `capacity ${capacity}, round ${round}`);
      assert.deepEqual(col(rb, 1), expected.map((x) => x * 10));
      assert.equal(rb.dropped, model.length - expected.length);
    }
  }
});

test("every column lives in one backing array, before and after growing", () => {
  // One ArrayBuffer per ring (not one per column): a selection of 100 runs creates 1,000 series.
  const ring = new RingBuffer(4, 1 << 18);
  assert.equal(ring.column(0).buffer, ring.column(3).buffer);
  const n = 5000; // past the first allocation: the ring grows
  ring.push(...[0, 1, 2, 3].map((c) => Float64Array.from({ length: n }, (_, i) => i * 10 + c)));
  assert.equal(ring.column(1).buffer, ring.column(2).buffer);
  for (let c = 0; c < 4; c++) {
    const col = ring.column(c);
    assert.equal(col.length, n);
    assert.equal(col[0], c);
    assert.equal(col[n - 1], (n - 1) * 10 + c);
  }
});

test("the backing arrays are made by the first push, as large as it needs", () => {
  // A snapshot of 200 points fills exactly 200 rows (Chromium pays for each fresh page written);
  // a series fed live starts with FIRST_ROWS and doubles from there.
  const ring = new RingBuffer(4, 1 << 18);
  assert.equal(ring.column(0).buffer.byteLength, 0);
  assert.equal(ring.last(0), undefined);
  const xs = Float64Array.from({ length: 200 }, (_, i) => i);
  ring.push(xs, xs, xs, xs);
  assert.equal(ring.column(3).buffer.byteLength, 200 * 4 * 8);
  ring.pushRow(200, 200, 200, 200); // the first live point after the snapshot grows it
  assert.deepEqual(col(ring, 2), [...Array.from(xs), 200]);
  assert.ok(ring._cols[0].length >= 402, `backing array has ${ring._cols[0].length} rows`);
  const live = new RingBuffer(2, 1 << 18);
  live.pushRow(1, 2);
  assert.equal(live._cols[0].length, FIRST_ROWS);
  const small = new RingBuffer(1, 10); // never past the capacity and its slack
  small.pushRow(5);
  assert.ok(small._cols[0].length <= small.maxRows);
  assert.deepEqual(col(small, 0), [5]);
});
