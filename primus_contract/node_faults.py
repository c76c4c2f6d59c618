"""What a run learns about its nodes, and what the job does about it once an attempt has ended.

The job's processes write `<run_dir>/logs/nodes.jsonl` (NODES), one JSON object a line:

    hosts   attempt, node, names, ips        every node at start (the preflight): its host names and addresses
    rank    attempt, rank, node              every rank at start: which node ran which rank
    fault   attempt, node, kind, why, rank   a failure that names a node (KINDS; `slow`: a rank consistently
                                             slower than the others, named once; `timeout`: a peer that a failed
                                             collective named in the job's output, primus_contract/peer_faults.py,
                                             written by `settle`)
    timeout attempt, node, rank, why         a rank whose collective timed out (waiting for another: `stopped`);
                                             `seen: log`: its NCCL watchdog said so in the job's output (`settle`)
    error   attempt, node, rank, why         a rank that failed on its own (not its device, not a collective: a
                                             software error); a peer that then names its node does not blame it
    attempt attempt, nodes, rc, node, why, action   written by `settle` when the attempt's job step has ended

`settle` (run by the job script after every attempt, `python -m primus_contract.node_faults settle ...`) turns the
attempt's faults into suspect lines of the node ledger (primus_contract/node_ledger.py), decides whether the job
is requeued away from them, and prints that decision as one line for the script: `requeue NODES | why` (NODES:
the job's whole new ExcNodeList, comma-separated) or `end | why`. `primus-slurm status RUN` reads the `attempt`
lines (which node ended each attempt, and why) and the `slow` lines.

PRIMUS_FAULT_FILE names a file of injected faults for tests (a node made bad on purpose), one a line:
`KIND NODE [VALUE]`, KIND one of check-slow (the check's GEMM takes VALUE times as long), preflight (the
preflight's node check fails), slow (the rank sleeps VALUE seconds a step), peer-error (the preflight prints NCCL's
warning that host VALUE closed the connection, and fails); NODE is a node name or `first` (the first node that
reads the line, recorded beside the file in `<file>.first`). Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from primus_contract import node_ledger, peer_faults
from primus_contract.run_files import NODES
# A fault of these kinds names its node by itself: the node's GPU failed (a CUDA/HIP error, the preflight's device
# check), a collective timed out waiting for that node's rank, the node's ranks stopped (`stopped`: a hang), or a
# rank there was consistently slower than the others (trainer/observability/stragglers.py).
NODE_KINDS = ("device", "timeout", "hang", "slow")
# A preflight failure (the interpreter's stack) names a node only when other nodes of the same attempt passed it:
# when every node fails, the image or recipe is wrong, not a node.
SHARED_KINDS = ("preflight",)
KINDS = NODE_KINDS + SHARED_KINDS
WAIT_SPREAD_S = 2.0  # timeouts of ranks waiting in the same collective, apart (`stopped`)
MAX_NODE_REQUEUES = 3  # requeues away from suspect nodes per run; then the job ends (a fleet-wide problem)
EXIT_STOPPED = 75  # the trainer checkpointed and stopped (trainer/runtime/signals.py EXIT_PREEMPTED)
# An attempt that ended on purpose: the trainer's own decisions (trainer/runtime/signals.py: 2 config or data, 3
# diverged, 4 checkpoint failed), or a stop signal that reached the job script (settle's `stopped`: a cancel, the
# time-limit warning). Its ranks end one after another and their peers' sockets close as they go ("Connection closed
# by remote peer"): a peer named in its output says nothing about that peer's node, so settle does not read it. (Not
# by exit code alone: when one node's task fails, srun ends the others with SIGTERM, and the job's code can be
# theirs, 143, or a stopped trainer's 75.)
ENDED_ON_PURPOSE = (0, 2, 3, 4)
FAULT_ENV = "PRIMUS_FAULT_FILE"


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def record(run_dir, event: str, **fields) -> None:
    """Append one line to the run's NODES file (any rank, any node: one write, O_APPEND)."""
    rec = {"event": event, "t": round(time.time(), 3), **fields}
    try:
        node_ledger.append(Path(run_dir) / NODES, [json.dumps(rec, default=str)])
    except OSError:
        pass  # a run directory that cannot be written to has bigger news; never fail the job over this


def read(run_dir) -> list[dict]:
    return [r for r in node_ledger.json_lines(Path(run_dir) / NODES) if isinstance(r.get("event"), str)]


def suspects(records: list[dict], attempt: int, job_nodes: list[str]) -> dict[str, str]:
    """{node: why} that this attempt's faults name (see NODE_KINDS / SHARED_KINDS)."""
    faults = [r for r in records if r.get("event") == "fault" and r.get("attempt") == attempt
              and r.get("kind") in KINDS and isinstance(r.get("node"), str)]
    shared = {r["node"] for r in faults if r["kind"] in SHARED_KINDS}
    out: dict[str, str] = {}

    def name(node: str, why: str) -> None:  # the first reason a node is named, but a failure outranks a slow rank
        if node not in out or out[node].startswith("slow:"):
            out[node] = why
    for r in faults:
        if r["kind"] in SHARED_KINDS and job_nodes and (shared >= set(job_nodes) or r["node"] not in job_nodes):
            continue  # every node failed it (or a name that is none of the job's, as a container's hostname): not
            # a node's fault
        name(r["node"], f"{r['kind']}: {r.get('why', '')}")
    if not any(r["kind"] == "timeout" for r in faults):  # a peer named outright: no guess from who timed out
        for node, why in stopped(records, attempt).items():
            name(node, f"hang: {why}")  # (slow, then hung: it hung)
    return out


def stopped(records: list[dict], attempt: int) -> dict[str, str]:
    """{node: why} of the nodes none of whose ranks saw a collective time out in this attempt while ranks of other
    nodes did: the others were waiting for them (a hung rank never gets to say so). A node with one rank that timed
    out is not named, so a node whose ranks were ended by their launcher first is not blamed by mistake. Ranks
    waiting in one collective time out together: a timeout more than WAIT_SPREAD_S after the first is a rank that
    was woken only to be killed (Slurm ends a step with SIGCONT, then SIGTERM: a stopped rank then finds its
    collective's time long past), not one that waited. A timeout the NCCL watchdog wrote in the job's output (`seen:
    log`: the watchdog aborted its process, and only the output says it waited) carries no time and always counts."""
    ranks = peer_faults.rank_nodes(records, attempt)
    waited = [r for r in records if r.get("event") == "timeout" and r.get("attempt") == attempt]
    if not waited or not ranks:
        return {}
    timed = [float(r.get("t") or 0) for r in waited if r.get("seen") != "log"]
    first = min(timed) if timed else 0.0
    waited = [r for r in waited if r.get("seen") == "log" or float(r.get("t") or 0) <= first + WAIT_SPREAD_S]
    said = {r.get("node") for r in waited}
    silent = sorted({n for n in ranks.values() if isinstance(n, str) and n not in said})
    if not silent or len(silent) == len(set(ranks.values())):
        return {}
    return {n: f"its ranks {sorted(r for r, m in ranks.items() if m == n)} never timed out while "
               f"{len(waited)} rank(s) on {', '.join(sorted(said))} waited for them ({waited[0].get('why', '')})"
            for n in silent}


def decide(records: list[dict], attempt: int, job_nodes: list[str], rc: int, requeue: bool,
           excluded: list[str], partition_nodes: list[str]) -> tuple[str, list[str], str]:
    """(action, the job's new ExcNodeList, why): `requeue` away from the nodes this attempt's failure named, or
    `end`. A slow rank is suspect in the ledger but never the reason for a requeue: it did not fail the job."""
    named = {n: why for n, why in suspects(records, attempt, job_nodes).items() if not why.startswith("slow:")}
    if not named:
        return "end", list(excluded), "no failure named a node"
    names = ", ".join(f"{n} ({why})" for n, why in sorted(named.items()))
    new = sorted(set(excluded) | set(named))
    if rc == 0:
        return "end", new, f"suspect: {names}"
    if not requeue:
        return "end", new, f"suspect: {names}; cluster.requeue is false, not requeued"
    done = sum(1 for r in records if r.get("event") == "attempt" and str(r.get("action", "")).startswith("requeue"))
    if done >= MAX_NODE_REQUEUES:
        return "end", new, f"suspect: {names}; already requeued {done} times away from nodes, not again"
    left = [n for n in partition_nodes if n not in new]
    if partition_nodes and len(left) < len(job_nodes):
        return "end", new, (f"suspect: {names}; not requeued: excluding {','.join(new)} leaves {len(left)} of the "
                            f"partition's {len(partition_nodes)} nodes, the job needs {len(job_nodes)}")
    return "requeue", new, f"suspect: {names}"


def settle(run_dir, attempt: int, job: str, rc: int, job_nodes: list[str], ledger, requeue: bool,
           excluded: list[str], partition_nodes: list[str], log: str = "", log_start: int = 0,
           stopped: bool = False) -> str:
    """Record the attempt's end and its suspects (run file and ledger); returns the script's one line. `log`: the
    job's output, this attempt's part from byte `log_start`, where a failed collective may have named its peer;
    `stopped`: a stop signal reached the job script (ENDED_ON_PURPOSE)."""
    records = read(run_dir)
    if log and rc not in ENDED_ON_PURPOSE and not stopped:
        found = peer_faults.parse(peer_faults.read_log(log, log_start))
        for node, why in peer_faults.named(found, records, attempt, job_nodes).items():
            record(run_dir, "fault", attempt=attempt, node=node, kind="timeout", why=why, rank=None)
        for w in peer_faults.waits(found, records, attempt):  # ranks whose NCCL watchdog aborted them
            record(run_dir, "timeout", attempt=attempt, seen="log", **w)
        records = read(run_dir)
    named = suspects(records, attempt, job_nodes)
    by = f"run {Path(run_dir).name} attempt {attempt} (job {job})"
    problem = ""
    if ledger:
        try:
            node_ledger.append(ledger, [node_ledger.line(n, "suspect", w, by) for n, w in sorted(named.items())])
        except OSError as err:
            problem = f"; the node ledger {ledger} could not be written ({err.strerror or err})"
        excluded = [*excluded, *node_ledger.excluded(ledger)]  # with what this attempt's strikes just excluded
    action, new, why = decide(records, attempt, job_nodes, rc, requeue, excluded, partition_nodes)
    why += problem
    failed = sorted(n for n, w in named.items() if not w.startswith("slow:"))  # (a finished attempt's: slow ranks)
    ended_by = (failed or sorted(named) or [None])[0] if rc else None
    done = (f"requeue excluding {','.join(new)}" if action == "requeue" else "finished" if rc == 0 else
            "stopped to be resumed (a time-limit requeue or `resume` continues it)" if rc == EXIT_STOPPED else "end")
    record(run_dir, "attempt", attempt=attempt, job=job, nodes=job_nodes, rc=rc, node=ended_by,
           why=named.get(ended_by, ""), suspects=sorted(named), action=done)
    return f"{action} {','.join(new) or '-'} | {why}"


def injected(kind: str, node: str | None = None) -> str | None:
    """The VALUE of an injected fault of `kind` on this node (`` when it has none), None when there is none."""
    path = os.environ.get(FAULT_ENV)
    if not path:
        return None
    node = node or node_name()
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for raw in lines:
        parts = raw.split()
        if len(parts) < 2 or parts[0] != kind:
            continue
        target = parts[1]
        if target == "first":
            target = _claim(f"{path}.first", node)
        if target == node:
            return parts[2] if len(parts) > 2 else ""
    return None


def _claim(path: str, node: str) -> str:
    """The node that read a `first` fault first (this one, if nobody had)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return Path(path).read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(node + "\n")
    return node


def _split(text: str) -> list[str]:
    return [n for n in (text or "").replace(" ", ",").split(",") if n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m primus_contract.node_faults")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("settle", help="after an attempt: its suspects into the ledger, and the requeue decision")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--attempt", type=int, required=True)
    s.add_argument("--job", required=True)
    s.add_argument("--rc", type=int, required=True)
    s.add_argument("--nodes", default="", help="the attempt's nodes (comma-separated)")
    s.add_argument("--ledger", default="", help="the node ledger to append suspects to")
    s.add_argument("--requeue", action="store_true", help="the job may be requeued (cluster.requeue)")
    s.add_argument("--excluded", default="", help="the job's ExcNodeList now, and the ledger's excluded nodes")
    s.add_argument("--partition-nodes", default="", help="every node of the job's partition")
    s.add_argument("--log", default="", help="the job's output file (a failed collective may name its peer there)")
    s.add_argument("--log-start", default="0", help="where this attempt's part of --log starts (bytes)")
    s.add_argument("--stopped", action="store_true", help="a stop signal reached the job script (cancel, warning)")
    args = ap.parse_args(argv)
    start = int(args.log_start) if args.log_start.isdigit() else 0
    print(settle(args.run_dir, args.attempt, args.job, args.rc, _split(args.nodes), args.ledger, args.requeue,
                 _split(args.excluded), _split(args.partition_nodes), args.log, start, args.stopped), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
