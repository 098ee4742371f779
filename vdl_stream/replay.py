"""``vdl-stream replay``: recorded runs streamed again through a broker and the live dashboard.

The data path is the live one, fed from disk instead of from writers::

    RunReader.iter_records()  ->  Timeline (in memory)  ->  Replayer (paced by wall time / speed)
        ->  Broker over a temporary directory  ->  subscribers  ->  WebSocket  ->  browser

The recorded run is only ever read (:class:`recorder.RunReader` never writes). The broker persists
what it is fed into a fresh temporary directory, deleted at exit, so that snapshots for browsers
that connect mid-replay work exactly as they do live. Seeking backwards starts a fresh broker over a
fresh directory (browsers are closed with code 1001, reconnect on their own and get new snapshots);
seeking forwards feeds everything up to the target at once.

Control: :class:`Replayer` has ``play()``, ``pause()``, ``set_speed()``, ``seek()`` and
``status()``; :func:`replay_blueprint` exposes them as ``GET/POST /api/replay`` (docs/interop.md).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import trio

import recorder

from . import codec
from .codec import Batch, ScalarColumns

#: Real seconds between two feeds while playing (the pacing granularity).
TICK = 0.05
#: Scalar points per batch, at most (per run).
BATCH_POINTS = 1 << 16
#: Non-scalar events per batch, at most (per run).
BATCH_EVENTS = 1024
WRITER_ID = "replay"


# -- the timeline (no I/O, no trio) ------------------------------------------------------------


class _Chunk:
    """One recorded scalar chunk and how far it has been fed."""

    __slots__ = ("pos", "release", "steps", "tag", "values", "walls")

    def __init__(self, tag: str, series: recorder.ScalarSeries) -> None:
        self.tag = tag
        self.steps = series.steps
        self.walls = series.walls
        self.values = series.values
        # When each point is released: its wall time, made non-decreasing so that points keep
        # their recorded order (a step going back inside a chunk must not look like a restart).
        self.release = np.maximum.accumulate(series.walls) if len(series.walls) else series.walls
        self.pos = 0


class RunTimeline:
    """The records of one run, ordered for replay, with a cursor.

    Args:
        name: the run name the replay publishes under.
        records: the run's records in write order (from :meth:`recorder.RunReader.iter_records`);
            kinds that are not dashboard events (e.g. the broker's bookkeeping) are dropped.
    """

    def __init__(self, name: str, records: list[recorder.Record]) -> None:
        self.name = name
        # Consecutive chunks of a tag are joined (a live run has one per flush) unless the next
        # one starts at or below a step already seen: that is a restart and stays a chunk of its
        # own, so that the broker records it as a restart again.
        groups: list[tuple[str, list[recorder.ScalarSeries]]] = []
        open_groups: dict[str, tuple[list[recorder.ScalarSeries], list[int]]] = {}
        events: list[dict[str, Any]] = []
        for r in records:
            if r.kind == "scalars":
                if not len(r.data):
                    continue
                first, top = int(r.data.steps[0]), int(r.data.steps.max())
                group = open_groups.get(r.tag)
                if group is None or first <= group[1][0]:
                    group = open_groups[r.tag] = ([], [top])
                    groups.append((r.tag, group[0]))
                group[0].append(r.data)
                group[1][0] = max(group[1][0], top)
            elif r.kind in codec.EVENT_KINDS:
                events.append(
                    {**r.data, "kind": r.kind, "tag": r.tag, "step": r.step, "wall": r.wall}
                )
        self.chunks = [
            _Chunk(
                tag,
                parts[0]
                if len(parts) == 1
                else recorder.ScalarSeries(
                    *(np.concatenate(cols) for cols in zip(*parts, strict=True))
                ),
            )
            for tag, parts in groups
        ]
        self.chunks.sort(key=lambda c: float(c.release[0]))  # stable: write order among equals
        events.sort(key=lambda e: e["wall"])
        self.events = events
        self.event_walls = np.array([e["wall"] for e in events], dtype=np.float64)
        self.epos = 0
        self.points = sum(len(c.steps) for c in self.chunks)

    def rewind(self) -> None:
        """Move the cursor back to the start."""
        self.epos = 0
        for c in self.chunks:
            c.pos = 0

    def span(self) -> tuple[float, float] | None:
        """The first and last wall time recorded, or None for an empty run."""
        walls = [float(c.release[0]) for c in self.chunks] + [
            float(c.release[-1]) for c in self.chunks
        ]
        if len(self.event_walls):
            walls += [float(self.event_walls[0]), float(self.event_walls[-1])]
        return (min(walls), max(walls)) if walls else None

    def next_wall(self) -> float | None:
        """The wall time of the next record not yet taken, or None when all were taken."""
        best = None
        for c in self.chunks:
            if c.pos < len(c.release):
                w = float(c.release[c.pos])
                best = w if best is None else min(best, w)
        if self.epos < len(self.event_walls):
            w = float(self.event_walls[self.epos])
            best = w if best is None else min(best, w)
        return best

    def wall_of_step(self, step: int) -> float | None:
        """The earliest wall time of a record at or after ``step``, or None when there is none."""
        best = None
        for c in self.chunks:
            at = np.nonzero(c.steps >= step)[0]
            if len(at):
                w = float(c.release[at[0]])
                best = w if best is None else min(best, w)
        for e in self.events:
            if e["step"] is not None and e["step"] >= step:
                best = e["wall"] if best is None else min(best, e["wall"])
                break
        return best

    def take(
        self, until: float, max_points: int = BATCH_POINTS, max_events: int = BATCH_EVENTS
    ) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
        """Take what was recorded at or before wall time ``until`` (at most the given amounts)."""
        scalars = []
        budget = max_points
        for c in self.chunks:
            if budget <= 0:
                break
            if c.pos >= len(c.release) or c.release[c.pos] > until:
                continue
            hi = int(np.searchsorted(c.release, until, side="right"))
            hi = min(hi, c.pos + budget)
            scalars.append(
                ScalarColumns(c.tag, c.steps[c.pos : hi], c.walls[c.pos : hi], c.values[c.pos : hi])
            )
            budget -= hi - c.pos
            c.pos = hi
        hi = int(np.searchsorted(self.event_walls, until, side="right"))
        hi = min(hi, self.epos + max_events)
        events = self.events[self.epos : hi]
        self.epos = max(self.epos, hi)
        return scalars, events

    def done(self) -> bool:
        """Whether every record was taken."""
        return self.next_wall() is None


def find_runs(path: str) -> dict[str, str]:
    """Map run names to run directories for ``path``: a run directory, or a log directory of runs.

    Raises:
        recorder.NotARunError: ``path`` is neither (or holds no runs).
    """
    try:
        with recorder.RunReader(path):
            pass
        return {os.path.basename(os.path.abspath(path)) or "run": path}
    except recorder.NotARunError:
        pass
    try:
        names = recorder.list_runs(path)
    except NotADirectoryError:
        names = []
    if not names:
        raise recorder.NotARunError(f"{path}: neither a run directory nor a log directory of runs")
    return {name: os.path.join(path, *name.split("/")) for name in names}


def load_timelines(path: str) -> list[RunTimeline]:
    """Read every run under ``path`` into memory (blocking; never writes to ``path``)."""
    out = []
    for name, run_dir in find_runs(path).items():
        with recorder.RunReader(run_dir) as reader:
            out.append(RunTimeline(name, list(reader.iter_records())))
    return out


# -- the replayer (trio) -----------------------------------------------------------------------


class BrokerSlot:
    """The broker replayed into, replaceable: a seek backwards swaps in a fresh one.

    Attribute access goes to the current broker, so the slot can stand in for it in
    :func:`vdl_stream.server.create_app`. Each broker records into its own sub-directory of
    ``workdir`` (a temporary directory the caller owns), removed when the broker is replaced.
    """

    def __init__(self, workdir: str, nursery: trio.Nursery, **broker_options: Any) -> None:
        self._workdir = workdir
        self._nursery = nursery
        self._options = broker_options
        self._generation = 0
        self.current: Any = None

    async def start(self) -> None:
        """Start a fresh broker (stopping the current one first, if any)."""
        from .broker import Broker

        old = self.current
        self._generation += 1
        path = os.path.join(self._workdir, f"gen{self._generation}")
        os.makedirs(path)
        broker = Broker(path, **self._options)
        await self._nursery.start(broker.run)
        self.current = broker
        if old is not None:
            old.close()  # drains, then closes its subscribers: browsers reconnect to the new one
            with trio.move_on_after(10, shield=True):
                await old.wait_closed()
            await trio.to_thread.run_sync(partial(shutil.rmtree, old.logdir, ignore_errors=True))

    async def ingest(self, batch: Batch) -> int:
        """Feed a batch to the current broker."""
        return await self.current.ingest(batch)

    async def reset(self) -> None:
        """Replace the broker by a fresh, empty one."""
        await self.start()

    async def aclose(self) -> None:
        """Stop the current broker (drain, fsync, close its subscribers)."""
        if self.current is not None:
            self.current.close()
            with trio.move_on_after(10, shield=True):
                await self.current.wait_closed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


@dataclass(frozen=True)
class ReplayStatus:
    """Where a replay stands.

    Attributes:
        playing: False while paused (or before start).
        finished: every record has been fed.
        speed: recorded seconds per real second (``math.inf`` for "max").
        position: the recorded wall time reached (Unix seconds).
        start, end: the recorded time range.
        fed: scalar points and events fed to the broker so far.
        total: scalar points and events in the replay.
        runs: the replayed run names.
    """

    playing: bool
    finished: bool
    speed: float
    position: float
    start: float
    end: float
    fed: int
    total: int
    runs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (speed ``"max"`` instead of infinity)."""
        d = dict(self.__dict__)
        d["speed"] = "max" if math.isinf(self.speed) else self.speed
        d["runs"] = list(self.runs)
        return d


def parse_speed(raw: object) -> float:
    """Turn ``"max"`` or a positive number (str or number) into a speed; raise ValueError."""
    if isinstance(raw, str) and raw.strip().lower() == "max":
        return math.inf
    try:
        speed = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"speed must be a positive number or 'max', got {raw!r:.40}") from None
    if not (speed > 0) or math.isnan(speed):
        raise ValueError(f"speed must be a positive number or 'max', got {raw!r:.40}")
    return speed


class Replayer:
    """Feeds timelines into a broker, paced by their recorded wall times scaled by ``speed``.

    Args:
        timelines: the runs to replay (one shared clock: runs start as far apart as recorded).
        sink: where batches go: a :class:`BrokerSlot` (anything with ``async ingest(batch)`` and
            ``async reset()``).
        speed: recorded seconds per real second; ``math.inf`` feeds as fast as the broker takes.
        max_gap: a recorded pause longer than this many real seconds is shortened to it.
        start_paused: wait for :meth:`play` before feeding.
    """

    def __init__(
        self,
        timelines: list[RunTimeline],
        sink: Any,
        *,
        speed: float = 1.0,
        max_gap: float = 3.0,
        start_paused: bool = False,
    ) -> None:
        self.timelines = timelines
        self.sink = sink
        self.speed = parse_speed(speed)
        self.max_gap = max_gap
        spans = [s for s in (t.span() for t in timelines) if s is not None]
        self.start = min(s[0] for s in spans) if spans else 0.0
        self.end = max(s[1] for s in spans) if spans else 0.0
        self.total = sum(t.points + len(t.events) for t in timelines)
        self.fed = 0
        self.batches = 0
        self._seq = 0
        self._playing = not start_paused
        self._anchor_wall = self.start  # recorded time at _anchor_clock
        self._anchor_clock: float | None = None
        self._seek_to: float | None = None
        self._fed_until = -math.inf  # the latest wall time fed
        self._changed = trio.Event()
        self.finished = trio.Event()

    # -- control (sync, called from the same trio loop) ---------------------------------------

    def _now(self) -> float:
        if not self._playing or self._anchor_clock is None:
            return self._anchor_wall
        if math.isinf(self.speed):
            return math.inf
        return self._anchor_wall + (trio.current_time() - self._anchor_clock) * self.speed

    def _reanchor(self, wall: float | None = None) -> None:
        self._anchor_wall = min(self._now(), self.end) if wall is None else wall
        self._anchor_clock = trio.current_time()
        self._changed.set()

    def play(self) -> None:
        """Resume (or start) feeding."""
        if not self._playing:
            self._playing = True
            self._reanchor(self._anchor_wall)

    def pause(self) -> None:
        """Stop feeding; the position stays where it is."""
        if self._playing:
            self._reanchor()
            self._playing = False

    def set_speed(self, speed: float | str) -> None:
        """Change the speed (a positive number, or ``"max"``/``math.inf``); raise ValueError."""
        value = parse_speed(speed)
        self._reanchor()
        self.speed = value

    def seek(self, *, wall: float | None = None, step: int | None = None) -> None:
        """Jump to a recorded wall time, or to the first record at or after ``step``.

        Everything recorded before the target is fed at once, so every chart shows the run as it
        stood then; feeding goes on from there (if playing).

        Raises:
            ValueError: neither or both of ``wall`` and ``step``, or a non-finite wall.
        """
        if (wall is None) == (step is None):
            raise ValueError("seek needs exactly one of wall and step")
        if step is not None:
            found = [w for w in (t.wall_of_step(step) for t in self.timelines) if w is not None]
            target = min(found) if found else self.end
        else:
            if not math.isfinite(wall):
                raise ValueError(f"wall must be a finite number, got {wall!r}")
            target = wall
        self._seek_to = min(max(target, self.start), self.end)
        self._changed.set()

    def status(self) -> ReplayStatus:
        """Where the replay stands (see :class:`ReplayStatus`)."""
        return ReplayStatus(
            playing=self._playing,
            finished=self.finished.is_set(),
            speed=self.speed,
            position=min(self._now(), self.end),
            start=self.start,
            end=self.end,
            fed=self.fed,
            total=self.total,
            runs=tuple(t.name for t in self.timelines),
        )

    # -- feeding -------------------------------------------------------------------------------

    async def _feed(self, until: float) -> None:
        """Feed every timeline up to recorded time ``until``, in bounded batches."""
        for t in self.timelines:
            while True:
                scalars, events = t.take(until)
                if not scalars and not events:
                    break
                self._seq += 1
                batch = Batch(WRITER_ID, self._seq, t.name, scalars, events)
                await self.sink.ingest(batch)
                self.fed += batch.count()
                for c in scalars:
                    self._fed_until = max(self._fed_until, float(c.walls.max()))
                if events:
                    self._fed_until = max(self._fed_until, max(e["wall"] for e in events))
                self.batches += 1

    def _next_wall(self) -> float | None:
        walls = [w for w in (t.next_wall() for t in self.timelines) if w is not None]
        return min(walls) if walls else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Feed until cancelled: pace, honour pause/speed/seek, then wait for a seek at the end."""
        self._anchor_clock = trio.current_time()
        task_status.started()
        while True:
            self._changed = trio.Event()
            if self._seek_to is not None:
                target, self._seek_to = self._seek_to, None
                if target < self._fed_until:  # records after the target were fed: start over
                    await self.sink.reset()
                    for t in self.timelines:
                        t.rewind()
                    self.fed = 0
                    self._seq = 0
                    self._fed_until = -math.inf
                self.finished = trio.Event() if self.finished.is_set() else self.finished
                await self._feed(math.nextafter(target, -math.inf))
                self._reanchor(target)
                continue
            if not self._playing:
                await self._changed.wait()
                continue
            now = self._now()
            await self._feed(now)
            nxt = self._next_wall()
            if nxt is None:
                self._anchor_wall = self.end
                self._anchor_clock = trio.current_time()
                self.finished.set()
                await self._changed.wait()
                continue
            wait = (nxt - self._now()) / self.speed
            if wait > self.max_gap:  # shorten long recorded pauses
                self._reanchor(nxt - self.max_gap * self.speed)
                wait = self.max_gap
            with trio.move_on_after(max(TICK, wait)):
                await self._changed.wait()


# -- HTTP control ------------------------------------------------------------------------------


def replay_blueprint(replayer: Replayer) -> Any:
    """A quart blueprint serving ``GET /api/replay`` (status) and ``POST /api/replay`` (control).

    POST takes a JSON object ``{"action": "play" | "pause" | "speed" | "seek", "speed": number |
    "max", "step": int, "wall": float}`` and answers with the status, or 400 and ``{"error": ...}``.
    Only ``application/json`` bodies are accepted (a cross-site form cannot send one without a
    preflight). Token checks are the app's (``/api/`` paths).
    """
    from quart import Blueprint, jsonify, request

    bp = Blueprint("replay", __name__)

    @bp.get("/api/replay")
    async def status() -> Any:
        return jsonify(replayer.status().to_json())

    @bp.post("/api/replay")
    async def control() -> Any:
        if request.mimetype != "application/json":
            return jsonify(error="send the command as application/json"), 415
        body = await request.get_json(silent=True)
        if not isinstance(body, dict):
            return jsonify(error="the body must be a JSON object"), 400
        action = body.get("action")
        try:
            if action == "play":
                replayer.play()
            elif action == "pause":
                replayer.pause()
            elif action == "speed":
                replayer.set_speed(body.get("speed"))
            elif action == "seek":
                step, wall = body.get("step"), body.get("wall")
                if step is not None and (type(step) is not int):
                    raise ValueError(f"step must be an integer, got {step!r:.40}")
                if wall is not None and type(wall) not in (int, float):
                    raise ValueError(f"wall must be a number, got {wall!r:.40}")
                replayer.seek(step=step, wall=None if wall is None else float(wall))
            else:
                raise ValueError(
                    f"action must be one of play, pause, speed, seek; got {action!r:.40}"
                )
        except ValueError as exc:
            return jsonify(error=str(exc)), 400
        return jsonify(replayer.status().to_json())

    return bp


async def serve_replay(
    slot: BrokerSlot,
    replayer: Replayer,
    host: str = "127.0.0.1",
    port: int = 8040,
    token: str | None = None,
    *,
    insecure: bool = False,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard over ``slot`` plus the replay control endpoints, until cancelled.

    The same app as ``vdl-stream serve`` (:func:`vdl_stream.server.create_app`) with
    :func:`replay_blueprint` mounted. Reports the URL through ``task_status``.

    Raises:
        PortInUseError: the port is taken.
        InsecureBindError: a non-loopback ``host`` without ``token`` or ``insecure``.
    """
    from .server import serve_dashboard

    await serve_dashboard(
        slot,  # type: ignore[arg-type]  (a BrokerSlot stands in for the broker it holds)
        host,
        port,
        token,
        insecure=insecure,
        shutdown_trigger=shutdown_trigger,
        blueprints=[replay_blueprint(replayer)],
        task_status=task_status,
    )


# -- command line ------------------------------------------------------------------------------


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``vdl-stream replay`` to ``parser``."""
    parser.add_argument("path", metavar="PATH", help="a run directory or a log directory of runs")
    parser.add_argument(
        "--speed",
        default="1",
        help="recorded seconds per real second, or 'max' (default: 1)",
    )
    parser.add_argument(
        "--from",
        dest="from_step",
        type=int,
        metavar="STEP",
        help="start at this step (what came before is shown at once)",
    )
    parser.add_argument(
        "--max-gap",
        type=float,
        default=3.0,
        help="shorten recorded pauses to at most this many real seconds (default: 3)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8040, help="port (default: 8040; 0: any free)")
    parser.add_argument("--token", help="require this token from browsers")
    parser.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without --token"
    )
    parser.add_argument("--paused", action="store_true", help="start paused (play from the page)")
    parser.add_argument(
        "--exit", action="store_true", help="exit when everything has been replayed"
    )


def run_replay(args: argparse.Namespace) -> int:
    """Run ``vdl-stream replay``; return 0, or 2 on bad input."""
    from . import __version__
    from .errors import InsecureBindError, PortInUseError, unwrap

    try:
        speed = parse_speed(args.speed)
        if not args.max_gap > 0:
            raise ValueError(f"--max-gap must be a positive number, got {args.max_gap!r}")
        timelines = load_timelines(args.path)
    except (ValueError, recorder.RecorderError) as exc:
        print(f"vdl-stream replay: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        with (
            trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
            tempfile.TemporaryDirectory(prefix="vdl-replay-") as workdir,
        ):
            async with trio.open_nursery() as nursery:
                slot = BrokerSlot(workdir, nursery)
                await slot.start()
                replayer = Replayer(
                    timelines, slot, speed=speed, max_gap=args.max_gap, start_paused=True
                )
                if args.from_step is not None:
                    replayer.seek(step=args.from_step)
                web_stop = trio.Event()
                feeding = trio.CancelScope()

                async def feed(task_status: trio.TaskStatus[None]) -> None:
                    with feeding:
                        await replayer.run(task_status=task_status)

                await nursery.start(feed)
                url = await nursery.start(
                    partial(
                        serve_replay,
                        slot,
                        replayer,
                        args.host,
                        args.port,
                        args.token,
                        insecure=args.insecure,
                        shutdown_trigger=web_stop.wait,
                    )
                )
                suffix = f"/?token={args.token}" if args.token else "/"
                names = ", ".join(t.name for t in timelines)
                print(f"vdl-stream {__version__}: replaying {names} at {url}{suffix}", flush=True)
                if not args.paused:
                    replayer.play()

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        return

                async with trio.open_nursery() as waiting:

                    async def first(fn: Callable[[], Awaitable[object]]) -> None:
                        await fn()
                        waiting.cancel_scope.cancel()

                    waiting.start_soon(first, stop_on_signal)
                    if args.exit:
                        waiting.start_soon(first, replayer.finished.wait)
                status = replayer.status()
                print(f"replayed {status.fed:,} of {status.total:,} points and events", flush=True)
                feeding.cancel()
                await slot.aclose()  # browsers are closed with 1001
                web_stop.set()
                nursery.cancel_scope.deadline = trio.current_time() + 5

    try:
        trio.run(main)
    except BaseException as exc:
        error = unwrap(exc)
        if isinstance(error, (PortInUseError, InsecureBindError)):
            print(
                f"vdl-stream replay: {error.strerror if isinstance(error, OSError) else error}",
                file=sys.stderr,
            )
            return 2
        raise
    return 0
