"""Rules for the step's memory and launch levers that map onto megatron-core's TransformerConfig (wired in
trainer/model/levers.py): activation offload to host memory and CUDA graphs. One definition, run by
`validate`/`submit` and by the trainer at start; what needs the node (Transformer Engine) is a machine rule
(primus_contract.machine)."""
from __future__ import annotations

from primus_contract.errors import fail

OFFLOAD = "`trainer.recompute.activation_offload_layers`"
GRAPHS = "`trainer.distributed.cuda_graphs`"
# why no recipe can set cuda_graphs today (read in megatron-core 0.16.1 and 0.19.2, and in this trainer)
GRAPHS_NOT_BUILT = ("megatron-core captures its layer graphs from its own loop (create_cudagraphs in its pipeline "
                    "schedules, TECudaGraphHelper in megatron/training), which this trainer's step does not run, and "
                    "the adapters keep Python-side state a replayed graph skips (fp8_param's transpose release, "
                    "trainer/precision/fp8_release.py; adapter_inputs' stashed SwiGLU input, trainer/model/lora/"
                    "inputs.py; dropout from torch's default generator, trainer/model/lora/drop.py)")


def run_device(t: dict, profile: str) -> str:
    """cpu | cuda | auto: the recipe's device, with env profile cpu hiding the GPUs (as device_rules says)."""
    device = t["distributed"]["device"]
    return "cpu" if profile == "cpu" and device == "auto" else device


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


def cuda_graph_rules(t: dict, profile: str) -> None:
    if not t["distributed"]["cuda_graphs"]:
        return
    if run_device(t, profile) == "cpu":
        fail(f"{GRAPHS} needs a GPU; `trainer.distributed.device` is cpu: set it to false")
    if t["data"]["packing"]:
        fail(f"{GRAPHS} needs static shapes, and `trainer.data.packing: true` gives every batch its own document "
             "boundaries (cu_seqlens): set packing: false, or cuda_graphs: false")
    fail(f"{GRAPHS} is not built: {GRAPHS_NOT_BUILT}; set it to false")


def layout_rules(t: dict) -> None:
    """One document a row (packing false) runs [S, B] through megatron-core: sequence parallelism splits S itself."""
    d, par = t["data"], t["parallelism"]
    sample = -(-d["seq_length"] // d["pad_to_multiple_of"]) * d["pad_to_multiple_of"]
    if not d["packing"] and par["sequence_parallel"] and sample % par["tensor"]:
        fail(f"`trainer.data.seq_length` ({sample} after pad_to_multiple_of) must be divisible by "
             f"`trainer.parallelism.tensor` ({par['tensor']}) with packing false and sequence parallelism (each row "
             "is split over the tensor-parallel ranks); set pad_to_multiple_of to a multiple of tensor")


def lever_rules(t: dict, profile: str) -> None:
    layout_rules(t)
    offload_rules(t, profile)
    cuda_graph_rules(t, profile)
