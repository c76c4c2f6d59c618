"""The `after:` key: the steps that run after training, each its own job (`submit --then`, docs/contract.md §1).

A step is a name (`eval`) or a mapping (`{step: export, merged: true}`); the resolved recipe holds every step as
a mapping with all its keys. `when` is the Slurm dependency on the step before: afterok (default: only if it
succeeded) or afterany (whatever its end, e.g. an eval of a failed run's last checkpoint).
"""
from __future__ import annotations

from primus_contract.errors import fail
from primus_contract.text import check_text

WHEN = ("afterok", "afterany")
# step -> {option: (kind, default)}; kinds: bool, int, str, path (absolute)
STEPS = {
    "eval": {"data": ("path", None)},
    "export": {"adapter": ("bool", True), "merged": ("bool", False)},
    "generate": {"prompts": ("path", None), "prompt": ("str", None), "max_new_tokens": ("int", 64)},
}
NEEDS_BASE = "trainer.checkpoint.pretrained"


def _value(where: str, kind: str, value):
    if value is None:
        return None
    ok = {"bool": isinstance(value, bool), "int": isinstance(value, int) and not isinstance(value, bool),
          "str": isinstance(value, str), "path": isinstance(value, str)}[kind]
    if not ok:
        what = {"bool": "true or false", "int": "an integer", "str": "a string", "path": "an absolute path"}[kind]
        fail(f"`{where}` is {value!r:.60}; expected {what}")
    if isinstance(value, str) and not value:
        fail(f"`{where}` must be a non-empty single-line value")
    if isinstance(value, str):
        check_text(where, value)  # as every text field: single line, no control character, valid UTF-8
    if kind == "path" and not value.startswith("/"):
        fail(f"`{where}` is {value!r:.80}; expected an absolute path")
    if kind == "int" and not 1 <= value <= 1 << 20:
        fail(f"`{where}` is {value}; expected an integer in [1, 1048576]")
    return value


def coerce_step(where: str, item) -> dict:
    """One entry of `after`, as its full mapping (every option, defaults filled in)."""
    if isinstance(item, str):
        item = {"step": item}
    if not isinstance(item, dict):
        fail(f"`{where}` is {type(item).__name__} {item!r:.60}; expected a step name or a mapping with `step`")
    name = item.get("step")
    if name not in STEPS:
        fail(f"`{where}.step` is {name!r:.40}; expected one of {', '.join(STEPS)}")
    options = STEPS[name]
    for key in item:
        if key not in ("step", "when", *options):
            fail(f"`{where}.{key}` is not an option of the {name} step; its options: when, {', '.join(options)}")
    when = item.get("when", "afterok")
    if when not in WHEN:
        fail(f"`{where}.when` is {when!r:.40}; expected one of {', '.join(WHEN)}")
    out = {"step": name, "when": when}
    for key, (kind, default) in options.items():
        out[key] = _value(f"{where}.{key}", kind, item.get(key, default))
    return out


def coerce_steps(where: str, value: list) -> list:
    return [coerce_step(f"{where}[{i}]", item) for i, item in enumerate(value)]


def pipeline_rules(after: list, t: dict) -> None:
    """Each step's own cross-field rules (the schema already gave every step its full mapping)."""
    base = (t.get("checkpoint") or {}).get("pretrained")
    for i, s in enumerate(after):
        where = f"after[{i}]"
        if s["step"] == "export" and not (s["adapter"] or s["merged"]):
            fail(f"`{where}` exports nothing: set adapter or merged to true")
        if s["step"] == "export" and s["merged"] and not base:
            fail(f"`{where}.merged` needs a pretrained base (`{NEEDS_BASE}` is unset); export the adapter only")
        if s["step"] == "generate":
            if (s["prompts"] is None) == (s["prompt"] is None):
                fail(f"`{where}` needs exactly one of prompts (a .jsonl file) or prompt (one text)")
            if not base:
                fail(f"`{where}` generates from the base model plus the adapter; `{NEEDS_BASE}` is unset")
        if s["step"] == "eval" and s["data"] is None and not _has_validation(t):
            fail(f"`{where}` evaluates the validation split, and `trainer.data.validation` is unset; give data")


def _has_validation(t: dict) -> bool:
    v = (t.get("data") or {}).get("validation") or {}
    return bool(v.get("path") or v.get("hf_name"))
