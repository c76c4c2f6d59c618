"""`primus-slurm preflight RECIPE`: run the job's preflight (trainer/runtime/preflight.py) in the recipe's container or
interpreter, here (local) or as a one-minute Slurm job, then a timed all-reduce across the job's ranks
(trainer/runtime/preflight_comm.py). It renders the recipe's own job script with that entrypoint, so the check sees what
a submitted job would: the same image, mounts, environment, devices and ranks.

The run directory is `<workspace>/<experiment.name>/preflight-<run-id>` and is not recorded in the registry.
"""
from __future__ import annotations

from pathlib import Path

import click

from primus_slurm.jobs import executors, runs
from primus_slurm.cli_options import set_option
from primus_slurm.errors import UserError
from primus_slurm.config.recipe import dump, load_recipe
from primus_slurm.config.render import render_script

ENTRYPOINT = "trainer.runtime.preflight_comm"
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
    @group.command()
    @click.argument("recipe")
    @set_option
    @click.option("--executor", type=click.Choice(["local", "slurm"]), default=None, help="Default: the recipe's.")
    @click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the check.")
    def preflight(recipe: str, overrides: tuple, executor: str | None, timeout: float) -> None:
        """Check that RECIPE's image (or interpreter) holds python, torch, megatron-core and TE if its precision
        needs it, at supported versions, then time an all-reduce across the job's ranks (gloo or NCCL)."""
        concrete, run_dir = prepare(recipe, overrides, executor)
        rc, text = executors.executor_for(concrete).run_check(
            run_dir, timeout, lambda job_id: click.echo(f"preflight: Slurm job {job_id} ({run_dir})", err=True))
        report(rc, text, run_dir)
