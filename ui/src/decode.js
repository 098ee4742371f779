// Wire decoding for /ws/live (docs/protocol.md): msgpack frames in, plain objects and
// Float64Array columns out. No I/O and no DOM, so Node's test runner exercises it directly.
import { decode, encode } from "@msgpack/msgpack";
import { expandSummaryTable } from "./summarytable.js";

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * Turn an `f8` column (raw little-endian doubles in a msgpack `bin`) into a Float64Array.
 *
 * The bytes are copied into a fresh buffer: a `bin` decoded from a frame is a view at an arbitrary
 * offset, and Float64Array needs 8-byte alignment.
 *
 * @param {Uint8Array} bytes the column as received
 * @param {string} name what the column is, for the error message
 * @returns {Float64Array}
 * @throws {TypeError} when `bytes` is not a Uint8Array or its length is not a multiple of 8
 */
export function f8(bytes, name = "column") {
  checkF8(bytes, name);
  const out = new Float64Array(bytes.byteLength / 8);
  copyF8(bytes, out);
  return out;
}

// Throw f8's TypeError unless `bytes` can be read as doubles.
function checkF8(bytes, name) {
  if (!(bytes instanceof Uint8Array)) {
    throw new TypeError(`${name} must be f8 bytes, got ${describe(bytes)}`);
  }
  if (bytes.byteLength % 8 !== 0) {
    throw new TypeError(`${name} must have a multiple of 8 bytes, got ${bytes.byteLength}`);
  }
}

// Copy little-endian doubles into `out` (as many as it holds): a byte copy where the machine is
// little-endian (any offset: `bytes` need not be aligned), one double at a time elsewhere.
function copyF8(bytes, out) {
  if (LITTLE_ENDIAN) {
    new Uint8Array(out.buffer, out.byteOffset, out.byteLength).set(bytes);
  } else {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    for (let i = 0; i < out.length; i++) out[i] = view.getFloat64(i * 8, true);
  }
}

/**
 * Decode the `scalars` list of a snapshot or data frame.
 *
 * Every column of the list is copied into one Float64Array and handed out as a view of it: an
 * ArrayBuffer costs about 10 µs to allocate in Chromium whatever its size, and a selection of 100
 * runs brings 100 snapshots of 10 tags (30 columns each, copied once more into the series' rings).
 * The views share that buffer, so keep a column by copying it, not by its `buffer`.
 *
 * @param {Array} entries `[[tag, steps f8, walls f8, values f8], ...]`
 * @returns {{tag: string, steps: Float64Array, walls: Float64Array, values: Float64Array}[]}
 * @throws {TypeError} on a malformed entry or columns of different lengths
 */
export function decodeScalars(entries) {
  if (entries == null) return [];
  if (!Array.isArray(entries)) throw new TypeError(`scalars must be a list, got ${describe(entries)}`);
  let doubles = 0;
  entries.forEach((entry, i) => {
    if (!Array.isArray(entry) || entry.length !== 4) {
      throw new TypeError(`scalars[${i}] must be [tag, steps, walls, values], got ${describe(entry)}`);
    }
    const [tag, stepBytes, wallBytes, valueBytes] = entry;
    if (typeof tag !== "string" || tag === "") {
      throw new TypeError(`scalars[${i}] tag must be a non-empty str, got ${describe(tag)}`);
    }
    checkF8(stepBytes, `scalars[${i}] steps`);
    checkF8(wallBytes, `scalars[${i}] walls`);
    checkF8(valueBytes, `scalars[${i}] values`);
    const n = stepBytes.byteLength;
    if (n !== wallBytes.byteLength || n !== valueBytes.byteLength) {
      throw new TypeError(
        `scalars[${i}] columns differ in length: steps ${n / 8}, walls ${wallBytes.byteLength / 8}, values ${valueBytes.byteLength / 8}`,
      );
    }
    doubles += (3 * n) / 8;
  });
  const all = new Float64Array(doubles);
  let at = 0;
  const column = (bytes) => {
    const out = all.subarray(at, at + bytes.byteLength / 8);
    copyF8(bytes, out);
    at += out.length;
    return out;
  };
  return entries.map(([tag, stepBytes, wallBytes, valueBytes]) => ({
    tag,
    steps: column(stepBytes),
    walls: column(wallBytes),
    values: column(valueBytes),
  }));
}

// The f8 columns of curve events (vdl_stream/summaries.py), all of num_thresholds elements.
const CURVE_COLUMNS = {
  pr_curve: ["thresholds", "tp", "fp", "tn", "fn", "precision", "recall"],
  roc_curve: ["thresholds", "tp", "fp", "tn", "fn", "tpr", "fpr"],
};

/**
 * Decode the `f8` columns carried by non-scalar events in place of their bytes, so views never see
 * raw bytes: histogram `edges`/`counts` and the columns of `pr_curve`/`roc_curve` become
 * Float64Array. Other kinds pass through unchanged.
 *
 * @param {object} event one entry of a frame's `events` list
 * @returns {object} the same event with decoded columns
 * @throws {TypeError} when a histogram's or curve's columns are malformed
 */
export function decodeEvent(event) {
  if (event === null || typeof event !== "object") {
    throw new TypeError(`event must be a map, got ${describe(event)}`);
  }
  if (event.kind === "pr_curve" || event.kind === "roc_curve") {
    const out = { ...event };
    for (const key of CURVE_COLUMNS[event.kind]) out[key] = f8(event[key], `${event.kind} ${key}`);
    const n = out.thresholds.length;
    for (const key of CURVE_COLUMNS[event.kind]) {
      if (out[key].length !== n) throw new TypeError(`${event.kind} ${key} must have ${n} elements, got ${out[key].length}`);
    }
    return out;
  }
  if (event.kind === "histogram") {
    const edges = f8(event.edges, "histogram edges");
    const counts = f8(event.counts, "histogram counts");
    if (edges.length !== counts.length + 1) {
      throw new TypeError(`histogram edges must have counts+1 elements, got ${edges.length} and ${counts.length}`);
    }
    return { ...event, edges, counts };
  }
  return event;
}

/**
 * Check and normalise a replay status: the body of a `replay` frame, or the JSON answer of
 * `POST /api/replay` (docs/protocol.md, docs/interop.md).
 *
 * @param {any} body
 * @returns {{playing: boolean, finished: boolean, speed: number|"max", position: number, step: number|null, start: number, end: number, fed: number, total: number, runs: string[], version: number}}
 * @throws {TypeError} a required field is missing or of the wrong type
 */
export function decodeReplayStatus(body) {
  if (body === null || typeof body !== "object") throw new TypeError(`replay status must be a map, got ${describe(body)}`);
  for (const field of ["position", "start", "end"]) {
    if (typeof body[field] !== "number" || !Number.isFinite(body[field])) throw new TypeError(`replay ${field} must be a finite number, got ${describe(body[field])}`);
  }
  const speed = body.speed;
  if (speed !== "max" && !(typeof speed === "number" && speed > 0)) throw new TypeError(`replay speed must be a positive number or "max", got ${describe(speed)}`);
  const count = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
  return {
    playing: body.playing === true,
    finished: body.finished === true,
    speed,
    position: body.position,
    step: typeof body.step === "number" && Number.isFinite(body.step) ? body.step : null,
    start: body.start,
    end: Math.max(body.start, body.end),
    fed: count(body.fed),
    total: count(body.total),
    runs: Array.isArray(body.runs) ? body.runs.filter((r) => typeof r === "string") : [],
    version: count(body.version),
  };
}

/**
 * Decode one binary WebSocket frame into a message object with decoded columns.
 *
 * `snapshot` and `data` frames get `scalars` as `{tag, steps, walls, values}` objects and their
 * `events` passed through {@link decodeEvent}; an event that fails to decode is left out and
 * counted in `badEvents`. A `reset` frame gets its `runs` checked (a list of str); a `replay`
 * frame becomes `{type: "replay", status}` with the status of {@link decodeReplayStatus}. Other
 * types are returned as decoded.
 *
 * @param {ArrayBuffer|Uint8Array} frame
 * @returns {object}
 * @throws {TypeError|Error} when the frame is not a msgpack map with a string `type`
 */
export function decodeFrame(frame) {
  const bytes = frame instanceof Uint8Array ? frame : new Uint8Array(frame);
  const msg = decode(bytes);
  if (msg === null || typeof msg !== "object" || Array.isArray(msg) || typeof msg.type !== "string") {
    throw new TypeError(`frame must be a map with a str type, got ${describe(msg)}`);
  }
  if (msg.type === "frames") {
    // A live tick's frames in one message (docs/protocol.md): each is decoded on its own, and
    // one that fails is left out (counted) rather than losing the others.
    if (!Array.isArray(msg.frames)) throw new TypeError(`frames.frames must be a list, got ${describe(msg.frames)}`);
    const frames = [];
    let bad = 0;
    for (const inner of msg.frames) {
      try {
        if (!(inner instanceof Uint8Array)) throw new TypeError(`a frame must be bytes, got ${describe(inner)}`);
        const one = decodeFrame(inner);
        if (one.type === "frames") throw new TypeError("frames do not nest");
        frames.push(one);
      } catch {
        bad++;
      }
    }
    return { type: "frames", frames, badFrames: bad };
  }
  if (msg.type === "snapshot" || msg.type === "data" || msg.type === "snapshot_events") {
    if (typeof msg.run !== "string") throw new TypeError(`${msg.type}.run must be a str, got ${describe(msg.run)}`);
    // `snapshot_events` carries the events of the snapshot just sent (its scalars came first).
    msg.scalars = msg.type === "snapshot_events" ? [] : decodeScalars(msg.scalars);
    // One malformed event is dropped (and counted) rather than losing the frame's scalars.
    const events = [];
    msg.badEvents = 0;
    for (const ev of msg.events ?? []) {
      try {
        events.push(decodeEvent(ev));
      } catch {
        msg.badEvents++;
      }
    }
    msg.events = events;
  } else if (msg.type === "reset") {
    if (!Array.isArray(msg.runs) || !msg.runs.every((r) => typeof r === "string")) {
      throw new TypeError(`reset.runs must be a list of str, got ${describe(msg.runs)}`);
    }
  } else if (msg.type === "summaries" && msg.table !== undefined) {
    // The summaries on connect as columns (asked for with `?summaries=table`): the same objects.
    return { type: "summaries", runs: expandSummaryTable(msg.table) };
  } else if (msg.type === "replay") {
    return { type: "replay", status: decodeReplayStatus(msg) };
  }
  return msg;
}

/**
 * Encode the `subscribe` message.
 *
 * @param {string[]|null} runs run names, or null for all runs
 * @param {number} maxPoints history points per tag in snapshots
 * @param {{keep?: boolean, split?: boolean, batch?: boolean}} [opts] `keep`: the runs held stay
 *   (only the others get snapshots); `split`: each snapshot's scalars, then its events; `batch`:
 *   live frames in one `frames` message per tick (docs/protocol.md)
 * @returns {Uint8Array}
 */
export function encodeSubscribe(runs = null, maxPoints = 2000, { keep = false, split = false, batch = false } = {}) {
  const msg = { type: "subscribe", runs, max_points: maxPoints };
  if (keep) msg.keep = true;
  if (split) msg.split = true;
  if (batch) msg.batch = true;
  return encode(msg);
}

function describe(value) {
  if (value === null) return "nil";
  if (Array.isArray(value)) return "list";
  if (value instanceof Uint8Array) return `${value.byteLength} bytes`;
  return typeof value === "string" ? JSON.stringify(value.slice(0, 40)) : typeof value;
}
