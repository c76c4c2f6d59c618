"""trainer.model.hf.read.SafetensorsDir, the one safetensors reader of the HF import, the merged export and the
adapter: which files it takes, the order it lists, meta() from the header, one file mapped at a time."""
import gc
import json

import pytest
import torch
from safetensors.torch import save_file

from trainer.model.hf.read import SafetensorsDir


def _sharded(d, stray=False):
    d.mkdir()
    save_file({"z.weight": torch.arange(6.0).reshape(2, 3), "a.weight": torch.zeros(5)},
              str(d / "model-00001.safetensors"))
    save_file({"m.weight": torch.ones(4, dtype=torch.bfloat16)}, str(d / "model-00002.safetensors"))
    where = {"m.weight": "model-00002.safetensors", "z.weight": "model-00001.safetensors",
             "a.weight": "model-00001.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": where}))
    if stray:  # e.g. a Mistral repo's consolidated.safetensors next to the HF shards
        save_file({"stray": torch.ones(1)}, str(d / "consolidated.safetensors"))
    return d


def _mapped(d) -> list[str]:
    return sorted({line.split()[-1].rsplit("/", 1)[-1] for line in open("/proc/self/maps") if str(d) in line})


def test_index_names_the_files_listed_file_then_name_and_meta_reads_nothing(tmp_path):
    hf = SafetensorsDir(_sharded(tmp_path / "hf", stray=True))
    assert list(hf) == ["a.weight", "z.weight", "m.weight"] and "stray" not in hf and len(hf) == 3
    assert hf.meta("m.weight") == (torch.bfloat16, (4,)) and hf.meta("z.weight") == (torch.float32, (2, 3))
    assert hf.reads == 0
    assert torch.equal(hf["z.weight"], torch.arange(6.0).reshape(2, 3))
    assert (hf.reads, hf.read_bytes, hf.largest) == (1, 24, 24)


def test_model_safetensors_is_preferred_without_an_index(tmp_path):
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    save_file({"w": torch.zeros(2), "other": torch.ones(1)}, str(tmp_path / "consolidated.safetensors"))
    hf = SafetensorsDir(tmp_path)
    assert list(hf) == ["w"] and torch.equal(hf["w"], torch.ones(2))


def test_every_file_without_an_index_or_model_safetensors(tmp_path):
    save_file({"b": torch.ones(1), "a": torch.ones(1)}, str(tmp_path / "x.safetensors"))
    save_file({"c": torch.ones(1)}, str(tmp_path / "adapter_model.safetensors"))
    assert list(SafetensorsDir(tmp_path)) == ["c", "a", "b"]


def test_missing_shard_and_empty_directory_are_refused(tmp_path):
    d = _sharded(tmp_path / "hf")
    (d / "model-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="names 1 missing shard.*model-00002"):
        SafetensorsDir(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(FileNotFoundError, match="names no tensors"):
        SafetensorsDir(d)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        SafetensorsDir(tmp_path)


def test_one_file_is_mapped_at_a_time(tmp_path):
    """A pass over a 470 GB checkpoint never maps all of its shards: once no tensor read from a file is alive,
    reading from the next file unmaps it."""
    d = _sharded(tmp_path / "hf")
    hf = SafetensorsDir(d)
    first = hf["a.weight"]
    assert _mapped(d) == ["model-00001.safetensors"]
    second = hf["m.weight"]
    assert _mapped(d) == ["model-00001.safetensors", "model-00002.safetensors"]  # `first` still refers to it
    del first
    gc.collect()
    assert _mapped(d) == ["model-00002.safetensors"]
    del second
    gc.collect()
    assert hf.meta("z.weight") == (torch.float32, (2, 3)) and _mapped(d) == ["model-00001.safetensors"]
