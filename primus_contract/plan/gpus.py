"""GPUs the env profiles name (templates/profiles.yaml): memory a process can use, and dense peak rates.

memory_gib: the device's total as nvidia-smi / rocm-smi report it (MiB / 1024), the ceiling a plan is held to.
Peak TFLOP/s are the vendors' dense (no sparsity) figures; the planner never uses them raw: achieved rates come
from calibration.py (measured on the H200), scaled to other GPUs by these peaks' ratio, which the plan says.
link_gb_s: one GPU's intra-node (NVLink / Infinity Fabric) bandwidth per direction, for tensor-parallel traffic.
hbm_tb_s: the vendor's peak memory bandwidth, for memory-bound work (elementwise passes, the adapters' GEMMs).
hbm_fit_tb_s: where rows were measured on the GPU, the bandwidth that puts the H200-calibrated memory-bound costs on
them (those kernels are not all at the bandwidth bound); 0: the vendor's peak.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    bf16_tflops: float
    fp8_tflops: float
    fp4_tflops: float      # 0: no FP4 units (emulation runs BF16 GEMMs)
    link_gb_s: float
    hbm_tb_s: float
    hbm_fit_tb_s: float = 0.0

    @property
    def memory_bound_tb_s(self) -> float:
        return self.hbm_fit_tb_s or self.hbm_tb_s


GPUS = {
    # h100's fit: the 12 Llama-3-8B rows of bench/results/2026-12-05c_h100_levers (BF16 and FP8, packed and single)
    # planned within -3..+3 % (mean -0.2 %; refitted with the costs that price the chunked loss's passes, was 4.1);
    # at the vendor's 3.35 TB/s they are planned 3-16 % low
    "h100": Gpu("H100 SXM 80GB", 81559 / 1024, 989.0, 1979.0, 0.0, 450.0, 3.35, hbm_fit_tb_s=4.3),
    "h200": Gpu("H200 141GB", 143771 / 1024, 989.0, 1979.0, 0.0, 450.0, 4.8),
    "b200": Gpu("B200 180GB", 183359 / 1024, 2250.0, 4500.0, 9000.0, 900.0, 8.0),
    "mi300x": Gpu("MI300X 192GB", 196592 / 1024, 1307.0, 2615.0, 0.0, 448.0, 5.3),
    "mi355x": Gpu("MI355X 288GB", 294896 / 1024, 2500.0, 5000.0, 10000.0, 576.0, 8.0),
}
CALIBRATED_ON = "h200"


def gpu_for(env_profile: str) -> Gpu | None:
    """The GPU of a recipe's cluster.env_profile; None for none/cpu (unknown: the plan says so, nothing refused)."""
    return GPUS.get(env_profile)
