"""`primus-slurm sweep`: the trials of a grid, each checked as `submit` checks a recipe (the same functions:
submit.prepare, plan_cli.check_memory, submit.check), the accepted ones started as ONE Slurm job array, or with
the local executor one after another (N at a time).

A sweep lives in `<workspace>/<experiment.name>/<sweep id>/`: sweep.json (the trials, their values, run ids,
refusals), and for Slurm array.sbatch, the array script as submitted. Each accepted trial is an ordinary run
(its own run directory, resolved recipe, job script, registry entry with `sweep`), so status, logs, cancel,
resume, eval and export take a trial like any run.
"""
from __future__ import annotations

import datetime as _dt
import json
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from primus_slurm.planning import plan_cli
from primus_slurm.jobs import runs
from primus_slurm.jobs import submit as submit_mod
from primus_slurm.errors import UserError
from primus_slurm.config.recipe import find_recipe
from primus_slurm.config.render import render_array, sbatch_lines
from primus_slurm.jobs.slurm_executor import submit_script
from primus_slurm.experiments import grid, local_queue, pipeline

SWEEP_JSON = "sweep.json"
ARRAY_SCRIPT = "array.sbatch"
PER_RUN_SBATCH = ("--output=", "--open-mode=", "--job-name=")  # the array sets its own


@dataclass
class Trial:
    index: int
    values: list[tuple[str, str]]
    prepared: submit_mod.Prepared | None = None
    error: str | None = None
    task: int | None = None  # array task id / queue position of an accepted trial
    hours: float | None = None  # the plan's training time (step time x train_iters); None on CPU
    gpus: int = 0

    @property
    def gpu_hours(self) -> float | None:
        return self.hours * self.gpus if self.hours is not None else None

    def as_dict(self) -> dict:
        p = self.prepared
        return {"index": self.index, "values": dict(self.values), "task": self.task, "error": self.error,
                "planned_hours": self.hours, "planned_gpu_hours": self.gpu_hours,
                "run_id": p.run_id if p and self.error is None else None,
                "run_dir": str(p.run_dir) if p and self.error is None else None}


@dataclass
class Sweep:
    sweep_id: str
    recipe: str
    executor: str | None
    max_parallel: int | None
    trials: list[Trial] = field(default_factory=list)
    sweep_dir: Path | None = None

    @property
    def accepted(self) -> list[Trial]:
        return [t for t in self.trials if t.error is None]

    @property
    def keys(self) -> list[str]:
        return grid.varying([t.values for t in self.trials])


def new_sweep_id() -> str:
    now = _dt.datetime.now(_dt.timezone.utc)
    return f"sweep-{now.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _fresh_run_id(used: set) -> str:
    """A run id no other trial of the sweep has: ids drawn within one second share their stamp, and two may draw
    the same 3 random bytes (then one run directory for both)."""
    run_id = runs.new_run_id()
    while run_id in used:
        run_id = runs.new_run_id()
    used.add(run_id)
    return run_id


def plan(recipe: str, grids: tuple, zips: tuple, overrides: tuple = (), executor: str | None = None,
         max_parallel: int | None = None, max_trials: int | None = None, skip_memory_check: bool = False,
         dry_run: bool = False) -> Sweep:
    """Every trial prepared and checked; a refused one keeps its one error line."""
    combos = grid.trials(grids, zips, max_trials)
    grid.check_overlap(tuple(o for o in overrides if not o.startswith("after=")), list(dict(combos[0])))
    find_recipe(recipe)  # a missing recipe is one line, not one refusal a trial
    sweep = Sweep(new_sweep_id(), recipe, executor, max_parallel)
    used: set[str] = set()
    for i, values in enumerate(combos):
        trial = Trial(i, values)
        try:
            trial.prepared = submit_mod.prepare(recipe, [*overrides, *grid.set_items(values)], executor,
                                                _fresh_run_id(used), dry_run=dry_run)
            planned = plan_cli.check_memory(trial.prepared.recipe.resolved, skip_memory_check)
            if not planned.on_cpu:
                c = trial.prepared.recipe.resolved["cluster"]
                trial.gpus = c["nodes"] * c["gpus_per_node"]
                iters = trial.prepared.recipe.resolved["trainer"]["schedule"]["train_iters"]
                trial.hours = planned.step_s * iters / 3600
            submit_mod.check(trial.prepared)
            wandb = trial.prepared.recipe.resolved["trainer"]["logging"]["wandb"]
            if wandb["project"] and wandb["group"] is None:  # the sweep's trials are one W&B group
                wandb["group"] = sweep.sweep_id
        except UserError as exc:
            trial.error = str(exc)
        sweep.trials.append(trial)
    accepted = sweep.accepted
    reasons = {t.error for t in sweep.trials}
    if not accepted and len(reasons) == 1:  # every trial refused for one reason: that reason, once
        raise UserError(f"sweep: every trial is refused: {reasons.pop()}")
    if accepted:
        pipeline.check_paths(accepted[0].prepared.recipe.resolved)
    for task, trial in enumerate(accepted):
        trial.task = task
    if accepted:
        first = accepted[0].prepared
        sweep.executor = first.executor
        sweep.sweep_dir = runs.run_dir_for(first.recipe.resolved, sweep.sweep_id)
        if len({t.prepared.executor for t in accepted}) > 1:
            raise UserError("sweep: the trials resolve to different executors; give --executor")
        if sweep.executor == "slurm":
            array_lines(sweep)  # one array shares one set of resources: refuse trials that differ
    return sweep


def array_lines(sweep: Sweep) -> list[str]:
    """The #SBATCH lines of the sweep's array: the trials' own (equal for all), its name, output and range."""
    shared = None
    for trial in sweep.accepted:
        p = trial.prepared
        lines = [line for line in sbatch_lines(p.recipe.resolved, str(p.run_dir))
                 if not line.startswith(PER_RUN_SBATCH)]
        if shared is None:
            shared, first = lines, trial
        elif lines != shared:
            differ = next(a for a, b in zip(lines + [""] * len(shared), shared + [""] * len(lines)) if a != b)
            raise UserError(f"sweep: trial {trial.index} asks Slurm for {differ or 'other resources'}, trial "
                            f"{first.index} does not; the tasks of one job array share their resources, so sweep "
                            "cluster.* keys in separate sweeps")
    n = len(sweep.accepted)
    limit = f"%{sweep.max_parallel}" if sweep.max_parallel else ""
    name = sweep.accepted[0].prepared.recipe.resolved["experiment"]["name"]
    return [f"--job-name={name}", *shared, f"--output={sweep.sweep_dir}/logs/array-%A_%a.out",
            "--open-mode=append", f"--array=0-{n - 1}{limit}"]


def array_script(sweep: Sweep) -> str:
    return render_array(array_lines(sweep), [str(t.prepared.run_dir) for t in sweep.accepted], sweep.sweep_id)


def record(sweep: Sweep, **fields) -> None:
    data = {"sweep_id": sweep.sweep_id, "recipe": str(sweep.recipe), "executor": sweep.executor,
            "max_parallel": sweep.max_parallel, "keys": sweep.keys,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "trials": [t.as_dict() for t in sweep.trials], **fields}
    tmp = sweep.sweep_dir / (SWEEP_JSON + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(sweep.sweep_dir / SWEEP_JSON)


def launch(sweep: Sweep) -> list[dict]:
    """Create every accepted trial's run directory, start them (one array, or the local queue); the registry
    entries. Nothing is left behind when the start fails: the directories it made are removed (only those: a
    directory in the way is another run's), the jobs it queued cancelled."""
    if not sweep.accepted:
        raise UserError(f"sweep: all {len(sweep.trials)} trials were refused; nothing submitted")
    tag = {"sweep": sweep.sweep_id, "sweep_dir": str(sweep.sweep_dir)}
    infos, made = [], []
    try:
        sweep.sweep_dir.mkdir(parents=True)
        made.append(sweep.sweep_dir)
        (sweep.sweep_dir / "logs").mkdir()
        for trial in sweep.accepted:
            chain = pipeline.local_chain(trial.prepared.recipe.resolved) if sweep.executor != "slurm" else []
            infos.append(submit_mod.create(trial.prepared, **tag, sweep_task=trial.task, pipeline=chain))
            made.append(trial.prepared.run_dir)
        if sweep.executor == "slurm":
            started = _start_array(sweep, infos)
        else:
            record(sweep)
            started = local_queue.start(sweep.sweep_dir, [t.prepared.run_dir for t in sweep.accepted],
                                        sweep.max_parallel or 1)
    except BaseException:
        for made_dir in made:
            shutil.rmtree(made_dir, ignore_errors=True)
        raise
    entries = [submit_mod.record(t.prepared, info, s, "sweep", "sweep_dir")
               for t, info, s in zip(sweep.accepted, infos, started)]
    if sweep.executor != "slurm":
        local_queue.release(sweep.sweep_dir)
    return entries


def _start_array(sweep: Sweep, infos: list[dict]) -> list[dict]:
    """The trials' job array, each trial followed by its own steps (`after:`): then the array is submitted held and
    released once every step is queued (pipeline.all_or_nothing). Each trial's run.json fields."""
    script = array_script(sweep)
    (sweep.sweep_dir / ARRAY_SCRIPT).write_text(script)
    resolved = sweep.accepted[0].prepared.recipe.resolved  # (the trials share their `after:` and cluster)
    steps = bool(resolved["after"])
    with pipeline.all_or_nothing(resolved) as queued:
        array_id, _ = submit_script(script, sweep.sweep_dir, [pipeline.HOLD] if steps else [])
        queued.add(array_id, held=steps)
        started = [{"job_id": f"{array_id}_{t.task}", "array_job_id": array_id} for t in sweep.accepted]
        record(sweep, array_job_id=array_id)
        for trial, info, fields in zip(sweep.accepted, infos, started):
            if steps:
                info.update(fields)
                pipeline.submit_chain(trial.prepared.run_dir, info, trial.prepared.recipe.resolved, queued)
    return started


def read(sweep_dir: Path) -> dict:
    """sweep.json, checked: a file edited by hand, or torn, is one error line naming what is wrong."""
    path = Path(sweep_dir) / SWEEP_JSON
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"{sweep_dir} has no readable {SWEEP_JSON} (not a sweep directory?)") from None
    problem = _malformed(data)
    if problem:
        raise UserError(f"{path}: {problem}; not a sweep.json that `primus-slurm sweep` wrote (edited by hand?)")
    return data


_TRIAL_FIELDS = {"index": (int,), "values": (dict,), "run_id": (str, type(None)), "run_dir": (str, type(None)),
                 "error": (str, type(None)), "task": (int, type(None))}


def _malformed(data) -> str | None:
    """What makes `data` no sweep.json (None when it is one)."""
    if not isinstance(data, dict):
        return f"holds a JSON {type(data).__name__}, not an object"
    for key, kinds, what in (("sweep_id", (str,), "a string"), ("keys", (list,), "a list of recipe keys"),
                             ("trials", (list,), "a list of trials"), ("executor", (str, type(None)),
                                                                        "slurm, local or null")):
        if not isinstance(data.get(key), kinds):
            return f"`{key}` is {'missing' if key not in data else repr(data[key])[:60]}; expected {what}"
    if not all(isinstance(k, str) for k in data["keys"]):
        return "`keys` holds a non-string; expected a list of recipe keys"
    limit = data.get("max_parallel")  # (resume SWEEP keeps to it)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        return f"`max_parallel` is {repr(limit)[:60]}; expected a positive integer or null"
    for i, trial in enumerate(data["trials"]):
        if not isinstance(trial, dict):
            return f"`trials[{i}]` is {repr(trial)[:60]}; expected an object"
        for key, kinds in _TRIAL_FIELDS.items():
            if not isinstance(trial.get(key), kinds) or isinstance(trial.get(key), bool):
                return (f"`trials[{i}].{key}` is {'missing' if key not in trial else repr(trial[key])[:60]}; "
                        f"expected {' or '.join('null' if k is type(None) else k.__name__ for k in kinds)}")
        if trial["run_id"] is not None and trial["run_dir"] is None:
            return f"`trials[{i}]` has run_id {trial['run_id']!r} but no run_dir"
    return None
