"""NVFP4 and MXFP4 reference numerics against hand-worked vectors."""
import math

import pytest
import torch

from trainer.precision import e2m1, mxfp4, nvfp4
from trainer.precision.hadamard import apply_rht, rht_matrix

NAN, INF = float("nan"), float("inf")


def test_e2m1_rne_ties_saturation_signs():
    v = torch.tensor([0.0, -0.0, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.0, 9.0, -0.25, -0.3, -5.5, NAN])
    codes = e2m1.encode(v.clamp(-6, 6))
    assert e2m1.decode(codes).tolist()[:-1] == [0, 0, 0, 0.5, 1, 1, 2, 2, 4, 4, 6, 6, 6, -0.0, -0.5, -6]
    assert codes[-1].item() == 0                        # NaN -> +0 code (the scale carries the NaN)
    assert codes[1].item() == 0 and codes[13].item() == 8   # -0.0 -> +0, small negatives -> -0


def test_pack_layout_low_nibble_first():
    codes = torch.tensor([[1, 2, 15, 7]], dtype=torch.uint8)
    packed = e2m1.pack(codes)
    assert packed.tolist() == [[0x21, 0x7F]]
    assert torch.equal(e2m1.unpack(packed), codes)


def test_stochastic_rounding_is_unbiased_and_on_grid():
    g = torch.Generator().manual_seed(0)
    v = torch.full((200_000,), 2.4)
    vals = e2m1.decode(e2m1.encode_stochastic(v, g))
    assert set(vals.unique().tolist()) == {2.0, 3.0}
    assert abs(vals.mean().item() - 2.4) < 0.01
    assert e2m1.decode(e2m1.encode_stochastic(torch.tensor([7.0, -1.0]), g)).tolist() == [6.0, -1.0]


def _nv_row(block0):
    """One 1x32 row: block 0 as given, block 1 holds 2688 so the tensor amax is 448*6 (global scale 1)."""
    block1 = [2688.0, 1344.0, -672.0] + [0.0] * 13
    return torch.tensor([block0 + block1])


def test_nvfp4_unit_global_scale_hand_vector():
    block0 = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.3, -5.5, 0.1, 4.9, 2.9, 0, -0.0]
    q = nvfp4.quantize_ref(_nv_row(block0))
    assert q.amax.item() == 2688.0
    assert q.scale.float().tolist() == [[1.0, 448.0]]      # 6 * rcp(6) rounds to exactly 1; 2688/6 = 448
    out = q.dequantize()[0].tolist()
    assert out[:16] == [6, 0, 1, 1, 2, 2, 4, 4, 0, -0.5, -6, 0, 4, 3, 0, 0]
    assert out[16:19] == [2688.0, 1344.0, -672.0]


def test_nvfp4_scale_rounds_down_then_saturates():
    # block amax 6.375 -> decode 1.0625, a tie between E4M3 1.0 and 1.125 -> even (1.0) -> 6.375 saturates to 6
    q = nvfp4.quantize_ref(_nv_row([6.375, 3.2] + [0.0] * 14))
    assert q.scale.float()[0, 0].item() == 1.0
    assert q.dequantize()[0, :2].tolist() == [6.0, 3.0]


def test_nvfp4_subnormal_scale_edges():
    smallest = 6 * 2.0 ** -9            # decode scale exactly the smallest E4M3 subnormal, 2^-9
    q = nvfp4.quantize_ref(_nv_row([smallest, smallest / 2] + [0.0] * 14))
    assert q.scale.float()[0, 0].item() == 2.0 ** -9
    assert q.dequantize()[0, :2].tolist() == [smallest, smallest / 2]
    # block scale 2^-11 rounds to E4M3 zero: the block flushes to 0 (encode scale clamps to FLT_MAX)
    q = nvfp4.quantize_ref(_nv_row([6 * 2.0 ** -11, -1e-4] + [0.0] * 14))
    assert q.scale.float()[0, 0].item() == 0.0
    assert q.dequantize()[0, :2].tolist() == [0.0, 0.0]


def test_nvfp4_zeros_and_all_zero_tensor():
    q = nvfp4.quantize_ref(torch.zeros(2, 32))
    assert q.amax.item() == 0 and torch.equal(q.data, torch.zeros(2, 16, dtype=torch.uint8))
    assert torch.equal(q.dequantize(), torch.zeros(2, 32))


def test_nvfp4_nan_and_inf_poison_the_tensor_like_te():
    x = torch.randn(2, 32)
    x[0, 3] = NAN
    q = nvfp4.quantize_ref(x)
    assert torch.isnan(q.amax).all() and torch.isnan(q.scale.float()).all()
    assert torch.isnan(q.dequantize()).all()
    x[0, 3] = INF
    q = nvfp4.quantize_ref(x)
    assert q.scale.float()[0, 0].item() == 448.0 and not torch.isfinite(q.dequantize()).any()


def test_nvfp4_2d_tiles_share_one_scale_and_commute_with_transpose():
    torch.manual_seed(0)
    w = torch.randn(32, 48)
    w[0, 0] = 10.0                                       # only tile (0, 0) sees it
    q = nvfp4.quantize_ref(w, tile=(16, 16))
    s = q.scale.float()
    assert s.shape == (32, 3)
    assert torch.equal(s[:16], s[:1].expand(16, 3)) and torch.equal(s[16:], s[16:17].expand(16, 3))
    assert s[0, 0] > s[0, 1]
    qt = nvfp4.quantize_ref(w.t().contiguous(), tile=(16, 16))
    assert torch.equal(q.dequantize().t(), qt.dequantize())   # 2-D blocks: W_q^T == (W^T)_q
    q1 = nvfp4.quantize_ref(w.t().contiguous(), tile=(1, 16))
    assert not torch.equal(q.dequantize().t(), q1.dequantize())


def test_nvfp4_padding_keeps_shape():
    x = torch.randn(20, 40)
    q = nvfp4.quantize_ref(x, tile=(16, 16))
    assert q.data.shape == (20, 20) and q.scale.shape == (32, 3) and q.dequantize().shape == (20, 40)


def test_nvfp4_error_is_bounded():
    torch.manual_seed(1)
    x = torch.randn(64, 256)
    err = (nvfp4.qdq_ref(x) - x).abs()
    blocks = x.view(64, 16, 16).abs().amax(-1, keepdim=True).expand(64, 16, 16).reshape(64, 256)
    # worst E2M1 step is 2 (between 4 and 6) at scale amax/6, plus E4M3 scale rounding (< 1/16)
    assert (err <= blocks / 6 * 1.0 * 1.07 + 1e-6).all()
    assert 0 < err.mean() < 0.1


def test_rht_is_orthonormal_and_rotates():
    t = rht_matrix(16)
    assert torch.allclose(t @ t.T, torch.eye(16), atol=1e-6)
    x = torch.randn(4, 32)
    y = apply_rht(x)
    assert torch.allclose((y.view(-1, 16) @ t.T).view(4, 32), x, atol=1e-5)
    assert not torch.allclose(y, x)


def test_mxfp4_hand_vector_unit_scale():
    row = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.3, -5.5, 0.1, 4.9, 2.9, 0, -0.0] + [0.0] * 16
    q = mxfp4.quantize_ref(torch.tensor([row]))
    assert q.scale.tolist() == [[127]]                  # floor(log2 6) - 2 = 0
    assert q.dequantize()[0, :16].tolist() == [6, 0, 1, 1, 2, 2, 4, 4, 0, -0.5, -6, 0, 4, 3, 0, 0]


@pytest.mark.parametrize("amax,code,first", [
    (7.0, 127, 6.0),               # X = 1, 7 saturates to 6
    (8.0, 128, 8.0),               # X = 2
    (0.75, 124, 0.75),             # floor(log2 .75) = -1 -> X = 2^-3
    (2.0 ** -124, 1, 2.0 ** -124),   # exponent -126
    (2.0 ** -125, 0, 2.0 ** -125),   # exponent -127, E8M0's smallest
    (1e-40, 0, 0.0),               # subnormal block: scale clamps to 2^-127, element rounds to 0
    (torch.finfo(torch.float32).max, 252, 6 * 2.0 ** 125),   # 2^127*1.99 saturates at 6 * 2^125
])
def test_mxfp4_e8m0_scale(amax, code, first):
    q = mxfp4.quantize_ref(torch.tensor([[amax] + [0.0] * 31]))
    assert q.scale.item() == code
    assert q.dequantize()[0, 0].item() == first


def test_mxfp4_zero_block_and_specials():
    q = mxfp4.quantize_ref(torch.zeros(1, 64))
    assert q.scale.tolist() == [[0, 0]] and torch.equal(q.dequantize(), torch.zeros(1, 64))
    x = torch.ones(1, 64)
    x[0, 1] = NAN
    x[0, 40] = -INF
    q = mxfp4.quantize_ref(x)
    assert q.scale.tolist() == [[255, 255]]
    assert torch.isnan(q.dequantize()).all()
    x = torch.ones(1, 64)
    x[0, 40] = INF
    assert q.scale.tolist()[0][0] == 255 and mxfp4.quantize_ref(x).scale.tolist() == [[127 - 2 + 0, 255]]


def test_mxfp4_differs_from_nvfp4():
    torch.manual_seed(2)
    x = torch.randn(8, 64)
    a, b = mxfp4.qdq_ref(x), nvfp4.qdq_ref(x)
    assert not torch.equal(a, b)
    assert (a - x).abs().mean() > (b - x).abs().mean()   # power-of-two scales over 32 lose more


def test_mxfp4_padding():
    q = mxfp4.quantize_ref(torch.randn(3, 40))
    assert q.scale.shape == (3, 2) and q.dequantize().shape == (3, 40)
    assert math.isfinite(q.dequantize().sum().item())
