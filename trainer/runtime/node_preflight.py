"""The preflight's node check (trainer/runtime/preflight.py, on every node before torchrun starts): the GPUs'
error counters from the vendor tool (trainer/runtime/gpu_counters.py) and a fault injected for tests
(primus_contract/node_faults.py: `preflight NODE`). A problem is recorded as a `fault` of kind `device` in the
run's logs/nodes.jsonl, which the job script settles into the node ledger after the attempt (and requeues the job
away from the node). It also records the node's host names and addresses (a `hosts` line: the job script maps a
peer that a failed collective names in the job's output onto its node, primus_contract/peer_faults.py) and turns
NCCL's warnings on where the job left NCCL_DEBUG unset (NCCL prints nothing by default; a healthy run has no WARN
lines). Standard library only, as the preflight.
"""
from __future__ import annotations

import os

from primus_contract import node_faults, peer_faults, run_files
from trainer.runtime import gpu_counters


def problem() -> str | None:
    """What is wrong with this node's GPUs, else None."""
    value = node_faults.injected("preflight")
    if value is not None:
        return f"injected fault ({node_faults.FAULT_ENV}){': ' + value if value else ''}"
    tool, found, _ = gpu_counters.counters()
    bad = gpu_counters.bad(found) if tool else None
    return f"{tool}: {bad}" if bad else None


def record(run_dir: str | None, kind: str, why: str) -> str:
    """The fault in the run's logs/nodes.jsonl; returns this node's name."""
    node = node_faults.node_name()
    if run_dir:
        node_faults.record(run_dir, "fault", attempt=run_files.current_attempt(), node=node, kind=kind, why=why,
                           rank=None, task=int(os.environ.get("SLURM_PROCID", "0") or 0))
    return node


def start(run_dir: str | None) -> None:
    """On every node before torchrun: the node's `hosts` line, and NCCL/RCCL's warnings on (they go to stdout)."""
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    if run_dir:
        node_faults.record(run_dir, "hosts", attempt=run_files.current_attempt(), node=node_faults.node_name(),
                           **peer_faults.addresses())


def injected_peer_error() -> str | None:
    """A `peer-error NODE HOST` fault on this node (tests): NCCL's warning, in its own format (src/misc/socket.cc
    socketProgress, after src/debug.cc's prefix), that HOST closed the connection; None when there is none."""
    host = node_faults.injected("peer-error")
    if not host:
        return None
    return (f"{os.uname().nodename.split('.')[0]}:{os.getpid()}:{os.getpid() + 3} [0] misc/socket.cc:58 NCCL WARN "
            f"socketProgress: Connection closed by remote peer {host}<45678>")
