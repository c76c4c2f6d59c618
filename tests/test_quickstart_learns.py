"""The shipped quickstart learns: recipes/quickstart.yaml as shipped (pretrained base from
recipes/data/quickstart/base, LoRA, the bundled data, 500 iterations), submitted with the local executor as
`make quickstart` runs it; the run is conftest.quickstart_run, trained once per session for this test and
test_post_commands (it trained a second, 120-iteration run of its own)."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.test_train_support import EVAL_RE, ROOT, log_text, losses

BASE = ROOT / "recipes" / "data" / "quickstart" / "base"
ITERS, EVAL_EVERY, LOG_EVERY = 500, 25, 10  # recipes/quickstart.yaml as shipped


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


@pytest.mark.slow  # reads conftest's session quickstart run (shared with test_post_commands; ~160 s if run alone)
def test_quickstart_loss_and_eval_loss_fall(quickstart_run):
    _, _, run_dir = quickstart_run
    data = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    assert data["trainer"]["checkpoint"]["pretrained"] == str(BASE.resolve())
    assert (data["trainer"]["schedule"]["train_iters"], data["trainer"]["schedule"]["eval_interval"],
            data["trainer"]["logging"]["log_interval"]) == (ITERS, EVAL_EVERY, LOG_EVERY)  # the shipped schedule
    text = log_text(run_dir)
    curve = {it: float(v) for it, v in losses(text).items()}
    evals = {int(it): float(v) for it, v in EVAL_RE.findall(text)}
    assert sorted(curve) == list(range(LOG_EVERY, ITERS + 1, LOG_EVERY)), text[-2000:]
    assert sorted(evals) == list(range(EVAL_EVERY, ITERS + 1, EVAL_EVERY)), text[-2000:]
    # The base never saw the Alpaca template: the first interval starts far above the end of the run.
    assert curve[10] > 3.0, curve
    assert curve[120] < curve[10] / 3, curve  # already learnt by iteration 120
    assert max(curve[110], curve[120]) < min(curve[10], curve[20]) / 2, curve
    assert max(curve[490], curve[500]) < min(curve[10], curve[20]) / 3, curve
    assert evals[ITERS] < 0.7 * evals[EVAL_EVERY] and evals[125] < 0.7 * evals[EVAL_EVERY], evals
    assert evals[ITERS] < 1.6, evals
