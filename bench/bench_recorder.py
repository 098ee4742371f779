"""Benchmark of recorder/ against the targets of issue 3, with TensorBoard and VisualDL as anchors.

    python bench/bench_recorder.py            # full sizes (a few minutes on 2 cores)
    python bench/bench_recorder.py --quick    # sizes / 10, anchors included (under a minute)
    python bench/bench_recorder.py --live --hours 0.25 1 4 24   # live-written runs (see below)
    python bench/bench_recorder.py --restarts --base ../base   # runs with many restarts (below)

Measures, on the same machine in one run:

* append: scalar batches of 1,000 points per tag into RunWriter (default sync="interval"), a flush
  after every 100,000 points, close() (fsync and index) included; the median of 3 runs for the
  100-tag run; also 1-point batches (per-call overhead);
* bytes on disk per scalar event (segments only; the index is reported apart);
* loading all of a run of 100 tags x 10,000 steps (RunReader + read_scalars of every tag), with the
  index (a closed run) and without it (a live run: every segment scanned and verified), median of
  --repeat fresh readers, peak memory (RSS, interpreter included) from a fresh process;
* loading one tag of 10,000,000 points, and max_points=2000 over it with the reader warm;
* how bytes/event and load time depend on the points of a tag per flush (each flush writes one
  chunk per tag with pending points), 1 to 1,000;
* anchors, from the venv at bench/.venv-anchors (tensorboard, tensorboardX, visualdl): the same
  1M-point run written by tensorboardX and VisualDL, loaded by EventAccumulator (no sampling),
  TensorBoard's Rust data server (one load cycle as it logs it; by default it keeps 1,000 points a
  tag, and it verifies checksums only when a record fails to parse) and VisualDL's LogReader, each
  once, in a fresh process (they take seconds each). Disable with
  --no-anchors. To create the venv:

      python -m venv bench/.venv-anchors
      bench/.venv-anchors/bin/pip install tensorboard tensorboardX visualdl numpy

Results go to stdout (a Markdown table) and bench/out/recorder.json. Page cache is warm for every
reader, ours and the anchors alike.

``--live`` measures runs written the way live training writes them (bench/live_run.py: 10 tags at
50 steps/s, a flush with its "ingest" record every 20 ms, histograms, telemetry, images), generated
once per duration and cached under bench/out/live/ (stopped without close(), as SIGKILL leaves
them): the time to open each with RunReader after the kill, and after a clean close (a copy of it
closed by a RunWriter, which compacts the tail); the same points and events written in bulk and
opened, for the ratio; and the writer's CPU time spent compacting while it wrote at live cadence.
Results go to bench/out/recorder-live.json.

``--restarts`` measures reads of runs whose tag restarts often (bench/restarts_run.py: four writers
with step counters of their own, a counter reset every epoch, and no restart for comparison), of
1,000 to 100,000 records: ``read_scalars``, a dashboard snapshot's downsampled read
(``max_points=2000``), ``iter_scalars``, the preview's write and a replay's points as of the run's
end (vdl_stream/replay.py). Each read runs in a fresh process, in the tree given by ``--base`` and
in this one alternately (base, this, base, this, ...: ``--pairs`` pairs, fewer where the base runs
past ``--timeout`` seconds). ``--shapes``, ``--records`` and ``--reads`` choose what runs; the runs
are written once under bench/out/recorder/restarts/. Results go to stdout (a Markdown table) and
bench/out/recorder-restarts.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from live_run import cached_live_run, write_live_run  # noqa: E402
from recorder_data import tag_series  # noqa: E402

from recorder import RunReader, RunWriter  # noqa: E402
from recorder.catalog import INDEX_NAME  # noqa: E402

ANCHORS_PYTHON = os.path.join(HERE, ".venv-anchors", "bin", "python")
FLUSH_POINTS = 100_000


def _segments_bytes(run_dir: str) -> int:
    return sum(
        os.path.getsize(os.path.join(run_dir, f))
        for f in os.listdir(run_dir)
        if f.endswith(".vdlr")
    )


def write_run(
    run_dir: str, tags: int, steps: int, batch: int = 1000, flush_points: int = FLUSH_POINTS
) -> dict:
    """Append ``tags`` x ``steps`` points in batches of ``batch`` per tag, flushing after every
    ``flush_points`` points; time it."""
    shutil.rmtree(run_dir, ignore_errors=True)
    data = [tag_series(t, steps) for t in range(tags)]
    names = [f"tag{t}" for t in range(tags)]
    since_flush = 0
    start = time.perf_counter()
    w = RunWriter(run_dir)
    for lo in range(0, steps, batch):
        hi = lo + batch
        for name, (s, walls, values) in zip(names, data, strict=True):
            w.append_scalars(name, s[lo:hi], walls[lo:hi], values[lo:hi])
        since_flush += tags * min(batch, steps - lo)
        if since_flush >= flush_points:
            w.flush()
            since_flush = 0
    w.flush()
    flushed = time.perf_counter() - start
    w.close()  # fsync and index
    seconds = time.perf_counter() - start
    points = tags * steps
    return {
        "points": points,
        "seconds": seconds,
        "events_per_s": points / seconds,
        "events_per_s_before_close": points / flushed,
        "bytes_per_event": _segments_bytes(run_dir) / points,
        "index_bytes": os.path.getsize(os.path.join(run_dir, INDEX_NAME)),
    }


def append_small_batches(run_dir: str, points: int) -> dict:
    """Points appended one per call (the per-call overhead), flushed every 1,000."""
    shutil.rmtree(run_dir, ignore_errors=True)
    s, walls, values = tag_series(0, points)
    start = time.perf_counter()
    with RunWriter(run_dir) as w:
        for i in range(points):
            w.append_scalars("x", s[i : i + 1], walls[i : i + 1], values[i : i + 1])
            if i % 1000 == 999:
                w.flush()
    seconds = time.perf_counter() - start
    return {"points": points, "seconds": seconds, "events_per_s": points / seconds}


def chunk_sensitivity(out: str, repeat: int) -> list[dict]:
    """Bytes per event and load time against the points per chunk (points of a tag per flush)."""
    rows = []
    for per_chunk in (1, 10, 100, 1000):
        steps = 100 if per_chunk == 1 else 1000
        run_dir = os.path.join(out, f"run-chunks-{per_chunk}")
        written = write_run(run_dir, 100, steps, batch=per_chunk, flush_points=1)
        seconds, _ = median_time(lambda d=run_dir: load_all(d), repeat)
        rows.append(
            {
                "points_per_chunk": per_chunk,
                "points": written["points"],
                "bytes_per_event": written["bytes_per_event"],
                "load_us_per_point": seconds / written["points"] * 1e6,
            }
        )
        shutil.rmtree(run_dir)
    return rows


def load_all(run_dir: str) -> int:
    """Open the run and read every scalar tag; return the number of points."""
    r = RunReader(run_dir)
    n = sum(len(r.read_scalars(tag).steps) for tag in r.tags())
    r.close()
    return n


def median_time(fn, repeat: int) -> tuple[float, list[float]]:
    """Median and all of ``repeat`` timed calls of ``fn`` (garbage collected between)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def load_in_fresh_process(run_dir: str) -> dict:
    """Time and peak memory of load_all in a new interpreter."""
    out = subprocess.run(
        [sys.executable, __file__, "--load-rss", run_dir],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def _load_rss(run_dir: str) -> None:
    start = time.perf_counter()
    points = load_all(run_dir)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak, interpreter included
    print(json.dumps({"seconds": seconds, "points": points, "rss_mb": rss}))


def anchors(out: str, tags: int, steps: int) -> dict | None:
    """Run bench/recorder_anchors.py in the anchors' venv; None when it is not installed."""
    if not os.path.exists(ANCHORS_PYTHON):
        print(f"(anchors skipped: {ANCHORS_PYTHON} not found)", file=sys.stderr)
        return None
    script = os.path.join(HERE, "recorder_anchors.py")

    def call(*args: str) -> dict:
        res = subprocess.run(
            [ANCHORS_PYTHON, script, *args], check=True, capture_output=True, text=True
        )
        return json.loads(res.stdout.strip().splitlines()[-1])

    result = call("write", "--tags", str(tags), "--steps", str(steps), "--out", out)
    result["tb_load"] = call("load-tb", os.path.join(out, "tbx"))
    result["vdl_load"] = call("load-vdl", os.path.join(out, "vdl"))
    tbx = os.path.join(out, "tbx")
    result["rust_load"] = call("load-rust", tbx)
    result["rust_load_all"] = call("load-rust", tbx, "--samples", "scalars=all")
    return result


def open_run(run_dir: str) -> int:
    """Open a run with RunReader and list its tags (what a dashboard does first)."""
    r = RunReader(run_dir)
    n = len(r.tags())
    r.close()
    return n


def bulk_copy(src: str, dst: str) -> dict:
    """Write the points and events of run ``src`` into ``dst`` in bulk: each tag's points in
    65,536-point batches, the events as they are, one flush at the end."""
    shutil.rmtree(dst, ignore_errors=True)
    r = RunReader(src)
    start = time.perf_counter()
    w = RunWriter(dst, sync="never")
    for tag, info in r.tags().items():
        if info.kind == "scalars":
            for piece in r.iter_scalars(tag):
                w.append_scalars(tag, *piece)
    for record in r.iter_records():
        if record.kind != "scalars":
            w.append_record(record.kind, record.tag, record.step, record.wall, record.data)
    w.close()
    r.close()
    return {"seconds": time.perf_counter() - start}


def run_info(run_dir: str) -> dict:
    """What a live run holds, for one stopped before write_live_run could report it."""
    r = RunReader(run_dir)
    tags = r.tags()
    points = sum(i.count for i in tags.values() if i.kind == "scalars")
    events = sum(i.count for i in tags.values() if i.kind != "scalars")
    events += len(r.read_records("telemetry"))
    steps = max(i.step_max for i in tags.values() if i.kind == "scalars") + 1
    r.close()
    size = sum(os.path.getsize(os.path.join(run_dir, n)) for n in os.listdir(run_dir))
    return {
        "hours": round(steps / 50 / 3600, 2),
        "records": steps * 2 + events,  # a group chunk and an ingest record per flush
        "points": points,
        "events": events,
        "bytes": size,
        "seconds": 0.0,
        "writer_cpu_s": float("nan"),
        "statistics": {"compaction_seconds": float("nan"), "compactions": 0, "merges": 0},
    }


def live(args: argparse.Namespace) -> None:
    """The ``--live`` measurements (see the module docstring)."""
    res: dict = {"hours": {}}
    runs = [(hours, None) for hours in args.hours] + [(None, path) for path in args.runs]
    for hours, killed in runs:
        t0 = time.perf_counter()
        if killed is None:
            hours = int(hours) if float(hours).is_integer() else hours  # one cache key per run
            killed = cached_live_run(hours, killed=True)
            with open(os.path.join(os.path.dirname(killed), "done.json")) as f:
                info = json.load(f)
        else:  # a run a real SIGKILL stopped (e.g. an interrupted generation): measure what it has
            info = run_info(killed)
            hours = info["hours"]
        generated = time.perf_counter() - t0
        closed = os.path.join(args.out, f"closed-{hours:g}h")
        if not os.path.isdir(closed):
            shutil.copytree(killed, closed + ".tmp")
            RunWriter(closed + ".tmp", sync="never").close()  # compacts the tail a kill left
            os.rename(closed + ".tmp", closed)
        row = {
            "records_written": info["records"],
            "points": info["points"],
            "events": info["events"],
            "bytes": info["bytes"],
            "generation_s": info["seconds"] if generated > 1 else None,
            "writer_cpu_s": info["writer_cpu_s"],
            "compaction_cpu_s": info["statistics"]["compaction_seconds"],
            "compactions": info["statistics"]["compactions"],
            "merges": info["statistics"]["merges"],
        }
        row["compaction_share"] = row["compaction_cpu_s"] / row["writer_cpu_s"]
        for label, run_dir in (("killed", killed), ("closed", closed)):
            seconds, _ = median_time(lambda d=run_dir: open_run(d), args.repeat)
            r = RunReader(run_dir)
            stats = r.statistics()
            r.close()
            row[f"open_{label}_s"] = seconds
            row[f"records_read_{label}"] = stats.records
            row[f"files_{label}"] = len(os.listdir(run_dir))
        r = RunReader(closed)
        start = time.perf_counter()
        r.read_scalars("train/loss", max_points=2000)  # not loaded: chunk by chunk
        row["max_points_cold_s"] = time.perf_counter() - start
        row["max_points_cached_bytes"] = r.cached_bytes()
        start = time.perf_counter()
        n = sum(len(piece) for piece in r.iter_scalars("train/loss"))
        row["iter_scalars_rows_per_s"] = n / (time.perf_counter() - start)
        r.close()
        if hours <= args.bulk_hours:
            bulk = os.path.join(args.out, f"bulk-{hours:g}")
            row["bulk_write_s"] = bulk_copy(closed, bulk)["seconds"]
            row["open_bulk_s"], _ = median_time(lambda d=bulk: open_run(d), args.repeat)
            row["live_vs_bulk"] = row["open_closed_s"] / row["open_bulk_s"]
            row["live_killed_vs_bulk"] = row["open_killed_s"] / row["open_bulk_s"]
            shutil.rmtree(bulk)
        res["hours"][f"{hours:g}"] = row
        print(json.dumps({f"{hours:g}h": row}), flush=True)
    if args.live_cpu_hours:
        d = os.path.join(args.out, "live-cpu")
        shutil.rmtree(d, ignore_errors=True)
        w = write_live_run(d, args.live_cpu_hours)
        shutil.rmtree(d)
        res["cpu"] = {
            "hours": args.live_cpu_hours,
            "writer_cpu_s": w["writer_cpu_s"],
            "compaction_cpu_s": w["statistics"]["compaction_seconds"],
            "share": w["statistics"]["compaction_seconds"] / w["writer_cpu_s"],
            "flushes": w["flushes"],
        }
    with open(os.path.join(args.out, "..", "recorder-live.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(live_report(res))


def live_report(res: dict) -> str:
    """The ``--live`` results as a Markdown table."""
    lines = [
        "| live run | records written | files | open after SIGKILL | open after close "
        "| bulk-written, open | live / bulk | compaction CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for hours, row in res["hours"].items():
        bulk = row.get("open_bulk_s")
        ratio = "" if bulk is None else f"{row['live_vs_bulk']:.2f}x"
        share = row["compaction_share"]
        cpu = "" if share != share else f"{share * 100:.1f}% of {row['writer_cpu_s']:.0f} s"
        lines.append(
            f"| {hours} h, {row['points']:,} points, {row['events']:,} events "
            f"| {row['records_written']:,} | {row['files_killed']} / {row['files_closed']} "
            f"| {row['open_killed_s'] * 1e3:.0f} ms ({row['records_read_killed']:,} records) "
            f"| {row['open_closed_s'] * 1e3:.0f} ms ({row['records_read_closed']:,} records) "
            f"| {'' if bulk is None else f'{bulk * 1e3:.0f} ms'} "
            f"| {ratio} "
            f"| {cpu} |"
        )
    lines += [
        "",
        "| live run | read_scalars(max_points=2000), one tag, not loaded | iter_scalars, one tag |",
        "| --- | --- | --- |",
    ]
    for hours, row in res["hours"].items():
        lines.append(
            f"| {hours} h | {row['max_points_cold_s'] * 1e3:.0f} ms, "
            f"{row['max_points_cached_bytes']:,} bytes kept "
            f"| {row['iter_scalars_rows_per_s'] / 1e6:.0f} M rows/s |"
        )
    cpu = res.get("cpu")
    if cpu:
        lines += [
            "",
            f"Compaction while writing {cpu['hours']:g} h at live cadence ({cpu['flushes']:,} "
            f"flushes): {cpu['compaction_cpu_s']:.2f} s of {cpu['writer_cpu_s']:.1f} s writer CPU "
            f"= {cpu['share'] * 100:.1f}%.",
        ]
    return "\n".join(lines)


def restarts(args: argparse.Namespace) -> dict:
    """Reads of runs with many restarts, the tree at ``args.base`` and this one alternately."""
    script = os.path.join(HERE, "restarts_run.py")
    trees = {"base": os.path.abspath(args.base), "new": ROOT}
    res: dict = {"pairs": args.pairs, "timeout_s": args.timeout, "runs": []}
    for shape in args.shapes:
        for n in args.records:
            run_dir = os.path.join(args.out, "restarts", f"{shape}-{n}")
            written = run_dir + ".written"  # (a compacted run has no index file to tell)
            if not os.path.exists(written):  # written once, kept for later invocations
                subprocess.run(
                    [sys.executable, script, "write", shape, str(n), run_dir], check=True
                )
                open(written, "w").close()
            for read in args.reads:
                row: dict = {"shape": shape, "records": n, "read": read, "base": [], "new": []}
                for _ in range(args.pairs):
                    for name, tree in trees.items():
                        if row[name] and row[name][-1] is None:
                            continue  # ran past the timeout once: not again
                        cmd = [sys.executable, script, "time", run_dir, read]
                        try:
                            out = subprocess.run(
                                cmd,
                                cwd=tree,
                                capture_output=True,
                                check=True,
                                timeout=args.timeout,
                            )
                        except subprocess.TimeoutExpired:
                            row[name].append(None)
                            continue
                        got = json.loads(out.stdout)
                        assert got["recorder"] == os.path.join(tree, "recorder"), got
                        row[name].append(got["seconds"])
                        row["points"] = got["points"]
                res["runs"].append(row)
                print(restarts_row(row), flush=True)
    return res


def restarts_row(row: dict) -> str:
    """One line of the --restarts table: seconds per pair and the median ratio."""

    def cell(seconds: float | None) -> str:
        return "timeout" if seconds is None else f"{seconds:.3g}"

    pairs = list(zip(row["base"], row["new"], strict=False))
    ratios = [b / n for b, n in pairs if b is not None and n]
    base = " / ".join(cell(b) for b in row["base"])
    new = " / ".join(cell(n) for n in row["new"])
    ratio = f"{statistics.median(ratios):.3g}x" if ratios else "-"
    return (
        f"| {row['shape']} | {row['records']:,} | {row['read']} | {row.get('points', '-')} "
        f"| {base} | {new} | {ratio} |"
    )


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes / 10")
    parser.add_argument("--repeat", type=int, default=7, help="fresh readers per load figure")
    parser.add_argument("--no-anchors", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "out", "recorder"))
    parser.add_argument("--load-rss", metavar="RUN_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--live", action="store_true", help="the live-written runs instead")
    parser.add_argument(
        "--hours", type=float, nargs="+", default=[0.25, 1.0], help="--live: run durations"
    )
    parser.add_argument(
        "--bulk-hours", type=float, default=4.0, help="--live: bulk copies up to this duration"
    )
    parser.add_argument(
        "--runs", nargs="*", default=[], help="--live: also these killed live runs (directories)"
    )
    parser.add_argument(
        "--live-cpu-hours", type=float, default=0.0, help="--live: also write this fresh"
    )
    parser.add_argument("--restarts", action="store_true", help="runs with many restarts")
    parser.add_argument("--base", help="--restarts: the tree to compare with (its root)")
    parser.add_argument(
        "--shapes", nargs="+", default=["writers", "epochs", "none"], help="--restarts"
    )
    parser.add_argument(
        "--records", type=int, nargs="+", default=[1000, 10_000, 100_000], help="--restarts"
    )
    parser.add_argument("--pairs", type=int, default=3, help="--restarts: base/new pairs")
    parser.add_argument(
        "--reads",
        nargs="+",
        default=["read_scalars", "snapshot", "iter_scalars", "preview", "replay"],
        help="--restarts: which (bench/restarts_run.py READS)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="--restarts: seconds a read may take"
    )
    args = parser.parse_args()
    if args.restarts:
        if not args.base:
            parser.error("--restarts needs --base")
        print("| shape | records | read | points | base s | new s | base/new |")
        print("| --- | --: | --- | --: | --- | --- | --: |")
        res = restarts(args)
        with open(os.path.join(args.out, "..", "recorder-restarts.json"), "w") as f:
            json.dump(res, f, indent=2)
        return
    if args.load_rss:
        _load_rss(args.load_rss)
        return
    if args.live:
        os.makedirs(args.out, exist_ok=True)
        live(args)
        return

    scale = 10 if args.quick else 1
    tags, steps, big = 100, 10_000 // scale, 10_000_000 // scale
    os.makedirs(args.out, exist_ok=True)
    run_1m = os.path.join(args.out, "run-1m")
    run_10m = os.path.join(args.out, "run-10m")
    res: dict = {"quick": args.quick, "tags": tags, "steps": steps, "big_points": big}

    rounds = [write_run(run_1m, tags, steps) for _ in range(3)]
    res["append_1m_all"] = [r["events_per_s"] for r in rounds]
    res["append_1m"] = sorted(rounds, key=lambda r: r["events_per_s"])[1]  # the median of 3
    res["append_1m_fine"] = write_run(
        os.path.join(args.out, "run-1m-fine"), tags, steps, batch=100, flush_points=1
    )
    res["append_1_point_calls"] = append_small_batches(
        os.path.join(args.out, "run-small"), 100_000 // scale
    )
    res["load_1m_index_s"], res["load_1m_index_all"] = median_time(
        lambda: load_all(run_1m), args.repeat
    )
    index = os.path.join(run_1m, INDEX_NAME)
    os.rename(index, index + ".away")
    try:
        res["load_1m_scan_s"], _ = median_time(lambda: load_all(run_1m), args.repeat)
    finally:
        os.rename(index + ".away", index)
    fine = os.path.join(args.out, "run-1m-fine")
    res["load_1m_fine_s"], _ = median_time(lambda: load_all(fine), args.repeat)
    res["load_1m_fresh_process"] = load_in_fresh_process(run_1m)

    res["chunks"] = chunk_sensitivity(args.out, min(args.repeat, 3))

    res["append_10m"] = write_run(run_10m, 1, big)

    def load_big() -> None:
        r = RunReader(run_10m)
        assert len(r.read_scalars("tag0").steps) == big
        r.close()

    res["load_10m_s"], res["load_10m_all"] = median_time(load_big, args.repeat)
    warm = RunReader(run_10m)
    warm.read_scalars("tag0")
    res["max_points_2000_s"], _ = median_time(
        lambda: warm.read_scalars("tag0", max_points=2000), 3 * args.repeat
    )
    picked = warm.read_scalars("tag0", max_points=2000)
    res["max_points_returned"] = len(picked.steps)
    warm.close()

    if not args.no_anchors:
        res["anchors"] = anchors(os.path.join(args.out, "anchors"), tags, steps)

    with open(os.path.join(args.out, "..", "recorder.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(report(res))


def report(res: dict) -> str:
    """The results as a Markdown table (the figures of docs/performance.md)."""
    n1 = res["tags"] * res["steps"]
    big = res["big_points"]
    a1 = res["append_1m"]
    fresh = res["load_1m_fresh_process"]
    rows = [
        (
            "append, 1,000-point batches, 100 tags (median of 3)",
            f"{a1['events_per_s'] / 1e6:.1f} M events/s "
            f"({a1['events_per_s_before_close'] / 1e6:.1f} M/s before close)",
            ">= 2 M/s",
        ),
        (
            f"append, one tag of {big:,}",
            f"{res['append_10m']['events_per_s'] / 1e6:.1f} M events/s",
            ">= 2 M/s",
        ),
        (
            "append, 1-point calls",
            f"{res['append_1_point_calls']['events_per_s'] / 1e3:.0f} k events/s",
            "",
        ),
        ("bytes on disk per scalar event", f"{a1['bytes_per_event']:.2f}", "<= 16"),
        (
            "bytes/event, flushed every 100 steps",
            f"{res['append_1m_fine']['bytes_per_event']:.2f}",
            "<= 16",
        ),
        (
            f"load all {n1:,} points ({res['tags']} tags), index",
            f"{res['load_1m_index_s'] * 1e3:.0f} ms",
            "<= 100 ms",
        ),
        (
            "  same, in a fresh process: time / peak RSS",
            f"{fresh['seconds'] * 1e3:.0f} ms / {fresh['rss_mb']:.0f} MB",
            "",
        ),
        (
            f"load all {n1:,} points, no index (live run)",
            f"{res['load_1m_scan_s'] * 1e3:.0f} ms",
            "<= 100 ms",
        ),
        (
            f"load all {n1:,} points, flushed every 100 steps",
            f"{res['load_1m_fine_s'] * 1e3:.0f} ms",
            "",
        ),
        (f"load one tag of {big:,} points", f"{res['load_10m_s'] * 1e3:.0f} ms", "<= 500 ms"),
        (
            f"max_points=2000 over {big:,} (warm)",
            f"{res['max_points_2000_s'] * 1e3:.1f} ms",
            "<= 100 ms",
        ),
    ]
    anchors = res.get("anchors")
    if anchors:
        ev = anchors["events"]
        tb, vdl = anchors["tb_load"], anchors["vdl_load"]
        ours = res["load_1m_index_s"]
        rows += [
            (
                f"TensorBoard EventAccumulator, load {ev:,} (tensorboardX file)",
                f"{tb['seconds']:.2f} s / {tb['rss_mb']:.0f} MB",
                f"ours {tb['seconds'] / ours:.0f}x faster",
            ),
            (
                "TensorBoard Rust data server, one load cycle, 1,000 points a tag kept",
                f"{anchors['rust_load']['seconds']:.2f} s / {anchors['rust_load']['rss_mb']:.0f} MB",
                f"ours {anchors['rust_load']['seconds'] / ours:.0f}x faster",
            ),
            (
                "TensorBoard Rust data server, every point kept",
                f"{anchors['rust_load_all']['seconds']:.2f} s / "
                f"{anchors['rust_load_all']['rss_mb']:.0f} MB",
                f"ours {anchors['rust_load_all']['seconds'] / ours:.0f}x faster",
            ),
            (
                "VisualDL LogReader, load the same",
                f"{vdl['seconds']:.2f} s / {vdl['rss_mb']:.0f} MB",
                f"ours {vdl['seconds'] / ours:.0f}x faster",
            ),
            (
                "tensorboardX bytes/event",
                f"{anchors['tbx_bytes'] / ev:.1f}",
                f"ours {anchors['tbx_bytes'] / ev / a1['bytes_per_event']:.1f}x smaller",
            ),
            (
                "VisualDL bytes/event",
                f"{anchors['vdl_bytes'] / ev:.1f}",
                f"ours {anchors['vdl_bytes'] / ev / a1['bytes_per_event']:.1f}x smaller",
            ),
            (
                "tensorboardX add_scalar rate",
                f"{ev / anchors['tbx_write_s'] / 1e3:.0f} k events/s",
                f"ours {a1['events_per_s'] * anchors['tbx_write_s'] / ev:.0f}x faster",
            ),
            (
                "VisualDL add_scalar rate",
                f"{ev / anchors['vdl_write_s'] / 1e3:.0f} k events/s",
                f"ours {a1['events_per_s'] * anchors['vdl_write_s'] / ev:.0f}x faster",
            ),
        ]
    lines = ["| measurement | result | target / ratio |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines += [
        "",
        "| points of a tag per flush (chunk) | bytes/event | load time per point |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {c['points_per_chunk']} | {c['bytes_per_event']:.1f} | {c['load_us_per_point']:.2f} µs |"
        for c in res["chunks"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
