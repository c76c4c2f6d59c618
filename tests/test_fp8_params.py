"""trainer.precision.fp8_params: which cached FP8 transposes are dropped after a step (TE's own
quantization is exercised on the GPU: bench/gpu_suite.sh 70b)."""
import torch

from trainer.precision.fp8_params import init_context, release_transposes


class _FakeQuantized:
    """Stands in for TE's quantized-tensor storage API on a plain parameter: get_usages + update_usage."""

    def __init__(self, param, columnwise: bool, two_d=None):
        self.calls = []
        self.columnwise = columnwise
        if two_d is not None:
            param._is_2D_scaled = two_d
        param.get_usages = lambda: {"rowwise": True, "columnwise": self.columnwise}

        def update_usage(rowwise_usage=None, columnwise_usage=None):
            self.calls.append((rowwise_usage, columnwise_usage))
            if columnwise_usage is False:
                self.columnwise = False

        param.update_usage = update_usage


def test_release_drops_only_frozen_rebuildable_columnwise_copies():
    names = ("frozen", "trained", "plain", "rowwise_only", "block2d", "block1d")
    m = torch.nn.ModuleDict({k: torch.nn.Linear(2, 2, bias=False) for k in names})
    for k in names:
        m[k].weight.requires_grad_(k == "trained")
    fakes = {"frozen": _FakeQuantized(m["frozen"].weight, True), "trained": _FakeQuantized(m["trained"].weight, True),
             "rowwise_only": _FakeQuantized(m["rowwise_only"].weight, False),
             "block2d": _FakeQuantized(m["block2d"].weight, True, two_d=True),
             "block1d": _FakeQuantized(m["block1d"].weight, True, two_d=False)}
    assert release_transposes(m) == 2
    for k in ("frozen", "block2d"):
        assert fakes[k].calls == [(True, False)] and not fakes[k].columnwise, k
    for k in ("trained", "rowwise_only", "block1d"):
        assert fakes[k].calls == [], k
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


def _e4m3(x, scale):
    return (x * scale).to(torch.float8_e4m3fn).float() / scale


def test_pretrained_weight_check_passes_good_fp8_copies_and_refuses_a_stale_scale():
    """fp8_param + checkpoint.pretrained: each FP8 weight is compared with the checkpoint value it was copied
    from; a copy quantized with a wrong scale (here 1.0 for a std-0.005 weight: subnormals) is refused."""
    import pytest

    from trainer.precision.fp8_params import check_loaded, e4m3_error

    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(0)) * 0.005
    own = 448.0 / float(w.abs().max())
    assert 0.02 < e4m3_error(w) < 0.035
    check_loaded("w", _e4m3(w, own), w)  # tensorwise current scaling: exactly the reference
    rows = 448.0 / w.abs().amax(dim=1, keepdim=True)
    check_loaded("w", _e4m3(w, rows), w)  # finer (block/row) scales do better
    check_loaded("w", w.to(torch.bfloat16), w)
    check_loaded("zeros", torch.zeros(4, 4), torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"fp8_param: w holds the checkpoint weight with relative error 0\.1"):
        check_loaded("w", _e4m3(w, 1.0), w)
    with pytest.raises(ValueError, match="the FP8 copy is wrong"):
        check_loaded("w", torch.randn_like(w) * 0.005, w)


def test_pretrained_summary_names_the_worst_fp8_weight_relative_to_its_reference():
    from trainer.model.hf.importer import pretrained_summary

    assert pretrained_summary("/ckpt", ["a", "b"], []) == "pretrained | path /ckpt | tensors 2"
    line = pretrained_summary("/ckpt", ["a", "b", "c"], [("a", 0.030, 0.030), ("b", 0.020, 0.010), ("c", 0.0, 0.0)])
    assert line == ("pretrained | path /ckpt | tensors 3 | fp8_param weights checked 3 | worst b relative error "
                    "0.0200 (E4M3 with its own scale 0.0100)")


class Float8Quantizer:  # the class name is what marks TE's delayed-scaling quantizer (fp8_params._delayed)
    scale = 1.0


class _E4M3Weight:
    """A stand-in for TE's Float8Tensor on CPU (no TE here): E4M3 data, a per-tensor scale, `dequantize`, and
    `copy_` from another one taking data and scale, as TE's Float8Tensor-to-Float8Tensor copy does. Quantized
    at 'init' with the delayed quantizer's initial scale 1.0, as TE does under delayed scaling."""

    def __init__(self, value, scale=1.0):
        self._quantizer, self.requires_grad = Float8Quantizer(), True  # LoRA has not frozen the base yet
        self.data, self.scale = (value.float() * scale).to(torch.float8_e4m3fn), scale
        self.shape, self.dtype, self.device = value.shape, torch.bfloat16, value.device

    def dequantize(self):
        return self.data.float() / self.scale

    def copy_(self, other):
        self.data, self.scale = other.data.clone(), other.scale


def _own_scale(p):
    return lambda src: _E4M3Weight(src, 448.0 / float(src.float().abs().max()))


def _stale_model(std: float):
    import functools
    import types

    module = torch.nn.Module()
    init = functools.partial(torch.nn.init.normal_, mean=0.0, std=std)
    module.param_init_meta = {"weight": types.SimpleNamespace(init_fn=init)}
    module._parameters["weight"] = _E4M3Weight(init(torch.empty(256, 512)))  # rounded with the scale 1.0
    outer = torch.nn.Sequential()
    outer.add_module("proj", module)
    return outer


def test_redraw_delayed_draws_each_weight_again_and_quantizes_it_with_its_own_scale():
    """Random init under delayed scaling (review finding: the first version skipped every weight because the base
    still required grad, and re-scaling the scale-1.0 rounding cannot bring back what it lost)."""
    from trainer.precision.fp8_params import e4m3_error, redraw_delayed

    std = 0.02 / (2 * 80) ** 0.5  # megatron's output-layer init for 80 layers
    model = _stale_model(std)
    stale = model.proj.weight.dequantize()
    assert float((stale == 0).float().mean()) > 0.4  # what the scale 1.0 did to it
    checks = redraw_delayed(model, lambda name: 1234, _own_scale)
    assert [c[0] for c in checks] == ["proj.weight"]
    _, got, ref = checks[0]
    assert got <= ref * 1.05 and 0.02 < ref < 0.035, checks
    redrawn = model.proj.weight.dequantize()
    assert float((redrawn == 0).float().mean()) < 0.01 and abs(float(redrawn.std()) / std - 1) < 0.05
    again = _stale_model(std)
    redraw_delayed(again, lambda name: 1234, _own_scale)
    assert torch.equal(again.proj.weight.dequantize(), redrawn)  # seeded: the same draw every time
    other = _stale_model(std)
    redraw_delayed(other, lambda name: 99, _own_scale)
    assert not torch.equal(other.proj.weight.dequantize(), redrawn)
    assert e4m3_error(redrawn) < 0.035


def test_init_seed_of_names_weights_by_global_layer_and_tp_rank():
    """build_model's per-weight seeds for redraw_delayed, on a real (CPU) megatron model."""
    from tests.model_helpers import dist_session, tiny_cfg
    from trainer.model import build_model
    from trainer.model.transforms import _init_seed_of

    cfg = tiny_cfg()
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        seed_of = _init_seed_of(model, 1234)
        names = [n for n, _ in model.named_parameters() if n.endswith("weight") and "linear_qkv" in n]
        seeds = [seed_of(n) for n in names]
        assert len(names) >= 2 and len(set(seeds)) == len(seeds)  # one stream per weight
        assert seeds == [seed_of(n) for n in names] and seeds != [_init_seed_of(model, 1)(n) for n in names]
        assert all(0 <= s < 2**63 for s in seeds)


def test_weight_check_holds_for_rocm_e4m3fnuz_copies():
    """ROCm gfx942 stores FP8 as e4m3fnuz (max 240, bias 8), not e4m3fn (max 448). The check's reference is
    e4m3fn with the weight's own scale; an fnuz copy with its own scale (what TE makes there) has the same
    3 mantissa bits, so its error stays inside the check's 5 % slack, and a stale fnuz scale is still refused."""
    import pytest

    from trainer.precision.fp8_params import check_loaded

    def fnuz(x, scale):
        return (x * scale).to(torch.float8_e4m3fnuz).float() / scale

    for std in (0.02, 0.005, 0.0016):
        w = torch.randn(256, 512, generator=torch.Generator().manual_seed(1)) * std
        got, ref = check_loaded("w", fnuz(w, 240.0 / float(w.abs().max())), w)
        assert abs(got / ref - 1.0) < 0.01, (std, got, ref)
    with pytest.raises(ValueError, match="the FP8 copy is wrong"):  # scale 1.0 at std 0.0016: subnormals
        check_loaded("w", fnuz(w, 1.0), w)
