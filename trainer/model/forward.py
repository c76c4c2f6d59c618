"""One forward pass over a collated batch -> per-token cross-entropy.

    losses = forward_losses(model, batch)   # fp32 [B, S], not masked, not reduced

The batch (trainer.data.collate) has tokens/labels/loss_mask/position_ids [B, S] and cu_seqlens
(int32 document boundaries over the flattened B*S tokens) + max_seqlen. With trainer.data.packing (the
default) a micro-batch with several documents in a row runs the packed THD layout: [B, S] is flattened to
[1, B*S] and PackedSeqParams carries cu_seqlens, so no token attends across a document (or a micro-batch row)
boundary. TE gets qkv_format="thd"; the CPU / local path gets the same params and SDPACoreAttention masks
block-diagonally. A micro-batch of one-document rows (every row with packing false; with packing, where
trainer.data.single_document_sbhd allows it) runs plain causal attention on [B, S] (no PackedSeqParams), which is
exact there and what TE's FP8 attention needs. `model_inputs` (trainer/model/inputs.py) is the one preparation,
also for callers that run the model themselves (trainer.step.pipeline).
"""
from __future__ import annotations

import torch

from trainer.model.inputs import model_inputs, packed_seq_params  # noqa: F401 (the API: tests, trainer.post)


def forward_losses(model, batch) -> torch.Tensor:
    """Per-token CE loss [B, S] in fp32 (labels < 0 are replaced by 0; mask them with loss_mask).

    With pipeline parallelism this is a forward-only pass through all stages (no autograd graph;
    for evaluation): every stage returns the last stage's losses. Training steps with pipeline
    parallelism go through trainer.step.pipeline.accumulate_gradients instead."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized() and ps.get_pipeline_model_parallel_world_size() > 1:
        from trainer.step.pipeline import pipelined_losses

        return pipelined_losses(model, batch)
    b, s = batch["tokens"].shape
    out = model(**model_inputs(model, batch))
    return out.float().reshape(b, s)
