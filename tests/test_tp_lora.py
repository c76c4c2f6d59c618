"""TP=2 (two gloo processes) gives the same per-token losses and LoRA grads as TP=1 (with sequence
parallelism also with recompute.adapter_inputs; and with sequence parallelism and trainer.lora.fused_swiglu, its
Triton kernels run in the interpreter on each rank's shard of fc1, against TP=1 with fused_swiglu on). The TP=1
reference takes megatron's output layer + cross-entropy; the TP=2 runs take trainer.model.chunked_loss
(vocab-parallel, 9-token chunks).

Tolerance: fp32 on CPU, rtol 1e-4 / atol 1e-5 (only the summation order of the TP reductions
differs between the layouts).
"""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.model_helpers import dist_session, free_port, packed_batch, perturb_adapters, tiny_cfg
from trainer.model import allreduce_sequence_parallel_grads, build, build_model, chunked_loss, forward_losses
from trainer.model.sharding import full_state_dict, load_full_state_dict, to_full

DOCS = [13, 22, 8, 21]
RUNS = ((False, False), (True, False), (True, True))  # (sequence parallel, fused_swiglu)


def _cfg(tp: int, sp: bool, swiglu: bool = False):
    # the sequence-parallel run also keeps fc1's output instead of the fc2 adapter's input (lora.inputs), unless
    # fc1's adapter is folded into the SwiGLU (the two exclude each other)
    return tiny_cfg(trainer={"parallelism": {"tensor": tp, "sequence_parallel": sp},
                             "lora": {"fused_swiglu": swiglu},
                             "recompute": {"adapter_inputs": sp and not swiglu, "chunked_loss": tp > 1}})


def _run(model, batch):
    losses = forward_losses(model, batch)
    loss = (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    loss.backward()
    return losses.detach()


def _worker(rank, world, ports, full, batch, out_path):
    results = {}
    for (sp, swiglu), port in zip(RUNS, ports):
        results[(sp, swiglu)] = _tp_run(rank, world, port, sp, full, batch, swiglu)
    if rank == 0:
        torch.save(results, out_path)


def _tp_run(rank, world, port, sp, full, batch, swiglu=False):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cfg = _cfg(world, sp, swiglu)
    chunked_loss.CHUNK_BYTES = 4 * 64 * 9  # 64 = this rank's vocab shard: 9-token chunks
    with dist_session(cfg) as info:
        from megatron.core import parallel_state as ps

        built = build(cfg, info.device)
        model = built.model
        assert built.line("chunked loss")  # installed (not megatron's output layer + loss)
        assert (model.decoder.layers[0].mlp.linear_fc2.input_act is not None) == (sp and not swiglu)
        if swiglu:  # every dense MLP wired, with the Triton kernels (the interpreter: TRITON_INTERPRET=1)
            from trainer.model.lora.swiglu import kernels_usable

            assert built.line("fused swiglu").startswith("fused swiglu | fc1 adapters folded into the activation | 2")
            assert kernels_usable(info.device)
        # trainer.lora.fused (the default) with the TP/SP collectives between A and B (tests/test_lora_fused.py pins
        # it against the unfused path at TP 1)
        # (fc1's adapter folded into the SwiGLU kernels is called through forward_parts instead)
        wrapped = [m for m in model.modules() if type(m).__name__ == "LoRALinear"]
        assert all(m.uses_fused_path() for m in wrapped if not m.swiglu_folded)
        assert sum(m.swiglu_folded for m in wrapped) == (2 if swiglu else 0)
        load_full_state_dict(model, full)
        losses = _run(model, batch)
        marked = [n for n, p in model.named_parameters() if getattr(p, "sequence_parallel", False)
                  and p.requires_grad]
        # replicated factors fed by a sequence shard: A of column bases, B of row bases
        assert len(marked) == (8 if sp else 0), marked
        allreduce_sequence_parallel_grads(model)
        grads = {}
        for name, p in model.named_parameters():
            if p.requires_grad:
                grads[name] = to_full(name, p.grad, p, ps.get_tensor_model_parallel_group())
        round_trip = full_state_dict(model)
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    return {"losses": losses, "grads": grads, "full": round_trip, "shapes": shapes}


@pytest.mark.slow
def test_tp2_matches_tp1(tmp_path, monkeypatch):
    """One spawn of two gloo ranks runs TP=2, TP=2 + sequence parallel, and TP=2 + sequence parallel + fused_swiglu
    (spawn + imports dominate)."""
    batch = packed_batch(2, 32, DOCS, vocab=128, seed=11)
    refs = {}
    for swiglu in (False, True):  # TP=1 with fused_swiglu on: on CPU its unfused ops (tests/test_lora_swiglu.py)
        with dist_session(_cfg(1, False, swiglu)) as info:
            model = build_model(_cfg(1, False, swiglu), info.device)
            perturb_adapters(model, seed=12)
            full = {k: v.clone() for k, v in full_state_dict(model).items()}
            refs[swiglu] = (_run(model, batch),
                            {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    out = tmp_path / "tp2.pt"
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the ranks (spawned: they import Triton anew) run its kernels
    mp.start_processes(_worker, args=(2, tuple(free_port() for _ in RUNS), full, batch, str(out)),
                       nprocs=2, join=True, start_method="spawn")
    results = torch.load(out)
    assert set(results) == set(RUNS)
    for (sp, swiglu), got in results.items():
        ref_losses, ref_grads = refs[swiglu]
        # the adapters really are sharded: column-parallel B and row-parallel A are half-size
        assert got["shapes"]["decoder.layers.0.self_attention.linear_qkv.lora_b"] == (64, 4)
        assert got["shapes"]["decoder.layers.0.mlp.linear_fc2.lora_a"] == (4, 80)
        assert got["shapes"]["decoder.layers.0.mlp.linear_fc1.lora_a"] == (4, 64)
        torch.testing.assert_close(got["losses"], ref_losses, rtol=1e-4, atol=1e-5)
        assert set(got["grads"]) == set(ref_grads)
        for name, g in ref_grads.items():
            assert g.abs().sum() > 0, name
            torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-5,
                                       msg=f"sp={sp} {name}")
        for name, t in full.items():
            torch.testing.assert_close(got["full"][name], t, rtol=0, atol=0, msg=name)
