"""`trainer.precision.fp8_param`: the frozen base weights live as FP8 tensors only (TE Float8Tensor).

A LoRA base never changes, so its FP8 copy is exact for the whole run: BF16 weights plus per-step FP8
re-quantization (fp8_weight_cache: false) or plus cached FP8 copies (true) are both avoidable. With
`fp8_param` megatron-core builds each layer's TE linears inside TE's quantized-model-init context, so each
weight is quantized once at init and the BF16 original is never kept (built under no_grad: TE would otherwise
keep a high-precision copy of every initial value for an optimizer that never touches them).

On Hopper the FP8 GEMM of the input gradient needs the weight's transpose (TE's column-wise data); TE makes
it on demand in backward and keeps it on the parameter. `release_transposes(model)` drops them after each
micro-batch's backward (after the whole step with pipeline parallelism, whose schedule interleaves
micro-batches), so at the forward's activation peak the weights cost 1 byte a parameter; re-making them
costs one transpose per weight and micro-batch. (TE's GroupedLinear, MoE experts, asks for column-wise
data in forward already, so expert weights keep 2 bytes a parameter.)

Every FP8 weight is scaled from its own amax. Current and block scaling do that when they quantize; delayed
scaling quantizes with its running scale, which for a weight built at init is the initial 1.0 (a std-0.02
weight lands in E4M3's subnormals) and is never revisited for a frozen weight. So under delayed scaling
`copy_own_scale` quantizes through a current-scaling quantizer of the same FP8 format and copies data and
scale into the parameter (TE's Float8Tensor-to-Float8Tensor copy); for random init `redraw_delayed` draws
each weight again in BF16 (the scale-1.0 rounding has already lost it) and copies it in the same way. The
GEMMs read each tensor's own scale, so the delayed recipe then only drives the activations and gradients
(with its amax fused into the casts).

Pretrained weights (checkpoint.pretrained) are copied into the FP8 parameters tensor by tensor (`copy_own_scale`).
`check_loaded` then compares each FP8 weight with the value copied into it and refuses one that is worse than
E4M3 with the weight's own per-tensor scale, so a wrong scale fails loudly at load instead of training on a
degraded base.
"""
from __future__ import annotations

import contextlib

import torch


def init_context(config):
    """Context to build the model in: no_grad when config.fp8_param (else nothing).

    megatron-core builds every transformer layer inside its own TE quantized-model-init context when
    config.fp8_param is set (and none for the layers first_last_layers_bf16 keeps in BF16); grad mode off
    here keeps TE from saving a CPU copy of each initial value (preserve_high_precision_init_val)."""
    return torch.no_grad() if getattr(config, "fp8_param", False) else contextlib.nullcontext()


def release_transposes(model) -> int:
    """Drop the column-wise FP8 copies (transposes) TE made on frozen quantized weights; returns how many.

    Per-tensor FP8 (delayed / current scaling) rebuilds a transpose from the row-wise data on demand, and so
    does 2-D block scaling; 1-D block-scaled data cannot be rebuilt and is left alone."""
    released = 0
    for p in model.parameters():
        if not releasable(p):
            continue
        usages = p.get_usages()
        if not (usages.get("rowwise") and usages.get("columnwise")):
            continue
        p.update_usage(rowwise_usage=True, columnwise_usage=False)
        released += 1
    return released


def releasable(p) -> bool:
    """A frozen quantized weight whose column-wise copy can be dropped and rebuilt from its row-wise data
    (per-tensor FP8, 2-D block scaling; not 1-D block-scaled data)."""
    return (not p.requires_grad and callable(getattr(p, "get_usages", None))
            and getattr(p, "_is_2D_scaled", True) is not False)


E4M3_MAX = 448.0


def is_quantized(p) -> bool:
    """True for a TE quantized parameter (Float8Tensor and its kin): copying into it quantizes."""
    return hasattr(p, "_quantizer") and callable(getattr(p, "dequantize", None))


def _delayed(p) -> bool:
    """A per-tensor FP8 weight whose quantizer is delayed scaling's (TE Float8Quantizer: a running scale)."""
    return type(getattr(p, "_quantizer", None)).__name__ == "Float8Quantizer"


def _te_own_scale(p):
    """TE's current-scaling quantizer of p's FP8 format: a scale from the tensor's own amax."""
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

    return Float8CurrentScalingQuantizer(p._fp8_dtype, p.device, rowwise=True, columnwise=False)


def copy_own_scale(p, src: torch.Tensor, own_scale=_te_own_scale) -> None:
    """p.copy_(src), with a quantized p scaled from src's own amax whatever p's recipe (see the module doc)."""
    if _delayed(p):
        src = own_scale(p)(src.to(device=p.device, dtype=p.dtype).contiguous())
    p.copy_(src)


def redraw_delayed(model, seed_of, own_scale=_te_own_scale) -> list:
    """Random init under delayed scaling: TE rounded each initial weight to E4M3 with the scale 1.0 (a
    std-0.0016 output-layer weight loses about half its values to zero), so that value cannot be rescaled.
    Each such weight is drawn again in BF16 by its module's own init function (megatron's init_method or
    output_layer_init_method, TE's param_init_meta) from a generator seeded with seed_of(name), quantized
    with its own scale and checked against the draw; returns check_loaded's (name, error, reference) of each.
    Run before LoRA freezes the base: every parameter still requires grad here."""
    checks = []
    with torch.no_grad():
        for module_name, module in model.named_modules():
            meta = getattr(module, "param_init_meta", None) or {}
            for leaf, p in module.named_parameters(recurse=False):
                if leaf not in meta or not _delayed(p):
                    continue
                name = f"{module_name}.{leaf}" if module_name else leaf
                value = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                cuda = [p.device.index if p.device.index is not None else torch.cuda.current_device()] \
                    if p.device.type == "cuda" else []
                with torch.random.fork_rng(devices=cuda):
                    torch.manual_seed(seed_of(name))
                    meta[leaf].init_fn(value)
                copy_own_scale(p, value, own_scale)
                checks.append((name, *check_loaded(name, p.dequantize(), value)))
    return checks


def checks_summary(checks: list) -> str:
    """' | fp8_param weights checked N | worst NAME relative error E (E4M3 with its own scale R)', or ''."""
    if not checks:
        return ""
    name, got, ref = max(checks, key=lambda c: c[1] / c[2] if c[2] else c[1])
    return (f" | fp8_param weights checked {len(checks)} | worst {name} relative error {got:.4f} "
            f"(E4M3 with its own scale {ref:.4f})")


def _rel_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    norm = float(exact.norm())
    return float((approx - exact).norm()) / norm if norm > 0 else float(approx.abs().max())


def e4m3_error(src: torch.Tensor) -> float:
    """Relative (Frobenius) error of quantizing `src` to E4M3 with one scale from its own amax: the worst a
    tensorwise or block-scaled FP8 copy of a weight should do."""
    x = src.detach().float()
    amax = float(x.abs().max())
    if amax == 0.0:
        return 0.0
    scale = E4M3_MAX / amax
    return _rel_error((x * scale).to(torch.float8_e4m3fn).float() / scale, x)


def check_loaded(name: str, loaded: torch.Tensor, src: torch.Tensor, slack: float = 1.05) -> tuple[float, float]:
    """Refuse an FP8 weight that holds the checkpoint value worse than per-tensor E4M3 would (e.g. quantized with
    a stale scale): `loaded` is the parameter's dequantized value, `src` what was copied into it.
    Returns (its relative error, the E4M3 reference error) for the load summary."""
    x = src.detach().float().to(loaded.device)
    got, ref = _rel_error(loaded.detach().float(), x), e4m3_error(x)
    if got > slack * ref + 1e-6:
        raise ValueError(f"trainer.precision.fp8_param: {name} holds the checkpoint weight with relative error "
                         f"{got:.4f}, worse than E4M3 with the weight's own scale ({ref:.4f}); the FP8 copy is wrong")
    return got, ref
