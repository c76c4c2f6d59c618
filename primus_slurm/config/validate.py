"""The launcher's side of the contract: the rules only the launcher needs (sbatch flags, container, secrets,
shell-facing values), then primus_contract's rules, which the trainer runs again at start. Each raises one
UserError naming the field."""
from __future__ import annotations

import re

import primus_contract
from primus_contract.fields import ALWAYS_SECRET, ENV_NAME_RE
from primus_slurm.errors import UserError, from_contract

SBATCH_FLAG_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:@%/+=&|\[\]*!-]+)?$")
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.,&|\[\]*()!:-]+$")
MOUNT_RE = re.compile(r"^/[^:,\s]*:/[^:,\s]*(:(ro|rw))?$")
# (the first character: never '-', which the runtime would take for an option: audit, 2026-12-06)
IMAGE_RE = re.compile(r"^[A-Za-z0-9/][A-Za-z0-9_./:@+#-]*$")
# container options that set the environment: values there land in the job script and the container's config
# (-ie: docker's and podman's short options combine, and -e takes the next argument; audit, 2026-12-07)
ENV_ARG_RE = re.compile(r"^(--env|-[A-Za-z]*e)")
# srun options the pyxis step sets itself (its container.extra_args go to srun): the step's shape, the environment
# (--export: a secret there lands in the script), the warning signal (never SIGUSR1: NCCL's), the step's files
MANAGED_SRUN = ("nodes", "ntasks", "ntasks-per-node", "kill-on-bad-exit", "cpu-bind", "export", "signal",
                "container-image", "container-mounts", "container-workdir", "container-env", "dependency",
                "job-name", "output", "error", "input", "open-mode", "chdir")
MANAGED_SRUN_SHORT = "NnKdJoeiD"  # their one-letter forms (-N nodes, -n ntasks, -K, -d, -J, -o, -e, -i, -D)
WORKSPACE_RE = re.compile(r"^/[A-Za-z0-9_./+@=-]*$")  # (no comma: container mount lists are comma-separated)
# sbatch options the job script sets itself; sbatch also takes any unambiguous prefix (--sig=, --out=)
MANAGED_SBATCH = ("job-name", "nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "mem", "partition",
                  "account", "qos", "reservation", "constraint", "time", "exclusive", "requeue", "no-requeue", "signal",
                  "output", "error", "open-mode", "export",
                  # the job's shape, which pipeline steps inherit (audit, 2026-12-06): `sweep` makes the arrays,
                  # --then the dependencies
                  "array", "dependency", "kill-on-invalid-dep", "wrap", "chdir", "parsable")
# variables the job script itself sets or relies on, and shell variables that change how it parses
RESERVED_ENV = ("BIND", "CHILD", "CONTAINER", "JOB_ID", "LAUNCH", "MASTER_ADDR", "MASTER_PORT", "NNODES",
                "NODE_WRAPPER", "REQUEUE", "RUN_DIR", "SELF_ID", "SRUN", "TRAIN", "PYTHONPATH", "IFS", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS",
                "CDPATH", "GLOBIGNORE", "PROMPT_COMMAND", "PATH")  # (PATH: scontrol and srun; values are literal)
RESERVED_ENV_PREFIXES = ("SLURM_", "PRIMUS_RUN_")


def fail(msg: str) -> None:
    raise UserError(msg)


def validate(r: dict) -> None:
    _cluster(r["cluster"], r["experiment"])
    with from_contract():
        primus_contract.check(r)


def slurm_seconds(time: str) -> int:
    """Seconds of a Slurm time limit: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]."""
    days, _, rest = time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
        return ((int(days) * 24 + h) * 60 + m) * 60 + sec
    if len(parts) == 3:
        return (parts[0] * 60 + parts[1]) * 60 + parts[2]
    return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0)


def check_time_limit(c: dict, executor: str) -> None:
    """A Slurm job warned `signal_grace_s` before its end must have a longer limit (load_recipe checks an explicit
    slurm executor, submit.prepare the one `auto` resolves to)."""
    if executor == "slurm" and 0 < slurm_seconds(c["time"]) <= c["signal_grace_s"]:  # 0: no limit
        fail(f"`cluster.signal_grace_s` ({c['signal_grace_s']} s) is not shorter than `cluster.time` ({c['time']}): "
             "the time-limit warning would come at the start, and every attempt would stop and requeue at once; "
             "use a longer time or a smaller grace")


def _managed(flag: str, names: tuple) -> str:
    """'--name (--option)' when the long option `flag` names or abbreviates one of `names` (sbatch and srun take any
    unambiguous prefix: --sig= is --signal=); '' otherwise."""
    name = flag.split("=")[0][2:] if flag.startswith("--") else ""
    hit = next((m for m in names if name and m.startswith(name)), None)
    return f"--{name} (--{hit})" if hit else ""


def sets_option(flags: list, option: str) -> bool:
    """Whether one of `flags` (cluster.extra_sbatch) is sbatch's `--option`, or a prefix sbatch takes for it."""
    return any(_managed(str(flag), (option,)) for flag in flags)


def _extra_args(cont: dict, secrets: set) -> None:
    """container.extra_args go to the runtime (srun's options under pyxis) as written into the job script: no
    secret, no environment (cluster.env and cluster.secrets carry it), and under pyxis none of the srun options the
    step sets itself (srun, like sbatch, takes any unambiguous prefix)."""
    for i, arg in enumerate(str(a) for a in cont["extra_args"]):
        field = f"`cluster.container.extra_args[{i}]`"
        leaked = [name for name in sorted(secrets) if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}=", arg)]
        if leaked:
            fail(f"{field} would write the secret {leaked[0]} into the job script; list it in cluster.secrets and "
                 "export it in your shell instead")
        if ENV_ARG_RE.match(arg):
            fail(f"{field} is {arg!r:.40}: the environment goes in through cluster.env, and secrets through "
                 "cluster.secrets (a value here is written into the job script and the container's configuration)")
        said = _managed(arg, MANAGED_SRUN)
        if not arg.startswith("--") and len(arg) > 1 and arg[0] == "-" and arg[1] in MANAGED_SRUN_SHORT:
            said = f"-{arg[1]}"
        if cont["runtime"] == "pyxis" and said:
            fail(f"{field} sets srun's {said}, which the job script sets for the pyxis step; use the cluster.* "
                 "field instead")


def _cluster(c: dict, exp: dict) -> None:
    check_time_limit(c, c["executor"])
    if not WORKSPACE_RE.match(exp["workspace"]):
        fail(f"`experiment.workspace` resolves to {exp['workspace']!r}; use a path of letters, digits and ./_-+@=")
    for i, flag in enumerate(c["extra_sbatch"]):
        if not SBATCH_FLAG_RE.match(flag):
            fail(f"`cluster.extra_sbatch[{i}]` is {flag!r:.60}; expected one '--flag' or '--flag=value' "
                 "(letters, digits and _.,:@%/+=&|[]*!-)")
        said = _managed(flag, MANAGED_SBATCH)
        if said:
            fail(f"`cluster.extra_sbatch[{i}]` sets {said}, which primus-slurm manages; use the cluster.* field "
                 "instead")
    if c["constraint"] and not CONSTRAINT_RE.match(c["constraint"]):
        fail(f"`cluster.constraint` is {c['constraint']!r:.60}; expected a Slurm feature expression")
    cont = c["container"]
    if cont["runtime"] != "none" and not cont["image"]:
        fail(f"`cluster.container.image` is required when `cluster.container.runtime` is {cont['runtime']}")
    if cont["image"] and not IMAGE_RE.match(cont["image"]):
        fail(f"`cluster.container.image` is {cont['image']!r:.60}; expected an image reference or path")
    if cont["runtime"] in ("docker", "podman") and c["gpus_per_node"] and not c["exclusive"] and c["executor"] != "local":
        fail(f"`cluster.container.runtime` {cont['runtime']} gives the container every GPU of the node (its daemon is "
             "outside the job's cgroup), so with `cluster.exclusive: false` it would use GPUs Slurm gave to other "
             "jobs; set exclusive: true, or use pyxis or apptainer")
    if cont["runtime"] in ("docker", "podman", "apptainer") and "#" in (cont["image"] or ""):
        fail(f"`cluster.container.image` {cont['image']!r:.80} uses pyxis/enroot's registry#image form; "
             f"{cont['runtime']} needs registry/image (e.g. nvcr.io/nvidia/pytorch:25.09-py3)")
    if cont["runtime"] == "apptainer" and cont["image"] and not cont["image"].startswith(("/", "docker://", "oras://")):
        fail(f"`cluster.container.image` is {cont['image']!r:.80}; apptainer needs a .sif path or a "
             "docker://registry/image (or oras://) reference")
    _extra_args(cont, set(c["secrets"]) | set(ALWAYS_SECRET))
    for i, m in enumerate(cont["mounts"]):
        if not MOUNT_RE.match(m):
            fail(f"`cluster.container.mounts[{i}]` is {m!r:.60}; expected '/host/path:/container/path[:ro|rw]'")
    for i, name in enumerate(c["secrets"]):
        if not ENV_NAME_RE.match(name):
            fail(f"`cluster.secrets[{i}]` is {name!r:.60}; expected an environment variable name")
    for key in c["env"]:
        if key in c["secrets"] or key in ALWAYS_SECRET:
            fail(f"`cluster.env.{key}` would write the secret {key} into the job script; list it in "
                 "cluster.secrets and export it in your shell instead")
        if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
            fail(f"`cluster.env.{key}` is a variable the job script sets or relies on; choose another name")
    if c["executor"] == "local" and c["nodes"] > 1:
        fail(f"`cluster.nodes` is {c['nodes']} but `cluster.executor` is local; the local executor runs one node")
