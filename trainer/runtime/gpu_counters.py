"""The GPUs' error counters from the vendor's tool (nvidia-smi, rocm-smi), for the node check and the preflight.

Standard library only (the preflight imports no torch). Where neither tool is on PATH (CPU nodes, a container
without it) the counters are skipped and the caller says so in a note.
"""
from __future__ import annotations

import json
import shutil
import subprocess

# nvidia-smi --query-gpu fields whose non-zero value means the GPU needs attention: uncorrectable ECC errors since
# the driver loaded, rows the memory failed to remap (H100/H200), pages waiting to be retired (older GPUs)
NVIDIA_FIELDS = ("ecc.errors.uncorrected.volatile.total", "remapped_rows.failure", "retired_pages.pending")
TIMEOUT_S = 30


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _number(text: str) -> float | None:
    text = text.strip().lower()
    if text in ("", "n/a", "[n/a]", "[not supported]", "not supported"):
        return None
    if text in ("yes", "no"):  # remapped_rows.failure / retired_pages.pending answer Yes / No
        return 1.0 if text == "yes" else 0.0
    try:
        return float(text)
    except ValueError:
        return None


def nvidia(text: str) -> dict[int, dict[str, float]]:
    """{GPU index: {field: value}} from `nvidia-smi --query-gpu=index,<NVIDIA_FIELDS> --format=csv,noheader,nounits`."""
    out = {}
    for raw in text.splitlines():
        cells = [c.strip() for c in raw.split(",")]
        if len(cells) != 1 + len(NVIDIA_FIELDS) or not cells[0].isdigit():
            continue
        values = {name: _number(cell) for name, cell in zip(NVIDIA_FIELDS, cells[1:])}
        out[int(cells[0])] = {k: v for k, v in values.items() if v is not None}
    return out


def rocm(text: str) -> dict[int, dict[str, float]]:
    """{GPU index: {block uncorrectable: count}} from `rocm-smi --showrasinfo all --json` (keys `card0`, ...)."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    out = {}
    for card, fields in (data or {}).items():
        if not (isinstance(fields, dict) and card.startswith("card") and card[4:].isdigit()):
            continue
        counts = {}
        for key, value in fields.items():
            if "uncorrect" in key.lower() or key.lower().endswith(" ue"):
                number = _number(str(value))
                if number is not None:
                    counts[key] = number
        out[int(card[4:])] = counts
    return out


def counters() -> tuple[str | None, dict[int, dict[str, float]], str]:
    """(the tool used or None, {GPU index: {counter: value}}, a note: what was skipped and why)."""
    if shutil.which("nvidia-smi"):
        text = _run(["nvidia-smi", f"--query-gpu=index,{','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"])
        if text is None:
            return "nvidia-smi", {}, "nvidia-smi failed; error counters not read"
        return "nvidia-smi", nvidia(text), ""
    if shutil.which("rocm-smi"):
        text = _run(["rocm-smi", "--showrasinfo", "all", "--json"])
        if text is None:
            return "rocm-smi", {}, "rocm-smi failed; error counters not read"
        return "rocm-smi", rocm(text), ""
    return None, {}, "no nvidia-smi or rocm-smi on PATH: GPU error counters skipped"


def bad(found: dict[int, dict[str, float]]) -> str | None:
    """`GPU 3: ecc.errors.uncorrected.volatile.total 2` for the first GPU with a non-zero counter, else None."""
    for index in sorted(found):
        nonzero = {k: v for k, v in found[index].items() if v > 0}
        if nonzero:
            return f"GPU {index}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(nonzero.items()))
    return None
