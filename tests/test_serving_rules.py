"""vLLM's max_lora_rank is one of a fixed set (vllm/config/lora.py MaxLoRARanks): `generate` started vLLM with
max(rank, 8), which vLLM refuses for a rank such as 12 or 48 (audit, 2026-12-05). primus_contract.serving rounds up."""
from __future__ import annotations

import importlib.util
import typing

import pytest

from primus_contract.serving import VLLM_LORA_RANKS, vllm_lora_rank, vllm_memory_fraction


@pytest.mark.parametrize("rank, want", [(1, 1), (2, 8), (8, 8), (12, 16), (48, 64), (300, 320), (512, 512),
                                        (513, None), (65536, None)])
def test_the_rank_vllm_is_started_with(rank, want):
    assert vllm_lora_rank(rank) == want


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed here (GPU images)")
def test_the_set_is_vllms_own():
    from vllm.config.lora import MaxLoRARanks

    assert tuple(sorted(typing.get_args(MaxLoRARanks))) == VLLM_LORA_RANKS


def test_vllm_takes_what_the_process_left_free():
    """vLLM refuses to start unless gpu_memory_utilization x the GPU is free; the export before it in the same process
    holds ~8.9 GiB outside the allocator (H100, 2026-12-05, NCCL eager, the default then): the default 0.9 of 79 GiB
    could not be free."""
    assert vllm_memory_fraction(79.0, 79.2) == 0.9  # an empty GPU: vLLM's default
    share = vllm_memory_fraction(70.3, 79.2)
    assert share * 79.2 < 70.3 and share > 0.8
    assert vllm_memory_fraction(1.0, 79.2) == 0.05
