"""Step time of one LoRA training step per GPU: a sum of work features times calibrated costs.

    step = (1 + pipeline bubble) x sum over features f of  work_f (per GPU, per step) x cost_f

The work comes from the recipe and primus_contract.flops: base-linear GEMM FLOPs by precision (forward + dgrad,
and the forward again for recomputed layers), the BF16 output layer, the attention core, the adapters (below),
elementwise volume per layer (tokens x hidden: norms, casts; by precision, with adapter_inputs' recompute and LoRA
dropout as their own), FP8 tensorwise (current) scaling's amax pass (a read of every FP8 GEMM operand before its
cast, which delayed scaling fuses into the cast), the chunked loss's passes over the logits (below), kernel launches
per layer and micro-batch, per local expert and MoE layer, routed-expert FLOPs, and tensor-parallel bytes over the
link. The costs are calibration.COST (seconds per unit on the H200, refitted by scripts/plan_calibrate.py from
calibration.CALIBRATION_ROWS); on another GPU, FLOP costs scale by its vendor peak ratio, memory-bound costs
(elementwise, the loss's passes, adapters) by its HBM bandwidth and link costs by its link's. FLOPs are split
evenly over TP and PP ranks; 1F1B's bubble is (pp - 1) / micro-batches.

Adapters: A [r, in] and B [out, r] are skinny GEMMs (rank 16-64 against widths of thousands: r FLOPs a byte, far
under the ~200 a BF16 GEMM needs to be compute-bound), so their time follows the activations they stream, tokens x
(in + out) per adapted linear and pass (x and the output in forward; the output's gradient, x and dx in backward),
whatever the rank. That traffic is the feature `adapter`; their FLOPs (2 r (in + out) a token, BF16) are added to
gemm_bf16 at the base GEMMs' rate, which is what a larger rank adds. trainer.lora.epilogue and fused_swiglu scale a
linear's traffic by their pass counts over the default path's, of which the share measured on the H200 shows
(adapter_passes.traffic_ratio, REALIZED; null fused_swiglu planned as it will run).

Chunked loss (trainer.recompute.chunked_loss, trainer/model/chunked_loss.py): besides the output layer's two GEMMs
(gemm_bf16), elementwise passes over each chunk's logits, tokens x vocab / TP on the last stage (split over PP like
the rest). The feature `loss_elementwise` is the bytes they move, LOSS_BYTES_PER_LOGIT by the path that runs
(memory.chunked_loss_path): the torch path casts the bf16 logits to fp32 and runs max, sub_, exp_, sum, div_ and the
cast back (44 bytes a logit); chunked_loss_kernel (an NVIDIA GPU, BF16) reads the bf16 logits twice and writes the
gradient over them once (trainer/model/ce_kernel.py: 6 bytes). One cost a byte, fitted on the H200's torch-path rows
(the kernel's rows are all H100s': they test it), prices both. Without chunked_loss, megatron's own loss has no
feature (its passes are in the other costs, as before).

FP8 attention (precision.fp8_dot_product_attention) scales the attention feature by calibration.FP8_ATTENTION_TIME,
measured on one shape.

Packed sequences are assumed to hold documents like the benchmarks' GovReport-like packs (sum of squared lengths
PACKED_ATTENTION_FILL x seq^2), unpacked one a sequence.
"""
from __future__ import annotations

from primus_contract import flops
from primus_contract.plan import calibration as cal
from primus_contract.plan.adapter_passes import traffic_ratio
from primus_contract.rules_precision import (epilogue_norm_on, epilogue_on, fp8_attention_on, fused_swiglu_on,
                                             run_device, swiglu_kernels_can_run)
from primus_contract.plan.gpus import CALIBRATED_ON, GPUS, Gpu
from primus_contract.plan.memory import chunked_loss_path, offloaded_bytes
from primus_contract.plan.offload import exposed_copy_s
from primus_contract.plan.shapes import Layout, layer_linears_local, moe_layer

PACKED_ATTENTION_FILL = 0.436
# bytes the chunked loss's elementwise passes move per logit (trainer/model/chunked_loss.py, ce_kernel.py)
LOSS_BYTES_PER_LOGIT = {"torch": 44.0, "kernel": 6.0}


def precision_of(t: dict) -> str:
    p = t["precision"]
    if p["fp4"]:
        return "fp4_emulated" if p["fp4_emulation"] else "fp4"
    if p["fp8"]:
        return "fp8_param" if p["fp8_param"] else "fp8"
    return "bf16" if p["bf16"] else "fp32"


def _gemm_class(precision: str) -> str:
    return {"fp8_param": "fp8", "fp4": "fp8", "fp32": "bf16"}.get(precision, precision)


def features(r: dict, lay: Layout) -> dict[str, float]:
    """Work per GPU per step, by feature (FLOPs, element counts, calls, bytes)."""
    t = r["trainer"]
    m, rec = t["model"], t["recompute"]
    # null fused_swiglu / epilogue / epilogue_norm (auto): as they will run on this recipe's machine
    lora = {**t["lora"], "fused_swiglu": fused_swiglu_on(t, r["cluster"]["env_profile"]),
            "epilogue": epilogue_on(t, r["cluster"]["env_profile"]),
            "epilogue_norm": epilogue_norm_on(t, r["cluster"]["env_profile"])}
    precision = precision_of(t)
    gclass = _gemm_class(precision)
    n_mb = lay.micro_batches
    mb_tokens = float(lay.mbs * lay.seq)
    tokens = mb_tokens * n_mb
    layers = m["num_layers"]
    redo = _recomputed(t, lay) / layers
    split = lay.tp * lay.pp
    head = 2.0 * m["hidden_size"] * m["vocab_size"]
    base_fwd = flops.base_linear_fwd_flops_per_token(m) - head
    expert_fwd = _expert_fwd_flops_per_token(m)
    fill = PACKED_ATTENTION_FILL if t["data"]["packing"] else 1.0
    f = {k: 0.0 for k in cal.COST}
    f[f"gemm_{gclass}"] = tokens * (base_fwd - expert_fwd) * (2 + redo) / split
    f[f"expert_gemm_{gclass}"] = tokens * expert_fwd * (2 + redo) / split
    f["gemm_bf16"] += tokens * head * 2 / lay.tp / lay.pp
    f["attention"] = flops.attention_fwd_flops(m, n_mb * lay.mbs * fill * lay.seq ** 2) * (3 + redo) / split
    # (with packing, FP8 attention runs on the one-document micro-batches only: how many is the data's, unknown here)
    if fp8_attention_on(t, r["cluster"]["env_profile"]) and not t["data"]["packing"]:
        f["attention"] *= cal.FP8_ATTENTION_TIME
    f["gemm_bf16"] += tokens * flops.lora_fwd_flops_per_token(m, lora) * (3 + redo) / split
    stage_layers = layers / lay.pp
    volume = stage_layers * tokens * m["hidden_size"] / lay.seq_shard * (1 + redo)
    f[f"elementwise_{gclass}"] = volume
    if rec["adapter_inputs"]:
        f["adapter_inputs_elementwise"] = volume
    adapted_in = adapted_io = quantized = 0.0
    for layer in range(layers):
        for lin in layer_linears_local(m, lora, lay, layer):
            if lin.short != "router":  # FP8 GEMM operands: the input (each forward), the output's gradient
                quantized += (lin.in_local * (1 + redo) + lin.out_local) * lin.uses
            if lin.adapted:  # (epilogue / fused_swiglu: their pass counts, primus_contract/plan/adapter_passes.py)
                adapted_in += lin.in_local * lin.uses
                adapted_io += (lin.in_local + lin.out_local) * lin.uses * traffic_ratio(lora, lin, lay.tp)
    f["adapter"] = adapted_io * tokens / lay.pp * (3 + redo)  # activations streamed: forward, backward (2), recompute
    if gclass == "fp8" and t["precision"]["fp8_recipe"] == "tensorwise":
        f["current_scaling_elementwise"] = quantized * tokens / lay.pp  # amax pass before each cast
    scale = tokens / lay.pp * (1 + redo)
    if lora["enabled"] and lora["dropout"] > 0:
        f[f"dropout_{lora['dropout_position']}_elementwise"] = adapted_in * scale
    loss = chunked_loss_path(r)  # bytes its elementwise passes stream over the logits (the GEMMs are in gemm_bf16)
    if loss:
        f["loss_elementwise"] = tokens * m["vocab_size"] / lay.tp / lay.pp * LOSS_BYTES_PER_LOGIT[loss]
    f["layer_calls"] = stage_layers * n_mb * (1 + redo)
    if m["num_moe_experts"]:
        moe_layers = sum(1 for i in range(layers) if moe_layer(m, i)) / lay.pp
        f[f"expert_calls_{gclass}"] = moe_layers * m["num_moe_experts"] / lay.ep * n_mb * (1 + redo)
    if lay.tp > 1:
        volume = mb_tokens * m["hidden_size"] * 2.0 * (lay.tp - 1) / lay.tp
        f["tp_bytes"] = stage_layers * n_mb * 4 * volume * (1 if lay.sp else 2) * (2 + redo)
    return f


def _recomputed(t: dict, lay: Layout) -> int:
    """Layers whose forward runs twice a step (full recompute: all; block: num_layers a stage)."""
    rec, layers = t["recompute"], t["model"]["num_layers"]
    if rec["granularity"] != "full":
        return 0
    return min(rec["num_layers"] * lay.pp, layers) if rec["method"] == "block" else layers


def swiglu_store_casts(r: dict, lay: Layout) -> float:
    """Seconds a step (on the H200) of megatron's FP8 SwiGLU store passes (calibration.FP8_SWIGLU_CAST_S /
    UNCAST_S): on a GPU with precision.fp8_swiglu_input, each dense MLP's fc1 output is cast in every forward (the
    recomputed layers' twice) and copied back before its backward; an MLP fused_swiglu folds (its forward kernel
    writes the copy) or the store's kernels take (precision.fp8_swiglu_kernels: an NVIDIA GPU in BF16, no activation
    offload) neither."""
    t, profile = r["trainer"], r["cluster"]["env_profile"]
    if not t["precision"]["fp8_swiglu_input"]:
        return 0.0
    if run_device(t, profile) == "cpu":  # (refused by the contract: megatron keeps it only on a GPU)
        return 0.0
    kernels = t["precision"]["fp8_swiglu_kernels"] and swiglu_kernels_can_run(t, profile)
    folded = fused_swiglu_on(t, profile)
    lora = {**t["lora"], "fused_swiglu": folded}
    layers = t["model"]["num_layers"]
    redo = _recomputed(t, lay) / layers
    tokens = float(lay.mbs * lay.seq) * lay.micro_batches / lay.pp
    seconds = 0.0
    for layer in range(layers):
        for lin in layer_linears_local(t["model"], lora, lay, layer):
            if lin.short != "linear_fc1" or lin.expert or ".shared_experts." in f".{lin.path}":
                continue
            if kernels or (folded and lin.adapted):
                continue
            cast = cal.FP8_SWIGLU_CAST_S * (1 + redo)
            seconds += lin.out_local * lin.uses * tokens * (cast + cal.FP8_SWIGLU_UNCAST_S)
    return seconds


def _expert_fwd_flops_per_token(m: dict) -> float:
    total = 0.0
    for layer in range(m["num_layers"]):
        for _, suffix, i, o, uses in flops.layer_linears(m, layer):
            if ".experts." in f".{suffix}":
                total += 2.0 * i * o * uses
    return total


def _scale(name: str, gpu: Gpu | None) -> float:
    """What a calibrated cost is multiplied by on `gpu` (1 on the calibration GPU or an unknown one)."""
    ref = GPUS[CALIBRATED_ON]
    if gpu is None or gpu is ref:
        return 1.0
    if name == "adapter" or "elementwise" in name:
        return ref.memory_bound_tb_s / gpu.memory_bound_tb_s
    if name.endswith("fp8") or name.endswith("fp8_param"):
        return ref.fp8_tflops / gpu.fp8_tflops
    if name == "tp_bytes":
        return ref.link_gb_s / gpu.link_gb_s
    if name.startswith(("gemm", "expert_gemm", "attention")):
        return ref.bf16_tflops / gpu.bf16_tflops
    return 1.0


def step_time(r: dict, lay: Layout, gpu: Gpu | None) -> dict[str, float]:
    """Seconds of one step per GPU, by feature (and the pipeline bubble)."""
    f = features(r, lay)
    fp4_units = gpu is not None and gpu.fp4_tflops and precision_of(r["trainer"]) == "fp4"
    out = {}
    for name, work in f.items():
        if work:
            cost = cal.COST[name] * _scale(name, gpu)
            if fp4_units and name.endswith("fp8"):
                cost *= gpu.fp8_tflops / gpu.fp4_tflops  # not measured: FP8's efficiency at the FP4 peak
            out[name] = work * cost
    casts = swiglu_store_casts(r, lay)
    if casts:
        out["fp8 swiglu store casts"] = casts * _scale("elementwise", gpu)
    bubble = (lay.pp - 1) / lay.micro_batches if lay.pp > 1 else 0.0
    out["pipeline bubble"] = sum(out.values()) * bubble
    if r["trainer"]["recompute"]["activation_offload_layers"]:  # (pipeline 1: rules_levers)
        out["activation offload (copies not hidden)"] = exposed_copy_s(
            offloaded_bytes(r, lay), sum(out.values()) / lay.micro_batches, lay.micro_batches)
    return out
