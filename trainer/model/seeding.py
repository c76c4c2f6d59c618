"""Layout-independent random initialisation of the base model.

Megatron initialises weights from the running RNG stream, so layer k's random weights depend on what
was built before it on the same rank: with pipeline parallelism, stage 1's first layer would get
other weights than the same layer at PP=1. SeededTransformerLayer reseeds the torch generator and
megatron's model-parallel RNG tracker from (experiment seed, global layer number) before building
each layer, so every layer's init is a function of its global index only; the output layer, built
after the last layer, follows suit, and the embedding is built first on stage 0 either way. With
megatron's CPU initialisation (the full weight drawn, then split) that makes a random-init model
identical under any TP/PP layout (MoE experts under EP are not covered: each EP rank draws its local
experts from the same stream). Pretrained weights (checkpoint.pretrained) replace all of it anyway.
"""
from __future__ import annotations

import torch
from megatron.core.transformer.transformer_layer import TransformerLayer, get_transformer_layer_offset



def reseed(base: int | None, global_layer_number: int) -> None:
    """Reseed torch and megatron's model-parallel RNG tracker for the layer (base None: leave them)."""
    from megatron.core import tensor_parallel

    if base is None:
        return
    seed = (int(base) * 1_000_003 + 7_919 * int(global_layer_number)) % (2**31)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


class SeededTransformerLayer(TransformerLayer):
    """TransformerLayer whose random init depends only on (seed, global layer number); `init_seed` comes
    from the layer spec's params (seeded())."""

    def __init__(self, config, submodules, layer_number: int = 1, *args, init_seed: int | None = None, **kwargs):
        offset = 0
        if kwargs.get("add_layer_offset", True) and not kwargs.get("is_mtp_layer", False):
            offset = get_transformer_layer_offset(config, kwargs.get("vp_stage"))
        reseed(init_seed, layer_number + offset)
        super().__init__(config, submodules, layer_number, *args, **kwargs)


def seeded(spec, seed: int):
    """A copy of a TransformerLayer ModuleSpec that builds SeededTransformerLayer from experiment seed `seed`."""
    import copy

    if spec.module is not TransformerLayer:
        return spec
    spec = copy.copy(spec)
    spec.module = SeededTransformerLayer
    spec.params = {**(spec.params or {}), "init_seed": int(seed)}
    return spec
