// The system view: GPU utilization, memory, temperature and power, CPU and RAM, over wall time.
// One chart per metric (`gpu0/util` and `gpu1/util` share the "GPU utilization" chart), one line per
// device and source; cursors are synced by wall time with each other and with the scalar charts
// when those use wall time. Lines are in their run's color (the same as in every other view), the
// devices and sources of one run told apart by dashes, and named in a legend under each chart.
import { Chart, DASHES, formatBytes, formatValue } from "../chart.js";
import { colorFor, el } from "../dom.js";
import { gather, minMaxIndices } from "../downsample.js";
import { t } from "../i18n.js";
import { VALUE, WALL } from "../store.js";

// The main metrics, in display order: key -> title string key. Every other field (docs/telemetry.md
// lists them) gets a chart under "More", folded away until opened.
const MAIN = new Map([
  ["gpu/util", "gpuUtil"],
  ["gpu/mem_used", "gpuMem"],
  ["gpu/temp", "gpuTemp"],
  ["gpu/power", "gpuPower"],
  ["cpu/percent", "cpuPercent"],
  ["ram/used", "ramUsed"],
]);

/**
 * The y format of a metric, from its unit in docs/telemetry.md: byte counts and byte rates are
 * shown as KiB/MiB/GiB, everything else as a number.
 * @param {string} metric
 */
export function formatFor(metric) {
  if (/bytes_per_s$|\/pcie_(tx|rx)$/.test(metric)) return (v) => `${formatBytes(v)}/s`;
  if (/\/(mem_used|mem_total|proc_mem|used|total|rss)$/.test(metric)) return formatBytes;
  return formatValue;
}

/**
 * Split a telemetry field into the chart it belongs to and the device it describes:
 * `gpu0/util` -> {metric: "gpu/util", device: "gpu0"}; `cpu/percent` -> {metric: "cpu/percent", device: "cpu"}.
 * @param {string} field
 */
export function splitField(field) {
  const i = field.indexOf("/");
  if (i <= 0) return { metric: field, device: "" };
  const device = field.slice(0, i);
  const kind = device.replace(/\d+$/, "");
  return { metric: `${kind}/${field.slice(i + 1)}`, device };
}

export class SystemView {
  /** @param {object} ctx shared page context: `store`, `scheduler`, `state`, `syncGroup(syncKey)` */
  constructor(ctx) {
    this.ctx = ctx;
    /** @type {Map<string, Chart>} metric -> chart */
    this.charts = new Map();
    this.empty = el("p", { class: "empty", text: t("noSystem") });
    this.grid = el("div", { class: "grid" });
    this.moreGrid = el("div", { class: "grid" });
    this.moreTitle = el("summary", { text: t("more") });
    this.more = el("details", { class: "group more" }, this.moreTitle, this.moreGrid);
    this.more.hidden = true;
    this.element = el("div", { class: "view system" }, this.empty, this.grid, this.more);
    ctx.store.subscribe((change) => {
      if (change.kind !== "telemetry") return;
      const run = ctx.store.runs.get(change.run);
      if (!run) return;
      for (const series of run.telemetry.values()) this._touch(splitField(series.field).metric);
    }, { current: true });
  }

  /** Redraw after the run toggles changed. */
  refresh() {
    for (const chart of this.charts.values()) this.ctx.scheduler.mark(chart);
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noSystem");
    this.moreTitle.textContent = t("more");
    for (const [metric, chart] of this.charts) chart.setTitle(titleOf(metric));
  }

  _touch(metric) {
    let chart = this.charts.get(metric);
    if (!chart) {
      chart = new Chart({
        key: `system:${metric}`,
        title: titleOf(metric),
        dataset: { metric },
        syncKey: "wall",
        group: this.ctx.syncGroup("wall"),
        xKind: "wall",
        formatY: formatFor(metric),
        legend: true,
        source: (c) => this._lines(c, metric),
        exportData: () => this._export(metric),
      });
      chart.onChange = () => this.ctx.scheduler.mark(chart);
      this.charts.set(metric, chart);
      const main = MAIN.has(metric);
      const order = (m) => (MAIN.has(m) ? String([...MAIN.keys()].indexOf(m)) : `~${m}`);
      const siblings = [...this.charts.keys()].filter((m) => MAIN.has(m) === main).sort((a, b) => order(a).localeCompare(order(b)));
      const next = siblings[siblings.indexOf(metric) + 1];
      (main ? this.grid : this.moreGrid).insertBefore(chart.element, next === undefined ? null : this.charts.get(next).element);
      if (!main) this.more.hidden = false;
      this.ctx.scheduler.observe(chart);
      this.empty.hidden = true;
    }
    this.ctx.scheduler.mark(chart);
  }

  // Every sample held of each line (not the drawn ones), for CSV/JSON: `{run: label, wall, value}`.
  _export(metric) {
    return this._lines(null, metric, true).map((l) => ({ run: l.label, wall: Array.from(l.xs), value: Array.from(l.ys) }));
  }

  // The lines of a chart, downsampled to its width and zoom (all: every sample, chart unused).
  _lines(chart, metric, all = false) {
    const { store, state } = this.ctx;
    const lines = [];
    const runs = store.runNames().filter((r) => !state.hiddenRuns.has(r));
    const withTelemetry = runs.filter((r) => store.runs.get(r).telemetry.size > 0);
    for (const runName of withTelemetry) {
      const entries = [...store.runs.get(runName).telemetry.values()]
        .filter((s) => splitField(s.field).metric === metric && s.buffer.length > 0)
        .sort((a, b) => (a.source + a.field).localeCompare(b.source + b.field));
      const sources = new Set(entries.map((series) => series.source));
      entries.forEach((series, k) => {
        const walls = series.column(WALL);
        const values = series.column(VALUE);
        const idx = all ? null : minMaxIndices(walls, values, chart.width, chart.zoom?.[0], chart.zoom?.[1]);
        const { device } = splitField(series.field);
        const source = series.source.endsWith("#0") ? series.source.slice(0, -2) : series.source;
        const label = [runName, sources.size > 1 ? source : "", device].filter(Boolean).join(" ");
        lines.push({ label, color: colorFor(runName), dash: DASHES[k % DASHES.length], legendData: { run: runName }, xs: idx ? gather(walls, idx) : walls, ys: idx ? gather(values, idx) : values });
      });
    }
    return lines;
  }
}

function titleOf(metric) {
  return MAIN.has(metric) ? t(MAIN.get(metric)) : metric;
}
