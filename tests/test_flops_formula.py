"""trainer.step.flops against numbers worked out by hand for a small dense model."""
from __future__ import annotations

import pytest

from trainer.step import flops

# h=8, n=2 heads, g=1 group, d=4, f=12, V=10, 2 layers
M = {"num_layers": 2, "hidden_size": 8, "ffn_hidden_size": 12, "num_attention_heads": 2, "num_query_groups": 1,
     "kv_channels": None, "vocab_size": 10, "num_moe_experts": None, "multi_latent_attention": False}
LORA = {"enabled": True, "dim": 2, "target_modules": ["linear_qkv", "linear_fc2"], "exclude_modules": []}


def test_hand_computed_step():
    # base forward per token and layer: qkv 2*8*(2+2)*4=256, proj 2*8*8=128, fc1 2*8*24=384, fc2 2*12*8=192 -> 960
    # two layers 1920 + LM head 2*8*10=160 -> 2080; fwd + input-grad -> 4160 per token
    assert flops.base_linear_fwd_flops_per_token(M) == 2080
    # LoRA r=2: qkv 2*2*(8+16)=96, fc2 2*2*(12+8)=80 per layer -> 352 per token, x3 (fwd, dgrad, wgrad) -> 1056
    assert flops.lora_fwd_flops_per_token(M, LORA) == 352
    # documents 3 and 5 (packed): sum L^2 = 34; attention fwd = layers*2*n*(d+d)*sumsq/2 = 2*2*2*8*34/2 = 1088
    tokens, sumsq = flops.doc_length_stats([0, 3, 8])
    assert (tokens, sumsq) == (8, 34)
    assert flops.attention_fwd_flops(M, sumsq) == 1088
    assert flops.step_flops(M, LORA, tokens, sumsq) == 8 * (4160 + 1056) + 3 * 1088


def test_packing_counts_attention_per_document():
    one_doc = flops.step_flops(M, LORA, 8, flops.doc_length_stats([0, 8])[1])
    two_docs = flops.step_flops(M, LORA, 8, flops.doc_length_stats([0, 4, 8])[1])
    assert one_doc - two_docs == 3 * 2 * 2 * 2 * 8 * (64 - 32) / 2


def test_exclusions_wildcards_and_disabled():
    excl = dict(LORA, target_modules=["linear_*"], exclude_modules=["decoder.layers.1.*"])
    # layer 0 only, all four linears: qkv 96 + proj 2*2*16=64 + fc1 2*2*32=128 + fc2 80
    assert flops.lora_fwd_flops_per_token(M, excl) == 96 + 64 + 128 + 80
    assert flops.lora_fwd_flops_per_token(M, dict(LORA, enabled=False)) == 0


def test_moe_counts_topk_experts_and_router():
    moe = dict(M, num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=6, moe_layer_freq=1,
               moe_first_k_dense=1, moe_shared_expert_intermediate_size=None)
    # layer 0 dense (960); layer 1: attention 384 + router 2*8*4=64 + 2 experts * (2*8*12 + 2*6*8)=2*288
    assert flops.base_linear_fwd_flops_per_token(moe) == 960 + 384 + 64 + 576 + 160


def test_llama3_8b_per_token_matches_6N_style_estimate():
    m = {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32,
         "num_query_groups": 8, "kv_channels": None, "vocab_size": 128256}
    # Llama-3-8B: 8.03e9 params minus the 0.525e9 input embedding (a lookup) -> 7.50e9 -> 2*N forward
    assert flops.base_linear_fwd_flops_per_token(m) == pytest.approx(2 * (8.03e9 - 128256 * 4096), rel=0.005)
