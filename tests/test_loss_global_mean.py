"""The step's loss is the token mean over the WHOLE global batch (all micro-batches, all DP ranks),
and its gradients equal a hand computation of exactly that mean, for uneven micro-batches."""
from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.model_helpers import dist_session, free_port, packed_batch, perturb_adapters, tiny_cfg

# four micro-batches with very different numbers of loss tokens (doc lengths -> len-1 loss tokens each)
DOCS = [[10, 15], [5], [30], [3, 4]]
SEQ = 32


def _micro_batches():
    return [packed_batch(1, SEQ, docs, vocab=128, seed=i) for i, docs in enumerate(DOCS)]


def _step_grads(model, micro_batches, dp_group=None):
    """The trainer's path: step header count, per-micro-batch objective backward
    (trainer.step.pipeline.accumulate_gradients), DP grad SUM."""
    from trainer.step.loss import all_reduce_sum, local_token_count, step_header
    from trainer.model import forward_losses
    from trainer.step.optim import reduce_gradients, trainable_parameters
    from trainer.step.pipeline import accumulate_gradients

    params = trainable_parameters(model)
    model.zero_grad(set_to_none=True)
    n, _, totals = step_header(local_token_count(micro_batches), False, True, torch.device("cpu"), group=None)
    backwards = []  # the per-micro-batch hook (fp8_param releases FP8 transposes there)
    loss_sum = accumulate_gradients(model, forward_losses, micro_batches, n, torch.device("cpu"),
                                    after_backward=lambda: backwards.append(1))
    assert len(backwards) == len(micro_batches)
    reduce_gradients(params, dp_group)
    all_reduce_sum(loss_sum, dp_group)
    return float(loss_sum / n), totals[0], {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}


def _hand_grads(model, micro_batches):
    """Reference: concatenate every unmasked token's CE over all micro-batches, take the plain mean."""
    from trainer.model import forward_losses

    model.zero_grad(set_to_none=True)
    picked = [forward_losses(model, mb)[mb["loss_mask"].bool()] for mb in micro_batches]
    loss = torch.cat(picked).mean()
    loss.backward()
    naive = sum(float(p.detach().mean()) for p in picked) / len(picked)  # mean of micro-batch means (wrong)
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}
    return float(loss.detach()), sum(len(p) for p in picked), naive, grads


def _build():
    from trainer.model import build_model

    model = build_model(tiny_cfg(), torch.device("cpu"))
    perturb_adapters(model, seed=3)
    return model


def _compare(ours, hand):
    loss, count, grads = ours
    ref_loss, ref_count, naive, ref_grads = hand
    assert count == ref_count == sum(sum(d - 1 for d in docs) for docs in DOCS)
    assert abs(loss - ref_loss) < 1e-6 * max(1.0, abs(ref_loss))
    assert abs(naive - ref_loss) > 1e-3  # the uneven split makes the naive mean differ: the check can fail
    assert grads.keys() == ref_grads.keys() and grads
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-5, atol=1e-7, msg=k)


def test_global_token_mean_single_rank_uneven_micro_batches():
    with dist_session(tiny_cfg()):
        model = _build()
        mbs = _micro_batches()
        _compare(_step_grads(model, mbs), _hand_grads(model, mbs))


def _dp_worker(rank, world, port, out):
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with dist_session(tiny_cfg()) as info:
        model = _build()
        for p in model.parameters():  # identical replicas, as DP requires
            dist.broadcast(p.data, src=0)
        mbs = _micro_batches()
        mine = mbs[:2] if rank == 0 else mbs[2:]   # rank 0: 23+4 loss tokens, rank 1: 29+5
        ours = _step_grads(model, mine, info.dp_group)
        if rank == 0:
            hand = _hand_grads(model, mbs)   # local, no collectives: the whole global batch at once
            _compare(ours, hand)
            torch.save({"loss": ours[0], "ref": hand[0]}, out)
        dist.barrier()


@pytest.mark.slow
def test_global_token_mean_two_dp_ranks(tmp_path):
    out = str(tmp_path / "dp.pt")
    mp.spawn(_dp_worker, args=(2, free_port(), out), nprocs=2, join=True)
    res = torch.load(out)
    assert abs(res["loss"] - res["ref"]) < 1e-6
