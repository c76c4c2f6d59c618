"""The state of a run's pipeline steps (run.json's `pipeline`, and `pipeline_before`: the chains of the attempts
before each `resume`), as `status RUN` and the sweep leaderboard show them; each settles to the truth:

- Slurm: one sacct/squeue query for every step of both chains; a step neither knows is UNKNOWN, with a reason.
- Local: the queue process (local_queue.py) writes each step's state as it runs it. A step it left PENDING or
  RUNNING when it died (killed, the machine rebooted) never changes again: it reads CANCELLED (never ran) or
  FAILED (ended with the queue), with the queue's pid as the reason.
- A FAILED step says why: its job's last `error:` line (or the exception that ended it), from its output file.
"""
from __future__ import annotations

from pathlib import Path

from primus_slurm.jobs.executor_base import TERMINAL
from primus_slurm.jobs.local_executor import proc_start_ticks
from primus_slurm.jobs.slurm_executor import slurm_states

OUTPUTS = ("job.out", "slurm-*.out")  # a post job's output: local, Slurm


def _queue_alive(info: dict) -> bool:
    pid = info.get("queue_pid")
    return bool(pid) and proc_start_ticks(pid) is not None and proc_start_ticks(pid) == info.get("queue_pid_start")


def _settle_local(info: dict, steps: list[dict]) -> None:
    """Steps the local queue left unfinished when it died."""
    if not info.get("queue_pid") or not any(s.get("state") in ("PENDING", "RUNNING") for s in steps) or \
            _queue_alive(info):  # (no queue recorded yet: the submit is still writing it)
        return
    for s in steps:
        if s.get("state") == "PENDING":
            s.update(state="CANCELLED", reason=f"the local queue (pid {info.get('queue_pid')}) ended before it "
                                               "ran this step")
        elif s.get("state") == "RUNNING":
            s.update(state="FAILED", reason=f"the local queue (pid {info.get('queue_pid')}) ended while this step "
                                            f"ran; its output: {s.get('dir')}")


def states(info: dict) -> tuple[list[dict], list[dict]]:
    """(the current chain, the chains before each resume), each step with its state."""
    return states_of([info])[0]


def states_of(infos: list[dict]) -> list[tuple[list[dict], list[dict]]]:
    """states() of many runs (a sweep's trials): one sacct/squeue query for every Slurm step of them all."""
    out = [([dict(s) for s in info.get("pipeline") or [] if isinstance(s, dict)],
            [dict(s) for s in info.get("pipeline_before") or [] if isinstance(s, dict)]) for info in infos]
    slurm = [s for info, (chain, before) in zip(infos, out) if info.get("executor") == "slurm"
             for s in (*chain, *before)]
    found = slurm_states([s["job_id"] for s in slurm if s.get("job_id")]) if slurm else {}
    for s in slurm:
        row = found.get(str(s.get("job_id"))) or {}
        s.update(state=row.get("state", "UNKNOWN"),
                 exit_code=row.get("exit_code") if row.get("state") in TERMINAL else None)
        if not row:
            s["reason"] = f"neither sacct nor squeue knows job {s.get('job_id')}"
    for info, (chain, before) in zip(infos, out):
        if info.get("executor") != "slurm":
            _settle_local(info, chain)
            _settle_local(info, before)
        for s in (*chain, *before):
            if s.get("state") == "FAILED" and not s.get("reason") and s.get("dir"):
                s["reason"] = why_failed(Path(s["dir"]))
    return out


def chain_states(info: dict) -> list[dict]:
    """run.json's pipeline with each step's state."""
    return states(info)[0]


def why_failed(job_dir: Path) -> str | None:
    """A failed post job's reason: its output's last `error:` line, else the last exception line of a traceback,
    else the job script's own last line."""
    lines: list[str] = []
    for pattern in OUTPUTS:
        for path in sorted(Path(job_dir).glob(pattern)):
            try:
                lines += path.read_text(errors="replace").splitlines()
            except OSError:
                continue
    lines = [line.strip() for line in lines if line.strip()]
    for test in (lambda s: s.startswith("error:") or " error | " in s,
                 lambda s: s.split(":", 1)[0].endswith(("Error", "Exception")),
                 lambda s: s.startswith("primus-slurm:")):
        hits = [line for line in lines if test(line)]
        if hits:
            return hits[-1][:300]
    return None


def step_states(post_rows: list[dict], steps: list[dict]) -> None:
    """A queued step's post job has no exit code of its own until it runs (Slurm may remove it unrun): its row
    takes the chain's state (and reason) where it has no result; a failed post job gets its reason."""
    by_dir = {s.get("dir"): s for s in steps}
    for row in post_rows:
        step = by_dir.get(row["path"])
        if step and row["state"] == "RUNNING" and step.get("state"):
            row.update(state=step["state"], exit_code=step.get("exit_code"))
            if step.get("reason"):
                row["reason"] = step["reason"]
        if row["state"] == "FAILED" and not row.get("reason"):
            row["reason"] = why_failed(Path(row["path"]))


def chain_line(train: dict, chain: list[dict]) -> str:
    """`status RUN`'s pipeline line: train job STATE -> eval job STATE -> ..."""
    parts = [f"train {train.get('job_id')} {train.get('state')}"]
    parts += [f"{s['step']}{' (afterany)' if s['when'] == 'afterany' else ''} {s.get('job_id') or '-'} "
              f"{s.get('state', 'UNKNOWN')}" for s in chain]
    return "pipeline: " + " -> ".join(parts)


def short_state(state: str | None) -> str:
    """A step's state in the sweep table: `ok`, `pending`, `running`, else Slurm's word (FAILED, CANCELLED, ...)."""
    return {"COMPLETED": "ok", "PENDING": "pending", "RUNNING": "running"}.get(state, state or "UNKNOWN")


def summary(chain: list[dict]) -> str | None:
    """A trial's chain in the sweep table: `eval ok, export FAILED` (None without steps)."""
    if not chain:
        return None
    return ", ".join(f"{s['step']} {short_state(s.get('state'))}" for s in chain)
