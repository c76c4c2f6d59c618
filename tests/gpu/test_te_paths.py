"""Adapter paths against the real Transformer Engine module they stand in for (the CPU tests use a torch stand-in of
TE's LayerNormLinear, so only a GPU with TE shows whether TE's attributes and numerics are the ones assumed).

trainer.lora.epilogue_norm (trainer/model/lora/norm_epilogue.py) runs a LayerNormLinear's RMSNorm with torch and the
base GEMM in its epilogue node: on the 8B's qkv widths in BF16 it must take TE's module (its attribute names, a
plain weight) and give TE's default path's outputs and gradients to BF16 rounding. Seconds."""
from __future__ import annotations

import pytest
import torch

import lifecycle_support as ls

if ls.device() != "cuda":
    pytest.skip("needs a CUDA device with Transformer Engine", allow_module_level=True)
te = pytest.importorskip("transformer_engine.pytorch")
pytestmark = pytest.mark.gpu

HIDDEN, OUT, TOKENS = 4096, 6144, 4096  # the 8B's qkv, half a micro-batch


class _MegatronReturn(te.LayerNormLinear):
    """TE's LayerNormLinear returning as megatron's wrapper does: ((out, ln_out), None) or (out, None)."""

    def forward(self, x):
        return super().forward(x), None


def _run(norm_epilogue: bool):
    from trainer.model.lora.layers import LoRALinear

    torch.manual_seed(0)
    # parallel_mode "column", as megatron's TELayerNormColumnParallelLinear builds it: TE's default (None) is what
    # megatron's duplicated linears hand TE, which the adapter treats as whole and keeps off the epilogue
    base = _MegatronReturn(HIDDEN, OUT, bias=False, normalization="RMSNorm", eps=1e-5, params_dtype=torch.bfloat16,
                           device="cuda", parallel_mode="column")
    with torch.no_grad():
        base.layer_norm_weight.uniform_(0.5, 1.5)
    for p in base.parameters():
        p.requires_grad_(False)
    lora = LoRALinear(base, "linear_qkv", dim=16, alpha=32, dropout=0.0, dropout_position="pre", a_init="kaiming",
                      b_init="zero", tp_size=1, tp_rank=0, sequence_parallel=False, seed=2, epilogue=norm_epilogue,
                      epilogue_norm=norm_epilogue)
    with torch.no_grad():  # (drawn on the host: the same values for both runs)
        lora.lora_b.copy_(torch.randn(lora.lora_b.shape, generator=torch.Generator().manual_seed(4)) * 0.02)
    taken = lora.uses_norm_epilogue()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(TOKENS, 1, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    up = torch.randn(TOKENS, 1, OUT, device="cuda", dtype=torch.bfloat16, generator=g)
    y, _ = lora(x)
    y.backward(up)
    return taken, [t.float() for t in (y.detach(), x.grad, lora.lora_a.grad, lora.lora_b.grad)]


def test_norm_epilogue_takes_te_layernormlinear_and_matches_it(record):
    ref_taken, ref = _run(False)
    taken, got = _run(True)
    errors = [float((g - r).norm() / r.norm()) for g, r in zip(got, ref)]
    record(relative_errors_y_dx_da_db=[round(e, 5) for e in errors])
    assert not ref_taken and taken, "epilogue_norm did not take TE's LayerNormLinear (its attributes or weight type)"
    assert all(e < 2e-2 for e in errors), errors  # BF16: the norm's and the sums' roundings


def test_a_te_linear_without_parallel_mode_is_whole_on_every_tp_rank(record):
    """MLA's down projections on TE's spec: megatron's TELinear(parallel_mode="duplicated") builds TE's Linear with
    parallel_mode None. The adapter must hold the whole B on every TP rank and, under SP, see the rank's own tokens
    (audit, 2026-12-06: it took them for column shards, a shape error at the first forward with SP)."""
    from trainer.model.lora.layers import LoRALinear

    base = te.Linear(512, 256, bias=False, parallel_mode=None, params_dtype=torch.bfloat16, device="cuda")
    assert base.parallel_mode is None  # what megatron hands TE for "duplicated"
    lora = LoRALinear(base, "linear_kv_down_proj", dim=8, alpha=16, dropout=0.0, dropout_position="pre",
                      a_init="kaiming", b_init="zero", tp_size=2, tp_rank=1, sequence_parallel=True, seed=2,
                      epilogue=True)  # (asked for: a duplicated linear's node is refused)
    got = {"duplicated": lora.duplicated, "tp_size": lora.tp_size, "tokens_per_rank": lora.tokens_per_rank,
           "b_shape": list(lora.lora_b.shape), "epilogue_refused": not lora.uses_epilogue()}
    record(te_duplicated_linear=got)
    assert got == {"duplicated": True, "tp_size": 1, "tokens_per_rank": True, "b_shape": [256, 8],
                   "epilogue_refused": True}


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_the_epilogue_rounds_alike_with_and_without_grad_on_the_gpu(record, p):
    """megatron's recompute runs a layer's first forward without grad and replays it with grad; with the Triton
    products on (the default since 2026-12-06) both must give the same BF16 bits (audit, 2026-12-06: the grad-off
    branch summed in the other order, 1 ulp apart; fixed and checked on the CPU, this is the GPU's kernels)."""
    from tests.model_helpers import epilogue_branches

    with_grad, without = epilogue_branches("cuda", TOKENS, HIDDEN, OUT, p, kernels=True)
    differing = int((with_grad != without).sum())
    record(**{f"differing_p{p}": differing})
    assert differing == 0


def test_full_recompute_keeps_the_bf16_losses_with_the_default_levers(record, monkeypatch):
    """The tiny model on the GPU in BF16 with the defaults (the auto epilogue, the Triton products and the chunked
    loss's kernel): 4 AdamW steps give the same losses, bit for bit, with full recompute as without (deterministic
    attention, as the lifecycle runs: a second plain run shows the kernels are)."""
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    from tests.model_helpers import tiny_cfg, train_losses
    from trainer.model.lora.layers import LoRALinear

    def took(model):  # the levers really run: some linear on the epilogue
        assert any(m.uses_epilogue() for m in model.modules() if isinstance(m, LoRALinear))

    def losses(recompute):
        cfg = tiny_cfg(trainer={"precision": {"bf16": True}, "recompute": recompute,
                                "distributed": {"device": "cuda", "backend": "nccl"}})
        return train_losses(cfg, 4, seed=3, check_model=took)

    plain, again = losses({}), losses({})
    full = losses({"granularity": "full", "method": "uniform", "num_layers": 1})
    record(plain=plain, plain_again=again, full_recompute=full)
    assert plain == again, "two plain runs differ: a kernel is not deterministic, so recompute cannot be judged"
    assert plain == full


def test_fp8_attention_is_on_by_default_for_one_document_fp8_rows(record):
    """precision.fp8_dot_product_attention null: a model of head dim 128 (one head of the tiny model's widths), FP8
    delayed, one document a row (packing false) runs TE's FP8 attention; 6 AdamW steps stay within 0.05 of the same
    run with BF16 attention (false), and the loss falls in both."""
    from tests.model_helpers import tiny_cfg, train_losses
    from trainer.precision import describe, resolve

    def cfg(value):
        return tiny_cfg(trainer={
            "model": {"hidden_size": 128, "num_attention_heads": 1, "num_query_groups": 1, "ffn_hidden_size": 352},
            "precision": {"bf16": True, "fp8": "hybrid", "fp8_dot_product_attention": value},
            "data": {"packing": False}, "distributed": {"device": "cuda", "backend": "nccl"}})

    def run(value):
        seen = []
        losses = train_losses(cfg(value), 6, seed=5, rows=2, seq=256, doc_lens=(256, 256),
                              check_model=lambda m: seen.append(bool(m.config.fp8_dot_product_attention)))
        return seen[0], losses

    line = describe(resolve(cfg(None)))
    (on, fp8), (off, bf16) = run(None), run(False)
    record(precision_line=line, fp8_attention=fp8, bf16_attention=bf16)
    assert "| attention fp8" in line and on and not off
    assert fp8[-2] < fp8[0] and bf16[-2] < bf16[0], "the loss did not fall (the same batch, 4 or 6 steps apart)"
    assert max(abs(a - b) for a, b in zip(fp8, bf16)) < 0.05


def test_fp8_attention_follows_the_micro_batches_of_a_packed_run(record, monkeypatch):
    """precision.fp8_dot_product_attention true with packing (single_document_sbhd): micro-batches of one-document rows
    run sbhd with TE's FP8 attention, packed ones thd with BF16 attention, in turn, for 8 AdamW steps under delayed
    scaling; the losses stay within 0.05 of the run with BF16 attention throughout and fall in both."""
    import trainer.model.forward as fwd
    from tests.model_helpers import tiny_cfg, train_losses

    flags, made = [], fwd.model_inputs

    def spy(model, batch):  # the flag megatron reads, once each micro-batch's inputs are made
        out = made(model, batch)
        flags.append((out["packed_seq_params"] is None, bool(model.config.fp8_dot_product_attention)))
        return out

    monkeypatch.setattr(fwd, "model_inputs", spy)

    def run(value):
        cfg = tiny_cfg(trainer={
            "model": {"hidden_size": 128, "num_attention_heads": 1, "num_query_groups": 1, "ffn_hidden_size": 352},
            "precision": {"bf16": True, "fp8": "hybrid", "fp8_dot_product_attention": value},
            "distributed": {"device": "cuda", "backend": "nccl"}})
        flags.clear()
        losses = train_losses(cfg, 8, seed=5, rows=2, seq=256, doc_lens=((256, 256), (200, 150, 100)),
                              row_documents=True)
        return losses, list(flags)

    (fp8, on), (bf16, off) = run(True), run(False)
    record(fp8_attention=fp8, bf16_attention=bf16, flags_on=on)
    assert on == [(True, True), (False, False)] * 4, on  # sbhd with FP8 attention, thd without, in turn
    assert off == [(True, False), (False, False)] * 4, off
    assert fp8[-2] < fp8[0] and bf16[-2] < bf16[0], "the loss did not fall (the same batch, 4 or 6 steps apart)"
    assert max(abs(a - b) for a, b in zip(fp8, bf16)) < 0.05
