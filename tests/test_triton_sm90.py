"""The Triton kernels of the FP8 SwiGLU store compiled for the H100/H200 (sm_90) on this CPU machine, with the ptxas
that ships in Triton's wheel: the interpreter (tests/test_swiglu_fp8.py, tests/test_lora_swiglu.py) runs their
numerics but never lowers them, so a kernel that only a GPU's compiler refuses would first fail in a device session.
The GPU's Triton may be another version than this machine's: a compile here is necessary, not sufficient."""
import pytest

triton = pytest.importorskip("triton")


def _compile(fn, signature: dict, constexprs: dict):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}},
                    constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def _ptxas_here() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return bool(get_ptxas(90).path)
    except Exception:  # noqa: BLE001  (no NVIDIA backend in this Triton build)
        return False


pytestmark = pytest.mark.skipif(not _ptxas_here(), reason="this Triton has no NVIDIA backend / ptxas")


@pytest.mark.parametrize("hw", [True, False])
def test_the_fp8_store_kernels_compile_for_sm90(hw):
    """hw: the GPU's own FP8 conversions (what runs on a GPU); else the integer form (the interpreter's). The
    hardware form converts with cvt ... satfinite ... e4m3x2."""
    import trainer.model.swiglu_fp8 as m

    ints = {k: "i32" for k in ("T", "N")}
    fwd = _compile(m._fwd_kernel, {"u_ptr": "*bf16", "o_ptr": "*bf16", "q_ptr": "*u8", **ints, "su": "i32",
                                   "so": "i32", "sq": "i32"}, {"HW": hw, "BT": m._BT, "BN": m._BN})
    bwd = _compile(m._bwd_kernel, {"q_ptr": "*u8", "d_ptr": "*bf16", "du_ptr": "*bf16", **ints, "sq": "i32",
                                   "sd": "i32", "sdu": "i32"}, {"HW": hw, "BT": m._BT, "BN": m._BN})
    for k in (fwd, bwd):
        assert k.asm["cubin"] and ".target sm_90" in k.asm["ptx"]
    assert ("satfinite.e4m3x2" in fwd.asm["ptx"]) is hw


def test_the_fold_kernels_compile_for_sm90():
    """fused_swiglu's kernels (their backward calls swiglu_fp8's swiglu_grads): the forward writing the FP8 copy of
    fc1's base output by the GPU's saturating conversion (precision.fp8_swiglu_input) or not, the backward reading
    that copy (the 16-bit forms run in every GPU session)."""
    import trainer.model.lora.swiglu as s

    common = {"h_ptr": "*bf16", "b_ptr": "*bf16", "T": "i32", "N": "i32", "R": "i32", "su": "i32", "sh": "i32",
              "sb": "i32"}
    consts = {"BT": s._BT, "BN": s._BN, "RP": 16}
    for store in (True, False):
        fwd = _compile(s._fwd_kernel, {"u_ptr": "*bf16", **common, "o_ptr": "*bf16", "q_ptr": "*u8", "so": "i32",
                                       "sq": "i32", "scale": "fp32"}, {**consts, "STORE": store, "HW": True})
        assert fwd.asm["cubin"] and ("satfinite.e4m3x2" in fwd.asm["ptx"]) is store
    bwd = _compile(s._bwd_kernel, {"u_ptr": "*fp8e4nv", **common, "d_ptr": "*bf16", "du_ptr": "*bf16", "sd": "i32",
                                   "sdu": "i32", "scale": "fp32"}, consts)
    assert bwd.asm["cubin"]
