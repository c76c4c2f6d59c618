"""What this machine offers for low precision: device, compute capability / gfx arch, TE version."""
from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Optional, Tuple

_TE_DISTS = ("transformer_engine", "transformer-engine", "transformer_engine_torch",
             "transformer-engine-cu12", "transformer-engine-cu13")


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


def parse_version(text: str) -> Tuple[int, ...]:
    parts = []
    for piece in text.replace("+", ".").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits or not piece[0].isdigit():
            break
        parts.append(int(digits))
    return tuple(parts)


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
