"""Build the megatron-core GPTModel from the resolved recipe, with LoRA applied.

    built = build(cfg, device, prec)   # BuiltModel: the model, the transforms' log lines, the userbuffers' size
    model = build_model(cfg, device)   # the model alone

TransformerConfig comes from cfg.trainer.model (Llama family: GQA, RoPE, RMSNorm, SwiGLU, no biases,
untied embeddings; MoE / MLA / RoPE scaling keywords from trainer.model.arch), cfg.trainer.parallelism,
cfg.trainer.recompute (activation offload: trainer.model.levers) and cfg.trainer.precision (merged
with trainer.precision.transformer_config_kwargs of the resolved precision). The layer spec is TE's
on a GPU with Transformer Engine, megatron's local spec + SDPACoreAttention otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from trainer import precision
from trainer.config import ConfigError
from trainer.model import arch, levers, specs, tp_overlap
from trainer.model.transforms import BuildContext, apply_transforms
from trainer.precision import Precision, fp8_params, weight_cache


def _recompute_kwargs(rcfg) -> dict:
    gran = rcfg.granularity
    if gran in (None, "none", False):
        return {}
    if gran == "full":
        return {"recompute_granularity": "full", "recompute_method": rcfg.method or "uniform",
                "recompute_num_layers": int(rcfg.num_layers or 1)}
    if gran == "selective":
        return {"recompute_granularity": "selective"}
    raise ValueError(f"trainer.recompute.granularity must be null|full|selective, got {gran!r}")


def make_transformer_config(cfg, device: torch.device, use_te: bool, prec: Optional[Precision] = None):
    """TransformerConfig for the recipe; fusions only where their kernels exist (GPU). `prec`: the run's
    resolved precision (None: resolved here)."""
    m, par, pcfg = cfg.trainer.model, cfg.trainer.parallelism, cfg.trainer.precision
    if int(par.context) > 1:  # (validate refuses it too; a hand-edited resolved recipe ends here)
        raise ConfigError("trainer.parallelism.context > 1 is not supported yet: packed (THD) batches are not "
                          "split across context-parallel ranks; use 1")
    bf16 = bool(pcfg.bf16)
    dtype = torch.bfloat16 if bf16 else torch.float32
    on_gpu = device.type == "cuda"
    if pcfg.fp8_swiglu_input and not on_gpu:  # megatron-core's unfused (CPU) SwiGLU would silently ignore it
        raise ConfigError("trainer.precision.fp8_swiglu_input needs the GPU's fused SwiGLU; this run is on "
                          f"{device.type}: set it to false")
    kwargs = dict(
        num_layers=int(m.num_layers), hidden_size=int(m.hidden_size),
        ffn_hidden_size=int(m.ffn_hidden_size), num_attention_heads=int(m.num_attention_heads),
        num_query_groups=int(m.num_query_groups or m.num_attention_heads),
        kv_channels=int(m.kv_channels) if m.kv_channels else None,
        normalization="RMSNorm", layernorm_epsilon=float(m.norm_epsilon),
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=False, qk_layernorm=arch.qk_norm(m),
        hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=int(par.tensor), pipeline_model_parallel_size=int(par.pipeline),
        context_parallel_size=int(par.context), expert_model_parallel_size=int(par.expert),
        sequence_parallel=bool(par.sequence_parallel) and int(par.tensor) > 1,
        bf16=bf16, params_dtype=dtype, pipeline_dtype=dtype,
        use_cpu_initialization=not on_gpu, perform_initialization=True,
        bias_activation_fusion=on_gpu, masked_softmax_fusion=False, persist_layer_norm=on_gpu,
        bias_dropout_fusion=on_gpu, apply_rope_fusion=use_te, gradient_accumulation_fusion=False,
        cross_entropy_loss_fusion=on_gpu,
        # megatron's own fused cross-entropy: 0.19 warns that TE's "has known stability issues" and Megatron-LM's
        # argument check refuses it (audit, 2026-12-06); used only with trainer.recompute.chunked_loss false
        cross_entropy_fusion_impl="native",
        # our objective is already divided by the global batch's loss tokens (trainer/step/loss.py):
        # megatron's pipeline schedule must not rescale it by micro-batch count or token count
        calculate_per_token_loss=True,
        batch_p2p_comm=on_gpu,  # batched isend/irecv needs torch.cuda.synchronize
        # TE keeps FP8/FP4 copies of the frozen base weights between steps unless told not to
        disable_parameter_transpose_cache=not bool(pcfg.fp8_weight_cache),
        # the SwiGLU input kept in FP8 for its backward (megatron's fused bias_swiglu; refused on CPU by the contract)
        activation_func_fp8_input_store=bool(pcfg.fp8_swiglu_input),
    )
    kwargs.update(arch.moe_kwargs(m, use_te, on_gpu, par))
    kwargs.update(arch.mla_kwargs(m))
    kwargs.update(_recompute_kwargs(cfg.trainer.recompute))
    kwargs.update(levers.offload_kwargs(cfg))
    kwargs.update(precision.transformer_config_kwargs(prec or precision.resolve(cfg)))
    kwargs.update(tp_overlap.config_kwargs(cfg))
    return arch.config_class(m)(**kwargs)


def _require_input_grads(model) -> None:
    """With a frozen embedding, make the decoder input require grad so recompute (autograd
    Functions that only backprop when an input requires grad) still reaches the adapters."""
    emb = getattr(model, "embedding", None)
    if emb is None:
        return

    def hook(_module, _inputs, output):
        if isinstance(output, torch.Tensor) and not output.requires_grad and torch.is_grad_enabled():
            output.requires_grad_(True)
        return output

    emb.register_forward_hook(hook)


@dataclass(frozen=True)
class BuiltModel:
    """The built model and what its transforms decided: `lines` is ((transform name, log line or None), ...) of
    the transforms that applied, in order; `ub_tokens` the TE userbuffers' token count (None: no
    tp_comm_overlap), which every micro-batch must have (trainer.model.tp_overlap.check_tokens)."""
    model: torch.nn.Module
    precision: Precision
    lines: tuple = ()
    ub_tokens: Optional[int] = None

    def line(self, name: str) -> Optional[str]:
        """The log line of transform `name` (None: it did not apply, or had nothing to say)."""
        return dict(self.lines).get(name)

    @property
    def log_lines(self) -> list[str]:
        return [line for _, line in self.lines if line]


def build(cfg, device: torch.device, prec: Optional[Precision] = None) -> BuiltModel:
    """GPTModel on `device`, the base frozen and LoRA adapters trainable, with every transform of
    trainer.model.transforms applied. `prec`: the run's resolved precision (None: resolved here)."""
    device = torch.device(device)
    prec = prec or precision.resolve(cfg)
    use_te = specs.te_available(device)
    if device.type == "cpu":
        from trainer.model import cpu_compat

        cpu_compat.install()
    config = make_transformer_config(cfg, device, use_te, prec)
    weight_cache.configure(cfg.trainer.precision.fp8_weight_cache)  # the FP4 payload copies follow TE's (above)
    ub_tokens = tp_overlap.initialize(cfg, config, device, use_te)  # before TE's linears are built
    with fp8_params.init_context(config):
        model = _gpt_model(config, cfg.trainer.model, device, int(cfg.experiment.seed))
    model.to(device)
    lines = apply_transforms(model, BuildContext(cfg, config, device, prec, ub_tokens))
    model.to(device)
    levers.mark_layout(model, cfg)
    # recompute, and TE's offload sync (it hooks each layer's output), need a decoder input that requires grad
    if config.recompute_granularity is not None or levers.offloads(config):
        _require_input_grads(model)
    return BuiltModel(model, prec, lines, ub_tokens)


def build_model(cfg, device: torch.device, prec: Optional[Precision] = None):
    """build(...)'s model alone."""
    return build(cfg, device, prec).model


def _gpt_model(config, m, device, seed: int):
    """GPTModel for this pipeline stage; every layer's init seeded from `seed` (trainer.model.seeding)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    return GPTModel(
        config=config, transformer_layer_spec=specs.block_spec(config, m, device, seed),
        vocab_size=int(m.vocab_size), max_sequence_length=int(m.max_position_embeddings),
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
        parallel_output=True, share_embeddings_and_output_weights=not bool(m.untie_embeddings),
        position_embedding_type="rope", rotary_base=float(m.rotary_base), **arch.gpt_rope_kwargs(m))
