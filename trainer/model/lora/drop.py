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

# dropout_recomputable(p, dtype): whether x * mask * scale in backward reproduces native_dropout's forward output bit for
# bit at p on an input of that dtype (see below): the contract's rule, which the planner and `validate` read too
from primus_contract.dropout_rebuild import dropout_recomputable

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def recomputable(p: float, dtype: torch.dtype = torch.float32) -> bool:
    """The contract's rule for an input of `dtype` (float64 and others take float32's, which holds for any)."""
    return dropout_recomputable(p, _DTYPE_NAMES.get(dtype, "float32"))


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


# --- trainer.lora.dropout_recompute: the dropped copy recomputed in backward from the input and a bit-packed mask ---
#
#     store, packed = kept_drop(keep, p, dtype)  # keep packed 8 to a byte where recomputable(p, dtype), else None
#     xd, keep = store.restore(x, packed)  # in backward: keep as draw made it, xd == draw's xd bit for bit
#
# A fused or epilogue adapter under pre-dropout needs drop(x) for dA and the mask for dx. Kept as they are that is
# 3 bytes an element (the BF16 dropped copy and a bool mask). Kept as x and 1 bit an element it is 2.125, and 0.125
# where x is kept by another op anyway (linear_proj's input is the attention output, which the core attention keeps):
# autograd then holds one storage for both. The recompute is one elementwise pass in backward, the op F.dropout's own
# backward runs, so xd comes out bitwise: on a GPU native_dropout scales by float32(1 / float32(1 - p)) in its forward
# and its backward by float32(1 / (1 - p)); `recomputable` keeps the dropped copy for a p where the two differ and the
# input's dtype does not hide it (p = 0.1, the MLPerf recipes', is not one: tests/gpu/test_fp8_epilogue.py checks it
# there; at p = 0.15 a float32 input differs, a bfloat16 one rebuilds: primus_contract/dropout_rebuild.py decides it
# over every bfloat16 value, and the GPU test runs them all). On CPU the keep is the scaled
# noise (1 / (1 - p) in x's dtype) and xd = x * noise: rebuilt from its bits by the same division.


_SHIFTS: dict = {}


def _shifts(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _SHIFTS:
        _SHIFTS[key] = torch.arange(8, dtype=torch.uint8, device=device)
    return _SHIFTS[key]


def pack_keep(keep: torch.Tensor) -> torch.Tensor:
    """keep [..., n] (the bool mask, or the CPU noise: nonzero where kept) as bits, 8 to a byte along the last
    dimension: uint8 [rows, ceil(n / 8)], bit j of byte i holding element 8 i + j (rows: the leading dimensions)."""
    n = keep.shape[-1]
    bits = keep.reshape(-1, n)
    bits = bits if bits.dtype == torch.bool else bits != 0
    pad = (-n) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(bits.shape[0], pad)], dim=1)
    return (bits.view(bits.shape[0], -1, 8).to(torch.uint8) << _shifts(keep.device)).sum(-1, dtype=torch.uint8)


def unpack_keep(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The bool mask [rows, n] that pack_keep packed."""
    bits = (packed.unsqueeze(-1) >> _shifts(packed.device)) & 1
    return bits.view(packed.shape[0], -1)[:, :n].bool()


class KeptDrop:
    """What a node needs to rebuild (xd, keep) of a pre-dropout in backward: the keep's shape and kind (the bool
    mask, or the CPU noise's dtype), p, and whether the Triton passes run (trainer.model.lora.bits). The tensors, x
    and the packed mask, go through save_for_backward."""
    __slots__ = ("shape", "noise_dtype", "p", "kernels")

    def __init__(self, keep: torch.Tensor, p: float, kernels: bool = False):
        self.shape, self.p, self.kernels = keep.shape, p, kernels
        self.noise_dtype = None if keep.dtype == torch.bool else keep.dtype

    def restore(self, x: torch.Tensor, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(xd as a 2-D [tokens, width], keep as draw returned it), from the undropped x and the packed mask."""
        n = self.shape[-1]
        if self.kernels:  # one pass: x and the bits read, xd and the mask written (trainer.model.lora.bits)
            from trainer.model.lora.bits import undrop_bits

            scale = 1.0 / (1.0 - self.p) if self.noise_dtype is None else _noise_value(self.noise_dtype, self.p)
            xd, keep = undrop_bits(x.reshape(-1, n), packed, scale, self.noise_dtype)
            return xd, keep.view(self.shape)
        keep = unpack_keep(packed, n).view(self.shape)
        if self.noise_dtype is not None:  # the CPU noise: bernoulli's 0/1 in x's dtype divided as draw divides it
            keep = keep.to(self.noise_dtype).div_(1 - self.p)
        return undrop(x.reshape(self.shape), keep, self.p).reshape(-1, n), keep


def _noise_value(dtype: torch.dtype, p: float) -> float:
    """The kept elements' value of draw's CPU noise: 1 divided by (1 - p) in `dtype`, as draw divides."""
    return torch.ones(1, dtype=dtype).div_(1 - p).item()


def kept_drop(keep: torch.Tensor | None, p: float, dtype: torch.dtype, kernels: bool = False) -> tuple[
        KeptDrop | None, torch.Tensor | None]:
    """(KeptDrop, the packed mask) for a node to keep instead of the dropped copy and the mask, or (None, None) where
    there is no dropout or a GPU's recompute would not be bitwise on an input of `dtype` (recomputable; the CPU noise
    always is). kernels: pack and rebuild with the Triton passes (trainer.model.lora.bits; where the node's kernels
    run)."""
    if keep is None or not p or (keep.dtype == torch.bool and not recomputable(p, dtype)):
        return None, None
    if kernels:
        from trainer.model.lora.bits import pack_bits

        return KeptDrop(keep, p, True), pack_bits(keep.reshape(-1, keep.shape[-1]))
    return KeptDrop(keep, p), pack_keep(keep)


def kept_for_grad(x: torch.Tensor, xd: torch.Tensor, keep, p: float, u=None, act=None, recompute_drop: bool = False,
                  kernels: bool = False):
    """What an adapter node saves for dA = dh^T xd (and dx's mask): (kept, keep or its bits, KeptDrop or None, the
    act in effect). x: the adapter's input; xd: its dropped copy (x itself without dropout); (u, act): x = act(u)
    recomputable from u, which another op keeps anyway (trainer.model.lora.inputs, the norm epilogue's
    recompute.norm_output). With dropout u is used only with recompute_drop where the recompute is bitwise. kernels:
    the mask packed and the copy rebuilt by Triton passes (trainer.model.lora.bits)."""
    if keep is None:
        return (u, None, None, act) if u is not None else (xd, None, None, None)
    store, packed = kept_drop(keep, p, x.dtype, kernels) if recompute_drop else (None, None)
    if store is None:
        return xd, keep, None, None
    return (u, packed, store, act) if u is not None else (x, packed, store, None)


def input_for_grad(kept: torch.Tensor, keep, store, act) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the 2-D input of dA, the mask for dx) in backward from what kept_for_grad kept."""
    with torch.no_grad():
        full = kept if act is None else act(kept)
        if store is not None:
            return store.restore(full, keep)
        return full.reshape(-1, full.shape[-1]), keep
