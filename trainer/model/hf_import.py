"""Load a local Hugging Face Llama checkpoint (safetensors) into the megatron-core GPTModel.

    load_hf_llama(model, "/path/to/hf_dir")   # works before or after LoRA, at any TP size

Layout conversion (HF -> megatron, full tensors; sharding.load_full_state_dict then takes this
rank's TP shard):
* q/k/v_proj -> linear_qkv.weight, interleaved per query group: [q_g (heads/groups * d); k_g; v_g]
* gate_proj/up_proj -> linear_fc1.weight = [gate; up]
* o_proj -> linear_proj, down_proj -> linear_fc2, embed_tokens, lm_head, norms by name; with TE the
  input/post-attention norms live inside linear_qkv / linear_fc1 as layer_norm_weight.
Both use the same (rotate-half) RoPE convention, so q/k need no permutation.

Memory: nothing is read up front. The safetensors files are memory-mapped (SafetensorsDir) and each
megatron tensor is built when the loader reaches it (LazyTensors), so a rank holds one converted tensor
at a time instead of the whole checkpoint (138 GB for Llama2-70B, once per rank).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

import torch

from trainer.model.sharding import canonical_params, load_full_state_dict
from trainer.precision.fp8_params import checks_summary


class SafetensorsDir(Mapping):
    """The tensors of every *.safetensors file in a directory, each read on access (memory-mapped files).
    `reads` counts the tensors read so far."""

    def __init__(self, hf_dir):
        from safetensors import safe_open

        files = sorted(Path(hf_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
        self._where = {}
        for f in files:
            handle = safe_open(str(f), framework="pt")
            self._where.update((key, handle) for key in handle.keys())
        self.reads = 0

    def __getitem__(self, key: str) -> torch.Tensor:
        tensor = self._where[key].get_tensor(key)
        self.reads += 1
        return tensor

    def __contains__(self, key) -> bool:  # (Mapping's default would read the tensor)
        return key in self._where

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class LazyTensors(Mapping):
    """name -> tensor converted from HF tensors when accessed (and not kept). Each entry is
    (HF source names, function of those tensors)."""

    def __init__(self, hf: Mapping, entries: dict[str, tuple[tuple[str, ...], Callable]]):
        self._hf, self._entries = hf, entries

    def __getitem__(self, key: str) -> torch.Tensor:
        sources, fn = self._entries[key]
        return fn(*(self._hf[s] for s in sources))

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def only(self, keys) -> "LazyTensors":
        return LazyTensors(self._hf, {k: e for k, e in self._entries.items() if k in keys})

    def absent_sources(self) -> list[str]:
        """HF names these entries need that the checkpoint lacks (no tensor is read)."""
        return sorted({s for sources, _ in self._entries.values() for s in sources if s not in self._hf})


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


def hf_to_megatron(hf: Mapping, config, te_layout: bool,
                   layer_offset: int = 0, num_local_layers: int | None = None) -> LazyTensors:
    """Full megatron tensors (canonical names) for local layers [offset, offset+num) of the HF state,
    each converted when accessed."""
    heads, groups = config.num_attention_heads, config.num_query_groups
    n = config.num_layers if num_local_layers is None else num_local_layers

    def same(key):
        return (key,), lambda t: t

    def qkv(q, k, v):
        return fuse_qkv(q, k, v, heads, groups)

    def gate_up(gate, up):
        return torch.cat([gate, up], dim=0)

    out = {}
    if "model.embed_tokens.weight" in hf:
        out["embedding.word_embeddings.weight"] = same("model.embed_tokens.weight")
    out["decoder.final_layernorm.weight"] = same("model.norm.weight")
    out["output_layer.weight"] = same("lm_head.weight" if "lm_head.weight" in hf else "model.embed_tokens.weight")
    for i in range(n):
        src, dst = f"model.layers.{layer_offset + i}.", f"decoder.layers.{i}."
        a, m = dst + "self_attention.", dst + "mlp."
        out[a + "linear_qkv.weight"] = tuple(src + f"self_attn.{x}_proj.weight" for x in "qkv"), qkv
        out[a + "linear_proj.weight"] = same(src + "self_attn.o_proj.weight")
        out[m + "linear_fc1.weight"] = (src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight"), gate_up
        out[m + "linear_fc2.weight"] = same(src + "mlp.down_proj.weight")
        ln_in, ln_post = same(src + "input_layernorm.weight"), same(src + "post_attention_layernorm.weight")
        if te_layout:
            out[a + "linear_qkv.layer_norm_weight"] = ln_in
            out[m + "linear_fc1.layer_norm_weight"] = ln_post
        else:
            out[dst + "input_layernorm.weight"] = ln_in
            out[dst + "pre_mlp_layernorm.weight"] = ln_post
    return LazyTensors(hf, out)


def load_hf_llama(model, hf_dir) -> None:
    """Copy an HF Llama checkpoint's weights into the (possibly TP/PP-sharded) base model."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = model.config
    _check_config(hf_dir, config)
    hf = SafetensorsDir(hf_dir)
    params = canonical_params(model)
    te_layout = any(k.endswith("linear_qkv.layer_norm_weight") for k in params)
    n_local = len(model.decoder.layers)
    offset = get_transformer_layer_offset(config) if ps.get_pipeline_model_parallel_world_size() > 1 else 0
    full = hf_to_megatron(hf, config, te_layout, layer_offset=offset, num_local_layers=n_local).only(params)
    absent = full.absent_sources()
    if absent:  # before any weight is copied: no half-loaded model
        raise KeyError(f"HF checkpoint {hf_dir} lacks {len(absent)} tensors, e.g. {absent[:3]}")
    base = {k for k in params if not k.endswith((".lora_a", ".lora_b"))}
    missing = sorted(base - set(full))
    if missing:
        raise KeyError(f"HF checkpoint {hf_dir} gives no weight for {missing[:4]}")
    checks: list = []
    loaded = load_full_state_dict(model, full, strict=False, fp8_checks=checks)
    model._primus_weights_line = pretrained_summary(hf_dir, loaded, checks)


def pretrained_summary(hf_dir, loaded: list, checks: list) -> str:
    """The log line of an HF import: what was copied and, for FP8 parameters, how well they hold it."""
    return f"pretrained | path {hf_dir} | tensors {len(loaded)}" + checks_summary(checks)
