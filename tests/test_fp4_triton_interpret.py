"""The Triton kernels equal the pure-torch references bit for bit (run in Triton's CPU interpreter)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    from trainer.precision import fp4_payload, fp4_rows, fp4_triton, mxfp4, nvfp4
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
            q = fp4_rows.nvfp4_qdq(x, tile)
            assert torch.equal(q.nan_to_num(7.0), nvfp4.qdq_ref(x, tile).nan_to_num(7.0)), (name, tile, "qdq")
        o, c, s = fp4_triton.mxfp4_quantize(x, qdq=True)
        r = mxfp4.quantize_ref(x)
        assert torch.equal(c, r.data) and torch.equal(s, r.scale), (name, "mx")
        assert torch.equal(o.nan_to_num(7.0), r.dequantize(x.dtype).nan_to_num(7.0)), (name, "mx qdq")
        # rows kernel (1x16 / 1x32 blocks, one block per tile row) and payloads without the tensor scale
        assert torch.equal(fp4_rows.mxfp4_qdq(x).nan_to_num(7.0), mxfp4.qdq_ref(x).nan_to_num(7.0)), (name, "mx rows")
        if x.shape[0] % 32 == 0:
            assert torch.equal(fp4_rows.mxfp4_rows(x.t(), out_dtype=torch.bfloat16).nan_to_num(7.0),
                               mxfp4.qdq_ref(x.t().contiguous()).bfloat16().nan_to_num(7.0)), (name, "mx strided")
        amax = fp4_triton.tensor_amax(x)
        want_amax = x.abs().max().float().view(1)
        assert torch.equal(amax.view(torch.int32), want_amax.view(torch.int32)) or \
            (amax.isnan().all() and want_amax.isnan().all()), (name, "amax")   # NaN payload bits may differ
        for tile in ((1, 16), (16, 16)):
            want = fp4_payload.nvfp4_block_values(nvfp4.quantize_ref(x, tile)).nan_to_num(7.0)
            got = (fp4_rows.nvfp4_rows(x, amax, global_scale=False, out_dtype=torch.bfloat16) if tile[0] == 1 else
                   fp4_triton.nvfp4_qdq_2d(x, amax, tile, global_scale=False, out_dtype=torch.bfloat16))
            assert got.dtype == torch.bfloat16 and torch.equal(got.nan_to_num(7.0), want), (name, tile, "payload")
        xt = x.t() if x.shape[0] % 16 == 0 else x[:16].t()
        got = fp4_rows.nvfp4_rows(xt, fp4_triton.tensor_amax(xt))
        assert torch.equal(got.nan_to_num(7.0), nvfp4.qdq_ref(xt.contiguous()).nan_to_num(7.0)), (name, "strided")
    y = torch.randn(37, 50).bfloat16()
    alpha = torch.tensor([3.7e-5])
    assert torch.equal(fp4_rows.scale_output(y.clone(), alpha, torch.bfloat16), (y.float() * alpha).bfloat16())
    assert torch.equal(fp4_rows.scale_output(y, alpha, torch.float32), y.float() * alpha)
    sr_in = torch.full((16, 64), 2.4)
    sr_in[:, ::16] = 6.0                       # block and tensor amax 6: scales are 1, 2.4 sits between 2 and 3
    sr = fp4_rows.nvfp4_qdq(sr_in, stochastic=True)
    assert [round(v, 4) for v in sorted(set(sr.flatten().tolist()))] == [2.0, 3.0, 6.0], "SR picks both neighbours"
    mx_sr = fp4_rows.mxfp4_qdq(torch.full((16, 64), 2.4), stochastic=True)
    assert set(mx_sr.flatten().tolist()) == {2.0, 3.0}, "MX stochastic rounding"
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
