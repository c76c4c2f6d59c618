"""What one GPU of a layout holds of the model: its pipeline stage's layers and linears, sharded by TP and EP.

Each linear is (short name, megatron path, in, out, uses per token) from primus_contract.flops.layer_linears (the
one table of the model's linears for FLOPs), with its tensor-parallel split: column-parallel linears shard their
output, row-parallel ones (linear_proj, linear_fc2) their input, MLA's down-projections and the router are
replicated, routed experts are split over EP ranks (num_moe_experts / expert) and TP (expert TP = tensor).
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_contract.flops import is_adapted, is_moe_layer, layer_linears

ROW_PARALLEL = ("linear_proj", "linear_fc2")
REPLICATED = ("linear_q_down_proj", "linear_kv_down_proj", "router")
# linears TE fuses with the RMSNorm in front of them (TELayerNormColumnParallelLinear): their input is the norm's
# output, which adapter_inputs (scope norm) folds into the adapter instead of keeping. MLA's up-projections are
# fused with the latent norms (its layer spec, qk_layernorm: always under MLA, trainer/model/arch.qk_norm)
NORM_FUSED = ("linear_qkv", "linear_q_up_proj", "linear_kv_up_proj")
# MLA's linears fed by the layer's separate input_layernorm (megatron's MLA spec: a plain norm, then plain linears;
# q_proj kept plain on 0.19 too, trainer/model/mla_q.py): nothing folds the norm into their adapters, and they read
# one tensor, so their adapters keep one storage a layer (tests/test_plan_mla_adapter_memory.py)
INPUT_NORM_SHARED = ("linear_q_proj", "linear_q_down_proj", "linear_kv_down_proj")


@dataclass(frozen=True)
class Linear:
    short: str
    path: str           # megatron path within the model (decoder.layers.<i>.<suffix>)
    params: float       # parameters of this linear on one GPU (all local experts together)
    in_local: float     # input features per shard
    out_local: float
    uses: int           # times per token (topk for routed experts)
    expert: bool
    norm_fed: bool      # its input is an RMSNorm output fused into the linear (dense fc1 too)
    adapted: bool


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    ep: int
    dp: int
    sp: bool
    world: int
    mbs: int
    gbs: int
    seq: int

    @property
    def micro_batches(self) -> int:
        return max(1, self.gbs // (self.mbs * self.dp))

    @property
    def seq_shard(self) -> int:
        """What sequence-dimension tensors (norm inputs, residual) are divided by: TP with SP, else 1."""
        return self.tp if self.sp else 1


def layout_of(r: dict) -> Layout:
    t, c = r["trainer"], r["cluster"]
    par = t["parallelism"]
    world = c["nodes"] * (c["nproc_per_node"] or c["gpus_per_node"] or 1)
    tp, pp, cp = par["tensor"], par["pipeline"], par["context"]
    dp = max(1, world // (tp * pp * cp))
    s = t["schedule"]
    return Layout(tp, pp, par["expert"], dp, bool(par["sequence_parallel"]), world, s["micro_batch_size"],
                  s["global_batch_size"], t["data"]["seq_length"])


def stage_layers(m: dict, pp: int, stage: int) -> range:
    per = m["num_layers"] // pp
    return range(stage * per, (stage + 1) * per)


def layer_linears_local(m: dict, lora: dict, lay: Layout, layer: int) -> list[Linear]:
    targets = lora["target_modules"] if lora["enabled"] else ()
    excludes = lora["exclude_modules"]
    out = []
    experts = m["num_moe_experts"] or 0
    for short, suffix, i, o, uses in layer_linears(m, layer):
        expert = ".experts." in f".{suffix}"
        count = experts / lay.ep if expert else 1
        if short in REPLICATED:
            il, ol = i, o
        elif short in ROW_PARALLEL:
            il, ol = i / lay.tp, o
        else:
            il, ol = i, o / lay.tp
        norm_fed = short in NORM_FUSED or (short == "linear_fc1" and suffix == "mlp.linear_fc1")
        adapted = bool(targets) and is_adapted(short, f"decoder.layers.{layer}.{suffix}", targets, excludes)
        out.append(Linear(short, suffix, count * il * ol, il, ol, uses, expert, norm_fed, adapted))
    return out


def lora_params_local(lin: Linear, rank: int) -> float:
    """Adapter parameters on one GPU: A [r, in] and B [out, r]; the split side follows the base's shard."""
    count = lin.params / (lin.in_local * lin.out_local) if lin.in_local * lin.out_local else 1
    return count * rank * (lin.in_local + lin.out_local)


def moe_layer(m: dict, layer: int) -> bool:
    return is_moe_layer(m, layer)
