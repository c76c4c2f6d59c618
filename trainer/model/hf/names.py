"""Which Hugging Face tensors make each megatron-core parameter, for Llama, Qwen3, Qwen3-MoE and DeepSeek-V2.

    sources, fn = hf_source("decoder.layers.3.mlp.experts.local_experts.17.linear_fc1.weight", heads, groups)
    # (("model.layers.3.mlp.experts.17.gate_proj.weight", "model.layers.3.mlp.experts.17.up_proj.weight"), cat)

Names are *logical*: canonical (no LoRA ".base."), with the layer's and the expert's index in the whole model
(trainer.model.layout), and TE's grouped expert weights (`experts.linear_fc1.weight<i>`) spelled like the
local spec's (`experts.local_experts.<j>.linear_fc1.weight`). TE fuses some norms into the following linear
(`linear_qkv.layer_norm_weight` is the input norm, `linear_fc1.layer_norm_weight` the pre-MLP norm,
`linear_q_up_proj` / `linear_kv_up_proj.layer_norm_weight` MLA's q / kv latent norms); both spellings map to
the same HF norm, so one table serves the TE and the local layer spec.

Conversions: q/k/v_proj -> linear_qkv, interleaved per query group ([q_g; k_g; v_g]); gate/up_proj ->
linear_fc1 = [gate; up] (dense MLP, each routed expert, the shared experts). Everything else is copied as is:
both sides use rotate-half RoPE on standard attention, and for MLA megatron-core de-interleaves the rope
channels itself (its multi-latent-attention RoPE), so DeepSeek's q_proj / kv_a_proj_with_mqa rows need no
permutation; kv_b_proj's per-head [k_nope; v] rows are megatron's linear_kv_up_proj layout.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

import torch

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")
_GROUPED = re.compile(r"\.experts\.(linear_fc[12])\.weight(\d+)$")

# layer-relative megatron name -> layer-relative HF name, copied as is
_COPY = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_q_proj.weight": "self_attn.q_proj.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_q_up_proj.layer_norm_weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "self_attention.linear_kv_up_proj.layer_norm_weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
}
_GATE_UP = {"mlp.linear_fc1.weight": "mlp", "mlp.shared_experts.linear_fc1.weight": "mlp.shared_experts"}
# HF names no megatron parameter takes, on purpose (buffers some exporters write)
IGNORED = re.compile(r"\.rotary_emb\.inv_freq$")


def fuse_qkv(q, k, v, heads: int, groups: int) -> torch.Tensor:
    """[heads*d, h], [groups*d, h] x2 -> megatron's per-group interleaved [(heads+2*groups)*d, h]."""
    d = q.shape[0] // heads
    qg = q.reshape(groups, heads // groups * d, -1)
    kg = k.reshape(groups, d, -1)
    vg = v.reshape(groups, d, -1)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, q.shape[-1])


def split_qkv(qkv, heads: int, groups: int):
    """Inverse of fuse_qkv along dim 0 (works for weights and for LoRA B [rows, r])."""
    per = heads // groups
    d = qkv.shape[0] // (heads + 2 * groups)
    g = qkv.reshape(groups, (per + 2) * d, -1)
    q = g[:, :per * d].reshape(heads * d, -1)
    k = g[:, per * d:(per + 1) * d].reshape(groups * d, -1)
    v = g[:, (per + 1) * d:].reshape(groups * d, -1)
    return q, k, v


def logical_name(global_name: str, ep_rank: int, local_experts: int) -> str:
    """A global canonical name with TE's grouped expert weight `...experts.linear_fc1.weight<i>` spelled as the
    local spec's `...experts.local_experts.<global j>.linear_fc1.weight`."""
    m = _GROUPED.search(global_name)
    if m is None:
        return global_name
    j = ep_rank * local_experts + int(m.group(2))
    return f"{global_name[:m.start()]}.experts.local_experts.{j}.{m.group(1)}.weight"


def _same(t):
    return t


def _gate_up(gate, up):
    return torch.cat([gate, up], dim=0)


def hf_source(name: str, heads: int, groups: int, *, mla: bool = False,
              tied: bool = False) -> Optional[tuple[tuple[str, ...], Callable]]:
    """(HF tensor names, conversion) for one logical megatron parameter, or None when no HF tensor makes it."""
    if name == "embedding.word_embeddings.weight":
        return ("model.embed_tokens.weight",), _same
    if name == "decoder.final_layernorm.weight":
        return ("model.norm.weight",), _same
    if name == "output_layer.weight":  # tied: the last pipeline stage's copy of the embedding
        return ("model.embed_tokens.weight" if tied else "lm_head.weight",), _same
    m = _LAYER.match(name)
    if m is None:
        return None
    pre, rest = f"model.layers.{m.group(1)}.", m.group(2)
    if rest == "self_attention.q_layernorm.weight":  # Qwen3's per-head q norm, or MLA's q latent norm
        return (pre + ("self_attn.q_a_layernorm.weight" if mla else "self_attn.q_norm.weight"),), _same
    if rest in _COPY:
        return (pre + _COPY[rest],), _same
    if rest == "self_attention.linear_qkv.weight":
        return (tuple(pre + f"self_attn.{x}_proj.weight" for x in "qkv"),
                lambda q, k, v: fuse_qkv(q, k, v, heads, groups))
    if rest in _GATE_UP:
        mod = pre + _GATE_UP[rest]
        return (f"{mod}.gate_proj.weight", f"{mod}.up_proj.weight"), _gate_up
    e = _EXPERT.match(rest)
    if e is not None:
        mod = f"{pre}mlp.experts.{e.group(1)}"
        if e.group(2) == "linear_fc1":
            return (f"{mod}.gate_proj.weight", f"{mod}.up_proj.weight"), _gate_up
        return (f"{mod}.down_proj.weight",), _same
    return None
