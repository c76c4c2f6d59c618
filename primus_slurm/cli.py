"""`primus-slurm` command line: recipe commands here; job commands in jobs_cli, precision tools in precision_cli."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from primus_contract.hf_config import describe
from primus_contract.machine import at_start
from primus_contract.plan import auto_levers
from primus_contract.rules_model import world_size
from primus_slurm.jobs import jobs_cli, preflight
from primus_slurm.planning import plan_cli, precision_cli
from primus_slurm.post_training import post_cli
from primus_slurm.jobs import submit as submit_mod
from primus_slurm.cli_options import set_option
from primus_slurm.errors import UserError
from primus_slurm.experiments import cli as experiments_cli
from primus_slurm.experiments import pipeline
from primus_slurm.nodes import cli as nodes_cli
from primus_slurm.jobs.executors import concrete_executor, sbatch_absent_note
from primus_slurm.config.recipe import find_recipe, load_recipe
from primus_slurm.config.render import render_script
from primus_slurm.resources import recipes_dir


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="primus-slurm")
def main() -> None:
    """Fine-tune LLMs with LoRA on Slurm: recipe -> validated config -> sbatch script -> torchrun -> trainer."""


@main.command(cls=pipeline.ThenCommand)
@click.argument("recipe")
@set_option
@click.option("--json", "as_json", is_flag=True, help="Print the resolved recipe as JSON.")
@click.option("--skip-memory-check", is_flag=True, help="as submit's: accept a recipe the plan predicts will not fit")
@click.option("--executor", type=click.Choice(["slurm", "local"]), default=None,
              help="as submit's: judge the recipe for this executor (default: the recipe's)")
@click.option("--then", "then", multiple=True, metavar="STEP [OPTIONS]", help="as submit's: the steps after training")
@click.pass_context
def validate(ctx, recipe: str, overrides: tuple, as_json: bool, skip_memory_check: bool, executor: str | None,
             then) -> None:
    """Check RECIPE (path or name under recipes/) as `submit --dry-run` does (the same verdict) and print a
    summary, or the resolved recipe the job reads with --json; lists the checks only the job's nodes can make."""
    overrides = (*overrides, *pipeline.override(ctx.meta.get("then") or []))  # (as submit: the same verdict)
    prepared = submit_mod.prepare(recipe, overrides, executor, dry_run=True)
    planned = plan_cli.check_memory(prepared.recipe.resolved, skip_memory_check)  # submit's verdict, in its order
    unchecked = submit_mod.check(prepared)
    pipeline.check_paths(prepared.recipe.resolved)  # the `after:` steps' files, as submit checks them
    r = prepared.recipe
    if as_json:
        click.echo(json.dumps(r.resolved, indent=2))
        return
    t, c = r.resolved["trainer"], r.resolved["cluster"]
    par = t["parallelism"]
    click.echo(f"ok: {r.path} — {t['model']['preset']} on {c['nodes']} node(s), world {world_size(c)}, "
               f"TP{par['tensor']} PP{par['pipeline']} CP{par['context']} EP{par['expert']}, "
               f"seq {t['data']['seq_length']}, GBS {t['schedule']['global_batch_size']}, hash {r.hash[:12]}")
    click.echo(f"plan: {plan_cli.summary(planned)}")
    levers = auto_levers(t, c["env_profile"])
    if levers:  # the null (auto) keys as they will run on the profile's machine (the trainer decides alike)
        click.echo(f"automatic levers: {levers}")
    for name, what in at_start(r.resolved):  # the contract's machine rules: the trainer checks them on the node
        click.echo(f"checked at start on the node: {name}: {what}")
    for what in unchecked:  # paths this machine cannot see
        click.echo(f"not checked here (the job's nodes see it): {what}")
    if t["checkpoint"]["pretrained"]:
        click.echo(f"pretrained: {pretrained_line(t['checkpoint']['pretrained'])}")
    for note in prepared.notes:
        click.echo(note)


def pretrained_line(path: str) -> str:
    """What the job will import: family, layers, experts, shards, size (its config.json already checked)."""
    if not Path(path).is_dir():  # (an existing file is refused by paths.check_paths)
        return f"{path} (not visible here: its config.json is checked against the recipe when the job starts)"
    return f"{path} — {describe(path)}"


@main.command()
@click.argument("recipe")
@set_option
@click.option("--executor", type=click.Choice(["slurm", "local"]), default=None, help="Default: the recipe's.")
@click.option("--run-dir", default=None, help="Run directory to render for (default: a placeholder).")
def render(recipe: str, overrides: tuple, executor: str | None, run_dir: str | None) -> None:
    """Print the job script RECIPE renders to (see `submit --dry-run` for the exact submitted text)."""
    r = load_recipe(recipe, overrides)
    name = r.resolved["experiment"]["name"]
    run_dir = run_dir or f"{r.resolved['experiment']['workspace']}/{name}/RUN_ID"
    requested = executor or r.resolved["cluster"]["executor"]
    click.echo(render_script(r.resolved, run_dir, "RUN_ID", executor), nl=False)
    note = sbatch_absent_note(requested, concrete_executor(requested))
    if note:
        click.echo(note, err=True)


@main.group(invoke_without_command=True)
@click.pass_context
def recipes(ctx: click.Context) -> None:
    """List the recipes shipped with primus-slurm (`recipes show NAME` prints one)."""
    if ctx.invoked_subcommand is None:
        for path in sorted(recipes_dir().glob("*.yaml")):
            click.echo(f"{path.stem:36s} {_summary(path.read_text())}")


def _summary(text: str, width: int = 110) -> str:
    """A recipe's first sentence, from its leading comment lines, cut at a word with an ellipsis past `width`."""
    head = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        head.append(line.lstrip("# ").strip())
    words = " ".join(head).split()
    sentence = " ".join(words)
    for i, word in enumerate(words):
        if word.endswith(".") and i + 1 < len(words) and words[i + 1][:1].isupper():
            sentence = " ".join(words[:i + 1])
            break
    if len(sentence) <= width:
        return sentence
    return sentence[:width].rsplit(" ", 1)[0].rstrip(",;:") + " …"


@recipes.command("show")
@click.argument("name")
def recipes_show(name: str) -> None:
    """Print a shipped recipe's YAML."""
    click.echo(find_recipe(name).read_text(), nl=False)


for _commands in (jobs_cli, precision_cli, post_cli, preflight, plan_cli, experiments_cli,
                  nodes_cli):  # each module's register(group)
    _commands.register(main)


_NO_ARGS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


def run(argv=None) -> int:
    try:
        rv = main.main(args=argv, prog_name="primus-slurm", standalone_mode=False)
    except UserError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("error: aborted", err=True)
        return 130
    except _NO_ARGS_HELP as exc:  # `primus-slurm` alone: the help, as written
        click.echo(exc.format_message(), err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        return 2
    except BrokenPipeError:
        return 0
    return rv if isinstance(rv, int) else 0


def entry() -> None:
    sys.exit(run())
