"""Run ids and run directories (docs/contract.md §2): the files a submit leaves behind, and provenance."""
from __future__ import annotations

import datetime as _dt
import getpass
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import primus_contract
from primus_contract import run_files

RUN_JSON = run_files.RUN_JSON


def new_run_id(now: _dt.datetime | None = None) -> str:
    """`<UTC yyyymmdd-HHMMSS>-<6 random hex>`."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def run_dir_for(resolved: dict, run_id: str, base: str | None = None) -> Path:
    """`<workspace>/<experiment.name>/<run-id>`, absolute (workspace relative to `base` or the cwd)."""
    exp = resolved["experiment"]
    workspace = Path(os.path.expanduser(exp["workspace"]))
    if not workspace.is_absolute():
        workspace = Path(base or os.getcwd()) / workspace
    return (workspace / exp["name"] / run_id).resolve()


def trainer_source_dir() -> Path:
    """The directory of the `trainer` package, found without importing it (it imports torch)."""
    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the trainer package is not importable from this environment")
    return Path(list(spec.submodule_search_locations)[0])


def git_provenance(path: Path) -> dict:
    """{'git_sha', 'git_dirty'} of the checkout holding `path`; both None outside a git checkout."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if sha is None:
        return {"git_sha": None, "git_dirty": None}
    porcelain = git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha.strip(), "git_dirty": bool(porcelain and porcelain.strip())}


def create_run_dir(run_dir: Path, script: str, raw_yaml: str, resolved_yaml: str) -> None:
    """Write job.sbatch, recipe.yaml, recipe.resolved.yaml, the trainer snapshot and logs/."""
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "logs").mkdir()
    (run_dir / run_files.JOB_SCRIPT).write_text(script)
    (run_dir / run_files.RECIPE).write_text(raw_yaml)
    (run_dir / run_files.RESOLVED).write_text(resolved_yaml)
    snapshot_code(run_dir / run_files.CODE)


def snapshot_code(code_dir: Path) -> None:
    """The trainer's source and the contract it imports, copied into code_dir (a job runs from its own snapshot)."""
    for source in (trainer_source_dir(), Path(primus_contract.__file__).parent):
        shutil.copytree(source, code_dir / source.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def provenance(resolved: dict, recipe_hash: str, run_id: str, executor: str) -> dict:
    """The run.json fields known before submission (job id and pid are added after)."""
    return {
        "run_id": run_id,
        "name": resolved["experiment"]["name"],
        "executor": executor,
        "recipe_hash": recipe_hash,
        "user": getpass.getuser(),
        "submit_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "stall_minutes": float((resolved.get("cluster") or {}).get("stall_minutes") or 30),
        "train_iters": ((resolved.get("trainer") or {}).get("schedule") or {}).get("train_iters"),
        **git_provenance(trainer_source_dir()),
    }


def write_run_json(run_dir: Path, info: dict) -> None:
    tmp = run_dir / (RUN_JSON + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / RUN_JSON)


def read_run_json(run_dir: Path) -> dict:
    try:
        info = json.loads((Path(run_dir) / RUN_JSON).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}  # a run.json edited into a list or a number: no fields
