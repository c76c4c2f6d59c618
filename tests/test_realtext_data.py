"""The bundled real-text set (recipes/data/realtext, scripts/make_realtext_data.py) behind
recipes/compare_realtext.yaml: it loads through the real data pipeline with the resolved recipe, every real token
is supervised, packs decode to English prose, and the tokenizer matches the model preset (the pretrained base in
data/realtext/base: tests/test_realtext_base.py)."""
from __future__ import annotations

import json
import os
import re

import pytest

from tests.test_train_support import ROOT

RECIPE = ROOT / "recipes" / "compare_realtext.yaml"
DATA = ROOT / "recipes" / "data" / "realtext"
COMMON = {"the", "of", "a", "is", "to", "and", "in", "be", "if", "for"}


def _resolved(tmp_path) -> dict:
    from primus_slurm.config.recipe import load_recipe

    env = dict(os.environ, PRIMUS_WORKSPACE=str(tmp_path / "ws"))
    data = load_recipe(RECIPE, env=env).resolved
    data["trainer"]["data"]["cache_dir"] = str(tmp_path / "cache")
    return data


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from trainer.config import Config
    from trainer.data import build_datasets

    data = _resolved(tmp_path_factory.mktemp("realtext"))
    return data, build_datasets(Config.from_dict(data))


def test_files_are_small_text_records_with_disjoint_splits():
    sizes = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file() and "base" not in p.parts)
    assert sizes <= 600_000, sizes
    split = {s: [json.loads(line) for line in (DATA / f"{s}.jsonl").read_text().splitlines()]
             for s in ("train", "validation")}
    assert len(split["train"]) >= 100 and len(split["validation"]) >= 20
    for records in split.values():
        assert all(set(r) == {"text"} and len(r["text"]) >= 80 for r in records)
    train_paras = {p for r in split["train"] for p in r["text"].split("\n\n")}
    assert not train_paras & {p for r in split["validation"] for p in r["text"].split("\n\n")}
    assert re.search(r"CPython 3\.\d+\.\d+", (DATA / "README.txt").read_text())


def test_recipe_resolves_to_text_lora_on_the_realtext_base(built):
    data, _ = built
    t = data["trainer"]
    assert t["checkpoint"]["pretrained"] == str((DATA / "base").resolve())  # tests/test_realtext_base.py
    assert t["data"]["format"] == "text" and t["data"]["packing"]
    assert t["data"]["seq_length"] == 256 and t["lora"]["dim"] == 32
    assert set(t["lora"]["target_modules"]) == {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}
    assert (t["schedule"]["train_iters"], t["schedule"]["eval_interval"]) == (200, 25)

    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(t["tokenizer"]["path"]))
    assert 1024 <= n <= 2048 and t["model"]["vocab_size"] == -(-n // 64) * 64


def test_pipeline_supervises_every_real_token(built):
    _, (train, val, stats) = built
    assert val is not None and len(train) >= 200 and len(val) >= 40
    for split in ("train", "validation"):
        s = stats[split]
        assert s["supervised_fraction"] > 0.97, s  # only each document's last token has no target
        assert s["dropped_no_target"] == 0 and s["skipped_bad_records"] == 0 and s["fill_rate"] > 0.8, s
        assert s["truncated"] <= 0.1 * s["records"], s  # documents (nearly all) fit one pack


def test_packs_decode_to_english(built):
    data, (train, val, _) = built
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(data["trainer"]["tokenizer"]["path"])
    for pack in (train[0], val[len(val) // 2]):
        ids = pack["input_ids"][: int(pack["num_tokens"])].tolist()
        assert max(ids) < data["trainer"]["model"]["vocab_size"]
        words = re.findall(r"[a-z]+", tok.decode(ids, skip_special_tokens=True).lower())
        assert len(words) > 100
        assert sum(w in COMMON for w in words) > 0.12 * len(words), words[:60]  # prose, not code or noise
