"""Time-limit warning -> SIGUSR2 -> SIGTERM -> checkpoint -> requeue -> resume, all inside the podman container.

Attempt 0 (container primus-<job>-0-<node>) gets the warning its `#SBATCH --signal=B:USR2@45` asks for: the batch
shell's trap sends SIGTERM to the step, the node wrapper passes it into the container (`podman kill --signal TERM`),
the trainer checkpoints and exits 75, and the script requeues the job. Attempt 1 runs in a new container
(primus-<job>-1-<node>), loads that checkpoint and finishes; no container is left. The trainer is frozen (SIGSTOP,
from the host: the container shares its pid namespace) at iteration 3 and the warning is sent as slurmctld sends it
(USR2 to the batch shell only, `scancel --batch --signal=USR2`), so where it stops does not depend on CPU speed.
That slurmctld itself sends it before a real time limit is test_reliability_requeue's attempt 0 (the same job script;
here it cost a 45-75 s wait for slurmctld's 30 s time-limit check).
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from container_support import container_recipe, image, job_containers, remove_job_containers  # noqa: F401
from reliability_support import cancel, read, release, submit, wait_for, wait_requeued, wait_text, worker_pids

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ITERS = 30


def test_time_limit_checkpoint_requeue_resume_in_the_container(image, local_slurm, job_env, tmp_path):  # noqa: F811
    recipe = container_recipe(tmp_path, "ctr-requeue", image, signal_grace_s=45)
    entry = submit(job_env, recipe, f"trainer.schedule.train_iters={ITERS}")
    job, run_dir = entry["job_id"], Path(entry["run_dir"])
    logs = run_dir / "logs"
    out, first, second = logs / f"slurm-{job}.out", logs / "rank-0" / "debug.log", logs / "rank-0" / "debug.attempt-1.log"
    frozen = None
    try:
        wait_text(first, "] iteration 3/", 300)
        frozen = worker_pids(run_dir)[0]
        os.kill(frozen, signal.SIGSTOP)
        names0 = [c["name"] for c in job_containers(job)]
        assert "#SBATCH --signal=B:USR2@45\n" in read(run_dir / "job.sbatch")  # the warning slurmctld would send
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
        wait_text(out, "primus-slurm: caught SIGUSR2", 60)
        os.kill(frozen, signal.SIGCONT)
        frozen = None
        wait_requeued(job, 1)
        text0 = read(first)
        assert "] stop signal | signal SIGTERM" in text0 and "| exit 75" in text0, text0[-2000:]
        stopped = int(text0.split("] stop signal | signal SIGTERM | iteration ")[1].split()[0])
        assert f"] checkpoint saved | iteration {stopped} |" in text0
        wait_for(lambda: not job_containers(job), 30, "attempt 0's container removed")

        release(job)
        wait_text(second, "] iteration", 300)
        names1 = [c["name"] for c in job_containers(job)]
        text1 = wait_text(second, "] training finished |", 300)
        assert f"] checkpoint loaded | iteration {stopped} |" in text1, text1[-2000:]
        assert f"] training finished | iterations {ITERS} | exit 0" in text1, text1[-2000:]
        assert len(names0) == 1 and names0[0].startswith(f"primus-{job}-0-node"), names0
        assert len(names1) == 1 and names1[0].startswith(f"primus-{job}-1-node"), names1
        pre = [line for line in read(out).splitlines() if line.startswith("preflight | ")]
        assert len(pre) == 2 and all("container podman (/run/.containerenv)" in line for line in pre), pre
        wait_for(lambda: not job_containers(job), 60, "no container once the job ended")
    finally:
        if frozen:
            os.kill(frozen, signal.SIGCONT)
        cancel(job)
        remove_job_containers(job)
