"""Costs of the speed model's features (speed.py), seconds per unit on one H200 (TE 2.20.2, megatron-core 0.19.2),
and the peak-memory constants. scripts/plan_calibrate.py fits COST by non-negative least squares on relative step
time over the rows in CALIBRATION_ROWS (bench/results file, label) and rewrites the block between the markers;
tests/test_plan_accuracy.py checks the plan against every matched row, calibrating or not. The COST below (refitted
2026-12-06 for loss_elementwise) is the fit with --exclude of 2026-12-02_h200_70b_1gpu/8b_plan_variations.jsonl,
2026-12-03_h200_speed/*, 2026-12-03_h200_fused/* and 2026-12-05_h200_speed/* (the 73 rows of the fit before it).
"""
from __future__ import annotations

WORKSPACE_GIB = 0.1           # cuBLAS / TE workspaces
FP8_WORKSPACE_GIB = 0.1       # FP8 scaling state and cast buffers
ALLOCATOR_MARGIN = 0.01       # the allocator's reserve above its peak (fragmentation), set by the row that ran
                              # nearest the card's edge: 70b-1gpu-block11-normout-swiglu8 (planned 137.9 GiB, ran 4
                              # times at 137.2 allocated on the H200's 140.4, lazy NCCL; 2026-12-06i_h200_speed)
                              # admits at most 1.3 %. The out-of-memory rows the plan matches are refused at any margin
                              # (the nearest, 2026-12-02's block40, needs 156 GiB). It was 2 % with a CUDA context's
                              # worth of headroom on top, set on eager-NCCL rows: that refused block 11, which ran.
                              # tests/test_plan_accuracy.py holds every row that ran to fit, every OOM row not to
# Outside the caching allocator, per process (GiB). What the trainer holds beyond PyTorch's reserve (its CUDA context
# and NCCL's communicators), measured on one H100 at world size 1 by trainer.distributed.nccl_eager_init: eager, 20
# megatron groups' communicators made at init; lazy (the default), none at world size 1
# (bench/results/2026-12-05c_h100_levers/nccl_groups.jsonl).
OUTSIDE_TORCH_GIB = {True: 8.88, False: 0.73}
NCCL_FIRST_COMM_GIB = 0.66    # lazy, world size > 1: the first communicator a process makes (one all-reduce)
NCCL_COMM_GIB = 0.38          # each further one (the same probe; NCCL's default buffers and channels)
# Attention's time with TE's FP8 attention (precision.fp8_dot_product_attention) over its BF16 time: the 8B FP8
# one-document shape on an H200 (2026-12-06c_h200_speed/levers-fp8.jsonl, medians of 3) ran 421.3 ms a step with it
# against 442.0 ms without, 20.7 ms of the 90.0 ms this model plans for attention there. Not a fitted cost: one shape.
FP8_ATTENTION_TIME = 0.77

# megatron's FP8 SwiGLU store (precision.fp8_swiglu_input), seconds an element of fc1's output on the H200: its cast
# after the activation, u.to(float8_e4m3fn), each forward (vectorized_elementwise_kernel: 105.5 ms / 186 calls), and
# the copy back to 16 bits before the backward (unrolled_elementwise_kernel: 274.4 ms / 160 calls, 0.83 TB/s), both
# over 8,192 x 57,344 elements (bench/results/2026-12-06i_h200_speed/profile-70b-1gpu-block13-normout-swiglu8-prof.txt).
# Kernel times read off one profile, not fitted. fused_swiglu's forward kernel writes the copy itself (since
# 2026-12-07, nineteenth session), and so do the store's own kernels (precision.fp8_swiglu_kernels,
# trainer/model/swiglu_fp8.py): both planned at nothing. On an H100
# (bench/results/2026-12-07_h100_speed) they took 0.80 ms forward and 0.69 ms backward a 70B layer, about what the
# H200 profile gives megatron's SwiGLU without the store (~0.34 + ~1.09 ms) on a card with 30 % less bandwidth
FP8_SWIGLU_CAST_S = 1.2073e-12
FP8_SWIGLU_UNCAST_S = 3.6503e-12

# Costs measured apart and held by the fit (scripts/plan_calibrate.py): each from a pair of rows that differ in that
# feature alone. dropout_pre_elementwise, seconds an adapted input element (tokens x the dropped linears' inputs, each
# forward): block-40 recompute of the 70B on one H200 with LoRA dropout 0.1 on qkv/proj (2,566 tokens/s,
# 70b-1gpu-block40-drs) and without (2,630, 70b-1gpu-block40-nodrop), 2026-12-06i_h200_speed: 2.4 % of the step,
# 77.6 ms over 1.61e10 elements. The 20-layer cut on an H100 repeated the share (2.3 %, 2026-12-07e_h100_speed).
# Fitted, the term had been 2.2e-11 (4.6x): every 70B row on the H200 but one has the dropout, so the fit had put
# whatever else the 70B's step costs into it (planned 11 % of that step).
MEASURED_COST = {'dropout_pre_elementwise': 4.8189e-12}

# --- fitted by scripts/plan_calibrate.py ---
COST = {
    'gemm_bf16': 1.4872e-15,
    'gemm_fp8': 9.1184e-16,
    'gemm_fp4_emulated': 2.3478e-15,
    'expert_gemm_bf16': 8.2066e-15,
    'expert_gemm_fp8': 4.0632e-14,
    'expert_gemm_fp4_emulated': 0.0000e+00,
    'attention': 1.7955e-15,
    'adapter': 2.3600e-12,
    'elementwise_bf16': 0.0000e+00,
    'elementwise_fp8': 0.0000e+00,
    'elementwise_fp4_emulated': 0.0000e+00,
    'adapter_inputs_elementwise': 2.4691e-11,
    'dropout_pre_elementwise': 4.8189e-12,
    'dropout_post_elementwise': 5.3562e-11,
    'current_scaling_elementwise': 1.6378e-12,
    'loss_elementwise': 3.0082e-13,
    'layer_calls': 6.3689e-05,
    'expert_calls_bf16': 1.9645e-04,
    'expert_calls_fp8': 1.9173e-04,
    'expert_calls_fp4_emulated': 0.0000e+00,
    'tp_bytes': 1.2953e-12,
}
CALIBRATION_ROWS: tuple = (
    ('2026-11-30_h200_llama3_8b_fp4emu.jsonl', '8b-fp4emu-single'),
    ('2026-11-30_h200_llama3_8b_lora.jsonl', '8b-bf16-packed'),
    ('2026-11-30_h200_llama3_8b_lora.jsonl', '8b-bf16-single'),
    ('2026-11-30_h200_llama3_8b_lora.jsonl', '8b-fp8-packed'),
    ('2026-11-30_h200_llama3_8b_lora.jsonl', '8b-fp8-single'),
    ('2026-11-30_h200_llama3_8b_lora_recompute.jsonl', '8b-bf16-packed-recompute8'),
    ('2026-11-30_h200_llama3_8b_lora_recompute.jsonl', '8b-fp8-packed-recompute8'),
    ('2026-11-30_h200_llama3_8b_mem_v2.jsonl', '8b-bf16-packed-keep-inputs'),
    ('2026-11-30_h200_llama3_8b_mem_v2.jsonl', '8b-bf16-packed'),
    ('2026-11-30_h200_llama3_8b_mem_v2.jsonl', '8b-fp8-packed'),
    ('2026-11-30_h200_llama3_8b_mem_v2.jsonl', '8b-fp8-packed-fp8param'),
    ('2026-11-30_h200_llama3_8b_mem_v2.jsonl', '8b-fp8-packed-adapter_inputs-false'),
    ('2026-11-30_h200_llama3_8b_mem_v2.jsonl', '8b-fp8-packed-adapter_inputs-true'),
    ('2026-11-30_h200_smoke_2layer.jsonl', 'smoke-bf16'),
    ('2026-11-30_h200_smoke_2layer.jsonl', 'smoke-fp8'),
    ('2026-11-30_h200_smoke_2layer.jsonl', 'smoke-bf16-single'),
    ('2026-11-30_h200x2_llama2_70b_tp2_fast_v2.jsonl', '70b-tp2-fp8-fp8param-norecompute'),
    ('2026-11-30_h200x2_llama2_70b_tp2_first.jsonl', '70b-tp2-bf16-packed'),
    ('2026-11-30_h200x2_llama2_70b_tp2_fp8.jsonl', '70b-tp2-fp8-packed'),
    ('2026-11-30_h200x2_moe_proxies.jsonl', 'qwen3_235b_a22b_proxy'),
    ('2026-11-30_s3_h200_memory/70bfast.jsonl', '70b-tp2-fp8-fp8param-norecompute'),
    ('2026-11-30_s3_h200_memory/70bfast.jsonl', '70b-tp2-fp8-fp8param-norecompute-gbs4'),
    ('2026-11-30_s3_h200_memory/8b-te-ce.jsonl', '8b-bf16-packed-no-chunked-loss'),
    ('2026-11-30_s3_h200_memory/8bmem.jsonl', '8b-bf16-packed-defaults'),
    ('2026-11-30_s3_h200_memory/8bmem.jsonl', '8b-bf16-packed-no-chunked-loss'),
    ('2026-11-30_s3_h200_memory/8bmem.jsonl', '8b-bf16-packed-adapter-inputs-norm'),
    ('2026-11-30_s3_h200_memory/8bmem.jsonl', '8b-bf16-packed-adapter-inputs-fc2'),
    ('2026-11-30_s3_h200_memory/8bmem.jsonl', '8b-bf16-packed-adapter-inputs-all'),
    ('2026-11-30_s3_h200_memory/8bmem.jsonl', '8b-fp8-packed-defaults'),
    ('2026-11-30_s3_h200_memory/8bmem.jsonl', '8b-fp8-packed-fp8param-tensorwise'),
    ('2026-11-30_s3_h200_profile/profile.jsonl', '8b-bf16-keep'),
    ('2026-11-30_s3_h200_profile/profile.jsonl', '8b-bf16-adapter-inputs-fc2'),
    ('2026-11-30_s3_h200_profile/profile.jsonl', '8b-bf16-adapter-inputs-norm'),
    ('2026-11-30_s3_h200_profile/profile.jsonl', '8b-bf16-adapter-inputs-all'),
    ('2026-11-30_s3_h200_profile/profile.jsonl', '8b-fp8-keep'),
    ('2026-11-30_s3_h200_profile/profile.jsonl', '8b-fp8-adapter-inputs'),
    ('2026-11-30_s4_h200x2/70b-final.jsonl', '70b-keep'),
    ('2026-11-30_s4_h200x2/70b-final.jsonl', '70b-ai-all'),
    ('2026-11-30_s4_h200x2/70b-final.jsonl', '70b-bf16-fullrecompute'),
    ('2026-11-30_s4_h200x2/70b-profile-and-8b.jsonl', '70b-profile'),
    ('2026-11-30_s4_h200x2/70b-profile-and-8b.jsonl', '8b-bf16-defaults-jobenv'),
    ('2026-11-30_s4_h200x2/70bub.jsonl', '70b-fp8param-norecompute'),
    ('2026-11-30_s4_h200x2/70bub.jsonl', '70b-fp8param-norecompute-ub'),
    ('2026-11-30_s4_h200x2/8b-env-ab.jsonl', '8b-noenv'),
    ('2026-11-30_s4_h200x2/8b-env-ab.jsonl', '8b-jobenv'),
    ('2026-11-30_s4_h200x2/8b-env-ab.jsonl', '8b-jobenv-smmargin0'),
    ('2026-11-30_s4_h200x2/8b-env-ab.jsonl', '8b-jobenv-maxconn32'),
    ('2026-11-30_s4_h200x2/8b-env-ab.jsonl', '8b-jobenv-noexpandable'),
    ('2026-11-30_s4_h200x2/smoke.jsonl', 'ub-smoke-2layer'),
    ('2026-11-30_s5_h200x2/70b-delayed-fp8param-keep.jsonl', '70b-delayed-fp8param-keep'),
    ('2026-11-30_s5_h200x2/70b-delayed-nccl-ub-adapter-inputs.jsonl', '70b-delayed-keep'),
    ('2026-11-30_s5_h200x2/70b-delayed-nccl-ub-adapter-inputs.jsonl', '70b-delayed-keep-nccl-min-nchannels-32'),
    ('2026-11-30_s5_h200x2/70b-delayed-nccl-ub-adapter-inputs.jsonl', '70b-delayed-keep-nccl-proto-simple'),
    ('2026-11-30_s5_h200x2/70b-delayed-nccl-ub-adapter-inputs.jsonl', '70b-delayed-adapter-inputs'),
    ('2026-11-30_s5_h200x2/70b-delayed-nccl-ub-adapter-inputs.jsonl', '70b-delayed-keep-ub'),
    ('2026-11-30_s5_h200x2/70b-gbs8-and-recompute-block40.jsonl', '70b-keep-gbs8'),
    ('2026-11-30_s5_h200x2/70bprofile.jsonl', '70b-keep-profile'),
    ('2026-11-30_s6_h200x2/70bfast.jsonl', '70b-tp2-delayed-keep'),
    ('2026-11-30_s6_h200x2/70bfast.jsonl', '70b-tp2-keep'),
    ('2026-11-30_s6_h200x2/70bprofile.jsonl', '70b-keep-profile'),
    ('2026-11-30_s6_h200x2/lora-dropout-tp2.jsonl', '8b-tp2-sp-fp8-fullrecompute-lora-dropout0.1-post'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'qwen3_30b_a3b_proxy-bf16'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'qwen3_30b_a3b_proxy-fp8'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'qwen3_30b_a3b_proxy-fp8param'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'qwen3_30b_a3b_proxy-delayed-fp8param'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'deepseek_v2_lite_proxy-bf16'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'deepseek_v2_lite_proxy-fp8'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'deepseek_v2_lite_proxy-fp8param'),
    ('2026-11-30_s6_h200x2/moe-fp8.jsonl', 'deepseek_v2_lite_proxy-delayed-fp8param'),
    ('2026-12-02_h200_70b_1gpu/70b1.jsonl', '70b-1gpu-full'),
    ('2026-12-02_h200_70b_1gpu/70b1.jsonl', '70b-1gpu-block52'),
    ('2026-12-02_h200_70b_1gpu/70b1.jsonl', '70b-1gpu-block60'),
    ('2026-12-02_h200_70b_1gpu/8b_plan_variations.jsonl', '8b-plan-seq4096'),
    ('2026-12-02_h200_70b_1gpu/8b_plan_variations.jsonl', '8b-plan-seq16384'),
    ('2026-12-02_h200_70b_1gpu/8b_plan_variations.jsonl', '8b-plan-mbs2'),
    ('2026-12-02_h200_70b_1gpu/8b_plan_variations.jsonl', '8b-plan-rank64'),
    ('2026-12-02_h200_70b_1gpu/8b_plan_variations.jsonl', '8b-plan-fullrecompute'),
    ('2026-12-02_h200_70b_1gpu/8b_plan_variations.jsonl', '8b-plan-fp8param'),
    ('2026-12-03_h200_fused/70b1-fp8swiglu.jsonl', '70b1-block44-fp8swiglu'),
    ('2026-12-03_h200_fused/70b1-fused.jsonl', '70b1-block60-fused-true'),
    ('2026-12-03_h200_fused/70b1-fused.jsonl', '70b1-block60-fused-false'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-bf16-packed-fused-false'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-fp8-packed-fused-false'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-bf16-packed-fused-true'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-fp8-packed-fused-true'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-fp8-single-fused-norm-folded'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-fp8-single-fused-profile'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-fp8-single-fused-false-rerun'),
    ('2026-12-03_h200_fused/fused-packed.jsonl', '8b-fp8-single-fused-true-rerun'),
    ('2026-12-03_h200_fused/fused-rerun.jsonl', '8b-bf16-single-fused-false-rerun'),
    ('2026-12-03_h200_fused/fused-rerun.jsonl', '8b-bf16-single-fused-true-rerun'),
    ('2026-12-03_h200_fused/fused-rerun.jsonl', '8b-bf16-single-fused-false-rerun'),
    ('2026-12-03_h200_fused/fused-rerun.jsonl', '8b-bf16-single-fused-true-rerun'),
    ('2026-12-03_h200_fused/fused.jsonl', '8b-bf16-single-fused-false'),
    ('2026-12-03_h200_fused/fused.jsonl', '8b-fp8-single-fused-false'),
    ('2026-12-03_h200_fused/fused.jsonl', '8b-bf16-single-fused-true'),
    ('2026-12-03_h200_fused/fused.jsonl', '8b-fp8-single-fused-true'),
    ('2026-12-03_h200_speed/speed.jsonl', '8b-bf16-single'),
    ('2026-12-03_h200_speed/speed.jsonl', '8b-fp8-single'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-bf16-default-single (median of 3)'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-bf16-default-packed (median of 3)'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-bf16-swiglu-single (median of 3)'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-bf16-swiglu-packed (median of 3)'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-fp8-default-single (median of 3)'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-fp8-default-packed (median of 3)'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-fp8-swiglu-single (median of 3)'),
    ('2026-12-05_h200_speed/epilogue.jsonl', '8b-fp8-swiglu-packed (median of 3)'),
    ('2026-12-06c_h200_speed/70b1.jsonl', '70b-1gpu-block60'),
    ('2026-12-06c_h200_speed/70b1.jsonl', '70b-1gpu-block46'),
    ('2026-12-06c_h200_speed/anchor-fp8attn.jsonl', '8b-fp8-single-sbhd-fp8attn'),
    ('2026-12-06c_h200_speed/epilogue-70b.jsonl', '70b1-unfused-r0'),
    ('2026-12-06c_h200_speed/epilogue-70b.jsonl', '70b1-fused-r0'),
    ('2026-12-06c_h200_speed/epilogue-70b.jsonl', '70b1-unfused-r1'),
    ('2026-12-06c_h200_speed/epilogue-70b.jsonl', '70b1-fused-r1'),
    ('2026-12-06c_h200_speed/levers-bf16.jsonl', '8b-bf16-thd-single (median of 3)'),
    ('2026-12-06c_h200_speed/levers-bf16.jsonl', '8b-bf16-sbhd-single (median of 3)'),
    ('2026-12-06c_h200_speed/levers-fp8.jsonl', '8b-fp8-thd-single (median of 3)'),
    ('2026-12-06c_h200_speed/levers-fp8.jsonl', '8b-fp8-sbhd-single (median of 3)'),
    ('2026-12-06c_h200_speed/levers-fp8.jsonl', '8b-fp8-sbhd-fp8attn-single (median of 3)'),
    ('2026-12-06c_h200_speed/offload-70b.jsonl', '70b1-block60-r0'),
    ('2026-12-06c_h200_speed/offload-70b.jsonl', '70b1-offload-r0'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block40-drs'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block60-drs'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block36-normout'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block13-normout-swiglu8'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block20-normout-swiglu8'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block40-nodrop'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block11-normout-swiglu8'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block13-normout-swiglu8-rep'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block11-normout-swiglu8-rep'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block13-normout-swiglu8-rep'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block11-normout-swiglu8-rep'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block13-normout-swiglu8-rep'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block11-normout-swiglu8-rep'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block40-normout'),
    ('2026-12-06i_h200_speed/70b1.jsonl', '70b-1gpu-block40-normout-swiglu8'),
)
# --- end of fitted block ---
