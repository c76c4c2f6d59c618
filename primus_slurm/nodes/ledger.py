"""The launcher's side of the node ledger (primus_contract/node_ledger.py): which cluster and file, the excluded
nodes that every submission passes to sbatch (`--exclude`), and the refusal when they leave too few nodes.

`submit`, `sweep`, `resume` and pipeline steps all go through `slurm_executor.submit_script`, which takes the
nodes from `exclusion`; the one line that says so is printed once per ledger and process.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import click

from primus_contract import node_ledger
from primus_slurm.errors import UserError

LOCAL_CLUSTER = "local"  # the ledger's name where no Slurm is reachable (`nodes` still shows and edits it)


@lru_cache(maxsize=None)
def cluster_name() -> str:
    """Slurm's ClusterName (the job script's SLURM_CLUSTER_NAME), else `local`. From slurm.conf where
    this node has one (SLURM_CONF, else /etc/slurm/slurm.conf), lower-cased as Slurm keeps it: `scontrol show config`
    waits ~9 s for a controller that is down, and every `validate` / dry run waited with it (2026-12-05). A
    configless node (no slurm.conf) asks scontrol."""
    if not shutil.which("scontrol"):
        return LOCAL_CLUSTER
    try:
        name = _cluster_name_in(Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf").read_text(
            errors="replace"))
    except OSError:
        name = None
    if name:
        return name
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return LOCAL_CLUSTER
    return _cluster_name_in(out.stdout) or LOCAL_CLUSTER


_CLUSTER_NAME = re.compile(r'(?i)(?:^|\s)ClusterName\s*=\s*"?([^\s"#]+)')


def _cluster_name_in(text: str) -> str | None:
    """ClusterName in slurm.conf's text (several KEY=VALUE may share a line; the value may be quoted) or in
    `scontrol show config`'s (`ClusterName = x`), lower-cased as Slurm keeps it."""
    for raw in text.splitlines():
        found = _CLUSTER_NAME.search(raw.split("#", 1)[0])
        if found:
            return found.group(1).lower()
    return None


def ledger_dir(workspace) -> str:
    """Where the ledgers of `workspace` live (one file per cluster)."""
    return os.path.join(os.path.abspath(os.path.expanduser(str(workspace))), node_ledger.DIR)


def path_for(workspace) -> Path:
    return node_ledger.ledger_path(os.path.abspath(os.path.expanduser(str(workspace))), cluster_name())


def append(path: Path, lines: list[str]) -> None:
    """node_ledger.append, a failure as one UserError line (a --workspace that is a file, a read-only one)."""
    try:
        node_ledger.append(path, lines)
    except OSError as exc:
        raise UserError(f"cannot write the node ledger {path} (--workspace): {exc.strerror or exc}") from None


def check_node(node: str) -> str:
    if not node_ledger.NODE_RE.fullmatch(node):
        raise UserError(f"NODE must be one Slurm node name (letters, digits, '.', '_', '-'; at most 64), "
                        f"got {node!r:.80}")
    return node


@dataclass(frozen=True)
class Exclusion:
    ledger: Path
    nodes: tuple[str, ...]   # the ledger's excluded nodes and the recipe's own --exclude, as sbatch gets them

    @property
    def args(self) -> list[str]:
        """sbatch's --exclude for these nodes (none when there are none)."""
        return [f"--exclude={','.join(self.nodes)}"] if self.nodes else []


def _own_excludes(extra_sbatch: list) -> list[str]:
    """The nodes a recipe's cluster.extra_sbatch already excludes (`--exclude=a,b`): a command-line --exclude
    replaces the script's, so both are merged."""
    out = []
    for item in extra_sbatch or []:
        if str(item).startswith("--exclude="):
            out += [n for n in str(item).split("=", 1)[1].split(",") if n]
    return out


def exclusion(resolved: dict, slurm: bool | None = None) -> Exclusion:
    """What a Slurm job of `resolved` excludes (nothing for the local executor); `slurm` when the caller knows."""
    path = path_for(resolved["experiment"]["workspace"])
    if not (resolved["cluster"]["executor"] == "slurm" if slurm is None else slurm):
        return Exclusion(path, ())
    nodes = sorted(set(node_ledger.excluded(path)) | set(_own_excludes(resolved["cluster"]["extra_sbatch"])))
    return Exclusion(path, tuple(nodes))


@lru_cache(maxsize=None)  # (a sweep checks every trial)
def partition_nodes(partition: str | None) -> tuple[str, ...] | None:
    """Every node of `partition` (the default one when None), from sinfo; None when sinfo cannot tell."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    nodes = []
    for raw in out.stdout.splitlines():
        parts = raw.split()
        if len(parts) == 2 and (parts[1].rstrip("*") == partition if partition else parts[1].endswith("*")):
            nodes.append(parts[0])
    return tuple(sorted(set(nodes))) or None


def check_placement(resolved: dict) -> Exclusion:
    """UserError when the excluded nodes leave the partition fewer nodes than the job needs; the exclusion."""
    ex = exclusion(resolved)
    if not ex.nodes:
        return ex
    c = resolved["cluster"]
    nodes = partition_nodes(c["partition"] or None)
    if nodes is None:
        return ex
    left = [n for n in nodes if n not in ex.nodes]
    if len(left) < c["nodes"]:
        where = f"partition {c['partition']}" if c["partition"] else "the default partition"
        raise UserError(f"`cluster.nodes` is {c['nodes']}, but {where} has {len(left)} of its {len(nodes)} nodes "
                        f"left without the excluded {','.join(ex.nodes)} (node ledger {ex.ledger}; "
                        "`primus-slurm nodes clear NODE` puts one back)")
    return ex


@lru_cache(maxsize=None)
def announce(nodes: tuple[str, ...]) -> None:
    """The one line a submission that excludes nodes prints (once per process for the same nodes)."""
    click.echo(f"excluding nodes {','.join(nodes)} (sbatch --exclude: the node ledger's and the recipe's; "
               "`primus-slurm nodes` lists them)", err=True)


def excluded_in(script: str, args: list[str]) -> tuple[str, ...]:
    """The nodes a script (its #SBATCH --exclude line) and sbatch `args` exclude; the arguments win, as in sbatch."""
    found = [line[len("#SBATCH --exclude="):] for line in script.splitlines() if line.startswith("#SBATCH --exclude=")]
    found += [a[len("--exclude="):] for a in args if a.startswith("--exclude=")]
    return tuple(n for n in (found[-1] if found else "").split(",") if n)
