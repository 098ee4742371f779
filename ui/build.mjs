// Build the dashboard bundle into vdl_stream/static/ (committed, served by the Python package):
// ES modules: app.js (the page), laterviews.js (the views below the first charts, imported by
// app.js once those are drawn or a view is opened) and chunk-<hash>.js (the modules they share,
// and the early socket's); app.css (uPlot's CSS + ours), index.html (which preloads the chunks)
// and embed-worker.js (the embeddings projector's Web Worker).
// Usage: npm run build            (minified)
//        npm run build -- --dev   (unminified, with inline source maps)
// The names are the same for the same source (esbuild's chunk hashes are of their content), and a
// chunk of an earlier build is removed: CI rebuilds and fails on any difference in the directory.
import { build } from "esbuild";
import { mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "vdl_stream", "static");
const dev = process.argv.includes("--dev");

await mkdir(out, { recursive: true });
for (const name of await readdir(out)) if (/^chunk-.*\.js$/.test(name)) await rm(join(out, name));
const options = {
  bundle: true,
  target: ["es2020", "chrome90", "firefox90", "safari14"],
  minify: !dev,
  sourcemap: dev ? "inline" : false,
  legalComments: "eof",
  outdir: out,
  logLevel: "info",
};
// Split: what the entry points share goes to chunk-<hash>.js; every file is flat under /static/
// (the server serves /static/<name>). earlysocket.js is an entry point only so that its modules
// (the socket, the connection, msgpack) get a chunk of their own, which app.js imports first: it
// is evaluated first, before the chunk of uPlot, the strings and the store (behind that chunk the
// socket opened 10-45 ms before DOMContentLoaded instead of 59-233 ms: docs/performance.md, "The
// bundle evaluated lazily"), and in the same task as the rest of the page (a script of its own
// could let the socket open, its first frames heard by no one, between the two scripts). Its own
// file is not used: removed below.
const page = await build({
  ...options,
  format: "esm",
  splitting: true,
  entryNames: "[name]",
  chunkNames: "chunk-[hash]",
  metafile: true,
  // laterviews.js is an entry point too, only so that its file has a name of its own.
  entryPoints: {
    earlysocket: join(here, "src", "earlysocket.js"),
    app: join(here, "src", "app.js"),
    laterviews: join(here, "src", "laterviews.js"),
  },
});
// The embeddings worker: its own file (a worker script must be a same-origin URL under the
// page's Content-Security-Policy; a blob: worker would be refused).
await build({ ...options, format: "iife", entryPoints: { "embed-worker": join(here, "src", "embedworker.js") } });

await rm(join(out, "earlysocket.js"));

// index.html preloads the chunks app.js imports statically, so that they are fetched beside it,
// not one round trip after.
const entry = Object.values(page.metafile.outputs).find((o) => o.entryPoint?.endsWith("src/app.js"));
const preloads = entry.imports
  .filter((i) => i.kind === "import-statement")
  .map((i) => `    <link rel="modulepreload" href="/static/${basename(i.path)}" />`)
  .sort();
const html = await readFile(join(here, "index.html"), "utf8");
const marker = "    <!-- modulepreload -->";
if (!html.includes(marker)) throw new Error(`ui/index.html lacks the line ${JSON.stringify(marker.trim())}`);
await writeFile(join(out, "index.html"), html.replace(marker, preloads.join("\n")));
