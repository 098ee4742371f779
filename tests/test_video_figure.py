"""add_video (animated GIF image events) and add_figure (matplotlib figures as PNG), on the writer
and both facades: what is recorded, decoded back with Pillow, and the argument checks."""

from __future__ import annotations

import io
import re
from functools import partial

import numpy as np
import pytest
import trio

import recorder
from tests.conftest import http_request
from vdl_stream import LogWriter, SummaryWriter, attach
from vdl_stream.server import run_server

Image = pytest.importorskip("PIL.Image", reason="add_video needs Pillow (the media extra)")


def images(run_dir) -> list[dict]:
    with recorder.RunReader(run_dir) as reader:
        return [
            r.data | {"tag": r.tag, "step": r.step, "wall": r.wall}
            for r in reader.read_records(kind="image")
        ]


def gif_frames(data: bytes) -> tuple[list[np.ndarray], list[int]]:
    """The frames of a GIF as RGB arrays, and their durations in ms."""
    gif = Image.open(io.BytesIO(data))
    frames, durations = [], []
    for i in range(gif.n_frames):
        gif.seek(i)
        frames.append(np.asarray(gif.convert("RGB")))
        durations.append(gif.info["duration"])
    return frames, durations


def colour_video(n: int, t: int, h: int, w: int) -> np.ndarray:
    """(N, T, 3, H, W) uint8 frames of flat colours, different per video and frame."""
    vid = np.zeros((n, t, 3, h, w), np.uint8)
    for i in range(n):
        for j in range(t):
            vid[i, j] = np.array([40 * i + 20, 60 * j + 10, 200 - 30 * i], np.uint8)[:, None, None]
    return vid


def test_writer_add_video_records_a_playable_gif_with_the_batch_tiled(tmp_path):
    vid = colour_video(2, 3, 8, 10)
    with attach(tmp_path, run="v") as w:
        w.add_video("clip", vid, 7, fps=5)
    (event,) = images(tmp_path / "v")
    assert event["format"] == "gif" and event["step"] == 7
    assert (event["width"], event["height"], event["frames"], event["fps"]) == (20, 8, 3, 5.0)
    frames, durations = gif_frames(event["data"])
    assert len(frames) == 3 and durations == [200, 200, 200]
    for j, frame in enumerate(frames):
        assert frame.shape == (8, 20, 3)
        for i in range(2):  # video i sits in column i of the grid
            tile = frame[:, 10 * i : 10 * (i + 1)].astype(int)
            assert np.abs(tile - vid[i, j].transpose(1, 2, 0).astype(int)).max() <= 8


def test_summary_writer_add_video_takes_floats_grey_and_other_axis_orders(tmp_path):
    ramp = np.linspace(0.0, 1.0, 4, dtype=np.float32)  # one grey level per frame
    vid = np.broadcast_to(ramp[:, None, None, None], (4, 6, 5, 1)).copy()  # T, H, W, C
    with SummaryWriter(tmp_path / "sw") as w:
        w.add_video("grey", vid, dataformats="THWC")  # global_step None: step 0, as TensorBoard
        w.add_video("batch", np.zeros((1, 2, 3, 4, 4), np.float64), global_step=3, fps=25)
    grey, batch = sorted(images(tmp_path / "sw"), key=lambda e: e["tag"], reverse=True)
    assert grey["step"] == 0 and (grey["width"], grey["height"], grey["frames"]) == (5, 6, 4)
    frames, durations = gif_frames(grey["data"])
    assert [int(f[0, 0, 0]) for f in frames] == [0, 85, 170, 255] and durations == [250] * 4
    # Pillow merges identical frames into one of their total duration: the timing is the same.
    assert batch["step"] == 3 and sum(gif_frames(batch["data"])[1]) == 80


def test_log_writer_add_video_and_figure_take_millisecond_walltimes(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    del matplotlib
    with LogWriter(tmp_path / "lw") as w:
        w.add_video("clip", colour_video(1, 2, 4, 4), step=1, walltime=1_700_000_000_000)
        w.add_figure("fig", Figure(figsize=(1, 1), dpi=20), step=2, walltime=1_700_000_001_000)
    clip, fig = sorted(images(tmp_path / "lw"), key=lambda e: e["tag"])
    assert clip["wall"] == 1_700_000_000.0 and clip["format"] == "gif"
    assert fig["wall"] == 1_700_000_001.0 and fig["format"] == "png"


@pytest.mark.parametrize(
    ("args", "error", "text"),
    [
        ((np.zeros((2, 3, 4, 4), np.uint8),), ValueError, "must have 5 dimensions, got shape"),
        ((np.zeros((1, 2, 2, 4, 4), np.uint8),), ValueError, "C of 1, 3 or 4 channels"),
        ((np.zeros((1, 0, 3, 4, 4), np.uint8),), ValueError, "from 1 to 10000 frames (T)"),
        ((np.zeros((1, 2, 3, 4, 4), np.int32),), ValueError, "uint8 (0..255) or float (0..1)"),
        ((["a"],), TypeError, "vid_tensor must be an array of numbers"),
        ((np.zeros((1, 2, 3, 4, 4)), 0, 0), ValueError, "fps must be above 0 and at most 100"),
        ((np.zeros((1, 2, 3, 4, 4)), 0, "4"), TypeError, "fps must be a number, got str"),
        ((np.zeros((1, 2, 3, 4, 4)), 0, 4, None, "NCHW"), ValueError, "dataformats must be NTCHW"),
        ((np.zeros((1, 2, 3, 4, 4)), 1.5), TypeError, "step"),
    ],
)
def test_add_video_checks_its_arguments(tmp_path, args, error, text):
    with attach(tmp_path, run="bad") as w:
        with pytest.raises(error, match=re.escape(text)):
            w.add_video("clip", *args) if len(args) > 1 else w.add_video("clip", args[0], 0)
        w.add_scalar("still", 1.0, 0)
    assert images(tmp_path / "bad") == []


def test_add_figure_renders_with_agg_and_closes_pyplot_figures(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")  # what a machine without a display gets anyway
    import matplotlib.pyplot as plt

    closed = plt.figure(figsize=(2, 1), dpi=50, facecolor="red")
    plt.plot([0, 1], [1, 0])
    kept = plt.figure(figsize=(2, 1), dpi=50, facecolor="blue")
    with SummaryWriter(tmp_path / "figs") as w:
        w.add_figure("closed", closed, global_step=1)
        w.add_figure("kept", kept, global_step=2, close=False)
        w.add_figure("both", [closed, kept], global_step=3, close=False)
    assert not plt.fignum_exists(closed.number) and plt.fignum_exists(kept.number)
    plt.close(kept)
    events = {e["tag"]: e for e in images(tmp_path / "figs")}
    assert (events["closed"]["width"], events["closed"]["height"]) == (100, 50)
    assert (events["both"]["width"], events["both"]["height"]) == (200, 50)
    red = np.asarray(Image.open(io.BytesIO(events["closed"]["data"])).convert("RGB"))
    both = np.asarray(Image.open(io.BytesIO(events["both"]["data"])).convert("RGB"))
    assert tuple(red[0, 0]) == (255, 0, 0)
    assert tuple(both[0, 0]) == (255, 0, 0) and tuple(both[0, 199]) == (0, 0, 255)


def test_add_figure_checks_its_arguments(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    with attach(tmp_path, run="bad") as w:
        with pytest.raises(TypeError, match="figure must be a matplotlib Figure or a list"):
            w.add_figure("fig", np.zeros((4, 4)), 0)
        with pytest.raises(ValueError, match="non-empty list"):
            w.add_figure("fig", [], 0)
        with pytest.raises(TypeError, match="close must be a bool, got str"):
            w.add_figure("fig", Figure(), 0, close="yes")
        with pytest.raises(ValueError, match="one size in pixels, got 20x20, 40x20"):
            w.add_figure("fig", [Figure((1, 1), dpi=20), Figure((2, 1), dpi=20)], 0)
    assert images(tmp_path / "bad") == []


@pytest.fixture
def video_run(tmp_path):
    """A log directory with the run ``r`` holding one video ``clip`` (written outside trio)."""
    with attach(tmp_path, run="r") as w:
        w.add_video("clip", colour_video(1, 2, 4, 4), 0)
    return tmp_path


async def test_the_dashboard_serves_a_video_as_a_gif(nursery, video_run):
    url = await nursery.start(partial(run_server, video_run, "127.0.0.1", 0))
    with trio.fail_after(20):
        _, kind, body = await trio.to_thread.run_sync(
            http_request, url + "/api/blob?run=r&kind=image&tag=clip&index=0"
        )
    assert kind == "image/gif" and body.startswith(b"GIF89a")


def test_the_page_plays_a_video_and_says_how_long_it_is(serve_process, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    try:
        page.goto(serve_process.url + "/")
        page.wait_for_function("() => window.vdl && window.vdl.connected", timeout=15_000)
        with attach(url=serve_process.ws_url, run="video", telemetry=False) as writer:
            writer.add_video("clip", colour_video(2, 3, 16, 16), 4, fps=5)
        page.locator('.tabs button[data-view="images"]').click()
        card = page.locator('.image-card[data-image-tag="clip"]')
        readout = card.locator(".readout").filter(has_text="frames at")
        readout.wait_for(timeout=15_000)
        assert "3 frames at 5 fps" in readout.inner_text()
        page.wait_for_function(
            "() => { const img = document.querySelector('.image-card[data-image-tag=clip] img');"
            " return img && img.complete && img.naturalWidth > 0; }",
            timeout=15_000,
        )
        # The <img> decoded the GIF: an image of the grid's size (2 videos of 16x16 side by side).
        size = page.evaluate(
            "() => { const img = document.querySelector('.image-card[data-image-tag=clip] img');"
            " return [img.naturalWidth, img.naturalHeight]; }"
        )
        assert size == [32, 16]
    finally:
        page.close()
