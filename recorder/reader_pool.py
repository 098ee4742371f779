"""Downsampled scalar reads of runs in worker processes, beside the process that asked.

A read of a run's downsampled scalars (a snapshot's: every tag of a run of 10,000 points per tag
read to 200) is Python, msgpack and small numpy calls that hold the GIL for most of their time:
threads of one process take turns, so a server reading 100 runs uses one core. A
:class:`ReaderPool` reads them in processes of its own, each with its own :class:`RunReader` of
the run up to the position the asking reader has read (the same records, so the same points),
and hands back the columns. The asking process keeps its own reader (and what it has read) as
before: it stores the answer with :meth:`RunReader.keep_scalars`.

Runs read from the disk (a sweep written hours ago, no longer in the OS page cache) wait for
the disk one chunk at a time, in whichever thread or process reads them: :func:`prefetch` asks
the OS for a run's files ahead of such a read, so that many runs' reads reach the disk at once.

No trio, no web: the calls block; a caller on an event loop runs them in a thread.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from recorder.compaction import _receive, _send
from recorder.reader import RunReader
from recorder.records import CorruptionWarning, Position, ScalarSeries

# A reader process: ``python -c _WORKER``; requests on stdin, answers on stdout (each a msgpack
# map after its length, as the compaction process's). Not multiprocessing: its spawn imports
# the owner's main script again in every process (for ``vdl-stream serve``, the whole server),
# and its fork copies an event loop's threads' state.
_WORKER = "from recorder.reader_pool import serve_reads; serve_reads()"

_T = TypeVar("_T")

#: A run whose files hold more than this is left to its reads by :func:`prefetch`: a snapshot of a
#: long run reads its level-of-detail summaries, a small part of its files.
PREFETCH_RUN_BYTES = 16 << 20


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one, as under
    ``taskset`` or a container's cpuset), else ``os.cpu_count()``: what the processes that read
    and format runs (a :class:`ReaderPool`, an export's) are sized by."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else os.cpu_count() or 1


class ReaderPool:
    """Worker processes that read runs' downsampled scalars (:func:`read_downsampled`).

    The processes are started by :meth:`start` (blocking: a process imports NumPy and this
    package, 0.2-0.5 s of CPU each), so a caller starts them ahead of the reads that need them,
    and reads in its own process until :attr:`ready`. Each ends when its input closes
    (:meth:`close`, or the owner's death). :meth:`read` is safe from any thread: as many reads
    run at once as there are processes, the others wait for one.

    Args:
        processes: worker processes, at least 1.

    Raises:
        ValueError: ``processes`` is not a positive int.
    """

    def __init__(self, processes: int) -> None:
        if type(processes) is not int or processes < 1:
            raise ValueError(f"processes must be a positive int, got {processes!r}")
        self.processes = processes
        self._procs: list[subprocess.Popen] = []
        # Processes free for a read; None once closed (passed on: it wakes every waiting read).
        self._idle: queue.SimpleQueue[subprocess.Popen | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False

    @property
    def ready(self) -> bool:
        """Whether every process has started and none was lost: :meth:`read` may be called."""
        return self._ready and not self._closed

    def start(self) -> None:
        """Start the processes and wait until each has imported what it reads with (blocking).

        Idempotent; does nothing once :meth:`close` was called.

        Raises:
            OSError, EOFError: a process could not be started, or ended before it was ready
                (the pool is then closed).
        """
        with self._lock:
            if self._closed or self._procs:
                return
            # The same recorder as this process's, wherever it is imported from.
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
            for _ in range(self.processes):
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _WORKER],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        env={**os.environ, "PYTHONPATH": path},
                    )
                )
            procs = list(self._procs)
        try:
            for proc in procs:
                _receive(proc.stdout)  # "ready": its imports are done
        except BaseException:
            self.close()
            raise
        with self._lock:
            if not self._closed:
                for proc in procs:
                    self._idle.put(proc)
                self._ready = True

    def read(
        self,
        run_dir: str,
        limit: Position,
        tags: list[str],
        max_points: int,
        meanwhile: Callable[[], _T],
    ) -> tuple[list[ScalarSeries] | None, _T]:
        """:func:`read_downsampled` in one of the processes (blocking, until one is free), and
        ``meanwhile()`` in this thread while that process reads: both answers. The first is
        None also when the process's reader raised an error (a run that is not readable): the
        caller reads the run itself, and reports what it finds.

        Raises:
            RuntimeError: the pool is not :attr:`ready`, or a process was lost (the pool is
                then closed: the caller reads in its own process from then on).
            Whatever ``meanwhile`` raises (the process's answer is then read and dropped).
        """
        if not self.ready:
            raise RuntimeError("the reader pool is not started")
        proc = self._idle.get()
        if proc is None:
            self._idle.put(None)
            raise RuntimeError("the reader pool is closed")
        try:
            request = {
                "run_dir": run_dir,
                "limit": list(limit),
                "tags": tags,
                "max_points": max_points,
            }
            _send(proc.stdin, request)
        except (OSError, ValueError) as exc:
            self.close()
            raise RuntimeError(f"the reader process {proc.pid} was lost ({exc})") from exc
        try:
            other = meanwhile()
        finally:
            try:
                reply = _receive(proc.stdout)
            except (OSError, ValueError, EOFError) as exc:
                self.close()
                raise RuntimeError(f"the reader process {proc.pid} was lost ({exc})") from exc
            self._idle.put(proc)
        if reply.get("series") is None:  # damaged, changed or unreadable: read it yourself
            return None, other
        series = [
            ScalarSeries(
                np.frombuffer(s, np.int64),
                np.frombuffer(w, np.float64),
                np.frombuffer(v, np.float64),
            )
            for s, w, v in reply["series"]
        ]
        return series, other

    def close(self) -> None:
        """End the processes (each exits as its input closes; killed after 5 s). Idempotent;
        a read under way fails."""
        with self._lock:
            self._closed = True
            procs, self._procs = self._procs, []
        self._idle.put(None)
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with contextlib.suppress(OSError):
                proc.stdout.close()

    def __enter__(self) -> ReaderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_downsampled(
    run_dir: str, limit: Position, tags: list[str], max_points: int
) -> list[ScalarSeries] | None:
    """``RunReader(run_dir, limit).read_scalars(tag, max_points=max_points)`` of each of ``tags``
    (a :class:`ReaderPool` process's task; blocking).

    Returns None instead when the answer might differ from the asking reader's: a damaged record
    was found (the asking process reads the run itself, so that the damage is reported there,
    once), or the reader did not reach ``limit``.

    Raises:
        NotARunError, FormatError, RecorderError: as :class:`RunReader` (the asking process then
            reads the run itself, and reports what it finds).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptionWarning)  # reported by the asking process
        with RunReader(run_dir, limit) as reader:
            out = [reader.read_scalars(tag, max_points=max_points) for tag in tags]
            if reader.position() != limit or reader.statistics().corrupt_records:
                return None
    return out


def prefetch(run_dir: str | os.PathLike[str], max_bytes: int = PREFETCH_RUN_BYTES) -> int:
    """Ask the OS to read run ``run_dir``'s files into its page cache now, in the background
    (``posix_fadvise(POSIX_FADV_WILLNEED)``), ahead of a read of all of it (blocking, briefly:
    the call returns before the disk has answered).

    A run read from the disk otherwise waits for one chunk at a time (each read's ``pread``);
    asked for together, the files of many runs reach the disk at once. Nothing is read when the
    files hold more than ``max_bytes`` in all, and nothing fails: a run that is gone, changing
    or unreadable is left to its reads, which report it.

    Returns:
        The bytes asked for: 0 when nothing was (too large, unreadable, or no
        ``posix_fadvise`` on this platform).
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return 0
    try:
        with os.scandir(run_dir) as entries:
            files = [(e.path, e.stat().st_size) for e in entries if e.is_file()]
    except OSError:
        return 0
    if sum(size for _, size in files) > max_bytes:
        return 0
    asked = 0
    for path, size in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # replaced meanwhile (compaction): its reads find the new file
        try:
            advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            asked += size
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def serve_reads() -> None:
    """A reader process's loop: answer its owner's reads until its input closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers' pipe
    _send(stdout, {"ready": True})
    while True:
        try:
            request: dict[str, Any] = _receive(stdin)
        except (EOFError, OSError):
            return
        try:
            series = read_downsampled(
                request["run_dir"],
                Position(*request["limit"]),
                request["tags"],
                request["max_points"],
            )
            reply: dict[str, Any] = {"series": None}
            if series is not None:
                reply["series"] = [[c.tobytes() for c in s] for s in series]
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _send(stdout, reply)
