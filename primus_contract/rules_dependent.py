"""Keys that only act together with another: set (a value other than the schema's default) without it, a key does
nothing. Never silently: `validate`, the dry run, `submit` and `sweep` print one `note:` line for each
(primus_slurm/jobs/submit.py recipe_notes), and the trainer logs it at start. Not refused:
turning a feature off with one override (`--set trainer.recompute.granularity=null` on a block-recompute recipe, a
sweep grid `trainer.precision.fp8=null,hybrid` over a recipe with fp8_recipe tensorwise) leaves its settings behind,
and that must still run.

Each row: (dotted key, what it needs in words, the test on the resolved recipe that it is in effect).
"""
from __future__ import annotations

import json
from typing import Any, Callable

from primus_contract.rules_precision import (GPU_PROFILES, LORA_KERNEL_MAX_RANK, dense_mlp_free, fused_swiglu_on,
                                             run_device, swiglu_kernels_can_run, triton_kernels_run)
from primus_contract.schema import field_at


def _get(r: dict, dotted: str) -> Any:
    node: Any = r
    for part in dotted.split("."):
        node = node[part]
    return node


def _decays(r: dict) -> bool:
    return r["trainer"]["schedule"]["lr_decay"] != "constant"


def _has_validation(r: dict) -> bool:
    v = r["trainer"]["data"]["validation"]
    return bool(v["path"] or v["hf_name"])


def _tokenized(r: dict) -> bool:
    return r["trainer"]["data"]["format"] != "mlperf_npy"


def _moe(r: dict) -> bool:
    return bool(r["trainer"]["model"]["num_moe_experts"])


def _mla(r: dict) -> bool:
    return bool(r["trainer"]["model"]["multi_latent_attention"])


def _container(r: dict) -> bool:
    return r["cluster"]["container"]["runtime"] != "none"


def _nvidia_16bit(r: dict) -> bool:
    return triton_kernels_run(r["trainer"], r["cluster"]["env_profile"])


def _swiglu_store_unfolded(r: dict) -> bool:
    t, profile = r["trainer"], r["cluster"]["env_profile"]
    if not (t["precision"]["fp8_swiglu_input"] and swiglu_kernels_can_run(t, profile)) or dense_mlp_free(t["model"]):
        return False
    from primus_contract.rules_model import targeted_linears

    return not (fused_swiglu_on(t, profile) and "mlp.linear_fc1" in targeted_linears(t["model"], t["lora"]))


def _lora_kernels(r: dict) -> bool:
    lora = r["trainer"]["lora"]
    return (_nvidia_16bit(r) and lora["dim"] <= LORA_KERNEL_MAX_RANK
            and bool(lora["fused"] or lora["epilogue"] is not False))


def _stores_if(r: dict, lora: dict | None = None, recompute: dict | None = None):
    """The planner's adapter stores (primus_contract.plan.memory.adapter_stores: the one rule of where they act) with
    these keys set: where a store would act if it were on."""
    from primus_contract.plan.memory import adapter_stores

    t = r["trainer"]
    t = {**t, "lora": {**t["lora"], **(lora or {})}, "recompute": {**t["recompute"], **(recompute or {})}}
    return adapter_stores(t, r["cluster"]["env_profile"])


def _fused_pre_dropout(r: dict) -> bool:
    """LoRA pre-dropout on a path whose nodes draw it themselves (trainer.lora.fused, or the epilogue)."""
    return _stores_if(r, lora={"dropout_recompute": True}).drop_plain


def _norm_recomputable(r: dict) -> bool:
    """The norm epilogue runs (its nodes own the norm), and under pre-dropout the dropped copy is recomputed."""
    return _stores_if(r, recompute={"norm_output": True}).norm_output


def _single_document_switch(r: dict) -> bool:  # (trainer/model/inputs.py batch_layout: THD under PP or CP)
    par = r["trainer"]["parallelism"]
    return r["trainer"]["data"]["packing"] and par["pipeline"] == 1 and par["context"] == 1


DEPENDENT: tuple[tuple[str, str, Callable[[dict], bool]], ...] = (
    ("trainer.schedule.target_eval_loss", "`trainer.schedule.eval_interval` (the early stop is judged at evaluations)",
     lambda r: bool(r["trainer"]["schedule"]["eval_interval"])),
    ("trainer.schedule.min_lr", "`trainer.schedule.lr_decay` cosine or linear", _decays),
    ("trainer.schedule.lr_decay_iters", "`trainer.schedule.lr_decay` cosine or linear", _decays),
    ("trainer.recompute.method", "`trainer.recompute.granularity: full`",
     lambda r: r["trainer"]["recompute"]["granularity"] == "full"),
    ("trainer.recompute.num_layers", "`trainer.recompute.granularity: full`",
     lambda r: r["trainer"]["recompute"]["granularity"] == "full"),
    ("trainer.recompute.adapter_inputs_scope", "`trainer.recompute.adapter_inputs: true`",
     lambda r: r["trainer"]["recompute"]["adapter_inputs"]),
    ("trainer.logging.profile_trace", "`trainer.logging.profile_start`",
     lambda r: r["trainer"]["logging"]["profile_start"] is not None),
    ("trainer.logging.profile_ranks", "`trainer.logging.profile_start`",
     lambda r: r["trainer"]["logging"]["profile_start"] is not None),
    ("trainer.precision.fp8_recipe", "`trainer.precision.fp8` hybrid or e4m3",
     lambda r: bool(r["trainer"]["precision"]["fp8"])),
    ("trainer.precision.fp4_recipe", "`trainer.precision.fp4: e2m1`", lambda r: bool(r["trainer"]["precision"]["fp4"])),
    ("trainer.precision.num_layers_at_start_in_bf16", "`trainer.precision.first_last_layers_bf16: true`",
     lambda r: r["trainer"]["precision"]["first_last_layers_bf16"]),
    ("trainer.precision.num_layers_at_end_in_bf16", "`trainer.precision.first_last_layers_bf16: true`",
     lambda r: r["trainer"]["precision"]["first_last_layers_bf16"]),
    ("trainer.precision.fp8_weight_cache", "`trainer.precision.fp8` or `fp4` (a BF16 run keeps no quantized weight "
     "copies)", lambda r: bool(r["trainer"]["precision"]["fp8"] or r["trainer"]["precision"]["fp4"])),
    ("trainer.lora.dropout_position", "`trainer.lora.dropout` above 0",
     lambda r: bool(r["trainer"]["lora"]["dropout"])),
    ("trainer.lora.dropout_recompute", "`trainer.lora.dropout` above 0 with `dropout_position: pre` on the fused or "
     "epilogue adapter path (`trainer.lora.fused` or `epilogue`), on a GPU at a dropout whose mask rebuilds bitwise "
     "(0.1, 0.05, 0.2 do; 0.15 only in BF16; 0.104 does not: primus_contract.dropout_rebuild)", _fused_pre_dropout),
    ("trainer.recompute.norm_output", "`trainer.lora.epilogue_norm` in effect (a GPU run with the epilogue on), and "
     "with pre-dropout `trainer.lora.dropout_recompute` in effect", _norm_recomputable),
    ("trainer.data.single_document_sbhd", "`trainer.data.packing: true` (without packing every row is one document "
     "and runs sbhd), pipeline 1 and context 1 (those run THD)", _single_document_switch),
    ("trainer.data.max_seqlen_buckets", "`trainer.data.packing: true` on a GPU (the CPU's attention reads no "
     "max_seqlen)", lambda r: r["trainer"]["data"]["packing"] and run_device(r["trainer"], r["cluster"]["env_profile"])
     != "cpu"),
    ("trainer.recompute.chunked_loss_kernel", "`trainer.recompute.chunked_loss: true`, an NVIDIA GPU and BF16 (the "
     "torch ops run elsewhere)", lambda r: r["trainer"]["recompute"]["chunked_loss"] and _nvidia_16bit(r)),
    ("trainer.precision.fp8_swiglu_kernels", "`trainer.precision.fp8_swiglu_input: true` on an NVIDIA GPU in BF16, "
     "with a dense MLP whose fc1 adapter `trainer.lora.fused_swiglu` does not fold (the fold's kernels keep their "
     "own FP8 copy), and no `trainer.recompute.activation_offload_layers` (offload keeps megatron's store)",
     _swiglu_store_unfolded),
    ("trainer.lora.triton_products", f"an NVIDIA GPU, BF16, `trainer.lora.dim` up to {LORA_KERNEL_MAX_RANK} and the "
     "fused or epilogue adapter path (the torch ops run elsewhere)", _lora_kernels),
    *((f"trainer.model.{key}", "`trainer.model.num_moe_experts`", _moe)
      for key in ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                  "moe_norm_topk_prob", "moe_router_topk_scaling_factor")),
    *((f"trainer.model.{key}", "`trainer.model.multi_latent_attention: true`", _mla)
      for key in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")),
    ("trainer.model.family", "`trainer.model.num_moe_experts` or `trainer.checkpoint.pretrained` (a dense model "
     "without a checkpoint is built from the other model keys alone)",
     lambda r: _moe(r) or bool(r["trainer"]["checkpoint"]["pretrained"])),
    *((f"cluster.container.{key}", "`cluster.container.runtime` other than none", _container)
      for key in ("image", "mounts", "workdir", "extra_args")),
    ("trainer.distributed.nccl_eager_init", "NCCL (`trainer.distributed.backend` nccl, or auto on a GPU)",
     lambda r: r["trainer"]["distributed"]["backend"] == "nccl" or (
         r["trainer"]["distributed"]["backend"] == "auto"
         and run_device(r["trainer"], r["cluster"]["env_profile"]) != "cpu")),
    ("trainer.data.validation.split", "`trainer.data.validation.path` or `hf_name`", _has_validation),
    ("trainer.data.validation.limit", "`trainer.data.validation.path` or `hf_name`", _has_validation),
    ("trainer.data.overlong", "a tokenized format (mlperf_npy packs are already tokenized and sized)", _tokenized),
    ("trainer.data.bad_records", "a tokenized format (mlperf_npy has no records to skip)", _tokenized),
    ("trainer.data.cache_dir", "a tokenized format (mlperf_npy is read as is, never cached)", _tokenized),
    ("cluster.currency", "`cluster.gpu_hour_price`", lambda r: r["cluster"]["gpu_hour_price"] is not None),
    ("cluster.container.shm_size", "`cluster.container.runtime` docker or podman (apptainer and pyxis share the "
     "host's /dev/shm)", lambda r: r["cluster"]["container"]["runtime"] in ("docker", "podman")),
)


def with_device(r: dict, device: str) -> dict:
    """The resolved recipe `r` with trainer.distributed.device set to `device` (a copy; r is left as it is)."""
    t = r["trainer"]
    return {**r, "trainer": {**t, "distributed": {**t["distributed"], "device": device}}}


def _devices(r: dict) -> list[dict]:
    """The recipe as it may run: itself where it names its device (or env profile cpu hides the GPUs), else once on
    a GPU and once on CPU (device auto on a profile that names no GPU: the node decides; the trainer passes the
    device it got, trainer/__main__.py)."""
    if run_device(r["trainer"], r["cluster"]["env_profile"]) != "auto" or r["cluster"]["env_profile"] in GPU_PROFILES:
        return [r]
    return [with_device(r, d) for d in ("cuda", "cpu")]


def inert_keys(r: dict) -> list[str]:
    """One line per key of the resolved recipe `r` that is set but does nothing here, saying what it needs (where the
    device is not known yet, a key is inert only if it does nothing on a GPU and on CPU)."""
    out = []
    runs = _devices(r)
    for key, needs, in_effect in DEPENDENT:
        value = _get(r, key)
        if value != field_at(key).default and not any(in_effect(x) for x in runs):
            shown = json.dumps(value)  # (as the recipe writes it: true, "block", 1.0)
            out.append(f"`{key}` is {shown} but does nothing without {needs}")
    return out
