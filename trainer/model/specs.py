"""Transformer-layer spec selection: TE on a GPU with Transformer Engine, local spec otherwise.

The local spec swaps megatron's DotProductAttention (no packed-sequence support) for
SDPACoreAttention so packed THD batches never attend across documents.
"""
from __future__ import annotations

import copy

import torch


def te_available(device: torch.device) -> bool:
    """True when the TE layer spec can be used: CUDA device and transformer_engine importable."""
    if device.type != "cuda":
        return False
    try:
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # ImportError, or a broken TE build
        return False
    return True


def layer_spec(mcfg, device: torch.device):
    """ModuleSpec for one GPT layer of the recipe's (dense, GQA, RMSNorm, SwiGLU) model."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    num_experts = mcfg.num_moe_experts or None
    if te_available(device):
        return specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=bool(num_experts),
            qk_layernorm=bool(mcfg.qk_layernorm),
            multi_latent_attention=bool(mcfg.multi_latent_attention))
    from trainer.model.sdpa_attention import SDPACoreAttention

    spec = specs.get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=bool(mcfg.qk_layernorm),
        multi_latent_attention=bool(mcfg.multi_latent_attention), normalization="RMSNorm")
    spec = copy.deepcopy(spec)
    spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return spec


def uses_te(model) -> bool:
    """Whether a built model runs TE modules (decides the THD batch layout and qkv_format)."""
    return getattr(model, "_primus_uses_te", False)
