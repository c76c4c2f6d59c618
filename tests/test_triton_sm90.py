"""The Triton kernels of the FP8 SwiGLU store compiled for the H100/H200 (sm_90) and the A100 (sm_80) on this CPU
machine, with the ptxas that ships in Triton's wheel: the interpreter (tests/test_swiglu_fp8.py,
tests/test_lora_swiglu.py) runs their numerics but never lowers them, so a kernel that only a GPU's compiler refuses
would first fail in a device session (HW on sm_80 did: an audit, 2026-12-07). The GPU's Triton may be another version
than this machine's: a compile here is necessary, not sufficient."""
import pytest

triton = pytest.importorskip("triton")


def _compile(fn, signature: dict, constexprs: dict, arch: int = 90):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}},
                    constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32))


def _ptxas_here() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return bool(get_ptxas(90).path)
    except Exception:  # noqa: BLE001  (no NVIDIA backend in this Triton build)
        return False


pytestmark = pytest.mark.skipif(not _ptxas_here(), reason="this Triton has no NVIDIA backend / ptxas")


def _hw(monkeypatch, capability) -> bool:
    """What the kernels' launches pass as HW on a CUDA device of this capability (swiglu_fp8.fp8_conversions)."""
    import torch

    import trainer.model.swiglu_fp8 as m

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    m.fp8_conversions.cache_clear()
    try:
        return m.fp8_conversions(torch.device("cuda", 0))
    finally:
        m.fp8_conversions.cache_clear()


# (arch, capability): the H100/H200, and the A100, whose Triton refuses e4m3 ("fp8e4nv not supported in this
# architecture"): there the launches take the integer form (audit, 2026-12-07)
ARCHS = [(90, (9, 0)), (80, (8, 0))]


@pytest.mark.parametrize("arch,capability", ARCHS)
def test_the_fp8_store_kernels_compile_in_the_form_the_launch_picks(monkeypatch, arch, capability):
    """The store's kernels in the form a launch on that GPU picks: the GPU's own FP8 conversions on sm_90 (cvt ...
    satfinite ... e4m3x2), the integer form (the interpreter's) on sm_80."""
    import trainer.model.swiglu_fp8 as m

    hw = _hw(monkeypatch, capability)
    assert hw is (arch >= 89)
    ints = {k: "i32" for k in ("T", "N")}
    fwd = _compile(m._fwd_kernel, {"u_ptr": "*bf16", "o_ptr": "*bf16", "q_ptr": "*u8", **ints, "su": "i32",
                                   "so": "i32", "sq": "i32"}, {"HW": hw, "BT": m._BT, "BN": m._BN}, arch)
    bwd = _compile(m._bwd_kernel, {"q_ptr": "*u8", "d_ptr": "*bf16", "du_ptr": "*bf16", **ints, "sq": "i32",
                                   "sd": "i32", "sdu": "i32"}, {"HW": hw, "BT": m._BT, "BN": m._BN}, arch)
    for k in (fwd, bwd):
        assert k.asm["cubin"] and f".target sm_{arch}" in k.asm["ptx"]
    assert ("satfinite.e4m3x2" in fwd.asm["ptx"]) is hw


def test_the_integer_form_compiles_for_sm90_too():
    """The integer form on sm_90 as well (what the interpreter runs): no FP8 instruction in it."""
    import trainer.model.swiglu_fp8 as m

    ints = {k: "i32" for k in ("T", "N")}
    fwd = _compile(m._fwd_kernel, {"u_ptr": "*bf16", "o_ptr": "*bf16", "q_ptr": "*u8", **ints, "su": "i32",
                                   "so": "i32", "sq": "i32"}, {"HW": False, "BT": m._BT, "BN": m._BN})
    assert fwd.asm["cubin"] and "e4m3" not in fwd.asm["ptx"]


@pytest.mark.parametrize("arch,capability", ARCHS)
def test_the_fold_kernels_compile_in_the_form_the_launch_picks(monkeypatch, arch, capability):
    """fused_swiglu's kernels (their backward calls swiglu_fp8's swiglu_grads): the forward writing the FP8 copy of
    fc1's base output (precision.fp8_swiglu_input) or not, the backward reading that copy as bytes or fc1's 16-bit
    output, in the form a launch on that GPU picks."""
    import trainer.model.lora.swiglu as s

    hw = _hw(monkeypatch, capability)
    common = {"h_ptr": "*bf16", "b_ptr": "*bf16", "T": "i32", "N": "i32", "R": "i32", "su": "i32", "sh": "i32",
              "sb": "i32"}
    consts = {"BT": s._BT, "BN": s._BN, "RP": 16}
    for store in (True, False):
        fwd = _compile(s._fwd_kernel, {"u_ptr": "*bf16", **common, "o_ptr": "*bf16", "q_ptr": "*u8", "so": "i32",
                                       "sq": "i32", "scale": "fp32"}, {**consts, "STORE": store, "HW": hw}, arch)
        assert fwd.asm["cubin"] and ("satfinite.e4m3x2" in fwd.asm["ptx"]) is (store and hw)
        bwd = _compile(s._bwd_kernel, {"u_ptr": "*u8" if store else "*bf16", **common, "d_ptr": "*bf16",
                                       "du_ptr": "*bf16", "sd": "i32", "sdu": "i32", "scale": "fp32"},
                       {**consts, "BYTES": store, "HW": hw}, arch)
        assert bwd.asm["cubin"] and f".target sm_{arch}" in bwd.asm["ptx"]
