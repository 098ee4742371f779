// The replay bar: play/pause, speed and a scrubber over the recorded time range, shown only when the
// page is served by `vdl-stream replay` (GET /api/replay answers 200; under `vdl-stream serve` it
// answers 404 and the bar stays hidden). It polls the replay status about once a second and moves
// the scrubber in between by the speed. Seeking back makes the server swap in a fresh broker and
// close the socket with 1001: the page reconnects at once and re-syncs from snapshots.
import { formatDuration } from "../chart.js";
import { el } from "../dom.js";
import { t } from "../i18n.js";
import { STEP } from "../store.js";

/** Positions of the scrubber (`input.replay-scrub` runs from 0 to this): 0.01% of the run each. */
export const SCRUB_MAX = 10_000;
/** Speeds offered (recorded seconds per real second); the server's own speed is added if missing. */
export const SPEEDS = [1, 10, 100, 1000, "max"];
/** Milliseconds between status requests while the page is visible, and while it is hidden. */
export const POLL_MS = 1000;
export const HIDDEN_POLL_MS = 5000;
/** How often the bar is redrawn between polls (ms), moving the position on by the speed. */
const TICK_MS = 250;
/** After a seek, how long (ms) status answers still showing the old position are not believed. */
const SEEK_HOLD_MS = 5000;
/** Keyboard seeks (one per arrow key press) are coalesced over this many milliseconds. */
const SEEK_DEBOUNCE_MS = 150;
/** After a reconnect, how long (ms) a run the server does not list keeps its old points at most. */
export const STALE_MS = 1000;

/** An error answer of /api/replay: `status` is the HTTP status (0: no answer). */
export class ReplayError extends Error {
  constructor(message, status) {
    super(message);
    this.name = "ReplayError";
    this.status = status;
  }
}

/**
 * Check and normalise a status object of /api/replay (docs/interop.md).
 * @param {any} body the parsed JSON
 * @returns {{playing: boolean, finished: boolean, speed: number|"max", position: number, start: number, end: number, fed: number, total: number, runs: string[]}}
 * @throws {ReplayError} a field is missing or of the wrong type
 */
export function parseStatus(body) {
  const bad = (field) => new ReplayError(`/api/replay: ${field} is missing or invalid`, 200);
  if (body === null || typeof body !== "object") throw bad("the status");
  for (const field of ["position", "start", "end"]) if (typeof body[field] !== "number" || !Number.isFinite(body[field])) throw bad(field);
  const speed = body.speed === "max" ? "max" : body.speed;
  if (speed !== "max" && !(typeof speed === "number" && speed > 0)) throw bad("speed");
  return {
    playing: body.playing === true,
    finished: body.finished === true,
    speed,
    position: body.position,
    start: body.start,
    end: Math.max(body.start, body.end),
    fed: Number(body.fed) || 0,
    total: Number(body.total) || 0,
    runs: Array.isArray(body.runs) ? body.runs.filter((r) => typeof r === "string") : [],
  };
}

/**
 * Ask /api/replay for the status (no `command`) or send it a command (`{action: ...}`).
 * @param {object|undefined} command the JSON body of a POST, or undefined for a GET
 * @param {object} [opts]
 * @param {string|null} [opts.token] sent as a Bearer token, as every API request of the page
 * @param {typeof fetch} [opts.fetchImpl] injectable for tests
 * @returns {Promise<object|null>} the status (see parseStatus), or null when the server has no
 *   replay (404: `vdl-stream serve`)
 * @throws {ReplayError} another HTTP error (with the server's message), or no answer (status 0)
 */
export async function replayRequest(command, { token = null, fetchImpl = fetch } = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const init = command === undefined ? { headers } : { method: "POST", headers: { ...headers, "Content-Type": "application/json" }, body: JSON.stringify(command) };
  let response;
  try {
    response = await fetchImpl("/api/replay", { ...init, cache: "no-store" });
  } catch (err) {
    throw new ReplayError(`/api/replay: ${err?.message ?? err}`, 0);
  }
  if (response.status === 404) return null;
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: reported by status below
  }
  if (!response.ok) throw new ReplayError(typeof body?.error === "string" ? body.error : `/api/replay answered ${response.status}`, response.status);
  return parseStatus(body);
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
 * Where a replay stands `elapsed` real seconds after `status` was taken: it moves on by the speed
 * while playing (up to the end); at speed "max" the server's position is taken as it is.
 * @param {ReturnType<typeof parseStatus>} status
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
 * Re-syncing the store with a replay's fresh broker after a reconnect. A seek back replaces the
 * broker: runs it lists get snapshots (which replace their points), but a run it does not list yet
 * is one the replay has not fed again so far, and its old points must go before new ones are
 * appended. They go when its first data arrives, so that its charts change once, from the old
 * picture to the new, or after STALE_MS when none arrives (the run had not begun at the target).
 * No DOM, no timers: the caller runs `expire()` STALE_MS after `seen()` returns true.
 */
export class Resync {
  /** @param {import("../store.js").Store} store */
  constructor(store) {
    this.store = store;
    /** Runs whose points are from before the reconnect. */
    this.stale = new Set();
    this._awaitRuns = false;
  }

  /** The socket (re)opened: the first `runs` message that follows is the server's whole list. */
  opened() {
    this._awaitRuns = true;
  }

  /**
   * See a server message before the store applies it.
   * @returns {boolean} whether runs were just marked stale (start the STALE_MS timer)
   */
  seen(msg) {
    if (msg.type === "runs" && this._awaitRuns) {
      this._awaitRuns = false;
      const listed = new Set(msg.runs ?? []);
      this.stale = new Set([...this.store.runs.keys()].filter((name) => !listed.has(name)));
      return this.stale.size > 0;
    }
    if ((msg.type === "data" || msg.type === "snapshot") && this.stale.delete(msg.run) && msg.type === "data") this.store.clearRun(msg.run);
    return false;
  }

  /** Empty the runs still stale: nothing of them was replayed again. */
  expire() {
    for (const name of this.stale) this.store.clearRun(name);
    this.stale.clear();
  }
}

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
    /** "detecting", "active" (served by `vdl-stream replay`) or "absent" (no replay: bar hidden). */
    this.state = "detecting";
    /** The last status the server gave, or null. */
    this.status = null;
    /** Milliseconds between polls while visible (POLL_MS). */
    this.pollInterval = POLL_MS;
    /** Status requests and commands sent, for tests. */
    this.requests = 0;
    this.error = "";
    this._errors = { command: "", poll: "" };
    this._statusAt = 0;
    this._lastPoll = -Infinity;
    this._polling = false;
    this._epoch = 0; // bumped by every command: a poll answer sent before it is stale
    this._hold = null; // {target, at}: the position a seek went to, until the server shows it
    this._dragging = false;
    this._seekTimer = 0;
    this._timer = 0;
    this._connection = null;
    this._resync = new Resync(ctx.store);
    this._staleTimer = 0;

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
    this.element = el("div", { class: "replay-bar", hidden: true, dataset: { state: "detecting" } }, this.title, this.playBtn, this.speedSelect, this.scrub, this.time, this.stepLabel, this.message);
    this._speeds = "";
    this.relabel();
  }

  /**
   * Find out whether the page is served by a replay, and if so show the bar and keep it current.
   * @param {import("../connection.js").Connection} connection the page's socket: it reconnects at
   *   once when a seek closes it (1001)
   */
  start(connection) {
    this._connection = connection;
    this._detect();
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

  /** The replay position now (recorded wall time, seconds), moved on from the last status by the speed. */
  position() {
    const s = this.status;
    if (!s) return NaN;
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
   * Go to a recorded wall time or to the first record at or after a step: every chart then shows
   * the run as it stood there.
   * @param {{wall: number}|{step: number}} where
   */
  async seek(where) {
    const command = "step" in where ? { action: "seek", step: Math.round(where.step) } : { action: "seek", wall: Number(where.wall) };
    if ("wall" in command && this.status) this._hold = { target: Math.min(this.status.end, Math.max(this.status.start, command.wall)), at: this._now() };
    else this._hold = null;
    const status = await this._send(command);
    this.render();
    return status;
  }

  /** Ask for the status now. */
  async refresh() {
    return this._poll();
  }

  // ---- connection hooks (app.js) ----------------------------------------------------------------

  /** The socket (re)opened (see Resync). */
  connectionOpened() {
    this._resync.opened();
  }

  /** See each server message before the store does (see Resync). */
  beforeMessage(msg) {
    if (this.state !== "active") return;
    if (this._resync.seen(msg)) {
      clearTimeout(this._staleTimer);
      this._staleTimer = setTimeout(() => this._resync.expire(), STALE_MS);
    }
  }

  // ---- internals --------------------------------------------------------------------------------

  async _detect() {
    this.requests++;
    let status;
    try {
      status = await replayRequest(undefined, { token: this.ctx.token, fetchImpl: this._fetch });
    } catch (err) {
      if (err.status === 0) {
        setTimeout(() => this._detect(), 3000); // no answer (yet): the socket retries too
        return;
      }
      console.warn("vdl-stream: no replay controls:", err.message);
      status = null;
    }
    if (status === null) {
      this._setState("absent");
      return;
    }
    if (this._connection) this._connection.quickReconnect = true;
    this._apply(status, this._epoch);
    this._setState("active");
    this.render();
    this._timer = setInterval(() => this._tick(), TICK_MS);
  }

  _setState(state) {
    this.state = state;
    this.element.hidden = state !== "active";
    this.element.dataset.state = state === "active" ? this._playState() : state;
    if (state === "absent") clearInterval(this._timer);
  }

  _tick() {
    const hidden = typeof document !== "undefined" && document.hidden;
    const every = hidden ? Math.max(this.pollInterval, HIDDEN_POLL_MS) : this.pollInterval;
    if (this._now() - this._lastPoll >= every) this._poll().catch(() => {});
    if (!hidden) this.render();
  }

  async _poll() {
    if (this._polling) return this.status;
    this._polling = true;
    this._lastPoll = this._now();
    const epoch = this._epoch;
    this.requests++;
    try {
      const status = await replayRequest(undefined, { token: this.ctx.token, fetchImpl: this._fetch });
      if (status === null) {
        this._setState("absent"); // the server on this port is no replay any more
        return null;
      }
      this._showError("poll", "");
      this._apply(status, epoch);
      return this.status;
    } catch (err) {
      this._showError("poll", err.message);
      throw err;
    } finally {
      this._polling = false;
    }
  }

  async _send(command) {
    const epoch = ++this._epoch;
    this.requests++;
    try {
      const status = await replayRequest(command, { token: this.ctx.token, fetchImpl: this._fetch });
      if (status === null) throw new ReplayError("this server has no replay", 404);
      this._showError("command", "");
      this._apply(status, epoch);
      return this.status;
    } catch (err) {
      this._showError("command", err.message);
      throw err;
    } finally {
      this.render();
    }
  }

  // Take a status answer, unless a command was sent after it was asked for. The server answers a
  // seek before carrying it out, so until a status shows the position moved to (or on from) the
  // seek's target, the target is shown.
  _apply(status, epoch) {
    if (epoch !== this._epoch) return;
    const now = this._now();
    const hold = this._hold;
    if (hold) {
      const elapsed = (now - hold.at) / 1000;
      // Since the seek, a replay can have moved on by at most the real time passed times the speed.
      const reach = !status.playing ? 0 : status.speed === "max" ? Infinity : (elapsed + 0.1) * status.speed;
      const eps = 1e-3; // seconds: the server clamps the target as the page does
      const arrived = status.position >= hold.target - eps && status.position <= hold.target + reach + eps;
      if (arrived || elapsed * 1000 > SEEK_HOLD_MS) {
        this._hold = null;
      } else {
        status = { ...status, position: hold.target, finished: status.finished && hold.target >= status.end };
        this.status = status;
        this._statusAt = hold.at;
        return;
      }
    }
    this.status = status;
    this._statusAt = now;
  }

  _playState() {
    const s = this.status;
    return !s ? "detecting" : s.finished ? "finished" : s.playing ? "playing" : "paused";
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
    this._epoch++; // answers to polls sent before now show the old position
    this.render();
    clearTimeout(this._seekTimer);
    this._seekTimer = setTimeout(() => this._command(() => this.seek({ wall })), SEEK_DEBOUNCE_MS);
  }

  _command(fn) {
    fn().catch(() => {}); // shown in the bar by _send
  }

  // A refused command stays shown until the next command; a failed poll until the next poll.
  _showError(kind, text) {
    this._errors[kind] = text;
    this.error = this._errors.command || this._errors.poll;
    this.message.textContent = this.error ? `⚠ ${this.error}` : "";
    this.element.classList.toggle("stale", Boolean(this._errors.poll));
  }

  /** Draw the bar from the status (cheap: called every TICK_MS while shown). */
  render() {
    const s = this.status;
    if (!s || this.state !== "active") return;
    const preview = this._dragging ? scrubWall(this.scrub.value, s.start, s.end) : null;
    const hold = this._hold;
    const pos = preview ?? (hold && hold.target !== s.position ? estimatePosition({ ...s, position: hold.target }, (this._now() - hold.at) / 1000) : this.position());
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
    if (document.activeElement !== this.speedSelect) this.speedSelect.value = String(s.speed);
  }

  /** The `window.vdl.replay` hook (docs/dashboard.md). */
  hook() {
    const bar = this;
    return {
      /** "detecting", "active" or "absent". */
      get state() {
        return bar.state;
      },
      /** Whether the page is served by `vdl-stream replay` (the bar is shown). */
      get active() {
        return bar.state === "active";
      },
      /** The last status from GET/POST /api/replay (normalised), or null. */
      get status() {
        return bar.status;
      },
      /** The position now (recorded wall time), moved on from the last status by the speed. */
      get position() {
        return bar.position();
      },
      /** Milliseconds between status requests (default 1000). */
      get pollInterval() {
        return bar.pollInterval;
      },
      set pollInterval(ms) {
        bar.pollInterval = Math.max(100, Number(ms) || POLL_MS);
      },
      /** Status requests and commands sent so far. */
      get requests() {
        return bar.requests;
      },
      /** The last error shown in the bar ("" when none). */
      get error() {
        return bar.error;
      },
      play: () => bar.play(),
      pause: () => bar.pause(),
      setSpeed: (speed) => bar.setSpeed(speed),
      seek: (where) => bar.seek(where),
      refresh: () => bar.refresh(),
    };
  }
}
