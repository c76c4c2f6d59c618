"""HF import of every shipped family from tiny random transformers models saved in the Hub layout (one tensor per
expert): Llama (llama3 RoPE scaling, tied embeddings), Qwen3 (q/k norms), Qwen3-MoE (router, routed experts) and
DeepSeek-V2 (MLA with and without q_lora_rank, YaRN, a dense first layer, shared + routed experts, a routed
scaling factor). The imported megatron model's fp32 logits equal transformers' (1e-4); a random build is far off.
The recipe model comes from config.json (primus_contract.hf_config.model_fields), and a recipe that disagrees with
it, or a config.json field the trainer does not implement, is refused by name."""
from __future__ import annotations

import json
import os

import pytest
import torch

from primus_contract.hf_config import HFConfigError, check_pretrained, model_fields, read_config
from tests.conftest import cli
from tests.hf_tiny import load_tiny, save_tiny
from tests.model_helpers import dist_session, tiny_cfg
from trainer.model import build

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
CASES = {
    "llama3_tied": ("llama", {"tie_word_embeddings": True, "rope_parameters": LLAMA3}),
    "qwen3": ("qwen3", {}),
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe_unnormalised": ("qwen3_moe", {"norm_topk_prob": False}),
    "deepseek_v2_lite": ("deepseek_v2", {}),
    "deepseek_v2_q_lora_yarn": ("deepseek_v2", {"q_lora_rank": 24, "rope_parameters": YARN,
                                                "routed_scaling_factor": 2.5}),
}
MLA_LORA = ["linear_kv_down_proj", "linear_kv_up_proj", "linear_proj", "linear_fc1", "linear_fc2"]


def recipe_for(path, **trainer) -> object:
    """A tiny recipe whose model section is the checkpoint's config.json (the truth), importing it."""
    fields = model_fields(read_config(path))
    sections = {"model": fields, "checkpoint": {"pretrained": str(path)}, **trainer}
    if fields["multi_latent_attention"]:
        sections.setdefault("lora", {"target_modules": MLA_LORA})
    return tiny_cfg(trainer=sections)


def megatron_logits(cfg, tokens, pretrained=True):
    with dist_session(cfg) as info:
        built = build(cfg, info.device)
        model = built.model.eval()
        with torch.no_grad():
            return model(input_ids=tokens, position_ids=None, attention_mask=None), built.line("hf import") or ""


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_logits_equal_transformers(tmp_path, case):
    family, overrides = CASES[case]
    path = save_tiny(family, tmp_path / "hf", seed=3, **overrides)
    tokens = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = load_tiny(path)(tokens).logits
    cfg = recipe_for(path)
    got, line = megatron_logits(cfg, tokens)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert line.startswith(f"pretrained | path {path} | tensors ") and f"| {read_config(path)['model_type']} | 2 layers |" in line
    random = tiny_cfg(trainer={**{k: v for k, v in cfg.trainer.to_dict().items() if k in ("model", "lora")}})
    far, _ = megatron_logits(random, tokens)
    assert (far - ref).abs().max() > 1e-2  # the match is not an accident


def test_sharded_checkpoint_with_index(tmp_path):
    """A checkpoint split over shards with model.safetensors.index.json loads the same; describe counts shards."""
    from primus_contract.hf_config import describe

    model = load_tiny(save_tiny("qwen3_moe", tmp_path / "one", seed=5))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    shards = len(list((tmp_path / "sharded").glob("*.safetensors")))
    assert shards > 2 and f"| {shards} shards |" in describe(tmp_path / "sharded")
    tokens = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(tokens).logits
    got, _ = megatron_logits(recipe_for(tmp_path / "sharded"), tokens)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


MISMATCH = {  # recipe field, wrong value (each against a tiny checkpoint of the family)
    "rotary_base": ("llama", 500000.0), "untie_embeddings": ("llama", False), "kv_channels": ("qwen3", 32),
    "norm_epsilon": ("qwen3", 1e-3), "vocab_size": ("qwen3", 256), "qk_layernorm": ("qwen3", False),
    "num_moe_experts": ("qwen3_moe", 8), "moe_router_topk": ("qwen3_moe", 1), "moe_norm_topk_prob": ("qwen3_moe", False),
    "q_lora_rank": ("deepseek_v2", 32), "moe_first_k_dense": ("deepseek_v2", 0),
    "moe_shared_expert_intermediate_size": ("deepseek_v2", 32),
    "rope_scaling": ("deepseek_v2", {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096.0}),
}


@pytest.mark.parametrize("field", sorted(MISMATCH))
def test_recipe_disagreeing_with_config_json_is_refused(tmp_path, field):
    family, wrong = MISMATCH[field]
    path = save_tiny(family, tmp_path / "hf", seed=1)
    model = model_fields(read_config(path))
    check_pretrained(model, path)  # the config's own fields pass
    with pytest.raises(HFConfigError, match=rf"`trainer.model.{field}` is .* but the checkpoint's config.json says"):
        check_pretrained({**model, field: wrong}, path)


UNSUPPORTED = {  # config.json edit -> the field the refusal names
    "model_type": ({"model_type": "mistral"}, "config.json model_type"),
    "sliding": ({"use_sliding_window": True}, "use_sliding_window"),
    "bias": ({"attention_bias": True}, "attention_bias"),
    "act": ({"hidden_act": "gelu"}, "hidden_act"),
    "unknown": ({"new_math_switch": 1.5}, "new_math_switch"),
    "group_routing": ({"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1}, "topk_method"),
    "quantized": ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    "rope_linear": ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    "deepseek_eps": ({"rms_norm_eps": 1e-5}, "rms_norm_eps"),  # transformers' MLA latent norms keep 1e-6
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unimplemented_config_json_fields_are_refused_by_name(tmp_path, case):
    edit, named = UNSUPPORTED[case]
    family = "deepseek_v2" if case in ("group_routing", "deepseek_eps") else "qwen3"
    path = save_tiny(family, tmp_path / "hf", seed=1)
    hf = {**read_config(path), **edit}
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(HFConfigError, match=named) as e:
        model_fields(hf)
    assert named in e.value.field or named in str(e.value)


def test_untied_checkpoint_with_tied_recipe_is_refused_at_validate(tmp_path):
    """The issue's silent cases end at `validate`, one line, exit 2: a tied recipe over an untied checkpoint
    (lm_head.weight would be dropped) and a RoPE base other than config.json's."""
    path = save_tiny("llama", tmp_path / "hf", seed=2)
    base = ["recipes/quickstart.yaml", "--set", f"trainer.checkpoint.pretrained={path}"]
    fields = model_fields(read_config(path))
    sets = [a for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                        "vocab_size", "norm_epsilon", "rotary_base")
            for a in ("--set", f"trainer.model.{k}={fields[k]}")]
    env = {**os.environ, "PRIMUS_REGISTRY": str(tmp_path / "registry")}
    ok = cli(env, "validate", *base, *sets)
    assert ok.returncode == 0 and "pretrained: " in ok.stdout and "— llama | 2 layers |" in ok.stdout, ok.stderr
    for extra, field in ((["--set", "trainer.model.untie_embeddings=false"], "untie_embeddings"),
                         (["--set", "trainer.model.rotary_base=500000"], "rotary_base")):
        bad = cli(env, "validate", *base, *sets, *extra)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
        assert bad.stderr.startswith(f"error: `trainer.model.{field}` is ") and "config.json says" in bad.stderr


def test_missing_config_json_is_refused(tmp_path):
    path = save_tiny("qwen3", tmp_path / "hf", seed=1)
    (path / "config.json").unlink()
    with pytest.raises(HFConfigError, match="has no config.json"):
        check_pretrained(model_fields({"model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2,
                                       "hidden_size": 64, "intermediate_size": 160, "vocab_size": 128,
                                       "head_dim": 16}), path)


def test_model_preset_checkpoint_reads_the_architecture_from_config_json(tmp_path):
    """`trainer.model.preset: checkpoint` takes every model field from config.json; a field the recipe still sets
    is checked against it; an unreadable directory is refused at validate."""
    path = save_tiny("deepseek_v2", tmp_path / "hf", seed=1, q_lora_rank=24)
    env = {**os.environ, "PRIMUS_REGISTRY": str(tmp_path / "registry")}
    base = ["validate", "recipes/quickstart.yaml", "--set", "trainer.model.preset=checkpoint",
            "--set", f"trainer.checkpoint.pretrained={path}", "--set", "trainer.lora.target_modules=[linear_proj]",
            "--set", "trainer.checkpoint.export_peft=false"]
    out = cli(env, *base, "--json")
    assert out.returncode == 0, out.stderr
    model = json.loads(out.stdout)["trainer"]["model"]
    assert (model["q_lora_rank"], model["kv_lora_rank"], model["num_moe_experts"], model["moe_first_k_dense"],
            model["max_position_embeddings"]) == (24, 16, 4, 1, 256)
    bad = cli(env, *base, "--set", "trainer.model.kv_lora_rank=8")
    assert bad.returncode == 2 and bad.stderr == (f"error: `trainer.model.kv_lora_rank` is 8 but the checkpoint's "
                                                  f"config.json says 16: {path}\n")
    gone = cli(env, *[a.replace(str(path), str(tmp_path / "nowhere")) for a in base])
    assert gone.returncode == 2 and "must be a directory readable here" in gone.stderr
