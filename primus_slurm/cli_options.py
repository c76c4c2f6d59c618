"""Click options that commands in several modules share (cli.py, preflight.py)."""
from __future__ import annotations

import click

SET_HELP = "Override a recipe value, e.g. --set trainer.parallelism.tensor=2 (repeatable)."


def set_option(func):
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)(func)
