"""trainer.lora.epilogue true under FP8 (trainer/model/lora/base_gemm.py TeFp8Gemm): the epilogue node runs the base's
FP8 GEMMs through TE's functional linear with the module's own quantizers. Against the fused path (TE's module runs
its own GEMM, the adapter added after it) on real TE modules: the same outputs and gradients to BF16 rounding (the
same FP8 operands; only where the adapter's sum is rounded differs), the module's delayed-scaling amaxes recorded
forward and backward; and the tiny model's losses under delayed scaling and under tensorwise with FP8 weights
(fp8_param, whose transposes must be gone after each backward). Seconds."""
from __future__ import annotations

import pytest
import torch

import lifecycle_support as ls

if ls.device() != "cuda":
    pytest.skip("needs a CUDA device with Transformer Engine", allow_module_level=True)
te = pytest.importorskip("transformer_engine.pytorch")
pytestmark = pytest.mark.gpu

HIDDEN, OUT, TOKENS = 4096, 4096, 4096  # the 8B's proj, half a micro-batch


class _Megatron:
    """TE's module returning as megatron's wrappers do ((out, ln_out) or out, None), with their first-micro-batch
    flag (no weight cache: disable_parameter_transpose_cache)."""
    disable_parameter_transpose_cache = True
    is_first_microbatch = True

    def forward(self, x):
        return super().forward(x), None


class _Linear(_Megatron, te.Linear):
    pass


class _LayerNormLinear(_Megatron, te.LayerNormLinear):
    pass


def _module(norm: bool):
    torch.manual_seed(0)
    kw = dict(bias=False, params_dtype=torch.bfloat16, device="cuda")
    if norm:
        base = _LayerNormLinear(HIDDEN, OUT, normalization="RMSNorm", eps=1e-5, parallel_mode="column", **kw)
        with torch.no_grad():
            base.layer_norm_weight.uniform_(0.5, 1.5)
    else:
        base = _Linear(HIDDEN, OUT, parallel_mode="row", **kw)
    for p in base.parameters():
        p.requires_grad_(False)
    return base


def _run(norm: bool, epilogue: bool, p: float):
    from transformer_engine.common.recipe import DelayedScaling

    from trainer.model.lora.layers import LoRALinear

    base = _module(norm)
    lora = LoRALinear(base, "linear_qkv" if norm else "linear_proj", dim=16, alpha=32, dropout=p,
                      dropout_position="pre", a_init="kaiming", b_init="zero", tp_size=1, tp_rank=0,
                      sequence_parallel=False, seed=2, fused=True, epilogue=epilogue, epilogue_norm=epilogue)
    lora.fp8_epilogue = epilogue
    with torch.no_grad():  # (drawn on the host: the same values for both runs)
        lora.lora_b.copy_(torch.randn(lora.lora_b.shape, generator=torch.Generator().manual_seed(4)) * 0.02)
    taken = lora.uses_norm_epilogue() if norm else lora.uses_epilogue()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(TOKENS, 1, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    up = torch.randn(TOKENS, 1, OUT, device="cuda", dtype=torch.bfloat16, generator=g)
    torch.cuda.manual_seed(7)  # the dropout's mask: one draw in either path
    with te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling()):
        y, _ = lora(x)
    y.backward(up)
    amax = [float(base.fp8_meta[k].amax_history.abs().max()) for k in ("scaling_fwd", "scaling_bwd")]
    return taken, amax, [t.float() for t in (y.detach(), x.grad, lora.lora_a.grad, lora.lora_b.grad)]


@pytest.mark.parametrize("norm", [False, True], ids=["proj", "qkv-norm"])
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_fp8_epilogue_matches_the_fused_path_on_te_modules(record, norm, p):
    ref_taken, ref_amax, ref = _run(norm, False, p)
    taken, amax, got = _run(norm, True, p)
    errors = [float((g - r).norm() / r.norm()) for g, r in zip(got, ref)]
    record(**{f"{'qkv' if norm else 'proj'}_p{p}": {"rel_err_y_dx_da_db": [round(e, 5) for e in errors],
                                                      "amax_fwd_bwd": amax, "ref_amax": ref_amax}})
    assert taken and not ref_taken, "the FP8 epilogue did not take TE's module"
    assert all(a > 0 for a in amax), f"the module's delayed-scaling amaxes were not recorded: {amax}"
    assert all(e < 2e-2 for e in errors), errors


def _tiny(precision: dict, epilogue: bool, targets=None):
    from tests.model_helpers import tiny_cfg

    lora = {"epilogue": epilogue, **({"target_modules": targets} if targets else {})}
    return tiny_cfg(trainer={
        "model": {"hidden_size": 128, "num_attention_heads": 1, "num_query_groups": 1, "ffn_hidden_size": 352},
        "precision": {"bf16": True, **precision}, "lora": lora,
        "distributed": {"device": "cuda", "backend": "nccl"}})


TENSORWISE = {"fp8": "hybrid", "fp8_recipe": "tensorwise"}


@pytest.mark.parametrize("precision, targets", [
    ({"fp8": "hybrid", "fp8_recipe": "delayed"}, None),
    ({"fp8": "hybrid", "fp8_recipe": "delayed"}, ["linear_fc1", "linear_fc2"]),  # the MLP's fc1 is the first module
    ({**TENSORWISE, "fp8_param": True}, None),
    ({**TENSORWISE, "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
      "num_layers_at_end_in_bf16": 0}, None),  # layer 1 runs unquantized: its bases through torch
], ids=["delayed", "delayed-mlp-only", "tensorwise-fp8param", "tensorwise-first-layer-bf16"])
def test_fp8_epilogue_trains_the_tiny_model_like_the_fused_path(record, monkeypatch, precision, targets):
    """6 AdamW steps: the losses stay within 0.05 of the fused path's and fall; every wrapped linear took the FP8
    epilogue; with fp8_param no weight keeps its transpose after a backward (counted at each optimizer step)."""
    from tests.model_helpers import train_losses
    from trainer.model.lora.layers import LoRALinear
    from trainer.precision.fp8_params import releasable

    seen, kept, models = [], [], []

    def took(model):
        wrapped = [m for m in model.modules() if isinstance(m, LoRALinear)]
        seen.extend([sum(m.fp8_epilogue and (m.uses_epilogue() or m.uses_norm_epilogue()) for m in wrapped),
                     len(wrapped)])
        models.append(model)

    class Counting(torch.optim.AdamW):  # the backward is complete when the step runs
        def step(self, *args, **kwargs):
            if models:
                kept.append(sum(bool(p.get_usages().get("columnwise"))
                                for p in models[-1].parameters() if releasable(p)))
            return super().step(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", Counting)
    fp8 = train_losses(_tiny(precision, True, targets), 6, seed=5, rows=2, seq=256, doc_lens=(200, 150, 100),
                       check_model=took)
    models.clear()
    ref = train_losses(_tiny(precision, False, targets), 6, seed=5, rows=2, seq=256, doc_lens=(200, 150, 100))
    record(**{"_".join(f"{k}={v}" for k, v in precision.items()) + f"_targets={targets}": {
        "epilogue": fp8, "fused": ref, "taken_of_wrapped": seen, "transposes_kept": kept}})
    assert seen[0] == seen[1] > 0, seen
    assert fp8[-2] < fp8[0] and ref[-2] < ref[0], "the loss did not fall"
    assert max(abs(a - b) for a, b in zip(fp8, ref)) < 0.05
    if precision.get("fp8_param"):
        assert len(kept) == 6 and not any(kept), kept
