// Page entry point: builds the layout, wires the connection to the store and the store to the
// views, and exposes `window.vdl` for tests and the curious (documented in docs/dashboard.md).
// First import: it opens the /ws/live socket before any other module is evaluated.
import { earlySocket, LIVE_URL, token } from "./earlysocket.js";
import "uplot/dist/uPlot.min.css";
import "./style.css";
import { Connection } from "./connection.js";
import { chartHooks, SyncGroup } from "./chart.js";
import { colorFor, el } from "./dom.js";
import { FrameScheduler, loadingDelay } from "./frames.js";
import { deriveSummary, pointsFor, RunsModel, SELECT_ALL_UP_TO } from "./runs.js";
import { sameSubscription } from "./runsdefault.js";
import { RunsTable } from "./views/runstable.js";
import { initLanguage, language, LANGUAGES, loadingText, onLanguage, setLanguage, t, tf } from "./i18n.js";
import { DEFAULT_SMOOTHING } from "./smoothing.js";
import { STEP, Store, VALUE, WALL } from "./store.js";
import { icon } from "./icons.js";
import { Report } from "./report.js";
import { rememberKey, Remembered } from "./remember.js";
import { BADGE_TEXT, badgeState, ReplayBar } from "./views/replay.js";
import { ScalarsView } from "./views/scalars.js";
import { AlertsView } from "./views/alerts.js";
import { PendingView } from "./views/pending.js";
import { Toasts } from "./toast.js";

initLanguage();

/** History points per tag asked for in snapshots (`max_points` of `subscribe`). */
const MAX_POINTS = 2000;
const store = new Store({ maxPoints: MAX_POINTS });
// Charts redraw at most once per animation frame and at most 10 times a second: curves read just
// as live, and with 20 charts on screen the browser spends most of a frame compositing canvases.
const NORMAL_REDRAW_MS = 100;
const LOADING_REDRAW_MS = 1000;
// A redraw while many snapshots load strokes every line as the final one does (150-350 ms of the
// main thread for 100 runs on five charts): when the rest is due within this, it waits for them
// (the redraw at 1 s of a selection that ends at 1.1 s only put the final one off by its cost),
// but never past twice LOADING_REDRAW_MS from the last redraw.
const LOADING_WAIT_MS = 500;
// The first redraw of a selection of many runs waits for the whole load up to this long (the
// "Loading k/N" note counts meanwhile): 100 runs load in 1-2.5 s on a busy two-core machine, and a
// partial redraw at 1 s (uPlot's paths and strokes for every line in so far, on each chart on
// screen, then its canvases committed) ran on the main thread beside the server's reads, to be
// stroked again by the final one (frames.js, loadingDelay; docs/performance.md, h10-select).
const LOADING_FIRST_DRAW_MS = 2000;
// Drawing takes at most a quarter of the time: with many live runs, a frame that took 60 ms to
// draw is followed by 240 ms without drawing (frames.js), however slow the machine.
const DRAW_BUDGET = 0.25;
const scheduler = new FrameScheduler({ minInterval: NORMAL_REDRAW_MS, budget: DRAW_BUDGET });
const state = {
  xKind: "step",
  logY: false,
  smoothing: DEFAULT_SMOOTHING,
  filter: null,
  hiddenRuns: new Set(),
  paused: false,
  /** Views shown on the page (`vdl.showView` toggles them; the header's buttons scroll to them). */
  views: new Set(["alerts", "scalars", "system", "histograms", "images", "text", "curves", "hparams", "graph", "embeddings"]),
};
const syncGroups = new Map();
// The runs table's model: selection, pins, hidden runs, filters, grouping (see runs.js).
const runsModel = new RunsModel();
runsModel.derive = (name) => deriveSummary(store, name);
const ctx = {
  runs: runsModel,
  /** Call after changing the runs model (a brush): redraw, and re-subscribe to the runs drawn. */
  onRunsChanged: () => applyRuns(),
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

// Page order: alerts, then training curves, then the system charts right under them, then the
// views of laterviews.js: each holds its place (a PendingView) until that module is loaded
// (loadLaterViews), when the view takes it.
const views = {
  alerts: alertsView,
  scalars: new ScalarsView(ctx),
};
for (const name of ["system", "histograms", "images", "text", "curves", "hparams", "graph", "embeddings"]) views[name] = new PendingView(name);
// Model graph (issue 15): `graph` events are taken from the connection's frames, not the store;
// those that come before the view is loaded wait for it here.
let graphView = null;
const graphFrames = [];
// Shown only under `vdl-stream replay`: the server's first `replay` frame shows it.
const replayBar = new ReplayBar(ctx);
replayBar.onChange = () => showBadge();
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
// A mouse wheel scrolls the view buttons sideways when they run past the header's edge.
tabs.addEventListener("wheel", (e) => {
  if (tabs.scrollWidth <= tabs.clientWidth || Math.abs(e.deltaX) > Math.abs(e.deltaY)) return;
  tabs.scrollLeft += e.deltaY;
  e.preventDefault();
}, { passive: false });
// On a phone the settings panel is folded away behind this button.
const menuBtn = el("button", { type: "button", class: "menu", "aria-label": "Settings / 设置", text: "☰", on: { click: () => document.body.classList.toggle("show-side") } });
const filterInput = el("input", { type: "search", class: "filter", spellcheck: "false", on: { input: onFilter } });
const filterError = el("span", { class: "filter-error", role: "alert", hidden: true });
const smoothingInput = el("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(state.smoothing), on: { input: onSmoothing } });
const smoothingValue = el("output", { text: state.smoothing.toFixed(2) });
const xSelect = el("select", { class: "xkind", on: { change: (e) => updateSetting({ xKind: e.target.value }) } });
const logInput = el("input", { type: "checkbox", class: "logy", on: { change: (e) => updateSetting({ logY: e.target.checked }) } });
const runsTable = new RunsTable({ model: runsModel, onChange: (how) => applyRuns(true, how?.immediate), scheduler });
const labels = {};
const label = (key) => (labels[key] = el("span", { text: t(key) }));

const side = el(
  "aside",
  { class: "side" },
  el("label", { class: "field" }, label("tagFilter"), filterInput, filterError),
  el("label", { class: "field" }, label("smoothing"), el("span", { class: "row" }, smoothingInput, smoothingValue)),
  el("label", { class: "field" }, label("xAxis"), xSelect),
  el("label", { class: "check" }, logInput, label("logY")),
  runsTable.element,
);
// ---- header: badge, buttons that scroll to a view, report (issue 12, items 6-7) ------------------

const report = new Report(ctx, views);
const reportLabel = el("span", { class: "report-label" });
const reportBtn = el(
  "button",
  // The report lists and prints every view: the later views are loaded first.
  { type: "button", class: "report-btn", on: { click: () => (report.panel.hidden ? loadLaterViews().then(() => report.open()) : report.close()) } },
  icon("report"),
  reportLabel,
);
const main = el("main", {}, report.head, ...Object.values(views).map((v) => v.element));
const header = el("header", { class: "top" }, menuBtn, el("h1", { text: "vdl-stream" }), conn, syncNote, tabs, el("span", { class: "spacer" }), reportBtn, pauseBtn, langSelect, replayBar.element, report.panel);
document.body.replaceChildren(header, el("div", { class: "layout" }, side, main), toasts.element);
// The sticky sidebar and a view scrolled to start under the header, however tall it is.
new ResizeObserver(() => document.documentElement.style.setProperty("--header-h", `${header.offsetHeight}px`)).observe(header);

/** Scroll the page to a view (showing it first if `vdl.showView` hid it). */
function goToView(name) {
  // A view not loaded yet shows its loading note meanwhile, and is scrolled to again once loaded:
  // only if it is still the view last asked for and the page is still where it was taken (one
  // the user scrolled elsewhere meanwhile must not be pulled back when the views come in).
  if (views[name] instanceof PendingView) {
    loadLaterViews().then(() => {
      if (askedView === name && landing !== null && Math.abs(window.scrollY - landing) <= 2) goToView(name);
    });
  }
  if (!state.views.has(name)) {
    state.views.add(name);
    showViews();
  }
  document.body.classList.remove("show-side");
  askedView = name;
  landing = null;
  spySoon(); // at the page's end the page may not scroll at all
  const target = views[name].element;
  const root = document.documentElement;
  const wanted = window.scrollY + target.getBoundingClientRect().top - header.offsetHeight - 8;
  const end = Math.max(0, Math.min(wanted, root.scrollHeight - window.innerHeight));
  // Already there (a last view at the page's end): no scroll, so no scroll's end to wait for,
  // and a later scroll of the user's must not bring the page back.
  if (Math.abs(end - window.scrollY) <= 2) {
    landing = end;
    return;
  }
  target.scrollIntoView({ behavior: "smooth", block: "start" });
  landing = end;
  // Charts drawn for the first time on the way may move the target: land on it once more, unless
  // the scroll that ended is the user's, elsewhere (it ends the smooth one too, or comes after).
  window.addEventListener(
    "scrollend",
    () => {
      if (Math.abs(window.scrollY - end) > 2) return;
      if (Math.abs(target.getBoundingClientRect().top - header.offsetHeight - 8) > 2) target.scrollIntoView({ block: "start" });
    },
    { once: true },
  );
}

// The header marks the view at the top of the page (the last one whose title has passed under
// the header), checked once per frame while scrolling, and when the page is next idle after views
// are shown or hidden. Never read at once: the positions force a style and layout of the whole
// page, 70-220 ms while the bundle builds it on a cold load of 1,000 runs, which the next frame
// lays out again anyway. Nor in the next frame after the page was built: there the read forced
// the page's first full layout (~300 ms under load on a cold load of 1,000 runs) inside that
// frame's callbacks, before the runs table's and the charts' first renders, which change the
// page again. When the page is idle its layout is the last frame's, and reading it costs nothing
// (2 ms for the same reads).
// At the page's end the last views cannot reach the top: there the view last asked for by its
// button is marked while it is in sight, else the last view in sight (as a scroll-spy does).
const SPY_IDLE_TIMEOUT_MS = 2000;
/** The view whose button was last pressed (`goToView`). */
let askedView = null;
/** Where `goToView` took the page (its scroll's end), or null before it computed that. */
let landing = null;
let spyPending = false;
let spyIdlePending = false;
function spySoon() {
  if (!spyPending) {
    spyPending = true;
    requestAnimationFrame(spyViews);
  }
}
function spyWhenIdle() {
  if (spyIdlePending) return;
  spyIdlePending = true;
  whenIdle(() => {
    spyIdlePending = false;
    spyViews();
  }, SPY_IDLE_TIMEOUT_MS);
}

/** Call `fn` when the page is next idle, or after `timeoutMs` at the latest. */
function whenIdle(fn, timeoutMs) {
  if (typeof requestIdleCallback === "function") requestIdleCallback(fn, { timeout: timeoutMs });
  else setTimeout(fn, 0);
}
/** Whether some of `element` is in sight, below `below` px from the top. */
function inSight(element, below) {
  const box = element.getBoundingClientRect();
  return box.height > 0 && box.top < window.innerHeight && box.bottom > below;
}
function spyViews() {
  spyPending = false;
  const top = header.offsetHeight + 24; // views scroll to 8 px under the header
  let current = null;
  const shown = Object.entries(views).filter(([, view]) => !view.element.hidden);
  for (const [name, view] of shown) {
    if (current === null || view.element.getBoundingClientRect().top <= top) current = name;
  }
  const root = document.documentElement;
  if (shown.length && window.scrollY > 0 && window.innerHeight + window.scrollY >= root.scrollHeight - 2) {
    const asked = shown.find(([name]) => name === askedView);
    const last = shown.findLast(([, view]) => inSight(view.element, top));
    if (asked && inSight(asked[1].element, top)) current = askedView;
    else if (last) current = last[0];
  }
  for (const b of tabs.children) {
    const on = b.dataset.view === current;
    b.classList.toggle("active", on);
    if (on) b.setAttribute("aria-current", "true");
    else b.removeAttribute("aria-current");
  }
}
window.addEventListener("scroll", spySoon, { passive: true });

/** Show the badge: Live, Paused, Replay (· paused), or the connection's state. */
function showBadge() {
  const badge = badgeState(conn.dataset.state, state.paused, replayBar.playState());
  conn.dataset.badge = badge;
  conn.textContent = t(BADGE_TEXT[badge]);
}

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
      el("button", { type: "button", class: "tab", dataset: { view: name }, text: t(name), title: tf("goToView", { view: t(name) }), on: { click: () => goToView(name) } }),
    ),
  );
  reportLabel.textContent = t("exportReport");
  reportBtn.title = t("exportReport");
  report.relabel();
  if (filterError.textContent) onFilter();
  for (const [name, h] of Object.entries(viewTitles)) h.textContent = t(name);
  showViews();
  setConnState(conn.dataset.state);
  showSync();
  for (const view of Object.values(views)) view.relabel?.();
  runsTable.relabel();
  replayBar.relabel();
}

// A view that is not shown is display:none, so its charts are not drawn at all.
function showViews() {
  for (const [name, view] of Object.entries(views)) view.element.hidden = !state.views.has(name);
  spyWhenIdle();
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
    filterError.hidden = true;
    filterError.textContent = "";
  } catch (err) {
    // Say what is wrong (the engine's own words, e.g. "Unterminated group"); the last valid
    // filter stays in force.
    const message = tf("badRegexAt", { message: String(err.message).replace(/^Invalid regular expression: /, "") });
    filterInput.setCustomValidity(message);
    filterInput.title = message;
    filterError.textContent = message;
    filterError.hidden = false;
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
    rememberView();
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
  showBadge();
}

// ---- remembered across reloads (issue 12): selection, pins, hidden runs, groups, smoothing ------

const remembered = new Remembered(rememberKey(window.location));
const savedView = remembered.load();
/** The runs table's saved state, taken back at the first selection (onRunsKnown). */
let savedRuns = savedView?.runs ?? null;
{
  const w = savedView?.smoothing;
  if (typeof w === "number" && w >= 0 && w <= 0.99) {
    state.smoothing = w;
    store.setSmoothing(w);
    smoothingInput.value = String(w);
    smoothingValue.textContent = w.toFixed(2);
  }
}

/** Save what the page remembers (only once the first selection is made: not the defaults). */
function rememberView() {
  if (selectionMade) remembered.save({ runs: runsModel.saved(), smoothing: state.smoothing });
}

// ---- runs ---------------------------------------------------------------------------------------
// The runs table decides which runs are drawn; the page subscribes to those only (docs/dashboard.md,
// "Runs"). Views read `state.hiddenRuns`: every known run that is not drawn.

/** Whether the first selection was made (on the first `runs` frame, or its summaries). */
let selectionMade = false;
/** Waiting, after a socket opened, for the `runs` frame (and summaries) to subscribe. */
let awaitingSubscribe = false;
let summariesTimer = 0;
let subscribeTimer = 0;
let subscribedKey = null;
/** The subscription the server made from the first socket's URL (`hello`'s `subscribed`), until the first subscribe. */
let serverSubscribed = null;

/**
 * Apply the runs table's state: which runs are drawn (`state.hiddenRuns`), the table, the views and
 * (soon) the subscription. With `always` false (new summaries), the views are refreshed only when
 * the set of runs drawn changed.
 */
function applyRuns(always = true, immediate = false) {
  const hidden = new Set();
  for (const name of runsModel.names) if (!runsModel.isDrawn(name)) hidden.add(name);
  const changed = hidden.size !== state.hiddenRuns.size || [...hidden].some((name) => !state.hiddenRuns.has(name));
  state.hiddenRuns = hidden;
  setRedrawInterval();
  // New summaries (not the user's doing): the table is drawn with the charts' next frame.
  runsTable.update({ live: !always && !changed });
  if (always || changed) refreshViews();
  rememberView();
  // Re-subscribe once the user pauses (typing a filter changes the set on every key); after a
  // click (`immediate`) at once: the snapshots are what the user waits for. "At once" is the end
  // of the click's task (a microtask), not a timer: a timer of 0 ms ran after the frame the click
  // dirtied (the table's and the charts' layout: 50-200 ms before the server heard of 100 runs).
  clearTimeout(subscribeTimer);
  if (awaitingSubscribe) return;
  if (immediate) queueMicrotask(resubscribe);
  else subscribeTimer = setTimeout(resubscribe, 150);
}

function resubscribe() {
  if (!connection.connected || awaitingSubscribe) return;
  const runs = runsModel.subscription();
  const key = runs === null ? null : runs.join("\u0000");
  if (key === subscribedKey) return;
  sendSubscribe(runs);
}

function sendSubscribe(runs) {
  subscribedKey = runs === null ? null : runs.join("\u0000");
  awaitingSubscribe = false;
  clearTimeout(summariesTimer);
  // Fewer history points per run when many runs share the charts (the server answers faster).
  const points = pointsFor(runs === null ? runsModel.names.size : runs.length);
  connection.maxPoints = points;
  store.maxPoints = points;
  // `keep`: the runs already drawn stay; only the added ones are read and sent (docs/protocol.md).
  store.subscribeTo(runs, { keep: true });
  // The server subscribed the first socket to the default selection already (earlysocket.js):
  // when that is this one, its snapshots are on their way, and a subscribe would only repeat it.
  if (sameSubscription(serverSubscribed, runs, points)) connection.assume(runs);
  else connection.subscribe(runs, { keep: true });
  serverSubscribed = null;
}

// On the first `runs` frame: few runs are all selected at once; with many, the most recently active
// are chosen from the summaries that follow (or, from a server that sends none, by name).
function onRunsKnown(fromSummaries) {
  if (!awaitingSubscribe) return;
  if (!selectionMade && savedRuns !== null) {
    // The last visit's selection, when it names a run this server has (pins, hidden runs and
    // groups come back either way).
    const restored = runsModel.restore(savedRuns);
    savedRuns = null;
    runsTable.syncControls();
    if (restored) selectionMade = true;
  }
  if (!selectionMade) {
    if (runsModel.names.size > SELECT_ALL_UP_TO && !fromSummaries && runsModel.summaries.size === 0) {
      // Every server of this package sends the summaries right after the runs; this is for one
      // that sends none. Long enough for 1,000 runs' summaries on a busy machine (at 500 ms, a
      // page at load 20 chose the first ten runs by name before the most recent were known).
      summariesTimer ||= setTimeout(() => {
        summariesTimer = 0;
        onRunsKnown(true);
      }, SUMMARIES_WAIT_MS);
      return;
    }
    runsModel.selectDefault();
    selectionMade = true;
  }
  // Subscribe first: the server starts reading while the page draws the table (with the URL's
  // subscription, earlysocket.js, it started before the page was built).
  sendSubscribe(runsModel.subscription());
  applyRuns();
}

// Runs appear one by one (a `runs` frame of 1,000 names emits 1,000 changes): take them in one go.
let pendingNames = null;
function addRunNames(names) {
  if (pendingNames === null) {
    pendingNames = [];
    queueMicrotask(() => {
      const added = runsModel.addNames(pendingNames);
      pendingNames = null;
      if (added.length && selectionMade) runsModel.selectNew(added);
      if (added.length) applyRuns();
    });
  }
  pendingNames.push(...names);
}

store.subscribe((change) => {
  if (change.kind === "runs") {
    if (change.run !== null) {
      addRunNames([change.run]);
      return;
    }
    // The frame's list: known now, so that the first selection sees every run.
    const added = runsModel.addNames(store.announced);
    if (added.length && selectionMade) runsModel.selectNew(added);
    // Until the first subscribe the table waits: onRunsKnown subscribes, then builds it, so that
    // the server starts reading the first charts' runs before the page lays out 1,000 rows.
    if (added.length && !awaitingSubscribe) applyRuns();
    onRunsKnown(false);
  } else if (change.kind === "summaries") {
    const added = runsModel.updateSummaries(change.summaries);
    if (added.length && selectionMade) runsModel.selectNew(added);
    if (awaitingSubscribe) onRunsKnown(true);
    else applyRuns(false);
  } else if (change.kind === "hparams" || (change.kind === "scalars" && runsModel.summaries.size === 0)) {
    // The page's own data only shows in the table for runs without a complete server summary.
    if (change.run === null || !Object.keys(runsModel.summaries.get(change.run)?.hparams ?? {}).length) runsTable.update();
  }
});

// `body[data-sync]` is connecting, loading or ready (see Store.syncState): until ready, the other
// views do not claim to have nothing (style.css), and the scalars view says what it waits for.
function showSync(sync = store.syncState()) {
  document.body.dataset.sync = sync.phase;
  syncNote.hidden = sync.phase !== "loading";
  syncNote.textContent = sync.phase === "loading" ? tf("loadingShort", sync) : "";
  syncNote.title = sync.phase === "loading" ? loadingText(sync) : "";
}
showSync();
// While the snapshots of many runs stream in, every arriving run changes each chart's set of lines
// (a rebuild): redraw when the last one is in, or first after LOADING_FIRST_DRAW_MS and then at most
// once a second until it is.
let lastPhase = "connecting";
let loadingSince = -Infinity; // when the selection being loaded began
let loadingFrames = 0; // the scheduler's drawing frames then
scheduler.defer = (sinceDraw) => {
  const sync = store.syncState();
  if (sync.phase !== "loading" || sync.total <= SELECT_ALL_UP_TO) return 0;
  const load = {
    elapsedMs: performance.now() - loadingSince,
    sinceDrawMs: sinceDraw,
    done: sync.done,
    total: sync.total,
    drawn: scheduler.stats.frames > loadingFrames,
  };
  return loadingDelay(load, { firstMs: LOADING_FIRST_DRAW_MS, waitMs: LOADING_WAIT_MS, redrawMs: LOADING_REDRAW_MS });
};
// Meanwhile the charts on screen are drawn without those just below them (frames.js): these are
// drawn once, in the drawing frame after the last snapshot's.
scheduler.holdNear = () => {
  const sync = store.syncState();
  return sync.phase === "loading" && sync.total > SELECT_ALL_UP_TO;
};
store.subscribe((change) => {
  if (change.kind !== "sync") return;
  const sync = store.syncState();
  showSyncSoon(sync);
  setRedrawInterval(sync);
  // A new selection of many runs on a page that shows charts: they are redrawn once a second
  // from now, or when the last snapshot is in (often sooner), not first for the runs dropped and
  // the first run to arrive (each such frame strokes every line and commits the canvases).
  if (lastPhase === "ready" && sync.phase === "loading" && sync.total > SELECT_ALL_UP_TO) {
    scheduler.restart();
    loadingSince = performance.now();
    loadingFrames = scheduler.stats.frames;
  }
  lastPhase = sync.phase;
});

// The "Loading k/N" note follows the snapshots at most every SYNC_NOTE_MS: each change of it is a
// frame to lay out, paint and commit, and 100 snapshots arriving one by one made 100 of them while
// the page waited for the server (a change of phase still shows at once).
const SYNC_NOTE_MS = 250;
let syncNoteTimer = 0;
function showSyncSoon(sync) {
  if (sync.phase !== document.body.dataset.sync) {
    clearTimeout(syncNoteTimer);
    syncNoteTimer = 0;
    showSync(sync);
  } else {
    syncNoteTimer ||= setTimeout(() => {
      syncNoteTimer = 0;
      showSync();
    }, SYNC_NOTE_MS);
  }
}

// Charts redraw at most every 100 ms with up to 20 runs drawn, every 250 ms up to 50, every 500 ms
// beyond (each redraw strokes every line), and once a second while many snapshots stream in.
function setRedrawInterval(sync = store.syncState()) {
  const loading = sync.phase === "loading" && sync.total > SELECT_ALL_UP_TO;
  const drawn = runsModel.names.size - state.hiddenRuns.size;
  const interval = loading ? LOADING_REDRAW_MS : drawn <= SELECT_ALL_UP_TO ? NORMAL_REDRAW_MS : drawn <= 50 ? 250 : 500;
  if (interval === scheduler.minInterval) return;
  const sooner = interval < scheduler.minInterval;
  scheduler.minInterval = interval;
  if (sooner) scheduler.flush();
}

// ---- connection ---------------------------------------------------------------------------------

function setConnState(s, detail = "") {
  conn.dataset.state = s;
  conn.title = detail;
  showBadge();
}

/** The most the page's first charts hold the frames behind their snapshots back (holdForFirstCharts). */
const FIRST_CHARTS_HOLD_MS = 1000;
let firstChartsHeld = false;
// Once the last scalars frame of the page's first snapshots is in, the frames after it (a split
// snapshot's events frame: histograms, images, telemetry; 0.2-0.3 s to decode and store for a 1 h
// run) wait until the charts are drawn, instead of landing between that frame and the two frames
// that lay the charts out and draw them (docs/performance.md, "h12-page"). They are taken after
// the frame that follows the drawing one, which draws the charts just below the view (frames.js).
function holdForFirstCharts() {
  const charts = views.scalars.charts;
  const drawn = () => [...charts.values()].some((chart) => chart.renders > 0);
  if (firstChartsHeld || charts.size === 0 || drawn() || store.syncState().phase !== "ready") return;
  firstChartsHeld = true;
  const release = connection.hold();
  // The limit is a timer of its own, not afterDraw's: a page in a background tab gets no
  // animation frames, so neither the draw nor the frame after it would come.
  const timer = setTimeout(release, FIRST_CHARTS_HOLD_MS);
  scheduler.afterDraw(
    () =>
      requestAnimationFrame(() => {
        clearTimeout(timer);
        release();
      }),
    Infinity,
    drawn,
  );
}

/** How long the first selection waits for the summaries (the most recently active runs). */
const SUMMARIES_WAIT_MS = 3000;
/** The /ws/live protocol version this page implements (docs/protocol.md). */
const PROTOCOL_VERSION = 1;
const connection = new Connection({
  maxPoints: MAX_POINTS,
  autoSubscribe: false,
  url: LIVE_URL,
  onMessage: (msg) => {
    if (msg.type === "hello") {
      if (msg.version !== PROTOCOL_VERSION) console.warn(`vdl-stream: server speaks protocol ${msg.version}, this page ${PROTOCOL_VERSION}`);
      conn.dataset.server = String(msg.server ?? "");
      serverSubscribed = msg.subscribed ?? null;
    }
    store.apply(msg);
    if (msg.type === "snapshot") holdForFirstCharts();
    alertsView.onMessage(msg);
    if (graphView !== null) graphView.onMessage(msg);
    else if (Array.isArray(msg.events) && msg.events.some((ev) => ev?.kind === "graph")) graphFrames.push(msg);
    replayBar.onMessage(msg);
  },
  onState: (s, detail) => {
    if (s === "open") {
      // The server lists its runs (and their summaries), then waits for the page's subscribe.
      store.beginSync(null);
      awaitingSubscribe = true;
      subscribedKey = undefined;
    }
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
    for (const [metric, chart] of views.system.charts ?? []) if (chart.plot) map.set(metric, chart.plot);
    return map;
  },
  /** PR/ROC charts: Map of `pr_curve:<tag>` / `roc_curve:<tag>` -> uPlot instance. */
  get curveCharts() {
    const map = new Map();
    for (const [key, card] of views.curves.cards ?? []) if (card.chart.plot) map.set(key, card.chart.plot);
    return map;
  },
  /** The colour of a run's lines, swatches and legends (the same in every view). */
  runColor: (run) => colorFor(run),
  /** Show or hide a view: `scalars`, `system`, `histograms`, `images`, `text`, `curves`, `hparams`. */
  showView(name, shown = true) {
    if (shown && views[name] instanceof PendingView) loadLaterViews();
    if (shown) state.views.add(name);
    else state.views.delete(name);
    showViews();
  },
  /** Histogram display: "ridgeline" or "heatmap" (a promise: the view may load first). */
  setHistogramMode: (mode) => loadLaterViews().then(() => views.histograms.setMode(mode)),
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
  /** The runs table's model: `.selected`, `.pinned`, `.hidden`, `.summaries`, `subscription()`, ... */
  runsModel,
  /** The runs table (`render()` draws it now). */
  runsTable,
  /** The frame scheduler; `vdl.scheduler.minInterval` (ms, default 100) caps the redraw rate. */
  scheduler,
  setLanguage,
  /** Export report: `preparePrint(views)`/`finishPrint()` around a print, `png(views)`, `meta()`, `open()`. */
  report: report.hook(),
  /** Scroll to a view, as its header button does. */
  goToView,
  /**
   * Model graph: `keys()`, `boxes()`, `toggle(path)`, `expandAll()`, `matches()`, `stats`
   * (docs/dashboard.md). Until the view is loaded it answers as a graph view holding nothing does.
   */
  get graph() {
    return laterHook("graph", GRAPH_PENDING);
  },
  /** Replay controls (only active under `vdl-stream replay`): status, play, pause, setSpeed, seek. */
  replay: replayBar.hook(),
  /** The embeddings projector: `state()`, `pointOnPage(i)`, `setMethod(m)`, ... (as `graph` until loaded). */
  get embeddings() {
    return laterHook("embeddings", EMBEDDINGS_PENDING);
  },
  /** The views below the first charts: `state` ("pending", "loading", "loaded"), `load()` (a promise). */
  laterViews: {
    get state() {
      return laterState;
    },
    load: () => loadLaterViews(),
  },
  /** Loading state: `{phase: "connecting"|"loading"|"ready", total, done}` (snapshots of runs). */
  get sync() {
    return store.syncState();
  },
};

// Escape releases a pinned cursor (and closes the report panel).
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") for (const group of syncGroups.values()) if (group.x !== null) group.set(null);
  if (e.key === "Escape") report.close();
});

onLanguage(relabel);
relabel();
connection.start({ socket: earlySocket });

// ---- the views below the first charts (laterviews.js) -------------------------------------------
// A first load evaluates only what its first view needs: the module of the other views (67 of the
// bundle's 274 KB: the graph's layout, the projector, the sweep panels, the histograms' drawing,
// ...) is imported once the first scalar charts are drawn, when the page is next idle; at once
// when one of those views is opened (goToView, showView, the report); when the first snapshots
// are in and there is no scalar chart to draw; and LATER_VIEWS_MS after the script ran at the
// latest (a page in a background tab draws nothing), which also bounds what graphFrames holds.
const LATER_VIEWS_MS = 5000;
const LATER_IDLE_TIMEOUT_MS = 1000;
/** "pending", "loading" or "loaded" (`vdl.laterViews.state`). */
let laterState = "pending";
let laterViews = null;
const laterTimer = setTimeout(() => loadLaterViews(), LATER_VIEWS_MS);

/**
 * Import laterviews.js and put its views in their places (once; a failed import is tried again
 * at the next call).
 * @returns {Promise<void>} settled once the views are on the page
 */
function loadLaterViews() {
  clearTimeout(laterTimer);
  if (laterViews !== null) return laterViews;
  laterState = "loading";
  laterViews = import("./laterviews.js").then(
    ({ buildLaterViews }) => {
      const built = buildLaterViews(ctx);
      for (const [name, view] of Object.entries(built)) {
        const pending = views[name];
        view.element.prepend(viewTitles[name]);
        view.element.dataset.view = name;
        view.element.hidden = pending.element.hidden;
        pending.element.replaceWith(view.element);
        views[name] = view;
        view.refresh?.();
      }
      graphView = built.graph;
      for (const msg of graphFrames.splice(0)) graphView.onMessage(msg);
      laterState = "loaded";
      spyWhenIdle();
    },
    (err) => {
      console.error("vdl-stream: the views below the charts did not load:", err);
      laterState = "pending";
      laterViews = null;
    },
  );
  return laterViews;
}

const loadLaterWhenIdle = () => whenIdle(() => loadLaterViews(), LATER_IDLE_TIMEOUT_MS);
scheduler.afterDraw(loadLaterWhenIdle, Infinity, () => [...views.scalars.charts.values()].some((chart) => chart.renders > 0));
store.subscribe((change) => {
  if (laterViews === null && change.kind === "sync" && store.syncState().phase === "ready" && views.scalars.charts.size === 0) loadLaterWhenIdle();
});

// What `vdl.graph` and `vdl.embeddings` answer before their view is loaded (laterHook).
const GRAPH_PENDING = {
  keys: () => [],
  boxes: () => [],
  edges: () => 0,
  expanded: () => [],
  matches: () => [],
  selected: () => null,
  scale: () => 1,
  stats: Object.freeze({ layouts: 0, draws: 0, receivedAt: null, firstDrawAt: null, lastLayoutMs: 0, lastDrawMs: 0 }),
};
const EMBEDDINGS_PENDING = {
  state: () => ({ run: null, tag: null, step: null, n: 0, d: 0, method: "pca", phase: "idle", shown: false, epoch: 0, epochs: 0, done: false, ms: 0, timings: {}, matches: null, hover: null, tip: null, costs: {} }),
  pointOnPage: () => null,
  labelOf: () => [],
};

/**
 * The `vdl` hook of a later view: the view's own once loaded; before, `pending`'s answers, and
 * for anything else (an action) a function that loads the view, then calls the view's.
 */
function laterHook(name, pending) {
  if (!(views[name] instanceof PendingView)) return views[name].hook();
  return new Proxy(pending, {
    get: (target, key) => (key in target ? target[key] : (...args) => loadLaterViews().then(() => views[name].hook()[key](...args))),
  });
}
