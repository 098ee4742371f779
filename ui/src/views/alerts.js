// Alerts (docs/alerts.md): the broker's detectors and `writer.alert()` record `alert` events in the
// run; they reach the page in `snapshot` and `data` frames like any event. `AlertBook` keeps them
// per run with what the user acknowledged or muted (no DOM); `AlertsView` is the panel (per run,
// newest first), raises a toast for each new one, and gives the charts their markers.
import { colorFor, el } from "../dom.js";
import { t, tf } from "../i18n.js";

/** Alerts kept per run (oldest dropped first); the server's rate limit keeps them few anyway. */
export const ALERTS_PER_RUN = 500;
const STORAGE_KEY = "vdl-stream.alerts";
/** Marker colours by level. */
export const LEVEL_COLORS = { info: "#1f77b4", warn: "#ff7f0e", error: "#d62728" };

/** The identity of an alert: the same alert in a snapshot and in a data frame is one. */
export function alertKey(run, ev) {
  return `${run}\u0000${ev.wall}\u0000${ev.rule}\u0000${ev.series ?? ""}`;
}

/** What mute applies to: one rule on one tag (or the whole run) of one run. */
export function muteKey(run, ev) {
  return `${run}\u0000${ev.rule}\u0000${ev.series ?? ""}`;
}

/**
 * The x of each marker on a chart of `tag`: alerts about that tag and alerts about the whole run
 * (stall, crash, training code's own), of runs `shown`, not muted.
 * @param {AlertBook} book
 * @param {string} tag
 * @param {"step"|"relative"|"wall"} xKind
 * @param {(run: string) => boolean} shown
 * @param {(run: string) => number} firstWall the origin of relative time of a run on that chart
 * @returns {{x: number, level: string, run: string}[]}
 */
export function markersFor(book, tag, xKind, shown, firstWall = () => NaN) {
  const out = [];
  for (const [run, list] of book.runs) {
    if (!shown(run)) continue;
    for (const a of list) {
      if (a.series !== null && a.series !== undefined && a.series !== tag) continue;
      if (book.isMuted(run, a)) continue;
      let x;
      if (xKind === "step") x = a.step;
      else if (xKind === "wall") x = a.wall;
      else x = a.wall - firstWall(run);
      if (typeof x === "number" && Number.isFinite(x)) out.push({ x, level: a.level, run });
    }
  }
  return out;
}

/** Alerts per run, with acknowledgements and mutes kept in localStorage. No DOM. */
export class AlertBook {
  constructor(storage = globalThis.localStorage) {
    /** @type {Map<string, object[]>} run -> alerts in arrival order */
    this.runs = new Map();
    this._keys = new Set();
    this._storage = storage;
    const saved = this._load();
    this.acked = new Set(saved.acked ?? []);
    this.muted = new Set(saved.muted ?? []);
  }

  /**
   * Take the alert events of a frame; return the new ones (for toasts when `live`).
   * @param {object} msg a decoded `snapshot` or `data` frame
   */
  take(msg) {
    const fresh = [];
    for (const ev of msg.events ?? []) {
      if (ev.kind !== "alert") continue;
      const key = alertKey(msg.run, ev);
      if (this._keys.has(key)) continue;
      this._keys.add(key);
      const alert = { ...ev, run: msg.run, key, receivedAt: Date.now() };
      let list = this.runs.get(msg.run);
      if (!list) this.runs.set(msg.run, (list = []));
      list.push(alert);
      if (list.length > ALERTS_PER_RUN) this._keys.delete(list.shift().key);
      fresh.push(alert);
    }
    return fresh;
  }

  /** Every alert, newest first (by wall time). */
  all() {
    return [...this.runs.values()].flat().sort((a, b) => b.wall - a.wall);
  }

  isAcked(alert) {
    return this.acked.has(alert.key);
  }

  isMuted(run, alert) {
    return this.muted.has(muteKey(run, alert));
  }

  /** Acknowledge (or un-acknowledge) one alert. */
  acknowledge(alert, on = true) {
    if (on) this.acked.add(alert.key);
    else this.acked.delete(alert.key);
    this._save();
  }

  /** Mute (or unmute) the alert's rule on its tag of its run: no toasts, no markers. */
  mute(alert, on = true) {
    const key = muteKey(alert.run, alert);
    if (on) this.muted.add(key);
    else this.muted.delete(key);
    this._save();
  }

  /** Alerts neither acknowledged nor muted. */
  unread() {
    return this.all().filter((a) => !this.isAcked(a) && !this.isMuted(a.run, a));
  }

  _load() {
    try {
      return JSON.parse(this._storage?.getItem(STORAGE_KEY) ?? "{}") ?? {};
    } catch {
      return {};
    }
  }

  _save() {
    try {
      // Bounded: only the newest acknowledgements are kept.
      const acked = [...this.acked].slice(-5000);
      this._storage?.setItem(STORAGE_KEY, JSON.stringify({ acked, muted: [...this.muted] }));
    } catch {
      // ignore: storage disabled or full
    }
  }
}

/** The title of an alert in the page's language: by rule, with the tag it is about. */
export function alertTitle(alert) {
  if (alert.rule === "user") return alert.title;
  const name = t(`alert_${alert.rule}`);
  const known = name !== `alert_${alert.rule}`;
  const head = known ? name : alert.title;
  return known && alert.series ? `${head}: ${alert.series}` : head;
}

export class AlertsView {
  /**
   * @param {object} ctx shared page context: `store`, `scheduler`, `state`, `shown`
   * @param {object} opts
   * @param {import("../toast.js").Toasts} opts.toasts where new alerts are announced
   * @param {() => void} opts.onChange called when markers change (the charts redraw)
   */
  constructor(ctx, { toasts, onChange }) {
    this.ctx = ctx;
    this.book = new AlertBook();
    this.toasts = toasts;
    this.onChange = onChange;
    this.empty = el("p", { class: "empty", text: t("noAlerts") });
    this.list = el("div", { class: "alert-runs" });
    this.element = el("div", { class: "view alerts" }, this.empty, this.list);
    this.element.classList.add("none");
    this.render = () => this._render();
  }

  /** Feed every frame of the connection here. */
  onMessage(msg) {
    // A split snapshot's events (alerts among them) come in `snapshot_events` (docs/protocol.md).
    if (msg.type !== "snapshot" && msg.type !== "data" && msg.type !== "snapshot_events") return;
    const fresh = this.book.take(msg);
    if (!fresh.length) return;
    // A snapshot brings history: only alerts that arrive live are announced.
    if (msg.type === "data") {
      for (const a of fresh) {
        if (this.book.isMuted(a.run, a)) continue;
        this.toasts.show({
          title: `${alertTitle(a)} — ${a.run}`,
          body: a.message,
          level: a.level,
          onClick: () => this.element.scrollIntoView({ block: "start" }),
        });
      }
    }
    this._render();
    this.onChange?.();
  }

  /** Apply the run toggles. */
  refresh() {
    this._render();
  }

  relabel() {
    this.empty.textContent = t("noAlerts");
    this._render();
  }

  _render() {
    const byRun = new Map();
    for (const a of this.book.all()) {
      if (!this.ctx.shown(a.run, a.series ?? "")) continue;
      if (!byRun.has(a.run)) byRun.set(a.run, []);
      byRun.get(a.run).push(a);
    }
    this.empty.hidden = byRun.size > 0;
    this.element.classList.toggle("none", this.book.runs.size === 0);
    this.list.replaceChildren(
      ...[...byRun.keys()].sort().map((run) => {
        const alerts = byRun.get(run);
        const open = alerts.filter((a) => !this.book.isAcked(a) && !this.book.isMuted(run, a)).length;
        return el(
          "section",
          { class: "chart alert-run", dataset: { run } },
          el(
            "header",
            {},
            el("i", { class: "swatch", style: { background: colorFor(run) } }),
            el("span", { class: "chart-title", text: run, title: run }),
            el("span", { class: "run-label", text: tf("alertsOpen", { open, total: alerts.length }) }),
          ),
          el("ol", { class: "alert-list" }, ...alerts.map((a) => this._item(a))),
        );
      }),
    );
  }

  _item(a) {
    const acked = this.book.isAcked(a);
    const muted = this.book.isMuted(a.run, a);
    const when = new Date(a.wall * 1000).toLocaleTimeString();
    const step = a.step === null || a.step === undefined ? "" : ` · ${t("step")} ${a.step}`;
    return el(
      "li",
      { class: `alert-item${acked ? " acked" : ""}${muted ? " muted" : ""}`, dataset: { level: a.level, rule: a.rule } },
      el("span", { class: "alert-level", text: t(`level_${a.level}`) }),
      el("span", { class: "alert-title", text: alertTitle(a) }),
      el("span", { class: "alert-when", text: `${when}${step}` }),
      el("span", { class: "alert-message", text: a.message }),
      el(
        "span",
        { class: "alert-actions" },
        el("button", {
          type: "button",
          class: "icon alert-ack",
          text: acked ? t("alertUnack") : t("alertAck"),
          on: { click: () => (this.book.acknowledge(a, !acked), this._render()) },
        }),
        el("button", {
          type: "button",
          class: "icon alert-mute",
          text: muted ? t("alertUnmute") : t("alertMute"),
          title: t("alertMuteHint"),
          on: { click: () => (this.book.mute(a, !muted), this._render(), this.onChange?.()) },
        }),
      ),
    );
  }

  /** The chart marker hook (ui/src/chart.js `chartHooks.draw`): vertical lines at alerts. */
  drawMarkers(chart, u) {
    if (!["step", "wall", "relative"].includes(chart.xKind) || this.book.runs.size === 0) return;
    const store = this.ctx.store;
    const markers = markersFor(
      this.book,
      chart.key,
      chart.xKind,
      (run) => this.ctx.shown(run, chart.key),
      (run) => store.series(run, chart.key)?.firstWall ?? NaN,
    );
    const { top, height } = u.bbox;
    const { min, max } = u.scales.x;
    const ctx = u.ctx;
    let drawn = 0;
    ctx.save();
    ctx.setLineDash([4, 3]);
    ctx.lineWidth = 1.5 * (devicePixelRatio || 1);
    for (const m of markers) {
      if (!(m.x >= min && m.x <= max)) continue;
      const x = Math.round(u.valToPos(m.x, "x", true));
      ctx.strokeStyle = LEVEL_COLORS[m.level] ?? LEVEL_COLORS.warn;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.fillStyle = ctx.strokeStyle;
      ctx.beginPath();
      ctx.moveTo(x - 5, top);
      ctx.lineTo(x + 5, top);
      ctx.lineTo(x, top + 8);
      ctx.fill();
      drawn++;
    }
    ctx.restore();
    chart.alertMarkers = drawn;
  }
}
