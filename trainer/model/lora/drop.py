"""LoRA pre-dropout for the fused adapter paths: the same draw nn.Dropout makes, and the mask kept for backward.

    xd, keep = draw(x, p)          # xd == F.dropout(x, p, training=True) from the same generator state, bit for bit
    dx = undrop(g, keep, p)        # == the gradient F.dropout's autograd node gives g

F.dropout (torch's at::dropout) draws differently by device: on a GPU it is native_dropout (a Philox mask, kept as
bool, backward native_dropout_backward(g, mask, 1/(1-p))); on CPU it is x * noise with noise = bernoulli(1-p) / (1-p)
in x's dtype (backward g * noise). `draw` makes the same calls in the same order, so a fused path fed the same RNG
state drops the same elements as the unfused path (tests/test_lora_epilogue.py pins it on CPU; on a GPU both are
native_dropout by construction).
"""
from __future__ import annotations

import torch


def draw(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x dropped and rescaled, keep): keep is the bool mask (GPU) or the scaled noise in x's dtype (CPU)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"dropout probability must be in (0, 1), got {p}")
    x = x.contiguous()
    if x.device.type == "cpu":
        noise = torch.empty_like(x).bernoulli_(1 - p).div_(1 - p)
        return x * noise, noise
    out, mask = torch.ops.aten.native_dropout(x, p, True)
    return out, mask


def undrop(g: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """The dropout's backward of `g` with the kept mask (the same op F.dropout's autograd node runs)."""
    if keep.dtype == torch.bool:
        return torch.ops.aten.native_dropout_backward(g, keep, 1.0 / (1.0 - p))
    return g * keep


def keep_scale(keep: torch.Tensor, p: float) -> float:
    """The factor a kernel multiplies the kept mask by (1/(1-p) for a bool mask; the CPU noise holds it already)."""
    return 1.0 / (1.0 - p) if keep.dtype == torch.bool else 1.0
