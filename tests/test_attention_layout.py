"""trainer.data.packing false: every row is one document, and the model runs plain causal (sbhd) attention without
PackedSeqParams (trainer/model/inputs.py). It equals the THD layout's per-document attention: the same logits at
every real token and the same adapter gradients, on a tiny real megatron-core model."""
import numpy as np
import pytest
import torch

from tests.model_helpers import dist_session, perturb_adapters, tiny_cfg
from trainer.data.batching import collate
from trainer.data.dataset import PackedDataset
from trainer.data.errors import DataError
from trainer.data.packing import one_per_bin, pack_lengths
from trainer.model import build_model, forward_losses
from trainer.model.inputs import LAYOUT_ATTR, model_inputs

SEQ, VOCAB, PAD = 32, 128, 0


def _dataset(lengths, packed: bool, seed: int = 5) -> PackedDataset:
    """The data path's own rows: documents of `lengths` (supervised after the first token), one per row unless
    packed."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, int(sum(lengths))).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    order, poff = pack_lengths(np.asarray(lengths), SEQ) if packed else one_per_bin(len(lengths))
    return PackedDataset(tokens, np.ones(len(tokens), np.uint8), offsets, order, poff, SEQ, PAD)


def test_unpacked_rows_are_one_document_then_padding():
    ds = _dataset([32, 20, 9], packed=False)
    for i, n in enumerate([32, 20, 9]):
        row = ds[i]
        assert row["num_tokens"] == n and row["loss_mask"][n - 1:].sum() == 0 and (row["input_ids"][n:] == PAD).all()
    assert collate([ds[0], ds[1], ds[2]])["row_documents"] == 1
    assert collate(list(_dataset([20, 9, 3], packed=True)))["row_documents"] == 3


def _logits(model, batch):
    inputs = model_inputs(model, batch)
    inputs["labels"] = None
    b, s = batch["tokens"].shape
    return model(**inputs).reshape(b, s, -1)


def test_one_document_rows_equal_thd_in_logits_and_adapter_grads():
    cfg = tiny_cfg(trainer={"data": {"packing": False}})
    lengths = [32, 20, 9]  # one full row, two padded ones
    batch = collate(list(_dataset(lengths, packed=False)))
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        assert getattr(model, LAYOUT_ATTR) == "sbhd"
        inputs = model_inputs(model, batch)
        assert inputs["packed_seq_params"] is None and tuple(inputs["input_ids"].shape) == (3, SEQ)
        perturb_adapters(model, seed=3)
        out = {}
        for layout in ("thd", "sbhd"):
            setattr(model, LAYOUT_ATTR, layout)
            model.zero_grad(set_to_none=True)
            losses = forward_losses(model, batch)
            (losses * batch["loss_mask"]).sum().backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
            with torch.no_grad():
                logits = _logits(model, batch)
            out[layout] = (losses.detach(), logits, grads)
    (l_thd, z_thd, g_thd), (l_bshd, z_bshd, g_bshd) = out["thd"], out["sbhd"]
    mask = batch["loss_mask"].bool()
    torch.testing.assert_close(l_bshd[mask], l_thd[mask], rtol=1e-5, atol=1e-5)
    for row, n in enumerate(lengths):  # every real token; the padding after a document is loss-masked
        torch.testing.assert_close(z_bshd[row, :n], z_thd[row, :n], rtol=1e-5, atol=1e-5)
    assert g_thd.keys() == g_bshd.keys() and len(g_thd) > 0
    for name in g_thd:
        torch.testing.assert_close(g_bshd[name], g_thd[name], rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for g in g_thd.values())


def test_a_row_of_several_documents_is_never_run_causal():
    cfg = tiny_cfg(trainer={"data": {"packing": False}})
    batch = collate(list(_dataset([20, 9, 3], packed=True)))
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        with pytest.raises(ValueError, match="trainer.data.packing is false .* a batch row holds 3 documents"):
            model_inputs(model, batch)


def test_packed_mlperf_file_with_packing_false_is_refused(tmp_path):
    from trainer.data import mlperf
    from trainer.data.options import DataOptions, SourceSpec

    mlperf.write_synthetic(str(tmp_path), n_packs=4, seq_length=64, vocab_size=VOCAB, seed=1)
    spec = SourceSpec(str(tmp_path), None, "train", None)
    opts = DataOptions(format="mlperf_npy", train=spec, validation=spec, tokenizer=None, seq_length=64,
                       packing=False)
    with pytest.raises(DataError, match=r"trainer.data.packing: false means one document a row, and .* pack \d+ "
                                        r"holds \d+ \(format mlperf_npy"):
        mlperf.load_split(opts, spec, "train")
