"""Run summaries: ``GET /api/runs``, the ``summaries`` and ``synced`` frames of ``/ws/live``.

Real processes and sockets: a ``vdl-stream serve`` subprocess on 127.0.0.1, training processes
that publish to it over ``/ws/ingest`` (closed cleanly, or SIGKILLed) or write their own run that
the server follows, and real WebSockets. The summary logic itself is checked against a full read
of the run by a property test over any sequence of batches.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

import recorder
from recorder.digest import DIGEST_NAME, load_digest
from tests.conftest import http_get, start_serve, stop_serve
from vdl_stream import codec
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.run_summary import RunSummary
from vdl_stream.server import run_server
from vdl_stream.telemetry import legacy_view, scalar_tag

TELEMETRY_TAG = scalar_tag("gpu-host", 0, "gpu0.util")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from runs_data import write_runs  # noqa: E402

KEYS = {
    "name",
    "status",
    "start",
    "last_wall",
    "last_step",
    "host",
    "hparams",
    "last",
    "min",
    "max",
}

# A training process: hparams, then train/loss at steps 0..5 with NaN and Inf among the values,
# flushed; then it waits for its standard input to close (and closes the writer cleanly) or to
# be killed. ``url`` empty: it writes the run itself (an in-process broker) for a server to follow.
WRITER = """
import math, sys
from vdl_stream import attach
url, logdir, run = sys.argv[1], sys.argv[2], sys.argv[3]
kw = {"url": url} if url else {}
w = attach(logdir, run=run, telemetry=False, **kw)
w.add_hparams({"lr": 0.01, "optimizer": "adam", "layers": 4}, ["train/loss"])
for step, value in enumerate([3.0, 1.0, math.nan, 2.0, math.inf, math.nan]):
    w.add_scalar("train/loss", value, step)
w.add_scalar("train/acc", 0.5, 5)
assert w.flush(timeout=20)
print("flushed", flush=True)
sys.stdin.read()
w.close()
print("closed", flush=True)
"""


def start_writer(logdir: Path, run: str, url: str = "") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(logdir), run],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "flushed"
    return proc


def summary_of(server, run: str, until, timeout: float = 20.0) -> dict:
    """Poll ``/api/runs`` until ``run``'s summary satisfies ``until`` (or fail after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = http_get(server.url + "/api/runs")
        assert status == 200
        found = {r["name"]: r for r in body["runs"]}
        if run in found and until(found[run]):
            return found[run]
        assert server.proc.poll() is None, "the server exited"
        assert time.monotonic() < deadline, found.get(run)
        time.sleep(0.05)


def check_writer_summary(s: dict) -> None:
    """What WRITER logged, as a summary says it (NaN and Inf travel as null; min/max skip them)."""
    assert set(s) == KEYS
    assert s["hparams"] == {"lr": 0.01, "optimizer": "adam", "layers": 4}
    assert s["last"] == {"train/loss": None, "train/acc": 0.5}
    assert s["min"] == {"train/loss": 1.0, "train/acc": 0.5}
    assert s["max"] == {"train/loss": 3.0, "train/acc": 0.5}
    assert s["last_step"] == 5
    assert s["host"] == socket.gethostname()
    assert s["start"] <= s["last_wall"] <= time.time() + 1


@contextlib.contextmanager
def serving(logdir: Path):
    server = start_serve(logdir)
    try:
        yield server
    finally:
        stop_serve(server)


def test_ingested_run_is_live_then_finished(tmp_path):
    with serving(tmp_path / "logs") as server:
        writer = start_writer(tmp_path / "unused", "job", server.ws_url)
        try:
            live = summary_of(server, "job", lambda s: s["last_step"] == 5)
            assert live["status"] == "live"
            check_writer_summary(live)
            writer.stdin.close()
            assert writer.wait(30) == 0
            done = summary_of(server, "job", lambda s: s["status"] == "finished")
            check_writer_summary(done)
        finally:
            writer.kill()
            writer.wait()


def test_sigkilled_writer_reads_as_crashed(tmp_path):
    with serving(tmp_path / "logs") as server:
        writer = start_writer(tmp_path / "unused", "job", server.ws_url)
        try:
            summary_of(server, "job", lambda s: s["status"] == "live" and s["last_step"] == 5)
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
        crashed = summary_of(server, "job", lambda s: s["status"] == "crashed")
        check_writer_summary(crashed)


def test_followed_run_of_another_process(tmp_path):
    logdir = tmp_path / "logs"
    logdir.mkdir()
    with serving(logdir) as server:
        # The training process writes the run itself; the server follows its files.
        writer = start_writer(logdir, "other", "")
        try:
            live = summary_of(server, "other", lambda s: s["last_step"] == 5)
            assert live["status"] == "live"
            check_writer_summary(live)
            writer.stdin.close()
            assert writer.wait(30) == 0
            done = summary_of(server, "other", lambda s: s["status"] == "finished")
            check_writer_summary(done)
        finally:
            writer.kill()
            writer.wait()
    # A fresh server over the closed run: its summary comes from the recorder's digest.
    assert load_digest(logdir / "other") is not None
    with serving(logdir) as server:
        status, body = http_get(server.url + "/api/runs")
        assert status == 200
        (cold,) = body["runs"]
        assert cold["status"] == "finished"
        check_writer_summary(cold)


# A training process that writes its run itself (an in-process broker) at a 20 ms cadence until
# it is killed; it says "flushed" once its first point is on disk.
LOOPING_WRITER = """
import sys, time
from vdl_stream import attach
w = attach(sys.argv[1], run=sys.argv[2], telemetry=False)
for step in range(1_000_000):
    w.add_scalar("train/loss", 1.0 / (step + 1), step)
    if step == 0:
        assert w.flush(timeout=20)
        print("flushed", flush=True)
    time.sleep(0.02)  # a training step
"""


def test_a_followed_runs_killed_writer_reads_as_crashed_within_seconds(tmp_path):
    """A run another process writes (its own broker: no connection for the server to lose)
    reads ``crashed`` within the follow loop's rounds once that process is SIGKILLed (its lock
    free, the process gone), not after ``CRASH_AFTER`` (120 s) without data; the crash rule
    raises its alert."""
    logdir = tmp_path / "logs"
    logdir.mkdir()
    with serving(logdir) as server:
        writer = subprocess.Popen(
            [sys.executable, "-c", LOOPING_WRITER, str(logdir), "other"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert writer.stdout.readline().strip() == "flushed"
            # Followed live (its points after the server found it reach the detectors too).
            # (last_step is None while the run is listed and none of its points read yet)
            live = summary_of(server, "other", lambda s: (s["last_step"] or 0) >= 50)
            assert live["status"] == "live"
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
        crashed = summary_of(server, "other", lambda s: s["status"] == "crashed", timeout=15)
        assert crashed["last_step"] >= live["last_step"]
        deadline = time.monotonic() + 15  # the crash rule's grace (3 s), then its next check
        while True:
            status, body = http_get(server.url + "/api/alerts?run=other")
            rules = [a["rule"] for a in body["alerts"]] if status == 200 else []
            if "crash" in rules or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert rules.count("crash") == 1, body


def test_thousand_runs_answer(tmp_path):
    logdir = tmp_path / "sweep"
    facts = write_runs(logdir, n_runs=1000, tags=3, points=20)
    with serving(logdir) as server:
        t0 = time.perf_counter()
        status, body = http_get(server.url + "/api/runs")
        first = time.perf_counter() - t0
        assert status == 200
        runs = body["runs"]
        assert [r["name"] for r in runs] == facts["runs"]  # every run, sorted by name
        assert all(set(r) == KEYS for r in runs)
        crashed = {r["name"] for r in runs if r["status"] == "crashed"}
        assert crashed == set(facts["crashed"]) and 0 < len(crashed) < 100
        assert {r["status"] for r in runs} == {"finished", "crashed"}
        r = runs[0]
        assert set(r["last"]) == {"train/loss", "train/acc", "eval/loss"}
        assert set(r["hparams"]) >= {"lr", "optimizer", "batch_size"}
        assert r["host"] == "node00" and r["last_step"] == 19
        with recorder.RunReader(logdir / r["name"]) as reader:
            loss = reader.read_scalars("train/loss")
        assert r["last"]["train/loss"] == loss.values[-1]
        assert r["min"]["train/loss"] == loss.values.min()
        assert r["start"] == loss.walls[0] and r["last_wall"] == loss.walls[-1]
        for name in facts["diverged"]:  # their loss ends in NaN: null, and min/max stay finite
            d = next(x for x in runs if x["name"] == name)
            assert d["last"]["train/loss"] is None and d["max"]["train/loss"] is not None
        assert first < 5.0, first  # the figure itself is bench/bench_runs.py's


# -- /ws/live: summaries and synced -----------------------------------------------------------


async def next_of(ws, kind: str) -> dict:
    while True:
        message = msgpack.unpackb(await ws.get_message(), raw=False)
        if message["type"] == kind:
            return message


def columns(tag: str, steps: list[int], values: list[float]) -> ScalarColumns:
    s = np.array(steps, dtype=np.int64)
    return ScalarColumns(tag, s, 1.7e9 + s.astype(np.float64), np.array(values, dtype=np.float64))


async def test_summaries_and_synced_frames(tmp_path, nursery):
    logdir = tmp_path / "logs"
    with recorder.RunWriter(logdir / "old") as w:
        w.append_scalars("loss", np.arange(3), 1.7e9 + np.arange(3.0), np.array([5.0, 4.0, 3.0]))
    bad = logdir / "bad"
    bad.mkdir()
    (bad / "segment-000000.vdlr").write_bytes(b"\x89VDLREC\n" + b"\0" * 8)  # a broken header
    with trio.fail_after(30):
        url = await nursery.start(partial(run_server, logdir, "127.0.0.1", 0))
        ws_url = "ws" + url.removeprefix("http")
        async with open_websocket_url(ws_url + "/ws/live") as browser:
            assert (await next_of(browser, "hello"))["version"] == 1
            first = await next_of(browser, "summaries")
            assert [r["name"] for r in first["runs"]] == ["old"]
            assert first["runs"][0]["last"] == {"loss": 3.0}
            assert first["runs"][0]["status"] == "finished" or first["runs"][0]["host"] is None
            # Subscribed to a run that does not exist yet: synced still comes, and summaries of
            # every run come too, whatever the subscription names.
            await browser.send_message(
                codec.encode_message({"type": "subscribe", "runs": ["elsewhere"]})
            )
            synced = await next_of(browser, "synced")
            assert isinstance(synced["seq"], int)
            async with open_websocket_url(ws_url + "/ws/ingest") as writer:
                batch = Batch("w", 1, "new", [columns("loss", [0, 1, 2], [1.0, math.nan, 0.5])])
                await writer.send_message(codec.encode_batch(batch))
                assert msgpack.unpackb(await writer.get_message(), raw=False)["type"] == "ack"
                changed = await next_of(browser, "summaries")
                while "new" not in {r["name"] for r in changed["runs"]}:
                    changed = await next_of(browser, "summaries")
                (new,) = [r for r in changed["runs"] if r["name"] == "new"]
                assert new["status"] == "live" and new["last_step"] == 2
                assert (new["last"], new["min"], new["max"]) == (
                    {"loss": 0.5},
                    {"loss": 0.5},
                    {"loss": 1.0},
                )
            # The writer's connection ended without the close marker: crashed.
            lost = await next_of(browser, "summaries")
            while "new" not in {r["name"] for r in lost["runs"]}:
                lost = await next_of(browser, "summaries")
            assert [r["status"] for r in lost["runs"] if r["name"] == "new"] == ["crashed"]
        # A page subscribed to every run, with one of them unreadable: synced follows the
        # snapshots of the others (the page once waited for the unreadable one forever).
        async with open_websocket_url(ws_url + "/ws/live") as browser:
            await next_of(browser, "summaries")
            await browser.send_message(codec.encode_message({"type": "subscribe", "runs": None}))
            got = []
            while (message := msgpack.unpackb(await browser.get_message(), raw=False))[
                "type"
            ] != "synced":
                if message["type"] == "snapshot":
                    got.append(message["run"])
            assert sorted(got) == ["new", "old"]


async def frames_until_synced(ws) -> list[dict]:
    """Every message up to and including the next ``synced``."""
    got = []
    while (message := msgpack.unpackb(await ws.get_message(), raw=False))["type"] != "synced":
        got.append(message)
    return [*got, message]


async def test_a_keep_subscription_does_not_send_the_summaries_again(tmp_path, nursery):
    # A run that appears after the page connected has its summary published then: the first
    # subscription brings it, a ``keep`` re-subscription of the same subscriber does not (its
    # queue carries what is published later), a fresh subscription (no keep) does again.
    logdir = tmp_path / "logs"
    with recorder.RunWriter(logdir / "old") as w:
        w.append_scalars("loss", np.arange(3), 1.7e9 + np.arange(3.0), np.array([5.0, 4.0, 3.0]))
    with trio.fail_after(30):
        url = await nursery.start(partial(run_server, logdir, "127.0.0.1", 0))
        ws_url = "ws" + url.removeprefix("http")
        async with (
            open_websocket_url(ws_url + "/ws/live") as browser,
            open_websocket_url(ws_url + "/ws/live") as watcher,
        ):
            await next_of(browser, "summaries")
            await next_of(watcher, "summaries")
            await watcher.send_message(codec.encode_message({"type": "subscribe", "runs": []}))
            await next_of(watcher, "synced")
            async with open_websocket_url(ws_url + "/ws/ingest") as writer:
                batch = Batch("w", 1, "new", [columns("loss", [0, 1], [1.0, 0.5])])
                await writer.send_message(codec.encode_batch(batch))
                assert msgpack.unpackb(await writer.get_message(), raw=False)["type"] == "ack"
            # Published (the watcher, subscribed, gets it: after ``browser`` connected), then
            # again once the writer's connection ended without a close: nothing more follows.
            status = None
            while status != "crashed":
                runs = (await next_of(watcher, "summaries"))["runs"]
                status = next((r["status"] for r in runs if r["name"] == "new"), status)
            kinds = []
            for ask in (
                {"runs": ["old"], "keep": True},
                {"runs": ["old", "new"], "keep": True},
                {"runs": ["new"], "keep": True},
                {"runs": ["new"]},
            ):
                await browser.send_message(codec.encode_message({"type": "subscribe", **ask}))
                got = await frames_until_synced(browser)
                kinds.append([m["type"] for m in got])
                if ask == {"runs": ["old"], "keep": True}:
                    (summaries,) = [m for m in got if m["type"] == "summaries"]
                    assert "new" in {r["name"] for r in summaries["runs"]}
            assert kinds[0] == ["summaries", "snapshot", "synced"], kinds
            assert kinds[1] == ["snapshot", "synced"], kinds  # "new" only, no summaries
            assert kinds[2] == ["synced"], kinds
            assert kinds[3][0] == "summaries" and kinds[3][-1] == "synced", kinds


async def test_a_page_that_connects_before_the_first_publication_gets_no_summary_twice(
    tmp_path, nursery
):
    # Connected at once after the start, before the broker's first publication of summaries
    # (every SUMMARY_INTERVAL): what the connect frame held is not published to it again, so a
    # run that appears later comes in a frame of its own, not with every other run's summary.
    logdir = tmp_path / "logs"
    for i in range(3):
        with recorder.RunWriter(logdir / f"old{i}") as w:
            w.append_scalars("loss", np.arange(3), 1.7e9 + np.arange(3.0), np.ones(3) * i)
    with trio.fail_after(30):
        url = await nursery.start(partial(run_server, logdir, "127.0.0.1", 0))
        ws_url = "ws" + url.removeprefix("http")
        async with open_websocket_url(ws_url + "/ws/live") as browser:
            first = await next_of(browser, "summaries")
            assert sorted(r["name"] for r in first["runs"]) == ["old0", "old1", "old2"]
            await browser.send_message(codec.encode_message({"type": "subscribe", "runs": []}))
            assert [m["type"] for m in await frames_until_synced(browser)] == ["synced"]
            async with open_websocket_url(ws_url + "/ws/ingest") as writer:
                batch = Batch("w", 1, "new", [columns("loss", [0, 1], [1.0, 0.5])])
                await writer.send_message(codec.encode_batch(batch))
                assert msgpack.unpackb(await writer.get_message(), raw=False)["type"] == "ack"
                names: set[str] = set()
                while "new" not in names:
                    names = {r["name"] for r in (await next_of(browser, "summaries"))["runs"]}
                assert names == {"new"}


# -- the recorder's digest --------------------------------------------------------------------


def test_digest_is_stale_once_the_run_grows_without_it(tmp_path):
    run = tmp_path / "r"
    with recorder.RunWriter(run) as w:
        w.append_scalars("a", np.arange(4), 1.7e9 + np.arange(4.0), np.arange(4.0))
        w.append_record("meta", None, None, 1.7e9, {"host": "h1"})
    digest = load_digest(run)
    assert digest is not None and digest.scalars["a"].last_value == 3.0
    assert digest.meta == {"host": "h1"}
    w = recorder.RunWriter(run)  # reopened: the digest is continued...
    w.append_scalars("a", np.arange(4, 6), 1.7e9 + np.arange(4.0, 6.0), np.array([9.0, -1.0]))
    w.flush()
    assert load_digest(run) is None  # ...but on disk it no longer describes the files
    w.close()
    digest = load_digest(run)
    assert digest is not None
    assert (digest.scalars["a"].count, digest.scalars["a"].vmin, digest.scalars["a"].vmax) == (
        6,
        -1.0,
        9.0,
    )
    (run / DIGEST_NAME).write_bytes(b"garbage")
    assert load_digest(run) is None  # damaged: ignored, never an error


# -- property: a summary equals what a full read of the run says ------------------------------

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0]),
)
BATCHES = st.lists(
    st.tuples(
        st.lists(
            st.tuples(
                # The last: a telemetry field on the scalar path (issue 16), whose walls count
                # towards the run's time range but which is not a training tag.
                st.sampled_from(["a", "b/c", "d", TELEMETRY_TAG]),
                st.lists(VALUES, min_size=1, max_size=5),
            ),
            max_size=3,
        ),
        st.lists(
            st.one_of(
                st.builds(
                    lambda h: ("hparams", {"hparams": h, "metrics": [], "metric_values": None}),
                    st.dictionaries(
                        st.sampled_from(["lr", "opt", "n"]),
                        st.one_of(
                            st.floats(allow_nan=False), st.text(max_size=3), st.integers(-5, 5)
                        ),
                        max_size=3,
                    ),
                ),
                st.builds(
                    lambda h, c: ("meta", {"host": h, **({"status": "closed"} if c else {})}),
                    st.sampled_from(["h1", "h2"]),
                    st.booleans(),
                ),
            ),
            max_size=2,
        ),
        st.booleans(),  # read the summary after this batch (it folds what it kept)
    ),
    min_size=1,
    max_size=8,
)


def full_read(run_dir: Path, name: str) -> dict:
    """The summary fields as a full read of the run gives them (status left out)."""
    with recorder.RunReader(run_dir) as reader:
        last, lo, hi, walls, top = {}, {}, {}, [], None
        for tag, info in reader.tags().items():
            if info.kind != "scalars":
                continue
            s = reader.read_scalars(tag)
            if tag == TELEMETRY_TAG:
                walls += s.walls.tolist()
                continue
            finite = s.values[np.isfinite(s.values)]
            last[tag] = float(s.values[-1]) if math.isfinite(s.values[-1]) else None
            lo[tag] = float(finite.min()) if len(finite) else None
            hi[tag] = float(finite.max()) if len(finite) else None
            walls += s.walls.tolist()
            top = int(s.steps.max()) if top is None else max(top, int(s.steps.max()))
        records = reader.read_records()
        walls += [r.wall for r in records if r.kind != "scalars"]
        hparams = [r.data["hparams"] for r in records if r.kind == "hparams"]
        hosts = [r.data["host"] for r in records if r.kind == "meta" and "host" in r.data]
        return {
            "name": name,
            "start": min(walls) if walls else None,
            "last_wall": max(walls) if walls else None,
            "last_step": top,
            "host": hosts[-1]
            if hosts
            else ("gpu-host" if TELEMETRY_TAG in reader.tags() else None),
            "hparams": {
                k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in (hparams[-1] if hparams else {}).items()
            },
            "last": last,
            "min": lo,
            "max": hi,
        }


def without_status(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "status"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BATCHES)
def test_summary_equals_a_full_read(batches):
    """Built batch by batch (as the broker does), from the digest a closed writer leaves, and
    from a reader: each equals what a full read of the run says."""
    live = RunSummary("r", time.time())
    steps: dict[str, int] = {}
    wall = 1.7e9
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "r"
        with recorder.RunWriter(run, sync="never") as w:
            for scalars, events, read_now in batches:
                cols = []
                for tag, values in scalars:
                    first = steps.get(tag, 0)
                    s = np.arange(first, first + len(values), dtype=np.int64)
                    steps[tag] = first + len(values)
                    wall += 1
                    walls = wall + np.arange(len(values), dtype=np.float64) * 0.01
                    v = np.array(values, dtype=np.float64)
                    w.append_scalars(tag, s, walls, v)
                    cols.append(ScalarColumns(tag, s, walls, v))
                maps = []
                for kind, data in events:
                    wall += 1
                    w.append_record(kind, None, None, wall, data)
                    maps.append({"kind": kind, "tag": None, "step": None, "wall": wall, **data})
                live.add(*legacy_view(cols, maps), time.time())  # as the broker hands it over
                if read_now:
                    live.status(time.time())
                w.flush()
        expected = full_read(run, "r")
        digest = load_digest(run)
        assert digest is not None
        from_digest = RunSummary.from_digest("r", digest, time.time())
        with recorder.RunReader(run) as reader:
            from_reader = RunSummary.from_reader("r", reader, time.time())
        now = time.time()
        for summary in (live, from_digest, from_reader):
            got = without_status(summary.to_json(now))
            # hparams values: NaN never generated; compare through JSON's eyes.
            assert got == expected, (summary, got, expected)
        closed = [
            d.get("status") == "closed"
            for _, ev, _ in batches
            for k, d in ev
            if k == "meta" and "status" in d
        ]
        want = "finished" if closed and closed[-1] else "live"
        assert {s.status(now) for s in (live, from_digest, from_reader)} == {want}


def test_a_summarys_kept_batches_hold_no_tracked_object_per_batch():
    """The batches a summary keeps until its next fold (up to FOLD_BATCHES, a second or more of
    a live run) leave no object per batch for the garbage collector to track, so they are not
    promoted to its oldest generation, where they would set off full collections in a training
    process that logs through attach(); what the fold makes of them is unchanged."""
    summary = RunSummary("r", time.time())
    gc.collect()
    before = len(gc.get_objects())
    for i in range(200):  # fewer than FOLD_BATCHES: all kept until the summary is read
        step = np.array([i], np.int64)
        cols = [
            ScalarColumns(f"t{k}", step, np.array([1.7e9 + i]), np.array([k + i / 1000]))
            for k in range(20)
        ]
        summary.add(cols, [{"kind": "text", "tag": "n", "step": i, "wall": 1.7e9 + i}], 0.0)
    del cols, step
    gc.collect()
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    body = summary.to_json(time.time())
    assert body["last_step"] == 199
    assert body["last"] == {f"t{k}": k + 0.199 for k in range(20)}


async def test_broker_summaries_follow_ingest(tmp_path):
    """In-process: the broker's summary of an ingested run, and of a run it starts writing that
    already holds history on disk (no digest: read once), then updated batch by batch."""
    with recorder.RunWriter(tmp_path / "hist", compact_records=None) as w:
        w.append_scalars("x", np.arange(5), 1.7e9 + np.arange(5.0), np.array([1, 2, 3, 4, 0.0]))
    (tmp_path / "hist" / DIGEST_NAME).unlink()
    broker = Broker(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        with trio.fail_after(20):
            await broker.ingest(Batch("w", 1, "hist", [columns("x", [5, 6], [7.0, 6.0])]))
            (s,) = broker.summaries()
            assert (s["last"], s["min"], s["max"], s["last_step"]) == (
                {"x": 6.0},
                {"x": 0.0},
                {"x": 7.0},
                6,
            )
            assert broker.publish_summaries() == 1 and broker.publish_summaries() == 0
            broker.writer_lost(["hist"])
            assert broker.summaries()[0]["status"] == "crashed"
            assert broker.publish_summaries() == 1  # a status change is a change
            broker.close()
            await broker.wait_closed()
    with pytest.raises(ValueError, match="crash_after"):
        Broker(tmp_path, crash_after=0)


def test_cold_runs_without_a_digest_get_their_summary(tmp_path):
    """Runs written before digests existed (or whose writer was killed): listed at once with a
    placeholder, then filled in by the server on its own, without a page asking."""
    logdir = tmp_path / "logs"
    for i in range(3):
        with recorder.RunWriter(logdir / f"r{i}") as w:
            w.append_scalars("loss", np.arange(10), 1.7e9 + np.arange(10.0), np.arange(10.0) + i)
            w.append_record("meta", None, None, 1.7e9, {"host": "old", "status": "closed"})
        (logdir / f"r{i}" / DIGEST_NAME).unlink()
    with serving(logdir) as server:
        for i in range(3):
            s = summary_of(server, f"r{i}", lambda s: s["last_step"] is not None)
            assert (s["status"], s["host"], s["last"], s["min"], s["max"]) == (
                "finished",
                "old",
                {"loss": 9.0 + i},
                {"loss": float(i)},
                {"loss": 9.0 + i},
            )


async def test_a_followed_run_is_crashed_when_idle_and_live_when_it_moves(tmp_path):
    """A run another process writes (no connection to lose): crashed once nothing arrived for
    ``crash_after`` seconds (its files' age, for a run found on disk), live again when it grows."""
    run = tmp_path / "r"
    with recorder.RunWriter(run) as w:
        w.append_scalars("loss", np.arange(3), 1.7e9 + np.arange(3.0), np.ones(3))
    for name in os.listdir(run):
        os.utime(run / name, (1.7e9, 1.7e9))  # written long ago, never closed by its Writer
    broker = Broker(tmp_path, crash_after=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        with trio.fail_after(30):
            await nursery.start(partial(broker.follow, 0.05))
            assert [s["status"] for s in broker.summaries()] == ["crashed"]
            with recorder.RunWriter(run) as w:  # the training resumed
                w.append_scalars("loss", np.arange(3, 5), 1.7e9 + np.arange(3.0, 5.0), np.zeros(2))
            for _ in range(500):  # the follow loop polls every 50 ms
                if (s := broker.summaries()[0])["last_step"] == 4:
                    break
                await trio.sleep(0.05)
            assert s["status"] == "live" and s["last"] == {"loss": 0.0}
            assert s["min"] == {"loss": 0.0} and s["max"] == {"loss": 1.0}
            broker.close()
            await broker.wait_closed()


def test_status_markers_keep_the_run_time_range(tmp_path):
    """The Writer's status meta events take the wall times of the data they go with, so a run
    logged with wall times of its own (an import, a test) keeps its time range."""
    from vdl_stream import attach

    with attach(tmp_path, run="r", telemetry=False) as w:
        for step in range(5):
            w.add_scalar("loss", 1.0 / (step + 1), step, walltime=1.7e9 + step)
    with recorder.RunReader(tmp_path / "r") as reader:
        metas = reader.read_records(kind="meta")
        assert [m.data.get("status") for m in metas] == ["running", "closed"]
        assert [m.wall for m in metas] == [1.7e9, 1.7e9 + 4]
        assert metas[0].data["host"] == socket.gethostname()
    digest = load_digest(tmp_path / "r")
    assert digest is not None and digest.walls(("scalars", "meta")) == (1.7e9, 1.7e9 + 4)
    s = RunSummary.from_digest("r", digest, time.time()).to_json(time.time())
    assert (s["status"], s["start"], s["last_wall"]) == ("finished", 1.7e9, 1.7e9 + 4)


# -- the summaries on connect as a table (?summaries=table) -----------------------------------


def expand_table(table: dict) -> list[dict]:
    """The summary objects of a ``summaries`` table (docs/protocol.md), as ui/src/summarytable.js
    expands them: written here from the documented layout, to check the server against it."""
    names = table["names"]
    n = len(names)

    def interned(column: list, absent: object = None) -> list:
        values, index = column
        return [absent if k == 0xFFFF else values[k] for k in np.frombuffer(index, "<u2")]

    def f8(raw: bytes) -> list:
        return [None if math.isnan(v) else v for v in np.frombuffer(raw, "<f8").tolist()]

    status, host = interned(table["status"]), interned(table["host"])
    start, wall, step = f8(table["start"]), f8(table["last_wall"]), f8(table["last_step"])
    missing = object()
    hparams = [(k, interned([v, i], missing)) for k, v, i in table["hparams"]]
    tags = table["tags"]
    stats = {
        a: np.frombuffer(table[a], "<f8").reshape(len(tags), n) for a in ("last", "min", "max")
    }
    has = (
        np.ones((len(tags), n), bool)
        if table["has"] is None
        else np.frombuffer(table["has"], "u1").reshape(len(tags), n).astype(bool)
    )
    out = []
    for i, name in enumerate(names):
        tag_stats = {
            a: {
                t: None if math.isnan(v) else v
                for t, v in zip(tags, stats[a][:, i].tolist(), strict=True)
            }
            for a in stats
        }
        for t, present in zip(tags, has[:, i], strict=True):
            if not present:
                for a in tag_stats:
                    del tag_stats[a][t]
        out.append(
            {
                "name": name,
                "status": status[i],
                "start": start[i],
                "last_wall": wall[i],
                "last_step": None if step[i] is None else int(step[i]),
                "host": host[i],
                "hparams": {k: v[i] for k, v in hparams if v[i] is not missing},
                **tag_stats,
            }
        )
    return out


async def test_the_first_summaries_as_a_table_hold_the_same_summaries(tmp_path, nursery):
    logdir = tmp_path / "logs"
    write_runs(logdir, n_runs=40, tags=3, points=20)
    # Runs that differ in what they have: no hparams, another tag, a NaN last value, no host.
    with recorder.RunWriter(logdir / "bare") as w:
        w.append_scalars(
            "other/tag", np.arange(3), 1.7e9 + np.arange(3.0), np.array([1.0, 2.0, math.nan])
        )
    with recorder.RunWriter(logdir / "odd") as w:
        w.append_record(
            "hparams", None, None, 1.7e9, {"hparams": {"lr": 1, "flag": True, "note": None}}
        )
        w.append_scalars("train/loss", np.arange(2), 1.7e9 + np.arange(2.0), np.array([3.0, 2.0]))
    with trio.fail_after(60):
        url = await nursery.start(partial(run_server, logdir, "127.0.0.1", 0))
        ws_url = "ws" + url.removeprefix("http") + "/ws/live"
        async with open_websocket_url(ws_url) as browser:
            rows = (await next_of(browser, "summaries"))["runs"]
        async with open_websocket_url(ws_url + "?summaries=table") as browser:
            raw = await next_of(browser, "summaries")
        async with open_websocket_url(ws_url + "?summaries=table") as browser:
            again = await next_of(browser, "summaries")
    assert "runs" not in raw and len(raw["table"]["names"]) == 42
    assert expand_table(raw["table"]) == rows
    odd = next(r for r in rows if r["name"] == "odd")
    assert odd["hparams"] == {"lr": 1, "flag": True, "note": None}
    assert next(r for r in rows if r["name"] == "bare")["last"] == {"other/tag": None}
    assert again == raw  # unchanged summaries: the same table
    # Interned: 40 runs share 4 optimizers, and the status column names each status once.
    optimizer = next(v for k, v, _ in raw["table"]["hparams"] if k == "optimizer")
    assert sorted(optimizer) == ["adam", "adamw", "rmsprop", "sgd"]
    assert len(raw["table"]["status"][0]) <= 3


def test_a_table_column_with_too_many_distinct_values_is_refused():
    from vdl_stream.run_summary import TABLE_MISSING, summaries_table

    def obj(i: int) -> dict:
        return {"name": f"r{i}", "hparams": {"seed": i}, "last": {}, "min": {}, "max": {}}

    table = summaries_table([obj(i) for i in range(3)])
    assert table["hparams"][0][:2] == ["seed", [0, 1, 2]] and table["has"] is None
    with pytest.raises(ValueError, match="more than 65535 values"):
        summaries_table([obj(i) for i in range(TABLE_MISSING + 1)])


async def test_the_first_pages_summaries_table_is_built_before_the_url(
    tmp_path, nursery, monkeypatch
):
    # Built at start-up, not between the first page's `runs` and `summaries` frames.
    from vdl_stream import server

    write_runs(tmp_path / "logs", n_runs=30, tags=2, points=20)
    built: list[int] = []
    table_frame = server.summaries_table_frame

    def counted(objs):
        built.append(len(objs))
        return table_frame(objs)

    monkeypatch.setattr(server, "summaries_table_frame", counted)
    monkeypatch.setattr(server, "_table_cache", server._TableCache())
    with trio.fail_after(60):
        url = await nursery.start(partial(run_server, tmp_path / "logs", "127.0.0.1", 0))
        assert built == [30]
        ws_url = "ws" + url.removeprefix("http") + "/ws/live?summaries=table"
        async with open_websocket_url(ws_url) as browser:
            first = await next_of(browser, "summaries")
    assert built == [30]  # the page got the bytes built at start-up
    assert len(first["table"]["names"]) == 30
