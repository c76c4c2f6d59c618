"""Every private (underscore) megatron-core / Transformer Engine name the trainer touches, what for, and the
versions each was checked against. Data only: nothing here imports megatron or TE.

tests/test_private_api.py scans trainer/**/*.py and fails on a touched name missing here (or listed here and no
longer touched), and looks each megatron-core name up in the installed megatron-core. An upgrade of either
library starts here: these are the names that can move without a deprecation.
"""
from __future__ import annotations

from dataclasses import dataclass

# How each version was checked (the keys of Name.checked).
VERSIONS = {
    "mcore-0.16.1": "megatron-core 0.16.1, installed on the CPU host: tests/test_private_api.py imports each name",
    "mcore-0.19.1-src": "megatron-core 0.19.1 source (Megatron-LM branch core_r0.19.0), read 2026-12-02",
    "mcore-0.19.2-h200": "megatron-core 0.19.2 on the H200: the code ran in bench/results/2026-12-02_h200_hf_import",
    "te-2.19-src": "Transformer Engine 2.19 source (branch release_v2.19), read 2026-12-02",
    "te-2.20.0.dev0-src": "Transformer Engine 2.20.0.dev0 source (main, 2026-08-22), read 2026-12-02",
    "te-2.20.2-h200": "Transformer Engine 2.20.2 on the H200: the code ran in bench/results/2026-12-02_h200_hf_import",
    "te-2.20.2-src": "Transformer Engine 2.20.2 source (its wheel's Python files), read 2026-12-06",
    "te-2.20.2-h100": "Transformer Engine 2.20.2 on an H100: the code ran in bench/results/2026-12-06e_h100_lifecycle",
}
_MCORE = ("mcore-0.16.1", "mcore-0.19.1-src")
_TE = ("te-2.19-src", "te-2.20.0.dev0-src")
_TE_ONLY = "a Transformer Engine name: TE is not installed on the CPU host"
_FP8_EPI = ("te-2.20.0.dev0-src", "te-2.20.2-src", "te-2.20.2-h100")


@dataclass(frozen=True)
class Name:
    name: str            # dotted: module[.Class].attribute
    used_for: str        # where and why
    checked: tuple       # keys of VERSIONS
    seen_as: str = ""    # how the scan sees an access on an object it cannot type: ".attribute"
    skip_here: str = ""  # why the installed megatron-core 0.16.1 cannot confirm it (then it is not looked up)


_RANDOM = "megatron.core.tensor_parallel.random"
_NVFP4 = "transformer_engine.pytorch.custom_recipes.reference_nvfp4"

NAMES = (
    # model/cpu_compat.py: megatron-core on a CPU host (install() does nothing where CUDA is available)
    Name(f"{_RANDOM}._get_cuda_rng_state", "model/cpu_compat: replaced by the CPU generator's state (activation "
         "recompute saves and restores it)", _MCORE),
    Name(f"{_RANDOM}._set_cuda_rng_state", "model/cpu_compat: replaced, as _get_cuda_rng_state", _MCORE),
    Name(f"{_RANDOM}._CUDA_RNG_STATE_TRACKER", "model/cpu_compat: set to the CPU RNG tracker", _MCORE),
    Name(f"{_RANDOM}._CUDA_RNG_STATE_TRACKER_INITIALIZED", "model/cpu_compat: set True beside the tracker, so "
         "megatron does not build its CUDA one", _MCORE),
    Name(f"{_RANDOM}._MODEL_PARALLEL_RNG_TRACKER_NAME", "model/cpu_compat: the default fork name of the CPU "
         "tracker (as megatron's fork)", _MCORE),
    Name(f"{_RANDOM}.CudaRNGStatesTracker._is_initialized", "model/cpu_compat: the CPU tracker's add() marks it "
         "initialized, as megatron's add() does", _MCORE),
    # model/mla_q.py
    Name("megatron.core.transformer.multi_latent_attention.MLASelfAttention._resolve_qk_norm_config",
         "model/mla_q.PlainQueryMLA overrides it: without q_lora_rank the query projection stays the spec's plain "
         "linear (0.19 makes it a fused norm + linear)", ("mcore-0.19.1-src", "mcore-0.19.2-h200"),
         skip_here="megatron-core 0.19 only: 0.16.1 has no such method and never calls the override"),
    # precision/emulation.py: FP4 emulation on megatron's local linears (no TE)
    Name("megatron.core.tensor_parallel.layers.ColumnParallelLinear._forward_impl", "precision/emulation: "
         "replaced per instance by the FP4 quantize-dequantize GEMM", _MCORE, seen_as="._forward_impl"),
    Name("megatron.core.tensor_parallel.layers.RowParallelLinear._forward_impl", "precision/emulation: as "
         "ColumnParallelLinear._forward_impl", _MCORE, seen_as="._forward_impl"),
    # precision/fp8_params.py: TE quantized (FP8) parameters
    Name("transformer_engine.pytorch.quantized_tensor.QuantizedTensorStorage._quantizer", "precision/fp8_params: "
         "is_quantized() and the delayed-scaling test read a parameter's quantizer",
         (*_TE, "te-2.20.2-h200"), seen_as="._quantizer", skip_here=_TE_ONLY),
    Name("transformer_engine.pytorch.tensor.storage.float8_tensor_storage.Float8TensorStorage._fp8_dtype",
         "precision/fp8_params: the FP8 format of a delayed-scaling weight, for its own-scale quantizer", _TE,
         seen_as="._fp8_dtype", skip_here=_TE_ONLY),
    Name("transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage.Float8BlockwiseQTensorStorage."
         "_is_2D_scaled", "precision/fp8_params.release_transposes: 1-D block-scaled weights keep their "
         "transposes", _TE, seen_as="._is_2D_scaled", skip_here=_TE_ONLY),
    # model/lora/base_gemm.py: the FP8 epilogue runs a TE linear's FP8 GEMMs itself (TE 2.15+ has all of these)
    Name("transformer_engine.pytorch.ops.basic.BasicLinear._functional_forward", "model/lora/base_gemm: the base's "
         "FP8 GEMM accumulating into the adapter's product (what TE's fused linear+add op calls)", _FP8_EPI,
         seen_as="._functional_forward", skip_here=_TE_ONLY),
    Name("transformer_engine.pytorch.ops.basic.BasicLinear._functional_backward", "model/lora/base_gemm: the base's "
         "FP8 dgrad accumulating into the adapter's input gradient", _FP8_EPI, seen_as="._functional_backward",
         skip_here=_TE_ONLY),
    Name("transformer_engine.pytorch.module.linear.Linear._get_quantizers", "model/lora/base_gemm: the module's "
         "own input / weight / grad-output quantizers (LayerNormLinear has the same method and 6-tuple)", _FP8_EPI,
         seen_as="._get_quantizers", skip_here=_TE_ONLY),
    Name("transformer_engine.pytorch.module.base.TransformerEngineBaseModule._fp8_workspaces", "model/lora/"
         "base_gemm: the module's cached FP8 weight across a step's micro-batches (is_first_microbatch)", _FP8_EPI,
         seen_as="._fp8_workspaces", skip_here=_TE_ONLY),
    # precision/te_factory.py: the FP4 quantizers of TE's CustomRecipe
    Name(f"{_NVFP4}.NVFP4TensorRef._create_transpose", "precision/te_factory: overridden to refuse (an FP4 "
         "columnwise copy is a quantization of its own)", _TE, skip_here=_TE_ONLY),
    Name(f"{_NVFP4}.NVFP4TensorRef._quantizer", "precision/te_factory: the dataclass field, passed when a "
         "tensor is built", _TE, skip_here=_TE_ONLY),
    Name(f"{_NVFP4}.NVFP4QuantizerRef._quantize", "precision/te_factory: overridden by the fused-kernel "
         "quantizer; same 6-tuple (qx, sx, qx_t, sx_t, amax_row, amax_col) as TE's", _TE, skip_here=_TE_ONLY),
)

# Private helpers of ours in subclasses of megatron/TE classes: checked NOT to be names of the base class (in
# the installed megatron-core by the test; the TE ones in the sources of VERSIONS' te-* keys), so none overrides.
OWN_IN_SUBCLASSES = {
    "megatron.core.transformer.module.MegatronModule._sdpa": "model/sdpa_attention: the attention kernel call",
    f"{_NVFP4}.NVFP4QuantizerRef._one": "precision/te_factory: one FP4 payload and amax",
    f"{_NVFP4}.NVFP4QuantizerRef._weight_copies": "precision/te_factory: both copies of a weight",
    f"{_NVFP4}.NVFP4QuantizerRef._fill": "precision/te_factory: fills a PrimusFP4TensorRef",
}

# Private attributes the scan cannot type that are not megatron's or TE's.
NOT_MEGATRON_OR_TE = {
    "._data": "trainer/config: the dict behind our own Config",
    "._version": "precision/weight_cache: torch.Tensor._version (in-place update counter)",
    "._primus_chunks": "model/sdpa_attention: our cache on megatron's PackedSeqParams object",
    "._fp4_emulation": "precision/emulation: our marker on an emulated megatron linear",
    "._is_view": "model/lora/fused: torch.Tensor._is_view (a custom Function's as-is output may not be written)",
    "._primus_megatron_forward": "model/lora/swiglu: megatron's own MLP.forward, kept on the instance we rewire",
    "._primus_swiglu": "model/lora/swiglu: the SwiGLU megatron applies, kept on the instance we rewire",
    "._primus_fp8_store": "model/lora/swiglu: whether the rewired MLP keeps fc1's output in FP8 (fp8_swiglu_input)",
}
