// DOM construction without innerHTML: user data (tags, run names, text) only ever becomes text
// nodes or attribute values, so HTML inside it is shown, never parsed.

/**
 * Create an element.
 * @param {string} tag element name
 * @param {object} [props] `class`, `text`, `dataset`, `on` ({event: handler}), `style` (object),
 *   anything else is set as an attribute
 * @param {...(Node|string|null|undefined)} children strings become text nodes
 * @returns {HTMLElement}
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "style") Object.assign(node.style, value);
    else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

/** Append children (strings become text nodes; null/undefined are skipped). */
export function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

/** Remove every child of `node`. */
export function clear(node) {
  while (node.firstChild) node.firstChild.remove();
}

/**
 * Insert `element` under `parent` so that the elements of a keyed collection stay in key order.
 * @param {Element} parent
 * @param {Map<string, any>} items the collection, already holding `key`
 * @param {string} key the new item's key
 * @param {Element} element the new item's element
 * @param {(item: any) => Element} elementOf the element of another item
 */
export function insertSorted(parent, items, key, element, elementOf = (item) => item.element) {
  const keys = [...items.keys()].sort();
  const next = keys[keys.indexOf(key) + 1];
  parent.insertBefore(element, next === undefined ? null : elementOf(items.get(next)));
}

/**
 * Line colors: Tableau's ten first (what telemetry lines and groups use in order), then ten darker
 * ones, all readable on light and dark backgrounds. Twenty rather than ten, so that runs colored
 * by a hash of their names share a color half as often.
 */
export const PALETTE = [
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
  "#393b79", "#e6550d", "#637939", "#843c39", "#7b4173", "#3182bd", "#8c6d31", "#31a354", "#a55194", "#636363",
];

/**
 * 32-bit FNV-1a hash of a string's UTF-16 code units: small, fast and well spread, so that run
 * names differing in one character (`seed1`, `seed2`) get different colors.
 * @param {string} text
 * @returns {number} an unsigned 32-bit integer
 */
export function hashString(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

const colors = new Map();
/**
 * A stable color for a key within its namespace. Runs (space "run") get a color derived from the
 * name alone (a hash into the palette), so a run has the same color in every view, after a reload
 * and whatever order the runs arrive in. Other spaces (telemetry lines) are colored in order of
 * first use, starting at the first palette color.
 * @param {string} key
 * @param {string} [space]
 */
export function colorFor(key, space = "run") {
  if (space === "run") return PALETTE[hashString(`${space}\u0000${key}`) % PALETTE.length];
  let map = colors.get(space);
  if (!map) colors.set(space, (map = new Map()));
  let c = map.get(key);
  if (!c) {
    c = PALETTE[map.size % PALETTE.length];
    map.set(key, c);
  }
  return c;
}

/** A file name for a tag: anything but letters, digits, `-`, `_` and `.` becomes `_`. */
export function fileName(tag, ext) {
  const base = String(tag).replace(/[^\p{L}\p{N}._-]+/gu, "_").replace(/^_+|_+$/g, "") || "chart";
  return `${base}.${ext}`;
}
