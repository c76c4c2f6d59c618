"""TransformerConfig keywords for the architecture families beyond dense Llama: MoE (Qwen3-MoE,
DeepSeek-V2), MLA (DeepSeek), RoPE scaling (llama3, yarn).

    kwargs.update(moe_kwargs(m, use_te, on_gpu)); kwargs.update(rope_kwargs(m)); cls = config_class(m)

MoE: routed experts every layer (or after `moe_first_k_dense` dense layers, or by `moe_layer_freq`),
top-k routing as the HF models do it (norm_topk_prob true, Qwen3's default: softmax over the top-k logits =
renormalised top-k probabilities; false, DeepSeek-V2's: softmax over all experts, top-k kept unnormalised,
times routed_scaling_factor = model.moe_router_topk_scaling_factor), optional shared
experts, no load-balancing loss (the router is frozen under LoRA). Experts are not tensor-parallel
(expert_tensor_parallel_size 1, set in trainer.distributed too); expert parallelism splits them over
the data-parallel ranks. TE runs them as TEGroupedMLP (grouped GEMM), the local spec as SequentialMLP.
The token dispatcher is all-to-all on GPU and all-gather on CPU (all-to-all needs CUDA streams).

MLA (DeepSeek): MLATransformerConfig with the preset's ranks / head dims; the q/kv norms of MLA are
always on (DeepSeek's kv_a_layernorm). RoPE: rope_scaling {type: yarn, ...} maps to MLA's YaRN
parameters, no rope_scaling to plain RoPE.
"""
from __future__ import annotations

from primus_contract.hf_config import rope_scaling_problem

_YARN_KEYS = {"factor": "rotary_scaling_factor", "original_max_position_embeddings": "original_max_position_embeddings",
              "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim"}


def moe_layer_pattern(mcfg):
    """megatron's moe_layer_freq: 1 (every layer), or the 0/1 list of primus_contract.flops.is_moe_layer (the
    first moe_first_k_dense layers dense, then every moe_layer_freq-th layer MoE, as DeepSeek-V2's config.json
    counts them): the layers the planner and the FLOPs count are the layers built."""
    from primus_contract.flops import is_moe_layer

    first_dense, layers = int(mcfg.moe_first_k_dense or 0), int(mcfg.num_layers)
    if first_dense >= layers:
        raise ValueError(f"model.moe_first_k_dense {first_dense} leaves no MoE layer of {layers}")
    pattern = [int(is_moe_layer(mcfg, i)) for i in range(layers)]
    return 1 if all(pattern) else pattern


def moe_kwargs(mcfg, use_te: bool, on_gpu: bool, par=None) -> dict:
    if not mcfg.num_moe_experts:
        return {}
    if par is not None and int(par.tensor) > 1 and not par.sequence_parallel:
        raise ValueError("MoE with parallelism.tensor > 1 needs parallelism.sequence_parallel: true "
                         "(megatron-core refuses MoE training under TP without it)")
    experts, topk = int(mcfg.num_moe_experts), int(mcfg.moe_router_topk or 1)
    norm_topk = mcfg.get("moe_norm_topk_prob")  # null: the family's own (Qwen3 renormalises, DeepSeek-V2 not)
    norm_topk = mcfg.family != "deepseek" if norm_topk is None else bool(norm_topk)
    scale = float(mcfg.get("moe_router_topk_scaling_factor") or 1.0)
    if topk > experts:
        raise ValueError(f"model.moe_router_topk {topk} > num_moe_experts {experts}")
    out = {
        "num_moe_experts": experts,
        "moe_router_topk": topk,
        "moe_ffn_hidden_size": int(mcfg.moe_ffn_hidden_size or mcfg.ffn_hidden_size),
        "moe_shared_expert_intermediate_size": (int(mcfg.moe_shared_expert_intermediate_size)
                                                if mcfg.moe_shared_expert_intermediate_size else None),
        "moe_layer_freq": moe_layer_pattern(mcfg),
        "moe_grouped_gemm": use_te,
        "moe_token_dispatcher_type": "alltoall" if on_gpu else "allgather",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        # (top-1 needs it too: a softmax over one logit has no gradient, megatron refuses it)
        "moe_router_pre_softmax": not norm_topk or topk == 1,
        "moe_router_score_function": "softmax",
        "moe_router_topk_scaling_factor": scale if scale != 1.0 else None,
        "expert_tensor_parallel_size": 1,
    }
    if on_gpu:
        out["moe_router_dtype"] = "fp32"
    return out


def rope_kwargs(mcfg) -> dict:
    """RoPE scaling: llama3 (GPTModel keywords) or yarn (MLATransformerConfig fields)."""
    rs = mcfg.rope_scaling
    mla = bool(mcfg.multi_latent_attention)
    if not rs:  # (MLATransformerConfig defaults to DeepSeek's YaRN factor 40: its softmax scale would keep mscale²)
        return {"rope_type": "rope", "rotary_scaling_factor": 1.0} if mla else {}
    problem = rope_scaling_problem(rs, mla)  # the contract refused it at submit (rules_model.model_rules)
    if problem:
        raise NotImplementedError(f"rope_scaling {dict(rs)}: {problem}")
    return {"rope_type": "yarn", **yarn_kwargs(rs)} if mla else {}  # llama3: applied by GPTModel (gpt_rope_kwargs)


def yarn_kwargs(rs) -> dict:
    """MLA's YaRN fields with Hugging Face's defaults where config.json leaves one out (megatron's own defaults are
    DeepSeek-V3's): beta_fast 32, beta_slow 1; mscale and mscale_all_dim count only when both are given
    (otherwise the cos/sin scale is 0.1 ln(factor) + 1 and the softmax scale is not changed)."""
    out = {dst: float(rs[src]) for src, dst in _YARN_KEYS.items() if rs.get(src) is not None}
    out.setdefault("beta_fast", 32.0)
    out.setdefault("beta_slow", 1.0)
    if not (rs.get("mscale") and rs.get("mscale_all_dim")):
        out.update(mscale=1.0, mscale_all_dim=0.0)
    if "original_max_position_embeddings" not in out:
        raise ValueError("model.rope_scaling yarn needs original_max_position_embeddings")
    return out


def gpt_rope_kwargs(mcfg) -> dict:
    """GPTModel keywords for llama3 RoPE scaling (MLA does its RoPE inside the attention)."""
    rs = mcfg.rope_scaling
    if not rs or mcfg.multi_latent_attention:
        return {}
    rope_kwargs(mcfg)  # validates
    return {"rope_scaling": True, "rope_scaling_factor": float(rs.get("factor", 8))}


def qk_norm(mcfg) -> bool:
    """Whether attention norms its queries/keys: model.qk_layernorm (Qwen3), and always under MLA, whose latent
    norms (kv_a_layernorm, and q_a_layernorm with a q_lora_rank) every DeepSeek checkpoint holds. The layer spec and
    the config read this one rule: a dense MLA model built from a spec that read qk_layernorm alone (false) got no
    kv latent norm while its config said True (2026-12-05)."""
    return bool(mcfg.qk_layernorm) or bool(mcfg.multi_latent_attention)


def mla_kwargs(mcfg) -> dict:
    if not mcfg.multi_latent_attention:
        return {}
    missing = [k for k in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim") if not mcfg[k]]
    if missing:
        raise ValueError(f"multi_latent_attention needs model.{', model.'.join(missing)}")
    rope = rope_kwargs(mcfg)
    # MLA has no key/value groups: TE's attention takes its head count from num_query_groups (seen on the H200,
    # 2026-12-02: a recipe's GQA value reached it and the forward refused). megatron's fused MLA RoPE is YaRN only.
    fused_rope = {} if rope["rope_type"] == "yarn" else {"apply_rope_fusion": False}
    return {"q_lora_rank": int(mcfg.q_lora_rank) if mcfg.q_lora_rank else None,
            "kv_lora_rank": int(mcfg.kv_lora_rank), "qk_head_dim": int(mcfg.qk_head_dim),
            "qk_pos_emb_head_dim": int(mcfg.qk_pos_emb_head_dim), "v_head_dim": int(mcfg.v_head_dim),
            "num_query_groups": int(mcfg.num_attention_heads), **fused_rope,
            "qk_layernorm": qk_norm(mcfg), "rotary_base": float(mcfg.rotary_base), **rope}


def config_class(mcfg):
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    return MLATransformerConfig if mcfg.multi_latent_attention else TransformerConfig
