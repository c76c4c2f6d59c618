"""Learning-rate schedule: linear warmup, then cosine / linear / constant decay to min_lr.

Iterations are 1-based: iteration `i` is the i-th optimizer step. The LR used by step i is

    warmup (i <= W, W > 0):   lr * i / W
    decay  (W < i <= T):      p = (i - W) / (T - W)
        cosine:   min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * p))
        linear:   min_lr + (lr - min_lr) * (1 - p)
        constant: lr
    after T:                  min_lr (constant: lr)

with T = schedule.train_iters and W = schedule.warmup_iters. The schedule is a pure function of the
iteration, so resuming needs only the iteration; `state_dict()` records the hyper-parameters so a
checkpoint documents what produced it.
"""
from __future__ import annotations

import math

DECAY_STYLES = ("cosine", "linear", "constant")


class LRSchedule:
    def __init__(self, lr: float, min_lr: float, warmup_iters: int, train_iters: int, decay: str) -> None:
        if decay not in DECAY_STYLES:
            raise ValueError(f"schedule.lr_decay must be one of {DECAY_STYLES}, got {decay!r}")
        if warmup_iters < 0 or train_iters < 1:
            raise ValueError("schedule.warmup_iters must be >= 0 and train_iters >= 1")
        self.lr = float(lr)
        self.min_lr = float(min_lr or 0.0)
        self.warmup_iters = int(warmup_iters or 0)
        self.train_iters = int(train_iters)
        self.decay = decay

    @classmethod
    def from_config(cls, schedule) -> "LRSchedule":
        return cls(schedule.lr, schedule.min_lr, schedule.warmup_iters, schedule.train_iters, schedule.lr_decay)

    def lr_at(self, iteration: int) -> float:
        i, w, t = int(iteration), self.warmup_iters, self.train_iters
        if w > 0 and i <= w:
            return self.lr * max(i, 0) / w
        if self.decay == "constant":
            return self.lr
        if i >= t or t <= w:
            return self.min_lr
        p = (i - w) / (t - w)
        if self.decay == "cosine":
            return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
        return self.min_lr + (self.lr - self.min_lr) * (1.0 - p)

    def apply(self, optimizer, iteration: int) -> float:
        """Set every param group's lr for step `iteration`; returns the lr."""
        lr = self.lr_at(iteration)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self) -> dict:
        return {"lr": self.lr, "min_lr": self.min_lr, "warmup_iters": self.warmup_iters,
                "train_iters": self.train_iters, "decay": self.decay}
