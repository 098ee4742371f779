"""The page's share of a selection of 100 runs, its ingest alone: 100 snapshot frames decoded and
applied to a fresh ``Store`` in headless Chromium, timed by the renderer main thread's own CPU.

    python bench/bench_page_ingest.py                          # this tree
    python bench/bench_page_ingest.py --trees BEFORE,.         # trees alternated, same browser

Each tree's ``ui/src/decode.js`` and ``ui/src/store.js`` are bundled with esbuild into a small
harness (this tree's ``ui/node_modules`` resolves the packages of every tree). The frames are
built by this tree's ``vdl_stream.codec.encode_live``, as ``Broker.send_snapshot`` sends a sweep's
runs whole: 10 tags of 200 points (the page's ``max_points`` over many runs) and one ``hparams``
event a run. A round opens a page per tree and applies the 100 frames ``--reps`` times (a fresh
``Store`` each time, the first ``--warmup`` not counted); the report gives, per tree, the median
and quartiles of the rounds' main-thread CPU per 100 frames (``/proc/<pid>/task/<pid>/stat`` of
the page's renderer: the load moves it less than the wall clock) and of the wall time measured
in the page. Every wait is bounded; the browser is closed in ``finally``.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from bench_dashboard import find_browser_pid, renderer_main_cpu_s  # noqa: E402

from tests.conftest import CHROMIUM_ARGS  # noqa: E402  (one set of browser flags)
from vdl_stream import codec  # noqa: E402

TAGS = [
    f"{part}/{name}" for part in ("train", "eval") for name in ("loss", "acc", "ppl", "lr", "norm")
]

HARNESS = """
import { decodeFrame } from "TREE/ui/src/decode.js";
import { Store } from "TREE/ui/src/store.js";
window.ingest = (frames, reps, warmup) => {
  const names = frames.map((_, i) => `run-${i}`);
  const times = [];
  for (let r = 0; r < warmup + reps; r++) {
    const store = new Store({ maxPoints: 200 });
    store.subscribeTo(names);
    const t0 = performance.now();
    for (const f of frames) store.apply(decodeFrame(f));
    if (r >= warmup) times.push(performance.now() - t0);
  }
  return times;
};
"""


def snapshot_frames(runs: int = 100, points: int = 200, seed: int = 0) -> list[bytes]:
    """``runs`` snapshot frames of ``len(TAGS)`` tags of ``points`` points and an hparams event."""
    rng = np.random.default_rng(seed)
    frames = []
    for r in range(runs):
        columns = []
        for tag in TAGS:
            steps = np.sort(rng.choice(10_000, points, replace=False)).astype(np.int64)
            columns.append(
                codec.ScalarColumns(tag, steps, 1.7e9 + steps * 0.1, rng.standard_normal(points))
            )
        hparams = {"kind": "hparams", "step": 0, "wall": 1.7e9, "hparams": {"lr": 0.01, "seed": r}}
        frames.append(codec.encode_live("snapshot", 1, f"run-{r}", columns, [hparams]))
    return frames


def bundle(tree: Path, out: Path) -> str:
    """The harness over ``tree``'s ui/src, bundled (esbuild from this tree's ui)."""
    src = out / f"harness-{abs(hash(str(tree)))}.js"
    src.write_text(HARNESS.replace("TREE", str(tree)))
    target = src.with_suffix(".bundle.js")
    esbuild = ROOT / "ui" / "node_modules" / ".bin" / "esbuild"
    env = {**os.environ, "NODE_PATH": str(ROOT / "ui" / "node_modules")}
    subprocess.run(
        [
            str(esbuild),
            str(src),
            "--bundle",
            "--format=iife",
            f"--outfile={target}",
            "--log-level=error",
        ],
        check=True,
        env=env,
        timeout=60,
    )
    return target.read_text()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--trees", default=".", help="comma-separated checkouts to compare (default: this one)"
    )
    ap.add_argument("--rounds", type=int, default=6, help="pages per tree, alternated")
    ap.add_argument("--reps", type=int, default=20, help="selections of 100 frames a page")
    ap.add_argument("--warmup", type=int, default=3, help="selections a page not counted")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    frames = snapshot_frames()
    payload = [base64.b64encode(f).decode() for f in frames]
    cpu: dict[Path, list[float]] = {t: [] for t in trees}
    wall: dict[Path, list[float]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        scripts = {t: bundle(t, Path(tmp)) for t in trees}
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            browser_pid = find_browser_pid()
            for _ in range(args.rounds):
                for tree in trees:
                    page = browser.new_page()
                    page.set_content("<html><body></body></html>")
                    page.add_script_tag(content=scripts[tree])
                    page.evaluate(
                        "(b64) => { window.frames64 = b64.map((s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0))); }",
                        payload,
                    )
                    before = renderer_main_cpu_s(browser_pid)
                    times = page.evaluate(
                        "([reps, warmup]) => ingest(window.frames64, reps, warmup)",
                        [args.reps, args.warmup],
                    )
                    after = renderer_main_cpu_s(browser_pid)
                    spent = max((after[pid] - before.get(pid, 0.0) for pid in after), default=0.0)
                    # The thread's CPU over the warm-up and the counted selections, per selection.
                    cpu[tree].append(1000 * spent / (args.reps + args.warmup))
                    wall[tree].append(statistics.median(times))
                    page.close()
        finally:
            browser.close()
    print(
        f"100 snapshot frames of {len(TAGS)} tags x 200 points, {sum(map(len, frames)):,} bytes; load {os.getloadavg()[0]:.1f}"
    )
    for tree in trees:
        c, w = sorted(cpu[tree]), sorted(wall[tree])
        q = statistics.quantiles(c, n=4) if len(c) > 1 else [c[0]] * 3
        print(
            f"{tree}: main-thread CPU per 100 frames median {statistics.median(c):.1f} ms"
            f" (quartiles {q[0]:.1f}-{q[2]:.1f}, {len(c)} pages); wall in the page median {statistics.median(w):.1f} ms"
        )


if __name__ == "__main__":
    main()
