"""Read `trainer.data.*` (and the few other keys the data pipeline needs) from the resolved recipe.

The config is any attribute-access view of the resolved recipe (docs/contract.md section 1), or a plain dict.
Its values are the contract's to check (primus_contract: fields.py, rules_data.py), at validate/submit and at
trainer start; `DataOptions.from_config` only reads them into the data code's types.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from primus_contract.fields import SCHEMA
from primus_contract.rules_data import sample_length

_DATA = SCHEMA["trainer"]["data"]  # allowed values and defaults: primus_contract.fields (the one definition)


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

    @property
    def sample_length(self) -> int:
        """Length of every sample handed to the model: seq_length rounded up to pad_to_multiple_of."""
        return sample_length(self.seq_length, self.pad_to_multiple_of)

    def packing_key(self) -> dict:
        """The options that change the packed arrays (part of the cache key)."""
        return {"seq_length": self.seq_length, "packing": self.packing,
                "pad_to_multiple_of": self.pad_to_multiple_of, "overlong": self.overlong,
                "bad_records": self.bad_records}

    @classmethod
    def from_config(cls, cfg: Any) -> "DataOptions":
        """The data options of a resolved recipe, which primus_contract has checked (validate/submit, and the
        trainer's start check): no value is checked again here. A key left out takes the contract's default."""
        d = "trainer.data."
        cache_dir = get(cfg, d + "cache_dir")
        if not cache_dir:
            cache_dir = os.path.join(get(cfg, "experiment.workspace", None) or "./runs", ".cache", "data")
        return cls(format=get(cfg, d + "format", _DATA["format"].default), train=_source(cfg, "train"),
                   validation=_source(cfg, "validation"), tokenizer=get(cfg, "trainer.tokenizer.path") or None,
                   seq_length=get(cfg, d + "seq_length", _DATA["seq_length"].default),
                   packing=get(cfg, d + "packing", cls.packing),
                   pad_to_multiple_of=get(cfg, d + "pad_to_multiple_of", cls.pad_to_multiple_of),
                   overlong=get(cfg, d + "overlong", cls.overlong),
                   bad_records=get(cfg, d + "bad_records", cls.bad_records),
                   cache_dir=str(cache_dir), shuffle=get(cfg, d + "shuffle", cls.shuffle),
                   seed=get(cfg, "experiment.seed", cls.seed),
                   micro_batch_size=get(cfg, "trainer.schedule.micro_batch_size", cls.micro_batch_size))


def _source(cfg: Any, name: str) -> SourceSpec:
    node = get(cfg, f"trainer.data.{name}")
    split = _DATA[name]["split"].default
    if node is None:
        return SourceSpec(None, None, split, None)
    return SourceSpec(path=get(node, "path") or None, hf_name=get(node, "hf_name") or None,
                      split=get(node, "split") or split, limit=get(node, "limit"))
