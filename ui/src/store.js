// Everything the page has received, by run: scalar series in ring buffers, and bounded lists of the
// other event kinds. Applies `snapshot` (replace a run), `data` (append) and `reset` (fresh
// snapshots follow) frames, keeps track of which snapshots are still on their way (the loading
// state), and tells its listeners what changed. No DOM.
import { isAscending } from "./downsample.js";
import { BlockExtremes } from "./extremes.js";
import { RingBuffer } from "./ringbuffer.js";
import { DEFAULT_SMOOTHING, Ema } from "./smoothing.js";

// Columns of a scalar series' ring buffer.
export const STEP = 0;
export const WALL = 1;
export const VALUE = 2;
export const SMOOTHED = 3;

/**
 * Most points kept per scalar series; older points are dropped first. 262,144 points of four
 * columns take 8 MiB (10 MiB with the ring's slack). Snapshots bring history downsampled anyway.
 */
export const SERIES_CAPACITY = 1 << 18;
/** Most events kept per (run, tag) for histograms, text and curves. */
export const EVENTS_PER_TAG = 500;
/** Most images or audio clips kept per (run, tag): they can be large. */
export const MEDIA_PER_TAG = 100;
/**
 * Telemetry travels as scalars under this reserved tag namespace (docs/protocol.md, "Telemetry
 * scalars"): `@telemetry/<host>/rank<r>/<field>`. Its series are kept apart from the training tags.
 */
export const TELEMETRY_PREFIX = "@telemetry/";
/**
 * Most samples kept per telemetry field and source: 4.5 hours at the writer's default 1 s
 * interval (8 GPUs with every NVML field is about 60 MiB).
 */
export const TELEMETRY_CAPACITY = 1 << 14;

/**
 * Split a telemetry tag into its source (`host#rank`) and field; null for any other tag.
 * @param {string} tag
 */
export function parseTelemetryTag(tag) {
  if (!tag.startsWith(TELEMETRY_PREFIX)) return null;
  const rest = tag.slice(TELEMETRY_PREFIX.length);
  const a = rest.indexOf("/");
  const b = a < 0 ? -1 : rest.indexOf("/", a + 1);
  if (b < 0 || !rest.startsWith("rank", a + 1) || b === rest.length - 1) return null;
  const rank = Number(rest.slice(a + 5, b));
  if (!Number.isInteger(rank)) return null;
  return { source: `${rest.slice(0, a)}#${rank}`, field: rest.slice(b + 1) };
}

/** One scalar tag of one run. */
export class Series {
  constructor(run, tag, smoothing, capacity = SERIES_CAPACITY) {
    this.run = run;
    this.tag = tag;
    this.buffer = new RingBuffer(4, capacity);
    /** Block summaries of the raw values, so that drawing need not scan every point. */
    this.extremes = new BlockExtremes(capacity);
    this.ema = new Ema(smoothing);
    /** Whether steps (walls) never decrease: a restarted run breaks this until the next snapshot. */
    this.stepsAscending = true;
    this.wallsAscending = true;
    /** Wall time of the first point since the last snapshot: the origin of relative time. */
    this.firstWall = NaN;
    /** Last step of the last snapshot's points, and whether the server downsampled them. */
    this.historyEnd = -Infinity;
    this.historyDownsampled = false;
    /** Bumped when the series is cleared (a snapshot replaces it). */
    this.generation = 0;
    /** Bumped on every change, so a chart can tell whether it is stale. */
    this.version = 0;
  }

  /** Append decoded columns, smoothing the new values incrementally. */
  append(steps, walls, values) {
    if (steps.length === 0) return;
    if (this.buffer.length === 0) this.firstWall = walls[0];
    // Kept up to date here so that drawing need not scan the whole series for order. A NaN x
    // counts as out of order (drawing relies on ascending x being sorted).
    this.stepsAscending &&= !(steps[0] < this.buffer.last(STEP)) && !Number.isNaN(steps[0]) && isAscending(steps);
    this.wallsAscending &&= !(walls[0] < this.buffer.last(WALL)) && !Number.isNaN(walls[0]) && isAscending(walls);
    const n = values.length;
    if (n <= this.buffer.capacity) {
      // The smoothed values are written in place, after the raw ones are copied into their slot:
      // no array per append (50 live runs of 10 tags append 500 times a second).
      this.buffer.push(steps, walls, values, values);
      const smoothed = this.buffer.column(SMOOTHED);
      this.ema.fill(values, smoothed.subarray(smoothed.length - n));
    } else {
      const smoothed = new Float64Array(n);
      this.ema.fill(values, smoothed);
      this.buffer.push(steps, walls, values, smoothed);
    }
    this.extremes.append(values);
    this.version++;
  }

  /** Drop every point (before a snapshot refills the series). */
  clear() {
    this.buffer.clear();
    this.extremes.clear();
    this.ema.reset();
    this.firstWall = NaN;
    this.historyEnd = -Infinity;
    this.historyDownsampled = false;
    this.generation++;
    this.stepsAscending = true;
    this.wallsAscending = true;
    this.version++;
  }

  /** Recompute the smoothed column with another weight. */
  resmooth(weight) {
    this.ema = new Ema(weight);
    this.ema.fill(this.buffer.column(VALUE), this.buffer.column(SMOOTHED));
    this.version++;
  }

  get length() {
    return this.buffer.length;
  }

  column(c) {
    return this.buffer.column(c);
  }
}

/** A telemetry field of one source (run, host, rank): a scalar series over wall time. */
export class Telemetry extends Series {
  constructor(run, tag, source, field) {
    super(run, tag, 0, TELEMETRY_CAPACITY);
    this.source = source;
    this.field = field;
  }
}

/** Per-run state. */
class Run {
  constructor(name) {
    this.name = name;
    /** @type {Map<string, Series>} */
    this.scalars = new Map();
    /** @type {Map<string, object[]>} tag -> events sorted by step, for each kind */
    this.histograms = new Map();
    this.images = new Map();
    this.texts = new Map();
    this.prCurves = new Map();
    this.rocCurves = new Map();
    this.audio = new Map();
    /** Embeddings: descriptions only (shape, header, sizes); views/embeddings.js fetches data. */
    this.embeddings = new Map();
    /** The latest `hparams` event of the run, or null. */
    this.hparams = null;
    /** @type {Map<string, Telemetry>} `@telemetry/...` tag -> samples (kept out of `scalars`) */
    this.telemetry = new Map();
    this.seq = 0;
  }
}

export class Store {
  /**
   * @param {object} [opts]
   * @param {number} [opts.maxPoints] the `max_points` the page subscribes with: a snapshot series
   *   with more than half as many points is taken to have been downsampled by the server
   */
  constructor({ maxPoints = 2000 } = {}) {
    this.maxPoints = maxPoints;
    /** @type {Map<string, Run>} */
    this.runs = new Map();
    /** Run names announced by the server (may include runs with no data yet). */
    this.announced = [];
    this.smoothing = DEFAULT_SMOOTHING;
    this._listeners = new Set();
    this._sync = { phase: "connecting", expected: new Set(), arrived: new Set() };
    /** The runs the page subscribed to, or null (every run): what a `gap` re-sends. */
    this.subscribed = null;
    this._wanted = null;
    /**
     * Runs whose whole snapshot arrived on this connection (and nothing was lost since), with
     * the `max_points` it was asked with: what a `keep` subscription does not wait for.
     * @type {Map<string, number>}
     */
    this.held = new Map();
  }

  /**
   * The page (re)subscribed to `runs` (null: every run): wait for their snapshots, and empty the
   * runs it no longer follows so that their points do not linger in memory. With `keep` (the
   * subscribe asked the server to keep what the page holds) only the runs not held with at
   * least `maxPoints` points per tag are waited for; the others stay as they are.
   * @param {string[]|null} runs
   * @param {{keep?: boolean}} [opts]
   */
  subscribeTo(runs, { keep = false } = {}) {
    this.subscribed = runs;
    this._wanted = runs === null ? null : new Set(runs);
    if (runs !== null) {
      for (const name of this.runs.keys()) if (!this._wanted.has(name)) this._dropRun(name);
    }
    if (!keep) this.held.clear();
    for (const [name, points] of this.held) if (!this._wants(name) || points < this.maxPoints) this.held.delete(name);
    this.beginSync((runs ?? this.announced).filter((name) => !this.held.has(name)));
  }

  // Whether the subscription covers `run` (frames of a run it dropped may still be on the way).
  _wants(run) {
    return this._wanted === null || this._wanted.has(run);
  }

  /**
   * Start waiting for a fresh set of snapshots: the socket opened (`runs` null: the server's
   * first `runs` message lists them), or the page subscribed again after a `gap` or was told to
   * forget everything by a `reset` (`runs`: the runs whose snapshots follow).
   * @param {string[]|null} runs
   */
  beginSync(runs = null) {
    if (runs === null) this.held.clear(); // a new connection: the server holds nothing of ours
    this._sync = { phase: runs === null ? "connecting" : "loading", expected: new Set(runs ?? []), arrived: new Set() };
    this._syncChanged();
  }

  /**
   * Where the page stands in getting the server's data: `connecting` (no `runs` list yet),
   * `loading` (snapshots of `total` runs expected, `done` of them arrived) or `ready` (every
   * snapshot is in, so an empty page means the server has no data).
   * @returns {{phase: "connecting"|"loading"|"ready", total: number, done: number}}
   */
  syncState() {
    const { phase, expected, arrived } = this._sync;
    let done = 0;
    for (const name of expected) if (arrived.has(name)) done++;
    return { phase, total: expected.size, done };
  }

  /**
   * Listen for changes. The callback gets `{kind, run, tags}` where kind is `runs`, `scalars`,
   * `sync` (see syncState), `summaries` (with `summaries`: the frame's list) or an event kind (`histogram`, `image`, `audio`, `text`, `telemetry`,
   * `pr_curve`, `roc_curve`, `hparams`), and `tags` the tags touched.
   * @param {(change: object) => void} fn
   * @param {object} [opts]
   * @param {boolean} [opts.current] also call `fn`, in a microtask (after the constructor that
   *   subscribes has returned), with the changes that describe what the store holds already: for
   *   a view built after its data came (app.js loads the views below the first charts later)
   * @returns {() => void} unsubscribe
   */
  subscribe(fn, { current = false } = {}) {
    this._listeners.add(fn);
    if (current) queueMicrotask(() => this._listeners.has(fn) && this._current(fn));
    return () => this._listeners.delete(fn);
  }

  // Call `fn` with a change for each kind of data each run holds (see subscribe's `current`).
  _current(fn) {
    fn({ kind: "runs", run: null, tags: [] });
    for (const run of this.runs.values()) {
      const name = run.name;
      if (run.scalars.size) fn({ kind: "scalars", run: name, tags: [...run.scalars.keys()] });
      if (run.telemetry.size) fn({ kind: "telemetry", run: name, tags: [...new Set([...run.telemetry.values()].map((t) => t.source))] });
      for (const [kind, held] of [["histogram", run.histograms], ["image", run.images], ["audio", run.audio], ["text", run.texts], ["pr_curve", run.prCurves], ["roc_curve", run.rocCurves], ["embedding", run.embeddings]]) {
        if (held.size) fn({ kind, run: name, tags: [...held.keys()] });
      }
      if (run.hparams !== null) fn({ kind: "hparams", run: name, tags: [] });
    }
    fn({ kind: "sync", run: null, tags: [] });
  }

  /**
   * Apply one decoded server message (see decode.js). Unknown types are ignored.
   * @param {object} msg
   */
  apply(msg) {
    switch (msg.type) {
      case "runs":
        this.announced = (msg.runs ?? []).filter((r) => typeof r === "string");
        for (const name of this.announced) this._run(name);
        this._emit({ kind: "runs", run: null, tags: [] });
        // The first list after the socket opened names the runs whose snapshots follow.
        if (this._sync.phase === "connecting") this.beginSync(this.announced);
        break;
      case "snapshot":
        if (!this._wants(msg.run)) break;
        this._clearRun(msg.run);
        this._ingest(msg);
        // Split snapshots (docs/protocol.md): the scalars come first, the events next.
        if (msg.events_follow === true) this.held.delete(msg.run);
        else this.held.set(msg.run, this.maxPoints);
        if (this._sync.phase === "loading") {
          this._sync.arrived.add(msg.run);
          this._syncChanged();
        }
        break;
      case "snapshot_events":
        if (!this._wants(msg.run)) break;
        this._ingest(msg);
        this.held.set(msg.run, this.maxPoints);
        break;
      case "data":
        if (!this._wants(msg.run)) break;
        this._ingest(msg);
        // A server sends every snapshot of a subscription before any data.
        if (this._sync.phase === "loading") this._ready();
        break;
      case "reset":
        // The server's runs changed under the page (a replay's seek): fresh snapshots of
        // `runs` follow and replace each run; any other run is emptied now.
        for (const name of this.runs.keys()) if (!msg.runs.includes(name)) this._clearRun(name);
        this.held.clear();
        this.beginSync(msg.runs);
        break;
      case "gap":
        // The page subscribes again: a snapshot of every run of its subscription comes, or
        // only of the runs the gap names (they lost frames; the others go on).
        if (Array.isArray(msg.runs)) {
          for (const name of msg.runs) this.held.delete(name);
          this.beginSync(msg.runs.filter((name) => this._wants(name)));
          break;
        }
        this.held.clear();
        this.beginSync(this.subscribed ?? this.announced);
        break;
      case "summaries":
        // One small summary per run (docs/http-api.md "Run summaries"), for the runs table.
        if (Array.isArray(msg.runs)) this._emit({ kind: "summaries", run: null, tags: [], summaries: msg.runs });
        break;
      case "synced":
        // Every snapshot of the subscription was sent (a run the server could not read is left out).
        if (this._sync.phase === "loading") this._ready();
        break;
      default:
        break;
    }
  }

  /** The series of `run`/`tag`, or undefined. */
  series(run, tag) {
    return this.runs.get(run)?.scalars.get(tag);
  }

  /**
   * Empty a run: its points and events go, the run itself stays known (for a server that no
   * longer has them, such as a replay that went back to before they were logged).
   * @param {string} name
   */
  clearRun(name) {
    if (this.runs.has(name)) this._clearRun(name);
  }

  /** Every scalar tag of every run, sorted. */
  scalarTags() {
    const tags = new Set();
    for (const run of this.runs.values()) for (const tag of run.scalars.keys()) tags.add(tag);
    return [...tags].sort();
  }

  /** Run names, sorted. */
  runNames() {
    return [...this.runs.keys()].sort();
  }

  /**
   * Change the smoothing weight of every series.
   * @param {number} weight in [0, 1)
   */
  setSmoothing(weight) {
    this.smoothing = weight;
    for (const run of this.runs.values()) for (const s of run.scalars.values()) s.resmooth(weight);
    for (const run of this.runs.values()) this._emit({ kind: "scalars", run: run.name, tags: [...run.scalars.keys()] });
  }

  _run(name) {
    let run = this.runs.get(name);
    if (!run) {
      run = new Run(name);
      this.runs.set(name, run);
      this._emit({ kind: "runs", run: name, tags: [] });
    }
    return run;
  }

  _clearRun(name) {
    const run = this._run(name);
    for (const s of run.scalars.values()) s.clear();
    run.histograms.clear();
    run.images.clear();
    run.texts.clear();
    run.prCurves.clear();
    run.rocCurves.clear();
    run.audio.clear();
    run.embeddings.clear();
    run.hparams = null;
    for (const t of run.telemetry.values()) t.clear();
    this._emit({ kind: "scalars", run: name, tags: [...run.scalars.keys()] });
    for (const kind of ["histogram", "image", "audio", "text", "telemetry", "pr_curve", "roc_curve", "hparams", "embedding"]) this._emit({ kind, run: name, tags: [] });
  }

  // Forget a run's data entirely (its buffers go to the garbage collector); the run stays known.
  _dropRun(name) {
    const run = this.runs.get(name);
    if (!run) return;
    const tags = [...run.scalars.keys()];
    const had = tags.length + run.histograms.size + run.images.size + run.texts.size + run.prCurves.size + run.rocCurves.size + run.audio.size + run.telemetry.size + run.embeddings.size;
    if (had === 0 && run.hparams === null) return;
    const fresh = new Run(name);
    fresh.seq = run.seq;
    this.runs.set(name, fresh);
    this._emit({ kind: "scalars", run: name, tags });
    for (const kind of ["histogram", "image", "audio", "text", "telemetry", "pr_curve", "roc_curve", "hparams", "embedding"]) this._emit({ kind, run: name, tags: [] });
  }

  _ingest(msg) {
    const run = this._run(msg.run);
    if (typeof msg.seq === "number") run.seq = Math.max(run.seq, msg.seq);
    const touched = [];
    const sources = new Set();
    for (const { tag, steps, walls, values } of msg.scalars) {
      if (tag.startsWith(TELEMETRY_PREFIX)) {
        const t = this._telemetrySeries(run, tag);
        if (t) {
          t.append(steps, walls, values);
          sources.add(t.source);
        }
        continue;
      }
      let s = run.scalars.get(tag);
      if (!s) {
        s = new Series(run.name, tag, this.smoothing);
        run.scalars.set(tag, s);
      }
      s.append(steps, walls, values);
      if (msg.type === "snapshot" && steps.length) {
        s.historyEnd = steps[steps.length - 1];
        s.historyDownsampled = steps.length > this.maxPoints / 2;
      }
      touched.push(tag);
    }
    if (touched.length) this._emit({ kind: "scalars", run: run.name, tags: touched });
    if (sources.size) this._emit({ kind: "telemetry", run: run.name, tags: [...sources] });

    const byKind = new Map();
    for (const ev of msg.events) {
      const tag = this._event(run, ev);
      if (tag === undefined) continue;
      if (!byKind.has(ev.kind)) byKind.set(ev.kind, new Set());
      byKind.get(ev.kind).add(tag);
    }
    for (const [kind, tags] of byKind) this._emit({ kind, run: run.name, tags: [...tags] });
  }

  // Store one non-scalar event; returns its tag (or field) when it was kept.
  _event(run, ev) {
    switch (ev.kind) {
      case "histogram":
        return insertByStep(run.histograms, ev);
      case "image":
        return insertByStep(run.images, ev, MEDIA_PER_TAG);
      case "text":
        return insertByStep(run.texts, ev);
      case "audio":
        return insertByStep(run.audio, ev, MEDIA_PER_TAG);
      case "embedding":
        return insertByStep(run.embeddings, ev, MEDIA_PER_TAG);
      case "pr_curve":
        return insertByStep(run.prCurves, ev);
      case "roc_curve":
        return insertByStep(run.rocCurves, ev);
      case "hparams":
        if (ev.hparams === null || typeof ev.hparams !== "object") return undefined;
        run.hparams = ev;
        return "";
      case "telemetry": {
        // A run written before telemetry became scalars: each field is read as a point of its
        // `@telemetry/` series, the one conversion of the page.
        if (typeof ev.wall !== "number" || ev.fields == null || typeof ev.fields !== "object") return undefined;
        const host = String(ev.host ?? "?").replaceAll("/", "_") || "?";
        const prefix = `${TELEMETRY_PREFIX}${host}/rank${Number.isInteger(ev.rank) ? ev.rank : 0}/`;
        const step = new Float64Array([Math.trunc(ev.wall * 1000)]);
        const wall = new Float64Array([ev.wall]);
        let source;
        for (const [field, value] of Object.entries(ev.fields)) {
          if (typeof value !== "number") continue;
          const t = this._telemetrySeries(run, prefix + field);
          if (!t) continue;
          t.append(step, wall, new Float64Array([value]));
          source = t.source;
        }
        return source;
      }
      default:
        return undefined;
    }
  }

  // The telemetry series of `tag` in `run`, made on first use; null for a malformed tag.
  _telemetrySeries(run, tag) {
    let t = run.telemetry.get(tag);
    if (!t) {
      const parsed = parseTelemetryTag(tag);
      if (!parsed) return null;
      t = new Telemetry(run.name, tag, parsed.source, parsed.field);
      run.telemetry.set(tag, t);
    }
    return t;
  }

  _ready() {
    this._sync.phase = "ready";
    this._emit({ kind: "sync", run: null, tags: [] });
  }

  _syncChanged() {
    const { phase, expected, arrived } = this._sync;
    if (phase === "loading" && [...expected].every((name) => arrived.has(name))) this._ready();
    else this._emit({ kind: "sync", run: null, tags: [] });
  }

  _emit(change) {
    for (const fn of this._listeners) fn(change);
  }
}

// Keep events of one tag sorted by step (a late event is inserted in place; the same step replaces)
// and bounded to the newest `limit`.
function insertByStep(byTag, ev, limit = EVENTS_PER_TAG) {
  if (typeof ev.tag !== "string") return undefined;
  let list = byTag.get(ev.tag);
  if (!list) {
    list = [];
    byTag.set(ev.tag, list);
  }
  const step = typeof ev.step === "number" ? ev.step : list.length ? list[list.length - 1].step + 1 : 0;
  const item = { ...ev, step };
  let i = list.length;
  while (i > 0 && list[i - 1].step > step) i--;
  if (i > 0 && list[i - 1].step === step) list[i - 1] = item;
  else list.splice(i, 0, item);
  if (list.length > limit) list.splice(0, list.length - limit);
  return ev.tag;
}
