// The scalars view: one chart per tag, grouped by the tag's prefix (`train/loss` is in `train`),
// runs overlaid, EMA-smoothed line over a faint raw line, regex tag filter.
import { shareGrid } from "../align.js";
import { Chart, formatValue } from "../chart.js";
import { scalarSeries } from "../chartdata.js";
import { colorFor, el, PALETTE } from "../dom.js";
import { gather, lowerBound, minMaxIndices, nearestIndex } from "../downsample.js";
import { aggregate, bandEdges } from "../groups.js";
import { fetchScalars, needsHistory, spliceRange } from "../history.js";
import { loadingText, t, tf } from "../i18n.js";
import { groupKey } from "../runs.js";
import { Ema } from "../smoothing.js";
import { SMOOTHED, STEP, VALUE, WALL } from "../store.js";

/** With more runs than this in a chart, the faint raw lines behind the smoothed ones are left out. */
export const RAW_LINES_UP_TO = 20;
/** The width of each line (CSS px) with more runs than RAW_LINES_UP_TO in a chart. */
export const MANY_LINES_WIDTH = 1;

/** The group a tag is shown in: the part before its first `/` (empty for none). */
export function tagGroup(tag) {
  const i = tag.indexOf("/");
  return i > 0 ? tag.slice(0, i) : "";
}

export class ScalarsView {
  /**
   * @param {object} ctx shared page context: `store`, `scheduler`, `state`, `syncGroup(syncKey)`,
   *   `token` (for the HTTP API)
   */
  constructor(ctx) {
    this.ctx = ctx;
    /** @type {Map<string, Chart>} */
    this.charts = new Map();
    this.groups = new Map();
    /** Fetched full-resolution history by `${tag}\u0000${run}`, and requests in flight. */
    this.details = new Map();
    this.pending = new Map();
    /** The group aggregates last drawn, by tag (for the readout). */
    this.groupAggregates = new Map();
    // While it has no charts, this says whether the page is connecting, loading (with progress)
    // or has everything the server has: "No data yet" only then.
    this.empty = el("p", { class: "empty", dataset: { sync: "connecting" }, text: loadingText(ctx.store.syncState()) });
    this.element = el("div", { class: "view scalars" }, this.empty);
    ctx.store.subscribe((change) => {
      if (change.kind === "scalars") for (const tag of change.tags) this._touch(tag);
      // The list of runs (not each of the 1,000 runs a `runs` frame announces one by one).
      else if (change.kind === "runs" && change.run === null) this.refresh();
      else if (change.kind === "sync") this.applyFilter();
    });
  }

  /** Redraw every chart (after a setting such as the x axis or the run toggles changed). */
  refresh() {
    const { state } = this.ctx;
    for (const chart of this.charts.values()) {
      const syncKey = scalarSyncKey(state.xKind);
      if (chart.xKind !== state.xKind || chart.logY !== state.logY) {
        chart.zoom = null;
        chart.resetBtn.hidden = true;
      }
      if (chart.syncKey !== syncKey) {
        chart.group.charts.delete(chart);
        chart.syncKey = syncKey;
        chart.group = this.ctx.syncGroup(syncKey);
        chart.group.charts.add(chart);
        chart._signature = ""; // the uPlot sync key is fixed at build time
      }
      chart.xKind = state.xKind;
      chart.logY = state.logY;
      this.ctx.scheduler.mark(chart);
    }
    this.applyFilter();
  }

  /** Show only charts whose tag matches the filter regex. */
  applyFilter() {
    // Called on every snapshot that arrives (a sync change): only what differs is written, so
    // 100 arriving snapshots do not each invalidate the page's style and layout.
    const set = (node, key, value) => {
      if (node[key] !== value) node[key] = value;
    };
    const re = this.ctx.state.filter;
    let shown = 0;
    for (const [tag, chart] of this.charts) {
      const ok = !re || re.test(tag);
      set(chart.element, "hidden", !ok);
      if (ok) shown++;
    }
    for (const group of this.groups.values()) {
      set(group.element, "hidden", ![...group.charts].some((c) => !c.element.hidden));
    }
    set(this.empty, "hidden", shown > 0);
    const sync = this.ctx.store.syncState();
    set(this.empty.dataset, "sync", sync.phase);
    set(this.empty, "textContent", this.charts.size ? t("noTags") : loadingText(sync));
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.applyFilter();
    for (const chart of this.charts.values()) {
      chart.resetBtn.title = t("reset");
      chart.pngBtn.title = t("savePng");
      chart._updateReadout();
    }
  }

  _touch(tag) {
    let chart = this.charts.get(tag);
    if (!chart) chart = this._create(tag);
    this.ctx.scheduler.mark(chart);
  }

  _create(tag) {
    const { state, scheduler } = this.ctx;
    const syncKey = scalarSyncKey(state.xKind);
    const chart = new Chart({
      key: tag,
      title: tag,
      syncKey,
      group: this.ctx.syncGroup(syncKey),
      xKind: state.xKind,
      logY: state.logY,
      // One diverging run among many would squash every other line flat at the bottom.
      robust: true,
      source: (c) => this._lines(c, tag),
      lookup: (x) => this._lookup(tag, x),
      exportData: () => scalarSeries(this.ctx.store, this.ctx.state, tag),
    });
    chart.onChange = () => scheduler.mark(chart);
    // Group lines come as mean, max, min: after each draw, fill between max and min (uPlot bands).
    const render = chart.render.bind(chart);
    chart.render = () => {
      render();
      applyBands(chart);
    };
    this.charts.set(tag, chart);

    const name = tagGroup(tag);
    let group = this.groups.get(name);
    if (!group) {
      const body = el("div", { class: "grid" });
      group = {
        body,
        charts: new Set(),
        element: el("details", { class: "group", open: true, dataset: { group: name } }, el("summary", { text: name || "·" }), body),
      };
      this.groups.set(name, group);
      const names = [...this.groups.keys()].sort();
      const next = names[names.indexOf(name) + 1];
      this.element.insertBefore(group.element, next === undefined ? null : this.groups.get(next).element);
    }
    group.charts.add(chart);
    const tags = [...group.charts].map((c) => c.key).sort();
    const after = tags[tags.indexOf(tag) + 1];
    group.body.insertBefore(chart.element, after === undefined ? null : this.charts.get(after).element);
    scheduler.observe(chart);
    this.applyFilter();
    return chart;
  }

  // The lines of one chart: per visible run, the raw values (faint when smoothing) and the
  // smoothed values, downsampled to the chart's width over its zoomed range. Zoomed into history
  // the page only has downsampled (or no longer has), the full-resolution points are fetched.
  _lines(chart, tag) {
    if (this.ctx.runs?.groupBy) return this._groupLines(chart, tag);
    const { store, state } = this.ctx;
    const lines = [];
    const shown = [];
    for (const run of store.runNames()) {
      if (state.hiddenRuns.has(run)) continue;
      const series = store.series(run, tag);
      if (series && series.length > 0) shown.push([run, series]);
    }
    // With many runs overlaid the faint raw lines are only clutter (and half the drawing).
    const raw = state.smoothing > 0 && shown.length <= RAW_LINES_UP_TO;
    // Many runs, no zoom: the lines in step order go onto one shared grid below, which reads
    // their columns at once, so a column whose every row is kept is read in place instead of
    // copied (a selection of 100 runs of 200 points: 1,000 copies per draw otherwise). A line off
    // the grid keeps its columns until the next draw: a copy, as the ring may move its rows.
    const gridded = shown.length > RAW_LINES_UP_TO && !chart.zoom;
    const entries = [];
    for (const [run, series] of shown) {
      const walls = series.column(WALL);
      const xsFull = state.xKind === "step" ? series.column(STEP) : walls;
      // Relative time counts from the run's first point, even after the ring buffer dropped it.
      const offset = state.xKind === "relative" ? series.firstWall : 0;
      const zoom = chart.zoom;
      const ascending = state.xKind === "step" ? series.stepsAscending : series.wallsAscending;
      const idx = minMaxIndices(xsFull, series.column(VALUE), chart.width, zoom ? zoom[0] + offset : undefined, zoom ? zoom[1] + offset : undefined, ascending, series.extremes);
      // Only the columns drawn: raw lines (no smoothing, or faint behind few runs) and smoothed ones.
      // (idx is ascending and unique, so as many indices as rows means every row; the x column
      // is shifted in place below when offset, so then it is always a copy.)
      const inPlace = gridded && ascending && idx.length === xsFull.length;
      const pick = (col) => (inPlace ? col : gather(col, idx));
      let cols = { xs: inPlace && !offset ? xsFull : gather(xsFull, idx) };
      if (state.smoothing === 0 || raw) cols.raw = pick(series.column(VALUE));
      if (state.smoothing > 0) cols.smoothed = pick(series.column(SMOOTHED));
      if (offset) for (let i = 0; i < cols.xs.length; i++) cols.xs[i] -= offset;
      if (zoom && state.xKind === "step" && ascending) {
        const detail = this._detail(chart, series, zoom);
        if (detail) cols = spliceRange(cols, detail, detail.start, detail.end);
      }
      entries.push({ run, ascending, cols });
    }
    // Many runs (and no zoom, whose edges need the points just outside it): one shared x grid of
    // two rows per pixel column instead of every run's own x values (see align.js).
    if (gridded) {
      const onGrid = entries.filter((e) => e.ascending);
      const key = state.smoothing > 0 ? "smoothed" : "raw";
      // The last draw's grid arrays are filled again: uPlot is given the new data right after.
      const grid = shareGrid(onGrid.map((e) => ({ xs: e.cols.xs, ys: e.cols[key] })), chart.width, undefined, undefined, chart._grid);
      chart._grid = grid;
      onGrid.forEach((e, i) => (e.cols = { xs: grid.xs, [key]: grid.ys[i] }));
    }
    // Many runs: lines one pixel wide. Canvas strokes of at most a pixel are drawn as hairlines
    // (Skia's fast path) where wider ones are outlined and filled: most of a frame's rasterizing
    // with 50 live runs on eight charts, and one line among many needs no more.
    const width = shown.length > RAW_LINES_UP_TO ? MANY_LINES_WIDTH : undefined;
    for (const { run, cols } of entries) {
      const color = colorFor(run);
      if (state.smoothing > 0) {
        if (raw) lines.push({ label: `${run} (raw)`, color, xs: cols.xs, ys: cols.raw, alpha: 0.25, width: 1, legend: false });
        lines.push({ label: run, color, xs: cols.xs, ys: cols.smoothed, width });
      } else {
        lines.push({ label: run, color, xs: cols.xs, ys: cols.raw, width });
      }
    }
    return lines;
  }

  // The received point nearest to x of every visible run (smoothed value when smoothing), for the
  // readout; x is reported as the first run's step (or time) of that point.
  _lookup(tag, x) {
    if (this.ctx.runs?.groupBy) return this._groupLookup(tag, x);
    const { store, state } = this.ctx;
    let at = null;
    const values = [];
    for (const run of store.runNames()) {
      if (state.hiddenRuns.has(run)) continue;
      const series = store.series(run, tag);
      if (!series || series.length === 0) continue;
      const ascending = state.xKind === "step" ? series.stepsAscending : series.wallsAscending;
      if (!ascending) continue;
      const xs = series.column(state.xKind === "step" ? STEP : WALL);
      const offset = state.xKind === "relative" ? series.firstWall : 0;
      const i = nearestIndex(xs, x + offset);
      at ??= xs[i] - offset;
      const raw = series.column(VALUE)[i];
      const smoothed = series.column(SMOOTHED)[i];
      // The tooltip shows both, sorted by the one drawn boldly.
      values.push(state.smoothing > 0 ? { label: run, color: colorFor(run), value: smoothed, raw, smoothed } : { label: run, color: colorFor(run), value: raw });
    }
    return at === null ? null : { x: at, values };
  }

  /**
   * The drawn runs by group (see runs.js groupKey): Map of group key -> run names, in key order.
   * @returns {Map<string, string[]>}
   */
  runGroups() {
    const { store, state, runs } = this.ctx;
    const byKey = new Map();
    for (const run of store.runNames()) {
      if (state.hiddenRuns.has(run)) continue;
      const key = groupKey(run, runs.row(run).hparams, runs.groupBy);
      if (!byKey.has(key)) byKey.set(key, []);
      byKey.get(key).push(run);
    }
    return new Map([...byKey].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)));
  }

  // Per group: the mean across its runs (smoothed values when smoothing is on) and a band (min–max
  // or ±std, runs.band), over the chart's zoomed range at about one x per pixel column, recomputed
  // on every draw (live).
  _groupLines(chart, tag) {
    const { store, state } = this.ctx;
    const lines = [];
    const aggregates = [];
    const zoom = chart.zoom;
    let index = -1;
    for (const [key, names] of this.runGroups()) {
      // Groups take the palette in the order of their keys: few, and distinct colors matter more
      // than colors that survive a change of grouping.
      index++;
      const runs = [];
      for (const run of names) {
        const series = store.series(run, tag);
        if (!series || series.length === 0) continue;
        const ascending = state.xKind === "step" ? series.stepsAscending : series.wallsAscending;
        if (!ascending) continue;
        let xs = series.column(state.xKind === "step" ? STEP : WALL);
        if (state.xKind === "relative") xs = Float64Array.from(xs, (w) => w - series.firstWall);
        runs.push({ xs, ys: series.column(state.smoothing > 0 ? SMOOTHED : VALUE) });
      }
      if (runs.length === 0) continue;
      const agg = aggregate(runs, chart.width, zoom?.[0], zoom?.[1]);
      if (agg.xs.length === 0) continue;
      const color = PALETTE[index % PALETTE.length];
      const label = tf("groupMean", { name: key, n: runs.length });
      aggregates.push({ label, color, agg });
      lines.push({ label, color, xs: agg.xs, ys: agg.mean, width: 2, group: "mean" });
      // The band's edges: the runs' max and min, or mean ± std (runs.band).
      const band = this.ctx.runs.band === "std" ? "std" : "minmax";
      const { lower, upper } = bandEdges(agg, band);
      const [hi, lo] = band === "std" ? ["+std", "-std"] : ["max", "min"];
      lines.push({ label: `${label} ${hi}`, color, xs: agg.xs, ys: upper, width: 0.5, alpha: 0.4, legend: false, group: "max" });
      lines.push({ label: `${label} ${lo}`, color, xs: agg.xs, ys: lower, width: 0.5, alpha: 0.4, legend: false, group: "min" });
    }
    this.groupAggregates.set(tag, aggregates);
    return lines;
  }

  // The readout of grouped lines: each group's mean at the aggregated x nearest to x, with its
  // band (min – max, or ± std) and how many runs have a value there.
  _groupLookup(tag, x) {
    const aggregates = this.groupAggregates.get(tag) ?? [];
    const std = this.ctx.runs?.band === "std";
    let at = null;
    const values = [];
    for (const { label, color, agg } of aggregates) {
      const i = nearestIndex(agg.xs, x);
      at ??= agg.xs[i];
      const band = std ? `± ${formatValue(agg.std[i])}` : `${formatValue(agg.min[i])} – ${formatValue(agg.max[i])}`;
      values.push({ label, color, value: agg.mean[i], cells: [agg.mean[i], band, String(agg.count[i])] });
    }
    return at === null ? null : { x: at, values, head: [t("mean"), t(std ? "bandStdShort" : "bandMinMaxShort"), t("runsShort")] };
  }

  // Fetched full-resolution points of `series` covering the zoom, or null (asking for them when the
  // zoom reaches history the page lacks; the chart is redrawn when they arrive).
  _detail(chart, series, zoom) {
    const [x0, x1] = zoom;
    if (!needsHistory(series, x0, x1)) return null;
    const key = `${series.tag}\u0000${series.run}`;
    const have = this.details.get(key);
    // A fetch covers the zoom when it spans it and is fine enough: the server sent every point
    // (well under max_points), or the zoom is at least half as wide as the fetched range.
    const covers = (d) =>
      d.generation === series.generation && d.start <= x0 && d.end >= x1 && d.maxPoints >= chart.width * 2 &&
      (d.failed || d.xs.length < d.maxPoints / 2 || d.end - d.start <= 2 * (x1 - x0));
    if (have && covers(have)) return have.failed ? null : have;
    if (this.pending.get(key)?.covers?.(zoom)) return null;
    this.pending.get(key)?.abort.abort();
    const abort = new AbortController();
    const request = { start: Math.floor(x0), end: Math.ceil(x1), maxPoints: chart.width * 2, generation: series.generation };
    this.pending.set(key, { abort, covers: ([a, b]) => request.start <= a && request.end >= b });
    fetchScalars({ run: series.run, tag: series.tag, start: request.start, end: request.end, maxPoints: request.maxPoints, token: this.ctx.token, signal: abort.signal })
      .then(({ steps, walls, values }) => {
        const detail = { ...request, xs: steps, walls, raw: values, smoothed: this._smoothDetail(series, request.start, values) };
        this.details.set(key, detail);
      })
      .catch((err) => {
        if (err.name === "AbortError") return;
        console.warn(`vdl-stream: no full-resolution history for ${series.tag} of ${series.run}:`, err);
        this.details.set(key, { ...request, failed: true });
      })
      .finally(() => {
        if (this.pending.get(key)?.abort === abort) this.pending.delete(key);
        this.ctx.scheduler.mark(chart);
      });
    return null;
  }

  // Smooth fetched values, continuing from the received series' smoothed value just before them.
  _smoothDetail(series, start, values) {
    const steps = series.column(STEP);
    const before = lowerBound(steps, start) - 1;
    const seed = before >= 0 ? series.column(SMOOTHED)[before] : NaN;
    const out = new Float64Array(values.length);
    (before >= 0 ? Ema.continuing(this.ctx.state.smoothing, seed) : new Ema(this.ctx.state.smoothing)).fill(values, out);
    return out;
  }
}

/**
 * Give a chart's uPlot instance one band per group (fill between its max and min lines), once per
 * instance: the chart rebuilds the instance whenever its set of lines changes.
 * @param {Chart} chart
 */
export function applyBands(chart) {
  const u = chart.plot;
  if (!u) return;
  const lines = chart._lines;
  const wanted = [];
  for (let i = 0; i + 2 < lines.length; i++) {
    if (lines[i].group === "mean" && lines[i + 1].group === "max" && lines[i + 2].group === "min") {
      wanted.push({ series: [i + 2, i + 3], fill: `${lines[i].color}66` });
    }
  }
  const key = JSON.stringify(wanted);
  if (chart._bandPlot === u && chart._bandKey === key) return;
  // A new instance draws for the first time after this task (uPlot commits in a microtask), so its
  // bands only need adding; redrawing it now would draw it before its scales are set.
  const fresh = chart._bandPlot !== u;
  chart._bandPlot = u;
  chart._bandKey = key;
  if (fresh && wanted.length === 0) return;
  u.delBand(null);
  for (const band of wanted) u.addBand(band);
  if (!fresh) u.redraw(true, false); // band clips are made while building the paths
}

/** Scalar charts share the cursor by step; on wall time they join the telemetry charts' group. */
export function scalarSyncKey(xKind) {
  return xKind === "wall" ? "wall" : `scalars-${xKind}`;
}
