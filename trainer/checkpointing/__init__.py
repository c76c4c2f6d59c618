"""Checkpoints of the LoRA training state: the atomic save/load protocol (checkpoint) and resume on another
parallel layout (reshard)."""
