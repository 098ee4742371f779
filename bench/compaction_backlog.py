"""What deferred compaction's bound costs a reader: open a run whose writer never compacted.

Writes ``--flushes`` flushes of a scalar point and a bookkeeping record each (two records a
flush, as the broker writes at low rates) with inline compaction (the default) and with
``defer_compaction=True`` and no ``compact()`` call (a writer never given an idle moment: at most
``DEFERRED_MAX`` units wait), then times opening the run and reading its series (median of 5).

    python bench/compaction_backlog.py
"""

from __future__ import annotations

import argparse
import tempfile
import time

from recorder import RunReader, RunWriter


def measure(defer: bool, flushes: int) -> str:
    """Write the run, time its opening; return a line of figures."""
    with tempfile.TemporaryDirectory(prefix="vdl-backlog-") as tmp:
        w = RunWriter(tmp + "/r", sync="never", defer_compaction=defer)
        for i in range(flushes):
            w.append_scalars("x", [i], [1.7e9 + i], [float(i)])
            w.append_record("ingest", None, None, 1.7e9 + i, {"w": i})
            w.flush()
        stats = w.statistics()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            with RunReader(tmp + "/r") as r:
                r.read_scalars("x")
                records = r.statistics().records
            times.append(time.perf_counter() - start)
        w.close()
    return (
        f"defer_compaction={defer!s:5}  units waiting {stats.compaction_backlog}  "
        f"records a reader decodes {records:6,}  open + read median {sorted(times)[2] * 1e3:6.1f} ms"
    )


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flushes", type=int, default=5130, help="default: 5 segments' worth")
    args = parser.parse_args()
    for defer in (False, True):
        print(measure(defer, args.flushes))


if __name__ == "__main__":
    main()
