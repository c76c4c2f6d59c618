"""Each LoRA adapter product on this GPU against the bytes it must move: which of the adapters' skinny GEMMs is
furthest from the memory bound (issue 37: in the FP8 single-document profile of 2026-12-05 the adapters' own GEMMs
took ~53 ms an iteration, ~3x what their bytes need at the H100's bandwidth; bench/results/2026-12-05c_h100_levers).

At the Llama-3-8B shape's widths (tokens 8192, rank 16, BF16, TP 1), per linear (qkv, proj, fc1, fc2) and per
product of the fused path (trainer/model/lora/fused.py):

    fwd_A   h = x A^T                 reads x                fwd_B   out += h B^T      reads and writes out
    bwd_dh  dh = dy B                 reads dy               bwd_dB  dB = dy^T h       reads dy
    bwd_dual (dh, dB) in one kernel   reads dy once          bwd_dA  dA = dh^T x       reads x
    bwd_dx  dx += dh A                reads and writes dx    *_triton  fwd_A, fwd_B, bwd_dA, bwd_dx by Triton kernels

one JSON line each: microseconds (median of --reps timings of --inner back-to-back calls, CUDA events), the bytes of
its large operand(s), the bound at the bandwidth a device copy reaches here (first row), and `of_bound` (bound /
measured: 1 is at the bound). A last row sums one iteration of the 8B (32 layers of the qkv, proj and fc2 adapters;
fc1's runs inside fused_swiglu's activation kernel) as the fused path runs them (bwd_dh and bwd_dB apart), with
bwd_dual instead, with bwd_dual and the four *_triton products instead, and the bound (dy read once).

    python3 bench/adapter_gemms.py            # GPU, ~20 s
    TRITON_INTERPRET=1 python3 bench/adapter_gemms.py --cpu     # tiny fp32 shapes in the interpreter: no timing value
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

R = 16
LAYERS = 32
LINEARS_8B = {"qkv": (4096, 6144), "proj": (4096, 4096), "fc1": (4096, 28672), "fc2": (14336, 4096)}
LINEARS_CPU = {"qkv": (40, 60), "proj": (40, 40), "fc1": (40, 260), "fc2": (130, 40)}
FUSED_PATH = ("fwd_A", "fwd_B", "bwd_dh", "bwd_dB", "bwd_dA", "bwd_dx")


def median_us(fn, reps: int, inner: int, cuda: bool) -> float:
    """Median over `reps` of the mean time of `inner` back-to-back calls, microseconds."""
    fn()
    out = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / inner)
        else:
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - t) * 1e6 / inner)
    return sorted(out)[len(out) // 2]


def copy_gb_s(dev: torch.device, n_bytes: int, reps: int, cuda: bool) -> float:
    """What a device-to-device copy reaches here (read + write), GB/s."""
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), reps, 5, cuda)
    return 2 * n_bytes / us / 1e3


def products(tokens: int, fin: int, fout: int, dtype, dev, kernels: bool) -> dict:
    """name -> (the call, the bytes of its large operands) for one adapter of width fin -> fout."""
    from trainer.model.lora.kernels import down_product, dual_grad, masked_product, weight_grad

    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, device=dev) * s).to(dtype)

    x, dy, out, dx = rnd(tokens, fin), rnd(tokens, fout), rnd(tokens, fout), rnd(tokens, fin)
    a, b, h, dh = rnd(R, fin, s=0.01), rnd(fout, R, s=0.01), rnd(tokens, R), rnd(tokens, R)
    e, bt = x.element_size(), b.t().contiguous()
    return {
        "fwd_A": (lambda: x.mm(a.t()), tokens * fin * e),
        "fwd_B": (lambda: out.addmm_(h, b.t()), 2 * tokens * fout * e),
        "bwd_dh": (lambda: dy.mm(b), tokens * fout * e),
        "bwd_dB": (lambda: dy.t().mm(h), tokens * fout * e),
        "bwd_dual": (lambda: dual_grad(dy, b, h, 2.0, kernels=kernels), tokens * fout * e),
        "bwd_dA": (lambda: dh.t().mm(x), tokens * fin * e),
        "bwd_dx": (lambda: dx.addmm_(dh, a), 2 * tokens * fin * e),
        # Triton for the other four: fwd_A and bwd_dA by the candidate kernels down_product / weight_grad (nothing
        # in training calls them yet), fwd_B and bwd_dx by masked_product without a mask (the fused path runs it
        # only with pre-dropout today): whether they beat cuBLAS
        "fwd_A_triton": (lambda: down_product(x, a, kernels=kernels), tokens * fin * e),
        "fwd_B_triton": (lambda: masked_product(h, bt, None, 0.0, out, True, kernels=kernels), 2 * tokens * fout * e),
        "bwd_dA_triton": (lambda: weight_grad(dh, x, kernels=kernels), tokens * fin * e),
        "bwd_dx_triton": (lambda: masked_product(dh, a, None, 0.0, dx, True, kernels=kernels), 2 * tokens * fin * e),
    }


def main() -> int:
    cpu = "--cpu" in sys.argv[1:]
    if not cpu and not torch.cuda.is_available():
        print(json.dumps({"bench": "adapter_gemms", "error": "no CUDA device"}))
        return 1
    from trainer.model.lora.kernels import kernels_usable

    dev = torch.device("cpu" if cpu else "cuda")
    tokens, dtype, linears = (70, torch.float32, LINEARS_CPU) if cpu else (8192, torch.bfloat16, LINEARS_8B)
    reps, inner = (3, 2) if cpu else (20, 10)
    gb_s = copy_gb_s(dev, (1 << 20) if cpu else (1 << 30), reps, not cpu)
    print(json.dumps({"bench": "adapter_gemms", "device": torch.cuda.get_device_name() if not cpu else "cpu",
                      "torch": torch.__version__, "tokens": tokens, "rank": R, "copy_gb_s": round(gb_s, 1),
                      "triton_kernels": kernels_usable(dev, R, dtype)}))
    per_iter = {"fused_path_ms": 0.0, "with_dual_ms": 0.0, "with_dual_and_triton_ms": 0.0, "bound_ms": 0.0}
    for name, (fin, fout) in linears.items():
        us, bound = {}, {}
        kernels = kernels_usable(dev, R, dtype)
        for op, (fn, n_bytes) in products(tokens, fin, fout, dtype, dev, kernels).items():
            us[op], bound[op] = median_us(fn, reps, inner, not cpu), n_bytes / gb_s / 1e3
            print(json.dumps({"bench": "adapter_gemms", "linear": name, "in": fin, "out": fout, "op": op,
                              "us": round(us[op], 1), "bytes": n_bytes, "bound_us": round(bound[op], 1),
                              "of_bound": round(bound[op] / us[op], 3)}), flush=True)
        if name == "fc1":  # fused_swiglu (the default) runs fc1's adapter inside the activation kernel
            continue
        path = sum(us[op] for op in FUSED_PATH)
        per_iter["fused_path_ms"] += path * LAYERS / 1e3
        dual = path - us["bwd_dh"] - us["bwd_dB"] + us["bwd_dual"]
        per_iter["with_dual_ms"] += dual * LAYERS / 1e3
        triton = dual + sum(us[f"{op}_triton"] - us[op] for op in ("fwd_A", "fwd_B", "bwd_dA", "bwd_dx"))
        per_iter["with_dual_and_triton_ms"] += triton * LAYERS / 1e3
        per_iter["bound_ms"] += (sum(bound[op] for op in FUSED_PATH) - bound["bwd_dB"]) * LAYERS / 1e3
    print(json.dumps({"bench": "adapter_gemms", "summary": "one 8B iteration: the qkv, proj and fc2 adapters x 32",
                      **{k: round(v, 2) for k, v in per_iter.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
