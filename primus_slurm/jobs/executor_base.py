"""The interface both executors implement (slurm_executor.SlurmExecutor, local_executor.LocalExecutor; picked
by name with executors.executor_for), and the job states they answer in: Slurm's words, which the local
executor uses too.

A state is a dict {'state', 'exit_code', 'nodes', 'source'} (and 'reason' where the executor knows why a job
ended without an exit code). `info` is a run's registry entry merged with its run.json.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

# STOPPING is ours: a job cancelled whose processes still run (the trainer checkpoints), until it has ended
STOPPING = "STOPPING"
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", STOPPING)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}


class NothingToCancel(Exception):
    """Raised by Executor.cancel when the scheduler no longer knows the job: the message says why."""


class Executor(ABC):
    name: str
    runs_here: bool     # the job runs on this machine, so every path it reads must exist here (paths.py)
    sbatch: bool        # the script carries #SBATCH lines and the job.sh.j2 blocks for Slurm
    post_output: str    # the output file of a post job in its directory (what an error message points to)

    def check_usable(self) -> None:
        """UserError when this machine cannot start jobs with this executor."""

    def container_unused(self, runtime: str) -> bool:
        """Whether the job runs on the host although the recipe names a container of `runtime`."""
        return False

    @abstractmethod
    def submit(self, run_dir: Path) -> dict:
        """Start `<run_dir>/job.sbatch`; returns the run.json fields that name the job (job_id, ...)."""

    @abstractmethod
    def resubmit(self, run_dir: Path) -> dict:
        """`resume`: start the run's script again as a new job (the previous one has ended); its run.json fields."""

    @abstractmethod
    def state(self, run_dir: Path, info: dict) -> dict:
        """The state of one run's job ({'state': 'UNKNOWN'} when the scheduler does not know it)."""

    @abstractmethod
    def states(self, runs: list[tuple[Path, dict]]) -> list[dict | None]:
        """The states of many runs' jobs at once (`status`), one a run; None where nothing knows the job."""

    @abstractmethod
    def busy(self, run_dir: Path, info: dict, state: dict) -> str | None:
        """The state that makes a resume wrong (the job still has processes), else None; `state` is state()'s."""

    @abstractmethod
    def cancel(self, run_dir: Path, info: dict) -> None:
        """End the run's job (NothingToCancel where the scheduler no longer knows it)."""

    @abstractmethod
    def stdout_path(self, run_dir: Path, info: dict) -> Path:
        """The job's stdout/stderr file."""

    @abstractmethod
    def run_post(self, job_dir: Path, out, submitted: Callable[[str], None]) -> tuple[str, int]:
        """Run a post job's `<job_dir>/job.sh` to its end, its output streamed to `out`;
        `submitted(job_id)` is called once a queued job has its id. Returns (job id, exit code)."""

    @abstractmethod
    def run_check(self, run_dir: Path, timeout: float, submitted: Callable[[str], None]) -> tuple[int, str]:
        """Run the preflight's `<run_dir>/job.sbatch` within `timeout` seconds (UserError past it); returns (exit
        code, its output)."""
