"""Recipe loading: YAML (strict), `extends:` presets, `${VAR:default}` interpolation, `--set` overrides,
model-preset inlining, schema defaults and cross-field validation. Output: a `Recipe` whose `.resolved` dict
is what the trainer reads (docs/contract.md §1)."""
from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from primus_contract import hf_config
from primus_slurm.config import schema
from primus_slurm.errors import UserError
from primus_slurm.resources import recipes_dir
from primus_slurm.config.validate import validate

MAX_RECIPE_BYTES = 1 << 20
MAX_EXTENDS_DEPTH = 16
VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


@dataclass
class Recipe:
    path: Path
    raw: dict  # after extends + interpolation + --set, before defaults
    resolved: dict  # fully defaulted, validated, model preset inlined

    @property
    def hash(self) -> str:
        return hashlib.sha256(dump(self.resolved).encode()).hexdigest()


def dump(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases (no billion-laughs) and without duplicate keys."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise UserError(f"YAML alias `*{event.anchor}` at line {event.start_mark.line + 1}: anchors and aliases "
                            "are not allowed in recipes; use `extends:` to share settings")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (list, dict, set)):
                raise UserError(f"mapping key at line {key_node.start_mark.line + 1} is a {type(key).__name__}; "
                                "keys must be plain names")
            if key in seen:
                raise UserError(f"duplicate key `{key}` at line {key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict:
    if path.exists() and not path.is_file():  # a directory, FIFO or device: never read it
        raise UserError(f"recipe {str(path)!r} is not a regular file")
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_RECIPE_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"recipe file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read recipe {str(path)!r}: {exc.strerror}") from None
    if len(data) > MAX_RECIPE_BYTES:
        raise UserError(f"recipe {str(path)!r} is over {MAX_RECIPE_BYTES} bytes; at most {MAX_RECIPE_BYTES} are allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"recipe {str(path)!r} is not valid UTF-8 (byte {exc.start})") from None
    try:
        loaded = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"recipe {str(path)!r} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except UserError:  # (_StrictLoader's own; a ValueError)
        raise
    except (ValueError, RecursionError) as exc:  # an integer past Python's 4300 digits; thousands of nested [
        raise UserError(f"recipe {str(path)!r} cannot be read: {_unreadable(exc)}") from None
    if loaded is None:
        raise UserError(f"recipe {str(path)!r} is empty; a recipe is a YAML mapping (see `primus-slurm recipes` "
                        "for examples)")
    if not isinstance(loaded, dict):
        raise UserError(f"recipe {str(path)!r} must be a mapping at the top level")
    return _substitute_recipe_dir(loaded, path.resolve().parent)


def _substitute_recipe_dir(node: Any, folder: Path) -> Any:
    if isinstance(node, dict):
        return {k: _substitute_recipe_dir(v, folder) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute_recipe_dir(v, folder) for v in node]
    if isinstance(node, str):
        return node.replace("${RECIPE_DIR}", str(folder))
    return node


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def find_recipe(name: str, relative_to: Path | None = None) -> Path:
    """A path, or a name under recipes/ (with or without .yaml), or under recipes/presets/."""
    candidates = [Path(name)]
    if relative_to is not None:
        candidates.insert(0, relative_to / name)
    stem = name if name.endswith((".yaml", ".yml")) else name + ".yaml"
    candidates += [recipes_dir() / stem, recipes_dir() / "presets" / stem]
    for cand in candidates:
        if cand.is_file():
            return cand
    if Path(name).exists():
        what = "a directory" if Path(name).is_dir() else "not a regular file"
        raise UserError(f"recipe {name!r} is {what}; give a recipe .yaml file or a name from `primus-slurm recipes`")
    raise UserError(f"recipe or preset {name!r} not found (looked in {', '.join(str(c) for c in candidates)})")


def _load_with_extends(path: Path, stack: tuple = ()) -> dict:
    real = path.resolve()
    if real in stack:
        chain = " -> ".join(p.name for p in (*stack, real))
        raise UserError(f"`extends` is recursive: {chain}")
    if len(stack) >= MAX_EXTENDS_DEPTH:
        raise UserError(f"`extends` is nested deeper than {MAX_EXTENDS_DEPTH} levels at {path.name}")
    data = read_yaml(path)
    parents = data.pop("extends", None)
    if parents is None:
        return data
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise UserError(f"`extends` in {path.name} must be a preset name or a list of names")
    merged: dict = {}
    for parent in parents:
        merged = deep_merge(merged, _load_with_extends(find_recipe(parent, path.parent), (*stack, real)))
    return deep_merge(merged, data)


def interpolate(node: Any, env: Mapping[str, str], secrets: set, where: str = "") -> Any:
    if isinstance(node, dict):
        return {k: interpolate(v, env, secrets, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, env, secrets, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, str) or "${" not in node:
        return node

    def value_of(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in secrets:
            raise UserError(f"`{where}` interpolates secret ${{{name}}}; secrets are passed to the job through "
                            "the environment (cluster.secrets), never written into a recipe")
        if name in env:
            return env[name]
        if default is None:
            raise UserError(f"`{where}` needs environment variable {name} (unset; write ${{{name}:default}} "
                            "to give a default)")
        return default

    whole = VAR_RE.fullmatch(node)
    text = VAR_RE.sub(value_of, node)
    if whole:  # a value that is one ${...} takes the type of what it expands to: ${TP:2} -> 2
        try:
            typed = yaml.safe_load(text) if text.strip() else text
        except (yaml.YAMLError, ValueError, RecursionError):  # (kept as text; a field's own check judges it)
            return text
        return typed if isinstance(typed, (int, float, bool)) or typed is None else text
    return text


def parse_set(item: str) -> tuple[str, Any, str]:
    """(dotted key, YAML value, the text as typed): a text field takes the text itself (apply_set)."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected key=value, e.g. --set trainer.parallelism.tensor=2")
    key, _, text = item.partition("=")
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
        raise UserError(f"--set {item!r}: {key!r} is not a dotted key like trainer.schedule.lr")
    try:
        value = yaml.load(text, Loader=_StrictLoader) if text.strip() else ""  # noqa: S506
    except yaml.YAMLError:
        value = text
    except UserError:
        raise
    except (ValueError, RecursionError) as exc:
        raise UserError(f"--set {key}: the value cannot be read: {_unreadable(exc)}") from None
    return key, value, text


def _unreadable(exc: BaseException) -> str:
    """Why YAML could not build a value (audit, 2026-12-06: these were tracebacks with exit 1)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split(";")[0].split(": value has")[0]


def _as_text(value: Any, text: str) -> Any:
    """A text field's --set value: the text as typed (YAML would read 60 and 1:30:00 as numbers, fold a newline
    into a space and drop '# x' as a comment), unless it is quoted or YAML's null."""
    typed = text.strip()
    if typed[:1] in ("'", '"') or typed in ("", "null", "Null", "NULL", "~"):
        return value
    return text if "\n" in text else typed  # a newline stays, for the field's own check to refuse


def apply_set(data: dict, key: str, value: Any, text: str) -> None:
    """Set a dotted key; a text field takes the text as typed (_as_text)."""
    node_spec: Any = schema.SCHEMA
    node = data
    parts = key.split(".")
    for i, part in enumerate(parts):
        if isinstance(node_spec, schema.Field) and node_spec.kind == "dict" and i == len(parts) - 1:
            # a free-form mapping such as cluster.env.NAME: text values as typed (0755 stays 0755, not 493)
            node[part] = _as_text(value, text) if node_spec.item == "str" else value
            return
        if not isinstance(node_spec, dict) or part not in node_spec:
            prefix = ".".join(parts[:i])
            options = node_spec if isinstance(node_spec, dict) else {}
            raise UserError(f"--set: unknown key `{key}` (at `{part}` under `{prefix or 'recipe'}`)"
                            f"{schema.nearest(part, options)}")
        node_spec = node_spec[part]
        if i == len(parts) - 1:
            is_text = isinstance(node_spec, schema.Field) and node_spec.kind == "str"
            node[part] = _as_text(value, text) if is_text else value
        else:
            if node.get(part) is None:
                node[part] = {}
            elif not isinstance(node[part], dict):  # never silently drop what the recipe wrote there
                where = ".".join(parts[:i + 1])
                raise UserError(f"--set {key}: `{where}` must be a mapping, got {type(node[part]).__name__} "
                                "in the recipe")
            node = node[part]


def _anchor_relative_paths(resolved: dict) -> None:
    """A relative data / tokenizer / checkpoint path that exists from the current directory means that file, as
    `experiment.workspace` does; the job runs elsewhere (its run directory), so it gets the absolute path. Not
    with docker/podman/apptainer (inside those a relative path is the image's); a value that does not exist here
    stays as written (a hub name, or a path only the job can see)."""
    if resolved["cluster"]["container"]["runtime"] not in ("none", "pyxis"):  # pyxis: a local job runs on the host,
        return  # and on Slurm its default workdir is the run directory, where the relative path did not point either
    t = resolved["trainer"]
    for node, key in ((t["data"]["train"], "path"), (t["data"]["validation"], "path"), (t["tokenizer"], "path"),
                      (t["checkpoint"], "pretrained")):
        value = node.get(key)
        if isinstance(value, str) and value and not value.startswith(("/", "~")) and os.path.exists(value):
            node[key] = os.path.abspath(value)


def load_model_preset(name: str) -> dict:
    folder = recipes_dir() / "models"
    path = folder / f"{name}.yaml"
    if not schema.NAME_RE.match(name) or not path.is_file():
        names = sorted(p.stem for p in folder.glob("*.yaml"))
        raise UserError(f"`trainer.model.preset` is {name!r}; known presets: {', '.join(names)}")
    return read_yaml(path)


def checkpoint_model(trainer: dict) -> dict:
    """`trainer.model.preset: checkpoint`: the architecture is read from `trainer.checkpoint.pretrained`'s
    config.json (the fields the recipe sets itself are then checked against it like any other)."""
    path = ((trainer.get("checkpoint") or {}).get("pretrained")) or ""
    if not isinstance(path, str) or not os.path.isdir(os.path.expanduser(path)):
        raise UserError(f"`trainer.model.preset` checkpoint reads the architecture from trainer.checkpoint.pretrained's "
                        f"config.json, which must be a directory readable here (got {path!r})")
    path = os.path.abspath(os.path.expanduser(path))
    try:
        hf = hf_config.read_config(path)
        return {**hf_config.model_fields(hf), "max_position_embeddings": int(hf.get("max_position_embeddings", 4096))}
    except hf_config.HFConfigError as e:
        raise UserError(str(e)) from None


def load_recipe(path: str | os.PathLike, overrides=(), env: Mapping[str, str] | None = None,
                check: bool = True) -> Recipe:
    """check False: defaults filled in, the contract's rules not run (`plan --frontier` checks each layout)."""
    env = os.environ if env is None else env
    recipe_path = Path(path)
    if not recipe_path.is_file() and not str(path).endswith((".yaml", ".yml")):
        recipe_path = find_recipe(str(path))
    raw = _load_with_extends(recipe_path)
    for item in overrides:
        apply_set(raw, *parse_set(item))
    resolved = resolve_raw(raw, env, check)
    return Recipe(path=recipe_path, raw=raw, resolved=resolved)


def resolve_raw(raw: dict, env: Mapping[str, str], check: bool = True) -> dict:
    """The resolved recipe of a raw one (extends and --set applied): secrets and ${VAR}s interpolated, the model
    preset inlined, every default filled in, and (check) every rule of the contract checked. `raw` is
    interpolated in place."""
    for section in ("experiment", "cluster", "trainer"):
        if not isinstance(raw.get(section, {}), dict):
            raise UserError(f"`{section}` must be a mapping, got {type(raw[section]).__name__}")
    listed = (raw.get("cluster") or {}).get("secrets")
    if listed is not None and (not isinstance(listed, list) or not all(isinstance(s, str) for s in listed)):
        raise UserError("`cluster.secrets` must be a list of environment variable names")
    raw.update(interpolate(raw, env, set(listed or ()) | set(schema.ALWAYS_SECRET)))
    trainer = raw.get("trainer", {})
    model = trainer.get("model", {})
    if not isinstance(model, dict):
        raise UserError(f"`trainer.model` must be a mapping (e.g. {{preset: llama3_8b}}), got {type(model).__name__}")
    preset = model.get("preset", schema.MODEL["preset"].default)
    if not isinstance(preset, str):
        raise UserError("`trainer.model.preset` must be a preset name")
    base = checkpoint_model(trainer) if preset == "checkpoint" else load_model_preset(preset)
    with_preset = deep_merge(raw, {"trainer": {"model": {**base, **model}}})
    resolved = schema.apply_schema(with_preset)
    resolved["experiment"]["workspace"] = os.path.abspath(os.path.expanduser(resolved["experiment"]["workspace"]))
    _anchor_relative_paths(resolved)
    if check:
        validate(resolved)
    return resolved
