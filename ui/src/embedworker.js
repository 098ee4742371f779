// The embeddings worker (built to /static/embed-worker.js): projects one matrix off the main
// thread, so the page keeps drawing and answering the mouse. Messages in:
//   {type: "load", job, data: Float32Array (N*D, transferred), n, d}  -> PCA at once
//   {type: "umap", job, epochs?}                                      -> the UMAP-style layout
//   {type: "stop", job}                                               -> stop a running layout
// Messages out: {type: "pca", job, coords, explained, ms}, {type: "phase", job, phase, ms},
// {type: "positions", job, coords, epoch, epochs, done}, {type: "error", job, message}.
// Coordinates are fresh Float32Arrays of 2N (x, y), transferred.
import { fuzzyGraph, nearestNeighbours, pca, umapLayout } from "./projection.js";

/** Neighbours per point of the graph the layout follows (umap-learn's default). */
const NEIGHBOURS = 15;
/** Epochs of the layout: umap-learn runs 200 for large data sets. */
const EPOCHS = 200;
/** Milliseconds of layout between two posts of positions (and two looks at the inbox). */
const SLICE_MS = 40;

let current = null; // {job, data, n, d, pca, graph}

const post = (msg, transfer = []) => self.postMessage(msg, transfer);
const yieldToInbox = () => new Promise((resolve) => setTimeout(resolve, 0));

self.onmessage = (event) => {
  const msg = event.data;
  try {
    if (msg.type === "load") load(msg);
    else if (msg.type === "umap") runLayout(msg).catch((err) => post({ type: "error", job: msg.job, message: String(err?.message ?? err) }));
    else if (msg.type === "stop" && current) current.stopped = msg.job;
  } catch (err) {
    post({ type: "error", job: msg.job, message: String(err?.message ?? err) });
  }
};

function load({ job, data, n, d }) {
  const start = performance.now();
  const result = pca(data, n, d);
  current = { job, data, n, d, pcaCoords: result.coords, graph: null, stopped: null };
  const coords = result.coords.slice();
  post({ type: "pca", job, coords, explained: result.explained, ms: performance.now() - start }, [coords.buffer]);
}

async function runLayout({ job, epochs = EPOCHS }) {
  const state = current;
  if (!state || state.job !== job) return;
  state.stopped = null;
  const start = performance.now();
  if (!state.graph) {
    post({ type: "phase", job, phase: "graph", ms: 0 });
    state.graph = fuzzyGraph(nearestNeighbours(state.data, state.n, state.d, NEIGHBOURS), state.n);
    await yieldToInbox();
    if (current !== state || state.stopped === job) return;
  }
  post({ type: "phase", job, phase: "layout", ms: performance.now() - start });
  const layout = umapLayout(state.graph, state.n, { init: state.pcaCoords, epochs, now: () => performance.now() });
  for (;;) {
    const more = layout.step(SLICE_MS);
    const coords = layout.positions.slice();
    post({ type: "positions", job, coords, epoch: layout.epoch, epochs, done: !more, ms: performance.now() - start }, [coords.buffer]);
    if (!more) return;
    await yieldToInbox();
    if (current !== state || state.stopped === job) return;
  }
}
