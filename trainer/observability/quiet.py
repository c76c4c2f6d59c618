"""Known-harmless library warnings, kept out of the job log: filtered on every rank, counted, and reported once
per run in one line of rank 0's log (`warnings filtered | ...`, docs/contract.md section 3) instead of a few
lines per rank. Any other warning is shown as Python shows it.

Progress bars (transformers' weight loading, huggingface_hub downloads, tqdm) are switched off by the job's
environment (primus_slurm/config/render.py QUIET_ENV), not here."""
from __future__ import annotations

import warnings

NO_TE = "megatron-core without Transformer Engine/Apex uses its torch fallbacks"
NO_APEX = "megatron-core without Apex uses its torch fallbacks"  # (Transformer Engine is there)
# message prefix -> what it means for this job: the line names only what is missing
KNOWN = {
    "Transformer Engine and Apex are not installed": NO_TE,
    "Apex is not installed": NO_APEX,
    "full scope is deprecated": "megatron-core's default cuda_graph_scope 'full' (no CUDA graphs are captured)",
}
_counts: dict[str, int] = {}  # meaning -> warnings filtered
_shown = None


def install() -> None:
    """Route warnings through the filter (idempotent)."""
    global _shown
    if _shown is not None:
        return
    _shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        for prefix, meaning in KNOWN.items():
            if text.startswith(prefix):
                _counts[meaning] = _counts.get(meaning, 0) + 1
                return
        _shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def summary() -> str | None:
    """The one line for rank 0's log, or None when nothing was filtered."""
    if not _counts:
        return None
    counts = dict(_counts)
    if NO_TE in counts and NO_APEX in counts:  # both missing: one meaning
        counts[NO_TE] += counts.pop(NO_APEX)
    return "warnings filtered | " + " | ".join(f"{meaning} ({n} warnings)" for meaning, n in counts.items())
