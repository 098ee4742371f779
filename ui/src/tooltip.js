// The floating tooltip of the charts: one element for the whole page, `position: fixed` on top of
// everything, so showing, filling and moving it never changes the layout (no chart box moves while
// the mouse does). It lists each line's value at the cursor, largest first.
import { el } from "./dom.js";
import { tf } from "./i18n.js";

/** Pixels between the pointer and the tooltip. */
const GAP = 14;
/** Most rows listed; the rest are counted ("+12 more"). */
export const MAX_ROWS = 20;

/**
 * Rows sorted by value, largest first; rows without a finite value go last, in their order.
 * @template {{value: number|null}} R
 * @param {R[]} rows
 * @returns {R[]}
 */
export function sortRows(rows) {
  const keyed = rows.map((row, i) => ({ row, i, v: Number.isFinite(row.value) ? row.value : -Infinity }));
  keyed.sort((a, b) => b.v - a.v || a.i - b.i);
  return keyed.map((k) => k.row);
}

/**
 * Where to put a `width` × `height` box for a pointer at (x, y) in a `vw` × `vh` viewport: below
 * and to the right of the pointer, flipped to the other side where it would not fit, and kept
 * inside the viewport.
 * @returns {{left: number, top: number}}
 */
export function placeBox(x, y, width, height, vw, vh) {
  let left = x + GAP;
  if (left + width > vw - 4) left = x - GAP - width;
  let top = y + GAP;
  if (top + height > vh - 4) top = y - GAP - height;
  return { left: Math.max(4, Math.min(left, vw - width - 4)), top: Math.max(4, Math.min(top, vh - height - 4)) };
}

let box = null;
let owner = null;

function element() {
  if (!box) {
    box = el("div", { class: "tooltip", role: "tooltip", hidden: true });
    document.body.append(box);
  }
  return box;
}

/**
 * Show the tooltip for `who` (any object: the chart showing it) near the pointer.
 * @param {object} who
 * @param {{clientX: number, clientY: number}} at the pointer, in viewport pixels
 * @param {string} title first line (the step or time)
 * @param {{label: string, color: string, value: number|null, cells: string[]}[]} rows already sorted
 * @param {string[]} [head] column names above the cells (e.g. smoothed, raw)
 */
export function showTooltip(who, at, title, rows, head = []) {
  const node = element();
  owner = who;
  const table = el(
    "table",
    {},
    head.length ? el("thead", {}, el("tr", {}, el("th", {}), ...head.map((h) => el("th", { text: h })))) : null,
    el(
      "tbody",
      {},
      ...rows.slice(0, MAX_ROWS).map((r) =>
        el(
          "tr",
          { dataset: { run: r.label } },
          el("td", { class: "tt-name" }, el("i", { style: { background: r.color } }), r.label),
          ...r.cells.map((c) => el("td", { class: "tt-value", text: c })),
        ),
      ),
    ),
  );
  const more = rows.length > MAX_ROWS ? el("div", { class: "tt-more", text: tf("moreRows", { n: rows.length - MAX_ROWS }) }) : null;
  node.replaceChildren(...[el("div", { class: "tt-title", text: title }), table, more].filter(Boolean));
  node.hidden = false;
  const { width, height } = node.getBoundingClientRect();
  const { left, top } = placeBox(at.clientX, at.clientY, width, height, window.innerWidth, window.innerHeight);
  node.style.left = `${Math.round(left)}px`;
  node.style.top = `${Math.round(top)}px`;
}

/** Hide the tooltip if `who` is showing it (or whoever does, with no argument). */
export function hideTooltip(who) {
  if (!box || (who !== undefined && owner !== who)) return;
  box.hidden = true;
  owner = null;
}
