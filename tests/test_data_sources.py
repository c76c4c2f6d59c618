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


def _unreadable_lines() -> list[bytes]:
    """JSONL lines the reader turned into tracebacks (audit, 2026-12-07): a Latin-1 byte, nesting deeper than the
    parser's recursion, an integer of more digits than int() converts, and a lone surrogate escape."""
    deep = json.dumps(RECORDS[0])[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return [b'{"context": "caf\xe9", "question": "q?", "answer": "a"}', deep.encode(),
            b'{"context": "c", "question": "q?", "answer": ' + b"1" * 5000 + b"}",
            json.dumps({**RECORDS[0], "context": "\ud800 lone"}).encode()]


def test_unreadable_records_are_bad_records(tmp_path):
    """Each is one bad record naming file:line, which `bad_records: skip` skips and `error` stops at."""
    path = tmp_path / "t.jsonl"
    good = json.dumps(RECORDS[1]).encode()
    path.write_bytes(b"\n".join([good, *_unreadable_lines(), good]) + b"\n")
    problems = [err for _, _, err in iter_records(spec(path), "k")]
    assert problems[0] is None and problems[1].startswith("not UTF-8 (byte 0xe9") and problems[5] is None
    assert problems[2] == "invalid JSON (nested too deeply to read)" and problems[3].startswith("invalid JSON (")
    c = cfg(tmp_path, {"path": str(path)})
    c["trainer"]["data"]["bad_records"] = "skip"
    _, _, stats = build_datasets(c)
    assert stats["train"]["samples"] == 2 and stats["train"]["skipped_bad_records"] == 4
    c["trainer"]["data"].update(bad_records="error", cache_dir=str(tmp_path / "other-cache"))
    with pytest.raises(DataError, match=rf"^{path}:2: not UTF-8 \(byte 0xe9 at byte 17 of the line\)$"):
        build_datasets(c)
    path.write_bytes(b"\n".join([good, _unreadable_lines()[3]]) + b"\n")
    with pytest.raises(DataError, match=rf"^{path}:2: field 'context' is not UTF-8 text \(a lone surrogate \\ud800"):
        build_datasets(c)


@pytest.mark.parametrize("name,body,says", [
    ("a.json", b'[{"context": "caf\xe9"}]', r"a.json: not UTF-8 \(byte 0xe9 at byte 18\)$"),
    ("a.json", b"[" * 100_000 + b"]" * 100_000, r"a.json: invalid JSON \(RecursionError: "),
    ("train.parquet", b"PAR1 not parquet", r"train.parquet: not a Parquet file that can be read \(ArrowInvalid: "),
])
def test_an_unreadable_file_is_one_error_naming_it(tmp_path, name, body, says):
    (tmp_path / name).write_bytes(body)
    c = cfg(tmp_path, {"path": str(tmp_path / name)})
    c["trainer"]["data"]["bad_records"] = "skip"  # (a whole file is no record to skip)
    with pytest.raises(DataError, match=rf"^{tmp_path}/{says}"):
        build_datasets(c)


def test_an_unreadable_save_to_disk_directory_is_one_error_naming_the_key(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_info.json").write_text("{not json")
    with pytest.raises(DataError, match=rf"^trainer.data.train.path: cannot load the save_to_disk dataset "
                                        rf"{tmp_path}/hf: "):
        build_datasets(cfg(tmp_path, {"path": str(tmp_path / "hf")}))
