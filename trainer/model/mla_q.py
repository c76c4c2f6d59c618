"""MLA without q_lora_rank keeps its query projection a plain linear on every megatron-core version.

DeepSeek-V2-Lite computes q = q_proj(input_layernorm(h)): no norm of its own on the query path. From megatron-core
0.19 (`transformer/mla_qk_norm_config.QKNormConfigResolver`), `qk_layernorm=True` (which MLA needs for the kv latent
norm) with `q_lora_rank=None` builds `linear_q_proj` as a fused norm + linear: a second RMSNorm on the query input,
with a weight no Hugging Face checkpoint holds (seen on the H200, 2026-12-02: the import stopped on
`linear_q_proj.layer_norm_weight`). 0.16 builds the plain linear the spec names. The subclass keeps the spec's
linear in that one case and changes nothing else; on 0.16 the hook is never called.
"""
from __future__ import annotations

from megatron.core.transformer.multi_latent_attention import MLASelfAttention


class PlainQueryMLA(MLASelfAttention):
    """MLASelfAttention whose q_proj (no q_lora_rank) is the spec's linear, without megatron 0.19's fused q norm."""

    def _resolve_qk_norm_config(self, submodules):
        resolved = super()._resolve_qk_norm_config(submodules)
        if self.config.q_lora_rank is None:
            resolved["linear_q_proj"] = submodules.linear_q_proj
        return resolved


def plain_query(spec):
    """The layer spec with MLA self-attention built as PlainQueryMLA (other attention untouched)."""
    attn = spec.submodules.self_attention
    if attn.module is MLASelfAttention:
        attn.module = PlainQueryMLA
    return spec
