"""Tiny random Hugging Face models saved in the Hub's on-disk layout (shared by the import/export tests).

    path = save_tiny("qwen3_moe", tmp_path / "hf", seed=3)          # fp32, deterministic
    model = load_tiny(path)                                           # transformers model, eval mode
    save_tiny("deepseek_v2", d, q_lora_rank=24, first_k_dense_replace=1, n_shared_experts=2)

Families: llama, qwen3 (q_norm/k_norm), qwen3_moe (router mlp.gate, routed experts, no shared experts),
deepseek_v2 (MLA; q_lora_rank None -> q_proj, set -> q_a_proj/q_a_layernorm/q_b_proj; first_k_dense_replace
dense layers; shared experts mlp.shared_experts). Sizes match tests/model_helpers.TINY (hidden 64, 4 heads,
vocab 128, ffn 160) and its QWEN3_MOE / DEEPSEEK_MLA presets (4 experts, top-2, expert ffn 32, shared 64).
rms_norm_eps is 1e-5 (tiny_cfg's norm_epsilon), except DeepSeek-V2's 1e-6: transformers 5.24 builds its
q_a_layernorm / kv_a_layernorm with a fixed eps of 1e-6, whatever config.json says (so does the real model).

Norm weights get noise (ones would hide a swapped norm) and router weights are scaled up, so the top-k choice
is decisive (near-ties could route differently under rounding). transformers 5 keeps experts fused in memory
(mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]); save_pretrained writes them per expert
(mlp.experts.{j}.{gate,up,down}_proj.weight), which `hub_layout` checks.
"""
from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("llama", "qwen3", "qwen3_moe", "deepseek_v2")
_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)


def tiny_config(family: str, **overrides):
    """The transformers config of a tiny `family` model (overrides win)."""
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": float(overrides.pop("rope_theta", 10000.0))}
    if family == "llama":
        cls, kw = tf.LlamaConfig, dict(num_key_value_heads=2, mlp_bias=False)
    elif family == "qwen3":
        cls, kw = tf.Qwen3Config, dict(num_key_value_heads=2, head_dim=16, use_sliding_window=False)
    elif family == "qwen3_moe":
        cls, kw = tf.Qwen3MoeConfig, dict(num_key_value_heads=2, head_dim=16, num_experts=4, norm_topk_prob=True,
                                          decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False, **_MOE)
    elif family == "deepseek_v2":
        cls, kw = tf.DeepseekV2Config, dict(num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                                            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                            n_routed_experts=4, n_shared_experts=2, first_k_dense_replace=1,
                                            topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
                                            mlp_bias=False, rms_norm_eps=1e-6, **_MOE)
    else:
        raise ValueError(f"unknown tiny family {family!r} (one of {FAMILIES})")
    kw = {**_COMMON, **kw, "rope_parameters": overrides.pop("rope_parameters", rope), **overrides}
    return cls(**kw)


def build_tiny(family: str, seed: int = 0, dtype=torch.float32, **overrides):
    """A random transformers model of `family` (eval mode, fp32 unless `dtype`), norms noised, routers sharpened."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.1)
            elif name.endswith("mlp.gate.weight"):  # the router
                p.mul_(30.0)
    return model


def save_tiny(family: str, out_dir, seed: int = 0, dtype=torch.float32, **overrides) -> Path:
    """Build a tiny `family` model and save it (safetensors, Hub layout: one tensor per expert)."""
    out = Path(out_dir)
    model = build_tiny(family, seed=seed, dtype=dtype, **overrides)
    model.save_pretrained(out, safe_serialization=True)
    layout = hub_layout(out)
    if family in ("qwen3_moe", "deepseek_v2") and not layout["per_expert"]:
        raise AssertionError(f"save_pretrained wrote fused experts in {out}: {layout}")
    return out


def load_tiny(path):
    """The saved tiny model, loaded back through transformers (fp32, eval)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def hub_layout(path) -> dict:
    """What the saved tensors look like: per-expert (Hub) or fused expert names, and the tensor count."""
    from safetensors import safe_open

    keys = set()
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            keys.update(h.keys())
    return {"tensors": len(keys),
            "per_expert": any(".mlp.experts.0.gate_proj.weight" in k for k in keys),
            "fused": any(k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")) for k in keys)}
