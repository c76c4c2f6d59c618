"""Read `trainer.data.*` (and the few other keys the data pipeline needs) from the resolved recipe.

The config is any attribute-access view of the resolved recipe (docs/contract.md section 1), or a plain dict.
`DataOptions.from_config` validates the values and raises `DataError` naming the offending key.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from primus_contract.fields import SCHEMA

from .errors import DataError

_DATA = SCHEMA["trainer"]["data"]  # allowed values and defaults: primus_contract.fields (the one definition)
FORMATS = _DATA["format"].choices


def get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """`get(cfg, "trainer.data.seq_length")` on attribute views, dicts or SimpleNamespaces; `default` if absent."""
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        if isinstance(node, dict):
            if part not in node:
                return default
            node = node[part]
        elif hasattr(node, part):
            node = getattr(node, part)
        else:
            try:
                node = node[part]
            except (KeyError, TypeError, IndexError):
                return default
    return node


@dataclass(frozen=True)
class SourceSpec:
    path: str | None
    hf_name: str | None
    split: str
    limit: int | None

    @property
    def enabled(self) -> bool:
        return bool(self.path or self.hf_name)


@dataclass(frozen=True)
class DataOptions:
    format: str
    train: SourceSpec
    validation: SourceSpec
    tokenizer: str | None
    seq_length: int
    packing: bool = _DATA["packing"].default
    pad_to_multiple_of: int = _DATA["pad_to_multiple_of"].default
    overlong: str = _DATA["overlong"].default
    bad_records: str = _DATA["bad_records"].default
    cache_dir: str | None = None
    shuffle: bool = _DATA["shuffle"].default
    seed: int = SCHEMA["experiment"]["seed"].default
    micro_batch_size: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def sample_length(self) -> int:
        """Length of every sample handed to the model: seq_length rounded up to pad_to_multiple_of."""
        m = self.pad_to_multiple_of
        return -(-self.seq_length // m) * m

    def packing_key(self) -> dict:
        """The options that change the packed arrays (part of the cache key)."""
        return {"seq_length": self.seq_length, "packing": self.packing,
                "pad_to_multiple_of": self.pad_to_multiple_of, "overlong": self.overlong,
                "bad_records": self.bad_records}

    @classmethod
    def from_config(cls, cfg: Any) -> "DataOptions":
        d = "trainer.data."
        fmt = get(cfg, d + "format")
        if fmt not in FORMATS:
            raise DataError(f"trainer.data.format: {fmt!r} is not one of {'|'.join(FORMATS)}")
        seq = _int(get(cfg, d + "seq_length"), d + "seq_length", minimum=2)
        mult = get(cfg, d + "pad_to_multiple_of", 1)
        mult = 1 if mult is None else _int(mult, d + "pad_to_multiple_of", minimum=1)
        overlong = _choice(cfg, "overlong")
        bad = _choice(cfg, "bad_records")
        train = _source(cfg, "train", "train")
        if not train.enabled:
            raise DataError("trainer.data.train.path: no training data given (set path or hf_name)")
        tok = get(cfg, "trainer.tokenizer.path")
        if fmt != "mlperf_npy" and not tok:
            raise DataError("trainer.tokenizer.path: a tokenizer is required for format " + fmt)
        cache_dir = get(cfg, d + "cache_dir")
        if not cache_dir:
            cache_dir = os.path.join(get(cfg, "experiment.workspace", None) or "./runs", ".cache", "data")
        return cls(format=fmt, train=train, validation=_source(cfg, "validation", "validation"),
                   tokenizer=tok, seq_length=seq, packing=bool(get(cfg, d + "packing", True)),
                   pad_to_multiple_of=mult, overlong=overlong, bad_records=bad, cache_dir=str(cache_dir),
                   shuffle=bool(get(cfg, d + "shuffle", True)),
                   seed=_int(get(cfg, "experiment.seed", 1234), "experiment.seed"),
                   micro_batch_size=_int(get(cfg, "trainer.schedule.micro_batch_size", 1) or 1,
                                         "trainer.schedule.micro_batch_size", minimum=1))


def _choice(cfg: Any, name: str) -> str:
    value = get(cfg, "trainer.data." + name, None) or _DATA[name].default
    if value not in _DATA[name].choices:
        raise DataError(f"trainer.data.{name}: {value!r} is not one of {'|'.join(_DATA[name].choices)}")
    return value


def _source(cfg: Any, name: str, default_split: str) -> SourceSpec:
    key = f"trainer.data.{name}"
    node = get(cfg, key)
    if node is None:
        return SourceSpec(None, None, default_split, None)
    limit = get(node, "limit")
    if limit is not None:
        limit = _int(limit, key + ".limit", minimum=1)
    path = get(node, "path")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise DataError(f"{key}.path: expected a file or directory path, got {path!r}")
    return SourceSpec(path=str(path) if path else None, hf_name=get(node, "hf_name"),
                      split=str(get(node, "split") or default_split), limit=limit)


def _int(value: Any, key: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                raise ValueError
        except ValueError:
            raise DataError(f"{key}: expected an integer, got {value!r}") from None
    if minimum is not None and value < minimum:
        raise DataError(f"{key}: must be >= {minimum}, got {value}")
    return value
