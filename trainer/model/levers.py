"""TransformerConfig kwargs of the step's levers that primus_contract/rules_levers.py admits, and the attention
layout the model is built for.

* `trainer.recompute.activation_offload_layers: N` -> megatron-core's layer-level CPU offloading
  (`cpu_offloading`, `cpu_offloading_num_layers`, `cpu_offloading_activations`, `cpu_offloading_weights`: the same
  fields in 0.16.1 and 0.19.2). Its TransformerBlock runs each layer inside TE's offload context
  (`get_cpu_offload_context`): every tensor the layer saves for backward (TE >= 2.10: >= 256k elements, not a
  Parameter, on the GPU; the adapters' saves included, through autograd's saved-tensor hooks) is copied to pinned
  host memory on a side stream and copied back before the layer's backward; the frozen weights stay. Activations
  only: `cpu_offloading_weights` false. megatron-core refuses it with recompute and pipeline parallelism, and
  without TE (the contract says so first). The 70B on one H200 ran 3.5 % under block-60 recompute with it
  (bench/results/2026-12-06c_h200_speed/).
* The attention layout (trainer.model.inputs.attention_layout) is recorded on the model, and whether FP8
  attention follows each micro-batch's layout (auto with fp8_dot_product_attention true).
"""
from __future__ import annotations

from trainer.config import ConfigError
from trainer.model.inputs import BUCKETS_ATTR, FP8_ATTENTION_ATTR, LAYOUT_ATTR, attention_layout

FP8_ATTENTION_BUILT_ATTR = "primus_fp8_attention_built"
OFFLOAD_FIELDS = ("cpu_offloading", "cpu_offloading_num_layers", "cpu_offloading_activations",
                  "cpu_offloading_weights")


def offload_kwargs(cfg) -> dict:
    """cpu_offloading kwargs of trainer.recompute.activation_offload_layers ({} when 0). TE on a GPU is the machine
    rule primus_contract.machine.offload_error, checked at start (megatron's TransformerBlock asserts it too)."""
    n = int(cfg.trainer.recompute.activation_offload_layers)
    if not n:
        return {}
    from megatron.core.transformer.transformer_config import TransformerConfig

    missing = [f for f in OFFLOAD_FIELDS if f not in TransformerConfig.__dataclass_fields__]
    if missing:
        raise ConfigError(f"trainer.recompute.activation_offload_layers needs megatron-core's TransformerConfig "
                          f"field(s) {', '.join(missing)}, which the installed megatron-core lacks")
    return {"cpu_offloading": True, "cpu_offloading_num_layers": n, "cpu_offloading_activations": True,
            "cpu_offloading_weights": False}


def offloads(config) -> bool:
    return bool(getattr(config, "cpu_offloading", False))


def mark_layout(model, cfg) -> str:
    """Record the attention layout the batches are given in (trainer.model.inputs reads it), whether THD's max_seqlen
    is bucketed, and on an 'auto' model built with FP8 attention that it follows each micro-batch's layout
    (inputs.follow_layout)."""
    layout = attention_layout(cfg)
    setattr(model, LAYOUT_ATTR, layout)
    # (THD's max_seqlen, inputs.py; a run resolved before the key existed: off, its default)
    setattr(model, BUCKETS_ATTR, bool(cfg.trainer.data.get("max_seqlen_buckets", False)))
    config = getattr(model, "config", None)
    fp8_attention = bool(getattr(config, "fp8_dot_product_attention", False))
    setattr(model, FP8_ATTENTION_BUILT_ATTR, fp8_attention)
    setattr(model, FP8_ATTENTION_ATTR, layout == "auto" and fp8_attention)
    return layout


def fp8_attention_built(model) -> bool:
    """The model was built with TE's FP8 attention (per micro-batch in the 'auto' layout): the checkpoint's metadata
    records it (`fp8_attention`), since null may turn it on from the data (trainer.precision.follow_data)."""
    return bool(getattr(model, FP8_ATTENTION_BUILT_ATTR, False))
