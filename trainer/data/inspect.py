"""`python -m trainer.data inspect --config recipe.resolved.yaml`: dataset stats + one decoded pack with the
supervised spans marked ⟦like this⟧ (the tokens the loss is taken on)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import yaml

import primus_contract

from . import load_splits
from .dataset import PackedDataset
from .errors import DataError
from .options import DataOptions
from .tokenize import load_tokenizer

OPEN, CLOSE = "⟦", "⟧"


def load_yaml(path: str) -> dict:
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f)
    except OSError as e:
        raise DataError(f"--config: cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise DataError(f"--config: {path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise DataError(f"--config: {path} does not hold a mapping")
    return cfg


def render_pack(ds: PackedDataset, i: int, tokenizer: Any = None) -> str:
    """Each document of pack i on its own block; supervised tokens wrapped in ⟦ ⟧; padding summarized."""
    lines = []
    for n, d in enumerate(ds.documents_of(i).tolist()):
        a, b = int(ds.doc_offsets[d]), int(ds.doc_offsets[d + 1])
        toks, sup = ds.tokens[a:b], ds.sup[a:b]
        lines.append(f"--- document {n} ({b - a} tokens, {int(sup[1:].sum())} supervised) ---")
        cuts = np.flatnonzero(np.diff(sup.astype(np.int8))) + 1
        parts = []
        for span_t, span_s in zip(np.split(toks, cuts), np.split(sup, cuts)):
            text = (tokenizer.decode(span_t.tolist(), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
                    if tokenizer is not None else " ".join(map(str, span_t.tolist())))
            parts.append(f"{OPEN}{text}{CLOSE}" if span_s[0] else text)
        lines.append("".join(parts))
    pad = ds.sample_length - int(ds.pack_lengths()[i])
    if pad:
        lines.append(f"--- padding ({pad} tokens) ---")
    return "\n".join(lines)


def inspect(config_path: str, split: str, pack: int) -> str:
    try:  # the contract's checks, as at trainer start
        resolved = primus_contract.apply_schema(load_yaml(config_path))
        primus_contract.check(resolved)
    except primus_contract.ContractError as e:
        raise DataError(str(e)) from None
    opts = DataOptions.from_config(resolved)
    tokenizer = load_tokenizer(opts.tokenizer) if opts.tokenizer else None
    train, val, stats = load_splits(opts, tokenizer)
    ds = train if split == "train" else val
    if ds is None:
        raise DataError(f"trainer.data.{split}.path: no {split} data configured")
    if not 0 <= pack < len(ds):
        raise DataError(f"--pack: {pack} out of range (the {split} split has {len(ds)} packs)")
    out = [json.dumps({k: v for k, v in stats.items() if v is not None}, indent=2),
           f"=== {split} pack {pack} of {len(ds)} (supervised spans in {OPEN} {CLOSE}) ===",
           render_pack(ds, pack, tokenizer)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.data", description="SFT data pipeline tools")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ins = sub.add_parser("inspect", help="stats + one decoded pack of the recipe's data")
    ins.add_argument("--config", required=True, help="resolved recipe YAML")
    ins.add_argument("--split", choices=("train", "validation"), default="train")
    ins.add_argument("--pack", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        print(inspect(args.config, args.split, args.pack))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
