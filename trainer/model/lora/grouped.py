"""LoRA for grouped expert linears (TE's GroupedLinear in megatron's TEGroupedMLP: one GEMM for all
local experts, weights weight0..weight{E-1}, called as linear(x, m_splits) on expert-sorted tokens).

    y = base(x, m_splits) + scale * concat_e( B_e A_e x_e ),   x_e = rows of expert e (m_splits[e])

Each local expert e has its own factors at `<linear>.lora.<e>.lora_a|lora_b` (A [r, in], B [out, r],
fp32 masters like trainer.model.lora.layers), so checkpoints, resharding over expert parallelism
(trainer.model.layout renames the local expert index to the global one) and PEFT export treat them
like SequentialMLP's per-expert adapters. Experts are never tensor-parallel here. The adapter GEMMs
run as two grouped GEMMs (torch._grouped_mm) on CUDA bf16 where it exists and passes a forward +
backward self-check against per-expert GEMMs (once per device), else one small GEMM pair per expert.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def dropout_per_tp_rank(dropout: nn.Module, t: torch.Tensor, per_rank: bool) -> torch.Tensor:
    """Dropout with megatron's RNG rules: a tensor that differs across the TP ranks (a hidden or sequence shard, or
    a rank's own tokens) draws from the model-parallel tracker, seeded per TP rank, so each rank gets its own mask;
    a tensor every TP rank holds whole draws from the default generator, equal across TP ranks, so all keep the
    same mask."""
    if not per_rank:
        return dropout(t)
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    with get_cuda_rng_tracker().fork():
        return dropout(t)


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


_GROUPED_MM: dict[str, bool] = {}  # device -> torch._grouped_mm passed the self-check there


def _grouped_mm_usable(device: torch.device) -> bool:
    """Once per device: torch._grouped_mm exists and its forward AND backward match per-expert GEMMs
    on a small problem (uneven groups, one empty); anything else -> the per-expert loop."""
    key = str(device)
    if key not in _GROUPED_MM:
        _GROUPED_MM[key] = False
        if hasattr(torch, "_grouped_mm") and device.type == "cuda":
            try:
                with torch.enable_grad():  # the first call may come from an eval (no_grad) pass
                    _GROUPED_MM[key] = _self_check(device)
            except Exception:  # noqa: BLE001  (unsupported GPU, dtype, layout or no autograd)
                pass
    return _GROUPED_MM[key]


def _self_check(device) -> bool:
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(40, 64, generator=g).to(device, torch.bfloat16).requires_grad_(True)
    w = torch.randn(3, 64, 16, generator=g).to(device, torch.bfloat16).requires_grad_(True)
    splits = [13, 0, 27]
    offs = torch.tensor(splits, device=device).cumsum(0).to(torch.int32)
    got = torch._grouped_mm(x, w, offs=offs)
    got.float().square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    want = torch.cat([p @ w[e] for e, p in enumerate(torch.split(x, splits))])
    want.float().square().sum().backward()
    close = lambda a, b: torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)  # noqa: E731
    return close(got, want) and close(gx, x.grad) and close(gw, w.grad)


def grouped_lora_delta(x: torch.Tensor, m_splits, adapters, scale: float) -> torch.Tensor:
    """scale * B_e A_e x_e for every expert's rows of x (expert-sorted, m_splits rows each)."""
    splits = [int(m) for m in m_splits]
    a = torch.stack([ad.lora_a for ad in adapters]).to(x.dtype)  # [E, r, in]
    b = torch.stack([ad.lora_b for ad in adapters]).to(x.dtype)  # [E, out, r]
    # torch._grouped_mm needs 16-byte strides: a rank of 8, 16, ... in BF16 (rank 4 failed on the H200, 2026-12-02)
    if x.dtype == torch.bfloat16 and a.shape[1] % 8 == 0 and _grouped_mm_usable(x.device):
        offs = torch.tensor(splits, device=x.device).cumsum(0).to(torch.int32)
        h = torch._grouped_mm(x.contiguous(), a.transpose(1, 2).contiguous(), offs=offs)
        return torch._grouped_mm((h * scale).contiguous(), b.transpose(1, 2).contiguous(), offs=offs)
    parts = torch.split(x, splits)
    return torch.cat([F.linear(F.linear(p, a[e]) * scale, b[e]) for e, p in enumerate(parts)])


class GroupedLoRALinear(nn.Module):
    """A frozen grouped expert linear plus one LoRA adapter per local expert."""

    def __init__(self, base: nn.Module, dim: int, alpha: float, dropout: float, dropout_position: str,
                 init_pairs: list[tuple[torch.Tensor, torch.Tensor]], tokens_per_rank: bool = False):
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
        self.tokens_per_rank = tokens_per_rank  # TP > 1 (with SP): each TP rank routes its own tokens here
        device = base.weight0.device
        self.lora = nn.ModuleList(ExpertAdapter(a.to(device), b.to(device)) for a, b in init_pairs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["base"], name)

    def forward(self, x: torch.Tensor, m_splits, *args, **kwargs):
        out, bias = self.base(x, m_splits, *args, **kwargs)
        pre, post = (self.dropout is not None and self.dropout_position == p for p in ("pre", "post"))
        inp = dropout_per_tp_rank(self.dropout, x, self.tokens_per_rank) if pre else x
        delta = grouped_lora_delta(inp, m_splits, list(self.lora), self.scale)
        if post:
            delta = dropout_per_tp_rank(self.dropout, delta, self.tokens_per_rank)
        return out + delta.to(out.dtype), bias
