"""`primus-slurm preflight RECIPE`: run the job's preflight (trainer/preflight.py) in the recipe's container or
interpreter, here (local) or as a one-minute Slurm job, then a timed all-reduce across the job's ranks
(trainer/preflight_comm.py). It renders the recipe's own job script with that entrypoint, so the check sees what
a submitted job would: the same image, mounts, environment, devices and ranks.

The run directory is `<workspace>/<experiment.name>/preflight-<run-id>` and is not recorded in the registry.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import click

from primus_slurm import executors, runs
from primus_slurm.errors import UserError
from primus_slurm.executors import TERMINAL
from primus_slurm.recipe import dump, load_recipe
from primus_slurm.render import render_script

ENTRYPOINT = "trainer.preflight_comm"
FIXED = ("cluster.entrypoint=" + ENTRYPOINT, "cluster.time=00:02:00", "cluster.requeue=false",
         "cluster.signal_grace_s=10")
SHOWN = ("preflight |", "all-reduce |")


def prepare(recipe_path: str, overrides=(), executor: str | None = None) -> tuple[str, Path]:
    """(executor, run directory holding job.sbatch) for the preflight job of RECIPE."""
    sets = [*overrides, *FIXED] + ([f"cluster.executor={executor}"] if executor else [])
    recipe = load_recipe(recipe_path, sets)
    concrete = executors.resolve_executor(recipe.resolved["cluster"]["executor"])
    recipe.resolved["cluster"]["executor"] = concrete
    run_id = runs.new_run_id()
    run_dir = runs.run_dir_for(recipe.resolved, f"preflight-{run_id}")
    script = render_script(recipe.resolved, str(run_dir), run_id, executor=concrete)
    try:
        runs.create_run_dir(run_dir, script, dump(recipe.raw), dump(recipe.resolved))
    except OSError as exc:
        raise UserError(f"cannot create the preflight directory {run_dir} (`experiment.workspace`): "
                        f"{exc.strerror or exc}") from None
    return concrete, run_dir


def run_local(run_dir: Path, timeout: float) -> tuple[int, str]:
    out = run_dir / "logs" / "preflight.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(["bash", str(run_dir / "job.sbatch")], cwd=run_dir, stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the job script passes it on; containers are reaped
            proc.wait()
            raise UserError(f"the preflight did not finish within {timeout:.0f} s; see {out}") from None
    return rc, out.read_text(errors="replace")


def run_slurm(run_dir: Path, timeout: float) -> tuple[int, str]:
    job_id, _ = executors.submit_slurm((run_dir / "job.sbatch").read_text(), run_dir)
    click.echo(f"preflight: Slurm job {job_id} ({run_dir})", err=True)
    end = time.monotonic() + timeout
    state = {}
    while time.monotonic() < end:
        state = executors.slurm_states([job_id]).get(str(job_id), {})
        if state.get("state") in TERMINAL:
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", str(job_id)], capture_output=True)
        raise UserError(f"Slurm job {job_id} did not finish within {timeout:.0f} s (last state "
                        f"{state.get('state', 'unknown')}); it was cancelled")
    out = run_dir / "logs" / f"slurm-{job_id}.out"
    for _ in range(50):  # the output file can trail the accounting record
        if out.exists():
            break
        time.sleep(0.1)
    text = out.read_text(errors="replace") if out.exists() else ""
    return (0 if state.get("state") == "COMPLETED" else 1), text


def report(rc: int, text: str, run_dir: Path) -> None:
    """Print what the check found; a refusal raises its one line (exit 2), anything else exits 1."""
    for line in text.splitlines():
        if line.startswith(SHOWN):
            click.echo(line)
    refusals = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("preflight: ")]
    if refusals:
        raise UserError(refusals[0])
    if rc != 0 or "all-reduce |" not in text:
        tail = "\n".join(text.splitlines()[-15:])
        click.echo(f"{tail}\npreflight: the check job failed (exit {rc}); output above, all of it in {run_dir}/logs",
                   err=True)
        raise click.exceptions.Exit(1)


def register(group: click.Group) -> None:
    from primus_slurm.cli import set_option

    @group.command()
    @click.argument("recipe")
    @set_option
    @click.option("--executor", type=click.Choice(["local", "slurm"]), default=None, help="Default: the recipe's.")
    @click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the check.")
    def preflight(recipe: str, overrides: tuple, executor: str | None, timeout: float) -> None:
        """Check that RECIPE's image (or interpreter) holds python, torch, megatron-core and TE if its precision
        needs it, at supported versions, then time an all-reduce across the job's ranks (gloo or NCCL)."""
        concrete, run_dir = prepare(recipe, overrides, executor)
        rc, text = (run_slurm if concrete == "slurm" else run_local)(run_dir, timeout)
        report(rc, text, run_dir)
