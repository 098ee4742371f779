"""Runs written the way live training writes them, for benchmarks and fixtures.

A live run is not a bulk load: the broker persists what arrived every ~20 ms with
``RunWriter(sync="never")``: ``append_*`` for the batches, an ``"ingest"`` bookkeeping record (every
writer's last sequence number), ``flush()``; and ``sync()`` about once a second. This module
replays that cadence with simulated wall times and no sleeping:

* 10 scalar tags (``train/loss``, ``train/acc``, ...) per step, 50 steps/s, one flush per 20 ms
  (so one step per flush), each flush ending with the ``"ingest"`` record;
* histograms of 4 layers (``hist/layer0`` ...) every 50 steps, 64 buckets, in the shape
  ``vdl_stream.summaries.histogram_event`` builds;
* a telemetry event (untagged, ``{"host", "rank", "fields"}``) every second;
* an image (``images/sample``, ~4 KB of PNG-like bytes) every 1,000 steps;
* optionally stopped the way SIGKILL stops it: no ``close()``, nothing after the last flush.

Dependency-free (recorder and NumPy) so that any test or benchmark can import it::

    from live_run import write_live_run, cached_live_run
    info = write_live_run("/tmp/run", hours=0.1)
    path = cached_live_run(24, killed=True)     # generated once under bench/out/live/

Command line::

    python bench/live_run.py OUT_DIR --hours 1 [--killed]
    python bench/live_run.py --cached --hours 24            # fill the cache, print the path
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from recorder import RunWriter  # noqa: E402

WALL0 = 1_790_000_000.0
TAGS = (
    "train/loss",
    "train/acc",
    "train/lr",
    "train/grad_norm",
    "train/tokens_per_s",
    "eval/loss",
    "eval/acc",
    "sys/step_time",
    "sys/data_time",
    "sys/mem",
)
CACHE_DIR = os.path.join(HERE, "out", "live")
# Bump when the cadence or the record shapes change, so cached runs are regenerated.
GENERATOR_VERSION = 1


def _histogram(rng: np.random.Generator, layer: int, step: int, buckets: int) -> dict[str, Any]:
    spread = 1.0 + layer * 0.5 + 1.0 / (1.0 + step / 10_000)
    lo, hi = -3.0 * spread, 3.0 * spread
    edges = np.linspace(lo, hi, buckets + 1)
    centre = (edges[:-1] + edges[1:]) / 2
    counts = np.rint(10_000 * np.exp(-(centre**2) / (2 * spread**2)) + rng.random(buckets))
    return {
        "edges": edges.astype("<f8").tobytes(),
        "counts": counts.astype("<f8").tobytes(),
        "num": int(counts.sum()),
        "nan": 0,
        "inf": 0,
        "min": float(lo),
        "max": float(hi),
        "sum": float((counts * centre).sum()),
        "sum_sq": float((counts * centre**2).sum()),
    }


def _telemetry(rng: np.random.Generator) -> dict[str, Any]:
    fields = {
        "gpu0.util": float(rng.uniform(80, 100)),
        "gpu0.mem_used": float(rng.uniform(3e10, 4e10)),
        "gpu0.power": float(rng.uniform(250, 300)),
        "gpu0.temp": float(rng.uniform(60, 70)),
        "cpu.percent": float(rng.uniform(10, 40)),
        "mem.rss": float(rng.uniform(5e9, 6e9)),
        "net.rx_rate": float(rng.uniform(1e6, 2e6)),
        "net.tx_rate": float(rng.uniform(1e6, 2e6)),
        "disk.read_rate": float(rng.uniform(0, 1e7)),
        "disk.write_rate": float(rng.uniform(0, 1e6)),
    }
    return {"host": "node-0", "rank": 0, "fields": fields}


def _image(rng: np.random.Generator) -> dict[str, Any]:
    blob = b"\x89PNG\r\n\x1a\n" + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return {"format": "png", "data": blob, "width": 64, "height": 64}


def write_live_run(
    path: str | os.PathLike[str],
    hours: float,
    *,
    killed: bool = False,
    steps_per_s: int = 50,
    flush_s: float = 0.02,
    tags: int = 10,
    layers: int = 4,
    histogram_every: int = 50,
    telemetry_s: float = 1.0,
    image_every: int = 1000,
    sync_s: float | None = None,
    start_step: int = 0,
    wall0: float = WALL0,
    seed: int = 0,
    writer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``hours`` of a live-written run into ``path`` (created; appended to if it exists).

    Args:
        path: the run directory.
        hours: simulated duration (the wall times of the records span it; nothing sleeps).
        killed: stop as SIGKILL would after the last flush: no ``close()``, no index, no fsync.
        steps_per_s, flush_s: the training cadence; every flush persists the steps that fell in
            its 20 ms (one at the default 50 steps/s) and an ``"ingest"`` record.
        tags: scalar tags per step (at most 10 named ones, then ``extra/N``).
        layers, histogram_every: histograms of ``layers`` layers every that many steps.
        telemetry_s: a telemetry event every that many simulated seconds.
        image_every: an image every that many steps.
        sync_s: call ``sync()`` every that many simulated seconds, as the broker does (None:
            never; the fsyncs would dominate the generation time, not the recorder's work).
        start_step, wall0: where the run starts (to append a second session to a run).
        seed: for the values.
        writer: extra keyword arguments of :class:`recorder.RunWriter` (e.g. compaction
            thresholds); ``sync`` is always ``"never"``, as the broker opens it.

    Returns:
        ``{"flushes", "steps", "points", "records", "events", "seconds", "bytes", "writer_cpu_s",
        "statistics"}``: what was written, and the writer's wall and CPU time.
    """
    if not isinstance(hours, (int, float)) or not hours > 0:
        raise ValueError(f"hours must be a number > 0, got {hours!r}")
    names = [TAGS[i] if i < len(TAGS) else f"extra/{i}" for i in range(tags)]
    rng = np.random.default_rng(seed)
    flushes = round(hours * 3600 / flush_s)
    steps_per_flush = steps_per_s * flush_s
    total_steps = round(flushes * steps_per_flush)
    # Values of every tag, computed at once (a noisy decaying curve per tag).
    s_all = np.arange(start_step, start_step + total_steps, dtype=np.int64)
    base = np.exp(-s_all / max(total_steps / 3, 1))
    noise = rng.normal(0.0, 0.02, (tags, min(total_steps, 1 << 16)))
    walls_all = wall0 + (s_all - start_step) / steps_per_s + 0.001
    w = RunWriter(path, **{**(writer or {}), "sync": "never"})
    start = time.perf_counter()
    cpu0 = time.process_time()
    events = records_before = 0
    next_tel = wall0 + telemetry_s
    next_sync = None if sync_s is None else wall0 + sync_s
    done = 0
    last_seq = {"trainer-0": 0}
    cols = [np.empty(1, np.float64) for _ in range(tags)]
    noise_n = noise.shape[1]
    for f in range(flushes):
        flush_wall = wall0 + (f + 1) * flush_s
        upto = min(total_steps, round((f + 1) * steps_per_flush))
        if upto > done:
            steps = s_all[done:upto]
            walls = walls_all[done:upto]
            for t in range(tags):
                k = done % noise_n
                vals = base[done:upto] * (1.0 + t * 0.1) + noise[t, k : k + upto - done]
                if len(vals) != upto - done:  # the noise table wrapped
                    vals = base[done:upto] * (1.0 + t * 0.1)
                cols[t] = vals
                w.append_scalars(names[t], steps, walls, vals)
            for step in steps.tolist():
                if step % histogram_every == 0:
                    for layer in range(layers):
                        w.append_record(
                            "histogram",
                            f"hist/layer{layer}",
                            step,
                            flush_wall,
                            _histogram(rng, layer, step, 64),
                        )
                        events += 1
                if step % image_every == 0:
                    w.append_record("image", "images/sample", step, flush_wall, _image(rng))
                    events += 1
            done = upto
        if flush_wall >= next_tel:
            w.append_record("telemetry", None, None, flush_wall, _telemetry(rng))
            events += 1
            next_tel += telemetry_s
        last_seq["trainer-0"] += 1
        w.append_record("ingest", None, None, flush_wall, dict(last_seq))
        if next_sync is not None and flush_wall >= next_sync:
            w.sync()
            next_sync += sync_s
        else:
            w.flush()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    stats = w.statistics()
    if killed:
        # What SIGKILL leaves: everything flushed is in the OS; no close(), no index.
        w._closed = True  # __del__ then does nothing
        os.close(w._fd)
        os.close(w._dir_fd)
    else:
        w.close()
    size = sum(
        os.path.getsize(os.path.join(path, name))
        for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name))
    )
    return {
        "hours": hours,
        "flushes": flushes,
        "steps": total_steps,
        "points": total_steps * tags,
        "records": stats.records - records_before,
        "events": events,
        "seconds": seconds,
        "writer_cpu_s": cpu,
        "bytes": size,
        "killed": killed,
        "statistics": {k: v for k, v in dataclasses.asdict(stats).items() if k != "position"},
    }


def cached_live_run(hours: float, *, killed: bool = False, **options: Any) -> str:
    """The path of a live run of ``hours`` under bench/out/live/, generating it once.

    Runs are keyed by their parameters and :data:`GENERATOR_VERSION`; a run whose generation was
    interrupted is generated again (a ``done.json`` beside it marks a complete one).
    """
    key = json.dumps(
        {"v": GENERATOR_VERSION, "hours": hours, "killed": killed, **options}, sort_keys=True
    )
    name = f"h{hours:g}-{'killed' if killed else 'closed'}-{abs(hash_key(key)):016x}"
    root = os.path.join(CACHE_DIR, name)
    run = os.path.join(root, "run")
    done = os.path.join(root, "done.json")
    if os.path.exists(done):
        return run
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    info = write_live_run(run, hours, killed=killed, **options)
    with open(done, "w") as f:
        json.dump({"key": key, **info}, f, indent=2, default=str)
    return run


def hash_key(text: str) -> int:
    """A stable 64-bit hash of ``text`` (Python's hash() is salted per process)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the run directory to write")
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--killed", action="store_true", help="stop without close()")
    parser.add_argument("--cached", action="store_true", help="write into bench/out/live/")
    parser.add_argument("--sync-s", type=float, default=None, help="sync() every N seconds")
    args = parser.parse_args()
    if args.cached:
        print(cached_live_run(args.hours, killed=args.killed))
        return
    if not args.out:
        parser.error("give OUT_DIR or --cached")
    info = write_live_run(args.out, args.hours, killed=args.killed, sync_s=args.sync_s)
    print(json.dumps(info, indent=2, default=str))


if __name__ == "__main__":
    main()
