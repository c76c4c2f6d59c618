"""A Hugging Face checkpoint's config.json against the recipe's model section: the checkpoint is the truth.

    hf = read_config(path)              # config.json of a checkpoint directory (HFConfigError if unreadable)
    fields = model_fields(hf)           # the recipe model fields that config.json implies
    bad = mismatches(recipe_model, fields)   # [(field, recipe value, config.json value)], effective values
    check_pretrained(recipe_model, path)     # raises HFConfigError naming the first mismatch or unsupported field
    describe(path)                      # "qwen3_moe | 48 layers | 128 experts top-8 | 16 shards | 61.1 GB"

Supported `model_type`s: llama (2 / 3 / 3.1, rope_scaling llama3), qwen3 (q_norm/k_norm), qwen3_moe (router
mlp.gate, per-expert weights, no shared experts) and deepseek_v2 (multi-latent attention with or without
q_lora_rank, YaRN, first_k_dense_replace dense layers, shared + routed experts, greedy top-k). A config.json field
that changes the math and that the trainer does not implement (sliding window, biases, another activation,
group-limited routing, partial RoPE, attention dropout, DeepSeek-V2 norm_topk_prob, a quantized checkpoint, an
unknown field) is refused by name; tests/test_hf_config_audit.py flips every field against transformers. Standard library only: the
launcher (validate/submit) and the trainer (at start) run the same check.
"""
from __future__ import annotations

import json
import math
from typing import Optional

from primus_contract.flops import is_moe_layer
from primus_contract.hf_files import HFConfigError, read_config, shards  # noqa: F401 (this module's API)

FAMILY = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3", "deepseek_v2": "deepseek"}
MOE_TYPES = ("qwen3_moe", "deepseek_v2")
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")  # the spellings of the routed-expert count
# config.json fields this module knows: those it maps or refuses below, and those that do not change the forward
# pass the trainer computes (bookkeeping, generation, inference caches, the auxiliary balancing losses of
# pre-training: LoRA keeps the router frozen and adds no aux loss). Any other field is refused by name.
KNOWN_FIELDS = frozenset((
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "auto_map",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout",
    "max_position_embeddings", "pretraining_tp", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha",
    "seq_aux", "ep_size", "output_attentions", "output_hidden_states", "return_dict", "is_encoder_decoder",
    "tie_encoder_decoder", "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "max_window_layers",
    "num_key_value_heads", "n_group", "topk_group", "head_dim", "rope_theta", "rope_scaling", "rope_parameters",
    "layer_types", "sliding_window", "use_sliding_window", "attention_bias", "mlp_bias", "hidden_act",
    "num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
    "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers",
    "norm_topk_prob", "routed_scaling_factor", "topk_method", "scoring_func", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim", "num_hidden_layers", "hidden_size",
    "intermediate_size", "num_attention_heads", "vocab_size", "rms_norm_eps", "tie_word_embeddings",
    "quantization_config", "attn_logit_softcapping", "final_logit_softcapping", "embedding_multiplier",
))
_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192.0}
_YARN = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def _refuse(hf: dict, key: str, why: str):
    raise HFConfigError(f"config.json {key}", f"config.json `{key}: {json.dumps(hf.get(key))}` ({hf['model_type']}) "
                                              f"is not supported: {why}")


def rope(hf: dict) -> tuple[float, dict | None]:
    """(RoPE base, scaling dict or None) as transformers 5 reads config.json: a legacy `rope_scaling` replaces
    `rope_parameters`; the base is that dict's own rope_theta, else the top-level one, else 10000; llama3 and yarn
    take original_max_position_embeddings from max_position_embeddings when they do not give it."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    nums = {k: float(v) for k, v in params.items() if k not in ("rope_type", "type", "rope_theta") and v is not None}
    if kind in ("llama3", "yarn") and "original_max_position_embeddings" not in nums and "max_position_embeddings" in hf:
        nums["original_max_position_embeddings"] = float(hf["max_position_embeddings"])
    return theta, {"type": kind, **nums}


def _need(hf: dict, key: str):
    """A field model_fields cannot do without (HFConfigError naming it when config.json lacks it)."""
    if hf.get(key) is None:
        raise HFConfigError(f"config.json {key}", f"config.json has no `{key}` ({hf['model_type']}), which the "
                                                  "model's shape needs")
    return hf[key]


def _check_unsupported(hf: dict) -> None:
    mt = hf["model_type"]
    unknown = sorted(k for k in hf if k not in KNOWN_FIELDS)
    if unknown:
        _refuse(hf, unknown[0], "a field primus-slurm does not know, so it cannot tell whether it changes the model")
    if hf.get("quantization_config"):
        _refuse(hf, "quantization_config", "import a BF16/FP32 checkpoint (FP8 weights are made by trainer.precision)")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            _refuse(hf, key, "the trainer's linears have no biases")
    if hf.get("hidden_act", "silu") != "silu":
        _refuse(hf, "hidden_act", "the trainer's MLP is SwiGLU (silu)")
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in hf.get("layer_types") or []):
        _refuse(hf, "use_sliding_window" if hf.get("use_sliding_window") else "layer_types",
                "sliding-window attention is not implemented; every layer attends to its whole document")
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "embedding_multiplier"):
        if hf.get(key) is not None:
            _refuse(hf, key, "not implemented by the trainer")
    if float(hf.get("attention_dropout") or 0.0) != 0.0:
        _refuse(hf, "attention_dropout", "the trainer's attention has no dropout (trainer.lora.dropout is the "
                                         "adapters'), so fine-tuning would differ from the checkpoint's own")
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if float(partial) != 1.0:
        _refuse({**hf, "partial_rotary_factor": partial}, "partial_rotary_factor",
                "partial rotary embeddings are not implemented (every head dimension is rotated)")
    if mt == "deepseek_v2":
        if not math.isclose(float(hf.get("rms_norm_eps", 1e-6)), 1e-6):  # transformers builds them with 1e-6
            _refuse(hf, "rms_norm_eps", "DeepSeek-V2's q/kv latent norms use 1e-6 whatever config.json says, "
                                        "megatron-core uses norm_epsilon for every norm")
        if hf.get("topk_method", "greedy") != "greedy":
            _refuse(hf, "topk_method", "only greedy top-k routing is implemented (megatron-core's group-limited "
                                       "routing scores a group by the sum of its best experts, DeepSeek-V2 by the max)")
        if hf.get("scoring_func", "softmax") != "softmax":
            _refuse(hf, "scoring_func", "DeepSeek-V2 routing is a softmax over the experts")
        if hf.get("norm_topk_prob"):
            _refuse(hf, "norm_topk_prob", "transformers' DeepSeek-V2 ignores it (top-k weights times "
                                          "routed_scaling_factor, never renormalised), DeepSeek's own code renormalises "
                                          "and then skips routed_scaling_factor; no released DeepSeek-V2 sets it")
        if hf.get("num_key_value_heads") not in (None, hf.get("num_attention_heads")):
            _refuse(hf, "num_key_value_heads", "multi-latent attention has no key/value groups: it must equal "
                                               "num_attention_heads (transformers' DeepSeek-V2 fails otherwise)")
        for key, why in (("q_lora_rank", "null for DeepSeek-V2-Lite; transformers reads a missing one as 1536"),
                         ("n_shared_experts", "transformers reads a missing one as 2, DeepSeek's own code as none")):
            if key not in hf:
                raise HFConfigError(f"config.json {key}", f"config.json has no `{key}` (deepseek_v2): give it ({why})")
        if not hf["n_shared_experts"]:
            _refuse(hf, "n_shared_experts", "transformers' DeepSeek-V2 keeps zero-width shared-expert tensors "
                                            "that the trainer's model has no parameter for")
    if mt in MOE_TYPES:
        moe_pattern(hf)  # refuses a layout of MoE and dense layers the trainer cannot build
    counts = {k: hf[k] for k in EXPERT_COUNTS if hf.get(k) is not None}
    if mt in MOE_TYPES and len(set(counts.values())) > 1:
        _refuse(hf, next(iter(counts)), f"the expert counts {json.dumps(counts)} disagree (transformers reads one)")
    if mt in ("qwen3", "qwen3_moe") and "head_dim" not in hf:
        _refuse(hf, "head_dim", "Qwen3 config.json must give head_dim")


def _rope_fields(hf: dict, mla: bool) -> dict:
    theta, scaling = rope(hf)
    if scaling is not None:
        kind = scaling["type"]
        required = {"llama3": ("factor", "low_freq_factor", "high_freq_factor"), "yarn": ("factor",)}.get(kind, ())
        if [k for k in required if k not in scaling]:  # (transformers refuses them too)
            _refuse({**hf, "rope_scaling": scaling}, "rope_scaling",
                    f"{kind} scaling needs {', '.join(k for k in required if k not in scaling)}")
        problem = rope_scaling_problem(scaling, mla)
        if problem:
            _refuse({**hf, "rope_scaling": scaling}, "rope_scaling", problem)
        if kind == "yarn":
            for key, ok in (("truncate", 1.0), ("attention_factor", None)):
                if key in scaling and scaling[key] != ok:
                    _refuse({**hf, "rope_scaling": scaling}, "rope_scaling",
                            f"yarn with {key} {scaling[key]} is not implemented by megatron-core")
    return {"rotary_base": theta, "rope_scaling": scaling}


def rope_scaling_problem(scaling, mla: bool) -> Optional[str]:
    """Why the trainer cannot build this RoPE scaling (None: it can; trainer/model/arch.py rope_kwargs): llama3 with
    megatron-core's 1 / 4 / 8192 on standard attention, yarn with original_max_position_embeddings on MLA."""
    if not scaling:
        return None
    if not isinstance(scaling, dict):
        return f"{scaling!r:.40} is not a mapping of RoPE scaling fields"
    for key in ("factor", *_LLAMA3, *_YARN):  # (audit, 2026-12-07: factor 'abc' passed; low_freq_factor 'x' crashed)
        value, zero_ok = scaling.get(key), key.startswith("mscale")  # (mscale 0: none, as in transformers)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok)):
            return f"{key} {value!r:.40} is not a {'non-negative' if zero_ok else 'positive'} number"
    kind = scaling.get("type") or scaling.get("rope_type")
    if kind == "llama3" and not mla:
        off = [k for k, v in _LLAMA3.items() if not math.isclose(float(scaling.get(k, v)), v)]
        return f"llama3 scaling with {off[0]} {scaling[off[0]]} (megatron-core implements 1 / 4 / 8192)" if off else None
    if kind == "yarn" and mla:
        if scaling.get("mscale_all_dim") and not scaling.get("mscale"):  # (audit, 2026-12-06: logits differed)
            return ("yarn with mscale_all_dim but no mscale: transformers then scales cos/sin by the factor alone "
                    "and the softmax by mscale_all_dim; megatron-core derives both from mscale and mscale_all_dim")
        return (None if scaling.get("original_max_position_embeddings") is not None
                else "yarn scaling needs original_max_position_embeddings")
    return (f"{kind or 'an untyped'} scaling: implemented are llama3 (Llama) and yarn (DeepSeek multi-latent "
            "attention)")


def moe_pattern(hf: dict) -> tuple[int, int]:
    """(moe_first_k_dense, moe_layer_freq) that build the MoE layers of this config.json as transformers does:
    DeepSeek-V2 every layer from first_k_dense_replace on; Qwen3-MoE (i + 1) % decoder_sparse_step == 0 and i not in
    mlp_only_layers. The trainer builds the layouts of flops.is_moe_layer (the first k dense, then every n-th layer
    from the first MoE one); others, and a model with no MoE layer, are refused."""
    layers, mt = int(_need(hf, "num_hidden_layers")), hf.get("model_type")
    if mt == "deepseek_v2":
        if int(hf.get("moe_layer_freq") or 1) != 1:
            _refuse(hf, "moe_layer_freq", "transformers' DeepSeek-V2 ignores it (every layer from "
                                          "first_k_dense_replace on is MoE), so its weights could follow either reading")
        first = int(hf.get("first_k_dense_replace") or 0)
        if first >= layers:
            _refuse(hf, "first_k_dense_replace", f"it leaves no MoE layer of {layers}")
        return first, 1
    step, dense = int(hf.get("decoder_sparse_step") or 1), set(hf.get("mlp_only_layers") or ())
    field = "mlp_only_layers" if dense else "decoder_sparse_step"
    moe = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    if not moe:
        _refuse(hf, field, "it leaves no MoE layer")
    first = moe[0]
    for freq in ([moe[1] - first] if len(moe) > 1 else range(1, layers + 1)):  # (one MoE layer: any freq that fits)
        m = {"num_moe_experts": 1, "moe_first_k_dense": first, "moe_layer_freq": freq}
        if [i for i in range(layers) if is_moe_layer(m, i)] == moe:
            return first, freq
    _refuse(hf, field, "the trainer builds the first moe_first_k_dense layers dense, then every moe_layer_freq-th "
                       f"layer MoE; config.json makes layers {moe} MoE")


def model_fields(hf: dict) -> dict:
    """The recipe's trainer.model fields that this config.json implies (HFConfigError if unsupported)."""
    mt = hf.get("model_type")
    if mt not in FAMILY:
        raise HFConfigError("config.json model_type", f"config.json model_type {mt!r} is not supported: "
                                                      f"one of {', '.join(sorted(FAMILY))}")
    _check_unsupported(hf)
    mla = mt == "deepseek_v2"
    heads = int(_need(hf, "num_attention_heads"))
    out = {"family": FAMILY[mt], "num_layers": int(_need(hf, "num_hidden_layers")),
           "hidden_size": int(_need(hf, "hidden_size")), "ffn_hidden_size": int(_need(hf, "intermediate_size")),
           "num_attention_heads": heads, "vocab_size": int(_need(hf, "vocab_size")), "norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
           "untie_embeddings": not bool(hf.get("tie_word_embeddings", False)),
           "multi_latent_attention": mla, **_rope_fields(hf, mla)}
    if mla:
        out.update(q_lora_rank=hf.get("q_lora_rank"), kv_lora_rank=int(_need(hf, "kv_lora_rank")),
                   qk_head_dim=int(_need(hf, "qk_nope_head_dim")),
                   qk_pos_emb_head_dim=int(_need(hf, "qk_rope_head_dim")), v_head_dim=int(_need(hf, "v_head_dim")))
    else:
        out.update(num_query_groups=int(hf.get("num_key_value_heads") or heads),
                   kv_channels=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
                   qk_layernorm=mt in ("qwen3", "qwen3_moe"))
    if mt in MOE_TYPES:
        name = next((k for k in EXPERT_COUNTS if k in hf), "num_experts")
        ffn = int(_need(hf, "moe_intermediate_size"))
        # DeepSeek's fields only: transformers' Qwen3-MoE reads neither (audit, 2026-12-06: they were applied)
        deepseek = mt == "deepseek_v2"
        shared = int(hf.get("n_shared_experts") or 0) * ffn if deepseek else 0
        out.update(num_moe_experts=int(_need(hf, name)), moe_router_topk=int(_need(hf, "num_experts_per_tok")),
                   moe_ffn_hidden_size=ffn,
                   moe_shared_expert_intermediate_size=shared or None,
                   **dict(zip(("moe_first_k_dense", "moe_layer_freq"), moe_pattern(hf))),
                   moe_norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                   moe_router_topk_scaling_factor=float((deepseek and hf.get("routed_scaling_factor")) or 1.0))
    else:
        out.update(num_moe_experts=None)
    return out


def to_hf_config(m: dict) -> dict:
    """The config.json of a checkpoint with the recipe model `m` (the inverse of model_fields), for writing random
    or exported checkpoints: model_fields(to_hf_config(m)) has no mismatch with m."""
    mla, moe = bool(m.get("multi_latent_attention")), bool(m.get("num_moe_experts"))
    model_type = ("deepseek_v2" if m.get("family") == "deepseek" else
                  ("qwen3_moe" if moe else "qwen3") if m.get("family") == "qwen3" else "llama")
    if model_type not in ("deepseek_v2", "qwen3_moe") and moe:
        raise HFConfigError("trainer.model.family", f"no Hugging Face model type has {m.get('family')} with experts")
    hf = {"model_type": model_type, "num_hidden_layers": int(m["num_layers"]), "hidden_size": int(m["hidden_size"]),
          "intermediate_size": int(m["ffn_hidden_size"]), "num_attention_heads": int(m["num_attention_heads"]),
          "vocab_size": int(m["vocab_size"]), "rms_norm_eps": float(m["norm_epsilon"]),
          "tie_word_embeddings": not bool(m["untie_embeddings"]), "hidden_act": "silu", "attention_bias": False,
          "max_position_embeddings": int(m.get("max_position_embeddings") or 4096),
          "rope_theta": float(m["rotary_base"])}
    scaling = _effective(m, "rope_scaling")
    if scaling:
        hf["rope_scaling"] = {("rope_type" if k == "type" else k): v for k, v in scaling.items()}
    if mla:
        hf.update(q_lora_rank=m.get("q_lora_rank"), kv_lora_rank=int(m["kv_lora_rank"]),
                  qk_nope_head_dim=int(m["qk_head_dim"]), qk_rope_head_dim=int(m["qk_pos_emb_head_dim"]),
                  v_head_dim=int(m["v_head_dim"]), num_key_value_heads=int(m["num_attention_heads"]))
    else:
        hf.update(num_key_value_heads=_effective(m, "num_query_groups"), head_dim=_effective(m, "kv_channels"))
    if moe:
        shared = m.get("moe_shared_expert_intermediate_size")
        hf.update(num_experts_per_tok=int(m["moe_router_topk"]), moe_intermediate_size=int(m["moe_ffn_hidden_size"]),
                  norm_topk_prob=_effective(m, "moe_norm_topk_prob"))
        if model_type == "qwen3_moe":  # its MoE layers: (i + 1) % decoder_sparse_step == 0, not in mlp_only_layers
            dense = [i for i in range(int(m["num_layers"])) if not is_moe_layer(m, i)]
            hf.update(num_experts=int(m["num_moe_experts"]), decoder_sparse_step=1, mlp_only_layers=dense)
        else:  # DeepSeek-V2 (transformers): every layer from first_k_dense_replace on is MoE
            if int(m.get("moe_layer_freq") or 1) != 1:
                raise HFConfigError("trainer.model.moe_layer_freq", "transformers' DeepSeek-V2 has no MoE layer "
                                    "frequency: every layer after the first moe_first_k_dense is MoE")
            hf.update(n_routed_experts=int(m["num_moe_experts"]), topk_method="greedy",
                      n_shared_experts=int(shared) // int(m["moe_ffn_hidden_size"]) if shared else 0,
                      first_k_dense_replace=int(m.get("moe_first_k_dense") or 0),
                      routed_scaling_factor=_effective(m, "moe_router_topk_scaling_factor"))
    return hf


def norm_topk_prob(m: dict) -> bool:
    """Whether the run renormalises the top-k routing weights: the recipe's moe_norm_topk_prob, null the family's
    (Qwen3 does, DeepSeek-V2 does not; trainer.model.arch.moe_kwargs)."""
    v = m.get("moe_norm_topk_prob")
    return m.get("family") != "deepseek" if v is None else bool(v)


def _effective(m: dict, key: str):
    """A recipe model value as the trainer uses it (nulls resolved the way trainer.model.build does)."""
    v = m.get(key)
    if key == "num_query_groups":
        return int(v or m["num_attention_heads"])
    if key == "kv_channels":
        return int(v or int(m["hidden_size"]) // int(m["num_attention_heads"]))
    if key == "moe_norm_topk_prob":
        return norm_topk_prob(m)
    if key == "moe_router_topk_scaling_factor" and v is None:
        return 1.0
    if key == "rope_scaling" and v:  # (a value that is no number stays as written: the comparison names it)
        return {("type" if k == "rope_type" else k): (float(x) if isinstance(x, (int, float)) else x)
                for k, x in v.items()}
    if key == "rope_scaling":
        return None
    return v


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _moe_layers(m: dict) -> list[bool]:
    return [is_moe_layer(m, i) for i in range(int(m.get("num_layers") or 0))]


def mismatches(recipe_model: dict, fields: dict) -> list[tuple[str, object, object]]:
    """(field, recipe value, config.json value) for each model field the two disagree on (moe_first_k_dense and
    moe_layer_freq agree when they make the same layers MoE)."""
    same_layers = _moe_layers(recipe_model) == _moe_layers(fields)
    return [(k, _effective(recipe_model, k), _effective(fields, k)) for k in fields
            if not _same(_effective(recipe_model, k), _effective(fields, k))
            and not (same_layers and k in ("moe_first_k_dense", "moe_layer_freq"))]


def check_pretrained(recipe_model: dict, path) -> dict:
    """Refuse (HFConfigError) a checkpoint whose config.json disagrees with the recipe or is unsupported;
    returns the config.json fields."""
    fields = model_fields(read_config(path))
    bad = mismatches(recipe_model, fields)
    if bad:
        key, mine, theirs = bad[0]
        more = f" (and {len(bad) - 1} more: {', '.join(k for k, _, _ in bad[1:])})" if len(bad) > 1 else ""
        raise HFConfigError(f"trainer.model.{key}", f"`trainer.model.{key}` is {json.dumps(mine)} but the checkpoint's "
                                                    f"config.json says {json.dumps(theirs)}{more}: {path}")
    return fields


def describe(path) -> str:
    """What will be loaded: family, layers, experts, shards, size."""
    hf = read_config(path)
    f = model_fields(hf)
    files, size = shards(path)
    experts = (f" | {f['num_moe_experts']} experts top-{f['moe_router_topk']}"
               + (f" + shared {f['moe_shared_expert_intermediate_size']}" if f["moe_shared_expert_intermediate_size"]
                  else "") if f["num_moe_experts"] else "")
    mla = " | MLA" + (f" q_lora {f['q_lora_rank']}" if f.get("q_lora_rank") else "") if f["multi_latent_attention"] else ""
    return (f"{hf['model_type']} | {f['num_layers']} layers | hidden {f['hidden_size']}{mla}{experts} | "
            f"{len(files)} shard{'s' if len(files) != 1 else ''} | "
            + (f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"))
