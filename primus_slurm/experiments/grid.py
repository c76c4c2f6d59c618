"""`sweep --grid KEY=V1,V2 --zip KEY=...`: the trials of a sweep, each a list of `--set` items.

Every --grid key is an axis of its own; the --zip keys are one axis together (their i-th values go together).
The trials are the product of the axes, in the order given. A key and each of its values are checked here, once,
as `--set` would take them (recipe.apply_set: unknown keys with the nearest name; the field's type), so a typo is
one line before any trial is planned.
"""
from __future__ import annotations

import itertools

from primus_contract.errors import ContractError
from primus_contract.schema import coerce_value, field_at
from primus_contract.fields import Field

from primus_slurm.errors import UserError
from primus_slurm.config.recipe import apply_set, parse_set

MAX_TRIALS = 1000  # more only with --max-trials
UNSWEPT = {"after": "the steps after each trial are --then's (or the recipe's `after:`), not swept",
           "experiment.name": "the trials of one sweep share their experiment (the sweep's directory); sweep it "
                              "in separate sweeps",
           "experiment.workspace": "the trials of one sweep share their workspace (the sweep's directory); sweep it "
                                   "in separate sweeps"}
MAX_TRIALS_CAP = 10000  # --max-trials' own bound: planning 10,000 trials takes about 45 s on one core


def check_overlap(overrides: tuple, swept: list[str]) -> None:
    """A key both set (`--set`) and swept: the grid's values would replace --set's without a word."""
    for item in overrides:
        key = item.partition("=")[0].strip()
        for s in swept:
            if key == s or s.startswith(key + ".") or key.startswith(s + "."):
                raise UserError(f"--set {key} and the swept key {s}: the grid's values would replace --set's; "
                                "give the key once")


def parse_item(option: str, item: str) -> tuple[str, list[str], list]:
    """`KEY=V1,V2` -> (KEY, [V1, V2], their values), each value checked against KEY's field."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"{option} {item!r}: expected KEY=V1,V2,... e.g. {option} trainer.schedule.lr=1e-4,3e-4")
    values = [v.strip() for v in text.split(",")] if text.strip() else []
    if not values:
        raise UserError(f"{option} {key}: the grid is empty; give at least one value (KEY=V1,V2,...)")
    if any(not v for v in values):
        raise UserError(f"{option} {key}={text}: an empty value between commas")
    return key, values, [check_value(option, key, value) for value in values]


def check_value(option: str, key: str, text: str):
    """The value `text` gives `key` (as --set gives it: 1e-3 and 0.001 are one value); UserError when `key` is
    no recipe key, or `text` is not a value of its type."""
    probe: dict = {}
    try:
        apply_set(probe, *parse_set(f"{key}={text}"))
    except UserError as exc:
        raise UserError(f"{option} {key}={text}: {str(exc).removeprefix('--set: ')}") from None
    node = probe
    for part in key.split("."):
        node = node[part]
    field = field_at(key)
    if field is None:  # an entry of a free-form mapping (cluster.env.NAME): the recipe's own check takes it
        return node
    if not isinstance(field, Field):
        raise UserError(f"{option} {key}: a section, not one value; sweep one of its keys")
    if key in UNSWEPT:
        raise UserError(f"{option} {key}: {UNSWEPT[key]}")
    try:
        return coerce_value(key, node)
    except ContractError as exc:
        raise UserError(f"{option} {key}={text}: {exc}") from None


def trials(grids: tuple[str, ...], zips: tuple[str, ...], max_trials: int | None = None) -> list[list[tuple[str, str]]]:
    """[[(key, value text), ...] per trial], the product of the axes; UserError for bad input or too many."""
    if not grids and not zips:
        raise UserError("sweep: give at least one --grid KEY=V1,V2,... (or --zip)")
    axes: list[list[list[tuple[str, str]]]] = []
    seen: set[str] = set()

    def add_key(option: str, key: str) -> None:
        if key in seen:
            raise UserError(f"{option} {key}: the key is swept twice; give it once")
        seen.add(key)

    for item in grids:
        key, values, coerced = parse_item("--grid", item)
        add_key("--grid", key)
        _once(f"--grid {item}", values, coerced)
        axes.append([[(key, v)] for v in values])
    if zips:
        parsed = [parse_item("--zip", item) for item in zips]
        for key, _, _ in parsed:
            add_key("--zip", key)
        lengths = {len(values) for _, values, _ in parsed}
        if len(lengths) > 1:
            counts = ", ".join(f"{key}: {len(values)}" for key, values, _ in parsed)
            raise UserError(f"--zip keys vary together, so each needs as many values ({counts})")
        rows = list(zip(*(v for _, v, _ in parsed)))
        _once("--zip " + " --zip ".join(zips), [", ".join(row) for row in rows], list(zip(*(c for *_, c in parsed))))
        axes.append([list(zip([k for k, _, _ in parsed], row)) for row in rows])
    count = 1
    for axis in axes:
        count *= len(axis)
    limit = max_trials if max_trials is not None else MAX_TRIALS
    if count > limit:
        allow = (f"--max-trials {max_trials} allows fewer" if max_trials is not None else
                 f"more than {MAX_TRIALS} only with --max-trials N")
        raise UserError(f"sweep: the grid makes {count:,} trials; {allow}")
    return [[pair for part in combo for pair in part] for combo in itertools.product(*axes)]


def _once(what: str, points: list[str], values: list) -> None:
    """A point of an axis given twice would make two identical trials: its values compared as the recipe takes them
    (1e-3 and 0.001; by type too, so that true is not 1)."""
    typed = [_typed(v) for v in values]
    twice = next((i for i, v in enumerate(typed) if v in typed[:i]), None)
    if twice is not None:
        first = points[typed.index(typed[twice])]
        same = "" if first == points[twice] else f"as {first}: "
        raise UserError(f"{what}: {points[twice]} is given twice ({same}two identical trials); give each once")


def _typed(value):
    """A value with its type (in a tuple, each item's): True == 1 in Python, not in a recipe."""
    if isinstance(value, (tuple, list)):
        return type(value), tuple(_typed(v) for v in value)
    if isinstance(value, dict):
        return dict, tuple((k, _typed(v)) for k, v in value.items())
    return type(value), value


def set_items(trial: list[tuple[str, str]]) -> list[str]:
    """A trial's --set items."""
    return [f"{key}={value}" for key, value in trial]


def varying(all_trials: list[list[tuple[str, str]]]) -> list[str]:
    """The keys whose values differ between trials (the leaderboard's columns)."""
    keys = list(dict.fromkeys(key for trial in all_trials for key, _ in trial))
    return [k for k in keys if len({dict(t).get(k) for t in all_trials}) > 1] or keys
