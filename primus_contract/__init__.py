"""The recipe contract, written once: keys, types, defaults and allowed values (fields.py, schema.py), the
cross-field rules (rules_*.py) and the rules that need the machine (machine.py).

Pure standard library. The launcher (primus_slurm) runs `resolve` on the recipe it is given; the job ships this
package beside trainer/ in <run_dir>/code and the trainer runs `check_resolved` on recipe.resolved.yaml at start,
so what `submit` accepts is what the trainer accepts.
"""
from __future__ import annotations

from primus_contract.errors import ContractError
from primus_contract.rules_data import checkpoint_rules, data_and_schedule_rules
from primus_contract.rules_levers import lever_rules
from primus_contract.rules_model import epilogue_rules, lora_rules, model_rules, parallel_rules
from primus_contract.rules_pipeline import pipeline_rules
from primus_contract.rules_precision import device_rules, epilogue_owner_rules, recipe_precision_rules
from primus_contract.rules_shapes import fp8_shape_rules
from primus_contract.rules_tracking import tracking_rules
from primus_contract.schema import apply_schema

__all__ = ["ContractError", "apply_schema", "check", "check_resolved", "resolve"]


def check(r: dict) -> None:
    """The cross-field rules over a fully-defaulted recipe; raises ContractError naming the first field."""
    t, c = r["trainer"], r["cluster"]
    recipe_precision_rules(t, c["env_profile"])
    model_rules(t["model"], t)
    checkpoint_rules(t)
    parallel_rules(t, c)
    fp8_shape_rules(t)
    device_rules(t, c["env_profile"])
    lora_rules(t["lora"], t["model"], t["parallelism"]["pipeline"])
    epilogue_rules(t)
    epilogue_owner_rules(t, c["env_profile"])
    lever_rules(t, c["env_profile"])
    data_and_schedule_rules(t)
    tracking_rules(t)
    pipeline_rules(r.get("after") or [], t)


def resolve(raw: dict) -> dict:
    """Defaults filled in and every rule checked (model presets already inlined)."""
    resolved = apply_schema(raw)
    check(resolved)
    return resolved


def check_resolved(resolved: dict) -> None:
    """What the trainer runs at start on recipe.resolved.yaml: the same schema and rules (a hand-edited resolved
    recipe is refused here, in one line, not deep inside megatron)."""
    check(apply_schema(resolved))
