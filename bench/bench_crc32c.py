"""Benchmark: CRC-32C of TensorBoard event files, google-crc32c (C) against the numpy path.

Writes two event files with tensorboardX: N scalars (``add_scalar``, records of ~40 bytes, the
common case) and M images of 256 KiB each (long records). For each file and each backend
(``tfrecord.CRC_BACKEND``), interleaved, ``--repeat`` times, it times:

- ``import``: :func:`vdl_stream.interop.import_runs` of the file (framing, both checksums of every
  record, decoding, writing the run);
- ``crc``: :func:`vdl_stream.tfrecord.crc32c_many` over the payloads alone.

and prints medians and the numpy/google ratio. Figures: docs/performance.md ("CRC-32C:
google-crc32c against numpy")::

    python bench/bench_crc32c.py                 # 1,000,000 scalars, 200 images, 5 repeats
    python bench/bench_crc32c.py --quick
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def write_scalars(directory: str, points: int) -> str:
    """``points`` scalars of two tags, as ``add_scalar`` writes them; returns the file."""
    from tensorboardX import SummaryWriter

    with SummaryWriter(directory, max_queue=4096, flush_secs=600) as w:
        for i in range(points):
            tag = "train/loss" if i % 2 else "train/acc"
            w.add_scalar(tag, math.sin(i * 1e-3), i // 2, walltime=1.7e9 + i * 0.01)
    (path,) = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
    return path


def write_images(directory: str, count: int, size: int = 256 << 10) -> str:
    """``count`` image summaries of ``size`` bytes each (random bytes behind a PNG signature)."""
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary

    rng = np.random.default_rng(0)
    with SummaryWriter(directory, max_queue=16, flush_secs=600) as w:
        for i in range(count):
            data = b"\x89PNG\r\n\x1a\n" + rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            image = Summary.Image(height=256, width=256, colorspace=3, encoded_image_string=data)
            w._get_file_writer().add_summary(
                Summary(value=[Summary.Value(tag="img", image=image)]), i, 1.7e9 + i
            )
    (path,) = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
    return path


def time_import(path: str, backend: str, tmp: str) -> float:
    """Seconds for one ``import_runs`` of ``path`` with the CRC ``backend``."""
    from vdl_stream import interop, tfrecord

    out = os.path.join(tmp, "out")
    shutil.rmtree(out, ignore_errors=True)
    tfrecord.CRC_BACKEND = backend
    t = time.perf_counter()
    interop.import_runs([path], out)
    return time.perf_counter() - t


def time_crc(path: str, backend: str) -> float:
    """Seconds for ``crc32c_many`` over every payload of ``path`` with ``backend``."""
    from vdl_stream import tfrecord

    data = np.fromfile(path, dtype=np.uint8)
    frames = tfrecord.scan_frames(data, 0, max_records=1 << 30, max_bytes=1 << 40)
    t = time.perf_counter()
    tfrecord.crc32c_many(data, frames.offsets, frames.lengths, backend=backend)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200,000 scalars, 40 images, 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.points, args.images, args.repeat = 200_000, 40, 3
    from vdl_stream import tfrecord

    if tfrecord._google_crc32c is None:
        raise SystemExit("google-crc32c (C) is not installed: nothing to compare")
    tmp = tempfile.mkdtemp(prefix="bench-crc-")
    try:
        files = {
            f"{args.points:,} scalars": write_scalars(os.path.join(tmp, "s"), args.points),
            f"{args.images} images of 256 KiB": write_images(os.path.join(tmp, "i"), args.images),
        }
        for label, path in files.items():
            mib = os.path.getsize(path) / (1 << 20)
            for what, fn in (
                ("import", lambda b, p=path: time_import(p, b, tmp)),
                ("crc", lambda b, p=path: time_crc(p, b)),
            ):
                times: dict[str, list[float]] = {"numpy": [], "google": []}
                for _ in range(args.repeat):
                    for backend in times:
                        times[backend].append(fn(backend))
                med = {b: statistics.median(t) for b, t in times.items()}
                print(
                    f"{label} ({mib:.1f} MiB) {what}: numpy {med['numpy'] * 1e3:.0f} ms, "
                    f"google {med['google'] * 1e3:.0f} ms, ratio {med['numpy'] / med['google']:.2f}x"
                    f" (median of {args.repeat})",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
