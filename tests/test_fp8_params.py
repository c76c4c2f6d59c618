"""trainer.precision.fp8_params: which cached FP8 transposes are dropped after a step (TE's own
quantization is exercised on the GPU: bench/gpu_suite.sh 70b)."""
import torch

from trainer.precision.fp8_params import init_context, release_transposes


class _FakeFloat8:
    """Stands in for TE's Float8Tensor storage API on a plain parameter: _transpose + update_usage."""

    def __init__(self, param, with_transpose: bool):
        self.calls = []
        param._transpose = torch.zeros(2) if with_transpose else None

        def update_usage(rowwise_usage=None, columnwise_usage=None):
            self.calls.append((rowwise_usage, columnwise_usage))
            if columnwise_usage is False:
                param._transpose = None

        param.update_usage = update_usage


def test_release_drops_only_frozen_cached_transposes():
    m = torch.nn.ModuleDict({k: torch.nn.Linear(2, 2, bias=False) for k in ("frozen", "trained", "plain", "bare")})
    for k in ("frozen", "plain", "bare"):
        m[k].weight.requires_grad_(False)
    frozen = _FakeFloat8(m["frozen"].weight, with_transpose=True)
    trained = _FakeFloat8(m["trained"].weight, with_transpose=True)
    bare = _FakeFloat8(m["bare"].weight, with_transpose=False)
    assert release_transposes(m) == 1
    assert frozen.calls == [(True, False)] and m["frozen"].weight._transpose is None
    assert trained.calls == [] and m["trained"].weight._transpose is not None
    assert bare.calls == []
    assert release_transposes(m) == 0


def test_init_context_is_inert_without_fp8_param():
    class Cfg:
        fp8_param = False

    with init_context(Cfg()):
        assert torch.is_grad_enabled()


def test_precision_line_names_fp8_weight_storage():
    from trainer.precision.logline import _storage_dtype

    class Float8Tensor(torch.Tensor):  # TE's class name; its dtype reports the nominal bf16
        pass

    bf16 = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.bfloat16), requires_grad=False)
    assert _storage_dtype(bf16) == "bfloat16"
    fp8 = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.bfloat16).as_subclass(Float8Tensor), requires_grad=False)
    assert _storage_dtype(fp8) == "fp8"
