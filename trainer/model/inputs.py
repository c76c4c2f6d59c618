"""GPTModel.forward kwargs for a collated batch, used by forward_losses and by trainer.step.pipeline's schedule,
which runs the model itself. Two layouts; the model is built for one of three values (`attention_layout`):

* thd: [B, S] flattened to [1, B*S] with PackedSeqParams(qkv_format="thd") from cu_seqlens, so no token attends
  across a document or a row (trainer/model/forward.py);
* sbhd (packing false): every row is ONE document followed by padding (trainer.data.packing.one_per_bin; an
  mlperf_npy pack with several is refused at load, and `row_documents` is checked here). [B, S] as it is, no
  PackedSeqParams: megatron's plain causal attention (TE's sbhd, or SDPACoreAttention's is_causal on CPU). TE's
  FP8 attention takes this layout only;
* auto (packing true, trainer.data.single_document_sbhd true, the default): each micro-batch is run sbhd when every
  row holds at most one document (collate's `row_documents` <= 1), else thd (`batch_layout`). On an H100 the
  Llama-3-8B LoRA shape with one document a row ran ~2 % faster sbhd (FP8 and BF16; bench/results).

sbhd is exact for the real tokens (with LoRA dropout, equal in distribution: the same draws land on other
tokens of the [S, B] order than of the [B*S] one; deterministic either way). A one-document row is the document at 0..n-1 (collate's cu_seqlens start every
row at 0), then from n on the padding (pad id, label ignored, loss_mask 0; trainer/data/dataset.py gives it its
own cu_seqlens segment and position_ids restarting at 0). Causally a real token sees only earlier tokens, all of its
own document, as in thd; the padding comes after them, so no real token sees it, and what it sees itself is
loss-masked. RoPE: megatron's rotary embedding does not read position_ids (0..S-1 a row in sbhd, restarting at
each cu_seqlens segment in thd), so either way the real tokens' positions are 0..n-1, the document's own
position_ids; only the padding's differ (n..S-1 against 0..S-n-1), which no loss sees. MoE is dropless with no
load-balancing loss (trainer.model.arch): a token's expert output depends on that token alone.

auto stays thd where sbhd is not allowed: context parallelism > 1 (thd batches are what a CP split would take; the
build refuses CP > 1 today), pipeline parallelism > 1 (trainer.step.pipeline sizes the p2p buffers of all the
micro-batches of a step by the model's one layout: [B*S, 1] unless it is sbhd), a row of 2+ documents, a batch
without `row_documents` (not from collate: it may be packed), and sequence parallelism where S is not divisible
by tensor (sbhd splits each row's S over the TP ranks). The decision is a pure function of the model's config and
the batch, so every rank of a tensor-parallel group takes the same one.
"""
from __future__ import annotations

import torch

from primus_contract.rules_precision import attention_layout as contract_layout
from trainer.precision.settings import FP8_ATTENTION_ATTR  # (FP8 attention follows each micro-batch's layout)

LAYOUT_ATTR = "primus_attention_layout"  # set on the GPTModel by trainer.model.build (trainer.model.levers)
BUCKETS_ATTR = "primus_max_seqlen_buckets"  # trainer.data.max_seqlen_buckets, set there too (default off)


def attention_layout(cfg) -> str:
    """The layout the model is built for: primus_contract.rules_precision.attention_layout (the contract refuses FP8
    attention where it is thd)."""
    return contract_layout(cfg.trainer)


def layout_of(model) -> str:
    return getattr(model, LAYOUT_ATTR, "thd")


def follow_layout(model, layout: str) -> None:
    """An 'auto' model built with FP8 attention (precision.fp8_dot_product_attention true) runs it on the sbhd
    micro-batches only: TE has no FP8 attention for thd. megatron makes each forward's FP8 recipe from the model's
    TransformerConfig (fp8_utils.get_fp8_recipe: fp8_dpa=config.fp8_dot_product_attention), so the flag follows this
    micro-batch's layout. A full recompute under the tensorwise recipe makes its FP8 context again in the backward
    (megatron's block recompute), reading the flag then: that is this micro-batch's still, since without pipeline
    parallelism (auto has none) each micro-batch's forward and backward run before the next one's inputs are made
    (trainer/step/pipeline.py)."""
    if getattr(model, FP8_ATTENTION_ATTR, False):
        model.config.fp8_dot_product_attention = layout == "sbhd"


def batch_layout(model, batch) -> str:
    """'thd' or 'sbhd' for this micro-batch: the model's layout, or for 'auto' sbhd when every row holds at most one
    document and nothing else needs thd (the module docstring)."""
    layout = layout_of(model)
    if layout != "auto":
        return layout
    docs = batch.get("row_documents")
    if docs is None or int(docs) > 1:
        return "thd"
    config = getattr(model, "config", None)
    if config is not None:
        if (int(getattr(config, "context_parallel_size", 1)) > 1
                or int(getattr(config, "pipeline_model_parallel_size", 1)) > 1):
            return "thd"
        tp = int(getattr(config, "tensor_model_parallel_size", 1))
        if getattr(config, "sequence_parallel", False) and batch["tokens"].shape[1] % tp:
            return "thd"
    return "sbhd"


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor onto `device` without draining the stream: to a CUDA device through pinned memory, whose copy is
    asynchronous (a copy from pageable memory waits for every kernel queued before it, so the GPU idles while the host
    prepares the next one: ~1 ms at each of the 8B's step starts on the H100, bench/results/2026-12-05d_h100_speed's
    profile). Elsewhere, or already there, a plain .to()."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)


def bucket_max_seqlen(n: int, total: int) -> int:
    """`n` rounded up to a power of two, at least 64 and at most `total` (the micro-batch's tokens): an upper bound
    of the longest segment that takes a few values over a run, so TE's cuDNN attention, whose execution graphs are
    keyed by the shape (max_seqlen included), builds a few of them rather than one per new longest document."""
    return min(max(64, 1 << (max(int(n), 1) - 1).bit_length()), int(total))


def packed_seq_params(cu_seqlens: torch.Tensor, max_seqlen: int, total: int, device, buckets: bool = False):
    """PackedSeqParams for THD attention; a trailing segment covers any rows past cu_seqlens[-1]; `buckets`: max_seqlen
    rounded up by bucket_max_seqlen (trainer.data.max_seqlen_buckets)."""
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
    cu = to_device(cu, device)
    max_seqlen = bucket_max_seqlen(max_seqlen, total) if buckets else int(max_seqlen)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)


def model_inputs(model, batch) -> dict:
    """GPTModel.forward kwargs for a collated batch in its `batch_layout`: sbhd (`one_document_rows`), or
    THD-flattened [1, B*S] tokens/labels/positions and PackedSeqParams. Every pipeline stage passes the same kwargs
    (only the first stage embeds the tokens, only the last one uses the labels; every stage's attention needs
    cu_seqlens)."""
    tokens = batch["tokens"]
    b, s = tokens.shape
    device = next(model.parameters()).device
    layout = batch_layout(model, batch)
    follow_layout(model, layout)
    if layout == "sbhd":
        return one_document_rows(batch, device)
    tokens = to_device(tokens, device).reshape(1, b * s)
    labels = to_device(batch["labels"], device).reshape(1, b * s)
    labels = labels.clamp(min=0)
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = torch.arange(s, device=device).repeat(b)
    position_ids = to_device(position_ids, device).reshape(1, b * s)
    max_seqlen = batch.get("max_seqlen") or s
    if isinstance(max_seqlen, torch.Tensor):
        max_seqlen = int(max_seqlen.max())
    cu = batch.get("cu_seqlens")
    if cu is None:  # no packing info: each row is one document
        cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
    psp = packed_seq_params(cu, max_seqlen, b * s, device, buckets=getattr(model, BUCKETS_ATTR, False))
    return dict(input_ids=tokens, position_ids=position_ids, attention_mask=None, labels=labels,
                packed_seq_params=psp)


def one_document_rows(batch, device) -> dict:
    """GPTModel.forward kwargs of the sbhd layout: [B, S] rows of one document each, causal attention, no
    PackedSeqParams. A batch without `row_documents` is taken as one document a row (packing false only:
    `batch_layout` runs such a batch thd under 'auto')."""
    docs = int(batch.get("row_documents", 1))
    if docs > 1:  # the layout would let a later document attend to an earlier one: never run it
        raise ValueError(f"trainer.data.packing is false (one document a row, plain causal attention), but a batch "
                         f"row holds {docs} documents")
    tokens = to_device(batch["tokens"], device)
    labels = to_device(batch["labels"], device).clamp(min=0)
    position_ids = batch.get("position_ids")
    if position_ids is not None:
        position_ids = to_device(position_ids, device)
    return dict(input_ids=tokens, position_ids=position_ids, attention_mask=None, labels=labels,
                packed_seq_params=None)
