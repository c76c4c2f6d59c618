"""Transformer-layer spec selection: TE on a GPU with Transformer Engine, local spec otherwise.

The local spec swaps megatron's DotProductAttention (no packed-sequence support) for
SDPACoreAttention so packed THD batches never attend across documents.
"""
from __future__ import annotations

import copy

import torch


class LocalRMSNorm(torch.nn.RMSNorm):
    """torch RMSNorm for the local spec that also accepts sequence parallelism (megatron's
    WrappedTorchNorm refuses it). Its weight is marked `sequence_parallel` so a trainer that
    unfreezes it knows to all-reduce its grad across TP."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


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
    spec.submodules.input_layernorm = LocalRMSNorm
    spec.submodules.pre_mlp_layernorm = LocalRMSNorm
    return spec


def uses_te(model) -> bool:
    """Whether a built model runs TE modules (decides the THD batch layout and qkv_format)."""
    return getattr(model, "_primus_uses_te", False)


def block_spec(config, mcfg, device: torch.device):
    """What GPTModel gets as `transformer_layer_spec`: TE's layer spec as is; on the local path a
    block spec whose final norm is LocalRMSNorm too (so sequence parallelism works there)."""
    spec = layer_spec(mcfg, device)
    if te_available(device):
        return spec
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)

    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config),
                                      layer_norm=LocalRMSNorm)
