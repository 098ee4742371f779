"""Benchmark of the browser dashboard against the targets of issue 6, in headless Chromium.

    python bench/bench_dashboard.py            # 60 s of live load, then the 10,000,000-point run
    python bench/bench_dashboard.py --quick    # 15 s of live load, one server start for the run
    python bench/bench_dashboard.py --skip-load --prefill 262144   # live load with full rings
    python bench/bench_dashboard.py --runs     # issue 12: 1,000 runs (bench/dashboard_runs.py)

Two parts, each against a real ``vdl-stream serve`` subprocess on 127.0.0.1:

* live: a writer in its own process (bench/dashboard_writer.py, ``vdl_stream.attach(url=...)``)
  logs 20 scalar tags at 1,000 points/s each (every 10 ms, 10 points per tag) for ``--duration``
  seconds while the page is open in a 1400x1000 viewport. Every ``--interval`` seconds the script
  reads the Chrome DevTools Protocol's ``Performance.getMetrics``: main-thread busy share =
  d(TaskDuration) / d(Timestamp) (also ScriptDuration, LayoutDuration, RecalcStyleDuration) and
  JSHeapUsedSize, plus ``Runtime.getHeapUsage`` (ArrayBuffer backing stores, which hold the ring
  buffers and are not in the JS heap). After the measured window the writer goes on for
  ``--profile`` seconds while a CPU profile is taken (self time by function, with the first
  characters of each minified function; not part of the busy figures). At the end it checks that
  ``window.vdl.series(run, tag)`` holds every point sent (the newest 262,144 when more were sent),
  and reads the heap after ``HeapProfiler.collectGarbage``. ``--prefill N`` first logs N points
  per tag at once and waits for the page to hold them, so that the window is measured with full
  ring buffers (the steady state of a long run).
* load: a run of ``--tags`` x ``--steps`` scalars (default 10 x 1,000,000 = 10,000,000 points) is
  written with ``recorder.RunWriter(sync="never")`` into ``--cache`` (kept between invocations;
  its generation time is reported), served ``--starts`` times, and opened 1 + ``--repeat`` times
  per server start, in a fresh browser context each: the time from navigation start until every
  scalar chart in the viewport has data (``window.vdl.charts.get(tag).data[0].length > 0``; charts
  below the fold are drawn only when scrolled to, so "every chart" is reported apart, when it
  happens), broken down with bench/dashboard_probe.js. The first load after a server start is
  "cold" (the server's reader is not open yet); the page cache of the OS is warm either way. Then
  a plain WebSocket client (bench/dashboard_snapshot.py) times the server alone, cold and warm,
  and one more page load runs under the CPU profiler.

Results: a Markdown summary on stdout and the full record in bench/out/dashboard.json (or --out).
Every wait is bounded, and the server, the writer and the browser are stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import dashboard_runs  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
from broker_clients import ServeProcess, process_cpu_s, stop_process  # noqa: E402
from dashboard_snapshot import snapshot_time  # noqa: E402
from dashboard_writer import tag_name  # noqa: E402

from recorder import RunWriter  # noqa: E402
from tests.conftest import CHROMIUM_ARGS  # noqa: E402  (one set of browser flags)

VIEWPORT = {"width": 1400, "height": 1000}
LIVE_RUN = "live"
BIG_RUN = "big"
WALL0 = 1_790_000_000.0
PROBE = (HERE / "dashboard_probe.js").read_text()
RING_CAPACITY = 1 << 18  # points per series the page keeps (ui/src/store.js SERIES_CAPACITY)

# Charts whose box intersects the viewport (and those wholly inside it).
IN_VIEW_JS = """() => {
  const H = window.innerHeight, W = window.innerWidth;
  let some = 0, whole = 0;
  for (const e of document.querySelectorAll('[data-tag]')) {
    const r = e.getBoundingClientRect();
    if (r.bottom > 0 && r.top < H && r.right > 0 && r.left < W) some++;
    if (r.top >= 0 && r.bottom <= H && r.left >= 0 && r.right <= W) whole++;
  }
  return [some, whole];
}"""

# Cheap progress of one series (the store's ring buffer, not a copy): points held, newest wall.
PROGRESS_JS = """([run, tag]) => {
  const s = window.vdl.store.series(run, tag);
  return {now: Date.now() / 1000, points: s ? s.buffer.length : 0,
          lastWall: s && s.buffer.length ? s.buffer.last(1) : null,
          frames: window.vdl.stats.frames, draws: window.vdl.stats.draws, gaps: window.vdl.stats.gaps};
}"""


# -- processes ------------------------------------------------------------------------------------


def readline(proc: subprocess.Popen, timeout: float) -> str:
    """Read one line of ``proc``'s stdout, waiting at most ``timeout`` seconds ("" on timeout)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


class Serve(ServeProcess):
    """The benchmarks' ``vdl-stream serve`` subprocess, also timing its start-up and reporting
    the server's memory and CPU."""

    def __init__(self, logdir: Path, log: Path) -> None:
        t0 = time.perf_counter()
        super().__init__(logdir, log)
        self.start_s = time.perf_counter() - t0
        self.ws_url = self.ws

    def rss_mb(self) -> float:
        """The server process's resident memory, MB."""
        return psutil.Process(self.proc.pid).memory_info().rss / 1e6

    def cpu_s(self) -> float:
        """CPU seconds the server process and its live child processes (reader processes read
        for it) have used so far."""
        proc = psutil.Process(self.proc.pid)
        total = 0.0
        for p in (proc, *proc.children()):
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:  # ended meanwhile
                continue
            total += t.user + t.system
        return total


def chromium_cpu_s(browser_pid: int | None) -> float:
    """CPU seconds used by Chromium's processes (browser, renderer, GPU, utility) so far."""
    if browser_pid is None:
        return float("nan")
    try:
        root = psutil.Process(browser_pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total
    except psutil.NoSuchProcess:
        return float("nan")


def renderer_main_cpu_s(browser_pid: int | None) -> dict[int, float]:
    """CPU seconds each Chromium renderer's main thread has used so far, by renderer pid (the
    main thread's id is the process's own, ``/proc/<pid>/task/<pid>/stat``): the page's own work,
    scripts, style, layout, paint and commit alike, without its compositor or raster threads and
    without the time the thread waited for a core (what a loaded machine adds to task times)."""
    if browser_pid is None:
        return {}
    out = {}
    try:
        children = psutil.Process(browser_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    for p in children:
        try:
            if "--type=renderer" in p.cmdline():
                out[p.pid] = process_cpu_s(p.pid, thread=p.pid)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            pass
    return out


def chromium_threads_cpu_s(browser_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of every thread of Chromium's processes, summed by process type and
    thread name (``renderer/Compositor``, ``gpu-process/VizCompositorTh``, ``browser/main``;
    the names as /proc/<pid>/task/<tid>/comm has them, a process's main thread as ``main``): which
    of them works beside the page's main thread (``renderer/main``)."""
    if browser_pid is None:
        return {}
    out: Counter[str] = Counter()
    try:
        root = psutil.Process(browser_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    for p in procs:
        try:
            kind = next(
                (a.split("=", 1)[1] for a in p.cmdline() if a.startswith("--type=")), "browser"
            )
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                with open(f"/proc/{p.pid}/task/{tid}/comm") as f:
                    name = "main" if int(tid) == p.pid else f.read().strip()
                out[f"{kind}/{name}"] += process_cpu_s(p.pid, thread=int(tid))
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            pass
    return dict(out)


def find_browser_pid() -> int | None:
    """The pid of the Chromium browser process this script launched (a child of the driver)."""
    me = psutil.Process()
    for p in me.children(recursive=True):
        try:
            if "--remote-debugging-pipe" in p.cmdline():
                return p.pid
        except psutil.NoSuchProcess:
            pass
    return None


# -- CDP ------------------------------------------------------------------------------------------


def perf_metrics(cdp) -> dict[str, float]:
    """``Performance.getMetrics`` as a dict."""
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def heap_usage(cdp) -> dict[str, float]:
    """``Runtime.getHeapUsage``: usedSize, totalSize and (newer Chromium) backingStorageSize."""
    return cdp.send("Runtime.getHeapUsage")


def fetch_bundle(url: str) -> str:
    """The page's script as the server serves it (to show the code behind minified names)."""
    with urllib.request.urlopen(url + "/static/app.js", timeout=30) as response:
        return response.read().decode()


def top_functions(profile: dict, n: int = 15, bundle: str | None = None) -> list[dict]:
    """Self time by function in a ``Profiler.stop`` profile, largest first.

    The bundle is minified; with ``bundle`` (the served app.js), each of its functions comes with
    the first characters of its code, to find it in ui/src or uPlot.
    """
    lines = bundle.split("\n") if bundle else []
    nodes = {node["id"]: node for node in profile["nodes"]}
    self_us: Counter = Counter()
    # timeDeltas[i] is the time from sample i-1 to sample i: charge it to sample i-1.
    samples, deltas = profile["samples"], profile["timeDeltas"]
    for i in range(len(samples) - 1):
        self_us[samples[i]] += deltas[i + 1]
    total = sum(self_us.values()) or 1
    by_function: Counter = Counter()
    for node_id, us in self_us.items():
        frame = nodes[node_id]["callFrame"]
        url = frame.get("url", "")
        where = (
            f"{url.rsplit('/', 1)[-1]}:{frame['lineNumber'] + 1}:{frame['columnNumber'] + 1}"
            if url
            else ""
        )
        by_function[(frame["functionName"] or "(anonymous)", where)] += us
    top = []
    for (name, where), us in by_function.most_common(n):
        entry = {"function": name, "at": where, "self_ms": us / 1000, "share": us / total}
        if where.startswith("app.js:") and lines:
            line, column = (int(x) for x in where.split(":")[1:])
            if line <= len(lines):
                entry["code"] = lines[line - 1][max(0, column - 31) : column + 59]
        top.append(entry)
    return top


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return float("nan")
    t = np.array([p[0] for p in points])
    v = np.array([p[1] for p in points])
    return float(np.polyfit(t, v, 1)[0] * 60)


# -- live load ------------------------------------------------------------------------------------


def live(args, browser, work: Path) -> dict:
    """The live part: 20 tags x 1,000 points/s into an open page, sampled through CDP."""
    server = writer = context = None
    try:
        server = Serve(work / "live-logs", work / "serve-live.log")
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.wait_for_function("() => window.vdl && window.vdl.connected", timeout=30_000)
        bundle = fetch_bundle(server.url)
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        writer = subprocess.Popen(
            [
                sys.executable, str(HERE / "dashboard_writer.py"),
                "--url", server.ws_url, "--run", LIVE_RUN, "--tags", str(args.live_tags),
                "--rate", str(args.rate), "--duration", str(args.duration + args.profile),
                "--prefill", str(args.prefill),
            ],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        if readline(writer, 60).strip() != "ready":
            raise RuntimeError("the writer did not attach")
        tags = [tag_name(i) for i in range(args.live_tags)]
        cdp.send("HeapProfiler.collectGarbage")
        start_heap = perf_metrics(cdp)["JSHeapUsedSize"]
        browser_pid = find_browser_pid()
        cpu0 = (time.perf_counter(), chromium_cpu_s(browser_pid), server.cpu_s())

        writer.stdin.write("go\n")
        writer.stdin.flush()
        prefill = None
        if args.prefill:
            t_prefill = time.perf_counter()
            line = readline(writer, 600)
            if not line or not json.loads(line)["prefilled"]:
                raise RuntimeError("the writer could not log the prefill")
            held = min(args.prefill, RING_CAPACITY)
            page.wait_for_function(
                "([run, tags, n]) => tags.every(t => { const s = window.vdl.store.series(run, t);"
                " return s && s.buffer.length >= n; })",
                arg=[LIVE_RUN, tags, held],
                timeout=600_000,
            )
            prefill = {
                "points_per_tag": args.prefill,
                "held": held,
                "seconds": time.perf_counter() - t_prefill,
            }
            cdp.send("HeapProfiler.collectGarbage")
            start_heap = perf_metrics(cdp)["JSHeapUsedSize"]
            writer.stdin.write("go\n")
            writer.stdin.flush()
        go = time.perf_counter()
        samples = []
        while True:
            now = time.perf_counter() - go
            m = perf_metrics(cdp)
            h = heap_usage(cdp)
            pr = page.evaluate(PROGRESS_JS, [LIVE_RUN, tags[0]])
            samples.append({"t": now, **m, "backing": h.get("backingStorageSize"), **pr})
            if now >= args.duration or writer.poll() is not None:
                break
            time.sleep(min(args.interval, max(0.05, args.duration - now)))
        cpu1 = (time.perf_counter(), chromium_cpu_s(browser_pid), server.cpu_s())
        in_view = page.evaluate(IN_VIEW_JS)
        renders = page.evaluate(
            "() => Object.fromEntries([...window.vdl.chartWrappers].map(([t, c]) => [t, c.renders]))"
        )

        profile = None
        if args.profile > 0 and writer.poll() is None:
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 500})
            cdp.send("Profiler.start")
            time.sleep(args.profile)
            profile = cdp.send("Profiler.stop")["profile"]
            cdp.send("Profiler.disable")

        line = readline(writer, args.duration + args.profile + 120)
        if not line:
            raise RuntimeError("the writer did not finish in time")
        sent = json.loads(line)
        writer.wait(30)
        # Catching up: how long after the last flush until the page holds every point.
        t_flushed = time.perf_counter()
        n = sent["points_per_tag"]
        try:
            page.wait_for_function(
                "([run, tags, n]) => tags.every(t => { const s = window.vdl.store.series(run, t);"
                " return s && s.buffer.length >= n; })",
                arg=[LIVE_RUN, tags, min(n, RING_CAPACITY)],
                timeout=60_000,
            )
            catch_up = time.perf_counter() - t_flushed
        except Exception:  # the page never caught up: reported as a miss
            catch_up = None
        received = page.evaluate(
            "([run, tags]) => tags.map(t => { const s = window.vdl.series(run, t);"
            " const k = s.steps.length; return [k, k ? s.steps[0] : null, k ? s.steps[k - 1] : null]; })",
            [LIVE_RUN, tags],
        )
        cdp.send("HeapProfiler.collectGarbage")
        end = perf_metrics(cdp)
        end_backing = heap_usage(cdp).get("backingStorageSize")
        stats = page.evaluate("() => window.vdl.stats")
        return summarize_live(
            args, samples, start_heap, end, end_backing, sent, received, catch_up, in_view,
            renders, stats, errors, cpu0, cpu1, profile, bundle, prefill,
        )  # fmt: skip
    finally:
        stop_process(writer)
        if context is not None:
            context.close()
        if server is not None:
            server.stop()


def summarize_live(
    args, samples, start_heap, end, end_backing, sent, received, catch_up, in_view,
    renders, stats, errors, cpu0, cpu1, profile, bundle, prefill,
) -> dict:  # fmt: skip
    """Turn the raw samples into the figures of the report."""
    first, last = samples[0], samples[-1]
    span = last["Timestamp"] - first["Timestamp"]

    def share(name: str, a: dict, b: dict) -> float:
        return (b[name] - a[name]) / (b["Timestamp"] - a["Timestamp"])

    intervals = [share("TaskDuration", a, b) for a, b in itertools.pairwise(samples)]
    half = [s for s in samples if s["t"] >= last["t"] / 2]
    # From the second sample on: the first may still show the prefill's newest (older) point.
    lag = [s["now"] - s["lastWall"] for s in samples[1:] if s["lastWall"] is not None]
    n = sent["points_per_tag"]
    held = min(n, RING_CAPACITY)
    busy = [(b["t"], share("TaskDuration", a, b)) for a, b in itertools.pairwise(samples)]
    quarter = max(1, len(busy) // 4)
    return {
        "prefill": prefill,
        "tags": args.live_tags,
        "rate_per_tag": args.rate,
        "duration_s": args.duration,
        "measured_s": span,
        "charts_in_view": {"intersecting": in_view[0], "whole": in_view[1]},
        "busy_share": share("TaskDuration", first, last),
        "script_share": share("ScriptDuration", first, last),
        "layout_share": share("LayoutDuration", first, last),
        "style_share": share("RecalcStyleDuration", first, last),
        "busy_share_intervals": {
            "first_quarter": statistics.mean(x for _, x in busy[:quarter]),
            "last_quarter": statistics.mean(x for _, x in busy[-quarter:]),
            "median": statistics.median(intervals),
            "max": max(intervals),
            "min": min(intervals),
        },
        "chromium_cpu_share": (cpu1[1] - cpu0[1]) / (cpu1[0] - cpu0[0]),
        "server_cpu_share": (cpu1[2] - cpu0[2]) / (cpu1[0] - cpu0[0]),
        "writer_cpu_s": sent["cpu_s"],
        "heap_mb": {
            "start_after_gc": start_heap / 1e6,
            "peak": max(s["JSHeapUsedSize"] for s in samples) / 1e6,
            "end_after_gc": end["JSHeapUsedSize"] / 1e6,
            "second_half_slope_per_min": slope_per_min(
                [(s["t"], s["JSHeapUsedSize"] / 1e6) for s in half]
            ),
        },
        "array_buffers_mb": {
            "start": (first["backing"] or 0) / 1e6,
            "end": (end_backing or 0) / 1e6,
            "ring_data_expected": args.live_tags * held * 4 * 8 / 1e6,
        },
        "busy_samples": [[round(t, 1), round(x, 4)] for t, x in busy],
        "heap_samples_mb": [
            [round(s["t"], 1), round(s["JSHeapUsedSize"] / 1e6, 2)] for s in samples
        ],
        "latency_s": {"median": statistics.median(lag), "max": max(lag)} if lag else None,
        "sent_per_tag": n,
        "writer": sent,
        "received": {
            "complete_tags": sum(
                1 for k, a, b in received if k == held and a == n - held and b == n - 1
            ),
            "min_points": min(k for k, _, _ in received),
            "max_points": max(k for k, _, _ in received),
        },
        "catch_up_s": catch_up,
        "renders": renders,
        "renders_in_view": sorted({r for r in renders.values() if r > 0}) or [0],
        "renders_out_of_view": sum(1 for r in renders.values() if r == 0),
        "page_stats": stats,
        "page_errors": errors,
        "profile_top": top_functions(profile, 15, bundle) if profile else None,
        "profile_s": args.profile,
    }


# -- the recorded run -----------------------------------------------------------------------------


def ensure_run(cache: Path, tags: int, steps: int) -> tuple[Path, dict]:
    """Write (once; cached) a run of ``tags`` x ``steps`` scalars; return its logdir and facts."""
    logdir = cache / f"run-{tags}x{steps}"
    marker = logdir / "generated.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        info["cached"] = True
        return logdir, info
    shutil.rmtree(logdir, ignore_errors=True)
    run_dir = logdir / BIG_RUN
    batch = 1 << 16  # one recorder chunk per tag per append
    rng = np.random.default_rng(6)
    t0 = time.perf_counter()
    w = RunWriter(run_dir, sync="never")
    try:
        for start in range(0, steps, batch):
            s = np.arange(start, min(steps, start + batch), dtype=np.int64)
            walls = WALL0 + s * 0.05
            for tag in range(tags):
                values = np.exp(-s / (steps / 3)) * (1 + tag / tags) + rng.normal(0, 0.05, len(s))
                w.append_scalars(f"big/t{tag:03d}", s, walls, values)
    finally:
        w.close()
    seconds = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in run_dir.iterdir())
    info = {
        "tags": tags,
        "steps": steps,
        "points": tags * steps,
        "generate_s": seconds,
        "bytes": size,
    }
    marker.write_text(json.dumps(info))
    info["cached"] = False
    return logdir, info


#: The page's scripts as Resource Timing has them: name, bytes (decoded) and when each arrived.
SCRIPTS_JS = """() => performance.getEntriesByType('resource')
  .filter((e) => new URL(e.name).pathname.endsWith('.js'))
  .map((e) => ({name: new URL(e.name).pathname.split('/').pop(), bytes: e.decodedBodySize,
                start: e.startTime, end: e.responseEnd}))"""


#: Trace events of a script's compilation and top-level evaluation: a classic script's
#: ``EvaluateScript`` (its URL in ``args.data.url``), a module graph's ``v8.evaluateModule``.
SCRIPT_EVENTS = frozenset({"EvaluateScript", "v8.compile", "v8.compileModule", "v8.evaluateModule"})


def script_costs(events: list[dict]) -> list[dict]:
    """The script compilations and evaluations on the page's main thread in a Chromium trace
    (complete events; one nested in another, a classic script's compilation, is left out), each
    as ``{name, url, at, ms}``, ``at`` in ms from the page's navigation start."""
    starts = [
        e
        for e in events
        if e["name"] == "navigationStart"
        and (e.get("args", {}).get("data") or {}).get("documentLoaderURL")
    ]
    if not starts:
        return []
    nav = starts[-1]
    mine = [
        e
        for e in events
        if e["name"] in SCRIPT_EVENTS
        and e.get("ph") == "X"
        and (e["pid"], e["tid"]) == (nav["pid"], nav["tid"])
        and e["ts"] >= nav["ts"]
    ]
    out: list[dict] = []
    end = 0
    for e in sorted(mine, key=lambda e: e["ts"]):
        if e["ts"] < end:
            continue  # inside the last one
        end = e["ts"] + e.get("dur", 0)
        args = e.get("args", {})
        url = (args.get("data") or {}).get("url") or args.get("fileName") or ""
        out.append(
            {
                "name": e["name"],
                "url": url.rsplit("/", 1)[-1],
                "at": (e["ts"] - nav["ts"]) / 1000,
                "ms": e.get("dur", 0) / 1000,
            }
        )
    return out


def load_once(browser, url: str, tags: int, profile: bool = False, trace: bool = False) -> dict:
    """Open the page in a fresh context; time it until the charts in view have data.

    With ``profile``, a CPU profile covers the load (its overhead slows the load down a little).
    With ``trace``, a Chromium trace does, from which the scripts' compilation and top-level
    evaluation are taken (``script_costs``, ``script_eval_first_ms``: those that began before the
    charts were shown).
    """
    context = browser.new_context(viewport=VIEWPORT)
    try:
        context.add_init_script(script=f"window.__vdlBenchExpect = {tags};\n{PROBE}")
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        cdp = None
        if profile:
            cdp = context.new_cdp_session(page)
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 200})
            cdp.send("Profiler.start")
        traced: list[dict] = []
        trace_done: list[bool] = []
        if trace:
            cdp = context.new_cdp_session(page)
            cdp.on("Tracing.dataCollected", lambda e: traced.extend(e["value"]))
            cdp.on("Tracing.tracingComplete", lambda e: trace_done.append(True))
            categories = ["devtools.timeline", "v8.execute", "blink.user_timing"]
            cdp.send(
                "Tracing.start",
                {"traceConfig": {"includedCategories": categories}, "transferMode": "ReportEvents"},
            )
        t0 = time.perf_counter()
        page.goto(url + "/", wait_until="commit")
        page.wait_for_function(
            "() => window.__vdlBench && window.__vdlBench.shown !== null",
            polling="raf",
            timeout=60_000,
        )
        wall = time.perf_counter() - t0
        top = None
        if profile:
            top = top_functions(cdp.send("Profiler.stop")["profile"], 20, fetch_bundle(url))
        # Charts below the fold: give them a moment (they may not be drawn until scrolled to).
        with contextlib.suppress(Exception):  # "all" stays null: reported as such
            page.wait_for_function("() => window.__vdlBench.all !== null", timeout=3_000)
        probe = page.evaluate("() => window.__vdlBench")
        nav = page.evaluate(
            "() => { const n = performance.getEntriesByType('navigation')[0];"
            " return {responseEnd: n.responseEnd, domContentLoaded: n.domContentLoadedEventEnd}; }"
        )
        in_view = page.evaluate(IN_VIEW_JS)
        scripts = page.evaluate(SCRIPTS_JS)
        points = page.evaluate("() => [...window.vdl.charts.values()].map(u => u.data[0].length)")
        if trace:
            cdp.send("Tracing.end")
            deadline = time.monotonic() + 30
            while not trace_done and time.monotonic() < deadline:
                page.wait_for_timeout(50)
    finally:
        context.close()
    snap = [f for f in probe["frames"] if f["type"] == "snapshot"]
    snap_at = snap[-1]["at"] + snap[-1]["handled"] if snap else None
    subscribe = probe["sends"][0] if probe["sends"] else None
    return {
        "driver_s": wall,
        "shown_ms": probe["shown"],
        "shown_charts": probe["shownCharts"],
        "all_drawn_ms": probe["all"],
        "html_ms": nav["responseEnd"],
        "dom_ready_ms": nav["domContentLoaded"],
        "ws_created_ms": probe["created"],
        "ws_open_ms": probe["open"],
        "subscribe_ms": subscribe,
        "snapshot_arrived_ms": snap[0]["at"] if snap else None,
        "snapshot_bytes": sum(f["bytes"] for f in snap),
        "snapshot_frames": len(snap),
        "decode_store_ms": sum(f["handled"] for f in snap),
        "server_ms": snap[0]["at"] - subscribe if snap and subscribe is not None else None,
        "draw_ms": probe["shown"] - snap_at if snap_at is not None else None,
        "frames": probe["frames"],
        "long_tasks": probe["longTasks"],
        "charts_in_view": in_view,
        "drawn_points_per_chart": points,
        "page_errors": errors,
        "profile_top": top,
        "scripts": scripts,
        # The scripts the page had fetched by the time its charts were shown (the bundle's first
        # part: with ui/build.mjs's split, app.js and its shared chunk), and from the last of
        # them to the end of DOMContentLoaded: their compilation and evaluation, the page built
        # (module scripts run before it fires).
        "first_script_bytes": sum(s["bytes"] for s in scripts if s["end"] <= probe["shown"]),
        "scripts_to_dom_ready_ms": nav["domContentLoaded"]
        - max((s["end"] for s in scripts if s["end"] <= probe["shown"]), default=0.0),
        **traced_scripts(traced, probe["shown"]),
    }


def traced_scripts(events: list[dict], shown_ms: float) -> dict:
    """``load_once``'s figures from a trace (none without one)."""
    if not events:
        return {}
    costs = script_costs(events)
    return {
        "script_costs": costs,
        "script_eval_first_ms": sum(c["ms"] for c in costs if c["at"] < shown_ms),
        "script_eval_later_ms": sum(c["ms"] for c in costs if c["at"] >= shown_ms),
    }


def load(args, browser, work: Path) -> dict:
    """The load part: open the recorded run, cold and warm, ``--starts`` server starts."""
    gen_t0 = time.perf_counter()
    logdir, info = ensure_run(Path(args.cache), args.tags, args.steps)
    info["ensure_s"] = time.perf_counter() - gen_t0
    rounds = []
    profiled = None
    for _ in range(args.starts):
        server = None
        try:
            server = Serve(logdir, work / "serve-load.log")
            cpu0 = server.cpu_s()
            loads = [load_once(browser, server.url, args.tags) for _ in range(1 + args.repeat)]
            rounds.append(
                {
                    "serve_start_s": server.start_s,
                    "server_cpu_s": server.cpu_s() - cpu0,
                    "server_rss_mb": server.rss_mb(),
                    "loads": loads,
                }
            )
            if args.load_profile and len(rounds) == args.starts:
                profiled = load_once(browser, server.url, args.tags, profile=True)
        finally:
            if server is not None:
                server.stop()
    # The server alone (a plain WebSocket client): its share of the wait, cold and warm.
    server_only = []
    for _ in range(args.starts):
        server = None
        try:
            server = Serve(logdir, work / "serve-load.log")
            rss0 = server.rss_mb()
            cold_ws = snapshot_time(server.ws_url)
            warm_ws = [snapshot_time(server.ws_url) for _ in range(args.repeat)]
            server_only.append(
                {
                    "cold": cold_ws,
                    "warm": warm_ws,
                    "rss_mb_before": rss0,
                    "rss_mb_after": server.rss_mb(),
                }
            )
        finally:
            if server is not None:
                server.stop()
    cold = [r["loads"][0] for r in rounds]
    warm = [x for r in rounds for x in r["loads"][1:]]

    def med(rows, key):
        vals = [r[key] for r in rows if r[key] is not None]
        return statistics.median(vals) if vals else None

    keys = ["shown_ms", "all_drawn_ms", "driver_s", "html_ms", "dom_ready_ms", "ws_open_ms", "server_ms",
            "decode_store_ms", "draw_ms"]  # fmt: skip
    return {
        "run": info,
        "rounds": rounds,
        "cold_median": {k: med(cold, k) for k in keys},
        "warm_median": {k: med(warm, k) for k in keys},
        "profiled_load": profiled,
        "server_only": server_only,
        "server_only_cold_s": [r["cold"]["snapshot_s"] for r in server_only],
        "server_only_warm_median_s": statistics.median(
            w["snapshot_s"] for r in server_only for w in r["warm"]
        ),
        "cold_all_shown_ms": [r["shown_ms"] for r in cold],
        "warm_all_shown_ms": [r["shown_ms"] for r in warm],
    }


# -- report ---------------------------------------------------------------------------------------


def report(result: dict) -> str:
    """The Markdown summary printed at the end."""
    out = []
    lv = result.get("live")
    if lv:
        h = lv["heap_mb"]
        out += [
            f"## live: {lv['tags']} tags x {lv['rate_per_tag']} points/s, {lv['duration_s']:.0f} s "
            f"({lv['charts_in_view']['intersecting']} charts in view, {lv['charts_in_view']['whole']} whole)"
            + (
                f", after a prefill of {lv['prefill']['points_per_tag']:,} points per tag "
                f"({lv['prefill']['held']:,} held, in {lv['prefill']['seconds']:.1f} s)"
                if lv["prefill"]
                else ""
            ),
            "",
            "| metric | value | target |",
            "| --- | ---: | --- |",
            f"| main-thread busy (TaskDuration / wall) | {lv['busy_share']:.1%} | < 50% |",
            f"| of which script / layout / style | {lv['script_share']:.1%} / {lv['layout_share']:.1%} / "
            f"{lv['style_share']:.1%} | |",
            f"| busy per {result['args']['interval']:.0f} s interval: median / max; first / last quarter | "
            f"{lv['busy_share_intervals']['median']:.1%} / {lv['busy_share_intervals']['max']:.1%}; "
            f"{lv['busy_share_intervals']['first_quarter']:.1%} / {lv['busy_share_intervals']['last_quarter']:.1%} | |",
            f"| Chromium CPU (all processes) / server CPU, of one core | {lv['chromium_cpu_share']:.0%} / "
            f"{lv['server_cpu_share']:.0%} | |",
            f"| JS heap: start (after GC) / peak / end (after GC) | {h['start_after_gc']:.1f} / {h['peak']:.1f} / "
            f"{h['end_after_gc']:.1f} MB | bounded |",
            f"| JS heap slope, second half | {h['second_half_slope_per_min']:+.2f} MB/min | |",
            f"| ArrayBuffers: start / end (ring data expected) | {lv['array_buffers_mb']['start']:.1f} / "
            f"{lv['array_buffers_mb']['end']:.1f} ({lv['array_buffers_mb']['ring_data_expected']:.1f}) MB | |",
            "| newest point's age on the page: median / max | "
            + (f"{lv['latency_s']['median'] * 1000:.0f} / {lv['latency_s']['max'] * 1000:.0f} ms" if lv["latency_s"] else "-")
            + " | |",
            f"| points per tag: sent / held by the page, newest kept (complete tags) | {lv['sent_per_tag']:,} / "
            f"{lv['received']['min_points']:,}-{lv['received']['max_points']:,} "
            f"({lv['received']['complete_tags']}/{lv['tags']}) | all |",
            f"| redraws of each drawn chart; charts never drawn | {min(lv['renders_in_view'])}-{max(lv['renders_in_view'])}; {lv['renders_out_of_view']} "
            f"(WebSocket frames {lv['page_stats']['frames']}, gaps {lv['page_stats']['gaps']}) | |",
            "| catch-up after the writer's last flush | "
            + (f"{lv['catch_up_s']:.2f} s" if lv["catch_up_s"] is not None else "never (60 s)")
            + " | |",
        ]  # fmt: skip
        if lv["profile_top"]:
            out += ["", f"CPU profile, {lv['profile_s']:.0f} s, self time:", ""]
            out += [
                f"- {p['share']:.1%} {p['function']} {p['at']} {p.get('code', '')!r}"
                for p in lv["profile_top"]
            ]
        out.append("")
    ld = result.get("load")
    if ld:
        r = ld["run"]
        out += [
            f"## load: {r['tags']} tags x {r['steps']:,} steps = {r['points']:,} points, "
            f"{r['bytes'] / 1e6:.0f} MB (generated in {r['generate_s']:.1f} s"
            + (", cached" if r["cached"] else "")
            + ")",
            "",
            "| ms from navigation start (median) | cold | warm |",
            "| --- | ---: | ---: |",
        ]
        for k in [
            "html_ms",
            "dom_ready_ms",
            "ws_open_ms",
            "server_ms",
            "decode_store_ms",
            "draw_ms",
            "shown_ms",
            "all_drawn_ms",
        ]:
            c, w = ld["cold_median"][k], ld["warm_median"][k]
            out.append(
                f"| {k} | {c:.0f} | {w:.0f} |"
                if c is not None and w is not None
                else f"| {k} | {c} | {w} |"
            )
        out.append(
            f"| driver: goto to detected (s) | {ld['cold_median']['driver_s']:.2f} | {ld['warm_median']['driver_s']:.2f} |"
        )
        out.append("")
        out.append(f"cold shown_ms: {[round(x) for x in ld['cold_all_shown_ms']]}")
        out.append(f"warm shown_ms: {[round(x) for x in ld['warm_all_shown_ms']]}")
        out.append(
            f"server alone (WebSocket client, subscribe to last snapshot): cold "
            f"{[round(x * 1000) for x in ld['server_only_cold_s']]} ms, warm median "
            f"{ld['server_only_warm_median_s'] * 1000:.0f} ms; server RSS "
            f"{ld['server_only'][0]['rss_mb_before']:.0f} MB before, {ld['server_only'][0]['rss_mb_after']:.0f} MB after"
        )
        first = ld["rounds"][0]["loads"][0]
        out.append(
            f"charts in view: {first['shown_charts']} of {r['tags']}; snapshot {first['snapshot_bytes'] / 1e3:.0f} kB "
            f"in {first['snapshot_frames']} frame(s); server start {ld['rounds'][0]['serve_start_s']:.2f} s"
        )
        if ld["profiled_load"] and ld["profiled_load"]["profile_top"]:
            pl = ld["profiled_load"]
            out += [
                "",
                f"CPU profile of one warm load (shown at {pl['shown_ms']:.0f} ms under the profiler), self time:",
                "",
            ]
            out += [
                f"- {p['share']:.1%} {p['self_ms']:.0f} ms {p['function']} {p['at']} {p.get('code', '')!r}"
                for p in pl["profile_top"]
            ]
    return "\n".join(out)


def main() -> None:
    """Parse the arguments, run the parts asked for, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="15 s of live load, one server start")
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds of live load (default 60)"
    )
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between CDP samples")
    parser.add_argument(
        "--profile",
        type=float,
        default=5.0,
        help="seconds of CPU profile after the window (0: none)",
    )
    parser.add_argument("--live-tags", type=int, default=20)
    parser.add_argument("--rate", type=int, default=1000, help="points per second per tag")
    parser.add_argument(
        "--prefill", type=int, default=0,
        help="points per tag logged at once before the measured window (262144 fills the page's rings)",
    )  # fmt: skip
    parser.add_argument("--tags", type=int, default=10, help="tags of the recorded run")
    parser.add_argument(
        "--steps", type=int, default=1_000_000, help="steps per tag of the recorded run"
    )
    parser.add_argument(
        "--starts", type=int, default=None, help="server starts (cold loads; default 3)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="warm loads per server start")
    parser.add_argument(
        "--no-load-profile",
        dest="load_profile",
        action="store_false",
        help="skip the extra, CPU-profiled page load",
    )
    parser.add_argument(
        "--cache", default=os.path.join(tempfile.gettempdir(), "vdl-bench-dashboard")
    )
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--out", default=str(HERE / "out" / "dashboard.json"))
    # -- issue 12: many runs (bench/dashboard_runs.py) --
    parser.add_argument("--runs", action="store_true", help="only the many-runs part (issue 12)")
    parser.add_argument("--runs-count", type=int, default=1000, help="runs of the served directory")
    parser.add_argument("--runs-points", type=int, default=10_000, help="points per tag and run")
    parser.add_argument("--runs-starts", type=int, default=None, help="server starts (default 2)")
    parser.add_argument("--runs-live", type=int, default=50, help="runs logging live")
    parser.add_argument("--runs-rate", type=int, default=100, help="points/s per tag, live runs")
    parser.add_argument("--runs-duration", type=float, default=None, help="live seconds (30)")
    parser.add_argument("--runs-skip-load", action="store_true")
    parser.add_argument("--runs-skip-live", action="store_true")
    parser.add_argument(
        "--runs-page-cache",
        choices=("cold", "warm", "as-is"),
        default="cold",
        help="the selected runs' files before each selection: evicted from the OS page cache"
        " (read from the disk, as a server over a sweep written earlier), read into it, or left"
        " as the machine has them (then whichever tree runs first reads from the disk)",
    )
    parser.add_argument(
        "--runs-previews",
        action="store_true",
        help="serve a copy of the sweep whose runs have previews (recorder/preview.py; made once"
        " under bench/out/runs-preview, its data files hard links to the sweep's), as runs closed"
        " by this tree's writer have",
    )
    parser.add_argument(
        "--runs-profile",
        action="store_true",
        help="CPU profiles of the page over the selection and the live load (self time by function)",
    )
    parser.add_argument(
        "--runs-trace",
        action="store_true",
        help="a trace of the page's main thread over the selections and the live load (self time by event)",
    )
    args = parser.parse_args()
    if args.runs_starts is None:
        args.runs_starts = 1 if args.quick else 2
    if args.runs_duration is None:
        args.runs_duration = 15.0 if args.quick else 30.0
    if args.runs:
        args.out = args.out.replace("dashboard.json", "dashboard-runs.json")
    if args.duration is None:
        args.duration = 15.0 if args.quick else 60.0
    if args.starts is None:
        args.starts = 1 if args.quick else 3

    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        sys.exit("chromium is not installed")
    result: dict = {
        "args": vars(args),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_before": os.getloadavg(),
            "python": platform.python_version(),
            "chromium": subprocess.run([executable, "--version"], capture_output=True, text=True).stdout.strip(),
        },
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip(),
        "bundle_sha256": hashlib.sha256((ROOT / "vdl_stream" / "static" / "app.js").read_bytes()).hexdigest()[:16],
        "bundle_dirty": bool(
            subprocess.run(["git", "status", "--porcelain", "vdl_stream/static"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        ),
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="vdl-bench-dashboard-") as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            result["machine"]["browser_version"] = browser.version
            if args.runs:
                result["runs"] = dashboard_runs.run(args, browser, Path(tmp))
            else:
                if not args.skip_live:
                    result["live"] = live(args, browser, Path(tmp))
                if not args.skip_load:
                    result["load"] = load(args, browser, Path(tmp))
        finally:
            browser.close()
    result["machine"]["load_avg_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(dashboard_runs.report(result["runs"]) if args.runs else report(result))
    print(f"\n(full record: {args.out})")


if __name__ == "__main__":
    main()
