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
        kept = [(v, it) for v, it in finite if _kept(Path(t["run_dir"]), it, s)]
        chain = chains[t["run_id"]]
        tokens = s.get("avg_tokens_per_s_gpu") if s.get("finished") and s.get("avg_tokens_per_s_gpu") else \
            s.get("tokens_per_s_gpu")
        row.update(state=s["state"], exit_code=s["exit_code"], job_id=s["job_id"], iteration=s["iteration"],
                   train_iters=s["train_iters"], lm_loss=s["lm_loss"], last_eval_loss=evals[-1][1] if evals else None,
                   best_eval_loss=min(finite)[0] if finite else None, tokens_per_s_gpu=tokens,
                   best_eval_iteration=min(finite)[1] if finite else None, then=chain,
                   best_kept_eval_loss=min(kept)[0] if kept else None,
                   best_kept_eval_iteration=min(kept)[1] if kept else None,
                   then_summary=chain_state.summary(chain),
                   run_dir=t["run_dir"], error=t["error"] or s.get("error") or s.get("reason"),
                   **{k: v for k, v in costs[t["run_id"]].items() if k in ("gpu_hours", "elapsed_s", "attempts",
                                                                           "tokens_per_gpu_hour", "cost", "currency")})
        out.append(row)
    out.sort(key=lambda r: (r["state"] == "REFUSED", r.get("best_eval_loss") is None,
                            r.get("best_eval_loss") or 0.0, r["trial"]))
    return data, out


def _kept(run_dir: Path, iteration: int | None, state: dict) -> bool:
    """Whether the model an eval measured is still there: its iteration's checkpoint, or the adapter the trainer
    exported at the end of a finished run (the model of its last iteration)."""
    if iteration is None:
        return False
    if (run_dir / "checkpoints" / f"iter_{iteration:07d}").is_dir():
        return True
    return bool(state.get("finished")) and iteration == state.get("iteration") and (run_dir / "adapter").is_dir()


def _latest(run_dir: Path) -> str | None:
    latest = run_dir / run_files.LATEST
    return latest.read_text().strip() if latest.is_file() else None


def winner(board: list[dict]) -> dict | None:
    """The trial with the lowest eval loss whose model was kept (that iteration's checkpoint, or the end-of-run
    adapter of its last iteration): its values, eval loss and iteration, the adapter of exactly that model where one
    exists (a completed export step's of the latest checkpoint, or the end-of-run one), the `export` command that
    makes a merged checkpoint of it, and a note where a lower eval loss was logged by a model no longer kept. None
    when no trial has an eval loss yet; with losses but no kept model, the best loss, no export and the note."""
    logged = [r for r in board if r.get("best_eval_loss") is not None]
    if not logged:
        return None
    top = min(logged, key=lambda r: (r["best_eval_loss"], r["trial"]))
    kept = [r for r in board if r.get("best_kept_eval_loss") is not None]
    best = min(kept, key=lambda r: (r["best_kept_eval_loss"], r["trial"])) if kept else top
    loss, it = ((best["best_kept_eval_loss"], best["best_kept_eval_iteration"]) if kept else
                (best["best_eval_loss"], best["best_eval_iteration"]))
    note = None
    if not kept or top["best_eval_loss"] < loss:
        note = (f"trial {top['trial']} logged eval loss {top['best_eval_loss']:.4f} at iteration "
                f"{top['best_eval_iteration']}, but no checkpoint of that iteration was kept")
    out = {"trial": best["trial"], "values": best["values"], "run_id": best["run_id"], "state": best["state"],
           "eval_loss": loss, "iteration": it, "adapter": None, "export": None, "note": note}
    if not kept:
        return out
    run_dir = Path(best["run_dir"])
    saved = f"iter_{it:07d}"
    on_latest = _latest(run_dir) == saved
    if on_latest:  # a completed export step exported the latest checkpoint (its default)
        out["adapter"] = next((res.get("adapter") for s in best.get("then") or () if s["step"] == "export" and
                               s.get("state") == "COMPLETED" and s.get("dir")
                               for res in [post.read_json(Path(s["dir"]) / "result.json")] if res.get("adapter")),
                              None)
    if out["adapter"] is None and it == best.get("iteration") and best["state"] == "COMPLETED" and (
            run_dir / "adapter").is_dir():
        out["adapter"] = str(run_dir / "adapter")
    if (run_dir / "checkpoints" / saved).is_dir():
        out["export"] = f"primus-slurm export {best['run_id']}{'' if on_latest else f' --checkpoint {it}'} --merged"
    return out
