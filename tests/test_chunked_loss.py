"""trainer.model.chunked_loss: the chunked frozen-output-layer CE gives megatron's losses and LoRA
gradients, never keeps the [tokens, vocab] logits, and leaves logits-wanted forwards alone.
(TP=2 with and without sequence parallelism against megatron's path: tests/test_tp_lora.py.)"""
from __future__ import annotations

import torch

from tests.model_helpers import models_with_same_adapters, packed_batch, tiny_cfg
from trainer.model import chunked_loss, forward_losses
from trainer.model.forward import model_inputs
from trainer.observability.saved_census import SavedTensorCensus

DOCS = [13, 22, 8, 21]
VOCAB = 128


def _cfg(chunked: bool):
    return tiny_cfg(trainer={"recompute": {"chunked_loss": chunked}})


def _step(model, batch):
    census = SavedTensorCensus(model, torch.device("cpu"))
    census.start()
    losses = forward_losses(model, batch)
    loss = (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    loss.backward()
    census.close()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        eval_losses = forward_losses(model, batch)
        inputs = model_inputs(model, batch)
        inputs.pop("labels")
        logits = model(**inputs)
    return losses.detach(), grads, eval_losses, logits, sum(census.totals().values())


def test_chunked_loss_matches_megatron_and_keeps_no_logits(monkeypatch):
    monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", 4 * VOCAB * 7)  # 7-token chunks: 64 tokens -> 10
    batch = packed_batch(2, 32, DOCS, vocab=VOCAB, seed=3)
    runs = {}
    for chunked, (_, model) in zip((False, True), models_with_same_adapters([_cfg(False), _cfg(True)], seed=4)):
        assert ("compute_language_model_loss" in vars(model)) == chunked  # the chunked loss installed on the model
        runs[chunked] = _step(model, batch)
    (ref, ref_grads, ref_eval, ref_logits, ref_saved), (got, grads, got_eval, logits, saved) = runs[False], runs[True]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_eval, ref_eval, rtol=1e-5, atol=1e-5)
    assert set(grads) == set(ref_grads) and len(grads) == 16
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # a forward without labels still returns megatron's logits
    assert logits.shape == (1, 64, VOCAB)
    torch.testing.assert_close(logits, ref_logits)
    # megatron's path keeps the fp32 [64, 128] logits (32 KiB); ours keeps dCE/dh [64, 64] instead
    assert ref_saved - saved >= 64 * VOCAB * 4 - 64 * 64 * 4


def test_trainable_output_weight_takes_megatron_path():
    """If a recipe ever trains the output layer, its weight gradient must not be skipped."""
    batch = packed_batch(1, 32, [32], vocab=VOCAB, seed=5)
    for _, model in models_with_same_adapters([_cfg(True)], seed=6):
        model.output_layer.weight.requires_grad_(True)
        forward_losses(model, batch).sum().backward()
        assert model.output_layer.weight.grad is not None and model.output_layer.weight.grad.abs().sum() > 0


def test_state_never_leaks_and_a_rewritten_stand_in_is_refused():
    """After a labelled forward the output layer gives logits again; if anything replaces the hidden
    states the output layer handed through (as MuP's logit scaling would), the loss refuses loudly
    instead of taking cross-entropy over hidden states."""
    import pytest

    batch = packed_batch(1, 32, [32], vocab=VOCAB, seed=7)
    for _, model in models_with_same_adapters([_cfg(True)], seed=8):
        forward_losses(model, batch)
        h = torch.randn(5, 1, 64)
        logits, _ = model.output_layer(h)
        assert logits.shape == (5, 1, VOCAB)
        model.output_layer.register_forward_hook(lambda _m, _i, out: (out[0] * 1.0, out[1]))
        with pytest.raises(RuntimeError, match="chunked_loss: the output layer's result was transformed"):
            forward_losses(model, batch)
