"""Model FLOPs of one LoRA fine-tuning step (the numerator of TFLOP/s/GPU and MFU; the planner's step time).

Counted: matrix multiplications only, 2 FLOPs per multiply-add. Not counted: norms, activations,
softmax, rotary, the embedding lookup, optimizer, and activation recompute (model FLOPs, not
hardware FLOPs: recompute lowers TFLOP/s instead of inflating it).

Per token, with h = hidden, n = heads, g = query groups, d = kv_channels (h/n when null),
f = ffn hidden, V = vocab, F(layer) = forward GEMM FLOPs of the base linears:

    dense layer   F = 2*h*(n+2g)*d  [qkv]  + 2*n*d*h [proj]  + 2*h*2f [fc1, gated SwiGLU]  + 2*f*h [fc2]
    MoE layer     attention as above + 2*h*E [router] + topk*(2*h*2fe + 2*fe*h) [routed experts]
                  + (2*h*2fs + 2*fs*h) [shared expert, when fs is set]
    MLA attention 2*h*ql + 2*ql*n*(dn+dr)   (or 2*h*n*(dn+dr) without q_lora_rank)  [q]
                  + 2*h*(kvl+dr) + 2*kvl*n*(dn+dv)  [kv]  + 2*n*dv*h [proj]
    LM head       2*h*V

Base weights are frozen, so the backward computes only input gradients, which cost the same as the
forward: base linears count 2 x F (forward + input-grad, NO weight-grad). We count the input-grad of
every linear, including the first layer's (a small over-count when the embedding output needs no grad).

Attention core (no weights; backward = dQ, dK, dV, dP: twice the forward), per document of length
L_i in a packed sequence (attention never crosses documents) and causal (L_i^2 / 2 query-key pairs):

    attention fwd = num_layers * 2 * n * (d_qk + d_v) * sum_i L_i^2 / 2,   counted 3x (fwd + bwd)

LoRA adapter on a linear in -> out with rank r: forward 2*r*(in+out) per token; backward input-grad
2*r*(in+out) and weight-grad 2*r*(in+out): counted 3x. A module is adapted when its short name or its
megatron path (decoder.layers.<i>.self_attention.linear_qkv, decoder.layers.<i>.mlp.linear_fc1,
...mlp.experts.linear_fc1, ...mlp.shared_experts.linear_fc1) matches a lora.target_modules pattern
(primus_contract/targets.py) and no lora.exclude_modules pattern. Routed-expert adapters count topk times per token.

    step FLOPs = tokens * (2 * sum_layers F + 2 * 2*h*V + 3 * lora_fwd) + 3 * attention fwd
"""
from __future__ import annotations

from typing import Iterable, Sequence

from primus_contract.targets import targeted


def _get(cfg, key, default=None):
    try:
        value = cfg[key]
    except (KeyError, TypeError):
        return default
    return default if value is None else value


def _dims(m) -> dict:
    h, n = int(m["hidden_size"]), int(m["num_attention_heads"])
    g = int(_get(m, "num_query_groups", n))
    d = int(_get(m, "kv_channels", h // n))
    return {"h": h, "n": n, "g": g, "d": d, "f": int(m["ffn_hidden_size"]), "V": int(m["vocab_size"]),
            "L": int(m["num_layers"])}


def is_moe_layer(m, layer: int) -> bool:
    experts = _get(m, "num_moe_experts", 0)
    if not experts:
        return False
    if layer < int(_get(m, "moe_first_k_dense", 0)):
        return False
    freq = _get(m, "moe_layer_freq", 1)
    if isinstance(freq, (list, tuple)):
        return bool(freq[layer])
    return layer % int(freq) == 0


def attention_linears(m) -> list[tuple[str, int, int]]:
    """[(module name, in, out)] of one layer's attention linears (full, un-sharded sizes)."""
    x = _dims(m)
    h, n = x["h"], x["n"]
    if _get(m, "multi_latent_attention", False):
        dn, dr, dv = int(m["qk_head_dim"]), int(m["qk_pos_emb_head_dim"]), int(m["v_head_dim"])
        kvl, ql = int(m["kv_lora_rank"]), _get(m, "q_lora_rank", None)
        mods = ([("linear_q_down_proj", h, int(ql)), ("linear_q_up_proj", int(ql), n * (dn + dr))] if ql
                else [("linear_q_proj", h, n * (dn + dr))])
        return mods + [("linear_kv_down_proj", h, kvl + dr), ("linear_kv_up_proj", kvl, n * (dn + dv)),
                       ("linear_proj", n * dv, h)]
    return [("linear_qkv", h, (n + 2 * x["g"]) * x["d"]), ("linear_proj", n * x["d"], h)]


def attention_head_dims(m) -> tuple[int, int, int]:
    """(heads, qk head dim, v head dim)."""
    if _get(m, "multi_latent_attention", False):
        return int(m["num_attention_heads"]), int(m["qk_head_dim"]) + int(m["qk_pos_emb_head_dim"]), int(m["v_head_dim"])
    x = _dims(m)
    return x["n"], x["d"], x["d"]


def mlp_linears(m, layer: int) -> list[tuple[str, str, int, int, int]]:
    """[(short name, megatron path suffix, in, out, uses per token)] of one layer's MLP linears."""
    h = _dims(m)["h"]
    if not is_moe_layer(m, layer):
        f = int(m["ffn_hidden_size"])
        return [("linear_fc1", "mlp.linear_fc1", h, 2 * f, 1), ("linear_fc2", "mlp.linear_fc2", f, h, 1)]
    fe = int(_get(m, "moe_ffn_hidden_size", m["ffn_hidden_size"]))
    topk = int(m["moe_router_topk"])
    mods = [("router", "mlp.router", h, int(m["num_moe_experts"]), 1),
            ("linear_fc1", "mlp.experts.linear_fc1", h, 2 * fe, topk),
            ("linear_fc2", "mlp.experts.linear_fc2", fe, h, topk)]
    fs = _get(m, "moe_shared_expert_intermediate_size", 0)
    if fs:
        mods += [("linear_fc1", "mlp.shared_experts.linear_fc1", h, 2 * int(fs), 1),
                 ("linear_fc2", "mlp.shared_experts.linear_fc2", int(fs), h, 1)]
    return mods


def layer_linears(m, layer: int) -> list[tuple[str, str, int, int, int]]:
    attn = [(name, f"self_attention.{name}", i, o, 1) for name, i, o in attention_linears(m)]
    return attn + mlp_linears(m, layer)


def is_adapted(short: str, path: str, targets: Iterable[str], excludes: Iterable[str]) -> bool:
    """LoRA wraps the linear at `path` (its last part `short`); never a MoE router (trainer/model/lora/layers.py)."""
    return short != "router" and targeted((path,), targets, excludes)


def base_linear_fwd_flops_per_token(m) -> float:
    """Forward GEMM FLOPs per token of all base linears including the LM head."""
    total = 0.0
    for layer in range(int(m["num_layers"])):
        total += sum(2.0 * i * o * uses for _, _, i, o, uses in layer_linears(m, layer))
    return total + 2.0 * int(m["hidden_size"]) * int(m["vocab_size"])


def lora_fwd_flops_per_token(m, lora) -> float:
    if lora is None or not _get(lora, "enabled", False):
        return 0.0
    r = int(lora["dim"])
    targets, excludes = _get(lora, "target_modules", ()), _get(lora, "exclude_modules", ())
    total = 0.0
    for layer in range(int(m["num_layers"])):
        for short, suffix, i, o, uses in layer_linears(m, layer):
            if is_adapted(short, f"decoder.layers.{layer}.{suffix}", targets, excludes):
                total += 2.0 * r * (i + o) * uses
    return total


def attention_fwd_flops(m, sum_sq_doc_lengths: float) -> float:
    """Causal, per-document attention-core forward FLOPs for documents with sum L_i^2 given."""
    n, dqk, dv = attention_head_dims(m)
    return int(m["num_layers"]) * 2.0 * n * (dqk + dv) * float(sum_sq_doc_lengths) / 2.0


def doc_length_stats(cu_seqlens: Sequence[int]) -> tuple[int, int]:
    """(tokens, sum of squared document lengths) from cumulative sequence lengths [0, l1, l1+l2, ...]."""
    bounds = [int(x) for x in cu_seqlens]
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    return sum(lengths), sum(L * L for L in lengths)


def step_flops(m, lora, tokens: float, sum_sq_doc_lengths: float) -> float:
    """Model FLOPs of one training step over `tokens` tokens in documents with sum L_i^2 given."""
    per_token = 2.0 * base_linear_fwd_flops_per_token(m) + 3.0 * lora_fwd_flops_per_token(m, lora)
    return float(tokens) * per_token + 3.0 * attention_fwd_flops(m, sum_sq_doc_lengths)
