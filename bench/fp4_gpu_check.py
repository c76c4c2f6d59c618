"""GPU check of the FP4 work (run on a CUDA machine with Transformer Engine >= 2.9; prints one JSON object).

    python bench/fp4_gpu_check.py [--out bench/results/fp4_gpu_check.json] [--quick]

Sections (each catches and reports its own exception, so one failure does not hide the rest):
  env            torch / TE / GPU
  nvfp4_bitexact ours vs TE's NVFP4QuantizerRef._quantize: packed E2M1 codes, E4M3 scales, amax, rowwise and
                 columnwise (RHT on/off, 1x16 and 16x16 tiles), random shapes + amax edge cases; both our
                 pure-torch reference (on GPU) and the fused Triton kernel. "mismatches" must be 0 everywhere.
  mxfp4_triton   Triton MXFP4 vs our OCP-MX reference, bit for bit
  timing_ms      fwd+bwd of an 8192x4096x4096 linear (x:[8192,4096], W:[4096,4096]):
                 "frozen_*": W frozen as LoRA trains it (fprop + dgrad; the weight's FP4 copy is cached);
                 the older keys: W trainable (fprop + dgrad + wgrad, re-quantized every step).
                 bf16 torch/TE GEMMs vs our FP4 emulation (local autograd path and TE CustomRecipe path).
                 "ratio_vs_bf16" (headline, the number the issue bounds at <= 2) is the frozen-weight
                 ratio of the path the trainer takes on this machine ("headline" names it).
  (the TE sections below live in bench/fp4_gpu_check_te.py; the test tensors and TE autocast both use are in
  bench/fp4_gpu_common.py)
  te_custom_vs_ref  te.Linear output/grads with our factory vs TE's reference factory (same quantization,
                 different GEMM accumulation order): relative differences, expected ~1e-3 or below.
  te_frozen_layernorm_linear  te.LayerNormLinear with a FROZEN weight (as megatron + LoRA run it:
                 return_layernorm_output, is_first_microbatch True then False, a forward whose backward
                 never runs) then fwd+bwd; our factory vs TE's reference factory and bf16.
  te_payload_exact  our quantizers' bf16 payloads == decoded TE NVFP4QuantizerRef codes x block scales.
  mcore_gpt_te   trainer.model.build_model (megatron-core GPT, TE layer spec, LoRA, fp4 emulation kwargs)
                 on this GPU: which quantizer class TE built, and 3 fwd+bwd steps with finite losses.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from fp4_gpu_check_te import (  # noqa: E402
    mcore_gpt_te, te_custom_vs_ref, te_frozen_layernorm_linear, te_payload_exact,
)
from fp4_gpu_common import te_autocast, test_tensors  # noqa: E402


def section(results: dict, name: str):
    def wrap(fn):
        t0 = time.time()
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - report, keep going
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        if isinstance(results[name], dict):
            results[name]["seconds"] = round(time.time() - t0, 2)
        return fn
    return wrap


def env_info():
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
            "cc": list(torch.cuda.get_device_capability(0))}
    try:
        import transformer_engine

        info["te"] = getattr(transformer_engine, "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        info["te"] = f"not importable: {exc}"
    return info


def nvfp4_bitexact(quick: bool):
    from transformer_engine.pytorch.custom_recipes import reference_utils
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef

    from trainer.precision import fp4_triton, nvfp4

    def same(a, b):
        if a is None or b is None:
            return a is b
        is_scale = a.dtype == torch.float8_e4m3fn
        a = a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a
        b = b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b
        if is_scale and a.shape == b.shape and not torch.equal(a, b):
            # E4M3 NaN is 0x7F or 0xFF depending on the platform's NaN sign; treat both as the same NaN
            a, b = torch.where((a & 0x7F) == 0x7F, 0x7F, a), torch.where((b & 0x7F) == 0x7F, 0x7F, b)
        if a.dtype == torch.float32:   # amax: bit for bit, except that any NaN equals any NaN (payload bits vary)
            if a.shape == b.shape and bool((a.isnan() == b.isnan()).all()) and bool(a.isnan().any()):
                a, b = a.nan_to_num(7.0), b.nan_to_num(7.0)
            a, b = a.view(torch.int32), b.view(torch.int32)
        return a.shape == b.shape and bool(torch.equal(a, b))

    rows, total, bad = [], 0, 0
    for name, x in test_tensors(quick):
        for tile, rht in (((1, 16), False), ((1, 16), True), ((16, 16), False)):
            total += 1
            entry = {"case": name, "tile": list(tile), "rht": rht}
            try:
                ref = NVFP4QuantizerRef(dtype=reference_utils.Fp4Formats.E2M1, quant_tile_shape=tile, with_rht=rht)
                qx, sx, qxt, sxt, ar, ac = ref._quantize(x)
                ours_r = nvfp4.quantize_ref(x, tile)
                ours_c = nvfp4.quantize_ref(x.t().contiguous(), tile, rht=rht)
                entry["torch_ref"] = all((same(qx, ours_r.data), same(sx, ours_r.scale), same(ar, ours_r.amax),
                                          same(qxt, ours_c.data), same(sxt, ours_c.scale), same(ac, ours_c.amax)))
                _, c, s, a = fp4_triton.nvfp4_quantize(x, tile)
                _, ct, st, at = fp4_triton.nvfp4_quantize(x.t().contiguous(), tile, rht=rht)
                entry["triton"] = all((same(qx, c), same(sx, s.view(torch.float8_e4m3fn)), same(ar, a),
                                       same(qxt, ct), same(sxt, st.view(torch.float8_e4m3fn)), same(ac, at)))
                if not entry["triton"]:
                    entry["triton_code_mismatches"] = int((qx != c).sum()) if qx.shape == c.shape else "shape"
                    entry["triton_scale_mismatches"] = int((sx.view(torch.uint8) != s).sum()) \
                        if sx.shape == s.shape else f"shape {tuple(sx.shape)} vs {tuple(s.shape)}"
            except Exception as exc:  # noqa: BLE001
                entry["error"] = f"{type(exc).__name__}: {exc}"
            ok = entry.get("torch_ref") and entry.get("triton")
            bad += 0 if ok else 1
            if not ok:
                rows.append(entry)
    return {"cases": total, "mismatches": bad, "failing_cases": rows[:40]}


def mxfp4_triton(quick: bool):
    from trainer.precision import fp4_triton, mxfp4

    total = bad = 0
    failing = []
    for name, x in test_tensors(quick):
        if x.shape[-1] % 32:
            continue
        total += 1
        out, codes, scales = fp4_triton.mxfp4_quantize(x, qdq=True)
        ref = mxfp4.quantize_ref(x)
        deq = ref.dequantize(x.dtype)
        ok = torch.equal(codes, ref.data) and torch.equal(scales, ref.scale) and \
            torch.equal(torch.nan_to_num(out, 7.0), torch.nan_to_num(deq, 7.0))
        if not ok:
            bad += 1
            failing.append(name)
    return {"cases": total, "mismatches": bad, "failing_cases": failing}


def _time(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return round(times[len(times) // 2], 3)


def _local_timings(res, x, w, dy, prefix):
    from trainer.precision.emulation import EmulationSpec, FP4EmulatedMatmul

    for label, spec in {"local_nvfp4": EmulationSpec("nvfp4"), "local_nvfp4_rht_sr": EmulationSpec("nvfp4", True, True),
                        "local_mxfp4": EmulationSpec("mxfp4")}.items():
        key = prefix + label
        try:
            res[f"{key}_ms"] = _time(lambda s=spec: FP4EmulatedMatmul.apply(x, w, s).backward(dy))
            res[f"{key}_ratio_vs_bf16"] = round(res[f"{key}_ms"] / res[f"{prefix}bf16_ms"], 2)
        except Exception as exc:  # noqa: BLE001
            res[f"{key}_error"] = f"{type(exc).__name__}: {exc}"


def _te_timings(res, x, dy, k, n, frozen, prefix):
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import CustomRecipe

    from trainer.precision import te_factory

    lin = te.Linear(k, n, bias=False, params_dtype=torch.bfloat16).cuda()
    lin.weight.requires_grad_(not frozen)
    xi = x.detach().clone().requires_grad_(True)
    res[f"{prefix}te_bf16_ms"] = _time(lambda: lin(xi).backward(dy))
    for label, fac in {"te_custom_nvfp4": te_factory.nvfp4_factory,
                       "te_custom_nvfp4_rht_sr": te_factory.nvfp4_rht_sr_factory,
                       "te_custom_mxfp4": te_factory.mxfp4_factory}.items():
        key = prefix + label
        try:
            recipe = CustomRecipe(qfactory=fac)

            def step(r=recipe):
                with te_autocast(te, r):
                    out = lin(xi)
                out.backward(dy)

            res[f"{key}_ms"] = _time(step, iters=10, warmup=3)
            res[f"{key}_ratio_vs_bf16"] = round(res[f"{key}_ms"] / res[f"{prefix}te_bf16_ms"], 2)
        except Exception as exc:  # noqa: BLE001
            res[f"{key}_error"] = f"{type(exc).__name__}: {exc}"


def timing(quick: bool):
    m, k, n = 8192, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wf = w.detach().clone()                       # frozen (LoRA base): no wgrad, FP4 copy cached
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def bf16():
        (x @ w.t()).backward(dy)

    def bf16_frozen():
        (x @ wf.t()).backward(dy)

    res = {"shape_mkn": [m, k, n], "bf16_ms": _time(bf16), "frozen_bf16_ms": _time(bf16_frozen)}
    _local_timings(res, x, w, dy, "")
    _local_timings(res, x, wf, dy, "frozen_")
    for frozen, prefix in ((False, ""), (True, "frozen_")):
        try:
            _te_timings(res, x, dy, k, n, frozen, prefix)
        except Exception as exc:  # noqa: BLE001
            res[f"{prefix}te_error"] = f"{type(exc).__name__}: {exc}"
    headline = "frozen_te_custom_nvfp4" if "frozen_te_custom_nvfp4_ratio_vs_bf16" in res else "frozen_local_nvfp4"
    res["headline"] = f"{headline} (frozen weight, fprop+dgrad, vs bf16 of the same path)"
    res["ratio_vs_bf16"] = res.get(f"{headline}_ratio_vs_bf16")
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    args = parser.parse_args()
    results: dict = {}
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 1
    section(results, "env")(lambda: env_info())
    section(results, "nvfp4_bitexact")(lambda: nvfp4_bitexact(args.quick))
    section(results, "mxfp4_triton")(lambda: mxfp4_triton(args.quick))
    section(results, "timing_ms")(lambda: timing(args.quick))
    section(results, "te_custom_vs_ref")(lambda: te_custom_vs_ref(args.quick))
    section(results, "te_frozen_layernorm_linear")(lambda: te_frozen_layernorm_linear(args.quick))
    section(results, "te_payload_exact")(lambda: te_payload_exact(args.quick))
    section(results, "mcore_gpt_te")(lambda: mcore_gpt_te(args.quick))
    text = json.dumps(results, indent=1, default=str)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    ok = results.get("nvfp4_bitexact", {}).get("mismatches") == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
