"""`primus-slurm nodes`: the node ledger (primus_contract/node_ledger.py) shown and edited by hand, and
`nodes check` (check.py). `cli.py` calls `register(group)`."""
from __future__ import annotations

import datetime as _dt
import getpass
import json

import click

from primus_contract import node_ledger
from primus_slurm.errors import UserError
from primus_slurm.nodes import check as check_mod
from primus_slurm.nodes import ledger

WORKSPACE = click.option("--workspace", default="./runs", show_default=True,
                         help="the experiment.workspace whose node ledger to use (one ledger per cluster in it)")


def _when(t: float) -> str:
    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _reason(reason: str | None, required: bool) -> str:
    text = (reason or "").strip()
    if required and not text:
        raise UserError("--reason is required: say why the node is excluded (it is kept in the ledger)")
    if "\n" in text or "\r" in text or len(text) > 300:
        raise UserError("--reason must be one line of at most 300 characters")
    return text


@click.group("nodes", invoke_without_command=True)
@WORKSPACE
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def nodes(ctx: click.Context, workspace: str, as_json: bool) -> None:
    """The node ledger of this cluster: each node a run or a check named (suspect), or that is kept out of every
    job (excluded: by hand, or after two strikes). `nodes check` checks nodes; `exclude` / `clear` edit it."""
    if ctx.invoked_subcommand is not None:
        return
    path = ledger.path_for(workspace)
    states = sorted(node_ledger.fold(node_ledger.read(path)).values(), key=lambda n: n.node)
    if as_json:
        click.echo(json.dumps({"ledger": str(path), "nodes": [n.as_dict() for n in states]}, indent=2))
        return
    if not states:
        click.echo(f"no nodes in the ledger {path}")
        return
    rows = [("NODE", "STATE", "SINCE", "STRIKES", "WHY", "BY")]
    rows += [(n.node, n.state, _when(n.since), str(len(n.strikes)), n.why, n.by) for n in states]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        click.echo("  ".join(f"{v:<{w}}" for v, w in zip(r[:4], widths)) + f"  {r[4]}  ({r[5]})")
    click.echo(f"ledger: {path}")


@nodes.command("exclude")
@click.argument("node")
@click.option("--reason", required=True, help="why (kept in the ledger)")
@WORKSPACE
def exclude_cmd(node: str, reason: str, workspace: str) -> None:
    """Keep NODE out of every job submitted from now on (sbatch --exclude), until `nodes clear NODE`."""
    ledger.check_node(node)
    why = _reason(reason, True)
    path = ledger.path_for(workspace)
    ledger.append(path, [node_ledger.line(node, "excluded", why, f"hand ({getpass.getuser()})")])
    click.echo(f"{node} excluded ({why}); ledger {path}")


@nodes.command("clear")
@click.argument("node")
@click.option("--reason", default="", help="why (kept in the ledger)")
@WORKSPACE
def clear_cmd(node: str, reason: str, workspace: str) -> None:
    """Put NODE back: ok, its strikes forgotten."""
    ledger.check_node(node)
    why = _reason(reason, False) or "cleared by hand"
    path = ledger.path_for(workspace)
    known = node_ledger.fold(node_ledger.read(path))
    if node not in known:
        raise UserError(f"node {node} is not in the ledger {path} (`primus-slurm nodes` lists it)")
    ledger.append(path, [node_ledger.line(node, "cleared", why, f"hand ({getpass.getuser()})")])
    click.echo(f"{node} cleared (was {known[node].state}); ledger {path}")


@nodes.command("check")
@click.option("--nodes", "count", type=click.IntRange(1, 4096), default=None, help="how many nodes (default 1)")
@click.option("--nodelist", default=None, help="these nodes (a Slurm host list, e.g. node[1-4])")
@click.option("--partition", default=None, help="the partition (default: Slurm's)")
@click.option("--gpus-per-node", type=click.IntRange(0, 64), default=0, show_default=True,
              help="GPUs to ask for on each node (0: none asked; the check uses those it sees)")
@click.option("--exclusive", is_flag=True, help="whole nodes (nothing else running beside the check)")
@click.option("--timeout", type=click.FloatRange(30, 3600), default=300.0, show_default=True,
              help="seconds to wait for the check job")
@click.option("--python", "python", default=None, help="the interpreter on the nodes (default: this one)")
@click.option("--local", is_flag=True, help="check this machine, without Slurm (per-node figures only)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@WORKSPACE
def check_cmd(count, nodelist, partition, gpus_per_node, exclusive, timeout, python, local, as_json,
              workspace) -> None:
    """Check nodes with a short job, one task a node: a timed GEMM against the GPU's expected rate, free GPU
    memory, the GPU error counters, local disk, the shared filesystem; across nodes an all-reduce and each link
    of a ring. One line a node (ok / slow / failed); exit 0 when all are ok, 3 otherwise."""
    spec = check_mod.CheckSpec(count, nodelist, partition, gpus_per_node, exclusive, timeout,
                               python or check_mod.default_python(), workspace, local)
    raise click.exceptions.Exit(check_mod.run(spec, as_json))


def register(group: click.Group) -> None:
    group.add_command(nodes)
