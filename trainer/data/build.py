"""Raw records -> PackedDataset for one split: read, validate (bad-record policy), format, tokenize, handle
overlong documents, pack — through the on-disk cache."""
from __future__ import annotations

from typing import Any

import numpy as np

from .cache import cached
from .dataset import PackedDataset
from .errors import DataError
from .formatters import get_formatter
from .options import DataOptions, SourceSpec
from .packing import one_per_bin, pack_lengths
from .sources import fingerprint, iter_records
from .stats import summarize
from .tokenize import TokenizerInfo, tokenize_documents


def read_documents(opts: DataOptions, spec: SourceSpec, key: str, tokenizer: Any) -> tuple[list, dict]:
    """Formatted documents (lists of segments) + counts {records, skipped_bad_records}."""
    fmt = get_formatter(opts.format)
    docs, records, skipped = [], 0, 0
    for loc, rec, err in iter_records(spec, key):
        records += 1
        try:
            if err:
                raise DataError(f"{loc}: {err}")
            docs.append(fmt(rec, loc, tokenizer))
        except DataError:
            if opts.bad_records == "error":
                raise
            skipped += 1
    if not docs:
        raise DataError(f"{key}.path: no usable records ({records} read, {skipped} bad) in "
                        f"{spec.path or spec.hf_name}")
    return docs, {"records": records, "skipped_bad_records": skipped}


def apply_overlong(tokens: np.ndarray, sup: np.ndarray, offsets: np.ndarray, seq_length: int, policy: str):
    """Truncate or drop documents longer than seq_length, then drop documents with no target left.
    Returns (tokens, sup, offsets, counts)."""
    lengths = np.diff(offsets)
    pos = np.arange(len(tokens)) - np.repeat(offsets[:-1], lengths)
    overlong = lengths > seq_length
    keep_doc = ~overlong if policy == "drop" else np.ones(len(lengths), bool)
    new_len = np.where(keep_doc, np.minimum(lengths, seq_length), 0)
    # a document needs at least one supervised label position (a supervised token after its first)
    sup_after_first = np.where(pos > 0, sup, 0).astype(np.int64)
    csum = np.concatenate([[0], np.cumsum(sup_after_first)])
    starts = offsets[:-1]
    targets = csum[np.minimum(starts + new_len, len(tokens))] - csum[starts]
    no_target = keep_doc & (targets == 0)
    keep_doc &= ~no_target
    keep_tok = np.repeat(keep_doc, lengths) & (pos < seq_length)
    final_len = np.where(keep_doc, np.minimum(lengths, seq_length), 0)[keep_doc]
    new_offsets = np.concatenate([[0], np.cumsum(final_len)]).astype(np.int64)
    counts = {"truncated": int((overlong & keep_doc).sum()) if policy == "truncate" else 0,
              "dropped_overlong": int(overlong.sum()) if policy == "drop" else 0,
              "dropped_no_target": int(no_target.sum())}
    return tokens[keep_tok], sup[keep_tok], new_offsets, counts


def build_split(opts: DataOptions, spec: SourceSpec, name: str, tokenizer: Any, info: TokenizerInfo
                ) -> tuple[PackedDataset, dict]:
    key = f"trainer.data.{name}"
    parts = {"source": fingerprint(spec, key), "formatter": opts.format, "tokenizer": info.identity,
             **opts.packing_key()}

    def build() -> tuple[dict, dict]:
        docs, counts = read_documents(opts, spec, key, tokenizer)
        tokens, sup, offsets = tokenize_documents(docs, tokenizer, info)
        tokens, sup, offsets, more = apply_overlong(tokens, sup, offsets, opts.seq_length, opts.overlong)
        counts.update(more)
        if len(offsets) < 2:
            raise DataError(f"{key}.path: every document was dropped ({counts})")
        lengths = np.diff(offsets)
        order, poff = pack_lengths(lengths, opts.seq_length) if opts.packing else one_per_bin(len(lengths))
        ds = PackedDataset(tokens, sup, offsets, order, poff, opts.sample_length, info.pad_id)
        return ds.arrays(), summarize(ds, **counts)

    arrays, stats, hit, path = cached(opts.cache_dir, name, parts, build)
    ds = PackedDataset.from_arrays(arrays, opts.sample_length, info.pad_id)
    return ds, {**stats, "cache": "hit" if hit else "miss", "cache_path": path}
