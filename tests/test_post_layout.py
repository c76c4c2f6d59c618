"""A post job (eval, export, generate) runs at tensor and expert parallel 1: a TP > 1 checkpoint over a random base is
refused at submit on a GPU recipe (the base differs per TP size there), an EP > 1 one on any device, and accepted where
it is the same base."""
from __future__ import annotations

import json

import pytest

from primus_slurm.errors import UserError
from primus_slurm.post_training import post


def _run(tmp_path, tensor: int, expert: int = 1):
    ck = tmp_path / "checkpoints" / "iter_0000010"
    ck.mkdir(parents=True)
    (ck / "metadata.json").write_text(json.dumps({"tensor": tensor, "expert": expert}))
    return tmp_path


def _resolved(device: str, pretrained=None) -> dict:
    return {"trainer": {"distributed": {"device": device}, "checkpoint": {"pretrained": pretrained}}}


def test_tp2_random_base_on_a_gpu_is_refused(tmp_path):
    with pytest.raises(UserError, match="tensor parallel 2 over a randomly initialised base"):
        post.check_layout(_run(tmp_path, 2), "iter_0000010", _resolved("cuda"))


@pytest.mark.parametrize("tensor, device, pretrained", [(1, "cuda", None), (2, "cpu", None), (2, "cuda", "/base")])
def test_the_same_base_is_accepted(tmp_path, tensor, device, pretrained):
    post.check_layout(_run(tmp_path, tensor), "iter_0000010", _resolved(device, pretrained))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_ep2_random_base_is_refused_on_any_device(tmp_path, device):
    """Each EP rank draws its local experts from its own stream (trainer/model/seeding.py): a post job at EP 1 of a
    run trained at EP 2 over a random base would pair the adapters with other experts (audit, 2026-12-05)."""
    with pytest.raises(UserError, match="expert parallel 2 over a randomly initialised base"):
        post.check_layout(_run(tmp_path, 1, expert=2), "iter_0000010", _resolved(device))
    post.check_layout(tmp_path, "iter_0000010", _resolved(device, "/base"))  # a pretrained base: the same experts
