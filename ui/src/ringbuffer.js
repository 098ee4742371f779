// Bounded per-series storage: parallel Float64Array columns holding the newest `capacity` rows.
//
// Rows live in a window of a backing array a quarter larger than the capacity. Appends write after
// the window; when the end of the backing array is reached, the live rows are moved back to the
// front in one copyWithin. A full buffer moves its rows once per capacity/4 appends (amortised
// O(1): four row copies per append at most), and every column is always one contiguous subarray,
// so downsampling and uPlot read it without copying or index arithmetic. The backing arrays are
// made by the first push, as large as it needs (at least `FIRST_ROWS`), and double up to their
// final size.

// Rows the backing arrays hold beyond the capacity at least: room to append before compacting.
const MIN_SLACK_ROWS = 256;
/**
 * Rows of the backing arrays the first push makes, unless it brings more: a series fed live
 * starts with room for this many rows, and one filled by a snapshot gets exactly its points.
 * Chromium pays for every fresh page of an ArrayBuffer written for the first time (a selection of
 * 100 runs fills 1,000 series of 200 points at once: 6.4 KB each, not the 16 KB of 512 rows).
 */
export const FIRST_ROWS = 64;
// The columns of a ring with no backing arrays yet (no rows pushed): empty views of one array.
const NONE = new Float64Array(0);

export class RingBuffer {
  /**
   * @param {number} columns number of parallel columns (e.g. step, wall, value)
   * @param {number} capacity most rows kept; older rows are dropped first
   * @throws {RangeError} when either argument is not a positive integer
   */
  constructor(columns, capacity = 1 << 20) {
    if (!Number.isInteger(columns) || columns < 1) throw new RangeError(`columns must be a positive int, got ${columns}`);
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive int, got ${capacity}`);
    this.columns = columns;
    this.capacity = capacity;
    /** Most rows the backing arrays hold: the capacity plus room to append before compacting. */
    this.maxRows = capacity + Math.max(MIN_SLACK_ROWS, Math.ceil(capacity / 4));
    this._start = 0;
    this._end = 0;
    /** Rows ever dropped from the front because the buffer was full. */
    this.dropped = 0;
    this._cols = Array.from({ length: columns }, () => NONE);
  }

  /** Number of rows held. */
  get length() {
    return this._end - this._start;
  }

  /**
   * Append rows. Each argument is one column (array-like), all of the same length.
   * When more rows arrive than fit, the oldest are dropped.
   *
   * @param {...ArrayLike<number>} cols
   * @throws {RangeError} on a wrong column count or columns of different lengths
   */
  push(...cols) {
    if (cols.length !== this.columns) throw new RangeError(`push needs ${this.columns} columns, got ${cols.length}`);
    const n = cols[0].length;
    for (const c of cols) {
      if (c.length !== n) throw new RangeError(`columns differ in length: ${n} and ${c.length}`);
    }
    let from = 0;
    if (n > this.capacity) {
      // Only the newest `capacity` rows can survive; skip the rest up front.
      from = n - this.capacity;
      this.dropped += this.length + from;
      this._start = this._end = 0;
    }
    const count = n - from;
    this._reserve(count);
    for (let c = 0; c < this.columns; c++) {
      const src = cols[c];
      const dst = this._cols[c];
      if (from === 0 && ArrayBuffer.isView(src)) dst.set(src, this._end);
      else for (let i = 0; i < count; i++) dst[this._end + i] = src[from + i];
    }
    this._end += count;
  }

  /**
   * Append one row.
   * @param {...number} row one value per column
   */
  pushRow(...row) {
    this._reserve(1);
    for (let c = 0; c < this.columns; c++) this._cols[c][this._end] = row[c];
    this._end += 1;
  }

  /**
   * A live view of one column, oldest row first. It is invalidated by the next push.
   * @param {number} c column index
   * @returns {Float64Array}
   */
  column(c) {
    return this._cols[c].subarray(this._start, this._end);
  }

  /** The last row's value in column `c`, or undefined when empty. */
  last(c) {
    return this._end > this._start ? this._cols[c][this._end - 1] : undefined;
  }

  /** Drop every row (capacity and backing arrays are kept). */
  clear() {
    this._start = this._end = 0;
  }

  /** Make room for `count` more rows, dropping the oldest beyond the capacity. */
  _reserve(count) {
    const overflow = this.length + count - this.capacity;
    if (overflow > 0) {
      this._start += overflow;
      this.dropped += overflow;
    }
    const size = this._cols[0].length;
    if (this._end + count <= size) return;
    const live = this.length;
    const needed = live + count;
    if (size === 0) {
      this._alloc(Math.min(Math.max(needed, FIRST_ROWS), this.maxRows));
      return;
    }
    if (needed * 2 > size && size < this.maxRows) {
      let grown = size;
      while (grown < needed * 2 && grown < this.maxRows) grown *= 2;
      this._alloc(Math.min(grown, this.maxRows));
      return;
    }
    for (const col of this._cols) col.copyWithin(0, this._start, this._end);
    this._start = 0;
    this._end = live;
  }

  _alloc(size) {
    const live = this.length;
    // One backing array for every column (each a view of its own `size` rows): allocating an
    // ArrayBuffer costs about 10 µs in Chromium whatever its size, and a selection of 100 runs
    // creates 1,000 series at once.
    const backing = new Float64Array(size * this.columns);
    this._cols = Array.from({ length: this.columns }, (_, c) => {
      const col = backing.subarray(c * size, (c + 1) * size);
      if (live) col.set(this._cols[c].subarray(this._start, this._end));
      return col;
    });
    this._start = 0;
    this._end = live;
  }
}
