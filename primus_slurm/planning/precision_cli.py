"""CLI commands of the precision work: `verify-fp4` and `compare` (registered by cli.py)."""
from __future__ import annotations

import click

from primus_slurm.post_training.compare import compare
from primus_slurm.errors import UserError
from primus_slurm.cli_options import run_argument
from primus_slurm.experiments import leaderboard
from primus_slurm.experiments.cli import show_sweep
from primus_slurm.post_training.verify_fp4 import verify


def register(group: click.Group) -> None:
    @group.command("compare")
    @run_argument("runs", sweep=True, nargs=-1, required=True)
    @click.option("--plot", "plot_path", default=None, metavar="PNG",
                  help="Also write a plot of lm loss per iteration to this PNG file (default: no plot).")
    @click.option("--json", "as_json", is_flag=True, help="SWEEP: the leaderboard as JSON")
    def compare_cmd(runs: tuple, plot_path: str, as_json: bool) -> None:
        """Per-iteration lm loss of RUNS (same seed, data, GBS, LR), and each later run's max/mean divergence
        from the first RUN (the reference). One SWEEP: its leaderboard, a row per trial, best eval loss first
        (--plot: every trial's loss curve)."""
        if plot_path and not plot_path.lower().endswith(".png"):
            raise UserError(f"--plot {plot_path!r}: the plot is a PNG; give a file name ending in .png")
        if len(runs) == 1 and leaderboard.is_sweep(runs[0]):
            show_sweep(runs[0], as_json, plot_path)
            return
        if as_json:
            raise UserError("compare --json: only for a SWEEP (its leaderboard)")
        click.echo(compare(list(runs), plot_path or None))

    @group.command("verify-fp4")
    @run_argument()
    @click.option("--fp8-run", default=None, help="FP8 run of the same recipe, for the memory and throughput checks.")
    def verify_fp4_cmd(run: str, fp8_run: str | None) -> int:
        """Check the five pieces of evidence that RUN trained in FP4; exit 0 only if all hold."""
        report, ok = verify(run, fp8_run)
        click.echo(report)
        return 0 if ok else 1
