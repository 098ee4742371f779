"""Embeddings (issue 15): add_embedding on the writer and both facades, the ``embedding`` event's
checks, its light form in browser frames, and /api/blob serving its parts."""

from __future__ import annotations

import json
import re
import zlib
from functools import partial

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import recorder
from tests.conftest import http_request
from vdl_stream import LogWriter, SummaryWriter, attach, codec, embeddings
from vdl_stream.server import run_server


def embedding_records(run_dir) -> list[dict]:
    with recorder.RunReader(run_dir) as reader:
        return [
            r.data | {"tag": r.tag, "step": r.step, "wall": r.wall}
            for r in reader.read_records(kind="embedding")
        ]


def matrix(event: dict) -> np.ndarray:
    return np.frombuffer(event["data"], "<f4").reshape(event["shape"])


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def png_pixels(data: bytes) -> np.ndarray:
    """Decode the PNGs that summaries.encode_png writes (one IDAT, filter Up on every row)."""
    w, h = png_size(data)
    channels = {0: 1, 2: 3, 6: 4}[data[25]]
    idat = data.index(b"IDAT")
    length = int.from_bytes(data[idat - 4 : idat], "big")
    raw = np.frombuffer(zlib.decompress(data[idat + 4 : idat + 4 + length]), np.uint8)
    rows = raw.reshape(h, 1 + w * channels)[:, 1:]
    return np.cumsum(rows, axis=0, dtype=np.uint8).reshape(h, w, channels)


def test_writer_add_embedding_records_the_matrix_labels_and_sprite(tmp_path):
    rng = np.random.default_rng(1)
    mat = rng.normal(size=(10, 5))
    thumbs = np.zeros((10, 3, 4, 6), np.uint8)
    for i in range(10):
        thumbs[i] = 20 * i
    with attach(tmp_path, run="e") as w:
        w.add_embedding(mat, [f"p{i}" for i in range(10)], thumbs, 3, "feat")
    (event,) = embedding_records(tmp_path / "e")
    assert (event["tag"], event["step"], event["shape"]) == ("feat", 3, [10, 5])
    np.testing.assert_array_equal(matrix(event), mat.astype(np.float32))
    assert event["metadata_header"] == ["label"]
    assert event["metadata"] == [[f"p{i}" for i in range(10)]]
    # 10 thumbnails of 6x4 in ceil(sqrt(10)) = 4 columns, 3 rows: row-major, as TensorBoard.
    assert event["thumbnail"] == [4, 6] and png_size(event["sprite"]) == (24, 12)
    pixels = png_pixels(event["sprite"])
    for i in range(10):
        r, c = divmod(i, 4)
        assert (pixels[4 * r : 4 * r + 4, 6 * c : 6 * c + 6] == 20 * i).all()
    assert (pixels[8:, 12:] == 0).all()  # the unused cells of the last row


def test_summary_writer_takes_tensorboardx_names_rows_and_float_images(tmp_path):
    mat = np.arange(12, dtype=np.float64).reshape(4, 3)
    rows = [["a", 1], ["b", 2], ["a", 3], ["c", 4]]
    with SummaryWriter(tmp_path / "sw") as w:
        w.add_embedding(mat, metadata=rows, metadata_header=["class", "id"], tag="t")
        w.add_embedding(mat, label_img=np.full((4, 1, 2, 2), 0.5), global_step=9)
    first, second = embedding_records(tmp_path / "sw")
    assert first["step"] == 0 and first["metadata_header"] == ["class", "id"]
    assert first["metadata"] == [["a", "b", "a", "c"], ["1", "2", "3", "4"]]
    assert first["sprite"] is None and first["thumbnail"] is None
    assert second["tag"] == "default" and second["step"] == 9 and second["metadata"] is None
    assert (png_pixels(second["sprite"])[:2, :2] == 128).all()  # 0.5 of 255, rounded


def test_log_writer_add_embeddings_takes_visualdl_names_old_and_new(tmp_path):
    hot = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    with LogWriter(tmp_path / "vdl") as w:
        w.add_embeddings(tag="old", labels=["x", "y"], hot_vectors=hot, walltime=1_700_000_000_000)
        w.add_embeddings(
            "new",
            mat=np.array(hot),
            metadata=[["x", "1"], ["y", "2"]],
            metadata_header=["name", "n"],
        )
        with pytest.raises(TypeError, match="give mat or its older name hot_vectors, not both"):
            w.add_embeddings("both", mat=hot, hot_vectors=hot)
        with pytest.raises(TypeError, match="needs mat"):
            w.add_embeddings("none", labels=["x"])
        with pytest.raises(TypeError, match=r"positional order \(tag, labels, hot_vectors\)"):
            w.add_embeddings("swapped", ["x", "y"], hot)  # VisualDL 2.0's order
    old, new = embedding_records(tmp_path / "vdl")
    assert old["wall"] == 1_700_000_000.0 and old["step"] == 0 and old["metadata"] == [["x", "y"]]
    assert new["metadata_header"] == ["name", "n"] and new["metadata"] == [["x", "y"], ["1", "2"]]


BAD = [
    (
        dict(mat=np.zeros(5)),
        ValueError,
        "mat must be 2-D (N points x D dimensions), got shape (5,)",
    ),
    (dict(mat=np.zeros((0, 3))), ValueError, "mat must hold at least one point"),
    (dict(mat="abc"), TypeError, "mat must be an array of numbers"),
    (
        dict(mat=np.array([[1.0, 2.0], [3.0, np.nan]])),
        ValueError,
        "mat must hold finite float32 values, got NaN (nan) at row 1, column 1 of shape (2, 2)",
    ),
    (dict(mat=np.array([[np.inf, 0.0]])), ValueError, "got Inf (inf) at row 0, column 0"),
    (dict(mat=np.array([[1e300]])), ValueError, "got beyond float32 (1e+300)"),
    (
        dict(mat=np.zeros((3, 2)), metadata=["a", "b"]),
        ValueError,
        "metadata must have one entry per point of mat (3), got 2",
    ),
    (dict(mat=np.zeros((1, 2)), metadata="ab"), TypeError, "metadata must be a list of labels"),
    (
        dict(mat=np.zeros((2, 2)), metadata=[["a", "b"], ["c"]], metadata_header=["x", "y"]),
        ValueError,
        "metadata[1] must be a row of 2 labels (one per metadata_header name), got 1 labels",
    ),
    (
        dict(mat=np.zeros((1, 2)), metadata=[["a", "b"]], metadata_header=["x", "x"]),
        ValueError,
        "metadata_header must not repeat a name",
    ),
    (
        dict(mat=np.zeros((1, 2)), metadata_header=["x"]),
        ValueError,
        "metadata_header needs metadata",
    ),
    (
        dict(mat=np.zeros((2, 2)), label_img=np.zeros((3, 3, 4, 4))),
        ValueError,
        "label_img must have one image per point of mat (2), got shape (3, 3, 4, 4)",
    ),
    (
        dict(mat=np.zeros((2, 2)), label_img=np.zeros((2, 2, 4, 4))),
        ValueError,
        "label_img must be (N, C, H, W) with C of 1, 3 or 4 (or (N, H, W)), got shape (2, 2, 4, 4)",
    ),
    (
        dict(mat=np.zeros((4, 2)), label_img=np.zeros((4, 1, 5000, 10), np.uint8)),
        ValueError,
        "label_img tiles into a 20x10000 sprite, over 8192 pixels a side",
    ),
    (dict(mat=np.zeros((1, 2)), tag=""), ValueError, "tag must be a non-empty str"),
    (dict(mat=np.zeros((1, 2)), global_step="x"), TypeError, "global_step"),
    (
        dict(mat=np.zeros((1, (1 << 22) + 1))),
        ValueError,
        "mat must have at most 1000000 points and 16777216 bytes as float32",
    ),
]


@pytest.mark.parametrize(("args", "error", "text"), BAD)
def test_add_embedding_names_the_bad_argument_and_records_nothing(tmp_path, args, error, text):
    with attach(tmp_path, run="bad") as w, pytest.raises(error, match=re.escape(text)):
        w.add_embedding(**args)
    assert embedding_records(tmp_path / "bad") == []


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 40),
    d=st.integers(1, 9),
    labels=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_an_embedding_event_round_trips_the_wire_and_its_light_form_is_small(n, d, labels, seed):
    rng = np.random.default_rng(seed)
    mat = rng.normal(scale=10.0 ** rng.integers(-3, 4), size=(n, d)).astype(np.float32)
    meta = [str(v) for v in rng.integers(0, 5, n)] if labels else None
    event = embeddings.embedding_event(mat, meta, None, 2, "e", None, 1.5)
    batch = codec.Batch("w", 1, "r", [], [event])
    back = codec.decode_batch(codec.decode_message(codec.encode_batch(batch))).events[0]
    np.testing.assert_array_equal(matrix(back), mat)
    assert back["metadata"] == ([meta] if labels else None)
    frame = msgpack.unpackb(codec.encode_live("data", 1, "r", [], [event]))
    (light,) = frame["events"]
    assert "data" not in light and "metadata" not in light and "sprite" not in light
    assert light["data_bytes"] == 4 * n * d and light["shape"] == [n, d]


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"shape": [2, 0]}, "embedding shape must be [N, D]"),
        ({"data": b"\0" * 12}, "embedding data must be 16 bytes of float32"),
        ({"metadata": [["a"]]}, "one array of N str per metadata_header name"),
        ({"metadata": None}, "metadata and metadata_header go together"),
        ({"sprite": b"GIF89a", "thumbnail": [1, 1]}, "sprite must be PNG bin data"),
        ({"sprite": None, "thumbnail": [1, 1]}, "sprite and thumbnail go together"),
    ],
)
def test_the_codec_refuses_a_broken_embedding_event(change, text):
    event = embeddings.embedding_event(np.zeros((2, 2)), ["a", "b"], None, 0, "e", None, 1.0)
    with pytest.raises(codec.ProtocolError, match=re.escape(text)):
        codec.check_event(event | change)


@pytest.fixture
def embedding_run(tmp_path):
    """A log directory with run ``r``: tag ``feat`` at steps 1 and 2, with labels and a sprite."""
    with attach(tmp_path, run="r") as w:
        for step in (1, 2):
            mat = np.full((3, 2), float(step))
            w.add_embedding(mat, ["a", "b", "c"], np.zeros((3, 1, 2, 2)), step, "feat")
    return tmp_path


async def test_the_server_serves_an_embeddings_parts(nursery, embedding_run):
    url = await nursery.start(partial(run_server, embedding_run, "127.0.0.1", 0))
    base = url + "/api/blob?run=r&kind=embedding&tag=feat"

    def get(query: str) -> tuple[int, str, bytes]:
        return http_request(base + query)

    with trio.fail_after(30):
        status, kind, body = await trio.to_thread.run_sync(get, "&step=1")
        assert (status, kind) == (200, "application/octet-stream")
        assert np.frombuffer(body, "<f4").tolist() == [1.0] * 6
        status, _, body = await trio.to_thread.run_sync(get, "&index=-1&part=matrix")
        assert status == 200 and np.frombuffer(body, "<f4").tolist() == [2.0] * 6
        status, kind, body = await trio.to_thread.run_sync(get, "&step=2&part=metadata")
        assert kind.startswith("application/json")
        assert json.loads(body) == {
            "shape": [3, 2],
            "header": ["label"],
            "columns": [["a", "b", "c"]],
            "thumbnail": [2, 2],
        }
        status, kind, body = await trio.to_thread.run_sync(get, "&step=2&part=sprite")
        assert kind == "image/png" and png_size(body) == (4, 4)
        status, _, body = await trio.to_thread.run_sync(get, "&step=5")
        assert status == 404 and b"no embedding of that step" in body
        status, _, body = await trio.to_thread.run_sync(get, "&part=pixels")
        assert status == 400 and b"part must be one of" in body
        status, _, body = await trio.to_thread.run_sync(
            http_request, url + "/api/events?run=r&kind=embedding&tag=feat"
        )
        events = json.loads(body)["events"]
        assert [e["data_bytes"] for e in events] == [24, 24] and events[0]["sprite_bytes"] > 0


def clustered(n: int, d: int, classes: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """``n`` points in ``d`` dimensions around ``classes`` well-separated centres, and their class."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=6.0, size=(classes, d))
    cls = np.arange(n) % classes
    return centres[cls] + rng.normal(size=(n, d)), [f"class{c}" for c in cls]


def test_the_page_projects_an_embedding_and_shows_a_label_on_hover(serve_process, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function("() => window.vdl && window.vdl.connected", timeout=15_000)
        mat, labels = clustered(600, 32, 4)
        thumbs = np.zeros((600, 3, 8, 8), np.uint8)
        thumbs[:, 0] = (np.arange(600) % 4 * 60)[:, None, None]
        rows = [[c, f"item{i}"] for i, c in enumerate(labels)]
        with attach(url=serve_process.ws_url, run="emb", telemetry=False) as writer:
            writer.add_embedding(mat, rows, thumbs, 3, "features", ["class", "name"])
        page.locator('.tabs button[data-view="embeddings"]').click()
        page.wait_for_function(
            "() => { const s = vdl.embeddings.state(); return s.shown && s.n === 600; }",
            timeout=20_000,
        )
        state = page.evaluate("vdl.embeddings.state()")
        assert (state["run"], state["tag"], state["step"], state["d"]) == ("emb", "features", 3, 32)
        assert "PCA of 600 × 32" in page.locator(".embed-status").inner_text()
        legend = page.locator(".embed-legend").inner_text()
        assert all(f"class{c}" in legend for c in range(4))  # coloured by the class column
        page.screenshot(path=str(serve_process.logdir.parent / "embeddings-pca.png"))

        # The non-linear method: positions stream in from the worker until the layout is done.
        page.locator("select.embed-method").select_option("umap")
        page.wait_for_function(
            "() => { const s = vdl.embeddings.state(); return s.method === 'umap' && s.done; }",
            timeout=60_000,
        )
        assert "UMAP of 600 points" in page.locator(".embed-status").inner_text()

        # Hover point 17: its labels and its thumbnail show in the card.
        point = page.evaluate("vdl.embeddings.pointOnPage(17)")
        page.mouse.move(point["x"], point["y"])
        page.wait_for_function("() => vdl.embeddings.state().tip !== null", timeout=10_000)
        hovered = page.evaluate("vdl.embeddings.state().hover")
        tip = page.locator(".embed-tip").inner_text()
        assert f"name: item{hovered}" in tip and f"class: {labels[hovered]}" in tip
        assert page.locator(".embed-tip canvas.embed-thumb").count() == 1

        # Search by label: only the matches stay bright.
        page.locator("input.embed-search").fill("item17")
        page.wait_for_function("() => vdl.embeddings.state().matches !== null", timeout=5_000)
        # item17, item170..item179: 11 labels contain it
        assert page.evaluate("vdl.embeddings.state().matches") == 11
        assert "11 matches" in page.locator(".embed-status").inner_text()
        page.screenshot(path=str(serve_process.logdir.parent / "embeddings-umap.png"))

        # Every string of the view switches language.
        page.evaluate("vdl.setLanguage('zh')")
        assert "11 个匹配" in page.locator(".embed-status").inner_text()
        assert (
            page.locator("select.embed-method option[value=umap]").inner_text() == "UMAP（非线性）"
        )
        assert page.locator('.tabs button[data-view="embeddings"]').inner_text() == "高维嵌入"
        page.evaluate("vdl.setLanguage('en')")
        assert errors == []
    finally:
        page.close()


@pytest.fixture
def replay_run(tmp_path):
    """Run ``r``: the scalar ``loss`` at steps 0..4, then an embedding ``feat`` at step 4."""
    with attach(tmp_path, run="r") as w:
        for step in range(5):
            w.add_scalar("loss", 1.0 / (step + 1), step, walltime=1_700_000_000.0 + step)
        w.add_embedding(
            np.eye(3), ["a", "b", "c"], global_step=4, tag="feat", walltime=1_700_000_004.5
        )
    return tmp_path / "r"


async def test_a_replay_serves_the_embedding_once_the_replay_has_reached_it(replay_run):
    from vdl_stream.replay import Replayer, RunTimeline, serve_replay

    with recorder.RunReader(replay_run) as reader:
        timeline = RunTimeline("r", list(reader.iter_records()), str(replay_run))
    replayer = Replayer([timeline], start_paused=True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replayer.run)
            url = await nursery.start(serve_replay, replayer, "127.0.0.1", 0)
            blob = url + "/api/blob?run=r&kind=embedding&tag=feat&step=4"
            status, _, _ = await trio.to_thread.run_sync(http_request, blob)
            assert status == 404  # the replay has not reached it yet
            await trio.to_thread.run_sync(
                lambda: http_post(url + "/api/replay", {"action": "seek", "step": 10})
            )
            status, _, body = await trio.to_thread.run_sync(http_request, blob)
            assert (
                status == 200 and np.frombuffer(body, "<f4").tolist() == np.eye(3).ravel().tolist()
            )
            replayer.source.close()
            nursery.cancel_scope.cancel()


def http_post(url: str, body: dict) -> int:
    import urllib.request

    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status
