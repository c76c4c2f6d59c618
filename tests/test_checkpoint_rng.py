"""A checkpoint restores exactly on the device the reading process runs on (issue: on an H200 every resume, eval,
generate and export died with `TypeError: RNG state must be a torch.ByteTensor`: the shard was read with
map_location=<the run's device>, so the saved generator states arrived as CUDA tensors).

The reading process here runs "on" the meta device (the one other device a CPU machine has): the shard must still
be read onto the CPU, every RNG state must come back a CPU ByteTensor, and adapters, AdamW state and every RNG
stream (Python, NumPy, torch, megatron's tracker) must be restored bit for bit through the same `restore` that
training resume and the post-training jobs call."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch

from model_helpers import dist_session, perturb_adapters, tiny_cfg
from trainer.checkpointing import checkpoint as ckpt
from trainer.checkpointing.reshard import restore
from trainer.model import adapter_state_dict, build_model
from trainer.step.optim import build_optimizer, trainable_parameters


def _draws() -> dict:
    """One draw from every stream a checkpoint restores."""
    from megatron.core import tensor_parallel

    with tensor_parallel.get_cuda_rng_tracker().fork():
        tracked = torch.rand(4)
    return {"python": random.random(), "numpy": float(np.random.rand()), "torch": torch.rand(4), "tracker": tracked}


def _one_adam_step(model, optimizer) -> None:
    params = trainable_parameters(model)
    loss = sum((p.float() ** 2).sum() for p in params)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _rng_tensors(rng: dict) -> dict:
    out = {k: rng[k] for k in ("torch", "cuda") if rng.get(k) is not None}
    out.update({f"tracker/{n}": t for n, t in (rng.get("tracker") or {}).items()})
    return out


def test_restore_on_another_device_is_exact(tmp_path):
    cfg = tiny_cfg()
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        perturb_adapters(model, seed=3)
        optimizer = build_optimizer(trainable_parameters(model), cfg.trainer.schedule)
        _one_adam_step(model, optimizer)
        elsewhere = dataclasses.replace(info, device=torch.device("meta"))  # the process that saves and restores
        state = {"iteration": 5, "adapter": adapter_state_dict(model), "optimizer": optimizer.state_dict(),
                 "rng": ckpt.rng_state(elsewhere.device)}
        path = ckpt.save(str(tmp_path), 5, state, rank=0, coords=(0, 0, 0), keep_last=None,
                         metadata={"world_size": 1, "tensor": 1, "pipeline": 1, "data_parallel": 1, "expert": 1})
        want_adapters = {n: t.clone() for n, t in adapter_state_dict(model).items()}
        want_moments = {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()}
        want_draws = _draws()

        # what a later process would have: other adapters, other moments, other streams
        perturb_adapters(model, seed=11)
        _one_adam_step(model, optimizer)
        _draws()

        loaded, _ = ckpt.load(path, rank=0, coords=(0, 0, 0))
        rng = _rng_tensors(loaded["rng"])
        assert "tracker/model-parallel-rng" in rng, sorted(rng)
        for name, t in rng.items():
            assert t.device.type == "cpu" and t.dtype == torch.uint8, (name, t.device, t.dtype)

        iteration, note = restore(path, model, optimizer, elsewhere)
        assert (iteration, note) == (5, None)
        for n, t in adapter_state_dict(model).items():
            assert torch.equal(t, want_adapters[n]), n
        got = optimizer.state_dict()["state"]
        assert got.keys() == want_moments.keys()
        for i, moments in want_moments.items():
            for k, v in moments.items():
                assert torch.equal(got[i][k], v), (i, k)
        draws = _draws()
        assert draws["python"] == want_draws["python"] and draws["numpy"] == want_draws["numpy"]
        assert torch.equal(draws["torch"], want_draws["torch"])
        assert torch.equal(draws["tracker"], want_draws["tracker"])


def test_rng_states_read_onto_another_device_are_normalised():
    """set_rng_state takes states that a loader put elsewhere (a tensor of another dtype or a generator object) and
    restores the same stream; bytes that are truly gone (meta) are one clear CheckpointError, not a TypeError."""
    torch.manual_seed(1234)
    saved = torch.get_rng_state()
    want = torch.rand(3)
    gen = torch.Generator().manual_seed(99)
    gen_want = torch.rand(2, generator=torch.Generator().manual_seed(99))
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": saved.to(torch.int16),
             "cuda": None, "tracker": None}
    ckpt.set_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(3), want)
    assert torch.equal(ckpt._cpu_bytes(gen), torch.Generator().manual_seed(99).get_state())
    assert torch.equal(torch.rand(2, generator=gen), gen_want)
    lost = dict(state, torch=torch.empty(saved.shape, dtype=torch.uint8, device="meta"))
    try:
        ckpt.set_rng_state(lost, torch.device("cpu"))
    except ckpt.CheckpointError as err:
        assert "meta" in str(err)
    else:
        raise AssertionError("a meta RNG state was accepted")


class _Scaled(torch.nn.Module):
    """A module with extra state, as Transformer Engine's FP8 modules keep their scales and amax history (torch's
    extra-state protocol)."""

    def __init__(self):
        super().__init__()
        self.amax_history = torch.zeros(4)

    def get_extra_state(self):
        return self.amax_history.clone()

    def set_extra_state(self, state):
        self.amax_history = state.clone()


def test_module_extra_state_round_trips_through_a_checkpoint(tmp_path):
    """The FP8 scaling state of a frozen base is saved with the adapters and restored on resume (module_state)."""
    from trainer.checkpointing.module_state import extra_state, restore_extra_state

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), _Scaled(), torch.nn.Sequential(_Scaled()))
    model[1].amax_history = torch.tensor([1.0, 2.0, 3.0, 4.0])
    model[2][0].amax_history = torch.tensor([5.0, 6.0, 7.0, 8.0])
    path = ckpt.save(str(tmp_path), 1, {"extra_state": extra_state(model)}, rank=0, coords=(0, 0, 0),
                     keep_last=None, metadata={})
    fresh = torch.nn.Sequential(torch.nn.Linear(2, 2), _Scaled(), torch.nn.Sequential(_Scaled()))
    loaded, _ = ckpt.load(path, rank=0, coords=(0, 0, 0))
    assert sorted(loaded["extra_state"]) == ["1", "2.0"]  # the Linear has none
    assert restore_extra_state(fresh, loaded["extra_state"]) == 2
    assert torch.equal(fresh[1].amax_history, model[1].amax_history)
    assert torch.equal(fresh[2][0].amax_history, model[2][0].amax_history)
    try:
        restore_extra_state(torch.nn.Sequential(torch.nn.Linear(2, 2)), loaded["extra_state"])
    except KeyError as err:
        assert "lacks" in str(err)
    else:
        raise AssertionError("extra state of modules the model lacks was accepted")


def test_a_checkpoint_of_another_device_kind_keeps_this_process_tracker():
    """A GPU run's checkpoint read on the CPU: its CUDA tracker state (a 16-byte Philox state) is not put into the
    CPU tracker, whose next fork would fail; Python/NumPy/torch CPU streams are restored all the same."""
    from megatron.core import tensor_parallel

    cfg = tiny_cfg()
    with dist_session(cfg) as info:
        tracker = tensor_parallel.get_cuda_rng_tracker()
        mine = {n: t.clone() for n, t in tracker.get_states().items()}
        state = ckpt.rng_state(info.device)
        want = torch.rand(3)
        gpu_state = dict(state, device="cuda", cuda=torch.zeros(16, dtype=torch.uint8),
                         tracker={n: torch.zeros(16, dtype=torch.uint8) for n in mine})
        ckpt.set_rng_state(gpu_state, info.device)
        assert torch.equal(torch.rand(3), want)
        assert all(torch.equal(tracker.get_states()[n], t) for n, t in mine.items())
        with tracker.fork():
            torch.rand(2)


def test_a_random_base_on_a_gpu_is_not_resharded_across_tp(tmp_path):
    """On a GPU megatron draws each TP shard of a random base from that TP rank's stream: another TP size is another
    base, and resharded adapters would be paired with weights they never saw. restore refuses that in one line
    (a post job runs at TP 1, so eval/export of such a TP 2 run says so instead of a silently wrong loss)."""
    import json

    from trainer.runtime.distributed import DistInfo

    (tmp_path / "metadata.json").write_text(json.dumps({"world_size": 2, "tensor": 2, "pipeline": 1,
                                                        "data_parallel": 1, "expert": 1}))
    one = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cuda"), backend="nccl", tp_size=1,
                   tp_rank=0, pp_size=1, pp_rank=0, cp_size=1, ep_size=1, dp_size=1, dp_rank=0, is_first_stage=True,
                   is_last_stage=True, dp_group=None, tp_group=None, pp_group=None)
    try:
        restore(str(tmp_path), None, None, one, random_base=True)
    except ckpt.CheckpointError as err:
        assert "tensor parallel 2 over a randomly initialised base" in str(err)
    else:
        raise AssertionError("a random base was resharded across TP on a GPU")
