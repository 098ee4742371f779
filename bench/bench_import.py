"""Benchmark: ``vdl-stream import`` of a TensorBoard event file vs TensorBoard's EventAccumulator.

Writes an event file of N scalars with tensorboardX (two tags, as ``add_scalar`` writes them), then
times, best of ``--repeat``:

- vdl-stream: :func:`vdl_stream.interop.import_runs` (framing, both CRC-32C checks, decoding, and
  writing a run with ``recorder.RunWriter``, fsync at close included);
- TensorBoard: ``EventAccumulator(path, size_guidance={SCALARS: 0}).Reload()``, which only loads
  into memory, in a separate process with ``--tb-python`` (an interpreter with ``tensorboard``).

Usage (see docs/performance.md for figures)::

    python -m venv --system-site-packages /tmp/tbvenv && /tmp/tbvenv/bin/pip install tensorboard
    python bench/bench_import.py --points 1000000 --tb-python /tmp/tbvenv/bin/python
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

EA_SCRIPT = r"""
import sys, time
from tensorboard.backend.event_processing import event_accumulator as ea
best = None
for _ in range(int(sys.argv[2])):
    t, c = time.perf_counter(), time.process_time()
    acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    n = sum(len(acc.Scalars(k)) for k in acc.Tags()["scalars"])
    n += sum(len(acc.Tensors(k)) for k in acc.Tags()["tensors"])
    r = (time.perf_counter() - t, time.process_time() - c, n)
    best = r if best is None or r[0] < best[0] else best
print(*best)
"""


def write_events(directory: str, points: int) -> str:
    """Write ``points`` scalars with tensorboardX into ``directory``; return the file path."""
    from tensorboardX import SummaryWriter

    with SummaryWriter(directory, max_queue=4096, flush_secs=600) as w:
        for i in range(points):
            tag = "train/loss" if i % 2 else "train/acc"
            w.add_scalar(tag, math.sin(i * 1e-3), i // 2, walltime=1.7e9 + i * 0.01)
    (path,) = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events-dir", help="reuse (or create) the event file here")
    parser.add_argument("--tb-python", default=sys.executable, help="python with tensorboard")
    args = parser.parse_args()

    from vdl_stream.interop import import_runs

    work = tempfile.mkdtemp(prefix="vdl-bench-import-")
    try:
        events_dir = args.events_dir or os.path.join(work, "tb")
        existing = glob.glob(os.path.join(events_dir, "events.out.tfevents.*"))
        if existing:
            path = existing[0]
        else:
            t = time.perf_counter()
            path = write_events(events_dir, args.points)
            print(
                f"wrote {args.points:,} scalars with tensorboardX in {time.perf_counter() - t:.1f} s"
            )
        size = os.path.getsize(path)
        print(f"event file: {size / 1e6:.1f} MB")

        best = None
        for i in range(args.repeat):
            out = os.path.join(work, f"runs{i}")
            t, c = time.perf_counter(), time.process_time()
            report = import_runs([events_dir], out)
            r = (time.perf_counter() - t, time.process_time() - c, report.scalars)
            best = r if best is None or r[0] < best[0] else best
            shutil.rmtree(out)
        wall, cpu, n = best
        print(
            f"vdl-stream import:   {wall:6.2f} s wall {cpu:6.2f} s cpu  {n / wall:12,.0f} scalars/s"
        )

        done = subprocess.run(
            [args.tb_python, "-c", EA_SCRIPT, events_dir, str(args.repeat)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print("EventAccumulator: could not run (is tensorboard installed for --tb-python?)")
            print(done.stderr.strip().splitlines()[-1] if done.stderr else "")
            return
        ea_wall, ea_cpu, ea_n = done.stdout.split()
        ea_wall, ea_cpu = float(ea_wall), float(ea_cpu)
        print(
            f"EventAccumulator:    {ea_wall:6.2f} s wall {ea_cpu:6.2f} s cpu  "
            f"{int(ea_n) / ea_wall:12,.0f} scalars/s"
        )
        print(f"speed-up: {ea_wall / wall:.1f}x wall, {ea_cpu / cpu:.1f}x cpu")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
