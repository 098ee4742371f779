"""Anchor measurements for bench/bench_recorder.py, run in the anchors' venv.

The same run (tags x steps scalar points, from bench/recorder_data.py) written by tensorboardX and by
VisualDL's LogWriter, then loaded by TensorBoard's EventAccumulator and VisualDL's LogReader. Each
load runs in a fresh process so its peak memory can be reported. Prints one JSON object.

    bench/.venv-anchors/bin/python bench/recorder_anchors.py write --tags 100 --steps 10000 --out DIR
    bench/.venv-anchors/bin/python bench/recorder_anchors.py load-tb DIR/tbx
    bench/.venv-anchors/bin/python bench/recorder_anchors.py load-rust DIR/tbx --samples scalars=all
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from recorder_data import tag_series


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write(tags: int, steps: int, out: str) -> dict:
    """Write the run with tensorboardX and VisualDL; return times and sizes."""
    from tensorboardX import SummaryWriter
    from visualdl import LogWriter

    data = [tag_series(t, steps) for t in range(tags)]
    result = {"events": tags * steps}
    tbx = os.path.join(out, "tbx")
    shutil.rmtree(tbx, ignore_errors=True)
    start = time.perf_counter()
    w = SummaryWriter(tbx, flush_secs=120, max_queue=100_000)
    for i in range(steps):
        for t in range(tags):
            s, walls, values = data[t]
            w.add_scalar(f"tag{t}", values[i], int(s[i]), walltime=float(walls[i]))
    w.close()
    result["tbx_write_s"] = time.perf_counter() - start
    result["tbx_bytes"] = _size(tbx)
    vdl = os.path.join(out, "vdl")
    shutil.rmtree(vdl, ignore_errors=True)
    start = time.perf_counter()
    with LogWriter(logdir=vdl) as w:
        for i in range(steps):
            for t in range(tags):
                s, walls, values = data[t]
                w.add_scalar(f"tag{t}", float(values[i]), int(s[i]), walltime=int(walls[i] * 1000))
    result["vdl_write_s"] = time.perf_counter() - start
    result["vdl_bytes"] = _size(vdl)
    return result


def load_tb(path: str) -> dict:
    """Load every scalar of the run with TensorBoard's EventAccumulator (no sampling)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    start = time.perf_counter()
    acc = EventAccumulator(path, size_guidance={SCALARS: 0})
    acc.Reload()
    points = sum(len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"])
    return {"seconds": time.perf_counter() - start, "points": points, "rss_mb": _rss_mb()}


def _rust_seconds(text: str) -> float:
    """Parse a Rust ``Duration`` as printed by ``{:?}`` (``843.5ms``, ``1.2s``, ``950µs``)."""
    for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9), ("s", 1.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"unknown duration {text!r}")


def load_rust(path: str, samples: str) -> dict:
    """One load cycle of TensorBoard's Rust data server (``--load_fast``), as it logs it.

    ``samples`` is passed as ``--samples-per-plugin`` (``""``: the default, 1,000 points a tag).
    """
    from tensorboard_data_server import server_binary

    args = [server_binary(), "--logdir", path, "--reload", "once", "--port", "0", "-v"]
    if samples:
        args += ["--samples-per-plugin", samples]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        for line in proc.stderr:
            if "Finished load cycle" in line:
                seconds = _rust_seconds(line.rsplit("(", 1)[1].rstrip(")\n "))
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the Rust data server did not finish loading")
        else:
            raise RuntimeError("the Rust data server exited without loading")
        with open(f"/proc/{proc.pid}/status") as f:
            rss = next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 1024
    finally:
        proc.kill()
        proc.wait()
    return {"seconds": seconds, "rss_mb": rss, "samples": samples or "default (1000 a tag)"}


def load_vdl(path: str) -> dict:
    """Load every scalar of the run with VisualDL's LogReader."""
    from visualdl import LogReader

    start = time.perf_counter()
    (name,) = [f for f in os.listdir(path) if "vdlrecords" in f]
    reader = LogReader(file_path=os.path.join(path, name))
    points = sum(len(reader.get_data("scalar", tag)) for tag in reader.get_tags()["scalar"])
    return {"seconds": time.perf_counter() - start, "points": points, "rss_mb": _rss_mb()}


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["write", "load-tb", "load-vdl", "load-rust"])
    parser.add_argument("--samples", default="", help="load-rust: --samples-per-plugin")
    parser.add_argument("path", nargs="?", default=None)
    parser.add_argument("--tags", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.mode == "write":
        result = write(args.tags, args.steps, args.out)
    elif args.mode == "load-tb":
        result = load_tb(args.path)
    elif args.mode == "load-rust":
        result = load_rust(args.path, args.samples)
    else:
        result = load_vdl(args.path)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
