"""Benchmark: ``vdl-stream replay`` of a large run: feed rate, start-up, and seeks in a browser.

Records a run of N scalar points (10 tags, 1 ms apart) plus one histogram per 10,000 points with
``recorder.RunWriter``, then measures:

- **feed** (always): the run replayed as ``vdl-stream replay --speed max`` does it (timelines loaded
  with ``RunReader.iter_records()``, fed by a :class:`~vdl_stream.replay.Replayer` into its
  :class:`~vdl_stream.replay.ReplaySource`), with one in-process subscriber decoding every ``data``
  frame (msgpack) and counting points. The rate is points and events received per second, from
  the first feed to the last frame received. With ``--websocket`` the subscriber is also measured
  as a WebSocket client of ``/ws/live`` (the browser's path) that re-syncs after a ``gap`` as the
  page does (its queue holds 8 MiB of frames): the time until it holds every tag's last point.
- **start** (``--start``): ``vdl-stream replay PATH --paused [--from STEP]`` as a subprocess, from
  its start until a ``/ws/live`` client holds the run as of the start position (every tag up to
  the step before STEP; at the beginning, until the server has listed its runs), then until the
  process is idle: the CPU time it used and the bytes it wrote. ``--code DIR`` runs the command
  from another source tree (``PYTHONPATH=DIR``, working directory DIR), e.g. the previous
  implementation, extracted with
  ``git archive bccdb43 vdl_stream recorder | tar -x -C /tmp/old-replay``.
- **seek** (``--browser``): the replay served by ``vdl-stream replay --paused``, opened in Chromium
  (Playwright, the test suite's flags); each seek is ``vdl.replay.seek({wall})`` (POST
  /api/replay) to a random position, timed in the page from the request until every chart in view
  draws data that ends at the new position (the last step of each tag before the target).

Usage::

    python bench/bench_replay.py --points 10000000 --websocket --start --browser
    python bench/bench_replay.py --points 10000000 --start --code /tmp/old-replay --code .
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import trio
from broker_clients import process_cpu_s

import recorder
from vdl_stream.replay import Replayer, load_timelines, serve_replay

TAGS = 10
WALL0 = 1.7e9
SPACING = 1e-3  # recorded seconds between two points (of any tag)
HERE = Path(__file__).resolve().parent


def record(run_dir: str, points: int) -> int:
    """Write the run; return its number of points and events."""
    per_tag = points // TAGS
    block = 1 << 16
    events = 0
    with recorder.RunWriter(run_dir, sync="never") as w:
        for lo in range(0, per_tag, block):
            hi = min(lo + block, per_tag)
            steps = np.arange(lo, hi, dtype=np.int64)
            for k in range(TAGS):
                walls = WALL0 + (steps * TAGS + k) * SPACING
                w.append_scalars(f"train/m{k}", steps, walls, np.sin(steps * (k + 1) * 1e-4))
            for step in range(lo - lo % 1000 + 1000 if lo % 1000 else lo, hi, 1000):
                edges = np.linspace(-1, 1, 31).tobytes()
                counts = np.ones(30).tobytes()
                w.append_record(
                    "histogram",
                    "weights",
                    step,
                    WALL0 + step * TAGS * SPACING,
                    {"edges": edges, "counts": counts, "num": 30},
                )
                events += 1
            w.flush()
    return per_tag * TAGS + events


def count(frame: dict) -> int:
    """Points and events in a decoded data frame."""
    return sum(len(c[1]) // 8 for c in frame["scalars"]) + len(frame["events"])


# -- feed ----------------------------------------------------------------------------------------


async def feed(logdir: str, total: int) -> tuple[float, float, int, int]:
    """Replay at max speed into an in-process subscriber; return load s, feed s, received, gaps."""
    t = time.perf_counter()
    timelines = await trio.to_thread.run_sync(load_timelines, logdir)
    load = time.perf_counter() - t
    received = gaps = 0
    replayer = Replayer(timelines, speed=math.inf, start_paused=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(replayer.run)
        sub = replayer.source.subscribe()
        await replayer.source.snapshot(sub)
        started = time.perf_counter()
        replayer.play()
        while received < total:
            frame = msgpack.unpackb(await sub.receive())
            if frame["type"] == "gap":
                gaps += 1
                break
            if frame["type"] == "data":
                received += count(frame)
        elapsed = time.perf_counter() - started
        replayer.source.close()
        nursery.cancel_scope.cancel()
    return load, elapsed, received, gaps


async def feed_websocket(logdir: str, total: int, per_tag: int) -> tuple[float, int, int]:
    """The same, with the subscriber a WebSocket client of ``/ws/live`` on 127.0.0.1 that does
    what the page does: after a ``gap`` it subscribes again and re-syncs from the snapshot.
    Returns the seconds until it holds every tag's last point, the points and events it got in
    ``data`` frames, and the gaps."""
    from trio_websocket import open_websocket_url

    timelines = await trio.to_thread.run_sync(load_timelines, logdir)
    received = gaps = 0
    reached: dict[str, int] = {}
    subscribe = msgpack.packb({"type": "subscribe", "runs": None})
    replayer = Replayer(timelines, speed=math.inf, start_paused=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(replayer.run)
        url = await nursery.start(serve_replay, replayer, "127.0.0.1", 0)
        ws_url = url.replace("http", "ws", 1) + "/ws/live"
        async with open_websocket_url(ws_url, max_message_size=64 << 20) as ws:
            await ws.send_message(subscribe)
            while msgpack.unpackb(await ws.get_message())["type"] != "snapshot":
                pass  # hello, runs, the status, then the (empty) snapshot: subscribed
            started = time.perf_counter()
            replayer.play()
            while len(reached) < TAGS or min(reached.values()) < per_tag - 1:
                frame = msgpack.unpackb(await ws.get_message())
                if frame["type"] == "gap":
                    gaps += 1
                    await ws.send_message(subscribe)
                if frame["type"] == "data":
                    received += count(frame)
                if frame["type"] in ("data", "snapshot"):
                    for tag, steps, _, _ in frame["scalars"]:
                        if len(steps):
                            top = int(np.frombuffer(steps, "<f8")[-1])
                            reached[tag] = max(reached.get(tag, -1), top)
            elapsed = time.perf_counter() - started
        replayer.source.close()
        nursery.cancel_scope.cancel()
    return elapsed, received, gaps


# -- start ---------------------------------------------------------------------------------------


def start_replay(run_dir: str, *extra: str, code: str | None) -> tuple[subprocess.Popen, str]:
    """Start ``vdl-stream replay RUN --port 0 --paused ...``; return it and its URL."""
    # `python -m` puts the working directory first on sys.path: run from the tree to measure.
    code = code or str(HERE.parent)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": code}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vdl_stream.cli",
            "replay",
            run_dir,
            "--port",
            "0",
            "--paused",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=code,
    )
    line = proc.stdout.readline()
    if " at http" not in line:
        proc.kill()
        raise RuntimeError(f"replay did not start: {line!r} {proc.stderr.read()!r}")
    return proc, line.rsplit(" at ", 1)[1].strip().rstrip("/")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def until_shown(url: str, last_step: int | None) -> None:
    """Subscribe to ``/ws/live`` until every tag reaches ``last_step`` (None: until the server
    has listed its runs), subscribing again after a ``gap``; at most 120 s."""
    from trio_websocket import open_websocket_url

    reached: dict[str, int] = {}
    subscribe = msgpack.packb({"type": "subscribe", "runs": None})
    ws_url = url.replace("http", "ws", 1) + "/ws/live"
    with trio.fail_after(120):
        async with open_websocket_url(ws_url, max_message_size=64 << 20) as ws:
            await ws.send_message(subscribe)
            while True:
                frame = msgpack.unpackb(await ws.get_message())
                if frame["type"] == "runs" and last_step is None:
                    return
                if frame["type"] == "gap":
                    await ws.send_message(subscribe)
                if frame["type"] not in ("snapshot", "data"):
                    continue
                for tag, steps, _, _ in frame["scalars"]:
                    if len(steps):
                        top = int(np.frombuffer(steps, "<f8").max())
                        reached[tag] = max(reached.get(tag, -1), top)
                if len(reached) == TAGS and min(reached.values()) >= last_step:
                    return


def process_written(pid: int) -> int:
    """Bytes the process has passed to write() so far (files, sockets)."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def measure_start(run_dir: str, from_step: int | None, code: str | None) -> dict[str, float]:
    """From spawning the command: seconds to its URL line and to a client holding the run; then,
    once the process is idle (its CPU time still for 0.5 s), the CPU seconds it used and the MB it
    wrote (a copy through a broker shows here)."""
    t0 = time.perf_counter()
    extra = () if from_step is None else ("--from", str(from_step))
    proc, url = start_replay(run_dir, *extra, code=code)
    try:
        listening = time.perf_counter() - t0
        trio.run(until_shown, url, None if from_step is None else from_step - 1)
        shown = time.perf_counter() - t0
        cpu = process_cpu_s(proc.pid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.5)
            cpu, before = process_cpu_s(proc.pid), cpu
            if cpu - before < 0.02:
                break
        written = process_written(proc.pid) / 1e6
        return {"listening": listening, "shown": shown, "cpu": cpu, "written": written}
    finally:
        stop(proc)


# -- seek in Chromium ----------------------------------------------------------------------------

# In the page: seek, then wait (one check per animation frame) until every chart in view draws
# data ending at the expected step of its tag. Returns milliseconds, or -1 after 10 s.
SEEK_JS = """
async ([wall, expected]) => {
  const t0 = performance.now();
  let inView = 0;
  const done = () => {
    inView = 0;
    for (const [tag, chart] of window.vdl.chartWrappers) {
      if (!chart.visible) continue;
      inView++;
      const xs = chart.plot && chart.plot.data[0];
      if (!xs || !xs.length || xs[xs.length - 1] !== expected[tag]) return false;
    }
    return inView > 0;
  };
  const seek = window.vdl.replay.seek({ wall });
  return await new Promise((resolve) => {
    const check = () => {
      if (done()) resolve([performance.now() - t0, inView]);
      else if (performance.now() - t0 > 10000) resolve([-1, inView]);
      else requestAnimationFrame(check);
    };
    seek.then(check, () => resolve([-1, inView]));
  });
}
"""


def measure_seeks(run_dir: str, per_tag: int, seeks: int) -> tuple[list[float], int]:
    """Milliseconds per seek, in Chromium, against ``vdl-stream replay --paused``, and the number
    of charts in view."""
    sys.path.insert(0, str(HERE.parent))
    from playwright.sync_api import sync_playwright

    from tests.conftest import CHROMIUM_ARGS

    rng = np.random.default_rng(7)
    records = per_tag * TAGS
    proc, url = start_replay(run_dir, code=None)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + "/")
            page.wait_for_function(
                "() => window.vdl && window.vdl.replay.active && window.vdl.sync.phase === 'ready'",
                timeout=60_000,
            )
            times = []
            in_view = 0
            for i in range(seeks + 1):
                # between two recorded points, so that which points come before is exact
                n = int(rng.integers(TAGS, records - 1))
                wall = WALL0 + (n + 0.5) * SPACING
                expected = {f"train/m{k}": (n - k) // TAGS for k in range(TAGS)}
                ms, in_view = page.evaluate(SEEK_JS, [wall, expected])
                if ms < 0:
                    raise RuntimeError(f"seek to record {n} was not drawn within 10 s")
                if i:  # the first one warms up the page and the server
                    times.append(ms)
                page.wait_for_timeout(300)
            browser.close()
    finally:
        stop(proc)
    return times, in_view


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--websocket", action="store_true", help="also feed through /ws/live")
    parser.add_argument("--start", action="store_true", help="time the start of the command")
    parser.add_argument(
        "--code",
        action="append",
        help="run the command (--start) from this source tree; repeat to compare trees "
        "(their runs alternate); default: this one",
    )
    parser.add_argument("--browser", action="store_true", help="time seeks in Chromium")
    parser.add_argument("--seeks", type=int, default=20, help="seeks to time (default: 20)")
    parser.add_argument("--repeat", type=int, default=3, help="start-up runs (median; default 3)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="vdl-bench-replay-")
    try:
        run_dir = os.path.join(work, "logs", "big")
        t = time.perf_counter()
        total = record(run_dir, args.points)
        print(f"recorded {total:,} points and events in {time.perf_counter() - t:.1f} s")
        if not args.code:
            load, elapsed, received, gaps = trio.run(feed, os.path.join(work, "logs"), total)
            print(f"loaded the run in {load:.2f} s")
            print(
                f"replayed {received:,} of {total:,} into a subscriber in {elapsed:.2f} s: "
                f"{received / elapsed:,.0f} events/s ({gaps} gaps)"
            )
        if args.websocket:
            elapsed, received, gaps = trio.run(
                feed_websocket, os.path.join(work, "logs"), total, args.points // TAGS
            )
            print(
                f"through /ws/live: the client holds the whole run after {elapsed:.2f} s "
                f"({received:,} points and events came in data frames, {gaps} gaps re-synced "
                "from snapshots)"
            )
        if args.start:
            per_tag = args.points // TAGS
            codes = args.code or [str(HERE.parent)]
            for label, step in (("at the start", None), ("--from the last step", per_tag - 1)):
                runs: dict[str, list[dict[str, float]]] = {code: [] for code in codes}
                for _ in range(args.repeat):
                    for code in codes:  # alternating, so that a busy moment hits every tree
                        runs[code].append(measure_start(run_dir, step, code))
                for code, times in runs.items():
                    median = {k: statistics.median(r[k] for r in times) for k in times[0]}
                    print(
                        f"start {label} ({code}): listening after {median['listening']:.2f} s, "
                        f"a client holds the run after {median['shown']:.2f} s; until idle "
                        f"{median['cpu']:.2f} CPU-s, {median['written']:.0f} MB written "
                        f"(median of {args.repeat})"
                    )
        if args.browser:
            times, in_view = measure_seeks(run_dir, args.points // TAGS, args.seeks)
            times.sort()
            print(
                f"seek in Chromium, all {in_view} charts in view redrawn: "
                f"median {statistics.median(times):.0f} ms, "
                f"p90 {times[int(len(times) * 0.9) - 1]:.0f} ms, max {times[-1]:.0f} ms "
                f"({len(times)} seeks)"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
