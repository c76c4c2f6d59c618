"""Render the job script (sbatch for Slurm, plain bash for the local executor) from a resolved recipe."""
from __future__ import annotations

import shlex
import sys
from functools import lru_cache

import jinja2
import yaml

from primus_contract.rules_data import uses_hub
from primus_contract.rules_model import nproc_per_node
from primus_slurm.errors import UserError
from primus_slurm.jobs.executors import concrete_executor, executor_for
from primus_slurm.nodes import ledger as nodes_ledger
from primus_slurm.resources import templates_dir
from primus_slurm.config.validate import WORKSPACE_RE

TEMPLATE = "job.sh.j2"
# Variables the script itself exports (and srun's task rank, which the preflight reads); containers that do not
# inherit the host environment get them by name.
SCRIPT_VARS = ("PRIMUS_RUN_DIR", "PRIMUS_RUN_ID", "SLURM_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
               "PRIMUS_CONTAINER_RUNTIME", "PRIMUS_CONTAINER_IMAGE", "SLURM_PROCID",
               "SLURMD_NODENAME",  # (the node a fault names is Slurm's name, not the container's hostname)
               "OMP_NUM_THREADS")  # (a CPU-only job's threads per rank, which the script sets from Slurm's CPUs)
# No progress bars in job logs: transformers' weight loading and huggingface_hub go through huggingface_hub's
# switch, anything else through tqdm's own environment default.
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
JIT_VARS = {"nvidia": ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"),
            "amd": ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")}


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - shell, not HTML: every recipe value goes through the `q` filter
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


@lru_cache(maxsize=1)
def profiles() -> dict:
    return yaml.safe_load((templates_dir() / "profiles.yaml").read_text())


def sbatch_lines(resolved: dict, run_dir: str) -> list[str]:
    c, name = resolved["cluster"], resolved["experiment"]["name"]
    lines = [f"--job-name={name}", f"--nodes={c['nodes']}", "--ntasks-per-node=1"]
    if c["gpus_per_node"]:
        lines.append(f"--gpus-per-node={c['gpus_per_node']}")
    for key in ("cpus_per_task", "mem", "partition", "account", "qos", "reservation", "constraint"):
        if c[key]:
            lines.append(f"--{key.replace('_', '-')}={c[key]}")
    lines.append(f"--time={c['time']}")
    if c["exclusive"]:
        lines.append("--exclusive")
    lines.append("--requeue" if c["requeue"] else "--no-requeue")
    lines.append(f"--signal=B:{c['signal']}@{c['signal_grace_s']}")
    lines += [f"--output={run_dir}/logs/slurm-%j.out", "--open-mode=append"]
    lines += nodes_ledger.exclusion(resolved, slurm=True).args  # the node ledger's excluded nodes and the
    return lines + [x for x in c["extra_sbatch"] if not str(x).startswith("--exclude=")]  # recipe's, in one line


def job_env(resolved: dict) -> dict:
    """The variables the job script exports: no progress bars, the Hub offline unless the recipe names something
    on it (an hf:// tokenizer, an hf_name dataset; primus_contract.rules_data.uses_hub), its env profile's, then
    cluster.env (which may set HF_HUB_OFFLINE itself). A run on the CPU (`trainer.distributed.device: cpu`) on a node
    with GPUs does not see them: the trainer's CPU adaptations of megatron-core (trainer/model/cpu_compat.py) stay
    off wherever CUDA is visible, and without them megatron's CUDA RNG tracker is used by a CPU run (audit,
    2026-12-05: identical dropout masks across TP ranks, a pipeline's buffers on cuda:0)."""
    c = resolved["cluster"]
    offline = {} if uses_hub(resolved["trainer"]) else {"HF_HUB_OFFLINE": "1"}
    hide = {"CUDA_VISIBLE_DEVICES": ""} if resolved["trainer"]["distributed"]["device"] == "cpu" else {}
    return {**QUIET_ENV, **offline, **hide, **profiles()[c["env_profile"]]["env"], **c["env"]}


def job_python(resolved: dict, executor: str) -> str:
    """The interpreter the job runs: cluster.python, where the default `python3` without a container (or with one
    this executor does not use) means the launcher's own, the environment primus-slurm (and torch) were installed
    into (on Slurm that assumes a filesystem the nodes share; set cluster.python otherwise). submit writes it
    into the resolved recipe, so `validate --json` and recipe.resolved.yaml show what runs."""
    c = resolved["cluster"]
    runtime = c["container"]["runtime"]
    if c["python"] == "python3" and (runtime == "none" or executor_for(executor).container_unused(runtime)):
        return sys.executable
    return c["python"]


def check_run_dir(run_dir: str) -> None:
    """A run directory lands unquoted in #SBATCH lines (symlinks already resolved): a plain absolute path only."""
    if not WORKSPACE_RE.match(run_dir):
        raise UserError(f"the run directory {run_dir!r} must be an absolute path of letters, digits and "
                        "./_-+@= (check `experiment.workspace` and the symlinks on its way)")


def render_script(resolved: dict, run_dir: str, run_id: str, executor: str | None = None, template: str = TEMPLATE,
                  extra: dict | None = None) -> str:
    """The job script; `template` may extend job.sh.j2 (post-training jobs), `extra` adds/overrides context."""
    check_run_dir(str(run_dir))
    c = resolved["cluster"]
    executor = executor or concrete_executor(resolved["cluster"]["executor"])
    runner = executor_for(executor)
    profile = profiles()[c["env_profile"]]
    env = job_env(resolved)
    python = job_python(resolved, executor)
    runtime = c["container"]["runtime"]
    context = {
        "run_id": run_id,
        "run_dir": run_dir,
        "executor": executor,
        "slurm": runner.sbatch,
        "sbatch": sbatch_lines(resolved, run_dir) if runner.sbatch else [],
        "runtime": runtime,
        "container_unused": runner.container_unused(runtime),
        "container": c["container"],
        "vendor": profile["vendor"],
        "profile_name": c["env_profile"],
        "env": sorted(env.items()),
        "jit_cache": profile["jit_cache"],
        "secrets": list(c["secrets"]),
        "passthrough": sorted({*env, *SCRIPT_VARS, *(JIT_VARS.get(profile["vendor"], ()) if profile["jit_cache"] else ()), *c["secrets"]}),
        "python": python,
        # the job script's own helpers (the node ledger's settle) run on the host, outside any container
        "host_python": python if runtime == "none" or runner.container_unused(runtime) else "python3",
        "ledger_dir": nodes_ledger.ledger_dir(resolved["experiment"]["workspace"]),
        "nproc_per_node": nproc_per_node(c),
        "entrypoint": c["entrypoint"],
        "requeue": c["requeue"],
        "signal": c["signal"],
    }
    context.update(extra or {})
    return _environment().get_template(template).render(**context)


def render_template(template: str, **context) -> str:
    """Another script from templates/ (its values quoted by its own `q` filters)."""
    return _environment().get_template(template).render(**context)


def render_array(sbatch: list[str], run_dirs: list[str], sweep_id: str) -> str:
    """A sweep's job array script (templates/array.sh.j2): task K execs the job script of `run_dirs[K]`."""
    for run_dir in run_dirs:
        check_run_dir(run_dir)
    return _environment().get_template("array.sh.j2").render(sbatch=sbatch, run_dirs=run_dirs, sweep_id=sweep_id)
