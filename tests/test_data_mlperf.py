"""MLPerf Llama2-70B LoRA packed .npy format: synthetic writer + loader round trip."""
import json
import os

import numpy as np
import pytest

from trainer.data import DataError, build_datasets, collate
from trainer.data.mlperf import write_synthetic


def cfg(path, ws, seq=1024, validation=True):
    return {"experiment": {"workspace": str(ws), "seed": 1}, "trainer": {"tokenizer": {"path": None}, "data": {
        "format": "mlperf_npy", "train": {"path": str(path), "split": "train"},
        "validation": {"path": str(path) if validation else None, "split": "validation"}, "seq_length": seq}}}


def test_round_trip(tmp_path):
    d = tmp_path / "mlperf"
    write_synthetic(str(d), n_packs=24, seq_length=1024, vocab_size=500, seed=0)
    assert sorted(os.listdir(d)) == ["packed_metadata.jsonl", "train.npy", "validation.npy"]
    meta = json.loads((d / "packed_metadata.jsonl").read_text().splitlines()[0])
    assert set(meta) == {"max_samples_per_bin", "dataset_max_seqlen", "min_packed_seqlen"}
    raw = np.load(d / "train.npy", allow_pickle=True)
    assert raw.dtype == object and len(raw) == 24
    train, val, stats = build_datasets(cfg(d, tmp_path))
    assert len(train) == 24 and len(val) == 3 and stats["train"]["fill_rate"] > 0.8
    docs_per_pack = []
    for i, p in enumerate(raw):
        pack = train[i]
        n = len(p["input_ids"])
        assert pack["num_tokens"] == n and np.array_equal(pack["input_ids"][:n], p["input_ids"])
        bounds = list(p["seq_start_id"]) + [n]
        assert pack["cu_seqlens"].tolist()[:len(bounds)] == bounds          # documents from seq_start_id
        lm = np.asarray(p["loss_mask"])
        for a, b in zip(bounds[:-1], bounds[1:]):
            assert np.array_equal(pack["labels"][a:b - 1], p["input_ids"][a + 1:b])
            assert np.array_equal(pack["loss_mask"][a:b - 1], lm[a + 1:b]) and pack["loss_mask"][b - 1] == 0
            assert pack["position_ids"][a] == 0 and p["input_ids"][a] == 1 and p["input_ids"][b - 1] == 2
        docs_per_pack.append(len(bounds) - 1)
    assert meta["max_samples_per_bin"] >= max(docs_per_pack)  # max over train + validation
    assert 1 < np.mean(docs_per_pack) < 8                    # realistic: a few GovReport-like documents a pack
    batch = collate([train[0], train[1]])
    assert batch["tokens"].shape == (2, 1024) and batch["num_loss_tokens"] > 0


def test_deterministic_and_too_short_seq_length(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_synthetic(str(a), 8, 512, 100, seed=3)
    write_synthetic(str(b), 8, 512, 100, seed=3)
    assert (a / "train.npy").read_bytes() == (b / "train.npy").read_bytes()
    with pytest.raises(DataError, match=r"^trainer.data.seq_length: .*train.npy:pack \d+ has \d+ tokens > "):
        build_datasets(cfg(a, tmp_path, seq=256, validation=False))
    with pytest.raises(DataError, match=r"^trainer.data.train.path: no such MLPerf packed file"):
        build_datasets(cfg(tmp_path / "missing", tmp_path))


def test_token_ids_beyond_the_model_vocab_are_refused(tmp_path):
    """Data written for a larger vocabulary (another model's tokenizer) must not train silently: megatron's
    vocab-parallel embedding maps unknown ids to zero vectors."""
    d = tmp_path / "mlperf"
    write_synthetic(str(d), n_packs=8, seq_length=512, vocab_size=1000, seed=0)
    c = cfg(d, tmp_path, seq=512)
    c["trainer"]["model"] = {"vocab_size": 1000}
    train, _, _ = build_datasets(c)
    top = int(train.tokens.max())
    assert 900 < top < 1000
    c["trainer"]["model"] = {"vocab_size": top}
    with pytest.raises(DataError, match=rf"trainer.model.vocab_size: the train data has token id {top} >= vocab_size {top}"):
        build_datasets(c)


def test_padding_id_beyond_the_model_vocab_is_refused(tmp_path):
    from trainer.data import PackedDataset, check_vocab

    ds = PackedDataset(np.array([3, 4, 5]), np.ones(3), np.array([0, 3]), np.array([0]), np.array([0, 1]), 8,
                       pad_id=32000)  # e.g. a Llama-2 tokenizer with an added <pad>
    check_vocab({"train": ds}, 32001)
    with pytest.raises(DataError, match="the train data has padding id 32000 >= vocab_size 32000"):
        check_vocab({"train": ds, "validation": None}, 32000)
