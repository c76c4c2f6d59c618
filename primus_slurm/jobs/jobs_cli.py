"""Job commands of the CLI: submit, status, logs, cancel, list. `cli.py` calls `register(group)`."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from primus_slurm.post_training import post, post_cli
from primus_slurm.jobs import registry, runs
from primus_slurm.jobs import logs as logs_mod
from primus_slurm.jobs import status as status_mod
from primus_slurm.jobs import submit as submit_mod
from primus_slurm.planning import plan_cli, plan_runs
from primus_slurm.errors import UserError
from primus_slurm.jobs.executor_base import NothingToCancel
from primus_slurm.jobs.executors import executor_for
from primus_slurm.experiments import chain_state, cost, leaderboard, pipeline
from primus_slurm.experiments import cli as experiments_cli
from primus_slurm.experiments import sweep_resume
from primus_slurm.cli_options import run_argument
from primus_slurm.nodes import run_nodes


@click.command("submit", cls=pipeline.ThenCommand)
@click.argument("recipe")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a recipe field, e.g. --set trainer.schedule.lr=1e-4 (repeatable)")
@click.option("--dry-run", is_flag=True, help="print the script and the resolved recipe; create nothing (with "
              "--run-id, exactly the script a submit with that id runs)")
@click.option("--executor", type=click.Choice(["slurm", "local"]), help="override cluster.executor")
@click.option("--run-id", help="use this run id instead of a fresh one (yyyymmdd-HHMMSS-xxxxxx)")
@click.option("--follow", is_flag=True, help="stream the rank-0 log; exit with the job's exit code")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--skip-memory-check", is_flag=True, help="submit even if the plan predicts the GPU's memory is "
              "exceeded (`primus-slurm plan` shows why)")
@click.option("--then", "then", multiple=True, metavar="STEP [OPTIONS]",
              help="a step after training, its own job (repeatable, in order): eval [--data F], export "
                   "[--merged] [--no-adapter], generate --prompts F | --prompt T [--max-new-tokens N]; "
                   "--afterany: run it whatever the step before did (the recipe's `after:` key, replaced)")
@click.pass_context
def submit_cmd(ctx, recipe, overrides, dry_run, executor, run_id, follow, as_json, skip_memory_check, then):
    """Render RECIPE into a job script and submit it (with --then / `after:`, and the steps after it)."""
    if dry_run and follow:
        raise UserError("--follow has nothing to follow with --dry-run (nothing is submitted)")
    overrides = (*overrides, *pipeline.override(ctx.meta.get("then") or []))
    prepared = submit_mod.prepare(recipe, overrides, executor, run_id, dry_run=dry_run)
    steps = prepared.recipe.resolved["after"]
    planned = plan_cli.check_memory(prepared.recipe.resolved, skip_memory_check)
    gpu_note = plan_cli.unknown_gpu_note(planned, prepared.recipe.resolved)  # (after the checks: a refusal is one line)
    if dry_run:
        submit_mod.check(prepared)
        pipeline.check_paths(prepared.recipe.resolved)  # as the submit checks them
        for note in (gpu_note, prepared.note, *prepared.notes):
            if note:
                click.echo(note, err=True)
        if as_json:
            click.echo(json.dumps({"run_id": prepared.run_id, "run_dir": str(prepared.run_dir),
                                   "executor": prepared.executor, "script": prepared.script,
                                   "resolved": prepared.recipe.resolved}, indent=2))
        else:
            sys.stdout.write(submit_mod.dry_run_text(prepared) + (pipeline.dry_run_text(prepared) if steps else ""))
        return
    entry = pipeline.submit(prepared) if steps else submit_mod.submit(prepared)
    for note in (gpu_note, *prepared.notes):  # (not the sbatch-absent line: a real submit ran the executor it names)
        if note:
            click.echo(note, err=True)
    if executor_for(prepared.executor).container_unused(prepared.recipe.resolved["cluster"]["container"]["runtime"]):
        click.echo("note: cluster.container is a pyxis image, which only Slurm can start: this local job runs on "
                   "the host, without the image", err=True)
    if as_json:
        click.echo(json.dumps(entry, indent=2, sort_keys=True))
    else:
        click.echo(f"submitted run {entry['run_id']} ({entry['executor']} job {entry['job_id']})")
        click.echo(f"run dir: {entry['run_dir']}")
        if steps:
            click.echo(pipeline.submitted_line(Path(entry["run_dir"])))
    if follow:
        sys.exit(logs_mod.follow(entry, out=sys.stdout if not as_json else sys.stderr))


ALL_RUNS = click.option("--all", "show_all", is_flag=True, help="every run in the registry (default: the runs of the "
                        "git checkout holding the current directory, else of the current directory)")


@click.command("status")
@run_argument(sweep=True, required=False)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--wide", is_flag=True, help="every column (exec, job, TFLOP/s, peak memory, checkpoint, restarts); "
              "default: what fits 100 columns")
@ALL_RUNS
@click.option("--watch", "-w", type=click.FloatRange(min=1), is_flag=False, flag_value=10.0, default=None,
              metavar="[SECONDS]", help="redraw every SECONDS (default 10) until every run (and step) has ended; "
              "Ctrl-C stops watching, not the runs")
def status_cmd(run, as_json, wide, show_all, watch):
    """State and training progress of this checkout's runs (--all: every run), or of RUN; of SWEEP, its
    leaderboard (a row per trial). RUN and SWEEP are found from any directory."""
    if run is not None and show_all:
        raise UserError("--all: lists every run; not with RUN")
    if watch is None:
        _status(run, as_json, wide, show_all)
        return
    if as_json:
        raise UserError("--watch: redraws the table; not with --json (poll `status --json` instead)")
    tty = sys.stdout.isatty()
    while True:
        if tty:
            click.echo("\033[H\033[2J", nl=False)  # clear the screen: the table redrawn in place
        ended = _status(run, as_json, wide, show_all)
        if ended:
            click.echo("every run and step has ended")
            return
        click.echo(f"watching: every {watch:g} s until every run and step has ended (Ctrl-C stops watching, "
                   "not the runs)" + ("" if tty else "\n"))
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return


def _status(run, as_json, wide, show_all) -> bool:
    """`status` once; whether everything shown has ended (the runs and their steps)."""
    if run and leaderboard.is_sweep(run):
        return experiments_cli.show_sweep(run, as_json, wide=wide)
    entries, hidden = ([registry.find(run)], "") if run else registry.scoped(show_all)
    rows = status_mod.collect(entries)  # (the scheduler is asked about these runs only)
    if run:  # its exports, generations and evals (primus_slurm.post_training.post), what it cost
        rows[0]["post"] = post.results(Path(rows[0]["run_dir"]))
        info = {**entries[0], **runs.read_run_json(Path(entries[0]["run_dir"]))}
        rows[0]["cost"] = cost.costs([(Path(info["run_dir"]), info)])[0]
        rows[0]["pipeline"], before = chain_state.states(info)
        chain_state.step_states(rows[0]["post"], [*rows[0]["pipeline"], *before])
        measured = (rows[0]["mem_peak_gib"], rows[0].get("avg_tokens_per_s_gpu") or rows[0]["tokens_per_s_gpu"])
        planned = plan_runs.planned(Path(rows[0]["run_dir"]))
        rows[0]["plan"] = plan_runs.as_dict(planned, *measured)
        rows[0]["node_history"] = run_nodes.history(Path(rows[0]["run_dir"]))  # each attempt's nodes, slow ranks
    if as_json:  # what each run cost: one sacct call for all of them
        found = [(Path(r["run_dir"]), {**e, **runs.read_run_json(Path(r["run_dir"]))}) for r, e in zip(rows, entries)]
        for r, c in zip(rows, cost.costs(found)):
            r.update({k: c[k] for k in ("gpu_hours", "steps_gpu_hours", "elapsed_s", "tokens_per_gpu_hour", "cost",
                                        "currency")})
        click.echo(status_mod.to_json(rows[0] if run else rows))
    elif rows:
        status_mod.render_table(rows, wide=wide)
        if run:
            line = plan_runs.versus(planned, *measured)  # "" for a CPU run
            if line:
                click.echo(line)
            post_cli.show_results(rows[0]["run_dir"], rows=rows[0]["post"])
            for line in run_nodes.lines(rows[0]["node_history"]):
                click.echo(line)
            click.echo(cost.line(rows[0]["cost"]))
            if rows[0]["pipeline"]:
                click.echo(chain_state.chain_line(rows[0], rows[0]["pipeline"]))
        else:
            sweeps = leaderboard.sweeps(entries)
            if sweeps:  # the trials above belong to these (list --sweeps lists them)
                click.echo("sweeps: " + ", ".join(f"{s['sweep']} ({s['trials']} trials)" for s in sweeps) +
                           "; `primus-slurm status SWEEP` shows one")
    _listed(bool(rows), hidden, as_json)
    steps = rows[0].get("pipeline") or [] if run and rows else []
    return all(r["state"] in status_mod.ENDED for r in [*rows, *steps])


def _listed(shown: bool, hidden: str, as_json: bool) -> None:
    """The last line of a bare `status`/`list`: how many runs it left out (registry.scoped; on stderr under
    --json, which stays one document), or that there are none at all."""
    if not shown and not as_json:
        click.echo(hidden or "no runs yet (primus-slurm submit RECIPE)")
    elif hidden:
        click.echo(hidden, err=as_json)


@click.command("logs")
@run_argument()
@click.option("-f", "--follow", is_flag=True, help="keep streaming until the job ends")
@click.option("--attempt", type=click.IntRange(min=0), default=None, metavar="K",
              help="the trainer log of attempt K (0: the first; default: the latest; `status` counts RESTARTS)")
@click.option("--stdout", "job_stdout", is_flag=True, help="the job's stdout/stderr file instead (every rank's output)")
def logs_cmd(run, follow, attempt, job_stdout):
    """Print (or follow) the trainer log of RUN (rank 0's: the only rank that writes one)."""
    entry = registry.find(run)
    if attempt is not None and (follow or job_stdout):
        raise UserError("--attempt: shows one finished attempt's trainer log; not with -f or --stdout")
    if follow:
        sys.exit(logs_mod.follow(entry, stdout=job_stdout))
    logs_mod.show(entry, job_stdout, attempt)


def _runs_of(ref: str) -> list[dict]:
    """RUN's registry entry, or every submitted trial's of SWEEP."""
    if leaderboard.is_sweep(ref):
        return leaderboard.trial_entries(leaderboard.find(ref))
    return [registry.find(ref)]


@click.command("cancel")
@run_argument(sweep=True)
def cancel_cmd(run):
    """Cancel RUN (scancel, or kill the local process group), or every unfinished trial of SWEEP."""
    entries = _runs_of(run)
    if not entries:
        raise UserError(f"cancel {run}: the sweep has no submitted trial; nothing to cancel")
    found = [(Path(e["run_dir"]), {**e, **runs.read_run_json(Path(e["run_dir"]))}) for e in entries]
    bases = status_mod.scheduler_states(found)  # the states `status` starts from, one query per executor
    # the trials still waiting first: a throttled array starts its next task as soon as a running one ends
    failed = []
    for i in sorted(range(len(found)), key=lambda i: (bases[i] or {}).get("state") != "PENDING"):
        try:
            _cancel(*found[i], bases[i] or {"state": "UNKNOWN"})
        except UserError as exc:  # the others are still cancelled
            click.echo(f"not cancelled: run {found[i][1]['run_id']}: {exc}")
            failed.append(found[i][1]["run_id"])
    if failed:
        raise UserError(f"cancel {run}: {len(failed)} of {len(found)} not cancelled (each one's reason above)")


def _cancel(run_dir: Path, info: dict, now: dict) -> None:
    ended = now.get("state")
    if ended in status_mod.TERMINAL:
        click.echo(f"run {info['run_id']} (job {info.get('job_id')}) already ended ({ended}); nothing to cancel")
        return
    if ended == "UNKNOWN" and info.get("cancel_time"):
        click.echo(f"run {info['run_id']} (job {info.get('job_id')}) was cancelled at {info['cancel_time']}; "
                   "nothing to cancel")
        return
    if ended == "UNKNOWN" and not run_dir.is_dir():
        why = now.get("reason") or "its run directory is gone"
        click.echo(f"run {info['run_id']} (job {info.get('job_id')}) is UNKNOWN: {why}; nothing to cancel")
        return
    executor = executor_for(info.get("executor"))
    if info.get("executor") == "slurm":  # its afterok steps first: Slurm may start a step whose dependency, an
        for step in chain_state.chain_states(info):  # array task cancelled while pending, left no record
            if step.get("when") == "afterok" and step.get("state") == "PENDING" and step.get("job_id"):
                try:
                    executor.cancel(run_dir, {"job_id": step["job_id"]})
                except NothingToCancel:  # it ended (and was purged) since its state was read
                    continue
                click.echo(f"cancelled run {info['run_id']}'s {step['step']} step (job {step['job_id']})")
    try:
        executor.cancel(run_dir, info)
    except NothingToCancel as why:
        click.echo(f"run {info['run_id']} (job {info.get('job_id')}) is {ended or 'UNKNOWN'}: {why}; nothing to cancel")
        return
    if info.get("executor") == "slurm" and run_dir.is_dir():  # a job cancelled before it starts may leave no
        # accounting record: status reads this (locally the queue owns run.json; its cancel marker says it)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        runs.write_run_json(run_dir, {**runs.read_run_json(run_dir), "cancel_time": stamp})
    click.echo(f"cancelled run {info['run_id']} (job {info['job_id']})")


@click.command("resume")
@run_argument(sweep=True)
@click.option("--follow", is_flag=True, help="stream the rank-0 log; exit with the job's exit code")
def resume_cmd(run, follow):
    """Submit a stopped RUN again (same script, a new job); training resumes from its latest checkpoint. SWEEP:
    every trial that ended unfinished (a trial that completed, or still runs, is left as it is), within the
    sweep's --max-parallel."""
    if leaderboard.is_sweep(run):
        if follow:
            raise UserError("resume SWEEP: --follow follows one run; give a trial's run id")
        sweep_resume.resume_sweep(run)
        return
    entry = sweep_resume.resume_run(run)
    if follow:
        sys.exit(logs_mod.follow(entry, min_attempt=entry["attempt"]))


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--sweeps", is_flag=True, help="the sweeps instead, one line each (`status SWEEP` shows one)")
@ALL_RUNS
def list_cmd(as_json, show_all, sweeps):
    """This checkout's submitted runs (--all: every run; from the registry, no scheduler query), or its sweeps."""
    entries, hidden = registry.scoped(show_all)
    if sweeps:
        found = leaderboard.sweeps(entries)
        if as_json:
            click.echo(json.dumps(found, indent=2, sort_keys=True))
        elif found:
            _columns([("SWEEP", "EXEC", "TRIALS", "SUBMITTED", "SWEEP DIR")] +
                     [(s["sweep"], s["executor"], str(s["trials"]), s["submit_time"], s["sweep_dir"]) for s in found])
        if not found and not as_json:
            click.echo("no sweeps yet (primus-slurm sweep RECIPE --grid KEY=V1,V2)")
        if hidden:
            click.echo(hidden, err=as_json)
        return
    if as_json:
        click.echo(json.dumps(entries, indent=2, sort_keys=True))
    elif entries:
        rows = [("RUN", "NAME", "EXEC", "JOB", "SUBMITTED", "RUN DIR")]
        rows += [(e["run_id"], e.get("name", "-"), e.get("executor", "-"), str(e.get("job_id", "-")),
                  e.get("submit_time", "-"), e["run_dir"]) for e in entries]
        _columns(rows)
    _listed(bool(entries), hidden, as_json)


def _columns(rows: list[tuple]) -> None:
    """Rows as left-aligned columns; the last one unpadded (a path)."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(f"{str(v):<{w}}" for v, w in zip(row, widths)) + f"  {row[-1]}")


def register(group: click.Group) -> None:
    for command in (submit_cmd, status_cmd, logs_cmd, cancel_cmd, resume_cmd, list_cmd):
        group.add_command(command)
