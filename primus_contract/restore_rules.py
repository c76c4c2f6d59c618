"""What a checkpoint can be restored onto, decided the same way at submit (primus_slurm/post_training/post.py) and
in the job (trainer/checkpointing/reshard.py). Standard library only."""
from __future__ import annotations

from typing import Optional


def random_base_refusal(saved_tp: int, tp: int, pretrained: bool, device: str, saved_ep: int = 1,
                        ep: int = 1) -> Optional[str]:
    """Why adapters saved at tensor parallel `saved_tp` (expert parallel `saved_ep`) cannot be restored at `tp`
    (`ep`), or None. Over a randomly initialised base (no trainer.checkpoint.pretrained) another layout can be
    another base, and the adapters would be paired with weights they were not trained with, silently:
    - on a GPU megatron draws each TP shard from its own TP rank's stream (on the CPU the base is drawn whole and
      then split, the same at every TP size);
    - on any device each EP rank draws its local experts from its own stream (trainer/model/seeding.py), so another
      EP size is other experts (audit, 2026-12-05: a post job, always at EP 1, of a run trained at EP 2)."""
    if pretrained:
        return None
    if int(saved_ep) != int(ep):
        return (f"saved at expert parallel {saved_ep} over a randomly initialised base (no "
                f"trainer.checkpoint.pretrained); its experts differ at expert parallel {ep}: use the same expert "
                "parallel size, or a pretrained base")
    if device == "cpu" or int(saved_tp) == int(tp):
        return None
    return (f"saved at tensor parallel {saved_tp} over a randomly initialised base (no trainer.checkpoint.pretrained); "
            f"on a GPU that base differs at tensor parallel {tp}: use the same tensor parallel size, or a "
            "pretrained base")
