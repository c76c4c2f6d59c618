"""Helpers for the trainer-loop tests (no tests here): a small real resolved recipe from
recipes/quickstart.yaml and a runner for the real `python -m trainer` entry point."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ITER_RE = re.compile(r"\] iteration (\d+)/(\d+) \| lm loss (\S+) \|")
EVAL_RE = re.compile(r"\] eval iteration (\d+) \| eval loss (\S+)")

_BESIDE = ThreadPoolExecutor(4, thread_name_prefix="beside")

SMALL = [
    "trainer.data.seq_length=64",
    "trainer.data.train.limit=96",
    "trainer.data.validation.limit=16",
    "trainer.schedule.micro_batch_size=2",
    "trainer.schedule.global_batch_size=4",
    "trainer.schedule.warmup_iters=2",
    "trainer.schedule.eval_interval=null",
    "trainer.checkpoint.save_interval=null",
    "trainer.checkpoint.export_peft=false",
    "trainer.logging.log_interval=1",
    "trainer.logging.log_avg_skip_iterations=1",
]


def resolved_recipe(tmp_path: Path, *sets: str) -> dict:
    from primus_slurm.config.recipe import load_recipe

    env = dict(os.environ, PRIMUS_WORKSPACE=str(tmp_path / "ws"))
    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml", overrides=[*SMALL, *sets], env=env)
    data = recipe.resolved
    data["trainer"]["data"]["cache_dir"] = str(tmp_path / "cache")
    return data


def write_recipe(tmp_path: Path, *sets: str, name: str = "recipe.resolved.yaml", raw: dict | None = None) -> Path:
    """Resolve the quickstart with `sets`, then apply `raw` {dotted key: value} verbatim (values the
    launcher's validation would refuse, to exercise the trainer's own guards)."""
    data = resolved_recipe(tmp_path, *sets)
    for dotted, value in (raw or {}).items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def trainer_cmd(config: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-W", "ignore", "-m", "trainer", "--config", str(config), "--run-dir", str(run_dir)]


def trainer_env(attempt: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), SLURM_RESTART_COUNT=str(attempt), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def run_trainer(config: Path, run_dir: Path, attempt: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(trainer_cmd(config, run_dir), env=trainer_env(attempt), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def beside(fn, *args, **kwargs) -> Future:
    """fn(*args, **kwargs) started now in a thread, beside what the caller does next; `.result()` waits for it. For
    independent trainer runs: one process of one thread (OMP_NUM_THREADS=1) leaves the second of the machine's two
    cores idle, most of all through its start (imports, model build), so two of them take little more than one."""
    return _BESIDE.submit(fn, *args, **kwargs)


def log_text(run_dir: Path, attempt: int = 0) -> str:
    name = "debug.log" if attempt == 0 else f"debug.attempt-{attempt}.log"
    return (run_dir / "logs" / "rank-0" / name).read_text()


def losses(text: str) -> dict[int, str]:
    """{iteration: lm loss as logged} from a debug log."""
    return {int(m.group(1)): m.group(3) for m in ITER_RE.finditer(text)}


def train_curves(config: Path, run_dir: Path, timeout: int = 600) -> tuple[dict[int, float], dict[int, float], str]:
    """Run the trainer to the end (asserting exit 0): ({iteration: lm loss}, {iteration: eval loss}, debug log)."""
    res = run_trainer(config, run_dir, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    text = log_text(run_dir)
    return ({it: float(v) for it, v in losses(text).items()},
            {int(it): float(v) for it, v in EVAL_RE.findall(text)}, text)
