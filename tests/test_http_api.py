"""The HTTP API over a recorded run, and tag-pattern subscriptions on /ws/live."""

from __future__ import annotations

import json
import math
import time
import zlib
from functools import partial

import msgpack
import numpy as np
import pytest
import trio
from trio_websocket import open_websocket_url

import recorder
from tests.conftest import http_get, http_request
from vdl_stream import attach, codec
from vdl_stream.codec import Batch, ScalarColumns
from vdl_stream.server import run_server


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("logs")
    with attach(logdir, run="r", telemetry_interval=0.1) as w:
        for step in range(1000):
            w.add_scalar("train/loss", 1.0 / (step + 1), step)
        w.add_scalar("train/loss", math.nan, 1000)
        w.add_histogram("weights", np.arange(100.0), 5, buckets=4)
        w.add_image("sample", np.zeros((4, 6, 3), np.uint8), 5)
        w.add_text("notes", "<b>not bold</b>", 5)
        w.add_hparams({"lr": 0.1, "decay": math.inf}, {"best": math.nan})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until a few telemetry samples are on disk
            w.flush()
            tags = recorder.RunReader(logdir / "r").tags()  # telemetry: "@telemetry/" scalars
            if max((i.count for t, i in tags.items() if t.endswith("/ram/used")), default=0) >= 3:
                break
            time.sleep(0.05)
    return logdir


async def api(nursery, logdir):
    url = await nursery.start(partial(run_server, logdir, "127.0.0.1", 0))
    return lambda path: trio.to_thread.run_sync(http_get, url + path)


async def test_runs_tags_and_downsampled_scalars(nursery, recorded):
    get = await api(nursery, recorded)
    with trio.fail_after(20):
        status, body = await get("/api/runs")
        assert status == 200 and [r["name"] for r in body["runs"]] == ["r"]
        status, tags = await get("/api/tags?run=r")
        assert status == 200
        assert tags["tags"]["train/loss"]["kind"] == "scalars"
        assert tags["tags"]["train/loss"]["count"] == 1001
        assert tags["tags"]["weights"]["kind"] == "histogram"
        status, full = await get("/api/scalars?run=r&tag=train/loss")
        assert full["steps"] == list(range(1001))
        assert full["values"][-1] is None  # NaN travels as null in JSON
        status, part = await get("/api/scalars?run=r&tag=train/loss&start=10&end=19")
        assert part["steps"] == list(range(10, 20))
        status, small = await get("/api/scalars?run=r&tag=train/loss&max_points=50")
        assert len(small["steps"]) <= 50 and small["steps"][0] == 0 and small["steps"][-1] == 1000
        assert (await get("/api/scalars?run=r&tag=train/loss&max_points=x"))[0] == 400
        assert (await get("/api/scalars?run=nope&tag=x"))[0] == 404


async def test_events_blobs_and_telemetry(nursery, recorded):
    get = await api(nursery, recorded)
    with trio.fail_after(20):
        status, hist = await get("/api/events?run=r&kind=histogram&tag=weights")
        (event,) = hist["events"]
        assert status == 200 and event["step"] == 5
        assert event["counts"] == [25.0, 25.0, 25.0, 25.0]
        status, hparams = await get("/api/events?run=r&kind=hparams")
        (event,) = hparams["events"]  # non-finite numbers at any depth travel as null
        assert status == 200 and event["hparams"] == {"lr": 0.1, "decay": None}
        assert event["metric_values"] == {"best": None}, event
        status, text = await get("/api/events?run=r&kind=text")
        assert text["events"][0]["text"] == "<b>not bold</b>"
        status, images = await get("/api/events?run=r&kind=image&tag=sample")
        assert images["events"][0]["width"] == 6 and images["events"][0]["data_bytes"] > 0
        status, telemetry = await get("/api/telemetry?run=r")
        cpu = [k for k in telemetry["series"] if k.endswith("/ram/used")]
        assert status == 200 and cpu and len(telemetry["series"][cpu[0]]["values"]) >= 2
        assert (await get("/api/events?run=r&kind=bogus"))[0] == 404


async def test_blob_serves_the_png(nursery, recorded):
    url = await nursery.start(partial(run_server, recorded, "127.0.0.1", 0))

    with trio.fail_after(20):
        _, kind, body = await trio.to_thread.run_sync(
            http_request, url + "/api/blob?run=r&kind=image&tag=sample&index=0"
        )
    assert kind == "image/png" and body.startswith(b"\x89PNG\r\n\x1a\n")


async def test_tag_patterns_filter_snapshots_and_live_data(nursery, tmp_path):
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
    ws = "ws" + url.removeprefix("http")

    def cols(tag: str, step: int) -> ScalarColumns:
        return ScalarColumns(tag, np.array([step]), np.array([1.7e9]), np.array([1.0]))

    with trio.fail_after(30):
        async with open_websocket_url(ws + "/ws/ingest") as writer:
            await writer.send_message(
                codec.encode_batch(Batch("w", 1, "r", [cols("train/loss", 0), cols("eval/acc", 0)]))
            )
            await writer.get_message()
            async with open_websocket_url(ws + "/ws/live") as live:
                await live.send_message(
                    codec.encode_message({"type": "subscribe", "runs": None, "tags": "eval/*"})
                )
                seen = []
                while not seen or seen[-1]["type"] != "snapshot":
                    seen.append(msgpack.unpackb(await live.get_message()))
                assert [c[0] for c in seen[-1]["scalars"]] == ["eval/acc"]
                await writer.send_message(
                    codec.encode_batch(Batch("w", 2, "r", [cols("train/loss", 1)]))
                )
                await writer.send_message(
                    codec.encode_batch(
                        Batch("w", 3, "r", [cols("eval/acc", 1), cols("train/loss", 2)])
                    )
                )
                data = msgpack.unpackb(await live.get_message())
                while data["type"] in ("synced", "summaries"):  # run summaries, not tag data
                    data = msgpack.unpackb(await live.get_message())
                assert data["type"] == "data" and [c[0] for c in data["scalars"]] == ["eval/acc"]
                await live.send_message(
                    codec.encode_message({"type": "subscribe", "tags": "x" * 201})
                )
                with pytest.raises(Exception, match="at most 200 characters"):
                    while True:
                        await live.get_message()


async def test_export_as_csv_and_json(nursery, recorded):
    url = await nursery.start(partial(run_server, recorded, "127.0.0.1", 0))

    def fetch(path: str) -> tuple[int, str, str]:
        status, kind, body = http_request(url + path)
        return status, kind, body.decode()

    with trio.fail_after(30):
        status, kind, csv_text = await trio.to_thread.run_sync(fetch, "/api/export?run=r&tag=loss")
        assert status == 200 and kind.startswith("text/csv")
        lines = csv_text.splitlines()
        assert lines[0] == "tag,step,wall_time,value"
        assert len(lines) == 1 + 1001 and lines[1].startswith("train/loss,0,")
        status, kind, json_text = await trio.to_thread.run_sync(
            fetch, "/api/export?run=r&format=json&tag=loss"
        )
        assert status == 200 and len(json.loads(json_text)["train/loss"]) == 1001
        assert (await trio.to_thread.run_sync(fetch, "/api/export?run=r&format=xml"))[0] == 400
        assert (await trio.to_thread.run_sync(fetch, "/api/export?run=r&tag=("))[0] == 400
        assert (await trio.to_thread.run_sync(fetch, "/api/export?run=nope"))[0] == 404


def test_the_servers_deflate_is_level_one_and_a_standard_client_inflates_it():
    """Served WebSockets compress with ``QuickDeflate`` (zlib level 1); a peer using wsproto's own
    permessage-deflate reads every byte back, and the frame is smaller than its payload."""
    from wsproto import ConnectionType
    from wsproto.connection import Connection
    from wsproto.events import BytesMessage
    from wsproto.extensions import PerMessageDeflate

    from vdl_stream.server import QuickDeflate

    payload = np.arange(120_000, dtype="<f8").tobytes()  # a column of steps: 960 kB
    server_ext, client_ext = QuickDeflate(), PerMessageDeflate()
    client_ext.finalize(server_ext.accept(client_ext.offer()))
    server = Connection(ConnectionType.SERVER, [server_ext])
    client = Connection(ConnectionType.CLIENT, [client_ext])
    level_one = zlib.compressobj(1, zlib.DEFLATED, -15)
    expected = (level_one.compress(payload) + level_one.flush(zlib.Z_SYNC_FLUSH))[:-4]
    received = []
    for _ in range(2):  # the second message reuses the compressor made for the first
        wire = server.send(BytesMessage(data=payload))
        assert len(wire) < len(payload) // 2
        assert wire[0] & 0x40  # RSV1: the frame is compressed
        if not received:  # the first message's body is what zlib makes at level 1
            assert wire.endswith(expected)
        client.receive_data(wire)
        received += [e.data for e in client.events() if isinstance(e, BytesMessage)]
    assert received == [payload, payload]
