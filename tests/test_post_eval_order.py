"""trainer.post.evaluate.run resolves the checkpoint before it builds the validation data: a missing iteration fails
at once with the iteration named, not after minutes of tokenizing. (The CLI's own check, primus_slurm/post_training,
refuses it earlier still, so tests/test_post_commands.py never reaches this order; audit, 2026-12-07.)"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

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
