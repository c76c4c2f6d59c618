"""Tensor-parallel communication overlap: TE userbuffers for sequence-parallel TP.

    kwargs = config_kwargs(cfg)                  # TransformerConfig flags ({} when off)
    tokens = initialize(cfg, config, device, use_te)   # the userbuffers, once, before the model is built
    check_tokens(n, tokens)                      # a micro-batch must have the buffers' token count

With sequence parallelism every TP linear all-gathers its input (column-parallel) or reduce-scatters its
output (row-parallel), in forward and again in backward; with NCCL these run between the GEMMs. TE's
userbuffers split each GEMM into chunks and move the next chunk's data while the current one multiplies
(`trainer.parallelism.tp_comm_overlap: true`).

LoRA freezes the base weights, so there is no weight-gradient GEMM: TE's default "bulk" overlaps of the
column linears' backward (the input all-gather for wgrad hidden behind dgrad, the dgrad reduce-scatter
hidden behind wgrad) have nothing to hide behind. Here the column linears' dgrad reduce-scatter is
pipelined with their own dgrad GEMM instead (qkv_dgrad / fc1_dgrad: method pipeline,
tp_comm_overlap_rs_dgrad), which is what NVIDIA's LoRA overlap configs do for fc1.

TE skips the forward all-gather overlap of a LayerNormLinear that returns its norm output, and LoRA
asks for that output unless `trainer.recompute.adapter_inputs` (scope all|norm) folds the norm into the
adapter: use both together.

The buffers have a fixed shape, [sample length x micro_batch_size, hidden] (sample length: seq_length
rounded up to data.pad_to_multiple_of): every micro-batch
(training and evaluation) must have exactly that many tokens, which packed batches do.

CUDA multicast stays off: UB_SKIPMC=1 is set unless the environment already sets it (TE then exchanges
through CUDA IPC handles; a multicast object can take a shared host's GPUs down).
"""
from __future__ import annotations

import os

from primus_contract.errors import ContractError
from primus_contract.rules_model import tp_comm_overlap_rules
from trainer.config import ConfigError

# the column linears' dgrad reduce-scatter pipelined with their dgrad GEMM (no wgrad GEMM to hide behind)
UB_CONFIG = {"qkv_dgrad": {"method": "pipeline"}, "fc1_dgrad": {"method": "pipeline"}}


def config_kwargs(cfg) -> dict:
    """megatron-core TransformerConfig flags for the recipe ({} when tp_comm_overlap is off)."""
    if not cfg.trainer.parallelism.tp_comm_overlap:
        return {}
    return dict(tp_comm_overlap=True, tp_comm_overlap_ag=True, tp_comm_overlap_rs=True,
                tp_comm_overlap_rs_dgrad=True, tp_comm_bulk_dgrad=False, tp_comm_bulk_wgrad=False,
                tp_comm_bootstrap_backend="nccl")


def initialize(cfg, config, device, use_te: bool) -> int | None:
    """Create TE's userbuffers for this recipe; returns their token count (None when off), which the caller
    keeps (trainer.model.build.BuiltModel.ub_tokens) and checks every micro-batch against."""
    if not getattr(config, "tp_comm_overlap", False):
        return None
    t = cfg.trainer
    if device.type != "cuda" or not use_te:
        raise ConfigError("trainer.parallelism.tp_comm_overlap needs a GPU with Transformer Engine (TE "
                          "userbuffers), which this process does not have: set it to false")
    try:  # what userbuffers cannot carry: the contract's rule (validate and the start check ran it already)
        tp_comm_overlap_rules(t.parallelism, t.precision, {"device": device.type})
    except ContractError as err:
        raise ConfigError(str(err).replace("`", "")) from None
    os.environ.setdefault("UB_SKIPMC", "1")
    from transformer_engine.pytorch.module import base as te_base

    from trainer.data import DataOptions

    tokens = DataOptions.from_config(cfg).sample_length * int(t.schedule.micro_batch_size)
    kwargs = dict(shape=[tokens, int(config.hidden_size)], tp_size=int(config.tensor_model_parallel_size),
                  dtype=config.params_dtype, ub_cfgs=UB_CONFIG, bootstrap_backend=config.tp_comm_bootstrap_backend)
    mode = getattr(te_base, "UserBufferQuantizationMode", None)
    if mode is not None:
        kwargs["quantization_modes"] = [mode.FP8 if config.fp8 else mode.NONE]
    else:  # TE before quantization_modes
        kwargs["use_fp8"] = bool(config.fp8)
    te_base.initialize_ub(**kwargs)
    return tokens


def check_tokens(n: int, tokens: int | None) -> None:
    """Refuse a micro-batch of `n` tokens when the userbuffers hold `tokens` (None: no userbuffers; TE would
    fail obscurely)."""
    if tokens is not None and n != tokens:
        raise ValueError(f"trainer.parallelism.tp_comm_overlap: a micro-batch of {n} tokens, but the userbuffers "
                         f"hold sample length x micro_batch_size = {tokens}; every micro-batch must be that size")


def describe(model, tokens: int) -> str:
    """The log line: buffer size and how many norm linears overlap their forward all-gather."""
    # TE's own modules only: LoRALinear forwards attribute reads to its base and would count twice
    mods = [m for m in model.modules() if vars(m).get("ub_name") and "return_layernorm_output" in vars(m)]
    blocked = sum(bool(m.return_layernorm_output) for m in mods)
    return (f"tp comm overlap | TE userbuffers | {tokens} tokens a micro-batch | norm linears with forward all-gather "
            f"overlap {len(mods) - blocked} of {len(mods)}"
            + (" (LoRA keeps their norm output: set trainer.recompute.adapter_inputs)" if blocked else "")
            + f" | UB_SKIPMC {os.environ.get('UB_SKIPMC')}")
