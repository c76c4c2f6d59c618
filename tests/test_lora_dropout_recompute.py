"""trainer.lora.dropout_recompute (trainer/model/lora/drop.py): under pre-dropout the fused and epilogue nodes keep the
input and the mask's bits, and rebuild the dropped copy in backward. Against keeping the dropped copy and the mask:
the same outputs and gradients bit for bit, less kept; the packing round-trips; a GPU-only probability where the
recompute would not be bitwise keeps the copy."""
from __future__ import annotations

import math

import pytest
import torch

from tests.model_helpers import FrozenLinear
from trainer.model.lora.drop import draw, kept_drop, pack_keep, recomputable, undrop, unpack_keep
from trainer.model.lora.epilogue import epilogue_adapter
from trainer.model.lora.fused import fused_adapter

P = 0.1


@pytest.mark.parametrize("width", [1, 7, 8, 13, 64])
def test_bits_round_trip(width):
    g = torch.Generator().manual_seed(width)
    keep = torch.rand(3, 5, width, generator=g) > 0.3
    packed = pack_keep(keep)
    assert packed.dtype == torch.uint8 and packed.shape == (15, -(-width // 8))
    assert torch.equal(unpack_keep(packed, width).view(keep.shape), keep)
    # bit j of byte i is element 8 i + j
    one = torch.zeros(1, 16, dtype=torch.bool)
    one[0, 10] = True
    assert pack_keep(one).tolist() == [[0, 4]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [P, 0.3])
def test_restore_gives_the_draw_bit_for_bit(dtype, p):
    x = torch.randn(4, 6, 21).to(dtype)
    torch.manual_seed(3)
    xd, keep = draw(x, p)  # on CPU: the noise in x's dtype
    store, packed = kept_drop(keep, p, dtype)
    got_xd, got_keep = store.restore(x, packed)
    assert got_keep.dtype == keep.dtype and torch.equal(got_keep, keep)
    assert torch.equal(got_xd, xd.view(-1, xd.shape[-1]))
    # a GPU's bool mask: native_dropout_backward rebuilds x * mask / (1 - p), as the forward kernel scales it
    mask = keep != 0
    store, packed = kept_drop(mask, p, dtype)
    got_xd, got_keep = store.restore(x, packed)
    assert got_keep.dtype == torch.bool and torch.equal(got_keep, mask)
    assert torch.equal(got_xd, undrop(x, mask, p).view(-1, x.shape[-1]))


def test_a_probability_whose_scales_differ_keeps_the_copy_on_a_gpu_only():
    assert recomputable(0.1) and recomputable(0.05)
    odd = next(p / 1000 for p in range(1, 990) if not recomputable(p / 1000))
    mask = torch.ones(2, 8, dtype=torch.bool)
    assert kept_drop(mask, odd, torch.float32) == (None, None)
    noise = mask.to(torch.float32) / (1 - odd)
    assert kept_drop(noise, odd, torch.float32)[0] is not None  # the CPU noise rebuilds exactly
    assert kept_drop(None, P, torch.float32) == (None, None) and kept_drop(mask, 0.0, torch.float32) == (None, None)
    # a bfloat16 input: 0.15's scales differ, yet every bfloat16 product rounds alike; 0.104's do not
    assert not recomputable(0.15) and recomputable(0.15, torch.bfloat16)
    assert kept_drop(mask, 0.15, torch.bfloat16)[0] is not None and kept_drop(mask, 0.15, torch.float32)[0] is None
    assert not recomputable(0.104, torch.bfloat16) and kept_drop(mask, 0.104, torch.bfloat16) == (None, None)
    assert not recomputable(0.15, torch.float16)  # float16 takes float32's rule


def _scales(p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """native_dropout's forward scale float32(1 / float32(1 - p)) and its backward op's float32(1 / (1 - p)), formed in
    torch's float32 tensors."""
    keep = torch.tensor(1.0 - p, dtype=torch.float32).item()
    return torch.tensor(1.0 / keep, dtype=torch.float32), torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)


def test_the_contracts_rule_is_torchs_float32_arithmetic():
    """The planner and `validate` decide by primus_contract.dropout_rebuild.dropout_recomputable (stdlib floats,
    rounded to float32 through struct): the same verdict as the two scales formed in torch's float32 tensors, at every
    p of a fine grid. A check of the stdlib rounding only: that native_dropout's forward and backward take these two
    scales is held on a GPU (tests/gpu/test_fp8_epilogue.py: bit for bit where the rule says so, and at a p it refuses
    the difference shows)."""
    for q in range(1, 990):
        p = q / 1000
        forward, backward = _scales(p)
        assert recomputable(p) == bool(forward == backward), p
    assert not recomputable(0.15) and recomputable(0.2)


def test_the_bfloat16_rule_is_torchs_rounding_of_every_bfloat16():
    """For a bfloat16 input the rule enumerates every finite bfloat16 through stdlib floats: the same verdict as
    torch's float32 products rounded to bfloat16, over all 65,280 finite values (both signs), at every p of the grid
    whose scales differ. Most of them rebuild (0.15 among them), some do not (0.104): the rule is neither float32's
    nor always true."""
    bits = torch.arange(0, 0x10000, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = bits[torch.isfinite(bits)].float()
    verdicts = {}
    for q in range(1, 990):
        p = q / 1000
        forward, backward = _scales(p)
        if forward == backward:
            continue
        same = torch.equal((x * forward).to(torch.bfloat16).view(torch.int16),
                           (x * backward).to(torch.bfloat16).view(torch.int16))
        assert recomputable(p, torch.bfloat16) == same, p
        verdicts[p] = same
    assert verdicts[0.15] and not verdicts[0.104] and 0 < sum(verdicts.values()) < len(verdicts), verdicts


def _run(path, dtype, recompute_drop):
    """(y, dA, dB, dx, kept bytes) of one adapter with pre-dropout P through `path`, counting what autograd keeps."""
    g = torch.Generator().manual_seed(0)
    din, dout, r, s = 48, 40, 4, 2.0
    base = FrozenLinear(torch.randn(dout, din, generator=g).to(dtype) * 0.2)
    a = (torch.randn(r, din, generator=g) * 0.3).requires_grad_(True)
    b = (torch.randn(dout, r, generator=g) * 0.3).requires_grad_(True)
    x = torch.randn(3, 7, din, generator=g).to(dtype).requires_grad_(True)
    up = torch.randn(3, 7, dout, generator=g).to(dtype)
    storages = {}

    def pack(t):
        if math.prod(t.shape[:-1]) == 21 and t.shape[-1] != r:  # per-token tensors other than h
            storages[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t.dtype)
        return t

    torch.manual_seed(100)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if path == "epilogue":
            y = epilogue_adapter(base.weight, x, a, b, s, P, recompute_drop=recompute_drop)
        else:
            y, _ = fused_adapter(base, x, a, b, s, drop=lambda t: draw(t, P), p=P, recompute_drop=recompute_drop)
    (y.float() * up.float()).sum().backward()
    x_storage = x.untyped_storage().data_ptr()
    return y.detach(), a.grad, b.grad, x.grad, storages, x_storage


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["epilogue", "fused"])
def test_same_results_bit_for_bit_and_less_kept(path, dtype):
    y0, da0, db0, dx0, kept0, _ = _run(path, dtype, False)
    y1, da1, db1, dx1, kept1, x_storage = _run(path, dtype, True)
    assert da0.abs().sum() > 0 and dx0.abs().sum() > 0
    assert torch.equal(y1, y0) and torch.equal(da1, da0) and torch.equal(db1, db0) and torch.equal(dx1, dx0)
    elems, size = 21 * 48, dtype.itemsize
    # kept: the dropped copy and the CPU noise (both x's dtype), against x itself (the caller's storage) and the bits
    assert sorted(v for v in kept0.values()) == [(elems * size, dtype)] * 2
    assert x_storage in kept1 and kept1[x_storage] == (elems * size, dtype)
    assert sorted(v for k, v in kept1.items() if k != x_storage) == [(21 * 6, torch.uint8)]


@pytest.mark.parametrize("lora", [{"epilogue": True}, {}], ids=["epilogue", "fused"])
def test_tiny_model_trains_to_the_same_losses(lora):
    """8 AdamW iterations of the tiny model with dropout 0.1 on every adapter: the same losses, bit for bit, with the
    dropped copy recomputed or kept."""
    from tests.model_helpers import tiny_cfg, train_losses

    def run(recompute_drop):
        torch.manual_seed(11)
        trainer = {"lora": {"fused_swiglu": False, "dropout": P, "dropout_recompute": recompute_drop, **lora}}
        return train_losses(tiny_cfg(trainer=trainer), 8, seed=3)

    on, off = run(True), run(False)
    assert on[-1] < on[0] and on == off


KERNELS = """
import torch
from trainer.model.lora.bits import pack_bits, undrop_bits
from trainer.model.lora.drop import KeptDrop, draw, kept_drop, pack_keep
from trainer.model.lora.epilogue import epilogue_adapter
from trainer.model.lora.fused import fused_adapter

torch.manual_seed(0)
for rows, n in ((5, 1), (17, 13), (33, 64), (3, 300)):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, n).to(dtype)
        xd, noise = draw(x, 0.1)
        mask = noise != 0
        for keep in (noise, mask):
            packed = pack_bits(keep)
            assert torch.equal(packed, pack_keep(keep)), (rows, n, keep.dtype)
            ref = KeptDrop(keep, 0.1).restore(x, packed)
            got = KeptDrop(keep, 0.1, kernels=True).restore(x, packed)
            assert got[1].dtype == ref[1].dtype and torch.equal(got[1], ref[1]), (rows, n, keep.dtype)
            if dtype == torch.float32:  # bitwise, the signs of zeros included ((mask * x) * scale, as the dropout's
                # own ops); the interpreter truncates fp32 to bf16 where a GPU rounds to nearest even, so BF16 is
                # checked on the GPU (tests/gpu/test_fp8_epilogue.py)
                assert torch.equal(got[0].view(torch.int32), ref[0].view(torch.int32)), (rows, n, keep.dtype)
# the nodes with their kernels: the copy recomputed by the Triton passes gives the bits of keeping it
w = torch.randn(40, 48)
paths = [lambda x, a1, b1, rd: epilogue_adapter(w, x, a1, b1, 2.0, 0.1, kernels=True, recompute_drop=rd)]
paths += [lambda x, a1, b1, rd: fused_adapter(lambda z: (z @ w.t(), None), x, a1, b1, 2.0,
                                              drop=lambda z: draw(z, 0.1), p=0.1, kernels=True, recompute_drop=rd)[0]]
for path in paths:
    grads = []
    for rd in (False, True):
        x = torch.randn(3, 7, 48, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
        a1 = torch.randn(4, 48, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
        b1 = torch.randn(40, 4, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
        torch.manual_seed(5)
        y = path(x, a1, b1, rd)
        (y * torch.linspace(-1, 1, 40)).sum().backward()
        grads.append((y.detach(), x.grad, a1.grad, b1.grad))
    assert all(torch.equal(g, r) for g, r in zip(*grads))
print("bits ok")
"""


def test_the_bits_kernels_match_the_torch_ops_in_the_interpreter():
    pytest.importorskip("triton")
    from tests.model_helpers import interpreted

    done = interpreted("-c", KERNELS)
    assert done.returncode == 0 and "bits ok" in done.stdout, done.stderr[-3000:]
