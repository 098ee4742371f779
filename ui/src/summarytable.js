// The `summaries` frame as a table (docs/protocol.md, "Summaries as a table"): the summaries of
// 1,000 runs as a few columns instead of 1,000 maps of ~45 values each. Decoding the maps one value
// at a time took the page 100-200 ms before its first subscribe (the decoder is not yet optimised
// that early); the columns are copied in a few array operations. Pure functions; no DOM.
import { f8 } from "./decode.js";

/** Index of a run without a value in an interned column. */
export const MISSING = 0xffff;

/**
 * Little-endian unsigned integers of `width` bytes (1 or 2) from a msgpack `bin`.
 * @param {Uint8Array} bytes
 * @param {1|2} width
 * @param {string} name what the column is, for the error message
 * @returns {Uint8Array|Uint16Array}
 * @throws {TypeError} not bytes, or a length that is not a multiple of `width`
 */
export function uints(bytes, width, name) {
  if (!(bytes instanceof Uint8Array)) throw new TypeError(`${name} must be bytes, got ${typeof bytes}`);
  if (width === 1) return bytes;
  if (bytes.byteLength % 2 !== 0) throw new TypeError(`${name} must have an even number of bytes, got ${bytes.byteLength}`);
  const out = new Uint16Array(bytes.byteLength / 2);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i < out.length; i++) out[i] = view.getUint16(i * 2, true);
  return out;
}

// An interned column `[values, u2 indices]` of n runs: a function from run index to value
// (`absent` for MISSING, or an index past the values).
function interned(column, n, name, absent = null) {
  if (!Array.isArray(column) || column.length !== 2 || !Array.isArray(column[0])) {
    throw new TypeError(`summaries table ${name} must be [values, indices]`);
  }
  const [values, bytes] = column;
  const index = uints(bytes, 2, `summaries table ${name}`);
  if (index.length !== n) throw new TypeError(`summaries table ${name} must have ${n} indices, got ${index.length}`);
  return (i) => (index[i] < values.length ? values[index[i]] : absent);
}

function column(bytes, n, name) {
  const out = f8(bytes, `summaries table ${name}`);
  if (out.length !== n) throw new TypeError(`summaries table ${name} must have ${n} values, got ${out.length}`);
  return out;
}

const orNull = (v) => (Number.isNaN(v) ? null : v);
// An hparam the run does not have (a default argument of undefined would read as null).
const ABSENT = Symbol("absent");

/**
 * Expand a summaries table into the summary objects of docs/http-api.md ("Run summaries"), one
 * per run, in the table's order.
 * @param {object} table the frame's `table`
 * @returns {object[]}
 * @throws {TypeError} when a column is malformed or of the wrong length
 */
export function expandSummaryTable(table) {
  if (table === null || typeof table !== "object" || !Array.isArray(table.names)) {
    throw new TypeError("summaries table must be a map with names");
  }
  const names = table.names;
  const n = names.length;
  const status = interned(table.status, n, "status");
  const host = interned(table.host, n, "host");
  const start = column(table.start, n, "start");
  const lastWall = column(table.last_wall, n, "last_wall");
  const lastStep = column(table.last_step, n, "last_step");
  const hparams = (Array.isArray(table.hparams) ? table.hparams : []).map((entry, k) => {
    if (!Array.isArray(entry) || entry.length !== 3 || typeof entry[0] !== "string") throw new TypeError(`summaries table hparams[${k}] must be [name, values, indices]`);
    return [entry[0], interned([entry[1], entry[2]], n, `hparam ${entry[0]}`, ABSENT)];
  });
  const tags = Array.isArray(table.tags) ? table.tags : [];
  const cells = tags.length * n;
  const stats = {};
  for (const agg of ["last", "min", "max"]) {
    stats[agg] = f8(table[agg], `summaries table ${agg}`);
    if (stats[agg].length !== cells) throw new TypeError(`summaries table ${agg} must have ${cells} values, got ${stats[agg].length}`);
  }
  const has = table.has == null ? null : uints(table.has, 1, "summaries table has");
  if (has !== null && has.length !== cells) throw new TypeError(`summaries table has must have ${cells} values, got ${has.length}`);
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    const hp = {};
    for (const [key, value] of hparams) {
      const v = value(i);
      if (v !== ABSENT) hp[key] = v;
    }
    const last = {};
    const min = {};
    const max = {};
    for (let t = 0; t < tags.length; t++) {
      const at = t * n + i;
      if (has !== null && has[at] === 0) continue;
      const tag = tags[t];
      last[tag] = orNull(stats.last[at]);
      min[tag] = orNull(stats.min[at]);
      max[tag] = orNull(stats.max[at]);
    }
    out[i] = {
      name: names[i],
      status: status(i),
      start: orNull(start[i]),
      last_wall: orNull(lastWall[i]),
      last_step: orNull(lastStep[i]),
      host: host(i),
      hparams: hp,
      last,
      min,
      max,
    };
  }
  return out;
}
