// The page's default first selection, in a module without imports: the bundle's first module
// (earlysocket.js) asks the server for it in the /ws/live URL before runs.js and the views are
// evaluated, and the page checks that what the server chose is what it would have chosen.

/** With at most this many runs, every run is selected (and subscribed to) by default. */
export const SELECT_ALL_UP_TO = 20;
/** With more runs, the most recently active this many are selected by default. */
export const DEFAULT_SELECTED = 10;

/**
 * History points per tag to ask for in snapshots when subscribing to `runs` runs: 2,000 (the
 * page's default) for up to SELECT_ALL_UP_TO runs, then fewer as more runs share a chart, down to
 * 200 from 100 runs on. The server's time to answer grows with the points it sends, and a zoomed
 * chart fetches the full-resolution points of its range anyway (history.js).
 * @param {number} runs
 * @returns {number}
 */
export function pointsFor(runs) {
  if (runs <= SELECT_ALL_UP_TO) return 2000;
  return Math.max(200, Math.round(20000 / runs / 100) * 100);
}

/**
 * The /ws/live URL's first subscription (docs/protocol.md, "The first subscription in the URL")
 * for a page whose remembered view (remember.js) is `saved`: the default selection (every run up
 * to SELECT_ALL_UP_TO, else the DEFAULT_SELECTED most recently active), or null when the page
 * will choose another (a remembered selection, or remembered hidden runs, which narrow it).
 * @param {object|null} saved
 * @returns {Record<string, string>|null} query arguments
 */
export function firstSubscription(saved) {
  const runs = saved?.runs;
  if (runs && typeof runs === "object" && (Array.isArray(runs.selected) || (Array.isArray(runs.hidden) && runs.hidden.length > 0))) return null;
  return { newest: String(DEFAULT_SELECTED), all_up_to: String(SELECT_ALL_UP_TO), max_points: String(pointsFor(DEFAULT_SELECTED)) };
}

/**
 * Whether the subscription the server made from the URL (`hello`'s `subscribed`) is the one the
 * page is about to ask for: the same runs (null: every run) with the same points per tag.
 * @param {unknown} subscribed
 * @param {string[]|null} runs
 * @param {number} maxPoints
 */
export function sameSubscription(subscribed, runs, maxPoints) {
  if (subscribed === null || typeof subscribed !== "object" || subscribed.max_points !== maxPoints) return false;
  const theirs = subscribed.runs;
  if (theirs === null || runs === null) return theirs === null && runs === null;
  if (!Array.isArray(theirs)) return false;
  const mine = new Set(runs);
  const served = new Set(theirs);
  return served.size === mine.size && [...served].every((name) => mine.has(name));
}
