"""The lifecycle under a real Slurm on the device machine (issue 36 item 3), started with the other runs of
test_lifecycle.py's `lab` fixture so that its ~2.5 minutes overlap theirs (one after the other, on the H200 on
2026-12-05, it came on top of the suite's 8.4 minutes). `make gpu-test` starts the cluster first when the kit is
staged (scripts/gpu-slurm.sh: slurmctld, one slurmd with gres/gpu, slurmdbd over MariaDB) and sources its
environment; without a cluster that answers `scontrol ping` where SLURM_CONF points, the test skips (the shared
local test cluster of `make test`, in /etc/slurm, is never used by it).

One run with the slurm executor, holding one gres/gpu when the node has one, is warned of its time limit as Slurm's
`--signal=B:USR2@T` does (`scancel --signal=USR2 --batch`, without waiting for slurmctld's 30 s time-limit pass): the
job script has the trainer checkpoint, requeues the job (`scontrol requeue`), the second attempt resumes from that
checkpoint and completes, and `status --json` takes its GPU-hours from sacct's AllocTRES over both attempts.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import lifecycle_support as ls


def available() -> bool:
    return bool(os.environ.get("SLURM_CONF") and shutil.which("scontrol")
                and subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0)


def out(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def job_info(job_id: str) -> dict:
    """`scontrol show job -o` as {key: value}."""
    return dict(re.findall(r"(\w+)=(\S*)", out("scontrol", "show", "job", "-o", job_id)))


def node_gpus() -> int:
    """The node's gres/gpu count (`sinfo %G`: gpu:N, or gpu:TYPE:N)."""
    return max((int(m) for m in re.findall(r"gpu(?::[^:,(\s]+)?:(\d+)", out("sinfo", "-h", "-o", "%G"))), default=0)


def submit(dev: str, tmp: Path) -> dict:
    """The run, submitted with the slurm executor (its own state and workspace under tmp/slurm)."""
    gpus = 1 if node_gpus() else 0
    assert gpus or dev != "cuda", "a CUDA machine whose Slurm node has no gres/gpu (gpu-slurm.sh up counts them)"
    env = ls.env_for(tmp / "slurm")
    sets = [*ls.device_sets(dev, tmp), *ls.precision_sets(ls.precisions(dev)[0]), "cluster.nodes=1",
            f"cluster.gpus_per_node={gpus}", "cluster.nproc_per_node=1", "cluster.exclusive=false",
            "cluster.requeue=true"]
    entry = json.loads(ls.ok(ls.cli(env, "submit", str(ls.RECIPE), "--executor", "slurm", "--json",
                                    *[a for s in sets for a in ("--set", s)])))
    return {**entry, "env": env, "gpus": gpus}


def warn_and_requeue(entry: dict) -> tuple[dict, dict]:
    """After its first checkpoint: the time-limit warning to the batch script, the requeue it makes, and the second
    attempt to its end. Returns (scontrol's job record once requeued, `status --json` at the end)."""
    job, run_dir = str(entry["job_id"]), Path(entry["run_dir"])
    ls.wait_checkpoint(run_dir)
    out("scancel", "--signal=USR2", "--batch", job)
    end = time.monotonic() + 300
    while not ((info := job_info(job)).get("JobState") == "PENDING" and info.get("Restarts") == "1"):
        assert time.monotonic() < end and info.get("JobState") not in ls.TERMINAL, info
        time.sleep(0.5)
    time.sleep(2)  # a credential issued in the requeue's second is refused ("Job credential revoked")
    out("scontrol", "update", f"JobId={job}", "StartTime=now")  # skip the ~120 s hold of a requeued job
    return info, ls.wait_state(entry["env"], entry["run_id"], timeout=900)
