"""Core attention for megatron-core's local spec that honours packed (THD) batches.

megatron-core's local DotProductAttention refuses `packed_seq_params`; TE's attention needs a GPU.
This module is the drop-in `core_attention` for the local spec (CPU and GPU without TE): it runs
torch's scaled_dot_product_attention with

* THD input (`packed_seq_params.qkv_format == "thd"`): q [t, np, hn], k/v [t, ng, hn]; a
  per-document block-diagonal causal mask built from `cu_seqlens_q` so no token attends across a
  document boundary (rows past cu_seqlens[-1] are treated as one trailing document);
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
            mask = packed_causal_mask(packed_seq_params.cu_seqlens_q, q.size(2), q.device)
        else:
            # [s, b, h, d] -> [b, h, s, d]
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
            mask = None
        rep = q.size(1) // k.size(1)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0, scale=self.softmax_scale)
        if thd:
            return out[0].transpose(0, 1).reshape(out.size(2), -1)  # [t, h*d]
        b, h, s, d = out.shape
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)
