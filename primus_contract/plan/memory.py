"""Peak GPU memory of one LoRA training step, per GPU of the most loaded pipeline stage, as named terms (bytes).

What each term counts (checked against the census of saved tensors in bench/results/2026-11-30_s3_h200_profile and
the measured peaks in bench/results; calibration.py lists the rows):
- base weights: 2 bytes a parameter (4 without bf16); fp8_param: the transformer linears 1 byte (plus the one
  transpose alive at a time: each is made in its linear's backward and freed after it); embedding, output layer and
  router stay BF16. FP8 with fp8_weight_cache keeps row- and column-wise FP8 copies (+2 bytes a linear parameter);
  without it, the column-wise copy of every layer whose activations are kept lives until that layer's backward.
  FP4 emulation keeps a BF16 quantize-dequantized copy of each frozen linear (+2 bytes).
- LoRA: fp32 A and B, fp32 grads, AdamW's two fp32 moments (16 bytes a parameter) and the BF16 casts the forward
  keeps (2 bytes).
- activations per layer and token, what autograd keeps with frozen base linears (no input is kept for a weight
  gradient): the two RMSNorm inputs, attention q/k/v/out and its softmax statistics, SwiGLU's input (fc1's output);
  adapters keep their own inputs (the norm outputs, fc2's input) unless trainer.recompute.adapter_inputs folds or
  recomputes them (MLA's q_proj / q_down_proj and kv_down_proj read one output of a separate norm: kept once a
  layer, never folded; with LoRA pre-dropout an adapter keeps its dropped copy and bool mask instead of its
  input, or with lora.dropout_recompute on its fused or epilogue path its input and the mask's bits:
  tests/test_plan_dropout_memory.py; with recompute.norm_output the norm epilogue's adapters keep the norm's
  input, which the norm keeps anyway: tests/test_norm_output_recompute.py); MoE layers keep router probabilities,
  routed tokens and expert outputs. Sequence-dimension tensors are split by TP under sequence parallelism, head/FFN
  dimensions by TP always.
- recompute full: each chunk of num_layers layers keeps its input, one chunk is rebuilt in its backward; block:
  the first num_layers layers of the stage keep only their inputs. activation_offload_layers N: the first N layers
  keep nothing (their activations are in host memory), one layer's copy is in flight (offload.py). Pipeline stage 0
  holds min(pp, micro-batches) micro-batches in flight (1F1B).
- logits and loss: with chunked_loss a fixed chunk of 256 MiB fp32 logits (two buffers; with chunked_loss_kernel on
  an NVIDIA GPU only the chunk's 16-bit logits, 128 MiB, the gradient written over them), else the [tokens, vocab]
  logits and their gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_contract.plan import calibration as cal
from primus_contract.plan.offload import in_flight_layers, offloaded_layers
from primus_contract.plan.shapes import (INPUT_NORM_SHARED, Layout, Linear, layer_linears_local, lora_params_local,
                                         moe_layer, stage_layers)
from primus_contract.dropout_rebuild import activation_dtype, dropout_recomputable
from primus_contract.rules_precision import epilogue_norm_on, epilogue_on, run_device, triton_kernels_run

GIB = float(1 << 30)
CHUNK_BYTES = 256 * (1 << 20)  # trainer/model/chunked_loss.py


def chunked_loss_path(r: dict) -> str | None:
    """How the loss runs: "kernel" (trainer.recompute.chunked_loss_kernel's Triton passes: chunked_loss on, an NVIDIA
    GPU, BF16), "torch" (chunked_loss's fp32 torch ops), None (no chunked loss: megatron's output layer and loss)."""
    t = r["trainer"]
    rec = t["recompute"]
    if not (rec["chunked_loss"] and t["lora"]["enabled"]):
        return None
    kernel = rec["chunked_loss_kernel"] and triton_kernels_run(t, r["cluster"]["env_profile"])
    return "kernel" if kernel else "torch"


def _model_bytes(t: dict) -> float:
    return 2.0 if t["precision"]["bf16"] or t["precision"]["fp8"] else 4.0


def _fp8_layers(t: dict, layers: range, num_layers: int) -> set[int]:
    p = t["precision"]
    if not p["fp8"]:
        return set()
    if not p["first_last_layers_bf16"]:
        return set(layers)
    lo, hi = p["num_layers_at_start_in_bf16"], num_layers - p["num_layers_at_end_in_bf16"]
    return {i for i in layers if lo <= i < hi}


@dataclass(frozen=True)
class AdapterStores:
    """What the adapters keep in place of their inputs, decided once a plan (the paths are recipe-wide):
    drop_plain / drop_norm: under pre-dropout the non-norm / norm-fed adapters keep their input and the mask's bits,
    not the dropped copy and a bool mask (trainer.lora.dropout_recompute; their nodes draw the dropout: the fused path
    or the epilogue on a non-norm linear, the norm epilogue on a norm-fed one; experts keep their grouped path; a GPU
    run keeps the copy at a p whose mask does not rebuild bitwise for its input dtype,
    primus_contract.dropout_rebuild.dropout_recomputable: p = 0.104 in BF16, 0.15 in FP32, not 0.1). norm_output: the norm epilogue's adapters keep the norm's input (kept by the norm anyway), not its output
    (trainer.recompute.norm_output; under pre-dropout only with the dropped copy recomputed). norm_epilogue: the
    norm-fed adapters run on the norm epilogue (trainer/model/lora/norm_epilogue.py), which keeps no FP8 cast of
    the norm output beside the adapter's copy."""
    drop_plain: bool = False
    drop_norm: bool = False
    norm_output: bool = False
    norm_epilogue: bool = False

    def drop(self, lin: Linear) -> bool:
        return not lin.expert and (self.drop_norm if lin.norm_fed else self.drop_plain)

    def norm(self, lin: Linear) -> bool:
        return self.norm_output and lin.norm_fed and not lin.expert


def adapter_stores(t: dict, profile: str) -> AdapterStores:
    lora = t["lora"]
    pre = lora["dropout"] > 0 and lora["dropout_position"] == "pre"
    norm_epilogue = epilogue_norm_on(t, profile)
    # a GPU's mask is rebuilt bitwise only where dropout_recomputable(p, dtype) (a device not yet known plans as a GPU)
    rebuilt = lora["dropout_recompute"] and (run_device(t, profile) == "cpu" or dropout_recomputable(
        lora["dropout"], activation_dtype(t["precision"])))
    drop_norm = bool(pre and rebuilt and norm_epilogue)
    drop_plain = bool(pre and rebuilt and (lora["fused"] or epilogue_on(t, profile)))
    norm_output = bool(t["recompute"]["norm_output"] and norm_epilogue and (not pre or drop_norm))
    return AdapterStores(drop_plain, drop_norm, norm_output, norm_epilogue)


def layer_activation_bytes(m: dict, t: dict, lay: Layout, linears: list[Linear], moe: bool,
                           profile: str = "none", stores: AdapterStores | None = None) -> dict[str, float]:
    """Bytes one layer keeps for its backward per micro-batch, split into base and adapter shares (profile: the env
    profile, for which adapter paths run; stores: adapter_stores(t, profile), computed once by a caller that plans
    every layer)."""
    stores = stores if stores is not None else adapter_stores(t, profile)
    tokens = float(lay.mbs * lay.seq)
    shard, tp, h = lay.seq_shard, lay.tp, m["hidden_size"]
    rec, lora = t["recompute"], t["lora"]
    folded_norm = rec["adapter_inputs"] and rec["adapter_inputs_scope"] in ("all", "norm")
    folded_fc2 = rec["adapter_inputs"] and rec["adapter_inputs_scope"] in ("all", "fc2")
    heads = m["num_attention_heads"]
    base = 2 * h * 2 / shard  # the RMSNorm inputs TE keeps for the norm's backward
    if m["multi_latent_attention"]:
        qk, dv = m["qk_head_dim"] + m["qk_pos_emb_head_dim"], m["v_head_dim"]
        base += (2 * heads * qk + 2 * heads * dv) * 2 / tp + heads * 4 / tp
        base += ((m["q_lora_rank"] or 0) + m["kv_lora_rank"]) * 2 / shard  # the latent norms' inputs
    else:
        d = m["kv_channels"] or h // heads
        g = m["num_query_groups"] or heads
        base += (2 * heads * d + 2 * g * d) * 2 / tp + heads * 4 / tp
    moe_bytes = 0.0
    if moe:
        topk, experts = m["moe_router_topk"], m["num_moe_experts"]
        moe_bytes += experts * 4 * 2 / shard + topk * h * 2 / shard  # router logits + probs, expert outputs
    adapter = 0.0
    fp8 = bool(t["precision"]["fp8"])
    shared_kept = False  # MLA's input-norm output, kept once for all the adapters that read it
    for lin in linears:
        if lin.short == "linear_fc1":  # the SwiGLU input: 2 bytes, or 1 kept in FP8 (precision.fp8_swiglu_input)
            kept = lin.out_local * (1 if t["precision"]["fp8_swiglu_input"] else 2) * lin.uses
            if lin.expert or ".shared_experts." in f".{lin.path}":
                moe_bytes += kept
            else:
                base += kept
        if not lin.adapted:
            continue
        adapter += lora["dim"] * 2 * lin.uses  # A's output, the B GEMM's input
        in_bytes = lin.in_local * 2 * lin.uses / (shard if lin.in_local == h else 1)
        if lora["dropout"] > 0 and lora["dropout_position"] == "pre" and stores.drop(lin):
            # the input and the mask's bits (in / 8 bytes); linear_proj's input is the attention output, which the
            # core attention keeps; MLA's separate-norm linears share one input
            adapter += in_bytes / 16
            if lin.short in INPUT_NORM_SHARED:
                adapter += 0.0 if shared_kept else in_bytes
                shared_kept = True
            elif lin.short != "linear_proj" and not stores.norm(lin):
                adapter += in_bytes
        elif lora["dropout"] > 0 and lora["dropout_position"] == "pre":
            # the dropped copy and its bool mask (trainer/model/lora/drop.py) stand in for the input: A's gradient
            # reads the dropped copy, so neither path keeps the input itself (nor folds it)
            adapter += in_bytes * 1.5
        elif lin.short == "linear_proj":
            pass  # its input (the attention output) is kept by the core attention already
        elif lin.short in INPUT_NORM_SHARED:  # a separate norm: no fold; one storage for q_proj/q_down and kv_down
            adapter += 0.0 if shared_kept else in_bytes
            shared_kept = True
        elif lin.norm_fed and not lin.expert:
            if not folded_norm and not stores.norm(lin):  # FP8 off the norm epilogue: TE's cast of it is kept too
                adapter += in_bytes * (1.5 if fp8 and not stores.norm_epilogue else 1.0)
        elif lin.short == "linear_fc2" and not lin.expert and ".shared_experts." not in f".{lin.path}":
            if not folded_fc2:
                adapter += in_bytes
        else:
            adapter += in_bytes  # expert and shared-expert adapters keep their inputs
    return {"base": base * tokens, "adapter": adapter * tokens, "moe": moe_bytes * tokens}


def stage_memory(r: dict, lay: Layout, stage: int) -> dict[str, float]:
    """Named terms in bytes for one GPU of pipeline stage `stage`."""
    t = r["trainer"]
    m, p, rec = t["model"], t["precision"], t["recompute"]
    layers = stage_layers(m, lay.pp, stage)
    fp8_layers = _fp8_layers(t, layers, m["num_layers"])
    wbytes = _model_bytes(t)
    h, vocab = m["hidden_size"], m["vocab_size"]
    tokens = float(lay.mbs * lay.seq)
    terms = {k: 0.0 for k in ("base weights", "fp8 weight copies", "lora params+grads+adam", "activations (base)",
                              "activations (adapters)", "activations (moe)", "moe dispatch buffers", "logits+loss",
                              "fp8 transposes", "workspaces", "backward transients")}
    largest_linear = 0.0
    kept_layers = set(layers)
    full = rec["granularity"] == "full"
    n = max(1, rec["num_layers"])
    if full and rec["method"] == "block":
        kept_layers = set(list(layers)[min(n, len(layers)):])
    elif full:
        kept_layers = set()
    offloaded = offloaded_layers(t, layers)  # (not with recompute: rules_levers) their activations live on the host
    kept_layers -= offloaded
    per_layer_act = []
    stores = adapter_stores(t, r["cluster"]["env_profile"])
    lora_params = 0.0
    for layer in layers:
        linears = layer_linears_local(m, t["lora"], lay, layer)
        moe = moe_layer(m, layer)
        for lin in linears:
            in_fp8 = layer in fp8_layers and lin.short != "router"
            if p["fp8_param"] and in_fp8:
                terms["base weights"] += lin.params * 1.0
            else:
                terms["base weights"] += lin.params * wbytes
            if in_fp8 and not p["fp8_param"]:
                if p["fp8_weight_cache"]:
                    terms["fp8 weight copies"] += 2.0 * lin.params
                elif layer in kept_layers:
                    terms["fp8 weight copies"] += 1.0 * lin.params
            if p["fp4"] and p["fp4_emulation"] and lin.short != "router":
                terms["fp8 weight copies"] += 2.0 * lin.params
            elif p["fp4"] and lin.short != "router":
                terms["fp8 weight copies"] += (0.5625 if p["fp4_param"] else 1.125) * lin.params
            if lin.adapted:
                lora_params += lora_params_local(lin, t["lora"]["dim"])
            largest_linear = max(largest_linear, lin.params / (m["num_moe_experts"] / lay.ep if lin.expert else 1))
        acts = layer_activation_bytes(m, t, lay, linears, moe, stores=stores)
        per_layer_act.append((layer, acts))
        if moe:
            topk = m["moe_router_topk"]
            terms["moe dispatch buffers"] = max(terms["moe dispatch buffers"],
                                                2.0 * tokens / lay.seq_shard * topk * h * 2)
    if p["fp8"] and p["fp8_param"]:
        terms["fp8 transposes"] = largest_linear  # one linear's column-wise copy at a time
    elif p["fp8"] and not p["fp8_weight_cache"]:
        terms["fp8 transposes"] = 2.0 * largest_linear  # the linear being quantized this step
    first, last = stage == 0, stage == lay.pp - 1
    emb = vocab * h / lay.tp
    if first:
        terms["base weights"] += emb * wbytes
    if last and (m["untie_embeddings"] or lay.pp > 1):
        terms["base weights"] += emb * wbytes
    terms["lora params+grads+adam"] = lora_params * (16.0 + 2.0 + (4.0 if lay.dp > 1 else 0.0))
    in_flight = min(lay.pp - stage, lay.micro_batches) if lay.pp > 1 else 1
    layer_input = tokens * h * 2 / lay.seq_shard
    kept = {"base": 0.0, "adapter": 0.0, "moe": 0.0}
    biggest = {"base": 0.0, "adapter": 0.0, "moe": 0.0}
    for layer, acts in per_layer_act:
        for k, v in acts.items():
            biggest[k] = max(biggest[k], v)
            if layer in kept_layers:
                kept[k] += v
    recomputed = len(layers) - len(kept_layers) - len(offloaded)
    if recomputed:
        checkpoints = recomputed if rec["method"] == "block" else -(-recomputed // n)
        chunk = min(n, recomputed) if rec["method"] == "uniform" else 1
        kept["base"] += checkpoints * layer_input
        for k in kept:  # the chunk being rebuilt in its backward
            kept[k] += chunk * biggest[k] / in_flight
    terms["activations (base)"] = in_flight * (kept["base"] + layer_input)
    terms["activations (adapters)"] = in_flight * kept["adapter"]
    terms["activations (moe)"] = in_flight * kept["moe"]
    if offloaded:  # one offloaded layer's activations on the GPU while its copy is in flight
        terms["activations (offload in flight)"] = in_flight_layers * sum(biggest.values())
    if last:
        path = chunked_loss_path(r)
        if path:  # the Triton passes (trainer/model/ce_kernel.py) keep only the GEMM's 16-bit logits of a chunk
            terms["logits+loss"] = (0.5 if path == "kernel" else 2.0) * min(float(CHUNK_BYTES),
                                                                            tokens * vocab / lay.tp * 4)
        else:
            terms["logits+loss"] = tokens * vocab / lay.tp * 4
    widest = max((lin.out_local for lin in layer_linears_local(m, t["lora"], lay, layers[0])), default=h)
    terms["backward transients"] = tokens * (widest * 2 + 2 * h * 2 / lay.seq_shard)  # dgrad of the widest output
    terms["workspaces"] = cal.WORKSPACE_GIB * GIB + (cal.FP8_WORKSPACE_GIB * GIB if p["fp8"] else 0.0)
    return terms


def peak_memory(r: dict, lay: Layout) -> tuple[int, dict[str, float]]:
    """(most loaded stage, its terms in GiB)."""
    best = None
    stages = {0, lay.pp - 1}
    for stage in sorted(stages):
        terms = {k: v / GIB for k, v in stage_memory(r, lay, stage).items()}
        if best is None or sum(terms.values()) > sum(best[1].values()):
            best = (stage, terms)
    return best


def offloaded_bytes(r: dict, lay: Layout) -> float:
    """Bytes of activations one micro-batch sends to host memory (trainer.recompute.activation_offload_layers)."""
    t = r["trainer"]
    m = t["model"]
    layers = stage_layers(m, lay.pp, 0)
    stores = adapter_stores(t, r["cluster"]["env_profile"])
    total = 0.0
    for layer in sorted(offloaded_layers(t, layers)):
        acts = layer_activation_bytes(m, t, lay, layer_linears_local(m, t["lora"], lay, layer), moe_layer(m, layer),
                                      stores=stores)
        total += sum(acts.values())
    return total


def lazy_communicators(lay: Layout, t: dict) -> int:
    """NCCL communicators a rank makes beyond its first (the world's) at world size > 1 with lazy init: the groups
    trainer/runtime/nccl_groups.py makes before the model (data-parallel with CP, model-parallel, TP, CP, the experts'
    gradient-norm group, the pipeline group, expert dispatch, the experts' data-parallel group, FP8's amax group) and
    the pipeline's two point-to-point pairs. Groups of the same ranks are distinct communicators. An estimate: only
    world size 1 was measured (none there)."""
    par, moe, fp8 = t["parallelism"], bool(t["model"]["num_moe_experts"]), bool(t["precision"]["fp8"])
    tp, pp, cp, ep = lay.tp, lay.pp, par["context"], lay.ep
    expert_dp = lay.world // (ep * pp)  # (expert tensor parallelism is 1: trainer/runtime/distributed.py)
    return ((lay.dp * cp > 1) + (tp * pp > 1) + (tp > 1) + (cp > 1) + (ep * pp > 1) + (pp > 1) + (moe and ep > 1)
            + (moe and expert_dp > 1) + (fp8 and tp * lay.dp * cp > 1) + 2 * (pp > 1))


def outside_torch_gib(resolved: dict, lay: Layout) -> float:
    """GiB a process holds outside PyTorch's caching allocator: the CUDA context and NCCL's communicators, eager
    (trainer.distributed.nccl_eager_init: megatron's ~20 groups' made at init) or lazy (the default: none at world
    size 1, then the first and each further one its groups use)."""
    eager = bool(resolved["trainer"]["distributed"]["nccl_eager_init"])
    gib = cal.OUTSIDE_TORCH_GIB[eager]
    if not eager and lay.world > 1:
        gib += cal.NCCL_FIRST_COMM_GIB + cal.NCCL_COMM_GIB * lazy_communicators(lay, resolved["trainer"])
    return gib
