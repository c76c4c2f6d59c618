"""trainer.model.hf.merge: base + PEFT adapter folded into a complete HF checkpoint whose logits equal base + adapter.

Dense Llama: the adapter is the trainer's own export (megatron LoRA -> PEFT), so the merged model also
reproduces the trainer's logits. Qwen3-MoE / DeepSeek-V2: the adapter is written by peft itself on the
transformers model (routed experts through ParamWrapper on the fused 3-D expert parameters, dense and shared
MLPs as parameters), and the merge adds it to the Hub's per-expert tensors on disk.
"""
import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open

from tests.hf_tiny import hub_layout, load_tiny, save_tiny
from tests.model_helpers import tiny_cfg, trained_export
from trainer.model.hf.merge import merge_adapter

TOKENIZER = Path(__file__).resolve().parents[1] / "recipes/data/quickstart/tokenizer"
TOKENS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(7))


def peft_adapter(base_dir, out_dir, modules, parameters=None, seed=0, r=4, alpha=8.0):
    """A random (B != 0) adapter written by peft on the transformers model; returns its logits on TOKENS."""
    model = load_tiny(base_dir)
    conf = LoraConfig(r=r, lora_alpha=alpha, target_modules=modules, target_parameters=parameters, lora_dropout=0.0)
    peft_model = get_peft_model(model, conf)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(peft_model.named_parameters()):
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    peft_model.save_pretrained(out_dir)
    with torch.no_grad():
        return PeftModel.from_pretrained(load_tiny(base_dir), str(out_dir)).eval()(TOKENS).logits


def merged_logits(out_dir) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(TOKENS).logits


def test_merge_dense_llama_from_trainer_export(tmp_path):
    base = save_tiny("llama", tmp_path / "hf", seed=5)
    for f in TOKENIZER.iterdir():
        shutil.copy(f, base / f.name)
    (base / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "max_new_tokens": 8}))
    cfg = tiny_cfg(trainer={"checkpoint": {"pretrained": str(base)}, "lora": {"dim": 4, "alpha": 12}})
    mega = trained_export(cfg, TOKENS, tmp_path / "adapter")
    with torch.no_grad():
        ref = PeftModel.from_pretrained(load_tiny(base), str(tmp_path / "adapter")).eval()(TOKENS).logits
        base_logits = load_tiny(base)(TOKENS).logits
    info = merge_adapter(base, tmp_path / "adapter", tmp_path / "merged", note="FP8 hybrid (delayed scaling)",
                         shard_bytes=40_000)
    out = tmp_path / "merged"
    got = merged_logits(out)
    assert (ref - base_logits).abs().max() > 1e-2  # the adapter changes the output...
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)  # ...and the merge keeps that change
    torch.testing.assert_close(got, mega, rtol=1e-4, atol=1e-4)  # = the trainer's own model
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*.safetensors"))
    assert info["shards"] == len(shards) > 1 and set(index["weight_map"].values()) == {s.name for s in shards}
    assert info["tensors"] == len(index["weight_map"]) == hub_layout(base)["tensors"] == 21
    assert info["merged_tensors"] == 2 * 7  # q k v o gate up down in both layers
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / f).read_bytes() == (base / f).read_bytes()
    assert "Training precision: FP8 hybrid (delayed scaling)" in (out / "README.md").read_text()
    with safe_open(str(shards[0]), framework="pt") as h:
        assert {h.get_tensor(k).dtype for k in h.keys()} == {torch.float32}


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_merge_keeps_base_dtype(tmp_path, dtype):
    base = save_tiny("qwen3", tmp_path / "hf", seed=2, dtype=dtype)
    peft_adapter(base, tmp_path / "adapter", ["q_proj", "down_proj"], seed=3)
    merge_adapter(base, tmp_path / "adapter", tmp_path / "merged")
    with safe_open(str(next((tmp_path / "merged").glob("model-*.safetensors"))), framework="pt") as h:
        w = h.get_tensor("model.layers.0.self_attn.q_proj.weight")
    with safe_open(str(next(base.glob("*.safetensors"))), framework="pt") as h:
        w0 = h.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert w.dtype == w0.dtype == dtype and (w.float() - w0.float()).abs().max() > 0


@pytest.mark.parametrize("family,overrides,modules,parameters", [
    ("qwen3_moe", {}, ["q_proj", "k_proj", "v_proj", "o_proj"], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    ("qwen3_moe", {}, ["o_proj"], ["mlp.experts.down_proj"]),  # one fused wrapper only: it is the outer one
    ("deepseek_v2", {"q_lora_rank": 24}, ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
     ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate_proj.weight", "mlp.up_proj.weight",
      "mlp.down_proj.weight", "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight",
      "mlp.shared_experts.down_proj.weight"]),
])
def test_merge_moe_per_expert_on_disk(tmp_path, family, overrides, modules, parameters):
    base = save_tiny(family, tmp_path / "hf", seed=4, **overrides)
    assert hub_layout(base)["per_expert"]
    ref = peft_adapter(base, tmp_path / "adapter", modules, parameters, seed=8)
    with torch.no_grad():
        base_logits = load_tiny(base)(TOKENS).logits
    info = merge_adapter(base, tmp_path / "adapter", tmp_path / "merged")
    got = merged_logits(tmp_path / "merged")
    assert (ref - base_logits).abs().max() > 1e-2
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert hub_layout(tmp_path / "merged") == hub_layout(base)  # written in the Hub's per-expert layout
    experts = 4 * 3 * (2 if family == "qwen3_moe" else 1) if "mlp.experts.gate_up_proj" in parameters else 4 * 2
    assert info["merged_tensors"] >= experts


def test_merge_refuses_an_adapter_key_without_base_tensor(tmp_path):
    base = save_tiny("llama", tmp_path / "hf", seed=1)
    peft_adapter(base, tmp_path / "adapter", ["q_proj"], seed=1)
    other = save_tiny("llama", tmp_path / "hf1", seed=1, num_hidden_layers=1)  # layer 1 is absent there
    with pytest.raises(KeyError, match="layers.1.self_attn.q_proj maps to no tensor"):
        merge_adapter(other, tmp_path / "adapter", tmp_path / "merged")
    assert not (tmp_path / "merged").exists()  # nothing written
    narrow = save_tiny("llama", tmp_path / "hf2", seed=1, num_key_value_heads=1)  # k_proj has 16 rows, not 32
    peft_adapter(base, tmp_path / "adapter_k", ["k_proj"], seed=1)
    with pytest.raises(ValueError, match="k_proj: its delta for model.layers.0.self_attn.k_proj.weight is"):
        merge_adapter(narrow, tmp_path / "adapter_k", tmp_path / "merged")
    with pytest.raises(FileExistsError, match="already holds"):  # never mixed with an older checkpoint's shards
        merge_adapter(base, tmp_path / "adapter", other)
    with pytest.raises(ValueError, match="must not be the base"):
        merge_adapter(base, tmp_path / "adapter", base)


def test_merged_export_ships_the_runs_tokenizer(tmp_path):
    """`export --merged` copied the base's tokenizer files first, so the run's own (trainer.tokenizer.path) was never
    written (docs/after-training.md promises the run's); where the run's tokenizer is the base directory's, its files
    are copied as they are."""
    from trainer.data.tokenize import load_tokenizer
    from trainer.post import export

    base = save_tiny("llama", tmp_path / "hf", seed=5)
    for f in TOKENIZER.iterdir():
        shutil.copy(f, base / f.name)
    run_tok = load_tokenizer(str(TOKENIZER))
    run_tok.add_special_tokens({"additional_special_tokens": ["<|run|>"]})  # the run's: one token more
    run_tok.save_pretrained(tmp_path / "tok")
    peft_adapter(base, tmp_path / "adapter", ["q_proj"], seed=2)
    for tokenizer, out in ((tmp_path / "tok", "merged"), (base, "merged_base")):
        cfg = tiny_cfg(trainer={"checkpoint": {"pretrained": str(base)}, "tokenizer": {"path": str(tokenizer)}})
        export.merge(cfg, str(tmp_path / "adapter"), str(tmp_path / out), 7)
    assert "<|run|>" in load_tokenizer(str(tmp_path / "merged")).get_vocab()
    assert "<|run|>" not in load_tokenizer(str(tmp_path / "merged_base")).get_vocab()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "merged_base" / f).read_bytes() == (base / f).read_bytes()
