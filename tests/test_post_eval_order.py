"""trainer.post.evaluate.run resolves the checkpoint before it builds the validation data: a missing iteration fails
at once with the iteration named, not after minutes of tokenizing. (The CLI's own check, primus_slurm/post_training,
refuses it earlier still, so tests/test_post_commands.py never reaches this order; audit, 2026-12-07.)"""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import trainer.post.evaluate as ev
from trainer.post.runstate import PostError


class _Built(Exception):
    pass


def _recording(monkeypatch) -> list:
    built = []

    def packs(cfg):
        built.append(cfg)
        raise _Built

    monkeypatch.setattr(ev, "validation_packs", packs)
    return built


def test_a_missing_checkpoint_fails_before_the_validation_data_is_built(tmp_path, monkeypatch):
    built = _recording(monkeypatch)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(PostError, match="iter_0000007"):
        ev.run(SimpleNamespace(), str(tmp_path), 7, None)
    assert built == []


def test_a_complete_checkpoint_goes_on_to_build_the_data(tmp_path, monkeypatch):
    built = _recording(monkeypatch)
    done = tmp_path / "checkpoints" / "iter_0000007"
    done.mkdir(parents=True)
    (done / "metadata.json").write_text("{}")
    cfg = SimpleNamespace()
    with pytest.raises(_Built):
        ev.run(cfg, str(tmp_path), 7, None)
    assert built == [cfg]


def test_eval_data_is_read_with_the_runs_validation_split(tmp_path):
    """The launcher resolved `--data DIR` with the run's trainer.data.validation.split (DIR/test.jsonl here) and the
    job with "validation" (DIR/validation.jsonl): another file than the one checked (audit, 2026-12-07)."""
    from primus_contract import data_paths
    from primus_slurm.config.recipe import load_recipe
    from trainer.data.options import DataOptions
    from trainer.data.sources import resolve
    from trainer.post.runstate import run_config

    root = Path(__file__).resolve().parents[1]
    own, other = tmp_path / "own", tmp_path / "other"
    for d in (own, other):
        d.mkdir()
        for split in ("test", "validation"):
            shutil.copyfile(root / "recipes/data/quickstart/validation.jsonl", d / f"{split}.jsonl")
    resolved = load_recipe(root / "recipes/quickstart.yaml", overrides=[
        f"trainer.data.validation.path={own}", "trainer.data.validation.split=test"]).resolved
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    checked = data_paths.source(str(other), resolved["trainer"]["data"]["validation"]["split"], "alpaca")
    spec = DataOptions.from_config(run_config(str(tmp_path / "run"), str(other))).validation
    assert resolve(spec, "trainer.data.validation") == checked == ("file", str(other / "test.jsonl"))
