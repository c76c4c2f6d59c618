"""Rules for the step's memory levers that map onto megatron-core's TransformerConfig (wired in
trainer/model/levers.py): activation offload to host memory, and the one-document-a-row layout. (CUDA graphs are not
built: docs/performance.md says why.) One definition, run by `validate`/`submit` and by the trainer at start;
what needs the node (Transformer Engine) is a machine rule (primus_contract.machine)."""
from __future__ import annotations

from primus_contract.errors import fail
from primus_contract.rules_data import sample_length
from primus_contract.rules_precision import run_device

OFFLOAD = "`trainer.recompute.activation_offload_layers`"


def offload_rules(t: dict, profile: str) -> None:
    """megatron-core's layer-level cpu_offloading (TransformerConfig.__post_init__ in 0.16.1 and 0.19.2 refuses the
    same three: N >= num_layers, pipeline > 1, any recompute granularity; its TransformerBlock asserts TE)."""
    n = t["recompute"]["activation_offload_layers"]
    if not n:
        return
    layers, rec = t["model"]["num_layers"], t["recompute"]
    if n >= layers:
        fail(f"{OFFLOAD} ({n}) must be fewer than trainer.model.num_layers ({layers}): megatron-core keeps the "
             "last layer's activations on the GPU")
    if t["parallelism"]["pipeline"] > 1:
        fail(f"{OFFLOAD} needs `trainer.parallelism.pipeline` 1 (megatron-core has no CPU offloading with pipeline "
             f"parallelism); pipeline is {t['parallelism']['pipeline']}")
    if rec["granularity"]:
        fail(f"{OFFLOAD} and `trainer.recompute.granularity` {rec['granularity']} exclude each other (megatron-core "
             "does not offload recomputed layers); set granularity: null or activation_offload_layers: 0")
    if run_device(t, profile) == "cpu":
        fail(f"{OFFLOAD} needs a GPU with Transformer Engine (TE's offload context copies on CUDA streams); "
             "`trainer.distributed.device` is cpu: set it to 0")


def layout_rules(t: dict) -> None:
    """Sequence parallelism splits the token dimension over the tensor-parallel ranks: one document a row (packing
    false) runs [S, B] through megatron-core, packed rows run as one THD row of B x S tokens; megatron asserts either
    divides. Full uniform recompute checkpoints chunks of recompute.num_layers layers of each stage, and indexes past
    the stage's last layer where they do not tile it."""
    d, par, rec = t["data"], t["parallelism"], t["recompute"]
    sample = sample_length(d["seq_length"], d["pad_to_multiple_of"])
    if par["sequence_parallel"] and sample % par["tensor"]:
        fail(f"`trainer.data.seq_length` ({sample} after pad_to_multiple_of) must be divisible by "
             f"`trainer.parallelism.tensor` ({par['tensor']}) with sequence parallelism (each row's tokens are split "
             "over the tensor-parallel ranks); set pad_to_multiple_of to a multiple of tensor")
    per = t["model"]["num_layers"] // par["pipeline"]
    if rec["granularity"] == "full" and rec["method"] == "uniform" and per % rec["num_layers"]:
        fail(f"`trainer.recompute.num_layers` ({rec['num_layers']}) must divide the {per} layers of each pipeline "
             "stage with granularity full and method uniform (megatron-core recomputes chunks of that many layers "
             "and would index past the stage's last); set a divisor, or method: block")


def adapter_inputs_rules(t: dict, profile: str) -> None:
    """recompute.adapter_inputs rewires only adapters that read their base's own input (trainer/model/lora/inputs.py):
    a dense MLP's fc2 (scope all|fc2) and, on TE's spec, the norm-fused linears (scope all|norm); where the recipe
    leaves none, it is refused here rather than accepted and ignored (the trainer's build line counts what it
    rewired)."""
    from primus_contract.rules_model import targeted_linears
    from primus_contract.rules_precision import norm_fed_targets

    rec, lora = t["recompute"], t["lora"]
    if not rec["adapter_inputs"]:
        return
    if lora["dropout"] and lora["dropout_position"] == "pre":
        fail(f"`trainer.recompute.adapter_inputs` rewires adapters that read their base's own input, and with "
             f"`trainer.lora.dropout` {lora['dropout']:g} (pre) every adapter reads its own dropped-out copy: it would "
             "rewire nothing; set adapter_inputs: false")
    scope = rec["adapter_inputs_scope"]
    fc2 = scope in ("all", "fc2") and "mlp.linear_fc2" in targeted_linears(t["model"], lora)
    norm = scope in ("all", "norm") and run_device(t, profile) != "cpu" and bool(norm_fed_targets(t))
    if not (fc2 or norm):
        fail(f"`trainer.recompute.adapter_inputs` scope {scope} would rewire nothing here: it takes a dense MLP's "
             "linear_fc2 adapter (scope all|fc2) and, on a GPU, the norm-fused linears' (qkv, fc1; scope all|norm) "
             "among `trainer.lora.target_modules`; set adapter_inputs: false")


def lever_rules(t: dict, profile: str) -> None:
    layout_rules(t)
    offload_rules(t, profile)
    adapter_inputs_rules(t, profile)
