"""PEFT export for every family: a tiny transformers checkpoint (tests.hf_tiny, Hub layout) is imported by the
trainer, its adapters get random values, and the exported adapter loaded by peft.PeftModel.from_pretrained on
the installed transformers model reproduces the trainer's logits (fp32, 1e-4), routed-expert adapters included
(peft ParamWrapper on the fused expert parameters). The merge of the same adapter gives those logits too.
"""
import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from tests.hf_tiny import load_tiny, save_tiny
from tests.model_helpers import DEEPSEEK_MLA, MLA_TARGETS, QWEN3_MOE, tiny_cfg, trained_export
from trainer.model.hf_merge import merge_adapter

TOKENS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
QWEN3 = {"family": "qwen3", "qk_layernorm": True, "kv_channels": 16}
Q_LORA = {**DEEPSEEK_MLA, "q_lora_rank": 24}
Q_LORA_TARGETS = [t for t in MLA_TARGETS if t != "linear_q_proj"] + ["linear_q_down_proj", "linear_q_up_proj"]

CASES = {  # id: (hf family, hf overrides, recipe model, lora targets or None for the defaults)
    "qwen3": ("qwen3", {}, QWEN3, None),
    "qwen3_moe": ("qwen3_moe", {}, QWEN3_MOE, None),
    "deepseek_v2": ("deepseek_v2", {}, DEEPSEEK_MLA, MLA_TARGETS),
    "deepseek_v2_q_lora": ("deepseek_v2", {"q_lora_rank": 24}, Q_LORA, Q_LORA_TARGETS),
}


def family_cfg(case: str, hf_dir, **trainer):
    _, _, model, targets = CASES[case]
    lora = {"dim": 4, "alpha": 8, **({"target_modules": targets} if targets else {})}
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
