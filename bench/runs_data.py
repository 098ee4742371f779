"""A sweep's log directory: many finished runs with hparams, for the runs table and /api/runs.

Each run is written with ``recorder.RunWriter(sync="never")`` in bulk (one chunk per tag per
65,536 points), the way a finished run that a fresh ``serve`` opens looks on disk:

* a ``meta`` record ``{"host": "node03", "status": "running"}`` first (the host the run's summary
  shows) and, for a run that ended cleanly, ``{"status": "closed"}`` last: the close marker that
  makes its summary ``finished`` (a run without it, about 3 in 100 here, reads as ``crashed``:
  its newest event is long past, and its files' modification times say so too);
* one ``hparams`` record: ``lr`` (log-uniform 1e-5 .. 1e-1), ``optimizer`` (adam, adamw, sgd,
  rmsprop), ``batch_size``, ``dropout``, ``layers``, ``weight_decay``, ``warmup_steps``, ``amp``
  (bool), ``model`` (str), ``seed``, with ``metrics`` naming the eval tags;
* ``tags`` scalar tags (``train/loss``, ``train/acc``, ``eval/loss``, ``eval/acc``, ``train/lr``,
  ``train/grad_norm``, ``eval/f1``, ``train/tokens_per_s``, ``sys/mem_gb``, ``eval/ppl``; more are
  named ``extra/tNN``) of ``points`` points each at steps 0, 1, 2, ...: curves whose level and speed
  follow the hparams (a learning rate near 3e-3 with adam does best), with noise; runs with a large
  learning rate under sgd diverge, and their losses end in NaN (about 2 in 100).

Runs start an hour apart from 2026-09-22 (``WALL0``), with steps 0.1 s apart. Names look like
``s03-r0312-adamw``; ``seed`` makes everything reproducible.

Dependency-free (recorder and NumPy), so any test or benchmark can import it::

    from runs_data import write_runs, cached_runs
    facts = write_runs("/tmp/sweep", n_runs=100, points=1000)
    logdir = cached_runs(n_runs=1000, points=10_000)   # generated once under bench/out/runs/

Command line::

    python bench/runs_data.py OUT_DIR --runs 1000 --points 10000
    python bench/runs_data.py --cached --runs 1000 --points 10000   # fill the cache, print the path
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from recorder import RunWriter  # noqa: E402

WALL0 = 1_790_000_000.0
#: Seconds between two runs' starts, and between two steps of a run.
RUN_SPACING = 3600.0
STEP_SECONDS = 0.1
TAG_NAMES = (
    "train/loss",
    "train/acc",
    "eval/loss",
    "eval/acc",
    "train/lr",
    "train/grad_norm",
    "eval/f1",
    "train/tokens_per_s",
    "sys/mem_gb",
    "eval/ppl",
)
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
MODELS = ("resnet18", "resnet50", "vit-s", "vit-b", "convnext-t")
CACHE_DIR = os.path.join(HERE, "out", "runs")
#: Where :func:`with_previews` keeps its copies of the sweeps.
PREVIEW_DIR = os.path.join(HERE, "out", "runs-preview")
# Bump when the shapes written change, so cached log directories are regenerated.
VERSION = 2  # 2: digests of version 2
#: Runs without a close marker (crashed), out of 100.
CRASHED_PER_100 = 3


def tag_names(tags: int) -> list[str]:
    """The scalar tags of a run with ``tags`` tags: TAG_NAMES first, then ``extra/tNN``."""
    return [TAG_NAMES[i] if i < len(TAG_NAMES) else f"extra/t{i:02d}" for i in range(tags)]


def run_hparams(index: int, seed: int = 0) -> dict[str, Any]:
    """The hparams of run number ``index`` (deterministic in ``index`` and ``seed``)."""
    rng = np.random.default_rng([seed, index, 1])
    return {
        "lr": float(10 ** rng.uniform(-5, -1)),
        "optimizer": OPTIMIZERS[int(rng.integers(len(OPTIMIZERS)))],
        "batch_size": int(2 ** rng.integers(5, 10)),
        "dropout": round(float(rng.uniform(0, 0.5)), 3),
        "layers": int(rng.integers(2, 13)),
        "weight_decay": float(10 ** rng.uniform(-6, -2)),
        "warmup_steps": int(rng.choice([0, 100, 500, 1000])),
        "amp": bool(rng.integers(2)),
        "model": MODELS[int(rng.integers(len(MODELS)))],
        "seed": int(rng.integers(1 << 16)),
    }


def run_name(index: int, hparams: dict[str, Any]) -> str:
    """``s{index // 100:02d}-r{index:04d}-{optimizer}``."""
    return f"s{index // 100:02d}-r{index:04d}-{hparams['optimizer']}"


def _quality(hp: dict[str, Any]) -> float:
    """How well a run with these hparams trains, in (0, 1]."""
    distance = abs(math.log10(hp["lr"]) - math.log10(3e-3))
    bonus = {"adam": 0.0, "adamw": 0.05, "sgd": -0.15, "rmsprop": -0.05}[hp["optimizer"]]
    return float(np.clip(math.exp(-(distance**2) / 2) + bonus - hp["dropout"] * 0.2, 0.05, 1.0))


def run_curves(
    index: int, tags: int, points: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    """Steps, wall times, ``{tag: values}`` and facts (``diverged``) of run number ``index``."""
    hp = run_hparams(index, seed)
    rng = np.random.default_rng([seed, index, 2])
    steps = np.arange(points, dtype=np.int64)
    walls = WALL0 + index * RUN_SPACING + steps * STEP_SECONDS
    t = steps / max(points - 1, 1)
    q = _quality(hp)
    speed = 3 + 12 * q + rng.uniform(0, 2)
    decay = np.exp(-t * speed)
    floor = 0.05 + 1.5 * (1 - q)
    loss = floor + (2.5 - floor) * decay
    diverged = hp["optimizer"] == "sgd" and hp["lr"] > 0.03
    noise = rng.standard_normal((tags, points)) * 0.02
    out: dict[str, np.ndarray] = {}
    for i, tag in enumerate(tag_names(tags)):
        base = tag.split("/")[-1]
        if base == "loss":
            v = loss * (1.1 if tag.startswith("eval") else 1.0) * (1 + noise[i])
        elif base in ("acc", "f1"):
            v = np.clip(1 - loss / 2.6, 0, 1) * (0.97 if base == "f1" else 1.0) + noise[i] * 0.5
        elif base == "lr":
            v = hp["lr"] * np.minimum(1, (steps + 1) / max(hp["warmup_steps"], 1)) * (1 - t * 0.9)
        elif base == "grad_norm":
            v = 5 * decay + 0.3 + np.abs(noise[i]) * 20
        elif base == "tokens_per_s":
            v = 2e5 / hp["layers"] * (1 + noise[i])
        elif base == "mem_gb":
            v = 2 + hp["batch_size"] / 64 + hp["layers"] * 0.5 + noise[i]
        elif base == "ppl":
            v = np.exp(np.minimum(loss * 1.1, 50)) * (1 + noise[i])
        else:
            v = np.sin(t * (i + 1) * 6) * q + noise[i]
        if diverged and base in ("loss", "ppl", "grad_norm"):
            # The loss blows up over the last fifth of the run and ends in NaN.
            cut = int(points * 0.8)
            v = v.copy()
            v[cut:] *= np.exp(np.linspace(0, 30, points - cut))
            v[max(cut, points - max(points // 50, 1)) :] = np.nan
        out[tag] = np.asarray(v, dtype=np.float64)
    return steps, walls, out, {"diverged": diverged}


def write_run(
    run_dir: str, index: int, tags: int = 10, points: int = 10_000, seed: int = 0
) -> dict:
    """Write run number ``index`` of the sweep into ``run_dir``; return its facts."""
    hp = run_hparams(index, seed)
    steps, walls, values, facts = run_curves(index, tags, points, seed)
    crashed = np.random.default_rng([seed, index, 3]).integers(100) < CRASHED_PER_100
    writer = RunWriter(run_dir, sync="never")
    try:
        writer.append_record(
            "meta",
            None,
            None,
            float(walls[0]),
            {"host": f"node{index % 8:02d}", "status": "running"},
        )
        metrics = [t for t in tag_names(tags) if t.startswith("eval/")]
        writer.append_record(
            "hparams",
            None,
            None,
            float(walls[0]),
            {"hparams": hp, "metrics": metrics, "metric_values": None},
        )
        batch = 1 << 16  # one recorder chunk per tag per append
        for lo in range(0, points, batch):
            hi = min(points, lo + batch)
            for tag, v in values.items():
                writer.append_scalars(tag, steps[lo:hi], walls[lo:hi], v[lo:hi])
        if not crashed:
            writer.append_record("meta", None, None, float(walls[-1]), {"status": "closed"})
    finally:
        writer.close()
    # Written long ago, as a sweep's runs are: a run without the close marker reads as crashed
    # (a server judges idleness by the files' modification times).
    for name in os.listdir(run_dir):
        os.utime(os.path.join(run_dir, name), (float(walls[-1]), float(walls[-1])))
    return {**facts, "crashed": bool(crashed), "hparams": hp}


def write_runs(
    logdir: str | os.PathLike[str],
    n_runs: int = 1000,
    tags: int = 10,
    points: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Write a sweep of ``n_runs`` runs into ``logdir`` (created; existing runs are appended to).

    Returns facts: ``runs`` (names, sorted), ``points`` (scalar points in all), ``crashed`` and
    ``diverged`` (names), ``seconds`` and ``bytes``.

    Raises:
        ValueError: a count is not a positive int.
    """
    for name, value in (("n_runs", n_runs), ("tags", tags), ("points", points)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    root = os.fspath(logdir)
    os.makedirs(root, exist_ok=True)
    t0 = time.perf_counter()
    names, crashed, diverged = [], [], []
    for index in range(n_runs):
        name = run_name(index, run_hparams(index, seed))
        facts = write_run(os.path.join(root, name), index, tags, points, seed)
        names.append(name)
        if facts["crashed"]:
            crashed.append(name)
        if facts["diverged"]:
            diverged.append(name)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)
    return {
        "runs": sorted(names),
        "tags": tags,
        "points": n_runs * tags * points,
        "crashed": crashed,
        "diverged": diverged,
        "seconds": time.perf_counter() - t0,
        "bytes": size,
    }


def cached_runs(
    n_runs: int = 1000,
    tags: int = 10,
    points: int = 10_000,
    seed: int = 0,
    cache: str | os.PathLike[str] = CACHE_DIR,
) -> str:
    """The log directory of :func:`write_runs` with these arguments, generated once under ``cache``.

    A directory counts as cached only once its marker (``generated.json``, written last) exists,
    so a generation that was killed is redone, not reused.
    """
    logdir = os.path.join(os.fspath(cache), f"v{VERSION}-{n_runs}x{tags}x{points}-s{seed}")
    marker = os.path.join(logdir, "generated.json")
    if os.path.exists(marker):
        return logdir
    shutil.rmtree(logdir, ignore_errors=True)
    facts = write_runs(logdir, n_runs, tags, points, seed)
    with open(marker, "w") as f:
        json.dump(facts, f)
    return logdir


def with_previews(
    logdir: str | os.PathLike[str], cache: str | os.PathLike[str] = PREVIEW_DIR
) -> str:
    """A copy of the sweep ``logdir`` (made by :func:`cached_runs`) whose runs each have a preview
    (recorder/preview.py: what a closed run's writer now writes), made once under ``cache``: its
    data files are hard links to the sweep's (never written to: a reader only reads them, so the
    two log directories share their pages in the OS page cache), the previews new files.
    """
    from recorder.preview import write_preview

    out = os.path.join(os.fspath(cache), os.path.basename(os.fspath(logdir)))
    marker = os.path.join(out, "generated.json")
    if os.path.exists(marker):
        return out
    shutil.rmtree(out, ignore_errors=True)
    for run in sorted(os.listdir(logdir)):
        src = os.path.join(logdir, run)
        if not os.path.isdir(src):
            continue
        dst = os.path.join(out, run)
        os.makedirs(dst)
        for name in os.listdir(src):
            os.link(os.path.join(src, name), os.path.join(dst, name))
        write_preview(dst)
        # Written long ago, as the rest of the run (write_run).
        when = max(os.stat(os.path.join(src, name)).st_mtime for name in os.listdir(src))
        os.utime(os.path.join(dst, "preview.vdlp"), (when, when))
    shutil.copyfile(os.path.join(logdir, "generated.json"), marker)
    return out


def cached_facts(logdir: str | os.PathLike[str]) -> dict[str, Any]:
    """The facts :func:`cached_runs` recorded for ``logdir``."""
    with open(os.path.join(os.fspath(logdir), "generated.json")) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="the log directory to write (not with --cached)")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cached", action="store_true", help="generate under bench/out/runs/")
    args = parser.parse_args()
    if args.cached:
        print(cached_runs(args.runs, args.tags, args.points, args.seed))
        return
    if not args.out:
        parser.error("OUT_DIR is required without --cached")
    facts = write_runs(args.out, args.runs, args.tags, args.points, args.seed)
    print(
        f"{len(facts['runs'])} runs, {facts['points']:,} points, {facts['bytes'] / 1e6:.1f} MB "
        f"in {facts['seconds']:.1f} s ({len(facts['crashed'])} crashed, "
        f"{len(facts['diverged'])} diverged)"
    )


if __name__ == "__main__":
    main()
