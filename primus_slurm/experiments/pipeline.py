"""Pipelines: `submit RECIPE --then eval --then export --merged --then generate --prompts FILE`, or the recipe's
`after:` (primus_contract/rules_pipeline.py checks the steps).

Each step is a post job (primus_slurm.post_training.post: export, eval, generate) of the run, its outputs in the run
directory as the single commands leave them.
- Slurm: every step is its own job, submitted at once behind the step before it (`--dependency=afterok:<job>`, or
  afterany where the step says so) with `--kill-on-invalid-dep=yes`, so a step whose dependency can never be met
  is removed at once, never left pending. Export needs no GPU (--gpus-per-node is dropped); eval and generate
  take one.
- Local executor: the local queue (local_queue.py) runs the steps in order once training has ended, each only
  when the step before succeeded (or, `when: afterany`, whatever its end).
run.json's `pipeline` lists the steps (step, when, job id, directory; locally also their state).
On Slurm the job the steps wait for is submitted held (sbatch --hold) and released once every step is queued behind
it (all_or_nothing): a step sbatch refuses cancels, by id, every job the command had queued; nothing runs.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import click
import yaml

from primus_contract import run_files
from primus_contract.rules_pipeline import STEPS

from primus_slurm.post_training import post, post_cli
from primus_slurm.jobs import runs
from primus_slurm.jobs import submit as submit_mod
from primus_slurm.errors import UserError
from primus_slurm.config.validate import sets_option
from primus_slurm.jobs.slurm_executor import SlurmExecutor, cancel_jobs, release_jobs, submit_script
from primus_slurm.experiments import chain_state, local_queue

# --then STEP's own options: option -> the step key it sets, and whether it takes a value
THEN_OPTIONS = {"eval": {"--data": ("data", True)},
                "export": {"--merged": ("merged", False), "--adapter": ("adapter", False),
                           "--no-adapter": ("adapter", False)},
                "generate": {"--prompts": ("prompts", True), "--prompt": ("prompt", True),
                             "--max-new-tokens": ("max_new_tokens", True)}}
ANY_STEP = {"--afterany": ("when", False)}
PATHS = ("data", "prompts")
# GPUs per step job (0 where the run itself has none). Export builds the run's model under the run's precision as
# eval does (an FP8/FP4 run is refused on a CPU, a 70B base would be built in host memory): one GPU, as eval.
GPUS = {"export": 1, "eval": 1, "generate": 1}
HOLD = "--hold"  # sbatch: queued, but never started until `scontrol release`


def parse_then(args: list[str]) -> tuple[list[str], list[dict]]:
    """Take every `--then STEP [its options]` out of `args`: (the rest, the steps as `after:` entries)."""
    rest, steps, i = [], [], 0
    while i < len(args):
        if args[i] != "--then":
            rest.append(args[i])
            i += 1
            continue
        if i + 1 >= len(args):
            raise UserError("--then: name a step (eval, export or generate)")
        name, i = args[i + 1], i + 2
        if name not in STEPS:
            raise UserError(f"--then {name!r}: unknown step; one of {', '.join(STEPS)}")
        step, options = {"step": name}, {**THEN_OPTIONS[name], **ANY_STEP}
        while i < len(args) and args[i] in options:
            key, takes = options[args[i]]
            if takes and i + 1 >= len(args):
                raise UserError(f"--then {name} {args[i]}: needs a value")
            value = args[i + 1] if takes else {"--afterany": "afterany", "--no-adapter": False}.get(args[i], True)
            if key in PATHS:
                value = os.path.abspath(os.path.expanduser(value))
            elif key == "max_new_tokens":
                value = _int(name, args[i], value)
            step[key] = value
            i += 2 if takes else 1
        steps.append(step)
    return rest, steps


def _int(step: str, option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"--then {step} {option} {text!r}: expected an integer") from None


def override(steps: list[dict]) -> list[str]:
    """The `--set after=...` item that puts --then's steps into the recipe (checked there like any key)."""
    return [f"after={json.dumps(steps)}"] if steps else []


class ThenCommand(click.Command):
    """A command that takes `--then STEP [options]` groups (ctx.meta['then'] holds them as `after:` entries)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest, ctx.meta["then"] = parse_then(list(args))
        return super().parse_args(ctx, rest)


def check_paths(resolved: dict) -> None:
    """A step's input file must exist when the pipeline is submitted (its job reads it later); a generate step's
    prompts and an eval step's data are checked as `generate --prompts` and `eval --data` check them."""
    fmt = resolved["trainer"]["data"]["format"]
    for i, step in enumerate(resolved["after"]):
        for key in PATHS:
            if step.get(key) and not os.path.exists(step[key]):
                raise UserError(f"`after[{i}].{key}` is {step[key]!r:.200}, which does not exist")
        if step.get("prompts"):  # as `generate --prompts` reads it
            try:
                post_cli.read_prompts(step["prompts"], fmt=fmt)
            except UserError as exc:
                raise UserError(f"`after[{i}].prompts`: {str(exc).removeprefix('--prompts ')}") from None
        if step["step"] == "eval" and step.get("data"):
            try:
                post_cli.check_eval_data(step["data"], resolved)
            except UserError as exc:
                raise UserError(f"`after[{i}].data`: {str(exc).removeprefix('--data ')}") from None


def step_job(step: dict, run_id: str, run_dir: Path, resolved: dict, executor: str) -> post.PostJob:
    """The post job of one step, its arguments as `export`/`eval`/`generate` would give them."""
    job = post.PostJob(step["step"], {"run_id": run_id}, Path(run_dir), resolved, executor, post.new_id())
    if step["step"] == "eval" and step["data"]:
        job.args += ["--data", step["data"]]
    elif step["step"] == "export":
        job.args += [a for key in ("adapter", "merged") if step[key] for a in (f"--{key}", str(job.post_dir / key))]
    elif step["step"] == "generate":
        if step["prompts"]:
            job.copies["prompts.jsonl"] = step["prompts"]
            job.args += ["--prompts", str(job.post_dir / "prompts.jsonl")]
        else:
            job.args += [f"--prompt={step['prompt']}"]  # (one word: a prompt that starts with '-' stays the value)
        job.args += ["--max-new-tokens", step["max_new_tokens"]]
    return job


def _gpus(step: dict, resolved: dict) -> int:
    return min(GPUS[step["step"]], resolved["cluster"]["gpus_per_node"])


def chain(run_id: str, run_dir: Path, resolved: dict, executor: str, first_job: str, start) -> list:
    """Each step's post job and script, behind the job before it: `start(step, job, script, k)` returns the
    job id the next step waits for (submitting it, or a dry run's placeholder); returns start's answers."""
    out, previous = [], first_job
    for k, step in enumerate(resolved.get("after") or []):
        job = step_job(step, run_id, run_dir, resolved, executor)
        deps = (f"--dependency={step['when']}:{previous}", "--kill-on-invalid-dep=yes")
        previous = start(step, job, post.script(job, deps, _gpus(step, resolved)), k)
        out.append(previous)
    return out


def dry_run_text(p) -> str:
    """The scripts of a prepared run's steps, as `submit --dry-run` prints them after the training script."""
    texts = []

    def show(step, job, text, k):
        texts.append(f"# ---- after[{k}]: {step['step']} ({job.post_dir}) ----\n{text}")
        return f"STEP_{k}_JOB"
    chain(p.run_id, p.run_dir, p.recipe.resolved, p.executor, "TRAIN_JOB", show)
    return "".join(texts)


class Queued:
    """The Slurm jobs one command has queued (`jobs`, in order), those of them submitted held (`held`), and the step
    job directories it made (`made`)."""

    def __init__(self):
        self.jobs: list[str] = []
        self.held: list[str] = []
        self.made: list[Path] = []

    def add(self, job_id: str, held: bool = False) -> None:
        self.jobs.append(str(job_id))
        if held:
            self.held.append(str(job_id))


@contextlib.contextmanager
def all_or_nothing(resolved: dict, refused: str = "nothing was submitted"):
    """The jobs of a run (or a sweep) and its steps, queued together: the body adds each job sbatch takes to the
    Queued it gets; at its end the held ones are released (unless the recipe's extra_sbatch holds them itself). A
    failure on the way (a step sbatch refuses) cancels every one of them by id and removes the step directories it
    made, and its error line says `refused`."""
    queued = Queued()
    try:
        yield queued
        if not sets_option(resolved["cluster"]["extra_sbatch"], "hold"):
            release_jobs(queued.held)
    except BaseException as exc:
        cancel_jobs(queued.jobs)
        for made in queued.made:
            shutil.rmtree(made, ignore_errors=True)
        if not isinstance(exc, UserError):
            raise
        cancelled = f" (cancelled job {', '.join(queued.jobs)}, queued before it)" if queued.jobs else ""
        raise UserError(f"{exc}; {refused}{cancelled}") from None


def submit_chain(run_dir: Path, info: dict, resolved: dict, queued: Queued) -> list[dict]:
    """Slurm: every step's job, each behind the one before (added to `queued`); recorded in run.json's
    `pipeline`."""
    def start(step, job, text, k):
        if not job.post_dir.exists():  # (a new id: only ever one this command makes)
            queued.made.append(job.post_dir)
        record = post.create(job, text)
        job_id, _ = submit_script(text, job.post_dir)
        queued.add(job_id)
        post.set_job_id(job, record, job_id)
        info.setdefault("pipeline", []).append({"step": step["step"], "when": step["when"], "job_id": job_id,
                                                "dir": str(job.post_dir)})
        runs.write_run_json(run_dir, info)
        return job_id
    info["pipeline"] = []
    chain(info["run_id"], run_dir, resolved, "slurm", str(info["job_id"]), start)
    return info["pipeline"]


def _again(info: dict) -> bool:
    """Whether a resumed run's steps run again (some did not complete); if so its old chain goes to
    `pipeline_before` (info updated)."""
    chain = chain_state.chain_states(info)
    if not chain or all(s.get("state") == "COMPLETED" for s in chain):
        return False
    info["pipeline_before"] = [*info.get("pipeline_before", []), *chain]
    return True


def resume_args(run_dir: Path) -> list[str]:
    """The sbatch options of a resumed Slurm run's job: --hold where its steps are queued again behind it (then
    after_resume(held=True) releases it, or cancels it if a step is refused)."""
    info = runs.read_run_json(run_dir)
    return [HOLD] if info.get("executor") == "slurm" and _again(info) else []


def requeue_local(run_dir: Path, info: dict) -> bool:
    """A resumed local run that its sweep's queue starts: its steps again where they did not all complete (the
    queue runs them after it; info updated). Whether they run again."""
    again = _again(info)
    if again:
        info["pipeline"] = local_chain(yaml.safe_load((run_dir / run_files.RESOLVED).read_text()))
    return again


def after_resume(run_dir: Path, held: bool = False) -> str | None:
    """A resumed run whose steps did not all complete: its chain again, behind the new job (Slurm removed the old
    steps with the job they waited on; the local queue ran or skipped them when the old training ended): on Slurm
    as jobs (`held`: the new job was submitted held, resume_args; released once they are queued), locally by a
    queue of its own that waits for the resumed training. The line to print, or None (no steps, or all done)."""
    info = runs.read_run_json(run_dir)
    slurm = info.get("executor") == "slurm"
    again = (held or not slurm) and _again(info)  # (on Slurm, steps only behind a held job: resume_args)
    resolved = yaml.safe_load((run_dir / run_files.RESOLVED).read_text())
    if slurm:
        refused = (f"nothing runs: the resumed job of run {info.get('run_id')} is cancelled too (resume it again)"
                   if held else "its steps are not queued")
        with all_or_nothing(resolved, refused) as queued:
            if held:
                queued.add(info["job_id"], held=True)
            if again:
                submit_chain(run_dir, info, resolved, queued)
        return submitted_line(run_dir) if again else None
    if not again:
        return None
    info["pipeline"] = local_chain(resolved)
    started = local_queue.start(run_dir, [run_dir], 1, watch=True)[0]
    info.update({k: v for k, v in started.items() if k != "job_id"})  # the run keeps its own job id
    runs.write_run_json(run_dir, info)
    local_queue.release(run_dir)
    return submitted_line(run_dir)


def check_resumable(run_dir: Path) -> None:
    """A local run whose queue still runs one of its steps cannot be resumed yet (two writers of its run.json); steps
    that run again have their input files checked as at submit (check_paths: one moved or edited since)."""
    info = runs.read_run_json(run_dir)
    chain = chain_state.chain_states(info)
    busy = [s for s in chain if s.get("state") == "RUNNING"]
    if info.get("executor") != "slurm" and busy:
        raise UserError(f"run {info.get('run_id')}'s {busy[0]['step']} step still runs (the local queue, pid "
                        f"{info.get('queue_pid')}); resume it once the step has ended")
    if any(s.get("state") != "COMPLETED" for s in chain):
        check_paths(yaml.safe_load((run_dir / run_files.RESOLVED).read_text()))


def local_chain(resolved: dict) -> list[dict]:
    """The local queue's record of the steps before they run."""
    return [{"step": s["step"], "when": s["when"], "job_id": None, "dir": None, "state": "PENDING"}
            for s in resolved.get("after") or []]


def run_local(run_dir: Path, trained: dict) -> None:
    """The local queue's `after`: the run's steps in order, once its training ended as `trained` says."""
    info = runs.read_run_json(run_dir)
    chain = info.get("pipeline") or []
    if all(entry.get("state") == "COMPLETED" for entry in chain):  # none; or a resumed run's, all done before
        return
    resolved = yaml.safe_load((run_dir / run_files.RESOLVED).read_text())
    ok = trained.get("state") == "COMPLETED"
    for entry, step in zip(chain, resolved["after"]):
        if not ok and step["when"] == "afterok":
            entry["state"] = "CANCELLED"  # as Slurm removes a step whose dependency can never be met
        else:
            job = step_job(step, info["run_id"], run_dir, resolved, "local")
            entry.update(state="RUNNING", dir=str(job.post_dir), job_id="local")
            runs.write_run_json(run_dir, info)
            print(f"{run_dir}: {step['step']} ({job.post_dir})", flush=True)
            with open(os.devnull, "w") as quiet:  # (its output is in the step's own directory)
                rc, _ = post.launch(job, out=quiet)
            entry["state"], entry["exit_code"] = ("COMPLETED" if rc == 0 else "FAILED"), rc
            ok = rc == 0
        runs.write_run_json(run_dir, info)


def _start_held(run_dir: Path, info: dict, resolved: dict) -> dict:
    """A Slurm run with steps: its training job, held until every step is queued behind it; run.json's fields."""
    with all_or_nothing(resolved) as queued:
        info.update(SlurmExecutor().submit(run_dir, [HOLD]))
        queued.add(info["job_id"], held=True)
        submit_chain(run_dir, info, resolved, queued)
    return {k: info[k] for k in ("job_id", "submitted_file", "pipeline")}


def submitted_line(run_dir: Path) -> str:
    """`submit`'s line about the steps it queued behind the run."""
    chain = runs.read_run_json(run_dir).get("pipeline") or []
    return "then: " + " -> ".join(f"{s['step']} " + (f"job {s['job_id']} ({s['when']})" if s.get("job_id") else
                                                    f"({s['when']}, the local queue)") for s in chain)


def submit(p) -> dict:
    """Submit a prepared run that has steps (`after:`): Slurm, the training job then the chain; local, the local
    queue (training, then the steps). Returns the run's registry entry."""
    check_paths(p.recipe.resolved)
    if p.executor == "slurm":
        return submit_mod.submit(p, start=lambda run_dir, info: _start_held(run_dir, info, p.recipe.resolved))
    info = submit_mod.create(p, pipeline=local_chain(p.recipe.resolved))
    started = local_queue.start(p.run_dir, [p.run_dir], 1)[0]
    entry = submit_mod.record(p, info, started)
    local_queue.release(p.run_dir)
    return entry
