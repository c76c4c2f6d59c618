"""bench/adapter_gemms.py on CPU (tiny fp32 shapes): every adapter product of every linear is timed against the bytes
it must move, and the iteration summary sums what the fused path runs. The GPU numbers are a device call's."""
from __future__ import annotations

import json

from tests.model_helpers import interpreted


def test_every_product_is_timed_and_summed():
    out = interpreted("bench/adapter_gemms.py", "--cpu", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    head, body, summary = rows[0], rows[1:-1], rows[-1]
    assert head["copy_gb_s"] > 0 and head["tokens"] == 70 and head["triton_kernels"] is True  # the interpreter
    assert {(r["linear"], r["op"]) for r in body} == {
        (lin, op) for lin in ("qkv", "proj", "fc1", "fc2")
        for op in ("fwd_A", "fwd_B", "bwd_dh", "bwd_dB", "bwd_dual", "bwd_dA", "bwd_dx", "fwd_A_triton",
                   "fwd_B_triton", "bwd_dA_triton", "bwd_dx_triton")}
    fc2_dx = next(r for r in body if r["linear"] == "fc2" and r["op"] == "bwd_dx")
    assert fc2_dx["bytes"] == 2 * 70 * 130 * 4  # dx [tokens, in] read and written, fp32
    assert all(r["us"] > 0 and r["bytes"] > 0 and r["of_bound"] >= 0 for r in body)  # (interpreted kernels: ~0)
    fused = sum(r["us"] for r in body if r["linear"] != "fc1" and r["op"] in (
        "fwd_A", "fwd_B", "bwd_dh", "bwd_dB", "bwd_dA", "bwd_dx")) * 32 / 1e3
    assert abs(summary["fused_path_ms"] - fused) < 0.05 * fused + 0.02
