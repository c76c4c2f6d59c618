"""Packed (THD) attention on CPU: a packed batch equals running each document on its own."""
import torch

from tests.model_helpers import dist_session, packed_batch, perturb_adapters, tiny_cfg
from trainer.model import build_model, forward_losses
from trainer.model.sdpa_attention import document_ids, packed_causal_mask


def test_packed_causal_mask_is_block_diagonal():
    cu = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    assert document_ids(cu, 10).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]
    mask = packed_causal_mask(cu, 10, "cpu")
    for i in range(10):
        for j in range(10):
            same = document_ids(cu, 10)[i] == document_ids(cu, 10)[j]
            assert mask[i, j].item() == bool(same and j <= i), (i, j)


def _logits(model, tokens, cu):
    from trainer.model.forward import packed_seq_params

    t = tokens.reshape(1, -1)
    psp = packed_seq_params(cu, int((cu[1:] - cu[:-1]).max()), t.numel(), "cpu")
    return model(input_ids=t, position_ids=None, attention_mask=None, packed_seq_params=psp)


def test_packed_equals_separate_documents():
    cfg = tiny_cfg()
    doc_lens = [11, 7, 19, 9]  # documents cross the row boundary at 32
    batch = packed_batch(2, 32, doc_lens, vocab=128, seed=7)
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        perturb_adapters(model, seed=8)
        model.eval()
        with torch.no_grad():
            packed_losses = forward_losses(model, batch).reshape(-1)
            packed_logits = _logits(model, batch["tokens"], batch["cu_seqlens"])[0]
            flat_tokens = batch["tokens"].reshape(-1)
            flat_labels = batch["labels"].reshape(-1)
            cu = batch["cu_seqlens"].tolist()
            for d in range(len(doc_lens)):
                s, e = cu[d], cu[d + 1]
                one = {"tokens": flat_tokens[s:e].view(1, -1), "labels": flat_labels[s:e].view(1, -1),
                       "loss_mask": batch["loss_mask"].reshape(-1)[s:e].view(1, -1),
                       "position_ids": torch.arange(e - s).view(1, -1),
                       "cu_seqlens": torch.tensor([0, e - s], dtype=torch.int32), "max_seqlen": e - s}
                alone = forward_losses(model, one).reshape(-1)
                mask = one["loss_mask"].reshape(-1).bool()
                torch.testing.assert_close(packed_losses[s:e][mask], alone[mask], rtol=1e-5, atol=1e-5)
                alone_logits = _logits(model, one["tokens"], one["cu_seqlens"])[0]
                torch.testing.assert_close(packed_logits[s:e], alone_logits, rtol=1e-5, atol=1e-5)
            # Without the document boundaries (one long causal sequence) the later documents differ.
            cross = _logits(model, batch["tokens"], torch.tensor([0, 64], dtype=torch.int32))[0]
            assert not torch.allclose(cross[cu[1]:cu[2]], packed_logits[cu[1]:cu[2]], atol=1e-3)
            torch.testing.assert_close(cross[:cu[1]], packed_logits[:cu[1]], rtol=1e-5, atol=1e-5)


def test_padding_tail_gets_its_own_segment():
    cfg = tiny_cfg()
    batch = packed_batch(1, 32, [10, 12], vocab=128, seed=9)  # 10 pad tokens at the end
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        model.eval()
        with torch.no_grad():
            full = forward_losses(model, batch)
            trimmed = dict(batch)
            trimmed["tokens"] = batch["tokens"][:, :22]
            trimmed["labels"] = batch["labels"][:, :22]
            trimmed["position_ids"] = batch["position_ids"][:, :22]
            part = forward_losses(model, trimmed)
        torch.testing.assert_close(full[:, :21], part[:, :21], rtol=1e-5, atol=1e-5)
        assert torch.isfinite(full).all()


def test_max_seqlen_buckets_are_an_upper_bound_of_few_values():
    """trainer.data.max_seqlen_buckets (default off until timed on a GPU): THD's max_seqlen rounded up to a power of two, at least 64, at
    most the micro-batch's tokens; model_inputs passes it where the built model says so, else the longest document."""
    from trainer.model.inputs import BUCKETS_ATTR, bucket_max_seqlen, model_inputs
    from trainer.model.levers import mark_layout

    assert [bucket_max_seqlen(n, 8192) for n in (1, 64, 65, 2500, 4096, 4097, 8192)] == [
        64, 64, 128, 4096, 4096, 8192, 8192]
    assert bucket_max_seqlen(2500, 3000) == 3000 and bucket_max_seqlen(20, 32) == 32  # never past the tokens
    assert len({bucket_max_seqlen(n, 8192) for n in range(1, 8193)}) == 8
    batch = packed_batch(2, 32, [11, 7, 19, 9], vocab=128, seed=7)
    model = torch.nn.Linear(2, 2)  # what model_inputs reads: its parameters' device and the attributes the build sets
    for on, want in ((True, 64), (False, 19)):  # (64: the least bucket, at most the 2 x 32 tokens)
        mark_layout(model, tiny_cfg(trainer={"data": {"max_seqlen_buckets": on, "single_document_sbhd": False}}))
        assert getattr(model, BUCKETS_ATTR) is on
        assert model_inputs(model, batch)["packed_seq_params"].max_seqlen_q == want
