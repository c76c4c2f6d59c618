"""Transformer-layer spec selection: TE on a GPU with Transformer Engine, local spec otherwise.

The local spec swaps megatron's DotProductAttention (no packed-sequence support) for
SDPACoreAttention so packed THD batches never attend across documents (standard and MLA attention).
MoE models get one spec per layer (dense or MoE by moe_layer_freq / moe_first_k_dense). Every layer
is a SeededTransformerLayer (trainer.model.seeding: random init independent of the PP layout).
"""
from __future__ import annotations

import copy

import torch

from trainer.model import arch
from trainer.model.mla_q import plain_query
from trainer.model.seeding import seeded


class LocalRMSNorm(torch.nn.RMSNorm):
    """torch RMSNorm for the local spec that also accepts sequence parallelism (megatron's
    WrappedTorchNorm refuses it). Its weight is marked `sequence_parallel` so a trainer that
    unfreezes it knows to all-reduce its grad across TP."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


class HeadRMSNorm(LocalRMSNorm):
    """LocalRMSNorm for the q/k (and MLA q/kv latent) norms inside attention: per token like any
    RMSNorm, but never on a sequence shard's own weight-grad path, so not marked sequence_parallel."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(config, hidden_size, eps=eps)
        self.weight.sequence_parallel = False


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


def _local(spec, seed: int):
    """Local-spec layer with packed-sequence attention (SDPACoreAttention) and LocalRMSNorm norms."""
    from trainer.model.sdpa_attention import SDPACoreAttention

    from megatron.core.transformer.identity_op import IdentityOp

    spec = copy.deepcopy(spec)
    attn = spec.submodules.self_attention.submodules
    attn.core_attention = SDPACoreAttention
    for name in ("q_layernorm", "k_layernorm", "kv_layernorm"):  # megatron's torch norm refuses SP
        if getattr(attn, name, None) not in (None, IdentityOp):
            setattr(attn, name, HeadRMSNorm)
    spec.submodules.input_layernorm = LocalRMSNorm
    spec.submodules.pre_mlp_layernorm = LocalRMSNorm
    return seeded(plain_query(spec), seed)


def layer_spec(mcfg, device: torch.device, seed: int):
    """ModuleSpec for one GPT layer of a dense (GQA or MLA, RMSNorm, SwiGLU) model."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if te_available(device):
        return seeded(plain_query(specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=None, moe_grouped_gemm=False, qk_layernorm=arch.qk_norm(mcfg),
            multi_latent_attention=bool(mcfg.multi_latent_attention))), seed)
    return _local(specs.get_gpt_layer_local_spec(
        num_experts=None, moe_grouped_gemm=False, qk_layernorm=arch.qk_norm(mcfg),
        multi_latent_attention=bool(mcfg.multi_latent_attention), normalization="RMSNorm"), seed)


def uses_te(model) -> bool:
    """Whether a built model runs Transformer Engine modules (a class of TE's among its modules' bases)."""
    return any(c.__module__.startswith("transformer_engine") for m in model.modules() for c in type(m).__mro__)


def block_spec(config, mcfg, device: torch.device, seed: int):
    """What GPTModel gets as `transformer_layer_spec`. Dense: TE's layer spec as is, or on the local
    path a block spec whose final norm is LocalRMSNorm too (so sequence parallelism works there).
    MoE: megatron's per-layer specs (dense or MoE layer by config.moe_layer_freq) for this pipeline
    stage's layers, patched the same way on the local path. Every layer is seeded from `seed`
    (trainer.model.seeding)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    te = te_available(device)
    if not config.num_moe_experts:
        spec = layer_spec(mcfg, device, seed)
        if te:
            return spec
        return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config),
                                          layer_norm=LocalRMSNorm)
    if te:
        block = specs.get_gpt_decoder_block_spec(config, use_transformer_engine=True, normalization="RMSNorm")
        block.layer_specs = [seeded(plain_query(spec), seed) for spec in block.layer_specs]
        return block
    every = [_local(spec, seed) for spec in specs.get_gpt_decoder_layer_specs(config, False, normalization="RMSNorm")]
    offset = get_transformer_layer_offset(config)
    return TransformerBlockSubmodules(layer_specs=every[offset:offset + get_num_layers_to_build(config)],
                                      layer_norm=LocalRMSNorm)
