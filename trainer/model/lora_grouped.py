"""LoRA for grouped expert linears (TE's GroupedLinear in megatron's TEGroupedMLP: one GEMM for all
local experts, weights weight0..weight{E-1}, called as linear(x, m_splits) on expert-sorted tokens).

    y = base(x, m_splits) + scale * concat_e( B_e A_e x_e ),   x_e = rows of expert e (m_splits[e])

Each local expert e has its own factors at `<linear>.lora.<e>.lora_a|lora_b` (A [r, in], B [out, r],
fp32 masters like trainer.model.lora), so checkpoints, resharding over expert parallelism
(trainer.model.layout renames the local expert index to the global one) and PEFT export treat them
like SequentialMLP's per-expert adapters. Experts are never tensor-parallel here. The adapter GEMMs
run as two grouped GEMMs (torch._grouped_mm) on CUDA bf16 where available, else one small GEMM pair
per expert.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def is_grouped_linear(module: nn.Module) -> bool:
    w0 = getattr(module, "weight0", None)
    return isinstance(getattr(module, "num_gemms", None), int) and isinstance(w0, torch.Tensor) and w0.dim() == 2


class ExpertAdapter(nn.Module):
    """One expert's LoRA factors (fp32 masters)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        super().__init__()
        self.lora_a = nn.Parameter(a.float().contiguous())
        self.lora_b = nn.Parameter(b.float().contiguous())
        for p in (self.lora_a, self.lora_b):
            p.tensor_model_parallel = False
            p.allreduce = False  # expert grads: summed over the expert data-parallel group (trainer.optim)


_GROUPED_MM_OK = [True]  # flipped off after the first failure (unsupported GPU / dtype / layout)


def _grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor):
    """x [T, k] @ w[e] [k, n] for the rows of each expert (offs = cumulative row ends), or None."""
    if not (_GROUPED_MM_OK[0] and x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")):
        return None
    try:
        return torch._grouped_mm(x, w, offs=offs)
    except (RuntimeError, TypeError, NotImplementedError):
        _GROUPED_MM_OK[0] = False
        return None


def grouped_lora_delta(x: torch.Tensor, m_splits, adapters, scale: float) -> torch.Tensor:
    """scale * B_e A_e x_e for every expert's rows of x (expert-sorted, m_splits rows each)."""
    splits = [int(m) for m in m_splits]
    a = torch.stack([ad.lora_a for ad in adapters]).to(x.dtype)  # [E, r, in]
    b = torch.stack([ad.lora_b for ad in adapters]).to(x.dtype)  # [E, out, r]
    offs = torch.tensor(splits, device=x.device).cumsum(0).to(torch.int32)
    h = _grouped_mm(x, a.transpose(1, 2).contiguous(), offs)
    if h is not None:
        out = _grouped_mm((h * scale).contiguous(), b.transpose(1, 2).contiguous(), offs)
        if out is not None:
            return out
    parts = torch.split(x, splits)
    return torch.cat([F.linear(F.linear(p, a[e]) * scale, b[e]) for e, p in enumerate(parts)])


class GroupedLoRALinear(nn.Module):
    """A frozen grouped expert linear plus one LoRA adapter per local expert."""

    def __init__(self, base: nn.Module, dim: int, alpha: float, dropout: float, dropout_position: str,
                 init_pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        super().__init__()
        if dropout_position not in ("pre", "post"):
            raise ValueError(f"lora.dropout_position must be pre|post, got {dropout_position!r}")
        if len(init_pairs) != base.num_gemms:
            raise ValueError(f"{len(init_pairs)} adapter inits for {base.num_gemms} experts")
        self.base = base
        self.is_expert = True
        self.scale = float(alpha) / float(dim)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.dropout_position = dropout_position
        device = base.weight0.device
        self.lora = nn.ModuleList(ExpertAdapter(a.to(device), b.to(device)) for a, b in init_pairs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["base"], name)

    def forward(self, x: torch.Tensor, m_splits, *args, **kwargs):
        out, bias = self.base(x, m_splits, *args, **kwargs)
        inp = self.dropout(x) if self.dropout is not None and self.dropout_position == "pre" else x
        delta = grouped_lora_delta(inp, m_splits, list(self.lora), self.scale)
        if self.dropout is not None and self.dropout_position == "post":
            delta = self.dropout(delta)
        return out + delta.to(out.dtype), bias
