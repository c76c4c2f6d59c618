"""Passes an adapter's memory-bound work makes over its linear's activations, by adapter path: the one table behind
bench/adapter_traffic.py (bytes a step, calibrated on a measured call) and the planner's adapter feature (speed.py).

At rank 16 every adapter GEMM is memory-bound: its cost is the passes over the [tokens, in] inputs and [tokens, out]
outputs (the rank-sized tensors and the factors are noise). Per wrapped linear, forward + backward:

  unfused   fwd: read x (A) + read/write y (addmm)                        in + 2 out
            bwd: read dy twice (dh, dB) + read x (dA) + write dx_a + sum   2 out + 5 in      -> (6 in, 4 out)
  fused     trainer/model/lora/fused.py (non-norm linears): dx_a added in place into the base's dx    -> (4, 4)
  epilogue  trainer/model/lora/epilogue.py (non-norm linears, TP 1, 16-bit): the adapter writes y once and the
            base GEMM adds into it (its read of y hides in a compute-bound GEMM), dy read twice (dh, dB by cuBLAS:
            the one-read Triton kernel took 2.2-2.5x their time, H100 2026-12-05), dx_a written once for the base
            dgrad GEMM to add into                                                                   -> (3, 3)
  epilogue-all  the same for every linear, the norm-fed too (trainer.lora.epilogue_norm: torch runs the norm,
                trainer/model/lora/norm_epilogue.py; fc1 under the SwiGLU fold: the fused path's tap, 4 in) -> (3, 3)
Norm-fed linears (qkv, dense fc1, MLA's q/kv up-projections: their adapter reads TE's returned norm output, or folds
the norm) stay unfused under fused/epilogue. MLA's q_proj and down-projections follow a separate norm: plain linears,
fused; the down-projections are duplicated over TP, which the epilogue refuses (LoRALinear.uses_epilogue): fused.
  fused_swiglu  fc1's output + s h B^T is never written nor re-read (trainer/model/lora/swiglu.py): fc1 out - 2
  pre-dropout   draw (read x, write the dropped copy, a 1-byte mask: 2.5 in), and in backward the mask applied:
                unfused + 2.5 in (dropout backward: read dx_a and the mask, write), fused/epilogue + 0.5 in (the
                mask read inside the pass that adds dx_a)
"""
from __future__ import annotations

from primus_contract.plan.shapes import REPLICATED

DESIGNS = ("unfused", "fused", "epilogue", "epilogue-all")


def passes(design: str, norm_fed: bool, short: str = "", swiglu: bool = False,
           dropout: bool = False) -> tuple[float, float]:
    """(passes over [tokens, in], passes over [tokens, out]) of one wrapped linear, forward + backward."""
    if design not in DESIGNS:
        raise ValueError(f"unknown adapter design {design!r} ({', '.join(DESIGNS)})")
    path = design if design == "epilogue-all" or not norm_fed else "unfused"
    if path.startswith("epilogue") and short in REPLICATED:  # MLA's duplicated down-projections: the fused path
        path = "fused"
    if path == "epilogue-all" and swiglu and short == "linear_fc1":  # folded fc1: norm_epilogue's parts, the tap
        path = "fused"
    p_in, p_out = {"unfused": (6.0, 4.0), "fused": (4.0, 4.0), "epilogue": (3.0, 3.0), "epilogue-all": (3.0, 3.0)}[path]
    if swiglu and short == "linear_fc1":
        p_out -= 2.0
    if dropout:
        p_in += 2.5 + (2.5 if path == "unfused" else 0.5)
    return p_in, p_out


def design_of(lora: dict, tp: int = 1) -> str:
    """The design a recipe's trainer.lora runs (epilogue only where the contract lets it: TP 1; with epilogue_norm
    the norm-fed linears too)."""
    if lora.get("epilogue") and tp == 1:
        return "epilogue-all" if lora.get("epilogue_norm") else "epilogue"
    return "fused" if lora.get("fused", True) else "unfused"


# The share of each path's saved bytes that showed as time on the H200 (Llama-3-8B shape, median of 3 interleaved
# repeats, bench/results/2026-12-05_h200_speed/; the plan's gain over the default against the measured one, per
# cell): fused_swiglu 0.57 / 0.51 (BF16 packed / single-document), 0.20 / 0.49 (FP8), taken as 0.45; the epilogue
# 0.15 / 0.09 (BF16), taken as 0.12. The pass counts above stay the bytes (bench/adapter_traffic.py); the rest of
# the saving is what the kernels' own work and the GEMMs beside them hide.
# The epilogue's present form (dy read twice by cuBLAS, pass counts (3, 3)) was timed on an H100 on 2026-12-06
# (bench/results/2026-12-06b_h100_speed/, `kernels`: +1.31 % single-document, +1.20 % packed over the defaults then):
# 0.5 plans +1.23 % / +1.34 % (0.12, fitted on the H200 with the one-read dh/dB kernel it no longer uses, planned
# +0.29 % / +0.32 %). No H200 row of the present form exists yet.
REALIZED = {"fused_swiglu": 0.45, "epilogue": 0.5}


def _bytes(p: tuple[float, float], lin) -> float:
    return p[0] * lin.in_local + p[1] * lin.out_local


def traffic_ratio(lora: dict, lin, tp: int = 1) -> float:
    """The planner's adapter-traffic factor of one adapted linear: its time under the recipe's epilogue /
    fused_swiglu keys over its time without them (1.0 when neither is on: the calibrated cost already holds the
    default path, so the measured rows keep their fit): each key's byte saving (the pass counts), of which REALIZED
    shows."""
    if not (lora.get("epilogue") or lora.get("fused_swiglu")) or lin.expert:
        return 1.0
    dropout = bool(lora.get("dropout")) and lora.get("dropout_position", "pre") == "pre"
    swiglu = bool(lora.get("fused_swiglu"))
    default = design_of({**lora, "epilogue": False}, tp)
    ref = _bytes(passes(default, lin.norm_fed, lin.short, False, dropout), lin)
    folded = _bytes(passes(default, lin.norm_fed, lin.short, swiglu, dropout), lin)
    now = _bytes(passes(design_of(lora, tp), lin.norm_fed, lin.short, swiglu, dropout), lin)
    ratio = 1.0 - REALIZED["fused_swiglu"] * (1.0 - folded / ref)
    return ratio * (1.0 - REALIZED["epilogue"] * (1.0 - now / folded))
