// The hyperparameters view: a table with one row per run, its hyperparameters and the metrics that
// judge it (the values given with the hparams event, else the newest value of that scalar tag),
// sortable by any column; under it the sweep panels (parallel coordinates, scatter, heat map).
import { formatValue } from "../chart.js";
import { colorFor, el } from "../dom.js";
import { language, t, tf } from "../i18n.js";
import { compareCells } from "../runs.js";
import { VALUE } from "../store.js";
import { SweepPanels } from "./sweep.js";

/** Most rows the table lists (the runs table in the sidebar lists every run). */
export const HPARAMS_TABLE_ROWS = 200;

export class HparamsView {
  /** @param {object} ctx shared page context: `store`, `scheduler`, `state` */
  constructor(ctx) {
    this.ctx = ctx;
    this.sort = { column: null, descending: false };
    this.empty = el("p", { class: "empty", text: t("noHparams") });
    this.table = el("table", { class: "hparams-table" });
    this.more = el("p", { class: "hint hparams-more", hidden: true });
    this.sweep = new SweepPanels(ctx, () => ctx.onRunsChanged?.());
    this.element = el("div", { class: "view hparams" }, this.empty, el("div", { class: "table-box" }, this.table), this.more, this.sweep.element);
    // Redrawn through the scheduler like a chart: at most once per frame, not while hidden or paused.
    this.item = { element: this.element, render: () => this._render() };
    ctx.scheduler.observe(this.item);
    ctx.store.subscribe((change) => {
      // Scalars only matter for metric values the page derives itself: with the server's summaries
      // (at most one a second) the table and sweep panels need not follow every point.
      if (change.kind === "scalars" && ctx.runs.summaries.size > 0) return;
      if (change.kind === "hparams" || change.kind === "scalars" || change.kind === "runs" || change.kind === "summaries") ctx.scheduler.mark(this.item);
    }, { current: true });
  }

  /** Redraw after the run toggles changed. */
  refresh() {
    this.ctx.scheduler.mark(this.item);
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noHparams");
    this.sweep.relabel();
    this._sweepKey = "";
    this.ctx.scheduler.mark(this.item);
  }

  /** The table's rows: `{run, values: Map(column -> value)}`, and its columns. */
  rows() {
    const { store, runs: model } = this.ctx;
    const params = new Set();
    const metrics = new Set();
    const rows = [];
    // Every run that passes the runs table's filters (not only those drawn): the hparams come from
    // the run's summary, or its hparams event when the page holds it.
    for (const name of [...model.names].sort()) {
      if (model.hidden.has(name) || !model.passes(name)) continue;
      const ev = store.runs.get(name)?.hparams ?? null;
      const summary = model.row(name);
      const hparams = ev?.hparams ?? summary.hparams;
      if (Object.keys(hparams).length === 0) continue;
      const values = new Map();
      for (const [k, v] of Object.entries(hparams)) {
        params.add(k);
        values.set(`h:${k}`, v);
      }
      const tags = Array.isArray(ev?.metrics) && ev.metrics.length ? ev.metrics : model.shownMetrics();
      for (const tag of tags) {
        metrics.add(tag);
        const given = ev?.metric_values?.[tag];
        const series = store.series(name, tag);
        const v = typeof given === "number" ? given : series?.length ? series.column(VALUE)[series.length - 1] : (summary.last[tag] ?? undefined);
        values.set(`m:${tag}`, v);
      }
      rows.push({ run: name, values });
    }
    const columns = [
      ...[...params].sort().map((k) => ({ id: `h:${k}`, label: k, metric: false })),
      ...[...metrics].sort().map((k) => ({ id: `m:${k}`, label: k, metric: true })),
    ];
    return { rows, columns };
  }

  _render() {
    const { rows: all, columns } = this.rows();
    const rows = all.slice(0, HPARAMS_TABLE_ROWS);
    this.more.hidden = all.length <= rows.length;
    this.more.textContent = all.length > rows.length ? tf("hparamsMore", { shown: rows.length, total: all.length }) : "";

    // Scalars stream in all the time; rebuild the table only when what it shows changed.
    const content = JSON.stringify([language(), this.sort, columns, rows.map((r) => [r.run, [...r.values]])]);
    // The sweep panels follow the runs' summaries, the table's filters and what the table shows.
    const sweepKey = `${this.ctx.runs.version}|${language()}`;
    if (sweepKey !== this._sweepKey || content !== this._content) {
      this._sweepKey = sweepKey;
      this.sweep.render();
    }
    if (content === this._content) return;
    this._content = content;
    this.empty.hidden = rows.length > 0;
    this.table.hidden = rows.length === 0;
    const { column, descending } = this.sort;
    if (column) {
      rows.sort((a, b) => {
        const c = column === "run" ? compareCells(a.run, b.run) : compareCells(a.values.get(column), b.values.get(column));
        return descending ? -c : c;
      });
    }
    const header = (id, label, cls) =>
      el(
        "th",
        {
          class: cls,
          dataset: { column: id },
          "aria-sort": column === id ? (descending ? "descending" : "ascending") : "none",
          on: { click: () => this._sortBy(id) },
        },
        label,
        column === id ? (descending ? " ▼" : " ▲") : "",
      );
    this.table.replaceChildren(
      el("thead", {}, el("tr", {}, header("run", t("run"), "run-col"), ...columns.map((c) => header(c.id, c.label, c.metric ? "metric" : "")))),
      el(
        "tbody",
        {},
        ...rows.map((row) =>
          el(
            "tr",
            { dataset: { run: row.run } },
            el("td", { class: "run-col" }, el("i", { class: "swatch", style: { background: colorFor(row.run) } }), ` ${row.run}`),
            ...columns.map((c) => {
              const v = row.values.get(c.id);
              return el("td", { class: c.metric ? "metric" : "" }, v === undefined ? "" : typeof v === "number" ? formatValue(v) : String(v));
            }),
          ),
        ),
      ),
    );
  }

  _sortBy(id) {
    this.sort = this.sort.column === id ? { column: id, descending: !this.sort.descending } : { column: id, descending: false };
    this._render();
  }
}
