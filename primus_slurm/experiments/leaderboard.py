"""One view of a sweep (`status SWEEP`, `compare SWEEP`): a row per trial, best eval loss first.

A row: the trial's swept values, state, exit code, iteration, last and best eval loss, tokens/s/GPU, GPU-hours
(and cost where the recipe has a price); a refused trial keeps its one error line. States come from status.collect
(one scheduler query for all trials), costs from cost.costs (one sacct call).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from primus_contract import run_files

from primus_slurm.jobs import registry, runs
from primus_slurm.post_training import post
from primus_slurm.jobs import status as status_mod
from primus_slurm.errors import UserError
from primus_slurm.experiments import chain_state, cost
from primus_slurm.experiments import sweep as sweep_mod


def is_sweep(ref: str) -> bool:
    return ref.startswith("sweep-") or (Path(os.path.expanduser(ref)) / sweep_mod.SWEEP_JSON).is_file()


def find(ref: str) -> Path:
    """The sweep directory of a sweep id (or a unique prefix of one), or of a sweep directory path."""
    path = Path(os.path.expanduser(ref))
    if (path / sweep_mod.SWEEP_JSON).is_file():
        return path.resolve()
    dirs = {e["sweep"]: e["sweep_dir"] for e in registry.entries() if e.get("sweep", "").startswith(ref)}
    if len(dirs) > 1 and ref not in dirs:
        raise UserError(f"SWEEP '{ref}' matches {len(dirs)} sweeps; give more of the sweep id")
    if not dirs:
        raise UserError(f"SWEEP '{ref}' is not a known sweep id or sweep directory (`primus-slurm list --sweeps "
                        "--all` lists every sweep)")
    return Path(dirs.get(ref) or next(iter(dirs.values())))


def sweeps(entries: list[dict]) -> list[dict]:
    """The sweeps of these registry entries, oldest first: id, executor, submitted trials, submit time, dir."""
    out: dict[str, dict] = {}
    for e in entries:
        if isinstance(e.get("sweep"), str):
            s = out.setdefault(e["sweep"], {"sweep": e["sweep"], "sweep_dir": e.get("sweep_dir"), "trials": 0,
                                            "executor": e.get("executor"), "submit_time": e.get("submit_time")})
            s["trials"] += 1
    return list(out.values())


def trial_entries(sweep_dir: Path) -> list[dict]:
    """The registry entries of the sweep's submitted trials (or their run.json where the registry lacks one)."""
    data = sweep_mod.read(sweep_dir)
    known = {e["run_id"]: e for e in registry.entries() if e.get("sweep") == data["sweep_id"]}
    out = []
    for t in data["trials"]:
        if t["run_id"]:  # (a trial the registry lost: its run.json, else what sweep.json says of it)
            own = runs.read_run_json(Path(t["run_dir"]))
            out.append(known.get(t["run_id"]) or {"executor": data["executor"], **own, "run_id": t["run_id"],
                                                  "run_dir": t["run_dir"]})
    return out


def eval_losses(run_dir: Path) -> list[tuple[int | None, float]]:
    """Every (iteration, eval loss) the run logged, all attempts, in order."""
    values = []
    for attempt in cost.attempt_events(run_dir):
        for e in attempt:
            v = run_files.number(e.get("eval_loss")) if e["event"] == "eval" else None
            if v is not None:
                values.append((e.get("iteration") if isinstance(e.get("iteration"), int) else None, v))
    return values


def rows(sweep_dir: Path) -> tuple[dict, list[dict]]:
    """(sweep.json, one row a trial, sorted by best eval loss: trials without one, then refused ones, last)."""
    data = sweep_mod.read(sweep_dir)
    entries = {e["run_id"]: e for e in trial_entries(sweep_dir)}
    submitted = [t for t in data["trials"] if t["run_id"] in entries]
    states = {r["run_id"]: r for r in status_mod.collect([entries[t["run_id"]] for t in submitted])}
    found = [(Path(t["run_dir"]), {**entries[t["run_id"]], **runs.read_run_json(Path(t["run_dir"]))})
             for t in submitted]
    costs = dict(zip((t["run_id"] for t in submitted), cost.costs(found)))
    chains = {t["run_id"]: c for t, (c, _) in zip(submitted, chain_state.states_of([i for _, i in found]))}
    out = []
    for t in data["trials"]:
        row = {"trial": t["index"], "values": {k: t["values"].get(k) for k in data["keys"]}, "run_id": t["run_id"],
               "error": t["error"]}
        s = states.get(t["run_id"])
        if s is None:
            row.update(state="REFUSED" if t["error"] else "UNKNOWN")
            out.append(row)
            continue
        evals = eval_losses(Path(t["run_dir"]))
        finite = [(v, it) for it, v in evals if math.isfinite(v)]
        chain = chains[t["run_id"]]
        tokens = s.get("avg_tokens_per_s_gpu") if s.get("finished") and s.get("avg_tokens_per_s_gpu") else \
            s.get("tokens_per_s_gpu")
        row.update(state=s["state"], exit_code=s["exit_code"], job_id=s["job_id"], iteration=s["iteration"],
                   train_iters=s["train_iters"], lm_loss=s["lm_loss"], last_eval_loss=evals[-1][1] if evals else None,
                   best_eval_loss=min(finite)[0] if finite else None, tokens_per_s_gpu=tokens,
                   best_eval_iteration=min(finite)[1] if finite else None, then=chain,
                   then_summary=chain_state.summary(chain),
                   run_dir=t["run_dir"], error=t["error"] or s.get("error") or s.get("reason"),
                   **{k: v for k, v in costs[t["run_id"]].items() if k in ("gpu_hours", "elapsed_s", "attempts",
                                                                           "tokens_per_gpu_hour", "cost", "currency")})
        out.append(row)
    out.sort(key=lambda r: (r["state"] == "REFUSED", r.get("best_eval_loss") is None,
                            r.get("best_eval_loss") or 0.0, r["trial"]))
    return data, out


def winner(board: list[dict]) -> dict | None:
    """The trial with the lowest eval loss: its values, eval loss (and the iteration that logged it), the adapter
    it left (a completed export step's, else the one the trainer exported at its end) and the `export` command
    that makes a merged checkpoint of that iteration (None when no trial has an eval loss yet)."""
    best = next((r for r in board if r.get("best_eval_loss") is not None), None)
    if best is None:
        return None
    run_dir = Path(best["run_dir"])
    adapter = next((res.get("adapter") for s in best.get("then") or () if s["step"] == "export" and
                    s.get("state") == "COMPLETED" and s.get("dir")
                    for res in [post.read_json(Path(s["dir"]) / "result.json")] if res.get("adapter")), None)
    if adapter is None and (run_dir / "adapter").is_dir():
        adapter = str(run_dir / "adapter")
    it = best.get("best_eval_iteration")
    saved = f"iter_{it:07d}" if it is not None else None
    latest = run_dir / run_files.LATEST
    at = f" --checkpoint {it}" if saved and (run_dir / "checkpoints" / saved).is_dir() and not (
        latest.is_file() and latest.read_text().strip() == saved) else ""  # (export's default: the latest)
    return {"trial": best["trial"], "values": best["values"], "run_id": best["run_id"], "state": best["state"],
            "eval_loss": best["best_eval_loss"], "iteration": it, "adapter": adapter,
            "export": f"primus-slurm export {best['run_id']}{at} --merged"}

