"""The LoRA adapters' memory traffic per step, by design, calibrated on a measured H200 call: why 0.95x the
adapter-free ceiling needs more than fused adapter kernels. CPU only; prints one JSON line per design.

At rank 16 every adapter GEMM is memory-bound: its cost is the bytes it streams over the [tokens, in] inputs and
[tokens, out] outputs (the rank-sized tensors and the factors are noise). Per wrapped linear, in units of
tokens x width x 2 bytes:

  unfused  fwd: read x (A) + read/write y (addmm)                       in + 2 out
           bwd: read dy twice (dh, dB) + read x (dA) + write dx_a + sum  2 out + 5 in
           (the norm-fed qkv/fc1 read TE's returned norm output; TE adds its gradient: the same passes)
  fused    trainer/model/lora/fused.py on the non-norm linears (proj, fc2): dx_a added in place into the base's
           dx (read/write once): bwd 2 out + 3 in; qkv/fc1 unchanged
  epilogue the op-fuser design (TE ops' fused linear+add, LoRAFusion): the adapter writes its output and the base
           GEMM accumulates into it (fwd in + out), dy read once for dh and dB, the adapter's dx accumulated by the
           base dgrad GEMM (bwd out + 2 in)

The bytes of the unfused design are fitted to the measured adapter cost (ours unfused step - ceiling step, same
call), giving the effective bandwidth the other designs are priced at.

    python3 bench/adapter_traffic.py [--results bench/results/2026-12-03_h200_fused/fused.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# Llama-3-8B: (in, out) of qkv, proj, fc1, fc2; norm-fed: qkv, fc1
LINEARS = {"linear_qkv": (4096, 6144, True), "linear_proj": (4096, 4096, False),
           "linear_fc1": (4096, 28672, True), "linear_fc2": (14336, 4096, False)}
LAYERS, TOKENS = 32, 8192


def passes(design: str, norm_fed: bool) -> tuple[float, float]:
    """(passes over [tokens, in], passes over [tokens, out]) of one wrapped linear, forward + backward."""
    if design == "epilogue":
        return 3, 2
    if design == "fused" and not norm_fed:
        return 4, 4
    return 6, 4


def step_bytes(design: str) -> float:
    per_layer = sum(p_in * i + p_out * o for i, o, nf in LINEARS.values() for p_in, p_out in [passes(design, nf)])
    return per_layer * TOKENS * 2 * LAYERS


def _measured(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    out = {}
    for r in rows:
        if r.get("bench") == "lora_ceiling" and r.get("docs") == "single":
            out[("ceiling", r["fp8"] or "bf16")] = r["step_ms"]
        if r.get("bench") == "trainer_throughput" and r.get("label", "").endswith("single-fused-false"):
            out[("ours", "fp8" if "fp8" in r["label"] else "bf16")] = r["ms_per_iter"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=str(Path(__file__).parent / "results/2026-12-03_h200_fused/fused.jsonl"))
    args = ap.parse_args()
    ms = _measured(Path(args.results))
    for prec, fp8 in (("bf16", "bf16"), ("fp8", "delayed")):
        ceiling, ours = ms[("ceiling", fp8)], ms[("ours", prec)]
        adapters_ms = ours - ceiling
        bw = step_bytes("unfused") / (adapters_ms / 1e3)  # bytes/s the unfused adapters achieve
        budget_ms = ceiling / 0.95 - ceiling  # what 0.95x the ceiling leaves for all the adapters
        for design in ("unfused", "fused", "epilogue"):
            gb = step_bytes(design) / 1e9
            pred = step_bytes(design) / bw * 1e3
            print(json.dumps({"bench": "adapter_traffic", "precision": prec, "design": design,
                              "adapter_gb_per_step": round(gb, 1), "effective_tb_per_s": round(bw / 1e12, 2),
                              "adapter_ms": round(pred, 1), "budget_ms_for_0.95x_ceiling": round(budget_ms, 1),
                              "x_ceiling": round(ceiling / (ceiling + pred), 3),
                              "source": os.path.relpath(args.results, Path(__file__).resolve().parent.parent)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
