"""Crash stress for recorder/: a writer process killed with SIGKILL at random moments, many times.

Each trial starts a writer subprocess on the same run directory. The writer reopens the run (which
truncates whatever torn tail the previous kill left), appends scalar batches and text records, and
after each ``flush()`` (``sync="flush"``: fsynced) prints how far the run is durable. The parent kills
it at a random moment, then checks with a RunReader that every acknowledged point and record is
there, contiguous, with no damage reported. The next trial appends after it.

    python bench/recorder_stress.py --trials 500          # the longer stress run
    python bench/recorder_stress.py --trials 50 --seed 1  # what tests/recorder runs

The writer compacts every ``--compact`` records (default 6, so kills land in compactions and
merges), and a quarter of the trials make it kill itself at a chosen stage of a compaction's
swap: the block written but not renamed, renamed but nothing removed, partly removed, all removed.
With ``--defer`` the writer defers compaction as the broker's does (``defer_compaction=True``)
and runs it as the broker does, in a thread of its own beside the appends and flushes
(``compact(budget_s=0)`` in a loop), so kills land anywhere in a unit running concurrently with a
flush, and in the units a flush does past the bound. With ``--process`` too, the blocks are built
in a compaction process (``RunWriter(compaction_process=...)``), as the broker's are; half the
writers kill it once at a random moment after its first block (it is restarted), and every kill
of a writer takes its compaction process with it, wherever that is in a unit.

tests/recorder/test_recorder_crash.py imports :func:`run_trials` from this file.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import os, random, signal, sys, time
import numpy as np
from recorder import RunWriter

run, start, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
compact = int(sys.argv[4]) or None
kill_at = sys.argv[5] if len(sys.argv) > 5 else ""
defer = len(sys.argv) > 6 and sys.argv[6] == "defer"
in_process = len(sys.argv) > 7 and sys.argv[7] == "process"
rng = random.Random(seed)
process = None
if in_process:
    from recorder import CompactionProcess

    process = CompactionProcess()
w = RunWriter(
    run,
    sync="flush",
    segment_bytes=16384,
    compact_records=compact,
    defer_compaction=defer,
    compaction_process=process,
)
if kill_at:
    # Die at the n-th time compaction reaches a stage of its swap (see recorder/compaction.py).
    stage, nth = kill_at.split(":")
    seen = [0]

    def hook(name):
        if name == stage:
            seen[0] += 1
            if seen[0] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    w._compaction.hook = hook
if defer:
    import threading

    def compact_beside():  # the broker's compaction thread
        while True:
            if not w.compact(budget_s=0):
                time.sleep(0.001)  # nothing waits: look again soon

    threading.Thread(target=compact_beside, daemon=True).start()
if process is not None and rng.random() < 0.5:
    import threading

    def kill_the_compaction_process():  # as a crash of it would, mid-unit or between units
        deadline = time.monotonic() + 5
        while not process.units and time.monotonic() < deadline:  # once it builds blocks
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
        if process.pid:
            try:
                os.kill(process.pid, signal.SIGKILL)
                print("compaction process killed", flush=True)
            except ProcessLookupError:
                pass

    threading.Thread(target=kill_the_compaction_process, daemon=True).start()
if process is not None:
    process.ready(timeout=60)  # so that the kills land while it builds, not while it starts
print("open", w.statistics().truncated_bytes, flush=True)
i = start
while True:
    n = rng.randint(1, 200)
    steps = np.arange(i, i + n)
    w.append_scalars("x", steps, time.time() + steps * 1e-3, steps * 0.5)
    w.append_record("text", "t", i, time.time(), {"i": i, "pad": "p" * rng.randint(0, 3000)})
    i += n
    w.flush()
    print(i, flush=True)
    if process is not None:
        print("built", process.units, flush=True)
"""


class CrashCheckError(AssertionError):
    """A trial found the run in a state the recorder promises never to leave it in."""


def _durable(out: str) -> int | None:
    """The last step count the child reported durable, or None if it never flushed."""
    done = [int(line) for line in out.splitlines() if line.isdigit()]
    return done[-1] if done else None


def _built(out: str) -> int:
    """Blocks the child's compaction process(es) built, as it last reported."""
    counts = [int(line.split()[1]) for line in out.splitlines() if line.startswith("built ")]
    return counts[-1] if counts else 0


def verify(run_dir: str, acknowledged: int) -> int:
    """Check the run holds steps 0..n-1 with n >= acknowledged, and no damage; return n."""
    from recorder import RunReader

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any CorruptionWarning fails the check
        r = RunReader(run_dir)
        steps = r.read_scalars("x").steps
        texts = [rec.step for rec in r.read_records("text")]
        stats = r.statistics()
        r.close()
    n = len(steps)
    if not np.array_equal(steps, np.arange(n)):
        raise CrashCheckError(f"steps are not 0..{n - 1}: {steps[:10]}...")
    if n < acknowledged:
        raise CrashCheckError(f"lost fsynced data: {n} steps, {acknowledged} acknowledged")
    if stats.corrupt_records:
        raise CrashCheckError(f"{stats.corrupt_records} damaged records after a kill")
    if any(a >= b for a, b in itertools.pairwise(texts)) or any(t >= n for t in texts):
        raise CrashCheckError(f"text records out of step with scalars: {texts[-3:]}, n={n}")
    return n


def start_writer(
    run_dir: str,
    n: int,
    seed: int,
    compact: int,
    kill_at: str = "",
    defer: bool = False,
    process: bool = False,
) -> subprocess.Popen:
    """Start the writer child appending from step ``n`` (``compact``: its compact_records, 0 for
    none; ``kill_at``: ``"stage:n"`` to die at the n-th such stage of a compaction; ``defer``:
    compaction deferred, done in a thread of its own beside the writes; ``process``: blocks
    built in a compaction process, which half the children kill once at a random moment)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [
            *(sys.executable, "-c", CHILD, run_dir, str(n), str(seed), str(compact), kill_at),
            "defer" if defer else "",
            "process" if process else "",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_trials(
    run_dir: str,
    trials: int,
    seed: int,
    max_delay: float = 0.1,
    compact: int = 6,
    defer: bool = False,
    process: bool = False,
) -> dict:
    """Run ``trials`` kill trials on ``run_dir``; raise CrashCheckError on a broken promise.

    Most kills come within ``max_delay`` seconds after the writer opened the run; one in eight
    comes at a random moment of its start-up (possibly while it reopens and truncates). The
    writer compacts every ``compact`` records (0: never), so that kills land in compactions and
    merges too, and one trial in four kills it at a chosen stage of a compaction's swap.
    ``defer``: the writer defers compaction; ``process``: it builds blocks in a compaction
    process, killed now and then (see :func:`start_writer`).

    Returns counters: trials, kills before the writer opened, reopens that truncated a torn tail,
    kills inside a compaction, blocks at the end, steps durable at the end.
    """
    rng = random.Random(seed)
    n = 0
    early = torn = staged = built = process_kills = 0
    for trial in range(trials):
        kill_at = ""
        if compact and rng.random() < 0.25:
            stage = rng.choice(["written", "renamed", "removing", "removed"])
            kill_at = f"{stage}:{rng.randint(1, 3)}"
        child = start_writer(run_dir, n, rng.randrange(1 << 30), compact, kill_at, defer, process)
        if kill_at:
            out, err = child.communicate(timeout=60)  # it kills itself mid-compaction
            if child.returncode != -signal.SIGKILL:
                raise CrashCheckError(f"trial {trial}: writer exited {child.returncode}: {err}")
            staged += 1
            built += _built(out)
            process_kills += out.count("compaction process killed")
            n = verify(run_dir, _durable(out) or 0)
            continue
        if rng.random() < 0.125:
            time.sleep(rng.uniform(0.0, 0.4))
            head = ""
        else:
            head = child.stdout.readline()
            time.sleep(rng.uniform(0.0, max_delay))
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate()
        out = head + out
        if child.returncode != -signal.SIGKILL:
            raise CrashCheckError(f"trial {trial}: writer exited {child.returncode}: {err[-2000:]}")
        built += _built(out)
        process_kills += out.count("compaction process killed")
        if "open" not in out:
            early += 1
        elif int(out.split()[1]) > 0:
            torn += 1
        acknowledged = _durable(out)
        if not os.path.isdir(run_dir) or not any(
            name.startswith("segment-") for name in os.listdir(run_dir)
        ):
            continue  # killed before the run existed
        n = verify(run_dir, acknowledged or 0)
    # Finally, the run reopens in this process and appending continues.
    from recorder import RunWriter

    with RunWriter(run_dir, compact_records=compact or None) as w:
        steps = np.arange(n, n + 10)
        w.append_scalars("x", steps, time.time() + steps * 0.0, steps * 0.5)
    n = verify(run_dir, n + 10)
    names = os.listdir(run_dir)
    if any(name.endswith(".tmp") for name in names):
        raise CrashCheckError(f"a reopened writer left temporary files: {names}")
    return {
        "trials": trials,
        "killed_before_open": early,
        "torn_tails_truncated": torn,
        "killed_mid_compaction": staged,
        "blocks_built_by_compaction_processes": built,
        "compaction_processes_killed": process_kills,
        "blocks": sum(name.startswith("block-") for name in names),
        "steps": n,
    }


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=0.1, help="seconds after open to kill")
    parser.add_argument("--compact", type=int, default=6, help="compact_records (0: never)")
    parser.add_argument(
        "--defer", action="store_true", help="defer compaction, as the broker's writers do"
    )
    parser.add_argument(
        "--process",
        action="store_true",
        help="build blocks in a compaction process (killed at random in half the trials; "
        "give --max-delay 1 or more: it takes a few tenths of a second to start)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = run_trials(
            os.path.join(tmp, "run"),
            args.trials,
            args.seed,
            args.max_delay,
            args.compact,
            args.defer,
            args.process,
        )
        result["seconds"] = round(time.perf_counter() - start, 1)
    print(result)


if __name__ == "__main__":
    main()
