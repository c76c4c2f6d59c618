"""Core attention for megatron-core's local spec that honours packed (THD) batches.

megatron-core's local DotProductAttention refuses `packed_seq_params`; TE's attention needs a GPU.
This module is the drop-in `core_attention` for the local spec (CPU and GPU without TE): it runs
torch's scaled_dot_product_attention with

* THD input (`packed_seq_params.qkv_format == "thd"`): q [t, np, hn], k/v [t, ng, hn]; a
  per-document block-diagonal causal mask built from `cu_seqlens_q` so no token attends across a
  document boundary (rows past cu_seqlens[-1] are treated as one trailing document). The t tokens
  are cut at document boundaries into runs of at most CHUNK_TOKENS (a longer document is a run of
  its own) and each run is one SDPA call with its own small mask: attention costs ~t*CHUNK_TOKENS
  instead of t^2 (on CPU the dense t x t masked kernel was a third of a quickstart step). The runs
  and masks are computed once per forward (cached on the PackedSeqParams) and reused by every layer;
* SBHD input (no packed params): q [s, b, np, hn]; plain causal attention.

Output is [t, np*hn] (THD) or [s, b, np*hn], as megatron's attention expects.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule


def document_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Document index of each of `total` packed positions from cumulative lengths [n_docs+1]."""
    pos = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), pos, right=True)


def packed_causal_mask(cu_seqlens: torch.Tensor, total: int, device) -> torch.Tensor:
    """Bool [total, total]: True where query i may attend key j (same document, j <= i)."""
    doc = document_ids(cu_seqlens.to(device), total)
    same = doc[:, None] == doc[None, :]
    return torch.tril(same)


CHUNK_TOKENS = 128


def packed_chunks(cu_seqlens: torch.Tensor, total: int, device, cap: int = CHUNK_TOKENS
                  ) -> list[tuple[int, int, Optional[torch.Tensor]]]:
    """[(start, end, mask)] covering [0, total) in runs of whole documents of at most `cap` tokens
    (a longer document is its own run). mask is the run's block-diagonal causal mask, or None when
    the run is a single document (plain causal attention)."""
    ends = cu_seqlens.detach().reshape(-1).cpu().tolist()[1:]  # cu[0] is the start (0), as in document_ids
    cu = sorted({int(x) for x in ends if 0 < int(x) < total}) + [total]
    bounds, prev = [0], 0
    for end in cu:  # start a new run before the document that would overflow it
        if end - bounds[-1] > cap and prev > bounds[-1]:
            bounds.append(prev)
        prev = end
    bounds.append(total)
    chunks = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        inner = [0] + [x - a for x in cu if a < x < b] + [b - a]
        mask = None if len(inner) == 2 else packed_causal_mask(
            torch.tensor(inner, dtype=torch.int32), b - a, device)
        chunks.append((a, b, mask))
    return chunks


def _cached_chunks(packed_seq_params, total: int, device):
    key = (total, str(device))
    cache = getattr(packed_seq_params, "_primus_chunks", None)
    if cache is None or cache[0] != key:
        cache = (key, packed_chunks(packed_seq_params.cu_seqlens_q, total, device))
        packed_seq_params._primus_chunks = cache
    return cache[1]


class SDPACoreAttention(MegatronModule):
    """scaled_dot_product_attention with GQA and packed-sequence support."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection=None, **_unused):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention does not support context parallelism")
        self.layer_number = layer_number
        self.attn_mask_type = attn_mask_type
        tp = pg_collection.tp.size() if pg_collection is not None and hasattr(pg_collection, "tp") \
            else config.tensor_model_parallel_size
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.softmax_scale = softmax_scale  # None -> 1/sqrt(head_dim) inside SDPA
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if attention_bias is not None:
            raise ValueError("SDPACoreAttention does not support attention_bias")
        thd = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        if thd:
            # [t, h, d] -> [1, h, t, d]
            q, k, v = (x.unsqueeze(0).transpose(1, 2) for x in (query, key, value))
        else:
            # [s, b, h, d] -> [b, h, s, d]
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        rep = q.size(1) // k.size(1)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if not thd:
            out = self._sdpa(q, k, v, None)
            b, h, s, d = out.shape
            return out.permute(2, 0, 1, 3).reshape(s, b, h * d)
        chunks = _cached_chunks(packed_seq_params, q.size(2), q.device)
        out = torch.cat([self._sdpa(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], mask)
                         for a, b, mask in chunks], dim=2)
        return out[0].transpose(0, 1).reshape(out.size(2), -1)  # [t, h*d]

    def _sdpa(self, q, k, v, mask):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0, scale=self.softmax_scale)
