"""trainer.lora.epilogue (trainer/model/lora/epilogue.py) and pre-dropout fused into A (epilogue and trainer.lora.fused)
against the unfused adapter path: the same outputs and gradients of A, B and the input; dropout from the same RNG
state draws the same mask; a tiny model trains to the same losses. The Triton rank-r kernels (dy read once for dh
and dB; the masked dh A) run in Triton's CPU interpreter against the torch ops they replace."""
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.model_helpers import FrozenLinear, epilogue_branches, interpreted, tiny_cfg, train_losses
from trainer.model.lora.drop import draw, undrop
from trainer.model.lora.epilogue import epilogue_adapter
from trainer.model.lora.fused import fused_adapter
from trainer.model.lora.inputs import gated_silu

P = 0.1


_Base = FrozenLinear


def _unfused(base, x, a, b, s, p, u=None):
    """trainer/model/lora/layers.py's unfused path: base, then nn.Dropout, h = drop(x) A^T, addmm(out, h, B^T, s)."""
    from trainer.model.adapter_grads import adapter_a

    out, _ = base(x)
    xd = F.dropout(x, p, training=True) if p else x
    h = adapter_a(xd, a.to(out.dtype), u, gated_silu if u is not None else None)
    y = torch.addmm(out.reshape(-1, out.shape[-1]), h.reshape(-1, h.shape[-1]), b.to(out.dtype).t(), alpha=s)
    return y.view(out.shape)


def _run(path, dtype, p, recompute=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    din, dout, r, s = 48, 40, 4, 2.0
    base = _Base(torch.randn(dout, din, generator=g).to(dtype) * 0.2)
    a = (torch.randn(r, din, generator=g) * 0.3).requires_grad_(True)
    b = (torch.randn(dout, r, generator=g) * 0.3).requires_grad_(True)
    up = torch.randn(3, 7, dout, generator=g).to(dtype)
    u = torch.randn(3, 7, 2 * din, generator=g).to(dtype).requires_grad_(True) if recompute else None
    x = gated_silu(u) if recompute else torch.randn(3, 7, din, generator=g).to(dtype).requires_grad_(True)
    torch.manual_seed(seed + 100)  # the dropout's draw: the same state for every path
    if path == "epilogue":
        y = epilogue_adapter(base.weight, x, a, b, s, p, u=u, act=gated_silu if u is not None else None)
    elif path == "fused":
        y, _ = fused_adapter(base, x, a, b, s, u=u, act=gated_silu if u is not None else None,
                             drop=(lambda t: draw(t, p)) if p else None, p=p)
    else:
        y = _unfused(base, x, a, b, s, p, u)
    (y.float() * up.float()).sum().backward()
    return y.detach(), a.grad, b.grad, (u if recompute else x).grad


CASES = [(torch.float32, 0.0, False), (torch.float32, P, False), (torch.float32, 0.0, True),
         (torch.bfloat16, 0.0, False), (torch.bfloat16, P, False)]


@pytest.mark.parametrize("dtype,p,recompute", CASES, ids=["fp32", "fp32-dropout", "fp32-fc2-recompute", "bf16",
                                                          "bf16-dropout"])
@pytest.mark.parametrize("path", ["epilogue", "fused"])
def test_matches_the_unfused_path(path, dtype, p, recompute):
    y0, da0, db0, dx0 = _run("unfused", dtype, p, recompute)
    y1, da1, db1, dx1 = _run(path, dtype, p, recompute)
    assert da0.abs().sum() > 0 and db0.abs().sum() > 0 and dx0.abs().sum() > 0
    # dA, dB: the same products in the same order (h, dh identical); the fused path also writes y as addmm does
    assert torch.equal(da1, da0) and torch.equal(db1, db0)
    bf16_tol = dict(rtol=1.6e-2, atol=2e-2)
    if dtype == torch.float32 or path == "fused":  # fp32: both GEMM sums meet in one rounding either way
        assert torch.equal(y1, y0)
    else:  # bf16 epilogue: y rounded once (the base GEMM's accumulator) instead of twice
        torch.testing.assert_close(y1, y0, **bf16_tol)
    if path == "fused" and p or path == "epilogue" and dtype == torch.float32:
        # the fused path adds the dropout's own backward op in place on CPU; the epilogue's sums meet once in fp32
        assert torch.equal(dx1, dx0)
    else:  # dh A summed in the GEMM's accumulator (fused: addmm_; epilogue bf16: the dgrad GEMM's beta = 1)
        torch.testing.assert_close(dx1, dx0, **(bf16_tol if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)))


def test_same_rng_state_draws_the_same_mask():
    x = torch.randn(5, 9, 33)
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(7)
        ref = nn.Dropout(P)(x.to(dtype))
        torch.manual_seed(7)
        got, keep = draw(x.to(dtype), P)
        assert torch.equal(got, ref) and torch.equal(keep != 0, ref != 0)
        g = torch.randn_like(ref)
        xr = x.to(dtype).detach().requires_grad_(True)
        torch.manual_seed(7)
        F.dropout(xr, P, training=True).backward(g)
        assert torch.equal(undrop(g, keep, P), xr.grad)  # the dropout's own backward, bit for bit


def test_eval_mode_and_no_grad_are_the_plain_sum():
    torch.manual_seed(2)
    w, a, b = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    x = torch.randn(4, 5)
    with torch.no_grad():
        y = epilogue_adapter(w, x, a, b, 0.5)
    torch.testing.assert_close(y, x @ w.t() + 0.5 * (x @ a.t()) @ b.t())


@pytest.mark.parametrize("p", [0.0, P])
def test_without_grad_the_node_rounds_as_with_grad_in_bf16(p):
    """megatron's recompute runs a layer's forward once without grad and replays it with grad: both must give the
    same bits, or recompute changes the BF16 loss (audit, 2026-12-06: the grad-off branch summed in the other order,
    1 ulp apart in 70,403 of 196,608 outputs; fp32 rounds once either way, so only BF16 showed it)."""
    with_grad, without = epilogue_branches("cpu", 512, 256, 384, p)
    assert torch.equal(with_grad, without)


KERNELS = textwrap.dedent("""
    import torch
    from trainer.model.lora.drop import draw
    from trainer.model.lora.epilogue import epilogue_adapter
    from trainer.model.lora.fused import fused_adapter
    from trainer.model.lora.kernels import dual_grad, masked_product
    torch.manual_seed(0)
    tol = dict(rtol=2e-5, atol=2e-5)
    for t, n, r in ((70, 40, 4), (64, 130, 16), (33, 65, 8)):
        dy, b, h = torch.randn(t, n), torch.randn(n, r), torch.randn(t, r)
        for ref, got in zip(dual_grad(dy, b, h, 2.0), dual_grad(dy, b, h, 2.0, kernels=True)):
            torch.testing.assert_close(got, ref, **tol)
        dh, a, base = torch.randn(t, r), torch.randn(r, n), torch.randn(t, n)
        for keep in (None, draw(torch.randn(t, n), 0.1)[1], torch.rand(t, n) > 0.1):
            torch.testing.assert_close(masked_product(dh, a, keep, 0.1, kernels=True),
                                       masked_product(dh, a, keep, 0.1), **tol)
            torch.testing.assert_close(masked_product(dh, a, keep, 0.1, base.clone(), True, kernels=True),
                                       masked_product(dh, a, keep, 0.1, base.clone(), True), **tol)
        # the adapter's forward product s h B^T (no mask): written, and added in place as the fused path's y
        for out, acc in ((None, False), (base, True)):
            got = masked_product(dh, a, None, 0.0, None if out is None else out.clone(), acc, kernels=True, scale=2.0)
            ref = masked_product(dh, a, None, 0.0, None if out is None else out.clone(), acc, scale=2.0)
            torch.testing.assert_close(got, ref, **tol)
        w = torch.randn(n, 48)
        # the epilogue, and the fused path (trainer.lora.fused, the default) with pre-dropout: the masked dh A added
        # into dx, with the CPU's noise mask and with a bool mask as native_dropout keeps on a GPU (1/(1-p) in the
        # kernel)
        bool_drop = lambda z: (lambda k: (z * k / 0.9, k))(torch.rand_like(z) > 0.1)  # noqa: E731
        paths = [lambda x, a1, b1, k: epilogue_adapter(w, x, a1, b1, 2.0, 0.1, kernels=k, products=k)]
        paths += [lambda x, a1, b1, k, d=d: fused_adapter(lambda z: (z @ w.t(), None), x, a1, b1, 2.0, drop=d, p=0.1,
                                                          kernels=k)[0] for d in (lambda z: draw(z, 0.1), bool_drop)]
        # the fused path without dropout (trainer.lora.triton_products): y += s h B^T and dx += dh A as one Triton
        # pass each
        paths += [lambda x, a1, b1, k: fused_adapter(lambda z: (z @ w.t(), None), x, a1, b1, 2.0, kernels=k,
                                                     products=k)[0]]
        for path in paths:
            grads = []
            for kernels in (False, True):
                x = torch.randn(t, 48, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
                a1 = torch.randn(r, 48, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
                b1 = torch.randn(n, r, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
                torch.manual_seed(5)
                y = path(x, a1, b1, kernels)
                (y * torch.ones_like(y)).sum().backward()
                grads.append((y.detach(), x.grad, a1.grad, b1.grad))
            for ref, got in zip(*grads):
                torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    print("kernels ok")
""")


def test_kernels_match_the_torch_ops_in_the_interpreter():
    pytest.importorskip("triton")
    done = interpreted("-c", KERNELS)
    assert done.returncode == 0 and "kernels ok" in done.stdout, done.stderr[-3000:]


def _train(lora: dict, expect: str, iters: int = 12, recompute: dict | None = None):
    def check(model):
        wrapped = [m for m in model.modules() if type(m).__name__ == "LoRALinear"]
        taken = {"epilogue": [m.uses_epilogue() for m in wrapped], "fused": [m.uses_fused_path() for m in wrapped],
                 "unfused": [not (m.uses_epilogue() or m.uses_fused_path()) for m in wrapped]}[expect]
        assert wrapped and all(taken), (expect, taken)

    torch.manual_seed(11)  # the dropout draws: the same stream for every path
    # every adapter on the compared path: fc1's not folded into the SwiGLU (its own tests: tests/test_lora_swiglu.py)
    trainer = {"lora": {"fused_swiglu": False, **lora}, **({"recompute": recompute} if recompute else {})}
    return train_losses(tiny_cfg(trainer=trainer), iters, seed=3, check_model=check)


@pytest.mark.parametrize("dropout", [0.0, P], ids=["no-dropout", "dropout"])
def test_tiny_model_trains_the_same(dropout):
    """12 AdamW iterations of the tiny 2-layer model (on CPU every linear is plain: all 8 adapters take the path):
    the epilogue and the fused path give the unfused path's losses (fp32; dropout masks from the same draws)."""
    ref = _train({"fused": False, "dropout": dropout}, "unfused")
    assert ref[-1] < ref[0]
    for lora, expect in (({"epilogue": True, "dropout": dropout}, "epilogue"), ({"dropout": dropout}, "fused")):
        torch.testing.assert_close(torch.tensor(_train(lora, expect)), torch.tensor(ref), rtol=1e-5, atol=1e-6)


def test_full_recompute_replays_the_same_masks():
    """megatron's activation recompute (the 70B recipes') runs each layer's forward again in backward with the RNG
    state restored: the fused paths' masks are drawn again identically, so 8 iterations with dropout 0.1 match the
    unfused path under the same recompute."""
    rec = {"granularity": "full", "method": "uniform", "num_layers": 1}
    ref = _train({"fused": False, "dropout": P}, "unfused", 8, rec)
    # the replay is real: the same run without recompute (masks drawn once) gives the same losses
    torch.testing.assert_close(torch.tensor(_train({"fused": False, "dropout": P}, "unfused", 8)), torch.tensor(ref),
                               rtol=1e-5, atol=1e-6)
    for lora, expect in (({"epilogue": True, "dropout": P}, "epilogue"), ({"dropout": P}, "fused")):
        torch.testing.assert_close(torch.tensor(_train(lora, expect, 8, rec)), torch.tensor(ref), rtol=1e-5, atol=1e-6)


def test_which_layouts_take_the_epilogue():
    from trainer.model.lora.layers import LoRALinear

    kw = dict(leaf_name="linear_proj", dim=2, alpha=4.0, dropout=0.0, dropout_position="pre", a_init="xavier",
              b_init="zero", tp_rank=0, sequence_parallel=False, seed=0, epilogue=True)
    assert LoRALinear(_Base(torch.randn(6, 5)), tp_size=1, **kw).uses_epilogue()
    assert LoRALinear(_Base(torch.randn(6, 5)), tp_size=1, **{**kw, "dropout": P}).uses_epilogue()
    assert not LoRALinear(_Base(torch.randn(6, 5)), tp_size=2, **kw).uses_epilogue()
    assert not LoRALinear(_Base(torch.randn(6, 5)), tp_size=1,
                          **{**kw, "dropout": P, "dropout_position": "post"}).uses_epilogue()
    biased = _Base(torch.randn(6, 5))
    biased.bias = nn.Parameter(torch.zeros(6), requires_grad=False)
    assert not LoRALinear(biased, tp_size=1, **kw).uses_epilogue()
    expert = _Base(torch.randn(6, 5))
    expert.is_expert = True
    assert not LoRALinear(expert, tp_size=1, **kw).uses_epilogue()
    # pre-dropout now takes the fused path too (trainer.lora.fused); post-dropout keeps the unfused one
    fused = {**kw, "epilogue": False, "fused": True, "dropout": P}
    assert LoRALinear(_Base(torch.randn(6, 5)), tp_size=2, **fused).uses_fused_path()
    assert not LoRALinear(_Base(torch.randn(6, 5)), tp_size=1, **{**fused, "dropout_position": "post"}).uses_fused_path()


def test_build_refuses_when_no_linear_can_take_it(monkeypatch):
    """A model where every base is quantized/norm-fused (seen only at build): a loud refusal, not a silent no-op."""
    from tests.model_helpers import dist_session
    from trainer.config import ConfigError
    from trainer.model import build
    from trainer.model.lora import epilogue

    monkeypatch.setattr(epilogue, "owns_base_gemm", lambda base, fp8=False: False)
    import trainer.model.lora.layers as layers

    monkeypatch.setattr(layers, "owns_base_gemm", lambda base, fp8=False: False)
    cfg = tiny_cfg(trainer={"lora": {"epilogue": True}})
    with dist_session(cfg) as info:
        with pytest.raises(ConfigError, match="no wrapped linear can own its base GEMM"):
            build(cfg, info.device)


def test_the_build_line_counts_the_linears_on_the_path():
    """With fused_swiglu, fc1's adapter lives in the SwiGLU kernels: the epilogue owns the other 6 of 8 linears."""
    from tests.model_helpers import dist_session
    from trainer.model import build

    for swiglu, taken in ((False, 8), (True, 6)):
        cfg = tiny_cfg(trainer={"lora": {"epilogue": True, "fused_swiglu": swiglu}})
        with dist_session(cfg) as info:
            line = build(cfg, info.device).line("lora epilogue")
        assert line.startswith(f"lora epilogue | base GEMMs accumulate the adapters | {taken} of 8 linears"), line


@pytest.mark.slow  # ~8 s on two cores: every check of bench/kernel_check.py at tiny fp32 shapes in the interpreter
def test_the_device_calls_kernel_check_runs_on_cpu():
    """bench/kernel_check.py is the first thing the prepared device call runs: its own logic, checked here."""
    pytest.importorskip("triton")
    done = interpreted("bench/kernel_check.py", "--cpu")
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(rows) == 12 and all('"ok": true' in r for r in rows), done.stdout + done.stderr[-2000:]


def test_kernels_take_ranks_up_to_their_tile_and_never_run_on_rocm(monkeypatch):
    """One tile holds the whole rank: past LORA_KERNEL_MAX_RANK the torch ops serve (the kernels' shared memory would
    outgrow a block on sm_90 from rank 513); ROCm never ran them."""
    pytest.importorskip("triton")
    from trainer.model.lora.kernels import MAX_RANK, kernels_usable

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels_usable(torch.device("cpu"), 16) and kernels_usable(torch.device("cpu"), MAX_RANK)
    assert not kernels_usable(torch.device("cpu"), MAX_RANK + 1)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert not kernels_usable(torch.device("cuda"), 16)


def test_float32_takes_the_torch_path_on_the_gpu(monkeypatch):
    """tl.dot takes float32 inputs in TF32 on an NVIDIA GPU (~1e-3 relative), where the torch path keeps fp32; the
    interpreter computes them exactly, so an fp32 comparison on the CPU could not see it (audit, 2026-12-05)."""
    from trainer.model.lora import kernels

    if kernels.triton is None:
        pytest.skip("no Triton here")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gpu = torch.device("cuda", 0)
    assert kernels.kernels_usable(gpu, 16, torch.bfloat16) and kernels.kernels_usable(gpu, 16)
    assert not kernels.kernels_usable(gpu, 16, torch.float32)
    assert not kernels.kernels_usable(torch.device("cpu"), 16, torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.kernels_usable(torch.device("cpu"), 16, torch.float32)  # the interpreter tests keep the kernels


def test_triton_products_reach_every_wrapped_linear(monkeypatch):
    """trainer.lora.triton_products (off by default): the unmasked products take the Triton passes only when set,
    and the recipe key reaches every wrapped linear (never accepted and ignored)."""
    from tests.model_helpers import dist_session
    from trainer.model import build
    from trainer.model.lora import fused
    from trainer.model.lora.layers import LoRALinear

    calls = []
    real = fused.masked_product
    monkeypatch.setattr(fused, "masked_product", lambda *a, **kw: calls.append(kw["kernels"]) or real(
        *a, **{**kw, "kernels": False}))
    monkeypatch.setattr(LoRALinear, "_kernels", lambda self, x: True)  # as on a GPU with Triton
    for on in (False, True):
        cfg = tiny_cfg(trainer={"lora": {"triton_products": on, "fused_swiglu": False}})
        calls.clear()
        with dist_session(cfg) as info:
            model = build(cfg, info.device).model
            named = {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}
            wrapped = list(named.values())
            assert wrapped and all(m.triton_products is on for m in wrapped)
            # a column-parallel linear: its output is the base's own (a TP-1 row-parallel output is an all-reduce's
            # view, which the forward adds into out of place, by torch)
            qkv = next(m for n, m in named.items() if m.uses_fused_path() and n.endswith("linear_qkv"))
            x = torch.randn(3, 1, qkv.lora_a.shape[1], requires_grad=True)
            qkv(x)[0].sum().backward()
        assert calls == [on, on], calls  # y += s h B^T in forward, dx += dh A in backward
