// The runs table in the sidebar: one row per run (name, status, start, duration, last step, host,
// every hparam, last/min/max of chosen metrics), sortable by any column, with a text search, a
// condition filter (its error shown under it), grouping, and per-row select / pin / hide. Only the
// rows in view are in the DOM (fixed row height), so 1,000 runs scroll as smoothly as 10.
import { formatDuration, formatValue } from "../chart.js";
import { colorFor, el } from "../dom.js";
import { t, tf } from "../i18n.js";
import { BANDS, FIXED_COLUMNS } from "../runs.js";

/** Height of one row in px (rows are absolutely placed at index x ROW_HEIGHT). */
export const ROW_HEIGHT = 26;
/** Rows drawn above and below those in view, so a fast scroll does not show blanks. */
const OVERSCAN = 8;

const WIDTHS = { name: 190, status: 62, start: 92, duration: 62, last_step: 62, host: 80 };
const HPARAM_WIDTH = 72;
const METRIC_WIDTH = 70;

/** A cell's text for a column's value. */
export function cellText(column, value) {
  if (value === undefined || value === null) return "";
  if (column === "start") return formatStart(value);
  if (column === "duration") return formatDuration(value);
  if (typeof value === "number") return formatValue(value);
  return String(value);
}

function formatStart(wall) {
  const d = new Date(wall * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

// The group-by select's value for a grouping spec.
function groupValue(spec) {
  return !spec ? "" : spec.kind === "hparam" ? `h:${spec.key}` : "pattern";
}

export class RunsTable {
  /**
   * @param {object} opts
   * @param {import("../runs.js").RunsModel} opts.model
   * @param {(how?: {immediate: boolean}) => void} opts.onChange called after the user changed the
   *   selection, pins, hidden runs, filters or grouping (the page then redraws and re-subscribes:
   *   at once after a click, `immediate`, after a pause in typing otherwise)
   * @param {import("../frames.js").FrameScheduler} [opts.scheduler] draws the table's live updates
   *   (new summaries) in the charts' frames, within their budget
   */
  constructor({ model, onChange, scheduler = null }) {
    this.model = model;
    this.onChange = onChange;
    this.scheduler = scheduler;
    this.count = el("span", { class: "runs-count" });
    this.search = el("input", { type: "search", class: "run-search", spellcheck: "false", on: { input: () => this._onSearch() } });
    this.condition = el("input", { type: "search", class: "run-condition", spellcheck: "false", on: { input: () => this._onCondition() } });
    this.error = el("div", { class: "run-condition-error", role: "alert", hidden: true });
    this.groupSelect = el("select", { class: "run-group", on: { change: () => this._onGroup() } });
    this.groupPattern = el("input", { type: "search", class: "run-group-pattern", spellcheck: "false", hidden: true, on: { input: () => this._onGroup() } });
    this.bandSelect = el("select", { class: "run-group-band", hidden: true, on: { change: () => this._set(() => (this.model.band = this.bandSelect.value)) } });
    this.metricsBox = el("div", { class: "run-metrics-list" });
    this.metricsLabel = el("summary", {});
    this.metricsPicker = el("details", { class: "run-metrics" }, this.metricsLabel, this.metricsBox);
    this.allBtn = el("button", { type: "button", class: "icon runs-all", on: { click: () => this._selectShown(true) } });
    this.noneBtn = el("button", { type: "button", class: "icon runs-none", on: { click: () => this._selectShown(false) } });
    this.hiddenCheck = el("input", { type: "checkbox", class: "runs-show-hidden", on: { change: (e) => this._set(() => (this.model.showHidden = e.target.checked)) } });
    this.hiddenLabel = el("span", {});
    this.wideBtn = el("button", { type: "button", class: "icon runs-wide", text: "⇔", on: { click: () => document.body.classList.toggle("wide-runs") } });
    this.head = el("div", { class: "rt-head rt-row" });
    this.body = el("div", { class: "rt-body" });
    // The scroll offset as the last scroll event left it: read in the event, where the layout is
    // clean, never while drawing (a read after the page changed forces a style and layout of the
    // whole page: 148 ms of this function's time in a profile of the cold load of 1,000 runs,
    // whose first render comes right after the runs and summaries frames changed the page).
    this._scrollTop = 0;
    this.scroller = el(
      "div",
      {
        class: "runs-table",
        on: {
          scroll: () => {
            this._scrollTop = this.scroller.scrollTop;
            this._schedule();
          },
        },
      },
      this.head,
      this.body,
    );
    // The height in view, from the layout the browser did anyway (reading clientHeight while
    // drawing forced a layout every second with live summaries); drawn again when it changes
    // (the box grows to its max-height once the rows are in).
    this._viewHeight = 0;
    if (typeof ResizeObserver !== "undefined") {
      new ResizeObserver((entries) => {
        const h = entries[entries.length - 1].contentRect.height;
        if (Math.abs(h - this._viewHeight) > 1) {
          this._viewHeight = h;
          this._schedule();
        }
      }).observe(this.scroller);
    }
    this.titleLabel = el("span", {});
    this.element = el(
      "section",
      { class: "runs-panel" },
      el("h2", { class: "runs-head" }, this.titleLabel, this.count, this.wideBtn),
      this.search,
      this.condition,
      this.error,
      el("div", { class: "row runs-tools" }, this.groupSelect, this.groupPattern, this.bandSelect),
      this.metricsPicker,
      el("div", { class: "row runs-tools" }, this.allBtn, this.noneBtn, el("label", { class: "check" }, this.hiddenCheck, this.hiddenLabel)),
      this.scroller,
    );
    this._frame = 0;
    this._drawn = "";
    // Live updates (new summaries every second) are drawn with the charts, in the same frame and
    // commit: a frame of their own each second cost a commit as long as the charts' on a busy page.
    this._item = { element: this.scroller, render: () => this._render() };
    this.scheduler?.observe(this._item);
    this.relabel();
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.titleLabel.textContent = t("runs");
    this.search.placeholder = t("runSearch");
    this.condition.placeholder = t("runCondition");
    this.condition.title = t("runConditionHelp");
    this.groupPattern.placeholder = t("groupPattern");
    this.bandSelect.replaceChildren(...BANDS.map((b) => el("option", { value: b, text: t(b === "std" ? "bandStd" : "bandMinMax") })));
    this.bandSelect.value = this.model.band;
    this.bandSelect.title = t("groupBand");
    this.allBtn.textContent = t("all");
    this.noneBtn.textContent = t("none");
    this.hiddenLabel.textContent = t("showHidden");
    this.metricsLabel.textContent = t("metricColumns");
    this.wideBtn.title = t("widenRuns");
    this._showConditionError();
    this._drawn = "";
    this._schedule();
  }

  /**
   * Redraw soon (at most once per animation frame).
   * @param {{live?: boolean}} [opts] live: new data, not the user's doing (drawn with the charts'
   *   next frame when there is a scheduler)
   */
  update({ live = false } = {}) {
    if (live && this.scheduler) this.scheduler.mark(this._item);
    else this._schedule();
  }

  /** Redraw now. */
  render() {
    cancelAnimationFrame(this._frame);
    this._frame = 0;
    this._render();
  }

  _schedule() {
    if (this._frame) return;
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      this._render();
    });
  }

  // `typing`: a change made key by key (search, patterns), after which the page waits for a pause
  // before re-subscribing; a click re-subscribes at once.
  _set(fn, typing = false) {
    fn();
    this.onChange({ immediate: !typing });
    this._schedule();
  }

  _onSearch() {
    this._set(() => this.model.setSearch(this.search.value), true);
  }

  _onCondition() {
    this.model.setCondition(this.condition.value);
    this._showConditionError();
    this.onChange();
    this._schedule();
  }

  // The condition's error in the page's language (a language switch shows it again).
  _showConditionError() {
    const info = this.model.conditionErrorInfo;
    const error = info ? tf(info.key, info.params) : "";
    this.error.textContent = error;
    this.error.hidden = !error;
    this.condition.setCustomValidity(error);
  }

  /**
   * Show the model's grouping and band in the controls (after the model was restored from an
   * earlier visit).
   */
  syncControls() {
    const g = this.model.groupBy;
    const value = groupValue(g);
    if (![...this.groupSelect.options].some((o) => o.value === value)) this.groupSelect.append(el("option", { value, text: value }));
    this.groupSelect.value = value;
    this.groupPattern.hidden = value !== "pattern";
    if (g?.kind === "pattern") this.groupPattern.value = g.regex.source;
    this.bandSelect.value = this.model.band;
    this.bandSelect.hidden = !g;
    this._groupKey = ""; // the hparam choices are rebuilt around the value
    this._schedule();
  }

  _onGroup() {
    const value = this.groupSelect.value;
    this.groupPattern.hidden = value !== "pattern";
    let spec = null;
    let error = "";
    if (value === "pattern") {
      const text = this.groupPattern.value;
      if (text) {
        try {
          spec = { kind: "pattern", regex: new RegExp(text, "u") };
        } catch (err) {
          error = tf("badGroupPattern", { error: err.message });
        }
      }
    } else if (value.startsWith("h:")) {
      spec = { kind: "hparam", key: value.slice(2) };
    }
    this.groupPattern.setCustomValidity(error);
    this.groupPattern.title = error;
    if (error) return;
    this.bandSelect.hidden = !spec;
    this._set(() => (this.model.groupBy = spec), true);
  }

  _selectShown(on) {
    this._set(() => this.model.setSelected(this.model.tableRows().map((r) => r.name), on));
  }

  _width(column) {
    return WIDTHS[column] ?? (column.startsWith("h:") ? HPARAM_WIDTH : METRIC_WIDTH);
  }

  _label(column) {
    if (FIXED_COLUMNS.includes(column)) return t(`col_${column}`);
    if (column.startsWith("h:")) return column.slice(2);
    const i = column.lastIndexOf(":");
    return `${column.slice(2, i)} ${t(`agg_${column.slice(i + 1)}`)}`;
  }

  _render() {
    const model = this.model;
    // No layout is read here (see `_scrollTop`): before the ResizeObserver's first report the box
    // is at most the window's height, and an offset past the rows (they became fewer) is clamped
    // as the browser will clamp it.
    const height = this._viewHeight || window.innerHeight || 400;
    const columns = model.columns();
    const rows = model.tableRows();
    const top = Math.max(0, Math.min(this._scrollTop, rows.length * ROW_HEIGHT - height));
    const template = columns.map((c) => `${this._width(c)}px`).join(" ");
    this.scroller.style.setProperty("--rt-columns", template);
    const total = columns.reduce((s, c) => s + this._width(c), 0);
    this.head.style.width = this.body.style.width = `${total}px`;

    const drawn = model.drawn().length;
    const count = tf("runsCount", { shown: drawn, total: model.names.size });
    if (this.count.textContent !== count) this.count.textContent = count;
    this._renderControls();

    // The header, only when its columns or the sort changed.
    const headKey = JSON.stringify([columns, model.sort, this.titleLabel.textContent]);
    if (headKey !== this._headKey) {
      this._headKey = headKey;
      const { column: sorted, descending } = model.sort;
      this.head.replaceChildren(
        ...columns.map((c) =>
          el(
            "div",
            {
              class: `rt-cell rt-th${c === "name" ? " rt-name" : ""}${c.startsWith("m:") ? " metric" : ""}`,
              dataset: { column: c },
              role: "columnheader",
              title: this._label(c),
              "aria-sort": sorted === c ? (descending ? "descending" : "ascending") : "none",
              on: { click: () => this._set(() => model.sortBy(c)) },
            },
            this._label(c),
            sorted === c ? (descending ? " ▼" : " ▲") : "",
          ),
        ),
      );
    }

    // Only the rows in view (plus a margin) are built.
    this.body.style.height = `${rows.length * ROW_HEIGHT}px`;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(rows.length, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    const built = [];
    const cache = new Map();
    // Whether each row leads, asked once per row (the next row's answer is the one after).
    let leads = first < rows.length && model.leads(rows[first].name);
    for (let i = first; i < last; i++) {
      // A line under the last of the leading rows (pinned, and the runs drawn when the order
      // settled): the runs on the charts are the ones above it.
      const nextLeads = i + 1 < rows.length && model.leads(rows[i + 1].name);
      const split = i + 1 < rows.length && leads && !nextLeads;
      built.push(this._row(rows[i], i, columns, split, cache));
      leads = nextLeads;
    }
    this._rows = cache;
    // Live summaries redraw the table every second: rows that did not change are the same
    // elements, and the same rows in the same order are not touched at all (no layout, paint
    // or commit for them).
    const now = this.body.children;
    if (built.length !== now.length || built.some((row, i) => row !== now[i])) this.body.replaceChildren(...built);
  }

  // The group-by choices and the metric-column checkboxes, rebuilt only when their lists change.
  _renderControls() {
    const model = this.model;
    // Group-by choices: none, a name pattern, or any hparam.
    const hparams = model.hparamNames();
    const groupKey = JSON.stringify([hparams, this.titleLabel.textContent]);
    if (groupKey !== this._groupKey) {
      this._groupKey = groupKey;
      // The model's grouping, unless the user is choosing a pattern not yet valid.
      const value = this.groupSelect.value === "pattern" ? "pattern" : groupValue(model.groupBy);
      this.groupSelect.replaceChildren(
        el("option", { value: "", text: t("noGroups") }),
        el("option", { value: "pattern", text: t("groupByPattern") }),
        ...hparams.map((k) => el("option", { value: `h:${k}`, text: tf("groupByHparam", { name: k }) })),
      );
      this.groupSelect.value = [...this.groupSelect.options].some((o) => o.value === value) ? value : "";
    }
    // Metric column checkboxes.
    const tags = model.metricTags();
    const shown = model.shownMetrics();
    const metricsKey = JSON.stringify([tags, shown]);
    if (metricsKey !== this._metricsKey) {
      this._metricsKey = metricsKey;
      this.metricsBox.replaceChildren(
        ...tags.map((tag) =>
          el(
            "label",
            { class: "check", dataset: { metric: tag } },
            el("input", {
              type: "checkbox",
              checked: shown.includes(tag),
              on: {
                change: (e) =>
                  this._set(() => {
                    const now = new Set(model.shownMetrics());
                    if (e.target.checked) now.add(tag);
                    else now.delete(tag);
                    model.metrics = [...now].sort();
                  }),
              },
            }),
            tag,
          ),
        ),
      );
    }
  }

  // One row's element: the one built last time when nothing it shows changed (`cache` collects
  // the rows of this render).
  _row({ name, row }, index, columns, split, cache) {
    const model = this.model;
    const selected = model.isSelected(name);
    const cls = ["rt-row"];
    if (model.pinned.has(name)) cls.push("pinned");
    if (model.hidden.has(name)) cls.push("hidden-run");
    if (model.isDrawn(name)) cls.push("drawn");
    if (split) cls.push("rt-split");
    // Each cell's value and text, computed once: they make the row's key and its cells.
    const values = columns.map((c) => (c === "name" ? undefined : model.columnValue(row, c)));
    const texts = columns.map((c, i) => (c === "name" ? "" : c === "status" && values[i] ? t(`status_${values[i]}`) : cellText(c, values[i])));
    const key = [index, cls.join(" "), selected, t("pinRun"), ...columns.map((c, i) => (c === "name" ? "" : `${c}\u0002${values[i] ?? "unknown"}\u0002${texts[i]}`))].join("\u0001");
    const kept = this._rows?.get(name);
    if (kept && kept.key === key) {
      cache.set(name, kept);
      return kept.element;
    }
    const cells = columns.map((c, i) => {
      if (c === "name") {
        return el(
          "div",
          { class: "rt-cell rt-name", title: name },
          el("input", {
            type: "checkbox",
            class: "run-select",
            checked: selected,
            "aria-label": name,
            // One row's box: the row stays where it is (the order settles on All, None, a sort).
            on: { change: (e) => this._set(() => model.setSelected([name], e.target.checked, { settle: false })) },
          }),
          el("i", { class: "swatch", style: { background: colorFor(name) } }),
          el("span", { class: "run-name", text: name }),
          el("button", {
            type: "button",
            class: `run-pin${model.pinned.has(name) ? " on" : ""}`,
            title: t(model.pinned.has(name) ? "unpinRun" : "pinRun"),
            text: model.pinned.has(name) ? "★" : "☆",
            "aria-pressed": String(model.pinned.has(name)),
            on: { click: () => this._set(() => model.togglePinned(name)) },
          }),
          el("button", {
            type: "button",
            class: `run-hide${model.hidden.has(name) ? " on" : ""}`,
            title: t(model.hidden.has(name) ? "unhideRun" : "hideRun"),
            text: "⊘",
            "aria-pressed": String(model.hidden.has(name)),
            on: { click: () => this._set(() => model.toggleHidden(name)) },
          }),
        );
      }
      const v = values[i];
      const text = texts[i];
      return el("div", { class: `rt-cell${c.startsWith("m:") ? " metric" : ""}${c === "status" ? ` status-${v ?? "unknown"}` : ""}`, title: text }, text);
    });
    const element = el("div", { class: cls.join(" "), dataset: { run: name }, role: "row", style: { top: `${index * ROW_HEIGHT}px` } }, ...cells);
    cache.set(name, { key, element });
    return element;
  }
}
