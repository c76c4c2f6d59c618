"""Triton passes for the chunked loss's softmax cross-entropy (trainer/model/chunked_loss.py), each with the torch ops
it replaces.

    m, s, t = row_stats(logits, target)                  # per row: max, sum of exp(x - max), logit at the target
    top, total, loss = combine(m, s, t, mine, reduce_max, reduce_sum)   # across the TP group ([rows] tensors)
    logits = softmax_grad_(logits, target, top, total)   # softmax - onehot, in place in the logits' dtype

The torch path turns each chunk's bf16 logits ([rows, vocab/tp], the output layer's GEMM result) into fp32 and runs
~10 elementwise passes over them (.float(), max, sub_, gather, exp_, sum, div_, scatter_add_, .to(bf16)): ~18 ms of a
~555 ms Llama-3-8B iteration (8192 tokens, vocab 128256, 16 chunks of 523 rows; 2026-12-05 H100 profile). Here one
program per row streams the row's bf16 logits in BLOCK_V columns: the stats pass reads them once (online softmax in
fp32: running max, sum rescaled when the max grows), the gradient pass reads them once more and writes the gradient
over them. No fp32 copy of the logits exists. `target` is the row's label in this rank's shard, -1 where the label
is another rank's (or ignored).

Measured on an H200 (2026-12-05, bench/kernel_check.py in two short calls while the kernel was written, with
megatron-core but without TE; the output was not kept, so the next device call's kernel_check reruns it; one 523-row
chunk, bf16): stats 50 us (2.7 TB/s read), grad
78 us (3.4 TB/s read + write) at BLOCK_V 8192 / 8 warps (4096: stats 62 us; 2048: 83 us); the chunk's GEMMs + CE +
gradient 1.77-1.82 ms against the torch path's 2.61-2.75 ms (GEMMs alone 1.47-1.59 ms): ~0.9 ms a chunk, ~14 ms of
the 8B iteration's 16 chunks. The dh it gives is the torch path's within 0.24 % of its largest value (bf16 rounding of
the logit gradient), the loss within 1e-6.

The kernels run where `ce_kernel_usable(device, dtype)` (an NVIDIA GPU with Triton, or Triton's CPU interpreter,
TRITON_INTERPRET=1); tests/test_chunked_loss_kernel.py runs them in the interpreter against the torch path, and
bench/kernel_check.py on the GPU at the 8B's widths.
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK_V = 8192  # vocab columns a program holds at once (read at call time: the tests set a smaller one)
NUM_WARPS = 8
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def ce_kernel_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """The CE passes run on `device` for logits of `dtype`: 16-bit logits on an NVIDIA GPU with Triton (never ROCm),
    or any of _DTYPES in Triton's CPU interpreter (the tests). A GPU's fp32 run keeps the torch path, as the contract
    says (primus_contract rules_dependent: an NVIDIA GPU and BF16; the bf16 logits are the case that pays, and the
    GPU's exp would not match torch's fp32 bit for bit; audit, 2026-12-06)."""
    from trainer.model.lora.kernels import triton_runs_on

    if dtype == torch.float32 and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return dtype in _DTYPES and triton_runs_on(device)


if triton is not None:
    @triton.jit
    def _stats_kernel(x_ptr, tgt_ptr, m_ptr, s_ptr, t_ptr, V, sx, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * sx
        m = -float("inf")
        s = 0.0
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))  # finite: every block holds at least one column
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)  # masked columns: exp(-inf) = 0
            m = m_new
        tgt = tl.load(tgt_ptr + row)
        t = tl.load(base + tl.maximum(tgt, 0), mask=tgt >= 0, other=0.0).to(tl.float32)
        tl.store(m_ptr + row, m)
        tl.store(s_ptr + row, s)
        tl.store(t_ptr + row, t)

    @triton.jit
    def _grad_kernel(x_ptr, tgt_ptr, m_ptr, s_ptr, V, sx, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * sx
        m = tl.load(m_ptr + row)
        inv = 1.0 / tl.load(s_ptr + row)
        tgt = tl.load(tgt_ptr + row)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = cols < V
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            p = tl.exp(x - m) * inv
            p = tl.where(cols == tgt, p - 1.0, p)
            tl.store(base + cols, p.to(x_ptr.dtype.element_ty), mask=mask)


def row_stats(logits: torch.Tensor, target: torch.Tensor):
    """(m, s, t), fp32 [rows] each, of logits [rows, V] (any float dtype, rows contiguous): the row max m, sum of
    exp(x - m) and the raw logit at `target` (0 where target is -1). Replaces the torch path's logits.float(),
    .max(dim=1), sub_, gather, exp_ and sum(dim=1)."""
    rows, v = logits.shape
    assert logits.stride(1) == 1
    m, s, t = (torch.empty(rows, dtype=torch.float32, device=logits.device) for _ in range(3))
    if rows:
        _stats_kernel[(rows,)](logits, target.contiguous(), m, s, t, v, logits.stride(0), BLOCK_V=BLOCK_V,
                               num_warps=NUM_WARPS)
    return m, s, t


def combine(m, s, t, mine, reduce_max=None, reduce_sum=None):
    """(top, total, loss) from this rank's row_stats over its vocab shard: the global max, the global sum of
    exp(x - top) and the per-row CE log(total) - (x_target - top), the torch path's formula. reduce_max/reduce_sum
    all-reduce a tensor in place across the TP group (None: one rank). Two collectives: MAX of m, SUM of the stacked
    [2, rows] (rescaled sums, target logit minus the max where this rank holds the label)."""
    top = m.clone()
    if reduce_max is not None:
        reduce_max(top)
    sums = torch.stack([s * torch.exp(m - top), (t - top) * mine])
    if reduce_sum is not None:
        reduce_sum(sums)
    return top, sums[0], torch.log(sums[0]) - sums[1]


def softmax_grad_(logits: torch.Tensor, target: torch.Tensor, top: torch.Tensor, total: torch.Tensor):
    """dCE/dlogits = exp(x - top) / total - onehot(target), written over `logits` in its own dtype (returned).
    Replaces the torch path's sub_, exp_, div_, scatter_add_ and .to(weight.dtype) (on the fp32 copy)."""
    rows, v = logits.shape
    assert logits.stride(1) == 1
    if rows:
        _grad_kernel[(rows,)](logits, target.contiguous(), top.contiguous(), total.contiguous(), v,
                              logits.stride(0), BLOCK_V=BLOCK_V, num_warps=NUM_WARPS)
    return logits
