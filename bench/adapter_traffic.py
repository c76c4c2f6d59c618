"""The LoRA adapters' memory traffic per step, by design, calibrated on a measured H200 call: why 0.95x the
adapter-free ceiling needs more than fused adapter kernels. CPU only; prints one JSON line per design.

The pass counts per wrapped linear and design are primus_contract/plan/adapter_passes.py's (the planner prices
trainer.lora.epilogue and fused_swiglu with the same table): unfused, fused (trainer/model/lora/fused.py), epilogue
(trainer/model/lora/epilogue.py: proj/fc2 only, the norm-fed qkv/fc1 stay unfused), each with and without
fused_swiglu (fc1's output never written), and epilogue-all (every linear, the norm-fed too: lora.epilogue_norm).
The bytes of the unfused design are fitted to the measured adapter cost (ours unfused step - ceiling step, same call), giving the
effective bandwidth the other designs are priced at. --shape 70b prices the MLPerf 70B recipe's adapters (qkv/proj,
80 layers, pre-dropout with --dropout) at that bandwidth (FP8's; no 70B calibration).

    python3 bench/adapter_traffic.py [--results bench/results/2026-12-03_h200_fused/fused.jsonl] [--shape 70b --dropout]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from primus_contract.plan.adapter_passes import passes  # noqa: E402

# (in, out, norm-fed) of qkv, proj, fc1, fc2; the linears LoRA wraps
SHAPES = {
    "8b": {"layers": 32, "tokens": 8192, "targets": ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"),
           "linears": {"linear_qkv": (4096, 6144, True), "linear_proj": (4096, 4096, False),
                       "linear_fc1": (4096, 28672, True), "linear_fc2": (14336, 4096, False)}},
    "70b": {"layers": 80, "tokens": 8192, "targets": ("linear_qkv", "linear_proj"),
            "linears": {"linear_qkv": (8192, 10240, True), "linear_proj": (8192, 8192, False)}},
}
VARIANTS = (("unfused", False), ("fused", False), ("fused", True), ("epilogue", False), ("epilogue", True),
            ("epilogue-all", True))


def step_bytes(design: str, swiglu: bool = False, dropout: bool = False, shape: str = "8b") -> float:
    sh = SHAPES[shape]
    per_layer = 0.0
    for name in sh["targets"]:
        i, o, nf = sh["linears"][name]
        p_in, p_out = passes(design, nf, name, swiglu, dropout)
        per_layer += p_in * i + p_out * o
    return per_layer * sh["tokens"] * 2 * sh["layers"]


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
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--dropout", action="store_true", help="pre-dropout on every adapter (the MLPerf recipes)")
    args = ap.parse_args()
    ms = _measured(Path(args.results))
    for prec, fp8 in (("bf16", "bf16"), ("fp8", "delayed")):
        ceiling, ours = ms[("ceiling", fp8)], ms[("ours", prec)]
        bw = step_bytes("unfused") / ((ours - ceiling) / 1e3)  # bytes/s the 8B's unfused adapters achieve
        budget_ms = ceiling / 0.95 - ceiling  # what 0.95x the 8B ceiling leaves for all the adapters
        for design, swiglu in VARIANTS:
            if args.shape == "70b" and swiglu:
                continue  # no fc1 adapter there
            b = step_bytes(design, swiglu, args.dropout, args.shape)
            pred = b / bw * 1e3
            row = {"bench": "adapter_traffic", "shape": args.shape, "precision": prec, "design": design,
                   "fused_swiglu": swiglu, "dropout": args.dropout, "adapter_gb_per_step": round(b / 1e9, 1),
                   "effective_tb_per_s": round(bw / 1e12, 2), "adapter_ms": round(pred, 1),
                   "source": os.path.relpath(args.results, Path(__file__).resolve().parent.parent)}
            if args.shape == "8b" and not args.dropout:
                row.update({"budget_ms_for_0.95x_ceiling": round(budget_ms, 1),
                            "x_ceiling": round(ceiling / (ceiling + pred), 3)})
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
