"""trainer/model/ce_kernel.py's Triton CE passes, through trainer.model.chunked_loss's kernel path, in Triton's
interpreter against the torch path: per-token loss and the hidden's gradient (fp32 and bf16; a vocab the block does
not divide, several chunks, labels at the first and last ids and ignored ones; evaluation without the gradient);
two vocab shards (TP=2 as two threads whose all-reduces meet at a barrier) against the unsharded loss. Without the
interpreter on CPU the flag changes nothing: the torch path, bit for bit."""
from __future__ import annotations

import pytest
import torch

from tests.model_helpers import interpreted

SCRIPT = r"""
import threading
import torch
import torch.distributed as dist
from trainer.model import ce_kernel, chunked_loss

ce_kernel.BLOCK_V = 128                      # vocab 300: two full blocks and a ragged one
ROWS, VOCAB, HIDDEN, CHUNK = 37, 300, 24, 10  # 4 chunks, the last one ragged
g = torch.Generator().manual_seed(0)
h32 = torch.randn(ROWS, HIDDEN, generator=g)
w32 = torch.randn(VOCAB, HIDDEN, generator=g) * 0.3
labels = torch.randint(0, VOCAB, (ROWS,), generator=g)
labels[:6] = torch.tensor([0, VOCAB - 1, -100, 149, 150, 0])  # ends of the vocab and of both shards, one ignored
dout = torch.rand(ROWS, generator=g)


def ce(hidden, weight, kernel, tp=1, v0=0, want_grad=True, label=labels):
    x = hidden.clone().requires_grad_(want_grad)
    loss = chunked_loss._FrozenOutputCE.apply(x, weight, label, CHUNK, None, tp, v0, want_grad, kernel)
    grad = torch.autograd.grad(loss, x, dout.to(loss.dtype))[0] if want_grad else None
    return loss.detach(), grad


def close(name, got, ref, rtol, atol):
    diff = (got.float() - ref.float()).abs()
    rel = (diff / ref.float().abs().clamp_min(1e-6)).max().item()
    print(f"DIFF {name} max_abs {diff.max().item():.3g} max_rel {rel:.3g}")
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


for dtype, rtol, atol in ((torch.float32, 1e-5, 1e-6), (torch.bfloat16, 1.6e-2, 1e-3)):
    h, w = h32.to(dtype), w32.to(dtype)
    (loss_k, grad_k), (loss_t, grad_t) = ce(h, w, True), ce(h, w, False)
    close(f"{dtype} loss", loss_k, loss_t, 1e-5, 1e-5)  # fp32 from the same logits on both paths
    close(f"{dtype} grad", grad_k, grad_t, rtol, atol)
    assert grad_k.dtype == dtype
    close(f"{dtype} eval loss", ce(h, w, True, want_grad=False)[0], loss_t, 1e-5, 1e-5)

# the flag through chunked_output_loss ([s, b, h] in, [s, b] out)
hs = h32.view(ROWS, 1, HIDDEN).requires_grad_(True)
per_token = chunked_loss.chunked_output_loss(hs, w32, labels.view(ROWS, 1), False, kernel=True)
close("chunked_output_loss", per_token.view(ROWS), ce(h32, w32, False)[0], 1e-5, 1e-5)


class TwoRanks:
    # TP=2 without processes: each rank a thread; all_reduce deposits its tensor and reduces both at a barrier
    def __init__(self):
        self.bar, self.slot = threading.Barrier(2), [None, None]
        self.tls, self.lock = threading.local(), threading.Lock()

    def all_reduce(self, x, op=dist.ReduceOp.SUM, group=None):
        self.slot[self.tls.rank] = x.clone()
        self.bar.wait()
        x.copy_(torch.maximum(*self.slot) if op == dist.ReduceOp.MAX else self.slot[0] + self.slot[1])
        self.bar.wait()

    def locked(self, fn):  # one interpreted kernel at a time
        def run(*args):
            with self.lock:
                return fn(*args)
        return run

    def run(self, fn):
        out, errors = [None, None], []

        def go(rank):
            self.tls.rank = rank
            try:
                out[rank] = fn(rank)
            except BaseException as err:
                errors.append(err)
                self.bar.abort()
        threads = [threading.Thread(target=go, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


ranks = TwoRanks()
dist.all_reduce = ranks.all_reduce
ce_kernel.row_stats, ce_kernel.softmax_grad_ = ranks.locked(ce_kernel.row_stats), ranks.locked(ce_kernel.softmax_grad_)
ref_loss, ref_grad = ce(h32, w32, False)
shard = VOCAB // 2
for kernel in (False, True):
    (l0, g0), (l1, g1) = ranks.run(lambda r: ce(h32, w32[r * shard:(r + 1) * shard], kernel, tp=2, v0=r * shard))
    assert torch.equal(l0, l1)
    close(f"tp2 kernel={kernel} loss", l0, ref_loss, 1e-5, 1e-5)
    close(f"tp2 kernel={kernel} grad", g0 + g1, ref_grad, 1e-5, 1e-6)
print("ce kernel ok")
"""


def test_kernel_path_matches_the_torch_path_in_the_interpreter():
    pytest.importorskip("triton")
    done = interpreted("-c", SCRIPT, timeout=120)
    assert done.returncode == 0 and "ce kernel ok" in done.stdout, done.stdout + done.stderr[-3000:]
    print(done.stdout)


def test_cpu_without_the_interpreter_is_the_torch_path_bitwise(monkeypatch):
    from trainer.model import ce_kernel, chunked_loss

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not ce_kernel.ce_kernel_usable(torch.device("cpu"), torch.float32)
    # a GPU's fp32 run keeps the torch path too (the contract: an NVIDIA GPU and BF16); its bf16 run takes the kernel
    monkeypatch.setattr("trainer.model.lora.kernels.triton_runs_on", lambda device: True)
    assert not ce_kernel.ce_kernel_usable(torch.device("cuda"), torch.float32)
    assert ce_kernel.ce_kernel_usable(torch.device("cuda"), torch.bfloat16)
    monkeypatch.undo()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def never(*_args):
        raise AssertionError("the CE kernel ran on CPU without the interpreter")

    monkeypatch.setattr(ce_kernel, "row_stats", never)
    monkeypatch.setattr(ce_kernel, "softmax_grad_", never)
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        h = torch.randn(23, 16, generator=g).to(dtype)
        w = (torch.randn(50, 16, generator=g) * 0.3).to(dtype)
        labels = torch.randint(0, 50, (23,), generator=g)
        out = []
        for kernel in (True, False):
            x = h.clone().requires_grad_(True)
            loss = chunked_loss._FrozenOutputCE.apply(x, w, labels, 7, None, 1, 0, True, kernel)
            loss.backward(torch.ones_like(loss))
            out.append((loss.detach(), x.grad))
        assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
