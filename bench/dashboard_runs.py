"""The page figures of issue 12 (many runs), for ``bench/bench_dashboard.py --runs``.

Three measures, each against a real ``vdl-stream serve`` subprocess and headless Chromium:

* load: a log directory of ``--runs-count`` runs (bench/runs_data.py: 10 tags x ``--runs-points``
  points, hparams, host; cached under bench/out/runs) is served ``--runs-starts`` times and opened
  1 + ``--repeat`` times per start, each in a fresh browser context (the first load after a start
  is "cold"). An init script (RUNS_PROBE_JS) notes, at each animation frame from the navigation
  start, when the runs table is filled (a summary of every run, and rows in the DOM) and when the
  first scalar chart has data, then when every chart in view has.
* select: in the last page, the search box keeps the 100 runs named ``s05-*`` (none of them
  selected: the default selection is the newest ten), then ``All`` is clicked; the time from the
  click until every scalar chart in view draws 100 lines (the page re-subscribes to those runs and
  draws their snapshots), with the page's main-thread time over it (CDP Performance.getMetrics:
  TaskDuration, ScriptDuration, LayoutDuration). Then that page is reloaded: it remembers the 100
  runs and subscribes to them at once; the same probe times the table and the first charts, and
  the time until every chart in view draws them all is noted (at a 30 ms poll: an upper bound;
  the search is not remembered, so the ten runs selected by default are drawn too). Then, with a
  plain WebSocket client on one connection: 100 ``s06-*`` runs subscribed, then the same with one
  of them swapped for an open run, with ``keep`` (only the added run is sent) and without (all
  100 again): seconds to each ``synced``.
  Before the selection and before the server alone reads 100 unread runs, those runs' files
  are evicted from the OS page cache (``--runs-page-cache cold``, POSIX_FADV_DONTNEED: each tree
  reads them from the disk alike), read into it (``warm``) or left as they are (``as-is``: the
  first tree of a sitting then reads from the disk, the next ones from memory).
* live: ``--runs-live`` runs (bench/runs_writer.py, its own process) log 10 tags at
  ``--runs-rate`` points/s each while the page shows all of them (``All`` clicked); every
  ``--interval`` seconds the Chrome DevTools Protocol's ``Performance.getMetrics`` gives the
  main-thread busy share (d TaskDuration / d Timestamp) and JSHeapUsedSize; the heap is also read
  after ``HeapProfiler.collectGarbage`` at the start, halfway and at the end; the page's own
  counters give its drawing frames, the ms in their drawing calls and the ms after them until the
  next frame began (rasterizing and commit, ui/src/frames.js).

The select measure also records the CPU the server and Chromium (all its processes) spent over
it: on a loaded machine the wall-clock figure moves with the minute, what each side spent less.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

VIEWPORT = {"width": 1400, "height": 1000}

# Injected before the page's scripts: when the table is filled, the first chart has data, every
# chart in view has data (ms since the navigation started). Stops after 120 s.
RUNS_PROBE_JS = """(() => {
  const t = { table: null, firstChart: null, inView: null, rows: 0, messages: [], subscribe: null,
              socket: null, script: null };
  window.__runsBench = t;
  const expect = window.__runsBenchExpect;
  // The socket's first messages (hello, runs, summaries): when each arrived, its size and how
  // long the page's handler took; and when the first subscribe went out.
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      // When the page opened its socket, and when the bundle had arrived (its response's end).
      if (t.socket === null) {
        t.socket = performance.now();
        const js = performance.getEntriesByType('resource').find(e => e.name.endsWith('/app.js'));
        t.script = js ? js.responseEnd : null;
      }
    }
    send(data) {
      if (t.subscribe === null) t.subscribe = performance.now();
      return super.send(data);
    }
    set onmessage(fn) {
      super.onmessage = (ev) => {
        const t0 = performance.now();
        fn.call(this, ev);
        if (t.messages.length < 5) t.messages.push({ at: t0, bytes: ev.data.byteLength ?? 0, ms: performance.now() - t0 });
      };
    }
    get onmessage() { return super.onmessage; }
  };
  const tick = () => {
    const now = performance.now();
    const vdl = window.vdl;
    if (vdl) {
      const m = vdl.runsModel;
      if (t.table === null && m && m.summaries.size >= expect) {
        const rows = document.querySelectorAll('.rt-body [data-run]').length;
        if (rows > 0) { t.table = now; t.rows = rows; }
      }
      if (t.firstChart === null) {
        for (const u of vdl.charts.values()) if (u.data[0].length > 0) { t.firstChart = now; break; }
      }
      if (t.firstChart !== null && t.inView === null) {
        const H = window.innerHeight;
        const charts = [...document.querySelectorAll('[data-tag]')].filter(e => {
          const r = e.getBoundingClientRect(); return r.bottom > 0 && r.top < H; });
        if (charts.length && charts.every(e => { const u = vdl.charts.get(e.dataset.tag);
              return u && u.data[0].length > 0; })) t.inView = now;
      }
    }
    if ((t.table === null || t.inView === null) && now < 120000) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();"""

# Every scalar chart in view draws `n` runs (smoothed lines, the raw ones left out).
IN_VIEW_LINES_JS = """() => {
  const H = window.innerHeight;
  const out = [];
  for (const e of document.querySelectorAll('[data-tag]')) {
    const r = e.getBoundingClientRect();
    if (!(r.bottom > 0 && r.top < H)) continue;
    const u = window.vdl.charts.get(e.dataset.tag);
    out.push(u ? u.series.slice(1).filter(s => !String(s.label).endsWith(' (raw)')).length : 0);
  }
  return out;
}"""

# Click "All" and resolve, at the first animation frame where every chart in view draws `n` lines,
# with the milliseconds since the click.
SELECT_JS = """(n) => new Promise((resolve) => {
  const H = window.innerHeight;
  const t0 = performance.now();
  let subscribed = null, synced = null;
  // The drawing frames over the selection: [ms since the click, ms in its drawing calls].
  const draws = [], stats = () => window.vdl.stats;
  let frames = stats().frames, drawMs = stats().drawMs;
  document.querySelector('button.runs-all').click();
  const tick = () => {
    const now = performance.now();
    if (stats().frames !== frames) {
      draws.push([now - t0, stats().drawMs - drawMs]);
      frames = stats().frames;
      drawMs = stats().drawMs;
    }
    const runs = window.vdl.connection.runs;
    if (subscribed === null && Array.isArray(runs) && runs.length === n) subscribed = now - t0;
    if (subscribed !== null && synced === null && window.vdl.sync.phase === 'ready') synced = now - t0;
    const charts = [...document.querySelectorAll('[data-tag]')].filter(e => {
      const r = e.getBoundingClientRect(); return r.bottom > 0 && r.top < H; });
    const done = charts.length > 0 && charts.every(e => { const u = window.vdl.charts.get(e.dataset.tag);
      return u && u.series.slice(1).filter(s => !String(s.label).endsWith(' (raw)')).length === n; });
    if (done) resolve({ ms: now - t0, charts: charts.length, subscribed_ms: subscribed, synced_ms: synced, draws });
    else if (now - t0 > 60000) resolve({ ms: null, charts: charts.length, draws });
    else requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})"""


def page_cache(logdir: Path, prefix: str, mode: str) -> None:
    """Evict the files of the runs of ``logdir`` named ``prefix*`` from the OS page cache
    (``mode`` "cold"), or read them into it ("warm"); "as-is" leaves them."""
    if mode == "as-is":
        return
    for run in sorted(logdir.glob(prefix + "*")):
        for path in run.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                if mode == "cold":
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                else:
                    while os.read(fd, 1 << 22):
                        pass
            finally:
                os.close(fd)


def _serve(logdir: Path, log: Path):  # type: ignore[no-untyped-def]
    from bench_dashboard import Serve

    return Serve(logdir, log)


def load_and_select(args, browser, work: Path) -> dict:  # type: ignore[no-untyped-def]
    """The load and select measures over the cached many-runs log directory."""
    from runs_data import cached_runs, with_previews

    t_gen = time.perf_counter()
    logdir = Path(cached_runs(n_runs=args.runs_count, tags=10, points=args.runs_points))
    if args.runs_previews:
        logdir = Path(with_previews(logdir))
    gen_s = time.perf_counter() - t_gen
    loads = []
    select = None
    for start in range(args.runs_starts):
        server = _serve(logdir, work / f"serve-runs-{start}.log")
        try:
            for k in range(1 + args.repeat):
                last = start == args.runs_starts - 1 and k == args.repeat
                context = browser.new_context(viewport=VIEWPORT)
                try:
                    context.add_init_script(
                        script=f"window.__runsBenchExpect = {args.runs_count};\n{RUNS_PROBE_JS}"
                    )
                    page = context.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
                    page.goto(server.url + "/", wait_until="commit")
                    page.wait_for_function(
                        "() => window.__runsBench && window.__runsBench.table !== null"
                        " && window.__runsBench.inView !== null",
                        timeout=120_000,
                    )
                    probe = page.evaluate("() => window.__runsBench")
                    loads.append(
                        {
                            "start": start,
                            "cold": k == 0,
                            "table_ms": probe["table"],
                            "first_chart_ms": probe["firstChart"],
                            "in_view_ms": probe["inView"],
                            "rows_in_dom": probe["rows"],
                            "subscribe_ms": probe["subscribe"],
                            "socket_ms": probe["socket"],
                            "script_ms": probe["script"],
                            "first_messages": probe["messages"],
                            "subscribed": len(
                                page.evaluate("() => window.vdl.connection.runs || []")
                            ),
                            "errors": errors,
                        }
                    )
                    if last:
                        # What the page looks like with 1,000 runs (to look at, not measured).
                        page.screenshot(path=str(HERE / "out" / "runs-page.png"))
                        # CPU the selection took, server and browser: on a loaded machine the
                        # wall-clock figure moves with the minute; what each side spent, less.
                        from bench_dashboard import (
                            chromium_cpu_s,
                            chromium_threads_cpu_s,
                            find_browser_pid,
                            renderer_main_cpu_s,
                        )

                        browser_pid = find_browser_pid()

                        def cpu(s=server, b=browser_pid) -> tuple[float, float, dict, dict]:
                            return (
                                s.cpu_s(),
                                chromium_cpu_s(b),
                                renderer_main_cpu_s(b),
                                chromium_threads_cpu_s(b),
                            )

                        page_cache(logdir, "s05-", args.runs_page_cache)
                        select = select_runs(page, args.runs_profile, cpu, args.runs_trace)
                        select["page_cache"] = args.runs_page_cache
                        page.screenshot(path=str(HERE / "out" / "runs-select-100.png"))
                        # The same 100 again (None, then All): the server's reads are kept,
                        # so this is mostly the page's own work on 100 snapshots.
                        page.click("button.runs-none")
                        # Until the charts in view dropped the lines (else the next selection
                        # would find them still there and count as done at once).
                        page.wait_for_function(
                            f"() => ({IN_VIEW_LINES_JS})().every(n => n === 0)",
                            timeout=30_000,
                            polling=30,
                        )
                        select["again"] = select_runs(page, args.runs_profile, cpu, args.runs_trace)
                        names = page.evaluate("() => window.vdl.connection.runs")
                        # The server alone, on the same runs (now open: warm) and on 100
                        # others no page has read (cold, as the page's were).
                        select["server_alone_s"] = server_select(
                            server.ws_url, names, select["max_points"]
                        )
                        cold = [
                            n
                            for n in page.evaluate("() => [...window.vdl.runsModel.names]")
                            if n.startswith("s06-")
                        ]
                        page_cache(logdir, "s06-", args.runs_page_cache)
                        select["server_alone_cold_s"] = server_select(
                            server.ws_url, sorted(cold), select["max_points"]
                        )
                        select["reload"] = reload_remembered(page, names)
                        # A change of one run of 100 (the runs open now): a delta with keep,
                        # and the whole subscription again without it.
                        for keep in (True, False):
                            select[f"swap_one_keep_{keep}"] = server_swap(
                                server.ws_url, sorted(cold)[:100], names[0],
                                select["max_points"], keep,
                            )  # fmt: skip
                finally:
                    context.close()
        finally:
            server.stop()
    return {"logdir": str(logdir), "generation_s": gen_s, "loads": loads, "select": select}


def select_runs(page, profile: bool = False, cpu=None, trace: bool = False) -> dict:  # type: ignore[no-untyped-def]
    """Search for the ``s05-*`` runs, then time ``All`` until every chart in view draws 100
    (with ``profile``, under the CPU profiler: self time by function in ``profile_top``; with
    ``cpu``, a function giving the server's and the browser's CPU seconds so far, what each
    spent over the selection; with ``trace``, a trace of the main thread: self time by event in
    ``trace_top``)."""
    page.fill("input.run-search", "s05-")
    page.wait_for_function(
        "() => window.vdl.runsModel.tableRows().length === 100"
        " && Array.isArray(window.vdl.connection.runs) && window.vdl.connection.runs.length === 0",
        timeout=30_000,
    )
    page.wait_for_timeout(300)
    # The renderer's main thread over the selection (CDP Performance.getMetrics): how much of the
    # wait is the page's own work (tasks, scripts) rather than the server's and the network's.
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    if profile:
        cdp.send("Profiler.enable")
        cdp.send("Profiler.setSamplingInterval", {"interval": 1000})
        cdp.send("Profiler.start")
    events: list[dict] = []
    if trace:
        cdp.on("Tracing.dataCollected", lambda params: events.extend(params["value"]))
        cdp.send("Tracing.start", {"categories": TRACE_CATEGORIES, "transferMode": "ReportEvents"})
    before = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    cpu0 = cpu() if cpu else None
    result = page.evaluate(SELECT_JS, 100)
    if cpu0 is not None:
        cpu1 = cpu()
        result["server_cpu_s"] = cpu1[0] - cpu0[0]
        result["chromium_cpu_s"] = cpu1[1] - cpu0[1]
        # The page's renderer is the one whose main thread worked over the selection (the
        # benchmark's earlier pages are closed; a renderer started meanwhile counts from 0).
        spent = [t - cpu0[2].get(pid, 0.0) for pid, t in cpu1[2].items()]
        result["renderer_main_cpu_s"] = max(spent, default=None)
        # Which of Chromium's threads worked over it (those over 10 ms, the most first).
        threads = {k: t - cpu0[3].get(k, 0.0) for k, t in cpu1[3].items()}
        result["chromium_threads_s"] = {
            k: round(t, 3) for k, t in sorted(threads.items(), key=lambda kv: -kv[1]) if t >= 0.01
        }
        result["load_avg"] = list(os.getloadavg())
    after = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    if profile:
        from bench_dashboard import top_functions

        bundle = page.evaluate("() => fetch('/static/app.js').then((r) => r.text())")
        result["profile_top"] = top_functions(cdp.send("Profiler.stop")["profile"], 25, bundle)
    if trace:
        end_trace(page, cdp)
        result["trace_top"] = trace_self_times(events)
    for key in ("TaskDuration", "ScriptDuration", "LayoutDuration", "Timestamp"):
        result[f"main_{key}_s"] = after[key] - before[key]
    cdp.detach()
    result["lines"] = page.evaluate(IN_VIEW_LINES_JS)
    result["max_points"] = page.evaluate("() => window.vdl.connection.maxPoints")
    return result


def reload_remembered(page, names: list[str]) -> dict:  # type: ignore[no-untyped-def]
    """Reload the page that shows ``names`` (it remembers them: docs/dashboard.md, "Runs"): the
    table, the first chart and every chart in view (ms since the navigation), and when every chart
    in view draws all of them."""
    page.reload(wait_until="commit")
    page.wait_for_function(
        "() => window.__runsBench && window.__runsBench.table !== null"
        " && window.__runsBench.inView !== null",
        timeout=120_000,
    )
    probe = page.evaluate("() => window.__runsBench")
    # The search is not remembered: the selection is the 100 plus the ten selected by default.
    page.wait_for_function(
        "() => window.vdl.sync.phase === 'ready' && Array.isArray(window.vdl.connection.runs)"
        f" && ({IN_VIEW_LINES_JS})().every(n => n === window.vdl.connection.runs.length)",
        timeout=120_000,
        polling=30,
    )
    subscribed = page.evaluate("() => window.vdl.connection.runs")
    return {
        "table_ms": probe["table"],
        "first_chart_ms": probe["firstChart"],
        "in_view_ms": probe["inView"],
        "all_lines_ms": page.evaluate("() => performance.now()"),
        "runs": len(subscribed),
        "subscribed": set(names) <= set(subscribed),
    }


def server_select(ws_url: str, runs: list[str], max_points: int, timeout: float = 120.0) -> float:
    """Seconds the server alone takes from a ``subscribe`` to ``runs`` until its ``synced``."""
    import msgpack
    import trio
    from trio_websocket import open_websocket_url

    async def main() -> float:
        with trio.fail_after(timeout):
            async with open_websocket_url(ws_url + "/ws/live") as ws:
                message = {"type": "subscribe", "runs": runs, "max_points": max_points}
                await ws.send_message(msgpack.packb(message))
                t0 = time.perf_counter()
                while msgpack.unpackb(await ws.get_message(), raw=False)["type"] != "synced":
                    pass
                return time.perf_counter() - t0

    return trio.run(main)


def server_swap(
    ws_url: str, runs: list[str], spare: str, max_points: int, keep: bool, timeout: float = 300.0
) -> dict:
    """On one connection: subscribe to ``runs`` (split), then again with the last one swapped
    for ``spare`` (``keep`` or not); seconds from each ``subscribe`` to its ``synced``, and the
    snapshots the second one brought."""
    import msgpack
    import trio
    from trio_websocket import open_websocket_url

    async def main() -> dict:
        with trio.fail_after(timeout):
            async with open_websocket_url(ws_url + "/ws/live", max_message_size=1 << 26) as ws:
                out: dict = {}
                for key, names in (("first_s", runs), ("swap_s", [*runs[:-1], spare])):
                    message = {"type": "subscribe", "runs": names, "max_points": max_points,
                               "keep": keep, "split": True}  # fmt: skip
                    await ws.send_message(msgpack.packb(message))
                    t0, snapshots = time.perf_counter(), 0
                    while True:
                        kind = msgpack.unpackb(await ws.get_message(), raw=False)["type"]
                        snapshots += kind == "snapshot"
                        if kind == "synced":
                            break
                    out[key] = time.perf_counter() - t0
                    out[key.replace("_s", "_snapshots")] = snapshots
                return out

    return trio.run(main)


TRACE_CATEGORIES = "devtools.timeline,disabled-by-default-devtools.timeline,v8,blink"


def end_trace(page, cdp) -> None:  # type: ignore[no-untyped-def]
    """End the trace started on ``cdp`` and wait (at most 60 s) until its events are in."""
    done: list[bool] = []
    cdp.on("Tracing.tracingComplete", lambda params: done.append(True))
    cdp.send("Tracing.end")
    deadline = time.monotonic() + 60
    while not done and time.monotonic() < deadline:
        page.wait_for_timeout(100)  # lets Playwright deliver the trace's events


def _trace_lines(over: str, top: list[dict]) -> list[str]:
    """A trace's 15 largest self times on the main thread, as report lines headed by ``over``."""
    lines = ["", f"The main thread over {over} (trace, self time by event):"]
    for e in top[:15]:
        lines.append(f"  {e['self_ms']:8.0f} ms {e['share']:5.1%} {e['count']:6d}x  {e['event']}")
    return lines


def trace_self_times(events: list[dict], n: int = 20) -> list[dict]:
    """Self time by trace event name on the renderer's main thread (``CrRendererMain``), largest
    first: what the main thread did, scripts and native work (paint, canvas, GC) alike."""
    main = {
        (e["pid"], e["tid"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
        and e.get("args", {}).get("name") == "CrRendererMain"
    }  # fmt: skip
    by_thread: dict = {}
    for e in events:
        if e.get("ph") == "X" and (e["pid"], e["tid"]) in main and "dur" in e:
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    self_us: dict[str, float] = {}

    count: dict[str, int] = {}

    def close(span: list) -> None:  # [end, name, duration, children's time]
        self_us[span[1]] = self_us.get(span[1], 0.0) + span[2] - span[3]
        count[span[1]] = count.get(span[1], 0) + 1

    for spans in by_thread.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []
        for e in spans:
            while stack and stack[-1][0] <= e["ts"]:
                close(stack.pop())
            if stack:
                stack[-1][3] += e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], e["dur"], 0.0])
        while stack:
            close(stack.pop())
    total = sum(self_us.values()) or 1.0
    top = sorted(self_us.items(), key=lambda kv: -kv[1])[:n]
    return [
        {"event": k, "self_ms": v / 1000, "share": v / total, "count": count[k]} for k, v in top
    ]


def live_runs(args, browser, work: Path) -> dict:  # type: ignore[no-untyped-def]
    """The live measure: ``--runs-live`` runs logging at once, all shown, sampled through CDP."""
    from bench_dashboard import (
        chromium_cpu_s,
        fetch_bundle,
        find_browser_pid,
        perf_metrics,
        readline,
        slope_per_min,
        top_functions,
    )
    from broker_clients import stop_process

    server = writer = context = None
    try:
        server = _serve(work / "runs-live-logs", work / "serve-runs-live.log")
        writer = subprocess.Popen(
            [
                sys.executable, str(HERE / "runs_writer.py"), "--url", server.ws_url,
                "--runs", str(args.runs_live), "--tags", "10", "--rate", str(args.runs_rate),
                "--duration", str(args.runs_duration),
            ],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        if readline(writer, 120).strip() != "ready":
            raise RuntimeError("the runs writer did not attach")
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.wait_for_function(
            f"() => window.vdl && window.vdl.runsModel.names.size === {args.runs_live}"
            " && window.vdl.sync.phase === 'ready'",
            timeout=60_000,
        )
        page.click("button.runs-all")
        page.wait_for_function(
            f"() => (window.vdl.connection.runs === null || window.vdl.connection.runs.length === {args.runs_live})"
            " && window.vdl.sync.phase === 'ready'",
            timeout=60_000,
        )
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        cdp.send("HeapProfiler.collectGarbage")
        heap0 = perf_metrics(cdp)["JSHeapUsedSize"]
        # WebSocket messages and frames the page handled (a batched ``frames`` message holds
        # several; a page without batching counts each frame as one message).
        count_js = "() => { const s = window.vdl.connection.stats; return [s.messages ?? s.frames, s.frames]; }"
        counts0 = page.evaluate(count_js)
        # The page's drawing: frames that drew, charts drawn, ms in the drawing calls and after
        # them until the next frame began (rasterizing, commit; frames.js).
        draw_js = "() => { const s = window.vdl.stats; return [s.frames, s.draws, s.drawMs, s.settleMs ?? 0]; }"
        draws0 = page.evaluate(draw_js)
        trace: list[dict] = []
        if args.runs_trace:
            cdp.on("Tracing.dataCollected", lambda params: trace.extend(params["value"]))
            cdp.send(
                "Tracing.start", {"categories": TRACE_CATEGORIES, "transferMode": "ReportEvents"}
            )
        if args.runs_profile:
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 1000})
            cdp.send("Profiler.start")
        writer.stdin.write("go\n")
        writer.stdin.flush()
        go = time.perf_counter()
        browser_pid = find_browser_pid()
        samples = []
        heap_mid = None
        while True:
            now = time.perf_counter() - go
            if heap_mid is None and now >= args.runs_duration / 2:
                # The heap after GC halfway: the page's charts hold about two rows per pixel
                # column of every line drawn (align.js), so the heap grows until the lines span
                # the charts' width, then stays: flat means the second half adds nothing.
                cdp.send("HeapProfiler.collectGarbage")
                heap_mid = perf_metrics(cdp)["JSHeapUsedSize"]
            cpu_now = chromium_cpu_s(browser_pid)
            samples.append({"t": now, "chromium_cpu_s": cpu_now, **perf_metrics(cdp)})
            if now >= args.runs_duration or writer.poll() is not None:
                break
            time.sleep(min(args.interval, max(0.05, args.runs_duration - now)))
        profile = cdp.send("Profiler.stop")["profile"] if args.runs_profile else None
        if args.runs_trace:
            end_trace(page, cdp)
        line = readline(writer, args.runs_duration + 120)
        sent = json.loads(line) if line else None
        writer.wait(30)
        cdp.send("HeapProfiler.collectGarbage")
        heap1 = perf_metrics(cdp)["JSHeapUsedSize"]
        lines = page.evaluate(IN_VIEW_LINES_JS)
        counts1 = page.evaluate(count_js)
        draws1 = page.evaluate(draw_js)
        window_s = max(samples[-1]["t"], 1e-9)
        busy = [
            (b["TaskDuration"] - a["TaskDuration"]) / (b["Timestamp"] - a["Timestamp"])
            for a, b in itertools.pairwise(samples)
            if b["Timestamp"] > a["Timestamp"]
        ]
        # The main thread's CPU time (ThreadTime) over wall time: unlike the busy share, time
        # spent waiting for a core in a task does not count (on a loaded machine the two differ
        # by several times).
        cpu_share = [
            (b["ThreadTime"] - a["ThreadTime"]) / (b["Timestamp"] - a["Timestamp"])
            for a, b in itertools.pairwise(samples)
            if b["Timestamp"] > a["Timestamp"] and "ThreadTime" in a
        ]
        # The first interval holds the start of the load; the steady state is what follows.
        steady = busy[1:] or busy
        steady_cpu = cpu_share[1:] or cpu_share
        # The heap's trend over the second half, once the ring buffers have grown.
        half_t = args.runs_duration / 2
        half = [(s["t"], s["JSHeapUsedSize"] / 1e6) for s in samples if s["t"] >= half_t]
        span = max(samples[-1]["t"] - samples[0]["t"], 1e-9)
        cpu = (samples[-1]["chromium_cpu_s"] - samples[0]["chromium_cpu_s"]) / span
        return {
            "runs": args.runs_live,
            "rate": args.runs_rate,
            "duration_s": args.runs_duration,
            "busy_median": statistics.median(steady) if steady else None,
            "busy_max": max(steady) if steady else None,
            "busy_samples": busy,
            "main_cpu_median": statistics.median(steady_cpu) if steady_cpu else None,
            "main_cpu_samples": cpu_share,
            "profile_top": top_functions(profile, 25, fetch_bundle(server.url))
            if profile
            else None,
            "trace_top": trace_self_times(trace) if trace else None,
            "heap_gc_start_mb": heap0 / 1e6,
            "heap_gc_mid_mb": None if heap_mid is None else heap_mid / 1e6,
            "heap_gc_end_mb": heap1 / 1e6,
            "heap_slope_mb_per_min": slope_per_min(
                [(s["t"], s["JSHeapUsedSize"] / 1e6) for s in samples]
            ),
            "heap_slope_second_half_mb_per_min": slope_per_min(half),
            "chromium_cpu_per_s": cpu,
            "messages_per_s": (counts1[0] - counts0[0]) / window_s,
            "frames_per_s": (counts1[1] - counts0[1]) / window_s,
            "draw_frames_per_s": (draws1[0] - draws0[0]) / window_s,
            "charts_drawn_per_s": (draws1[1] - draws0[1]) / window_s,
            "draw_ms_per_s": (draws1[2] - draws0[2]) / window_s,
            "settle_ms_per_s": (draws1[3] - draws0[3]) / window_s,
            "load_avg": list(os.getloadavg()),
            "lines_in_view": lines,
            "sent": sent,
            "errors": errors,
        }
    finally:
        stop_process(writer)
        if context is not None:
            context.close()
        if server is not None:
            server.stop()


def run(args, browser, work: Path) -> dict:  # type: ignore[no-untyped-def]
    """Every measure of the runs part."""
    out = {}
    if not args.runs_skip_load:
        out["load"] = load_and_select(args, browser, work)
    if not args.runs_skip_live:
        out["live"] = live_runs(args, browser, work)
    return out


def _profile_lines(over: str, top: list[dict]) -> list[str]:
    """A CPU profile's 15 largest self times, as report lines headed by what it was taken over."""
    lines = ["", f"Self time over {over} (CPU profile):"]
    for f in top[:15]:
        lines.append(
            f"  {f['self_ms']:8.0f} ms {f['share']:5.1%}  {f['function']} {f['at']}"
            f"  {f.get('code', '')[:70]!r}"
        )
    return lines


def _draws(sel: dict) -> str:
    """The drawing frames of a selection, as "at ms (drawing calls ms)"."""
    draws = sel.get("draws")
    if draws is None:
        return "not recorded"
    return ", ".join(f"at {at:.0f} ms ({ms:.0f} ms)" for at, ms in draws) or "none"


def fmt_s(x: float | None) -> str:
    """``x`` seconds, or "—" when not measured."""
    return "—" if x is None else f"{x:.2f} s"


def fmt_ms(x: float | None) -> str:
    """``x`` milliseconds, or "—" when not measured."""
    return "—" if x is None else f"{x:.0f} ms"


def report(result: dict) -> str:
    """The runs part's figures as Markdown."""
    out = ["## Issue 12: page (many runs)", ""]
    load = result.get("load")
    if load:
        out.append(f"Log directory: {load['logdir']} (ready in {load['generation_s']:.1f} s)")
        out.append("")
        out.append(
            "| load | table filled | first chart drawn | every chart in view | runs subscribed |"
        )
        out.append("| --- | --- | --- | --- | --- |")
        for kind, rows in (
            ("cold", [r for r in load["loads"] if r["cold"]]),
            ("warm", [r for r in load["loads"] if not r["cold"]]),
        ):
            if not rows:
                continue
            table, first, in_view = (
                statistics.median(r[key] for r in rows)
                for key in ("table_ms", "first_chart_ms", "in_view_ms")
            )
            out.append(
                f"| {kind} (median of {len(rows)}) | {table:.0f} ms | {first:.0f} ms"
                f" | {in_view:.0f} ms | {rows[0]['subscribed']} |"
            )
        # The page's own share before the server can start: from the summaries' arrival to the
        # subscribe it sends (the third message is the summaries frame).
        shares = [
            (r["subscribe_ms"] - r["first_messages"][2]["at"], r["first_messages"][2])
            for r in load["loads"]
            if r.get("subscribe_ms") is not None and len(r.get("first_messages") or []) >= 3
        ]
        early = [d for d, _ in shares if d < 0]
        shares = [(d, m) for d, m in shares if d >= 0]
        if early:
            out.append("")
            out.append(
                f"{len(early)} load(s) subscribed before the summaries arrived (the page stopped"
                " waiting for them and chose its runs by name): left out below"
            )
        if shares:
            out.append("")
            out.append(
                "Summaries frame to subscribe (the page's own share of the first chart): median"
                f" {statistics.median(d for d, _ in shares):.0f} ms"
                f" ({', '.join(f'{d:.0f}' for d, _ in shares)}); the frame"
                f" {shares[0][1]['bytes'] / 1e3:.0f} kB, handled in a median of"
                f" {statistics.median(m['ms'] for _, m in shares):.0f} ms; subscribe sent at a"
                " median of"
                f" {statistics.median(r['subscribe_ms'] for r in load['loads'] if r.get('subscribe_ms')):.0f}"
                " ms after the navigation started"
            )
        # The fourth message, the first after the summaries: the first snapshot (the page's
        # first subscribe, or the URL's, docs/protocol.md).
        fourth = [
            r["first_messages"][3]["at"]
            for r in load["loads"]
            if len(r.get("first_messages") or []) >= 4
        ]
        if fourth:
            out.append(
                "The first message after the summaries (the first snapshot) handled a median of"
                f" {statistics.median(fourth):.0f} ms ({', '.join(f'{d:.0f}' for d in fourth)})"
                " after the navigation started"
            )
        opened = [
            r["socket_ms"] - r["script_ms"]
            for r in load["loads"]
            if r.get("socket_ms") is not None and r.get("script_ms") is not None
        ]
        if opened:
            out.append(
                "The socket opened a median of"
                f" {statistics.median(opened):.0f} ms ({', '.join(f'{d:.0f}' for d in opened)})"
                " after the page's script (app.js) arrived"
            )
        sel = load.get("select")
        if sel:
            out.append("")
            ms = "no" if sel["ms"] is None else f"{sel['ms']:.0f} ms"
            out.append(
                f"Select 100 runs: every chart in view ({sel['charts']}) redrawn with 100 lines"
                f" after {ms} (subscribed after {sel['subscribed_ms']:.0f} ms, synced after"
                f" {sel['synced_ms']:.0f} ms; max_points {sel['max_points']}; the server alone,"
                f" the same subscribe on a fresh connection: {sel['server_alone_s']:.2f} s,"
                f" 100 runs no page read yet: {sel['server_alone_cold_s']:.2f} s;"
                f" lines per chart: {sel['lines']}; their files in the page cache:"
                f" {sel.get('page_cache', 'as-is')})"
            )
            out.append("")
            out.append(f"Drawing frames over it: {_draws(sel)}; over the same 100 again: "
                       f"{_draws(sel.get('again') or {})}")  # fmt: skip
            again = sel.get("again")
            if again and again.get("ms") is not None:
                out.append("")
                out.append(
                    f"The same 100 again (None, then All; the server's reads kept): every chart"
                    f" with 100 lines after {again['ms']:.0f} ms (synced after"
                    f" {fmt_ms(again.get('synced_ms'))}); CPU: the server"
                    f" {again.get('server_cpu_s', 0):.2f} s, Chromium"
                    f" {again.get('chromium_cpu_s', 0):.2f} s; the page's main thread"
                    f" {again['main_TaskDuration_s']:.2f} s in tasks"
                    f" ({again['main_ScriptDuration_s']:.2f} s running scripts),"
                    f" {fmt_s(again.get('renderer_main_cpu_s'))} of CPU"
                )
                if again.get("profile_top"):
                    out += _profile_lines("the same selection again", again["profile_top"])
                if again.get("trace_top"):
                    out += _trace_lines("the same selection again", again["trace_top"])
            reload = sel.get("reload")
            if reload:
                out.append("")
                out.append(
                    f"Reload of that page ({reload['runs']} runs remembered: the 100 and the"
                    f" default ten): table {reload['table_ms']:.0f} ms, first chart"
                    f" {reload['first_chart_ms']:.0f} ms, every chart in view with"
                    f" {reload['runs']} lines by {reload['all_lines_ms']:.0f} ms"
                    f" (the 100 among them: {reload['subscribed']})"
                )
            if "server_cpu_s" in sel:
                out.append("")
                out.append(
                    f"CPU over the selection: the server {sel['server_cpu_s']:.2f} s, Chromium (all"
                    f" its processes) {sel['chromium_cpu_s']:.2f} s; load average"
                    f" {sel['load_avg'][0]:.1f}"
                )
                if sel.get("chromium_threads_s"):
                    out.append("")
                    out.append(
                        "Chromium's threads over it: "
                        + ", ".join(f"{k} {t:.2f} s" for k, t in sel["chromium_threads_s"].items())
                    )
            if "main_TaskDuration_s" in sel:
                out.append("")
                out.append(
                    f"The page's main thread over the selection: {sel['main_TaskDuration_s']:.2f} s"
                    f" in tasks ({sel['main_ScriptDuration_s']:.2f} s running scripts,"
                    f" {sel['main_LayoutDuration_s']:.2f} s layout) of"
                    f" {sel['main_Timestamp_s']:.2f} s; its CPU (the thread's own, load aside)"
                    f" {fmt_s(sel.get('renderer_main_cpu_s'))}"
                )
            if sel.get("profile_top"):
                out += _profile_lines("the selection", sel["profile_top"])
            if sel.get("trace_top"):
                out += _trace_lines("the selection", sel["trace_top"])
        for keep in (True, False):
            swap = (sel or {}).get(f"swap_one_keep_{keep}")
            if swap:
                out.append(
                    f"Swap one of 100 runs on one connection, keep={keep}: the first subscribe"
                    f" {swap['first_s']:.2f} s ({swap['first_snapshots']} snapshots), the swap"
                    f" {swap['swap_s']:.2f} s ({swap['swap_snapshots']} snapshots)"
                )
    live = result.get("live")
    if live:
        out.append("")
        out.append(
            f"Live: {live['runs']} runs x 10 tags x {live['rate']} points/s for {live['duration_s']:.0f} s:"
            f" main-thread busy median {live['busy_median']:.0%} (max {live['busy_max']:.0%}),"
            f" main-thread CPU median {live.get('main_cpu_median') or 0:.0%};"
            f" Chromium CPU {live['chromium_cpu_per_s']:.2f} s/s (all its processes);"
            f" JS heap after GC {live['heap_gc_start_mb']:.1f} -> {live.get('heap_gc_mid_mb') or 0:.1f}"
            f" (halfway) -> {live['heap_gc_end_mb']:.1f} MB,"
            f" slope {live['heap_slope_mb_per_min']:+.1f} MB/min"
            f" (second half {live['heap_slope_second_half_mb_per_min']:+.1f});"
            f" lines per chart in view {live['lines_in_view']}; load average {live['load_avg'][0]:.1f}"
        )
        if "messages_per_s" in live:
            out.append(
                f"WebSocket messages the page handled: {live['messages_per_s']:.0f}/s"
                f" carrying {live['frames_per_s']:.0f} frames/s"
            )
        if "draw_frames_per_s" in live:
            out.append(
                f"Drawing: {live['draw_frames_per_s']:.1f} frames/s, {live['charts_drawn_per_s']:.1f}"
                f" charts/s, {live['draw_ms_per_s']:.0f} ms/s in the drawing calls and"
                f" {live['settle_ms_per_s']:.0f} ms/s after them until the next frame began"
            )
        if live.get("trace_top"):
            out += _trace_lines("the live load", live["trace_top"])
        if live.get("profile_top"):
            out += _profile_lines("the live load", live["profile_top"])
    return "\n".join(out)
