"""A MoE model fine-tunes from its own HF checkpoint through the real `python -m trainer`: the quickstart recipe
with `trainer.model.preset: checkpoint` over a tiny Qwen3-MoE and a tiny DeepSeek-V2 (MLA, dense first layer,
shared experts) saved in the Hub layout with the quickstart tokenizer's vocabulary. The import's log line names
the family and the experts, and the LoRA loss falls on the bundled data."""
from __future__ import annotations

import os

import pytest
import yaml

from tests.hf_tiny import save_tiny
from tests.test_train_support import ROOT, beside, train_curves

CASES = {"qwen3_moe": ({}, "linear_qkv,linear_proj,linear_fc1,linear_fc2", "| 4 experts top-2 |"),
         "deepseek_v2": ({"q_lora_rank": 32}, "linear_kv_up_proj,linear_proj,linear_fc1,linear_fc2",
                         "| MLA q_lora 32 | 4 experts top-2 + shared 64 |")}


def _quickstart(tmp_path, *sets: str):
    """The shipped quickstart resolved with `sets`, its dataset cache under tmp_path: (recipe path, resolved)."""
    from primus_slurm.config.recipe import load_recipe

    env = dict(os.environ, PRIMUS_WORKSPACE=str(tmp_path / "ws"))
    data = load_recipe(ROOT / "recipes" / "quickstart.yaml", overrides=list(sets), env=env).resolved
    data["trainer"]["data"]["cache_dir"] = str(tmp_path / "cache")
    path = tmp_path / "recipe.resolved.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


@pytest.fixture(scope="module")
def fine_tunes(request, tmp_path_factory) -> dict:
    """The selected families' runs, started at once when the first of their tests comes (one trainer thread each:
    test_train_support.beside): {family: (resolved recipe, future of train_curves' result)}."""
    families = {item.callspec.params["family"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    started = {}
    for family in sorted(families):
        overrides, targets, _ = CASES[family]
        tmp = tmp_path_factory.mktemp(family)
        path = save_tiny(family, tmp / "hf", seed=11, vocab_size=512, hidden_size=128, max_position_embeddings=1024,
                         **overrides)
        cfg, data = _quickstart(tmp, "trainer.model.preset=checkpoint", f"trainer.checkpoint.pretrained={path}",
                                f"trainer.lora.target_modules=[{targets}]", "trainer.schedule.train_iters=40",
                                "trainer.schedule.eval_interval=null", "trainer.logging.log_interval=10",
                                "trainer.checkpoint.save_interval=null", "trainer.checkpoint.export_peft=false")
        started[family] = (data, beside(train_curves, cfg, tmp / "run"))
    return started


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CASES))
def test_moe_fine_tunes_from_its_checkpoint(fine_tunes, family):
    _, _, shown = CASES[family]
    data, started = fine_tunes[family]
    assert data["trainer"]["model"]["num_moe_experts"] == 4
    curve, _, text = started.result()
    line = next(x for x in text.splitlines() if "pretrained | path" in x)
    assert f"| {family} | 2 layers | hidden 128 " in line and shown in line, line
    assert sorted(curve) == [10, 20, 30, 40] and curve[40] < curve[10] - 0.3, curve
