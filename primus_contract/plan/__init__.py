"""`primus-slurm plan`: predicted peak memory and speed of a resolved recipe, per GPU, before it is queued.

Standard library only (the login node has no torch). memory.py: peak memory as named terms; speed.py: step time
from primus_contract.flops; offload.py: activation offload's GPU, host and copy terms; gpus.py: the GPUs the env profiles name; calibration.py: the rates measured on the
H200 and the rows they came from; frontier.py: the layouts that fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from primus_contract.plan import calibration as cal
from primus_contract.plan.gpus import CALIBRATED_ON, GPUS, Gpu, gpu_for
from primus_contract.plan.memory import offloaded_bytes, outside_torch_gib, peak_memory
from primus_contract.plan.offload import PCIE_GB_S
from primus_contract.plan.shapes import Layout, layout_of
from primus_contract.plan.speed import precision_of, step_time
from primus_contract.rules_precision import (epilogue_norm_on, epilogue_on, fp8_attention_data_note,
                                             fp8_attention_on, fused_swiglu_on)

# the keys whose null (auto) the plan resolves for the recipe's machine, and how (what the trainer decides alike),
# with what the data may change at start
AUTO_LEVERS = (("lora", "fused_swiglu", fused_swiglu_on, None), ("lora", "epilogue", epilogue_on, None),
               ("lora", "epilogue_norm", epilogue_norm_on, None),
               ("precision", "fp8_dot_product_attention", fp8_attention_on, fp8_attention_data_note))


def auto_levers(t: dict, profile: str) -> str:
    """`section.key on|off` for each null lever of the recipe, as it will run there ('' when none is null)."""
    return ", ".join(f"{section}.{key} {'on' if on(t, profile) else 'off'}{data(t, profile) if data else ''}"
                     for section, key, on, data in AUTO_LEVERS if t[section][key] is None)


ADDED_TO_PEAK = ("allocator margin", "cuda context + nccl")  # breakdown terms outside the allocator's peak


@dataclass
class Plan:
    layout: Layout
    gpu: Gpu | None
    stage: int
    breakdown: dict            # name -> GiB (the allocator's peak terms)
    peak_gib: float            # what torch.cuda.max_memory_allocated would report
    needs_gib: float           # peak + allocator margin + context: what must fit on the GPU
    step_s: float
    time_parts: dict           # name -> seconds
    precision: str
    notes: list = field(default_factory=list)
    on_cpu: bool = False       # a CPU run: no GPU to plan for (the numbers are an H200's, for reference only)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.layout.gbs * self.layout.seq / self.step_s / self.layout.world

    @property
    def gpu_memory_gib(self) -> float | None:
        return self.gpu.memory_gib if self.gpu else None

    @property
    def fits(self) -> bool | None:
        return None if self.gpu is None else self.needs_gib <= self.gpu.memory_gib

    @property
    def largest_term(self) -> tuple[str, float]:
        return max(self.breakdown.items(), key=lambda kv: kv[1])

    def as_dict(self) -> dict:
        lay = self.layout
        return {"peak_gib": round(self.peak_gib, 2), "needs_gib": round(self.needs_gib, 2),
                "gpu": self.gpu.name if self.gpu else None,
                "gpu_memory_gib": round(self.gpu.memory_gib, 2) if self.gpu else None, "fits": self.fits,
                "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1), "step_ms": round(1000 * self.step_s, 1),
                "precision": self.precision, "on_cpu": self.on_cpu, "pipeline_stage": self.stage,
                "layout": {"tensor": lay.tp, "pipeline": lay.pp, "expert": lay.ep, "data": lay.dp,
                           "sequence_parallel": lay.sp, "micro_batch_size": lay.mbs, "world": lay.world},
                "breakdown": {k: round(v, 3) for k, v in self.breakdown.items()},
                "step_ms_parts": {k: round(1000 * v, 1) for k, v in self.time_parts.items()},
                "calibrated_on": GPUS[CALIBRATED_ON].name, "calibration_rows": [f"{f}: {label}" for f, label in
                                                                                 cal.CALIBRATION_ROWS],
                "notes": list(self.notes)}


def plan(resolved: dict) -> Plan:
    """The plan of a resolved (defaulted, checked) recipe."""
    t, c = resolved["trainer"], resolved["cluster"]
    lay = layout_of(resolved)
    gpu = gpu_for(c["env_profile"])
    notes = []
    if gpu is None:
        notes.append(f"GPU unknown (cluster.env_profile {c['env_profile']}): memory not checked; speed as on an "
                     f"{GPUS[CALIBRATED_ON].name}")
    elif gpu is not GPUS[CALIBRATED_ON] and gpu.hbm_fit_tb_s:
        notes.append(f"speed scaled from the {GPUS[CALIBRATED_ON].name} calibration by vendor peak ratios, memory-"
                     f"bound work by a bandwidth fitted on rows measured on an {gpu.name} (one shape: the 8B)")
    elif gpu is not GPUS[CALIBRATED_ON]:
        notes.append(f"speed scaled from the {GPUS[CALIBRATED_ON].name} calibration by vendor peak ratios "
                     f"(not measured on an {gpu.name})")
    on_cpu = not c["gpus_per_node"] or t["distributed"]["device"] == "cpu"
    if on_cpu:
        gpu = None
        notes = ["a CPU run: nothing to plan on a GPU (the numbers are for one H200, for reference)"]
    precision = precision_of(t)
    if precision == "fp4":
        notes.append("FP4 (not emulated) has no measured rows: its memory and speed are estimates")
    if t["recompute"]["granularity"] == "selective":
        notes.append("recompute selective: megatron's core-attention recompute; TE's fused attention keeps only "
                     "its output and statistics, so the plan counts no saving")
    if t["data"]["packing"]:
        notes.append("attention assumes documents like the benchmarks' GovReport-like packs")
    if t["recompute"]["activation_offload_layers"]:
        host = offloaded_bytes(resolved, lay) / (1 << 30)
        notes.append(f"activation offload: {t['recompute']['activation_offload_layers']} layers, {host:.1f} GiB of "
                     f"pinned host memory per GPU, copied each way every micro-batch at an assumed "
                     f"{PCIE_GB_S:g} GB/s (fitted on one H200 row)")
    levers = auto_levers(t, c["env_profile"])
    if levers and not on_cpu:
        notes.append(f"automatic levers (null) as planned here: {levers}")
    stage, terms = peak_memory(resolved, lay)
    peak = sum(terms.values())
    margin = peak * cal.ALLOCATOR_MARGIN
    breakdown = dict(terms)
    breakdown[ADDED_TO_PEAK[0]] = margin
    outside = outside_torch_gib(resolved, lay)
    breakdown[ADDED_TO_PEAK[1]] = outside
    parts = step_time(resolved, lay, gpu)
    return Plan(lay, gpu, stage, breakdown, peak, peak + margin + outside, sum(parts.values()), parts,
                precision, notes, on_cpu)
