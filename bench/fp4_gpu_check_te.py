"""TE sections of bench/fp4_gpu_check.py (CUDA + Transformer Engine; each returns a JSON-able dict)."""
from __future__ import annotations

import os
import sys
import traceback

import torch

from fp4_gpu_common import te_autocast, test_tensors


def _ref_factory(role):
    from transformer_engine.pytorch.custom_recipes import reference_utils
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef

    weight = role is not None and getattr(role, "tensor_type", "") == "weight"
    return NVFP4QuantizerRef(dtype=reference_utils.Fp4Formats.E2M1, quant_tile_shape=(16, 16) if weight else (1, 16))


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def te_custom_vs_ref(quick: bool):
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import CustomRecipe

    from trainer.precision import te_factory

    torch.manual_seed(0)
    lin = te.Linear(1024, 512, bias=False, params_dtype=torch.bfloat16).cuda()
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for name, fac in (("ours", te_factory.nvfp4_factory), ("ref", _ref_factory), ("bf16", None)):
        xi = x.clone().requires_grad_(True)
        lin.weight.grad = None
        if fac is None:
            y = lin(xi)
        else:
            with te_autocast(te, CustomRecipe(qfactory=fac)):
                y = lin(xi)
        y.backward(dy)
        outs[name] = (y, xi.grad, lin.weight.grad)
    return {f"{t}_rel_ours_vs_ref": _rel(o, r) for t, o, r in zip(("y", "dx", "dw"), outs["ours"], outs["ref"])} | \
           {f"{t}_rel_ours_vs_bf16": _rel(o, r) for t, o, r in zip(("y", "dx", "dw"), outs["ours"], outs["bf16"])}


def _frozen_ln_linear_run(te, recipe, x, dy, megatron_style: bool):
    """Forward-only steps whose backward never runs (frozen input/norm/weight), then fwd+bwd; (y, dx)."""
    torch.manual_seed(0)
    mod = te.LayerNormLinear(1024, 512, bias=False, normalization="RMSNorm", params_dtype=torch.bfloat16,
                             return_layernorm_output=True).cuda()
    for p in mod.parameters():
        p.requires_grad_(False)
    for step in range(3):
        kw = {"is_first_microbatch": step == 0} if megatron_style else {}
        with te_autocast(te, recipe):
            mod(x, **kw)
    xi = x.clone().requires_grad_(True)
    kw = {"is_first_microbatch": False} if megatron_style else {}
    if recipe is None:
        y, ln_out = mod(xi, **kw)
    else:
        with te_autocast(te, recipe):
            y, ln_out = mod(xi, **kw)
    ((y * dy).float().sum() + ln_out.float().sum() * 1e-3).backward()   # ln_out feeds LoRA adapters
    return y.detach(), xi.grad


def te_frozen_layernorm_linear(quick: bool):
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import CustomRecipe

    from trainer.precision import te_factory

    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    res, runs = {}, {}
    for name, recipe, style in (("ours_megatron_style", CustomRecipe(qfactory=te_factory.nvfp4_factory), True),
                                ("ours_mxfp4_megatron_style", CustomRecipe(qfactory=te_factory.mxfp4_factory), True),
                                ("ref", CustomRecipe(qfactory=_ref_factory), False),
                                ("ref_megatron_style", CustomRecipe(qfactory=_ref_factory), True),
                                ("bf16", None, False)):
        try:
            runs[name] = _frozen_ln_linear_run(te, recipe, x, dy, style)
            res[f"{name}_ok"] = bool(torch.isfinite(runs[name][0]).all() and torch.isfinite(runs[name][1]).all())
        except Exception as exc:  # noqa: BLE001 - the reference is expected to fail megatron-style
            res[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            res[f"{name}_traceback"] = traceback.format_exc()[-1500:]
    for name in ("ours_megatron_style", "ours_mxfp4_megatron_style"):
        for other in ("ref", "bf16"):
            if name in runs and other in runs:
                res[f"y_rel_{name}_vs_{other}"] = _rel(runs[name][0], runs[other][0])
                res[f"dx_rel_{name}_vs_{other}"] = _rel(runs[name][1], runs[other][1])
    res["pass"] = bool(res.get("ours_megatron_style_ok") and res.get("ours_mxfp4_megatron_style_ok")
                       and res.get("y_rel_ours_megatron_style_vs_ref", 1) < 0.02
                       and res.get("dx_rel_ours_megatron_style_vs_ref", 1) < 0.02)
    return res


def te_payload_exact(quick: bool):
    """Payload of our TE quantizer == TE reference codes decoded times block scales (NaN cases compared as NaN)."""
    from transformer_engine.pytorch.custom_recipes import reference_utils
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef

    from trainer.precision import fp4_payload, nvfp4, te_factory

    total = bad = 0
    failing = []
    for name, x in test_tensors(quick):
        for tile in ((1, 16), (16, 16)):
            total += 1
            ref = NVFP4QuantizerRef(dtype=reference_utils.Fp4Formats.E2M1, quant_tile_shape=tile, columnwise=False)
            qx, sx, _, _, amax, _ = ref._quantize(x)
            want = fp4_payload.nvfp4_block_values(nvfp4.NVFP4Tensor(qx, sx, amax, tuple(x.shape)))
            ours = te_factory._classes()(tile=tile, weight=tile[0] == 16)
            ours.set_usage(rowwise=True, columnwise=False)
            got = ours.quantize(x)
            ok = got.data.shape == want.shape and torch.equal(got.data.nan_to_num(7.0), want.nan_to_num(7.0))
            if not ok:
                bad += 1
                failing.append(f"{name} {tile}")
    return {"cases": total, "mismatches": bad, "failing_cases": failing[:40]}


def mcore_gpt_te(quick: bool):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from model_helpers import dist_session, packed_batch, perturb_adapters, tiny_cfg

    from trainer.model.build import build_model
    from trainer.model.forward import forward_losses
    from trainer.model.specs import uses_te
    from trainer.precision import resolve, transformer_config_kwargs

    cfg = tiny_cfg(trainer={"model": {"hidden_size": 128, "ffn_hidden_size": 352},
                            "precision": {"bf16": True, "fp4": "e2m1", "fp4_emulation": True},
                            "distributed": {"device": "cuda", "backend": "nccl"}})
    res = {}
    with dist_session(cfg):
        kw = transformer_config_kwargs(resolve(cfg))
        res["config"] = {k: str(v) for k, v in kw.items() if k.startswith("fp4")}
        model = build_model(cfg, torch.device("cuda"))
        res["uses_te"] = uses_te(model)
        perturb_adapters(model)
        batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v  # max_seqlen is an int
                 for k, v in packed_batch(2, 64, [50, 60, 14], vocab=128).items()}
        losses = []
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            out = forward_losses(model, batch)
            loss = (out * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
            loss.backward()
            losses.append(float(loss))
        grads = [p.grad for n, p in model.named_parameters() if "lora" in n]
        res["losses"] = losses
        res["lora_grads_finite"] = bool(grads) and all(g is not None and torch.isfinite(g).all() for g in grads)
        classes = {type(q).__name__ for m in model.modules() for qs in getattr(m, "quantizers", {}).values()
                   for q in (qs or []) if q is not None}
        res["te_quantizer_classes"] = sorted(classes)
    res["pass"] = bool(res["uses_te"] and "PrimusFP4Quantizer" in classes and res["lora_grads_finite"]
                       and all(map(lambda v: v == v and abs(v) < 1e4, losses)))
    return res
