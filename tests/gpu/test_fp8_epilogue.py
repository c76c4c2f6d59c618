"""trainer.lora.epilogue true under FP8 (trainer/model/lora/base_gemm.py TeFp8Gemm): the epilogue node runs the base's
FP8 GEMMs through TE's functional linear with the module's own quantizers. Against the fused path (TE's module runs
its own GEMM, the adapter added after it) on real TE modules: the same outputs and gradients to BF16 rounding (the
same FP8 operands; only where the adapter's sum is rounded differs), the module's delayed-scaling amaxes recorded
forward and backward; and the tiny model's losses under delayed scaling and under tensorwise with FP8 weights
(fp8_param, whose transposes must be gone after each backward). With pre-dropout the nodes recompute the dropped
copy (trainer.lora.dropout_recompute): the same bits as keeping it. Seconds."""
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


def _run(norm: bool, epilogue: bool, p: float, recompute_drop: bool = True, kept: list | None = None,
         norm_recompute: bool = False):
    """(the path taken, the amaxes, [y, dx, dA, dB]); kept: filled with the bytes of what autograd keeps per token
    row (tensors with TOKENS leading rows)."""
    from transformer_engine.common.recipe import DelayedScaling

    from trainer.model.lora.layers import LoRALinear

    base = _module(norm)
    lora = LoRALinear(base, "linear_qkv" if norm else "linear_proj", dim=16, alpha=32, dropout=p,
                      dropout_position="pre", a_init="kaiming", b_init="zero", tp_size=1, tp_rank=0,
                      sequence_parallel=False, seed=2, fused=True, epilogue=epilogue, epilogue_norm=epilogue,
                      dropout_recompute=recompute_drop, norm_recompute=norm_recompute)
    lora.fp8_epilogue = epilogue
    with torch.no_grad():  # (drawn on the host: the same values for both runs)
        lora.lora_b.copy_(torch.randn(lora.lora_b.shape, generator=torch.Generator().manual_seed(4)) * 0.02)
    taken = lora.uses_norm_epilogue() if norm else lora.uses_epilogue()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(TOKENS, 1, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    up = torch.randn(TOKENS, 1, OUT, device="cuda", dtype=torch.bfloat16, generator=g)
    torch.cuda.manual_seed(7)  # the dropout's mask: one draw in either path
    storages = {}

    def keep(t):
        if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] == TOKENS:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling()), \
            torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        y, _ = lora(x)
    if kept is not None:
        kept.append(sum(storages.values()) - (storages.get(x.untyped_storage().data_ptr(), 0)))
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


@pytest.mark.parametrize("norm", [False, True], ids=["proj", "qkv-norm"])
def test_fp8_epilogue_recomputes_the_dropped_copy_bit_for_bit(record, norm):
    """trainer.lora.dropout_recompute on TE's modules under the FP8 epilogue: the same y, dx, dA, dB bits as keeping
    the dropped copy, and less kept (beside the caller's x: the dropped copy and the byte mask, against the bits)."""
    kept_off, kept_on = [], []
    _, _, ref = _run(norm, True, 0.1, recompute_drop=False, kept=kept_off)
    _, _, got = _run(norm, True, 0.1, recompute_drop=True, kept=kept_on)
    record(**{f"{'qkv' if norm else 'proj'}_kept_bytes_off_on": [kept_off[0], kept_on[0]]})
    assert all(torch.equal(g, r) for g, r in zip(got, ref)), [float((g - r).abs().max()) for g, r in zip(got, ref)]
    assert kept_on[0] < kept_off[0], (kept_on, kept_off)


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_fp8_norm_epilogue_recomputes_the_norm_output_bit_for_bit(record, p):
    """trainer.recompute.norm_output on TE's LayerNormLinear under the FP8 epilogue: the same y, dx, dA, dB bits as
    keeping the norm's output, and less kept beside x (the fused RMSNorm keeps x itself for its backward)."""
    kept_off, kept_on = [], []
    _, _, ref = _run(True, True, p, kept=kept_off)
    _, _, got = _run(True, True, p, kept=kept_on, norm_recompute=True)
    record(**{f"qkv_p{p}_kept_bytes_off_on": [kept_off[0], kept_on[0]]})
    assert all(torch.equal(g, r) for g, r in zip(got, ref)), [float((g - r).abs().max()) for g, r in zip(got, ref)]
    assert kept_on[0] <= kept_off[0] - TOKENS * HIDDEN * 2, (kept_on, kept_off)  # the BF16 norm output


def test_native_dropout_is_rebuilt_bit_for_bit_where_recomputable(record):
    """trainer/model/lora/drop.py's premise on this GPU: native_dropout's output equals its backward op applied to x
    and the mask wherever `recomputable(p, dtype)` says so; where it does not, the node keeps the dropped copy and the
    difference shows (recorded: how many kept elements the recompute would change). The BF16 input is every finite
    bfloat16 value (both signs) 257 times over, so the rule's enumeration is checked whole: at 0.15 and at float32's
    first refused p the scales differ yet BF16 rebuilds; at 0.04 it does not."""
    from trainer.model.lora.drop import kept_drop, recomputable

    bits = torch.arange(0, 0x10000, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    finite = bits[torch.isfinite(bits)]
    x = finite.repeat(-(-4096 * 4096 // finite.numel()))[:4096 * 4096].view(4096, 4096)
    odd = next(q / 1000 for q in range(1, 990) if not recomputable(q / 1000))
    odd_bf16 = next(q / 1000 for q in range(1, 990) if not recomputable(q / 1000, torch.bfloat16))
    seen, rebuilds = {}, {}
    for p in (0.1, 0.05, 0.2, 0.3, odd, 0.15, odd_bf16):
        out, mask = torch.ops.aten.native_dropout(x, p, True)
        rebuilt = torch.ops.aten.native_dropout_backward(x, mask, 1.0 / (1.0 - p))
        seen[str(p)] = int((rebuilt.view(torch.int16) != out.view(torch.int16)).sum())
        rebuilds[str(p)] = recomputable(p, torch.bfloat16)
        store, packed = kept_drop(mask, p, torch.bfloat16)
        if rebuilds[str(p)]:
            xd, keep = store.restore(x, packed)
            assert torch.equal(keep, mask) and torch.equal(xd.view(torch.int16), out.view(torch.int16)), p
            # the Triton passes (trainer/model/lora/bits.py): the same bits, the same bits rebuilt
            store_k, packed_k = kept_drop(mask, p, torch.bfloat16, kernels=True)
            assert torch.equal(packed_k, packed), p
            xd_k, keep_k = store_k.restore(x, packed_k)
            assert torch.equal(keep_k, mask) and torch.equal(xd_k.view(torch.int16), out.view(torch.int16)), p
        else:
            assert store is None, p
    # float32's rule is not vacuous: at `odd` the two scales differ by one float32 step, which an FP32 x shows
    x32 = torch.randn(4096, 4096, device="cuda", dtype=torch.float32)
    out, mask = torch.ops.aten.native_dropout(x32, odd, True)
    seen[f"{odd} fp32"] = int((torch.ops.aten.native_dropout_backward(x32, mask, 1.0 / (1.0 - odd)) != out).sum())
    assert kept_drop(mask, odd, torch.float32) == (None, None)
    record(differing_elements_by_p=seen, bf16_rule=rebuilds)
    assert all((seen[k] == 0) == rebuilds[k] for k in rebuilds), (seen, rebuilds)
    assert rebuilds[str(odd)] and rebuilds["0.15"] and not rebuilds[str(odd_bf16)], rebuilds
    assert seen[f"{odd} fp32"] > 0, seen


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
