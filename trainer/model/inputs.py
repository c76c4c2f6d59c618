"""GPTModel.forward kwargs for a collated batch, used by forward_losses and by trainer.step.pipeline's schedule,
which runs the model itself. Two layouts, fixed at build by `trainer.data.packing` (`attention_layout`):

* thd (packing true): [B, S] flattened to [1, B*S] with PackedSeqParams(qkv_format="thd") from cu_seqlens, so no
  token attends across a document or a row (trainer/model/forward.py);
* sbhd (packing false): every row is ONE document followed by padding (trainer.data.packing.one_per_bin; an
  mlperf_npy pack with several is refused at load, and `row_documents` is checked here). [B, S] as it is, no
  PackedSeqParams: megatron's plain causal attention (TE's sbhd, or SDPACoreAttention's is_causal on CPU). Exact:
  a real token sees only earlier tokens, all of its own document; the padding after it sees the document but is
  loss-masked. RoPE positions are 0..S-1, the document's own. TE's FP8 attention takes this layout only.
"""
from __future__ import annotations

import torch

LAYOUT_ATTR = "primus_attention_layout"  # set on the GPTModel by trainer.model.build


def attention_layout(cfg) -> str:
    """'sbhd' when every row holds one document (trainer.data.packing false), else 'thd'."""
    return "thd" if cfg.trainer.data.packing else "sbhd"


def layout_of(model) -> str:
    return getattr(model, LAYOUT_ATTR, "thd")


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
    if layout_of(model) == "sbhd":
        return one_document_rows(batch, device)
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


def one_document_rows(batch, device) -> dict:
    """GPTModel.forward kwargs of the sbhd layout: [B, S] rows of one document each, causal attention, no
    PackedSeqParams."""
    docs = int(batch.get("row_documents", 1))
    if docs > 1:  # the layout would let a later document attend to an earlier one: never run it
        raise ValueError(f"trainer.data.packing is false (one document a row, plain causal attention), but a batch "
                         f"row holds {docs} documents")
    tokens = batch["tokens"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True).clamp(min=0)
    position_ids = batch.get("position_ids")
    if position_ids is not None:
        position_ids = position_ids.to(device, non_blocking=True)
    return dict(input_ids=tokens, position_ids=position_ids, attention_mask=None, labels=labels,
                packed_seq_params=None)
