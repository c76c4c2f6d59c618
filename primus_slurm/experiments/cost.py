"""What a run cost: GPU-hours over every attempt, tokens trained per GPU-hour, and a price.

- Slurm: one sacct call for all runs (`--duplicates`: every attempt of a requeued job; `-X`: allocations), each
  attempt's elapsed seconds x the GPUs it held (AllocTRES gres/gpu); a run's jobs are its current one and those
  before each `resume` (run.json `jobs`), and its pipeline steps' (run.json `pipeline` and `pipeline_before`: an
  eval or export step holds a GPU too), which `gpu_hours` counts and `steps_gpu_hours` shows apart.
- Local executor: each attempt's wall time (its event stream, first to last event) x the GPUs it held: its world
  size when its start event says cuda, else cluster.gpus_per_node; each pipeline step the local queue ran (its
  job directory's job.sh written to its last write) x one GPU where the training held any (pipeline.GPUS).
- Tokens: the last iteration reached x tokens per iteration, as the trainer measured it (metrics event:
  tokens/s/GPU x world size x ms/iter); per GPU-hour: over the training's GPU-hours (the steps' left out).
- Cost: GPU-hours x cluster.gpu_hour_price, in cluster.currency (absent when the recipe sets no price).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from primus_contract import run_files
from primus_slurm.experiments.pipeline import GPUS

_GPU_TRES = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")


def gpus_of(alloc_tres: str) -> int:
    """GPUs in an AllocTRES text: `gres/gpu=8`, or the typed `gres/gpu:h100=8` where no untyped count is given."""
    plain = re.search(r"(?:^|,)gres/gpu=(\d+)", alloc_tres or "")
    if plain:
        return int(plain.group(1))
    return sum(int(n) for n in _GPU_TRES.findall(alloc_tres or ""))


def slurm_usage(job_ids: list[str], runner=subprocess.run) -> dict[str, dict]:
    """{job id: {'elapsed_s', 'gpu_hours', 'attempts'}} over every attempt, from one sacct call: a requeued job has a
    record an attempt (REQUEUED, then its current one); the record of one waiting to start again (PENDING, or
    CANCELLED before it did) has no AllocTRES and is no attempt."""
    wanted = sorted({str(j) for j in job_ids if j})
    if not wanted:
        return {}
    out = runner(["sacct", "--parsable2", "--noheader", "--duplicates", "-X", "-j", ",".join(wanted),
                  "-o", "JobID,JobIDRaw,ElapsedRaw,AllocTRES"], capture_output=True, text=True)
    usage: dict[str, dict] = {}
    if out.returncode != 0:
        return usage
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 4 or not parts[2].isdigit():
            continue
        job = parts[0] if parts[0] in wanted else parts[1]
        if job not in wanted:
            continue
        row = usage.setdefault(job, {"elapsed_s": 0, "gpu_hours": 0.0, "attempts": 0})
        row["elapsed_s"] += int(parts[2])
        row["gpu_hours"] += int(parts[2]) * gpus_of(parts[3]) / 3600
        row["attempts"] += bool(parts[3])  # (a record that never got an allocation: a requeued job's waiting one)
    return usage


def job_ids(info: dict) -> list[str]:
    """The run's Slurm jobs: those before each resume, then the current one; each once (sacct's records of a job
    are all its attempts: a job named twice would count them twice)."""
    before = [str(j["job_id"]) if isinstance(j, dict) else str(j) for j in info.get("jobs") or ()]
    return list(dict.fromkeys(j for j in (*before, str(info.get("job_id") or "")) if j and j != "None"))


def step_job_ids(info: dict) -> list[str]:
    """The Slurm jobs of the run's pipeline steps: the current chain's and those of the chains before each resume
    (the local queue's steps have none)."""
    steps = [*(info.get("pipeline") or ()), *(info.get("pipeline_before") or ())]
    return [str(s["job_id"]) for s in steps if isinstance(s, dict) and s.get("job_id") not in (None, "", "local")]


def local_step_usage(info: dict, gpus: int) -> dict:
    """The local queue's steps that ran (run.json `pipeline` and `pipeline_before`: those with a job directory): each
    one's wall time, from its job.sh (written as the queue starts it) to the last write of its post.json (rewritten
    at its end), output or result, x the GPUs it held (pipeline.GPUS, none where the training held none)."""
    spans = []
    for s in (*(info.get("pipeline") or ()), *(info.get("pipeline_before") or ())):
        d = Path(s["dir"]) if isinstance(s, dict) and isinstance(s.get("dir"), str) else None
        try:
            start = (d / "job.sh").stat().st_mtime
        except (OSError, TypeError):
            continue  # never started (PENDING, or CANCELLED behind a failed step), or its directory is gone
        ends = [p.stat().st_mtime for p in (d / n for n in ("post.json", "job.out", "result.json")) if p.is_file()]
        spans.append((max([start, *ends]) - start, min(GPUS.get(s.get("step"), 1), gpus)))
    return {"elapsed_s": round(sum(t for t, _ in spans)), "gpu_hours": sum(t * g for t, g in spans) / 3600,
            "attempts": len(spans)}


def _summed(usage: dict[str, dict], jobs: list[str]) -> dict:
    parts = [usage[j] for j in jobs if j in usage]
    return {key: sum(p[key] for p in parts) for key in ("elapsed_s", "gpu_hours", "attempts")}


def attempt_events(run_dir: Path) -> list[list[dict]]:
    """Each attempt's rank-0 event stream, oldest attempt first."""
    return [run_files.read_events(p) for p in run_files.attempt_files(run_dir, "jsonl")]


def attempt_gpus(events: list[dict], configured: int) -> int:
    """The GPUs one local attempt held: one a rank when its start event says it ran on cuda (whatever the recipe's
    cluster.gpus_per_node says: a CPU recipe run with trainer.distributed.device=cuda holds GPUs all the same),
    else the recipe's count (0 for a CPU run)."""
    start = next((e for e in events if e.get("event") == "start"), {})
    if start.get("device") == "cuda" and isinstance(start.get("world_size"), int):
        return start["world_size"]
    return configured


def local_usage(attempts: list[list[dict]], gpus: int) -> dict:
    """Each attempt's wall time (first to last event) x the GPUs it held (attempt_gpus; `gpus` the recipe's)."""
    timed = [([t for e in events if (t := run_files.event_time(e)) is not None], events) for events in attempts]
    spans = [(times[-1] - times[0], attempt_gpus(events, gpus)) for times, events in timed if len(times) > 1]
    elapsed = sum(s for s, _ in spans)
    return {"elapsed_s": round(elapsed), "gpu_hours": sum(s * g for s, g in spans) / 3600, "attempts": len(spans)}


def tokens_trained(attempts: list[list[dict]]) -> float | None:
    """The last iteration reached x the tokens of one iteration (the newest measurement)."""
    world, last = None, None
    for attempt in attempts:
        for e in attempt:
            if e["event"] == "start" and isinstance(e.get("world_size"), int):
                world = e["world_size"]
            elif e["event"] == "metrics" and isinstance(e.get("iteration"), int):
                last = e
    if not last or not world:
        return None
    tps, ms = run_files.number(last.get("tokens_per_s_gpu")), run_files.number(last.get("ms_per_iter"))
    if tps is None or ms is None:
        return None
    return last["iteration"] * tps * world * ms / 1000


def _cluster(run_dir: Path) -> dict:
    try:
        return yaml.safe_load((Path(run_dir) / run_files.RESOLVED).read_text())["cluster"] or {}
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return {}


def _gpus(cluster: dict) -> int:
    return int(cluster.get("gpus_per_node") or 0) * int(cluster.get("nodes") or 1)


def costs(found: list[tuple[Path, dict]], runner=subprocess.run) -> list[dict]:
    """One dict a run (run dir, run.json merged with its entry): elapsed_s and attempts (the training's),
    gpu_hours (the training's and its pipeline steps'), steps_gpu_hours, step_jobs, tokens, tokens_per_gpu_hour,
    price, currency, cost."""
    slurm = slurm_usage([j for _, info in found if info.get("executor") == "slurm"
                         for j in (*job_ids(info), *step_job_ids(info))], runner)
    rows = []
    for run_dir, info in found:
        cluster, attempts = _cluster(run_dir), attempt_events(run_dir)
        if info.get("executor") == "slurm":
            row, steps = _summed(slurm, job_ids(info)), _summed(slurm, step_job_ids(info))
        else:
            row = local_usage(attempts, _gpus(cluster))
            held = max((attempt_gpus(events, _gpus(cluster)) for events in attempts), default=_gpus(cluster))
            steps = local_step_usage(info, held)
        tokens = tokens_trained(attempts)
        price, currency = cluster.get("gpu_hour_price"), cluster.get("currency") or "USD"
        per_hour = tokens / row["gpu_hours"] if tokens and row["gpu_hours"] else None
        row.update(gpu_hours=row["gpu_hours"] + steps["gpu_hours"], steps_gpu_hours=steps["gpu_hours"],
                   step_jobs=steps["attempts"])
        row.update(tokens=tokens, tokens_per_gpu_hour=per_hour,
                   price=price, currency=currency,
                   cost=row["gpu_hours"] * price if price is not None else None)
        rows.append(row)
    return rows


def line(row: dict) -> str:
    """`status RUN`'s cost line."""
    per = f", {row['tokens_per_gpu_hour']:,.0f} tokens/GPU-hour" if row["tokens_per_gpu_hour"] else ""
    cost = f", {row['cost']:,.2f} {row['currency']} at {row['price']:g}/GPU-hour" if row["cost"] is not None else ""
    trained = f"over {row['attempts']} attempt(s), {row['elapsed_s']} s elapsed"
    if row.get("step_jobs"):
        trained = (f"({row['gpu_hours'] - row['steps_gpu_hours']:.3f} training {trained}; "
                   f"{row['steps_gpu_hours']:.3f} in {row['step_jobs']} pipeline step job(s))")
    return f"cost: {row['gpu_hours']:.3f} GPU-hours {trained}{per}{cost}"
