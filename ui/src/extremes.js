// Per-block extremes of one ring-buffer column, kept up to date as rows are appended, so that the
// lowest and highest value of any row range is found by reading a few block summaries instead of
// every row.
//
// Rows are numbered from the last clear (row r is the r-th value appended), so a block's summary
// stays valid while the ring drops rows from its front or moves them in its backing array: block k
// of size S covers rows [k*S, (k+1)*S) whatever their place in memory. Blocks come in levels of
// 16, 256, 4,096 and 65,536 rows (up to the capacity); each level keeps, in a circular table with
// a slot for every block the ring can hold, the offset in the block of its first lowest and first
// highest finite value (-1: none finite). A range query reads whole blocks of the coarsest level
// that fits, finer blocks towards its ends and single rows at the very ends: at most 15 rows and
// 15 blocks of each level per end.

const BASE_SHIFT = 4; // the finest blocks have 16 rows
const LEVEL_SHIFT = 4; // each level's blocks are 16 times larger
const INITIAL_SLOTS = 64; // table rows per level to begin with

export class BlockExtremes {
  /**
   * @param {number} capacity most rows the summarised ring buffer holds (its `capacity`)
   * @throws {RangeError} when capacity is not a positive integer
   */
  constructor(capacity) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive int, got ${capacity}`);
    this.capacity = capacity;
    /** Rows appended since the last clear. */
    this.total = 0;
    this._levels = [];
    for (let shift = BASE_SHIFT; 2 ** shift <= capacity; shift += LEVEL_SHIFT) {
      const size = 2 ** shift;
      // Enough slots for every block that rows still held can be in (a partly dropped one included).
      const slots = Math.ceil(capacity / size) + 1;
      // The tables start small and grow with the rows (a slot is k % slots, so before the ring
      // first wraps every slot in use is below the rows appended / size): 1,000 series of a
      // 200-point snapshot need 13 slots each, not the 140 KB a full 262,144-row table takes.
      this._levels.push({ size, slots, minAt: null, maxAt: null, minVal: 0, maxVal: 0 });
    }
    // Every level's first tables share one array: an ArrayBuffer costs about 10 µs to allocate
    // in Chromium whatever its size, and a selection of 100 runs creates 1,000 series at once.
    const rows = this._levels.map((level) => Math.min(level.slots, INITIAL_SLOTS));
    const shared = new Int32Array(2 * rows.reduce((sum, n) => sum + n, 0));
    let at = 0;
    this._levels.forEach((level, l) => {
      level.minAt = shared.subarray(at, at + rows[l]);
      level.maxAt = shared.subarray(at + rows[l], at + 2 * rows[l]);
      at += 2 * rows[l];
    });
  }

  // Make room in `level`'s tables for `slot` (doubling, up to its slots).
  _grow(level, slot) {
    let rows = level.minAt.length;
    while (rows <= slot) rows *= 2;
    rows = Math.min(rows, level.slots);
    const both = new Int32Array(2 * rows);
    const minAt = both.subarray(0, rows);
    const maxAt = both.subarray(rows);
    minAt.set(level.minAt);
    maxAt.set(level.maxAt);
    level.minAt = minAt;
    level.maxAt = maxAt;
  }

  /** Rows held, as in the ring buffer: the newest `capacity` of those appended. */
  get length() {
    return Math.min(this.total, this.capacity);
  }

  /**
   * Summarise rows appended to the ring buffer (call with the same values, in the same order).
   * @param {ArrayLike<number>} values
   */
  append(values) {
    const n = values.length;
    // Level by level, block by block: the block, slot and offset are found once per block, not
    // per value and level (a selection of 100 runs appends 1,000 snapshots of 200 values at once).
    for (const level of this._levels) {
      const size = level.size;
      let j = 0;
      while (j < n) {
        const r = this.total + j;
        const block = Math.floor(r / size);
        const first = r - block * size;
        const slot = block % level.slots;
        if (slot >= level.minAt.length) this._grow(level, slot);
        const end = Math.min(n, j + size - first);
        let lo = first === 0 ? -1 : level.minAt[slot];
        let hi = first === 0 ? -1 : level.maxAt[slot];
        let loVal = level.minVal;
        let hiVal = level.maxVal;
        for (let k = j, off = first; k < end; k++, off++) {
          const y = values[k];
          if (!Number.isFinite(y)) continue;
          // Strict comparisons: the first of equal extremes is kept, as the full scan does.
          if (lo < 0 || y < loVal) {
            lo = off;
            loVal = y;
          }
          if (hi < 0 || y > hiVal) {
            hi = off;
            hiVal = y;
          }
        }
        level.minAt[slot] = lo;
        level.maxAt[slot] = hi;
        level.minVal = loVal;
        level.maxVal = hiVal;
        j = end;
      }
    }
    this.total += n;
  }

  /** Forget every row (with the ring buffer's clear). */
  clear() {
    this.total = 0;
  }

  /**
   * Find the first lowest and first highest finite value among rows [from, to) of `ys`.
   *
   * @param {ArrayLike<number>} ys the summarised column as the ring buffer shows it now (oldest
   *   row first); its length must equal `this.length`
   * @param {number} from first row, an index into ys
   * @param {number} to end of the range (exclusive)
   * @param {Int32Array|number[]} out receives the index of the lowest in out[0] and of the highest in
   *   out[1], -1 where the range holds no finite value
   */
  scan(ys, from, to, out) {
    const origin = this.total - this.length;
    this._min = this._max = -1;
    this._minVal = this._maxVal = NaN;
    this._ys = ys;
    this._origin = origin;
    this._walk(origin + from, origin + to, this._levels.length - 1);
    this._ys = null;
    out[0] = this._min < 0 ? -1 : this._min - origin;
    out[1] = this._max < 0 ? -1 : this._max - origin;
  }

  // Fold rows [a, b) (numbered since the clear) into the running extremes, in row order: the
  // whole blocks of the coarsest level that has any inside, and the ends recursively.
  _walk(a, b, l) {
    const ys = this._ys;
    const origin = this._origin;
    for (; l >= 0; l--) {
      const { size } = this._levels[l];
      const first = Math.ceil(a / size);
      const last = Math.floor(b / size);
      if (first >= last) continue;
      this._walk(a, first * size, l - 1);
      const { slots, minAt, maxAt } = this._levels[l];
      for (let k = first; k < last; k++) {
        const slot = k % slots;
        if (minAt[slot] < 0) continue;
        const lo = k * size + minAt[slot];
        const hi = k * size + maxAt[slot];
        this._take(lo, ys[lo - origin], hi, ys[hi - origin]);
      }
      this._walk(last * size, b, l - 1);
      return;
    }
    for (let r = a; r < b; r++) {
      const y = ys[r - origin];
      if (Number.isFinite(y)) this._take(r, y, r, y);
    }
  }

  // Offer a candidate lowest (row lo, value yLo) and highest (row hi, value yHi) that come after
  // every earlier one: strict comparisons keep the first of equal values.
  _take(lo, yLo, hi, yHi) {
    if (this._min < 0 || yLo < this._minVal) {
      this._min = lo;
      this._minVal = yLo;
    }
    if (this._max < 0 || yHi > this._maxVal) {
      this._max = hi;
      this._maxVal = yHi;
    }
  }
}
