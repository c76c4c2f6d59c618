"""SDPACoreAttention's THD path runs attention in runs of whole documents (trainer.model.sdpa_attention
.packed_chunks); that must equal one dense block-diagonal causal mask over all t tokens, values and grads."""
import pytest
import torch
import torch.nn.functional as F

from trainer.model.sdpa_attention import SDPACoreAttention, packed_causal_mask, packed_chunks

CASES = [  # cu_seqlens, total tokens, expected runs with cap 128
    ([0, 30, 61, 100, 140, 170, 256], 256, 3),   # several documents per run
    ([0, 300, 320, 512], 512, 3),                # documents longer than the run cap are runs of their own
    ([0, 10, 10, 50], 80, 1),                    # empty document; tail past cu[-1] is one document
    ([0, 256], 256, 1),                          # a single document: plain causal, no mask
]


def _dense_attention(q, k, v, cu, total):
    qq, kk, vv = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))
    rep = qq.size(1) // kk.size(1)
    kk, vv = kk.repeat_interleave(rep, dim=1), vv.repeat_interleave(rep, dim=1)
    mask = packed_causal_mask(torch.tensor(cu, dtype=torch.int32), total, "cpu")
    out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
    return out[0].transpose(0, 1).reshape(total, -1)


@pytest.mark.parametrize("cu,total,runs", CASES)
def test_chunks_cover_the_dense_mask(cu, total, runs):
    chunks = packed_chunks(torch.tensor(cu, dtype=torch.int32), total, "cpu", cap=128)
    assert chunks[0][0] == 0 and chunks[-1][1] == total
    assert all(a1 == b0 for (_, b0, _), (a1, _, _) in zip(chunks, chunks[1:]))
    union = torch.zeros(total, total, dtype=torch.bool)
    for a, b, mask in chunks:
        union[a:b, a:b] = torch.tril(torch.ones(b - a, b - a, dtype=torch.bool)) if mask is None else mask
    assert torch.equal(union, packed_causal_mask(torch.tensor(cu, dtype=torch.int32), total, "cpu"))
    assert len(chunks) == runs  # the point: no dense t x t mask
    assert all(b - a <= 128 or mask is None for a, b, mask in chunks)


@pytest.mark.parametrize("cu,total,runs", CASES)
def test_chunked_attention_equals_dense_mask(cu, total, runs):
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                            attention_dropout=0.0)
    attn = SDPACoreAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    g = torch.Generator().manual_seed(len(cu) + total)
    q = torch.randn(total, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(total, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(total, 2, 16, generator=g, requires_grad=True)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t)
    out = attn(q, k, v, None, packed_seq_params=psp)
    again = attn(q, k, v, None, packed_seq_params=psp)  # second layer: cached runs
    ref = _dense_attention(q, k, v, cu, total)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
