"""Load a local Hugging Face Llama checkpoint (safetensors) into the megatron-core GPTModel.

    load_hf_llama(model, "/path/to/hf_dir")   # works before or after LoRA, at any TP size

Layout conversion (HF -> megatron, full tensors; sharding.load_full_state_dict then takes this
rank's TP shard):
* q/k/v_proj -> linear_qkv.weight, interleaved per query group: [q_g (heads/groups * d); k_g; v_g]
* gate_proj/up_proj -> linear_fc1.weight = [gate; up]
* o_proj -> linear_proj, down_proj -> linear_fc2, embed_tokens, lm_head, norms by name; with TE the
  input/post-attention norms live inside linear_qkv / linear_fc1 as layer_norm_weight.
Both use the same (rotate-half) RoPE convention, so q/k need no permutation.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer.model.sharding import canonical_params, load_full_state_dict


def read_safetensors_dir(hf_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def fuse_qkv(q, k, v, heads: int, groups: int) -> torch.Tensor:
    """[heads*d, h], [groups*d, h] x2 -> megatron's per-group interleaved [(heads+2*groups)*d, h]."""
    d = q.shape[0] // heads
    qg = q.reshape(groups, heads // groups * d, -1)
    kg = k.reshape(groups, d, -1)
    vg = v.reshape(groups, d, -1)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, q.shape[-1])


def split_qkv(qkv, heads: int, groups: int):
    """Inverse of fuse_qkv along dim 0 (works for weights and for LoRA B [rows, r])."""
    per = heads // groups
    d = qkv.shape[0] // (heads + 2 * groups)
    g = qkv.reshape(groups, (per + 2) * d, -1)
    q = g[:, :per * d].reshape(heads * d, -1)
    k = g[:, per * d:(per + 1) * d].reshape(groups * d, -1)
    v = g[:, (per + 1) * d:].reshape(groups * d, -1)
    return q, k, v


def _check_config(hf_dir, cfg) -> None:
    path = Path(hf_dir) / "config.json"
    if not path.exists():
        return
    hf = json.loads(path.read_text())
    want = {"hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_query_groups, "intermediate_size": cfg.ffn_hidden_size,
            "vocab_size": None}
    bad = {k: (hf.get(k), v) for k, v in want.items() if v is not None and k in hf and hf[k] != v}
    if bad:
        raise ValueError(f"{hf_dir}/config.json does not match the recipe model: "
                         + ", ".join(f"{k} hf={a} recipe={b}" for k, (a, b) in bad.items()))


def hf_to_megatron(hf: dict[str, torch.Tensor], config, te_layout: bool,
                   layer_offset: int = 0, num_local_layers: int | None = None) -> dict[str, torch.Tensor]:
    """Full megatron tensors (canonical names) for local layers [offset, offset+num) of the HF state."""
    heads, groups = config.num_attention_heads, config.num_query_groups
    n = config.num_layers if num_local_layers is None else num_local_layers
    out = {}
    if "model.embed_tokens.weight" in hf:
        out["embedding.word_embeddings.weight"] = hf["model.embed_tokens.weight"]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    out["output_layer.weight"] = hf.get("lm_head.weight", hf.get("model.embed_tokens.weight"))
    for i in range(n):
        src, dst = f"model.layers.{layer_offset + i}.", f"decoder.layers.{i}."
        a, m = dst + "self_attention.", dst + "mlp."
        out[a + "linear_qkv.weight"] = fuse_qkv(hf[src + "self_attn.q_proj.weight"],
                                                hf[src + "self_attn.k_proj.weight"],
                                                hf[src + "self_attn.v_proj.weight"], heads, groups)
        out[a + "linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        out[m + "linear_fc1.weight"] = torch.cat([hf[src + "mlp.gate_proj.weight"],
                                                  hf[src + "mlp.up_proj.weight"]], dim=0)
        out[m + "linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
        ln_in, ln_post = hf[src + "input_layernorm.weight"], hf[src + "post_attention_layernorm.weight"]
        if te_layout:
            out[a + "linear_qkv.layer_norm_weight"] = ln_in
            out[m + "linear_fc1.layer_norm_weight"] = ln_post
        else:
            out[dst + "input_layernorm.weight"] = ln_in
            out[dst + "pre_mlp_layernorm.weight"] = ln_post
    return out


def load_hf_llama(model, hf_dir) -> None:
    """Copy an HF Llama checkpoint's weights into the (possibly TP/PP-sharded) base model."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = model.config
    _check_config(hf_dir, config)
    hf = read_safetensors_dir(hf_dir)
    params = canonical_params(model)
    te_layout = any(k.endswith("linear_qkv.layer_norm_weight") for k in params)
    n_local = len(model.decoder.layers)
    offset = get_transformer_layer_offset(config) if ps.get_pipeline_model_parallel_world_size() > 1 else 0
    full = hf_to_megatron(hf, config, te_layout, layer_offset=offset, num_local_layers=n_local)
    full = {k: v for k, v in full.items() if k in params}
    base = {k for k in params if not k.endswith((".lora_a", ".lora_b"))}
    missing = sorted(base - set(full))
    if missing:
        raise KeyError(f"HF checkpoint {hf_dir} gives no weight for {missing[:4]}")
    load_full_state_dict(model, full, strict=False)
