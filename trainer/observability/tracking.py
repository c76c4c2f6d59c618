"""Rank 0's experiment trackers: TensorBoard (trainer.logging.tensorboard) and W&B (trainer.logging.wandb).

TrainLogger hands them its `metrics` and `eval` events, so a tracker holds exactly the numbers the log line
prints: `train/<field>` and `eval/<field>` (the event's field names, primus_contract/run_files.py), at step =
iteration. TrainLogger imports this module only when a tracker is on; tensorboard and wandb are imported here
only when theirs is.

TensorBoard: one folder of event files per attempt, <run_dir>/tensorboard/attempt-<N>/.
W&B: the W&B run id is made by the first attempt and kept in <run_dir>/wandb/run-id; every later attempt (a
requeue, `primus-slurm resume`) opens the same W&B run with it (resume="allow"). The resolved recipe is the run's
config; mode offline writes <run_dir>/wandb/offline-run-*/ and needs no network (`wandb sync` uploads it). wandb
reads WANDB_API_KEY from the environment (cluster.secrets passes it to the job); an online run without it is
refused at start, so no key file is ever used.
wandb's service process (wandb-core) shuts down on SIGTERM or SIGINT and loses what it had not written yet; Slurm
sends those to every process of the job step when it stops one (preemption, requeue, cancel). When a W&B call
fails, the attempt's scalars are kept, and at exit the same W&B run is opened again in a new service and given
them again (W&B keeps one value a step), then finished with the trainer's exit code.
"""
from __future__ import annotations

import os
import secrets
from typing import Any, Callable, Optional

from primus_contract import run_files

PREFIX = {"metrics": "train", "eval": "eval"}  # the events whose numbers the trackers log
NOT_SCALARS = ("iteration", "train_iters")


class TrackerError(Exception):
    """A tracker the recipe asks for cannot start here (one line; the trainer exits EXIT_CONFIG)."""


def scalars_of(kind: str, fields: dict) -> Optional[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) of an event the trackers log, else None."""
    prefix = PREFIX.get(kind)
    if prefix is None:
        return None
    values = {f"{prefix}/{k}": float(v) for k, v in fields.items()
              if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return int(fields["iteration"]), values


class TensorBoard:
    def __init__(self, run_dir: str, attempt: int, say: Callable[[str], None]) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (requirements/cpu.txt)

        rel = os.path.join(run_files.TENSORBOARD, f"attempt-{attempt}")
        self.writer = SummaryWriter(log_dir=os.path.join(run_dir, rel))
        say(f"tensorboard | dir {rel}")

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a killed attempt keeps what it logged

    def close(self, exit_code: int) -> None:
        self.writer.close()


def wandb_run_id(run_dir: str) -> str:
    """The run's W&B id: read from <run_dir>/wandb/run-id, made (and written atomically) by the first attempt."""
    path = os.path.join(run_dir, run_files.WANDB_RUN_ID)
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except FileNotFoundError:
        pass
    run_id = secrets.token_hex(4)  # 8 of W&B's allowed id characters [a-z0-9]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(run_id + "\n")
    os.replace(path + ".tmp", path)
    return run_id


class WandB:
    def __init__(self, cfg, run_dir: str, attempt: int, say: Callable[[str], None]) -> None:
        w = cfg.trainer.logging.wandb
        mode = w.mode or "online"
        if mode == "online" and not os.environ.get("WANDB_API_KEY"):
            raise TrackerError("`trainer.logging.wandb.mode` is online but WANDB_API_KEY is not in the job's "
                               "environment; export it where you submit (cluster.secrets passes it on) or set "
                               "trainer.logging.wandb.mode: offline")
        import wandb

        self.wandb, self.say = wandb, say
        self.run_id = wandb_run_id(run_dir)
        self.init = dict(project=w.project, entity=w.entity, name=w.name or os.path.basename(run_dir),
                         tags=list(w.tags), group=w.group, notes=cfg.experiment.description or None, mode=mode,
                         dir=run_dir, id=self.run_id, resume="allow",
                         config=cfg.to_dict(), settings=wandb.Settings(console="off", silent=True))
        self.history: list[tuple[int, dict[str, float]]] = []  # this attempt's, for a new service (see above)
        self.run: Any = wandb.init(**self.init)
        say(f"wandb | run {self.run_id} | project {w.project} | mode {mode} | attempt {attempt} | dir "
            f"{run_files.WANDB_DIR}")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.history.append((step, values))
        if self.run is None:
            return
        try:
            self.run.log(values, step=step)
        except Exception as err:  # noqa: BLE001  (its service is gone: training goes on, the scalars are kept)
            self._lost(err)

    def _lost(self, err: Exception, say: bool = True) -> None:
        self.run = None
        if say:  # not at close: the outcome line stays the log's last
            self.say(f"wandb | service lost | {type(err).__name__}: {err} | this attempt's scalars are logged again "
                     f"at exit")
        try:
            self.wandb.teardown()
        except Exception:  # noqa: BLE001  (the same dead service; the next init starts a new one)
            pass

    def close(self, exit_code: int) -> None:
        if self.run is not None:
            try:
                self.run.finish(exit_code=exit_code)
                return
            except Exception as err:  # noqa: BLE001
                self._lost(err, say=False)
        run = self.wandb.init(**self.init, reinit="create_new")
        for step, values in self.history:
            run.log(values, step=step)
        run.finish(exit_code=exit_code)  # nothing more in the log: the outcome line stays its last


def open_trackers(cfg, run_dir: str, attempt: int, say: Callable[[str], None]) -> list:
    """The trackers the recipe asks for, started (TrackerError when one cannot start here)."""
    out: list = []
    if cfg.trainer.logging.wandb.project is not None:  # first: it may refuse to start
        out.append(WandB(cfg, run_dir, attempt, say))
    if cfg.trainer.logging.tensorboard:
        out.append(TensorBoard(run_dir, attempt, say))
    return out
