// Redraw scheduling: charts are marked dirty as data arrives and redrawn at most once per animation
// frame; a chart scrolled out of view (IntersectionObserver) stays dirty and is drawn when it comes
// back; a chart just outside the view (within NEAR_VIEW_PX) is drawn ahead of a scroll, but after
// the charts on screen; while paused nothing is drawn, and resuming draws whatever changed meanwhile.

/** How far outside the viewport (CSS px, above and below) a chart is drawn ahead of a scroll. */
export const NEAR_VIEW_PX = 200;

/** The most the drawing budget spaces two frames by (minInterval may ask for more). */
export const MAX_BUDGET_WAIT_MS = 1000;
/** One display frame at 60 Hz: what a frame after a drawing one waits anyway. */
export const FRAME_MS = 1000 / 60;

/**
 * Milliseconds until the rest of a batch is in, at the rate it came so far: `done` of `total`
 * items arrived in `elapsedMs` (Infinity before the first one, 0 once all are in).
 * @param {number} done
 * @param {number} total
 * @param {number} elapsedMs
 */
export function remainingMs(done, total, elapsedMs) {
  if (done >= total) return 0;
  if (done <= 0) return Infinity;
  return (Math.max(0, elapsedMs) * (total - done)) / done;
}

/**
 * Milliseconds to put a paced redraw off by while the snapshots of a large selection load (0: draw
 * now). The first redraw waits for the whole load until `firstMs` after the selection began (its
 * partial lines would be stroked again by the final draw a moment later); from then on, and after
 * any redraw, one due when the rest is expected within `waitMs` (at the rate so far) waits for
 * it, but never more than `redrawMs` past when it was due.
 * @param {{elapsedMs: number, sinceDrawMs: number, done: number, total: number, drawn: boolean}} load
 *   ms since the selection began and since the last drawing frame (or the selection's start),
 *   snapshots in and asked for, and whether a drawing frame drew since the selection began
 * @param {{firstMs: number, waitMs: number, redrawMs: number}} limits
 * @returns {number}
 */
export function loadingDelay({ elapsedMs, sinceDrawMs, done, total, drawn }, { firstMs, waitMs, redrawMs }) {
  if (!drawn && elapsedMs < firstMs) return firstMs - elapsedMs;
  const due = remainingMs(done, total, elapsedMs);
  const latest = drawn ? 2 * redrawMs - sinceDrawMs : firstMs + redrawMs - elapsedMs;
  return due <= waitMs ? Math.min(due, latest) : 0;
}

export class FrameScheduler {
  /**
   * @param {object} [opts]
   * @param {(cb: FrameRequestCallback) => number} [opts.requestFrame] injectable for tests
   * @param {number} [opts.minInterval] least milliseconds between two drawing frames
   * @param {() => number} [opts.now] clock, injectable for tests
   * @param {number} [opts.budget] most share of the time spent drawing (0 < budget <= 1): a frame
   *   that took `d` ms to draw is followed by at least `d / budget` ms without drawing
   * @param {(sinceDrawMs: number) => number} [opts.defer] asked before a paced frame draws, with
   *   the milliseconds since the last drawing frame (or `restart`): milliseconds to put it off by
   *   (0 or less: draw now); `flush` and `drawAll` never wait for it
   * @param {() => boolean} [opts.holdNear] asked in a frame that draws charts on screen: while
   *   true, the charts only near the view wait for as many frames as it stays true (a batch of
   *   changes that ends in a frame of its own), not one; `drawAll` never waits for it
   */
  constructor({
    requestFrame = (cb) => requestAnimationFrame(cb),
    minInterval = 0,
    now = () => performance.now(),
    budget = 1,
    defer = () => 0,
    holdNear = () => false,
  } = {}) {
    if (!(budget > 0 && budget <= 1)) throw new RangeError(`budget must be in (0, 1], got ${budget}`);
    this._requestFrame = requestFrame;
    this.minInterval = minInterval;
    this.budget = budget;
    this._now = now;
    this.defer = defer;
    this.holdNear = holdNear;
    this._lastDraw = -Infinity;
    this._holdUntil = -Infinity;
    /**
     * Recent drawing time per frame (ms, smoothed): what the budget spaces frames by. With a
     * budget it counts until the next frame began, not only the drawing calls: the canvases'
     * rasterizing and the commit to the compositor come after them, on the same thread (50 live
     * runs on six charts: 10 ms of calls, then a commit of 40-90 ms on a software-rendered page).
     */
    this.drawCost = 0;
    this._dirty = new Set();
    this._pending = false;
    this._settling = false;
    this._items = new Map();
    this.paused = false;
    /**
     * Frames that drew at least one item, items drawn, ms in the drawing calls and (with a
     * budget) ms after them until the next frame began, for tests, benchmarks and the status line.
     */
    this.stats = { frames: 0, draws: 0, drawMs: 0, settleMs: 0 };
    this._costs = 0;
    /** Calls waiting for the next frame that draws (afterDraw). */
    this._afterDraw = [];
    const observing = typeof IntersectionObserver !== "undefined";
    this._observer = observing ? new IntersectionObserver((entries) => this._observed(entries, "visible"), { rootMargin: `${NEAR_VIEW_PX}px 0px` }) : null;
    // Which items are on screen itself (no margin): a frame draws those first (see _frame).
    this._screen = observing ? new IntersectionObserver((entries) => this._observed(entries, "onScreen")) : null;
  }

  /**
   * Track an item `{element, render()}`; it is drawn once the observer says it is in view (at once
   * where there is no IntersectionObserver).
   * @param {{element: Element, render: () => void, visible?: boolean}} item
   */
  observe(item) {
    // Not drawn until the observer's first report (it always reports a new target, within a
    // frame) says it is in view: a page that opens with ten charts and the sweep panels below the
    // fold draws only what is on screen, and reads no widths before the layout has them.
    item.visible = this._observer === null;
    item.onScreen = this._screen === null;
    item.waited = false;
    this._items.set(item.element, item);
    this._observer?.observe(item.element);
    this._screen?.observe(item.element);
    this.mark(item);
  }

  /** Stop tracking an item. */
  unobserve(item) {
    this._items.delete(item.element);
    this._dirty.delete(item);
    this._observer?.unobserve(item.element);
    this._screen?.unobserve(item.element);
  }

  /** Ask for `item` to be redrawn on the next frame it is visible and not paused. */
  mark(item) {
    this._dirty.add(item);
    this._schedule();
  }

  /**
   * Call `fn` once: right after the first frame that draws at least one item and after which
   * `until()` holds (within that frame's callbacks: work it starts in a task of its own comes after
   * the frame's paint and commit), or after `timeoutMs` if none has by then.
   * @param {() => void} fn
   * @param {number} [timeoutMs]
   * @param {() => boolean} [until] e.g. "a chart of these was drawn"
   */
  afterDraw(fn, timeoutMs = Infinity, until = () => true) {
    let called = false;
    const once = () => {
      if (called) return;
      called = true;
      clearTimeout(timer);
      fn();
    };
    const timer = Number.isFinite(timeoutMs) ? setTimeout(once, timeoutMs) : 0;
    this._afterDraw.push({ once, until });
  }

  /** Freeze (true) or unfreeze (false) drawing. */
  setPaused(paused) {
    this.paused = paused;
    if (!paused) this._schedule();
  }

  /**
   * Draw every dirty item now, visible or not (for full-page screenshots and tests; the page itself
   * never needs it). Paused still wins.
   */
  drawAll() {
    if (!this.paused) this._frame(true);
  }

  /**
   * Count the interval from now: the next frame draws `interval()` from now at the earliest (a
   * batch of changes begins, and its first change alone is not worth a frame).
   */
  restart() {
    this._lastDraw = this._now();
    // A frame already asked for (by a change just before) waits too.
    this._holdUntil = this._lastDraw + this.interval();
  }

  /** Draw the visible dirty items now, whatever minInterval says (after a batch of changes ends). */
  flush() {
    if (!this.paused) this._frame();
  }

  _schedule() {
    // While a drawing frame's cost is not known yet, the next one cannot be spaced from it.
    if (this._pending || this._settling || this.paused || this._dirty.size === 0) return;
    this._pending = true;
    const wait = this._lastDraw + this.interval() - this._now();
    const ask = () => this._requestFrame(() => this._frame(false, true));
    if (wait > 0) setTimeout(ask, wait);
    else ask();
  }

  /**
   * Least milliseconds from one drawing frame to the next: `minInterval`, or longer while drawing
   * takes more than the budget's share of the time (50 runs live on 8 charts: each frame strokes
   * 400 lines, and on a busy machine the page would otherwise spend every frame drawing).
   */
  interval() {
    // At most a second for the budget: one slow frame (the first draw builds every chart) must
    // not hold the next one back for long.
    const spaced = this.budget < 1 ? Math.min(MAX_BUDGET_WAIT_MS, this.drawCost / this.budget) : 0;
    return Math.max(this.minInterval, spaced);
  }

  _frame(all = false, timed = false) {
    this._pending = false;
    if (this.paused) return;
    if (timed && this._now() < this._holdUntil) {
      this._schedule(); // asked for before a restart: wait until its interval is over
      return;
    }
    const later = timed ? this.defer(this._now() - this._lastDraw) : 0;
    if (later > 0 && this._dirty.size) {
      // Put off (a partial redraw while the rest of a batch is due soon): asked again then.
      this._pending = true;
      setTimeout(() => this._requestFrame(() => this._frame(false, true)), later);
      return;
    }
    const t0 = this._now();
    let drew = 0;
    // A frame that has charts on screen to draw leaves those only near the view for the next
    // drawing frame (at most one frame late): the charts in view are not held back by charts
    // nobody sees yet (a selection of 100 runs: 5 charts on screen, 2 more within the margin, each
    // stroking 100 lines in every redraw while the runs load).
    const dirty = [...this._dirty];
    const screenFirst = !all && dirty.some((item) => item.visible && item.onScreen);
    // While holdNear says so (the snapshots of many runs loading), they wait without counting
    // the frame, so the frame the batch ends in draws the charts on screen alone too.
    const hold = screenFirst && this.holdNear();
    let waiting = false;
    for (const item of dirty) {
      if (!item.visible && !all) continue;
      if (screenFirst && !item.onScreen && !item.waited) {
        item.waited = !hold;
        waiting = true;
        continue;
      }
      item.waited = false;
      this._dirty.delete(item);
      try {
        item.render();
      } catch (err) {
        console.error("vdl-stream: drawing failed:", err);
      }
      drew++;
    }
    if (drew) {
      this._lastDraw = this._now();
      const cost = this._lastDraw - t0;
      this.stats.frames++;
      this.stats.draws += drew;
      this.stats.drawMs += cost;
      if (this.budget < 1) {
        // What the frame cost is known when the next one begins (see drawCost).
        this._settling = true;
        this._requestFrame(() => this._settled(t0, cost));
      } else {
        this._addCost(cost);
      }
      const waiting = this._afterDraw;
      this._afterDraw = [];
      for (const after of waiting) {
        if (after.until()) after.once();
        else this._afterDraw.push(after);
      }
    }
    if (waiting) this._schedule();
  }

  // The frame after a drawing one began: the drawing frame's cost is the time since it began, less
  // the display frame the next one waits for anyway (at least the drawing calls' own time).
  _settled(t0, cost) {
    this._settling = false;
    const frame = this._now() - t0 - FRAME_MS;
    this.stats.settleMs += Math.max(0, frame - cost);
    this._addCost(Math.max(cost, frame));
    this._schedule();
  }

  _addCost(cost) {
    // Smoothed, so that one slow frame (a garbage collection) does not stall the next ones.
    this.drawCost = this._costs === 0 ? cost : 0.7 * this.drawCost + 0.3 * cost;
    this._costs++;
  }

  // An observer's entries set each item's flag `key` ("visible": near the view; "onScreen": on
  // it); a frame is asked for when an item waiting to be drawn came into range (near the view,
  // which an item on screen is too once the other observer said so).
  _observed(entries, key) {
    let woke = false;
    for (const entry of entries) {
      const item = this._items.get(entry.target);
      if (!item) continue;
      item[key] = entry.isIntersecting;
      if (item[key] && item.visible && this._dirty.has(item)) woke = true;
    }
    if (woke) this._schedule();
  }
}
