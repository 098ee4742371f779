"""Live alerts: detectors that watch every run as it is ingested, and the ``alert`` event.

The broker hands each batch it ingests to :meth:`AlertEngine.observe`, which only queues it
under its run for the next round (bounded; a full queue drops the batch and counts it), so the
ingest path never waits for a detector. The engine's own task runs the
detectors in rounds (at most every 0.1 s, and further apart after an expensive one, on
everything queued meanwhile, each tag's columns joined into one, on the event loop in slices of
at most 2 ms), per run and tag, with state bounded per tag (a rolling window, a few numbers),
and checks time-based rules (stalled and crashed runs) a few times a second. An alert it raises
is an ``alert`` event ingested into the run like any other batch, from the writer id
:data:`ALERTS_WRITER`: it is persisted with the run (so export of the run directory, import and
replay keep it) and pushed to every page on ``/ws/live`` in the run's ``data`` frames.

The detectors, their defaults and the reasoning behind each are in docs/alerts.md; the rules
file (``vdl-stream serve --alerts rules.toml``) is parsed by :func:`load_rules`.
"""

from __future__ import annotations

import bisect
import copy
import fnmatch
import itertools
import logging
import math
import operator
import statistics
import time
import tomllib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

from . import codec
from .codec import Batch, ScalarColumns

log = logging.getLogger("vdl_stream.alerts")

#: The writer id of the broker's own alert batches (never observed again by the detectors).
ALERTS_WRITER = "vdl-stream-alerts"
#: The ``rule`` of alerts sent by training code with ``Writer.alert``.
USER_RULE = "user"
#: Batches waiting for the detectors; past this the newest are dropped and counted.
QUEUE_BATCHES = 4096
#: ... and scalar points waiting at most (about 24 bytes each, kept alive by the queue): 96 MiB.
QUEUE_POINTS = 1 << 22
#: Runs whose detector state is kept (least recently ingested forgotten first).
MAX_RUNS = 4096
#: Tags whose detector state is kept per run (tags past this are not watched).
MAX_TAGS = 1024
#: Tag names whose "does any tag detector watch it" is remembered (all runs together); past
#: this the memory starts over.
WATCHED_TAGS = 1 << 14
#: Seconds between checks of the time-based rules (stall, crash).
TICK = 0.2
#: Points of a long column folded into one smoothed update at most (bounded cost per batch).
MAX_SMOOTH_POINTS = 32
#: Columns up to this long are smoothed point by point in Python (less set-up than NumPy).
SMALL_EMA_POINTS = 4
#: Smoothing plans (column length, weight) kept per engine; writers flush a few sizes.
PLANS = 256
#: Columns of one tag are joined for a round until they hold this many points (only their
#: values are copied; a longer column is judged on its own). Most of a group's cost is fixed
#: (the spike rule's median, the smoothing's set-up: about 15 µs), so large groups: 64 Ki
#: points (a 512 KiB buffer, reused) put it under 0.3 ns a point.
JOIN_POINTS = 1 << 16
#: Detector rounds run on the event loop, in slices of at most DETECT_SLICE seconds of work
#: with a checkpoint between them; False runs each round in a worker thread instead, which
#: cost the server its GIL hand-offs on top (docs/performance.md, "Issue 14: alerts cost (this
#: session)"; kept to compare the two on other machines).
DETECT_ON_LOOP = True
DETECT_SLICE = 0.002
#: The spike rule computes a tag's median and MAD again once this share of its window was
#: replaced since the last time; in between, bounds on both catch every possible spike exactly
#: (a column that might hold one is judged on the true median and MAD).
SPIKE_MOVES = 0.1
#: Points of a tag whose spread floors the divergence rule's scale, when the spike rule keeps
#: no window for it (the spike rule's window serves otherwise).
NOISE_WINDOW = 200
#: Seconds between the starts of detector rounds at least; each round takes everything queued
#: meanwhile. A round costs about 15 µs per run and tag whatever it holds, so a fast writer's
#: tags pay that once per 0.1 s of points (at 50 ms it was a third of the detectors' cost of
#: 1,024-point batches served); the wait adds 50 ms to an alert's latency on average.
DETECT_INTERVAL = 0.1
#: A round that took a long time (many tags, or a fast writer's many columns) is followed by a
#: longer pause, so that the rounds' own clock reads about this share of one core at most (not
#: while hurried: HURRY_SHARE) ... What the event loop pays for them is two to three times that
#: clock (observe in place 3 to 4 µs a batch against 1.2 in a tight loop, the ingest steps
#: right after a round twice as long, the round task's own set-up and freeing): at 5% a fast
#: writer of small batches in process had rounds every 0.1 s and its loop paid +125 ns an event,
#: at 1% rounds spread to 0.2 to 0.5 s and it paid +48 (load 13; at load 1 the two read
#: alike: docs/performance.md, "(2026-12-01, h5-alerts)").
DETECT_SHARE = 0.01
#: ... but rounds start at most this many seconds apart (an alert within 1 s of its point).
DETECT_MAX_INTERVAL = 0.5
#: A queue past this share of either bound starts the next round at once rather than after
#: DETECT_INTERVAL: a writer fast enough to fill it within a round's interval (16M points/s
#: in-process) would otherwise have batches dropped while the detectors wait. Not half: a
#: served writer at 3M events/s reaches half the points between rounds, and hurried rounds
#: (each paying its per-tag cost again) cost it 4% of its ingest (docs/performance.md).
HURRY_SHARE = 0.75
#: A column's values (map() over a batch's columns in C, not a Python loop per column).
_VALUES = operator.attrgetter("values")


#: A column's tag (the same, for the tags of a round's batches).
_TAG = operator.attrgetter("tag")
_DTYPE = operator.attrgetter("dtype")
_FLOAT64 = np.dtype(np.float64)
#: A tag's columns joined for a round when there are at least this many: their bytes are
#: joined (one copy each, none of np.concatenate's set-up per array, which cost a round of
#: small batches more than the detectors' passes); fewer (large batches) are concatenated into
#: the engine's reused buffer, which spares allocating and faulting in a fresh one per round.
JOIN_BYTES_COLUMNS = 32


#: Event kinds that are not training data: a batch of only these does not count as the run's
#: activity (the stall rule's cadence).
_NOT_DATA = frozenset({"alert", "hparams", "meta", "telemetry"})
#: Status changes of a run's dropped batches kept for a round (the newest always: past this it
#: replaces the last one kept), so that a run whose writer flips its status in every batch
#: cannot push out another run's close. All runs together keep at most the queue's batch bound
#: of them before each keeps only its newest.
KEPT_STATUS = 4
#: Seconds between warnings that the detectors dropped batches (each says how many so far).
DROP_WARN_INTERVAL = 60.0
#: Alerts kept in memory per followed run (runs another process writes: the server cannot
#: record alerts in them), the oldest forgotten first; at most :data:`MAX_RUNS` runs.
HELD_PER_RUN = 256

#: Every detector with its default parameters (docs/alerts.md explains each value).
DEFAULT_RULES: dict[str, dict[str, Any]] = {
    "nan": {"enabled": True, "tags": ["*"], "exclude": [], "level": "error"},
    "spike": {
        "enabled": True,
        "tags": ["*"],
        "exclude": ["lr", "*/lr", "*learning_rate*", "*/lr_*", "*lr/*"],
        "level": "warn",
        "window": 200,
        "min_points": 50,
        "threshold": 25.0,
        "log_threshold": 6.0,
    },
    "divergence": {
        "enabled": True,
        "tags": ["*loss*"],
        "exclude": [],
        "level": "error",
        "alpha": 0.05,
        "min_points": 50,
        "factor": 3.0,
        "rising_points": 300,
    },
    "plateau": {
        "enabled": True,
        "tags": ["*loss*"],
        "exclude": [],
        "level": "info",
        "mode": "auto",
        "alpha": 0.05,
        "min_delta": 0.01,
        "patience": 2000,
        "patience_fraction": 0.5,
    },
    "stall": {"enabled": True, "level": "warn", "factor": 20.0, "min_seconds": 120.0},
    "crash": {"enabled": True, "level": "error", "grace": 3.0},
    "writers": {"enabled": True, "level": "warn"},
    "gpu_underuse": {"enabled": True, "level": "warn", "util": 30.0, "seconds": 120.0},
    "gpu_memory": {"enabled": True, "level": "warn", "fraction": 0.98, "seconds": 10.0},
    "gradients": {
        "enabled": True,
        "tags": ["*grad*"],
        "exclude": [],
        "level": "error",
        "baseline_points": 5,
        "growth": 1000.0,
        "shrink": 10000.0,
        "zero_eps": 1e-10,
        "zero_share": 0.9,
        "huge": 1e6,
        "huge_share": 0.01,
    },
    "limits": {"cooldown": 60.0, "per_minute": 20},
}
#: Detectors that apply per tag, and can be tuned or disabled per tag pattern.
TAG_DETECTORS = ("nan", "spike", "divergence", "plateau", "gradients")
#: Plateau's ``auto`` mode: tags matching these improve upwards; every other tag downwards.
HIGHER_IS_BETTER = ("*acc*", "*auc*", "*f1*", "*precision*", "*recall*", "*map*", "*score*")


# -- the alert event -------------------------------------------------------------------------------


def alert_event(
    title: object,
    text: object,
    level: object = "warn",
    *,
    step: object = None,
    wall: object = None,
    rule: str = USER_RULE,
    series: str | None = None,
    value: float | None = None,
) -> dict[str, Any]:
    """Build an ``alert`` event (docs/protocol.md, "alert").

    Args:
        title: a short headline, a non-empty str of at most 4,096 characters.
        text: the message, a str of at most 4,096 characters.
        level: ``"info"``, ``"warn"`` or ``"error"``.
        step: the training step it concerns, an int, or None.
        wall: seconds since the epoch; now when None.
        rule: the detector that raised it (``"user"`` for training code).
        series: the tag it is about, or None for the whole run.
        value: the offending value, or None.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """
    from .summaries import check_str, check_wall, to_step

    title = check_str(title, "title")
    if not title or len(title) > codec.MAX_ALERT_TEXT:
        raise ValueError(
            f"title must be a non-empty str of at most {codec.MAX_ALERT_TEXT} characters, "
            f"got {len(title)} characters"
        )
    text = check_str(text, "text")
    if len(text) > codec.MAX_ALERT_TEXT:
        raise ValueError(f"text must be at most {codec.MAX_ALERT_TEXT} characters, got {len(text)}")
    if type(level) is not str:
        raise TypeError(f"level must be a str, got {type(level).__name__} {level!r:.40}")
    if level not in codec.ALERT_LEVELS:
        raise ValueError(f"level must be one of {list(codec.ALERT_LEVELS)}, got {level!r:.40}")
    if step is not None:
        step = to_step(step)
    wall = time.time() if wall is None else check_wall(wall)
    if series is not None:
        codec.check_tag(series, "series")
    if value is not None and not math.isfinite(value):
        value_out: float | None = None  # msgpack carries NaN, but JSON answers cannot
        text = text or f"value {value}"
    else:
        value_out = value
    return {
        "kind": "alert",
        "tag": None,
        "step": step,
        "wall": wall,
        "series": series,
        "value": value_out,
        "rule": rule,
        "level": level,
        "title": title,
        "message": text,
    }


# -- rules -------------------------------------------------------------------------------------


class RulesError(ValueError):
    """A rules file (or rules map) is malformed; the message names the key and the bad value."""


def _patterns(value: object, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise RulesError(f"{where} must be a glob or a list of globs, got {value!r:.80}")
    return list(value)


def _merge_params(base: dict[str, Any], given: object, where: str) -> dict[str, Any]:
    """``base`` updated with ``given`` (a table, or a bool that only switches it on or off)."""
    out = copy.deepcopy(base)
    if isinstance(given, bool):
        out["enabled"] = given
        return out
    if not isinstance(given, dict):
        raise RulesError(f"{where} must be a table or true/false, got {given!r:.80}")
    for key, value in given.items():
        if key not in base:
            raise RulesError(f"{where} has no setting {key!r} (known: {sorted(base)})")
        default = base[key]
        if key in ("tags", "exclude"):
            out[key] = _patterns(value, f"{where}.{key}")
        elif key == "level":
            if value not in codec.ALERT_LEVELS:
                raise RulesError(f"{where}.level must be one of {list(codec.ALERT_LEVELS)}")
            out[key] = value
        elif key == "mode":
            if value not in ("auto", "min", "max"):
                raise RulesError(f"{where}.mode must be auto, min or max, got {value!r:.40}")
            out[key] = value
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise RulesError(f"{where}.{key} must be true or false, got {value!r:.40}")
            out[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RulesError(f"{where}.{key} must be a number, got {value!r:.40}")
            if not math.isfinite(value) or value < 0:
                raise RulesError(f"{where}.{key} must be a finite number >= 0, got {value!r}")
            out[key] = type(default)(value) if isinstance(default, int) else float(value)
    return out


@dataclass(frozen=True)
class Rules:
    """Detector parameters: the global ones, and overrides per tag pattern, first match wins.

    Build one with :func:`load_rules` (from TOML) or :func:`rules_from_dict`; ``Rules()`` is the
    defaults of :data:`DEFAULT_RULES`.
    """

    detectors: dict[str, dict[str, Any]] | None = None
    overrides: tuple[tuple[tuple[str, ...], dict[str, dict[str, Any]]], ...] = ()

    def params(self, name: str) -> dict[str, Any]:
        """The global parameters of detector ``name``."""
        return (self.detectors or DEFAULT_RULES)[name]

    def for_tag(self, name: str, tag: str) -> dict[str, Any] | None:
        """The parameters of tag detector ``name`` for ``tag``, or None when it does not apply."""
        for patterns, tables in self.overrides:
            if any(fnmatch.fnmatchcase(tag, p) for p in patterns):
                if name in tables:
                    params = tables[name]
                    return params if params["enabled"] else None
                break
        params = self.params(name)
        if not params["enabled"]:
            return None
        if not any(fnmatch.fnmatchcase(tag, p) for p in params["tags"]):
            return None
        if any(fnmatch.fnmatchcase(tag, p) for p in params["exclude"]):
            return None
        return params


def rules_from_dict(data: dict[str, Any]) -> Rules:
    """Build :class:`Rules` from a parsed rules file (see docs/alerts.md, "Rules file").

    Top-level tables name detectors (``[spike]``, ``[stall]``...) and change their defaults; a
    detector set to ``false`` is off. Each ``[[tags]]`` entry has ``match`` (a glob or a list of
    globs) and per-detector tables or booleans that apply to the tags it matches.

    Raises:
        RulesError: an unknown detector or setting, or a value of the wrong type.
    """
    if not isinstance(data, dict):
        raise RulesError("the rules must be a table")
    detectors = copy.deepcopy(DEFAULT_RULES)
    overrides = []
    for key, value in data.items():
        if key == "tags":
            if not isinstance(value, list):
                raise RulesError("tags must be an array of tables ([[tags]])")
            for i, entry in enumerate(value):
                where = f"tags[{i}]"
                if not isinstance(entry, dict) or "match" not in entry:
                    raise RulesError(f"{where} must be a table with a match glob")
                patterns = tuple(_patterns(entry["match"], f"{where}.match"))
                tables = {}
                for name, given in entry.items():
                    if name == "match":
                        continue
                    if name not in TAG_DETECTORS:
                        raise RulesError(
                            f"{where}.{name} is not a per-tag detector (known: {list(TAG_DETECTORS)})"
                        )
                    tables[name] = _merge_params(detectors[name], given, f"{where}.{name}")
                overrides.append((patterns, tables))
        elif key in DEFAULT_RULES:
            detectors[key] = _merge_params(detectors[key], value, key)
        else:
            raise RulesError(f"unknown detector {key!r:.40} (known: {sorted(DEFAULT_RULES)})")
    # Overrides were merged over the defaults as they stood when read; re-merge them over the
    # final global tables so that `[spike] window = 50` reaches tags with their own spike table.
    final = []
    for i, (patterns, tables) in enumerate(overrides):
        entry = data["tags"][i]
        final.append(
            (
                patterns,
                {
                    name: _merge_params(detectors[name], entry[name], f"tags[{i}].{name}")
                    for name in tables
                },
            )
        )
    return Rules(detectors, tuple(final))


def load_rules(path: str | Path) -> Rules:
    """Read a rules file (TOML; docs/alerts.md).

    Raises:
        OSError: the file cannot be read.
        RulesError: it is not valid TOML or breaks the schema (the message names the file).
    """
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"{path}: not valid TOML: {exc}") from None
    try:
        return rules_from_dict(data)
    except RulesError as exc:
        raise RulesError(f"{path}: {exc}") from None


# -- reading telemetry ---------------------------------------------------------------------------


#: One GPU's sample: wall time, host, rank, GPU name (``gpu0``), utilisation in percent, memory
#: used and total in bytes (None when not sampled).
GpuReading = tuple[float, Any, Any, str, float, float | None, float | None]


def gpu_readings(event: dict[str, Any]) -> list[GpuReading]:
    """The GPU samples in a ``telemetry`` event (docs/telemetry.md): the one place where the
    GPU rules (``gpu_underuse``, ``gpu_memory``) read telemetry, so that a change of its form
    is met here alone. A GPU is named by its ``gpu{i}/util`` field; fields that are missing or
    not numbers are left out."""
    fields = event.get("fields")
    if not isinstance(fields, dict):
        return []
    wall = float(event["wall"])
    host, rank = event.get("host"), event.get("rank")
    out = []
    for name, util in fields.items():
        if not (name.startswith("gpu") and name.endswith("/util")) or not _number(util):
            continue
        gpu = name[: -len("/util")]
        used, total = fields.get(f"{gpu}/mem_used"), fields.get(f"{gpu}/mem_total")
        out.append(
            (
                wall, host, rank, gpu, float(util),
                float(used) if _number(used) else None,
                float(total) if _number(total) else None,
            )
        )  # fmt: skip
    return out


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# -- per-tag detector state ---------------------------------------------------------------------


class _Rolling:
    """The last ``size`` finite values of a tag, as a ring (for median and MAD)."""

    __slots__ = ("buf", "i", "n", "pushed")

    def __init__(self, size: int) -> None:
        self.buf = np.empty(max(1, size), np.float64)
        self.n = 0
        self.i = 0
        self.pushed = 0  # values ever added: how far the window moved since some moment

    def extend(self, values: np.ndarray) -> None:
        size = len(self.buf)
        self.pushed += len(values)
        if len(values) >= size:
            self.buf[:] = values[-size:]
            self.n, self.i = size, 0
            return
        end = self.i + len(values)
        if end <= size:
            self.buf[self.i : end] = values
        else:
            cut = size - self.i
            self.buf[self.i :] = values[:cut]
            self.buf[: end - size] = values[cut:]
        self.i = end % size
        self.n = min(size, self.n + len(values))

    def values(self) -> np.ndarray:
        return self.buf[: self.n] if self.n < len(self.buf) else self.buf


def _median_mad(values: np.ndarray) -> tuple[float, float]:
    """The median of finite ``values`` and their median absolute deviation from it, in one
    scratch array (partitioned in place: no copies past the first)."""
    n = len(values)
    k = n // 2
    kth = k if n % 2 else (k - 1, k)
    work = values.copy()
    work.partition(kth)
    med = float(work[k]) if n % 2 else (float(work[k - 1]) + float(work[k])) / 2
    np.subtract(values, med, out=work)
    np.abs(work, out=work)
    work.partition(kth)
    mad = float(work[k]) if n % 2 else (float(work[k - 1]) + float(work[k])) / 2
    return med, mad


def _centre_bounds(values: np.ndarray, moves: int) -> tuple[float, float, float, float, float]:
    """The median and MAD of finite ``values`` (as :func:`_median_mad`, to the bit), and bounds
    that hold for every window made from ``values`` by replacing at most ``moves`` of them
    with any others: ``(median, mad, median_low, median_high, mad_low)``.

    Replacing one value moves every order statistic by at most one rank, so the new median lies
    between the old order statistics ``moves`` ranks below and above it; each new absolute
    deviation is at least the value's distance to that interval, so the new MAD is at least the
    order statistic of those distances ``moves`` ranks below the median's (0 when there is none).
    """
    n = len(values)
    low, high = (n - 1) // 2, n // 2  # the median's ranks (one rank when n is odd)
    ranked = np.sort(values)
    med = float(ranked[high]) if n % 2 else (float(ranked[low]) + float(ranked[high])) / 2
    work = np.subtract(ranked, med)
    np.abs(work, out=work)
    kth = high if n % 2 else (low, high)
    work.partition(kth)
    mad = float(work[high]) if n % 2 else (float(work[low]) + float(work[high])) / 2
    j = low - moves
    if j < 0:
        return med, mad, -math.inf, math.inf, 0.0
    med_low, med_high = float(ranked[j]), float(ranked[min(high + moves, n - 1)])
    # Distance to [med_low, med_high], negative inside it (only rank j matters, and clamped).
    np.maximum(np.subtract(med_low, ranked), np.subtract(ranked, med_high), out=work)
    work.partition(j)
    return med, mad, med_low, med_high, max(float(work[j]), 0.0)


def _robust_z(window: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """How many robust standard deviations (1.4826 MAD) each of ``values`` lies from the median
    of ``window``; None when the window has no spread (a constant, a step schedule)."""
    med, mad = _median_mad(window)
    if not mad > 0:
        return None
    return np.abs(values - med) / (1.4826 * mad)


class _Smoothed:
    """An exponential moving average with its best value, and how long it has risen."""

    __slots__ = ("best", "best_step", "ema", "first", "first_step", "n", "rising")

    def __init__(self) -> None:
        self.ema: float | None = None
        self.n = 0
        self.first: float | None = None
        self.best: float | None = None
        self.best_step: int | None = None
        self.rising = 0
        self.first_step = 0


class _TagState:
    """One tag's detector state, with the parameters of each tag detector for it (None: off),
    looked up once when the tag is first seen."""

    __slots__ = (
        "baseline",
        "bounds",
        "divergence",
        "emas",
        "gradients",
        "nan",
        "norms",
        "plateau",
        "plateau_params",
        "seen",
        "sign",
        "smooth",
        "spike",
        "window",
    )

    def __init__(self, rules: Rules, tag: str) -> None:
        self.nan = rules.for_tag("nan", tag)
        self.spike = rules.for_tag("spike", tag)
        self.divergence = rules.for_tag("divergence", tag)
        self.plateau_params = rules.for_tag("plateau", tag)
        self.gradients = rules.for_tag("gradients", tag)
        # alpha -> the tag's EMA with that weight, shared by divergence and plateau
        self.emas: dict[float, _Smoothed] = {}
        for p in (self.divergence, self.plateau_params):
            if p is not None and p["alpha"] not in self.emas:
                self.emas[p["alpha"]] = _Smoothed()
        self.window: _Rolling | None = None
        # spike: (window.pushed then, moves allowed, median low, median high, MAD low), see
        # _centre_bounds; None until the window is full.
        self.bounds: tuple[int, int, float, float, float] | None = None
        self.smooth: _Smoothed | None = None
        self.plateau: _Smoothed | None = None
        self.sign = 1.0  # plateau: -1 for a tag that improves upwards
        self.norms: list[float] = []
        self.baseline: float | None = None  # the median of the first norms, once there are enough
        self.seen = 0


class _RunState:
    """What the engine knows of one run."""

    def __init__(self) -> None:
        self.tags: dict[str, _TagState] = {}
        self.active: set[tuple[str, str | None]] = set()  # conditions that fired and still hold
        self.last_fired: dict[tuple[str, str | None], float] = {}
        self.minute: deque[float] = deque()  # monotonic times of alerts in the last minute
        self.suppressed = 0
        self.closed = False
        self.last_data: float | None = None  # monotonic time of the last training data
        self.intervals: deque[float] = deque(maxlen=32)
        self.lost_at: float | None = None  # a writer connection ended without the close marker
        self.last_step: int | None = None
        # tag -> its first step in the run's files, where the detectors began watching a run
        # part-way (history()); the plateau rule counts its run length from there
        self.first_steps: dict[str, int] = {}
        self.gpu_low: dict[tuple[Any, ...], float] = {}  # (host, rank, gpu) -> wall low since
        self.gpu_full: dict[tuple[Any, ...], float] = {}


@dataclass(frozen=True)
class AlertStatistics:
    """A point-in-time view of the engine (``/api/stats`` shows it under ``alerts``).

    Attributes:
        observed: batches the detectors looked at (counted once their round is done).
        dropped: batches whose points the detectors skipped because their queue was full
            (what such a batch says of its run is still read: its arrival, its tags' last
            steps, a status change).
        dropped_points: the scalar points of those batches.
        queue_depth, queue_peak: the queue now, and its peak.
        raised: alerts ingested into runs (or, for runs another process writes, kept in
            memory and pushed live).
        suppressed: alerts held back by the per-rule cooldown or the per-run rate limit.
        failed: alerts that could not be ingested (the run refused them).
        runs: runs with detector state.
        cpu_seconds: CPU time the detectors took, all rounds together.
    """

    observed: int
    dropped: int
    queue_depth: int
    queue_peak: int
    raised: int
    suppressed: int
    failed: int
    runs: int
    cpu_seconds: float
    dropped_points: int = 0


# -- the engine --------------------------------------------------------------------------------


#: A tag's columns to judge as one in a round, their points, and their values arrays when
#: read already (:meth:`AlertEngine._groups`).
_Group = tuple[Sequence[ScalarColumns], int, list[np.ndarray] | None]


class _Pending:
    """What a run's batches queued since the last round hold: each batch's scalar columns as
    ingest gave them (grouped per tag only by the round, in C where every batch has the same
    tags in the same order: :meth:`AlertEngine._groups`), the newest column of each tag whose
    points were dropped (only its last step is read), the events in order, whether any batch
    held training data, and the newest batch's arrival (monotonic); of the status changes of
    dropped batches past :data:`KEPT_STATUS`, the newest (read after the events)."""

    __slots__ = ("arrived", "batches", "data", "events", "kept", "status", "unwatched")

    def __init__(self) -> None:
        self.batches: list[list[ScalarColumns]] = []  # each batch's columns, in arrival order
        self.unwatched: dict[str, ScalarColumns] = {}
        self.events: list[dict[str, Any]] = []
        self.data = False
        self.arrived = 0.0
        self.kept = 0  # status changes of dropped batches in events
        self.status: dict[str, Any] | None = None


class _Parts:
    """The steps or walls of a tag's columns joined for a round, left in their columns: the
    detectors read the newest (every round) and, when they raise an alert, the offending
    point's, so copying them all would cost more than the detectors' own passes."""

    __slots__ = ("ends", "field", "group", "size")

    def __init__(self, group: Sequence[ScalarColumns], field: str, size: int) -> None:
        self.group = group
        self.field = field  # "steps" or "walls"
        self.size = size  # the group's points, which _joined knows already
        self.ends: list[int] | None = None  # points up to the end of each column, when needed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: Any) -> Any:
        field = self.field
        if isinstance(key, np.ndarray):  # a mask (only for columns with NaN or Inf)
            return np.concatenate([getattr(c, field) for c in self.group])[key]
        i = int(key)
        if i == -1:
            last = getattr(self.group[-1], field)
            if len(last):  # (the group's last column may be empty: _groups keeps those)
                return last[-1]
        ends = self.ends
        if ends is None:
            ends = self.ends = list(itertools.accumulate(len(c.values) for c in self.group))
        if i < 0:
            i += ends[-1]
        if not 0 <= i < ends[-1]:
            raise IndexError(f"index {key} is out of range for {ends[-1]} points")
        j = bisect.bisect_right(ends, i)
        return getattr(self.group[j], field)[i - (ends[j - 1] if j else 0)]


def _joined(
    group: Sequence[ScalarColumns],
    size: int,
    scratch: np.ndarray,
    values: list[np.ndarray] | None = None,
) -> ScalarColumns:
    """One column from the columns of one tag in ``group`` (``size`` points in all; ``values``:
    their values arrays, when the caller has them): their values copied into the start of
    ``scratch`` (which must hold them all; the column is valid until it is reused), or for
    :data:`JOIN_BYTES_COLUMNS` columns or more of contiguous float64, into a fresh array; their
    steps and walls left in their columns."""
    if len(group) == 1:
        return group[0]
    if values is None:
        values = [c.values for c in group]
    out = None
    n = len(values)
    if n >= JOIN_BYTES_COLUMNS and operator.countOf(map(_DTYPE, values), _FLOAT64) == n:
        try:
            out = np.frombuffer(b"".join(values), np.float64)
        except TypeError:  # a column not contiguous (no plain buffer)
            out = None
    if out is None:
        out = scratch[:size]
        np.concatenate(values, out=out)
    return ScalarColumns(
        group[0].tag,
        _Parts(group, "steps", size),  # type: ignore[arg-type]
        _Parts(group, "walls", size),  # type: ignore[arg-type]
        out,
    )


class AlertEngine:
    """Runs the detectors of docs/alerts.md over every batch a broker ingests.

    Args:
        rules: detector parameters (the defaults when None).
        queue_size: batches waiting for the detectors at most (and :data:`QUEUE_POINTS` scalar
            points); more are dropped and counted.
        notify: called with ``(run, alert event)`` for every alert ingested, training code's
            own included (the webhooks, :class:`vdl_stream.webhooks.WebhookNotifier`). It must
            not block.
        clock: the monotonic clock for the time-based rules (tests may pass their own).

    Raises:
        ValueError: ``queue_size`` is not a positive int.
    """

    # Past the 30 keys an instance dict shares with its class, every attribute read on the
    # ingest path (observe) went through a hashed lookup; slots make each a fixed offset
    # (docs/performance.md, "(2026-12-01, h4-alerts)"). Nothing sets other attributes on an
    # engine (tests/test_alerts.py::test_an_engine_takes_no_attribute_it_does_not_declare).
    __slots__ = (
        "_broker",
        "_busy",
        "_clock",
        "_depth",
        "_drop_warned",
        "_dropped",
        "_dropped_points",
        "_failed",
        "_held",
        "_hurry",
        "_hurry_depth",
        "_hurry_points",
        "_kept",
        "_limiter",
        "_lock",
        "_notify",
        "_observed",
        "_out",
        "_out_ready",
        "_peak",
        "_pending",
        "_plans",
        "_points",
        "_queue_size",
        "_queued",
        "_raised",
        "_runs",
        "_scratch",
        "_seq",
        "_suppressed",
        "_watched",
        "rules",
    )

    def __init__(
        self,
        rules: Rules | None = None,
        *,
        queue_size: int = QUEUE_BATCHES,
        notify: Callable[[str, dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if type(queue_size) is not int or queue_size < 1:
            raise ValueError(f"queue_size must be a positive int, got {queue_size!r}")
        self.rules = rules or Rules()
        # Queued batches, grouped per run and tag as they arrive (a plain dict and a wake-up
        # event rather than a trio memory channel: observe() runs on the ingest path for every
        # batch, and a channel's send cost about as much per small batch as the detectors
        # themselves); the detector task takes it all at once (docs/performance.md, "Alerts:
        # detector cost"). Bounded by queue_size batches and QUEUE_POINTS points in observe().
        self._pending: dict[str, _Pending] = {}
        self._queue_size = queue_size
        self._queued = trio.Event()  # set when a batch enters an empty queue
        # set when the queue passes HURRY_SHARE of a bound: the next round starts at once
        self._hurry = trio.Event()
        self._hurry_depth = max(1, int(queue_size * HURRY_SHARE))
        self._hurry_points = int(QUEUE_POINTS * HURRY_SHARE)
        # tag -> whether any tag detector applies to it (the rules' globs matched once per tag,
        # not per column): columns of a tag none watches are not queued.
        self._watched: dict[str, bool] = {}
        self._notify = notify
        self._clock = clock
        self._runs: OrderedDict[str, _RunState] = OrderedDict()
        self._out: deque[tuple[str, dict[str, Any]]] = deque(maxlen=4096)
        self._out_ready = trio.Event()
        self._seq = 0
        self._observed = self._dropped = self._peak = self._depth = self._points = 0
        self._dropped_points = 0
        self._drop_warned: float | None = None  # the clock at the last warning of drops
        self._kept = 0  # status events of dropped batches queued since the last round
        self._raised = self._suppressed = self._failed = 0
        self._busy = 0.0  # CPU seconds the detectors took (their thread's time)
        # Detector rounds run in a worker thread; the lock keeps the time-based checks (event
        # loop) off the state while one runs.
        self._lock = trio.Lock()
        self._limiter = trio.CapacityLimiter(1)
        self._broker: Any = None
        # Alerts of followed runs, which cannot be recorded in the run (docs/alerts.md,
        # "Runs written by another process"): bounded per run and in runs.
        self._held: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        # (points, alpha) -> the constants of one smoothing pass (see _plan); detector thread.
        self._plans: dict[tuple[int, float], tuple[Any, ...]] = {}
        # The values of a tag's columns joined for a round (one round at a time): one buffer reused
        # rather than a fresh array of up to 512 KiB per tag and round (allocating it cost more than
        # the copy, docs/performance.md).
        self._scratch = np.empty(JOIN_POINTS, np.float64)

    # -- the ingest side (event loop, never blocks) ------------------------------------------

    def observe(
        self,
        run: str,
        scalars: list[ScalarColumns],
        events: list[dict[str, Any]],
        *,
        followed: bool = False,
        points: int | None = None,
    ) -> None:
        """Queue an ingested batch for the detectors; drop it (counted) when the queue is full.

        Alert events in it (from ``Writer.alert``) go straight to ``notify``. ``followed``: the
        batch was read from a run another process writes; of the alerts recorded in it only
        training code's own (rule ``"user"``) are notified, since alerts raised by the writing
        process's own detectors are that process's to post. ``points``: the batch's points
        (at least those of ``scalars``) when the caller counted them already, for the queue's
        bound (counting them again cost a batch of four small columns a quarter of this call).
        """
        if events and self._notify is not None:
            for event in events:
                if event.get("kind") == "alert" and (
                    not followed or event.get("rule", USER_RULE) == USER_RULE
                ):
                    self._notify(run, event)
        if points is None:
            points = sum(map(len, map(_VALUES, scalars)))  # in C: no Python loop per column
        depth = self._depth
        entry = self._pending.get(run)
        if entry is None:
            entry = self._pending[run] = _Pending()
        if depth >= self._queue_size or self._points + points > QUEUE_POINTS:
            self._drop(run, entry, scalars, events, points)
            return
        # The batch as it came: grouping its columns per tag here cost the ingest path a
        # Python loop per column (4 to 5 µs a batch of four small columns, more than the
        # round's judging of them); the round groups a run's batches at once, in C
        # (docs/performance.md, "(2026-12-01, h3-alerts)").
        if scalars:
            entry.batches.append(scalars)
            entry.data = True
        if events:
            self._add_events(entry, events)
        entry.arrived = self._clock()
        if not depth:
            self._queued.set()
        self._points = queued = self._points + points
        self._depth = depth = depth + 1  # (its peak is taken by _take and statistics)
        if depth >= self._hurry_depth or queued >= self._hurry_points:
            self._hurry.set()

    def _drop(
        self,
        run: str,
        entry: _Pending,
        scalars: list[ScalarColumns],
        events: list[dict[str, Any]],
        points: int,
    ) -> None:
        """The queue is full: the batch's points and events are not judged (counted, and
        logged at most every :data:`DROP_WARN_INTERVAL` seconds), but what it says of its run
        is kept, so that a dropped batch cannot raise an alert later: that data arrived (no
        stall), its tags' last steps, and a change of the run's status (a dropped close would
        read as a stall)."""
        self._dropped += 1
        self._dropped_points += points
        now = self._clock()
        if self._drop_warned is None or now - self._drop_warned >= DROP_WARN_INTERVAL:
            self._drop_warned = now
            log.warning(
                "the alert detectors fell behind: %d batches (%d scalar points) not judged so "
                "far (their queue holds at most %d batches and %d points)",
                self._dropped,
                self._dropped_points,
                self._queue_size,
                QUEUE_POINTS,
            )
        self._queued.set()
        self._hurry.set()
        unwatched = entry.unwatched
        for cols in scalars:
            if len(cols.values):
                # Only its last step is read (_judge): a copy of that one point, so the dropped
                # column, uncounted in the queue's bounds, is not kept alive until the round.
                unwatched[cols.tag] = ScalarColumns(
                    cols.tag,
                    cols.steps[-1:].copy(),
                    cols.walls[-1:].copy(),
                    cols.values[-1:].copy(),
                )
        data = bool(scalars)
        for event in events:
            kind = event.get("kind")
            if kind == "meta":
                if "status" in event:
                    # Per run, bounded in all: a noisy run's status changes cannot push out
                    # another run's close (one cap for all runs did).
                    status = {"kind": "meta", "status": event["status"]}
                    if entry.kept < KEPT_STATUS - 1 and self._kept < self._queue_size:
                        entry.kept += 1
                        self._kept += 1
                        entry.events.append(status)
                    else:
                        entry.status = status
            elif kind not in _NOT_DATA:
                data = True
        if data:
            entry.data = True
            entry.arrived = now

    def _add_events(self, entry: _Pending, events: list[dict[str, Any]]) -> None:
        """Queue a batch's events in a run's pending ``entry``, after a dropped batch's status
        change still held back."""
        if entry.status is not None:  # a dropped batch's status, before this batch's
            entry.events.append(entry.status)
            entry.status = None
        entry.events.extend(events)

    def _groups(self, entry: _Pending) -> list[_Group]:
        """The watched tags' columns of a run's queued batches, per tag in arrival order, in
        groups of up to :data:`JOIN_POINTS` points (a longer column alone) with their points;
        the newest column of each tag no detector watches goes to ``entry.unwatched`` (only
        its last step is read).

        When the batches' columns repeat the first batch's tags in the same order (a writer's
        batches usually do), every column's tag and values are read in one pass each, in C,
        and each tag's columns and values are every k-th of them (a slice: no column read);
        only a tag whose columns pass :data:`JOIN_POINTS` together takes the loop per column
        that the others need.
        """
        batches = entry.batches
        if not batches:
            return []
        first = batches[0]
        tags = tuple(map(_TAG, first))
        stride = len(tags)
        if len(set(tags)) != stride:  # a tag twice in a batch
            return self._groups_by_column(entry)
        if len(batches) == 1:
            flat = first
        else:
            # One list of every column, their tags checked against the first batch's repeated
            # (so that every stride-th column holds one tag, in arrival order, whatever the
            # batches' boundaries), their values read in one pass for all tags. (About as many
            # instructions as a pass per tag: what a round's column reads cost is per item, in
            # the caches or not; docs/performance.md, "(2026-12-01, h6-alerts)".)
            flat = list(itertools.chain.from_iterable(batches))
            if len(flat) % stride or list(map(_TAG, flat)) != [*tags] * (len(flat) // stride):
                return self._groups_by_column(entry)
        every = list(map(_VALUES, flat))
        watched = self._watched
        groups: list[_Group] = []
        for index, tag in enumerate(tags):
            flag = watched.get(tag)
            if flag is None:
                flag = self._watch(tag)
            cols = flat[index::stride]
            if not flag:
                for c in reversed(cols):
                    if len(c.values):
                        entry.unwatched[tag] = c
                        break
                continue
            values = every[index::stride]
            size = sum(map(len, values))
            if size <= JOIN_POINTS:
                if size:  # (empty columns among others are harmless: _Parts, _joined)
                    groups.append((cols, size, values))
            else:
                self._cut(cols, list(map(len, values)), groups)
        return groups

    def _groups_by_column(self, entry: _Pending) -> list[_Group]:
        """:meth:`_groups` for batches whose tags differ: a loop per column."""
        tags: dict[str, tuple[list[ScalarColumns], list[int]]] = {}
        watched = self._watched
        for scalars in entry.batches:
            for cols in scalars:
                tag = cols.tag
                slot = tags.get(tag)
                if slot is None:
                    flag = watched.get(tag)
                    if flag is None:
                        flag = self._watch(tag)
                    if not flag:
                        if len(cols.values):
                            entry.unwatched[tag] = cols
                        continue
                    slot = tags[tag] = ([], [])
                slot[0].append(cols)
                slot[1].append(len(cols.values))
        groups: list[_Group] = []
        for cols, sizes in tags.values():
            self._cut(cols, sizes, groups)
        return groups

    @staticmethod
    def _cut(
        cols: Iterable[ScalarColumns],
        sizes: list[int],
        groups: list[_Group],
    ) -> None:
        """Append the non-empty ``cols`` (``sizes``: their points) to ``groups`` in groups of
        up to :data:`JOIN_POINTS` points, in order (a longer column alone)."""
        group: list[ScalarColumns] = []
        size = 0
        for c, n in zip(cols, sizes, strict=True):
            if not n:
                continue
            if group and size + n > JOIN_POINTS:
                groups.append((group, size, None))
                group, size = [], 0
            group.append(c)
            size += n
        if group:
            groups.append((group, size, None))

    def _watch(self, tag: str) -> bool:
        """Whether any tag detector applies to ``tag`` (remembered, for a bounded number of
        tags: past that the memory starts over)."""
        if len(self._watched) >= WATCHED_TAGS:
            self._watched.clear()
        watched = self._watched[tag] = any(
            self.rules.for_tag(name, tag) is not None for name in TAG_DETECTORS
        )
        return watched

    def history(self, run: str, first_steps: Mapping[str, int]) -> None:
        """Tell the detectors where each scalar tag of ``run`` began in its files, before they
        began watching it: a server started next to a running job follows the run from its
        current end. The plateau rule then counts its ``patience_fraction`` from the run's own
        first step, as it does for a run watched from its start, not from the first step the
        server saw (which made a long run's slow final phase read as a plateau). Call it before
        the run's first batch is observed."""
        self._state(run).first_steps = dict(first_steps)

    def shared_series(self, run: str, series: str, step: int | None, message: str) -> None:
        """Two writers log ``series`` of ``run`` at once (the broker saw them take turns on it,
        :meth:`Broker._check_shared`): raise the ``writers`` alert at ``step``, once per series
        while the engine remembers the run."""
        params = self.rules.params("writers")
        if params["enabled"]:
            state = self._state(run)
            self._fire(
                run, state, "writers", series, params, step, time.time(), None, message, hold=True
            )

    def writer_lost(self, runs: Iterable[str]) -> None:
        """A writer's connection of each of ``runs`` ended; one that was not closed and hears
        nothing within the crash rule's ``grace`` seconds is reported as crashed."""
        now = self._clock()
        for name in runs:
            state = self._runs.get(name)
            if state is not None and not state.closed:
                state.lost_at = now

    # -- the engine's task ---------------------------------------------------------------------

    async def run(
        self, broker: Any, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Watch ``broker`` until it is closed (or this is cancelled): attach to it, run the
        detectors, ingest the alerts.

        Alerts are ingested with :meth:`Broker.ingest` from the writer :data:`ALERTS_WRITER`; a
        refusal (a full disk, say) is counted and logged once, never raised.
        """
        self._broker = broker
        broker.alerts = self
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._detect)
                nursery.start_soon(self._tick)
                nursery.start_soon(self._emit)
                task_status.started()
                # Ends with the broker, so that a server shutting down is not held open.
                await broker.wait_closed()
                nursery.cancel_scope.cancel()
        finally:
            broker.alerts = None

    async def _detect(self) -> None:
        last = -math.inf
        interval = DETECT_INTERVAL
        while True:
            if not self._depth and not self._pending:  # (a dropped batch leaves no depth)
                self._queued = trio.Event()
                await self._queued.wait()
            # Run at most every DETECT_INTERVAL, on everything queued meanwhile: the cost per
            # run and tag is paid once per round, not once per batch, so a fast writer's many
            # small batches cost about what one large one does (and ingest keeps its pace).
            wait = last + interval - trio.current_time()
            if wait > 0:
                # ... unless the queue nears a bound: then at once, so that a fast writer's
                # batches are judged rather than dropped.
                with trio.move_on_after(wait):
                    await self._hurry.wait()
            pending, taken = self._take()
            last = trio.current_time()
            # On the event loop, in slices: a round is mostly short Python and NumPy calls that
            # hold the GIL, so a worker thread ran no faster and made the server pay about its
            # cost again in GIL hand-offs with the loop (docs/performance.md, "Issue 14: alerts
            # cost (this session)"); slices of DETECT_SLICE keep the loop's other tasks (the
            # persist task hands the recorder its next flush from there) waiting 2 ms at most.
            busy = self._busy
            async with self._lock:
                if DETECT_ON_LOOP:
                    await self._round_on_loop(pending)
                else:
                    await trio.to_thread.run_sync(self._round, pending, limiter=self._limiter)
            self._observed += taken  # counted once judged (AlertStatistics.observed)
            # Most of a round's cost is per tag, not per point: a run with many tags pays it
            # less often (more points a round), up to the latency bound.
            interval = min(
                DETECT_MAX_INTERVAL, max(DETECT_INTERVAL, (self._busy - busy) / DETECT_SHARE)
            )
            if self._out:
                self._out_ready.set()

    def _take(self) -> tuple[dict[str, _Pending], int]:
        """Take everything queued for a round, and how many batches it holds."""
        pending, self._pending = self._pending, {}
        taken = self._depth
        if taken > self._peak:  # the depth only grows between two rounds
            self._peak = taken
        self._depth = self._points = self._kept = 0
        if self._hurry.is_set():
            self._hurry = trio.Event()
        return pending, taken

    async def _round_on_loop(self, pending: dict[str, _Pending]) -> None:
        """One detector round on the event loop, in slices of at most :data:`DETECT_SLICE`
        seconds with a checkpoint between them (the engine's lock held)."""
        started = time.thread_time()
        deadline = time.perf_counter() + DETECT_SLICE
        for _ in self._steps(pending):
            if time.perf_counter() >= deadline:
                self._busy += time.thread_time() - started
                await trio.lowlevel.checkpoint()
                started = time.thread_time()
                deadline = time.perf_counter() + DETECT_SLICE
        self._busy += time.thread_time() - started

    def _round(self, pending: dict[str, _Pending]) -> None:
        """One detector round over queued batches (worker thread; the engine's lock held)."""
        started = time.thread_time()
        for _ in self._steps(pending):
            pass
        self._busy += time.thread_time() - started

    async def _tick(self) -> None:
        while True:
            await trio.sleep(TICK)
            async with self._lock:  # not while a round runs in its thread
                self.check_time(self._clock())
            if self._out:
                self._out_ready.set()

    async def _emit(self) -> None:
        warned = False
        followed = getattr(self._broker, "followed", None)  # a replay source has none
        while True:
            if not self._out:
                self._out_ready = trio.Event()
                await self._out_ready.wait()
            by_run: dict[str, list[dict[str, Any]]] = {}
            while self._out:
                run, event = self._out.popleft()
                by_run.setdefault(run, []).append(event)
            for run, events in by_run.items():
                if followed is not None and followed(run):
                    # Another process writes the run and holds its lock: the alerts are kept
                    # in memory (GET /api/alerts, snapshots) and pushed live, not recorded.
                    await self._broker.publish_alerts(run, events)
                    self._raised += len(events)
                    if self._notify is not None:
                        for event in events:
                            self._notify(run, event)
                    continue
                # Writer seqs must keep rising across broker restarts (the broker dedups by
                # them, and remembers the last one on disk): microseconds since the epoch.
                self._seq = max(self._seq + 1, time.time_ns() // 1000)
                batch = Batch(ALERTS_WRITER, self._seq, run, [], events)
                try:
                    await self._broker.ingest(batch)
                except trio.ClosedResourceError:
                    return
                except Exception as exc:  # RefusedError and the like: counted, logged once
                    self._failed += len(events)
                    if not warned:
                        warned = True
                        log.warning("cannot record alerts of run %r: %s", run, exc)
                    continue
                self._raised += len(events)
                if self._notify is not None:
                    for event in events:
                        self._notify(run, event)

    # -- detectors (pure: no I/O, callable from tests) ---------------------------------------------

    def _state(self, run: str) -> _RunState:
        state = self._runs.get(run)
        if state is None:
            state = self._runs[run] = _RunState()
            while len(self._runs) > MAX_RUNS:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run)
        return state

    def process(
        self, run: str, scalars: list[ScalarColumns], events: list[dict[str, Any]], now: float
    ) -> None:
        """Run the per-batch detectors on one batch of ``run`` that arrived at ``now`` (the
        engine's monotonic clock, taken by :meth:`observe`), as a round that holds it alone.

        Raises:
            Exception: a detector's bug (a round logs it and carries on with the next run).
        """
        entry = _Pending()
        if scalars:
            entry.batches.append(scalars)
            entry.data = True
        if events:
            self._add_events(entry, events)
        entry.arrived = now
        for _ in self._judge(run, entry):
            pass

    def _steps(self, pending: dict[str, _Pending]) -> Iterator[None]:
        """One round over queued batches, yielding after each group of columns (so that a
        round on the event loop can be cut in slices)."""
        for run, entry in pending.items():
            try:
                yield from self._judge(run, entry)
            except Exception:  # a detector bug must never stop the others
                log.exception("alert detectors failed on a batch of run %r", run)

    def _judge(self, run: str, entry: _Pending) -> Iterator[None]:
        """Run the detectors on what ``run``'s pending ``entry`` holds: its events, then each
        watched tag's groups of columns in order (each judged as one column), yielding after
        each group."""
        events = entry.events if entry.status is None else [*entry.events, entry.status]
        state = self._begin(run, events, entry.arrived, entry.data)
        groups = self._groups(entry)
        for cols in entry.unwatched.values():
            last = int(cols.steps[-1])
            if state.last_step is None or last > state.last_step:
                state.last_step = last
        scratch = self._scratch
        for group, size, values in groups:
            self._scalars(
                run,
                state,
                group[0] if len(group) == 1 else _joined(group, size, scratch, values),
            )
            yield

    def _begin(self, run: str, events: list[dict[str, Any]], now: float, data: bool) -> _RunState:
        """The run's state, updated with a batch's events and arrival (``data``: it has
        scalars)."""
        state = self._state(run)
        for event in events:
            kind = event.get("kind")
            if kind == "meta" and "status" in event:
                state.closed = event["status"] == "closed"
                if state.closed:
                    state.lost_at = None
            elif kind == "telemetry":
                self._telemetry(run, state, event)
            elif kind not in _NOT_DATA:
                data = True
                if kind == "histogram" and event.get("tag") is not None:
                    self._histogram(run, state, event)
        if data:
            if state.last_data is not None:
                state.intervals.append(now - state.last_data)
            state.last_data = now
            # Batches queued before the connection was lost do not bring the writer back.
            if state.lost_at is not None and now > state.lost_at:
                state.lost_at = None
            state.active.discard(("stall", None))
            state.active.discard(("crash", None))
        return state

    def _tag(self, state: _RunState, tag: str) -> _TagState | None:
        ts = state.tags.get(tag)
        if ts is None:
            if len(state.tags) >= MAX_TAGS:
                return None
            ts = state.tags[tag] = _TagState(self.rules, tag)
        return ts

    def _scalars(self, run: str, state: _RunState, cols: ScalarColumns) -> None:
        ts = self._tag(state, cols.tag)
        if ts is None:
            return
        steps, values = cols.steps, cols.values
        last = int(steps[-1])
        if state.last_step is None or last > state.last_step:
            state.last_step = last
        # The extremes decide for the whole column: NaN propagates into both and an Inf is one
        # of them, so finite extremes mean finite values (and the spike rule needs them anyway).
        lo = float(np.minimum.reduce(values))
        hi = float(np.maximum.reduce(values))
        all_finite = math.isfinite(lo) and math.isfinite(hi)
        finite = None
        if not all_finite:
            finite = np.isfinite(values)
            all_finite = bool(finite.all())
        nan = ts.nan
        if nan is not None:
            if not all_finite:
                i = int(np.argmin(finite))
                v = float(values[i])
                self._fire(
                    run, state, "nan", cols.tag, nan, int(steps[i]), float(cols.walls[i]), v,
                    f"{cols.tag} is {v} at step {int(steps[i])}",
                    hold=True,
                )  # fmt: skip
            elif state.active and ("nan", cols.tag) in state.active:
                state.active.discard(("nan", cols.tag))
        if not all_finite:
            steps, walls, values = steps[finite], cols.walls[finite], values[finite]
            if not len(values):
                return
            lo, hi = float(values.min()), float(values.max())
            last = int(steps[-1])
        else:
            walls = cols.walls
        ts.seen += len(values)
        for alpha, e in ts.emas.items():  # each weight once, however many rules use it
            self._ema(e, values, alpha)
        if ts.spike is not None:
            self._spike(run, state, ts, cols.tag, ts.spike, steps, walls, values, lo, hi)
        if ts.divergence is not None:
            self._divergence(run, state, ts, cols.tag, ts.divergence, last, walls, values)
        if ts.plateau_params is not None:
            self._plateau(run, state, ts, cols.tag, ts.plateau_params, last, steps, walls, values)

    def _spike(
        self,
        run: str,
        state: _RunState,
        ts: _TagState,
        tag: str,
        p: dict[str, Any],
        steps: np.ndarray,
        walls: np.ndarray,
        values: np.ndarray,
        lo: float,
        hi: float,
    ) -> None:
        """``lo`` and ``hi``: the least and the greatest of ``values``."""
        if ts.window is None:
            ts.window = _Rolling(int(p["window"]))
        window = ts.window
        first = 0  # the points before this one only fill the window (as one by one they would)
        need = int(p["min_points"]) - window.n
        if 0 < need < len(values):
            window.extend(values[:need])
            first, values = need, values[need:]
            lo, hi = float(values.min()), float(values.max())
        if window.n >= p["min_points"]:
            full = window.n == len(window.buf)
            bounds = ts.bounds
            if full and bounds is not None and window.pushed - bounds[0] <= bounds[1]:
                # The window moved by at most bounds[1] values since its median and MAD were
                # last computed: with the bounds that hold for any such window, a column whose
                # extremes stay within reach of every possible median cannot hold a spike
                # (exact: a possible one is judged on the true median and MAD below).
                _, _, med_low, med_high, mad_low = bounds
                reach = p["threshold"] * 1.4826 * mad_low
                if mad_low > 0 and hi - med_low <= reach and med_high - lo <= reach:
                    window.extend(values)
                    return
            w = window.values()
            z = None
            moves = max(1, int(len(w) * SPIKE_MOVES))
            if full and len(values) < moves:
                med, mad, med_low, med_high, mad_low = _centre_bounds(w, moves)
                ts.bounds = (window.pushed, moves, med_low, med_high, mad_low)
            else:
                # A tag that gets this many points a round moves its window past the bounds
                # by the next one: they would cost more than they save.
                med, mad = _median_mad(w)
                ts.bounds = None
            # Only the extremes can be spikes: two passes decide for the whole column.
            if mad > 0:
                reach = p["threshold"] * 1.4826 * mad
                if hi - med > reach or med - lo > reach:
                    z = np.abs(values - med) / (1.4826 * mad)
            if z is not None:
                # A series positive throughout (a loss, a norm, a time) must also stand out on a
                # log scale: its noise is multiplicative (near convergence a hard mini-batch has
                # ten times the median loss, tens of MADs away), a fault is orders of magnitude.
                if w.min() > 0 and lo > 0:
                    log_z = _robust_z(np.log(w), np.log(values))
                    if log_z is None:
                        log_z = z
                    z = np.where(log_z > p["log_threshold"], z, 0.0)
                i = int(np.argmax(z))
                if z[i] > p["threshold"]:
                    v = float(values[i])
                    step = int(steps[first + i])
                    self._fire(
                        run, state, "spike", tag, p, step, float(walls[first + i]), v,
                        f"{tag} = {v:.6g} at step {step}, {float(z[i]):.0f} robust "
                        f"deviations from the median {med:.6g} of the last {window.n} points",
                    )  # fmt: skip
        window.extend(values)

    def _ema(self, s: _Smoothed, values: np.ndarray, alpha: float) -> None:
        n = len(values)
        if n <= SMALL_EMA_POINTS:
            # A few points: plain floats cost less than setting up the NumPy pass below.
            ema = s.ema
            for x in values.tolist():
                new = x if ema is None else ema + alpha * (x - ema)
                if ema is not None:
                    s.rising = s.rising + 1 if new > ema else 0
                ema = new
            s.ema = ema
            s.n += n
            return
        starts, counts, weights = self._plan(n, alpha)
        g = len(weights)
        x = np.empty(g + 1)
        if starts is None:
            x[:g] = values
        else:
            # Fold a long column in groups: each group mean is one update of an EMA whose
            # weight covers the group, so the cost per batch stays bounded.
            np.add.reduceat(values, starts, out=x[:g])
        first = s.ema is None
        prev = float(x[0]) / counts[0] if first else s.ema
        x[g] = prev
        # Every update of the sequential EMA at once (see _plan), then plain floats: a few
        # dozen at most, and rising is usually decided by the last few. At most 32 x 33 values
        # (MAX_SMOOTH_POINTS): far under the size at which OpenBLAS hands a product to its
        # threads (its worker took no CPU over 200,000 of these, docs/performance.md, "Alerts:
        # the large-batch path"), so it stays a plain product here.
        emas = (weights @ x).tolist()
        if first:
            emas[0] = prev  # a first EMA starts at its first value, which is not a rise
        # Rising counts the points since the last update that did not rise: a group's update
        # stands for all its points (the rule's rising_points is in points, however the
        # writer batched them).
        rises = 0
        j = g - 1
        while j > 0 and emas[j] > emas[j - 1]:
            rises += counts[j]
            j -= 1
        if j > 0:
            s.rising = rises
        elif first:
            s.rising += rises
        elif emas[0] > prev:
            s.rising += rises + counts[0]
        else:
            s.rising = rises
        s.ema = emas[-1]
        s.n += n

    def _plan(self, n: int, alpha: float) -> tuple[np.ndarray | None, list[int], np.ndarray]:
        """The constants of smoothing ``n`` points with weight ``alpha`` in one pass (cached:
        writers flush columns of a few sizes): the groups' starts (None: a point a group), the
        points in each group, and the matrix that maps the groups' sums and the EMA before the
        column to the EMA after each group.

        The EMA after group j is ``carry_j * prev + sum_i w_ji * sum_i / count_i``: group i's
        mean enters with its group's weight ``1 - keep**count_i`` (``keep = 1 - alpha``), then
        decays by ``keep`` a point up to the end of group j; ``carry_j = keep**end_j``."""
        key = (n, alpha)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        g = min(n, MAX_SMOOTH_POINTS)
        starts = (np.arange(g) * n) // g
        counts = np.diff(np.append(starts, n))
        ends = np.cumsum(counts)  # points up to the end of each group
        keep = 1.0 - alpha
        gap = ends[:, None] - ends[None, :]  # exponents >= 0 only: no overflow, underflow is 0
        decay = np.where(gap >= 0, keep ** np.maximum(gap, 0), 0.0)
        weights = np.empty((g, g + 1))
        weights[:, :g] = decay * ((1.0 - keep**counts) / counts)
        weights[:, g] = keep**ends
        plan = (starts if g < n else None, counts.tolist(), weights)
        if len(self._plans) >= PLANS:
            self._plans.pop(next(iter(self._plans)))
        self._plans[key] = plan
        return plan

    def _divergence(
        self,
        run: str,
        state: _RunState,
        ts: _TagState,
        tag: str,
        p: dict[str, Any],
        step: int,
        walls: np.ndarray,
        values: np.ndarray,
    ) -> None:
        """``step``: the column's last (finite) point's step."""
        e = ts.emas[p["alpha"]]
        s = ts.smooth
        if s is None:
            s = ts.smooth = _Smoothed()
        if e.n < p["min_points"] or e.ema is None:
            return
        s.ema = e.ema
        if s.first is None:
            s.first = s.best = s.ema
        s.best = min(s.best, s.ema)
        if ts.spike is None:  # the noise floor below needs the tag's recent values
            if ts.window is None:
                ts.window = _Rolling(NOISE_WINDOW)
            ts.window.extend(values)
        scale = max(abs(s.best), 0.1 * abs(s.first), 1e-12)
        rise = s.ema - s.best
        # The rise, in units of the scale, past which it fires: by the factor, or by a fifth
        # once it has risen for long enough.
        fires_at = p["factor"] - 1
        if e.rising >= p["rising_points"]:
            fires_at = min(fires_at, 0.2)
        if rise > fires_at * scale and ts.window is not None and ts.window.n >= p["min_points"]:
            # The level alone is no scale for a loss near zero or below it, and the first value
            # is the run's start only when the server saw the start: one started next to a
            # converged run takes its noise for a rise. So the rise must also stand out of the
            # tag's noise (1.4826 MAD of its last points: a robust standard deviation). A
            # smoothed value's own noise is a sixth of it (alpha 0.05), so this takes nothing
            # from a real divergence, which rises by orders of magnitude. Computed only here:
            # a tag that is not rising by its level pays nothing for it.
            scale = max(scale, 1.4826 * _median_mad(ts.window.values())[1])
        by_factor = rise > (p["factor"] - 1) * scale
        rising = e.rising >= p["rising_points"] and rise > 0.2 * scale
        key = ("divergence", tag)
        if by_factor or rising:
            why = (
                f"{(s.ema - s.best) / scale + 1:.1f}x its best"
                if by_factor
                else f"rising for {e.rising} points"
            )
            self._fire(
                run, state, "divergence", tag, p, step, float(walls[-1]), float(values[-1]),
                f"{tag} is diverging: smoothed {s.ema:.6g}, {why} (best {s.best:.6g}) "
                f"at step {step}",
                hold=True,
            )  # fmt: skip
        elif key in state.active and rise < 0.5 * (p["factor"] - 1) * scale:
            state.active.discard(key)

    def _plateau(
        self,
        run: str,
        state: _RunState,
        ts: _TagState,
        tag: str,
        p: dict[str, Any],
        step: int,
        steps: np.ndarray,
        walls: np.ndarray,
        values: np.ndarray,
    ) -> None:
        """``step``: the column's last (finite) point's step."""
        e = ts.emas[p["alpha"]]
        s = ts.plateau
        if s is None:
            s = ts.plateau = _Smoothed()
            mode = p["mode"]
            if mode == "max" or (
                mode == "auto" and any(fnmatch.fnmatchcase(tag, g) for g in HIGHER_IS_BETTER)
            ):
                ts.sign = -1.0  # minimise the negated metric
        sign = ts.sign
        v = sign * e.ema
        if s.first is None:
            seen = int(steps[0])
            s.first, s.best, s.best_step = v, v, seen
            s.first_step = min(seen, state.first_steps.get(tag, seen))
        if v < s.best - p["min_delta"] * abs(s.best):
            s.best, s.best_step = v, step
            state.active.discard(("plateau", tag))
            return
        patience = max(p["patience"], p["patience_fraction"] * (step - s.first_step))
        if step - s.best_step >= patience:
            self._fire(
                run, state, "plateau", tag, p, step, float(walls[-1]), float(values[-1]),
                f"{tag} has not improved by {p['min_delta']:.0%} for {step - s.best_step} "
                f"steps (best smoothed {sign * s.best:.6g} at step {s.best_step})",
                hold=True,
            )  # fmt: skip

    def _histogram(self, run: str, state: _RunState, event: dict[str, Any]) -> None:
        tag = event["tag"]
        ts = self._tag(state, tag)
        if ts is None:
            return
        step = event.get("step")
        wall = float(event["wall"])
        nan = ts.nan
        bad = int(event.get("nan") or 0) + int(event.get("inf") or 0)
        if nan is not None and bad:
            self._fire(
                run, state, "nan", tag, nan, step, wall, None,
                f"{tag} holds {bad} NaN or Inf values at step {step}",
                hold=True,
            )  # fmt: skip
        p = ts.gradients
        if p is None:
            return
        try:
            # A histogram has a few dozen bins at most: plain floats cost less than NumPy here.
            edges = np.frombuffer(event["edges"], "<f8").tolist()
            counts = np.frombuffer(event["counts"], "<f8").tolist()
        except (KeyError, TypeError, ValueError):
            return
        total = sum(counts)
        sum_sq = event.get("sum_sq")
        if sum_sq is not None and math.isfinite(sum_sq):
            norm = math.sqrt(max(0.0, float(sum_sq)))
        else:  # from the bins' centres
            norm = math.sqrt(
                sum(
                    c * ((a + b) / 2) ** 2
                    for c, a, b in zip(counts, edges, edges[1:], strict=False)
                )
            )
        fired = False
        if ts.baseline is None:
            if norm > 0 and math.isfinite(norm):
                ts.norms.append(norm)
                if len(ts.norms) >= p["baseline_points"]:
                    ts.baseline = float(np.median(ts.norms))
        else:
            base = ts.baseline
            if norm > base * p["growth"]:
                fired = True
                self._fire(
                    run, state, "gradient_explode", tag, p, step, wall, norm,
                    f"{tag}: norm {norm:.3g} is {norm / base:.0e}x its early norm {base:.3g} "
                    f"at step {step}",
                    hold=True,
                )  # fmt: skip
            elif 0 < norm * p["shrink"] < base:
                fired = True
                self._fire(
                    run, state, "gradient_vanish", tag, p, step, wall, norm,
                    f"{tag}: norm {norm:.3g} fell to {norm / base:.0e}x its early norm "
                    f"{base:.3g} at step {step}",
                    hold=True,
                )  # fmt: skip
        if total > 0 and not fired:
            zero = huge = 0.0
            eps, big = p["zero_eps"], p["huge"]
            for c, a, b in zip(counts, edges, edges[1:], strict=False):
                lo, hi = (abs(a), abs(b)) if abs(a) <= abs(b) else (abs(b), abs(a))
                if hi <= eps:
                    zero += c
                elif lo >= big:
                    huge += c
            zero /= total
            huge /= total
            if huge >= p["huge_share"]:
                fired = True
                self._fire(
                    run, state, "gradient_explode", tag, p, step, wall, huge,
                    f"{tag}: {huge:.0%} of values are beyond {p['huge']:g} at step {step}",
                    hold=True,
                )  # fmt: skip
            elif zero >= p["zero_share"]:
                fired = True
                self._fire(
                    run, state, "gradient_vanish", tag, p, step, wall, zero,
                    f"{tag}: {zero:.0%} of values are within {p['zero_eps']:g} of zero at "
                    f"step {step}",
                    hold=True,
                )  # fmt: skip
        if not fired:
            state.active.discard(("gradient_explode", tag))
            state.active.discard(("gradient_vanish", tag))

    def _telemetry(self, run: str, state: _RunState, event: dict[str, Any]) -> None:
        if state.closed:
            return
        under = self.rules.params("gpu_underuse")
        memory = self.rules.params("gpu_memory")
        for wall, host, rank, gpu, util, used, total in gpu_readings(event):
            key = (host, rank, gpu)
            label = f"{gpu} on {host}" if host else gpu
            if under["enabled"]:
                if util < under["util"]:
                    since = state.gpu_low.setdefault(key, wall)
                    if wall - since >= under["seconds"]:
                        self._fire(
                            run, state, "gpu_underuse", f"{gpu}/util", under, state.last_step,
                            wall, float(util),
                            f"{label} has been {util:.0f}% busy (under {under['util']:g}%) for "
                            f"{wall - since:.0f} s; the input pipeline may be the bottleneck",
                            hold=True,
                        )  # fmt: skip
                else:
                    state.gpu_low.pop(key, None)
                    state.active.discard(("gpu_underuse", f"{gpu}/util"))
            if memory["enabled"] and used is not None and total:
                share = used / total
                if share >= memory["fraction"]:
                    since = state.gpu_full.setdefault(key, wall)
                    if wall - since >= memory["seconds"]:
                        self._fire(
                            run, state, "gpu_memory", f"{gpu}/mem_used", memory, state.last_step,
                            wall, float(share),
                            f"{label} memory is {share:.0%} full for {wall - since:.0f} s",
                            hold=True,
                        )  # fmt: skip
                else:
                    state.gpu_full.pop(key, None)
                    state.active.discard(("gpu_memory", f"{gpu}/mem_used"))

    def check_time(self, now: float) -> None:
        """Check the time-based rules (stalled and crashed runs) at monotonic time ``now``."""
        stall = self.rules.params("stall")
        crash = self.rules.params("crash")
        for run, state in self._runs.items():
            if state.closed or state.last_data is None:
                continue
            lost = state.lost_at
            if crash["enabled"] and lost is not None and now - lost >= crash["grace"]:
                state.lost_at = None
                self._fire(
                    run, state, "crash", None, crash, state.last_step, time.time(), None,
                    "the writer went away without closing the run (its connection was lost or "
                    f"its process ended), and it has not come back within {crash['grace']:g} s",
                    hold=True,
                )  # fmt: skip
                continue
            if stall["enabled"] and ("stall", None) not in state.active:
                # Plain floats: NumPy's set-up for 32 values cost about 20 µs a run and tick.
                cadence = statistics.median(state.intervals) if state.intervals else 0.0
                limit = max(stall["factor"] * cadence, stall["min_seconds"])
                idle = now - state.last_data
                if idle >= limit:
                    self._fire(
                        run, state, "stall", None, stall, state.last_step, time.time(), idle,
                        f"no new data for {idle:.0f} s (the run's cadence is {cadence:.2g} s "
                        "between batches) and it was not closed",
                        hold=True,
                    )  # fmt: skip

    # -- raising -------------------------------------------------------------------------------

    def _fire(
        self,
        run: str,
        state: _RunState,
        rule: str,
        series: str | None,
        params: dict[str, Any],
        step: int | None,
        wall: float,
        value: float | None,
        message: str,
        *,
        hold: bool = False,
    ) -> None:
        """Raise an alert unless its condition already fired (``hold``: until it clears), its
        (rule, series) is cooling down, or the run used up its alerts for this minute."""
        key = (rule, series)
        if hold and key in state.active:
            return
        if hold:
            state.active.add(key)
        limits = self.rules.params("limits")
        now = self._clock()
        last = state.last_fired.get(key)
        if last is not None and now - last < limits["cooldown"]:
            state.suppressed += 1
            self._suppressed += 1
            return
        while state.minute and now - state.minute[0] >= 60.0:
            state.minute.popleft()
        if len(state.minute) >= limits["per_minute"]:
            state.suppressed += 1
            self._suppressed += 1
            return
        state.minute.append(now)
        state.last_fired[key] = now
        title = TITLES.get(rule, rule) + (f": {series}" if series else "")
        event = alert_event(
            title,
            message[: codec.MAX_ALERT_TEXT],
            params.get("level", "warn"),
            step=step,
            wall=wall if math.isfinite(wall) else None,
            rule=rule,
            series=series,
            value=value,
        )
        self._out.append((run, event))  # the engine's tasks wake the emitter (event loop only)

    def hold(self, run: str, events: list[dict[str, Any]]) -> None:
        """Keep alerts raised on a followed ``run`` in memory (the broker calls this under the
        run's lock as it pushes them, so that a snapshot has each either held or to come)."""
        held = self._held.get(run)
        if held is None:
            held = self._held[run] = deque(maxlen=HELD_PER_RUN)
            while len(self._held) > MAX_RUNS:
                self._held.popitem(last=False)
        else:
            self._held.move_to_end(run)
        held.extend(events)

    def held(self, run: str) -> list[dict[str, Any]]:
        """Return the alerts raised on ``run`` while it was followed (written by another
        process), oldest first, the newest :data:`HELD_PER_RUN` at most; not recorded in it."""
        return list(self._held.get(run, ()))

    def pending(self) -> list[tuple[str, dict[str, Any]]]:
        """Take the alerts raised but not yet ingested (for tests that call :meth:`process`)."""
        out = list(self._out)
        self._out.clear()
        return out

    def statistics(self) -> AlertStatistics:
        """Return the engine's counters now."""
        return AlertStatistics(
            observed=self._observed,
            dropped=self._dropped,
            queue_depth=self._depth,
            queue_peak=max(self._peak, self._depth),
            raised=self._raised,
            suppressed=self._suppressed,
            failed=self._failed,
            runs=len(self._runs),
            cpu_seconds=round(self._busy, 6),
            dropped_points=self._dropped_points,
        )


#: Alert titles by rule (the page translates by rule; webhooks show these).
TITLES = {
    "nan": "NaN or Inf",
    "spike": "Spike",
    "divergence": "Diverging",
    "plateau": "Plateau",
    "stall": "Run stalled",
    "crash": "Run crashed",
    "writers": "Two writers",
    "gpu_underuse": "GPU underused",
    "gpu_memory": "GPU memory nearly full",
    "gradient_explode": "Exploding gradients",
    "gradient_vanish": "Vanishing gradients",
}
