"""Post-training jobs (`export`, `generate`, `eval`) on a run: checks, the job script, running it, its records.

A post job is templates/post.sh.j2 (job.sh.j2 with `python -m trainer.post KIND ...` instead of torchrun + the
trainer: the same environment, container and signal handling) rendered from the run's resolved recipe, on one
node without requeue. It lives in `<run_dir>/<exports|generations|evals>/<id>/`: job.sh, a snapshot of the
trainer and the contract it imports (code/), the job's output (job.out locally, slurm-<jobid>.out on Slurm),
post.json (what ran, where, exit code) and result.json (written by the job). `status RUN` lists them (results()).
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from primus_contract.restore_rules import random_base_refusal
from primus_contract.rules_precision import run_device
from primus_slurm.jobs import executors, registry, runs
from primus_slurm.errors import UserError
from primus_slurm.config.render import render_script, sbatch_lines

KINDS = {"export": "exports", "generate": "generations", "eval": "evals"}


@dataclass
class PostJob:
    kind: str
    entry: dict
    run_dir: Path
    resolved: dict
    executor: str
    post_id: str
    args: list = field(default_factory=list)
    copies: dict = field(default_factory=dict)  # name in the job directory -> file to copy there

    @property
    def post_dir(self) -> Path:
        return self.run_dir / KINDS[self.kind] / self.post_id

    @property
    def runner(self) -> executors.Executor:
        return executors.executor_for(self.executor)


def open_run(ref: str) -> tuple[dict, Path, dict]:
    """(registry entry, run directory, resolved recipe) of RUN; UserError when it is not a run."""
    entry = registry.find(ref)
    run_dir = Path(entry["run_dir"])
    try:
        resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    except (OSError, yaml.YAMLError):
        raise UserError(f"RUN '{ref}': {run_dir} has no readable recipe.resolved.yaml (not a run directory?)") \
            from None
    return entry, run_dir, resolved


def check_checkpoint(run_dir: Path, iteration: int | None) -> str:
    """The checkpoint directory name a post job will load (the trainer's layout, docs/contract.md §2)."""
    root = run_dir / "checkpoints"
    saved = sorted(int(p.name[5:]) for p in root.glob("iter_*") if (p / "metadata.json").is_file()) \
        if root.is_dir() else []
    if iteration is None:
        try:
            name = (root / "latest").read_text().strip()
        except OSError:
            raise UserError(f"run {run_dir.name} has no checkpoint yet ({root}/latest is missing)") from None
        if not (root / name / "metadata.json").is_file():
            raise UserError(f"{root}/latest names '{name}', which is not a complete checkpoint")
        return name
    name = f"iter_{iteration:07d}"
    if not (root / name / "metadata.json").is_file():
        raise UserError(f"--checkpoint {iteration}: run {run_dir.name} has no complete checkpoint {name} "
                        f"(saved iterations: {', '.join(map(str, saved)) or 'none'})")
    return name


def check_layout(run_dir: Path, name: str, resolved: dict) -> None:
    """A post job runs at tensor parallel 1: a checkpoint the job could not restore there is refused here, by the same
    rule (primus_contract/restore_rules.py)."""
    try:
        meta = json.loads((run_dir / "checkpoints" / name / "metadata.json").read_text())
        tensor, expert = int(meta.get("tensor", 1)), int(meta.get("expert", 1))
    except (OSError, ValueError, TypeError, AttributeError):
        return  # the job reads it and says what is wrong
    profile = (resolved.get("cluster") or {}).get("env_profile", "none")
    device = run_device(resolved["trainer"], profile)  # (env profile cpu: device auto runs on the CPU)
    why = random_base_refusal(tensor, 1, bool(pretrained(resolved)), device, expert, 1)
    if why:
        raise UserError(f"checkpoint {name} was {why} (a post job runs at tensor and expert parallel 1)")


def pretrained(resolved: dict) -> str | None:
    return ((resolved.get("trainer") or {}).get("checkpoint") or {}).get("pretrained") or None


def new_job(kind: str, ref: str, executor: str | None) -> PostJob:
    entry, run_dir, resolved = open_run(ref)
    info = {**entry, **runs.read_run_json(run_dir)}
    chosen = executors.resolve_executor(executor or info.get("executor") or resolved["cluster"]["executor"])
    return PostJob(kind, entry, run_dir, resolved, chosen, new_id())


def new_id() -> str:
    """A post job's id: `<UTC yyyymmdd-HHMMSS>-<6 random hex>`."""
    return f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def output_dir(job: PostJob, value: str | None, default_name: str, option: str) -> str | None:
    """An OUT option: None (not asked), '' (the job directory's `default_name`), or a new/empty directory."""
    if value is None:
        return None
    if value == "":
        return str(job.post_dir / default_name)
    path = Path(value).expanduser().resolve()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{option} {value}: exists and is not an empty directory")
    if not path.parent.is_dir():
        what = "is a file" if path.parent.exists() else "does not exist"
        raise UserError(f"{option} {value}: its parent directory {path.parent} {what}")
    return str(path)


def script(job: PostJob, sbatch_extra: tuple = (), gpus: int | None = None) -> str:
    """The job script: the run's recipe on one node, no requeue, its output in the job directory; `sbatch_extra`
    (a pipeline step's dependency) and `gpus` (per node, where the step needs other than the run's) for Slurm."""
    resolved = copy.deepcopy(job.resolved)
    c = resolved["cluster"]
    if gpus is not None:  # a step without a GPU (export) takes no whole node either
        c.update(gpus_per_node=gpus, exclusive=c["exclusive"] and gpus > 0)
    c.update(nodes=1, requeue=False)
    resolved["experiment"]["name"] = f"{resolved['experiment']['name']}-{job.kind}"[:64]
    lines = [f"--output={job.post_dir}/slurm-%j.out" if line.startswith("--output=") else line
             for line in sbatch_lines(resolved, str(job.run_dir))] + list(sbatch_extra)
    extra = {"post_dir": str(job.post_dir), "post_kind": job.kind, "post_args": [str(a) for a in job.args],
             "requeue": False, "nproc_per_node": 1}
    if job.runner.sbatch:
        extra["sbatch"] = lines
    return render_script(resolved, str(job.run_dir), job.entry["run_id"], job.executor, template="post.sh.j2",
                         extra=extra)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def launch(job: PostJob, out=sys.stdout) -> tuple[int, dict]:
    """Create the job directory, run the job (local: in the foreground; Slurm: submit and follow its output),
    record its exit code. Returns (exit code, result.json or {})."""
    record = create(job, script(job))

    def submitted(job_id: str) -> None:  # a queued job: its id is on record while it waits and runs
        set_job_id(job, record, job_id)
        out.write(f"submitted {job.kind} job {job_id} for run {job.entry['run_id']} ({job.post_dir})\n")
        out.flush()

    record["job_id"], rc = job.runner.run_post(job.post_dir, out, submitted)
    record["exit_code"] = rc
    _write_json(job.post_dir / "post.json", record)
    return rc, read_json(job.post_dir / "result.json")


def create(job: PostJob, text: str) -> dict:
    """The job directory: the trainer snapshot, the copied inputs, job.sh (`text`), post.json; its record."""
    d = job.post_dir
    try:
        d.mkdir(parents=True)
        # the contract too: the run's own snapshot (after this one on PYTHONPATH) is as old as the run
        runs.snapshot_code(d / "code")
    except OSError as exc:
        raise UserError(f"cannot create {d}: {exc.strerror or exc}") from None
    for name, src in job.copies.items():
        try:
            shutil.copyfile(src, d / name)
        except OSError as exc:  # (read at submit, so rare: gone or unreadable since) nothing of the job is left
            shutil.rmtree(d, ignore_errors=True)
            raise UserError(f"cannot copy {src} into the job: {exc.strerror or exc}") from None
    (d / "job.sh").write_text(text)
    record = {"kind": job.kind, "id": job.post_id, "run_id": job.entry["run_id"], "executor": job.executor,
              "args": job.args, "submit_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    _write_json(d / "post.json", record)
    return record


def set_job_id(job: PostJob, record: dict, job_id: str) -> None:
    record["job_id"] = job_id
    _write_json(job.post_dir / "post.json", record)


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def results(run_dir: Path) -> list[dict]:
    """Every post job of a run, oldest first: {kind, id, state, summary, path, job_id, exit_code}."""
    rows = []
    for kind, sub in KINDS.items():
        for d in sorted((Path(run_dir) / sub).glob("*/post.json")):
            rec, res = read_json(d), read_json(d.parent / "result.json")
            code = rec.get("exit_code")
            state = "COMPLETED" if res and code in (0, None) else ("FAILED" if code not in (None, 0) else "RUNNING")
            rows.append({"kind": kind, "id": rec.get("id", d.parent.name), "state": state, "exit_code": code,
                         "job_id": rec.get("job_id"), "executor": rec.get("executor"), "path": str(d.parent),
                         "summary": res.get("summary")})
    return sorted(rows, key=lambda r: r["id"])
