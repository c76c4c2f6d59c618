"""A Hugging Face checkpoint directory's JSON files as read before any field is used (hf_config builds on them):
config.json, whose value types are checked here, and model.safetensors.index.json. A hand-edited or truncated file
gives one HFConfigError naming the field, never a traceback from int("abc") at submit or on the node (audit,
2026-12-07: `validate` crashed where `submit --dry-run` passed). Standard library only."""
from __future__ import annotations

import json
from pathlib import Path

_FIELD = "trainer.checkpoint.pretrained"
# config.json fields read as numbers (hf_config's int()/float(), transformers' readings), objects and layer lists
NUMBERS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
           "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings", "rope_theta", "attention_dropout",
           "partial_rotary_factor", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
           "v_head_dim", "moe_intermediate_size", "num_experts", "num_local_experts", "n_routed_experts",
           "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
           "decoder_sparse_step", "routed_scaling_factor", "n_group", "topk_group")
MAPPINGS = ("rope_scaling", "rope_parameters")
INT_LISTS = ("mlp_only_layers",)


class HFConfigError(ValueError):
    """A checkpoint the trainer cannot import as the recipe describes; `field` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _load(f: Path):
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:  # (FileNotFoundError: the callers look first)
        raise HFConfigError(_FIELD, f"`{_FIELD}` {f} cannot be read as JSON: {e}") from None


def read_config(path) -> dict:
    """config.json of a checkpoint directory, its value types checked (HFConfigError naming the first wrong one)."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise HFConfigError(_FIELD, f"`{_FIELD}` {path} has no config.json (an HF checkpoint directory holds "
                                    "config.json and *.safetensors)")
    hf = _load(f)
    problem = type_problem(hf)
    if problem:
        raise HFConfigError(problem[0], f"{f}: {problem[1]}")
    return hf


def type_problem(hf) -> tuple[str, str] | None:
    """(field, what is wrong) for the first value of the wrong type in a parsed config.json; None when all fit."""
    if not isinstance(hf, dict):
        return "config.json", f"holds {type(hf).__name__} {json.dumps(hf)[:40]}, not an object of fields"
    for key in NUMBERS:
        v = hf.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"config.json {key}", f"`{key}: {json.dumps(v)[:40]}` is not a number"
    for key in MAPPINGS:
        v = hf.get(key)
        if v is not None and not isinstance(v, dict):
            return f"config.json {key}", f"`{key}: {json.dumps(v)[:40]}` is not an object of RoPE fields"
        for name, x in (v or {}).items():  # (hf_config.rope reads each as a float; yarn's truncate is a bool)
            if name not in ("rope_type", "type") and x is not None and not isinstance(x, (int, float)):
                return f"config.json {key}", f"`{key}.{name}: {json.dumps(x)[:40]}` is not a number"
    for key in INT_LISTS:
        v = hf.get(key)
        if v is not None and not (isinstance(v, list) and all(type(i) is int for i in v)):
            return f"config.json {key}", f"`{key}: {json.dumps(v)[:40]}` is not a list of layer numbers"
    return None


def shards(path) -> tuple[list[str], int]:
    """(safetensors files, total bytes) of a checkpoint: from model.safetensors.index.json when present."""
    d = Path(path)
    index = d / "model.safetensors.index.json"
    if index.exists():
        parsed = _load(index)
        weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise HFConfigError(_FIELD, f"`{_FIELD}` {index} has no `weight_map` object of tensor names to "
                                        ".safetensors files")
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in d.glob("*.safetensors"))
    return files, sum((d / f).stat().st_size for f in files if (d / f).exists())
