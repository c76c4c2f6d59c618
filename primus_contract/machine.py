"""The rules that need the machine, declared here beside the rest of the contract and run by the trainer at start
(trainer.precision.gating, on the probed Environment). `validate` lists the ones a recipe will meet
(`at_start`). Each returns a one-line refusal or None; `s` is any object with the trainer.precision fields as
attributes (the trainer's PrecisionSettings)."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional, Tuple

FIELD = "trainer.precision"

NVFP4_MIN_TE = (2, 8)
CUSTOM_RECIPE_MIN_TE = (2, 9)
FP8_MIN_CC = (8, 9)
FP8_BLOCKWISE_MIN_CC = (9, 0)
FP8_ATTENTION_MIN_CC = (9, 0)  # cuDNN fused attention in FP8 (TE's FusedAttention backend): sm90+
# ... under current scaling (fp8_recipe tensorwise): TE's backend selection (attention/dot_product_attention/utils.py,
# TE 2.20 source) disables FusedAttention for Float8CurrentScaling below sm100, and no other backend trains in FP8
FP8_ATTENTION_CS_MIN_CC = (10, 0)
NVFP4_MIN_CC = (10, 0)
FP8_MIN_GFX = 942
MXFP4_GFX = 950


def parse_version(text: str) -> Tuple[int, ...]:
    """'2.20.2+cu13' -> (2, 20, 2): the leading numeric release of a version string."""
    parts = []
    for piece in text.replace("+", ".").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits or not piece[0].isdigit():
            break
        parts.append(int(digits))
    return tuple(parts)


@dataclass(frozen=True)
class Environment:
    device: str = "cpu"                              # 'cpu' or 'cuda' (ROCm also reports 'cuda')
    device_name: str = "cpu"
    cuda_cc: Optional[Tuple[int, int]] = None        # NVIDIA compute capability
    rocm_arch: Optional[str] = None                  # e.g. 'gfx942', 'gfx950' (AMD only)
    te_version: Optional[Tuple[int, ...]] = None     # None: Transformer Engine not importable
    te_has_mxfp4: bool = False                       # ROCm TE exposes recipe.MXFP4BlockScaling
    has_triton: bool = False

    @property
    def has_te(self) -> bool:
        return self.te_version is not None

    @property
    def is_rocm(self) -> bool:
        return self.rocm_arch is not None

    def gfx_number(self) -> Optional[int]:
        """gfx942 -> 942 (hex-ish names like gfx90a -> None)."""
        if not self.rocm_arch:
            return None
        digits = self.rocm_arch.split(":")[0].removeprefix("gfx")
        return int(digits) if digits.isdigit() else None

    def summary(self) -> str:
        if self.device == "cpu":
            where = "CPU"
        elif self.is_rocm:
            where = f"{self.device_name} ({self.rocm_arch})"
        else:
            cc = f"{self.cuda_cc[0]}.{self.cuda_cc[1]}" if self.cuda_cc else "?"
            where = f"{self.device_name} (compute capability {cc})"
        te = "TE " + ".".join(map(str, self.te_version)) if self.te_version else "no Transformer Engine"
        return f"{where}, {te}"



def _cc(env: Environment) -> str:
    return f"{env.cuda_cc[0]}.{env.cuda_cc[1]}" if env.cuda_cc else "?"


def fp8_error(s, env: Environment) -> Optional[str]:
    alt = "use bf16 instead, or fp4: e2m1 with fp4_emulation: true for FP4 accuracy studies"
    if env.device == "cpu":
        return f"{FIELD}.fp8: {s.fp8} needs a GPU with FP8 units and Transformer Engine; this is a CPU; {alt}"
    if not env.has_te:
        return (f"{FIELD}.fp8: {s.fp8} needs Transformer Engine (megatron-core would silently run bf16 "
                f"without it); found {env.summary()}; install TE or {alt}")
    if env.is_rocm:
        gfx = env.gfx_number()
        if gfx is None or gfx < FP8_MIN_GFX:
            return f"{FIELD}.fp8: {s.fp8} needs gfx942 or newer (MI300X/MI325X/MI355X); found {env.summary()}; {alt}"
        if getattr(s, "fp8_dot_product_attention", False):
            return (f"{FIELD}.fp8_dot_product_attention runs cuDNN's FP8 attention (NVIDIA, compute capability "
                    f">= 9.0), never run on ROCm; found {env.summary()}; set it to false (or null)")
        return None
    if env.cuda_cc is None or env.cuda_cc < FP8_MIN_CC:
        return (f"{FIELD}.fp8: {s.fp8} needs compute capability >= 8.9 (Ada/Hopper/Blackwell); "
                f"found {env.summary()}; {alt}")
    if s.fp8_recipe == "blockwise" and env.cuda_cc < FP8_BLOCKWISE_MIN_CC:
        return (f"{FIELD}.fp8_recipe: blockwise (Float8BlockScaling) needs compute capability >= 9.0; "
                f"found {_cc(env)}; use fp8_recipe: delayed or tensorwise")
    if getattr(s, "fp8_dot_product_attention", False) and env.cuda_cc < FP8_ATTENTION_MIN_CC:
        return (f"{FIELD}.fp8_dot_product_attention needs compute capability >= 9.0 (cuDNN's FP8 fused attention: "
                f"Hopper or newer); found {_cc(env)}; set it to false")
    if (getattr(s, "fp8_dot_product_attention", False) and s.fp8_recipe == "tensorwise"
            and env.cuda_cc < FP8_ATTENTION_CS_MIN_CC):
        return (f"{FIELD}.fp8_dot_product_attention with fp8_recipe tensorwise (current scaling) needs compute "
                f"capability >= 10.0: TE runs FP8 attention under current scaling on Blackwell only; found "
                f"{_cc(env)}; use fp8_recipe: delayed, or set it to false")
    return None


def fp4_native_error(s, env: Environment) -> Optional[str]:
    emulate = f"set {FIELD}.fp4_emulation: true to emulate {s.fp4_recipe.upper()} numerics here"
    fp8_alt = ", or use fp8: hybrid" if env.device == "cuda" and fp8_error(_FP8_PROBE, env) is None else ""
    if s.fp4_recipe == "nvfp4":
        if env.device == "cpu":
            return f"{FIELD}.fp4_recipe: nvfp4 needs a GPU with FP4 units (compute capability >= 10.0); this is a CPU; {emulate}"
        if env.is_rocm:
            return (f"{FIELD}.fp4_recipe: nvfp4 is NVIDIA's format (CC >= 10.0); found {env.summary()}; "
                    f"on gfx950 use fp4_recipe: mxfp4, or {emulate}{fp8_alt}")
        if not env.has_te or env.te_version < NVFP4_MIN_TE:
            return (f"{FIELD}.fp4_recipe: nvfp4 needs Transformer Engine >= 2.8 (megatron-core ignores fp4 "
                    f"without it); found {env.summary()}; {emulate}{fp8_alt}")
        if env.cuda_cc is None or env.cuda_cc < NVFP4_MIN_CC:
            return (f"{FIELD}.fp4_recipe: nvfp4 needs compute capability >= 10.0 (B200/GB200/B300); "
                    f"found {env.summary()}; {emulate}{fp8_alt}")
        return None
    # mxfp4
    if env.device == "cpu":
        return f"{FIELD}.fp4_recipe: mxfp4 needs an AMD gfx950 GPU (MI355X/MI350X) with ROCm TE; this is a CPU; {emulate}"
    if not env.is_rocm or env.gfx_number() != MXFP4_GFX:
        return (f"{FIELD}.fp4_recipe: mxfp4 runs natively only on gfx950 (MI355X/MI350X) with ROCm TE "
                f"MXFP4BlockScaling; found {env.summary()}; {emulate}{fp8_alt}")
    if not env.te_has_mxfp4:
        return (f"{FIELD}.fp4_recipe: mxfp4 needs ROCm Transformer Engine with recipe.MXFP4BlockScaling; "
                f"found {env.summary()}; {emulate}{fp8_alt}")
    return None


_FP8_PROBE = SimpleNamespace(fp8="hybrid", fp8_recipe="tensorwise")


def fp8_attention_runs(env: Environment) -> bool:
    """TE's FP8 attention can run on `env`: Transformer Engine on an NVIDIA GPU of compute capability >= 9.0 (where
    fp8_dot_product_attention null turns on; elsewhere it stays off, never refused)."""
    return (env.device == "cuda" and not env.is_rocm and env.has_te and env.cuda_cc is not None
            and env.cuda_cc >= FP8_ATTENTION_MIN_CC)


def offload_error(layers: int, env: Environment) -> Optional[str]:
    """trainer.recompute.activation_offload_layers runs in TE's offload context (megatron-core's TransformerBlock
    asserts TE); None when it can run on `env`."""
    if layers and (env.device == "cpu" or not env.has_te):
        return (f"trainer.recompute.activation_offload_layers: {layers} needs Transformer Engine on a GPU (megatron-core "
                f"offloads through TE's offload context); found {env.summary()}; set it to 0")
    return None


# name -> (what is checked on the node, which recipes it applies to)
MACHINE_RULES = {
    "fp8_device": ("fp8 needs Transformer Engine on a GPU with FP8 units (NVIDIA compute capability >= 8.9, "
                   "AMD gfx942+); blockwise and fp8_dot_product_attention true need compute capability >= 9.0",
                   lambda p: bool(p["fp8"])),
    "nvfp4_native": ("fp4 nvfp4 needs Transformer Engine >= 2.8 on compute capability >= 10.0 (B200/GB200/B300)",
                     lambda p: bool(p["fp4"]) and not p["fp4_emulation"] and p["fp4_recipe"] == "nvfp4"),
    "mxfp4_native": ("fp4 mxfp4 needs ROCm Transformer Engine with MXFP4BlockScaling on gfx950 (MI355X/MI350X)",
                     lambda p: bool(p["fp4"]) and not p["fp4_emulation"] and p["fp4_recipe"] == "mxfp4"),
    "fp8_attention_auto": ("fp8_dot_product_attention null runs FP8 attention only on NVIDIA compute capability "
                           ">= 9.0 with Transformer Engine (chosen there, never refused)",
                           lambda p: bool(p["fp8"]) and p["fp8_dot_product_attention"] is None),
    "fp4_emulation_path": ("fp4 emulation uses TE's custom recipe with TE >= 2.9 on a GPU, else quantize-dequantize "
                           "around megatron's local linears (chosen, never refused)",
                           lambda p: bool(p["fp4"]) and bool(p["fp4_emulation"])),
    "fp8_swiglu_gpu": ("fp8_swiglu_input needs a GPU (megatron-core's fused SwiGLU keeps its input in FP8; the "
                       "unfused CPU path would ignore it)", lambda p: bool(p["fp8_swiglu_input"])),
    "megatron_fields": ("the installed megatron-core's TransformerConfig has every precision field the mode needs",
                        lambda p: bool(p["fp8"] or p["fp4"] or p["first_last_layers_bf16"])),
}


def at_start(resolved: dict) -> list:
    """[(name, description)] of the machine rules the trainer will check at start for this recipe."""
    t = resolved["trainer"]
    rules = [(name, what) for name, (what, applies) in MACHINE_RULES.items() if applies(t["precision"])]
    if t["parallelism"]["tp_comm_overlap"]:
        rules.append(("tp_comm_overlap", "TE userbuffers on a GPU (trainer.model.tp_overlap)"))
    if t["lora"]["epilogue"] is True and t["precision"]["fp8"]:
        rules.append(("fp8_epilogue", "lora.epilogue true under FP8: TE >= 2.15's functional linear on a GPU "
                                      "(trainer.model.lora.base_gemm; null stays off without it)"))
    if t["recompute"]["activation_offload_layers"]:
        rules.append(("activation_offload", "TE's CPU offload context on a GPU (megatron-core cpu_offloading; "
                                            "trainer.model.levers)"))
    if t["checkpoint"]["pretrained"]:  # rules_data.checkpoint_rules, again on the node (the login node may not see it)
        rules.append(("pretrained_config", "trainer.checkpoint.pretrained's config.json matches the recipe's model "
                                           "(primus_contract.hf_config)"))
    return rules
