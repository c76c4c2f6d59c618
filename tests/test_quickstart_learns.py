"""The shipped quickstart learns: the real `python -m trainer` on recipes/quickstart.yaml as shipped (pretrained
base from recipes/data/quickstart/base, LoRA, the bundled data), shortened to 120 iterations."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.test_train_support import ROOT, train_curves

BASE = ROOT / "recipes" / "data" / "quickstart" / "base"



def _quickstart(tmp_path, *sets: str):
    from primus_slurm.recipe import load_recipe

    env = dict(os.environ, PRIMUS_WORKSPACE=str(tmp_path / "ws"))
    data = load_recipe(ROOT / "recipes" / "quickstart.yaml", overrides=list(sets), env=env).resolved
    data["trainer"]["data"]["cache_dir"] = str(tmp_path / "cache")
    path = tmp_path / "recipe.resolved.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


def test_shipped_base_matches_the_preset():
    cfg = json.loads((BASE / "config.json").read_text())
    preset = yaml.safe_load((ROOT / "recipes" / "models" / "tiny_llama.yaml").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"], cfg["tie_word_embeddings"]) == (
        preset["num_layers"], preset["hidden_size"], preset["ffn_hidden_size"], preset["num_attention_heads"],
        preset["num_query_groups"], preset["vocab_size"], not preset["untie_embeddings"])
    assert (BASE / "model.safetensors").stat().st_size <= 2.5e6


def test_wheel_declares_the_base():  # an installed quickstart.yaml points at data/quickstart/base
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "primus_slurm.recipes.data.quickstart.base" in tool["packages"]
    assert tool["package-data"]["primus_slurm.recipes.data.quickstart.base"] == ["*"]


@pytest.mark.slow  # ~20 s alone on two cores (one trainer thread), much more on a busy machine
def test_quickstart_loss_and_eval_loss_fall(tmp_path):
    cfg, data = _quickstart(tmp_path, "trainer.schedule.train_iters=120", "trainer.schedule.eval_interval=20",
                            "trainer.logging.log_interval=10", "trainer.checkpoint.save_interval=null",
                            "trainer.checkpoint.export_peft=false")
    assert data["trainer"]["checkpoint"]["pretrained"] == str(BASE.resolve())
    curve, evals, text = train_curves(cfg, tmp_path / "run")
    assert sorted(curve) == list(range(10, 121, 10)) and sorted(evals) == list(range(20, 121, 20)), text[-2000:]
    # The base never saw the Alpaca template: the first interval starts far above the end of the run.
    assert curve[10] > 3.0, curve
    assert curve[120] < curve[10] / 3, curve
    assert max(curve[110], curve[120]) < min(curve[10], curve[20]) / 2, curve
    assert evals[120] < 0.7 * evals[20], evals
    assert evals[120] < 1.6, evals
