"""``vdl-stream import`` and ``vdl-stream export``: TensorBoard and VisualDL logs in, CSV and JSON out.

Import turns every directory holding TensorBoard event files (``events.out.tfevents.*``) or VisualDL
records (``vdlrecords.*.log``) into one run, written with :class:`recorder.RunWriter`. Damaged
records are skipped, reported and counted; they never stop an import. Export writes the scalars of
one run (and its telemetry) as CSV or JSON. See docs/interop.md.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import csv
import errno
import io
import itertools
import json
import logging
import math
import os
import queue
import re
import signal
import stat
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import numpy as np

import recorder
from recorder.framing import write_all
from recorder.reader_pool import usable_cores

from .codec import RESERVED_TAG_PREFIX

if TYPE_CHECKING:
    from . import tfevents

# storage (and trio with it), tfevents and vdlrecords are imported where used: an export of a
# local run needs none of them, and every ``/api/export`` child pays its imports before its
# first row, while the server's other core waits (docs/performance.md, "(2026-12-02,
# h8-export)").

log = logging.getLogger("vdl_stream.interop")

#: Scalar points of one tag held in memory before they are handed to the RunWriter.
TAG_BUFFER_POINTS = 1 << 20
#: Damage reports printed at most (the rest is counted).
SHOWN_CORRUPTIONS = 20

_BAD_RUN_CHARS = re.compile(r"[\x00-\x1f\x7f\\:]")


# -- finding sources ---------------------------------------------------------------------------


def source_kind(name: str) -> str | None:
    """Return ``"tensorboard"``, ``"visualdl"`` or None for a file name."""
    from . import tfevents, vdlrecords

    if tfevents.is_event_file(name):
        return "tensorboard"
    if vdlrecords.is_record_file(name):
        return "visualdl"
    return None


def _run_name(parts: list[str]) -> str:
    clean = [_BAD_RUN_CHARS.sub("_", p) for p in parts if p not in ("", ".")]
    clean = ["_" if p == ".." else p for p in clean]
    return "/".join(clean) or "run"


def find_sources(paths: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Map run names to their ``(file, kind)`` sources, files in name order.

    A directory given contributes one run per directory under it holding event or record files,
    named by its path relative to the given directory (as TensorBoard names runs); files directly
    in it form a run named after the directory itself. A file given forms a run named after the
    directory holding it.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a file given is neither kind, or two sources map to one run name.
    """
    runs: dict[str, list[tuple[str, str]]] = {}
    origin: dict[str, str] = {}

    def add(run: str, path: str, kind: str, root: str) -> None:
        if origin.setdefault(run, root) != root:
            raise ValueError(
                f"{root!r} and {origin[run]!r} both give a run named {run!r}; import them into "
                "different --logdir directories"
            )
        runs.setdefault(run, []).append((path, kind))

    for given in paths:
        if not os.path.exists(given):
            raise FileNotFoundError(f"{given}: no such file or directory")
        top = os.path.basename(os.path.abspath(given))
        if os.path.isfile(given):
            kind = source_kind(os.path.basename(given))
            if kind is None:
                raise ValueError(
                    f"{given}: not a TensorBoard event file (events.out.tfevents.*) or a "
                    "VisualDL record file (vdlrecords.*.log)"
                )
            parent = os.path.dirname(os.path.abspath(given))
            add(_run_name([os.path.basename(parent)]), given, kind, parent)
            continue
        for dirpath, dirnames, filenames in os.walk(given):
            dirnames.sort()
            rel = os.path.relpath(dirpath, given)
            run = _run_name([top] if rel == "." else rel.split(os.sep))
            for name in sorted(filenames):
                kind = source_kind(name)
                if kind is not None:
                    add(run, os.path.join(dirpath, name), kind, given)
    for files in runs.values():
        files.sort(key=lambda f: (f[1], os.path.basename(f[0])))
    return runs


# -- importing ---------------------------------------------------------------------------------


@dataclass
class ImportReport:
    """What an import did.

    Attributes:
        runs: run name -> number of scalar points and events written.
        files: source files read.
        bytes: source bytes read.
        records: source records read (valid framing).
        scalars: scalar points written.
        events: non-scalar events written.
        corrupt: ``(file, Corruption)`` for every damaged stretch skipped.
        skipped: counts of source records or values not imported, by what they were.
    """

    runs: dict[str, tuple[int, int]] = field(default_factory=dict)
    files: int = 0
    bytes: int = 0
    records: int = 0
    scalars: int = 0
    events: int = 0
    corrupt: list[tuple[str, tfevents.Corruption]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


class _TagBuffer:
    """Points of one tag not yet handed to the writer; a step going back (a restart) flushes."""

    __slots__ = ("count", "parts", "top")

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.count = 0
        self.top: int | None = None


class _RunImport:
    """Writes one run from decoded blocks, keeping restarts (a step going back) as restarts."""

    def __init__(self, writer: recorder.RunWriter, report: ImportReport) -> None:
        self.writer = writer
        self.report = report
        self.tags: dict[str, _TagBuffer] = {}
        self.bad_tags: set[str] = set()
        self.scalars = 0
        self.events = 0
        self.first_wall: float | None = None

    def add(self, block: tfevents.EventBlock) -> None:
        """Write a block's events now and buffer its scalar points (restarts flush)."""
        if block.first_wall is not None and (
            self.first_wall is None or block.first_wall < self.first_wall
        ):
            self.first_wall = block.first_wall
        for tag, (steps, walls, values) in block.scalars.items():
            self._scalars(
                tag,
                np.array(steps, dtype=np.int64),
                np.array(walls, dtype=np.float64),
                np.array(values, dtype=np.float64),
            )
        for kind, tag, step, wall, data in block.events:
            if tag in self.bad_tags:
                self.report.skipped[f"{kind} under a tag of another kind"] += 1
                continue
            try:
                self.writer.append_record(kind, tag, step, wall, data)
            except ValueError as exc:  # the tag already holds another kind
                self.bad_tags.add(tag)
                self.report.skipped[f"{kind} under a tag of another kind"] += 1
                print(f"vdl-stream import: {exc}; skipping those", file=sys.stderr)
                continue
            self.events += 1

    def _scalars(self, tag: str, s: np.ndarray, w: np.ndarray, v: np.ndarray) -> None:
        if tag in self.bad_tags or not len(s):
            if len(s):
                self.report.skipped["scalar under a tag of another kind"] += len(s)
            return
        buf = self.tags.get(tag)
        if buf is None:
            buf = self.tags[tag] = _TagBuffer()
        # A point whose step is below a step before it in the tag starts a restart (as TensorBoard
        # purges): points before it are flushed as their own chunk, which readers let the restart
        # supersede. Equal steps are kept, as TensorBoard keeps them.
        start = 0
        while start < len(s):
            seg = s[start:]
            running = np.maximum.accumulate(seg)
            prev = np.empty_like(running)
            prev[0] = seg[0] if buf.top is None else buf.top
            prev[1:] = running[:-1] if buf.top is None else np.maximum(running[:-1], buf.top)
            back = np.nonzero(seg < prev)[0]
            cut = len(seg) if not len(back) else int(back[0])
            if cut:
                end = start + cut
                buf.parts.append((s[start:end], w[start:end], v[start:end]))
                buf.count += cut
                top = int(running[cut - 1])
                buf.top = top if buf.top is None else max(buf.top, top)
            if cut == len(seg):
                break
            self._flush(tag, buf)
            buf.top = None
            start += cut
        if buf.count >= TAG_BUFFER_POINTS:
            self._flush(tag, buf)

    def _flush(self, tag: str, buf: _TagBuffer) -> None:
        if not buf.parts:
            return
        cols = [
            np.concatenate(c) if len(buf.parts) > 1 else buf.parts[0][i]
            for i, c in enumerate(zip(*buf.parts, strict=True))
        ]
        buf.parts = []
        buf.count = 0
        try:
            self.writer.append_scalars(tag, *cols)
        except ValueError as exc:
            self.bad_tags.add(tag)
            self.report.skipped["scalar under a tag of another kind"] += len(cols[0])
            print(f"vdl-stream import: {exc}; skipping those", file=sys.stderr)
            return
        self.scalars += len(cols[0])

    def finish(self) -> None:
        """Hand every buffered point to the writer."""
        for tag, buf in self.tags.items():
            self._flush(tag, buf)


def _blocks(path: str, kind: str) -> Iterator[tfevents.EventBlock]:
    from . import tfevents, vdlrecords

    if kind == "tensorboard":
        return tfevents.read_event_file(path)
    return vdlrecords.read_record_file(path)


#: TensorBoard's projector configuration, written by tensorboardX's ``add_embedding`` beside the
#: event files of a run (a text protobuf of ``embeddings { tensor_name, tensor_path,
#: metadata_path, sprite { ... } }`` entries, the paths relative to the run's directory).
PROJECTOR_CONFIG = "projector_config.pbtxt"


def projector_embeddings(run_dir: str, wall: float) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The embeddings a TensorBoard projector configuration in ``run_dir`` names, as
    ``embedding`` events at ``wall`` (tensors.tsv, metadata.tsv and the sprite's thumbnails).

    Returns the events and what was skipped (an entry whose files are missing or malformed is
    counted, never fatal)."""
    from .embeddings import embedding_event

    skipped: Counter[str] = Counter()
    config = os.path.join(run_dir, PROJECTOR_CONFIG)
    try:
        with open(config, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return [], skipped
    events = []
    for entry in re.findall(r"embeddings\s*\{((?:[^{}]|\{[^{}]*\})*)\}", text):
        fields = dict(
            re.findall(r'(tensor_name|tensor_path|metadata_path|image_path)\s*:\s*"([^"]*)"', entry)
        )
        dims = [int(d) for d in re.findall(r"single_image_dim\s*:\s*(\d+)", entry)]
        name = fields.get("tensor_name", "default")
        tag, _, suffix = name.rpartition(":")
        step = int(suffix) if tag and suffix.isdigit() else 0
        tag = tag or name
        try:
            mat = np.loadtxt(os.path.join(run_dir, fields["tensor_path"]), delimiter="\t", ndmin=2)
            metadata = header = None
            if "metadata_path" in fields:
                with open(os.path.join(run_dir, fields["metadata_path"]), encoding="utf-8") as f:
                    rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
                if len(rows) == len(mat) + 1:  # a header row, then one row per point
                    header, metadata = rows[0], rows[1:]
                else:
                    metadata = [r[0] if len(r) == 1 else "\t".join(r) for r in rows]
            thumbnails = None
            if "image_path" in fields and len(dims) == 2:
                thumbnails = _sprite_thumbnails(
                    os.path.join(run_dir, fields["image_path"]), dims[1], dims[0], len(mat)
                )
                if thumbnails is None:
                    skipped["projector sprite (thumbnails; needs Pillow)"] += 1
            event = embedding_event(mat, metadata, thumbnails, step, tag, header, wall)
        except (KeyError, OSError, TypeError, ValueError) as exc:
            log.warning("projector embedding %r in %s not imported: %s", name, run_dir, exc)
            skipped["projector embedding (unreadable)"] += 1
            continue
        events.append(event)
    return events, skipped


def _sprite_thumbnails(path: str, height: int, width: int, n: int) -> np.ndarray | None:
    """The ``n`` thumbnails of a projector sprite (tiles of ``height`` x ``width``, row-major in
    ``ceil(sqrt(n))`` columns) as ``(n, 3, height, width)`` uint8; None without Pillow.

    Raises:
        OSError, ValueError: the image cannot be read, or is too small for ``n`` tiles.
    """
    try:
        from PIL import Image
    except ImportError:
        return None
    with Image.open(path) as image:
        sheet = np.asarray(image.convert("RGB"))
    cols = math.ceil(math.sqrt(n))
    rows = -(-n // cols)
    if sheet.shape[0] < rows * height or sheet.shape[1] < cols * width:
        raise ValueError(f"sprite {sheet.shape[1]}x{sheet.shape[0]} holds fewer than {n} tiles")
    tiles = sheet[: rows * height, : cols * width].reshape(rows, height, cols, width, 3)
    return tiles.transpose(0, 2, 4, 1, 3).reshape(rows * cols, 3, height, width)[:n]


def import_runs(
    paths: list[str],
    logdir: str | os.PathLike[str],
    *,
    progress: Callable[[int, int, int], None] | None = None,
) -> ImportReport:
    """Import TensorBoard and VisualDL logs under ``paths`` as runs in ``logdir``.

    Args:
        paths: event files, record files, or directories holding them (searched recursively).
        logdir: the log directory the runs are written into.
        progress: called now and then with ``(bytes done, bytes total, points and events done)``.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a file is neither kind, no source was found, or a run already exists.
    """
    sources = find_sources(paths)
    if not sources:
        raise ValueError(
            "found no TensorBoard event files (events.out.tfevents.*) or VisualDL record files "
            f"(vdlrecords.*.log) under {', '.join(paths)}"
        )
    logdir = os.fspath(logdir)
    for run in sources:
        if os.path.exists(os.path.join(logdir, run)):
            raise ValueError(
                f"run {run!r} already exists in {logdir}; import into another --logdir or "
                "remove it first"
            )
    report = ImportReport()
    total = sum(os.path.getsize(p) for files in sources.values() for p, _ in files)
    done = decoded = 0
    for run, files in sources.items():
        writer = recorder.RunWriter(os.path.join(logdir, run), sync_interval=1e9)
        with writer:
            job = _RunImport(writer, report)
            for path, kind in files:
                report.files += 1
                base = done
                for block in _blocks(path, kind):
                    job.add(block)
                    report.records += block.records
                    report.corrupt.extend((path, c) for c in block.corrupt)
                    report.skipped.update(block.skipped)
                    done = base + block.end
                    decoded += block.scalar_count() + len(block.events)
                    if progress is not None:
                        progress(done, total, decoded)
                done = base + os.path.getsize(path)
            job.finish()
            # Embeddings live beside the event files, in TensorBoard's projector files.
            wall = job.first_wall if job.first_wall is not None else time.time()
            run_dirs = sorted({os.path.dirname(os.path.abspath(p)) for p, k in files})
            for run_dir in run_dirs:
                embedded, skipped = projector_embeddings(run_dir, wall)
                report.skipped.update(skipped)
                for event in embedded:
                    data = {
                        k: v for k, v in event.items() if k not in ("kind", "tag", "step", "wall")
                    }
                    writer.append_record("embedding", event["tag"], event["step"], wall, data)
                    job.events += 1
            writer.append_record(
                "meta",
                None,
                None,
                job.first_wall if job.first_wall is not None else time.time(),
                {
                    "imported_from": sorted({kind for _, kind in files}),
                    "source_files": [os.path.abspath(p) for p, _ in files],
                },
            )
        report.runs[run] = (job.scalars, job.events)
        report.scalars += job.scalars
        report.events += job.events
    report.bytes = total
    if progress is not None:
        progress(total, total, decoded)
    return report


class ProgressBar:
    """A one-line progress bar on a stream (stderr), redrawn at most 10 times a second."""

    def __init__(self, stream: TextIO, label: str, width: int = 30) -> None:
        self.stream = stream
        self.label = label
        self.width = width
        self.last = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int, items: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        self.stream.write(
            f"\r{self.label} [{'#' * fill}{'.' * (self.width - fill)}] {frac:4.0%} "
            f"{done / 1e6:.1f}/{total / 1e6:.1f} MB {items:,} events"
        )
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End the bar's line."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``vdl-stream import`` to ``parser``."""
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="event/record files or directories holding them"
    )
    parser.add_argument(
        "--logdir",
        required=True,
        help="directory to write the runs into, or s3://bucket/prefix (gs://, az://)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--progress", action="store_true", help="always draw the progress bar (default: on a tty)"
    )
    group.add_argument("--quiet", action="store_true", help="no progress bar")


def run_import(args: argparse.Namespace) -> int:
    """Run ``vdl-stream import``; return 0, 1 if damaged records were skipped, 2 on bad input."""
    err = sys.stderr
    show = not args.quiet and (args.progress or err.isatty())
    bar = ProgressBar(err, "import") if show else None
    started = time.perf_counter()
    from . import storage

    try:
        if storage.is_store_url(args.logdir):
            # Into a local directory first (runs are written there whole), then published.
            with tempfile.TemporaryDirectory(prefix="vdl-stream-import-") as tmp:
                report = import_runs(args.paths, tmp, progress=bar)
                storage.publish_all(args.logdir, tmp, new_only=True)
        else:
            report = import_runs(args.paths, args.logdir, progress=bar)
    except (OSError, ImportError, ValueError, recorder.RecorderError) as exc:
        if bar is not None:
            bar.close()
        print(f"vdl-stream import: {exc}", file=err)
        return 2
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - started
    for run, (scalars, events) in report.runs.items():
        print(f"  {run}: {scalars:,} scalar points, {events:,} events", file=err)
    print(
        f"imported {len(report.runs)} run(s) from {report.files} file(s) into {args.logdir}: "
        f"{report.scalars:,} scalar points and {report.events:,} events in {seconds:.2f} s; "
        f"{len(report.corrupt)} damaged record(s) skipped",
        file=err,
    )
    if report.skipped:
        parts = ", ".join(f"{what} {n:,}" for what, n in sorted(report.skipped.items()))
        print(f"not imported: {parts}", file=err)
    for path, c in report.corrupt[:SHOWN_CORRUPTIONS]:
        print(f"damaged: {path}: offset {c.offset}: {c.reason} ({c.length} bytes)", file=err)
    if len(report.corrupt) > SHOWN_CORRUPTIONS:
        print(f"damaged: ... and {len(report.corrupt) - SHOWN_CORRUPTIONS} more", file=err)
    return 1 if report.corrupt else 0


# -- exporting ---------------------------------------------------------------------------------

#: Rows read at a time: what an export holds in memory is a few times this many rows, whatever
#: the size of the run.
EXPORT_CHUNK_ROWS = 1 << 16
#: Rows formatted at a time (a block): its numpy passes stay in the CPU's caches.
FORMAT_ROWS = 1 << 14
#: Most worker threads an export formats blocks in by default (each holds a block or two).
EXPORT_THREADS_MAX = 4
EXPORT_FORMATS = ("csv", "json")
CSV_HEADER = "tag,step,wall_time,value\n"


def export_threads(cores: int | None = None, load: float | None = None) -> int:
    """Worker threads an export formats blocks in by default: one per idle core, at most
    :data:`EXPORT_THREADS_MAX`, and none unless two cores are idle.

    Idle cores are ``cores`` (default: the usable cores) less ``load`` (default :func:`_load`),
    rounded. numpy's passes release the GIL, so threads overlap them where cores are free; on
    busy cores they only add GIL hand-offs (15-30% more CPU time, and no faster:
    docs/performance.md, "Export speed").
    """
    idle = _cores(cores) - (_load() if load is None else load)
    threads = min(EXPORT_THREADS_MAX, int(idle + 0.5))
    return threads if threads >= 2 else 0


def export_in_child(cores: int | None = None) -> bool:
    """Whether ``GET /api/export`` formats a large export in a child process
    (:func:`stream_export_process`): wherever there are two cores or more (``cores``, default:
    the usable cores), however busy.

    The formatting then runs on a core of its own, beside the server's sending and its client's
    reading, and off the server's GIL and event loop. On a quiet 2-core machine that is the
    difference between about 3M rows/s (the server formatting while the client reads) and the
    CLI's rate; on busy cores the child spends about the CPU time the server would (the server
    formats without the CLI's memory settings, the child's bytes cross one pipe more), so there
    is nothing to gain from formatting in the server (docs/performance.md, "Export through the
    server").
    """
    return _cores(cores) >= 2


#: Environment variable that sets :func:`child_threads` (an int >= 0), to compare settings.
CHILD_THREADS_ENV = "VDL_STREAM_EXPORT_CHILD_THREADS"


def child_threads(cores: int | None = None) -> int:
    """Formatting threads of ``/api/export``'s child process: one for every core (``cores``,
    default: the usable cores) beyond two, and one at least, at most
    :data:`EXPORT_THREADS_MAX`; or the int in the environment variable
    :data:`CHILD_THREADS_ENV`, if set.

    One core is the server's and its client's, one the child's own thread (it reads the run and
    writes the pipe); the formatting runs beside them. On 2 cores the one formatting thread takes
    what the server and client leave of the other core, and keeps formatting while the child
    waits on a full pipe.

    Raises:
        ValueError: :data:`CHILD_THREADS_ENV` is set to something else than an int >= 0.
    """
    text = os.environ.get(CHILD_THREADS_ENV)
    if text:
        if not (text.isascii() and text.isdigit()):  # "²".isdigit() is True
            raise ValueError(f"{CHILD_THREADS_ENV} must be an int >= 0, got {text!r}")
        return int(text)
    return max(1, min(EXPORT_THREADS_MAX, _cores(cores) - 2))


#: Environment variable that sets :func:`child_processes` (an int >= 1), to compare settings.
CHILD_PROCESSES_ENV = "VDL_STREAM_EXPORT_CHILD_PROCESSES"


def child_processes(cores: int | None = None) -> int:
    """Processes ``/api/export``'s child, and ``vdl-stream export`` without ``--processes`` or
    ``--threads``, format in (:func:`write_export`): two where there are two cores or more
    (``cores``, default: the usable cores) and the platform forks and splices (Linux), else one;
    or the int in the environment variable :data:`CHILD_PROCESSES_ENV`.

    One process formats on one core at most (its GIL), and on a quiet 2-core machine that core
    was the limit of a 50M-row JSON export (docs/performance.md, "/api/export JSON: two
    processes"): two processes format alternate parts on both cores, beside the server's relay.
    Worker threads in one process (``--threads``) overlap only numpy's passes, and pay for the
    GIL's hand-offs: the CLI read 4.7M rows/s with them where the server's split child read 5M
    (docs/performance.md, "Export: the CLI's split (2026-12-02, h10-export)").

    Raises:
        ValueError: :data:`CHILD_PROCESSES_ENV` is set to something else than an int >= 1.
    """
    text = os.environ.get(CHILD_PROCESSES_ENV)
    if text:
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            raise ValueError(f"{CHILD_PROCESSES_ENV} must be an int >= 1, got {text!r}")
        return int(text)
    return 2 if _cores(cores) >= 2 and _can_split() else 1


def _can_split() -> bool:
    """Whether :func:`write_export` can split an export over processes here (fork and splice:
    Linux)."""
    return hasattr(os, "fork") and hasattr(os, "splice")


def _cores(cores: int | None) -> int:
    """``cores``, or where None the usable cores (those this process may run on:
    :func:`recorder.reader_pool.usable_cores`)."""
    return usable_cores() if cores is None else cores


def _load() -> float:
    """How many cores other work keeps busy: the 1-minute load average, or the tasks running
    right now (Linux) if fewer, since the average lags a minute behind (an export just finished
    still counts in it). 0 where neither is known."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return 0.0
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0]) - 1  # this process is one
    except (OSError, ValueError, IndexError):
        return load
    return min(load, float(max(running, 0)))


class Export:
    """The export of one run, produced chunk by chunk in constant memory (blocking).

    Scalar tags come first, sorted, each with restarts applied (as the dashboard shows them), then
    telemetry fields as tags ``telemetry/<host>/rank<r>/<field>``, then the run's alerts as tags
    ``alert/<rule>`` or ``alert/<rule>/<series>`` (step, wall time and offending value of each;
    a missing step or value is an empty CSV cell or a JSON null). Iterating yields UTF-8 chunks
    of at most :data:`FORMAT_ROWS` rows (or ``chunk_rows``, if fewer); their concatenation is the
    whole document. With ``threads`` above 0, blocks are formatted that many at a time in worker
    threads, at most ``2 * threads`` blocks ahead of the consumer, while it reads the run and
    writes what was yielded. Open it with ``with`` (or call :meth:`close`): it holds the run's
    reader and the worker threads. ``run_dir``, ``fmt`` and ``pattern`` are kept as given (a
    child process can export the same: :func:`stream_export_process`); ``rows`` and ``tags``
    count what was produced so far.

    Args:
        run_dir: the run directory.
        fmt: ``"csv"`` (``tag,step,wall_time,value`` rows) or ``"json"``
            (``{tag: [[wall_time, step, value], ...]}``, NaN and infinities as null).
        pattern: a regular expression searched in each tag; None keeps every tag.
        chunk_rows: rows read at a time.
        threads: worker threads formatting rows; 0 formats them in the iterating thread; None
            (the default) takes :func:`export_threads`.

    Raises:
        ValueError: an unknown ``fmt``, a ``chunk_rows`` below 1 or a ``threads`` below 0.
        re.error: a bad ``pattern``.
        recorder.RecorderError: ``run_dir`` is not a readable run.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        fmt: str = "csv",
        pattern: str | None = None,
        *,
        chunk_rows: int = EXPORT_CHUNK_ROWS,
        threads: int | None = None,
    ) -> None:
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"fmt must be one of {EXPORT_FORMATS}, got {fmt!r}")
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"chunk_rows must be a positive int, got {chunk_rows!r}")
        if threads is None:
            threads = export_threads()
        if not isinstance(threads, int) or threads < 0:
            raise ValueError(f"threads must be an int >= 0 or None, got {threads!r}")
        self.fmt = fmt
        self.rows = 0  # rows read so far (all of them once iterated)
        self.tags = 0  # tags that had rows
        self._threads = threads
        self._running: Generator[bytes, None, None] | None = None
        self._regex = re.compile(pattern) if pattern else None
        self.run_dir = os.fspath(run_dir)
        self.pattern = pattern
        self._chunk = chunk_rows
        self._reader = recorder.RunReader(run_dir)

    def stored_points(self) -> int:
        """The scalar points stored under the exported tags (superseded ones included): how
        large the export is, within restarts, telemetry and alerts."""
        return sum(
            info.count
            for tag, info in self._reader.tags().items()
            if info.kind == "scalars" and self._wanted(tag)
        )

    def _wanted(self, tag: str) -> bool:
        return self._regex is None or self._regex.search(tag) is not None

    def _series(self) -> Iterator[tuple[str, Iterator[tuple[Any, np.ndarray, np.ndarray]]]]:
        """``(tag, chunks of (steps or None, walls, values))`` for every tag exported."""
        for tag in self._scalar_tags():
            yield tag, _scalar_chunks(self._reader, tag, self._chunk)
        for tag, w, v in self._telemetry():
            yield tag, ((None, w[i : i + self._chunk], v[i : i + self._chunk])
                        for i in range(0, len(w), self._chunk))  # fmt: skip

    def _scalar_tags(self) -> list[str]:
        """The scalar tags exported (telemetry's reserved ones aside), sorted."""
        tags = self._reader.tags()
        return sorted(
            t
            for t, info in tags.items()
            if info.kind == "scalars" and not t.startswith(RESERVED_TAG_PREFIX) and self._wanted(t)
        )

    def _telemetry(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """``(tag, walls, values)`` of every telemetry field exported, tags sorted."""
        reader = self._reader
        # Telemetry samples are small and few (one a second): gathered in compact columns, from
        # its "@telemetry/" scalar tags (issue 16) and the telemetry events of older runs.
        fields: dict[str, tuple[array.array, array.array]] = {}
        tags = reader.tags()
        for tag in sorted(t for t, info in tags.items() if info.kind == "scalars"):
            if tag.startswith(RESERVED_TAG_PREFIX):
                name = "telemetry/" + tag[len(RESERVED_TAG_PREFIX) :]
                if self._wanted(name):
                    s = reader.read_scalars(tag)
                    fields[name] = (array.array("d", s.walls), array.array("d", s.values))
        for record in reader.read_records(kind="telemetry"):
            data = record.data
            prefix = f"telemetry/{data.get('host', 'host')}/rank{data.get('rank', 0)}/"
            for name, value in (data.get("fields") or {}).items():
                tag = prefix + name
                if tag not in fields:
                    if not self._wanted(tag):
                        continue
                    fields[tag] = (array.array("d"), array.array("d"))
                walls, values = fields[tag]
                walls.append(record.wall)
                values.append(float(value))
        for tag in sorted(fields):
            walls, values = fields.pop(tag)
            w, v = np.frombuffer(walls, np.float64), np.frombuffer(values, np.float64)
            if len(w) > 1 and (w[1:] < w[:-1]).any():  # a run holding both forms
                order = np.argsort(w, kind="stable")
                w, v = w[order], v[order]
            yield tag, w, v

    def __iter__(self) -> Iterator[bytes]:
        rows = self._jobs()
        if not self._threads:
            return (job if isinstance(job, bytes) else job() for job in rows)
        self._running = _run_ahead(rows, self._threads)
        return self._running

    def _jobs(self) -> Generator[bytes | Callable[[], bytes], None, None]:
        """The document in order: bytes, or the formatting of a block of rows still to run."""
        csv_out = self.fmt == "csv"
        yield (CSV_HEADER if csv_out else "{").encode()
        block = min(self._chunk, FORMAT_ROWS)
        for tag, chunks in self._series():
            if csv_out:
                cell = _csv_cell(tag)
            first = True
            for steps, walls, values in chunks:
                for i in range(0, len(walls), block):
                    s = None if steps is None else steps[i : i + block]
                    w, v = walls[i : i + block], values[i : i + block]
                    if csv_out:
                        yield partial(_block, _csv_rows, cell, s, w, v)
                    else:
                        head = ("," if self.tags else "") + "\n" + json.dumps(tag) + ": ["
                        head = (head if first else ", ").encode()
                        yield partial(_block, _json_rows, s, w, v, head)
                    if first:
                        self.tags += 1
                        first = False
                    self.rows += len(w)
            if not csv_out and not first:
                yield b"]"
        for tag, alerts in self._alerts():
            cell = _csv_cell(tag) if csv_out else None
            for i in range(0, len(alerts), self._chunk):
                part = alerts[i : i + self._chunk]
                text = _alert_rows(cell, part)
                if not csv_out:
                    head = (
                        (("," if self.tags else "") + "\n" + json.dumps(tag) + ": [")
                        if not i
                        else ", "
                    )
                    text = head + text
                yield text.encode()
            if not csv_out:
                yield b"]"
            self.tags += 1
            self.rows += len(alerts)
        if not csv_out:
            yield b"\n}\n"

    def _parts(self) -> Iterator[bytes | _TagStart | _TagEnd | _Rows | Callable[[], _Rows]]:
        """The document for a split export (:func:`write_export`), in order: bytes, a tag's
        start, rows formatted already (alerts), or the formatting of a part of a tag's rows
        still to run, its chunks decoded only then. Rows come without what goes between them
        and the tag's head and end (:class:`_Seams`), which depend on what came before: a
        process that formats only some parts does not decode the others. Every process
        iterating this over the same reader state gets the same sequence."""
        csv_out = self.fmt == "csv"
        yield (CSV_HEADER if csv_out else "{").encode()
        for tag in self._scalar_tags():
            cell = _csv_cell(tag) if csv_out else None
            yield _TagStart(tag)
            parts = self._reader.iter_scalar_parts(tag, max_chunk_points=self._chunk)
            for _, read in parts:
                yield partial(_format_part, cell, read)
            yield _TAG_END
        for tag, w, v in self._telemetry():
            cell = _csv_cell(tag) if csv_out else None
            yield _TagStart(tag)
            for i in range(0, len(w), self._chunk):
                yield partial(
                    _format_part, cell, (None, w[i : i + self._chunk], v[i : i + self._chunk])
                )
            yield _TAG_END
        for tag, alerts in self._alerts():
            cell = _csv_cell(tag) if csv_out else None
            yield _TagStart(tag)
            for i in range(0, len(alerts), self._chunk):
                part = alerts[i : i + self._chunk]
                yield _Rows(len(part), [_alert_rows(cell, part).encode()])
            yield _TAG_END
        if not csv_out:
            yield b"\n}\n"

    def _alerts(self) -> list[tuple[str, list[tuple[int | None, float, float | None]]]]:
        """The run's alerts (docs/alerts.md) as ``(tag, [(step, wall, value), ...])``, tags
        ``alert/<rule>`` or ``alert/<rule>/<series>`` in order, each tag's alerts as recorded."""
        tags: dict[str, list[tuple[int | None, float, float | None]]] = {}
        for record in self._reader.read_records(kind="alert"):
            data = record.data
            tag = f"alert/{data.get('rule', 'user')}"
            if data.get("series") is not None:
                tag += f"/{data['series']}"
            if self._wanted(tag):
                value = data.get("value")
                value = None if value is None else float(value)
                tags.setdefault(tag, []).append((record.step, record.wall, value))
        return sorted(tags.items())

    def close(self) -> None:
        """Stop formatting ahead and close the run's reader. Idempotent; never waits on a
        block being formatted (it finishes in its worker thread and is dropped)."""
        if self._running is not None:
            self._running.close()
        self._reader.close()

    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run_ahead(
    jobs: Generator[bytes | Callable[[], bytes], None, None], threads: int
) -> Generator[bytes, None, None]:
    """The results of ``jobs`` in order, the callables run by ``threads`` worker threads, at most
    ``2 * threads`` ahead of the consumer. Closing it early cancels what has not started and
    does not wait for what has."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="vdl-export")
    pending: deque[bytes | Future[bytes]] = deque()
    try:
        for job in jobs:
            pending.append(job if isinstance(job, bytes) else pool.submit(job))
            while len(pending) > 2 * threads:
                done = pending.popleft()
                yield done if isinstance(done, bytes) else done.result()
        while pending:
            done = pending.popleft()
            yield done if isinstance(done, bytes) else done.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        jobs.close()  # lets go of the reader's pinned files now


#: Bytes that lead each part a helper process writes: its length, then its rows (each 8 bytes,
#: little-endian).
_FRAME_HEAD = 16


class _Rows(NamedTuple):
    """Rows of one tag formatted for a split export, without what goes between them and the
    rows before (:class:`_Seams`)."""

    rows: int
    blocks: list[bytes | memoryview]


@dataclass(frozen=True)
class _TagStart:
    """Where a tag's rows start in a split export (its head is written before its first row)."""

    tag: str


class _TagEnd:
    """Where a tag's rows end in a split export (:data:`_TAG_END`)."""


_TAG_END = _TagEnd()


def _alert_rows(cell: str | None, part: list[tuple[int | None, float, float | None]]) -> str:
    """Alert rows ``(step, wall, value)``: CSV rows of the tag cell ``cell``, or JSON rows
    (``cell`` None) joined by ``", "``. Few (the detectors raise at most 20 a minute per run):
    formatted in Python."""
    if cell is not None:
        return "".join(f"{cell},{_csv_step(s)},{w!r},{_csv_value(v)}\n" for s, w, v in part)
    return ", ".join(f"[{w!r}, {_json_value(s)}, {_json_value(v)}]" for s, w, v in part)


def _block(rows: Callable[..., bytes | memoryview], *args: Any) -> bytes:
    """``rows(*args)`` as a bytes object: a block of what iterating :class:`Export` yields. The
    row functions give a view of the array numpy laid the rows out in; a split export
    (:func:`_format_part`) writes that view, saving a copy of every byte."""
    block = rows(*args)
    return block if isinstance(block, bytes) else block.tobytes()


def _format_part(cell: str | None, part: Callable[[], Any] | tuple) -> _Rows:
    """Rows of ``part`` (``(steps or None, walls, values)``, or a function reading them) in
    blocks of :data:`FORMAT_ROWS`: CSV rows of the tag cell ``cell``, or JSON rows (``cell``
    None) joined by ``", "``, with nothing before the first."""
    steps, walls, values = part() if callable(part) else part
    blocks = []
    for i in range(0, len(walls), FORMAT_ROWS):
        s = None if steps is None else steps[i : i + FORMAT_ROWS]
        w, v = walls[i : i + FORMAT_ROWS], values[i : i + FORMAT_ROWS]
        if cell is not None:
            blocks.append(_csv_rows(cell, s, w, v))
        else:
            blocks.append(_json_rows(s, w, v, b", " if i else b""))
    return _Rows(len(walls), blocks)


class _Seams:
    """What goes between the parts of a split export's document, decided in the document's
    order by the process writing it, from the rows each part turned out to hold: a tag's head
    before its first row (JSON ``,\n"tag": [``, after the first tag with rows), ``", "`` between
    JSON rows, ``]`` after a tag's last; nothing for a tag without rows. Counts the rows and
    the tags with rows, as iterating :class:`Export` does."""

    def __init__(self, fmt: str) -> None:
        self.json = fmt == "json"
        self.rows = 0
        self.tags = 0
        self._tag: str | None = None
        self._had = False

    def start(self, tag: str) -> None:
        """The rows that follow are ``tag``'s."""
        self._tag, self._had = tag, False

    def before(self, rows: int) -> bytes:
        """The bytes to write before a part of ``rows`` rows (none: the part is empty)."""
        if not rows:
            return b""
        self.rows += rows
        if self._had:
            return b", " if self.json else b""
        self._had = True
        self.tags += 1
        if not self.json:
            return b""
        return (("," if self.tags > 1 else "") + "\n" + json.dumps(self._tag) + ": [").encode()

    def end(self) -> bytes:
        """The bytes that end the tag started last."""
        return b"]" if self.json and self._had else b""


def write_export(export: Export, out: Any, processes: int = 1) -> None:
    """Write ``export``'s whole document to ``out`` (a binary file: stdout, a file, a pipe); with
    ``processes`` above 1 (Linux, ``out`` with a file descriptor), format it in that many
    processes at once (elsewhere in this one).

    The extra processes are forks of this one, taken once ``export`` has opened its run, so all
    read the same state of it (preads only: no shared file offsets). The rows are dealt out in
    parts of about ``export``'s ``chunk_rows`` (whole stored chunks, so a process decodes only
    the chunks it formats): part ``j`` is formatted by process ``j % processes`` (this one for
    0), each helper writing its parts, each led by its length and rows, into a pipe of its own;
    this process writes its own parts to ``out`` and moves each helper's on in order with
    ``os.splice`` (no copy through this process), writing what goes between them itself
    (:class:`_Seams`). Each process formats in its main thread (``export``'s threads are not
    used) and holds about what one export does. The bytes are those of iterating ``export``,
    and ``export.rows`` and ``export.tags`` count the same. A helper ends when it has written
    its last part, or when this process goes (its pipe broken); this process kills and reaps
    the helpers on any error.

    Raises:
        ValueError: ``processes`` is below 1.
        RuntimeError: a helper process failed (its error is on stderr, which it shares).
        OSError: writing ``out`` failed (``BrokenPipeError`` where its reader went).
    """
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if processes == 1 or not _can_split() or not _has_descriptor(out):
        for chunk in export:
            out.write(chunk)
        out.flush()
        return
    out.flush()  # a helper starts with a copy of what is buffered here
    # The reader's tags (np.unique) import numpy.ma at their first call: here once, not in
    # every process after the fork (about 60 ms of CPU each).
    import numpy.ma  # noqa: F401

    pipes: list[int] = []  # the read end of each helper's pipe
    running: list[int] = []  # helpers not reaped yet
    writer = None
    try:
        for k in range(1, processes):
            read, write = os.pipe()
            _widen_pipe(write)
            pid = os.fork()
            if not pid:
                os.close(read)
                for fd in pipes:
                    os.close(fd)
                _format_share(export, write, k, processes)  # never returns
            os.close(write)
            pipes.append(read)
            running.append(pid)
        seams = _Seams(export.fmt)
        writer = _WriteBehind(out.fileno(), seams)  # a thread: started after the forks
        j = 0
        for item in export._parts():
            if callable(item):
                k = j % processes
                j += 1
                item = item() if not k else pipes[k - 1]
            writer.put(item)
        writer.close()
        export.rows, export.tags = seams.rows, seams.tags
        while running:
            status = os.waitpid(running[0], 0)[1]
            running.pop(0)
            if status:
                raise RuntimeError(f"an export helper process ended with status {status}")
    finally:
        for pid in running:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if writer is not None:
            writer.abandon()  # its pipes ended with their helpers: it is not blocked for long
        for fd in pipes:
            os.close(fd)


def _has_descriptor(out: Any) -> bool:
    """Whether ``out`` is backed by a file descriptor, which a split export writes and splices
    to (a stream in memory, such as a test's captured standard output, is written by one
    process)."""
    try:
        out.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last
        return False
    return True


def _format_share(export: Export, fd: int, k: int, processes: int) -> None:
    """A helper process of :func:`write_export`: formats parts ``k``, ``k + processes``, ...
    of ``export`` into the pipe ``fd``, each led by its length and rows; exits, never
    returns."""
    code = 0
    try:
        # The document's other bytes are the parent's: this process must not hold its output
        # open (the reader would wait for it) nor write there.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        writer = _WriteBehind(fd)
        j = 0
        for item in export._parts():
            if not callable(item):
                continue
            if j % processes == k:
                rows, blocks = item()
                size = sum(len(b) for b in blocks)
                writer.put(size.to_bytes(8, "little") + rows.to_bytes(8, "little"))
                for block in blocks:
                    writer.put(block)
            j += 1
        writer.close()
    except BrokenPipeError:  # the parent went: nobody wants the rest
        code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)  # no parent's cleanup (its open files, atexit) runs here


#: Items a process of a split export formats ahead of its writes: a part of JSON rows is about
#: 3 MB (a helper's part is its head and its blocks of about 0.75 MB).
_WRITE_AHEAD = 4


class _WriteBehind:
    """The writes of one process of a split export (:func:`write_export`), made by a thread of
    its own, at most :data:`_WRITE_AHEAD` items behind: the process formats on while its output
    pipe is full or a helper's part is not there yet (the waits release the GIL). Items are
    bytes to write, or, with ``seams`` (the first process's), :class:`_Rows` of its own, the
    read end of a helper's pipe to move one part from (:func:`_move_frame`) and
    :class:`_TagStart` and :data:`_TAG_END`, each part led by what ``seams`` puts before it.
    The thread's error is raised by the next :meth:`put` or by :meth:`close`; after one, it
    takes items and drops them."""

    def __init__(self, fd: int, seams: _Seams | None = None) -> None:
        self._fd = fd
        self._seams = seams
        self._queue: queue.Queue[Any] = queue.Queue(_WRITE_AHEAD)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vdl-export-write", daemon=True)
        self._thread.start()

    def put(self, item: bytes | int | _Rows | _TagStart | _TagEnd) -> None:
        """Queue ``item`` (blocks while :data:`_WRITE_AHEAD` are queued)."""
        if self._error is not None:
            raise self._error
        self._queue.put(item)

    def close(self) -> None:
        """Wait until everything queued is written; raise the thread's error, if any."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """Drop what is queued and end the thread (after an error elsewhere); waits at most a
        few seconds for a write under way."""
        if self._error is None:
            self._error = RuntimeError("abandoned")
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(EXPORT_KILL_WAIT)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                self._write(item)
            except BaseException as exc:  # raised in the formatting thread
                self._error = exc

    def _write(self, item: bytes | int | _Rows | _TagStart | _TagEnd) -> None:
        seams = self._seams
        if isinstance(item, int):
            assert seams is not None
            _move_frame(item, self._fd, seams.before)
        elif isinstance(item, _Rows):
            assert seams is not None
            if lead := seams.before(item.rows):
                write_all(self._fd, lead)
            for block in item.blocks:
                write_all(self._fd, block)
        elif isinstance(item, _TagStart):
            assert seams is not None
            seams.start(item.tag)
        elif isinstance(item, _TagEnd):
            assert seams is not None
            if end := seams.end():
                write_all(self._fd, end)
        else:
            write_all(self._fd, item)


def _move_frame(src: int, dst: int, before: Callable[[int], bytes]) -> None:
    """Move one part from the helper pipe ``src`` (its length and rows, then its bytes) to
    ``dst``, after ``before(rows)``; spliced (no copy through this process) where ``dst`` takes
    it, read and written elsewhere.

    Raises:
        RuntimeError: the pipe ended before the part did (the helper failed).
    """
    head = b""
    while len(head) < _FRAME_HEAD:
        more = os.read(src, _FRAME_HEAD - len(head))
        if not more:
            raise RuntimeError("an export helper process ended before its blocks did")
        head += more
    left = int.from_bytes(head[:8], "little")
    if lead := before(int.from_bytes(head[8:], "little")):
        write_all(dst, lead)
    while left:
        try:
            moved = os.splice(src, dst, left)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # dst does not take a splice (a terminal, a file opened to append)
            moved = len(data := os.read(src, min(left, EXPORT_PIPE_CHUNK)))
            write_all(dst, data)
        if not moved:
            raise RuntimeError("an export helper process ended before its blocks did")
        left -= moved


def _scalar_chunks(
    reader: recorder.RunReader, tag: str, rows: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A tag's points, restarts applied, in chunks of at most about ``rows``."""
    chunks = getattr(reader, "iter_scalars", None)
    if chunks is not None:
        for s in chunks(tag, start=None, end=None, max_chunk_points=rows):
            yield s.steps, s.walls, s.values
        return
    s = reader.read_scalars(tag)  # a recorder without iter_scalars: the tag at once
    for i in range(0, len(s.steps), rows):
        yield s.steps[i : i + rows], s.walls[i : i + rows], s.values[i : i + rows]


def _csv_cell(tag: str) -> str:
    """The tag as the csv module writes it in a row (quoted when it holds , " or a newline)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow([tag, ""])
    return out.getvalue()[:-2]


def _csv_step(step: int | None) -> str:
    return "" if step is None else str(int(step))


def _csv_value(value: float | None) -> str:
    return "" if value is None else repr(value)


def _json_value(value: float | None) -> str:
    """A step or value in a JSON row: null for none, NaN and infinities."""
    if value is None or not math.isfinite(value):
        return "null"
    return str(value) if isinstance(value, int) else repr(value)


def _interleave(*columns: list) -> tuple:
    flat: list = [None] * (len(columns) * len(columns[0]))
    for i, col in enumerate(columns):
        flat[i :: len(columns)] = col
    return tuple(flat)


try:  # an optional accelerator: shortest round-trip floats formatted in compiled code
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

_COMMA, _NEWLINE, _SPACE = b",\n "
_NUMPY = 0 if _orjson is None else _orjson.OPT_SERIALIZE_NUMPY
#: Bytes :func:`_layout` copies per field: a number as repr() writes it (at most 24 bytes) and its
#: separator (at most 4), or a constant's piece, fits in one.
_UNIT = 32
_ROOM = np.zeros(_UNIT, np.uint8)


def _items(buf: np.ndarray, size: int, count: int | None = None) -> np.ndarray:
    """``buf`` (uint8) as overlapping items of ``size`` bytes, item i starting at byte i (``count``
    of them; default all that fit): one fancy-indexed copy moves ``size`` bytes from and to any
    byte offsets."""
    if count is None:
        count = len(buf) - size + 1
    return np.ndarray((count,), f"V{size}", buf, strides=(1,))


def _put(buf: np.ndarray, at: np.ndarray, sep: bytes) -> None:
    """Write ``sep`` at each byte offset ``at`` of ``buf`` (uint8)."""
    if len(sep) == 1:
        buf[at] = sep[0]
    elif len(at):
        _items(buf, len(sep))[at] = np.frombuffer(sep, f"V{len(sep)}")[0]


def _numbers(
    x: np.ndarray,
    sep: bytes,
    *,
    pre: bytes = b"",
    null_nonfinite: bool = False,
    room: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each number of ``x`` as ``repr()`` writes it, after ``pre`` (none or one byte) and followed
    by ``sep`` (none or at most ``4 - len(pre)`` bytes), as a column for :func:`_layout`:
    ``(text, starts, lengths)``, field i being ``text[starts[i] : starts[i] + lengths[i]]``,
    with at least :data:`_UNIT` bytes of ``text`` from each start, and ``room`` bytes before the
    first (so an item of ``room`` bytes may end where a field ends: :func:`_json_slots`).

    The digits come from one orjson call: its shortest round-trip digits are repr's, and so is its
    layout except in exponent notation (below 1e-4 and from 1e16) and for non-finite values: those
    fields are respelled by :func:`_repr_fields` in rows appended to orjson's text (non-finite
    values stay orjson's ``null``, if asked). A one-byte ``sep`` goes where orjson put its comma;
    a longer one, or ``pre``, in the room orjson's indented layout leaves between numbers
    (``",\\n  "``). With ``sep`` none or ``,`` and no ``pre``, the byte before each field but
    the first is a comma (orjson's, or one written before a respelled field), so an item may
    start there (:func:`_csv_slots`).
    """
    integers = x.dtype.kind in "iu"
    x = np.ascontiguousarray(x, np.int64 if integers else np.float64)
    wide = len(sep) > 1 or bool(pre)
    text = _orjson.dumps(x, option=_NUMPY | (_orjson.OPT_INDENT_2 if wide else 0))
    raw = np.frombuffer(text, np.uint8)
    if wide:  # "[\n  1.5,\n  2\n]": a newline 3 bytes before each number and before the "]"
        lines = np.flatnonzero(raw == _NEWLINE)
        starts = lines[:-1] + 3
        ends = lines[1:] - 1  # the comma after each number
        ends[-1] += 1  # the last has none
    else:  # "[1.5,2]"
        ends = np.flatnonzero(raw == _COMMA)  # no number holds a comma
        ends = np.append(ends, len(text) - 1)  # the closing bracket ends the last
        starts = np.empty_like(ends)
        starts[0] = 1
        starts[1:] = ends[:-1] + 1
    lengths = ends - starts  # the numbers alone, for now
    redone = b""
    odd: Any = ()
    if not integers:
        ax = np.abs(x)
        low, high = ax.min(), ax.max()  # NaN if any is
        if not (low >= 1e-4 and high < 1e16):
            keep = (ax == 0) | ((ax >= 1e-4) & (ax < 1e16))  # NaN compares False
            if null_nonfinite:
                keep |= ~np.isfinite(x)  # orjson writes them null already
            odd = np.flatnonzero(~keep)
        if len(odd):
            redone, sizes = _repr_fields(x[odd], text, starts[odd], lengths[odd])
            lengths[odd] = sizes
    # The respelled rows go after the room the last number's separator takes (2 bytes past
    # orjson's "\n]"), each a byte in: the byte before is ``pre``.
    rows = room + len(text) + 4
    size = rows + 1 + len(redone)
    buf = np.empty(size + _UNIT, np.uint8)  # and the room after the last field's start
    buf[room : room + len(text)] = raw
    if room:
        starts += room
    if len(odd):
        buf[rows + 1 : size] = np.frombuffer(redone, np.uint8)
        starts[odd] = rows + 1 + _WIDTH * np.arange(len(odd))
        if not wide:  # as orjson's compact layout has a comma before the others
            buf[starts[odd] - 1] = _COMMA
    ends = starts + lengths
    # After every number but the last orjson wrote a comma, and in its indented layout the next
    # line's newline and indentation: only the bytes of ``sep`` that differ are written there,
    # a byte at a time (one byte is one pass; a multi-byte item is one slower pass, and the
    # rows' ", " and "], " keep orjson's space). Where orjson wrote none, after the last
    # number and in the respelled rows, all of ``sep``.
    after = b",\n  " if wide else b","
    for j, byte in enumerate(sep):
        if j >= len(after) or byte != after[j]:
            buf[ends + j] = byte
    if sep:
        _put(buf, ends[np.append(odd, len(x) - 1).astype(np.int64)], sep)
        lengths += len(sep)
    if pre:
        starts -= 1
        lengths += 1
        # orjson's indentation is spaces: the respelled rows have none
        _put(buf, starts if pre != b" " else starts[odd], pre)
    return buf, starts, lengths


#: Columns of the rows :func:`_repr_fields` rewrites numbers in: the longest repr() of a float
#: ("-2.2250738585072014e-308") is 24 bytes, and a rewrite adds at most 2.
_WIDTH = 32
_COLUMNS = np.arange(_WIDTH, dtype=np.uint8)
_E, _MINUS, _PLUS, _ZERO, _DOT = b"e-+0."
#: Fields up to this many are respelled by repr() one by one.
_FEW_FIELDS = 64


def _repr_fields(
    x: np.ndarray, text: bytes, starts: np.ndarray, lengths: np.ndarray
) -> tuple[bytes, np.ndarray]:
    """The floats ``x`` as repr() writes them, from orjson's text of each (``text[starts[i]:]``,
    ``lengths[i]`` bytes), in rows of :data:`_WIDTH` bytes (what follows a number in its row is
    undefined); returns the rows' bytes and each number's length.

    orjson's digits are repr's; only their spelling is rewritten, with a few passes over the rows
    (a learning rate below 1e-4 makes a whole column of these, and repr() takes many times
    orjson's time): an exponent gets repr's sign and two digits at least (``1e16`` -> ``1e+16``,
    ``1.5e-7`` -> ``1.5e-07``), and a positional number below 1e-4 (``0.0000123``) goes to
    exponent notation (``1.23e-05``). Anything else (non-finite values) is formatted by repr().
    """
    m = len(x)
    if m <= _FEW_FIELDS:  # a zero crossing's few: the passes' fixed cost would be most of it
        texts = [repr(v).encode() for v in x.tolist()]
        sizes = np.fromiter(map(len, texts), np.int64, m)
        return b"".join(t.ljust(_WIDTH, b"\0") for t in texts), sizes
    r = np.arange(m)
    windows = np.lib.stride_tricks.sliding_window_view(
        np.frombuffer(text + bytes(_WIDTH), np.uint8), _WIDTH
    )
    # Each field's row, rewritten in place; the bytes after a field's end (the next fields') are
    # never read: _layout copies ``size`` bytes.
    rows = windows[starts]
    size = lengths.astype(np.int64)
    finite = np.isfinite(x)
    done = np.zeros(m, bool)
    # orjson's exponent notation ends a field with "e", maybe "-", and 1 to 3 digits: repr()
    # writes the sign always and two digits at least.
    flat = rows.reshape(-1)  # byte j of row i at i * _WIDTH + j: 1-D indexing is the fast kind
    base = r * _WIDTH
    epos = np.full(m, -1)
    for back in (2, 3, 4, 5):
        at = np.maximum(size - back, 0)
        epos = np.where((epos < 0) & (flat.take(base + at) == _E), at, epos)
    (i,) = np.nonzero((epos > 0) & finite)
    if len(i):
        e = base[i] + epos[i]  # the "e", in flat
        neg = flat.take(e + 1) == _MINUS
        first = e + 1 + neg
        digits = base[i] + size[i] - first
        power = flat.take(first).astype(np.int64) - _ZERO
        for j in (1, 2):
            more = flat.take(first + j).astype(np.int64) - _ZERO
            power = np.where(digits > j, power * 10 + more, power)
        wide = power >= 100
        flat[e + 1] = np.where(neg, _MINUS, _PLUS)
        flat[e + 2] = _ZERO + np.where(wide, power // 100, power // 10)
        flat[e + 3] = _ZERO + np.where(wide, power // 10 % 10, power % 10)
        flat[e + 4] = _ZERO + power % 10  # past the end unless wide
        size[i] = epos[i] + 4 + wide
        done[i] = True
    # Positional below 1e-4, [-]0.000ddd -> [-]d.dde-XX: the rows of each sign and count of
    # zeros alike (in practice one or two kinds: orjson writes exponents below 1e-5).
    neg = (rows[:, 0] == _MINUS).astype(np.int64)
    small = ~done & finite & (np.abs(x) < 1e-4) & (flat.take(base + neg) == _ZERO)
    small &= flat.take(base + neg + 1) == _DOT
    (i,) = np.nonzero(small)
    if len(i):
        g = rows[i]
        cols = _COLUMNS[None, :]
        inside = (cols >= (neg[i] + 2)[:, None]) & (cols < size[i][:, None])
        first = (inside & (g != _ZERO)).argmax(1)
        key = neg[i] * _WIDTH + first
        for kind in np.unique(key).tolist():
            sign, at = divmod(kind, _WIDTH)
            power = at - sign - 1
            pick = key == kind
            if not at or power > 99:
                continue  # repr() below
            h = np.zeros_like(g[pick])
            h[:, :sign] = _MINUS
            h[:, sign] = g[pick, at]
            h[:, sign + 1] = _DOT
            h[:, sign + 2 : sign + 2 + _WIDTH - at - 1] = g[pick, at + 1 :]
            digits = size[i[pick]] - at
            end = sign + np.where(digits > 1, digits + 1, 1)
            k = np.arange(len(h))
            for j, c in enumerate(b"e-%02d" % power):
                h[k, end + j] = c
            rows[i[pick]] = h
            size[i[pick]] = end + 4
            done[i[pick]] = True
    for j in np.flatnonzero(~done).tolist():
        spelling = np.frombuffer(repr(float(x[j])).encode(), np.uint8)
        rows[j, : len(spelling)] = spelling
        size[j] = len(spelling)
    return rows.tobytes(), size


def _layout(n: int, parts: list, lead: bytes = b"", trim: int = 0) -> memoryview:
    """``n`` rows made of ``parts`` (constant bytes, or :func:`_numbers` columns) side by side,
    after ``lead``, less ``trim`` bytes at the end: no Python object per field. A view of the
    array it built them in (no copy into a bytes object: :func:`_block`).

    Each row's fields' offsets in the output are a cumulative sum of their lengths. Every field
    of every row is then one item of :data:`_UNIT` bytes: one fancy-indexed gather takes the items
    from the fields' texts, one fancy-indexed assignment puts them at their offsets, in output
    order, so the bytes an item carries past its field's end are overwritten by the next field's
    item (numpy assigns in index order: :data:`_IN_ORDER`), and the last one's fall in the room
    after the end. Two copies per field, whatever its length.
    """
    pieces: list = []
    for part in parts:  # constants in pieces of at most _UNIT bytes (a long tag's cell)
        if isinstance(part, bytes):
            pieces += [part[i : i + _UNIT] for i in range(0, len(part), _UNIT)]
        else:
            pieces.append(part)
    starts = np.empty((n, len(pieces)), np.int64)
    sizes = np.empty((n, len(pieces)), np.int64)
    texts = []
    offset = 0
    for j, piece in enumerate(pieces):
        if isinstance(piece, bytes):
            text = np.frombuffer(piece, np.uint8)
            starts[:, j] = offset
            sizes[:, j] = len(piece)
        else:
            text, first, length = piece
            np.add(first, offset, out=starts[:, j])
            sizes[:, j] = length
        texts.append(text)
        offset += len(text)
    texts.append(_ROOM)  # a constant's item reads past the end
    source = np.concatenate(texts)
    at = sizes.reshape(-1)
    ends = np.cumsum(at)
    total = len(lead) + int(ends[-1])
    np.subtract(ends, at, out=at)
    at += len(lead)
    out = np.empty(total + _UNIT, np.uint8)
    out[: len(lead)] = np.frombuffer(lead, np.uint8)
    _items(out, _UNIT, total + 1)[at] = _items(source, _UNIT)[starts.reshape(-1)]
    return out[: total - trim].data


def _in_order() -> bool:
    """Whether a fancy-indexed assignment of overlapping items writes them in index order (what
    :func:`_layout` relies on; numpy's does). Checked once, at import."""
    source = np.arange(4 * _UNIT, dtype=np.uint8)
    out = np.zeros(3 * _UNIT, np.uint8)
    _items(out, _UNIT, 2 * _UNIT)[np.array([0, 3, 8])] = _items(source, _UNIT)[
        np.array([0, 40, 80])
    ]
    return out[:10].tolist() == [0, 1, 2, 40, 41, 42, 43, 44, 80, 81]


#: False would send every row through the formatting without orjson.
_IN_ORDER = _in_order()


def _fast() -> bool:
    """Whether rows are laid out by numpy from orjson's digits (:func:`_layout`), not formatted
    in Python. Asked at each block, not kept in a flag: ``_orjson`` can be switched off after
    import (the tests compare both paths)."""
    return _orjson is not None and _IN_ORDER


def _csv_rows(
    cell: str, steps: np.ndarray | None, walls: np.ndarray, values: np.ndarray
) -> bytes | memoryview:
    """CSV rows ``cell,step,repr(wall),repr(value)``, laid out by numpy from orjson's digits
    (then a view of numpy's array: :func:`_block`)."""
    n = len(walls)
    if not n:
        return b""
    if _fast():
        width = 0 if steps is None else _step_width(steps)
        if width is not None:
            return _csv_slots(cell.encode() + b",", steps, walls, values, width)
        head = cell.encode() + b","
        return _layout(
            n, [head, _numbers(steps, b","), _numbers(walls, b","), _numbers(values, b"\n")]
        )
    cell = cell.replace("%", "%%")
    if steps is None:
        text = (cell + ",,%r,%r\n") * n % _interleave(walls.tolist(), values.tolist())
    else:
        text = (
            (cell + ",%d,%r,%r\n")
            * n
            % _interleave(steps.tolist(), walls.tolist(), values.tolist())
        )
    return text.encode()


def _json_rows(
    steps: np.ndarray | None, walls: np.ndarray, values: np.ndarray, head: bytes = b""
) -> bytes | memoryview:
    """``head``, then JSON rows ``[wall, step, value]`` joined by ``", "``; non-finite values as
    null (a view of numpy's array where numpy laid them out: :func:`_block`)."""
    n = len(walls)
    if not n:
        return head
    if _fast():
        width = _step_width(steps)
        if width is not None:
            return _json_slots(steps, walls, values, head, width)
        # Rows "[w," " s," " v], ", the last one's ", " trimmed.
        w = _numbers(walls, b",", pre=b"[")
        s = b" null," if steps is None else _numbers(steps, b",", pre=b" ")
        v = _numbers(values, b"], ", pre=b" ", null_nonfinite=True)
        return _layout(n, [w, s, v], lead=head, trim=2)
    vals: list = values.tolist()
    for i in np.flatnonzero(~np.isfinite(values)).tolist():
        vals[i] = "null"
    if steps is None:
        text = ("[%r, null, %s], " * n)[:-2] % _interleave(walls.tolist(), vals)
    else:
        text = ("[%r, %d, %s], " * n)[:-2] % _interleave(walls.tolist(), steps.tolist(), vals)
    return head + text.encode()


#: ASCII digits of 0 to 9999, four bytes each ("0000", "0001", ...), as one uint32 an entry.
_DIGITS4 = np.frombuffer(b"".join(b"%04d" % i for i in range(10_000)), np.uint32)
#: ``null`` as one such word: the step of a row without one.
_NULL4 = np.frombuffer(b"null", np.uint32)[0]
#: What starts a JSON row in its slot (:func:`_json_slots`): the separator after the row before,
#: and the row's bracket.
_ROW_OPEN = b"], ["
#: What follows a step in a JSON row (:func:`_json_slots`), as one uint32 word (the value's
#: digits overwrite its last two bytes).
_STEP_END = np.frombuffer(b", \0\0", np.uint32)[0]


#: The last three digits of an integer part and the decimal point ("000." ... "999."), and the
#: last two digits of a fraction's six (two bytes after them unused), as uint32 words.
_DIGITS3_DOT = np.frombuffer(b"".join(b"%03d." % i for i in range(1000)), np.uint32)
_DIGITS2 = np.frombuffer(b"".join(b"%02d\0\0" % i for i in range(100)), np.uint32)
#: How many digits of a fraction's six repr() writes (up to the last that is not zero, one at
#: least: "5.0"), by its first four: those four's count; by its last two: 4 plus theirs, 0 where
#: both are zero. The larger of the two is the count (:func:`_micro_walls`).
_KEPT4 = np.array([max(len((b"%04d" % i).rstrip(b"0")), 1) for i in range(10_000)], np.int64)
_KEPT2 = np.array([i and 4 + len((b"%02d" % i).rstrip(b"0")) for i in range(100)], np.int64)
#: Below this many seconds (the year 2242) neighbouring float64s are at most 2**-20 s apart, less
#: than a microsecond: one decimal of at most six places rounds to each (:func:`_micro_walls`).
_MICRO_WALLS_BELOW = 2.0**33


def _micro_walls(
    walls: np.ndarray, bracket: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The fields ``[w,`` of wall times that are whole microseconds (as the recorder stores
    them, ``us / 1e6``), as :func:`_numbers` gives them with ``pre=b"["``, ``sep=b","`` and
    ``room=_UNIT``, and ``], `` in the 3 bytes before each (the row before's end in
    :func:`_json_slots`); with ``bracket`` False, CSV's ``w,`` with a comma before each (the
    step's, in :func:`_csv_slots`). The comma after each is not written (the lengths count it,
    the byte is left as it is): the item copied after the field brings it (JSON's step's,
    CSV's value's). Formatted
    in numpy from digit tables (no orjson, no newline search); None where any is not a whole
    microsecond, below 1 s, from :data:`_MICRO_WALLS_BELOW`, or where
    their integer parts' widths differ. Each field starts at the same column of a row of its
    own (the starts are evenly spaced, at least :data:`_UNIT` bytes before the buffer's end:
    :func:`_csv_slots` reads them with a stride).

    Why it is repr(): a wall ``w == u / 1e6`` (u an integer, the division correctly rounded)
    is the float64 nearest the decimal ``u / 10**6``; below 2**33 the float64s around ``w`` are
    less than 1e-6 apart, so no other decimal of at most six places rounds to ``w`` and that one,
    written with its trailing zeros dropped (one kept: ``5.0``), is the shortest that does:
    repr()'s digits, in its positional notation (1e-4 <= w < 1e16).
    """
    low, high = walls.min(), walls.max()
    if not (low >= 1.0 and high < _MICRO_WALLS_BELOW):  # NaN compares False
        return None
    u = np.rint(walls * 1e6)
    # Above about 2**32 s the product's own rounding can land it past the nearer half, one
    # microsecond off: the neighbours are tried (below 2**33 at most one of them divides back
    # to the wall, see above).
    off = np.flatnonzero(u / 1e6 != walls)
    for step in (-1.0, 1.0):
        if len(off) == 0:
            break
        near = u[off] + step
        found = near / 1e6 == walls[off]
        u[off[found]] = near[found]
        off = off[~found]
    if len(off):
        return None
    whole, fraction = _divmod(u.astype(np.int64), 1_000_000)
    width = len(str(int(whole[0])))
    if len(str(int(whole.min()))) != width or len(str(int(whole.max()))) != width:
        return None
    n = len(walls)
    head = -(-(width + 1) // 4)  # words of the integer part and its point
    cols = 4 * (head + 3)  # a word before them for the "[", two words of fraction
    buf = np.empty(_UNIT + n * cols + _UNIT, np.uint8)
    quads = buf[_UNIT : _UNIT + n * cols].view(np.uint32).reshape(n, cols // 4)
    q, last3 = _divmod(whole, 1000)
    quads[:, head] = _DIGITS3_DOT[last3]
    lead = _ROW_OPEN if bracket else b","
    if head == 1 or not _upper_words(quads, q, head, lead):
        rows = buf[_UNIT : _UNIT + n * cols].reshape(n, cols)
        for j, byte in enumerate(lead):  # over the leading zeros of the first digits' word
            rows[:, 4 * (head + 1) - width - 1 - len(lead) + j] = byte
    first4, last2 = _divmod(fraction, 100)
    quads[:, head + 1] = _DIGITS4[first4]
    quads[:, head + 2] = _DIGITS2[last2]
    kept = _KEPT2[last2]
    np.maximum(kept, _KEPT4[first4], out=kept)
    start = 4 * (head + 1) - width - 2  # the "["; 3 bytes at least before it
    if not bracket:
        start += 1
    starts = np.arange(_UNIT + start, _UNIT + n * cols, cols)
    lengths = kept + (width + 2 + bracket)  # "[", the integer part, ".", the fraction, ","
    return buf, starts, lengths


def _divmod(x: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.divmod(x, d)`` for int64 ``x`` and a positive ``d``: a floor division, a product and
    a difference (numpy divides by a scalar with a precomputed multiplier in ``//``, not in
    ``divmod``: about 1 against 8 ns an element)."""
    q = x // d
    r = q * d
    np.subtract(x, r, out=r)
    return q, r


#: Distinct upper parts (the integer part less its last three digits) of a block's walls up to
#: which :func:`_upper_words` formats each once: a block of 65,536 rows at 50 steps/s spans 1,311 s,
#: two or three of them.
_FEW_UPPER = 64


def _upper_words(quads: np.ndarray, upper: np.ndarray, head: int, lead: bytes = b"") -> bool:
    """Write the digits of ``upper`` (int64 of one digit count, positive: an integer part less
    its last three digits) right-aligned in ``quads``' uint32 columns 1 to ``head - 1``, four
    digits a word, and ``lead`` right before them where it can: True where it did (the bytes
    before ``lead`` in its first word, or the first word's leading zeros with no ``lead``, are
    the caller's to cover or to leave), False where ``lead`` is the caller's to write.

    Walls written at training's pace share these digits across a block (seconds since the epoch
    change their fourth digit from the end every 1,000 s): where they span at most
    :data:`_FEW_UPPER` values, each is formatted once, with ``lead``, and its words copied to its
    rows a uint32 column at a time (numpy copies whole items of 8 or 12 bytes 4-6 times slower
    than uint32s): a broadcast where all are alike, or down each run of one value where there
    are fewer than :data:`_FEW_UPPER` runs (sorted walls), else a gather from that small table;
    else
    digit by digit, as :func:`_step_words` writes steps (``head - 1`` words hold every digit of
    ``upper``), and False.
    """
    low, high = int(upper.min()), int(upper.max())
    span = high - low + 1
    if span > _FEW_UPPER:
        _step_words(quads, upper, 1, head - 1, False)
        return False
    digits = len(str(high))
    words = -(-(len(lead) + digits) // 4)  # at most head: lead is the "[" and 3 bytes before
    size = 4 * words
    texts = (lead + b"%d" % v for v in range(low, high + 1))
    table = np.frombuffer(b"".join(x.rjust(size, b"0") for x in texts), np.uint32)
    table = table.reshape(span, words).T.copy()  # a word's column contiguous
    first = head - words
    if span == 1:
        for k in range(words):
            quads[:, first + k] = table[k, 0]
        return True
    cuts = np.flatnonzero(upper[1:] != upper[:-1])
    if len(cuts) < _FEW_UPPER:  # sorted (as written): a few runs of one value, each broadcast
        bounds = [0, *(cuts + 1).tolist(), len(upper)]
        for a, b in itertools.pairwise(bounds):
            v = int(upper[a]) - low
            for k in range(words):
                quads[a:b, first + k] = table[k, v]
        return True
    pick = upper - low
    for k in range(words):
        quads[:, first + k] = table[k].take(pick)
    return True


def _step_width(steps: np.ndarray | None) -> int | None:
    """The width of every step of ``steps`` as text (4 for None: ``null``), or None where they
    differ (signs or digit counts mixed), are not int64 or hold its minimum."""
    if steps is None:
        return 4
    if steps.dtype != np.int64:
        return None
    low, high = int(steps.min()), int(steps.max())
    if (low < 0) != (high < 0) or len(str(low)) != len(str(high)) or low == -(2**63):
        return None
    return len(str(low))  # the same for every step between: the width grows with |step|


def _json_slots(
    steps: np.ndarray | None, walls: np.ndarray, values: np.ndarray, head: bytes, width: int
) -> memoryview:
    """What :func:`_json_rows` gives, for steps all ``width`` bytes wide: each row built whole in
    a slot row of its own, then moved into place in one piece.

    The rows are built as ``], [w, s, v``: the separator before each row, not after it, so the
    value's field is the last and needs no bytes after its digits (the next row's item covers
    what its item carries past them); the first row's ``], `` gives way to ``head`` and one
    ``]`` ends the last. Every row starts at the first column of its slot, as CSV's start at one
    column (:func:`_csv_slots`): the wall's field ``], [w,`` goes there, read with a stride from
    :func:`_micro_walls`' rows where the walls are whole microseconds, as the recorder stores
    them (else gathered from orjson's digits); the step's ``, s, `` at the wall's comma (which
    it brings: :func:`_micro_walls` writes none), one item scattered from rows of their own, where its digits are written right-aligned in whole words
    from :data:`_DIGITS4` (no orjson) and read with a stride; the value's digits after that
    (orjson's compact call, as CSV's: one gather and one scatter of an item). The rows are then
    read from their slots with a stride (no gather) and put side by side with one assignment of
    items as wide as the widest row (in order: an item's bytes past its row's end are
    overwritten by the next row's). Three fancy-indexed copies a row where the walls are whole
    microseconds (the step's and the value's scatters, the value's gather; the rows' move has
    no gather): until h10-export the wall's field ended at one column (its start varied with
    its fraction's digits), so it was gathered into its slot and the rows gathered from theirs,
    3-12% more CPU a row (docs/performance.md, "Export: the CLI's split").
    """
    n = len(walls)
    fields = _micro_walls(walls)
    w, w_at, w_len = _numbers(walls, b",", pre=b"[", room=_UNIT) if fields is None else fields
    v, v_at, v_len = _numbers(values, b",", null_nonfinite=True)
    negative = steps is not None and int(steps[0]) < 0
    words = -(-(width - negative) // 4)
    # The step's `` s, `` in rows of its own: the digits right-aligned in words 1 to ``words``
    # (word 0 holds the space, and the minus sign where the first word is full), ", " after.
    digits_end = 4 * (1 + words)
    lead = digits_end - width - 1  # the space before the step
    item = 16 if width + 4 <= 16 else _UNIT  # ", s, "
    step_cols = max(-(-(lead + item) // 4), 1 + words + 1) * 4
    texts = np.empty(n * step_cols + item, np.uint8)
    step_rows = texts[: n * step_cols].reshape(n, step_cols)
    quads = step_rows.view(np.uint32)
    if steps is None:
        quads[:, 1] = _NULL4
    else:
        _step_words(quads, steps, 1, words, negative)
    step_rows[:, lead] = _SPACE
    step_rows[:, lead - 1] = _COMMA  # the wall's (_micro_walls writes none)
    if negative:
        step_rows[:, lead + 1] = _MINUS
    quads[:, 1 + words] = _STEP_END
    # The slots: "], [w," from the first column, the step's item after it, the value's next.
    cols = -(-(3 + int(w_len.max()) + width + 3 + _UNIT) // 4) * 4
    row_len = w_len + v_len
    row_len += width + 5  # "], ", " ", ", " less the value's comma
    size = -(-int(row_len.max()) // 16) * 16
    slots = np.empty(n * cols + max(size, _UNIT), np.uint8)
    if fields is not None:  # one column of _micro_walls' rows: "], " is in the 3 bytes before
        stride = int(w_at[1] - w_at[0]) if n > 1 else 1
        wall_items = np.ndarray((n,), f"V{_UNIT}", w, int(w_at[0]) - 3, (stride,))
    else:  # orjson's, with its indentation before the "[" (and the comma before that)
        wall_items = _items(w, _UNIT)[w_at - 3]
    np.ndarray((n,), f"V{_UNIT}", slots, 0, (cols,))[...] = wall_items
    if fields is None:
        rows = slots[: n * cols].reshape(n, cols)
        for j, byte in enumerate(_ROW_OPEN[:-1]):
            rows[:, j] = byte
    at = np.arange(2, n * cols, cols)
    at += w_len  # at the wall's comma
    _items(slots, item)[at] = np.ndarray((n,), f"V{item}", texts, lead - 1, (step_cols,))
    at += width + 4
    _items(slots, _UNIT)[at] = _items(v, _UNIT)[v_at]
    # The rows go from ``len(head)`` in ``out`` and ``head`` to 3 bytes later, over the first
    # row's "], ": the document is ``out[3:]``.
    at = np.cumsum(row_len)
    end = len(head) + int(at[-1])
    at -= row_len
    at += len(head)
    out = np.empty(end + size + 1, np.uint8)
    _items(out, size, end + 1)[at] = np.ndarray((n,), f"V{size}", slots, 0, (cols,))
    out[3 : 3 + len(head)] = np.frombuffer(head, np.uint8)
    out[end] = ord("]")
    return out[3 : end + 1].data


def _put_columns(rows: np.ndarray, col: int, text: bytes) -> None:
    """Write ``text`` at column ``col`` of every row of ``rows`` (uint8, 2-D, each row a whole
    number of uint32 words), a uint32 column at a time where its bytes fill a word (the bytes
    of the first word before ``col`` are overwritten: the caller's to leave free), else a byte
    at a time: numpy broadcasts an item of 5 bytes down a column 4-8 times slower than a uint32
    or a byte (a CSV row's tag cell, :func:`_csv_slots`)."""
    lead = col % 4
    text = bytes(lead) + text
    col -= lead
    whole = len(text) // 4
    quads = rows.view(np.uint32)
    for k, word in enumerate(np.frombuffer(text, np.uint32, whole).tolist()):
        quads[:, col // 4 + k] = word
    for j in range(4 * whole, len(text)):
        rows[:, col + j] = text[j]


def _step_words(
    quads: np.ndarray, steps: np.ndarray, first: int, words: int, negative: bool
) -> None:
    """Write the digits of ``steps`` (int64, all of one width, of one sign: ``negative``; no
    minus sign) right-aligned in the ``words`` uint32 columns of ``quads`` from ``first``, four
    digits a word from :data:`_DIGITS4` (the first word's leading zeros are the caller's to
    cover)."""
    q = np.negative(steps) if negative else steps
    for k in range(first + words - 1, first, -1):
        q, low = _divmod(q, 10_000)
        quads[:, k] = _DIGITS4[low]
    quads[:, first] = _DIGITS4[q]


def _csv_slots(
    head: bytes, steps: np.ndarray | None, walls: np.ndarray, values: np.ndarray, width: int
) -> memoryview:
    """What :func:`_csv_rows` gives (``head`` its tag cell and comma), for steps all ``width``
    bytes wide (0: none): each row built whole in a slot row of its own, then moved into place
    in one piece, as :func:`_json_slots` builds JSON's.

    The rows are built as ``\\nhead step,wall,value``: the newline before each row, not after
    it, so the value's field is the last and needs no bytes after its digits (the next row's
    item covers what its item carries past them); the first row's newline is dropped and one
    ends the last. A row starts with its only fields of fixed width. In its slot row the step's
    digits are written right-aligned in whole words from :data:`_DIGITS4`, the newline and
    ``head`` (a constant) right before them: the row's start is the same column in every slot.
    The wall's field ``,wall`` goes right after the step (from :func:`_micro_walls` where the
    walls are whole microseconds, as the recorder stores them, read with a stride; else
    gathered from orjson's digits), a strided copy of one 32-byte item that brings the step's
    comma; the value's ``,value`` right after the wall's digits (one gather and one scatter of
    an item: the wall's width varies), the comma orjson wrote before it being the wall's. The
    rows are then read from their slots with a stride (no gather) and put side by side with one
    assignment of items as wide as the widest row (in order: an item's bytes past its row's end
    are overwritten by the next row's). Two or three fancy-indexed copies a row, against eight
    for :func:`_layout`'s four fields, one orjson call against three, no newline search or
    separators for the steps and walls, and no pass that writes a comma or a newline a row:
    until h11-csv the newline ended each row (written over orjson's commas), and the step's
    and the wall's commas were written a row at a time (docs/performance.md, "Export: CSV rows
    with their newline first (2026-12-02, h11-csv)").
    """
    n = len(walls)
    fields = _micro_walls(walls, bracket=False)
    w, w_at, w_len = _numbers(walls, b",") if fields is None else fields
    v, v_at, v_len = _numbers(values, b"")
    v[int(v_at[0]) - 1] = _COMMA  # orjson's "[" before the first value (a comma before any other)
    lead = b"\n" + head
    negative = steps is not None and int(steps[0]) < 0
    words = -(-(width - negative) // 4)
    # The step's words start past room for the lead (and a minus sign before a first word the
    # digits fill); the wall's comma goes right after them.
    step_at = -(-(len(lead) + 1) // 4) * 4
    comma = step_at + 4 * words
    start = comma - width - len(lead)  # the row's first byte, in every slot
    wide = int(w_len.max())
    cols = -(-(comma + wide + _UNIT) // 4) * 4  # room for the value's item after the wall
    row_len = v_len + w_len
    row_len += len(lead) + width + 1
    size = -(-int(row_len.max()) // 16) * 16
    slots = np.empty(n * cols + size, np.uint8)
    rows = slots[: n * cols].reshape(n, cols)
    if steps is not None:
        _step_words(rows.view(np.uint32), steps, step_at // 4, words, negative)
    # over the leading zeros of the step's first word
    column = partial(np.ndarray, (n,), buffer=slots, strides=(cols,))
    _put_columns(rows, start, lead)
    if negative:
        rows[:, comma - width] = _MINUS
    if fields is None:  # orjson's, with its comma before each (its "[" before the first)
        w[int(w_at[0]) - 1] = _COMMA
        wall_items = _items(w, _UNIT)[w_at - 1]
    else:  # _micro_walls' fields start at one column of its rows: read with a stride, no gather
        stride = int(w_at[1] - w_at[0]) if n > 1 else 1
        wall_items = np.ndarray((n,), f"V{_UNIT}", w, int(w_at[0]) - 1, (stride,))
    column(f"V{_UNIT}", offset=comma)[...] = wall_items
    at = np.arange(comma, n * cols, cols)
    at += w_len  # the wall's comma
    _items(slots, _UNIT)[at] = _items(v, _UNIT)[v_at - 1]
    # The rows go from byte 0 of ``out``: the document is ``out[1:]``, over the first newline.
    at = np.cumsum(row_len)
    total = int(at[-1])
    at -= row_len
    out = np.empty(total + size, np.uint8)
    _items(out, size, total + 1)[at] = column(f"V{size}", offset=start)
    out[total] = _NEWLINE
    return out[1 : total + 1].data


async def stream_export(export: Export) -> AsyncIterator[bytes]:
    """Yield ``export``'s chunks, each produced in a worker thread (the event loop never formats
    a row); closes ``export`` at the end, or when the consumer stops early."""
    import trio

    chunks = iter(export)
    limiter = trio.CapacityLimiter(1)  # one block at a time: the export is sequential
    try:
        while True:
            chunk = await trio.to_thread.run_sync(next, chunks, None, limiter=limiter)
            if chunk is None:
                return
            yield chunk
    finally:
        export.close()


#: Stored points from which ``GET /api/export`` formats in a child process (its start, about
#: 0.3 s, is then a small part of the export).
EXPORT_PROCESS_POINTS = 1_000_000
#: Bytes of each chunk passed on from the child's output (but the last): its pipe's size
#: (:func:`_widen_pipe`). 4 MB took as much CPU and held 10 MB more.
EXPORT_PIPE_CHUNK = 1 << 20
#: Longest the child may take to go once killed.
EXPORT_KILL_WAIT = 5.0
#: Export child processes a server runs at once (each holds about 60 MB); more exports at the
#: same time are formatted in the server's worker threads.
EXPORT_PROCESSES = 2
#: Where the child imports this very package from, wherever that is.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def stream_export_process(export: Export, slots: Any = None) -> AsyncIterator[bytes]:
    """Yield ``export``'s bytes, formatted by a ``vdl-stream export`` child process of the same
    run, format and pattern, read from its output in chunks of :data:`EXPORT_PIPE_CHUNK` bytes;
    ``export`` itself is closed. If ``slots`` (a ``trio.Semaphore``: how many such
    children may run at once) has none free, ``export`` is streamed in this process instead, as
    :func:`stream_export` does.

    For a server: the formatting holds neither its GIL nor its event loop, it runs on another
    core while the server sends, and it gets the CLI's memory settings (:func:`_keep_freed_memory`).
    The child's errors surface as a :class:`RuntimeError` at the end (opening ``export`` has
    checked the run and the pattern already). The child is killed when the consumer stops early
    or is cancelled.

    Raises:
        RuntimeError: the child failed (its last stderr lines are in the message).
    """
    import trio

    child = None
    taken = False
    if slots is not None:
        with contextlib.suppress(trio.WouldBlock):
            slots.acquire_nowait()
            taken = True
    if slots is None or taken:
        try:
            child = await _start_child(export)
        finally:
            if child is None and taken:  # the slot is not held while formatting here
                slots.release()
    if child is None:  # no slot free, or no Python to start: formatted in this process
        # aclosing: a client that leaves closes this generator, and with it the inner one now
        # (not when the garbage collector finds it)
        async with contextlib.aclosing(stream_export(export)) as chunks:
            async for chunk in chunks:
                yield chunk
        return
    export.close()
    _keep_relay_buffers()
    try:
        # closed with this generator, so the child is killed and reaped before its slot is
        # given back (never more than EXPORT_PROCESSES children alive)
        async with contextlib.aclosing(_child_output(*child)) as chunks:
            async for chunk in chunks:
                yield chunk
    finally:
        if taken:
            slots.release()


async def _start_child(export: Export) -> tuple[Any, _StderrTail] | None:
    """A ``vdl-stream export`` child process of ``export``'s run, format and pattern, its output
    a pipe, and the tail of its stderr; None where no Python executable can start."""
    command = [sys.executable, "-m", "vdl_stream.cli", "export", export.run_dir]
    command += ["--format", export.fmt]
    processes = child_processes()
    if processes > 1:
        command += ["--processes", str(processes)]
    else:
        command += ["--threads", str(child_threads())]
    command += ["--tag", export.pattern] if export.pattern else []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    try:
        child = await _open_child(command, env)
    except OSError as exc:  # no Python to start (an embedded interpreter): in this process
        log.warning("export: no child process (%s); formatting in the server", exc)
        return None
    if processes > 1:
        _lower_priority(child[0].pid)
    return child


#: How much lower (in nice steps) than the server's the priority of an export child formatting
#: in several processes is.
EXPORT_CHILD_NICE = 5


def _lower_priority(pid: int) -> None:
    """Give process ``pid`` a priority :data:`EXPORT_CHILD_NICE` steps below this process's
    (nice, at most 19); nothing where refused or not POSIX.

    A child formatting in two processes can keep both cores busy: the server's event loop (its
    relay of this very export, every other page and request) must then come first. Called as
    soon as the child starts, long before it forks its helpers (after its imports and the
    opening of the run), which inherit it. On idle cores it costs the export nothing.
    """
    with contextlib.suppress(AttributeError, OSError):
        nice = os.getpriority(os.PRIO_PROCESS, 0) + EXPORT_CHILD_NICE
        os.setpriority(os.PRIO_PROCESS, pid, min(19, nice))


async def _open_child(
    command: list[str], env: dict[str, str] | None = None
) -> tuple[Any, _StderrTail]:
    """``command`` started with its stdout a pipe (read by :func:`_child_output`) and its stderr
    read to the end as it comes (:class:`_StderrTail`).

    Raises:
        OSError: the command could not start.
    """
    import subprocess

    import trio

    errors = _StderrTail()
    try:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors.fd, env=env
        )
    except BaseException:
        errors.close()
        raise
    errors.start()
    return process, errors


#: Bytes of a child's stderr kept for its error message.
_STDERR_TAIL = 2000
#: Longest wait for the end of a failed child's stderr.
_STDERR_WAIT = 1.0


class _StderrTail:
    """The last :data:`_STDERR_TAIL` bytes a child process writes to its stderr, read to the end
    by a thread of its own as they come (memory bounded by the tail): a child that writes more
    than a pipe holds (64 KB) never blocks on its stderr while its output is read.

    Give the child :attr:`fd`, then call :meth:`start` (which closes this process's copy of
    it); :meth:`text` once the child has gone.
    """

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        self._tail = b""
        self._thread = threading.Thread(target=self._drain, name="export-stderr", daemon=True)

    def start(self) -> None:
        """Start reading; the child holds its own copy of :attr:`fd` by now."""
        os.close(self.fd)
        self._thread.start()

    def close(self) -> None:
        """Close both ends, for a child that never started."""
        os.close(self.fd)
        os.close(self._read)

    def _drain(self) -> None:
        try:
            while data := os.read(self._read, 1 << 16):
                self._tail = (self._tail + data)[-_STDERR_TAIL:]
        finally:
            os.close(self._read)

    async def text(self) -> str:
        """What was kept, once the pipe ended (the child and any process it shared its stderr
        with gone), or after :data:`_STDERR_WAIT` seconds."""
        import trio

        await trio.to_thread.run_sync(self._thread.join, _STDERR_WAIT)
        return self._tail.decode(errors="replace").strip()


async def _child_output(process: Any, errors: _StderrTail) -> AsyncIterator[bytes]:
    """``process``'s output in chunks of :data:`EXPORT_PIPE_CHUNK` bytes (the last one
    shorter); kills it when the consumer stops early or is cancelled. ``errors`` reads its
    stderr meanwhile.

    Raises:
        RuntimeError: the child failed (its last stderr lines are in the message).
    """
    import trio

    out = process.stdout
    assert out is not None
    try:
        fd = out.fileno()
        _widen_pipe(fd)
        # The pipe is read into one buffer and passed on in chunks of exactly its size (but the
        # last): the server then allocates the same sizes over and over (the chunk, and
        # hypercorn's copy of it with the chunk header), which glibc's malloc reuses
        # (_keep_relay_buffers). Chunks of every size up to 1 MB (each read as it came)
        # fragmented its heap: the server's RSS crept up by about 15 MB per GB relayed
        # (docs/performance.md, "Export through the server").
        buf = bytearray(EXPORT_PIPE_CHUNK)
        view = memoryview(buf)
        fill = 0
        while True:
            try:
                n = os.readv(fd, [view[fill:]])
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            fill += n
            if fill == len(buf) or (not n and fill):
                yield bytes(view[:fill])  # the consumer's send is this loop's checkpoint
                fill = 0
            elif n:
                await trio.lowlevel.checkpoint()
            if not n:
                break
        if await process.wait():
            raise RuntimeError(
                f"export child exited with {process.returncode}: {await errors.text()}"
            )
    finally:
        if process.returncode is None:
            process.kill()
        with trio.move_on_after(EXPORT_KILL_WAIT, shield=True):
            await process.wait()
            await out.aclose()


def _widen_pipe(fd: int) -> None:
    """Let a pipe hold up to 1 MB (Linux; pipe-max-size, unprivileged), so a read gets a whole
    formatted block rather than 64 KB of it. Elsewhere, or if refused, nothing changes."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), EXPORT_PIPE_CHUNK)
    except (ImportError, OSError):
        pass


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``vdl-stream export`` to ``parser``."""
    parser.add_argument(
        "run", metavar="RUN", help="a run directory, or a run's URL s3://bucket/prefix/run"
    )
    parser.add_argument("--format", choices=("csv", "json"), default="csv", help="default: csv")
    parser.add_argument("--tag", metavar="PATTERN", help="only tags matching this regex")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="worker threads formatting rows in one process (default with --processes 1: one "
        "per idle core, none if under two)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="processes formatting alternate parts of the rows, forked (Linux; default: 2 on "
        "two cores or more, 1 with --threads); with N above 1 each formats in its own main "
        "thread (no --threads)",
    )


def run_export(args: argparse.Namespace) -> int:
    """Run ``vdl-stream export``; return 0, or 2 on bad input. ``RUN`` may be a run's URL in an
    object store (``s3://bucket/prefix/run``; vdl_stream/storage.py)."""
    if "://" not in args.run:  # no store URL (storage.is_store_url): a local run, as it is
        return _export(args, args.run)
    from . import storage

    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(storage.local_path(args.run, run_only=True))
        except (OSError, ValueError, ImportError, recorder.RecorderError) as exc:
            print(f"vdl-stream export: {exc}", file=sys.stderr)
            return 2
        return _export(args, path)
    raise AssertionError("unreachable")  # pragma: no cover


def _export(args: argparse.Namespace, path: str) -> int:
    _keep_freed_memory()
    try:
        return _export_kept(args, path)
    finally:  # main() may run in a longer-lived process (tests, scripts)
        _keep_freed_memory(False)


def _export_kept(args: argparse.Namespace, path: str) -> int:
    processes = getattr(args, "processes", None)
    if processes is None:  # the split where there are two cores, as /api/export's child's
        try:
            processes = 1 if args.threads is not None else child_processes()
        except ValueError as exc:
            print(f"vdl-stream export: {exc}", file=sys.stderr)
            return 2
    if not isinstance(processes, int) or processes < 1:
        print(f"vdl-stream export: --processes must be >= 1, got {processes}", file=sys.stderr)
        return 2
    if processes > 1 and args.threads:
        print(
            "vdl-stream export: --threads and --processes above 1 exclude each other",
            file=sys.stderr,
        )
        return 2
    threads = 0 if processes > 1 else args.threads
    try:
        export = Export(path, args.format, args.tag, threads=threads)
    except re.error as exc:
        print(f"vdl-stream export: --tag is not a valid regular expression: {exc}", file=sys.stderr)
        return 2
    except ValueError:  # the only one left: a bad thread count
        print(f"vdl-stream export: --threads must be >= 0, got {args.threads}", file=sys.stderr)
        return 2
    except recorder.RecorderError as exc:
        print(f"vdl-stream export: {exc}", file=sys.stderr)
        return 2
    with export:
        try:
            if args.output and not _written_whole(args.output):
                with open(args.output, "wb") as f:  # a device or a FIFO: in place
                    write_export(export, f, processes)
            elif args.output:
                tmp = args.output + ".tmp"
                try:
                    with open(tmp, "wb") as f:
                        write_export(export, f, processes)
                except RuntimeError:
                    os.unlink(tmp)
                    raise
                os.replace(tmp, args.output)
            else:
                try:
                    write_export(export, sys.stdout.buffer, processes)
                except BrokenPipeError:  # e.g. piped into head: the reader has what it wanted
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                    return 0
        except RuntimeError as exc:  # a helper process failed (its error is on stderr)
            print(f"vdl-stream export: {exc}", file=sys.stderr)
            return 1
    if not export.tags:
        print(f"vdl-stream export: no scalar tags in {args.run} match", file=sys.stderr)
    else:
        print(f"exported {export.rows:,} rows", file=sys.stderr)
    return 0


def _written_whole(path: str) -> bool:
    """Whether ``vdl-stream export -o PATH`` writes a temporary file and renames it over
    ``path`` (a regular file, or none yet: no reader sees half an export, a failed one leaves
    nothing), rather than writing ``path`` in place (a device or a FIFO: renaming over
    ``/dev/null`` as root would replace the device with a file)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # none yet (or not to be looked at: the write says why)
        return True


#: mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: glibc's default mmap and trim thresholds (its dynamic adjustment stays off once set).
_DEFAULT_THRESHOLD = 128 << 10
#: A server relaying a child's export: allocations up to this many bytes come from the heap
#: (each chunk is EXPORT_PIPE_CHUNK bytes, h11's copy of it with its header a few more) ...
_RELAY_MMAP_THRESHOLD = 4 * EXPORT_PIPE_CHUNK
#: ... and up to this much free heap top is kept (a few chunks' worth).
_RELAY_TRIM_THRESHOLD = 16 * EXPORT_PIPE_CHUNK


def _keep_freed_memory(
    keep: bool = True, mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20
) -> None:
    """Have glibc's malloc keep freed memory for the next allocation (process-wide: meant for the
    ``vdl-stream export`` command's own process, and its child of ``/api/export``); with
    ``keep=False``, go back to glibc's default thresholds and hand the free memory back.

    An export allocates and frees a few MB a block (orjson's text, numpy's temporaries); by
    default glibc maps the large ones afresh and hands the heap's free top back, so every block
    faults its pages in again: about 1.7 us a page on this machine's VMs, a third of the export's
    time (docs/performance.md, "Export at 50M points"). With allocations up to
    ``mmap_threshold`` bytes (default 32 MB) served from the heap and up to ``trim_threshold``
    (default 64 MB) of free top kept, they fault once. Memory stays bounded: what one block
    uses. A server relaying an export passes smaller thresholds (:func:`_keep_relay_buffers`).
    Elsewhere than glibc it does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):  # another libc (musl has no mallopt)
        return
    mallopt(_M_MMAP_THRESHOLD, mmap_threshold if keep else _DEFAULT_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, trim_threshold if keep else _DEFAULT_THRESHOLD)
    if not keep:
        trim(0)


def _keep_relay_buffers() -> None:
    """Have this process's malloc keep the buffers of a relayed export (process-wide, for the
    server's life; set again at each such export, as nothing else in a server sets it): each
    1 MB chunk and h11's copy of it with its chunk header then come from the heap and go back
    to it. With glibc's default, dynamic thresholds the server faulted
    in about 260 pages per MB relayed, every buffer fresh: a fifth of its CPU through a large
    export (docs/performance.md, "/api/export JSON (2026-12-01, h2-json)"). Costs at most
    :data:`_RELAY_TRIM_THRESHOLD` of free heap kept; a no-op elsewhere than glibc."""
    _keep_freed_memory(True, _RELAY_MMAP_THRESHOLD, _RELAY_TRIM_THRESHOLD)
