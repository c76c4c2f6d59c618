"""FP8 GEMM shapes: what Transformer Engine refuses in the first forward, refused at validate/submit instead.

TE's FP8 linears need every GEMM's dims (per tensor-parallel shard) divisible by 16. Seen on the H200 (TE 2.20.2,
2026-12-02): "FP8 execution requires the product of all dimensions except the last to be divisible by 8 and the last
dimension to be divisible by 16", raised by a q_lora_rank of 24. The backward's dgrad quantizes the output gradient
the same way, so output dims are held to 16 too. Only the linears inside the transformer layers run in FP8
(embedding, router and output layer stay BF16), so only their shapes are listed.
"""
from __future__ import annotations

from primus_contract.errors import fail
from primus_contract.rules_data import sample_length

MULTIPLE = 16
TOKEN_MULTIPLE = 8  # the input's leading dims (the tokens of a micro-batch), as TE's message above says
# TE 2.20.2's FP8 attention (cuDNN fused attention) on an H200, 2026-12-06, sbhd causal, forward and backward: head
# dim 128 runs; 32, 64, 96 and 256 raise "No dot product attention backend is available" in the first forward
# (bench/results/2026-12-06c_h200_speed/fp8attn-probe.jsonl)
FP8_ATTENTION_HEAD_DIMS = (128,)


def linear_dims(m: dict, tp: int) -> list:
    """(megatron module name within a layer, out features, in features) per tensor-parallel shard of every linear
    of one model's layers: what FP8 runs, and what LoRA may target (routers excluded: they stay frozen). MoE models
    list the dense MLP too (moe_first_k_dense layers)."""
    h, heads = m["hidden_size"], m["num_attention_heads"]
    dims = []
    if m["multi_latent_attention"]:
        qk = m["qk_head_dim"] + m["qk_pos_emb_head_dim"]
        if m["q_lora_rank"]:
            dims += [("self_attention.linear_q_down_proj", m["q_lora_rank"], h),
                     ("self_attention.linear_q_up_proj", heads * qk // tp, m["q_lora_rank"])]
        else:
            dims.append(("self_attention.linear_q_proj", heads * qk // tp, h))
        dims += [("self_attention.linear_kv_down_proj", m["kv_lora_rank"] + m["qk_pos_emb_head_dim"], h),
                 ("self_attention.linear_kv_up_proj", heads * (m["qk_head_dim"] + m["v_head_dim"]) // tp, m["kv_lora_rank"]),
                 ("self_attention.linear_proj", h, heads * m["v_head_dim"] // tp)]
    else:
        kv = m["kv_channels"] or h // heads
        groups = m["num_query_groups"] or heads
        dims += [("self_attention.linear_qkv", (heads + 2 * groups) * kv // tp, h),
                 ("self_attention.linear_proj", h, heads * kv // tp)]
    ffns = [("mlp.", m["ffn_hidden_size"])]
    if m["num_moe_experts"]:
        ffns.append(("mlp.experts.", m["moe_ffn_hidden_size"] or m["ffn_hidden_size"]))
        if m["moe_shared_expert_intermediate_size"]:
            ffns.append(("mlp.shared_experts.", m["moe_shared_expert_intermediate_size"]))
    for what, ffn in ffns:
        dims += [(f"{what}linear_fc1", 2 * ffn // tp, h), (f"{what}linear_fc2", h, ffn // tp)]
    return dims


def _fp8_attention_heads(m) -> tuple:
    """(what the model's attention head dims are, whether TE's FP8 attention runs them: 128, q, k and v alike)."""
    if m["multi_latent_attention"]:
        qk, v = (m["qk_head_dim"] or 0) + (m["qk_pos_emb_head_dim"] or 0), m["v_head_dim"]
        return (f"multi-latent attention's q/k head dim {qk} and v head dim {v}",
                qk == v and v in FP8_ATTENTION_HEAD_DIMS)
    d = m["kv_channels"] or m["hidden_size"] // m["num_attention_heads"]
    return f"head dim {d} (from trainer.model)", d in FP8_ATTENTION_HEAD_DIMS


def fp8_attention_heads_ok(m) -> bool:
    """TE's FP8 attention has a backend for this model's heads (fp8_dot_product_attention null decides by it)."""
    return _fp8_attention_heads(m)[1]


def fp8_attention_head_rule(m: dict) -> None:
    """fp8_dot_product_attention true only where TE's FP8 attention has a backend: head dim 128, q, k and v alike."""
    dims, ok = _fp8_attention_heads(m)
    if not ok:
        allowed = " or ".join(map(str, FP8_ATTENTION_HEAD_DIMS))
        fail(f"`trainer.precision.fp8_dot_product_attention` needs attention head dim {allowed} (Transformer Engine's "
             f"FP8 attention has no backend for others); this model has {dims}: set fp8_dot_product_attention: false")


def fp8_shape_rules(t: dict) -> None:
    """With fp8 set, every FP8 linear's shard dims are multiples of 16 and a micro-batch's tokens of 8 (TE refuses the
    first forward otherwise), and FP8 attention's head dim is one TE runs."""
    if not t["precision"]["fp8"]:
        return
    if t["precision"]["fp8_dot_product_attention"]:
        fp8_attention_head_rule(t["model"])
    d, mbs = t["data"], t["schedule"]["micro_batch_size"]
    sample = sample_length(d["seq_length"], d["pad_to_multiple_of"])  # every row's length, packed or not
    if (mbs * sample) % TOKEN_MULTIPLE:  # (sequence parallelism gathers them before each FP8 GEMM)
        fail(f"`trainer.precision.fp8` needs the tokens of a micro-batch to be a multiple of {TOKEN_MULTIPLE} (TE's "
             f"FP8 linears); `trainer.data.seq_length` {sample} (after pad_to_multiple_of) x micro_batch_size {mbs} "
             f"is {mbs * sample}: set `trainer.data.pad_to_multiple_of: 16`")
    tp = t["parallelism"]["tensor"]
    for name, out_f, in_f in linear_dims(t["model"], tp):
        bad = [d for d in (out_f, in_f) if d % MULTIPLE]
        if bad:
            shard = f" per tensor-parallel shard (tensor {tp})" if tp > 1 else ""
            fail(f"`trainer.precision.fp8` needs every FP8 GEMM dimension to be a multiple of {MULTIPLE}; {name} is "
                 f"{out_f}×{in_f}{shard} (from trainer.model); change the model widths or set fp8 to null")
