"""Cross-field precision rules over a defaulted recipe: one definition, run by `validate`/`submit` and by the
trainer at start (trainer.precision.gating). Rules that need the machine are in primus_contract.machine."""
from __future__ import annotations

from typing import Mapping, Optional

from primus_contract.errors import fail
from primus_contract.rules_shapes import fp8_attention_heads_ok

P = "trainer.precision"
FP4_FLAGS = ("fp4_param", "fp4_emulation", "fp4_stochastic_rounding", "fp4_random_hadamard")
# FP4 units per env profile (the trainer checks the device itself at start; this catches a recipe whose nodes
# cannot run its FP4 format before it waits in the queue)
FP4_FORMAT = {"b200": "nvfp4", "mi355x": "mxfp4", "h100": None, "h200": None, "mi300x": None}
# TE's FP8 fused attention takes bshd/sbhd inputs only (an H200 run in the packed THD layout failed in TE 2.20.2:
# "No dot product attention backend is available"); with trainer.data.packing false every row is one document and
# the trainer runs plain causal sbhd attention (trainer/model/inputs.py). megatron-core (fp8_utils.get_fp8_recipe,
# 0.16.1 and 0.19.2) hands fp8_dpa to TE's DelayedScaling and Float8CurrentScaling only: with Float8BlockScaling the
# field would be ignored (TE's recipe table in dot_product_attention.py, v2.18, has no FP8 attention for it either).
FP8_ATTENTION_RECIPES = ("delayed", "tensorwise")
# TE 2.20 runs FP8 attention under current scaling (tensorwise) on sm100+ only (primus_contract.machine
# FP8_ATTENTION_CS_MIN_CC): refused on the Hopper profiles; null turns it on under delayed scaling only (measured)
HOPPER_PROFILES = ("h100", "h200")
NVIDIA_PROFILES, AMD_PROFILES = (*HOPPER_PROFILES, "b200"), ("mi300x", "mi355x")


def precision_rules(p: Mapping, num_layers: Optional[int], pipeline: int, device: str) -> None:
    """What holds on any machine. bf16: false with fp8/fp4 is allowed: the low-precision GEMMs then run inside an
    fp32 model (megatron-core 0.16.1's TransformerConfig has no such rule; TE's own tests, tests/pytorch/
    test_fusible_ops.py, cross float32 with its FP8 recipes; FP4 emulation in fp32 is what
    tests/test_fp4_emulation.py runs)."""
    if p["fp4_param_gather"]:  # megatron's distributed-optimizer all-gather: nothing here would read it
        fail(f"`{P}.fp4_param_gather` has no effect in LoRA training: the frozen base is sharded by "
             "tensor/pipeline parallelism only and no parameters are all-gathered; remove it")
    if p["fp4"] and p["fp8"]:
        fail(f"`{P}.fp4` and `{P}.fp8` are mutually exclusive (megatron-core runs one low-precision recipe); "
             "set one of them to null")
    for flag in FP4_FLAGS:
        if p[flag] and not p["fp4"]:
            fail(f"`{P}.{flag}` needs `{P}.fp4: e2m1` (fp4 is null)")
    if p["fp4"] and p["fp4_recipe"] == "mxfp4" and p["fp4_random_hadamard"]:
        fail(f"`{P}.fp4_random_hadamard` is implemented for fp4_recipe: nvfp4 only (TE's 16-point RHT); set it "
             "to false for mxfp4")
    if p["fp4"] and p["fp4_recipe"] == "mxfp4" and p["fp4_stochastic_rounding"] and not p["fp4_emulation"]:
        fail(f"`{P}.fp4_stochastic_rounding` with native MXFP4 (ROCm TE's MXFP4BlockScaling, its own rounding) would "
             "be ignored; set it to false, or fp4_emulation: true (the emulation rounds gradients stochastically)")
    if p["fp4_param"] and p["fp4_emulation"]:
        fail(f"`{P}.fp4_param` keeps weights as real FP4 tensors with native TE kernels, which emulation has "
             "not; set fp4_param: false to emulate, or run natively on FP4 hardware")
    if p["fp8_param"] and not p["fp8"]:
        fail(f"`{P}.fp8_param` needs `{P}.fp8: hybrid|e4m3` (fp8 is null)")
    if p["fp8_dot_product_attention"] and not p["fp8"]:  # megatron runs it inside the fp8 autocast only
        fail(f"`{P}.fp8_dot_product_attention` needs `{P}.fp8: hybrid|e4m3` (fp8 is null)")
    if p["fp8_dot_product_attention"] and p["fp8_recipe"] not in FP8_ATTENTION_RECIPES:
        fail(f"`{P}.fp8_dot_product_attention` runs with fp8_recipe delayed or tensorwise (TE has no FP8 attention "
             f"for {p['fp8_recipe']}); set fp8_dot_product_attention: false or fp8_recipe: delayed")
    if p["first_last_layers_bf16"]:
        _first_last(p, num_layers, pipeline)
    if device == "cpu" and p["fp8"]:  # the trainer's machine rule would say the same on the node
        fail(f"`{P}.fp8` needs a GPU with Transformer Engine; `trainer.distributed.device` is cpu "
             "(on CPU: bf16, or fp4: e2m1 with fp4_emulation: true)")
    if device == "cpu" and p["fp8_swiglu_input"]:  # megatron stores it only in its fused (GPU) SwiGLU
        fail(f"`{P}.fp8_swiglu_input` needs the GPU's fused SwiGLU; `trainer.distributed.device` is cpu "
             "(megatron-core's unfused SwiGLU would ignore it); set it to false")
    if device == "cpu" and p["fp4"] and not p["fp4_emulation"]:
        fail(f"`{P}.fp4` needs FP4 hardware (compute capability 10.0) with Transformer Engine; "
             f"`trainer.distributed.device` is cpu: set `{P}.fp4_emulation: true` to emulate it")


def _first_last(p: Mapping, num_layers: Optional[int], pipeline: int) -> None:
    if not (p["fp4"] or p["fp8"]):
        fail(f"`{P}.first_last_layers_bf16` only applies with fp8 or fp4 set (every layer already runs in "
             "bf16/fp32); set it to false")
    if p["fp8"] and p["fp8_recipe"] == "delayed":  # megatron-core's TransformerConfig raises the same
        fail(f"`{P}.first_last_layers_bf16` is not supported with fp8_recipe: delayed (megatron-core refuses "
             "it); use fp8_recipe: tensorwise or blockwise")
    if num_layers is None:
        return
    per_stage = num_layers // max(1, pipeline)
    start, end = p["num_layers_at_start_in_bf16"], p["num_layers_at_end_in_bf16"]
    for name, value in (("num_layers_at_start_in_bf16", start), ("num_layers_at_end_in_bf16", end)):
        if value > per_stage:
            fail(f"`{P}.{name}` ({value}) exceeds the {per_stage} layers per pipeline stage")
    if start + end >= num_layers:
        fail(f"`{P}.num_layers_at_start_in_bf16` + num_layers_at_end_in_bf16 ({start}+{end}) leaves none of the "
             f"{num_layers} layers in low precision")


def profile_rules(p: Mapping, profile: str) -> None:
    """The FP4 format the recipe's env profile has units for; FP8 attention on NVIDIA only."""
    if p["fp8_dot_product_attention"] and profile in AMD_PROFILES:
        fail(f"`{P}.fp8_dot_product_attention` runs cuDNN's FP8 attention (NVIDIA, compute capability >= 9.0); "
             f"`cluster.env_profile` {profile} is AMD, where it was never run; set it to false (or null)")
    if p["fp8_dot_product_attention"] and p["fp8_recipe"] == "tensorwise" and profile in HOPPER_PROFILES:
        fail(f"`{P}.fp8_dot_product_attention` with fp8_recipe tensorwise (current scaling) needs compute capability "
             f">= 10.0 (TE runs FP8 attention under current scaling on Blackwell only); `cluster.env_profile` "
             f"{profile} is Hopper: use fp8_recipe: delayed, or set it to false (or null)")
    if not p["fp4"] or p["fp4_emulation"] or profile not in FP4_FORMAT:
        return
    native = FP4_FORMAT[profile]
    if native is None:
        fail(f"`{P}.fp4` needs FP4 units, and `cluster.env_profile` {profile} has none (NVFP4: b200; "
             f"MXFP4: mi355x); set `{P}.fp4_emulation: true` for accuracy studies, or use fp8")
    if p["fp4_recipe"] != native:
        fail(f"`{P}.fp4_recipe` is {p['fp4_recipe']}, but `cluster.env_profile` {profile} runs "
             f"{native} (NVFP4 is NVIDIA TE's, MXFP4 ROCm TE's); set fp4_recipe: {native}")


def run_device(t: Mapping, profile: str) -> str:
    """cpu | cuda | auto: the recipe's device, with env profile cpu hiding the GPUs (as device_rules says)."""
    device = t["distributed"]["device"]
    return "cpu" if profile == "cpu" and device == "auto" else device


GPU_PROFILES = NVIDIA_PROFILES + AMD_PROFILES  # env profiles that name a GPU (cpu and none do not)
# the largest LoRA rank the adapters' Triton kernels take (trainer/model/lora/kernels.py: one tile holds the rank)
LORA_KERNEL_MAX_RANK = 128


def nvidia_run(t: Mapping, profile: str) -> bool:
    """The run's device is an NVIDIA GPU (where the Triton kernels run), as far as the recipe tells: device auto on
    an NVIDIA profile, or cuda on any profile but AMD's."""
    device = run_device(t, profile)
    return profile in NVIDIA_PROFILES if device == "auto" else (device == "cuda" and profile not in AMD_PROFILES)


def triton_kernels_run(t: Mapping, profile: str) -> bool:
    """Where the LoRA and loss Triton kernels run (trainer/model/lora/kernels.py kernels_usable, trainer/model/
    ce_kernel.py ce_kernel_usable): an NVIDIA GPU and BF16 (FP32 takes the torch ops: tl.dot would run it in TF32)."""
    return nvidia_run(t, profile) and bool(t["precision"]["bf16"])


def swiglu_kernels_can_run(t: Mapping, profile: str) -> bool:
    """Where precision.fp8_swiglu_kernels can take megatron's FP8 SwiGLU store (trainer/model/swiglu_fp8.py
    wire_swiglu_fp8): the Triton kernels run (an NVIDIA GPU in BF16), and no activation offload, which keeps
    megatron's store."""
    return triton_kernels_run(t, profile) and not t["recompute"]["activation_offload_layers"]


def fused_swiglu_on(t: Mapping, profile: str) -> bool:
    """trainer.lora.fused_swiglu as it runs: true / false as written; null (auto) on wherever it applies: an adapter
    on linear_fc1 without post-dropout, no recompute.adapter_inputs scope all|fc2 (fc2's adapter recomputes from
    fc1's full output), and with precision.fp8_swiglu_input only on an NVIDIA GPU (the kernels keep the FP8 copy;
    the unfused ops would not, and ROCm's FP8 is e4m3fnuz). The trainer decides per MLP by the same conditions
    (trainer/model/lora/swiglu.py: experts and non-gated MLPs keep the unfused path)."""
    value = t["lora"]["fused_swiglu"]
    if value is not None:
        return bool(value)
    return swiglu_blocker(t, profile) is None


def swiglu_blocker(t: Mapping, profile: str, known_device_only: bool = False) -> str | None:
    """Why no MLP of the recipe can fold fc1's adapter into the SwiGLU (None: some can). known_device_only: the
    device check only where the recipe names the device (auto without a GPU profile is decided on the node)."""
    lora, rec, m = t["lora"], t["recompute"], t["model"]
    if lora["dropout"] and lora["dropout_position"] == "post":
        return "`trainer.lora.dropout_position` post masks the adapter's output, which the fold never writes"
    if rec["adapter_inputs"] and rec["adapter_inputs_scope"] in ("all", "fc2"):
        return (f"`trainer.recompute.adapter_inputs` scope {rec['adapter_inputs_scope']} recomputes fc2's input from "
                "fc1's full output, which the fold never writes")
    if dense_mlp_free(m):
        return "every layer of the model is MoE (experts keep their grouped path)"
    from primus_contract.rules_model import targeted_linears

    if "mlp.linear_fc1" not in targeted_linears(m, lora):  # a dense MLP's fc1, in some layer
        return "no adapter on a dense MLP's linear_fc1 (`trainer.lora.target_modules` / `exclude_modules`)"
    if t["precision"]["fp8_swiglu_input"] and not t["precision"]["bf16"]:
        return ("`trainer.precision.fp8_swiglu_input` keeps the FP8 copy in the fold's Triton kernels, which take "
                "16-bit weights (`trainer.precision.bf16` is false: fp32)")
    if known_device_only and run_device(t, profile) == "auto" and profile not in GPU_PROFILES:
        return None
    nvidia = nvidia_run(t, profile)
    if t["precision"]["fp8_swiglu_input"] and not nvidia:
        return "`trainer.precision.fp8_swiglu_input` keeps the FP8 copy in the fold's kernels on NVIDIA GPUs only"
    if t["precision"]["fp8_swiglu_input"] and lora["dim"] > LORA_KERNEL_MAX_RANK:
        return (f"`trainer.precision.fp8_swiglu_input` keeps the FP8 copy in the fold's kernels, which take LoRA "
                f"ranks up to {LORA_KERNEL_MAX_RANK} (`trainer.lora.dim` is {lora['dim']})")
    return None


def _on_gpu(t: Mapping, profile: str) -> bool:
    """The run's device is a GPU (Transformer Engine's layer spec), as far as the recipe tells."""
    device = run_device(t, profile)
    return device == "cuda" or (device == "auto" and profile in GPU_PROFILES)


def epilogue_owners(t: Mapping, profile: str, te: Optional[bool] = None) -> list:
    """The model's linears that trainer.lora.epilogue could own (trainer/model/lora/layers.py uses_epilogue: not an
    expert, not a replicated MLA down-projection, not fc1 folded into the SwiGLU, and on a GPU not a linear TE fuses
    with its norm). te: whether the run builds TE's layer spec (default: as far as the recipe tells, _on_gpu)."""
    from primus_contract.plan.shapes import REPLICATED
    from primus_contract.rules_model import targeted_linears

    te = _on_gpu(t, profile) if te is None else te
    folded = fused_swiglu_on(t, profile)
    te_norm = _te_norm_linears(t["model"])
    owners = []
    for name in targeted_linears(t["model"], t["lora"]):
        if ".experts." in f".{name}" or name.rsplit(".", 1)[-1] in REPLICATED:
            continue
        if (name == "mlp.linear_fc1" and folded) or (te and name in te_norm):
            continue
        owners.append(name)
    return owners


def epilogue_owner_rules(t: Mapping, profile: str) -> None:
    """trainer.lora.epilogue true where no wrapped linear could own its base GEMM: refused here, not at the trainer's
    start (with epilogue_norm, the norm-fed linears count: epilogue_norm_rules)."""
    epilogue_norm_rules(t, profile)
    if not t["lora"]["epilogue"]:
        return
    if t["precision"]["fp8"] and profile in AMD_PROFILES:
        fail("`trainer.lora.epilogue` with `trainer.precision.fp8` runs the base GEMMs through NVIDIA Transformer "
             f"Engine's functional linear (built and checked on NVIDIA GPUs only); env profile {profile}: set "
             "epilogue: false")
    # device auto without a GPU profile may land on a GPU, where TE's spec fuses qkv/fc1 with their norms: the
    # owners must hold there too (the trainer refuses at its start otherwise)
    maybe_gpu = run_device(t, profile) != "cpu"
    # (a norm-fed owner only where the run is known to be on a GPU: device auto may land on a CPU, which has none)
    if not epilogue_owners(t, profile, te=maybe_gpu) and not (epilogue_norm_on(t, profile) and _on_gpu(t, profile)):
        where = "on a GPU, where Transformer Engine fuses qkv and fc1 with their norms" if maybe_gpu else "here"
        fail(f"`trainer.lora.epilogue` has no linear to own {where}: its targets are experts, replicated, norm-fed "
             "(with epilogue_norm false, or recompute.adapter_inputs scope all|norm) or fc1 folded by fused_swiglu; "
             "target linear_proj / linear_fc2, or set epilogue: false")


def dense_mlp_free(m: Mapping) -> bool:
    """Every layer is MoE: the dense MLP's linears (which model_linear_names lists for MoE models too) exist nowhere."""
    return bool(m["num_moe_experts"]) and m["moe_first_k_dense"] == 0 and m["moe_layer_freq"] == 1


def _te_norm_linears(m: Mapping) -> tuple:
    """The linears megatron's TE layer spec builds as LayerNormLinear (their input norm fused): qkv, a dense MLP's fc1
    (where a dense layer exists; not a shared expert's, whose norm is the MLP's own), MLA's up-projections (their
    latent norms)."""
    mla = ("self_attention.linear_q_up_proj", "self_attention.linear_kv_up_proj") if m["multi_latent_attention"] else ()
    return ("self_attention.linear_qkv",) + (() if dense_mlp_free(m) else ("mlp.linear_fc1",)) + mla


def norm_fed_targets(t: Mapping) -> list:
    """The targeted linears Transformer Engine fuses with their input norm on a GPU (trainer.lora.epilogue_norm's)."""
    from primus_contract.rules_model import targeted_linears

    te_norm = _te_norm_linears(t["model"])
    return [n for n in targeted_linears(t["model"], t["lora"]) if n in te_norm]


def epilogue_norm_rules(t: Mapping, profile: str) -> None:
    """trainer.lora.epilogue_norm: an extension of the epilogue (true, or null where it is on), on a GPU (where TE
    fuses the norms), with a norm-fed linear among the targets; refused otherwise, never accepted and ignored."""
    if not t["lora"]["epilogue_norm"]:
        return
    if t["lora"]["epilogue"] is False:
        fail("`trainer.lora.epilogue_norm` extends `trainer.lora.epilogue` to the norm-fed linears; epilogue is "
             "false: set epilogue: null or true, or epilogue_norm: false")
    if t["lora"]["epilogue"] is None and not epilogue_on(t, profile):
        fail("`trainer.lora.epilogue_norm` extends `trainer.lora.epilogue` to the norm-fed linears; epilogue null "
             "stays off for this run (it runs BF16 or FP8 delayed/tensorwise on an NVIDIA GPU at TP 1, where a "
             "linear can own its GEMM): set epilogue: true, or epilogue_norm: false")
    if not _on_gpu(t, profile):
        fail("`trainer.lora.epilogue_norm` owns the input norms Transformer Engine fuses into qkv and fc1, which only "
             "a GPU run has (its layer spec); set trainer.distributed.device: cuda, or epilogue_norm: false")
    rec = t["recompute"]
    if rec["adapter_inputs"] and rec["adapter_inputs_scope"] in ("all", "norm"):
        fail("`trainer.lora.epilogue_norm` runs the norm-fed linears' norm before their adapters, and "
             f"`trainer.recompute.adapter_inputs` scope {rec['adapter_inputs_scope']} folds that norm into A instead; "
             "set adapter_inputs_scope: fc2, or epilogue_norm: false")
    if not norm_fed_targets(t):
        fail("`trainer.lora.epilogue_norm` has no norm-fed linear to own: `trainer.lora.target_modules` names none of "
             "linear_qkv / linear_fc1; target one, or set epilogue_norm: false")


def epilogue_on(t: Mapping, profile: str) -> bool:
    """trainer.lora.epilogue as it runs: true / false as written; null (auto) on for a BF16 run on an NVIDIA GPU
    (where it was measured: H100 8B, 2026-12-05, +0.9 % / +0.5 % on top of fused_swiglu), FP8 with per-tensor scaling
    (delayed, tensorwise: the base GEMMs through TE's functional linear; H100 8B FP8 delayed, 2026-12-06, +2.6-3.4 %
    single-document, +1.2-4.1 % packed; the 70B's layers tensorwise + fp8_param +1.4-1.8 %), no FP4, at TP 1,
    without post-dropout, where some linear can own its base GEMM (a norm-fed one too, unless epilogue_norm is false).
    The trainer decides auto by the same conditions on its node (trainer/model/lora/epilogue.py auto_blocker)."""
    from primus_contract.rules_model import FP8_EPILOGUE_RECIPES

    value = t["lora"]["epilogue"]
    if value is not None:
        return bool(value)
    lora, prec = t["lora"], t["precision"]
    fp8_blocked = prec["fp8"] and prec["fp8_recipe"] not in FP8_EPILOGUE_RECIPES
    if fp8_blocked or prec["fp4"] or not prec["bf16"] or t["parallelism"]["tensor"] > 1:
        return False
    if lora["dropout"] and lora["dropout_position"] == "post":
        return False
    norm = t["lora"]["epilogue_norm"] is not False and _norm_owners(t, profile)
    return nvidia_run(t, profile) and (bool(epilogue_owners(t, profile)) or norm)


def _norm_owners(t: Mapping, profile: str) -> bool:
    """Some targeted linear the norm epilogue could own where the epilogue is on: a device that may be a GPU (TE's
    norm-fused qkv and fc1), a norm-fed target whose adapter reads the norm's output (no recompute.adapter_inputs
    scope all|norm: that folds the norm into A)."""
    rec = t["recompute"]
    folded = rec["adapter_inputs"] and rec["adapter_inputs_scope"] in ("all", "norm")
    return run_device(t, profile) != "cpu" and not folded and bool(norm_fed_targets(t))


def epilogue_norm_on(t: Mapping, profile: str) -> bool:
    """trainer.lora.epilogue_norm as it runs: true / false as written; null (auto) wherever the epilogue is on and a
    norm-fed linear can take it (_norm_owners). The trainer decides null per linear by the same structure
    (trainer/model/lora/layers.py uses_norm_epilogue; with the epilogue null, a norm-fed owner keeps it on)."""
    value = t["lora"]["epilogue_norm"]
    if value is not None:
        return bool(value)
    return epilogue_on(t, profile) and _norm_owners(t, profile)


def attention_layout(t: Mapping) -> str:
    """The layout the model is built for (trainer/model/inputs.py runs it): 'sbhd' with packing false (every row one
    document), 'auto' with packing and data.single_document_sbhd true and neither context nor pipeline parallelism
    (each micro-batch sbhd when every row holds one document, else thd), else 'thd'."""
    data, par = t["data"], t["parallelism"]
    if not data["packing"]:
        return "sbhd"
    if not data["single_document_sbhd"] or int(par["context"]) > 1 or int(par["pipeline"]) > 1:
        return "thd"
    return "auto"


def fp8_attention_fits(t: Mapping, one_document_rows: bool = False) -> bool:
    """The recipe side of fp8_dot_product_attention null (auto): FP8 under delayed scaling (what ran; TE's FP8
    attention under current scaling needs sm100, primus_contract.machine), rows of one document (TE's FP8 attention
    takes bshd/sbhd), context parallelism 1, and head dims TE's FP8 attention runs (128). Rows of one document: packing
    false, or (`one_document_rows`, what the trainer finds in its train split once loaded) packed data whose every row
    holds one document, in the 'auto' layout, which then runs every micro-batch sbhd (trainer/model/inputs.py), as
    packing false would. The node adds compute capability >= 9.0 and Transformer Engine (trainer/precision/gating.py:
    auto stays off where they lack, never refused). Packed rows of several documents take it only when set true (then
    per micro-batch)."""
    p = t["precision"]
    rows = not t["data"]["packing"] or (one_document_rows and attention_layout(t) == "auto")
    return (bool(p["fp8"]) and p["fp8_recipe"] == "delayed" and rows
            and t["parallelism"]["context"] == 1 and fp8_attention_heads_ok(t["model"]))


def fp8_attention_on(t: Mapping, profile: str) -> bool:
    """trainer.precision.fp8_dot_product_attention as it runs: true / false as written; null (auto) where
    fp8_attention_fits on an NVIDIA GPU (Llama-3-8B shape FP8 one document a row, median of 3: +4.5 % on an H200 and
    +3.8 / +4.3 % on an H100 on 2026-12-06; its real-text loss within the reseeded run's spread). As the recipe
    tells it: device auto without an NVIDIA env profile plans it off, and the node decides (gating.resolve). Packed
    data of one document a row, which only the loaded train split shows, is planned off and runs on
    (gating.follow_data)."""
    value = t["precision"]["fp8_dot_product_attention"]
    if value is not None:
        return bool(value)
    return fp8_attention_fits(t) and nvidia_run(t, profile)


def fp8_attention_data_note(t: Mapping, profile: str) -> str:
    """What the recipe cannot tell about fp8_dot_product_attention null: '' unless it is planned off only for want
    of the data, packed rows that may each hold one document (gating.follow_data turns it on at start then)."""
    if (t["precision"]["fp8_dot_product_attention"] is None and not fp8_attention_on(t, profile)
            and fp8_attention_fits(t, one_document_rows=True) and nvidia_run(t, profile)):
        return " (on at start if every row of the train split holds one document)"
    return ""


def recipe_precision_rules(t: Mapping, profile: str) -> None:
    """precision_rules + profile_rules on the `trainer` section of a defaulted recipe."""
    precision_rules(t["precision"], t["model"]["num_layers"], t["parallelism"]["pipeline"], run_device(t, profile))
    if t["precision"]["fp8_dot_product_attention"] and attention_layout(t) == "thd":
        fail(f"`{P}.fp8_dot_product_attention` needs rows of one document: TE's FP8 attention takes bshd/sbhd, not "
             "the packed THD layout; set `trainer.data.packing: false`, or keep packing with "
             "`trainer.data.single_document_sbhd: true` and context and pipeline parallelism 1 (FP8 attention then "
             "runs on the micro-batches whose rows hold one document each)")
    rec = t["recompute"]
    fc2_recompute = rec["adapter_inputs"] and rec["adapter_inputs_scope"] in ("all", "fc2")
    # (fused_swiglu with fp8_swiglu_input: its kernels keep fc1's output in FP8 themselves, trainer/model/lora/swiglu.py)
    if t["lora"]["fused_swiglu"] is True and fc2_recompute:
        fail(f"`trainer.lora.fused_swiglu` and `trainer.recompute.adapter_inputs` scope {rec['adapter_inputs_scope']} "
             "(fc2's adapter recomputes its input from fc1's full output, which the fused SwiGLU never writes) "
             "exclude each other; set one of them to false (or adapter_inputs_scope: norm)")
    if t["lora"]["fused_swiglu"] is True:
        why = swiglu_blocker(t, profile, known_device_only=True)
        if why:
            fail(f"`trainer.lora.fused_swiglu` is true but no MLP can fold fc1's adapter into its SwiGLU: {why}; set "
                 "fused_swiglu: null (wherever it applies) or false")
    if t["precision"]["fp8_swiglu_input"] and fc2_recompute:
        fail(f"`{P}.fp8_swiglu_input` and `trainer.recompute.adapter_inputs` (scope {rec['adapter_inputs_scope']}) "
             "exclude each other: the fc2 adapter's recompute needs the exact 16-bit SwiGLU input; set "
             "adapter_inputs_scope: norm, or fp8_swiglu_input: false")


def device_rules(t: Mapping, profile: str) -> None:
    if profile == "cpu" and t["distributed"]["device"] == "cuda":  # its CUDA_VISIBLE_DEVICES is empty
        fail("`trainer.distributed.device` is cuda, but `cluster.env_profile` cpu hides the GPUs "
             "(CUDA_VISIBLE_DEVICES is empty); use device auto or cpu, or the profile of the GPU nodes")
    profile_rules(t["precision"], profile)
