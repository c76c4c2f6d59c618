"""What a checkpoint can be restored onto, decided the same way at submit (primus_slurm/post_training/post.py) and
in the job (trainer/checkpointing/reshard.py). Standard library only."""
from __future__ import annotations

from typing import Optional


def random_base_refusal(saved_tp: int, tp: int, pretrained: bool, device: str) -> Optional[str]:
    """Why adapters saved at tensor parallel `saved_tp` cannot be restored at `tp`, or None. On a GPU megatron draws
    each TP shard of a randomly initialised base (no trainer.checkpoint.pretrained) from its own TP rank's stream, so
    another TP size is another base: the adapters would be paired with weights they were not trained with, silently.
    On the CPU the base is drawn whole and then split, the same at every TP size."""
    if pretrained or device == "cpu" or int(saved_tp) == int(tp):
        return None
    return (f"saved at tensor parallel {saved_tp} over a randomly initialised base (no trainer.checkpoint.pretrained); "
            f"on a GPU that base differs at tensor parallel {tp}: use the same tensor parallel size, or a "
            "pretrained base")
