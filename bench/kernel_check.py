"""The adapters' Triton kernels on this GPU against the torch ops they replace, at the 8B shape's widths: one JSON line
per check (max error relative to the reference's largest value, the tolerance, ok). The CPU tests run the same
kernels in Triton's interpreter only; this is the first thing a device call runs before timing them. On the GPU a
last row times torch's F.rms_norm against TE's RMSNorm (the question before an epilogue for the norm-fed linears).
The chunked loss's CE passes (trainer/model/ce_kernel.py) are checked on one chunk of the 8B's loss (523 rows of the
128256 vocabulary) against the torch path, and on the GPU a row times that chunk both ways (CUDA events).

    python3 bench/kernel_check.py            # GPU; ~20 s with the Triton compiles
    TRITON_INTERPRET=1 python3 bench/kernel_check.py --cpu    # the script itself, tiny fp32 shapes, on CPU
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

R = 16
TOL = 2e-2  # bf16 inputs, fp32 accumulation on both sides: rounding of the bf16 results
GPU_SHAPE = dict(tokens=8192, hidden=4096, ffn=14336, dtype=torch.bfloat16)
CPU_SHAPE = dict(tokens=70, hidden=40, ffn=130, dtype=torch.float32)
CE_GPU = dict(rows=523, vocab=128256, hidden=4096)  # one chunk of the 8B's loss: CHUNK_BYTES of fp32 logits
CE_CPU = dict(rows=37, vocab=300, hidden=40)


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def _row(name: str, pairs: dict) -> dict:
    errs = {k: round(_err(g, r), 6) for k, (g, r) in pairs.items()}
    return {"bench": "kernel_check", "check": name, "rel_err": errs, "tol": TOL, "ok": max(errs.values()) <= TOL}


def checks(dev: torch.device, tokens: int, hidden: int, ffn: int, dtype: torch.dtype):
    from trainer.model.lora.drop import draw
    from trainer.model.lora.epilogue import epilogue_adapter
    from trainer.model.lora.kernels import down_product, dual_grad, masked_product, weight_grad
    from trainer.model.lora.swiglu import swiglu_lora

    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, device=dev) * s).to(dtype)

    for n in (hidden, ffn):  # proj/fc2 outputs and fc2's input width
        dy, b, h = rnd(tokens, n), rnd(n, R, s=0.1), rnd(tokens, R)
        yield _row(f"dual_grad n{n}", dict(zip(("dh", "dB"), zip(dual_grad(dy, b, h, 2.0, kernels=True),
                                                                  dual_grad(dy, b, h, 2.0)))))
        dh, a, dx = rnd(tokens, R), rnd(R, n, s=0.1), rnd(tokens, n)
        x, a32 = rnd(tokens, n), rnd(R, n, s=0.1).float()  # the candidates of bench/adapter_gemms.py
        yield _row(f"down_product n{n}", {"h": (down_product(x, a32, kernels=True), down_product(x, a32))})
        yield _row(f"weight_grad n{n}", {"dA": (weight_grad(dh, x, kernels=True), weight_grad(dh, x))})
        keep = draw(rnd(tokens, n), 0.1)[1]
        yield _row(f"masked_product n{n}", {
            "write": (masked_product(dh, a, keep, 0.1, kernels=True), masked_product(dh, a, keep, 0.1)),
            "accumulate": (masked_product(dh, a, keep, 0.1, dx.clone(), True, kernels=True),
                           masked_product(dh, a, keep, 0.1, dx.clone(), True)),
            # unmasked, scaled, in place: trainer.lora.triton_products' y += s h B^T and dx += dh A
            "unmasked": (masked_product(dh, a, None, 0.0, dx.clone(), True, kernels=True, scale=2.0),
                         masked_product(dh, a, None, 0.0, dx.clone(), True, scale=2.0))})
    for store in (False, True):  # fc1 at the 8B's FFN width; the FP8 store checked against its own reference
        u, h, b = rnd(tokens, 2 * ffn), rnd(tokens, R), rnd(2 * ffn, R, s=0.1)
        grads = []
        for kernels in (True, False):
            uu, hh, bb = (t.clone().requires_grad_(True) for t in (u, h, b))
            # the reference reads the FP8-rounded copy; its gradient passes straight through to u (not rounded)
            base = uu if kernels or not store else uu + (uu.detach().to(torch.float8_e4m3fn).to(dtype) - uu.detach())
            act = swiglu_lora(base, hh, bb, 2.0, kernels=kernels, fp8_store=store and kernels)
            act.backward(torch.ones_like(act))
            grads.append((act.detach(), uu.grad, hh.grad, bb.grad))
        pairs = dict(zip(("du", "dh", "dB"), zip(grads[0][1:], grads[1][1:])))
        if not store:  # (with the store the reference's forward reads the rounded copy: only the grads compare)
            pairs["act"] = (grads[0][0], grads[1][0])
        yield _row(f"swiglu_lora fp8_store={store}", pairs)
    w, x = rnd(hidden, ffn, s=0.01), rnd(tokens, ffn)
    a, b = rnd(R, ffn, s=0.01).float(), rnd(hidden, R, s=0.1).float()
    outs = []
    for kernels in (True, False):  # the fc2 epilogue node with dropout, same draw both times
        xx, aa, bb = x.clone().requires_grad_(True), a.clone().requires_grad_(True), b.clone().requires_grad_(True)
        torch.manual_seed(5)
        y = epilogue_adapter(w, xx, aa, bb, 2.0, 0.1, kernels=kernels, products=kernels)  # (triton_products)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), xx.grad, aa.grad, bb.grad))
    yield _row("epilogue fc2 dropout 0.1", dict(zip(("y", "dx", "dA", "dB"), zip(*outs))))


def _ce_inputs(dev: torch.device, rows: int, vocab: int, hidden: int, dtype: torch.dtype):
    g = torch.Generator(device=dev).manual_seed(1)
    h = torch.randn(rows, 1, hidden, generator=g, device=dev).to(dtype)
    w = (torch.randn(vocab, hidden, generator=g, device=dev) * 0.02).to(dtype)
    return h, w, torch.randint(0, vocab, (rows, 1), generator=g, device=dev)


def _ce(kernel: bool, h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor):
    """(per-token loss, dCE/dh) of one chunk through chunked_output_loss (TP 1)."""
    from trainer.model.chunked_loss import chunked_output_loss

    x = h.detach().requires_grad_(True)
    loss = chunked_output_loss(x, w, labels, False, kernel=kernel)
    loss.backward(torch.ones_like(loss))
    return loss.detach(), x.grad


def ce_check(dev: torch.device, rows: int, vocab: int, hidden: int, dtype: torch.dtype) -> dict:
    """The CE kernel path against the torch path on one chunk; not ok where the kernel would not run here."""
    from trainer.model.ce_kernel import ce_kernel_usable

    args = _ce_inputs(dev, rows, vocab, hidden, dtype)
    (loss_k, grad_k), (loss_t, grad_t) = _ce(True, *args), _ce(False, *args)
    row = _row(f"chunked CE rows{rows} vocab{vocab}", {"loss": (loss_k, loss_t), "dh": (grad_k, grad_t)})
    row["kernel_ran"] = ce_kernel_usable(dev, dtype)
    row["ok"] = row["ok"] and row["kernel_ran"]
    return row


def ce_timing(rows: int, vocab: int, hidden: int) -> dict:
    """One chunk's output GEMM + CE + gradient GEMM, torch path vs kernel path, and the two GEMMs alone: ms each
    (CUDA events, median of 20 after 5 warm-ups). The 8B iteration runs 16 such chunks."""
    h, w, labels = _ce_inputs(torch.device("cuda"), rows, vocab, hidden, torch.bfloat16)

    def ms(fn) -> float:
        out = []
        for i in range(25):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            if i >= 5:
                out.append(start.elapsed_time(end))
        return round(sorted(out)[len(out) // 2], 3)

    hh = h.view(rows, hidden)
    return {"bench": "ce_timing", "rows": rows, "vocab": vocab, "hidden": hidden,
            "torch_ms": ms(lambda: _ce(False, h, w, labels)), "kernel_ms": ms(lambda: _ce(True, h, w, labels)),
            "gemms_ms": ms(lambda: torch.nn.functional.linear(hh, w) @ w)}


def rmsnorm_timing(tokens: int, hidden: int) -> dict:
    """The next lever's question (the epilogue for the norm-fed qkv/fc1 would own their RMSNorm): torch's
    F.rms_norm against TE's RMSNorm, forward + backward at [tokens, hidden] BF16, ms each (median of 20)."""
    import time

    import torch.nn.functional as F

    def timed(fn) -> float:
        out = []
        for i in range(25):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if i >= 5:
                out.append((time.perf_counter() - t) * 1e3)
        return round(sorted(out)[len(out) // 2], 3)

    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w, g = torch.ones(hidden, device="cuda", dtype=torch.bfloat16), torch.randn_like(x)
    row = {"bench": "rmsnorm_timing", "shape": [tokens, hidden],
           "torch_ms": timed(lambda: F.rms_norm(x, (hidden,), w, 1e-5).backward(g))}
    try:
        import transformer_engine.pytorch as te

        norm = te.RMSNorm(hidden, eps=1e-5, params_dtype=torch.bfloat16).cuda()
        row["te_ms"] = timed(lambda: norm(x).backward(g))
    except Exception as err:  # noqa: BLE001  (TE absent or changed: the torch number alone)
        row["te_error"] = f"{type(err).__name__}: {str(err)[:200]}"
    return row


def main() -> int:
    cpu = "--cpu" in sys.argv[1:]
    if not cpu and not torch.cuda.is_available():
        print(json.dumps({"bench": "kernel_check", "error": "no CUDA device"}))
        return 1
    bad = 0
    for row in checks(torch.device("cpu" if cpu else "cuda"), **(CPU_SHAPE if cpu else GPU_SHAPE)):
        bad += not row["ok"]
        print(json.dumps(row), flush=True)
    row = ce_check(torch.device("cpu" if cpu else "cuda"), **(CE_CPU if cpu else CE_GPU),
                   dtype=(CPU_SHAPE if cpu else GPU_SHAPE)["dtype"])
    bad += not row["ok"]
    print(json.dumps(row), flush=True)
    if not cpu:
        print(json.dumps(ce_timing(**CE_GPU)), flush=True)
        print(json.dumps(rmsnorm_timing(GPU_SHAPE["tokens"], GPU_SHAPE["hidden"])), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
