"""Capability gating: every unsupported combination refuses with one line naming the field and an alternative."""
import pytest

from trainer.precision import PrecisionError, check_capabilities
from primus_contract.machine import parse_version
from trainer.precision.capabilities import Environment

CPU = Environment(device="cpu")
CPU_TE = Environment(device="cpu", te_version=(2, 20, 2))
H200 = Environment(device="cuda", device_name="NVIDIA H200", cuda_cc=(9, 0), te_version=(2, 20, 2))
H200_NO_TE = Environment(device="cuda", device_name="NVIDIA H200", cuda_cc=(9, 0))
A100 = Environment(device="cuda", device_name="A100", cuda_cc=(8, 0), te_version=(2, 20, 2))
B200 = Environment(device="cuda", device_name="B200", cuda_cc=(10, 0), te_version=(2, 20, 2))
B200_OLD_TE = Environment(device="cuda", device_name="B200", cuda_cc=(10, 0), te_version=(2, 6, 0))
B200_TE28 = Environment(device="cuda", device_name="B200", cuda_cc=(10, 0), te_version=(2, 8, 0))
MI300 = Environment(device="cuda", device_name="MI300X", rocm_arch="gfx942", te_version=(2, 4, 0))
MI355 = Environment(device="cuda", device_name="MI355X", rocm_arch="gfx950", te_version=(2, 8, 0),
                    te_has_mxfp4=True)
MI355_OLD_TE = Environment(device="cuda", device_name="MI355X", rocm_arch="gfx950", te_version=(2, 2, 0))
MI250 = Environment(device="cuda", device_name="MI250X", rocm_arch="gfx90a", te_version=(2, 2, 0))


def cfg(num_layers=4, **precision):
    return {"trainer": {"model": {"num_layers": num_layers}, "precision": precision,
                        "parallelism": {"pipeline": 1}, "distributed": {"device": "auto"}}}


def refuse(env, **precision):
    with pytest.raises(PrecisionError) as info:
        check_capabilities(cfg(**precision), env)
    msg = str(info.value).replace("`", "")  # (the contract quotes field names; machine rules do not)
    assert "\n" not in msg and msg.startswith("trainer.precision.")
    return msg


@pytest.mark.parametrize("env", [CPU, H200, B200, MI355])
def test_fp4_and_fp8_together(env):
    msg = refuse(env, fp4="e2m1", fp8="hybrid")
    assert "mutually exclusive" in msg


@pytest.mark.parametrize("flag", ["fp4_param", "fp4_emulation", "fp4_stochastic_rounding", "fp4_random_hadamard"])
def test_fp4_flags_need_fp4(flag):
    msg = refuse(B200, **{flag: True})
    assert msg.startswith(f"trainer.precision.{flag} needs trainer.precision.fp4: e2m1")


def test_fp8_param_needs_fp8():
    assert refuse(H200, fp8_param=True).startswith("trainer.precision.fp8_param needs trainer.precision.fp8")


def test_fp8_param_runs_with_every_fp8_recipe():  # delayed too: trainer.precision.fp8_params.copy_own_scale
    for recipe in ("delayed", "tensorwise", "blockwise"):
        assert check_capabilities(cfg(fp8="hybrid", fp8_param=True, fp8_recipe=recipe), H200).kind == "fp8"


@pytest.mark.parametrize("env", [H200, B200])
def test_fp8_attention_runs_with_delayed_and_tensorwise_fp8(env):
    # (the packed THD layout failed inside TE on an H200: "No dot product attention backend is available"; the
    # contract refuses it with trainer.data.packing true, rules_precision.recipe_precision_rules)
    assert check_capabilities(cfg(fp8="hybrid", fp8_recipe="delayed", fp8_dot_product_attention=True), env).kind \
        == "fp8"
    tensorwise = cfg(fp8="hybrid", fp8_recipe="tensorwise", fp8_dot_product_attention=True)
    if env is B200:  # TE 2.20 runs FP8 attention under current scaling on sm100+ only
        assert check_capabilities(tensorwise, env).kind == "fp8"
    else:
        assert "with fp8_recipe tensorwise (current scaling) needs compute capability >= 10.0" in refuse(
            env, fp8="hybrid", fp8_recipe="tensorwise", fp8_dot_product_attention=True)
    assert "fp8_recipe delayed or tensorwise" in refuse(env, fp8="hybrid", fp8_recipe="blockwise",
                                                        fp8_dot_product_attention=True)
    assert refuse(env, fp8_dot_product_attention=True).startswith(
        "trainer.precision.fp8_dot_product_attention needs trainer.precision.fp8")
    assert refuse(CPU, fp8="hybrid", fp8_dot_product_attention=True).startswith("trainer.precision.fp8: hybrid "
                                                                                  "needs a GPU")


def test_fp8_attention_true_is_refused_on_rocm_and_null_stays_off_off_nvidia():
    """cuDNN's FP8 attention was never run on ROCm: true is refused there (and on the AMD env profiles at submit);
    null is chosen on the node, never refused (primus_contract.machine fp8_attention_runs)."""
    from primus_contract.machine import fp8_attention_runs

    assert "never run on ROCm" in refuse(MI300, fp8="hybrid", fp8_dot_product_attention=True)
    assert check_capabilities(cfg(fp8="hybrid"), MI300).kind == "fp8"
    assert fp8_attention_runs(H200) and not fp8_attention_runs(MI300) and not fp8_attention_runs(CPU)


def test_param_gather_is_refused():
    for extra in ({}, {"fp4_param": True}):  # refused even with fp4_param: nothing all-gathers parameters
        assert "fp4_param_gather has no effect in LoRA training" in refuse(
            B200, fp4="e2m1", fp4_param_gather=True, **extra)


def test_fp4_param_with_emulation():
    assert "fp4_param keeps weights as real FP4" in refuse(H200, fp4="e2m1", fp4_param=True, fp4_emulation=True)


def test_nvfp4_on_cpu_suggests_emulation():
    msg = refuse(CPU, fp4="e2m1")
    assert "nvfp4" in msg and "this is a CPU" in msg and "fp4_emulation: true" in msg


def test_nvfp4_on_hopper_suggests_emulation_or_fp8():
    msg = refuse(H200, fp4="e2m1")
    assert "compute capability >= 10.0" in msg and "found NVIDIA H200 (compute capability 9.0), TE 2.20.2" in msg
    assert "fp4_emulation: true" in msg and "fp8: hybrid" in msg


def test_nvfp4_without_te_on_gpu():
    msg = refuse(H200_NO_TE, fp4="e2m1")
    assert "Transformer Engine >= 2.8" in msg and "no Transformer Engine" in msg and "fp8" not in msg


def test_nvfp4_old_te_on_blackwell():
    assert "Transformer Engine >= 2.8" in refuse(B200_OLD_TE, fp4="e2m1")


def test_nvfp4_on_rocm():
    msg = refuse(MI355, fp4="e2m1", fp4_recipe="nvfp4")
    assert "NVIDIA's format" in msg and "mxfp4" in msg


def test_nvfp4_native_on_blackwell():
    assert check_capabilities(cfg(fp4="e2m1"), B200_TE28).kind == "fp4-native"


@pytest.mark.parametrize("env,needle", [(CPU, "this is a CPU"), (H200, "runs natively only on gfx950"),
                                        (B200, "runs natively only on gfx950"), (MI300, "gfx942"),
                                        (MI355_OLD_TE, "MXFP4BlockScaling")])
def test_mxfp4_gating(env, needle):
    msg = refuse(env, fp4="e2m1", fp4_recipe="mxfp4")
    assert needle in msg and "fp4_emulation: true to emulate MXFP4" in msg


def test_mxfp4_native_on_gfx950():
    mode = check_capabilities(cfg(fp4="e2m1", fp4_recipe="mxfp4"), MI355)
    assert (mode.kind, mode.fp4_format) == ("fp4-native", "mxfp4")


@pytest.mark.parametrize("env", [CPU, CPU_TE])
def test_fp8_on_cpu(env):
    msg = refuse(env, fp8="hybrid")
    assert "this is a CPU" in msg and "fp4_emulation: true" in msg


def test_fp8_without_te_is_refused_not_ignored():
    assert "silently run bf16" in refuse(H200_NO_TE, fp8="e4m3")


def test_fp8_on_ampere():
    assert "compute capability >= 8.9" in refuse(A100, fp8="hybrid")


def test_fp8_on_old_rocm():
    assert "gfx942 or newer" in refuse(MI250, fp8="hybrid")


def test_fp8_blockwise_needs_hopper():
    ada = Environment(device="cuda", device_name="L40S", cuda_cc=(8, 9), te_version=(2, 20, 2))
    assert "blockwise" in refuse(ada, fp8="hybrid", fp8_recipe="blockwise")
    # cuDNN's FP8 fused attention is sm90+: on Ada the start check refuses, not TE's first forward
    assert "fp8_dot_product_attention needs compute capability >= 9.0" in refuse(
        ada, fp8="hybrid", fp8_recipe="delayed", fp8_dot_product_attention=True)
    assert check_capabilities(cfg(fp8="hybrid", fp8_recipe="delayed"), ada).kind == "fp8"


@pytest.mark.parametrize("env", [H200, MI300, B200])
def test_fp8_ok(env):
    assert check_capabilities(cfg(fp8="hybrid", fp8_recipe="tensorwise"), env).kind == "fp8"


def test_emulation_modes():
    assert check_capabilities(cfg(fp4="e2m1", fp4_emulation=True), CPU).kind == "fp4-local-emulated"
    assert check_capabilities(cfg(fp4="e2m1", fp4_emulation=True), CPU_TE).kind == "fp4-local-emulated"
    assert check_capabilities(cfg(fp4="e2m1", fp4_emulation=True), H200).kind == "fp4-te-emulated"
    assert check_capabilities(cfg(fp4="e2m1", fp4_emulation=True), H200_NO_TE).kind == "fp4-local-emulated"
    mode = check_capabilities(cfg(fp4="e2m1", fp4_recipe="mxfp4", fp4_emulation=True), H200)
    assert (mode.kind, mode.fp4_format, mode.emulated) == ("fp4-te-emulated", "mxfp4", True)


def test_plain_modes():
    assert check_capabilities(cfg(bf16=True), CPU).kind == "bf16"
    assert check_capabilities(cfg(bf16=False), CPU).kind == "fp32"


def test_first_last_bf16_rules():
    assert "only applies with fp8 or fp4" in refuse(B200, first_last_layers_bf16=True)
    assert "fp8_recipe: delayed" in refuse(H200, fp8="hybrid", first_last_layers_bf16=True)
    assert "leaves none of the" in refuse(B200, num_layers=2, fp4="e2m1", first_last_layers_bf16=True)
    assert "exceeds the 4 layers" in refuse(B200, fp4="e2m1", first_last_layers_bf16=True,
                                           num_layers_at_start_in_bf16=5)
    ok = check_capabilities(cfg(fp4="e2m1", fp4_emulation=True, first_last_layers_bf16=True), CPU)
    assert ok.kind == "fp4-local-emulated"


@pytest.mark.parametrize("field,value", [("fp8", "e5m2"), ("fp4_recipe", "mxfp8"), ("fp8_recipe", "mxfp8"),
                                         ("fp4_emulation", "yes"), ("num_layers_at_end_in_bf16", -1)])
def test_bad_values_name_the_field(field, value):
    assert refuse(CPU, **{field: value}).startswith(f"trainer.precision.{field} is")


def test_accepts_trainer_config_object(tmp_path):
    from primus_contract.schema import apply_schema
    from trainer.config import Config

    mode = check_capabilities(Config.from_dict(apply_schema(cfg(fp4="e2m1", fp4_emulation=True))), CPU)
    assert mode.kind == "fp4-local-emulated"


def test_probe_runs_here():
    mode = check_capabilities(cfg(bf16=False))
    assert mode.kind == "fp32"


def test_parse_version():
    assert parse_version("2.20.2+cu13") == (2, 20, 2)
    assert parse_version("2.8.0.dev0+abc") == (2, 8, 0)
