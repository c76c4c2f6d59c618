"""Learning-rate schedule: linear warmup, then cosine / linear / constant decay to min_lr.

Iterations are 1-based: iteration `i` is the i-th optimizer step. The LR used by step i is

    warmup (i <= W, W > 0):   lr * i / W
    decay  (W < i <= T):      p = (i - W) / (T - W)
        cosine:   min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * p))
        linear:   min_lr + (lr - min_lr) * (1 - p)
        constant: lr
    after T:                  min_lr (constant: lr)

with T = schedule.lr_decay_iters (null: train_iters) and W = schedule.warmup_iters. The schedule is a pure
function of the iteration, so resuming needs only the iteration and the same T: `state_dict()` records the
hyper-parameters, and `resume_change` refuses a resume whose T moved only because train_iters did (extending a
run would make the LR jump), as megatron's scheduler refuses a changed decay length.
"""
from __future__ import annotations

import math

DECAY_STYLES = ("cosine", "linear", "constant")


class LRSchedule:
    def __init__(self, lr: float, min_lr: float, warmup_iters: int, decay_iters: int, decay: str) -> None:
        if decay not in DECAY_STYLES:
            raise ValueError(f"schedule.lr_decay must be one of {DECAY_STYLES}, got {decay!r}")
        if warmup_iters < 0 or decay_iters < 1:
            raise ValueError("schedule.warmup_iters must be >= 0 and lr_decay_iters >= 1")
        self.lr = float(lr)
        self.min_lr = float(min_lr or 0.0)
        self.warmup_iters = int(warmup_iters or 0)
        self.decay_iters = int(decay_iters)
        self.decay = decay

    @classmethod
    def from_config(cls, schedule, decay_iters: int | None = None) -> "LRSchedule":
        """The recipe's schedule; decay_iters replaces its T (a checkpoint's, in resume_change)."""
        return cls(schedule.lr, schedule.min_lr, schedule.warmup_iters, decay_iters or decay_iters_of(schedule),
                   schedule.lr_decay)

    def lr_at(self, iteration: int) -> float:
        i, w, t = int(iteration), self.warmup_iters, self.decay_iters
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
                "decay_iters": self.decay_iters, "decay": self.decay}


def decay_iters_of(schedule) -> int:
    """T: schedule.lr_decay_iters, or train_iters when it is null (or absent from an older resolved recipe)."""
    return int(schedule.get("lr_decay_iters") or schedule.train_iters)


def resume_change(schedule, saved_decay_iters, iteration: int) -> str:
    """A resume from `iteration` whose checkpoint ran with T = saved_decay_iters: '' when T is unchanged (or
    irrelevant: constant LR; or unknown: an older checkpoint), a note when lr_decay_iters moved it on purpose.
    Raises ValueError when only train_iters moved it: the LR would jump, silently."""
    if saved_decay_iters is None or schedule.lr_decay == "constant":
        return ""
    saved, now = int(saved_decay_iters), decay_iters_of(schedule)
    if saved == now:
        return ""
    if schedule.get("lr_decay_iters") is not None:
        return f"schedule | LR decay end moved on resume from iteration {saved} to {now} (trainer.schedule.lr_decay_iters)"
    before, after = LRSchedule.from_config(schedule, saved), LRSchedule.from_config(schedule)
    k = iteration + 1
    if f"{after.lr_at(k):.4g}" == f"{before.lr_at(k):.4g}":  # e.g. stopped in warmup: show where the decay differs
        k = max(k, (int(schedule.warmup_iters or 0) + min(saved, now)) // 2 + 1)
    raise ValueError(f"trainer.schedule.train_iters changed the LR decay end from iteration {saved} to {now}: at "
                     f"iteration {k} the LR would be {after.lr_at(k):.4g} instead of {before.lr_at(k):.4g}. Set "
                     f"trainer.schedule.lr_decay_iters: {saved} to keep the saved schedule, or {now} to stretch it")
