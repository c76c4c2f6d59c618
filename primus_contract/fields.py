"""The recipe's keys: every key, its type, default and allowed values. The single source of defaults.

`SCHEMA` is a nested dict whose leaves are `Field`s (primus_contract.schema applies it). Both the launcher
(primus_slurm) and the trainer read it; it needs nothing outside the standard library.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# protected whatever cluster.secrets lists (HUGGING_FACE_HUB_TOKEN: the name huggingface_hub also reads the token from)
ALWAYS_SECRET = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
# (minutes and seconds 00-59, at most 8 digits of minutes or 4 of days: sbatch refuses 99:99 and 20-digit limits,
# which validate accepted: audit, 2026-12-06)
TIME_RE = re.compile(r"^(\d{1,4}-)?\d{1,2}(:[0-5]\d){0,2}$|^\d{1,8}$", re.ASCII)
MAX_STR = 4096
WANDB_NAME_RE = re.compile(r"^[^/\\#?%:\s]{1,128}$")  # W&B refuses these characters in project and entity names
FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)$", re.ASCII)


@dataclass(frozen=True)
class Field:
    kind: str  # int | float | bool | str | list | dict
    default: Any = None
    nullable: bool = False
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    pattern: re.Pattern | None = None
    item: str = "str"  # element kind for list/dict values
    help: str = ""

    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices) + (" or null" if self.nullable else "")
        what = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                "list": f"a list of {self.item}s", "dict": f"a mapping of names to {self.item}s"}[self.kind]
        if self.min is not None and self.max is not None:
            what += f" in [{self.min:g}, {self.max:g}]"
        elif self.min is not None:
            what += f" >= {self.min:g}"
        return what + (" or null" if self.nullable else "")


def _opt(kind: str, **kw) -> Field:
    return Field(kind, None, nullable=True, **kw)


# the time-limit warning's signal: never USR1 (NCCL uses it), nor TERM or INT, which a cancel, a preemption or a
# Ctrl-C also sends (the job script requeues on this signal: audit, 2026-12-06)
SIGNALS = ("USR2", "URG", "XCPU")
RUNTIMES = ("none", "docker", "podman", "pyxis", "apptainer")
PROFILES = ("none", "cpu", "mi300x", "mi355x", "h100", "h200", "b200")

MODEL = {
    "preset": Field("str", "tiny_llama", pattern=NAME_RE),
    "family": Field("str", "llama", choices=("llama", "qwen3", "deepseek")),
    "num_layers": Field("int", 2, min=1, max=1024),
    "hidden_size": Field("int", 128, min=8, max=1 << 20),
    "ffn_hidden_size": Field("int", 352, min=8, max=1 << 22),
    "num_attention_heads": Field("int", 4, min=1, max=4096),
    "num_query_groups": _opt("int", min=1, max=4096),
    "kv_channels": _opt("int", min=1, max=1 << 16),
    "vocab_size": Field("int", 512, min=2, max=1 << 24),
    "max_position_embeddings": Field("int", 1024, min=1, max=1 << 24),
    "rotary_base": Field("float", 10000.0, min=1),
    "rope_scaling": _opt("dict", item="number"),
    "norm_epsilon": Field("float", 1e-5, min=0, max=1),
    "untie_embeddings": Field("bool", True),
    "qk_layernorm": Field("bool", False),
    "num_moe_experts": _opt("int", min=1, max=4096),
    "moe_router_topk": _opt("int", min=1, max=64),
    "moe_ffn_hidden_size": _opt("int", min=1, max=1 << 20),
    "moe_shared_expert_intermediate_size": _opt("int", min=1, max=1 << 20),
    "moe_layer_freq": Field("int", 1, min=1, max=1024),
    "moe_first_k_dense": Field("int", 0, min=0, max=1024),
    "moe_norm_topk_prob": _opt("bool", help="renormalise the top-k routing weights (HF norm_topk_prob); null: the "
                                            "family's own (qwen3 true, deepseek false)"),
    "moe_router_topk_scaling_factor": _opt("float", min=0, help="routing weights times this (HF routed_scaling_factor)"),
    "multi_latent_attention": Field("bool", False),
    "q_lora_rank": _opt("int", min=1, max=1 << 16),
    "kv_lora_rank": _opt("int", min=1, max=1 << 16),
    "qk_head_dim": _opt("int", min=1, max=1 << 12),
    "qk_pos_emb_head_dim": _opt("int", min=1, max=1 << 12),
    "v_head_dim": _opt("int", min=1, max=1 << 12),
}

DATA_SOURCE = {
    "path": _opt("str"),
    "hf_name": _opt("str"),
    "split": Field("str", "train", pattern=re.compile(r"^[A-Za-z0-9_.:\[\]%-]{1,64}$")),
    "limit": _opt("int", min=1),
}

SCHEMA: dict = {
    "experiment": {
        "name": Field("str", "run", pattern=NAME_RE, help="letters, digits, '.', '_', '-'; at most 64"),
        "workspace": Field("str", "./runs"),
        "seed": Field("int", 1234, min=0, max=2**31 - 1),
        "description": Field("str", "", help="informational: kept in recipe.resolved.yaml, and the W&B run's notes "
                             "with trainer.logging.wandb"),
    },
    "cluster": {
        "executor": Field("str", "auto", choices=("auto", "slurm", "local")),
        "partition": _opt("str", pattern=NAME_RE),
        "account": _opt("str", pattern=NAME_RE),
        "qos": _opt("str", pattern=NAME_RE),
        "reservation": _opt("str", pattern=NAME_RE),
        "constraint": _opt("str"),
        "nodes": Field("int", 1, min=1, max=4096),
        "gpus_per_node": Field("int", 8, min=0, max=64),
        "nproc_per_node": _opt("int", min=1, max=256, help="processes per node; default gpus_per_node (1 on CPU)"),
        "cpus_per_task": _opt("int", min=1, max=1024),
        "mem": _opt("str", pattern=re.compile(r"^\d+[KMGT]?$", re.ASCII)),
        "time": Field("str", "04:00:00", pattern=TIME_RE, help="minutes, HH:MM:SS or D-HH:MM:SS"),
        "exclusive": Field("bool", True),
        "requeue": Field("bool", True),
        "signal": Field("str", "USR2", choices=SIGNALS),
        "signal_grace_s": Field("int", 300, min=10, max=3600),
        "extra_sbatch": Field("list", [], help="extra '--flag=value' sbatch options"),
        "env_profile": Field("str", "none", choices=PROFILES),
        "env": Field("dict", {}, item="str"),
        "secrets": Field("list", ["HF_TOKEN", "WANDB_API_KEY"], help="environment variable names passed through"),
        "python": Field("str", "python3", pattern=re.compile(r"^[A-Za-z0-9_./+-]{1,256}$"),
                        help="an interpreter name or path of letters, digits and _./+- (python3: the launcher's "
                             "own when there is no container)"),
        "entrypoint": Field("str", "trainer", pattern=re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}$"),
                            help="python module torchrun runs with -m"),
        "stall_minutes": Field("float", 30.0, min=0.1, max=10080),
        "gpu_hour_price": _opt("float", min=0, help="price of one GPU-hour: `status` and the sweep leaderboard "
                               "show each run's cost (GPU-hours x price) in cluster.currency"),
        "currency": Field("str", "USD", pattern=re.compile(r"^[A-Z]{3}$"), help="the ISO 4217 code of "
                          "gpu_hour_price (USD, EUR, ...)"),
        "container": {
            "runtime": Field("str", "none", choices=RUNTIMES),
            "image": _opt("str"),
            "mounts": Field("list", [], help="'src:dst[:ro]'"),
            "workdir": _opt("str", pattern=re.compile(r"^/[A-Za-z0-9_./+@=-]*$"), help="an absolute path"),
            "shm_size": Field("str", "64g", pattern=re.compile(r"^\d+[kmgKMG]?$", re.ASCII)),
            "extra_args": Field("list", []),
        },
    },
    "trainer": {
        "model": MODEL,
        "tokenizer": {"path": Field("str", "")},
        "data": {
            "format": Field("str", "alpaca", choices=("alpaca", "squad", "openai", "chatml", "mlperf_npy", "text")),
            "train": DATA_SOURCE,
            "validation": {**DATA_SOURCE, "split": Field("str", "validation", pattern=DATA_SOURCE["split"].pattern)},
            "seq_length": Field("int", 256, min=8, max=1 << 20),
            "packing": Field("bool", True),
            "single_document_sbhd": Field("bool", True, help="with packing, run a micro-batch whose rows hold one "
                                          "document each in plain causal sbhd attention instead of THD (exact; "
                                          "with LoRA dropout the masks fall on other tokens; ~2 % faster on an "
                                          "H100; false: always THD)"),
            "max_seqlen_buckets": Field("bool", False, help="with packing on a GPU, THD attention's max_seqlen "
                                        "rounded up to a power of two (at least 64, at most the micro-batch's "
                                        "tokens), so TE's cuDNN attention reuses a few execution graphs instead of "
                                        "building one for every new longest document; the attention stays exact "
                                        "(max_seqlen is an upper bound); timed on an H100 on 2026-12-06 at -0.2 % "
                                        "to +0.0 % (bench/results/2026-12-06g_h100_speed/), so off by default; "
                                        "false: the longest document"),
            "pad_to_multiple_of": Field("int", 1, min=1, max=4096),
            "overlong": Field("str", "truncate", choices=("truncate", "drop")),
            "bad_records": Field("str", "error", choices=("error", "skip")),
            "cache_dir": _opt("str"),
            "shuffle": Field("bool", True),
        },
        "schedule": {
            "train_iters": Field("int", 100, min=1, max=10**9),
            "micro_batch_size": Field("int", 1, min=1, max=65536),
            "global_batch_size": Field("int", 8, min=1, max=10**7),
            "lr": Field("float", 1e-4, min=0, max=10),
            "min_lr": Field("float", 0.0, min=0, max=10),
            "warmup_iters": Field("int", 0, min=0),
            "lr_decay": Field("str", "cosine", choices=("cosine", "linear", "constant")),
            "lr_decay_iters": _opt("int", min=1, help="iteration the LR decay ends at (null: train_iters); set it to "
                                   "train longer on resume without moving the schedule"),
            "weight_decay": Field("float", 0.0, min=0, max=10),
            "adam_beta1": Field("float", 0.9, min=0, max=1),
            "adam_beta2": Field("float", 0.999, min=0, max=1),
            "adam_eps": Field("float", 1e-8, min=0, max=1),
            "clip_grad": Field("float", 1.0, min=0),
            "eval_interval": _opt("int", min=1),
            "eval_iters": Field("int", 10, min=1),
            "target_eval_loss": _opt("float", min=0),
        },
        "parallelism": {
            "tensor": Field("int", 1, min=1, max=1024),
            "pipeline": Field("int", 1, min=1, max=1024),
            "context": Field("int", 1, min=1, max=1024),
            "expert": Field("int", 1, min=1, max=1024),
            "sequence_parallel": Field("bool", False),
            "tp_comm_overlap": Field("bool", False, help="overlap the tensor-parallel all-gathers / reduce-scatters "
                                     "with the GEMMs (TE userbuffers; needs sequence_parallel, a GPU and TE)"),
        },
        "precision": {
            "bf16": Field("bool", True),
            "fp8": _opt("str", choices=("hybrid", "e4m3")),
            "fp8_recipe": Field("str", "delayed", choices=("delayed", "tensorwise", "blockwise")),
            "fp4": _opt("str", choices=("e2m1",)),
            "fp4_recipe": Field("str", "nvfp4", choices=("nvfp4", "mxfp4")),
            "fp4_param": Field("bool", False),
            "fp4_param_gather": Field("bool", False),
            "fp4_emulation": Field("bool", False),
            "fp4_stochastic_rounding": Field("bool", False),
            "fp4_random_hadamard": Field("bool", False),
            "fp8_weight_cache": Field("bool", True, help="keep quantized copies of the frozen base weights "
                                      "between steps (faster; ~2 bytes/param more); false for models that barely fit"),
            "fp8_param": Field("bool", False, help="keep the frozen base weights as FP8 tensors only (quantized "
                               "once, each with a scale from its own amax: 1 byte a parameter instead of 2, no "
                               "per-step re-quantization); needs fp8; works with checkpoint.pretrained"),
            "fp8_swiglu_input": Field("bool", False, help="keep the SwiGLU input (fc1's output) for its backward "
                                      "in FP8 e4m3 instead of 16-bit (megatron activation_func_fp8_input_store): "
                                      "ffn/tp x tokens bytes a layer less; GPU only, not with adapter_inputs "
                                      "scope all|fc2. The copy saturates past 448 on every torch (torch 2.11's CUDA "
                                      "cast alone makes NaN gradients there): the kernels and fused_swiglu write "
                                      "it so, and the trainer saturates megatron's own store (experts)"),
            # trainer/model/swiglu_fp8.py: megatron's cast after the activation and its copy back to 16 bits before
            # the backward (~190 ms of the 70B's 2.9 s step on an H200, 2026-12-06) become the activation's own
            # passes; the fold's kernels (lora.fused_swiglu) keep their own copy
            # (on by default since 2026-12-07: 1.74 ms a 70B layer faster than megatron's store on an H100, and its
            # copy saturates where torch 2.11's cast makes NaN gradients)
            "fp8_swiglu_kernels": Field("bool", True, help="with fp8_swiglu_input: the dense MLPs that fused_swiglu "
                                        "does not fold write the FP8 copy in the SwiGLU's own Triton pass and read "
                                        "it in its backward (torch 2.13's saturating e4m3fn bytes on every torch), "
                                        "instead of megatron's cast and copy back; NVIDIA GPU, BF16, no "
                                        "recompute.activation_offload_layers (offload keeps megatron's store)"),
            # TE's FP8 fused attention takes bshd/sbhd only: with packing false every row is one document and the
            # trainer runs plain causal attention without PackedSeqParams (trainer/model/inputs.py)
            "fp8_dot_product_attention": Field("bool", None, nullable=True, help="attention in FP8 (TE's fused "
                                               "attention; megatron-core fp8_dot_product_attention): needs fp8 "
                                               "delayed (or tensorwise on compute capability >= 10.0), a GPU of "
                                               "compute capability >= 9.0, head dim "
                                               "128 and rows of one document (TE has none for packed THD); true: "
                                               "refused where it cannot run, and with packing plus "
                                               "data.single_document_sbhd it runs on the one-document micro-batches "
                                               "only; null (default): on wherever it can with "
                                               "trainer.data.packing false, or with packing when the train split "
                                               "holds one document in every row (the trainer sees it at start; "
                                               "`plan` says off there), off elsewhere "
                                               "(rules_precision.fp8_attention_on; context parallelism 1; 8B FP8 "
                                               "one-document, median of 3: +4.5 % on an H200, +3.8 / +4.3 % on an "
                                               "H100, 2026-12-06; real-text loss within spread)"),
            "first_last_layers_bf16": Field("bool", False),
            "num_layers_at_start_in_bf16": Field("int", 1, min=0),
            "num_layers_at_end_in_bf16": Field("int", 1, min=0),
        },
        "lora": {
            "enabled": Field("bool", True),
            "dim": Field("int", 16, min=1, max=65536),
            "alpha": Field("float", 32.0, min=0),
            "dropout": Field("float", 0.0, min=0, max=0.99),
            "dropout_position": Field("str", "pre", choices=("pre", "post")),
            "a_init": Field("str", "xavier", choices=("xavier", "kaiming")),
            "b_init": Field("str", "zero", choices=("zero",)),
            "target_modules": Field("list", ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]),
            "exclude_modules": Field("list", []),
            "fused": Field("bool", True, help="two autograd nodes per adapter, its input gradient added in place "
                           "into the frozen base's (trainer/model/lora/fused.py): linear_proj/linear_fc2 and other "
                           "non-norm linears, any TP/SP layout, pre-dropout fused into A; elsewhere the unfused path"),
            "dropout_recompute": Field("bool", True, help="with pre-dropout on the fused and epilogue paths, an "
                                       "adapter keeps its input and the mask's bits (8 to a byte) instead of the "
                                       "dropped copy and a byte mask, and recomputes the dropped copy in backward, "
                                       "bitwise the same (trainer/model/lora/drop.py): 3 bytes an element become "
                                       "0.125 where the input is kept anyway (linear_proj's attention output), else "
                                       "2.125 (Llama2-70B, dropout 0.1 on qkv/proj: 0.23 GiB less a kept layer); "
                                       "on a GPU only at a dropout whose mask rebuilds bitwise for the input's dtype "
                                       "(0.1 does; 0.15 in BF16 only; 0.104 does not: "
                                       "primus_contract.dropout_rebuild)"),
            "triton_products": Field("bool", True, help="the fused and epilogue paths' unmasked rank-r products "
                                     "(y += s h B^T, dx += dh A) as one Triton pass each on NVIDIA GPUs in BF16 "
                                     "instead of cuBLAS's addmm_ (trainer/model/lora/kernels.py masked_product); "
                                     "elsewhere torch's GEMMs (H100 8B, 2026-12-06, median of 3: +0.4 % "
                                     "single-document, +0.3 % packed in BF16; FP8 not separated, +0.03 % / +0.1 %; "
                                     "real-text loss within the reseeded run's spread)"),
            # trainer/model/lora/swiglu.py: fc1's output + s h B^T is never written (Triton on a GPU, the unfused
            # ops on CPU); not with recompute.adapter_inputs scope all|fc2; with precision.fp8_swiglu_input its
            # kernels keep fc1's output in FP8
            "fused_swiglu": Field("bool", None, nullable=True, help="fold fc1's adapter into dense MLPs' SwiGLU "
                                  "kernels; null (default): wherever it applies, elsewhere the unfused path "
                                  "(rules_precision.fused_swiglu_on) "
                                  "(H200 8B, 2026-12-05: +2.4 % BF16 single-document, +2.9 % packed, +3.0 % / +1.3 % "
                                  "FP8; median of 3; real-text loss within the reseeded run's spread, H100)"),
            # trainer/model/lora/epilogue.py: not with fp4, FP8 blockwise, tensor > 1, post-dropout (rules_model.py)
            "epilogue": Field("bool", None, nullable=True, help="one node owns each non-norm linear's frozen base "
                              "GEMM: it adds into the adapter's product (beta 1), pre-dropout is fused into A "
                              "(trainer/model/lora/epilogue.py); TP 1; 16/32-bit base GEMMs, or FP8 delayed/"
                              "tensorwise on NVIDIA (the module's FP8 GEMMs through Transformer Engine's "
                              "functional linear, trainer/model/lora/base_gemm.py); true: refused where "
                              "it cannot run; null (default): on for BF16 and FP8 delayed/tensorwise on NVIDIA GPUs "
                              "where a linear can take it, off elsewhere (rules_precision.epilogue_on) (H100 8B, "
                              "2026-12-06, median of 3: BF16 +1.3 % single-document, +1.2 % packed; FP8 +2.6-3.4 % / "
                              "+1.2-4.1 %; real-text loss within the reseeded run's spread)"),
            "epilogue_norm": Field("bool", None, nullable=True, help="the epilogue (where it is on) also owns the "
                                   "norm-fed linears (qkv; fc1, folded or not): torch runs Transformer Engine's fused "
                                   "input norm, then the epilogue node (fc1 under the SwiGLU fold: the fused path's "
                                   "tap), so the adapter's input gradient is added in the dgrad GEMM, not in a "
                                   "separate pass (trainer/model/lora/norm_epilogue.py); GPU runs only; true: refused "
                                   "where it cannot run; null (default): wherever the epilogue is on, unless "
                                   "recompute.adapter_inputs scope all|norm folds the norm into A "
                                   "(rules_precision.epilogue_norm_on) (H100 8B BF16, 2026-12-06, median of 3: +0.95 % "
                                   "single-document, +0.84 % packed; real-text loss within the reseeded run's spread "
                                   "on an H200, 2026-12-06)"),
        },
        "recompute": {
            "granularity": _opt("str", choices=("full", "selective")),
            "method": Field("str", "uniform", choices=("uniform", "block")),
            "num_layers": Field("int", 1, min=1),
            "adapter_inputs": Field("bool", False, help="adapters keep only what the frozen base keeps anyway (fc2: "
                                    "SwiGLU recomputed from fc1's output; RMSNorm linears: norm folded into A): "
                                    "Llama-3-8B at 8192 tokens 50.4 -> 39.4 GiB, ~5 % slower in bf16, ~8 % in FP8"),
            "norm_output": Field("bool", False, help="the norm epilogue's adapters (qkv, fc1 where "
                                 "trainer.lora.epilogue_norm runs) keep the norm's input, which the norm keeps for its "
                                 "own backward anyway, instead of the norm's output, and run the norm again in "
                                 "backward for dA, bitwise the same (trainer/model/lora/norm_epilogue.py): hidden x 2 "
                                 "bytes a token less per norm-fed adapter, one norm pass more; with pre-dropout only "
                                 "with trainer.lora.dropout_recompute"),
            "chunked_loss": Field("bool", True, help="output layer + cross-entropy a chunk of tokens at a time with "
                                  "the input gradient computed in forward (frozen output layer): the [tokens, "
                                  "vocab] logits are never kept (Llama-3-8B at 8192 tokens: 53.7 -> 50.4 GiB, "
                                  "~3 % slower)"),
            "chunked_loss_kernel": Field("bool", True, help="with chunked_loss, each chunk's softmax cross-entropy "
                                         "and its logit gradient in two Triton passes over the bf16 logits "
                                         "(trainer/model/ce_kernel.py) instead of ~10 fp32 torch passes, on NVIDIA "
                                         "GPUs in BF16 (elsewhere torch's ops) (H100 8B, 2026-12-06, median of 3: "
                                         "+2.5 % BF16, +2.7 % / +3.1 % FP8 single-document / packed; real-text loss "
                                         "within the reseeded run's spread)"),
            # megatron-core's layer-level cpu_offloading (TE's offload context, both 0.16.1 and 0.19.2): the saved
            # tensors of the first N layers go to pinned host memory in forward and come back in backward
            "activation_offload_layers": Field("int", 0, min=0, max=1 << 20, help="offload the activations of "
                                               "this many transformer layers to host memory, overlapped with "
                                               "compute (0: none); fewer than num_layers, not with granularity "
                                               "or pipeline > 1; GPU with TE; not yet measured on a GPU"),
            "adapter_inputs_scope": Field("str", "all", choices=("all", "fc2", "norm"),
                                          help="which adapters adapter_inputs rewires: fc2 (SwiGLU recompute, "
                                          "ffn/tp x tokens x 2 bytes a layer) or norm (RMSNorm linears, 2 x "
                                          "hidden/tp x tokens x 2 bytes a layer)"),
        },
        "checkpoint": {
            "save_interval": _opt("int", min=1),
            "keep_last": Field("int", 2, min=1, max=1000),
            "resume": Field("str", "auto", choices=("auto", "never")),
            "pretrained": _opt("str"),
            "disable_last_saving": Field("bool", False),
            "export_peft": Field("bool", True),
        },
        "logging": {
            "log_interval": Field("int", 1, min=1),
            "log_avg_skip_iterations": Field("int", 2, min=0),
            "tensorboard": Field("bool", False, help="scalars of every log and eval line to <run_dir>/tensorboard/"
                                 "attempt-<N>/ (trainer/observability/tracking.py)"),
            "wandb": {  # rank 0 logs to W&B when project is set; the run id is kept in <run_dir>/wandb/run-id
                "project": _opt("str", pattern=WANDB_NAME_RE, help="a W&B project name (no / \\ # ? % :)"),
                "entity": _opt("str", pattern=WANDB_NAME_RE, help="a W&B team or user name (no / \\ # ? % :)"),
                "name": _opt("str", help="the W&B run's display name (null: the run directory's name)"),
                "tags": Field("list", []),
                "group": _opt("str", pattern=WANDB_NAME_RE, help="the W&B group of the run (a sweep sets its "
                              "id here: its trials are one group)"),
                "mode": _opt("str", choices=("online", "offline"), help="null: online; offline writes the run "
                             "under <run_dir>/wandb/ without network (`wandb sync` uploads it later)"),
            },
            "profile_start": _opt("int", min=1, help="first iteration to run under torch.profiler"),
            "profile_end": _opt("int", min=1, help="last profiled iteration (default: profile_start)"),
            "profile_ranks": Field("list", [0], item="int"),
            "profile_trace": Field("bool", False, help="also write a chrome trace (large for big models)"),
        },
        "distributed": {
            "device": Field("str", "auto", choices=("auto", "cpu", "cuda")),
            "backend": Field("str", "auto", choices=("auto", "nccl", "gloo")),
            "timeout_minutes": Field("float", 30.0, min=0.05, max=1440),
            # true: init_process_group(device_id=...), and torch makes each NCCL communicator when its group is
            # made (megatron makes 20 groups, world size 1: 8.9 GiB outside PyTorch on an H100). false (default):
            # a communicator at its group's first collective (0.73 GiB; bench/results/2026-12-05c_h100_levers/)
            "nccl_eager_init": Field("bool", False, help="make every NCCL communicator when its process group is "
                                     "made (~0.4 GiB of GPU memory each, megatron makes ~20); false: at the "
                                     "group's first collective (bench/nccl_groups_memory.py)"),
        },
    },
}


# the pipeline after training: each step its own job (primus_contract/rules_pipeline.py checks the steps)
SCHEMA["after"] = Field("list", [], item="step", help="steps run after training: eval, export, generate")

# keys that were accepted once and did nothing: refused as unknown, with what to do instead
REMOVED = {
    "trainer.logging.wandb_project": "it is `trainer.logging.wandb.project` now (with entity, name, tags, mode)",
}
