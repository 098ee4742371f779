"""What compaction costs the writer's process (its GIL) with and without a compaction process.

Writes a run the way the broker's writers see live training (10 scalar tags a step, one step and
one ``ingest`` record a flush, ``compact_records=2048``, ``defer_compaction=True``) until four
sealed segments wait, then compacts them (four level-0 blocks and their merge) with
``RunWriter.compact()``: once in the writer's thread, once with a ``CompactionProcess``. Prints the
CPU of the calling thread (what competes for the GIL with ingest), the compaction process's CPU
(its start-up left out: it is started and ready before), and the wall time. Also the CPU of
building one level-0 block from the writer's in-memory capture (the thread's way) against reading
the sealed segment back from its file (the process's way).

    python bench/compaction_process.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from recorder import CompactionProcess, RunReader, RunWriter, blocks, compaction

TAGS = [f"train/metric{i}" for i in range(10)]


def live_run(path: str, process: CompactionProcess | None) -> tuple[RunWriter, int]:
    """A deferring writer with four sealed segments of live-cadence records waiting."""
    w = RunWriter(
        path,
        sync="never",
        compact_records=2048,
        defer_compaction=True,
        compaction_process=process,
    )
    step = 0
    while w.statistics().compaction_backlog < 4:  # the bound: no flush compacts
        for tag in TAGS:
            w.append_scalars(tag, [step], [1.79e9 + step * 0.02], [step * 0.5])
        w.append_record("ingest", None, None, 1.79e9 + step * 0.02, {"w": step})
        w.flush()
        step += 1
    return w, step


def owner_cpu(mode: str) -> str:
    """Compact four segments in the thread or in a process; the line to print."""
    with tempfile.TemporaryDirectory() as d:
        process = CompactionProcess() if mode == "process" else None
        try:
            if process is not None and not process.ready(timeout=60):
                raise SystemExit("the compaction process did not start within 60 s")
            w, steps = live_run(os.path.join(d, "r"), process)
            child0 = 0.0 if process is None else process.cpu_seconds
            wall, cpu = time.perf_counter(), time.thread_time()
            w.compact()
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            child = 0.0 if process is None else process.cpu_seconds - child0
            stats = w.statistics()
            w.close()
        finally:
            if process is not None:
                process.close()
        with RunReader(os.path.join(d, "r")) as r:
            assert len(r.read_scalars(TAGS[3]).steps) == steps
    return (
        f"  {mode:8s} {stats.compactions} segments + {stats.merges} merge ({steps:,} flushes):"
        f" calling thread {cpu * 1e3:6.1f} ms CPU, compaction process {child * 1e3:6.1f} ms,"
        f" wall {wall * 1e3:6.0f} ms"
    )


def read_back_cpu(rounds: int = 7) -> str:
    """CPU of one level-0 block: from the capture vs from the file (fastest of ``rounds``)."""
    sealed = []
    seal = compaction.Compactor.seal

    def keep(self, number, size, records, capture):  # type: ignore[no-untyped-def]
        sealed.append((number, size, records, capture))
        seal(self, number, size, records, capture)

    compaction.Compactor.seal = keep
    try:
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "r")
            w, _ = live_run(run, None)
            number, size, records, capture = sealed[0]
            segments = [[number, w._compaction.created[number], size]]

            def from_capture() -> None:
                builder = blocks.BlockBuilder(segments)
                compaction._feed_capture(builder, capture)
                compaction._write_new(builder, run, "capture.vdlb", 0)

            def from_file() -> None:
                compaction._build_segment(run, "file.vdlb", segments)

            def fastest(fn) -> float:  # type: ignore[no-untyped-def]
                times = []
                for _ in range(rounds):
                    cpu = time.thread_time()
                    fn()
                    times.append(time.thread_time() - cpu)
                return min(times) * 1e3

            line = (
                f"  one segment ({records:,} records, {size:,} bytes) into a block:"
                f" from the capture {fastest(from_capture):.1f} ms CPU,"
                f" read back from the file {fastest(from_file):.1f} ms"
            )
            w.close()
            return line
    finally:
        compaction.Compactor.seal = seal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="thread/process pairs")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        print(
            f"compaction's CPU, in the writer's thread or in a process; load {f.read().split()[0]}"
        )
    for _ in range(args.rounds):
        for mode in ("thread", "process"):
            print(owner_cpu(mode))
    print(read_back_cpu())


if __name__ == "__main__":
    main()
