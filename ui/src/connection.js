// The /ws/live WebSocket: connect, subscribe, hand decoded frames to the caller, resubscribe after a
// `gap` (only the runs it names, when it names them), and reconnect with capped exponential backoff (with jitter) whenever the socket closes.
import { decodeFrame, encodeSubscribe } from "./decode.js";

const TOKEN_KEY = "vdl-stream.token";

/**
 * Read `?token=` from the page URL into sessionStorage and remove it from the address bar, so it
 * is neither bookmarked nor sent as a Referer; then return the stored token (or null).
 * @param {Location} location
 * @param {History} history
 * @param {Storage} storage
 */
export function takeToken(location = window.location, history = window.history, storage = window.sessionStorage) {
  const url = new URL(location.href);
  const token = url.searchParams.get("token");
  if (token !== null) {
    try {
      storage.setItem(TOKEN_KEY, token);
    } catch {
      // Storage can be disabled; the token then lives only in this page.
    }
    url.searchParams.delete("token");
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
    return token;
  }
  try {
    return storage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/**
 * The live URL on the page's own host: ws: for http pages, wss: for https.
 * @param {Location} location
 * @param {string|null} token
 * @param {Record<string, string>} [params] more query parameters (e.g. `{summaries: "table"}`:
 *   the summaries on connect as columns, docs/protocol.md)
 */
export function liveUrl(location, token, params = {}) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = new URLSearchParams(token ? { token } : {});
  for (const [k, v] of Object.entries(params)) query.set(k, v);
  const text = query.toString().replace(/\+/g, "%20");
  return `${scheme}//${location.host}/ws/live${text ? `?${text}` : ""}`;
}

/**
 * Backoff before reconnect attempt `attempt` (0-based): 250 ms doubling to a 10 s cap, with up to
 * 30% random jitter so that many tabs do not reconnect in lockstep after a server restart.
 */
export function backoffMs(attempt, random = Math.random) {
  const base = Math.min(10_000, 250 * 2 ** Math.min(attempt, 10));
  return Math.round(base * (1 + 0.3 * random()));
}

/** Whether `runs` is a list of run names (a `gap`'s `runs`: the runs that lost frames). */
export function isRunList(runs) {
  return Array.isArray(runs) && runs.every((r) => typeof r === "string");
}

export class Connection {
  /**
   * @param {object} opts
   * @param {string} opts.url WebSocket URL
   * @param {(msg: object) => void} opts.onMessage decoded server messages
   * @param {(state: "connecting"|"open"|"closed", detail?: string) => void} opts.onState
   * @param {number} [opts.maxPoints] history points per tag in snapshots
   * @param {boolean} [opts.autoSubscribe] subscribe as soon as a socket opens (default); when
   *   false the caller calls subscribe() once it has chosen the runs (after the `runs` frame)
   */
  constructor({ url, onMessage, onState, maxPoints = 2000, autoSubscribe = true }) {
    this.autoSubscribe = autoSubscribe;
    this.url = url;
    this.onMessage = onMessage;
    this.onState = onState;
    this.maxPoints = maxPoints;
    this.runs = null;
    this.connected = false;
    /**
     * Frames received (each frame of a batched `frames` message counts), WebSocket messages,
     * frames that failed to decode, reconnect attempts, `gap` messages, WebSockets opened (1
     * until the first reconnect) and WebSocket messages queued while held (hold()), for the
     * status line and tests.
     */
    this.stats = { frames: 0, messages: 0, badFrames: 0, reconnects: 0, gaps: 0, sockets: 0, held: 0 };
    /** Frames received while held (hold()), in their order, and the holds not yet released. */
    this._queue = [];
    this._holds = 0;
    this._attempt = 0;
    this._timer = null;
    this._ws = null;
    this._closed = false;
  }

  /**
   * Open a socket to `url` now, for a Connection's start() to adopt later in the same task: the
   * handshake and the server's first frames travel while the page builds itself (no event is
   * dispatched before the task ends, so none is missed). Null when the URL is refused.
   * @param {string} url
   * @returns {WebSocket|null}
   */
  static preopen(url) {
    try {
      const ws = new WebSocket(url);
      ws.binaryType = "arraybuffer";
      return ws;
    } catch {
      return null; // start() opens its own and reports the error
    }
  }

  /**
   * Open the socket (and keep reopening it until close()).
   * @param {{socket?: WebSocket|null}} [opts] socket: one from preopen(this URL), taken as the
   *   first socket while it is still connecting (else closed, and a new one opened)
   */
  start({ socket = null } = {}) {
    this._closed = false;
    const adopt = socket?.readyState === WebSocket.CONNECTING;
    if (socket && !adopt) socket.close();
    this._open(adopt ? socket : null);
  }

  /** Close for good: no reconnect. */
  close() {
    this._closed = true;
    clearTimeout(this._timer);
    this._ws?.close(1000, "page closed");
  }

  /**
   * Change the subscription (null: all runs); sent now if connected, and on every reconnect.
   * Snapshots come split (scalars first) and live frames batched while the link is busy (docs/protocol.md).
   * @param {string[]|null} runs
   * @param {{keep?: boolean}} [opts] `keep`: the server sends snapshots only of the runs this
   *   page does not hold yet (the others go on live), or those a `gap` names; never after a
   *   `gap` of every run
   */
  subscribe(runs = this.runs, { keep = false } = {}) {
    this.runs = runs;
    if (this._ws?.readyState === WebSocket.OPEN) this._ws.send(encodeSubscribe(this.runs, this.maxPoints, { keep, split: true, batch: true }));
  }

  /**
   * The server already serves `runs` on this socket (the URL's first subscription, `hello`'s
   * `subscribed`, docs/protocol.md): keep them for a `gap`'s re-subscription and for reconnects,
   * as subscribe() does, without sending anything.
   * @param {string[]|null} runs
   */
  assume(runs) {
    this.runs = runs;
  }

  /**
   * Hold the frames that arrive from now on until the returned function is called: they are
   * queued as they came (not decoded), then decoded and handed over in their order, in a task of
   * their own. The page holds them while its first charts are drawn: a split snapshot's events
   * frame (1.9 MB, 0.2-0.3 s to decode and store for a 1 h run) often arrives between the scalars
   * frame and the frame that draws them, and held the charts back by as much.
   * @returns {() => void} release (calling it again does nothing)
   */
  hold() {
    this._holds++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this._holds--;
      if (this._holds === 0 && this._queue.length > 0) setTimeout(() => this._drain(), 0);
    };
  }

  _drain() {
    while (this._holds === 0 && this._queue.length > 0) this._receive(this._queue.shift());
  }

  _receive(data) {
    let msg;
    try {
      msg = decodeFrame(data);
    } catch (err) {
      this.stats.badFrames++;
      console.warn("vdl-stream: dropped a bad frame:", err);
      return;
    }
    if (msg.type === "frames") {
      this.stats.messages++;
      this.stats.badFrames += msg.badFrames;
      for (const one of msg.frames) this._handle(one);
    } else {
      this.stats.messages++;
      this._handle(msg);
    }
  }

  _open(socket = null) {
    this.onState("connecting");
    let ws = socket;
    try {
      ws ??= new WebSocket(this.url);
    } catch (err) {
      this._retry(String(err));
      return;
    }
    ws.binaryType = "arraybuffer";
    this._ws = ws;
    this.stats.sockets++;
    ws.onopen = () => {
      this._attempt = 0;
      this.connected = true;
      this.onState("open");
      if (this.autoSubscribe) this.subscribe();
    };
    ws.onmessage = (ev) => {
      if (!(ev.data instanceof ArrayBuffer)) return;
      // Held (see hold()), or behind frames that were: queued as they came, not decoded yet.
      if (this._holds > 0 || this._queue.length > 0) {
        this._queue.push(ev.data);
        this.stats.held++;
        return;
      }
      this._receive(ev.data);
    };
    ws.onclose = (ev) => {
      if (this._ws !== ws) return;
      // What this socket sent comes before its close, held or not (a reconnect's frames follow).
      while (this._queue.length > 0) this._receive(this._queue.shift());
      this._ws = null;
      this.connected = false;
      if (this._closed) {
        this.onState("closed", "");
        return;
      }
      this._retry(ev.reason || `code ${ev.code}`);
    };
  }

  _handle(msg) {
    this.stats.frames++;
    if (msg.type === "gap") {
      this.stats.gaps++;
      // A gap naming runs lost frames of those alone: a `keep` re-subscription re-sends their
      // snapshots and nothing else; one without `runs` (every run) starts afresh.
      this.subscribe(this.runs, { keep: isRunList(msg.runs) });
    }
    this.onMessage(msg);
  }

  _retry(detail) {
    const delay = backoffMs(this._attempt++);
    this.stats.reconnects++;
    this.onState("closed", detail);
    clearTimeout(this._timer);
    this._timer = setTimeout(() => this._open(), delay);
  }
}
