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
