"""What the serving engines take of a run's adapter (standard library: the launcher refuses before submit, the
generate job picks and configures its engine by the same rule).

vLLM's LoRAConfig types max_lora_rank as one of a fixed set (vllm/config/lora.py MaxLoRARanks, read 2026-12-05):
the adapter's rank rounded up to the next of them; above the largest, vLLM cannot serve the adapter.
"""
from __future__ import annotations

from typing import Optional

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> Optional[int]:
    """The max_lora_rank vLLM is started with for an adapter of `rank`, None when it serves none that large."""
    return next((r for r in VLLM_LORA_RANKS if r >= int(rank)), None)


def vllm_memory_fraction(free: float, total: float, ceiling: float = 0.9, spare: float = 0.05) -> float:
    """vLLM's gpu_memory_utilization for a process that already holds part of the GPU: vLLM refuses to start unless
    that fraction of the whole GPU is free, and `generate` starts it after the adapter export built the megatron
    model in the same process (what lives outside PyTorch's allocator stays held: ~8.9 GiB a process on an H100 on
    2026-12-05 with NCCL's communicators made eagerly, the default then, so the default 0.9 of 79 GiB could not be
    free; 0.73 GiB lazily). What is free, less a spare, at most `ceiling`."""
    return max(0.05, min(ceiling, free / total - spare))
