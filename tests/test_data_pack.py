"""Packing, pack invariants (documents never split, labels never cross documents, cu_seqlens), overlong
handling, the unpacked path and the on-disk cache — on the shipped quickstart data and tokenizer."""
import json
import os
import time

import numpy as np
import pytest

from trainer.data import IGNORE_INDEX, build_datasets
from trainer.data.build import apply_overlong
from trainer.data.packing import pack_lengths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QS = os.path.join(ROOT, "recipes", "data", "quickstart")


def cfg(tmp_path, **data):
    base = {"format": "alpaca", "train": {"path": os.path.join(QS, "train.jsonl"), "limit": 600},
            "validation": {"path": os.path.join(QS, "validation.jsonl")}, "seq_length": 128, "packing": True,
            "pad_to_multiple_of": 1, "overlong": "truncate", "bad_records": "error", "cache_dir": None}
    base.update(data)
    return {"experiment": {"workspace": str(tmp_path), "seed": 7},
            "trainer": {"tokenizer": {"path": os.path.join(QS, "tokenizer")}, "data": base,
                        "schedule": {"micro_batch_size": 2}}}


@pytest.mark.parametrize("seed,capacity", [(0, 64), (1, 100), (2, 8192)])
def test_pack_lengths_places_every_document_once_within_capacity(seed, capacity):
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(capacity / 8), 1.0, 3000).astype(np.int64), 1, capacity)
    order, offsets = pack_lengths(lengths, capacity)
    assert np.array_equal(np.sort(order), np.arange(len(lengths)))
    per_bin = np.add.reduceat(lengths[order], offsets[:-1])
    assert per_bin.max() <= capacity and (np.diff(offsets) > 0).all()
    lower = -(-lengths.sum() // capacity)
    assert len(per_bin) <= 1.02 * lower + 1           # close to optimal on this easy distribution
    again = pack_lengths(lengths, capacity)
    assert np.array_equal(again[0], order) and np.array_equal(again[1], offsets)


def test_pack_lengths_rejects_overlong():
    with pytest.raises(ValueError):
        pack_lengths(np.array([5, 11]), 10)


def check_pack(pack, S):
    ids, labels, mask, pos, cu = (pack[k] for k in ("input_ids", "labels", "loss_mask", "position_ids",
                                                    "cu_seqlens"))
    assert ids.shape == labels.shape == mask.shape == pos.shape == (S,)
    assert ids.dtype == labels.dtype == pos.dtype == np.int64 and mask.dtype == np.float32
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == S and (np.diff(cu) > 0).all()
    n = pack["num_tokens"]
    docs = [(a, b) for a, b in zip(cu[:-1], cu[1:]) if b <= n]
    assert docs[-1][1] == n                                   # documents, then maybe one padding segment
    for a, b in docs:
        assert ids[a] == 0                                    # each document starts with its BOS: never split
        assert (pos[a:b] == np.arange(b - a)).all()
        assert (labels[a:b - 1] == ids[a + 1:b]).all()        # next token within the document
        assert labels[b - 1] == IGNORE_INDEX and mask[b - 1] == 0  # never across the boundary
        assert ids[b - 1] == 1                                # ... and ends with its EOS
    assert (labels[n:] == IGNORE_INDEX).all() and (mask[n:] == 0).all()
    assert ((labels == IGNORE_INDEX) <= (mask == 0)).all()
    return len(docs)


def test_packed_quickstart_invariants(tmp_path):
    train, val, stats = build_datasets(cfg(tmp_path))
    S = 128
    n_docs = sum(check_pack(train[i], S) for i in range(len(train)))
    assert n_docs == stats["train"]["samples"] == 600 and len(train) < 600 / 2
    assert stats["train"]["fill_rate"] > 0.9 and 0.1 < stats["train"]["supervised_fraction"] < 0.4
    assert sum(float(train[i]["loss_mask"].sum()) for i in range(len(train))) == stats["train"]["supervised_tokens"]
    assert val is not None and stats["validation"]["samples"] == 200


def test_unpacked_pads_each_document_to_multiple(tmp_path):
    train, _, stats = build_datasets(cfg(tmp_path, packing=False, seq_length=100, pad_to_multiple_of=32))
    assert len(train) == 600 and stats["train"]["sample_length"] == 128
    for i in range(0, 600, 37):
        p = train[i]
        assert check_pack(p, 128) == 1 and len(p["cu_seqlens"]) == 3


def test_overlong_truncate_and_drop_counts(tmp_path):
    tokens = np.arange(30, dtype=np.int32)
    sup = np.array([0] * 5 + [1] * 5 + [0] * 3 + [1] * 2 + [0] * 12 + [1] * 3, dtype=np.uint8)
    offsets = np.array([0, 10, 15, 30])          # lengths 10, 5, 15; doc 2's targets are all past position 8
    t, s, o, c = apply_overlong(tokens, sup, offsets, 8, "truncate")
    assert c == {"truncated": 1, "dropped_overlong": 0, "dropped_no_target": 1}
    assert o.tolist() == [0, 8, 13] and t.tolist() == list(range(8)) + list(range(10, 15))
    t, s, o, c = apply_overlong(tokens, sup, offsets, 8, "drop")
    assert c == {"truncated": 0, "dropped_overlong": 2, "dropped_no_target": 0} and t.tolist() == list(range(10, 15))


def test_truncation_counted_end_to_end(tmp_path):
    _, _, stats = build_datasets(cfg(tmp_path, seq_length=36))
    s = stats["train"]
    assert s["truncated"] > 0 and s["samples"] + s["dropped_no_target"] == 600 and s["max_doc_tokens"] == 36
    _, _, stats = build_datasets(cfg(tmp_path, seq_length=36, overlong="drop"))
    s = stats["train"]
    assert s["dropped_overlong"] > 0 and s["truncated"] == 0 and s["samples"] + s["dropped_overlong"] == 600


def test_cache_hit_identical_and_changed_option_misses(tmp_path):
    c = cfg(tmp_path)
    a, _, sa = build_datasets(c)
    b, _, sb = build_datasets(c)
    assert sa["train"]["cache"] == "miss" and sb["train"]["cache"] == "hit"
    assert sa["train"]["cache_path"] == sb["train"]["cache_path"]
    assert os.path.dirname(sa["train"]["cache_path"]) == os.path.join(str(tmp_path), ".cache", "data")
    for k in a.arrays():
        assert np.array_equal(a.arrays()[k], b.arrays()[k])
    for i in (0, len(a) - 1):
        for k in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
            assert np.array_equal(a[i][k], b[i][k])
    for change in ({"seq_length": 96}, {"packing": False}, {"overlong": "drop"}, {"train": {
            "path": os.path.join(QS, "train.jsonl"), "limit": 500}}):
        _, _, sc = build_datasets(cfg(tmp_path, **change))
        assert sc["train"]["cache"] == "miss" and sc["train"]["cache_path"] != sa["train"]["cache_path"]


def test_cache_misses_when_source_changes(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps({"instruction": f"i{i}", "output": f"o{i}"}) + "\n" for i in range(20)))
    c = cfg(tmp_path, train={"path": str(src)}, validation={"path": None})
    _, val, s1 = build_datasets(c)
    assert val is None and s1["validation"] is None
    with open(src, "a") as f:
        f.write(json.dumps({"instruction": "new", "output": "one"}) + "\n")
    os.utime(src, ns=(time.time_ns(), time.time_ns() + 10**9))
    _, _, s2 = build_datasets(c)
    assert s2["train"]["cache"] == "miss" and s2["train"]["samples"] == 21
