"""Write tests/data/visualdl/vdlrecords.1700000000.log with VisualDL's own LogWriter.

The checked-in file was made once with this script; the tests only read it. To make it again
(needs VisualDL, which is not a test dependency; Python 3.11):

    python -m venv /tmp/vdlvenv && /tmp/vdlvenv/bin/pip install visualdl
    /tmp/vdlvenv/bin/python tests/data/make_visualdl_fixture.py

Every logged value is a function of the step, so tests/test_interop.py recomputes what to expect.
"""

from __future__ import annotations

import os

import numpy as np
from visualdl import LogWriter

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "visualdl")
NAME = "vdlrecords.1700000000.log"
WALL_MS = 1_700_000_000_000


def main() -> None:
    path = os.path.join(OUT, NAME)
    if os.path.exists(path):
        os.remove(path)
    with LogWriter(logdir=OUT, file_name=NAME, display_name="fixture") as w:
        for step in range(50):
            wall = WALL_MS + step * 250
            w.add_scalar("train/loss", 1.0 / (step + 1), step, walltime=wall)
            w.add_scalars("lr", {"a": step * 0.5, "b": -step * 0.25}, step, walltime=wall)
        values = np.sin(np.arange(1000) * 0.01)
        w.add_histogram("weights", values, 10, buckets=10, walltime=WALL_MS + 2500)
        w.add_text("notes", "hello from VisualDL", 20, walltime=WALL_MS + 5000)
        image = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3) * 5
        w.add_image("sample", image, 30, walltime=WALL_MS + 7500)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
