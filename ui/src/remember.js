// What the page remembers across reloads of one server's page: the runs table's selection, pins,
// hidden runs, grouping and band, and the smoothing. Kept in localStorage under a key per server
// (origin and path: two servers on one host keep their own), written only when it changed.
// Storage that is missing, full or disabled (private windows) only means nothing is remembered.

/** The layout version of what is stored; anything else is ignored. */
export const REMEMBER_VERSION = 1;

/**
 * The storage key for the page at `location` (the token in the query or hash is left out).
 * @param {{origin: string, pathname: string}} location
 */
export function rememberKey(location) {
  return `vdl-stream:view:${location.origin}${location.pathname}`;
}

export class Remembered {
  /**
   * @param {string} key see rememberKey
   * @param {Storage|null|undefined} [storage] default: localStorage (none: remember nothing)
   */
  constructor(key, storage = globalThis.localStorage) {
    if (typeof key !== "string" || key === "") throw new TypeError(`key must be a non-empty string, got ${JSON.stringify(key)}`);
    this.key = key;
    this.storage = storage ?? null;
    this._written = null;
  }

  /**
   * What was saved last, or null (nothing, unreadable, or another layout version).
   * @returns {object|null}
   */
  load() {
    let text = null;
    try {
      text = this.storage?.getItem(this.key) ?? null;
    } catch {
      return null; // storage disabled
    }
    if (text === null) return null;
    this._written = text;
    try {
      const value = JSON.parse(text);
      return value && typeof value === "object" && value.v === REMEMBER_VERSION ? value : null;
    } catch {
      return null;
    }
  }

  /**
   * Save `value` (a plain object; `v` is added), unless it is what is stored already.
   * @param {object} value
   * @returns {boolean} whether it was written
   */
  save(value) {
    const text = JSON.stringify({ v: REMEMBER_VERSION, ...value });
    if (text === this._written) return false;
    try {
      this.storage?.setItem(this.key, text);
    } catch (err) {
      // Full or disabled: say so once, keep working.
      if (this._written !== text && !this._warned) console.warn("vdl-stream: cannot remember the view:", err);
      this._warned = true;
      return false;
    }
    this._written = text;
    return this.storage !== null;
  }
}
