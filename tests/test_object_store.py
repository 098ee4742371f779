"""Runs on object storage, against a real S3 API: moto's server mode on 127.0.0.1 (a subprocess),
with a TCP relay in front of it where a test needs the store to go down and come back."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio

pytest.importorskip("obstore")  # the cloud extra (which the test extra includes)

import recorder
import vdl_stream
from recorder.store import (
    FileRef,
    Manifest,
    ManifestError,
    RangeCache,
    RunMirror,
    find_runs,
    object_key,
    read_manifest,
)
from tests.conftest import http_get, start_serve, stop_serve
from tests.s3_server import MotoServer, Relay, restore_env, set_env
from vdl_stream import storage

ROOT = Path(__file__).resolve().parents[1]
URL = "s3://bucket/runs"


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[MotoServer]:
    """moto on a free port with a bucket, the environment pointing at it, a fresh cache dir."""
    server = MotoServer()
    old = set_env({**server.env(), "VDL_STREAM_CACHE": str(tmp_path / "cache")})
    try:
        server.create_bucket("bucket")
        yield server
    finally:
        restore_env(old)
        server.stop()


def _write(run: str, points: int, *, every: int = 10, url: str = URL) -> None:
    """Record ``run`` through attach(logdir=url): two scalar tags, a text and a histogram,
    flushed every ``every`` points (enough flushes for the broker to compact)."""
    with vdl_stream.attach(logdir=url, run=run, telemetry=False) as writer:
        for i in range(points):
            writer.add_scalar("train/loss", 1.0 / (i + 1), i)
            writer.add_scalar("train/acc", i * 1e-4, i)
            if i % every == 0:
                writer.flush()
        writer.add_text("notes", "hello bucket", 1)
        writer.add_histogram("w", np.arange(100.0), 2)


def _contents(run_dir: Path, max_points: int | None = None) -> dict:
    """Everything a reader returns from a run: every tag's points (downsampled to
    ``max_points``, which reads block chunks' level-of-detail summaries and slices) and every
    record's data."""
    with recorder.RunReader(run_dir) as reader:
        out: dict = {}
        for tag, info in sorted(reader.tags().items()):
            if info.kind == "scalars":
                s = reader.read_scalars(tag, max_points=max_points)
                out[tag] = (s.steps.tolist(), s.walls.tolist(), s.values.tolist())
            else:
                out[tag] = [(r.kind, r.step, r.data) for r in reader.read_records(info.kind, tag)]
        return out


def _objects(client: storage.ObstoreClient) -> dict[str, int]:
    return {o.key: o.size for o in client.list("")}


def test_attach_records_to_the_bucket_and_reads_back_exactly(s3: MotoServer) -> None:
    _write("exp/a", 24_000)
    client = storage.ObstoreClient(URL)
    keys = _objects(client)
    manifest = Manifest.decode(client.get("exp/a/manifest.vdlm"), "exp/a")
    # Closed: blocks plus the empty head segment, every named object present.
    assert any(f.name.startswith("block-") for f in manifest.files), manifest
    assert all(keys.get(f.key) == f.size for f in manifest.files)
    local = storage.cache_dir(URL) / "exp" / "a"
    with storage.mirrored(URL) as tmp:
        assert (tmp / "exp" / "a").is_dir()
        downsampled = _contents(tmp / "exp" / "a", max_points=300)
        remote = _contents(tmp / "exp" / "a")
    assert remote == _contents(local)
    assert downsampled == _contents(local, max_points=300)
    assert len(downsampled["train/loss"][0]) <= 300
    steps, _, values = remote["train/loss"]
    assert steps == list(range(24_000))
    assert values == [1.0 / (i + 1) for i in range(24_000)]
    assert remote["notes"][0][2] == {"text": "hello bucket"}


def test_append_to_a_run_that_exists_only_in_the_bucket(s3: MotoServer, tmp_path: Path) -> None:
    _write("r", 3_000)
    # Another machine: an empty cache. Naming the run continues it, from the bucket.
    os.environ["VDL_STREAM_CACHE"] = str(tmp_path / "other-cache")
    with vdl_stream.attach(logdir=URL, run="r", telemetry=False) as writer:
        for i in range(3_000, 3_500):
            writer.add_scalar("train/loss", 1.0 / (i + 1), i)
    with storage.mirrored(URL, ["r"]) as tmp:
        steps, _, _ = _contents(tmp / "r")["train/loss"]
    assert steps == list(range(3_500))


def test_a_fresh_serve_serves_the_bucket_with_an_empty_cache(
    s3: MotoServer, tmp_path: Path
) -> None:
    _write("exp/a", 15_000)
    _write("b", 500)
    server = start_serve(
        URL,  # type: ignore[arg-type]
        *("--cache-dir", str(tmp_path / "serve-cache")),
        *("--head-interval", "2", "--store-cache-mb", "64"),
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the first listing is done before serve reports its URL
            status, body = http_get(server.url + "/api/runs")
            if status == 200 and sorted(r["name"] for r in body["runs"]) == ["b", "exp/a"]:
                break
            assert time.monotonic() < deadline, body
        status, body = http_get(server.url + "/api/scalars?run=exp/a&tag=train/loss")
        assert status == 200, body
        assert body["steps"] == list(range(15_000))
        assert body["values"] == [1.0 / (i + 1) for i in range(15_000)]
        status, body = http_get(server.url + "/api/events?run=exp/a&kind=text&tag=notes")
        assert status == 200 and body["events"][0]["text"] == "hello bucket", body
        status, stats = http_get(server.url + "/api/stats")
        store = stats["store"]
        assert store["url"] == URL and store["runs_mirrored"] == 2, store
        assert store["requests"]["put"] == 0  # a reader writes nothing
        assert store["cache"]["fetches"] >= 1
    finally:
        assert stop_serve(server) == 0


async def test_the_first_look_at_the_bucket_begun_early_is_taken_not_repeated(
    s3: MotoServer, tmp_path: Path
) -> None:
    """``serve`` begins the bucket's first mirror round before importing the web server
    (storage.start_early_mirror); the StoreSync made next takes it: one listing, not two."""
    await trio.to_thread.run_sync(_write, "exp/a", 2_000)
    await trio.to_thread.run_sync(_write, "b", 300)
    local = tmp_path / "early"
    storage.start_early_mirror(URL, local)
    storage.start_early_mirror(URL, local)  # a second call for the same place starts nothing
    sync = storage.StoreSync(storage.ObstoreClient(URL), local)
    assert sync._early is not None
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync.run, done.wait)
        stats = sync.statistics()
        assert stats.requests["list"] == 1, stats.requests  # the early round's, taken
        assert stats.runs_mirrored == 2
        assert sorted(recorder.list_runs(local)) == ["b", "exp/a"]
        assert _contents(local / "exp/a")["train/loss"][0] == list(range(2_000))
        done.set()
    # Taken once: a second sync over the same place mirrors by itself.
    again = storage.StoreSync(storage.ObstoreClient(URL), tmp_path / "again")
    assert again._early is None


async def test_an_early_look_that_fails_leaves_the_first_round_to_the_sync(
    s3: MotoServer, tmp_path: Path
) -> None:
    await trio.to_thread.run_sync(_write, "a", 200)
    local = tmp_path / "early"
    old = set_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})  # nothing listens there
    try:
        storage.start_early_mirror(URL, local)
        early = storage._EARLY[(URL, local)]
        await trio.to_thread.run_sync(early.join, 60)
        assert early.sync is None  # it failed
    finally:
        restore_env(old)
    sync = storage.StoreSync(storage.ObstoreClient(URL), local)
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync.run, done.wait)
        assert sync.statistics().runs_mirrored == 1  # mirrored by itself
        assert recorder.list_runs(local) == ["a"]
        done.set()


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, vdl_stream
    writer = vdl_stream.attach(logdir=sys.argv[1], run="killed", telemetry=False)
    i = 0
    while True:
        writer.add_scalar("x", float(i), i)
        if i % 10 == 9:
            writer.flush()
            print(i, flush=True)
        i += 1
    """
)


def test_a_writer_killed_mid_run_leaves_the_bucket_and_its_local_head_intact(
    s3: MotoServer,
) -> None:
    client = storage.ObstoreClient(URL)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, URL],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    flushed = -1
    try:
        deadline = time.monotonic() + 120
        # Until the manifest names a compacted block, then a little more. (Not the block object
        # alone: it is uploaded before the manifest that names it, and a kill between the two
        # leaves the bucket at the previous manifest.)
        while not any(
            "block-" in f.name for f in getattr(read_manifest(client, "killed"), "files", ())
        ):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "no block was published"
            flushed = int(line)
        for _ in range(50):
            flushed = int(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The bucket holds a prefix of the run, exactly.
    with storage.mirrored(URL) as tmp:
        published = _contents(tmp / "killed")["x"][0]
    assert published == list(range(len(published))) and len(published) >= 2048
    # The local head holds everything flushed (the bucket's part included).
    local = _contents(storage.cache_dir(URL) / "killed")["x"][0]
    assert local[: len(published)] == published
    assert local[: flushed + 1] == list(range(flushed + 1))
    # The next writer of the run (same machine) publishes the rest.
    with vdl_stream.attach(logdir=URL, run="killed", telemetry=False):
        pass
    with storage.mirrored(URL) as tmp:
        got = _contents(tmp / "killed")["x"][0]
        assert got == local, (len(got), len(local), len(published), flushed, got[-3:], local[-3:])


@pytest.mark.parametrize("ours", [True, False])
def test_a_run_whose_last_manifest_was_put_but_not_recorded_is_still_published_from_here(
    s3: MotoServer, ours: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A process killed between a manifest's PUT and recording it in the run directory left
    the record one generation behind the bucket, with that manifest as its pending one: the
    next writer on this host publishes the rest. A manifest this host never announced (another
    broker's) still stops it."""
    client = storage.ObstoreClient(URL)
    with vdl_stream.attach(logdir=URL, run="r", telemetry=False) as writer:
        writer.add_scalar("x", 0.0, 0)
    manifest = read_manifest(client, "r")
    local = storage.cache_dir(URL) / "r"
    # Points the bucket has not got yet (written with no store in the way), then the record
    # as the kill left it: the generation before the bucket's, with or without that pending.
    with recorder.RunWriter(local, sync="never") as more:
        more.append_scalars("x", np.arange(1, 100), np.full(99, 1.7e9), np.arange(1.0, 100.0))
    pending = manifest if ours else Manifest("r", manifest.files[:-1], manifest.generation)
    storage._mark_published(local, manifest.generation - 1, pending=pending)
    with (
        caplog.at_level(logging.WARNING, "vdl_stream.storage"),
        vdl_stream.attach(logdir=URL, run="other", telemetry=False),
    ):
        pass  # its broker publishes what the cache directory holds when it closes
    with storage.mirrored(URL, ["r"]) as tmp:
        steps = _contents(tmp / "r")["x"][0]
    assert steps == (list(range(100)) if ours else [0])
    assert any("newer version" in r.getMessage() for r in caplog.records) is not ours


def test_a_store_that_is_down_never_stalls_the_writer_and_loses_nothing(
    s3: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    relay = Relay(s3.port)
    old = set_env(s3.env(relay.endpoint))
    try:
        relay.down()
        # Down from the start: a run named by attach() needs nothing from the store to begin.
        writer = vdl_stream.attach(logdir=URL, telemetry=False)
        slowest = 0.0
        with caplog.at_level(logging.WARNING, "vdl_stream.storage"):
            for i in range(20_000):
                start = time.perf_counter()
                writer.add_scalar("x", float(i), i)
                if i % 10 == 0:
                    assert writer.flush(timeout=10)
                slowest = max(slowest, time.perf_counter() - start)
            deadline = time.monotonic() + 30
            while not any("failing" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the outage was not reported"
                assert writer.flush(timeout=10)
        # Every flush returned once the local head had it: the store was never waited on.
        assert slowest < 2.0, slowest
        relay.up()
        writer.close()
        with storage.mirrored(URL) as tmp:
            assert _contents(tmp / writer.run)["x"][0] == list(range(20_000))
    finally:
        restore_env(old)
        relay.close()


async def test_foreign_objects_in_the_prefix_are_skipped_with_a_warning(
    s3: MotoServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await trio.to_thread.run_sync(_write, "good", 200)
    client = storage.ObstoreClient(URL)
    client.put("notes.txt", b"not a run")
    client.put("good/stray.bin", b"\x00" * 10)
    client.put("evil/manifest.vdlm", b"{not json")
    client.put(
        "sneaky/manifest.vdlm",
        json.dumps(
            {"format": "vdl-stream-manifest", "version": 1, "run": "sneaky",
             "files": [["segment-000000.vdlr", "good/segment-000000.vdlr.0011223344556677", 40, None]]}
        ).encode(),
    )  # fmt: skip
    sync = storage.StoreSync(client, tmp_path / "local")
    done = trio.Event()
    with caplog.at_level(logging.WARNING, "vdl_stream.storage"):
        async with trio.open_nursery() as nursery:
            await nursery.start(sync.run, done.wait)
            done.set()
    messages = " ".join(r.getMessage() for r in caplog.records)
    for bad in ("notes.txt", "good/stray.bin", "'evil'", "'sneaky'"):
        assert bad in messages, messages
    assert recorder.list_runs(tmp_path / "local") == ["good"]
    assert _contents(tmp_path / "local" / "good")["train/loss"][0] == list(range(200))


async def test_a_serving_broker_follows_a_live_run_through_the_bucket(
    s3: MotoServer, tmp_path: Path
) -> None:
    """A writer on one machine, a broker on another: the broker sees the sealed blocks and the
    head of a live run appear, through the bucket only."""
    client = storage.ObstoreClient(URL)
    writer = await trio.to_thread.run_sync(
        lambda: vdl_stream.attach(logdir=URL, run="live", telemetry=False)
    )

    def write() -> None:
        for i in range(30_000):
            writer.add_scalar("x", float(i), i)
            if i % 10 == 0:
                writer.flush()

    try:
        await trio.to_thread.run_sync(write)
        sync = storage.StoreSync(client, tmp_path / "reader", list_interval=0.2)
        done = trio.Event()
        path = tmp_path / "reader" / "live"
        seen: list = []
        async with trio.open_nursery() as nursery:
            await nursery.start(sync.run, done.wait)
            with trio.fail_after(60):
                while len(seen) < 2048:  # at least the first compacted block, while live
                    if path.is_dir() and any(n.startswith("block-") for n in os.listdir(path)):
                        seen = (await trio.to_thread.run_sync(_contents, path))["x"][0]
                    await trio.sleep(0.1)  # the next listing
            done.set()
        assert seen == list(range(len(seen)))
        assert sync.statistics().requests["put"] == 0
    finally:
        await trio.to_thread.run_sync(writer.close)


def test_store_urls_are_checked() -> None:
    assert storage.parse_store_url("s3://b/p/q/").prefix == "p/q"
    assert storage.parse_store_url("gs://b").prefix == ""
    for bad in ("s3://", "s3:///x", "ftp://b/p", "s3://b/a/../c", "s3://b/a//c"):
        with pytest.raises(ValueError, match="logdir"):
            storage.parse_store_url(bad)
    assert storage.is_store_url("az://c/p") and not storage.is_store_url("vdl_logs")


def test_manifests_are_checked() -> None:
    good = Manifest(
        "r", [FileRef("segment-000000.vdlr", object_key("r", "segment-000000.vdlr", b"x"), 32)]
    )
    assert Manifest.decode(good.encode(), "r").files == good.files
    with pytest.raises(ManifestError, match="names run"):
        Manifest.decode(good.encode(), "other")
    outside = Manifest(
        "r", [FileRef("segment-000000.vdlr", "s/segment-000000.vdlr.0011223344556677", 32)]
    )
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.decode(outside.encode(), "r")
    with pytest.raises(ManifestError, match="not JSON"):
        Manifest.decode(b"\x89PNG", "r")
    runs, foreign = find_runs(
        [
            storage.ObjectInfo(k, 1)
            for k in ("a/manifest.vdlm", "a/b/manifest.vdlm", "x", "../manifest.vdlm")
        ]
    )
    assert sorted(runs) == ["a", "a/b"] and foreign == ["x", "../manifest.vdlm"]


def test_the_range_cache_stays_within_its_budget(s3: MotoServer, tmp_path: Path) -> None:
    _write("big", 5_000, every=1)  # 5,000 flushes: blocks while live and one at close
    client = storage.ObstoreClient(URL)
    # A downsampled read fetches the chunks' level-of-detail summaries and the slices a bucket
    # edge falls in (Catalog.pread reads through the mirror), not the chunks.
    lod_cache = RangeCache(budget=64 << 20, min_fetch=1)
    lod_mirror = RunMirror(client, "big", str(tmp_path / "lod"), lod_cache)
    assert lod_mirror.refresh()
    with recorder.RunReader(tmp_path / "lod") as reader:
        assert len(reader.read_scalars("train/loss", max_points=20).steps) <= 20
    data = sum(f.tail - 32 for f in lod_mirror.files.values() if f.tail is not None)
    # (About a fifth of the blocks' data here; reading train/loss's chunks whole is half.)
    assert 0 < lod_cache.statistics().fetched_bytes < data / 3, (lod_cache.statistics(), data)
    lod_mirror.close()
    cache = RangeCache(budget=16 << 10, min_fetch=4 << 10)
    mirror = RunMirror(client, "big", str(tmp_path / "big"), cache)
    assert mirror.refresh()
    assert sum(name.startswith("block-") for name in mirror.files) >= 2, mirror.files
    with recorder.RunReader(tmp_path / "big") as reader:
        for tag in ("train/loss", "train/acc"):
            assert reader.read_scalars(tag).steps.tolist() == list(range(5_000))
    stats = cache.statistics()
    assert stats.fetches > 1 and stats.evictions >= 1, stats
    # Over budget only by the file being read (the others are emptied first).
    largest = max(f.size for f in mirror.files.values())
    assert stats.bytes <= (16 << 10) + largest, stats
    mirror.close()


def test_import_export_and_replay_take_store_urls(
    s3: MotoServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tests.test_interop import write_tb_logs
    from vdl_stream.cli import main

    logged = write_tb_logs(tmp_path / "tb")
    assert main(["import", str(tmp_path / "tb"), "--logdir", "s3://bucket/imported"]) == 0
    assert "imported 2 run(s)" in capsys.readouterr().err
    # Importing a run the bucket has already is refused, naming it.
    assert main(["import", str(tmp_path / "tb"), "--logdir", "s3://bucket/imported"]) == 2
    assert "already exists" in capsys.readouterr().err
    out = tmp_path / "train.csv"
    assert main(["export", "s3://bucket/imported/train", "-o", str(out)]) == 0
    rows = out.read_text().splitlines()
    steps, _, values = logged["train"]
    assert rows[0] == "tag,step,wall_time,value" and len(rows) == 1 + len(steps)
    assert [float(r.split(",")[3]) for r in rows[1:]] == values.tolist()
    assert main(["export", "s3://bucket/imported/none"]) == 2
    assert "s3://bucket/imported/none: not a run" in capsys.readouterr().err
    replay = [sys.executable, "-m", "vdl_stream.cli", "replay", "s3://bucket/imported"]
    done = subprocess.run(
        [*replay, "--speed", "max", "--exit", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "replaying eval, train at http://127.0.0.1:" in done.stdout
    assert "replayed 548 of 548 points and events" in done.stdout


def test_serve_publishes_what_remote_writers_send_and_everything_at_shutdown(
    s3: MotoServer, tmp_path: Path
) -> None:
    server = start_serve(
        URL,  # type: ignore[arg-type]
        *("--cache-dir", str(tmp_path / "serve-cache")),
        *("--head-interval", "2", "--store-cache-mb", "64"),
    )
    try:
        with vdl_stream.attach(url=server.ws_url, run="remote/r", telemetry=False) as writer:
            for i in range(5_000):
                writer.add_scalar("x", float(i), i)
                if i % 10 == 0:
                    writer.flush()
        status, stats = http_get(server.url + "/api/stats")
        assert status == 200 and stats["store"]["runs_published"] == 1, stats
        assert stats["store"]["cache"]["budget"] == 64 << 20  # --store-cache-mb reached the sync
    finally:
        assert stop_serve(server) == 0  # SIGTERM: closes the runs, then publishes them whole
    with storage.mirrored(URL) as tmp:
        assert _contents(tmp / "remote" / "r")["x"][0] == list(range(5_000))


def test_a_run_another_process_writes_in_the_cache_is_left_to_it(
    s3: MotoServer, tmp_path: Path
) -> None:
    """A serve and an attach() on one machine share the cache of a URL: each publishes only the
    runs it holds (or that nobody holds any more: left by a writer that stopped)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, recorder; w = recorder.RunWriter(sys.argv[1]); "
         "w.append_scalars('x', [0], [0.0], [1.0]); w.flush(); print('open', flush=True); "
         "sys.stdin.readline()", str(tmp_path / "local" / "r")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "open\n"
        assert recorder.lock_holders(tmp_path / "local" / "r" / "writer.lock") == {holder.pid}
        sync = storage.StoreSync(storage.ObstoreClient(URL), tmp_path / "local")
        assert sync._local_runs() == []
    finally:
        holder.communicate("\n", timeout=60)
    assert recorder.lock_holders(tmp_path / "local" / "r" / "writer.lock") == set()
    assert sync._local_runs() == ["r"]


def test_serve_store_flags_need_a_store_and_set_the_sync_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for flag in ("--head-interval", "--store-cache-mb"):
        proc = subprocess.run(
            [sys.executable, "-m", "vdl_stream.cli", "serve", "--logdir", str(tmp_path), flag, "3"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert proc.returncode == 2
        assert f"{flag} needs a --logdir in an object store, got {tmp_path}" in proc.stderr
    monkeypatch.setattr(storage, "HEAD_INTERVAL", 2.5)  # what serve sets from its flags
    monkeypatch.setattr(storage, "READ_CACHE_BYTES", 3 << 20)
    sync = storage.StoreSync(None, tmp_path)
    assert sync.head_interval == 2.5 and sync.cache.statistics().budget == 3 << 20


def test_store_sync_arguments_are_checked(tmp_path: Path) -> None:
    for name in ("upload_interval", "list_interval", "head_interval"):
        with pytest.raises(ValueError, match=name):
            storage.StoreSync(None, tmp_path, **{name: 0})
    with pytest.raises(ValueError, match="cache_bytes"):
        storage.StoreSync(None, tmp_path, cache_bytes=-1)


async def test_a_broker_over_the_bucket_fans_out_what_another_machine_publishes(
    s3: MotoServer, tmp_path: Path
) -> None:
    """The writer's machine appends to a run and publishes it; a broker that only shares the
    bucket shows the history as a snapshot, then fans out the appended points live (the head's
    growth arrives by a ranged read of the new bytes)."""
    import msgpack

    from recorder.store import RunPublisher
    from vdl_stream.broker import Broker

    client = storage.ObstoreClient(URL)
    source = tmp_path / "writer" / "r"
    publisher = RunPublisher(client, "r", str(source), head_interval=0.0)

    def write(first: int, last: int) -> None:
        with recorder.RunWriter(source, sync="never") as w:
            steps = np.arange(first, last)
            w.append_scalars("x", steps, 1.7e9 + steps, steps * 0.5)
        publisher.publish(final=True)

    await trio.to_thread.run_sync(write, 0, 10)
    broker = Broker(tmp_path / "reader")
    sync = storage.StoreSync(client, tmp_path / "reader", list_interval=0.1)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(sync.run, broker.wait_closed)
            await nursery.start(partial(broker.follow, 0.05))
            sub = broker.subscribe()
            (frame,) = await broker.snapshot(sub)
            history = msgpack.unpackb(frame)["scalars"][0][1]
            assert np.frombuffer(history, "<f8").tolist() == list(range(10))
            await trio.to_thread.run_sync(write, 10, 15)
            data = msgpack.unpackb(await sub.receive())
            while data["type"] != "data":
                data = msgpack.unpackb(await sub.receive())
            assert np.frombuffer(data["scalars"][0][1], "<f8").tolist() == list(range(10, 15))
            assert sync.statistics().requests["get_range"] >= 1  # the head's new bytes only
            broker.close()


def test_large_sealed_files_are_uploaded_from_the_file(
    s3: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import recorder.store

    monkeypatch.setattr(recorder.store, "STREAM_BYTES", 0)  # every sealed file streamed
    _write("streamed", 3_000, every=2)  # 1,500 flushes: blocks
    manifest = Manifest.decode(storage.ObstoreClient(URL).get("streamed/manifest.vdlm"), "streamed")
    assert any(f.tail is not None for f in manifest.files), manifest  # blocks, from their files
    local = storage.cache_dir(URL) / "streamed"
    with storage.mirrored(URL) as tmp:
        assert _contents(tmp / "streamed") == _contents(local)


def test_a_hung_store_never_stalls_the_writer(s3: MotoServer) -> None:
    """The store accepts connections but answers nothing (its process stopped): requests hang in
    the sync's threads; the writer's flushes never wait for them."""
    writer = vdl_stream.attach(logdir=URL, telemetry=False)
    s3.proc.send_signal(signal.SIGSTOP)
    try:
        slowest, i = 0.0, 0
        until = time.monotonic() + 3.0  # three rounds of the sync (one a second) hang meanwhile
        while i < 3_000 or time.monotonic() < until:
            start = time.perf_counter()
            writer.add_scalar("x", float(i), i)
            if i % 10 == 0:
                assert writer.flush(timeout=10)
            slowest = max(slowest, time.perf_counter() - start)
            i += 1
    finally:
        s3.proc.send_signal(signal.SIGCONT)
    assert slowest < 2.0, slowest
    writer.close()  # the hung requests complete once the store answers; the rest is published
    with storage.mirrored(URL) as tmp:
        assert _contents(tmp / writer.run)["x"][0] == list(range(i))


def _append(run_dir: Path, steps: range) -> None:
    """Append ``steps`` of tag ``x`` to the run in ``run_dir`` with a recorder writer."""
    with recorder.RunWriter(run_dir) as writer:
        s = np.arange(steps.start, steps.stop)
        writer.append_scalars("x", s, s.astype(float), s.astype(float))


def test_a_broker_whose_lease_ran_out_cannot_replace_the_new_owners_manifest(
    s3: MotoServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two hosts with their own disks: the one that takes a run over continues it from the
    bucket and claims its manifest; the one that had it (paused past its lease, then back)
    publishes no more: the bucket keeps the new owner's data."""
    old = storage.StoreSync(storage.ObstoreClient(URL), tmp_path / "a", mirror=False)
    new = storage.StoreSync(storage.ObstoreClient(URL), tmp_path / "b", mirror=False)
    old.prepare_write(tmp_path / "a" / "r")
    _append(tmp_path / "a" / "r", range(0, 100))
    old._publish("r", final=True)
    # Host b takes the run over: its disk has nothing of it, the bucket has steps 0-99.
    new.prepare_write(tmp_path / "b" / "r", taken_over=True)
    assert _contents(tmp_path / "b" / "r")["x"][0] == list(range(100))
    assert read_manifest(new.client, "r").generation == 2  # claimed: a new generation
    # Host a wakes up and goes on as if it still held the run: fenced.
    _append(tmp_path / "a" / "r", range(100, 150))
    with caplog.at_level(logging.WARNING, logger="vdl_stream.storage"):
        old._publish("r", final=True)
    assert "another broker published it since" in caplog.text
    assert old._local_runs() == []  # and it never tries again
    _append(tmp_path / "b" / "r", range(100, 200))
    new._publish("r", final=True)
    with storage.mirrored(URL) as tmp:
        assert _contents(tmp / "r")["x"][0] == list(range(200))  # b's, none of a's 100-149
    assert read_manifest(new.client, "r").generation == 3
    # Taken over again by a, whose disk is behind the bucket now: it starts from the bucket.
    old.prepare_write(tmp_path / "a" / "r", taken_over=True)
    assert _contents(tmp_path / "a" / "r")["x"][0] == list(range(200))
    # And b, taken over from, is fenced in turn; a host that published the newest manifest
    # itself keeps its disk (it may hold more than the bucket: its unpublished head).
    _append(tmp_path / "a" / "r", range(200, 210))
    old._publish("r", final=True)
    old.prepare_write(tmp_path / "a" / "r", taken_over=True)
    assert _contents(tmp_path / "a" / "r")["x"][0] == list(range(210))
