"""The step's host side never waits for the GPU where it need not (issue 37: the 8B profiles on the H100 showed the GPU
idle at every step start after a copy from pageable host memory, which waits for every kernel queued before it).

Each test queues a long GPU sleep (torch.cuda._sleep, ~1 s), then runs one piece of the step's host side (a second
time, as in steady state: the first run fills the caching allocators), and then asks whether the stream is still busy:
a piece that waited for the GPU returns after the sleep (the stream idle), one that did not returns at once (the sleep
still running). No wall-clock bound is asserted; the sleep is ~10^4 times
longer than what the host does in between. Runs on the GPU only (seconds)."""
from __future__ import annotations

import pytest
import torch

import lifecycle_support as ls

if ls.device() != "cuda":
    pytest.skip("needs a CUDA device (the pinned copies and stream queries are CUDA's)", allow_module_level=True)
pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 2_000_000_000  # ~1 s at the H100/H200's ~2 GHz


def _busy_after(fn):
    """(fn's result, whether the stream still ran the queued sleep when fn returned). fn runs once before, so that the
    caching allocators (device and pinned host memory) hold its blocks, as they do from a run's second step on."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    out = fn()
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return out, busy


def test_a_batch_goes_to_the_gpu_without_waiting(record):
    from trainer.step.evaluate import move_batch

    g = torch.Generator().manual_seed(0)
    batch = {"tokens": torch.randint(0, 1000, (1, 8192), generator=g), "labels": torch.randint(0, 1000, (1, 8192)),
             "loss_mask": torch.ones(1, 8192), "cu_seqlens": torch.tensor([0, 4000, 8192], dtype=torch.int32)}
    moved, busy = _busy_after(lambda: move_batch(batch, torch.device("cuda")))
    record(stream_busy_after_move=busy)
    assert moved["tokens"].is_cuda and moved["cu_seqlens"].device.type == "cpu"  # cu_seqlens stays on the host
    assert torch.equal(moved["tokens"].cpu(), batch["tokens"]) and torch.equal(moved["labels"].cpu(), batch["labels"])
    assert busy, "moving a batch waited for the queued kernels (a copy from pageable memory)"


def test_the_step_header_of_one_rank_does_not_wait(record):
    from trainer.step.loss import step_header

    (n, stop, totals), busy = _busy_after(
        lambda: step_header(4000.0, False, True, torch.device("cuda"), extras=(8192.0, 1.0)))
    record(stream_busy_after_header=busy)
    assert float(n) == 4000.0 and not stop and totals == [4000.0, 8192.0, 1.0]
    assert busy, "the step header of a one-rank run waited for the GPU"


def test_the_grad_norm_and_clip_do_not_wait(record):
    from trainer.step.optim import clip_gradients

    params = []
    for i in range(256):
        p = torch.nn.Parameter(torch.zeros(16, 64, device="cuda"))
        p.grad = torch.empty(16, 64, device="cuda")
        params.append(p)

    def step():  # the gradients as a backward leaves them (fill kernels), then the norm and clip: the warm-up call
        for i, p in enumerate(params):  # clipped them to norm 1 (the H100, 2026-12-06: the second call read 1.0)
            p.grad.fill_(0.01 * (i % 7))
        return clip_gradients(params, 1.0)

    norm, busy = _busy_after(step)
    record(stream_busy_after_clip=busy)
    ref = sum(float((0.01 * (i % 7)) ** 2) * 16 * 64 for i in range(256)) ** 0.5
    assert float(norm) == pytest.approx(ref, rel=1e-5)
    assert busy, "the grad norm / clip waited for the GPU"
