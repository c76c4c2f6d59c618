"""transformer_config_kwargs: what megatron-core TransformerConfig receives for each mode."""

import pytest
import torch

from trainer.precision import PrecisionError, resolve, transformer_config_kwargs
from trainer.precision.capabilities import Environment
from trainer.precision.config_kwargs import te_environment

CPU = Environment(device="cpu")
H200 = Environment(device="cuda", device_name="H200", cuda_cc=(9, 0), te_version=(2, 20, 2))
B200 = Environment(device="cuda", device_name="B200", cuda_cc=(10, 0), te_version=(2, 20, 2))
MI355 = Environment(device="cuda", device_name="MI355X", rocm_arch="gfx950", te_version=(2, 8, 0), te_has_mxfp4=True)


def cfg(**precision):
    return {"trainer": {"model": {"num_layers": 4}, "precision": precision}}


def kwargs(recipe, env):
    return transformer_config_kwargs(resolve(recipe, env))


def test_bf16_and_fp32():
    assert kwargs(cfg(bf16=True), CPU) == {"bf16": True, "params_dtype": torch.bfloat16}
    assert kwargs(cfg(bf16=False), CPU) == {"bf16": False, "params_dtype": torch.float32}


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise"])
def test_fp8(recipe):
    kw = kwargs(cfg(fp8="hybrid", fp8_recipe=recipe), H200)
    assert kw["fp8"] == "hybrid" and kw["fp8_recipe"] == recipe and "fp4" not in kw


def test_fp8_param_reaches_megatron_only_when_asked():
    assert kwargs(cfg(fp8="hybrid", fp8_param=True, fp8_recipe="tensorwise"), H200)["fp8_param"] is True
    assert kwargs(cfg(fp8="hybrid"), H200)["fp8_param"] is False


def test_native_nvfp4():
    kw = kwargs(cfg(fp4="e2m1", fp4_param=True), B200)
    assert (kw["fp4"], kw["fp4_recipe"], kw["fp4_param"]) == ("e2m1", "nvfp4", True)
    assert "fp8" not in kw


def test_native_mxfp4_routes_through_custom_hook():
    kw = kwargs(cfg(fp4="e2m1", fp4_recipe="mxfp4"), MI355)
    assert kw["fp4_recipe"] == "custom" and kw["fp4_quantizer_factory"].endswith("te_factory.rocm_mxfp4_factory")


@pytest.mark.parametrize("flags,name", [({}, "nvfp4_factory"), ({"fp4_random_hadamard": True}, "nvfp4_rht_factory"),
                                        ({"fp4_stochastic_rounding": True}, "nvfp4_sr_factory"),
                                        ({"fp4_random_hadamard": True, "fp4_stochastic_rounding": True},
                                         "nvfp4_rht_sr_factory"),
                                        ({"fp4_recipe": "mxfp4"}, "mxfp4_factory"),
                                        ({"fp4_recipe": "mxfp4", "fp4_stochastic_rounding": True},
                                         "mxfp4_sr_factory")])
def test_emulated_under_te_uses_custom_factory(flags, name):
    kw = kwargs(cfg(fp4="e2m1", fp4_emulation=True, **flags), H200)
    assert kw["fp4_recipe"] == "custom"
    assert kw["fp4_quantizer_factory"] == f"trainer.precision.te_factory.{name}"


def test_emulated_without_te_leaves_megatron_plain():
    kw = kwargs(cfg(fp4="e2m1", fp4_emulation=True, bf16=False), CPU)
    assert kw == {"bf16": False, "params_dtype": torch.float32}


def test_first_last_layers():
    kw = kwargs(cfg(fp4="e2m1", fp4_emulation=True, first_last_layers_bf16=True,
                                       num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=2), H200)
    assert kw["first_last_layers_bf16"] is True
    assert (kw["num_layers_at_start_in_bf16"], kw["num_layers_at_end_in_bf16"]) == (1, 2)


def test_kwargs_build_a_real_transformer_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = kwargs(cfg(fp4="e2m1", fp4_emulation=True, first_last_layers_bf16=True), H200)
    tc = TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, **kw)
    assert tc.fp4 == "e2m1" and tc.fp4_recipe == "custom" and tc.fp4_quantizer_factory.endswith("nvfp4_factory")
    assert tc.fp8 is None and tc.params_dtype == torch.bfloat16


def test_missing_megatron_field_is_an_error(monkeypatch):
    import trainer.precision.config_kwargs as ck

    monkeypatch.setattr(ck, "_transformer_config_fields", lambda: {"bf16", "params_dtype", "fp8", "fp8_recipe"})
    with pytest.raises(PrecisionError, match="fp4, fp4_quantizer_factory, fp4_recipe"):
        kwargs(cfg(fp4="e2m1", fp4_emulation=True), H200)


def test_te_environment_for_native_nvfp4():
    assert te_environment(cfg(fp4="e2m1")) == {"NVTE_NVFP4_DISABLE_RHT": "1",
                                               "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "1"}
    assert te_environment(cfg(fp4="e2m1", fp4_random_hadamard=True, fp4_stochastic_rounding=True)) == {
        "NVTE_NVFP4_DISABLE_RHT": "0", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "0"}
    assert te_environment(cfg(fp4="e2m1", fp4_emulation=True)) == {}
