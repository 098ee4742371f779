"""Following a run: poll() returns what was appended since, position() bounds other readers."""

import numpy as np

from recorder import RunReader, RunWriter


def test_poll_returns_only_new_records_and_position_bounds_a_reader(tmp_path):
    with RunWriter(tmp_path / "r", sync="never") as w:
        w.append_scalars("a", np.arange(3), np.zeros(3), np.ones(3))
        w.flush()
        follower = RunReader(tmp_path / "r")
        assert follower.poll() == []
        seen_to = follower.position()
        w.append_scalars("a", np.arange(3, 5), np.zeros(2), np.ones(2))
        w.append_record("text", "t", 1, 2.0, {"text": "x"})
        w.flush()
        new = follower.poll()
        assert [(r.kind, r.tag) for r in new] == [("scalars", "a"), ("text", "t")]
        assert new[0].data.steps.tolist() == [3, 4]
        assert follower.poll() == []
        with RunReader(tmp_path / "r", limit=seen_to) as bounded:
            assert bounded.read_scalars("a").steps.tolist() == [0, 1, 2]
            assert bounded.read_records(kind="text") == []
        assert follower.position() > seen_to
        follower.close()


def test_last_record_is_the_newest_of_its_kind(tmp_path):
    with RunWriter(tmp_path / "r", sync="never") as w:
        for i in range(5):
            w.append_record("ingest", None, None, float(i), {"w": i})
            w.append_scalars("a", np.array([i]), np.zeros(1), np.ones(1))
    with RunReader(tmp_path / "r") as reader:
        assert reader.last_record("ingest").data == {"w": 4}
        assert reader.last_record("text") is None


CHILD = r"""
import sys
from recorder import RunWriter
w = RunWriter(sys.argv[1], sync="never", compact_records=4, segment_bytes=2000)
for i in range(int(sys.argv[2])):
    w.append_scalars("x", [i], [1.0], [float(i)])
    if i % 5 == 0:
        w.append_record("text", "t", i, 1.0, {"i": i})
    w.flush()
w.close()
"""


def test_a_follower_in_another_process_sees_every_record_once_while_the_writer_compacts(tmp_path):
    import os
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = str(tmp_path / "r")
    n = 3000
    env = dict(os.environ, PYTHONPATH=root)
    child = subprocess.Popen([sys.executable, "-c", CHILD, run, str(n)], env=env)
    deadline = time.monotonic() + 120
    while not os.path.isdir(run) or not any(f.startswith("segment-") for f in os.listdir(run)):
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.001)
    follower = RunReader(run)
    got = list(follower.iter_records())
    polls = 0
    while child.poll() is None:
        assert time.monotonic() < deadline
        got.extend(follower.poll())  # as fast as it can: it lands anywhere in a compaction
        polls += 1
    assert child.returncode == 0
    got.extend(follower.poll())
    steps = [s for r in got if r.kind == "scalars" for s in r.data.steps.tolist()]
    assert steps == list(range(n))
    assert [r.step for r in got if r.kind == "text"] == list(range(0, n, 5))
    assert polls > 10
    assert any(f.startswith("block-") for f in os.listdir(run))
    follower.close()
