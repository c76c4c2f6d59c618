"""Adapter inputs recomputed in backward instead of kept: the fc2 adapter of a dense SwiGLU MLP.

A frozen base linear keeps nothing for its backward (no weight gradient: TE saves no input), but the
LoRA factor A of `linear_fc2` needs its input x = swiglu(u) for dA = dh^T x. Kept, x costs
ffn_hidden/tp x tokens x 2 bytes per layer (Llama-3-8B, 8192 tokens: 224 MiB a layer, 7 GiB over 32
layers). The activation's own backward keeps u (the fc1 output) anyway, so the adapter keeps u too
(the same storage: no extra memory) and recomputes x = swiglu(u) in backward -- one element-wise pass.

Applies only where x is exactly swiglu(u) as megatron's MLP.forward computes it: a dense `MLP` (not an
expert, not a shared expert), gated SiLU, no fc1 bias, no clamp or linear offset, no TE activation
module, no fp8 activation store; and only for an adapter without pre-dropout (dropout of x would need
its mask). The recompute uses the same function megatron used (its fused `swiglu`, or the same torch
ops), so the recomputed x is bit-identical. Anything else keeps x as before.

The same holds for adapters on TE's LayerNormColumnParallelLinear with RMSNorm (linear_qkv, linear_fc1):
TE keeps the norm's input x for its own backward, so instead of asking TE to return and keep ln_out the
adapter folds the norm weight into A and applies the per-token 1/rms scale to its rank-sized output
(_AdapterAOfRMSNorm): hidden/tp x tokens x 2 bytes less per wrapped linear (Llama-3-8B: 2 x 64 MiB a
layer). A first version recomputed the norm in fp32 torch ops in backward: -11 GiB but 18 % slower on
the H200; this one needs no [tokens, hidden] fp32 temporaries.

    wire_adapter_input_recompute(model)   # after apply_lora; {"fc2": n, "norm": m} wired
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from trainer.model.adapter_grads import adapter_a, adapter_a_of_rmsnorm, rmsnorm_weight  # noqa: F401 (the API)
from trainer.model.lora.layers import LoRALinear


def gated_silu(y: torch.Tensor) -> torch.Tensor:
    """megatron MLP.forward's unfused gated branch with activation_func F.silu: silu(first half) * second half."""
    y_glu, y_linear = torch.chunk(y, 2, dim=-1)
    return F.silu(y_glu) * y_linear


def swiglu_of(config, fp8_store_ok: bool = False):
    """The exact function megatron's dense MLP applies to fc1's output under `config`, or None. fp8_store_ok: also
    under activation_func_fp8_input_store (its forward is the same function; only what it keeps differs)."""
    if not config.gated_linear_unit or config.activation_func is not F.silu or config.add_bias_linear:
        return None
    refused = ("use_te_activation_func",) + (() if fp8_store_ok else ("activation_func_fp8_input_store",))
    if any(getattr(config, k, False) for k in refused):
        return None
    if getattr(config, "activation_func_clamp_value", None) is not None:
        return None
    if float(getattr(config, "glu_linear_offset", 0.0) or 0.0) != 0.0:
        return None
    if config.bias_activation_fusion:
        from megatron.core.fusions.fused_bias_swiglu import swiglu

        return swiglu
    return gated_silu  # (activation_func is F.silu: checked above)


def dense_mlps(model):
    """(name, module) of each dense megatron MLP: not an expert's (their MLP may scale x by routing probabilities)."""
    from megatron.core.transformer.mlp import MLP

    for name, module in model.named_modules():
        if type(module) is MLP and "experts" not in name.split("."):
            yield name, module


def rewire_forward(mlp, forward) -> None:
    """`mlp`'s forward becomes `forward` (a function of the module, like megatron's); megatron's own stays as
    _primus_megatron_forward (for per-token scales; the mark of a rewired MLP)."""
    mlp._primus_megatron_forward = mlp.forward
    mlp.forward = types.MethodType(forward, mlp)


def wire_adapter_input_recompute(model, scope: str = "all") -> dict:
    """Rewire eligible adapters (scope: all | fc2 | norm) to keep a tensor the base keeps anyway; returns
    counts by kind."""
    if scope not in ("all", "fc2", "norm"):
        raise ValueError(f"trainer.recompute.adapter_inputs_scope must be all|fc2|norm, got {scope!r}")
    wired = {"fc2": 0, "norm": 0}
    for module in model.modules() if scope != "fc2" else ():
        if _norm_rewirable(module, LoRALinear):
            module.base.return_layernorm_output = False
            module.adapter_norm = _rmsnorm_adapter(module.base)
            wired["norm"] += 1
    for _name, module in dense_mlps(model) if scope != "norm" else ():
        fc2 = getattr(module, "linear_fc2", None)
        if not isinstance(fc2, LoRALinear) or fc2.is_expert or fc2.fused_norm or _pre_dropout(fc2):
            continue
        act = swiglu_of(module.config)
        if act is None:
            continue
        fc2.input_act = act

        def remember(_module, _inputs, output, fc2=fc2):
            fc2.pending_act_input = output[0] if isinstance(output, tuple) else output

        module.linear_fc1.register_forward_hook(remember)
        wired["fc2"] += 1
    return wired


def _norm_rewirable(module, lora_cls) -> bool:  # LayerNorm bases keep TE's ln_out as before
    return (isinstance(module, lora_cls) and module.fused_norm and not _pre_dropout(module)
            and rmsnorm_weight(module.base) is not None)


def _rmsnorm_adapter(base):
    def adapter(x, a):  # reads the norm weight at call time (it may move with the module)
        return adapter_a_of_rmsnorm(x, a, *rmsnorm_weight(base))

    return adapter


def _pre_dropout(lora) -> bool:  # dropout of the adapter input would need its mask kept
    return lora.dropout is not None and lora.dropout_position == "pre"
