"""The demo's training (vdl_stream/demo.py) with faults injected, for the alert tests and bench.

The model, data and optimiser are the demo's own; only the knobs below differ, so a run without
faults is a normal demo run (with its own seed).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vdl_stream import demo, summaries
from vdl_stream.alerts import AlertEngine
from vdl_stream.codec import columns_from_points


def train(
    writer: Any,
    steps: int,
    *,
    seed: int = 0,
    lr_boost_at: int | None = None,
    lr_boost: float = 100.0,
    nan_at: int | None = None,
    grad_scale_at: int | None = None,
    grad_scale: float = 1e6,
    pause_at: int | None = None,
    pause: Any = None,
    on_step: Any = None,
    delay: float = 0.0,
) -> None:
    """Train the demo MLP for ``steps`` steps, logging as ``demo.train`` does.

    Args:
        seed: the data and initialisation seed.
        lr_boost_at: from this step on, the learning rate is multiplied by ``lr_boost``.
        nan_at: the loss logged at this step is NaN.
        grad_scale_at: from this step on, the gradients logged (and applied) are scaled by
            ``grad_scale``.
        pause_at: at this step, call ``pause()`` (e.g. wait for an event) before going on.
        on_step: called with ``(step, wall)`` after each step's points are logged.
        delay: seconds to sleep per step.
    """
    x, y = demo.make_spirals(seed=seed)
    model = demo.MLP.create(2, 64, 3, seed=seed)
    velocity = {k: np.zeros_like(getattr(model, k)) for k in ("w1", "b1", "w2", "b2")}
    with np.errstate(all="ignore"):
        for step, (xb, yb) in zip(range(steps), demo.batches(x, y, 64, seed), strict=False):
            if pause_at is not None and step == pause_at:
                pause()
            lr = demo.learning_rate(step, steps)
            if lr_boost_at is not None and step >= lr_boost_at:
                lr *= lr_boost
            loss, acc, grads = model.loss_and_grads(xb, yb)
            if grad_scale_at is not None and step >= grad_scale_at:
                grads = {k: g * grad_scale for k, g in grads.items()}
            if nan_at is not None and step == nan_at:
                loss = float("nan")
            for name, grad in grads.items():
                velocity[name] = 0.9 * velocity[name] - lr * grad
                setattr(model, name, getattr(model, name) + velocity[name])
            wall = time.time()
            writer.add_scalar("train/loss", loss, step)
            writer.add_scalar("train/accuracy", acc, step)
            writer.add_scalar("train/lr", lr, step)
            if step % 25 == 0:
                writer.add_histogram("weights/w1", np.nan_to_num(model.w1), step)
                writer.add_histogram("grads/w1", np.nan_to_num(grads["w1"]), step)
            if step % 100 == 0 or step == steps - 1:
                eval_loss, eval_acc, _ = model.loss_and_grads(x, y)
                writer.add_scalar("eval/loss", eval_loss, step)
                writer.add_scalar("eval/accuracy", eval_acc, step)
            if on_step is not None:
                on_step(step, wall)
            if delay:
                time.sleep(delay)


class Collect:
    """Stands in for a Writer: hands what the demo logs to ``engine.process`` in batches of
    about 30 points, as the writer's 20 ms flushes do, with wall times from the training.
    ``start``: the first step handed over, as a server started next to a running job sees it
    (which tells the detectors where each tag began, as the server does from the run's index)."""

    def __init__(self, engine: AlertEngine, run: str = "r", start: int = 0) -> None:
        self.engine, self.run, self.start = engine, run, start
        self.history: dict[str, int] | None = {} if start else None  # tag -> first step
        self.points: list[tuple[str, int, float, float]] = []
        self.events: list[dict[str, Any]] = []
        self.clock = 0.0

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if step < self.start:
            self.history.setdefault(tag, step)
            return
        self.points.append((tag, step, float(value), 1.7e9 + step * 0.01))
        if len(self.points) >= 30:
            self.flush()

    def add_histogram(self, tag: str, values: Any, step: int) -> None:
        if step < self.start:
            return
        self.events.append(summaries.histogram_event(tag, values, step, 1.7e9 + step * 0.01, 10))

    def flush(self) -> None:
        if self.history is not None and self.points:
            self.engine.history(self.run, self.history)
            self.history = None
        self.clock += 0.02
        self.engine.process(self.run, columns_from_points(self.points), self.events, self.clock)
        self.points, self.events = [], []
