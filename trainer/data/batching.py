"""Collation and the deterministic, resumable sample order.

The sample stream is the concatenation of epochs; epoch e is a permutation of range(num_samples) drawn from
``numpy.random.default_rng([seed, e])`` (identity when shuffle is off). Position k of the stream (k = samples
consumed so far, what the checkpoint stores) is therefore a pure function of (num_samples, seed, k): restarts
resume exactly.

Data parallel: iteration t consumes stream positions [t*G, (t+1)*G) with G = global_batch_size;
`global_batch_indices` returns them, `dp_slice` gives DP rank r its contiguous G/dp share, which it splits into
micro-batches of `micro_batch_size` (see `rank_micro_batches`).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterator, Sequence

import numpy as np
import torch


def collate(packs: Sequence[dict]) -> dict:
    """Stack packs into torch tensors. ``cu_seqlens`` covers the flattened B*S tokens (every segment of every
    sample, THD layout); ``max_seqlen`` is the longest segment; ``num_loss_tokens`` the number of supervised
    label positions; ``row_documents`` the most documents in one row (the padding tail not counted)."""
    if not packs:
        raise ValueError("collate needs at least one pack")
    S = len(packs[0]["input_ids"])
    if any(len(p["input_ids"]) != S for p in packs):
        raise ValueError("all packs of a batch must have the same length")
    cu = [np.zeros(1, dtype=np.int64)]
    row_documents = 0
    for b, p in enumerate(packs):
        ends = np.asarray(p["cu_seqlens"][1:], dtype=np.int64)
        real = int(p.get("num_tokens", S))  # the documents end within the real tokens; the padding tail after them
        row_documents = max(row_documents, int(((ends > 0) & (ends <= real)).sum()))
        if ends.size and ends[-1] > S:
            raise ValueError(f"pack {b}: cu_seqlens ends at {int(ends[-1])}, past its {S} tokens")
        if not ends.size or ends[-1] < S:  # close the pack's tail: the next row's first document must not
            ends = np.append(ends, S)      # attend to it as one segment
        cu.append(ends + b * S)
    cu_all = np.concatenate(cu)
    loss_mask = torch.from_numpy(np.stack([p["loss_mask"] for p in packs]).astype(np.float32))
    return {
        "tokens": torch.from_numpy(np.stack([p["input_ids"] for p in packs]).astype(np.int64)),
        "labels": torch.from_numpy(np.stack([p["labels"] for p in packs]).astype(np.int64)),
        "loss_mask": loss_mask,
        "position_ids": torch.from_numpy(np.stack([p["position_ids"] for p in packs]).astype(np.int64)),
        "cu_seqlens": torch.from_numpy(cu_all.astype(np.int32)),
        "max_seqlen": int(np.diff(cu_all).max()),
        "num_loss_tokens": int(loss_mask.sum().item()),
        "num_tokens": int(sum(int(p["num_tokens"]) for p in packs)),
        "row_documents": row_documents,  # the most documents one row holds (the sbhd layout needs 1)
    }


@lru_cache(maxsize=4)
def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Sample order of one epoch (read-only, cached: iterate_batches asks once per micro-batch)."""
    if not shuffle:
        perm = np.arange(num_samples, dtype=np.int64)
    else:
        perm = np.random.default_rng([int(seed), int(epoch)]).permutation(num_samples).astype(np.int64)
    perm.flags.writeable = False
    return perm


def stream_indices(num_samples: int, seed: int, start: int, count: int, shuffle: bool = True) -> np.ndarray:
    """Sample indices at stream positions [start, start+count)."""
    if num_samples <= 0:
        raise ValueError("the dataset is empty")
    out = np.empty(count, dtype=np.int64)
    pos, filled = start, 0
    while filled < count:
        epoch, off = divmod(pos, num_samples)
        perm = epoch_permutation(int(num_samples), int(seed), int(epoch), bool(shuffle))
        take = min(count - filled, num_samples - off)
        out[filled:filled + take] = perm[off:off + take]
        filled += take
        pos += take
    return out


def global_batch_indices(num_samples: int, global_batch_size: int, iteration: int, seed: int,
                         shuffle: bool = True) -> np.ndarray:
    """Indices of the `global_batch_size` samples of (0-based) `iteration`; epoch-wise reshuffled."""
    return stream_indices(num_samples, seed, iteration * global_batch_size, global_batch_size, shuffle)


def dp_slice(indices: np.ndarray, dp_rank: int, dp_size: int) -> np.ndarray:
    if len(indices) % dp_size:
        raise ValueError(f"global batch {len(indices)} is not divisible by data-parallel size {dp_size}")
    per = len(indices) // dp_size
    return indices[dp_rank * per:(dp_rank + 1) * per]


def rank_micro_batches(packs: Sequence[dict], global_batch_size: int, micro_batch_size: int, iteration: int,
                       seed: int, dp_rank: int = 0, dp_size: int = 1, shuffle: bool = True) -> list[dict]:
    """The collated micro-batches DP rank `dp_rank` runs in `iteration` (gradient accumulation steps)."""
    mine = dp_slice(global_batch_indices(len(packs), global_batch_size, iteration, seed, shuffle), dp_rank, dp_size)
    if len(mine) % micro_batch_size:
        raise ValueError(f"per-rank batch {len(mine)} is not divisible by micro_batch_size {micro_batch_size}")
    return [collate([packs[int(i)] for i in mine[j:j + micro_batch_size]])
            for j in range(0, len(mine), micro_batch_size)]


def iterate_batches(packs: Sequence[dict], micro_batch_size: int, seed: int, start_index: int = 0, *,
                    shuffle: bool = True, epochs: int | None = None) -> Iterator[dict]:
    """Collated micro-batches from stream position `start_index` (samples consumed) on. Endless when `epochs`
    is None; otherwise stops at the end of epoch `epochs` (a final short batch is yielded)."""
    n = len(packs)
    end = None if epochs is None else epochs * n
    pos = int(start_index)
    while end is None or pos < end:
        count = micro_batch_size if end is None else min(micro_batch_size, end - pos)
        idx = stream_indices(n, seed, pos, count, shuffle)
        pos += count
        yield collate([packs[int(i)] for i in idx])
