"""What `status RUN` says about a run's nodes, from its logs/nodes.jsonl (primus_contract/node_faults.py): which
nodes each attempt ran on, which node ended it and why, what the job did next; and the slow ranks it named."""
from __future__ import annotations

from pathlib import Path

from primus_contract import node_faults


def history(run_dir: Path) -> dict:
    """{'attempts': [{attempt, job, nodes, rc, node, why, action}], 'slow': [{attempt, node, rank, why}]}."""
    records = node_faults.read(run_dir)
    keys = ("attempt", "job", "nodes", "rc", "node", "why", "action")
    attempts = [{k: r.get(k) for k in keys} for r in records if r.get("event") == "attempt"]
    slow = [{k: r.get(k) for k in ("attempt", "node", "rank", "why")} for r in records
            if r.get("event") == "fault" and r.get("kind") == "slow"]
    return {"attempts": attempts, "slow": slow}


def lines(h: dict) -> list[str]:
    out = []
    for a in h.get("attempts") or []:
        ended = f"exit {a.get('rc')}, ended by {a['node']}: {a['why']}" if a.get("node") else f"exit {a.get('rc')}"
        out.append(f"attempt {a.get('attempt')} (job {a.get('job')}) on {','.join(a.get('nodes') or []) or '?'}: "
                   f"{ended}; {a.get('action')}")
    for s in h.get("slow") or []:
        out.append(f"slow rank: node {s.get('node')} (attempt {s.get('attempt')}): {s.get('why')}")
    return out
