"""Every adaptation megatron-core needs to run on a CPU-only host, in one place.

`install()` is a no-op when CUDA is available, so GPU runs use megatron-core untouched. On CPU it:

1. makes `torch.cuda.current_device()` return "cpu" (megatron allocates buffers with
   `device=torch.cuda.current_device()` in many spots; "cpu" is a valid device argument there);
2. replaces the model-parallel CUDA RNG tracker with one that forks the CPU generator, and points
   megatron's `_get_cuda_rng_state/_set_cuda_rng_state` (used by activation recompute) at the CPU
   generator, so `model_parallel_cuda_manual_seed`, dropout forks and recompute replay all work;
3. gives megatron's pipeline schedules (which allocate their token counter with device="cuda") a
   `torch` whose `zeros` maps a CUDA device to the CPU;
4. defines `te_general_gemm = None` in megatron's MoE utils when TE is absent (some versions only
   bind the name when TE imports, so the router's plain torch.mm fallback raised NameError);
5. sets multi_latent_attention.HAVE_TE = False when TE is absent (its guarded import succeeds
   without TE, binding TELinear = None, and MLA's isinstance(linear_proj, TELinear) then raised).

The packed (THD) attention on CPU is a separate module (trainer.model.sdpa_attention) selected by
trainer.model.specs; nothing here changes numerics.
"""
from __future__ import annotations

import contextlib
import types

import torch

_INSTALLED = False


def _cpu_get_rng_state(device="cuda", clone=False, graph_safe=False):  # noqa: ARG001
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state, device=-1, graph_safe=False):  # noqa: ARG001
    torch.set_rng_state(new_state)


def _make_tracker_class():
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Named RNG states over the CPU default generator (same API as megatron's tracker)."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


class _CpuTorch(types.ModuleType):
    """`torch` for a megatron module that hard-codes device="cuda" in torch.zeros."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "cuda":
            device = "cpu"
        return torch.zeros(*args, device=device, **kwargs)


def install() -> bool:
    """Apply the CPU adaptations once; returns True when they are active."""
    global _INSTALLED
    if torch.cuda.is_available():
        return False
    if _INSTALLED:
        return True
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    mrandom._get_cuda_rng_state = _cpu_get_rng_state
    mrandom._set_cuda_rng_state = _cpu_set_rng_state
    mrandom._CUDA_RNG_STATE_TRACKER = _make_tracker_class()()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _CpuTorch()
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    from megatron.core.transformer import multi_latent_attention as mla

    if not isinstance(getattr(mla, "TELinear", None), type):
        mla.HAVE_TE = False
    _INSTALLED = True
    return True


def is_installed() -> bool:
    return _INSTALLED
