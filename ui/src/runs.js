// The runs the page knows and what the user chose about them: one summary per run (from the server's
// `summaries` frames, else derived from what the page holds), the selection, pins, hidden runs, the
// text search, the condition filter, parallel-coordinate brushes and grouping. It answers which
// runs the table lists (in what order) and which runs are drawn and subscribed to. No DOM.
import { compileCondition, ConditionError, evaluate } from "./condition.js";
import { STEP, VALUE, WALL } from "./store.js";
import { DEFAULT_SELECTED, SELECT_ALL_UP_TO } from "./runsdefault.js";

export { DEFAULT_SELECTED, pointsFor, SELECT_ALL_UP_TO } from "./runsdefault.js";

/**
 * Strings in natural order ("run-2" before "run-10"), through one collator: `localeCompare` with
 * options builds a collator per call, 60-180 ms of sorting 1,000 names (the runs table's first
 * render); this way 4-11 ms.
 */
export const NATURAL_ORDER = new Intl.Collator(undefined, { numeric: true });

/**
 * Compare two cells for sorting: numbers numerically, before strings; strings in natural order;
 * missing values last in either direction.
 */
export function compareCells(a, b) {
  const missingA = a === undefined || a === null;
  const missingB = b === undefined || b === null;
  if (missingA || missingB) return missingA === missingB ? 0 : missingA ? 1 : -1;
  const numA = typeof a === "number" || typeof a === "boolean";
  const numB = typeof b === "number" || typeof b === "boolean";
  if (numA && numB) return Number(a) - Number(b);
  if (numA !== numB) return numA ? -1 : 1;
  return NATURAL_ORDER.compare(String(a), String(b));
}

/** The bands a group's mean can be drawn with (RunsModel.band). */
export const BANDS = ["minmax", "std"];

/** Built-in columns of the runs table, in order. */
export const FIXED_COLUMNS = ["name", "status", "start", "duration", "last_step", "host"];

/**
 * Normalise a summary (docs/http-api.md "Run summaries"): unknown keys dropped, wrong types
 * replaced by null / {}.
 * @param {object} s
 * @returns {object|null} null when it has no str name
 */
export function normalizeSummary(s) {
  if (s === null || typeof s !== "object" || typeof s.name !== "string") return null;
  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const map = (v) => (v !== null && typeof v === "object" && !Array.isArray(v) ? v : {});
  return {
    name: s.name,
    status: typeof s.status === "string" ? s.status : null,
    start: num(s.start),
    last_wall: num(s.last_wall),
    last_step: num(s.last_step),
    host: typeof s.host === "string" ? s.host : null,
    hparams: map(s.hparams),
    last: map(s.last),
    min: map(s.min),
    max: map(s.max),
  };
}

/**
 * The key of the group a run falls in, or null for no grouping.
 * @param {string} name the run's name
 * @param {object} hparams the run's hparams
 * @param {{kind: "hparam", key: string}|{kind: "pattern", regex: RegExp}|null} spec grouping: by the
 *   value of one hparam (`key=value`), or by the part of the name the pattern matches (its first
 *   capture group when it has one); a run without that hparam, or whose name does not match, is in
 *   a group of its own name
 * @returns {string|null}
 */
export function groupKey(name, hparams, spec) {
  if (!spec) return null;
  if (spec.kind === "hparam") {
    const v = hparams?.[spec.key];
    return v === undefined ? name : `${spec.key}=${v}`;
  }
  const m = spec.regex.exec(name);
  if (!m) return name;
  return m[1] ?? m[0];
}

export class RunsModel {
  constructor() {
    /** @type {Map<string, object>} name -> normalised summary from the server */
    this.summaries = new Map();
    /** Every run name known (announced, summarised or holding data). */
    this.names = new Set();
    /** Selected runs, or null: every run (today's behaviour with few runs). */
    this.selected = null;
    this.pinned = new Set();
    this.hidden = new Set();
    this.showHidden = false;
    this.search = "";
    /** Parsed condition, its text, and the error of the last text that did not compile. */
    this.condition = null;
    this.conditionText = "";
    this.conditionError = "";
    /** Parallel-coordinate brushes: column id -> [lo, hi] (numeric axes) or Set of values. */
    this.brushes = new Map();
    /** Grouping spec (see groupKey) or null. */
    this.groupBy = null;
    /** The band drawn around each group's mean: "minmax" (across its runs) or "std" (mean ± 1 std). */
    this.band = "minmax";
    this.sort = { column: null, descending: false };
    /**
     * The runs listed first, after the pinned ones: those selected when the order was last
     * settled (settleOrder), so that the runs drawn on the charts are the table's first rows.
     * A click on one row's checkbox does not settle it (the row would jump from under the
     * pointer). null: no run leads (every run is selected).
     * @type {Set<string>|null}
     */
    this.front = null;
    /** Metric columns of the table: tags, each shown as last / min / max. */
    this.metrics = null;
    /** Fallback rows for runs with no server summary: (name) -> partial summary. */
    this.derive = () => null;
    /** Bumped on every change, so views can tell whether to redraw. */
    this.version = 0;
  }

  /** Add run names (from a `runs` frame or the store). Returns the names that were new. */
  addNames(names) {
    const added = [];
    for (const n of names) {
      if (typeof n !== "string" || this.names.has(n)) continue;
      this.names.add(n);
      added.push(n);
    }
    if (added.length) this.version++;
    return added;
  }

  /** Merge the summaries of a `summaries` frame. Returns the names that were new. */
  updateSummaries(list) {
    const added = [];
    for (const raw of Array.isArray(list) ? list : []) {
      const s = normalizeSummary(raw);
      if (!s) continue;
      if (!this.names.has(s.name)) {
        this.names.add(s.name);
        added.push(s.name);
      }
      this.summaries.set(s.name, s);
    }
    this.version++;
    return added;
  }

  /** The row of a run: its summary, else what the page derives from its data, else only the name. */
  row(name) {
    const s = this.summaries.get(name);
    // A server summary with hparams is complete; deriving one from the page's data scans it.
    if (s && Object.keys(s.hparams).length > 0) return s;
    const d = this.derive(name);
    if (!s && !d) return normalizeSummary({ name });
    if (!s) return normalizeSummary({ ...d, name });
    // A summary without hparams yet (the server has not seen them) takes the page's.
    if (d && Object.keys(s.hparams).length === 0 && d.hparams) return { ...s, hparams: d.hparams };
    return s;
  }

  /**
   * The value of a field for one run, as conditions and columns read it: `name`, `status`,
   * `start`, `last_wall`, `duration`, `last_step` (or `step`), `host`; an hparam by its name (or
   * `hparams.<name>`); a scalar tag's newest value by the tag (or `<tag>.last`), its extremes as
   * `<tag>.min` / `<tag>.max`.
   */
  field(row, name) {
    switch (name) {
      case "name":
      case "status":
      case "start":
      case "last_wall":
      case "last_step":
      case "host":
        return row[name] ?? undefined;
      case "step":
        return row.last_step ?? undefined;
      case "duration":
        return row.start !== null && row.last_wall !== null ? row.last_wall - row.start : undefined;
      default:
        break;
    }
    if (Object.hasOwn(row.hparams, name)) return row.hparams[name];
    if (name.startsWith("hparams.") && Object.hasOwn(row.hparams, name.slice(8))) return row.hparams[name.slice(8)];
    if (Object.hasOwn(row.last, name)) return row.last[name] ?? undefined;
    const dot = name.lastIndexOf(".");
    if (dot > 0) {
      const tag = name.slice(0, dot);
      const agg = name.slice(dot + 1);
      if ((agg === "last" || agg === "min" || agg === "max") && Object.hasOwn(row[agg], tag)) return row[agg][tag] ?? undefined;
    }
    return undefined;
  }

  /** Whether some run has field `name`. */
  knownField(name) {
    if (FIXED_COLUMNS.includes(name) || name === "step" || name === "last_wall") return true;
    for (const n of this.names) if (this.field(this.row(n), name) !== undefined) return true;
    return false;
  }

  /**
   * Set the condition filter. An empty text clears it.
   * @returns {string} "" or the error message (the previous condition stays in force)
   */
  setCondition(text) {
    try {
      this.condition = compileCondition(text, (name) => this.knownField(name));
      this.conditionText = text;
      this.conditionError = "";
      this.conditionErrorInfo = null;
    } catch (err) {
      if (!(err instanceof ConditionError)) throw err;
      this.conditionError = err.message;
      /** The error's i18n key and parameters, to show it again in another language. */
      this.conditionErrorInfo = { key: err.key, params: err.params };
    }
    this.version++;
    return this.conditionError;
  }

  /** Set the text search (case-insensitive, on the name, host, status and hparam values). */
  setSearch(text) {
    this.search = String(text).trim().toLowerCase();
    this.version++;
  }

  /**
   * Whether a run passes the search, the condition and (unless `brushes` is false) the brushes;
   * pinned runs always do.
   */
  passes(name, brushes = true) {
    if (this.pinned.has(name)) return true;
    const row = this.row(name);
    if (this.search) {
      const hay = [name, row.host ?? "", row.status ?? "", ...Object.values(row.hparams).map(String)].join("\u0000").toLowerCase();
      if (!hay.includes(this.search)) return false;
    }
    if (this.condition && !evaluate(this.condition, (f) => this.field(row, f))) return false;
    if (!brushes) return true;
    for (const [column, range] of this.brushes) {
      const v = this.columnValue(row, column);
      if (range instanceof Set) {
        if (!range.has(v === undefined ? "" : String(v))) return false;
      } else if (!(typeof v === "number" && v >= range[0] && v <= range[1])) return false;
    }
    return true;
  }

  /** The value of a table column id (`name`, `h:<hparam>`, `m:<tag>:last|min|max`, fixed ids). */
  columnValue(row, column) {
    if (column.startsWith("h:")) return row.hparams[column.slice(2)];
    if (column.startsWith("m:")) {
      const i = column.lastIndexOf(":");
      const v = row[column.slice(i + 1)]?.[column.slice(2, i)];
      return v === null ? undefined : v;
    }
    return this.field(row, column);
  }

  isSelected(name) {
    return this.selected === null || this.selected.has(name);
  }

  /** Whether a run is drawn (and subscribed to): selected, not hidden, passing the filters. */
  isDrawn(name) {
    return this.isSelected(name) && !this.hidden.has(name) && this.passes(name);
  }

  /** Every run drawn, sorted by name. */
  drawn() {
    return [...this.names].filter((n) => this.isDrawn(n)).sort();
  }

  /**
   * What to subscribe to: null (every run, also runs that appear later) while every run is
   * selected and nothing narrows them, else the list of drawn runs.
   */
  subscription() {
    const narrowed = this.hidden.size > 0 || this.search || this.condition || this.brushes.size > 0;
    return this.selected === null && !narrowed ? null : this.drawn();
  }

  /**
   * Choose the default selection for the runs known now: every run when there are few, else the
   * DEFAULT_SELECTED most recently active (newest `last_wall`; runs without one last, by name).
   */
  selectDefault() {
    if (this.names.size <= SELECT_ALL_UP_TO) {
      this.selected = null;
    } else {
      const wall = (n) => this.row(n).last_wall ?? -Infinity;
      const recent = [...this.names].sort((a, b) => wall(b) - wall(a) || (a < b ? -1 : a > b ? 1 : 0));
      this.selected = new Set(recent.slice(0, DEFAULT_SELECTED));
    }
    this.settleOrder();
  }

  /** List the runs selected now first (after the pinned ones), from now until the next settle. */
  settleOrder() {
    this.front = this.selected === null ? null : new Set(this.selected);
    this.version++;
  }

  /** Whether a run is among the table's first rows: pinned, or selected when the order settled. */
  leads(name) {
    return this.pinned.has(name) || (this.front !== null && this.front.has(name));
  }

  /** A run that appeared later is selected while fewer than SELECT_ALL_UP_TO runs are. */
  selectNew(names) {
    if (this.selected === null) return;
    for (const n of names) if (this.selected.size < SELECT_ALL_UP_TO) this.selected.add(n);
    this.settleOrder();
  }

  /**
   * Select or unselect runs.
   * @param {string[]} names
   * @param {boolean} on
   * @param {{settle?: boolean}} [opts] settle: list the selection first from now on (false for a
   *   click on one row, which stays where it is)
   */
  setSelected(names, on, { settle = true } = {}) {
    if (this.selected === null) {
      if (on) return;
      this.selected = new Set(this.names);
    }
    for (const n of names) {
      if (on) this.selected.add(n);
      else this.selected.delete(n);
    }
    if (settle) this.settleOrder();
    else this.version++;
  }

  togglePinned(name) {
    if (this.pinned.has(name)) this.pinned.delete(name);
    else this.pinned.add(name);
    this.version++;
  }

  toggleHidden(name) {
    if (this.hidden.has(name)) this.hidden.delete(name);
    else this.hidden.add(name);
    this.version++;
  }

  /**
   * What of the table's state is worth keeping across page reloads (see remember.js): the
   * selection (null: every run), pins, hidden runs, grouping and the groups' band. Plain JSON.
   * @returns {{selected: string[]|null, pinned: string[], hidden: string[], groupBy: object|null, band: string}}
   */
  saved() {
    const g = this.groupBy;
    return {
      selected: this.selected === null ? null : [...this.selected].sort(),
      pinned: [...this.pinned].sort(),
      hidden: [...this.hidden].sort(),
      groupBy: !g ? null : g.kind === "hparam" ? { kind: "hparam", key: g.key } : { kind: "pattern", source: g.regex.source },
      band: this.band,
    };
  }

  /**
   * Take back what `saved()` gave (from an earlier visit, so possibly from another version or
   * hand-edited: anything malformed is left as it is). Pins, hidden runs, grouping and band always;
   * the selection only when it names a run known now (a log directory that changed since falls
   * back to the default selection), and "every run" only while there are at most
   * SELECT_ALL_UP_TO runs.
   * @param {unknown} saved
   * @returns {boolean} whether the selection was restored
   */
  restore(saved) {
    if (saved === null || typeof saved !== "object") return false;
    const names = (v) => (Array.isArray(v) ? v.filter((n) => typeof n === "string") : null);
    const pinned = names(saved.pinned);
    if (pinned) this.pinned = new Set(pinned);
    const hidden = names(saved.hidden);
    if (hidden) this.hidden = new Set(hidden);
    const g = saved.groupBy;
    if (g && g.kind === "hparam" && typeof g.key === "string") this.groupBy = { kind: "hparam", key: g.key };
    else if (g && g.kind === "pattern" && typeof g.source === "string") {
      try {
        this.groupBy = { kind: "pattern", regex: new RegExp(g.source, "u") };
      } catch {
        // A pattern this browser does not take: no grouping.
      }
    }
    if (BANDS.includes(saved.band)) this.band = saved.band;
    this.version++;
    if (saved.selected === null) {
      // "Every run" of a few runs is not every run of a directory that has grown to hundreds.
      if (this.names.size > SELECT_ALL_UP_TO) return false;
      this.selected = null;
      return true;
    }
    const selected = names(saved.selected);
    if (!selected || !selected.some((n) => this.names.has(n))) return false;
    this.selected = new Set(selected);
    this.settleOrder();
    return true;
  }

  /** Sort the table by a column id; the same column again reverses. */
  sortBy(column) {
    this.sort = this.sort.column === column ? { column, descending: !this.sort.descending } : { column, descending: false };
    this.settleOrder();
  }

  /** Hparam names of every run, sorted. */
  hparamNames() {
    return this._cached("hparamNames", () => {
      const keys = new Set();
      for (const n of this.names) for (const k of Object.keys(this.row(n).hparams)) keys.add(k);
      return [...keys].sort();
    });
  }

  /** Scalar tags any run summary has, sorted. */
  metricTags() {
    return this._cached("metricTags", () => {
      const tags = new Set();
      for (const n of this.names) for (const k of Object.keys(this.row(n).last)) tags.add(k);
      return [...tags].sort();
    });
  }

  // Lists over every run are asked for once per row while drawing: computed once per model
  // version, and at most every half second (runs without a summary change with their data).
  _cached(key, compute) {
    const now = Date.now();
    const hit = this._cache?.get(key);
    if (hit && hit.version === this.version && now - hit.at < 500) return hit.value;
    const value = compute();
    (this._cache ??= new Map()).set(key, { version: this.version, at: now, value });
    return value;
  }

  /** The metric tags shown as table columns: the chosen ones, else the first two tags. */
  shownMetrics() {
    if (this.metrics) return this.metrics;
    const tags = this.metricTags();
    const preferred = tags.filter((t) => /^(eval|val|test)\b|acc|loss/iu.test(t));
    return (preferred.length ? preferred : tags).slice(0, 2);
  }

  /** Table column ids: fixed, `h:<hparam>` for every hparam, `m:<tag>:last|min|max` per metric. */
  columns() {
    return [
      ...FIXED_COLUMNS,
      ...this.hparamNames().map((k) => `h:${k}`),
      ...this.shownMetrics().flatMap((tag) => ["last", "min", "max"].map((a) => `m:${tag}:${a}`)),
    ];
  }

  /**
   * The runs the table lists, in order: pinned first, then the runs selected when the order last
   * settled (the runs drawn, see `front`), each part by the sort column (name by default); hidden
   * runs only when showHidden, runs failing the filters not at all.
   */
  tableRows() {
    const names = [...this.names].filter((n) => (this.showHidden || !this.hidden.has(n)) && this.passes(n));
    const { column, descending } = this.sort;
    const rows = names.map((n) => ({ name: n, row: this.row(n) }));
    const cmp = (a, b) => {
      if (column && column !== "name") {
        const va = this.columnValue(a.row, column);
        const vb = this.columnValue(b.row, column);
        // Runs without the value stay last in either direction.
        const missing = (va === undefined || va === null) - (vb === undefined || vb === null);
        if (missing) return missing;
        const c = compareCells(va, vb);
        if (c !== 0) return descending ? -c : c;
      }
      const c = NATURAL_ORDER.compare(a.name, b.name);
      return column === "name" && descending ? -c : c;
    };
    const front = this.front;
    const leads = front === null ? () => 0 : (n) => front.has(n);
    rows.sort((a, b) => this.pinned.has(b.name) - this.pinned.has(a.name) || leads(b.name) - leads(a.name) || cmp(a, b));
    return rows;
  }
}

/**
 * A summary of a run from what the page holds (for a server that sends no `summaries`, and for the
 * hparams of a run whose summary has none yet): start, last wall time and step, hparams, and each
 * scalar tag's newest value and extremes. Cached per run until its data changes.
 * @param {import("./store.js").Store} store
 * @param {string} name
 * @returns {object|null} null when the page holds nothing of the run
 */
export function deriveSummary(store, name) {
  const run = store.runs.get(name);
  if (!run || (run.scalars.size === 0 && run.hparams === null)) return null;
  let version = 0;
  for (const s of run.scalars.values()) version += s.version;
  const cached = derived.get(run);
  if (cached && cached.version === version && cached.hparams === run.hparams) return cached.summary;
  const summary = { name, start: null, last_wall: null, last_step: null, hparams: run.hparams?.hparams ?? {}, last: {}, min: {}, max: {} };
  for (const [tag, s] of run.scalars) {
    const n = s.length;
    if (n === 0) continue;
    const walls = s.column(WALL);
    const steps = s.column(STEP);
    const values = s.column(VALUE);
    summary.start = summary.start === null ? s.firstWall : Math.min(summary.start, s.firstWall);
    summary.last_wall = Math.max(summary.last_wall ?? -Infinity, walls[n - 1]);
    summary.last_step = Math.max(summary.last_step ?? -Infinity, steps[n - 1]);
    let lo = Infinity;
    let hi = -Infinity;
    for (let i = 0; i < n; i++) {
      const v = values[i];
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    const finite = (v) => (Number.isFinite(v) ? v : null);
    summary.last[tag] = finite(values[n - 1]);
    summary.min[tag] = finite(lo);
    summary.max[tag] = finite(hi);
  }
  derived.set(run, { version, hparams: run.hparams, summary });
  return summary;
}
const derived = new WeakMap();
