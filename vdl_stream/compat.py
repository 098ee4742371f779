"""Drop-in facades: VisualDL's ``LogWriter`` and tensorboardX's / torch's ``SummaryWriter``.

Code written for those libraries runs by changing the import. Each facade composes a
:class:`vdl_stream.Writer` made by :func:`vdl_stream.attach` and translates the other library's
names and conventions (keyword names, default steps, millisecond wall times, log directories) into
it; everything is validated, batched and persisted exactly as with ``attach()``.

Log directories: VisualDL and TensorBoard write a run's files into ``logdir`` itself and show every
directory under the viewer's ``--logdir`` as a run. Here the last component of ``logdir`` is the run
name and its parent is the directory given to ``attach()``: ``LogWriter("./log/exp1")`` records the
run ``exp1`` in ``./log`` (so ``vdl-stream serve --logdir ./log`` shows it). Pass ``run=`` as well to
use ``logdir`` itself as the root and choose the run name freely.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Any

import numpy as np

from . import codec, summaries
from .session import attach, check_logdir, make_run_name, resolve_run
from .writer import Writer

#: ``attach()`` keywords a facade passes through from its ``**kwargs`` (e.g. ``url=``, ``serve=``).
ATTACH_OPTIONS = frozenset(inspect.signature(attach).parameters) - {"logdir", "run"}
#: Accepted for compatibility and without effect: batching and flushing are vdl-stream's own.
IGNORED_OPTIONS = frozenset({"write_to_disk", "sync_cycle"})
#: VisualDL wall times are integer milliseconds; larger than this (year 5138 in seconds) means ms.
MILLISECONDS_ABOVE = 1e11
#: VisualDL caps PR-curve thresholds at this many.
VISUALDL_MAX_THRESHOLDS = 127
#: Bins of ``SummaryWriter.add_histogram(bins="tensorflow")``: TensorBoard shows histograms
#: resampled to 30 bins, so its exponential default buckets are replaced by 30 equal ones.
TENSORFLOW_BINS = 30


def split_logdir(logdir: str | os.PathLike[str]) -> tuple[str, str]:
    """Split a VisualDL/TensorBoard log directory into ``(attach logdir, run name)``.

    ``"./log/exp1"`` -> ``("<abs>/log", "exp1")``. Raises ``ValueError`` when the last component is
    not a valid run name (see :func:`vdl_stream.codec.check_run_name`).
    """
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a str or path, got {type(logdir).__name__}")
    parent, name = os.path.split(os.path.abspath(os.fspath(logdir)))
    if not name:
        raise ValueError(f"logdir must name a directory under a parent, got {os.fspath(logdir)!r}")
    return parent, codec.check_run_name(name)


def _plan(
    logdir: str | os.PathLike[str] | None, default_run: str | None, kwargs: dict[str, Any]
) -> tuple[str, str | None, dict[str, Any]]:
    """Check a facade's arguments; return the ``attach()`` root, run name and options."""
    unknown = set(kwargs) - ATTACH_OPTIONS - IGNORED_OPTIONS - {"run"}
    if unknown:
        raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
    options = {k: v for k, v in kwargs.items() if k in ATTACH_OPTIONS}
    run = kwargs.get("run")
    if run is not None:
        if not isinstance(logdir, (str, os.PathLike, type(None))):
            raise TypeError(f"logdir must be a str or path, got {type(logdir).__name__}")
        root = "runs" if logdir is None else os.fspath(logdir)
    elif logdir is None:
        root, run = "runs", default_run
    else:
        root, run = split_logdir(logdir)
    return os.fspath(root), run, options


def _open(
    logdir: str | os.PathLike[str] | None, default_run: str | None, kwargs: dict[str, Any]
) -> tuple[Writer, str, dict[str, Any]]:
    """Attach a writer for a facade; return it, the root directory and the attach options."""
    root, run, options = _plan(logdir, default_run, kwargs)
    return attach(root, run, **options), root, options


def _comment_run(comment: str, separator: str) -> str | None:
    """The run name of a facade without a log directory: attach's own, plus ``comment``."""
    if type(comment) is not str:
        raise TypeError(f"comment must be a str, got {type(comment).__name__} {comment!r:.40}")
    if not comment:
        return None  # attach() names it (unique, and agreed on by the ranks of a job)
    from .telemetry import distributed_env

    return codec.check_run_name(make_run_name(distributed_env()[2]) + separator + comment)


class _Recorder:
    """Shared plumbing of the facades: the composed writer, flush, close, context manager."""

    _writer: Writer
    _logdir: str

    @property
    def writer(self) -> Writer:
        """The underlying :class:`vdl_stream.Writer` (for ``url``, ``run``, ``flush(timeout)``)."""
        return self._writer

    @property
    def logdir(self) -> str:
        """The directory of this run: the ``attach()`` log directory joined with the run name."""
        return self._logdir

    def get_logdir(self) -> str:
        """Return :attr:`logdir` (tensorboardX's and torch's name for it)."""
        return self._logdir

    def flush(self) -> None:
        """Wait until everything logged so far is persisted and fsynced (see ``Writer.flush``)."""
        self._writer.flush()

    def close(self) -> None:
        """Flush, stop the background work and release the run. Idempotent."""
        self._writer.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- VisualDL -----------------------------------------------------------------------------------


def _visualdl_wall(walltime: object) -> float | None:
    """VisualDL takes wall times in milliseconds; accept those and seconds alike."""
    if walltime is None:
        return None
    wall = summaries.check_wall(walltime)
    return wall / 1000.0 if abs(wall) > MILLISECONDS_ABOVE else wall


class LogWriter(_Recorder):
    """A drop-in for ``visualdl.LogWriter`` (VisualDL 2.x), plus VisualDL 1.x's ``mode()`` form.

    Args:
        logdir: the run's directory; its last component is the run name (see the module doc).
            Default: ``runs/<unique time-sortable name>[.comment]``.
        comment: appended to the default run name (ignored with ``logdir``), as VisualDL.
        max_queue, flush_secs, filename_suffix, file_name: accepted and ignored: vdl-stream
            batches every ``flush_interval`` (20 ms) and keeps its own files.
        display_name: recorded as a ``meta`` event ``{"display_name": ...}`` of the run.
        **kwargs: ``attach()`` options (``url``, ``serve``, ``token``, ``telemetry``, ...), ``run``
            (then ``logdir`` is the root directory), and VisualDL's ``write_to_disk`` and 1.x's
            ``sync_cycle`` (ignored). Anything else raises ``TypeError``.

    Wall times: VisualDL records integer milliseconds; a ``walltime`` above 1e11 is read as
    milliseconds, anything else as seconds.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str] | None = None,
        comment: str = "",
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        display_name: str = "",
        file_name: str = "",
        **kwargs: Any,
    ) -> None:
        if display_name:
            display_name = summaries.check_str(display_name, "display_name")
        elif type(display_name) is not str:
            raise TypeError(f"display_name must be a str, got {type(display_name).__name__}")
        root, run, self._options = _plan(logdir, _comment_run(comment, "."), kwargs)
        if run is None:
            from .telemetry import distributed_env

            run = make_run_name(distributed_env()[2])
        self._root, self._run = root, run
        # The run itself is opened at its first use: VisualDL 1.x code logs only into modes
        # (sub-runs), and an empty run beside them would only clutter the dashboard. The name
        # and the log directory are checked now, so that a mistake still raises here.
        self._main: Writer | None = None
        self._name = resolve_run(
            run, all_ranks=self._options.get("all_ranks", False), url=self._options.get("url")
        )[0]
        if self._options.get("url") is None:
            check_logdir(root, "")
        self._logdir = os.path.join(self._root, self._name)
        self._modes: dict[str, Writer] = {}
        self._mode_stack: list[LogWriterMode] = []
        if display_name:
            self._writer._add_event(
                {
                    "kind": "meta",
                    "tag": None,
                    "step": None,
                    "wall": time.time(),
                    "display_name": display_name,
                }
            )

    @property
    def _writer(self) -> Writer:  # type: ignore[override]
        """The run's own writer, attached on first use."""
        if self._main is None:
            self._main = attach(self._root, self._run, **self._options)
        return self._main

    def add_scalar(self, tag: str, value: Any, step: int, walltime: float | None = None) -> None:
        """Log one scalar point (see ``Writer.add_scalar``)."""
        self._writer.add_scalar(tag, value, step, _visualdl_wall(walltime))

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: dict[str, Any],
        step: int,
        walltime: float | None = None,
    ) -> None:
        """Log ``{key: value}`` at one step as the tags ``main_tag/key``."""
        self._writer.add_scalars(main_tag, tag_scalar_dict, step, _visualdl_wall(walltime))

    def add_histogram(
        self, tag: str, values: Any, step: int, walltime: float | None = None, buckets: int = 10
    ) -> None:
        """Log the distribution of ``values`` in ``buckets`` equal bins."""
        self._writer.add_histogram(tag, values, step, _visualdl_wall(walltime), buckets)

    def add_image(
        self, tag: str, img: Any, step: int, walltime: float | None = None, dataformats: str = "HWC"
    ) -> None:
        """Log an image: uint8, or float in [0, 1]; ``dataformats`` HW, HWC, CHW, NHWC, NCHW."""
        self._writer.add_image(tag, img, step, _visualdl_wall(walltime), dataformats)

    def add_text(
        self, tag: str, text_string: str, step: int | None = None, walltime: float | None = None
    ) -> None:
        """Log a text."""
        self._writer.add_text(tag, text_string, step, _visualdl_wall(walltime))

    def add_audio(
        self,
        tag: str,
        audio_array: Any,
        step: int,
        sample_rate: int = 8000,
        walltime: float | None = None,
    ) -> None:
        """Log audio: float samples in [-1, 1] or int16, mono or stereo."""
        self._writer.add_audio(tag, audio_array, step, sample_rate, _visualdl_wall(walltime))

    def add_hparams(
        self, hparams_dict: dict[str, Any], metrics_list: Any, walltime: float | None = None
    ) -> None:
        """Log the run's hyperparameters and the tags of the metrics that judge it."""
        self._writer.add_hparams(hparams_dict, metrics_list, _visualdl_wall(walltime))

    def add_pr_curve(
        self,
        tag: str,
        labels: Any,
        predictions: Any,
        step: int,
        num_thresholds: int = 10,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log a precision-recall curve (at most 127 thresholds, as VisualDL)."""
        self._writer.add_pr_curve(
            tag,
            labels,
            predictions,
            step,
            _visualdl_thresholds(num_thresholds),
            weights,
            _visualdl_wall(walltime),
        )

    def add_roc_curve(
        self,
        tag: str,
        labels: Any,
        predictions: Any,
        step: int,
        num_thresholds: int = 10,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log a ROC curve (at most 127 thresholds, as VisualDL)."""
        self._writer.add_roc_curve(
            tag,
            labels,
            predictions,
            step,
            _visualdl_thresholds(num_thresholds),
            weights,
            _visualdl_wall(walltime),
        )

    # -- add_video / add_figure ---------------------------------------------------------------

    def add_video(
        self,
        tag: str,
        vid_tensor: Any,
        step: int,
        fps: float = 4,
        walltime: float | None = None,
        dataformats: str = "NTCHW",
    ) -> None:
        """Log a video (N, T, C, H, W), uint8 or float in [0, 1], as an animated GIF."""
        self._writer.add_video(tag, vid_tensor, step, fps, _visualdl_wall(walltime), dataformats)

    def add_figure(
        self, tag: str, figure: Any, step: int, close: bool = True, walltime: float | None = None
    ) -> None:
        """Log a matplotlib figure (or a list of them) rendered to PNG; ``close`` closes it."""
        self._writer.add_figure(tag, figure, step, close, _visualdl_wall(walltime))

    def add_graph(
        self, model: Any, input_spec: Any = None, verbose: bool = False, **kwargs: Any
    ) -> None:
        """Log a model's graph (VisualDL's signature): a ``paddle.nn.Layer`` with its
        ``input_spec`` (a list of ``paddle.static.InputSpec``), a torch module with example
        inputs, or an ONNX model. ``tag=``/``step=`` are accepted. See
        :meth:`vdl_stream.Writer.add_graph`."""
        self._writer.add_graph(model, input_spec, verbose, **kwargs)

    # -- add_embeddings (VisualDL's high-dimensional component) -------------------------------

    def add_embeddings(
        self,
        tag: str,
        mat: Any = None,
        metadata: Any = None,
        metadata_header: Any = None,
        walltime: float | None = None,
        labels: Any = None,
        hot_vectors: Any = None,
        labels_meta: Any = None,
    ) -> None:
        """Log embeddings: ``mat`` (N x D) with ``metadata`` labels, VisualDL's names.

        ``labels``, ``hot_vectors`` and ``labels_meta`` are VisualDL's older names for
        ``metadata``, ``mat`` and ``metadata_header``; giving both names of one argument is an
        error. VisualDL records embeddings without a step: they are step 0 here.
        See :meth:`vdl_stream.Writer.add_embedding`.
        """
        for new, old, value, older in (
            ("mat", "hot_vectors", mat, hot_vectors),
            ("metadata", "labels", metadata, labels),
            ("metadata_header", "labels_meta", metadata_header, labels_meta),
        ):
            if value is not None and older is not None:
                raise TypeError(f"give {new} or its older name {old}, not both")
        mat = hot_vectors if mat is None else mat
        if mat is None:
            raise TypeError("add_embeddings needs mat (or hot_vectors), got None")
        metadata = labels if metadata is None else metadata
        try:
            self._writer.add_embedding(
                mat,
                metadata,
                None,
                0,
                tag,
                labels_meta if metadata_header is None else metadata_header,
                _visualdl_wall(walltime),
            )
        except TypeError as exc:
            if metadata is None or not str(exc).startswith("mat must be"):
                raise
            # VisualDL 2.0's order was (tag, labels, hot_vectors): labels landed in mat.
            raise TypeError(
                f"{exc}; VisualDL 2.0's positional order (tag, labels, hot_vectors) is now "
                "(tag, mat, metadata): pass mat= and metadata= (or hot_vectors=, labels=) by name"
            ) from None

    def alert(
        self,
        title: str,
        text: str,
        level: str = "warn",
        step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Raise an alert from training code: see :meth:`vdl_stream.Writer.alert`."""
        wall = None if walltime is None else _visualdl_wall(walltime)
        self._writer.alert(title, text, level, step, wall)

    # -- VisualDL 1.x: with writer.mode("train") as w: w.scalar("loss").add_record(step, v) ----

    def mode(self, name: str) -> LogWriterMode:
        """Return the mode ``name``: the sub-run ``<run>/<name>``, opened on first use.

        Use it as ``with writer.mode("train") as w:`` and call ``w.scalar(tag)``; inside the
        ``with`` block ``writer.scalar(tag)`` logs into the mode as well, as in VisualDL 1.x.
        Recorders made inside the block keep logging into the mode after it ends.
        """
        if type(name) is not str:
            raise TypeError(f"mode must be a str, got {type(name).__name__}")
        codec.check_run_name(f"{self._name}/{name}")
        return LogWriterMode(self, name)

    def _mode_writer(self, name: str) -> Writer:
        writer = self._modes.get(name)
        if writer is None:
            writer = self._modes[name] = attach(self._root, f"{self._name}/{name}", **self._options)
        return writer

    def _current(self) -> Writer:
        return self._mode_stack[-1].writer if self._mode_stack else self._writer

    def scalar(self, tag: str) -> ScalarRecorder:
        """VisualDL 1.x: a recorder of the scalar ``tag`` in the current mode."""
        return ScalarRecorder(self._current(), tag)

    def histogram(self, tag: str, num_buckets: int = 10) -> HistogramRecorder:
        """VisualDL 1.x: a recorder of histograms of ``tag`` in the current mode."""
        return HistogramRecorder(self._current(), tag, num_buckets)

    def text(self, tag: str) -> TextRecorder:
        """VisualDL 1.x: a recorder of texts of ``tag`` in the current mode."""
        return TextRecorder(self._current(), tag)

    def image(self, tag: str, num_samples: int = 1, step_cycle: int = 1) -> ImageRecorder:
        """VisualDL 1.x: a recorder of image samples of ``tag`` in the current mode."""
        return ImageRecorder(self._current(), tag, num_samples, step_cycle)

    def flush(self) -> None:
        """Wait until everything logged so far, in every mode, is persisted and fsynced."""
        for writer in self._opened():
            writer.flush()

    def close(self) -> None:
        """Flush and close the run and every mode. Idempotent."""
        for writer in self._opened():
            writer.close()

    def _opened(self) -> list[Writer]:
        main = [] if self._main is None else [self._main]
        return [*self._modes.values(), *main]


def _visualdl_thresholds(num_thresholds: Any) -> Any:
    if type(num_thresholds) is int:
        return min(num_thresholds, VISUALDL_MAX_THRESHOLDS)
    return num_thresholds  # let the builder name the bad value


class LogWriterMode:
    """A VisualDL 1.x mode: the sub-run ``<run>/<name>`` of a :class:`LogWriter`."""

    def __init__(self, owner: LogWriter, name: str) -> None:
        self._owner = owner
        self.name = name

    @property
    def writer(self) -> Writer:
        """The mode's :class:`vdl_stream.Writer` (opened on first use)."""
        return self._owner._mode_writer(self.name)

    def __enter__(self) -> LogWriterMode:
        self._owner._mode_stack.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._owner._mode_stack.remove(self)

    def scalar(self, tag: str) -> ScalarRecorder:
        """A recorder of the scalar ``tag``: ``.add_record(step, value)``."""
        return ScalarRecorder(self.writer, tag)

    def histogram(self, tag: str, num_buckets: int = 10) -> HistogramRecorder:
        """A recorder of histograms: ``.add_record(step, values)``."""
        return HistogramRecorder(self.writer, tag, num_buckets)

    def text(self, tag: str) -> TextRecorder:
        """A recorder of texts: ``.add_record(step, text)``."""
        return TextRecorder(self.writer, tag)

    def image(self, tag: str, num_samples: int = 1, step_cycle: int = 1) -> ImageRecorder:
        """A recorder of image samples (see :class:`ImageRecorder`)."""
        return ImageRecorder(self.writer, tag, num_samples, step_cycle)


class ScalarRecorder:
    """VisualDL 1.x scalar component: ``add_record(step, value)``."""

    def __init__(self, writer: Writer, tag: str) -> None:
        self._writer, self.tag = writer, codec.check_tag(tag)

    def add_record(self, step: int, value: Any) -> None:
        """Log ``value`` at ``step``."""
        self._writer.add_scalar(self.tag, value, step)


class HistogramRecorder:
    """VisualDL 1.x histogram component: ``add_record(step, values)``."""

    def __init__(self, writer: Writer, tag: str, num_buckets: int = 10) -> None:
        self._writer, self.tag = writer, codec.check_tag(tag)
        self.num_buckets = num_buckets

    def add_record(self, step: int, values: Any) -> None:
        """Log the distribution of ``values`` at ``step``."""
        self._writer.add_histogram(self.tag, values, step, buckets=self.num_buckets)


class TextRecorder:
    """VisualDL 1.x text component: ``add_record(step, text)``."""

    def __init__(self, writer: Writer, tag: str) -> None:
        self._writer, self.tag = writer, codec.check_tag(tag)

    def add_record(self, step: int, text: str) -> None:
        """Log ``text`` at ``step``."""
        self._writer.add_text(self.tag, text, step)


class ImageRecorder:
    """VisualDL 1.x image component, sampled in rounds.

    A round: ``start_sampling()``; for each candidate, ``i = is_sample_taken()`` and, when
    ``i >= 0``, ``set_sample(i, shape, data)`` (or just ``add_sample(shape, data)``);
    ``finish_sampling()`` logs the round's samples at the round's step (0, 1, 2, ...) as ``tag``
    (one sample) or ``tag/0``, ``tag/1``, ... Only every ``step_cycle``-th round is logged.
    ``shape`` is ``[H, W, C]`` (or ``[H, W]``) and ``data`` the flat pixels: uint8, floats in
    [0, 1], or floats in [0, 255] (VisualDL 1.x's convention; taken as such when any exceeds 1).
    """

    def __init__(self, writer: Writer, tag: str, num_samples: int = 1, step_cycle: int = 1) -> None:
        self._writer, self.tag = writer, codec.check_tag(tag)
        for name, value in (("num_samples", num_samples), ("step_cycle", step_cycle)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r:.40}")
        self.num_samples, self.step_cycle = num_samples, step_cycle
        self._round = 0
        self._samples: list[np.ndarray | None] = []

    def start_sampling(self) -> None:
        """Begin a round of samples."""
        self._samples = [None] * self.num_samples

    def is_sample_taken(self) -> int:
        """Return the index the next sample goes to, or -1 when the round is full."""
        for i, sample in enumerate(self._samples):
            if sample is None:
                return i
        return -1

    def set_sample(self, index: int, image_shape: Any, image_data: Any) -> None:
        """Put the image ``image_data`` (flat, of ``image_shape``) at ``index`` of this round."""
        if type(index) is not int or not 0 <= index < len(self._samples):
            raise ValueError(
                f"index must be from 0 to {len(self._samples) - 1} (call start_sampling() first), "
                f"got {index!r:.40}"
            )
        try:
            shape = tuple(summaries.to_step(n, "image_shape entries") for n in image_shape)
        except TypeError:
            raise TypeError(
                f"image_shape must be a list of 2 or 3 ints ([H, W, C]), got {image_shape!r:.60}"
            ) from None
        if len(shape) not in (2, 3) or not all(0 < n <= summaries.MAX_IMAGE_VALUES for n in shape):
            raise ValueError(
                f"image_shape must be 2 or 3 positive sizes ([H, W, C]), got {list(shape)!r:.60}"
            )
        arr = summaries.as_numpy(image_data, "image_data")
        if arr.size != int(np.prod(shape)) or len(shape) not in (2, 3):
            raise ValueError(
                f"image_data of {arr.size} values does not fit image_shape {list(shape)} ([H, W, C])"
            )
        arr = arr.reshape(shape)
        if arr.dtype.kind == "f" and arr.size and np.nanmax(arr) > 1.0:
            arr = np.clip(np.nan_to_num(arr), 0, 255).round().astype(np.uint8)
        self._samples[index] = arr

    def add_sample(self, image_shape: Any, image_data: Any) -> None:
        """Put an image into the next free place of this round (dropped when the round is full)."""
        index = self.is_sample_taken()
        if index >= 0:
            self.set_sample(index, image_shape, image_data)

    def finish_sampling(self) -> None:
        """End the round: log its samples (on every ``step_cycle``-th round) and count the step."""
        samples = [s for s in self._samples if s is not None]
        if self._round % self.step_cycle == 0:
            for i, sample in enumerate(samples):
                tag = self.tag if self.num_samples == 1 else f"{self.tag}/{i}"
                fmt = "HW" if sample.ndim == 2 else "HWC"
                self._writer.add_image(tag, sample, self._round, dataformats=fmt)
        self._round += 1
        self._samples = []


# -- tensorboardX / torch.utils.tensorboard -----------------------------------------------------


def _tensorboard_bins(bins: Any, values: Any, max_bins: int | None) -> int:
    """Turn ``bins`` (an int, ``"tensorflow"`` or a numpy estimator name) into a bucket count."""
    if isinstance(bins, str):
        if bins == "tensorflow":
            count = TENSORFLOW_BINS
        else:
            arr = summaries.as_numpy(values, "values").astype(np.float64).ravel()
            arr = arr[np.isfinite(arr)]
            try:
                # Without finite values, one bin; the name is checked all the same (on one
                # value), so that a bad name is refused whatever the values.
                edges = np.histogram_bin_edges(arr if arr.size else np.zeros(1), bins=bins)
                count = min(len(edges) - 1 if arr.size else 1, summaries.MAX_BUCKETS)
            except ValueError:
                raise ValueError(
                    f"bins must be an int, 'tensorflow' or a numpy estimator name, got {bins!r:.40}"
                ) from None
    elif isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        count = int(bins)
        if not 1 <= count <= summaries.MAX_BUCKETS:
            raise ValueError(f"bins must be from 1 to {summaries.MAX_BUCKETS}, got {count}")
    else:
        raise TypeError(
            "bins must be an int, 'tensorflow' or a numpy estimator name (explicit edges are not "
            f"supported), got {type(bins).__name__}"
        )
    if max_bins is not None:
        if (
            not isinstance(max_bins, (int, np.integer))
            or isinstance(max_bins, bool)
            or max_bins < 1
        ):
            raise ValueError(f"max_bins must be a positive int or None, got {max_bins!r:.40}")
        count = min(count, int(max_bins))
    return count


class SummaryWriter(_Recorder):
    """A drop-in for ``tensorboardX.SummaryWriter`` and ``torch.utils.tensorboard.SummaryWriter``.

    Covers the common methods; ``global_step=None`` is recorded as step 0, as TensorBoard does.

    Args:
        log_dir: the run's directory; its last component is the run name (see the module doc).
            ``logdir=`` (tensorboardX's older name) is accepted too. Default:
            ``runs/<unique time-sortable name>[comment]``.
        comment: appended to the default run name (ignored with ``log_dir``).
        purge_step: accepted; vdl-stream already shows the newest value of a step that is logged
            again after a restart, so nothing needs purging. Steps at or after ``purge_step``
            that are not logged again stay visible.
        max_queue, flush_secs, filename_suffix: accepted and ignored (vdl-stream batches every
            ``flush_interval``).
        **kwargs: ``attach()`` options (``url``, ``serve``, ``token``, ``telemetry``, ...) and
            ``run``; anything else raises ``TypeError``.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        **kwargs: Any,
    ) -> None:
        if log_dir is None:
            log_dir = kwargs.pop("logdir", None)
        self.purge_step = purge_step
        self._writer, root, _ = _open(log_dir, _comment_run(comment, ""), kwargs)
        self._logdir = os.path.join(root, self._writer.run)

    @property
    def log_dir(self) -> str:
        """The run's directory (torch's attribute name)."""
        return self._logdir

    def add_scalar(
        self,
        tag: str,
        scalar_value: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        display_name: str = "",
        summary_description: str = "",
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        """Log one scalar point. ``display_name``, ``summary_description``, ``new_style`` and
        ``double_precision`` are accepted and ignored (values are always float64)."""
        self._writer.add_scalar(
            tag, scalar_value, 0 if global_step is None else global_step, walltime
        )

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: dict[str, Any],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log ``{key: value}`` at one step as the tags ``main_tag/key`` of this run.

        (TensorBoard makes a sub-run per key instead; the points are the same.)
        """
        step = 0 if global_step is None else global_step
        self._writer.add_scalars(main_tag, tag_scalar_dict, step, walltime)

    def add_histogram(
        self,
        tag: str,
        values: Any,
        global_step: int | None = None,
        bins: Any = "tensorflow",
        walltime: float | None = None,
        max_bins: int | None = None,
    ) -> None:
        """Log the distribution of ``values``.

        ``bins``: an int, ``"tensorflow"`` (30 equal bins, what TensorBoard displays), or a numpy
        estimator name (``"auto"``, ``"fd"``, ``"sqrt"``, ...) that picks the number of equal bins.
        ``max_bins`` caps the number.
        """
        buckets = _tensorboard_bins(bins, values, max_bins)
        step = 0 if global_step is None else global_step
        self._writer.add_histogram(tag, values, step, walltime, buckets)

    def add_image(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "CHW",
    ) -> None:
        """Log an image: uint8, or float in [0, 1]; CHW by default, as TensorBoard."""
        step = 0 if global_step is None else global_step
        self._writer.add_image(tag, img_tensor, step, walltime, dataformats)

    def add_images(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "NCHW",
    ) -> None:
        """Log a batch of images tiled into one grid (8 per row), NCHW by default."""
        step = 0 if global_step is None else global_step
        self._writer.add_image(tag, img_tensor, step, walltime, dataformats)

    def add_text(
        self,
        tag: str,
        text_string: str,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log a text."""
        step = 0 if global_step is None else global_step
        self._writer.add_text(tag, text_string, step, walltime)

    def add_audio(
        self,
        tag: str,
        snd_tensor: Any,
        global_step: int | None = None,
        sample_rate: int = 44100,
        walltime: float | None = None,
    ) -> None:
        """Log audio: float samples in [-1, 1] or int16, mono or stereo."""
        step = 0 if global_step is None else global_step
        self._writer.add_audio(tag, snd_tensor, step, sample_rate, walltime)

    def add_hparams(
        self,
        hparam_dict: dict[str, Any],
        metric_dict: dict[str, Any],
        hparam_domain_discrete: dict[str, list[Any]] | None = None,
        run_name: str | None = None,
        global_step: int | None = None,
        name: str | None = None,
    ) -> None:
        """Log the run's hyperparameters with final metric values ``{tag: value}``.

        TensorBoard writes these into a separate sub-run (``run_name``/``name``) together with
        the metric values as scalars; here they are one ``hparams`` event of this run holding
        ``metric_values``, so no scalar series of the run is overwritten. ``hparam_domain_discrete``,
        ``run_name``, ``global_step`` and ``name`` are accepted and ignored.
        """
        if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
            raise TypeError(
                "hparam_dict and metric_dict must be dicts, got "
                f"{type(hparam_dict).__name__} and {type(metric_dict).__name__}"
            )
        self._writer.add_hparams(hparam_dict, metric_dict)

    def add_pr_curve(
        self,
        tag: str,
        labels: Any,
        predictions: Any,
        global_step: int | None = None,
        num_thresholds: int = 127,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log a precision-recall curve."""
        step = 0 if global_step is None else global_step
        self._writer.add_pr_curve(tag, labels, predictions, step, num_thresholds, weights, walltime)

    # -- add_video / add_figure ---------------------------------------------------------------

    def add_video(
        self,
        tag: str,
        vid_tensor: Any,
        global_step: int | None = None,
        fps: float = 4,
        walltime: float | None = None,
        dataformats: str = "NTCHW",
    ) -> None:
        """Log a video (N, T, C, H, W), uint8 or float in [0, 1], as an animated GIF (Pillow);
        tensorboardX's names, without its moviepy dependency."""
        step = 0 if global_step is None else global_step
        self._writer.add_video(tag, vid_tensor, step, fps, walltime, dataformats)

    def add_figure(
        self,
        tag: str,
        figure: Any,
        global_step: int | None = None,
        close: bool = True,
        walltime: float | None = None,
    ) -> None:
        """Log a matplotlib figure (or a list of them, tiled) rendered to PNG by Agg, without a
        display; ``close`` closes it afterwards."""
        step = 0 if global_step is None else global_step
        self._writer.add_figure(tag, figure, step, close, walltime)

    def add_graph(
        self,
        model: Any,
        input_to_model: Any = None,
        verbose: bool = False,
        use_strict_trace: bool = True,
        **kwargs: Any,
    ) -> None:
        """Log a model's graph (tensorboardX's / torch's signature): a torch module traced with
        torch.fx (shapes from ``input_to_model``), else torch.jit.trace; also ONNX models and
        Paddle layers. ``tag=``/``step=`` are accepted. See :meth:`vdl_stream.Writer.add_graph`."""
        self._writer.add_graph(model, input_to_model, verbose, use_strict_trace, **kwargs)

    def add_embedding(
        self,
        mat: Any,
        metadata: Any = None,
        label_img: Any = None,
        global_step: int | None = None,
        tag: str = "default",
        metadata_header: Any = None,
    ) -> None:
        """Log N x D embeddings with labels and thumbnails for the page's projector (PCA and a
        UMAP-style layout); see :meth:`vdl_stream.Writer.add_embedding`."""
        self._writer.add_embedding(mat, metadata, label_img, global_step, tag, metadata_header)

    def alert(
        self,
        title: str,
        text: str,
        level: str = "warn",
        step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Raise an alert from training code: see :meth:`vdl_stream.Writer.alert`."""
        self._writer.alert(title, text, level, step, walltime)


__all__ = [
    "HistogramRecorder",
    "ImageRecorder",
    "LogWriter",
    "LogWriterMode",
    "ScalarRecorder",
    "SummaryWriter",
    "TextRecorder",
    "split_logdir",
]
