"""Apply the schema: types and ranges checked, unknown keys refused (with the nearest valid name), every
default filled in. Raises ContractError naming the field."""
from __future__ import annotations

import difflib
from typing import Any

from primus_contract.errors import ContractError
from primus_contract.rules_pipeline import coerce_steps
from primus_contract.text import check_text
from primus_contract.fields import ENV_NAME_RE, FLOAT_RE, MODEL, REMOVED, SCHEMA, TIME_RE, Field


def nearest(name: str, options) -> str:
    if not options:  # under a free-form mapping's entry or a plain value: nothing can nest there
        return "; nothing can be set below a single value"
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    if match:
        return f"; did you mean `{match[0]}`?"
    hint = " (a model preset file belongs in `trainer.model.preset`, not `extends`)" if name in MODEL else ""
    return f"; allowed: {', '.join(sorted(options))}{hint}"


def _coerce(path: str, f: Field, value: Any) -> Any:
    if value is None:
        if f.nullable:
            return None
        raise ContractError(f"`{path}` must not be null; expected {f.allowed()}")
    if f.kind == "float" and isinstance(value, str) and FLOAT_RE.match(value.strip()):
        value = float(value)  # YAML 1.1 reads 5e-3 (no dot) as a string
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "list": isinstance(value, list),
        "dict": isinstance(value, dict),
    }[f.kind]
    if not ok and f.kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        sexagesimal = " (YAML reads an unquoted 1:30:00 as the number 5400)" if f.pattern is TIME_RE else ""
        raise ContractError(f"`{path}` is the number {value!r:.40}; quote it: expected {f.help or f.allowed()}, as a "
                        f"string{sexagesimal}")
    if not ok:
        raise ContractError(f"`{path}` is {type(value).__name__} {value!r:.60}; expected {f.allowed()}")
    if f.kind == "float":
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ContractError(f"`{path}` is {value}; expected a finite number")
    if f.kind in ("int", "float"):
        if (f.min is not None and value < f.min) or (f.max is not None and value > f.max):
            raise ContractError(f"`{path}` is {value}; expected {f.allowed()}")
    if f.kind == "str":
        check_text(path, value)
        if f.pattern and not f.pattern.match(value):
            raise ContractError(f"`{path}` is {value!r:.80}; expected {f.help or 'a value matching ' + f.pattern.pattern}")
    if f.choices and value not in f.choices:
        raise ContractError(f"`{path}` is {value!r:.60}; expected {f.allowed()}")
    if f.kind == "list" and f.item == "step":
        return coerce_steps(path, value)
    if f.kind == "list":
        for i, item in enumerate(value):
            if f.item == "int":
                if not isinstance(item, int) or isinstance(item, bool) or item < 0:
                    raise ContractError(f"`{path}[{i}]` is {item!r:.40}; expected an integer >= 0")
                continue
            if not isinstance(item, str):
                raise ContractError(f"`{path}[{i}]` is {type(item).__name__}; expected a string")
            check_text(f"{path}[{i}]", item)
        value = list(value)
    if f.kind == "dict":
        value = _coerce_dict(path, f, value)
    return value


def _coerce_dict(path: str, f: Field, value: dict) -> dict:
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not ENV_NAME_RE.match(k):
            raise ContractError(f"`{path}` has key {k!r:.60}; keys must be names like FOO_BAR")
        if f.item == "number":
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise ContractError(f"`{path}.{k}` must be a number or string")
            if isinstance(v, str):
                check_text(f"{path}.{k}", v)
        else:
            if isinstance(v, bool):
                v = "1" if v else "0"
            if isinstance(v, (int, float)):
                v = str(v)
            if not isinstance(v, str):
                raise ContractError(f"`{path}.{k}` is {type(v).__name__}; expected a string")
            check_text(f"{path}.{k}", v)
        out[k] = v
    return out


def apply_schema(raw: Any, spec: dict = SCHEMA, path: str = "") -> dict:
    """Validate `raw` against `spec`, returning a new dict with every default filled in."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ContractError(f"`{path or 'recipe'}` must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in spec:
            where = f"{path}.{key}" if path else str(key)
            if where in REMOVED:
                raise ContractError(f"unknown key `{where}`: {REMOVED[where]}")
            raise ContractError(f"unknown key `{where}`{nearest(str(key), spec)}")
    out = {}
    for key, sub in spec.items():
        where = f"{path}.{key}" if path else key
        if isinstance(sub, dict):
            out[key] = apply_schema(raw.get(key), sub, where)
        elif key in raw:
            out[key] = _coerce(where, sub, raw[key])
        else:
            out[key] = _copy(sub.default)
    return out


def coerce_value(dotted: str, value: Any) -> Any:
    """One leaf's value checked against its field (`coerce_value("trainer.precision.fp8", "e5m2")` raises)."""
    f = field_at(dotted)
    if not isinstance(f, Field):
        raise ContractError(f"unknown key `{dotted}`", dotted)
    return _coerce(dotted, f, value)


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def field_at(dotted: str) -> Field | dict | None:
    node: Any = SCHEMA
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
