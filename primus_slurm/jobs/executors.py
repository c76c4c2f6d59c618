"""Where a rendered script runs: `slurm` (sbatch through submitit) or `local` (a detached process group).

Both are an executor_base.Executor, picked once by name (`executor_for`); callers ask it, never the name. Nothing
here knows about recipes: the caller renders, an executor only runs and watches.
"""
from __future__ import annotations

import shutil

from primus_slurm.errors import UserError
from primus_slurm.jobs.executor_base import Executor
from primus_slurm.jobs.local_executor import LocalExecutor
from primus_slurm.jobs.slurm_executor import SlurmExecutor

_EXECUTORS: dict[str, Executor] = {e.name: e for e in (SlurmExecutor(), LocalExecutor())}


def executor_for(name: str) -> Executor:
    """The executor called `name` (slurm or local)."""
    try:
        return _EXECUTORS[name]
    except KeyError:
        raise UserError(f"cluster.executor must be one of auto, slurm, local (got '{name}')") from None


def concrete_executor(name: str | None) -> str:
    """`auto` (or unset) means Slurm when sbatch is on PATH, else local; other names pass through."""
    if name in (None, "", "auto"):
        return "slurm" if shutil.which("sbatch") else "local"
    return name


def resolve_executor(name: str, dry_run: bool = False) -> str:
    """`auto` → slurm when `sbatch` is on PATH, else local; UserError for an executor this machine cannot use
    (a dry run starts nothing, so it renders for an executor this machine lacks)."""
    executor = executor_for(concrete_executor(name))
    if not dry_run:
        executor.check_usable()
    return executor.name


# cluster keys only sbatch applies (cluster.signal is not one: the local job script traps it too)
SLURM_ONLY = ("time", "mem", "cpus_per_task", "partition", "account", "qos", "reservation", "constraint", "exclusive",
              "requeue", "signal_grace_s", "extra_sbatch")


def local_ignores_note(resolved: dict, concrete: str) -> str | None:
    """The note a local job's submit prints when the recipe sets Slurm-only cluster keys (not its defaults): the
    local executor has no allocation, time limit or signal to apply them to."""
    from primus_contract.schema import field_at

    if concrete != "local":
        return None
    c = resolved["cluster"]
    set_keys = [k for k in SLURM_ONLY if c[k] != field_at(f"cluster.{k}").default]
    if not set_keys:
        return None
    return (f"note: the local executor applies no Slurm option: cluster.{', cluster.'.join(set_keys)} take effect "
            "under --executor slurm only")


def sbatch_absent_note(requested: str | None, concrete: str) -> str | None:
    """The one note line a dry run or `render` prints on a machine without sbatch (None where sbatch is here, or
    the recipe asks for the local executor)."""
    if shutil.which("sbatch"):
        return None
    if concrete == "slurm":
        return ("note: `sbatch` is not on PATH here; this is the Slurm script a submit on a Slurm login node would "
                "run (only a real submit needs sbatch)")
    if requested in (None, "", "auto"):
        return ("note: `sbatch` is not on PATH here, so cluster.executor auto renders the local executor's script; "
                "--executor slurm renders the Slurm one")
    return None
