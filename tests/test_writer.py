"""The writer side: attach(), the hot path's checks, durability at flush(), and the CLI."""

from __future__ import annotations

import errno
import math
import socket
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import recorder
from tests.conftest import wait_for
from vdl_stream import attach
from vdl_stream.errors import PortInUseError
from vdl_stream.session import make_run_name


def test_in_process_flush_is_durable_and_complete(tmp_path):
    with attach(tmp_path, run="r1") as w:
        for step in range(5000):
            w.add_scalar("train/loss", 1.0 / (step + 1), step)
            w.add_scalar("train/acc", np.float32(step / 5000), np.int64(step))
        w.add_scalar("train/loss", math.nan, 5000)
        w.add_scalar("train/loss", math.inf, 5001)
        assert w.flush() is True
        # durable means readable from disk by anyone once flush() returned
        with recorder.RunReader(tmp_path / "r1") as reader:
            loss = reader.read_scalars("train/loss")
            assert loss.steps.tolist() == list(range(5002))
            assert loss.values[10] == pytest.approx(1 / 11)
            assert math.isnan(loss.values[5000]) and math.isinf(loss.values[5001])
            assert reader.read_scalars("train/acc").values[2500] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("args", "error", "text"),
    [
        ((3, 1.0, 0), TypeError, "tag must be a non-empty str, got int"),
        (("", 1.0, 0), ValueError, "tag must be a non-empty str"),
        (("a\x00", 1.0, 0), ValueError, "control characters"),
        (
            ("t", "1.5", 0),
            TypeError,
            "value must be a real number or a one-element tensor, got str",
        ),
        (("t", [1, 2], 0), TypeError, "value must be a real number .* got list"),
        (("t", None, 0), TypeError, "value .* got NoneType"),
        (("t", 1.0, 1.5), TypeError, "step must be an int, got float"),
        (("t", 1.0, "3"), TypeError, "step must be an int, got str"),
    ],
)
def test_bad_input_raises_at_the_call_site_and_loses_nothing(tmp_path, args, error, text):
    with attach(tmp_path, run="r") as w:
        w.add_scalar("ok", 1.0, 0)
        with pytest.raises(error, match=text):
            w.add_scalar(*args)
        w.add_scalar("ok", 2.0, 1)
    with recorder.RunReader(tmp_path / "r") as reader:
        assert reader.read_scalars("ok").values.tolist() == [1.0, 2.0]
        # (telemetry, on by default, has its own "@telemetry/" tags)
        assert {t for t in reader.tags() if not t.startswith("@telemetry/")} <= {"ok"}


def test_histogram_is_recorded(tmp_path):
    values = np.concatenate([np.random.default_rng(0).normal(size=1000), [np.nan, np.inf]])
    with attach(tmp_path, run="h") as w:
        w.add_histogram("w", values, 7, buckets=5)
    with recorder.RunReader(tmp_path / "h") as reader:
        (record,) = reader.read_records(kind="histogram")
    assert (record.tag, record.step) == ("w", 7)
    counts = np.frombuffer(record.data["counts"], "<f8")
    assert len(counts) == 5 and counts.sum() == 1000
    assert (record.data["nan"], record.data["inf"], record.data["num"]) == (1, 1, 1002)


def test_a_histogram_is_binned_later_from_a_copy_of_its_values(tmp_path):
    # The background thread bins it: an array the loop changes right after the call (a weight
    # updated in place) must not change what was logged.
    from vdl_stream import summaries

    values = np.random.default_rng(1).normal(size=10_000).astype(np.float32)
    expected = summaries.histogram_event("w", values.copy(), 3, 1.0e9, buckets=20)
    with attach(tmp_path, run="later", telemetry=False) as w:
        w.add_histogram("w", values, 3, walltime=1.0e9, buckets=20)
        values[:] = 1e6  # before the background thread got to it, most likely
    with recorder.RunReader(tmp_path / "later") as reader:
        (record,) = reader.read_records(kind="histogram")
    for key in ("edges", "counts", "num", "nan", "inf", "min", "max", "sum", "sum_sq"):
        assert record.data[key] == expected[key], key


def test_histogram_copies_reuse_binned_arrays_and_stay_private(tmp_path):
    # add_histogram copies into arrays that earlier calls' histograms no longer need: a reused
    # array must hold only the new call's values, whatever dtype and shape each call has.
    from vdl_stream import summaries

    rng = np.random.default_rng(2)
    calls = [
        rng.normal(size=(100, 30)).astype(np.float32),
        rng.normal(size=3000).astype(np.float32) * 1e3,  # same dtype and size, another shape
        rng.integers(-50, 50, size=3000).astype(np.int16),
        rng.normal(size=3000),
    ]
    expected = []
    with attach(tmp_path, run="spares", telemetry=False) as w:
        for step, values in enumerate(calls * 3):
            expected.append(summaries.histogram_event("w", values.copy(), step, 1.0e9, 7))
            w.add_histogram("w", values, step, walltime=1.0e9, buckets=7)
            values += 1  # the loop updates its array in place right after the call
            assert w.flush()
        # Four (dtype, size) kinds, each array given back after it was binned and taken again.
        assert 0 < w._spares.nbytes() <= 3000 * (4 + 2 + 8)
    with recorder.RunReader(tmp_path / "spares") as reader:
        records = reader.read_records(kind="histogram")
    assert len(records) == len(expected)
    for record, want in zip(records, expected, strict=True):
        for key in ("edges", "counts", "num", "nan", "inf", "min", "max", "sum", "sum_sq"):
            assert record.data[key] == want[key], (record.step, key)


def test_a_histogram_waiting_to_be_binned_is_not_tracked_by_the_garbage_collector(
    tmp_path, monkeypatch
):
    # A burst of histograms waits in the hot path's list while the background thread bins: an
    # event the cyclic GC tracks is traversed by every collection meanwhile and promoted to the
    # oldest generation. Its values and bins wait under two keys, not in a fresh tuple, so
    # the event holds only strs, numbers and an array, and the GC leaves it untracked.
    import gc

    from vdl_stream.writer import _BIN, Writer

    seen: list[bool] = []
    bin_events = Writer._bin

    def spy(self, events):
        seen.extend(gc.is_tracked(e) for e in events if _BIN in e)
        return bin_events(self, events)

    monkeypatch.setattr(Writer, "_bin", spy)
    values = np.random.default_rng(3).normal(size=1000).astype(np.float32)
    with attach(tmp_path, run="untracked", telemetry=False) as w:
        for step in range(20):
            w.add_histogram("w", values, step)
        assert w.flush()
    assert len(seen) == 20
    assert not any(seen)
    with recorder.RunReader(tmp_path / "untracked") as reader:
        assert len(reader.read_records(kind="histogram")) == 20


def test_spare_arrays_are_reused_by_dtype_and_size_within_their_bound():
    from vdl_stream.writer import _SpareArrays

    spares = _SpareArrays(limit=100)
    first = spares.copy(np.arange(8, dtype=np.float64))  # 64 bytes
    assert not spares.full()  # 64 bytes wait to be binned
    second = spares.copy(np.ones((2, 4)))
    assert spares.full()  # 128: the next call bins its values itself
    spares.give_back(first)
    spares.give_back(second)  # 128 bytes would pass the bound: dropped
    assert spares.nbytes() == 64 and not spares.full()
    spares.give_back(np.empty(0))  # nothing to keep
    other = spares.copy(np.arange(8, dtype=np.float32))  # another dtype: a new array
    assert not np.shares_memory(other, first) and spares.nbytes() == 64
    again = spares.copy(np.full((4, 2), 7.0))
    assert np.shares_memory(again, first) and again.shape == (8,) and (again == 7.0).all()
    assert spares.nbytes() == 0


def test_spare_arrays_are_cut_from_one_huge_page_arena_and_kept_within_it():
    import mmap

    from vdl_stream.writer import _SpareArrays

    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform: the spare arrays come from np.empty")
    spares = _SpareArrays(limit=1000)
    taken = [spares.copy(np.full(25, i, np.float64)) for i in range(5)]  # 200 bytes each
    arena = spares._arena
    assert arena is not None and arena.size == 1000
    assert arena.ctypes.data % (2 << 20) == 0  # aligned to a huge page
    for i, flat in enumerate(taken[:4]):  # each on a cache line of its own, inside the arena
        assert np.shares_memory(flat, arena) and (flat == i).all()
        assert flat.ctypes.data % 64 == 0
    assert not np.shares_memory(taken[4], arena)  # 4 x 256 + 200 bytes pass the arena's end
    for flat in taken:
        spares.give_back(flat)
    # The arena's arrays are kept; one from np.empty is not: the arena is the bound.
    assert spares.nbytes() == 4 * 200
    again = [spares.copy(np.full((5, 5), 9.0)) for _ in range(4)]
    assert all(np.shares_memory(flat, arena) for flat in again) and spares.nbytes() == 0
    assert all(flat.shape == (25,) and (flat == 9.0).all() for flat in again)


def test_spare_arrays_without_huge_pages_come_from_np_empty_within_their_bound(monkeypatch):
    import mmap

    from vdl_stream.writer import _SpareArrays

    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)
    spares = _SpareArrays(limit=100)
    first = spares.copy(np.arange(8, dtype=np.float64))
    assert spares._arena is not None and spares._arena.size == 0 and first.base is None
    second = spares.copy(np.arange(8, dtype=np.float64))
    spares.give_back(first)
    spares.give_back(second)  # 128 bytes would pass the bound: dropped
    assert spares.nbytes() == 64
    assert np.shares_memory(spares.copy(np.zeros(8)), first)


@pytest.mark.parametrize(
    "values",
    [
        np.array(3.5),  # 0-d
        np.arange(12.0).reshape(3, 4).T,  # a transposed view
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        np.arange(10, dtype=np.int64)[::-1],  # negative strides
        np.arange(8, dtype=">i4"),  # a byte order memoryview refuses
        np.array([True, False, True]),
        np.linspace(-1, 1, 7, dtype=np.float16),
        np.zeros((0, 3), np.float32),
        np.arange(300_000, dtype=np.float32).reshape(600, 500),  # past HELD_COPY_BYTES
    ],
    ids=[
        "0d",
        "transposed",
        "fortran",
        "reversed",
        "big-endian",
        "bool",
        "float16",
        "empty",
        "large",
    ],
)
def test_spare_array_copies_hold_the_values_in_c_order_whatever_the_layout(values):
    from vdl_stream.writer import _SpareArrays

    spares = _SpareArrays(limit=1 << 20)
    for _ in range(2):  # a new array, then the same array reused
        flat = spares.copy(values)
        assert flat.dtype == values.dtype and flat.shape == (values.size,)
        assert flat.tolist() == values.reshape(-1).tolist()
        spares.give_back(flat)


def test_a_histogram_is_binned_in_the_call_when_the_copies_waiting_reach_their_bound(
    tmp_path, monkeypatch
):
    # Bound 0: every call finds the copies "full" and bins its values itself, in its thread.
    import threading

    from vdl_stream import summaries, writer

    monkeypatch.setattr(writer, "SPARE_BYTES", 0)
    binned_in = []
    bin_histogram = summaries.bin_histogram

    def spy(values, buckets):
        binned_in.append(threading.current_thread())
        return bin_histogram(values, buckets)

    monkeypatch.setattr(summaries, "bin_histogram", spy)
    values = np.random.default_rng(5).normal(size=(50, 40))
    expected = summaries.histogram_event("w", values.copy(), 1, 1.0e9, 9)
    with attach(tmp_path, run="inline", telemetry=False) as w:
        w.add_histogram("w", values, 1, walltime=1.0e9, buckets=9)
        values[:] = 0.0
    assert binned_in[-2:] == [threading.current_thread()] * 2  # expected's, then the call's
    with recorder.RunReader(tmp_path / "inline") as reader:
        (record,) = reader.read_records(kind="histogram")
    for key in ("edges", "counts", "num", "nan", "inf", "min", "max", "sum", "sum_sq"):
        assert record.data[key] == expected[key], key


def test_run_names_are_unique_and_sortable():
    names = [make_run_name() for _ in range(200)]
    assert len(set(names)) == 200
    assert names[0][:15] <= names[-1][:15]


def test_serving_on_a_taken_port_is_a_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            PortInUseError,
            match=f"port {port} on 127.0.0.1 is already in use; choose another with --port",
        ):
            attach(tmp_path, serve=True, port=port)
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "vdl_stream.cli",
                "serve",
                "--logdir",
                str(tmp_path),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert cli.returncode == 2
    assert cli.stderr.strip().count("\n") == 0
    assert f"port {port}" in cli.stderr and "--port" in cli.stderr


def test_remote_writer_flush_is_acknowledged(serve_process):
    with attach(url=serve_process.ws_url, run="remote") as w:
        for step in range(2000):
            w.add_scalar("loss", step * 0.25, step)
        assert w.flush(timeout=20) is True
        with recorder.RunReader(serve_process.logdir / "remote") as reader:
            assert reader.read_scalars("loss").values.tolist() == [s * 0.25 for s in range(2000)]


def test_demo_trains_and_logs(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vdl_stream.cli",
            "demo",
            "--no-serve",
            "--steps",
            "300",
            "--delay",
            "0",
            "--logdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (run,) = recorder.list_runs(tmp_path)
    with recorder.RunReader(tmp_path / run) as reader:
        tags = reader.tags()
        loss = reader.read_scalars("train/loss").values
        assert {"train/loss", "train/accuracy", "train/lr", "eval/accuracy", "weights/w1"} <= set(
            tags
        )
        assert len(loss) == 300
        assert loss[-50:].mean() < loss[:50].mean()  # it really learns
        assert reader.read_scalars("eval/accuracy").values[-1] > 0.6


def test_demo_interrupted_while_training_closes_its_run_without_a_traceback(tmp_path):
    """Ctrl-C during the demo's training (what a newcomer does to stop it): exit 130, a line
    saying where the run is, no traceback, and the run closed with what was logged."""
    import signal

    from recorder.digest import load_digest

    demo = subprocess.Popen(
        [
            *(sys.executable, "-m", "vdl_stream.cli", "demo", "--no-serve"),
            *("--steps", "1000000", "--delay", "0.001", "--logdir", str(tmp_path)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: any(p.stat().st_size > 4096 for p in tmp_path.glob("*/segment-*.vdlr")),
            timeout=60,
            what="the demo's first flushes on disk",
        )
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 130, err
    assert "Traceback" not in err and "interrupted after" in err, err
    (run,) = recorder.list_runs(tmp_path)
    assert load_digest(tmp_path / run) is not None  # written by close()
    with recorder.RunReader(tmp_path / run) as reader:
        assert len(reader.read_scalars("train/loss").values) > 0


# -- input that used to be accepted and then killed the background thread -------------------------

BAD_CALLS = [
    (
        "add_scalar",
        ("x", 1.0, 2**63),
        ValueError,
        "step must be in the int64 range .* got 9223372036854775808",
    ),
    ("add_scalar", ("x", 1.0, -(2**63) - 1), ValueError, "step must be in the int64 range"),
    ("add_scalar", ("x", 1.0, 0, "yesterday"), TypeError, "walltime must be a real number .* str"),
    ("add_scalar", ("x", 1.0, 0, float("nan")), ValueError, "walltime must be a finite number"),
    ("add_scalar", ("x", 1.0, 0, float("inf")), ValueError, "walltime must be a finite number"),
    ("add_scalar", ("x", 1.0, 1.0), TypeError, "step must be an int, got float 1.0"),
    ("add_scalar", ("x", 1.0, np.float64(2.0)), TypeError, "step must be an int, got float64"),
    ("add_scalar", ("x", 10**400, 0), ValueError, "value must fit in a float64"),
    ("add_scalar", ("a\ud800b", 1.0, 0), ValueError, r"tag must be encodable as UTF-8 .*\\ud800"),
    ("add_text", ("t", "a\ud800b", 0), ValueError, r"text_string must be encodable .*\\ud800"),
    ("add_text", ("t", "ok", 2**64), ValueError, "step must be in the int64 range"),
    ("add_hparams", ({"a\ud800b": 1}, ["m"]), ValueError, "hparams_dict key must be encodable"),
    ("add_hparams", ({"lr": "a\ud800b"}, ["m"]), ValueError, r"hparams_dict\['lr'\] must be enc"),
    ("add_hparams", ({"lr": 1}, ["a\ud800"]), ValueError, r"metrics_list\[0\] must be encodable"),
    ("add_histogram", ("h", [1.0], 2**64), ValueError, "step must be in the int64 range"),
    ("add_histogram", ("h", [10**400], 0), TypeError, "values must be an array of numbers"),
    ("add_histogram", ("h", ["1.5"], 0), TypeError, "values must be an array of numbers"),
    ("add_histogram", ("h", [1.0], 0, "now"), TypeError, "walltime must be a real number"),
    ("add_image", ("i", np.zeros((2, 2), np.uint8), 0, float("nan"), "HW"), ValueError, "finite"),
    ("add_audio", ("a", np.zeros(4), 2**63), ValueError, "step must be in the int64 range"),
    ("add_pr_curve", ("p", [0, 1], [0.1, 0.9], 2**63), ValueError, "int64 range"),
    ("add_roc_curve", ("p", [0, 1], [0.1, 0.9], 0, 10, None, "x"), TypeError, "walltime"),
    ("add_scalars", ("m", {"a": 1.0}, 2**63), ValueError, "step must be in the int64 range"),
    ("add_scalars", ("m", {"a\ud800": 1.0}, 0), ValueError, "tag_scalar_dict key must be enc"),
]


@pytest.fixture(scope="module")
def shared_writer(tmp_path_factory):
    """One writer for the tests of bad calls: each must leave it working."""
    logdir = tmp_path_factory.mktemp("bad")
    with attach(logdir, run="r", telemetry=False) as w:
        yield w, logdir


@pytest.mark.parametrize(("method", "args", "error", "text"), BAD_CALLS, ids=lambda x: str(x)[:40])
def test_input_that_killed_the_thread_is_refused_at_the_call(
    shared_writer, method, args, error, text
):
    w, logdir = shared_writer
    canary = f"canary/{method}"
    w.add_scalar(canary, 1.0, 0)
    with pytest.raises(error, match=text):
        getattr(w, method)(*args)
    w.add_scalar(canary, 2.0, 1)
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "data stays queued": the flush is confirmed
        assert w.flush(timeout=10) is True
    assert time.monotonic() - started < 5
    assert w._thread.is_alive()
    with recorder.RunReader(logdir / "r") as reader:
        assert reader.read_scalars(canary).values.tolist()[-2:] == [1.0, 2.0]


def test_integer_steps_of_numpy_and_tensors_are_kept_and_floats_refused(tmp_path):
    class Tensor:  # what torch.tensor(7) offers: .item() giving an int
        def item(self):
            return 7

    with attach(tmp_path, run="steps", telemetry=False) as w:
        w.add_scalar("x", 1.0, np.int64(5))
        w.add_scalar("x", 1.0, np.uint32(6))
        w.add_scalar("x", 1.0, Tensor())
        w.add_scalar("x", 1.0, 2**63 - 1)
        w.add_scalar("x", 1.0, -(2**63))
        for bad in (1.0, np.float32(8), True, "9"):
            with pytest.raises(TypeError, match="step must be an int"):
                w.add_scalar("x", 1.0, bad)
    with recorder.RunReader(tmp_path / "steps") as reader:
        assert sorted(reader.read_scalars("x").steps.tolist()) == [-(2**63), 5, 6, 7, 2**63 - 1]


# -- failures behind the call: kept, reported, retried ----------------------------------------


@pytest.fixture
def failing_send(monkeypatch):
    """Make the in-process transport fail (as a full disk would) while ``state["error"]`` is set."""
    from vdl_stream.transport import InProcessTransport

    state = {"error": None, "calls": 0}
    original = InProcessTransport.send

    async def send(self, batch):
        state["calls"] += 1
        if state["error"] is not None:
            raise state["error"]
        await original(self, batch)

    monkeypatch.setattr(InProcessTransport, "send", send)
    return state


def test_a_failing_broker_keeps_the_data_reports_the_reason_and_recovers(tmp_path, failing_send):
    w = attach(tmp_path, run="faulty", telemetry=False)
    w.add_scalar("x", 0.0, 0)
    assert w.flush(timeout=10)
    failing_send["error"] = OSError(errno.ENOSPC, "No space left on device")
    # The first failure may come while the loop still runs (a point leaves as soon as the link
    # is free): the warning comes on one of these calls, whichever follows it.
    with pytest.warns(RuntimeWarning, match="retrying .*OSError: .*No space left on device"):
        for step in range(1, 1001):
            w.add_scalar("x", float(step), step)
        wait_for(lambda: failing_send["calls"] >= 3)  # retried with backoff
        w.add_scalar("x", 1001.0, 1001)
    with pytest.warns(RuntimeWarning, match="not confirmed within the timeout: .*No space left"):
        assert w.flush(timeout=0.3) is False
        for _ in range(20):  # flushes that gave up leave nothing behind to wait on
            assert w.flush(timeout=0.01) is False
    wait_for(lambda: not w._to_confirm)  # each gave-up flush is forgotten in the loop
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w.add_scalar("x", 1002.0, 1002)  # the same reason is not repeated
    failing_send["error"] = None  # space freed
    assert w.flush(timeout=10) is True
    assert w._thread.is_alive()
    w.close()
    with recorder.RunReader(tmp_path / "faulty") as reader:
        series = reader.read_scalars("x")
    assert series.steps.tolist() == list(range(1003))  # nothing lost, nothing duplicated
    assert series.values.tolist() == [float(s) for s in range(1003)]


def test_flush_keeps_its_timeout_while_the_background_loop_is_busy(tmp_path):
    """A flush hands its request to the background loop without waiting for the loop to run it:
    a loop held up (here by a callback that blocks it for 3 s) must not hold the training
    thread past the flush's timeout."""
    w = attach(tmp_path, run="busy", telemetry=False)
    w.add_scalar("x", 0.0, 0)
    assert w.flush(timeout=10)
    release = threading.Event()
    w._token.run_sync_soon(lambda: release.wait(3))  # the loop's thread is stuck here
    w.add_scalar("x", 1.0, 1)
    started = time.monotonic()
    with pytest.warns(RuntimeWarning, match="not confirmed within the timeout"):
        assert w.flush(timeout=0.2) is False
    took = time.monotonic() - started
    release.set()
    assert took < 2.0, f"flush(timeout=0.2) held the caller {took:.2f} s"
    assert w.flush(timeout=10) is True  # the loop runs again: the point is confirmed
    w.close()


def test_pending_data_spills_to_disk_beyond_its_memory_bound(tmp_path, failing_send, monkeypatch):
    from vdl_stream import writer as writer_module

    monkeypatch.setattr(writer_module, "PENDING_MEMORY_BYTES", 64 << 10)
    w = attach(tmp_path, run="spill", telemetry=False, flush_interval=0.005)
    failing_send["error"] = OSError(errno.EIO, "Input/output error")
    step = 0
    with pytest.warns(RuntimeWarning, match="retrying .*Input/output error"):
        for _ in range(40):
            for _ in range(500):
                w.add_scalar("x", float(step), step)
                step += 1
            w.add_text("t", "y" * 2000, step)
            time.sleep(0.006)
    wait_for(lambda: not w._queued_points())  # the pump keeps draining the hot path
    stats = w.statistics()
    assert stats.spilled_batches > 0 and stats.pending_batches > stats.spilled_batches
    assert stats.send_failures >= 1 and "Input/output error" in stats.problem
    assert w._pending._memory_bytes <= 64 << 10  # the rest is in the spool file
    assert stats.dropped_batches == 0
    failing_send["error"] = None
    assert w.flush(timeout=20) is True
    stats = w.statistics()
    assert (stats.pending_batches, stats.pending_bytes, stats.problem) == (0, 0, None)
    w.close()
    with recorder.RunReader(tmp_path / "spill") as reader:
        assert reader.read_scalars("x").steps.tolist() == list(range(step))
        assert len(reader.read_records(kind="text")) == 40


def test_when_the_spool_file_fails_too_batches_wait_in_memory_in_order(
    tmp_path, failing_send, monkeypatch
):
    from vdl_stream import writer as writer_module
    from vdl_stream.transport import Spool

    monkeypatch.setattr(writer_module, "PENDING_MEMORY_BYTES", 32 << 10)
    spool_full = {"on": False}
    original_put = Spool.put

    def put(self, seq, frame):
        if spool_full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        original_put(self, seq, frame)

    monkeypatch.setattr(Spool, "put", put)
    w = attach(tmp_path, run="tail", telemetry=False, flush_interval=0.005)
    failing_send["error"] = OSError(errno.EIO, "Input/output error")
    step = 0

    def log(batches):
        nonlocal step
        for _ in range(batches):
            for _ in range(300):
                w.add_scalar("x", float(step), step)
                step += 1
            time.sleep(0.007)

    with pytest.warns(RuntimeWarning) as caught:
        log(20)  # memory, then the spool file
        wait_for(lambda: w.statistics().spilled_batches > 0)
        spool_full["on"] = True
        log(3)  # the spool's disk is full too: behind it, in memory
        wait_for(lambda: not w._queued_points())
        spool_full["on"] = False
        log(2)  # still behind the spool: nothing overtakes
        wait_for(lambda: not w._queued_points())
    assert any("cannot spill pending batches" in str(x.message) for x in caught)
    assert w._pending._tail and len(w._pending._spool)
    assert w.statistics().dropped_batches == 0
    failing_send["error"] = None
    assert w.flush(timeout=20) is True
    w.close()
    with recorder.RunReader(tmp_path / "tail") as reader:
        series = reader.read_scalars("x")
    assert series.steps.tolist() == list(range(step))  # in order, none lost or duplicated


def test_with_no_broker_and_no_spool_memory_stays_bounded(tmp_path, failing_send, monkeypatch):
    from vdl_stream import writer as writer_module
    from vdl_stream.transport import Spool

    def put(self, seq, frame):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer_module, "PENDING_MEMORY_BYTES", 16 << 10)
    monkeypatch.setattr(Spool, "put", put)
    w = attach(tmp_path, run="bounded", telemetry=False, flush_interval=0.005)
    failing_send["error"] = OSError(errno.EIO, "Input/output error")
    with pytest.warns(RuntimeWarning, match="dropped the oldest pending batches"):
        for step in range(30_000):
            w.add_scalar("x", float(step), step)
            if step % 300 == 0:
                time.sleep(0.006)
        wait_for(lambda: not w._queued_points())
        w.add_scalar("x", 0.0, 30_000)
    stats = w.statistics()
    assert stats.dropped_batches > 0 and stats.pending_bytes <= 4 * (16 << 10) + 8_000
    assert w._thread.is_alive()
    failing_send["error"] = None
    assert w.flush(timeout=20) is True
    w.close()


def test_a_stopped_background_thread_makes_flush_fail_at_once(tmp_path):
    w = attach(tmp_path, run="stopped", telemetry=False)
    w._call_soon(lambda: setattr(w, "_closing", True))  # the loop ends, the writer is not closed
    wait_for(lambda: not w._thread.is_alive())
    started = time.monotonic()
    with pytest.warns(RuntimeWarning, match="background thread stopped"):
        assert w.flush(timeout=30) is False
    assert time.monotonic() - started < 1
    w.close()


def test_points_that_cannot_be_stored_are_dropped_and_reported_never_the_rest(tmp_path):
    w = attach(tmp_path, run="defence", telemetry=False)
    # What no add_* call lets through (the checks are bypassed here on purpose).
    w._new_series("x")((2**70, 1.0, 0.0))
    w.add_scalar("x", 2.0, 2)
    with pytest.warns(RuntimeWarning, match=r"dropped 1 scalar point\(s\) that cannot be stored"):
        assert w.flush(timeout=10) is True
        w.add_scalar("x", 3.0, 3)
    w.close()
    with recorder.RunReader(tmp_path / "defence") as reader:
        assert reader.read_scalars("x").values.tolist() == [2.0, 3.0]


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"telemetry_interval": 0.01}, ValueError, "telemetry_interval must be from 0.1 to 3600 s"),
        ({"telemetry_interval": "1"}, TypeError, "telemetry_interval must be a number"),
        ({"flush_interval": 0}, ValueError, "flush_interval must be from 0.001 to 60 s, got 0"),
        ({"flush_interval": True}, TypeError, "flush_interval must be a number of seconds"),
        ({"url": b"ws://x"}, TypeError, "url must be a str"),
        ({"run": "a\u202eb"}, ValueError, r"U\+202E"),
        ({"run": "exp/index.vdli"}, ValueError, "clashes with the record format"),
        ({"logdir": 3}, TypeError, "logdir must be a str or path, got int 3"),
    ],
)
def test_attach_arguments_are_checked(tmp_path, kwargs, error, text):
    kwargs = {"logdir": tmp_path, "run": "r", "telemetry": False, **kwargs}
    with pytest.raises(error, match=text):
        attach(**kwargs)


def test_in_process_points_leave_when_the_broker_is_free_not_at_the_interval(tmp_path):
    # A 30 s interval: only the adaptive flush gets each point written within the deadline.
    with attach(tmp_path, run="quick", telemetry=False, flush_interval=30.0) as w:
        for step in range(3):
            w.add_scalar("loss", float(step), step)
            deadline = time.monotonic() + 5
            steps: list[int] = []
            while time.monotonic() < deadline:
                try:
                    with recorder.RunReader(tmp_path / "quick") as reader:
                        steps = reader.read_scalars("loss").steps.tolist()
                except (recorder.NotARunError, KeyError):
                    steps = []
                if len(steps) == step + 1:
                    break
                time.sleep(0.005)  # polling files another thread writes: no event to wait on
            assert steps == list(range(step + 1)), f"point {step} waited for the timer"


def test_the_training_side_imports_no_broker_and_no_web_stack():
    code = (
        "import sys, vdl_stream, vdl_stream.writer, vdl_stream.session\n"
        "loaded = [m for m in ('vdl_stream.broker', 'vdl_stream.server', 'quart', 'hypercorn',"
        " 'quart_trio') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- the hot path's column buffers and copies (issue 16) -------------------------------------


def test_scalar_columns_are_read_only_and_the_recorder_keeps_them_without_a_copy(tmp_path):
    from recorder.writer import RunWriter
    from vdl_stream import codec

    cols = codec.scalar_columns("t", [1, 0.5, 10.0, 2, 0.25, 10.5, 3, math.nan, 11.0])
    assert cols.steps.tolist() == [1, 2, 3] and cols.walls.tolist() == [10.0, 10.5, 11.0]
    assert not any(c.flags.writeable for c in (cols.steps, cols.walls, cols.values))
    with pytest.raises(ValueError, match="read-only"):
        cols.values[0] = 1.0
    writable = np.array([7.0, 8.0, 9.0])
    with RunWriter(tmp_path / "run") as w:
        w.append_scalars("t", cols.steps, cols.walls, cols.values)
        w.append_scalars("u", cols.steps, cols.walls, writable)
        assert w._open_slots["t"].values[0] is cols.values  # kept as it is
        assert w._open_slots["u"].values[0] is not writable  # copied: the caller may reuse it
        writable[:] = 0.0
    with recorder.RunReader(tmp_path / "run") as reader:
        assert reader.read_scalars("u").values.tolist() == [7.0, 8.0, 9.0]
        assert np.array_equal(reader.read_scalars("t").values, cols.values, equal_nan=True)


def test_a_batch_of_several_tags_takes_one_conversion_a_column_kept_without_a_copy(
    tmp_path, monkeypatch
):
    """The pump turns all the tags of a batch into columns with three numpy conversions in all,
    not three a tag (about 9 us a tag on every point's way); each tag's columns are read-only
    views that the recorder keeps without a copy."""
    from recorder.writer import _frozen

    calls = []
    fromiter = np.fromiter

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return fromiter(*args, **kwargs)

    # The pump's timer never fires in this test: the columns are taken here, once.
    with attach(tmp_path, run="tags", telemetry=False, flush_interval=60.0) as w:
        for tag, points in (("a", [(1, 0.5, 10.0), (2, 0.25, 10.5)]), ("b", [(7, math.nan, 11.0)])):
            extend = w._new_series(tag)  # the hot path's buffer, without a call's wake-up
            for point in points:
                extend(point)
        monkeypatch.setattr(np, "fromiter", counted)
        columns = w._take_columns()
        monkeypatch.undo()
    assert len(calls) == 3
    a, b = columns
    assert (a.tag, a.steps.tolist(), a.walls.tolist(), a.values.tolist()) == (
        "a",
        [1, 2],
        [10.0, 10.5],
        [0.5, 0.25],
    )
    assert (b.tag, b.steps.tolist(), b.walls.tolist()) == ("b", [7], [11.0])
    assert math.isnan(b.values[0])
    for column in (a.steps, a.walls, a.values, b.steps, b.walls, b.values):
        assert not column.flags.writeable and _frozen(column)


def test_frames_written_by_short_pwritev_calls_read_back_whole(tmp_path, monkeypatch):
    import os

    from recorder import writer as recorder_writer

    real = os.pwritev
    calls = []

    def short(fd, buffers, offset):  # at most 5 bytes a call, as a signal or a full pipe may cut
        calls.append(len(buffers))
        head = bytes(memoryview(b"".join(bytes(b) for b in buffers))[:5])
        return real(fd, [head], offset)

    monkeypatch.setattr(recorder_writer.os, "pwritev", short)
    with recorder.RunWriter(tmp_path / "run") as w:
        w.append_scalars("t", np.arange(100), np.full(100, 1.79e9), np.linspace(0, 1, 100))
        w.append_record("text", "note", 3, 1.79e9, {"text": "hello"})
    assert len(calls) > 100  # the frames went out 5 bytes at a time
    with recorder.RunReader(tmp_path / "run") as reader:
        assert reader.read_scalars("t").values.tolist() == np.linspace(0, 1, 100).tolist()
        assert reader.read_records(kind="text")[0].data["text"] == "hello"


def test_tags_are_checked_once_and_every_tag_keeps_its_arrival_order(tmp_path):
    with attach(tmp_path, run="order", telemetry=False) as w:
        for step in range(3000):
            w.add_scalar(f"t{step % 7}", float(step), step // 7)
        with pytest.raises(TypeError, match="tag must be a non-empty str, got int 5"):
            w.add_scalar(5, 1.0, 0)
        with pytest.raises(ValueError, match="tag must not contain control characters"):
            w.add_scalar("bad\ntag", 1.0, 0)
        assert w.flush(timeout=20) is True
        assert w.statistics().queued_calls == 0
    with recorder.RunReader(tmp_path / "order") as reader:
        values: dict[int, list[float]] = {k: [] for k in range(7)}
        for step in range(3000):
            values[step % 7].append(float(step))
        for k in range(7):
            assert reader.read_scalars(f"t{k}").values.tolist() == values[k]


def test_event_size_estimate_counts_payloads_and_waiting_copies():
    # The bound on held and pending events rests on this estimate: str and bytes by length (str
    # subclasses too), maps and lists by entries, a histogram's copy waiting to be binned by
    # its bytes; numbers, bools and None cost nothing beyond the event's own 96.
    from vdl_stream.writer import _BIN, _BUCKETS, _event_bytes

    class Name(str):
        pass

    base = {"kind": "text", "tag": None, "step": 3, "wall": 1.5, "flag": True}
    assert _event_bytes(base) == 96 + len("text")
    assert _event_bytes({**base, "text": "x" * 1000}) == 96 + 4 + 1000
    assert _event_bytes({**base, "blob": b"\0" * 500, "name": Name("abc")}) == 96 + 4 + 503
    assert _event_bytes({**base, "meta": {"a": 1, "b": 2}, "rows": [1, 2, 3]}) == 96 + 4 + 320
    waiting = {**base, _BIN: np.zeros(10_000, np.float32), _BUCKETS: 10}
    assert _event_bytes(waiting) == 96 + 4 + 40_000


@pytest.mark.parametrize(
    ("values", "buckets"),
    [
        (np.arange(10_000, dtype=np.float32), 10),
        (np.array([], np.float64), 3),  # empty: min and max None
        (np.array([np.nan, np.inf, 1.0]), 1),
        (np.full(7, 2.5), 64),  # one value
        (np.arange(100, dtype=np.int16), 100),  # past the edges computed in Python floats
    ],
)
def test_a_binned_histogram_is_sized_as_the_general_estimate_sizes_it(values, buckets):
    # The background thread sizes binned histograms from four of their values (_binned_bytes)
    # instead of walking all thirteen: the two must agree, whatever the bins hold.
    from vdl_stream.summaries import histogram_event
    from vdl_stream.writer import _binned_bytes, _event_bytes

    for tag in ("w", "layer.1/weights/" + "x" * 200):
        event = histogram_event(tag, values, 3, 1.5, buckets)
        assert _binned_bytes(event) == _event_bytes(event)


def test_each_batch_is_sized_once_and_as_the_estimate_sizes_it(tmp_path, monkeypatch):
    # The pump sizes a batch's events as it bins them and hands that size to the pending queue,
    # which otherwise walks every event again: the size handed over must be the estimate's.
    from vdl_stream import writer as writer_module

    put = writer_module._Pending.put
    seen: list[tuple[int | None, int]] = []

    def checked_put(self, batch, events_bytes=None):
        seen.append((events_bytes, sum(map(writer_module._event_bytes, batch.events))))
        return put(self, batch, events_bytes)

    monkeypatch.setattr(writer_module._Pending, "put", checked_put)
    values = np.random.default_rng(1).normal(size=1000).astype(np.float32)
    with attach(tmp_path, run="r", telemetry=False) as w:
        for step in range(200):
            w.add_histogram("weights", values, step)
            w.add_text("note", f"step {step}", step)
            w.add_scalar("loss", 1.0, step)
        assert w.flush()
    carried = [(given, walked) for given, walked in seen if given is not None]
    assert carried, "no batch carried its size"
    assert all(given == walked for given, walked in carried), carried
    with recorder.RunReader(tmp_path / "r") as reader:
        assert len(reader.read_records(kind="histogram")) == 200


def test_the_persist_path_sizes_each_batch_once(tmp_path, monkeypatch):
    # The broker sizes every batch it persists once (the part it joins and the segment its
    # part must fit are decided from that one figure); it used to size each twice, a fifth
    # of the persist thread's samples for histograms.
    from tests.test_broker import scalars
    from vdl_stream import broker as broker_module
    from vdl_stream.codec import Batch

    sized: list[int] = []
    batch_bytes = broker_module._batch_bytes

    def counted(batch):
        sized.append(batch.seq)
        return batch_bytes(batch)

    monkeypatch.setattr(broker_module, "_batch_bytes", counted)
    values = np.random.default_rng(2).normal(size=100)
    with attach(tmp_path, run="r", telemetry=False) as w:
        for step in range(300):
            w.add_histogram("weights", values, step)
            if step % 7 == 0:
                assert w.flush()
    assert sized and len(sized) == len(set(sized)), sized
    with recorder.RunReader(tmp_path / "r") as reader:
        assert [r.step for r in reader.read_records(kind="histogram")] == list(range(300))

    class Text(str):
        pass

    # The estimate itself: 24 bytes a point, 64 an event, str and bytes (subclasses too) by
    # length, numbers, bools, None, maps and lists nothing.
    event = {"kind": "text", "tag": "t", "step": 1, "wall": 2.0, "text": Text("abc")}
    event |= {"blob": b"\0" * 10, "flag": True, "none": None, "map": {"a": "xx"}, "list": [1]}
    batch = Batch("w", 1, "r", [scalars("x", range(5))], [event, {**event, "text": "z" * 100}])
    assert batch_bytes(batch) == 24 * 5 + 2 * 64 + 2 * (4 + 1 + 10) + 3 + 100
