"""`primus-slurm compare RUN RUN...`: per-iteration lm-loss of runs on the same data, with divergence.

Also the run-log reading shared with verify-fp4 (rank-0 trainer log, docs/contract.md section 3).
Never imports torch; matplotlib is imported only when a plot is written.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from primus_contract import run_files
from primus_slurm.planning import plan_runs

from primus_slurm.jobs import registry
from primus_slurm.errors import UserError

_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (.*)$")
SAME_KEYS = (("experiment", "seed"), ("trainer", "data", "train"), ("trainer", "data", "seq_length"),
             ("trainer", "data", "packing"), ("trainer", "data", "format"),
             ("trainer", "schedule", "global_batch_size"), ("trainer", "schedule", "lr"),
             ("trainer", "schedule", "min_lr"), ("trainer", "schedule", "warmup_iters"),
             ("trainer", "schedule", "lr_decay"))


def fields(body: str) -> dict:
    """'lm loss 2.3 | lr 1e-4' -> {'lm loss': '2.3', 'lr': '1e-4'} (a field's last word is its value);
    the first field keeps its whole text under its first word ('precision | ...' -> {'precision': ''})."""
    out = {}
    for part in body.split(" | "):
        key, _, value = part.strip().rpartition(" ")
        out[key or value] = value if key else ""
    return out


def _num(text: Optional[str]) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


@dataclass
class RunLog:
    run_dir: Path
    recipe: dict
    precision: dict = field(default_factory=dict)     # fields of the `precision | ...` line
    precision_line: Optional[str] = None
    args: dict = field(default_factory=dict)          # `arg key = value` lines
    iterations: dict = field(default_factory=dict)    # iteration -> {'lm loss': float, ...} (interval means)
    losses: dict = field(default_factory=dict)        # iteration -> its own lm loss (metrics events' `losses`)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def label(self) -> str:
        p = self.precision
        if not p:
            return self.name
        if p.get("fp4") not in (None, "None"):
            return f"{self.name} (fp4 {p.get('recipe')})"
        if p.get("fp8") not in (None, "None"):
            return f"{self.name} (fp8 {p.get('recipe')})"
        return f"{self.name} ({p.get('weight_dtype', 'bf16/fp32')})"

    def series(self, key: str) -> dict:
        return {it: v[key] for it, v in sorted(self.iterations.items()) if v.get(key) is not None}

    def average(self, key: str) -> Optional[float]:
        """Mean of `key` over iterations after logging.log_avg_skip_iterations (contract section 3)."""
        skip = int(get(self.recipe, ("trainer", "logging", "log_avg_skip_iterations")) or 0)
        values = [v for it, v in self.series(key).items() if it > skip and math.isfinite(v)]
        return sum(values) / len(values) if values else None


def get(tree: dict, path: tuple):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def resolve_run_dir(ref: str) -> Path:
    """A run directory path, or a run id / job id known to the run registry."""
    path = Path(os.path.expanduser(ref))
    if (path / run_files.RESOLVED).is_file():
        return path.resolve()
    if path.exists():
        raise UserError(f"RUN '{ref}' has no recipe.resolved.yaml; give a run directory or run id")
    entry = registry.find(ref)
    return Path(entry["run_dir"])


def rank0_logs(run_dir: Path) -> list[Path]:
    return run_files.attempt_files(run_dir, "log")


def load_run(ref: str) -> RunLog:
    run_dir = resolve_run_dir(ref)
    with open(run_dir / run_files.RESOLVED, encoding="utf-8") as fh:
        recipe = yaml.safe_load(fh) or {}
    run = RunLog(run_dir=run_dir, recipe=recipe)
    logs = rank0_logs(run_dir)
    if not logs:
        raise UserError(f"RUN '{ref}': no rank-0 trainer log under {run_dir}/logs/rank-0")
    for log in logs:  # attempts in order: a restart's values replace the earlier attempt's
        events = log.parent / run_files.events_name(run_files.attempt_of(log))
        if events.is_file():
            _from_events(run, run_files.read_events(events))
            run.args = run.args or _flat(recipe)  # (the log's args dump is the resolved recipe)
            continue
        for raw in log.read_text(encoding="utf-8", errors="replace").splitlines():
            m = _STAMP.match(raw)
            body = m.group(1) if m else ""
            if body.startswith("precision |"):
                run.precision_line, run.precision = body, _precision_fields(body)
            elif body.startswith("arg "):
                key, _, value = body[4:].partition(" = ")
                run.args[key.strip()] = value.strip()
            elif body.startswith("iteration "):
                f = fields(body)
                it = _num(f.get("iteration", "").split("/")[0])
                if it is not None:
                    run.iterations[int(it)] = {k: _num(v) for k, v in f.items() if k != "iteration"}
    return run


# event fields (primus_contract/run_files.py) -> the names of the log line's fields, which the table and plot use
METRIC_NAMES = {"lm_loss": "lm loss", "lr": "lr", "grad_norm": "grad norm", "tokens_per_s_gpu": "tokens/s/GPU",
                "tflops_gpu": "TFLOP/s/GPU", "mem_alloc_gib": "mem alloc GiB", "mem_peak_gib": "mem peak GiB",
                "ms_per_iter": "ms/iter"}


def _flat(tree: dict, prefix: str = "") -> dict:
    """{dotted key: str(value)} as trainer/observability/logger.py's args dump writes them ('trainer.' dropped)."""
    out = {}
    for key, value in (tree or {}).items():
        name = f"{prefix}.{key}" if prefix else ("" if key == "trainer" else key)
        if isinstance(value, dict) and value:
            out.update(_flat(value, name))
        elif name:
            out[name] = str(value)
    return out


def _from_events(run: RunLog, events: list[dict]) -> None:
    for e in events:
        if e["event"] == "precision" and isinstance(e.get("line"), str):
            run.precision_line, run.precision = e["line"], _precision_fields(e["line"])
        elif e["event"] == "metrics" and isinstance(e.get("iteration"), int):
            run.iterations[e["iteration"]] = {name: run_files.number(e.get(key)) for key, name in METRIC_NAMES.items()}
            for pair in e.get("losses") or ():
                if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int):
                    run.losses[pair[0]] = run_files.number(pair[1])


def _precision_fields(body: str) -> dict:
    out = {}
    for part in body.split(" | ")[1:]:
        key, _, value = part.strip().partition(" ")
        out[key] = value
    return out


def decay_end(recipe: dict):
    """Where the LR decay ends (trainer.schedule.lr_decay_iters, null: train_iters); None for a constant LR."""
    s = get(recipe, ("trainer", "schedule")) or {}
    return None if s.get("lr_decay") == "constant" else (s.get("lr_decay_iters") or s.get("train_iters"))


def check_comparable(runs: list[RunLog]) -> None:
    base = runs[0]
    for other in runs[1:]:
        pairs = [(".".join(p), get(base.recipe, p), get(other.recipe, p)) for p in SAME_KEYS]
        pairs.append(("LR decay end (trainer.schedule.lr_decay_iters, else train_iters)", decay_end(base.recipe),
                      decay_end(other.recipe)))
        for what, a, b in pairs:
            if a != b:
                raise UserError(f"runs differ in {what} ({base.name}: {a!r}, {other.name}: {b!r}); "
                                "compare needs the same seed, data, global batch size and LR schedule")


def divergence(base: dict, other: dict) -> tuple[Optional[float], Optional[float], int]:
    common = sorted(set(base) & set(other))
    diffs = [abs(base[i] - other[i]) for i in common if math.isfinite(base[i]) and math.isfinite(other[i])]
    if not diffs:
        return None, None, 0
    return max(diffs), sum(diffs) / len(diffs), len(diffs)


EQUAL_REL = 1e-6  # per-iteration losses this close (relative) are the same training


def _losses(runs: list[RunLog]) -> tuple[list[dict], str]:
    """Each run's lm loss by iteration, and what they are: every iteration's own loss when every run logged
    them (metrics events' `losses`), else the logged interval means (older logs), whose first interval after a
    resume and last before a stop average fewer iterations than an uninterrupted run's."""
    if all(r.losses for r in runs):
        return [dict(sorted(r.losses.items())) for r in runs], "per-iteration losses"
    return [r.series("lm loss") for r in runs], ("logged interval means (a log without per-iteration losses; "
                                                 "intervals cut by a stop or resume average fewer iterations)")


def _verdict(base: dict, other: dict, mx: float) -> str:
    scale = max((abs(base[i]) for i in set(base) & set(other) if math.isfinite(base[i])), default=1.0)
    return "equal" if mx <= EQUAL_REL * max(scale, 1.0) else "different"


def table(runs: list[RunLog]) -> str:
    shown = [r.series("lm loss") for r in runs]  # the table: at the logged iterations
    losses, what_kind = _losses(runs)
    iters = sorted(set().union(*shown))
    lines = ["iteration  " + "  ".join(f"{r.name[-22:]:>22}" for r in runs)]
    for it in iters:
        cells = [f"{s[it]:>22.6f}" if it in s else f"{'-':>22}" for s in losses]
        lines.append(f"{it:>9}  " + "  ".join(cells))
    lines += ["", f"compared: {what_kind}"]
    for run, series in zip(runs[1:], losses[1:]):
        mx, mean, n = divergence(losses[0], series)
        what = (f"{_verdict(losses[0], series, mx)}: max |d lm loss| {mx:.6f}, mean {mean:.6f} over {n} iterations"
                if n else "no common finite iterations")
        lines.append(f"{run.label} against the reference {runs[0].label}: {what}")
    return "\n".join(lines)


def plot(runs: list[RunLog], path: str, title: str = "lm loss, same seed / data / GBS / LR",
         labels: Optional[list] = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, run in enumerate(runs):
        s = run.series("lm loss")
        ax.plot(list(s), list(s.values()), label=labels[i] if labels else run.label, linewidth=1.2)
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def compare(refs: list[str], plot_path: Optional[str]) -> str:
    if len(refs) < 2:
        raise UserError("compare needs at least two RUNs")
    runs = [load_run(r) for r in refs]
    check_comparable(runs)
    out = table(runs)
    for run in runs:  # planned against measured (primus_slurm.planning.plan_runs)
        peaks = run.series("mem peak GiB").values()
        line = plan_runs.versus(plan_runs.planned(run.run_dir), max(peaks, default=None), run.average("tokens/s/GPU"))
        out += f"\n{run.label}: {line}" if line else ""
    if plot_path:
        out += f"\nplot: {plot(runs, plot_path)}"
    return out
