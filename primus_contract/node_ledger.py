"""The node ledger: which nodes of a cluster are ok, suspect or excluded, when, why and by whom. One file per
cluster under the workspace, `<workspace>/.nodes/<cluster>.jsonl`, one JSON object a line, only ever appended:

    {"t": 1764892800.0, "node": "node2", "state": "suspect", "why": "...", "by": "run 20261204-... attempt 0"}

`state` is what the line says happened: `suspect` (a run or `nodes check` named the node), `excluded` (by hand,
`primus-slurm nodes exclude`), `cleared` (by hand, `nodes clear`). `fold` turns the lines into each node's state:
a node is excluded by hand, or by STRIKES suspect lines from different runs/checks since it was last cleared.

Written by the launcher (`nodes exclude/clear`, `nodes check`) and by the job (`primus_contract.node_faults`
settles an attempt's faults into it); read by `submit`, `sweep`, `resume` and pipelines, which pass the excluded
nodes to sbatch's --exclude. Standard library only: the job runs this from `<run_dir>/code`.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from primus_contract.run_files import json_objects

STRIKES = 2  # suspect lines (from different runs or checks) that exclude a node
DIR = ".nodes"
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a Slurm node name (no hostlist brackets)
STATES = ("suspect", "excluded", "cleared")


def ledger_path(workspace, cluster: str) -> Path:
    """The ledger of `cluster` (Slurm's ClusterName) under `workspace` (experiment.workspace)."""
    return Path(workspace) / DIR / f"{cluster}.jsonl"


def line(node: str, state: str, why: str, by: str, t: float | None = None) -> str:
    if state not in STATES:
        raise ValueError(f"ledger state {state!r}: one of {', '.join(STATES)}")
    why = " ".join(str(why).split())[:300]
    return json.dumps({"t": round(time.time() if t is None else t, 3), "node": node, "state": state, "why": why,
                       "by": by})


def append(path, lines: list[str]) -> None:
    """Append whole lines in one write (O_APPEND: concurrent writers never interleave inside a line)."""
    if not lines:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(text + "\n" for text in lines).encode())
    finally:
        os.close(fd)


@dataclass
class NodeState:
    node: str
    state: str = "ok"              # ok, suspect, excluded
    since: float = 0.0             # when it entered that state
    why: str = ""
    by: str = ""
    strikes: list[str] = field(default_factory=list)  # the `by` of each suspect line since the last clear

    def as_dict(self) -> dict:
        return {"node": self.node, "state": self.state, "since": self.since, "why": self.why, "by": self.by,
                "strikes": len(self.strikes)}


def json_lines(path) -> list[dict]:
    """The JSON objects of a JSON-lines file ([] when it is missing)."""
    try:
        return json_objects(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


def read(path) -> list[dict]:
    """The ledger's well-formed records: a known state, a Slurm node name (NODE_RE: the names reach sbatch's
    --exclude in a rendered script, so a hand-edited line with a newline or a space in it is skipped, never run) and
    a numeric time, if any."""
    return [r for r in json_lines(path) if r.get("state") in STATES and isinstance(r.get("node"), str)
            and NODE_RE.fullmatch(r["node"]) and _number(r.get("t", 0))]


def _number(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def fold(records: list[dict]) -> dict[str, NodeState]:
    """Each node's state after its records, in order."""
    nodes: dict[str, NodeState] = {}
    for rec in records:
        n = nodes.setdefault(rec["node"], NodeState(rec["node"]))
        t, why, by = float(rec.get("t") or 0), str(rec.get("why", "")), str(rec.get("by", ""))
        if rec["state"] == "cleared":
            n.state, n.since, n.why, n.by, n.strikes = "ok", t, why, by, []
        elif rec["state"] == "excluded":
            n.state, n.since, n.why, n.by = "excluded", t, why, by
        elif by not in n.strikes:  # one strike per run attempt or check, however many lines it wrote
            n.strikes.append(by)
            if n.state != "excluded":
                n.state, n.since, n.why, n.by = "suspect", t, why, by
                if len(n.strikes) >= STRIKES:
                    n.state, n.why = "excluded", f"{len(n.strikes)} strikes, the last: {why}"
    return nodes


def excluded(path) -> list[str]:
    """The excluded nodes, sorted."""
    return sorted(n.node for n in fold(read(path)).values() if n.state == "excluded")
