"""What both halves of the FP4 GPU check share (bench/fp4_gpu_check.py and bench/fp4_gpu_check_te.py import this,
never each other): the test tensors every bit-exactness section quantizes, and TE's autocast under either name."""
from __future__ import annotations

import torch


def te_autocast(te, recipe):
    """TE >= 2.8 `te.autocast(recipe=)`, else the older `te.fp8_autocast(fp8_recipe=)`."""
    autocast = getattr(te, "autocast", None)
    if autocast is not None:
        return autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def test_tensors(quick: bool):
    """(name, CUDA tensor) cases: random shapes in bf16 and fp32, then amax edge cases (zeros, tiny, subnormal,
    huge, one outlier, a block scale underflow, inf, nan, rounding ties), each in fp32 and bf16."""
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(128, 128), (256, 1024), (512, 4096), (1040, 2048)] + ([] if quick else [(2048, 2048)])
    cases = []
    for shape in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            cases.append((f"randn{shape}-{dtype}", torch.randn(*shape, generator=g, device="cuda").to(dtype)))
    base = torch.randn(256, 512, generator=g, device="cuda")
    edge = {
        "zeros": torch.zeros(64, 128, device="cuda"),
        "tiny1e-30": base * 1e-30, "subnormal": base * 1e-41, "huge1e30": base * 1e30, "fltmax": base * 1e37,
        "one_outlier": base.clone().index_put_((torch.tensor([3]), torch.tensor([7])), torch.tensor(1e4)),
        "scale_underflow": torch.cat([base[:, :16] * 1e-6, base[:, 16:] * 1e3], dim=1),
        "with_inf": base.clone().index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(float("inf"))),
        "with_nan": base.clone().index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(float("nan"))),
        "ties": (torch.randint(0, 13, (64, 128), device="cuda").float() * 0.25 - 1.5) * 448 / 6,
    }
    cases += [(k, v) for k, v in edge.items()] + [(k + "-bf16", v.bfloat16()) for k, v in edge.items()]
    return cases
