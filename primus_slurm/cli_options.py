"""Click options and arguments that commands in several modules share (cli.py, preflight.py, jobs_cli.py,
post_cli.py, precision_cli.py)."""
from __future__ import annotations

import functools

import click

from primus_slurm.jobs import registry

SET_HELP = "Override a recipe value, e.g. --set trainer.parallelism.tensor=2 (repeatable)."


def set_option(func):
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)(func)


def _given(sweep: bool, ctx, param, value):
    """Click's callback of a RUN argument (a tuple of them too): registry.check_ref refuses an empty one."""
    for ref in value if isinstance(value, tuple) else (value,):
        if ref is not None:
            registry.check_ref(ref, sweep)
    return value


def run_argument(name: str = "run", sweep: bool = False, **kwargs):
    """The RUN argument of a command (`sweep`: or a SWEEP): refused when it is empty or blank."""
    return click.argument(name, callback=functools.partial(_given, sweep), **kwargs)
