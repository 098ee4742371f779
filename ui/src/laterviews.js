// The views below the first charts: system, histograms, images, text, PR/ROC curves, hparams (with
// the sweep panels), the model graph and the embeddings projector. app.js imports this module
// once the first scalar charts are drawn (when the page is next idle), or at once when one of
// these views is opened, so that a first load evaluates only what its first view shows
// (docs/performance.md, "The bundle evaluated lazily").
import { CurvesView } from "./views/curves.js";
import { EmbeddingsView } from "./views/embeddings.js";
import { GraphView } from "./views/graph.js";
import { HistogramsView } from "./views/histograms.js";
import { HparamsView } from "./views/hparams.js";
import { ImagesView } from "./views/images.js";
import { SystemView } from "./views/system.js";
import { TextView } from "./views/text.js";

/**
 * Build the later views. Each subscribes to the store with `current`, so it first draws what the
 * store already holds; the graph view, fed by the connection's frames, is handed those that came
 * before it by the page.
 * @param {object} ctx the page's shared context (app.js)
 * @returns {Record<string, object>} the views by name, in page order (app.js holds a place for
 *   each under the same name)
 */
export function buildLaterViews(ctx) {
  return {
    system: new SystemView(ctx),
    histograms: new HistogramsView(ctx),
    images: new ImagesView(ctx),
    text: new TextView(ctx),
    curves: new CurvesView(ctx),
    hparams: new HparamsView(ctx),
    graph: new GraphView(ctx),
    // Embeddings (issue 15): a projector fed from /api/blob, projecting in a Web Worker.
    embeddings: new EmbeddingsView(ctx),
  };
}
