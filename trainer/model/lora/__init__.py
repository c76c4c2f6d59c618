"""LoRA adapters: the layers and their wiring (layers), the fused paths (fused; epilogue, which owns the base GEMM;
swiglu), their pre-dropout (drop) and Triton rank-r kernels (kernels), grouped experts (grouped) and the adapters'
input handling (inputs)."""
