"""The FP8 SwiGLU store's kernels (trainer.precision.fp8_swiglu_kernels) against megatron's own store, one fc1
output at a time, on the GPU: forward and backward milliseconds by CUDA events, medians of interleaved repeats.

    python3 bench/swiglu_fp8_speed.py [--tokens 8192 --ffn 28672 --repeats 20]     # one JSON line

The default shape is the Llama2-70B's fc1 at seq 8192 (u: 8,192 x 57,344 BF16). megatron's path is its
bias_swiglu_impl with fp8_input_store (the activation, the cast it keeps; in backward the copy back to 16 bits and
swiglu_back), the one the 70B's profile of 2026-12-06 timed at ~0.9 ms forward and ~2.8 ms backward a layer
(bench/results/2026-12-06i_h200_speed/). The two are timed in the same process, alternating.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _time(fn, u, d) -> tuple[float, float]:
    import torch

    x = u.detach().requires_grad_(True)
    a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    a.record()
    y = fn(x)
    b.record()
    y.backward(d)
    c.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b), b.elapsed_time(c)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=28672)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    import torch
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    from trainer.model.swiglu_fp8 import swiglu_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    u = torch.randn(args.tokens, 1, 2 * args.ffn, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    d = torch.randn(args.tokens, 1, args.ffn, device="cuda", dtype=torch.bfloat16, generator=g)
    paths = {"megatron": lambda x: bias_swiglu_impl(x, None, True, False), "kernels": swiglu_fp8}
    times = {k: ([], []) for k in paths}
    for rep in range(args.repeats + 3):  # 3 warm-up rounds (compiles, autotune)
        for name, fn in paths.items():
            f, b = _time(fn, u, d)
            if rep >= 3:
                times[name][0].append(f)
                times[name][1].append(b)
    nbytes = u.numel()
    out = {"bench": "swiglu_fp8_speed", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "tokens": args.tokens, "ffn": args.ffn, "repeats": args.repeats}
    for name, (f, b) in times.items():
        out[name] = {"forward_ms": round(statistics.median(f), 4), "backward_ms": round(statistics.median(b), 4),
                     "forward_ms_range": [round(min(f), 4), round(max(f), 4)],
                     "backward_ms_range": [round(min(b), 4), round(max(b), 4)]}
    # bytes each path must move at least, per element of u: kernels 2 read + 1 act (half as many) + 1 FP8 forward,
    # 1 FP8 + 1 grad (half) + 2 du backward
    out["kernels_bound_tb_s"] = {"forward": round(nbytes * 4 / out["kernels"]["forward_ms"] / 1e9, 2),
                                 "backward": round(nbytes * 4 / out["kernels"]["backward_ms"] / 1e9, 2)}
    saved = (out["megatron"]["forward_ms"] + out["megatron"]["backward_ms"] - out["kernels"]["forward_ms"]
             - out["kernels"]["backward_ms"])
    out["saved_ms_per_layer"] = round(saved, 4)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
