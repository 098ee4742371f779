// Build the dashboard bundle into vdl_stream/static/ (committed, served by the Python package):
// app.js (one IIFE, dependencies bundled), app.css (uPlot's CSS + ours), index.html and
// embed-worker.js (the embeddings projector's Web Worker).
// Usage: npm run build            (minified)
//        npm run build -- --dev   (unminified, with inline source maps)
import { build } from "esbuild";
import { copyFile, mkdir } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "vdl_stream", "static");
const dev = process.argv.includes("--dev");

await mkdir(out, { recursive: true });
const options = {
  bundle: true,
  format: "iife",
  target: ["es2020", "chrome90", "firefox90", "safari14"],
  minify: !dev,
  sourcemap: dev ? "inline" : false,
  legalComments: "eof",
  outdir: out,
  logLevel: "info",
};
await build({ ...options, entryPoints: { app: join(here, "src", "app.js") } });
// The embeddings worker: its own file (a worker script must be a same-origin URL under the
// page's Content-Security-Policy; a blob: worker would be refused).
await build({ ...options, entryPoints: { "embed-worker": join(here, "src", "embedworker.js") } });
await copyFile(join(here, "index.html"), join(out, "index.html"));
