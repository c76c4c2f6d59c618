"""Planned against measured for a run: the plan of its recipe.resolved.yaml (primus_contract.plan) next to the peak
memory and tokens/s the trainer recorded (the metrics and summary events: mem_peak_gib, tokens_per_s_gpu)."""
from __future__ import annotations

from pathlib import Path

import yaml

from primus_contract import apply_schema, run_files
from primus_contract.errors import ContractError
from primus_contract.plan import plan


def planned(run_dir: Path):
    """The plan of the run's resolved recipe; None when it cannot be read or planned (a hand-edited file)."""
    try:
        with open(Path(run_dir) / run_files.RESOLVED, encoding="utf-8") as fh:
            return plan(apply_schema(yaml.safe_load(fh) or {}))
    except (OSError, yaml.YAMLError, ContractError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _pair(planned_value: float, measured, unit: str, spec: str) -> str:
    if measured is None:
        return f"{planned_value:{spec}} planned / - measured {unit}"
    return (f"{planned_value:{spec}} planned / {measured:{spec}} measured {unit} "
            f"({100 * (planned_value / measured - 1):+.0f} %)" if measured else "")


def versus(p, peak_gib, tokens_per_s_gpu) -> str:
    """One line: planned against measured peak and tokens/s per GPU; "" for a CPU run, which no GPU plan describes
    (`status --json` still carries the numbers)."""
    if p is None:
        return "plan: not available (the run's recipe.resolved.yaml cannot be planned)"
    if p.on_cpu:
        return ""
    return (f"plan vs measured: peak {_pair(p.peak_gib, peak_gib, 'GiB', '.1f')}; tokens/s/GPU "
            f"{_pair(p.tokens_per_s_per_gpu, tokens_per_s_gpu, '', ',.0f').rstrip()}")


def as_dict(p, peak_gib, tokens_per_s_gpu) -> dict:
    return {"planned_peak_gib": p and round(p.peak_gib, 2), "measured_peak_gib": peak_gib,
            "planned_tokens_per_s_gpu": p and round(p.tokens_per_s_per_gpu, 1),
            "measured_tokens_per_s_gpu": tokens_per_s_gpu, "planned_fits": p and p.fits}
