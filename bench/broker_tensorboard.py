"""TensorBoard freshness for bench/bench_broker.py: how long until a written scalar is visible.

Starts ``tensorboard --logdir X --port P --host 127.0.0.1`` (plus ``--reload_interval`` when asked),
writes scalars with tensorboardX one at a time (flushed to the file after each) on a fixed schedule
that is not a multiple of the reload interval, and polls TensorBoard's HTTP API
(``/data/plugin/scalars/scalars?run=R&tag=T``, the route of the scalars plugin in TensorBoard 2.x)
every 50 ms, recording when each step first appears. Everything is bounded by counts and deadlines,
and the TensorBoard process is stopped in ``finally``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from broker_clients import STARTED, free_port

RUN, TAG = "fresh", "fresh/value"
POLL_S = 0.05


def find_tensorboard(explicit: str | None) -> str | None:
    """Return the ``tensorboard`` executable: ``explicit``, on PATH, or in /tmp/tbvenv."""
    for candidate in (explicit, shutil.which("tensorboard"), "/tmp/tbvenv/bin/tensorboard"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _get_steps(base: str) -> dict[int, float] | None:
    """Return {step: value} of the tag as TensorBoard serves it now, or None if not served yet."""
    query = urllib.parse.urlencode({"run": RUN, "tag": TAG})
    try:
        with urllib.request.urlopen(f"{base}/data/plugin/scalars/scalars?{query}", timeout=5) as r:
            points = json.load(r)  # [[wall_time, step, value], ...]
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return {int(p[1]): p[2] for p in points}


def _flush(writer, event_file: Path) -> None:
    """``writer.flush()`` until the event file grew (bounded by 5 s).

    tensorboardX's ``flush()`` flushes only what its background thread has already taken from its
    queue, so one call right after ``add_scalar`` can leave the event in memory until
    ``flush_secs`` (120 s) passes.
    """
    size = event_file.stat().st_size
    deadline = time.monotonic() + 5
    while True:
        writer.flush()
        if event_file.stat().st_size > size or time.monotonic() > deadline:
            return
        time.sleep(0.001)


def measure(
    tensorboard: str,
    workdir: Path,
    *,
    reload_interval: float | None,
    samples: int,
    spacing: float,
    start_timeout: float = 90.0,
) -> dict:
    """Measure freshness for ``samples`` scalars written ``spacing`` seconds apart.

    Returns the per-sample delays (seconds from ``add_scalar`` to first visible), the number never seen
    within the deadline, TensorBoard's version, and its startup time.
    """
    from tensorboardX import SummaryWriter

    logdir = workdir / f"tb-{reload_interval or 'default'}"
    logdir.mkdir(parents=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [tensorboard, "--logdir", str(logdir), "--port", str(port), "--host", "127.0.0.1"]
    if reload_interval is not None:
        args += ["--reload_interval", str(reload_interval)]
    log = open(workdir / f"tensorboard-{port}.log", "wb")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    STARTED.add(proc)
    writer = SummaryWriter(str(logdir / RUN))
    event_file = next((logdir / RUN).glob("events.out.tfevents.*"))
    _flush(writer, event_file)  # the file-version record, queued when the writer opened
    seen: dict[int, float] = {}
    written: dict[int, float] = {}
    stop = threading.Event()
    try:
        started = time.monotonic()
        writer.add_scalar(TAG, 0.0, 0)
        _flush(writer, event_file)
        while True:  # warm-up: TensorBoard up and the run loaded
            if proc.poll() is not None:
                raise RuntimeError(f"tensorboard exited with {proc.returncode}; see {log.name}")
            steps = _get_steps(base)
            if steps is not None and 0 in steps:
                break
            if time.monotonic() - started > start_timeout:
                raise RuntimeError(f"tensorboard did not show the run within {start_timeout} s")
            time.sleep(0.2)
        startup = time.monotonic() - started

        def poll() -> None:
            while not stop.is_set():
                steps = _get_steps(base) or {}
                now = time.monotonic()
                for step in steps:
                    seen.setdefault(step, now)
                stop.wait(POLL_S)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.monotonic()
        for i in range(1, samples + 1):
            time.sleep(max(0.0, t0 + i * spacing - time.monotonic()))
            written[i] = time.monotonic()
            writer.add_scalar(TAG, float(i), i)
            _flush(writer, event_file)
        deadline = time.monotonic() + 4 * (reload_interval or 5.0) + 10
        while time.monotonic() < deadline and not all(i in seen for i in written):
            time.sleep(POLL_S)
        stop.set()
        poller.join(10)
    finally:
        stop.set()
        writer.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    version = subprocess.run(
        [tensorboard, "--version_tb"], capture_output=True, text=True, timeout=60
    )
    return {
        "delays": [seen[i] - written[i] for i in written if i in seen],
        "missing": sum(1 for i in written if i not in seen),
        "version": version.stdout.strip(),
        "startup_s": startup,
    }
