"""collate / iterate_batches / global_batch_indices: THD cu_seqlens, determinism, resume, DP slicing."""
import os

import numpy as np
import pytest
import torch

from trainer.data import (build_datasets, collate, dp_slice, global_batch_indices, iterate_batches,
                          rank_micro_batches)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QS = os.path.join(ROOT, "recipes", "data", "quickstart")


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    cfg = {"experiment": {"workspace": str(ws), "seed": 3}, "trainer": {
        "tokenizer": {"path": os.path.join(QS, "tokenizer")},
        "data": {"format": "alpaca", "train": {"path": os.path.join(QS, "train.jsonl"), "limit": 400},
                 "validation": {"path": None}, "seq_length": 96}}}
    return build_datasets(cfg)[0]


def test_collate_shapes_and_flattened_cu_seqlens(train):
    packs = [train[0], train[1], train[2]]
    b = collate(packs)
    S = 96
    assert b["tokens"].shape == b["labels"].shape == b["position_ids"].shape == b["loss_mask"].shape == (3, S)
    assert b["tokens"].dtype == torch.int64 and b["loss_mask"].dtype == torch.float32
    assert b["cu_seqlens"].dtype == torch.int32 and b["cu_seqlens"].dim() == 1
    expect = [0] + [int(c) + i * S for i, p in enumerate(packs) for c in p["cu_seqlens"][1:]]
    assert b["cu_seqlens"].tolist() == expect and expect[-1] == 3 * S
    assert b["max_seqlen"] == max(int(x) for p in packs for x in np.diff(p["cu_seqlens"]))
    assert b["num_loss_tokens"] == int(sum(p["loss_mask"].sum() for p in packs)) > 0
    flat_pos = b["position_ids"].reshape(-1)
    assert (flat_pos[b["cu_seqlens"][:-1].long()] == 0).all()   # every segment restarts its positions
    assert torch.equal(b["tokens"][1], torch.from_numpy(packs[1]["input_ids"]))


def test_global_batch_indices_epochs_and_determinism():
    n, g = 10, 4
    stream = np.concatenate([global_batch_indices(n, g, t, seed=5) for t in range(5)])
    assert sorted(stream[:10].tolist()) == list(range(10)) and sorted(stream[10:20].tolist()) == list(range(10))
    assert not np.array_equal(stream[:10], stream[10:20])            # reshuffled per epoch
    assert np.array_equal(global_batch_indices(n, g, 3, seed=5), stream[12:16])  # restart-safe
    assert not np.array_equal(global_batch_indices(n, g, 0, seed=6), stream[:4])
    assert global_batch_indices(n, g, 1, seed=5, shuffle=False).tolist() == [4, 5, 6, 7]


def test_dp_slices_partition_the_global_batch(train):
    idx = global_batch_indices(len(train), 8, 2, seed=1)
    parts = [dp_slice(idx, r, 4) for r in range(4)]
    assert np.array_equal(np.concatenate(parts), idx)
    with pytest.raises(ValueError):
        dp_slice(idx, 0, 3)
    mbs = rank_micro_batches(train, 8, 1, 2, seed=1, dp_rank=1, dp_size=2)
    assert len(mbs) == 4
    for mb, i in zip(mbs, idx[4:8]):
        assert torch.equal(mb["tokens"][0], torch.from_numpy(train[int(i)]["input_ids"]))


def test_iterate_batches_resumes_exactly(train):
    it = iterate_batches(train, 2, seed=11)
    first = [next(it) for _ in range(len(train))]               # crosses an epoch boundary
    resumed = iterate_batches(train, 2, seed=11, start_index=2 * 7)
    for want in first[7:12]:
        got = next(resumed)
        assert torch.equal(got["tokens"], want["tokens"]) and torch.equal(got["cu_seqlens"], want["cu_seqlens"])
    other = next(iterate_batches(train, 2, seed=12))
    assert not torch.equal(other["tokens"], first[0]["tokens"])


def test_iterate_batches_finite_epoch_covers_every_pack_once(train):
    seen = [b["tokens"] for b in iterate_batches(train, 3, seed=0, shuffle=False, epochs=1)]
    stacked = torch.cat(seen)
    assert stacked.shape[0] == len(train)
    assert torch.equal(stacked[5], torch.from_numpy(train[5]["input_ids"]))


def test_collate_closes_each_packs_tail():
    """A pack whose cu_seqlens stop before its end (padding not listed as a segment) must not let the next
    row's first document attend to that tail: collate closes every row at its own length."""
    import numpy as np
    import pytest

    from trainer.data import collate

    def pack(cu):
        n = 8
        return {"input_ids": np.arange(n), "labels": np.arange(n), "loss_mask": np.ones(n), "position_ids": np.arange(n),
                "cu_seqlens": np.asarray(cu), "num_tokens": cu[-1]}

    batch = collate([pack([0, 3, 5]), pack([0, 4, 8])])
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 8, 12, 16] and batch["max_seqlen"] == 4
    with pytest.raises(ValueError, match="cu_seqlens ends at 9, past its 8 tokens"):
        collate([pack([0, 9])])
