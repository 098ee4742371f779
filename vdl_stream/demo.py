"""``vdl-stream demo``: a real small training run streaming to a local dashboard.

A two-layer MLP, written in numpy with a real forward pass, cross-entropy loss, backpropagated
gradients and SGD with momentum, learns a generated three-class spiral. Nothing is downloaded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .writer import Writer


def make_spirals(
    n_per_class: int = 1000, classes: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)``: points on ``classes`` interleaved noisy spirals, and their labels."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(classes):
        r = np.linspace(0.05, 1.0, n_per_class)
        t = np.linspace(c * 4.0, (c + 1) * 4.0, n_per_class) + rng.normal(0, 0.2, n_per_class)
        xs.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        ys.append(np.full(n_per_class, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


@dataclass
class MLP:
    """A 2 -> hidden -> classes ReLU network with its parameters and momentum buffers."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    @classmethod
    def create(cls, inputs: int, hidden: int, classes: int, seed: int = 0) -> MLP:
        """Initialise with He-scaled normal weights."""
        rng = np.random.default_rng(seed)
        return cls(
            rng.normal(0, math.sqrt(2 / inputs), (inputs, hidden)).astype(np.float32),
            np.zeros(hidden, np.float32),
            rng.normal(0, math.sqrt(2 / hidden), (hidden, classes)).astype(np.float32),
            np.zeros(classes, np.float32),
        )

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(hidden activations, class probabilities)``."""
        h = np.maximum(x @ self.w1 + self.b1, 0)
        logits = h @ self.w2 + self.b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return h, p / p.sum(axis=1, keepdims=True)

    def loss_and_grads(
        self, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, float, dict[str, np.ndarray]]:
        """Return mean cross-entropy, accuracy and the gradient of every parameter."""
        h, p = self.forward(x)
        n = len(y)
        loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
        acc = float((p.argmax(axis=1) == y).mean())
        d_logits = p.copy()
        d_logits[np.arange(n), y] -= 1
        d_logits /= n
        d_h = (d_logits @ self.w2.T) * (h > 0)
        grads = {
            "w1": x.T @ d_h,
            "b1": d_h.sum(axis=0),
            "w2": h.T @ d_logits,
            "b2": d_logits.sum(axis=0),
        }
        return loss, acc, grads


def learning_rate(step: int, steps: int, peak: float = 0.5, warmup: int = 100) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.5 * peak * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def batches(
    x: np.ndarray, y: np.ndarray, size: int, seed: int = 0
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield shuffled mini-batches forever."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - size + 1, size):
            idx = order[i : i + size]
            yield x[idx], y[idx]


def train(writer: Writer, steps: int = 2000, *, delay: float = 0.0, batch_size: int = 64) -> float:
    """Train the MLP for ``steps`` steps, logging to ``writer``; return the final eval accuracy."""
    x, y = make_spirals()
    model = MLP.create(2, 64, 3)
    velocity = {k: np.zeros_like(getattr(model, k)) for k in ("w1", "b1", "w2", "b2")}
    eval_acc = 0.0
    for step, (xb, yb) in zip(range(steps), batches(x, y, batch_size), strict=False):
        lr = learning_rate(step, steps)
        loss, acc, grads = model.loss_and_grads(xb, yb)
        for name, grad in grads.items():
            velocity[name] = 0.9 * velocity[name] - lr * grad
            setattr(model, name, getattr(model, name) + velocity[name])
        writer.add_scalar("train/loss", loss, step)
        writer.add_scalar("train/accuracy", acc, step)
        writer.add_scalar("train/lr", lr, step)
        if step % 25 == 0:
            writer.add_histogram("weights/w1", model.w1, step)
            writer.add_histogram("weights/w2", model.w2, step)
            writer.add_histogram("grads/w1", grads["w1"], step)
        if step % 100 == 0 or step == steps - 1:
            eval_loss, eval_acc, _ = model.loss_and_grads(x, y)
            writer.add_scalar("eval/loss", eval_loss, step)
            writer.add_scalar("eval/accuracy", eval_acc, step)
        if delay:
            time.sleep(delay)
    return eval_acc
