"""Which linears LoRA adapts: the one rule that the trainer (trainer/model/lora/layers.py lora_targets), the
contract's checks (rules_model.targeted_linears) and the planner's FLOPs (flops.is_adapted) share.

A pattern of trainer.lora.target_modules or exclude_modules (fnmatch, case-sensitive) matches a linear when it matches
its megatron name or any dotted tail of it: `decoder.layers.3.self_attention.linear_qkv` is named by `linear_qkv`,
`self_attention.linear_qkv`, `layers.3.*` and `decoder.layers.3.*` alike (`*` crosses dots). Expert linears have one
name whatever megatron's MoE layout: SequentialMLP's `mlp.experts.local_experts.<i>.linear_fc1` is matched as the
grouped `mlp.experts.linear_fc1`."""
from __future__ import annotations

import fnmatch
import re
from functools import lru_cache
from typing import Iterable

_LOCAL_EXPERT = re.compile(r"\.local_experts\.\d+(?=\.)")


def canonical(name: str) -> str:
    """One name for an expert linear whatever megatron's MoE layout (SequentialMLP's local_experts.<i> dropped)."""
    return _LOCAL_EXPERT.sub("", name)


@lru_cache(maxsize=16384)
def _tails(name: str) -> tuple:
    parts = canonical(name).split(".")
    return tuple(".".join(parts[i:]) for i in range(len(parts)))


def pattern_matches(pattern: str, names: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(tail, pattern) for n in names for tail in _tails(n))


@lru_cache(maxsize=16384)
def _targeted(names: tuple, targets: tuple, excludes: tuple) -> bool:
    return (any(pattern_matches(p, names) for p in targets)
            and not any(pattern_matches(p, names) for p in excludes))


def targeted(names: Iterable[str], targets: Iterable[str], excludes: Iterable[str] = ()) -> bool:
    """A target pattern matches one of `names` (one linear's names) and no exclude pattern matches any. Cached: the
    planner asks it for every linear of every layout it tries."""
    return _targeted(tuple(names), tuple(targets or ()), tuple(excludes or ()))
