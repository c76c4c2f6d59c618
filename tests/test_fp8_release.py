"""When FP8 weight transposes are made and freed (trainer.precision.fp8_release), with a CPU stand-in for TE.

TE is not on the CPU machines, so the frozen FP8 weight here is a stand-in with TE's usage interface
(get_usages / update_usage) whose linear makes the transpose in its backward, as TE's does for a primary-FP8
weight on Hopper (`weight_fp8.update_usage(columnwise_usage=True)` before the dgrad GEMM). The test logs every
make and free and checks: without the release every transpose is alive at the end of the backward (the 70B's
out-of-memory); with it at most one is alive at any time, each is freed right after its own dgrad, without and
with recompute (torch.utils.checkpoint re-runs the forward inside the backward, as megatron's full recompute
does), and the gradients are bit-identical."""
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from trainer.precision.fp8_params import release_transposes
from trainer.precision.fp8_release import release_after_backward


class Log:
    def __init__(self):
        self.events, self.live, self.peak = [], 0, 0

    def made(self, name):
        self.live += 1
        self.peak = max(self.peak, self.live)
        self.events.append(("made", name))

    def freed(self, name):
        self.live -= 1
        self.events.append(("freed", name))


class StandInFP8Weight(nn.Parameter):
    """Frozen weight with TE's usage interface: row-wise data always, a column-wise copy on demand."""

    def __new__(cls, data, name, log):
        p = super().__new__(cls, data, requires_grad=False)
        p.label, p.log, p.transpose = name, log, None
        return p

    def get_usages(self):
        return {"rowwise": True, "columnwise": self.transpose is not None}

    def update_usage(self, rowwise_usage=None, columnwise_usage=None):
        if columnwise_usage and self.transpose is None:
            self.transpose = self.detach().t().contiguous()
            self.log.made(self.label)
        elif columnwise_usage is False and self.transpose is not None:
            self.transpose = None
            self.log.freed(self.label)


class _Gemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.weight = weight
        return x @ weight.detach().t()

    @staticmethod
    def backward(ctx, grad):
        w = ctx.weight
        w.update_usage(columnwise_usage=True)  # what TE's dgrad asks for
        return grad @ w.transpose.t(), None


class StandInLinear(nn.Module):
    def __init__(self, n_in, n_out, name, log, gen):
        super().__init__()
        self.weight = StandInFP8Weight(torch.randn(n_out, n_in, generator=gen) / n_in ** 0.5, name, log)

    def forward(self, x):
        return _Gemm.apply(x, self.weight)


class Block(nn.Module):
    """x + fc2(relu(fc1(x)) + a trainable adapter): the residual feeds two consumers, like a transformer layer."""

    def __init__(self, i, h, log, gen):
        super().__init__()
        self.fc1 = StandInLinear(h, 2 * h, f"{i}.fc1", log, gen)
        self.fc2 = StandInLinear(2 * h, h, f"{i}.fc2", log, gen)
        self.adapter = nn.Parameter(torch.randn(h, h, generator=gen) * 0.01)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x))) + x @ self.adapter


class Stack(nn.Module):
    def __init__(self, layers, h, log, recompute):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.blocks = nn.ModuleList(Block(i, h, log, gen) for i in range(layers))
        self.recompute = recompute

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=self.recompute == "reentrant") if self.recompute else b(x)
        return x


def _run(layers, recompute, release):
    log = Log()
    model = Stack(layers, 8, log, recompute)
    if release:
        assert release_after_backward(model) == 2 * layers
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=recompute == "reentrant")
    model(x).square().sum().backward()
    return log, [b.adapter.grad.clone() for b in model.blocks], model


@pytest.mark.parametrize("recompute", [None, "reentrant", "non-reentrant"])
def test_each_transpose_lives_only_through_its_own_backward(recompute):
    layers = 6
    log, grads, model = _run(layers, recompute, release=True)
    made = [n for e, n in log.events if e == "made"]
    # every linear that computes a dgrad made its transpose once, in backward order; block 0's linears over an
    # input that needs no grad compute none (the first layer's QKV over frozen embeddings), so never make one
    first = 0 if recompute == "reentrant" else 1  # (reentrant checkpointing needs an input that requires grad)
    assert made == [f"{i}.{fc}" for i in reversed(range(first, layers)) for fc in ("fc2", "fc1")]
    assert log.peak == 1
    assert log.live == 0
    for a, b in zip(log.events[::2], log.events[1::2]):
        assert a[0] == "made" and b == ("freed", a[1])
    # the forward of the next step made none (TE's forward of a primary-FP8 weight asks for row-wise data only)
    model(torch.randn(4, 8))
    assert log.live == 0


@pytest.mark.parametrize("recompute", [None, "reentrant"])
def test_without_the_release_every_transpose_is_alive_at_the_end(recompute):
    layers = 6
    log, _, model = _run(layers, recompute, release=False)
    assert log.live == log.peak == 2 * (layers - (recompute != "reentrant"))
    assert release_transposes(model) == log.peak  # the old per-micro-batch backstop frees them only now
    assert log.live == 0


@pytest.mark.parametrize("recompute", [None, "reentrant"])
def test_the_release_changes_no_gradient(recompute):
    _, with_release, _ = _run(4, recompute, release=True)
    _, without, _ = _run(4, recompute, release=False)
    for a, b in zip(with_release, without):
        assert torch.equal(a, b)


def test_no_hook_fires_without_autograd():
    log = Log()
    model = Stack(3, 8, log, None)
    release_after_backward(model)
    with torch.no_grad():  # the first forward of full recompute, or evaluation
        model(torch.randn(4, 8))
    assert log.events == []
