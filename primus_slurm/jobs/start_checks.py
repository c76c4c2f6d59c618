"""What a job would fail on in its first seconds that the launcher can see first, so that `validate`, a dry run
and `submit` refuse it with the same line (submit.check, the one verdict) instead of a job failing after the queue:

  - an online W&B run reads WANDB_API_KEY from the job's environment, which is the submitter's (cluster.secrets
    passes it on): without it there, the trainer would stop at start (trainer/observability/tracking.py);
  - a local job without a container runs `cluster.python` on this machine: it must be an executable here. On Slurm
    the nodes run it; one missing here is listed as a check only they can make.
"""
from __future__ import annotations

import os
import shutil
import sys

from primus_slurm.errors import UserError
from primus_slurm.jobs.executors import executor_for

WANDB_KEY = "WANDB_API_KEY"


def check_start(resolved: dict, executor: str) -> list[str]:
    """UserError for the first thing the job would fail on at start; returns the checks not made here."""
    w = resolved["trainer"]["logging"]["wandb"]
    if w["project"] is not None and (w["mode"] or "online") == "online" and not os.environ.get(WANDB_KEY):
        raise UserError(f"`trainer.logging.wandb.mode` is online but {WANDB_KEY} is not in this environment (the job's "
                        "environment comes from it); export it before you submit (cluster.secrets passes it on) or set "
                        "trainer.logging.wandb.mode: offline")
    return _interpreter(resolved["cluster"], executor)


def _interpreter(cluster: dict, executor: str) -> list[str]:
    runtime, runner = cluster["container"]["runtime"], executor_for(executor)
    if runtime != "none" and not runner.container_unused(runtime):
        return []  # the image's own interpreter: the preflight checks it inside the container
    python = cluster["python"]
    if shutil.which(python):
        return []
    if not runner.runs_here:
        return [f"`cluster.python` {python}: not found on this machine"]
    raise UserError(f"`cluster.python` is {python!r:.200}, which is not an executable on this machine (a local job "
                    f"runs it here); name an interpreter with the trainer's stack, e.g. {sys.executable}")
