"""LoRA adapters: the layers and their wiring (layers), the fused paths (fused, swiglu), grouped experts
(grouped) and the adapters' input handling (inputs)."""
