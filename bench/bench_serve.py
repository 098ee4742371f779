"""Serving long and many runs: page loads, server memory, streaming export (issue 10, items 4-5).

    python bench/bench_serve.py                       # 1-hour live run, 100 runs, 50M-point export
    python bench/bench_serve.py --quick               # 0.1 hour, 20 runs, 5M points
    python bench/bench_serve.py --baseline /work/main # the same measures on another checkout too

Every part runs a real ``vdl-stream serve`` (or ``vdl-stream export``) subprocess of the checkout
under test (``PYTHONPATH`` set to it), on 127.0.0.1, and stops it in ``finally``:

* one run: a run written at live cadence by bench/live_run.py (10 scalar tags at 50 steps/s, a
  flush every 20 ms, histograms, telemetry, images; ``--hours`` of it, cached under ``--cache``) is
  served by a fresh ``serve``; Chromium opens the page ``--loads`` times, each in a fresh context,
  and the time from navigation start until every scalar chart in the viewport has data is taken with
  bench/dashboard_probe.js (as in bench/bench_dashboard.py). The server's RSS is read after.
* many runs: ``--runs`` copies of a shorter live run (``--run-hours``) in one log directory; the
  time until the charts in view first have data, and the server's RSS (and its peak, VmHWM) after.
* snapshot reads (``--snapshot-reads N``): the reads a snapshot of the one run makes (as
  vdl_stream.broker._read_snapshot), in N fresh processes of the tree: wall and CPU time (CPU time
  moves less with the machine's load).
* select 100 of 1,000 runs (``--sweep-selects N``, issue 12): the server alone sends the
  snapshots of 100 runs no page has read (split, 200 points a tag, as the page asks) to a
  WebSocket client, three selections on each of N fresh servers; seconds and server CPU, and
  that CPU in its parts: the event loop (main thread), the other threads, the reader processes.
* the same in process (``--sweep-in-process N``): a ``Broker`` over the sweep sends the same
  snapshots into a list (no socket, reading and encoding only), three selections in each of N
  fresh processes of the tree; CPU and wall seconds, frames.
* idle follow loop over 1,000 runs (``--sweep-idle SECONDS``): a fresh ``serve`` over the same
  sweep, no client; once it is up and ``--sweep-idle-settle`` seconds passed (discovery done), its
  process CPU (user + system, from /proc) over SECONDS, as CPU seconds per second; median of
  ``--sweep-idle-servers`` fresh servers. The same for ``--baseline``. ``--sweep-idle-no-foreign``
  serves with ``--no-foreign`` (no walk for TensorBoard/VisualDL files).
* export: a run of ``--points`` scalar points (10 tags, written in bulk, cached) exported in each
  of ``--export-formats`` by the CLI to /dev/null (wall time, rows/s, CPU time of the process, its
  peak RSS) and by ``GET /api/export`` from a fresh ``serve`` (the body read and counted; rows/s;
  the server's peak RSS; the CPU time of the server, of its export child and of the client's
  reading thread), while a second client asks ``/api/stats`` every 50 ms: its latencies show how
  long the event loop was held; the server and its child's CPU per million rows (what the
  machine's load barely moves). The export starts once the fresh server has settled (its
  start-up reads done: ``wait_settled``), as export_http_ab.py's does; ``--export-unsettled``
  starts it at once, racing them. ``--export-repeats N``: the median of N of each;
  ``--export-via cli`` or ``http``: one of the two. ``--skip-pages --skip-many`` measures the
  export alone.

``--baseline TREE`` runs the same parts with TREE's code as well and prints ratios (the export
part with ``--baseline-points``: the old export holds the whole run in memory).
Results: a Markdown table on stdout and the full record in bench/out/serve.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from bench_dashboard import load_once  # noqa: E402
from broker_clients import STARTED, ServeProcess, process_cpu_s  # noqa: E402
from live_run import write_live_run  # noqa: E402

from recorder import RunWriter, add_summaries, blocks  # noqa: E402
from tests.conftest import CHROMIUM_ARGS  # noqa: E402

TAGS = 10


def proc_status(pid: int, key: str) -> float:
    """A ``/proc/PID/status`` memory field (VmRSS, VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split(key + ":")[1].split()[0]) / 1024


def env_for(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}


class Serve(ServeProcess):
    """``vdl-stream serve`` of checkout ``tree`` over ``logdir`` on a free port, timed."""

    def __init__(self, tree: Path, logdir: Path, log: Path, *extra: str) -> None:
        t0 = time.perf_counter()
        super().__init__(logdir, log, *extra, tree=tree)
        self.start_s = time.perf_counter() - t0

    def rss_mb(self) -> float:
        return proc_status(self.proc.pid, "VmRSS")

    def peak_mb(self) -> float:
        return proc_status(self.proc.pid, "VmHWM")


def live_run(cache: Path, hours: float) -> Path:
    """A live-cadence run of ``hours`` under ``cache`` (generated once); returns its log dir."""
    logdir = cache / f"live-{hours:g}h"
    done = cache / f"live-{hours:g}h.done"  # written last: a killed generation is redone
    if not done.exists():
        shutil.rmtree(logdir, ignore_errors=True)
        t0 = time.perf_counter()
        info = write_live_run(logdir / "run", hours)
        print(
            f"generated a {hours:g} h live run: {info['records']:,} records, "
            f"{info['points']:,} points in {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
        done.write_text(json.dumps(info, default=str))
    return with_summaries(cache, logdir)


def with_summaries(cache: Path, logdir: Path) -> Path:
    """``logdir``, or when its run's blocks were written before level-of-detail summaries, a copy
    of it (hard links, made once) whose blocks got them with ``recorder.add_summaries``, as an
    existing user's run gets them. The cached run itself is never changed: add_summaries writes
    new files and renames them over the copy's links."""
    run = logdir / "run"
    footers = []
    for name in sorted(os.listdir(run)):
        if blocks.parse_block_name(name):
            with open(run / name, "rb") as f:
                footers.append(blocks.read_footer(f.fileno()))
    if all(blocks.has_summaries(f) for f in footers):
        return logdir
    copy = cache / f"{logdir.name}-lod"
    done = cache / f"{logdir.name}-lod.done"
    if not done.exists():
        shutil.rmtree(copy, ignore_errors=True)
        (copy / "run").mkdir(parents=True)
        for name in os.listdir(run):
            if name != "writer.lock":  # add_summaries takes the copy's own lock
                os.link(run / name, copy / "run" / name)
        t0 = time.perf_counter()
        count = add_summaries(copy / "run")
        print(
            f"gave {count} blocks of a copy of {logdir.name} summaries in "
            f"{time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
        done.write_text("")
    return copy


def many_runs(cache: Path, runs: int, hours: float) -> Path:
    """``runs`` copies of a live run of ``hours`` in one log directory."""
    logdir = cache / f"many-{runs}x{hours:g}h"
    done = cache / f"many-{runs}x{hours:g}h.done"
    if not done.exists():
        shutil.rmtree(logdir, ignore_errors=True)
        source = live_run(cache, hours) / "run"
        for i in range(runs):
            shutil.copytree(source, logdir / f"run{i:03d}")
        done.write_text("")
    return logdir


def bulk_run(
    cache: Path,
    points: int,
    name: str = "bulk",
    values: Callable[[np.ndarray, int], np.ndarray] | None = None,
) -> Path:
    """A run of ``points`` scalar points over 10 tags, written in bulk; returns the run dir.

    ``values(steps, tag_number)`` gives a tag's values (a sine by default); ``name`` keeps runs
    of other values apart in ``cache``.
    """
    run = cache / f"{name}-{points}" / "run"
    done = cache / f"{name}-{points}.done"
    if not done.exists():
        shutil.rmtree(run.parent, ignore_errors=True)
        per_tag = points // TAGS
        with RunWriter(run, sync="never") as w:
            for t in range(TAGS):
                for lo in range(0, per_tag, 1 << 20):
                    s = np.arange(lo, min(per_tag, lo + (1 << 20)), dtype=np.int64)
                    v = np.sin(s * 1e-4 + t) if values is None else values(s, t)
                    w.append_scalars(f"tag{t}", s, 1.79e9 + s * 0.02, v)
        done.write_text("")
    return run


def page_loads(browser, url: str, loads: int) -> list[dict]:
    out = []
    for _ in range(loads):
        r = load_once(browser, url, TAGS)
        keys = ("shown_ms", "shown_charts", "server_ms", "snapshot_bytes", "subscribe_ms")
        keys += ("snapshot_frames", "decode_store_ms", "draw_ms")
        keys += ("ws_created_ms", "dom_ready_ms", "first_script_bytes", "scripts_to_dom_ready_ms")
        out.append({k: r[k] for k in keys})
        # A split snapshot's events (docs/protocol.md): when they came, after the charts.
        events = [f for f in r["frames"] if f["type"] == "snapshot_events"]
        out[-1]["events_bytes"] = sum(f["bytes"] for f in events)
        out[-1]["events_at_ms"] = events[-1]["at"] if events else None
    return out


def ws_snapshot_s(url: str) -> float:
    """Seconds from a ``subscribe`` on ``/ws/live`` to the first ``snapshot`` frame, subscribed
    as the page subscribes (``split``: that frame holds the scalars, what the charts need)."""
    import trio
    from trio_websocket import open_websocket_url

    from vdl_stream import codec

    async def once() -> float:
        with trio.fail_after(600):
            ws_url = "ws" + url.removeprefix("http") + "/ws/live"
            async with open_websocket_url(ws_url, max_message_size=1 << 26) as ws:
                t0 = time.perf_counter()
                subscribe = {"type": "subscribe", "runs": None, "split": True, "max_points": 2000}
                await ws.send_message(codec.encode_message(subscribe))
                while codec.decode_message(await ws.get_message())["type"] != "snapshot":
                    pass
                return time.perf_counter() - t0

    return trio.run(once)


def part_one_run(args, tree: Path, browser, work: Path) -> dict:
    logdir = live_run(Path(args.cache), args.hours)
    extra = ("--cache-mb", str(args.cache_mb)) if args.cache_mb and tree == ROOT else ()
    server = Serve(tree, logdir, work / "serve-one.log", *extra)
    try:
        if args.ws_only:
            times = [ws_snapshot_s(server.url) for _ in range(args.loads)]
            return {
                "serve_start_s": server.start_s,
                "ws_snapshot_s": times,
                "ws_cold_ms": times[0] * 1000,
                "ws_warm_ms": statistics.median(times[1:]) * 1000 if len(times) > 1 else None,
                "rss_mb": server.rss_mb(),
            }
        figures = {"hours": args.hours, **page_figures(browser, server, args.loads)}
        if args.trace_loads:
            traced = [
                load_once(browser, server.url, TAGS, trace=True) for _ in range(args.trace_loads)
            ]
            keys = ("shown_ms", "script_eval_first_ms", "script_eval_later_ms", "script_costs")
            keys += ("first_script_bytes", "ws_created_ms", "dom_ready_ms")
            figures["traced"] = [{k: r.get(k) for k in keys} for r in traced]
            figures["script_eval_first_ms"] = statistics.median(
                r["script_eval_first_ms"] for r in traced
            )
        return figures
    finally:
        server.stop()


def page_figures(browser, server: Serve, count: int) -> dict:
    """Load the page ``count`` times (the first cold); the times and the server's memory."""
    loads = page_loads(browser, server.url, count)
    return {
        "serve_start_s": server.start_s,
        "cold_shown_ms": loads[0]["shown_ms"],
        "warm_shown_ms": statistics.median(r["shown_ms"] for r in loads[1:])
        if len(loads) > 1
        else None,
        # The scripts fetched before the charts were shown; from them to DOMContentLoaded (their
        # compilation and evaluation, the page built); the early socket's creation.
        "first_script_kb": statistics.median(r["first_script_bytes"] for r in loads) / 1024,
        "scripts_to_dom_ready_ms": statistics.median(r["scripts_to_dom_ready_ms"] for r in loads),
        "ws_created_ms": statistics.median(r["ws_created_ms"] for r in loads),
        "loads": loads,
        "rss_mb": server.rss_mb(),
        "peak_mb": server.peak_mb(),
    }


def part_many_runs(args, tree: Path, browser, work: Path) -> dict:
    logdir = many_runs(Path(args.cache), args.runs, args.run_hours)
    server = Serve(tree, logdir, work / "serve-many.log")
    try:
        return {
            "runs": args.runs,
            "run_hours": args.run_hours,
            **page_figures(browser, server, args.loads),
        }
    finally:
        server.stop()


PROBE = (
    "import sys; from vdl_stream.cli import main; code = main(sys.argv[1:]); "
    "sys.stderr.write('VmHWM ' + open('/proc/self/status').read().split('VmHWM:')[1].split()[0]"
    " + '\\n'); sys.exit(code)"
)


def export_cli(tree: Path, run: Path, fmt: str) -> dict:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, "export", str(run), "--format", fmt],
            stdout=sink,
            stderr=subprocess.PIPE,
            cwd=tree,
            env=env_for(tree),
            text=True,
            timeout=1800,
        )
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    peak = int(done.stderr.split("VmHWM ")[1].split()[0]) / 1024
    # CPU time (user + system) moves less than wall time on a shared machine.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": seconds, "cpu_s": cpu, "peak_mb": peak}


def children_mb(pid: int) -> float:
    """The summed RSS of ``pid``'s child processes now (a server's export child), MB."""
    import psutil

    total = 0
    try:
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
    except psutil.Error:
        pass
    return total / 2**20


def server_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process ``pid`` so far: its own, and its reaped
    children's."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system, t.children_user + t.children_system


#: A server is settled once it takes less than this share of a core over SETTLE_WINDOW_S: at
#: load 15 its start-up reads got 15% of a core, some half-second windows much less, and a pause
#: of a second comes between its discovery of the runs and those reads.
SETTLE_SHARE = 0.05
SETTLE_WINDOW_S = 2.0
#: Longest wait for a server to settle (its start-up reads of a 50M-point run take 1.8-2.9 s of
#: CPU, which took up to a minute at load 10-17).
SETTLE_DEADLINE_S = 120.0


def wait_settled(pid: int, deadline_s: float = SETTLE_DEADLINE_S) -> float:
    """Wait until process ``pid`` (a fresh server) has finished its start-up reads: its CPU
    over the last :data:`SETTLE_WINDOW_S` under :data:`SETTLE_SHARE` of a core, or
    ``deadline_s`` gone. Returns the seconds waited.

    Both export benchmarks (this one's and export_http_ab.py's) start their export from this
    state, so neither counts the server's start-up (its snapshot reads of every tag: 1.8 s of
    CPU for the 50M-point run, which has no level-of-detail summaries) nor races it.
    """
    t0 = time.perf_counter()
    step = SETTLE_WINDOW_S / 8
    window = [server_cpu(pid)[0]]  # the CPU at each step of the last window
    while time.perf_counter() - t0 < deadline_s:
        time.sleep(step)  # a sliding window measured, not a wait for an event
        window = [*window[-8:], server_cpu(pid)[0]]
        if len(window) == 9 and window[-1] - window[0] < SETTLE_SHARE * SETTLE_WINDOW_S:
            break
    return time.perf_counter() - t0


def export_http(tree: Path, run: Path, fmt: str, work: Path, settle: bool = True) -> dict:
    server = Serve(tree, run.parent, work / "serve-export.log")
    settled_s = wait_settled(server.proc.pid) if settle else 0.0
    latencies: list[float] = []
    children: list[float] = [0.0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(server.url + "/api/stats", timeout=60) as r:
                r.read()
            latencies.append(time.perf_counter() - t0)
            # A large export is formatted by a child process: its memory counts too.
            children.append(children_mb(server.proc.pid))
            done.wait(0.05)

    try:
        idle_mb = server.rss_mb()
        cpu0 = server_cpu(server.proc.pid)
        poller = threading.Thread(target=poll, daemon=True)
        t0, c0 = time.perf_counter(), time.thread_time()
        poller.start()
        size = 0
        with urllib.request.urlopen(
            f"{server.url}/api/export?run={run.name}&format={fmt}", timeout=1800
        ) as response:
            while chunk := response.read(1 << 20):
                size += len(chunk)
        seconds, client_cpu = time.perf_counter() - t0, time.thread_time() - c0
        done.set()
        poller.join(60)
        cpu1 = server_cpu(server.proc.pid)
        lat = np.array(latencies) * 1000
        return {
            "seconds": seconds,
            "bytes": size,
            "settled_s": settled_s,
            # CPU seconds during the export: the server's own (its /api/stats answers included),
            # its export child's (reaped by then), the client's reading thread
            "server_cpu_s": cpu1[0] - cpu0[0],
            "child_cpu_s": cpu1[1] - cpu0[1],
            "client_cpu_s": client_cpu,
            "idle_rss_mb": idle_mb,
            "peak_mb": server.peak_mb(),
            # sampled every 50 ms or so: a lower bound of the child's peak
            "child_peak_mb": max(children),
            "stats_requests": len(lat),
            "stats_p50_ms": float(np.percentile(lat, 50)),
            "stats_p99_ms": float(np.percentile(lat, 99)),
            "stats_max_ms": float(lat.max()),
        }
    finally:
        done.set()
        server.stop()


def part_export(args, tree: Path, work: Path, points: int) -> dict:
    """Each of ``--export-formats`` exported ``--export-repeats`` times by the CLI and by
    ``/api/export``; the run with the median time of each is kept. The first format's figures
    are also at the top level (what the report's ratios compare)."""
    run = bulk_run(Path(args.cache), points)
    out: dict = {"points": points, "repeats": args.export_repeats}
    for fmt in args.export_formats:
        out[fmt] = {}
        if "cli" in args.export_via:
            clis = sorted(
                (export_cli(tree, run, fmt) for _ in range(args.export_repeats)),
                key=lambda r: r["seconds"],
            )
            cli = clis[len(clis) // 2]
            out[fmt].update({
                "cli_seconds": cli["seconds"],
                "cli_rows_per_s": points / cli["seconds"],
                "cli_cpu_s": cli["cpu_s"],
                "cli_rows_per_cpu_s": points / cli["cpu_s"],
                "cli_peak_mb": cli["peak_mb"],
                "cli_all_seconds": [r["seconds"] for r in clis],
            })  # fmt: skip
        if "http" in args.export_via:
            https = sorted(
                (
                    export_http(tree, run, fmt, work, not args.export_unsettled)
                    for _ in range(args.export_repeats)
                ),
                key=lambda r: r["seconds"],
            )
            http = https[len(https) // 2]
            out[fmt].update({
                "http_seconds": http["seconds"],
                "http_rows_per_s": points / http["seconds"],
                "http": http,
                # CPU of the export's processes (server and child), which load barely moves
                "http_cpu_s_per_m_rows": (http["server_cpu_s"] + http["child_cpu_s"])
                / (points / 1e6),
                "http_all_seconds": [r["seconds"] for r in https],
            })  # fmt: skip
    out.update(out[args.export_formats[0]])
    return out


# What a snapshot of one run reads (the reads of vdl_stream.broker._read_snapshot), timed in a
# fresh process of the tree under test: open, every scalar tag downsampled to 2,000 points, 100
# events of each event tag, the untagged kinds; wall and CPU time of each. Printed as JSON.
SNAPSHOT_READS = """
import json, sys, time
from recorder import RunReader
from vdl_stream import broker, codec
def clock():
    return time.perf_counter(), time.process_time()
def since(t):
    now = clock()
    return [now[0] - t[0], now[1] - t[1]]
out = {"scalars": [0.0, 0.0], "events": [0.0, 0.0]}
t = clock()
r = RunReader(sys.argv[1])
tags = r.tags()
out["open"] = since(t)
for tag, info in tags.items():
    t = clock()
    if info.kind == "scalars":
        r.read_scalars(tag, max_points=broker.SNAPSHOT_POINTS)
        part = "scalars"
    elif info.kind in codec.EVENT_KINDS:
        r.read_records(kind=info.kind, tag=tag, limit=broker.SNAPSHOT_EVENTS)
        part = "events"
    else:
        continue
    out[part] = [a + b for a, b in zip(out[part], since(t))]
t = clock()
for kind, limit in broker.UNTAGGED_SNAPSHOT.items():
    r.read_records(kind=kind, limit=limit)
out["untagged"] = since(t)
print(json.dumps(out))
"""


def run_script(tree: Path, script: str, *args: str):
    """Run ``script`` (``python -c``) in a fresh process of ``tree``; its stdout, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env_for(tree),
        cwd=tree,  # "-c" puts the working directory first on sys.path
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout)


def part_snapshot_reads(args, tree: Path) -> dict:
    """The reads of one run's snapshot in process, ``--snapshot-reads`` fresh processes; the
    median wall and CPU seconds of each kind of read."""
    run = live_run(Path(args.cache), args.hours) / "run"
    samples = []
    for _ in range(args.snapshot_reads):
        samples.append(run_script(tree, SNAPSHOT_READS, str(run)))
    out = {}
    for key in samples[0]:
        out[f"{key}_wall_s"] = statistics.median(s[key][0] for s in samples)
        out[f"{key}_cpu_s"] = statistics.median(s[key][1] for s in samples)
    out["total_wall_s"] = statistics.median(sum(v[0] for v in s.values()) for s in samples)
    out["total_cpu_s"] = statistics.median(sum(v[1] for v in s.values()) for s in samples)
    return out


SWEEP_PREFIXES = ("s05-", "s06-", "s07-")  # 100 runs each, as the page's "select 100"


def tree_cpu_s(pid: int) -> float:
    """:func:`process_cpu_s` of ``pid`` and of its live child processes (a server's reader
    processes read for it)."""
    return process_cpu_s(pid) + children_cpu_s(pid)


def children_cpu_s(pid: int) -> float:
    """:func:`process_cpu_s` of the live child processes of ``pid`` (a server's reader processes)."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == pid:
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                total += process_cpu_s(int(entry.name))
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
    return total


def cpu_parts_s(pid: int) -> tuple[float, float, float]:
    """The CPU seconds so far of a server ``pid``, in three parts: its main thread (the event
    loop: encoding, permessage-deflate, sends), its other threads (the reads handed to threads,
    the follow loop's), and its child processes (the reader processes)."""
    loop = process_cpu_s(pid, pid)
    return loop, process_cpu_s(pid) - loop, children_cpu_s(pid)


def sweep_select_s(ws_url: str, runs: list[str]) -> float:
    """Seconds from a ``subscribe`` to ``runs`` (as the page subscribes to 100 runs: split,
    200 points a tag) until its ``synced``: the server alone reading and sending 100 snapshots."""
    import trio
    from trio_websocket import open_websocket_url

    from vdl_stream import codec

    async def once() -> float:
        with trio.fail_after(600):
            async with open_websocket_url(ws_url + "/ws/live", max_message_size=1 << 26) as ws:
                t0 = time.perf_counter()
                message = {"type": "subscribe", "runs": runs, "max_points": 200, "split": True,
                           "keep": True, "batch": True}  # fmt: skip
                await ws.send_message(codec.encode_message(message))
                while codec.decode_message(await ws.get_message())["type"] != "synced":
                    pass
                return time.perf_counter() - t0

    return trio.run(once)


def part_sweep(args, tree: Path, work: Path) -> dict:
    """Issue 12's "select 100 of 1,000 runs", the server alone: a fresh ``serve`` over the
    1,000-run sweep of bench/runs_data.py (generated once under bench/out/runs), a page's first
    subscription (the newest ten runs) and 3 s, then on one connection each the 100 runs of each
    of ``SWEEP_PREFIXES`` (no page read them: their readers are not open), ``--sweep-selects``
    servers; the median seconds and CPU of each (the server's and its child processes'), and of
    the CPU's parts (:func:`cpu_parts_s`)."""
    from runs_data import cached_runs

    logdir = Path(cached_runs(n_runs=1000, tags=10, points=10_000))
    for run in logdir.iterdir():  # in the OS page cache for every tree alike
        for path in run.iterdir() if run.is_dir() else ():
            with open(path, "rb") as f:
                while f.read(1 << 22):
                    pass
    samples: dict[str, list] = {p: [] for p in SWEEP_PREFIXES}
    for _ in range(args.sweep_selects):
        server = Serve(tree, logdir, work / "serve-sweep.log")
        try:
            time.sleep(3)  # discovery of the 1,000 runs is done
            # As a page's first load: the newest ten runs (none of the prefixes measured), then
            # a user's few seconds before a click (a server starts its reader processes then).
            sweep_select_s(server.ws, sorted(p.name for p in logdir.iterdir() if p.is_dir())[-10:])
            time.sleep(3)
            for prefix in SWEEP_PREFIXES:
                names = sorted(p.name for p in logdir.iterdir() if p.name.startswith(prefix))
                before = cpu_parts_s(server.proc.pid)
                wall = sweep_select_s(server.ws, names)
                parts = [b - a for a, b in zip(before, cpu_parts_s(server.proc.pid), strict=True)]
                samples[prefix].append((wall, sum(parts), *parts))
        finally:
            server.stop()
    out: dict = {"samples": {p: v for p, v in samples.items()}}
    everything = [x for v in samples.values() for x in v]
    out["select_s"] = statistics.median(x[0] for x in everything)
    out["select_cpu_s"] = statistics.median(x[1] for x in everything)
    for i, part in enumerate(("loop", "threads", "children"), 2):
        out[f"select_{part}_cpu_s"] = statistics.median(x[i] for x in everything)
    return out


# Issue 12's "select 100", the broker alone in process (no socket, no follow loop running
# beside it): a Broker that found the 1,000 runs, as serve's (its reader processes where the tree
# has them), a page's first subscription (the newest ten runs; it starts those processes), then
# ``send_snapshot`` of the 100 runs of each prefix given (none read yet), as the page subscribes
# (split asked, 200 points a tag), the frames kept in a list; per prefix the wall seconds, the
# CPU of the process and its children, frames, bytes, and the process's own CPU. JSON.
SWEEP_IN_PROCESS = """
import json, os, resource, sys, time
import trio
from vdl_stream import broker as broker_module
from vdl_stream.broker import Broker
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def children_cpu():
    total = 0.0
    for entry in os.scandir("/proc"):
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid():
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            continue
    return total
async def main():
    # As serve: its reader processes where the tree has them (started by a first snapshot).
    how_many = getattr(broker_module, "default_read_processes", None)
    processes = how_many() if how_many else getattr(broker_module, "READ_PROCESSES", 0)
    broker = Broker(sys.argv[1], read_processes=processes) if processes else Broker(sys.argv[1])
    out = []
    async def drop(frame):
        pass
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await nursery.start(broker.follow, 3600.0)  # one round: discovery, then quiet
        newest = sorted(broker._runs)[-10:]  # a page's first load
        sub = broker.subscribe(set(newest), None)
        await broker.send_snapshot(sub, drop, 200, runs=newest, split=True)
        broker.unsubscribe(sub)
        with trio.fail_after(60):
            while processes and not broker._reader_pool.ready:
                await trio.sleep(0.05)
        for prefix in sys.argv[2:]:
            names = sorted(n for n in broker._runs if n.startswith(prefix))
            sub = broker.subscribe(set(names), None)
            sizes = []
            async def keep(frame):
                sizes.append(len(frame))
            c0, k0, t0 = cpu(), children_cpu(), time.perf_counter()
            await broker.send_snapshot(sub, keep, 200, runs=names, split=True)
            wall, own = time.perf_counter() - t0, cpu() - c0
            out.append([prefix, wall, own + children_cpu() - k0, len(sizes), sum(sizes), own])
            broker.unsubscribe(sub)
        nursery.cancel_scope.cancel()
    print(json.dumps(out))
if __name__ == "__main__":
    trio.run(main)
"""


def part_sweep_in_process(args, tree: Path) -> dict:
    """Issue 12's "select 100 of 1,000 runs", the broker alone in process: ``--sweep-in-process``
    fresh processes of ``tree``, each sending the snapshots of the 100 runs of each of
    ``SWEEP_PREFIXES`` (no socket: reading, encoding); the median CPU and wall seconds."""
    from runs_data import cached_runs

    logdir = Path(cached_runs(n_runs=1000, tags=10, points=10_000))
    samples = []
    for _ in range(args.sweep_in_process):
        samples.extend(run_script(tree, SWEEP_IN_PROCESS, str(logdir), *SWEEP_PREFIXES))
    return {
        "samples": samples,
        "wall_s": statistics.median(x[1] for x in samples),
        "cpu_s": statistics.median(x[2] for x in samples),
        "frames": statistics.median(x[3] for x in samples),
        "mb": statistics.median(x[4] for x in samples) / 1e6,
        "own_cpu_s": statistics.median(x[5] for x in samples),
    }


def part_sweep_idle(args, tree: Path, work: Path) -> dict:
    """The follow loop of a ``serve`` over the 1,000-run sweep with no client: its process CPU
    over ``--sweep-idle`` seconds, after ``--sweep-idle-settle`` seconds (discovery of the runs
    done), median of ``--sweep-idle-servers`` fresh servers. Every round of the loop checks
    every run for what another process appended; a run nobody writes should cost next to
    nothing. (The loop also opens one run's reader a round ahead of a page, as long as the
    readers' budget has room: that part is the same in every tree.)"""
    from runs_data import cached_runs

    logdir = Path(cached_runs(n_runs=1000, tags=10, points=10_000))
    samples = []
    for _ in range(args.sweep_idle_servers):
        extra = ["--no-foreign"] if args.sweep_idle_no_foreign else []
        server = Serve(tree, logdir, work / "serve-idle.log", *extra)
        try:
            time.sleep(args.sweep_idle_settle)  # a duration to measure over, not a wait
            cpu, t0 = process_cpu_s(server.proc.pid), time.perf_counter()
            time.sleep(args.sweep_idle)
            cpu = process_cpu_s(server.proc.pid) - cpu
            samples.append(cpu / (time.perf_counter() - t0))
        finally:
            server.stop()
    return {"cpu_per_s": statistics.median(samples), "samples": samples,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}  # fmt: skip


def attempt(out: dict, key: str, part, *args) -> None:
    """Run one part; a part that fails (a page that never draws, say) is recorded, not fatal."""
    try:
        out[key] = part(*args)
    except Exception as exc:
        out[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    print(f"  {key}: {json.dumps(out[key], default=str)[:300]}", file=sys.stderr)


def run_tree(args, tree: Path, browser, work: Path, points: int) -> dict:
    out = {"tree": str(tree)}
    if args.snapshot_reads:
        attempt(out, "snapshot_reads", part_snapshot_reads, args, tree)
    if not args.skip_pages:
        attempt(out, "one_run", part_one_run, args, tree, browser, work)
        if not args.skip_many:
            attempt(out, "many_runs", part_many_runs, args, tree, browser, work)
    if args.sweep_selects:
        attempt(out, "sweep", part_sweep, args, tree, work)
    if args.sweep_in_process:
        attempt(out, "sweep_in_process", part_sweep_in_process, args, tree)
    if args.sweep_idle:
        attempt(out, "sweep_idle", part_sweep_idle, args, tree, work)
    if not args.skip_export:
        attempt(out, "export", part_export, args, tree, work, points)
    return out


def fmt(x: float | None, spec: str = ".0f") -> str:
    return "—" if x is None else format(x, spec)


def report(result: dict) -> str:
    a = result["this"]
    b = result.get("baseline")
    lines = [
        f"bench_serve on {result['machine']} ({result['cpus']} CPUs), {result['date']}",
        "",
        "| measure | this tree | baseline | ratio |",
        "| --- | --- | --- | --- |",
    ]

    def cell(side: dict | None, part: str, key: str, spec: str, unit: str) -> str:
        if side is None:
            return "—"
        got = side.get(part, {})
        if "error" in got:
            return got["error"][:60]
        return fmt(got.get(key), spec) + unit

    def row(name: str, part: str, key: str, spec: str = ".0f", unit: str = "") -> None:
        x = a.get(part, {}).get(key)
        y = b.get(part, {}).get(key) if b else None
        ratio = f"{y / x:.1f}x" if x and y else "—"
        there, base = cell(a, part, key, spec, unit), cell(b, part, key, spec, unit)
        lines.append(f"| {name} | {there} | {base} | {ratio} |")

    if "ws_cold_ms" in a.get("one_run", {}):
        h = result["args"]["hours"]
        for key, when in (("ws_cold_ms", "cold"), ("ws_warm_ms", "warm")):
            row(f"one {h:g} h live run: subscribe to scalars frame, {when}", "one_run", key,
                unit=" ms")  # fmt: skip
    elif "one_run" in a:
        h = result["args"]["hours"]
        row(
            f"one {h:g} h live run: charts in view drawn, cold",
            "one_run",
            "cold_shown_ms",
            unit=" ms",
        )
        row(
            f"one {h:g} h live run: charts in view drawn, warm",
            "one_run",
            "warm_shown_ms",
            unit=" ms",
        )
        row("one live run: scripts fetched before the charts", "one_run", "first_script_kb",
            unit=" KB")  # fmt: skip
        row("the same: scripts in -> DOMContentLoaded", "one_run", "scripts_to_dom_ready_ms",
            unit=" ms")  # fmt: skip
        row("the same: early socket created", "one_run", "ws_created_ms", unit=" ms")
        row("the same, traced: scripts compiled and evaluated before the charts", "one_run",
            "script_eval_first_ms", ".1f", " ms")  # fmt: skip
        row("one live run: server RSS after", "one_run", "rss_mb", unit=" MB")
        n, rh = result["args"]["runs"], result["args"]["run_hours"]
        row(
            f"{n} runs of {rh:g} h: first charts drawn, cold",
            "many_runs",
            "cold_shown_ms",
            unit=" ms",
        )
        row(f"{n} runs: server RSS after", "many_runs", "rss_mb", unit=" MB")
        row(f"{n} runs: server peak RSS", "many_runs", "peak_mb", unit=" MB")
    if "sweep" in a:
        row("select 100 of 1,000 runs, the server alone: subscribe to synced", "sweep",
            "select_s", ".2f", " s")  # fmt: skip
        row("select 100 of 1,000 runs: the server's CPU", "sweep", "select_cpu_s", ".2f", " s")
        for part, label in (
            ("loop", "its event loop (main thread)"),
            ("threads", "its other threads"),
            ("children", "its reader processes"),
        ):
            row(f"the same: {label}", "sweep", f"select_{part}_cpu_s", ".2f", " s")
    if "sweep_in_process" in a:
        row("select 100 of 1,000 runs, the broker in process: CPU", "sweep_in_process", "cpu_s",
            ".2f", " s")  # fmt: skip
        row("the same: the broker's process alone (no reader processes)", "sweep_in_process",
            "own_cpu_s", ".2f", " s")  # fmt: skip
        row("the same: wall", "sweep_in_process", "wall_s", ".2f", " s")
        row("the same: frames", "sweep_in_process", "frames", ".0f")
    if "sweep_idle" in a:
        row("1,000 runs, idle serve: its CPU (s per s)", "sweep_idle", "cpu_per_s", ".3f")
    if "snapshot_reads" in a:
        h = result["args"]["hours"]
        for what, label in (
            ("total", "all of it"),
            ("open", "open and tags()"),
            ("scalars", "scalar tags, 2,000 points each"),
            ("events", "event tags, 100 events each"),
            ("untagged", "untagged kinds"),
        ):
            for clock in ("wall", "cpu"):
                row(
                    f"one {h:g} h run, a snapshot's reads in process ({clock}): {label}",
                    "snapshot_reads",
                    f"{what}_{clock}_s",
                    ".3f",
                    " s",
                )
    if "export" in a and "error" not in a["export"]:
        e = a["export"]
        same = result.get("this_at_baseline_points", e if not b else {})
        be = b.get("export", {}) if b else {}
        lines += [
            "",
            f"| export | this tree, {e['points']:,} points | this tree, "
            f"{same.get('points', 0):,} points | baseline, {be.get('points', 0):,} points | "
            "ratio (same size) |",
            "| --- | --- | --- | --- | --- |",
        ]

        def get(d: dict, path: str) -> float | None:
            for k in path.split("."):
                if not isinstance(d, dict) or k not in d:
                    return None
                d = d[k]
            return d

        measures = (
            ("CLI rows/s", "cli_rows_per_s", ",.0f", True),
            ("CLI rows per CPU second", "cli_rows_per_cpu_s", ",.0f", True),
            ("CLI peak RSS, MB", "cli_peak_mb", ".0f", False),
            ("/api/export rows/s", "http_rows_per_s", ",.0f", True),
            ("/api/export: server peak RSS, MB", "http.peak_mb", ".0f", False),
            ("/api/export: its child's peak RSS (sampled), MB", "http.child_peak_mb", ".0f", False),
            ("/api/export: CPU per M rows, s", "http_cpu_s_per_m_rows", ".3f", False),
            ("/api/export: the server's CPU, s", "http.server_cpu_s", ".2f", False),
            ("/api/export: its child's CPU, s", "http.child_cpu_s", ".2f", False),
            ("/api/export: the client's CPU, s", "http.client_cpu_s", ".2f", False),
            ("/api/export: /api/stats p99, ms", "http.stats_p99_ms", ".0f", False),
            ("/api/export: /api/stats max, ms", "http.stats_max_ms", ".0f", False),
        )
        formats = [f for f in ("csv", "json") if f in e] or [""]
        for f in formats:
            for name, path, spec, higher in measures:
                x, y, z = (get(d, f"{f}.{path}" if f else path) for d in (e, same, be))
                ratio = "—" if not (y and z) else f"{(y / z if higher else z / y):.1f}x"
                label = f"{f.upper()} {name}" if f else name
                lines.append(
                    f"| {label} | {fmt(x, spec)} | {fmt(y, spec)} | {fmt(z, spec)} | {ratio} |"
                )
        lines.append("")
        lines.append("Ratios: how many times better this tree is (rows/s: this / baseline; "
                     "times and memory: baseline / this).")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments, run the parts, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="0.1 h run, 20 runs, 5M points")
    parser.add_argument("--hours", type=float, default=None, help="the one run (default 1)")
    parser.add_argument("--runs", type=int, default=None, help="many runs (default 100)")
    parser.add_argument("--run-hours", type=float, default=0.05, help="hours of each of them")
    parser.add_argument("--points", type=int, default=None, help="export (default 50,000,000)")
    parser.add_argument("--baseline", help="another checkout to measure the same way")
    parser.add_argument("--baseline-points", type=int, default=5_000_000)
    parser.add_argument("--loads", type=int, default=3, help="page loads per server (1 cold)")
    parser.add_argument("--skip-pages", action="store_true")
    parser.add_argument(
        "--snapshot-reads",
        type=int,
        default=0,
        metavar="N",
        help="one run: time a snapshot's reads in process, median of N fresh processes",
    )
    parser.add_argument(
        "--sweep-selects",
        type=int,
        default=0,
        metavar="N",
        help="issue 12: 100 of 1,000 runs' snapshots, the server alone, N fresh servers",
    )
    parser.add_argument(
        "--sweep-in-process",
        type=int,
        default=0,
        metavar="N",
        help="issue 12: 100 of 1,000 runs' snapshots, the broker in process, N fresh processes",
    )
    parser.add_argument(
        "--sweep-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="1,000 runs: an idle serve's CPU over SECONDS (its follow loop), fresh servers",
    )
    parser.add_argument("--sweep-idle-settle", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--sweep-idle-servers", type=int, default=3, metavar="N")
    parser.add_argument(
        "--sweep-idle-no-foreign",
        action="store_true",
        help="serve --no-foreign: the native runs' follow loop without the walk of the log "
        "directory for TensorBoard/VisualDL files (vdl_stream/foreign.py)",
    )
    parser.add_argument("--skip-many", action="store_true", help="no many-runs part")
    parser.add_argument(
        "--trace-loads",
        type=int,
        default=0,
        metavar="N",
        help="one run: N more loads (warm) under a Chromium trace: the scripts' compilation and"
        " top-level evaluation before the charts are shown, and after",
    )
    parser.add_argument(
        "--ws-only",
        action="store_true",
        help="one run: time /ws/live subscribe to the scalars' snapshot frame (the server alone) "
        "with a WebSocket client instead of page loads",
    )
    parser.add_argument("--cache-mb", type=int, help="serve --cache-mb for this tree")
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument(
        "--export-unsettled",
        action="store_true",
        help="export: start /api/export as soon as the server is up, racing its start-up reads",
    )
    parser.add_argument(
        "--export-formats",
        type=lambda text: text.split(","),
        default=["csv", "json"],
        help="export: comma-separated formats (default csv,json)",
    )
    parser.add_argument(
        "--export-repeats", type=int, default=1, help="export: runs of each, the median kept"
    )
    parser.add_argument(
        "--export-via",
        type=lambda text: text.split(","),
        default=["cli", "http"],
        help="export: comma-separated, cli (vdl-stream export) and http (/api/export); default both",
    )
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "vdl-bench-serve"))
    parser.add_argument("--out", default=str(HERE / "out" / "serve.json"))
    args = parser.parse_args()
    if (
        not set(args.export_formats) <= {"csv", "json"}
        or not set(args.export_via) <= {"cli", "http"}
        or args.export_repeats < 1
    ):
        parser.error(
            f"--export-formats takes csv and json, --export-via cli and http, --export-repeats "
            f">= 1; got {','.join(args.export_formats)!r}, {','.join(args.export_via)!r}, "
            f"{args.export_repeats}"
        )
    args.hours = args.hours or (0.1 if args.quick else 1.0)
    args.runs = args.runs or (20 if args.quick else 100)
    args.points = args.points or (5_000_000 if args.quick else 50_000_000)
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vdl-bench-serve-"))

    from playwright.sync_api import sync_playwright

    result = {
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": vars(args),
    }
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS
            )
            try:
                print(f"this tree ({ROOT})", file=sys.stderr)
                result["this"] = run_tree(args, ROOT, browser, work, args.points)
                if args.baseline:
                    print(f"baseline ({args.baseline})", file=sys.stderr)
                    result["baseline"] = run_tree(
                        args, Path(args.baseline), browser, work, args.baseline_points
                    )
                    if "export" in result["this"] and args.points != args.baseline_points:
                        # the same size for the ratio too
                        attempt(
                            result,
                            "this_at_baseline_points",
                            part_export,
                            args,
                            ROOT,
                            work,
                            args.baseline_points,
                        )
            finally:
                browser.close()
    finally:
        for proc in STARTED:
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(report(result))


if __name__ == "__main__":
    main()
