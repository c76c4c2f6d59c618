"""trainer.precision.weight_cache.refresh_te_weight_copies: megatron's set_is_first_microbatch reaches every module
that keeps a quantized weight copy (its `is_first_microbatch` flag, as megatron's TE wrappers have), and only where
the model quantizes (config.fp8 / fp4). (The trainer's step asks for it at the first two steps of a process; the
GPU lifecycle suite's FP8 resume is what shows that this keeps a resumed FP8 run on the uninterrupted one.)"""
from __future__ import annotations

import torch
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import MegatronModule

from trainer.precision import weight_cache


class _Copying(torch.nn.Module):  # what megatron's TE linear wrappers carry
    def __init__(self) -> None:
        super().__init__()
        self.is_first_microbatch = False


class _Model(MegatronModule):
    def __init__(self, fp8) -> None:
        super().__init__(TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, fp8=fp8))
        self.layers = torch.nn.ModuleList([_Copying(), torch.nn.Sequential(_Copying())])


def test_the_refresh_reaches_every_copying_module_where_the_model_quantizes():
    model = _Model("hybrid")
    flags = [m for m in model.modules() if isinstance(m, _Copying)]
    assert weight_cache.refresh_te_weight_copies([model]) == 1
    assert all(m.is_first_microbatch for m in flags)
    plain = _Model(None)  # BF16: TE quantizes nothing, megatron's call leaves the flags alone
    weight_cache.refresh_te_weight_copies(plain)
    assert not any(m.is_first_microbatch for m in plain.modules() if isinstance(m, _Copying))
    assert weight_cache.REFRESH_STEPS == 2

