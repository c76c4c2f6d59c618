"""The experiment commands (`sweep`), and the SWEEP forms of status / compare / cancel / resume, which
jobs_cli and precision_cli hand over here when their argument names a sweep. `cli.py` calls register()."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from primus_slurm.post_training import compare
from primus_slurm.cli_options import set_option
from primus_slurm.errors import UserError
from primus_slurm.experiments import board_table, leaderboard, pipeline
from primus_slurm.jobs.status import ENDED
from primus_slurm.experiments import sweep as sweep_mod


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    s = round(h * 3600)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def trial_table(sweep: sweep_mod.Sweep) -> str:
    """The trials, their verdicts and (GPU runs) the plan's training time and GPU-hours each, then the totals."""
    keys = sweep.keys
    timed = any(t.hours is not None for t in sweep.accepted)
    head = ["trial"] + keys + (["time", "GPU-h"] if timed else []) + ["verdict"]
    rows = []
    for t in sweep.trials:
        values = dict(t.values)
        verdict = f"refused: {t.error}" if t.error else (f"task {t.task}" if sweep.executor == "slurm"
                                                         else f"queue {t.task}")
        planned = [_hours(t.hours), f"{t.gpu_hours:,.1f}" if t.gpu_hours is not None else "-"] if timed else []
        rows.append([str(t.index)] + [values.get(k, "-") for k in keys] + planned + [verdict])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    lines = []
    for r in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    if timed:
        hours = [t.hours for t in sweep.accepted if t.hours is not None]
        at_once = sweep.max_parallel or (1 if sweep.executor != "slurm" else len(hours))
        lines.append(f"planned: {len(hours)} trials, {sum(t.gpu_hours for t in sweep.accepted if t.hours):,.1f} "
                     f"GPU-hours in all; about {_hours(sum(hours) / min(at_once, len(hours)))} of training with "
                     f"{min(at_once, len(hours))} at once (the plan's step time x train_iters: evals, starts and "
                     "queueing not counted)")
    return "\n".join(lines) + "\n"


@click.command("sweep", cls=pipeline.ThenCommand)
@click.argument("recipe")
@click.option("--grid", "grids", multiple=True, metavar="KEY=V1,V2,...",
              help="a recipe key and its values; each --grid is an axis of the product (repeatable)")
@click.option("--zip", "zips", multiple=True, metavar="KEY=V1,V2,...",
              help="keys that vary together (the i-th values of every --zip make one point of one axis)")
@set_option
@click.option("--max-parallel", type=click.IntRange(min=1), default=None, metavar="N",
              help="at most N trials at once (Slurm: the array's %N; local: default 1, one after another)")
@click.option("--max-trials", type=click.IntRange(min=1, max=sweep_mod.grid.MAX_TRIALS_CAP), default=None, metavar="N",
              help=f"allow up to N trials (default {sweep_mod.grid.MAX_TRIALS}, at most "
                   f"{sweep_mod.grid.MAX_TRIALS_CAP:,})")
@click.option("--executor", type=click.Choice(["slurm", "local"]), default=None, help="override cluster.executor")
@click.option("--dry-run", is_flag=True, help="print the trial table and the array script; submit nothing")
@click.option("--skip-memory-check", is_flag=True, help="as submit's")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--then", "then", multiple=True, metavar="STEP [OPTIONS]", help="as submit's: steps after each trial")
@click.pass_context
def sweep_cmd(ctx, recipe, grids, zips, overrides, max_parallel, max_trials, executor, dry_run, skip_memory_check,
              as_json, then):
    """Run RECIPE once per point of a grid: one Slurm job array (or the local queue). Each trial is checked as
    `submit` checks a recipe; refused trials are listed with their reason and not submitted."""
    overrides = (*overrides, *pipeline.override(ctx.meta.get("then") or []))
    sweep = sweep_mod.plan(recipe, grids, zips, overrides, executor, max_parallel, max_trials,
                           skip_memory_check, dry_run)
    _print_notes(sweep)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"sweep_id": sweep.sweep_id, "executor": sweep.executor,
                                   "trials": [t.as_dict() for t in sweep.trials],
                                   "script": sweep_mod.array_script(sweep) if sweep.executor == "slurm" and
                                   sweep.accepted else None}, indent=2))
        else:
            sys.stdout.write(trial_table(sweep))
            if sweep.executor == "slurm" and sweep.accepted:
                sys.stdout.write("# ---- the array script ----\n" + sweep_mod.array_script(sweep))
        if not sweep.accepted:  # as the submit would say: nothing could go
            raise UserError(f"sweep: all {len(sweep.trials)} trials were refused (each one's reason above)")
        return
    if not as_json:
        sys.stdout.write(trial_table(sweep))
    entries = sweep_mod.launch(sweep)
    if as_json:
        click.echo(json.dumps({"sweep_id": sweep.sweep_id, "sweep_dir": str(sweep.sweep_dir),
                               "executor": sweep.executor, "trials": [t.as_dict() for t in sweep.trials],
                               "runs": entries}, indent=2, sort_keys=True))
        return
    where = (f"slurm job array {entries[0]['job_id'].rsplit('_', 1)[0]}" if sweep.executor == "slurm" else
             f"the local queue, {sweep.max_parallel or 1} at a time")
    click.echo(f"submitted sweep {sweep.sweep_id}: {len(entries)} of {len(sweep.trials)} trials ({where})")
    click.echo(f"sweep dir: {sweep.sweep_dir}")


def _print_notes(sweep) -> None:
    """submit's notes (keys that do nothing in the job), each once, with the trials it concerns unless all."""
    seen: dict[str, list[int]] = {}
    for trial in sweep.accepted:
        for note in trial.prepared.notes:
            seen.setdefault(note, []).append(trial.index)
    for note, trials in seen.items():
        which = f" (trial{'s' if len(trials) > 1 else ''} {', '.join(map(str, trials))})"
        click.echo(note + (which if len(trials) < len(sweep.accepted) else ""), err=True)


def show_sweep(ref: str, as_json: bool, plot_path: str | None = None, wide: bool = False) -> bool:
    """`status SWEEP` and `compare SWEEP`: the leaderboard and its winner (and a PNG of every trial's loss
    curve); whether every trial and step has ended."""
    data, board = leaderboard.rows(leaderboard.find(ref))
    best = leaderboard.winner(board)
    if as_json:
        click.echo(json.dumps({"sweep_id": data["sweep_id"], "executor": data["executor"], "keys": data["keys"],
                               "trials": board, "best": best}, indent=2, sort_keys=True))
    else:
        sys.stdout.write(board_table.table(data, board, best, wide))
    if plot_path:
        shown = [r for r in board if r.get("run_dir") and compare.rank0_logs(Path(r["run_dir"]))]
        if not shown:
            raise UserError(f"--plot: no trial of {data['sweep_id']} has logged yet")
        labels = [f"trial {r['trial']}: " + ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in r["values"].items())
                  for r in shown]
        logged = [compare.load_run(r["run_dir"]) for r in shown]
        title = f"lm loss of every trial of {data['sweep_id']}"
        click.echo(f"plot: {compare.plot(logged, plot_path, title, labels)}", err=as_json)
    return all(r["state"] in ENDED and all(s.get("state") in ENDED for s in r.get("then") or ()) for r in board)


def register(group: click.Group) -> None:
    group.add_command(sweep_cmd)
