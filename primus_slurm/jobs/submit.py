"""`submit`: recipe → rendered script → run directory → executor → registry."""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from primus_contract.fields import SCHEMA
from primus_contract.rules_dependent import inert_keys

from primus_slurm import paths
from primus_slurm.jobs import executors, registry, runs
from primus_slurm.errors import UserError
from primus_slurm.config.recipe import Recipe, dump, load_recipe
from primus_slurm.config.render import job_python, render_script
from primus_slurm.jobs.start_checks import check_start
from primus_slurm.nodes import ledger as nodes_ledger
from primus_slurm.config.validate import check_time_limit

RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")


@dataclass
class Prepared:
    recipe: Recipe
    executor: str
    run_id: str
    run_dir: Path
    script: str
    note: str | None = None  # the dry run's one line when sbatch is absent here (executors.sbatch_absent_note)
    notes: tuple = ()  # the recipe's keys that do nothing in this job (recipe_notes): validate, dry run, submit


def prepare(recipe_path: str, overrides=(), executor: str | None = None, run_id: str | None = None,
            dry_run: bool = False) -> Prepared:
    """Everything a submit would write, computed without touching the disk; a dry run needs no sbatch here."""
    overrides = list(overrides)
    if executor:
        overrides.append(f"cluster.executor={executor}")
    recipe = load_recipe(recipe_path, overrides)
    requested = recipe.resolved["cluster"]["executor"]
    concrete = executors.resolve_executor(requested, dry_run=dry_run)
    recipe.resolved["cluster"]["executor"] = concrete  # the resolved recipe records where it really ran,
    python = job_python(recipe.resolved, concrete)  # and with which interpreter (where the field can hold it)
    if SCHEMA["cluster"]["python"].pattern.match(python):
        recipe.resolved["cluster"]["python"] = python
    check_time_limit(recipe.resolved["cluster"], concrete)
    if run_id is not None and not RUN_ID_RE.match(run_id):
        raise UserError(f"--run-id must look like 20260131-235959-a1b2c3 (got '{run_id}')")
    run_id = run_id or runs.new_run_id()
    run_dir = runs.run_dir_for(recipe.resolved, run_id)
    script = render_script(recipe.resolved, str(run_dir), run_id, executor=concrete)
    return Prepared(recipe, concrete, run_id, run_dir, script, executors.sbatch_absent_note(requested, concrete),
                    tuple(recipe_notes(recipe.resolved, concrete)))


def recipe_notes(resolved: dict, executor: str) -> list[str]:
    """The recipe's keys that do nothing in this job, one `note:` line each (validate, the dry run and the submit
    print them): Slurm-only options of a local job, and keys whose feature is off (primus_contract.rules_dependent)."""
    local = executors.local_ignores_note(resolved, executor)
    return ([local] if local else []) + [f"note: {line}" for line in inert_keys(resolved)]


def dry_run_text(p: Prepared) -> str:
    """The script exactly as it would be submitted, then the resolved recipe as shell comments."""
    recipe = "".join(f"# {line}\n" for line in dump(p.recipe.resolved).splitlines())
    return p.script + "# ---- recipe.resolved.yaml (not part of the script) ----\n" + recipe


def check(p: Prepared) -> list[str]:
    """What a submit refuses beyond the recipe itself; a dry run and `validate` check it too, so they print only
    what would run. Returns the checks that could not be made here (paths only the job's nodes see)."""
    unchecked = paths.check_paths(p.recipe.resolved, p.executor, str(p.run_dir))  # data/tokenizer/checkpoint
    unchecked += check_start(p.recipe.resolved, p.executor)  # the W&B key, a local job's interpreter
    nodes_ledger.check_placement(p.recipe.resolved)  # the node ledger's excluded nodes leave enough to place it
    if p.run_dir.exists():
        raise _taken(p.run_dir)
    _check_creatable(p.run_dir)
    return unchecked


def _taken(run_dir: Path) -> UserError:
    return UserError(f"run directory {run_dir} already exists; pick another --run-id")


def _check_creatable(run_dir: Path) -> None:
    """The run directory can be made here (submit makes it on this machine): its nearest existing ancestor is a
    writable directory. A dry run and `validate` judge it as the submit would, without writing."""
    ancestor = run_dir
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"cannot create the run directory {run_dir} (`experiment.workspace`): {ancestor} is not a "
                        "directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot create the run directory {run_dir} (`experiment.workspace`): {ancestor} is not "
                        "writable")


def create(p: Prepared, **fields) -> dict:
    """The run directory and its run.json (plus `fields`), the job not started yet; returns run.json's dict."""
    check(p)
    try:
        runs.create_run_dir(p.run_dir, p.script, dump(p.recipe.raw), dump(p.recipe.resolved))
    except FileExistsError:  # made since check(): another submit's, not ours to remove
        raise _taken(p.run_dir) from None
    except OSError as exc:  # e.g. the workspace is a file, or not writable
        shutil.rmtree(p.run_dir, ignore_errors=True)
        raise UserError(f"cannot create the run directory {p.run_dir} (`experiment.workspace`): "
                        f"{exc.strerror or exc}") from None
    try:
        registry.check_writable()
    except UserError:
        shutil.rmtree(p.run_dir, ignore_errors=True)
        raise
    info = runs.provenance(p.recipe.resolved, p.recipe.hash, p.run_id, p.executor)
    info.update(run_dir=str(p.run_dir), **fields)
    runs.write_run_json(p.run_dir, info)
    return info


def record(p: Prepared, info: dict, started: dict, *keys: str) -> dict:
    """run.json and the registry once the job is queued (`started`: the executor's fields); the entry has the
    usual keys, `keys` of run.json (a sweep's id) and `submit_dir`, where it was submitted from (`status` and
    `list` show the runs of the checkout they run in: registry.scoped)."""
    info.update(started)
    runs.write_run_json(p.run_dir, info)
    entry = {k: info[k] for k in ("run_id", "name", "executor", "job_id", "run_dir", "submit_time", *keys)}
    entry["submit_dir"] = os.getcwd()
    registry.record(entry)
    return entry


def submit(p: Prepared, start=None) -> dict:
    """Create the run dir, start the job (`start(run_dir, info)` returns its run.json fields; default: the
    executor's submit), record it. Returns the registry entry."""
    info = create(p)
    try:
        started = start(p.run_dir, info) if start else executors.executor_for(p.executor).submit(p.run_dir)
    except BaseException:
        shutil.rmtree(p.run_dir, ignore_errors=True)  # nothing was queued: leave no half run behind
        raise
    return record(p, info, started)
