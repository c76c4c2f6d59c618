"""Tiny MoE (Qwen3-style: 4 experts top-2, QK-norm) and MLA + MoE (DeepSeek-V2-style: multi-latent
attention, shared experts, first layer dense) megatron-core models on CPU: LoRA on attention, on every
routed expert and on the shared experts; the router stays frozen; packed documents stay separate."""
from __future__ import annotations

import pytest
import torch

from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from tests.model_helpers import DEEPSEEK_MLA, QWEN3_MOE, arch_sections, dist_session, packed_batch, tiny_cfg
from trainer.model import build_model, forward_losses
from trainer.model.lora.layers import LoRALinear, lora_modules

ARCHS = {"qwen3_moe": QWEN3_MOE, "deepseek_mla": DEEPSEEK_MLA}


def _loss(model, batch):
    return (forward_losses(model, batch) * batch["loss_mask"]).sum() / batch["loss_mask"].sum()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_lora_trains_experts_and_attention_router_frozen(arch):
    cfg = tiny_cfg(trainer=arch_sections(ARCHS[arch]))
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        layers = model.decoder.layers
        moe = layers[1].mlp
        assert type(moe).__name__ == "MoELayer" and len(moe.experts.local_experts) == 4
        assert all(isinstance(e.linear_fc1, LoRALinear) and isinstance(e.linear_fc2, LoRALinear)
                   for e in moe.experts.local_experts)
        if arch == "deepseek_mla":
            assert type(layers[0].mlp).__name__ == "MLP"  # moe_first_k_dense: 1
            assert isinstance(layers[0].self_attention, MLASelfAttention)
            assert isinstance(moe.shared_experts.linear_fc1, LoRALinear)
            assert isinstance(layers[0].self_attention.linear_kv_up_proj, LoRALinear)
            assert len(lora_modules(model)) == 4 + 2 + (4 + 2 * 4 + 2)  # attn x2, dense mlp, routed + shared
        else:
            assert type(layers[0].mlp).__name__ == "MoELayer"
            assert layers[0].self_attention.q_layernorm is not None
            assert len(lora_modules(model)) == 2 * (2 + 2 * 4)
        router = {n: p.detach().clone() for n, p in model.named_parameters() if ".router." in n}
        assert router and not any(p.requires_grad for n, p in model.named_parameters() if ".router." in n)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-2)
        batch = packed_batch(2, 32, [20, 17, 25], vocab=128, seed=1)
        touched, losses = set(), []
        for _ in range(10):
            opt.zero_grad()
            loss = _loss(model, batch)
            loss.backward()
            touched |= {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0] - 0.3, losses
        experts = {n for n in touched if ".local_experts." in n and n.endswith(".lora_b")}
        assert len(experts) == 2 * 4 * (1 if arch == "deepseek_mla" else 2), sorted(experts)  # every expert learns
        for n, p in model.named_parameters():
            if n in router:
                assert torch.equal(p, router[n]), n


def test_router_is_never_wrapped():
    lora = {**tiny_cfg().trainer.lora.to_dict(), "target_modules": ["*"]}
    cfg = tiny_cfg(trainer={"model": QWEN3_MOE, "lora": lora})
    with dist_session(cfg) as info:
        names = set(lora_modules(build_model(cfg, info.device)))
    assert "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2" in names
    assert not any("router" in n or "embedding" in n or "output_layer" in n for n in names)
    # no LM head either: it once was wrapped here, and the PEFT export refused it at the run's end
    # ("adapters on decoder layers only"), in the queue
    assert len(names) == 2 * (2 + 2 * 4)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_packed_documents_equal_separate_runs(arch):
    """Routing is per token (no capacity dropping) and attention is per document: a packed batch
    gives each document the losses it has alone, for MoE and for multi-latent attention."""
    cfg = tiny_cfg(trainer=arch_sections(ARCHS[arch]))
    doc_lens = [11, 7, 19, 9]
    batch = packed_batch(2, 32, doc_lens, vocab=128, seed=7)
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device).eval()
        with torch.no_grad():
            packed = forward_losses(model, batch).reshape(-1)
            cu = batch["cu_seqlens"].tolist()
            for d in range(len(doc_lens)):
                s, e = cu[d], cu[d + 1]
                one = {k: batch[k].reshape(-1)[s:e].view(1, -1) for k in ("tokens", "labels", "loss_mask")}
                one.update(position_ids=torch.arange(e - s).view(1, -1), max_seqlen=e - s,
                           cu_seqlens=torch.tensor([0, e - s], dtype=torch.int32))
                alone = forward_losses(model, one).reshape(-1)
                mask = one["loss_mask"].reshape(-1).bool()
                torch.testing.assert_close(packed[s:e][mask], alone[mask], rtol=1e-5, atol=1e-5)
            whole = dict(batch, cu_seqlens=torch.tensor([0, 64], dtype=torch.int32), max_seqlen=64)
            crossed = forward_losses(model, whole).reshape(-1)
            assert not torch.allclose(crossed[cu[1]:cu[2]], packed[cu[1]:cu[2]], atol=1e-4)


class _TorchGroupedLinear(torch.nn.Module):
    """Reference grouped linear with TE GroupedLinear's interface (weight0..weight{E-1}, forward(x,
    m_splits) -> (y, bias)), for the adapter math on CPU where TE does not exist."""

    def __init__(self, experts: int, inp: int, out: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.num_gemms = experts
        for e in range(experts):
            self.register_parameter(f"weight{e}", torch.nn.Parameter(torch.randn(out, inp, generator=g) * 0.1,
                                                                      requires_grad=False))

    def forward(self, x, m_splits):
        parts = torch.split(x, list(m_splits))
        return torch.cat([p @ getattr(self, f"weight{e}").t() for e, p in enumerate(parts)]), None


def test_grouped_expert_adapter_is_per_expert_lora():
    """TEGroupedMLP's linears get one adapter per expert: y_e = W_e x_e + (alpha/r) B_e A_e x_e on each
    expert's rows (uneven splits, one expert without tokens), grads only into that expert's factors."""
    from trainer.model.lora.layers import _grouped
    from trainer.model.lora.grouped import GroupedLoRALinear

    lcfg = tiny_cfg().trainer.lora
    base = _TorchGroupedLinear(4, 16, 24, seed=0)
    layer = _grouped(base, "decoder.layers.0.mlp.experts.linear_fc1", lcfg, seed=5, global_name=lambda n: n)
    assert isinstance(layer, GroupedLoRALinear) and len(layer.lora) == 4
    assert all(torch.count_nonzero(ad.lora_b) == 0 and ad.lora_a.abs().sum() > 0 for ad in layer.lora)
    assert not torch.equal(layer.lora[0].lora_a, layer.lora[1].lora_a)  # seeded per expert
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for ad in layer.lora:
            ad.lora_b.normal_(0, 0.1, generator=g)
    splits = [5, 0, 9, 3]
    x = torch.randn(sum(splits), 16, generator=g)
    y, bias = layer(x, splits)
    assert bias is None and y.shape == (17, 24)
    scale = lcfg.alpha / lcfg.dim
    rows = torch.split(x, splits)
    want = torch.cat([r @ getattr(base, f"weight{e}").t() + scale * (r @ layer.lora[e].lora_a.t()) @ layer.lora[e].lora_b.t()
                      for e, r in enumerate(rows)])
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    y[:5].sum().backward()  # only expert 0's rows
    assert layer.lora[0].lora_a.grad.abs().sum() > 0
    assert all(ad.lora_a.grad is None or ad.lora_a.grad.abs().sum() == 0 for ad in list(layer.lora)[1:])


def test_dense_mla_norms_its_kv_latent_as_the_moe_mla_does():
    """MLA always norms its kv latent (DeepSeek's kv_a_layernorm): a dense MLA model (no experts) built its layer
    from a spec that read model.qk_layernorm alone (false), and got none, while its config said True."""
    from megatron.core.transformer.identity_op import IdentityOp

    dense = {k: v for k, v in DEEPSEEK_MLA.items() if not k.startswith("moe_") and k != "num_moe_experts"}
    names = {}
    for label, arch in (("dense", dense), ("moe", DEEPSEEK_MLA)):
        cfg = tiny_cfg(trainer=arch_sections(arch))
        assert not cfg.trainer.model.qk_layernorm
        with dist_session(cfg) as info:
            attn = build_model(cfg, info.device).decoder.layers[0].self_attention
            assert not isinstance(attn.kv_layernorm, IdentityOp), label
            names[label] = sorted(n for n, _ in attn.named_parameters())
    assert names["dense"] == names["moe"] and any("kv_layernorm" in n for n in names["dense"]), names


def test_top1_routing_with_renormalised_weights_is_refused():
    """At moe_router_topk 1, Hugging Face's renormalised weight (norm_topk_prob, Qwen3's default) is 1 and megatron-
    core's is the expert's softmax probability (trainer.model.arch forces pre-softmax there): refused, not run with
    other numerics (audit, 2026-12-06); DeepSeek's family default (no renormalising) and an explicit false run."""
    from primus_contract.errors import ContractError
    from primus_contract.rules_model import model_rules

    t = tiny_cfg(trainer={"model": {**QWEN3_MOE, "moe_router_topk": 1}}).to_dict()["trainer"]
    with pytest.raises(ContractError, match=r"`trainer.model.moe_norm_topk_prob` \(true, or null on this family\)"):
        model_rules(t["model"], t)
    model_rules({**t["model"], "moe_norm_topk_prob": False}, t)
    model_rules({**t["model"], "family": "deepseek"}, t)
