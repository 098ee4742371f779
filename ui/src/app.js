// Page entry point: builds the layout, wires the connection to the store and the store to the
// views, and exposes `window.vdl` for tests and the curious (documented in docs/dashboard.md).
import "uplot/dist/uPlot.min.css";
import "./style.css";
import { Connection, liveUrl, takeToken } from "./connection.js";
import { chartHooks, SyncGroup } from "./chart.js";
import { colorFor, el } from "./dom.js";
import { FrameScheduler } from "./frames.js";
import { initLanguage, language, LANGUAGES, loadingText, onLanguage, setLanguage, t, tf } from "./i18n.js";
import { DEFAULT_SMOOTHING } from "./smoothing.js";
import { STEP, Store, VALUE, WALL } from "./store.js";
import { CurvesView } from "./views/curves.js";
import { HistogramsView } from "./views/histograms.js";
import { HparamsView } from "./views/hparams.js";
import { ImagesView } from "./views/images.js";
import { ReplayBar } from "./views/replay.js";
import { ScalarsView } from "./views/scalars.js";
import { SystemView } from "./views/system.js";
import { TextView } from "./views/text.js";
import { AlertsView } from "./views/alerts.js";
import { Toasts } from "./toast.js";

initLanguage();

const token = takeToken();
/** History points per tag asked for in snapshots (`max_points` of `subscribe`). */
const MAX_POINTS = 2000;
const store = new Store({ maxPoints: MAX_POINTS });
// Charts redraw at most once per animation frame and at most 10 times a second: curves read just
// as live, and with 20 charts on screen the browser spends most of a frame compositing canvases.
const scheduler = new FrameScheduler({ minInterval: 100 });
const state = {
  xKind: "step",
  logY: false,
  smoothing: DEFAULT_SMOOTHING,
  filter: null,
  hiddenRuns: new Set(),
  paused: false,
  /** Views shown on the page (the tab buttons toggle them). */
  views: new Set(["alerts", "scalars", "system", "histograms", "images", "text", "curves", "hparams"]),
};
const syncGroups = new Map();
const ctx = {
  token,
  store,
  scheduler,
  state,
  /** Whether a card of `run` (null: any) and `tag` passes the run toggles and the tag filter. */
  shown(run, tag) {
    return !(run !== null && state.hiddenRuns.has(run)) && !(state.filter && !state.filter.test(tag));
  },
  syncGroup(key) {
    if (!syncGroups.has(key)) syncGroups.set(key, new SyncGroup());
    return syncGroups.get(key);
  },
};

// Alerts (issue 14): a panel above the charts (collapsed while there are none), toasts, and a
// marker on each chart at the alert's step.
const toasts = new Toasts();
const alertsView = new AlertsView(ctx, {
  toasts,
  onChange: () => {
    for (const chart of views.scalars.charts.values()) chart.plot?.redraw(false, false);
  },
});
chartHooks.draw = (chart, u) => alertsView.drawMarkers(chart, u);

// Page order: alerts, then training curves, then the system charts right under them.
const views = {
  alerts: alertsView,
  scalars: new ScalarsView(ctx),
  system: new SystemView(ctx),
  histograms: new HistogramsView(ctx),
  images: new ImagesView(ctx),
  text: new TextView(ctx),
  curves: new CurvesView(ctx),
  hparams: new HparamsView(ctx),
};
// Shown only under `vdl-stream replay`: the server's first `replay` frame shows it.
const replayBar = new ReplayBar(ctx);
const viewTitles = {};
for (const [name, view] of Object.entries(views)) {
  viewTitles[name] = el("h2", { class: "view-title" });
  view.element.prepend(viewTitles[name]);
  view.element.dataset.view = name;
}

// ---- layout -------------------------------------------------------------------------------------

const conn = el("span", { class: "conn", dataset: { state: "connecting" }, role: "status" });
// "Loading k/N" while snapshots are on their way, also once the first runs are drawn (the title
// and the empty scalars view say it in full).
const syncNote = el("span", { class: "sync-note", role: "status", hidden: true });
const pauseBtn = el("button", { type: "button", class: "pause", on: { click: () => setPaused(!state.paused) } });
const langSelect = el(
  "select",
  { class: "lang", "aria-label": "Language / 语言", on: { change: (e) => setLanguage(e.target.value) } },
  ...LANGUAGES.map((code) => el("option", { value: code, text: code === "zh" ? "中文" : "English" })),
);
const tabs = el("nav", { class: "tabs" });
// On a phone the settings panel is folded away behind this button.
const menuBtn = el("button", { type: "button", class: "menu", "aria-label": "Settings / 设置", text: "☰", on: { click: () => document.body.classList.toggle("show-side") } });
const runList = el("ul", { class: "runs" });
const filterInput = el("input", { type: "search", class: "filter", spellcheck: "false", on: { input: onFilter } });
const smoothingInput = el("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(state.smoothing), on: { input: onSmoothing } });
const smoothingValue = el("output", { text: state.smoothing.toFixed(2) });
const xSelect = el("select", { class: "xkind", on: { change: (e) => updateSetting({ xKind: e.target.value }) } });
const logInput = el("input", { type: "checkbox", class: "logy", on: { change: (e) => updateSetting({ logY: e.target.checked }) } });
const labels = {};
const label = (key) => (labels[key] = el("span", { text: t(key) }));

const side = el(
  "aside",
  { class: "side" },
  el("label", { class: "field" }, label("tagFilter"), filterInput),
  el("label", { class: "field" }, label("smoothing"), el("span", { class: "row" }, smoothingInput, smoothingValue)),
  el("label", { class: "field" }, label("xAxis"), xSelect),
  el("label", { class: "check" }, logInput, label("logY")),
  el(
    "h2",
    { class: "runs-head" },
    label("runs"),
    el("button", { type: "button", class: "icon runs-all", on: { click: () => setAllRuns(true) } }, label("all")),
    el("button", { type: "button", class: "icon runs-none", on: { click: () => setAllRuns(false) } }, label("none")),
  ),
  runList,
);
const main = el("main", {}, ...Object.values(views).map((v) => v.element));
document.body.replaceChildren(
  el("header", { class: "top" }, menuBtn, el("h1", { text: "vdl-stream" }), conn, syncNote, tabs, el("span", { class: "spacer" }), pauseBtn, langSelect, replayBar.element),
  el("div", { class: "layout" }, side, main),
  toasts.element,
);

function relabel() {
  for (const [key, node] of Object.entries(labels)) node.textContent = t(key);
  filterInput.placeholder = t("tagFilter");
  pauseBtn.textContent = state.paused ? t("resume") : t("pause");
  langSelect.value = language();
  xSelect.replaceChildren(
    ...[["step", "xStep"], ["relative", "xRelative"], ["wall", "xWall"]].map(([value, key]) => el("option", { value, text: t(key) })),
  );
  xSelect.value = state.xKind;
  tabs.replaceChildren(
    ...Object.keys(views).map((name) =>
      el("button", { type: "button", class: "tab", dataset: { view: name }, text: t(name), on: { click: () => toggleView(name) } }),
    ),
  );
  for (const [name, h] of Object.entries(viewTitles)) h.textContent = t(name);
  showViews();
  setConnState(conn.dataset.state);
  showSync();
  for (const view of Object.values(views)) view.relabel?.();
  replayBar.relabel();
}

function toggleView(name) {
  if (state.views.has(name)) state.views.delete(name);
  else state.views.add(name);
  showViews();
}

// A view that is not shown is display:none, so its charts are not drawn at all.
function showViews() {
  for (const [name, view] of Object.entries(views)) view.element.hidden = !state.views.has(name);
  for (const b of tabs.children) {
    const on = state.views.has(b.dataset.view);
    b.classList.toggle("active", on);
    b.setAttribute("aria-pressed", String(on));
  }
}

function refreshViews() {
  for (const view of Object.values(views)) view.refresh?.();
}

// ---- settings -----------------------------------------------------------------------------------

function onFilter() {
  const text = filterInput.value;
  try {
    state.filter = text ? new RegExp(text, "iu") : null;
    filterInput.setCustomValidity("");
    filterInput.title = "";
  } catch {
    filterInput.setCustomValidity(t("badRegex"));
    filterInput.title = t("badRegex");
    return;
  }
  refreshViews();
}

let smoothingTimer = 0;
function onSmoothing() {
  const w = Number(smoothingInput.value);
  smoothingValue.textContent = w.toFixed(2);
  // Re-smoothing every series is O(points); do it once the slider rests.
  clearTimeout(smoothingTimer);
  smoothingTimer = setTimeout(() => {
    state.smoothing = w;
    store.setSmoothing(w);
    refreshViews();
  }, 60);
}

function updateSetting(patch) {
  Object.assign(state, patch);
  refreshViews();
}

function setPaused(paused) {
  state.paused = paused;
  scheduler.setPaused(paused);
  pauseBtn.textContent = paused ? t("resume") : t("pause");
  pauseBtn.classList.toggle("active", paused);
  document.body.classList.toggle("paused", paused);
}

// ---- runs ---------------------------------------------------------------------------------------

function renderRuns() {
  const names = [...new Set([...store.announced, ...store.runNames()])].sort();
  runList.replaceChildren(
    ...names.map((name) =>
      el(
        "li",
        { dataset: { run: name } },
        el(
          "label",
          {},
          el("input", {
            type: "checkbox",
            checked: !state.hiddenRuns.has(name),
            on: {
              change: (e) => {
                if (e.target.checked) state.hiddenRuns.delete(name);
                else state.hiddenRuns.add(name);
                refreshViews();
              },
            },
          }),
          el("i", { class: "swatch", style: { background: colorFor(name) } }),
          el("span", { class: "run-name", text: name, title: name }),
        ),
      ),
    ),
  );
}

/** Show (true) or hide (false) every run. */
function setAllRuns(shown) {
  for (const name of window.vdl.runs()) {
    if (shown) state.hiddenRuns.delete(name);
    else state.hiddenRuns.add(name);
  }
  renderRuns();
  refreshViews();
}

// `body[data-sync]` is connecting, loading or ready (see Store.syncState): until ready, the other
// views do not claim to have nothing (style.css), and the scalars view says what it waits for.
function showSync() {
  const sync = store.syncState();
  document.body.dataset.sync = sync.phase;
  syncNote.hidden = sync.phase !== "loading";
  syncNote.textContent = sync.phase === "loading" ? tf("loadingShort", sync) : "";
  syncNote.title = sync.phase === "loading" ? loadingText(sync) : "";
}
showSync();
store.subscribe((change) => {
  if (change.kind === "sync") showSync();
});

let knownRuns = "";
store.subscribe((change) => {
  if (change.kind !== "runs") return;
  const names = [...new Set([...store.announced, ...store.runNames()])].sort().join("\u0000");
  if (names !== knownRuns) {
    knownRuns = names;
    renderRuns();
  }
});

// ---- connection ---------------------------------------------------------------------------------

function setConnState(s, detail = "") {
  conn.dataset.state = s;
  conn.textContent = s === "open" ? t("connected") : s === "connecting" ? t("connecting") : t("disconnected");
  conn.title = detail;
}

/** The /ws/live protocol version this page implements (docs/protocol.md). */
const PROTOCOL_VERSION = 1;
const connection = new Connection({
  maxPoints: MAX_POINTS,
  url: liveUrl(window.location, token),
  onMessage: (msg) => {
    if (msg.type === "hello") {
      if (msg.version !== PROTOCOL_VERSION) console.warn(`vdl-stream: server speaks protocol ${msg.version}, this page ${PROTOCOL_VERSION}`);
      conn.dataset.server = String(msg.server ?? "");
    }
    store.apply(msg);
    alertsView.onMessage(msg);
    replayBar.onMessage(msg);
  },
  onState: (s, detail) => {
    if (s === "open") store.beginSync(null); // the server lists its runs, then sends their snapshots
    setConnState(s, detail);
  },
});

// ---- test and debugging hooks (docs/dashboard.md) ---------------------------------------------

window.vdl = {
  /** Map of scalar tag -> uPlot instance (rebuilt when its line set changes: read it fresh). */
  get charts() {
    const map = new Map();
    for (const [tag, chart] of views.scalars.charts) if (chart.plot) map.set(tag, chart.plot);
    return map;
  },
  /** The chart wrappers (`Chart`) by tag, with `.renders`, `.zoom`, `.element`. */
  get chartWrappers() {
    return views.scalars.charts;
  },
  /** Raw received points of one series (not downsampled), as plain arrays. */
  series(run, tag) {
    const s = store.series(run, tag);
    if (!s) return { steps: [], values: [], walls: [] };
    return { steps: Array.from(s.column(STEP)), values: Array.from(s.column(VALUE)), walls: Array.from(s.column(WALL)) };
  },
  /** Run names seen (announced or with data), sorted. */
  runs: () => [...new Set([...store.announced, ...store.runNames()])].sort(),
  /** Telemetry charts: Map of metric (`gpu/util`, `cpu/percent`, ...) -> uPlot instance. */
  get systemCharts() {
    const map = new Map();
    for (const [metric, chart] of views.system.charts) if (chart.plot) map.set(metric, chart.plot);
    return map;
  },
  /** Show or hide a view: `scalars`, `system`, `histograms`, `images`, `text`, `curves`, `hparams`. */
  showView(name, shown = true) {
    if (shown) state.views.add(name);
    else state.views.delete(name);
    showViews();
  },
  /** Histogram display: "ridgeline" or "heatmap". */
  setHistogramMode: (mode) => views.histograms.setMode(mode),
  /** Scalar tags seen, sorted. */
  tags: () => store.scalarTags(),
  get connected() {
    return connection.connected;
  },
  get paused() {
    return state.paused;
  },
  setPaused,
  /** Draw every chart now, including those scrolled out of view (before a full-page screenshot). */
  drawAll: () => scheduler.drawAll(),
  /** Connection counters: frames, badFrames, reconnects, gaps, sockets (WebSockets opened), draws. */
  get stats() {
    return { ...connection.stats, ...scheduler.stats };
  },
  /** Alerts: `list()` newest first, `book` (acknowledge, mute), `toasts.shown`. */
  alerts: {
    list: () => alertsView.book.all(),
    book: alertsView.book,
    toasts,
    /** Markers drawn on the scalar chart of `tag` at its last draw. */
    markers: (tag) => views.scalars.charts.get(tag)?.alertMarkers ?? 0,
  },
  state,
  store,
  connection,
  /** The frame scheduler; `vdl.scheduler.minInterval` (ms, default 100) caps the redraw rate. */
  scheduler,
  setLanguage,
  /** Replay controls (only active under `vdl-stream replay`): status, play, pause, setSpeed, seek. */
  replay: replayBar.hook(),
  /** Loading state: `{phase: "connecting"|"loading"|"ready", total, done}` (snapshots of runs). */
  get sync() {
    return store.syncState();
  },
};

// Escape releases a pinned cursor.
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") for (const group of syncGroups.values()) if (group.x !== null) group.set(null);
});

onLanguage(relabel);
relabel();
connection.start();
