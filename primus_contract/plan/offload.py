"""trainer.recompute.activation_offload_layers in the plan: megatron-core's layer-level CPU offloading (TE's offload
context) copies each of the first N layers' saved activations to pinned host memory during the forward and back
before that layer's backward.

Memory (memory.py): those layers keep nothing on the GPU ("(num_layers - num_offloaded_layers) x T" in TE's words),
but one offloaded layer's activations are on the GPU while its copy is in flight, in forward and again in backward
(`in_flight_layers`). Host: N layers' activations a micro-batch, pinned (the plan's notes say how much).
Speed (speed.py): the copies overlap compute; what is not hidden is the copy time beyond the forward (D2H) and the
backward (H2D) of the layers they run beside. PCIE_GB_S is one direction of PCIe Gen5 x16 with pinned memory, fitted
on one H200 row (the 70B on one GPU, 48 layers offloaded, 2026-12-06: 3,519 ms a step against the 2,358 ms of compute
planned beside it, so ~1,760 ms a copy of its 91.9 GB: 52 GB/s; 50 assumed before planned 3,677 ms).
"""
from __future__ import annotations

PCIE_GB_S = 52.0     # H2D / D2H rate of pinned host memory, GB/s a direction (one H200 row, above)
FORWARD_SHARE = 1 / 3  # of a layer's compute: the forward; the backward (dgrad + adapter grads) the rest
in_flight_layers = 1


def offloaded_layers(t: dict, layers: range) -> set[int]:
    """The stage's layers whose activations go to host memory: the first N (pipeline is 1 with offload)."""
    n = t["recompute"]["activation_offload_layers"]
    return set(list(layers)[:n]) if n else set()


def exposed_copy_s(offloaded_bytes_per_mb: float, compute_s_per_mb: float, micro_batches: int) -> float:
    """Seconds a step waits on the copies: per micro-batch, D2H beyond the forward plus H2D beyond the backward."""
    if not offloaded_bytes_per_mb:
        return 0.0
    copy = offloaded_bytes_per_mb / (PCIE_GB_S * 1e9)
    fwd, bwd = compute_s_per_mb * FORWARD_SHARE, compute_s_per_mb * (1 - FORWARD_SHARE)
    return micro_batches * (max(0.0, copy - fwd) + max(0.0, copy - bwd))
