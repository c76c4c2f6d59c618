"""SFT data pipeline: raw records -> formatted segments -> tokens -> packed samples -> micro-batches.

Public API (the trainer codes against these):

    from trainer.data import build_datasets, collate, iterate_batches, global_batch_indices, DataError
    train, val, stats = build_datasets(cfg, rank=0, world_size=1)

* ``cfg``: the resolved recipe (attribute view or nested dict); reads trainer.data.*, trainer.tokenizer.path,
  trainer.schedule.micro_batch_size, experiment.seed, experiment.workspace.
* ``train`` / ``val``: `PackedDataset` (len + indexing; ``val`` is None without a validation path/hf_name).
  ``train[i]`` is a pack: input_ids [S] int64, labels [S] int64 (next token within the document, IGNORE_INDEX
  = -100 at each document's last position and on padding), loss_mask [S] float32, position_ids [S] int64
  (restart at 0 per document), cu_seqlens int32 (document boundaries, then the padding tail as its own
  segment), num_tokens (real tokens). S = seq_length rounded up to pad_to_multiple_of (use 16 for FP8,
  32 for FP4 so every sample's token count satisfies the GEMM shape rules); packing: false puts one
  document per sample, padded to S.
* ``stats``: {"train": {...}, "validation": {...} | None}; keys samples, packs, tokens, supervised_tokens,
  supervised_fraction, fill_rate, truncated, dropped_overlong, dropped_no_target, skipped_bad_records,
  records, cache (hit|miss|none), cache_path.
* ``collate(packs)`` -> dict of torch tensors tokens/labels/loss_mask/position_ids [B,S], cu_seqlens int32 over
  the flattened B*S tokens, max_seqlen, num_loss_tokens, num_tokens.
* ``iterate_batches(packs, micro_batch_size, seed, start_index=0, shuffle=True, epochs=None)``: endless,
  deterministic collated micro-batches resuming at stream position ``start_index`` (samples consumed).
* Data parallel: ``global_batch_indices(num_samples, global_batch_size, iteration, seed, shuffle=True)`` gives
  the sample ids of iteration t (stream positions [t*G, (t+1)*G), epoch-wise reshuffled with
  default_rng([seed, epoch]), identical on every rank and across restarts); ``dp_slice(idx, dp_rank, dp_size)``
  the rank's contiguous share; ``rank_micro_batches(packs, G, micro_batch_size, iteration, seed, dp_rank,
  dp_size)`` the collated micro-batches of that share. Samples consumed after t iterations = t*G.

Errors: bad options or records raise `DataError` (one line naming the config key or file:line).
CLI: ``python -m trainer.data inspect --config recipe.resolved.yaml``.
"""
from __future__ import annotations

from typing import Any

from . import mlperf
from .batching import collate, dp_slice, global_batch_indices, iterate_batches, rank_micro_batches
from .build import build_split
from .dataset import PackedDataset
from .errors import DataError
from .options import DataOptions
from .tokenize import IGNORE_INDEX, load_tokenizer, tokenizer_info

__all__ = ["build_datasets", "collate", "iterate_batches", "global_batch_indices", "dp_slice",
           "rank_micro_batches", "PackedDataset", "DataError", "DataOptions", "IGNORE_INDEX", "load_splits",
           "check_vocab"]


def load_splits(opts: DataOptions, tokenizer: Any = None):
    """(train, val, stats) for validated options; `tokenizer` is loaded from opts.tokenizer when None."""
    out, stats = {}, {}
    if opts.format == "mlperf_npy":
        pad = 0
        if opts.tokenizer:
            pad = tokenizer_info(tokenizer or load_tokenizer(opts.tokenizer)).pad_id
        for name, spec in (("train", opts.train), ("validation", opts.validation)):
            out[name], stats[name] = mlperf.load_split(opts, spec, name, pad) if spec.enabled else (None, None)
        return out["train"], out["validation"], stats
    tokenizer = tokenizer or load_tokenizer(opts.tokenizer)
    info = tokenizer_info(tokenizer)
    for name, spec in (("train", opts.train), ("validation", opts.validation)):
        out[name], stats[name] = build_split(opts, spec, name, tokenizer, info) if spec.enabled else (None, None)
    return out["train"], out["validation"], stats


def build_datasets(cfg: Any, rank: int = 0, world_size: int = 1, tokenizer: Any = None):
    """(train, val, stats) from the resolved recipe. Every rank calls it; the first to take the cache lock
    tokenizes and packs, the others read its cache file. Both datasets are the full splits on every rank;
    data-parallel sharding happens per iteration with `global_batch_indices` / `dp_slice`."""
    train, val, stats = load_splits(DataOptions.from_config(cfg), tokenizer)
    check_vocab({"train": train, "validation": val}, _model_vocab(cfg))
    return train, val, stats


def _model_vocab(cfg: Any):
    try:
        return cfg.trainer.model.vocab_size
    except AttributeError:
        return ((cfg.get("trainer") or {}).get("model") or {}).get("vocab_size") if isinstance(cfg, dict) else None


def check_vocab(splits: dict, vocab_size) -> None:
    """Refuse token ids (padding included) the model has no embedding for: with tensor parallelism megatron's
    vocab-parallel embedding turns them into zero vectors and their labels into nonsense losses without a
    word; without it they index past the embedding table."""
    if not vocab_size:
        return
    for name, ds in splits.items():
        if ds is None:
            continue
        what, top = max(("token id", int(ds.tokens.max()) if ds.tokens.size else -1), ("padding id", ds.pad_id),
                        key=lambda item: item[1])
        if top >= int(vocab_size):
            raise DataError(f"trainer.model.vocab_size: the {name} data has {what} {top} >= vocab_size "
                            f"{vocab_size} (data or tokenizer made for another model?)")
