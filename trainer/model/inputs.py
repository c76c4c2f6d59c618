"""GPTModel.forward kwargs for a collated batch, in the packed THD layout (trainer/model/forward.py says why);
used by forward_losses and by trainer.step.pipeline's schedule, which runs the model itself."""
from __future__ import annotations

import torch


def packed_seq_params(cu_seqlens: torch.Tensor, max_seqlen: int, total: int, device):
    """PackedSeqParams for THD attention; a trailing segment covers any rows past cu_seqlens[-1]."""
    from megatron.core.packed_seq_params import PackedSeqParams

    # Validate/extend on the host (move_batch leaves cu_seqlens there: a device copy here would sync the stream).
    cu = cu_seqlens.detach().reshape(-1).to("cpu", torch.int32)
    if cu.numel() == 0 or int(cu[0]) != 0:
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), cu])
    last = int(cu[-1])
    if last < total:
        cu = torch.cat([cu, torch.tensor([total], dtype=torch.int32)])
        max_seqlen = max(int(max_seqlen), total - last)
    elif last > total:
        raise ValueError(f"cu_seqlens ends at {last} but the batch has {total} tokens")
    cu = cu.to(device=device, non_blocking=True)
    max_seqlen = int(max_seqlen)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)


def model_inputs(model, batch) -> dict:
    """GPTModel.forward kwargs for a collated batch: THD-flattened [1, B*S] tokens/labels/positions
    and PackedSeqParams. Every pipeline stage passes the same kwargs (only the first stage embeds the
    tokens, only the last one uses the labels; every stage's attention needs cu_seqlens)."""
    tokens = batch["tokens"]
    b, s = tokens.shape
    device = next(model.parameters()).device
    tokens = tokens.to(device, non_blocking=True).reshape(1, b * s)
    labels = batch["labels"].to(device, non_blocking=True).reshape(1, b * s)
    labels = labels.clamp(min=0)
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = torch.arange(s, device=device).repeat(b)
    position_ids = position_ids.to(device, non_blocking=True).reshape(1, b * s)
    max_seqlen = batch.get("max_seqlen") or s
    if isinstance(max_seqlen, torch.Tensor):
        max_seqlen = int(max_seqlen.max())
    cu = batch.get("cu_seqlens")
    if cu is None:  # no packing info: each row is one document
        cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
    psp = packed_seq_params(cu, max_seqlen, b * s, device)
    return dict(input_ids=tokens, position_ids=position_ids, attention_mask=None, labels=labels,
                packed_seq_params=psp)
