"""PEFT export for every family: a tiny transformers checkpoint (tests.hf_tiny, Hub layout) is imported by the
trainer, its adapters get random values, and the exported adapter loaded by peft.PeftModel.from_pretrained on
the installed transformers model reproduces the trainer's logits (fp32, 1e-4), routed-expert adapters included
(peft ParamWrapper on the fused expert parameters). The merge of the same adapter gives those logits too.
"""
import json
import re

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from tests.hf_tiny import load_tiny, save_tiny
from tests.model_helpers import DEEPSEEK_MLA, MLA_TARGETS, QWEN3_MOE, tiny_cfg, trained_export
from trainer.model.hf.merge import merge_adapter

TOKENS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
QWEN3 = {"family": "qwen3", "qk_layernorm": True, "kv_channels": 16}
DEEPSEEK = {**DEEPSEEK_MLA, "norm_epsilon": 1e-6}  # (tests.hf_tiny: transformers' MLA latent norms use 1e-6)
Q_LORA = {**DEEPSEEK, "q_lora_rank": 24}
Q_LORA_TARGETS = [t for t in MLA_TARGETS if t != "linear_q_proj"] + ["linear_q_down_proj", "linear_q_up_proj"]

CASES = {  # id: (hf family, hf overrides, recipe model, lora targets or None for the defaults)
    "qwen3": ("qwen3", {}, QWEN3, None),
    "qwen3_moe": ("qwen3_moe", {}, QWEN3_MOE, None),
    "deepseek_v2": ("deepseek_v2", {}, DEEPSEEK, MLA_TARGETS),
    "deepseek_v2_q_lora": ("deepseek_v2", {"q_lora_rank": 24}, Q_LORA, Q_LORA_TARGETS),
    # one layer's experts adapt gate/up only: peft wraps both fused parameters in every layer (audit, 2026-12-06)
    "qwen3_moe_uneven": ("qwen3_moe", {}, QWEN3_MOE, None),
}
EXCLUDE = {"qwen3_moe_uneven": ["decoder.layers.0.mlp.experts.linear_fc2"]}


def family_cfg(case: str, hf_dir, **trainer):
    _, _, model, targets = CASES[case]
    lora = {"dim": 4, "alpha": 8, **({"target_modules": targets} if targets else {}),
            **({"exclude_modules": EXCLUDE[case]} if case in EXCLUDE else {})}
    return tiny_cfg(trainer={"model": dict(model), "lora": lora, "checkpoint": {"pretrained": str(hf_dir)},
                             **trainer})


def peft_logits(base_dir, adapter_dir) -> torch.Tensor:
    with torch.no_grad():
        return PeftModel.from_pretrained(load_tiny(base_dir), str(adapter_dir)).eval()(TOKENS).logits


@pytest.mark.parametrize("case", list(CASES))
def test_export_loads_in_peft_and_matches_trainer(tmp_path, case):
    family, overrides, _, _ = CASES[case]
    base = save_tiny(family, tmp_path / "hf", seed=11, **overrides)
    mega = trained_export(family_cfg(case, base), TOKENS, tmp_path / "adapter", seed=12, std=0.1)
    with torch.no_grad():
        base_logits = load_tiny(base)(TOKENS).logits
    got = peft_logits(base, tmp_path / "adapter")
    assert (mega - base_logits).abs().max() > 1e-2  # the adapters change the output...
    torch.testing.assert_close(got, mega, rtol=1e-4, atol=1e-4)  # ...and peft reproduces it
    conf = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    if family in ("qwen3_moe", "deepseek_v2"):  # routed experts on the fused parameters, all 4 experts
        assert {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"} <= set(conf["target_parameters"])
        assert not {"gate_proj", "up_proj", "down_proj"} & set(conf["target_modules"])
        assert tensors["base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight"].shape == (4 * 4, 64)
        assert tensors["base_model.model.model.layers.1.mlp.experts.lora_B.weight"].shape == (64, 4 * 4)
        assert conf["lora_dropout"] == 0.0
    if case in EXCLUDE:  # layer 0's down_proj: zero factors where peft looks for them
        assert not tensors["base_model.model.model.layers.0.mlp.experts.lora_B.weight"].any()
        assert tensors["base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight"].any()
    # and the merged checkpoint of that adapter = the trainer's logits
    merge_adapter(base, tmp_path / "adapter", tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(TOKENS).logits, mega, rtol=1e-4, atol=1e-4)


def test_fused_expert_factor_layout():
    """Expert e's factors land where peft's ParamWrapper reads them: A rows e*r.., B columns e, e+E, ..."""
    from peft.tuners.lora.layer import ParamWrapper  # noqa: F401  (the layout below is its get_delta_weight's)
    from trainer.model.peft_export import _fuse_experts

    g = torch.Generator().manual_seed(0)
    pairs = {j: (torch.randn(3, 8, generator=g), torch.randn(10, 3, generator=g)) for j in range(4)}
    out = {}
    assert _fuse_experts({(0, "linear_fc2"): pairs}, 4, out) == {"mlp.experts.down_proj"}
    a = out["base_model.model.model.layers.0.mlp.experts.lora_A.weight"]
    b = out["base_model.model.model.layers.0.mlp.experts.lora_B.weight"]
    w_a, w_b = a.reshape(4, -1, a.shape[-1]), b.reshape(b.shape[0], -1, 4)  # peft's reshapes
    got = torch.einsum("o r e, e r i -> e o i", w_b, w_a)
    want = torch.stack([pairs[j][1] @ pairs[j][0] for j in range(4)])
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="experts \\[0, 1, 2\\], expected all 4"):
        _fuse_experts({(0, "linear_fc1"): {j: pairs[j] for j in range(3)}}, 4, {})


LAYOUTS = {"qwen3_moe/ep2": {"expert": 2}, "qwen3/tp2": {"tensor": 2},
           "deepseek_v2_q_lora/tp2_sp": {"tensor": 2, "sequence_parallel": True},
           "deepseek_v2/pp2": {"pipeline": 2}}  # dense layer 0 and MoE layer 1 on different stages


def _layout_cfg(run: str, root):
    case, _, layout = run.partition("/")
    par = {"tensor": 1, "pipeline": 1, "expert": 1, "sequence_parallel": False, **LAYOUTS.get(run, {})}
    return family_cfg(case, f"{root}/{case}/hf", parallelism=par)


def _export_on_ranks(run, par, root):
    """One rank of a 2-rank layout: import the checkpoint, load the single-process adapters, export."""
    from tests.model_helpers import dist_session
    from trainer.model import build_model, export_peft
    from trainer.model.layout import load_full_global_state_dict

    cfg = _layout_cfg(run, root)
    case = run.split("/")[0]
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        load_full_global_state_dict(model, torch.load(f"{root}/{case}/adapters.pt"), only_lora=True)
        export_peft(model, cfg, f"{root}/{run}/adapter")
        return {"tp": info.tp_size, "dp": info.dp_size, "pp": info.pp_size}


@pytest.mark.slow  # ~15 s on two cores under load: `make test` runs it, `make check` does not
def test_sharded_runs_export_whole(tmp_path):
    """EP=2, TP=2 and PP=2 (gloo, 2 ranks) export the same adapter file as one process: no expert, TP shard or
    stage dropped; the EP=2 export also loads in peft with the single-process trainer's logits."""
    import functools

    from tests.model_helpers import dist_session, perturb_adapters
    from tests.parallel_helpers import run_on_ranks
    from trainer.model import adapter_state_dict, build_model, export_peft

    mega = {}
    for run in LAYOUTS:
        case = run.split("/")[0]
        family, overrides, _, _ = CASES[case]
        save_tiny(family, tmp_path / case / "hf", seed=21, **overrides)
        cfg = _layout_cfg(case, tmp_path)
        with dist_session(cfg) as info:
            model = build_model(cfg, info.device)
            perturb_adapters(model, seed=22, std=0.1)
            torch.save({k: v.clone() for k, v in adapter_state_dict(model).items()}, tmp_path / case / "adapters.pt")
            model.eval()
            with torch.no_grad():
                mega[case] = model(input_ids=TOKENS, position_ids=None, attention_mask=None)
            export_peft(model, cfg, tmp_path / case / "adapter")
    sizes = run_on_ranks(2, LAYOUTS, functools.partial(_export_on_ranks, root=str(tmp_path)), tmp_path / "res")[0]
    assert sizes["qwen3/tp2"]["tp"] == 2 and sizes["qwen3_moe/ep2"]["dp"] == 2 and sizes["deepseek_v2/pp2"]["pp"] == 2
    for run in LAYOUTS:
        case = run.split("/")[0]
        got, want = (load_file(str(tmp_path / d / "adapter" / "adapter_model.safetensors")) for d in (run, case))
        assert got.keys() == want.keys(), run
        for name, tensor in want.items():
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=f"{run} {name}")
        assert (json.loads((tmp_path / run / "adapter" / "adapter_config.json").read_text())
                == json.loads((tmp_path / case / "adapter" / "adapter_config.json").read_text()))
    got = peft_logits(tmp_path / "qwen3_moe" / "hf", tmp_path / "qwen3_moe/ep2" / "adapter")
    torch.testing.assert_close(got, mega["qwen3_moe"], rtol=1e-4, atol=1e-4)


def _masked_batch(rows: int = 2, seq: int = 16, prompt: int = 5):
    """One document per row; the first `prompt` label positions are masked (SFT prompt tokens)."""
    g = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, 128, (rows, seq), generator=g)
    labels = torch.full((rows, seq), -100)
    labels[:, :-1] = tokens[:, 1:]
    mask = torch.zeros(rows, seq)
    mask[:, prompt:-1] = 1.0
    labels[mask == 0] = -100
    return {"tokens": tokens, "labels": labels, "loss_mask": mask,
            "position_ids": torch.arange(seq).repeat(rows, 1),
            "cu_seqlens": torch.arange(0, (rows + 1) * seq, seq, dtype=torch.int32), "max_seqlen": seq}


def _shared_a(key: str) -> str:
    """PEFT A keys that are one megatron A (q/k/v of linear_qkv, gate/up of linear_fc1) share a group name."""
    return re.sub(r"\.(q|k|v)_proj\.lora_A", ".qkv.lora_A", re.sub(r"\.(gate|up)_proj\.lora_A", ".fc1.lora_A", key))


@pytest.mark.parametrize("case", ["qwen3_moe", "deepseek_v2"])
def test_lora_step_matches_transformers_peft(tmp_path, case):
    """Loss and adapter gradients of one masked SFT batch: the trainer's model = transformers + PEFT with the
    exported adapter (grads compared in PEFT's layout; A grads of split megatron linears summed)."""
    from tests.model_helpers import dist_session, perturb_adapters
    from trainer.model import build_model, forward_losses
    from trainer.model.peft_export import gathered_adapters, to_peft_tensors

    family, overrides, _, _ = CASES[case]
    base = save_tiny(family, tmp_path / "hf", seed=31, **overrides)
    cfg = family_cfg(case, base)
    batch = _masked_batch()
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        perturb_adapters(model, seed=32, std=0.1)
        model.eval()  # (no dropout on either side)
        losses = forward_losses(model, batch)
        loss = (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
        loss.backward()
        from trainer.model import export_peft

        export_peft(model, cfg, tmp_path / "adapter")
        for p in model.parameters():  # the gradients, laid out like the adapter (same gather + mapping)
            if p.grad is not None:
                p.data.copy_(p.grad)
        grads, _, _ = to_peft_tensors(gathered_adapters(model), model.config)
    peft_model = PeftModel.from_pretrained(load_tiny(base), str(tmp_path / "adapter"), is_trainable=True).eval()
    logits = peft_model(batch["tokens"]).logits
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1),
                                           ignore_index=-100, reduction="sum")
    ref = ce / batch["loss_mask"].sum()
    ref.backward()
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=1e-5, atol=1e-5)
    theirs = {}
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            key = name.replace(".default.", ".")
            group = _shared_a(key)
            theirs[group] = theirs.get(group, 0) + p.grad
    mine = {_shared_a(k): v for k, v in grads.items()}  # (shared A: one grad, written once per piece)
    assert mine.keys() == theirs.keys()
    assert any("experts.base_layer.lora_B" in k for k in mine)
    for key, g in sorted(mine.items()):
        assert g.abs().max() > 0, key
        torch.testing.assert_close(theirs[key], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{key}: {m}")


def test_grouped_and_sequential_expert_names_export_alike():
    """TE's grouped experts (…experts.linear_fc1.lora.<j>, the GPU spec) and SequentialMLP's
    (…experts.local_experts.<j>.linear_fc1, the CPU spec) give the same PEFT tensors and targets."""
    from types import SimpleNamespace

    from trainer.model.peft_export import to_peft_tensors

    config = SimpleNamespace(num_attention_heads=4, num_query_groups=2, num_moe_experts=2)
    g = torch.Generator().manual_seed(1)
    factors = {(j, fc): (torch.randn(4, 8, generator=g), torch.randn(6, 4, generator=g))
               for j in range(2) for fc in ("linear_fc1", "linear_fc2")}
    local = {f"layers.0.mlp.experts.local_experts.{j}.{fc}.lora_{x}": t
             for (j, fc), ab in factors.items() for x, t in zip("ab", ab)}
    grouped = {f"layers.0.mlp.experts.{fc}.lora.{j}.lora_{x}": t
               for (j, fc), ab in factors.items() for x, t in zip("ab", ab)}
    (t1, m1, p1), (t2, m2, p2) = to_peft_tensors(local, config), to_peft_tensors(grouped, config)
    assert (m1, p1) == (m2, p2) == ([], ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"])
    assert t1.keys() == t2.keys() and all(torch.equal(t1[k], t2[k]) for k in t1)
