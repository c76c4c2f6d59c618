"""LoRA dropout under tensor parallelism follows megatron's RNG rules (two gloo processes, TP=2).

A tensor split across the TP ranks (a hidden shard: the input of a row-parallel base, the output of a
column-parallel one; or any sequence shard under sequence parallelism) must be dropped with a different mask on
each rank, drawn from the model-parallel tracker; a tensor every rank holds whole (a column base's input, a row
base's output, without sequence parallelism) must be dropped with the same mask on every rank, or the ranks'
copies of one activation disagree. Before, every rank drew every mask from the same default generator: the
shards of one tensor were dropped in lockstep (feature j together with feature j + hidden/TP).
"""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.model_helpers import (DEEPSEEK_MLA, MLA_TARGETS, QWEN3_MOE, dist_session, free_port, packed_batch,
                                 perturb_adapters, tiny_cfg)

CASES = [("pre", False), ("post", False), ("pre", True), ("post", True)]
ROW = ("linear_proj", "linear_fc2")


def _masks(rank, world, position, sp, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cfg = tiny_cfg(trainer={"parallelism": {"tensor": world, "sequence_parallel": sp},
                            "lora": {"dropout": 0.5, "dropout_position": position},
                            "recompute": {"chunked_loss": True}})
    from trainer.model import build_model, forward_losses

    masks = {}
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        perturb_adapters(model)  # B != 0, so a post-dropout input has no zeros of its own
        def record(name):
            def hook(mod, inp, out):  # returns None: the output stays
                masks.setdefault(name, ((out == 0) & (inp[0] != 0)).clone())
            return hook

        current = {}
        for name, module in model.named_modules():
            if type(module).__name__ == "LoRALinear":
                module.dropout.register_forward_hook(record(name))  # the unfused path's nn.Dropout
                module.register_forward_pre_hook(lambda mod, inp, name=name: current.update(name=name))
        import trainer.model.lora.layers as layers

        draw = layers.draw

        def recorded_draw(z, p):  # the fused path's pre-dropout (trainer.model.lora.drop.draw, under the TP rules)
            out, keep = draw(z, p)
            masks.setdefault(current["name"], ((out == 0) & (z != 0)).clone())
            return out, keep

        layers.draw = recorded_draw
        model.train()
        forward_losses(model, packed_batch(2, 32, [13, 22, 8, 21], vocab=128, seed=1))
    return masks


def _whole_linear_masks(rank, world, ports):
    """MoE experts and MLA's duplicated linears are whole on every TP rank but, under SP, see the rank's own
    tokens: {name: (tokens_per_rank, mask of dropping ones the way the adapter drops an unsharded input)}."""
    from trainer.model import build_model
    from trainer.model.lora.layers import LoRALinear
    from trainer.model.lora.grouped import dropout_per_tp_rank

    out = {}
    for arch, targets, port in (("moe", None, ports[0]), ("mla", MLA_TARGETS, ports[1])):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        model_cfg = {**(QWEN3_MOE if arch == "moe" else DEEPSEEK_MLA)}
        lora = {"dropout": 0.5, **({"target_modules": targets} if targets else {})}
        cfg = tiny_cfg(trainer={"model": model_cfg, "lora": lora,
                                "parallelism": {"tensor": world, "sequence_parallel": True}})
        with dist_session(cfg) as info:
            model = build_model(cfg, info.device).train()
            for name, m in model.named_modules():
                if getattr(m, "dropout", None) is None or not hasattr(m, "tokens_per_rank"):
                    continue
                ones = torch.ones(4096)
                mask = (m._drop(ones, sharded=False) if isinstance(m, LoRALinear)
                        else dropout_per_tp_rank(m.dropout, ones, m.tokens_per_rank)) == 0
                out[f"{arch}:{name}"] = (m.tokens_per_rank, mask)
    return out


def _worker(rank, world, ports, out):
    result = {case: _masks(rank, world, *case, port) for case, port in zip(CASES, ports)}
    result["whole"] = _whole_linear_masks(rank, world, ports[-2:])
    torch.save(result, f"{out}.{rank}")


@pytest.fixture(scope="module")
def masks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dropout") / "masks")
    mp.start_processes(_worker, args=(2, [free_port() for _ in range(len(CASES) + 2)], out), nprocs=2, join=True,
                       start_method="spawn")
    return torch.load(f"{out}.0"), torch.load(f"{out}.1")


@pytest.mark.parametrize("position,sp", CASES)
def test_shards_get_their_own_masks_and_whole_tensors_the_same(masks, position, sp):
    r0, r1 = masks[0][(position, sp)], masks[1][(position, sp)]
    assert r0 and set(r0) == set(r1)
    for name in r0:
        a, b = r0[name], r1[name]
        assert 0.3 < a.float().mean() < 0.7, (name, a.float().mean())  # p = 0.5 really dropped
        row = name.rsplit(".", 1)[-1] in ROW
        whole = not sp and (row if position == "post" else not row)
        assert torch.equal(a, b) == whole, (name, position, sp, "whole" if whole else "sharded")


def test_whole_linears_fed_their_ranks_own_tokens_get_their_own_masks(masks):
    r0, r1 = masks[0]["whole"], masks[1]["whole"]
    own = [n for n, (per_rank, _) in r0.items() if per_rank]
    assert any(".experts." in n for n in own), sorted(r0)  # MoE experts under SP route each rank's tokens
    for name, (per_rank, mask) in r0.items():
        assert per_rank == r1[name][0]
        assert torch.equal(mask, r1[name][1]) != per_rank, (name, per_rank)
