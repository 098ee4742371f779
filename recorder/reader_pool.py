"""Downsampled scalar reads of runs in worker processes, beside the process that asked.

A read of a run's downsampled scalars (a snapshot's: every tag of a run of 10,000 points per tag
read to 200) is Python, msgpack and small numpy calls that hold the GIL for most of their time:
threads of one process take turns, so a server reading 100 runs uses one core. A
:class:`ReaderPool` reads them in processes of its own, each with its own :class:`RunReader` of
the run up to the position the asking reader has read (the same records, so the same points),
and hands back the columns. The asking process keeps its own reader (and what it has read) as
before: it stores the answer with :meth:`RunReader.keep_scalars`.

No trio, no web: the calls block; a caller on an event loop runs them in a thread or waits on
the future :meth:`ReaderPool.submit` returns.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import warnings
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np

from recorder.reader import RunReader
from recorder.records import CorruptionWarning, Position, ScalarSeries


class ReaderPool:
    """Worker processes that read runs' downsampled scalars (:func:`read_downsampled`).

    The processes are started by :meth:`start` (blocking: a process imports NumPy and this
    package, about 0.3-0.9 s of CPU each), so a caller starts them ahead of the reads that need
    them, and reads in its own process until :attr:`ready`.

    Args:
        processes: worker processes, at least 1.

    Raises:
        ValueError: ``processes`` is not a positive int.
    """

    def __init__(self, processes: int) -> None:
        if type(processes) is not int or processes < 1:
            raise ValueError(f"processes must be a positive int, got {processes!r}")
        self.processes = processes
        self._executor: ProcessPoolExecutor | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def ready(self) -> bool:
        """Whether every process has started and :meth:`submit` may be called."""
        return self._ready.is_set() and not self._closed

    def start(self) -> None:
        """Start the processes and wait until each has imported what it reads with (blocking).

        Idempotent; does nothing once :meth:`close` was called.
        """
        with self._lock:
            if self._closed or self._executor is not None:
                return
            # spawn, not fork: the asking process may run threads (an event loop's workers).
            self._executor = ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn")
            )
            executor = self._executor
        # One task per process, all at once: a process is started for each while none is idle.
        pids = [executor.submit(os.getpid) for _ in range(self.processes)]
        for f in pids:
            f.result()
        self._ready.set()

    def submit(
        self, run_dir: str, limit: Position, tags: list[str], max_points: int
    ) -> Future[list[ScalarSeries] | None]:
        """Read ``tags`` of the run at ``run_dir`` up to ``limit``, each downsampled to
        ``max_points``, in a worker process: a future of :func:`read_downsampled`'s answer.

        Raises:
            RuntimeError: the pool is not :attr:`ready` (or was closed).
        """
        if not self.ready or self._executor is None:
            raise RuntimeError("the reader pool is not started")
        return self._executor.submit(read_downsampled, run_dir, limit, tags, max_points)

    def close(self) -> None:
        """Stop the processes (reads under way are abandoned). Idempotent; does not block."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


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
    # Plain arrays: a read-only view pickles as a copy anyway; the asking side marks them.
    return [ScalarSeries(*(np.asarray(c) for c in s)) for s in out]
