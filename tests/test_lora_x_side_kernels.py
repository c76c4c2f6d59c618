"""trainer/model/lora/kernels.py's down_product (h = x A^T) and weight_grad (dA = dh^T x, token splits summed in a
fixed order) in Triton's interpreter against the torch ops: ragged token and column counts, a rank padded to the
tile, more than one token split. The GPU timing against cuBLAS is bench/adapter_gemms.py's."""
from __future__ import annotations

import pytest

from tests.model_helpers import interpreted

SCRIPT = r"""
import torch
from trainer.model.lora import kernels
g = torch.Generator().manual_seed(0)
for t, k, r in ((1100, 70, 5), (64, 128, 16), (2050, 33, 16)):
    x, a, dh = (torch.randn(*s, generator=g) for s in ((t, k), (r, k), (t, r)))
    h_k, h_t = kernels.down_product(x, a, kernels=True), kernels.down_product(x, a)
    torch.testing.assert_close(h_k, h_t, rtol=1e-5, atol=1e-4)
    da_k, da_t = kernels.weight_grad(dh, x, kernels=True), kernels.weight_grad(dh, x)
    assert da_k.dtype == torch.float32 and da_k.shape == (r, k)
    torch.testing.assert_close(da_k, da_t, rtol=1e-5, atol=1e-3)
    assert torch.equal(da_k, kernels.weight_grad(dh, x, kernels=True))  # no atomics: the same bits again
print("x-side kernels ok")
"""


def test_down_product_and_weight_grad_match_the_torch_ops():
    pytest.importorskip("triton")
    done = interpreted("-c", SCRIPT)
    assert done.returncode == 0 and "x-side kernels ok" in done.stdout, done.stderr[-3000:]
