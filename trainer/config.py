"""Read-only attribute view over the resolved recipe (docs/contract.md section 1).

The launcher fills every default; this module has none of its own. A missing key is an error
that names the full dotted path, so a contract mismatch surfaces immediately instead of as a
silent default.

    cfg = load_config("run/recipe.resolved.yaml")
    cfg.trainer.model.hidden_size      # attribute access, nested
    cfg.trainer.lora.target_modules    # lists come back as tuples (immutable)
    cfg["trainer"]["model"]            # item access works too
    cfg.to_dict()                      # deep plain-dict copy

Recipe keys win over everything but the Mapping methods (keys/items/values/get), to_dict, flatten
and from_dict: the view defines no other public attributes (a key named `path` is a key).
"""
from __future__ import annotations

import copy
from typing import Any, Iterator, Mapping

import yaml


class ConfigError(KeyError):
    """A key the trainer needs is missing from the resolved recipe."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "config error"


def _freeze(value: Any, path: str) -> Any:
    if isinstance(value, Mapping):
        return Config(value, path)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v, f"{path}[{i}]") for i, v in enumerate(value))
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return copy.deepcopy(value)


class Config(Mapping):
    """Immutable nested mapping with attribute access."""

    __slots__ = ("_data", "_path")

    def __init__(self, data: Mapping[str, Any], path: str = "") -> None:
        if not isinstance(data, Mapping):
            raise TypeError(f"config{(' ' + path) if path else ''} must be a mapping, got {type(data).__name__}")
        frozen = {}
        for key, value in data.items():
            key = str(key)
            frozen[key] = _freeze(value, f"{path}.{key}" if path else key)
        object.__setattr__(self, "_data", frozen)
        object.__setattr__(self, "_path", path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Config":
        return cls(data)

    def to_dict(self) -> dict:
        return {k: _thaw(v) for k, v in self._data.items()}

    # mapping protocol
    def __getitem__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            where = f"{self._path}.{key}" if self._path else key
            raise ConfigError(f"resolved recipe has no key '{where}'") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    # attribute access
    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        try:
            return self[key]
        except ConfigError as err:
            raise AttributeError(str(err)) from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"config is read-only (tried to set '{key}')")

    def __delattr__(self, key: str) -> None:
        raise AttributeError(f"config is read-only (tried to delete '{key}')")

    def __repr__(self) -> str:
        return f"Config({self.to_dict()!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    def __hash__(self) -> int:  # type: ignore[override]
        raise TypeError("Config is not hashable; use trainer.checkpoint.recipe_hash")

    def __reduce__(self):
        return (Config, (self.to_dict(), self._path))

    def flatten(self, prefix: str = "") -> list[tuple[str, Any]]:
        """[(dotted.key, leaf value)] in recipe order; lists stay as leaves."""
        out: list[tuple[str, Any]] = []
        for key, value in self._data.items():
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(value, Config) and len(value):
                out.extend(value.flatten(name))
            else:
                out.append((name, _thaw(value)))
        return out


def load_config(path: str) -> Config:
    """Parse the resolved recipe YAML at `path` into a read-only Config."""
    with open(path, "r", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: resolved recipe must be a YAML mapping")
    return Config(data)
