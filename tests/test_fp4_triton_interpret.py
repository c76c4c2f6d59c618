"""The Triton kernels equal the pure-torch references bit for bit (run in Triton's CPU interpreter)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    from trainer.precision import fp4_triton, mxfp4, nvfp4
    torch.manual_seed(0)
    base = torch.randn(32, 256)
    cases = {"randn": base, "zeros": torch.zeros(16, 64), "tiny": base * 1e-30, "huge": base * 1e37,
             "underflow": torch.cat([base[:, :16] * 1e-6, base[:, 16:] * 1e3], 1), "ragged_rows": base[:21],
             "bf16": base.bfloat16()}
    for special in ("nan", "inf"):
        t = base.clone(); t[3, 40] = float(special); cases[special] = t
    for name, x in cases.items():
        for tile in ((1, 16), (16, 16)):
            _, c, s, a = fp4_triton.nvfp4_quantize(x, tile)
            r = nvfp4.quantize_ref(x, tile)
            assert torch.equal(c, r.data), (name, tile, "codes")
            nan_canon = lambda t: torch.where((t & 0x7F) == 0x7F, 0x7F, t)   # NaN's sign bit is platform-defined
            assert torch.equal(nan_canon(s), nan_canon(r.scale.view(torch.uint8))), (name, tile, "scales")
            q = fp4_triton.nvfp4_qdq(x, tile)
            assert torch.equal(q.nan_to_num(7.0), nvfp4.qdq_ref(x, tile).nan_to_num(7.0)), (name, tile, "qdq")
        o, c, s = fp4_triton.mxfp4_quantize(x, qdq=True)
        r = mxfp4.quantize_ref(x)
        assert torch.equal(c, r.data) and torch.equal(s, r.scale), (name, "mx")
        assert torch.equal(o.nan_to_num(7.0), r.dequantize(x.dtype).nan_to_num(7.0)), (name, "mx qdq")
    sr = fp4_triton.nvfp4_qdq(torch.full((16, 64), 2.4) * torch.tensor(1.0), stochastic=True)
    print("OK", sorted(set(sr.flatten().tolist()))[:4])
""")


@pytest.mark.slow
def test_triton_kernels_match_reference_in_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("OK")
