"""What this machine offers for low precision: device, compute capability / gfx arch, TE version."""
from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Optional, Tuple

from primus_contract.machine import Environment, parse_version  # noqa: F401 (the machine rules' facts)

_TE_DISTS = ("transformer_engine", "transformer-engine", "transformer_engine_torch",
             "transformer-engine-cu12", "transformer-engine-cu13")


def _te_version() -> Optional[Tuple[int, ...]]:
    if importlib.util.find_spec("transformer_engine") is None:
        return None
    for dist in _TE_DISTS:
        try:
            return parse_version(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    try:  # source installs without metadata
        import transformer_engine  # noqa: WPS433

        return parse_version(getattr(transformer_engine, "__version__", "0"))
    except Exception:  # noqa: BLE001 - a broken TE install counts as no TE
        return None


def _te_has_mxfp4() -> bool:
    try:
        from transformer_engine.common import recipe  # noqa: WPS433
    except Exception:  # noqa: BLE001
        return False
    return hasattr(recipe, "MXFP4BlockScaling")


def probe_environment(device: str = "auto") -> Environment:
    """Look at this process's accelerator and software. `device` is trainer.distributed.device."""
    import torch

    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    te_version = _te_version()
    has_triton = importlib.util.find_spec("triton") is not None
    if not use_cuda or not torch.cuda.is_available():
        return Environment(device="cpu", te_version=te_version, has_triton=has_triton)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if getattr(torch.version, "hip", None):
        arch = getattr(props, "gcnArchName", "") or "gfx?"
        return Environment(device="cuda", device_name=props.name, rocm_arch=arch.split(":")[0],
                           te_version=te_version, te_has_mxfp4=te_version is not None and _te_has_mxfp4(),
                           has_triton=has_triton)
    return Environment(device="cuda", device_name=props.name, cuda_cc=(props.major, props.minor),
                       te_version=te_version, has_triton=has_triton)
