// The /ws/live socket, opened by the bundle's first module: before the other modules are evaluated
// and the page builds its views and layout (200-300 ms of the main thread for a page of 1,000
// runs), so that the handshake and the server's runs and summaries frames travel meanwhile. The
// page's Connection adopts it at the end of the script (app.js): no event of the socket is
// dispatched before this task ends, so none is missed.
import { Connection, liveUrl, takeToken } from "./connection.js";
import { rememberKey, Remembered } from "./remember.js";
import { firstSubscription } from "./runsdefault.js";

/** The page's access token (taken from `?token=` and removed from the address bar). */
export const token = takeToken();
/**
 * The page's /ws/live URL: the summaries of every run on connect as columns (docs/protocol.md):
 * a few array copies to decode, where 1,000 summary maps held up the first subscribe by 100-300 ms.
 * Reconnects use it as it is.
 */
export const LIVE_URL = liveUrl(window.location, token, { summaries: "table" });
// The first socket also asks for the page's default selection (docs/protocol.md, "The first
// subscription in the URL"): the server sends its snapshots right after the summaries, while the
// page evaluates its bundle, instead of once the page has built itself and sent `subscribe`
// (0.8 s after the navigation for 1,000 runs). A page that remembers another selection asks
// for none and subscribes as before.
const first = firstSubscription(new Remembered(rememberKey(window.location)).load());
/** The socket opened now, for `connection.start({socket})` (null when the URL was refused). */
export const earlySocket = Connection.preopen(first === null ? LIVE_URL : liveUrl(window.location, token, { summaries: "table", ...first }));
