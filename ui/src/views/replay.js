// The replay bar: play/pause, speed and a scrubber over the recorded time range, shown only when the
// page is served by `vdl-stream replay`. It never asks for the status: the server pushes it on
// /ws/live as `replay` frames (one right after subscribing, then one whenever it changes), and the
// bar moves the scrubber on by the speed in between. A page served by `vdl-stream serve` gets no
// such frame, so the bar stays hidden and nothing is requested. Commands are POST /api/replay. A
// seek needs nothing from the bar: the server announces it on the same socket (a `reset` frame and
// fresh snapshots, applied by the store), so the socket stays open.
import { formatDuration } from "../chart.js";
import { decodeReplayStatus } from "../decode.js";
import { el } from "../dom.js";
import { t } from "../i18n.js";
import { STEP } from "../store.js";

/** Positions of the scrubber (`input.replay-scrub` runs from 0 to this): 0.01% of the run each. */
export const SCRUB_MAX = 10_000;
/** Speeds offered (recorded seconds per real second); the server's own speed is added if missing. */
export const SPEEDS = [1, 10, 100, 1000, "max"];
/** How often the bar is redrawn while playing (ms), moving the position on by the speed. */
const TICK_MS = 250;
/** Keyboard seeks (one per arrow key press) are coalesced over this many milliseconds. */
const SEEK_DEBOUNCE_MS = 150;

/** An error answer of POST /api/replay: `status` is the HTTP status (0: no answer). */
export class ReplayError extends Error {
  constructor(message, status) {
    super(message);
    this.name = "ReplayError";
    this.status = status;
  }
}

/**
 * Send one command to POST /api/replay (docs/interop.md).
 * @param {object} command the JSON body, e.g. `{action: "seek", wall: 1700000000.5}`
 * @param {object} [opts]
 * @param {string|null} [opts.token] sent as a Bearer token, as every API request of the page
 * @param {typeof fetch} [opts.fetchImpl] injectable for tests
 * @returns {Promise<ReturnType<typeof decodeReplayStatus>>} the status after the command
 * @throws {ReplayError} an HTTP error (with the server's message), or no answer (status 0)
 */
export async function replayCommand(command, { token = null, fetchImpl = fetch } = {}) {
  const headers = { "Content-Type": "application/json", ...(token ? { Authorization: `Bearer ${token}` } : {}) };
  let response;
  try {
    response = await fetchImpl("/api/replay", { method: "POST", headers, body: JSON.stringify(command), cache: "no-store" });
  } catch (err) {
    throw new ReplayError(`/api/replay: ${err?.message ?? err}`, 0);
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: reported by status below
  }
  if (!response.ok) throw new ReplayError(typeof body?.error === "string" ? body.error : `/api/replay answered ${response.status}`, response.status);
  try {
    return decodeReplayStatus(body);
  } catch (err) {
    throw new ReplayError(`/api/replay: ${err.message}`, response.status);
  }
}

/**
 * Which of two statuses is current: a command's answer and a pushed `replay` frame can cross on
 * their way, so the one with the higher `version` wins (the incoming one on a tie).
 * @param {ReturnType<typeof decodeReplayStatus>|null} current
 * @param {ReturnType<typeof decodeReplayStatus>} incoming
 */
export function newerStatus(current, incoming) {
  return current === null || incoming.version >= current.version ? incoming : current;
}

/**
 * The scrubber value (an integer in [0, max]) for a recorded wall time.
 * @param {number} wall
 * @param {number} start first recorded wall time
 * @param {number} end last recorded wall time
 */
export function scrubValue(wall, start, end, max = SCRUB_MAX) {
  if (!(end > start)) return wall >= end ? max : 0;
  const f = (wall - start) / (end - start);
  return Math.round(Math.min(1, Math.max(0, f)) * max);
}

/**
 * The recorded wall time for a scrubber value (clamped to [0, max]).
 * @param {number} value
 * @param {number} start
 * @param {number} end
 */
export function scrubWall(value, start, end, max = SCRUB_MAX) {
  const f = Math.min(max, Math.max(0, Number(value) || 0)) / max;
  return start + f * Math.max(0, end - start);
}

/**
 * Where a replay stands `elapsed` real seconds after `status` was received: it moves on by the
 * speed while playing (up to the end); at speed "max" the status's position is kept until the next
 * one (the server pushes one a second while playing).
 * @param {ReturnType<typeof decodeReplayStatus>} status
 * @param {number} elapsed seconds
 */
export function estimatePosition(status, elapsed) {
  if (!status.playing || status.finished || status.speed === "max") return status.position;
  return Math.min(status.end, status.position + Math.max(0, elapsed) * status.speed);
}

/**
 * The speeds to offer: SPEEDS, plus `current` (e.g. `--speed 60`) in order when it is not one of them.
 * @param {number|"max"} current
 * @returns {(number|"max")[]}
 */
export function speedOptions(current) {
  if (SPEEDS.includes(current) || typeof current !== "number") return [...SPEEDS];
  const numbers = [...SPEEDS.filter((s) => s !== "max"), current].sort((a, b) => a - b);
  return [...numbers, "max"];
}

/**
 * A speed as shown in the menu: `10×`, `0.5×`, or `maxLabel`.
 * @param {number|"max"} speed
 * @param {string} [maxLabel]
 */
export function speedLabel(speed, maxLabel = "max") {
  return speed === "max" ? maxLabel : `${+speed.toPrecision(4)}×`;
}

/** A `<select>` value back to a speed: "max" or a number. */
export function parseSpeedValue(value) {
  return value === "max" ? "max" : Number(value);
}

/**
 * The newest step the page has of any scalar series (what the charts reach), or null.
 * @param {import("../store.js").Store} store
 */
export function latestStep(store) {
  let best = null;
  for (const run of store.runs.values()) {
    for (const series of run.scalars.values()) {
      const step = series.buffer.last(STEP);
      if (step !== undefined && (best === null || step > best)) best = step;
    }
  }
  return best;
}

/**
 * The header's badge: `connecting` or `closed` while the socket is not open; then `replay` (a
 * replay that plays), `replay-paused` (a replay paused or finished, or the page paused during
 * one), `paused` (the page's Pause) or `live`. "Live" is never shown while paused or replaying.
 * @param {"connecting"|"open"|"closed"} connState
 * @param {boolean} paused the header's Pause
 * @param {"absent"|"playing"|"paused"|"finished"} replayState
 */
export function badgeState(connState, paused, replayState) {
  if (connState !== "open") return connState === "connecting" ? "connecting" : "closed";
  if (replayState !== "absent") return replayState === "playing" && !paused ? "replay" : "replay-paused";
  return paused ? "paused" : "live";
}

/** The string key of each badge state. */
export const BADGE_TEXT = { connecting: "connecting", closed: "disconnected", live: "badgeLive", paused: "badgePaused", replay: "badgeReplay", "replay-paused": "badgeReplayPaused" };

export class ReplayBar {
  /**
   * @param {object} ctx shared page context: `store`, `token`
   * @param {object} [opts]
   * @param {typeof fetch} [opts.fetchImpl]
   * @param {() => number} [opts.now] milliseconds, injectable for tests
   */
  constructor(ctx, { fetchImpl = (...args) => fetch(...args), now = () => performance.now() } = {}) {
    this.ctx = ctx;
    this._fetch = fetchImpl;
    this._now = now;
    /** "absent" (no `replay` frame yet: the bar is hidden) or "active" (served by a replay). */
    this.state = "absent";
    /** The newest status (pushed or answered), or null. */
    this.status = null;
    /** Commands sent (POST /api/replay), and `replay` frames received, for tests. */
    this.requests = 0;
    this.statusFrames = 0;
    this.error = "";
    this._statusAt = 0;
    this._hold = null; // {target, at}: a seek on its way; the bar shows its target until answered
    this._dragging = false;
    this._seekTimer = 0;
    this._timer = 0;

    this.playBtn = el("button", { type: "button", class: "replay-play", on: { click: () => this._togglePlay() } });
    this.speedSelect = el("select", { class: "replay-speed", on: { change: (e) => this._command(() => this.setSpeed(parseSpeedValue(e.target.value))) } });
    this.scrub = el("input", {
      type: "range",
      class: "replay-scrub",
      min: "0",
      max: String(SCRUB_MAX),
      step: "1",
      value: "0",
      on: {
        pointerdown: () => (this._dragging = true),
        pointerup: () => setTimeout(() => (this._dragging = false), 0),
        input: () => {
          this._dragging = true;
          this.render();
        },
        change: () => this._scrubbed(),
      },
    });
    this.title = el("span", { class: "replay-title" });
    this.time = el("span", { class: "replay-time" });
    this.stepLabel = el("span", { class: "replay-step" });
    this.message = el("span", { class: "replay-msg", role: "status" });
    this.element = el("div", { class: "replay-bar", hidden: true, dataset: { state: "absent" } }, this.title, this.playBtn, this.speedSelect, this.scrub, this.time, this.stepLabel, this.message);
    this._speeds = "";
    /** Called after each redraw of the bar (the header's badge follows the play state). */
    this.onChange = null;
    this.relabel();
  }

  /** "absent" (no replay), "playing", "paused" or "finished". */
  playState() {
    return this.state === "active" ? this._playState() : "absent";
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.title.textContent = t("replay");
    this.scrub.setAttribute("aria-label", t("replayPosition"));
    this.speedSelect.setAttribute("aria-label", t("replaySpeed"));
    this.speedSelect.title = t("replaySpeed");
    this._speeds = "";
    this.render();
  }

  /**
   * See each decoded server message: a `replay` frame carries the status (the first one shows
   * the bar).
   */
  onMessage(msg) {
    if (msg.type !== "replay") return;
    this.statusFrames++;
    this._apply(msg.status);
    if (this.state !== "active") {
      this.state = "active";
      this.element.hidden = false;
      this._timer = setInterval(() => this._tick(), TICK_MS);
    }
    this.render();
  }

  /** The replay position now (recorded wall time, seconds), moved on from the last status by the speed. */
  position() {
    const s = this.status;
    if (!s) return NaN;
    if (this._hold) return this._hold.target;
    return estimatePosition(s, (this._now() - this._statusAt) / 1000);
  }

  // ---- commands (each answers with the new status) ----------------------------------------------

  /** Resume feeding; from the start again when the replay had finished. */
  async play() {
    if (this.status?.finished && !this._hold) await this.seek({ wall: this.status.start });
    return this._send({ action: "play" });
  }

  /** Stop feeding; the position is kept. */
  pause() {
    return this._send({ action: "pause" });
  }

  /** @param {number|"max"} speed recorded seconds per real second */
  setSpeed(speed) {
    return this._send({ action: "speed", speed });
  }

  /**
   * Go to a recorded wall time or to the first record at or after a step: the server then sends a
   * `reset` frame and snapshots of every run as it stood there.
   * @param {{wall: number}|{step: number}} where
   */
  async seek(where) {
    const command = "step" in where ? { action: "seek", step: Math.round(where.step) } : { action: "seek", wall: Number(where.wall) };
    if ("wall" in command && this.status) this._hold = { target: Math.min(this.status.end, Math.max(this.status.start, command.wall)), at: this._now() };
    try {
      return await this._send(command);
    } finally {
      this._hold = null;
      this.render();
    }
  }

  // ---- internals --------------------------------------------------------------------------------

  _tick() {
    const s = this.status;
    if (s && s.playing && !s.finished && !(typeof document !== "undefined" && document.hidden)) this.render();
  }

  async _send(command) {
    this.requests++;
    try {
      const status = await replayCommand(command, { token: this.ctx.token, fetchImpl: this._fetch });
      this._showError("");
      this._apply(status);
      return this.status;
    } catch (err) {
      this._showError(err.message);
      throw err;
    } finally {
      this.render();
    }
  }

  _apply(status) {
    const kept = newerStatus(this.status, status);
    if (kept === this.status) return;
    this.status = kept;
    this._statusAt = this._now();
  }

  _playState() {
    const s = this.status;
    return !s ? "absent" : s.finished ? "finished" : s.playing ? "playing" : "paused";
  }

  _togglePlay() {
    const s = this.status;
    if (!s) return;
    this._command(() => (s.playing && !s.finished ? this.pause() : this.play()));
  }

  _scrubbed() {
    const s = this.status;
    this._dragging = false;
    if (!s) return;
    const wall = scrubWall(this.scrub.value, s.start, s.end);
    // Show the target at once; the command follows when the thumb rests (arrow keys fire often).
    this._hold = { target: wall, at: this._now() };
    this.render();
    clearTimeout(this._seekTimer);
    this._seekTimer = setTimeout(() => this._command(() => this.seek({ wall })), SEEK_DEBOUNCE_MS);
  }

  _command(fn) {
    fn().catch(() => {}); // shown in the bar by _send
  }

  // A refused command stays shown until the next command.
  _showError(text) {
    this.error = text;
    this.message.textContent = text ? `⚠ ${text}` : "";
  }

  /** Draw the bar from the status (cheap: called every TICK_MS while playing). */
  render() {
    const s = this.status;
    if (!s || this.state !== "active") return;
    const pos = this._dragging ? scrubWall(this.scrub.value, s.start, s.end) : this.position();
    if (!this._dragging) this.scrub.value = String(scrubValue(pos, s.start, s.end));
    this.scrub.title = `${s.fed.toLocaleString()} / ${s.total.toLocaleString()}`;
    this.time.textContent = `${formatDuration(pos - s.start)} / ${formatDuration(s.end - s.start)}`;
    this.time.title = new Date(pos * 1000).toLocaleString();
    const step = latestStep(this.ctx.store);
    this.stepLabel.textContent = step === null ? "" : `${t("step")} ${step}`;
    const state = this._playState();
    this.element.dataset.state = state;
    this.playBtn.dataset.playing = String(state === "playing");
    this.playBtn.textContent = state === "playing" ? `❚❚ ${t("replayPause")}` : state === "finished" ? `↻ ${t("replayAgain")}` : `▶ ${t("replayPlay")}`;
    const options = speedOptions(s.speed);
    const key = options.join(",");
    if (key !== this._speeds) {
      this._speeds = key;
      this.speedSelect.replaceChildren(...options.map((v) => el("option", { value: String(v), text: speedLabel(v, t("replayMax")) })));
    }
    if (typeof document === "undefined" || document.activeElement !== this.speedSelect) this.speedSelect.value = String(s.speed);
    this.onChange?.(state);
  }

  /** The `window.vdl.replay` hook (docs/dashboard.md). */
  hook() {
    const bar = this;
    return {
      /** "absent" (no replay: the bar is hidden) or "active" (served by `vdl-stream replay`). */
      get state() {
        return bar.state;
      },
      /** Whether the page is served by `vdl-stream replay` (the bar is shown). */
      get active() {
        return bar.state === "active";
      },
      /** The newest status, pushed in a `replay` frame or answered to a command, or null. */
      get status() {
        return bar.status;
      },
      /** The position now (recorded wall time), moved on from the last status by the speed. */
      get position() {
        return bar.position();
      },
      /** Commands sent (POST /api/replay); the page sends no other request about the replay. */
      get requests() {
        return bar.requests;
      },
      /** `replay` frames received. */
      get statusFrames() {
        return bar.statusFrames;
      },
      /** The last error shown in the bar ("" when none). */
      get error() {
        return bar.error;
      },
      play: () => bar.play(),
      pause: () => bar.pause(),
      setSpeed: (speed) => bar.setSpeed(speed),
      seek: (where) => bar.seek(where),
    };
  }
}
