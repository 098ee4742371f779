"""Videos and matplotlib figures as ``image`` events: ``add_video`` (animated GIF) and ``add_figure``.

Both follow tensorboardX: a video is an ``image`` event whose ``data`` is an animated GIF (the
page's ``<img>`` plays it, offline, as TensorBoard does), and a figure is rendered by matplotlib's
Agg renderer (no display needed) into a PNG ``image`` event. GIF encoding uses Pillow and figures
matplotlib; both are imported only when called (the ``media`` extra installs them).
"""

from __future__ import annotations

import io
import sys
from typing import Any

import numpy as np

from . import codec, summaries

#: Axes of a video tensor: tensorboardX's default order.
VIDEO_FORMAT = "NTCHW"
#: The most frames a video may hold.
MAX_VIDEO_FRAMES = 10_000
#: GIF frame delays are in hundredths of a second: faster than this cannot be shown.
MAX_FPS = 100.0


def _check_fps(fps: object) -> float:
    if isinstance(fps, bool) or not isinstance(fps, (int, float, np.integer, np.floating)):
        raise TypeError(f"fps must be a number, got {type(fps).__name__} {fps!r:.40}")
    value = float(fps)
    if not 0 < value <= MAX_FPS:
        raise ValueError(f"fps must be above 0 and at most {MAX_FPS:g}, got {fps!r}")
    return value


def video_frames(vid_tensor: Any, dataformats: object = VIDEO_FORMAT) -> np.ndarray:
    """Return a video tensor as ``(T, H, W, C)`` uint8 frames; a batch (N) tiled into a grid.

    Args:
        vid_tensor: uint8 (0..255) or float (0..1, clipped; NaN is 0) array or tensor with C of
            1 (grey), 3 (RGB) or 4 (RGBA).
        dataformats: the order of its axes: ``NTCHW`` (tensorboardX's default) or any order of
            those letters, or without ``N`` for a single video (``TCHW``, ``THWC``).

    Raises:
        TypeError, ValueError: a bad argument, named in the message with the shape received.
    """
    fmt = dataformats.upper() if isinstance(dataformats, str) else None
    if fmt is None or "".join(sorted(fmt)) not in ("CHNTW", "CHTW"):
        raise ValueError(
            f"dataformats must be NTCHW or TCHW (letters in any order), got {dataformats!r:.40}"
        )
    arr = summaries.as_numpy(vid_tensor, "vid_tensor")
    if arr.ndim != len(fmt):
        raise ValueError(
            f"vid_tensor with dataformats={fmt!r} must have {len(fmt)} dimensions, "
            f"got shape {arr.shape}"
        )
    if "N" not in fmt:
        arr, fmt = arr[None], "N" + fmt
    arr = arr.transpose([fmt.index(c) for c in "TNCHW"])
    if not 0 < arr.shape[0] <= MAX_VIDEO_FRAMES:
        raise ValueError(
            f"vid_tensor must have from 1 to {MAX_VIDEO_FRAMES} frames (T), got shape "
            f"{summaries.as_numpy(vid_tensor, 'vid_tensor').shape}"
        )
    if arr.size > summaries.MAX_IMAGE_VALUES:
        raise ValueError(
            f"vid_tensor must have at most {summaries.MAX_IMAGE_VALUES} values, got shape "
            f"{summaries.as_numpy(vid_tensor, 'vid_tensor').shape}"
        )
    try:
        frames = [summaries._image_hwc(frame, "NCHW") for frame in arr]
    except ValueError as exc:
        # The image checks name "img" and NCHW: say it in the video's own terms.
        raise ValueError(
            str(exc).replace("img with dataformats='NCHW'", f"vid_tensor with dataformats={fmt!r}")
        ) from None
    return np.stack(frames)


def encode_gif(frames: np.ndarray, fps: float) -> bytes:
    """Encode ``(T, H, W, C)`` uint8 frames as an endlessly looping animated GIF (Pillow).

    Each frame gets its own 256-colour palette; alpha is dropped (GIF has one transparent colour
    at most). Raises ``ImportError`` when Pillow is missing.
    """
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "add_video encodes GIFs with Pillow: pip install Pillow (or 'vdl-stream[media]')"
        ) from None
    images = []
    for frame in frames:
        if frame.shape[2] == 1:
            images.append(Image.fromarray(frame[:, :, 0], "L"))
        else:
            rgb = Image.fromarray(np.ascontiguousarray(frame[:, :, :3]), "RGB")
            images.append(rgb.quantize(256, method=Image.Quantize.FASTOCTREE))
    out = io.BytesIO()
    images[0].save(
        out,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=max(10, round(1000.0 / fps)),
        loop=0,
        optimize=False,
    )
    return out.getvalue()


def video_event(
    tag: str,
    vid_tensor: Any,
    step: int,
    wall: float,
    fps: float = 4,
    dataformats: str = VIDEO_FORMAT,
) -> dict[str, Any]:
    """Build an ``image`` event holding ``vid_tensor`` as an animated GIF at ``fps`` frames/s.

    Returns the event with ``format`` ``"gif"``, ``data``, ``width``, ``height``, ``frames`` (T)
    and ``fps``. Raises TypeError/ValueError for a bad argument (see :func:`video_frames`),
    ImportError without Pillow.
    """
    codec.check_tag(tag)
    step = summaries.to_step(step)
    wall = summaries.check_wall(wall, "walltime")
    fps = _check_fps(fps)
    frames = video_frames(vid_tensor, dataformats)
    data = encode_gif(frames, fps)
    if len(data) > summaries.MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"vid_tensor encodes to {len(data)} bytes of GIF, over the limit of "
            f"{summaries.MAX_PAYLOAD_BYTES}"
        )
    t, h, w, _ = frames.shape
    return {
        "kind": "image",
        "tag": tag,
        "step": step,
        "wall": wall,
        "format": "gif",
        "data": data,
        "width": int(w),
        "height": int(h),
        "frames": int(t),
        "fps": fps,
    }


def figure_pixels(figure: Any) -> np.ndarray:
    """Render a matplotlib figure with the Agg renderer; return its ``(H, W, 4)`` RGBA pixels.

    Works whatever backend pyplot uses (and without a display): the figure is drawn on an Agg
    canvas that is swapped in for the call only, so an interactive window keeps its own canvas.

    Raises:
        TypeError: ``figure`` is not a matplotlib figure.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "add_figure needs matplotlib: pip install matplotlib (or 'vdl-stream[media]')"
        ) from None
    if not isinstance(figure, Figure):
        raise TypeError(
            f"figure must be a matplotlib Figure or a list of them, got {type(figure).__name__}"
        )
    original = figure.canvas
    try:
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        return np.array(canvas.buffer_rgba(), dtype=np.uint8)
    finally:
        figure.set_canvas(original)


def figure_event(
    tag: str, figure: Any, step: int, wall: float, close: bool = True
) -> dict[str, Any]:
    """Build a PNG ``image`` event of a matplotlib figure, or of a list of figures tiled in a grid.

    Figures of a list must have the same size in pixels. With ``close`` each figure is closed
    through pyplot afterwards (when pyplot is in use), freeing its memory, as tensorboardX does.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    if type(close) is not bool:
        raise TypeError(f"close must be a bool, got {type(close).__name__} {close!r:.40}")
    codec.check_tag(tag)
    figures = list(figure) if isinstance(figure, (list, tuple)) else [figure]
    if not figures:
        raise ValueError("figure must be a matplotlib Figure or a non-empty list of them, got []")
    pixels = [figure_pixels(f) for f in figures]
    if len({p.shape for p in pixels}) > 1:
        sizes = sorted({f"{p.shape[1]}x{p.shape[0]}" for p in pixels})
        raise ValueError(f"figures of a list must have one size in pixels, got {', '.join(sizes)}")
    if isinstance(figure, (list, tuple)):
        event = summaries.image_event(tag, np.stack(pixels), step, wall, "NHWC")
    else:
        event = summaries.image_event(tag, pixels[0], step, wall, "HWC")
    if close and "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        for f in figures:
            plt.close(f)
    return event
