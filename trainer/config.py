"""The resolved recipe as a frozen tree of dataclasses, generated from the contract (docs/contract.md section 1).

One class per section of primus_contract.fields.SCHEMA (`Config` the whole recipe, `TrainerModel` for
trainer.model, ...), one field per key, in the contract's order; the contract is the only list of keys. The
launcher fills every default, so this module has none: a missing key (or one the contract lacks) is an error
that names the full dotted path, at load, not later as a silent default.

    cfg = load_config("run/recipe.resolved.yaml")     # or Config.from_dict(resolved_dict)
    cfg.trainer.model.hidden_size      # attribute access, nested
    cfg.trainer.lora.target_modules    # lists come back as tuples, mappings as read-only dicts
    cfg["trainer"]["model"]            # item access (each section is a read-only Mapping of its keys)
    cfg.to_dict()                      # deep plain-dict copy
    cfg.flatten()                      # [(dotted.key, leaf value)] in recipe order
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Iterator, Optional

import yaml

from primus_contract.fields import SCHEMA, Field


class ConfigError(KeyError):
    """A key the trainer needs is missing from the resolved recipe (or the recipe is not one)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "config error"


class FrozenDict(dict):
    """A mapping value of the recipe (trainer.model.rope_scaling, cluster.env): a dict that cannot change."""

    def _refuse(self, *_args, **_kwargs):
        raise TypeError("config is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse  # type: ignore

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=repr)))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenDict({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return copy.deepcopy(value)


class Section(Mapping):
    """Base of the generated section classes: built from a dict by from_dict, read by attribute or item."""

    _KINDS: ClassVar[dict] = {}  # key -> the contract's Field, or the Section class of a nested section
    _PATH: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, data: Any):
        if not isinstance(data, Mapping):
            where = cls._PATH or "the resolved recipe"
            raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
        unknown = [str(k) for k in data if k not in cls._KINDS]
        if unknown:
            raise ConfigError(f"resolved recipe has key '{_join(cls._PATH, unknown[0])}', which the contract does "
                              "not define")
        values = {}
        for key, kind in cls._KINDS.items():
            if key not in data:
                raise ConfigError(f"resolved recipe has no key '{_join(cls._PATH, key)}'")
            values[key] = kind.from_dict(data[key]) if isinstance(kind, type) else _freeze(data[key])
        return cls(**values)

    def __getitem__(self, key: str) -> Any:
        if key not in self._KINDS:
            raise ConfigError(f"resolved recipe has no key '{_join(self._PATH, key)}'")
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._KINDS)

    def __len__(self) -> int:
        return len(self._KINDS)

    def to_dict(self) -> dict:
        return {k: _thaw(getattr(self, k)) for k in self._KINDS}

    def flatten(self, prefix: str = "") -> list[tuple[str, Any]]:
        """[(dotted.key, leaf value)] in recipe order; lists stay as leaves, non-empty mappings are walked."""
        out: list[tuple[str, Any]] = []
        for key in self._KINDS:
            name, value = _join(prefix, key), getattr(self, key)
            if isinstance(value, Section):
                out.extend(value.flatten(name))
            elif isinstance(value, Mapping) and value:
                out.extend((_join(name, k), _thaw(v)) for k, v in value.items())
            else:
                out.append((name, _thaw(value)))
        return out


_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "list": tuple, "dict": Mapping}


def _class_name(path: str) -> str:
    return "".join(part.title().replace("_", "") for part in path.split(".")) if path else "Config"


def _section_class(spec: dict, path: str) -> type:
    """A frozen dataclass for the section `path` of the contract (and, recursively, its subsections)."""
    kinds, fields = {}, []
    for key, sub in spec.items():
        if isinstance(sub, dict):
            kinds[key] = _section_class(sub, _join(path, key))
            fields.append((key, kinds[key]))
        else:
            assert isinstance(sub, Field) and not hasattr(Section, key), key
            kinds[key] = sub
            fields.append((key, Optional[_TYPES[sub.kind]] if sub.nullable else _TYPES[sub.kind]))
    name = _class_name(path)
    cls = dataclasses.make_dataclass(name, fields, bases=(Section,), frozen=True, eq=True)
    cls._KINDS, cls._PATH = kinds, path
    cls.__module__, cls.__qualname__ = __name__, name
    cls.__doc__ = f"`{path or 'the resolved recipe'}`: generated from primus_contract.fields.SCHEMA."
    globals()[name] = cls  # importable by name, so a config pickles (multiprocessing tests pass it)
    return cls


Config = _section_class(SCHEMA, "")


def load_config(path: str):
    """Parse the resolved recipe YAML at `path` into a Config."""
    with open(path, "r", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: resolved recipe must be a YAML mapping")
    return Config.from_dict(data)
