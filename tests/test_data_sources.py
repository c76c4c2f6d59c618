"""Sources: JSONL, JSON array, Parquet, HF save_to_disk directories, split dirs, limits, missing paths."""
import json
import os

import datasets
import pytest

from trainer.data import DataError, build_datasets
from trainer.data.options import SourceSpec
from trainer.data.sources import iter_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = os.path.join(ROOT, "recipes", "data", "quickstart", "tokenizer")
RECORDS = [{"context": f"ctx {i}", "question": f"q {i}?", "answers": {"text": [f"ans {i}"], "answer_start": [0]}}
           for i in range(12)]


def cfg(ws, train, validation=None, fmt="squad"):
    return {"experiment": {"workspace": str(ws), "seed": 1}, "trainer": {"tokenizer": {"path": TOK}, "data": {
        "format": fmt, "train": train, "validation": validation or {"path": None}, "seq_length": 64}}}


def spec(path, split="train", limit=None):
    return SourceSpec(path=str(path), hf_name=None, split=split, limit=limit)


def test_json_parquet_and_split_dir(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(RECORDS))
    datasets.Dataset.from_list(RECORDS).to_parquet(str(tmp_path / "train.parquet"))
    got_json = list(iter_records(spec(tmp_path / "a.json"), "k"))
    got_pq = list(iter_records(spec(tmp_path), "k"))                    # dir -> <split>.parquet
    assert [r for _, r, _ in got_json] == RECORDS and [r["context"] for _, r, _ in got_pq] == [
        r["context"] for r in RECORDS]
    assert got_json[3][0].endswith("a.json:record 4") and got_pq[0][0].endswith("train.parquet:row 1")
    assert len(list(iter_records(spec(tmp_path / "a.json", limit=5), "k"))) == 5


def test_hf_save_to_disk_dataset_dict(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS[:10]),
                               "validation": datasets.Dataset.from_list(RECORDS[10:])})
    dd.save_to_disk(str(tmp_path / "hf"))
    train, val, stats = build_datasets(cfg(tmp_path, {"path": str(tmp_path / "hf"), "split": "train"},
                                           {"path": str(tmp_path / "hf"), "split": "validation"}))
    assert stats["train"]["samples"] == 10 and stats["validation"]["samples"] == 2
    with pytest.raises(DataError, match=r"trainer.data.train.split: split 'test' not in"):
        build_datasets(cfg(tmp_path, {"path": str(tmp_path / "hf"), "split": "test"}))


def test_missing_and_unsupported_paths_name_the_key(tmp_path):
    with pytest.raises(DataError, match=r"^trainer.data.train.path: no such file or directory"):
        build_datasets(cfg(tmp_path, {"path": str(tmp_path / "nope.jsonl")}))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"^trainer.data.train.path: unsupported file type"):
        build_datasets(cfg(tmp_path, {"path": str(tmp_path / "x.csv")}))
    with pytest.raises(DataError, match=r"^trainer.tokenizer.path: cannot load tokenizer"):
        c = cfg(tmp_path, {"path": str(tmp_path / "x.csv")})
        c["trainer"]["tokenizer"]["path"] = str(tmp_path / "no-tokenizer")
        (tmp_path / "t.jsonl").write_text(json.dumps(RECORDS[0]) + "\n")
        c["trainer"]["data"]["train"]["path"] = str(tmp_path / "t.jsonl")
        build_datasets(c)


def test_all_bad_records_skipped_is_an_error(tmp_path):
    (tmp_path / "t.jsonl").write_text(json.dumps({"context": "c"}) + "\n")
    c = cfg(tmp_path, {"path": str(tmp_path / "t.jsonl")})
    c["trainer"]["data"]["bad_records"] = "skip"
    with pytest.raises(DataError, match=r"no usable records \(1 read, 1 bad\)"):
        build_datasets(c)
