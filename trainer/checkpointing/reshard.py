"""Resume a checkpoint on the same or on a different parallel layout (TP / PP / DP / EP).

    start_iteration, note = restore(path, model, optimizer, info)

Every rank's checkpoint file (trainer/checkpointing/checkpoint.py) holds its adapter shards keyed by GLOBAL name
(trainer.model.layout: layer and expert indices of the whole model, so PP stages and EP ranks never
collide) in parameter order, and its AdamW state in the same order. metadata.json records the layout
(world size, tensor, pipeline, data_parallel, expert); the file name records each file's (tp, pp, dp) coords.

* Same layout: this rank's own file is loaded as is (adapters, AdamW moments, RNG, TE's FP8 scaling state):
  bit-exact.
* Different layout: a rank reads shard files (data-parallel rank 0 first, further ones only for
  parameters still missing, e.g. experts spread over EP) until it has every old TP shard of each of
  ITS adapters; shards are merged to full tensors (sharding.merge_shards, the inverse of the TP split,
  SwiGLU's [gate; up] row layout included) and sliced for the new TP rank (sharding.to_local). The
  AdamW moments (exp_avg, exp_avg_sq) are resharded the same way; `step` is carried over. RNG
  streams and TE's FP8 scaling state (trainer/checkpointing/module_state.py) are per-rank and layout-specific, so
  they keep this run's seeding (this matters only for dropout; data order is a pure function of seed and
  iteration) and FP8 modules start their amax history anew.
"""
from __future__ import annotations

import os
import re
from typing import Optional

import torch

from primus_contract.restore_rules import random_base_refusal
from trainer.checkpointing import checkpoint as ckpt

_SHARD = re.compile(r"^rank-(\d+)_tp(\d+)_pp(\d+)_dp(\d+)\.pt$")


LAYOUT_KEYS = ("world_size", "tensor", "pipeline", "data_parallel", "expert")


def layout_of(meta: dict) -> tuple:
    # (checkpoints from before "expert" was recorded hold no EP size: 1 is assumed, and restore reshards
    # when this rank's file holds other adapters)
    return tuple(int(meta.get(k, 1 if k == "expert" else -1)) for k in LAYOUT_KEYS)


def current_layout(info) -> tuple:
    return (info.world_size, info.tp_size, info.pp_size, info.dp_size, info.ep_size)


def restore(path: str, model, optimizer, info, random_base: bool = False) -> tuple[int, Optional[str]]:
    """Load adapters + optimizer (+ RNG on the same layout); returns (iteration, reshard note or None).
    `random_base`: the base has no pretrained weights; another EP size over it is refused, and another TP size on a GPU
    (primus_contract/restore_rules.py, the rule `eval`/`export` apply at submit)."""
    from trainer.checkpointing.module_state import restore_extra_state
    from trainer.model import load_adapter_state_dict
    from trainer.model.lora.state import adapter_parameters

    meta = ckpt.read_metadata(path)
    old = layout_of(meta)
    if old == current_layout(info):
        state, _ = ckpt.load(path, rank=info.rank, coords=(info.tp_rank, info.pp_rank, info.dp_rank))
        # (an older checkpoint recorded no EP size: after an EP change this rank's file holds other experts)
        if state["adapter"].keys() == adapter_parameters(model).keys():
            load_adapter_state_dict(model, state["adapter"])
            optimizer.load_state_dict(state["optimizer"])
            ckpt.set_rng_state(state["rng"], info.device)
            restore_extra_state(model, state.get("extra_state"))  # TE's FP8 scales and amax history
            return int(state["iteration"]), None
    why = random_base_refusal(old[1], info.tp_size, not random_base, info.device.type, old[4], info.ep_size)
    if why:
        raise ckpt.CheckpointError(f"{path} was {why}")
    iteration = load_resharded(path, old[1], model, optimizer, info.tp_rank, info.tp_size)
    note = "resharded from " + " ".join(f"{k} {v}" for k, v in zip(LAYOUT_KEYS, old))
    return iteration, note


def shard_files(path: str) -> list[tuple[int, int, int, str]]:
    """(dp, pp, tp, file) of every rank file, data-parallel rank 0 first."""
    out = []
    for name in os.listdir(path):
        m = _SHARD.match(name)
        if m:
            out.append((int(m.group(4)), int(m.group(3)), int(m.group(2)), os.path.join(path, name)))
    if not out:
        raise ckpt.CheckpointError(f"{path} has no rank files")
    return sorted(out)


def _moments_by_name(names: list[str], adapter: dict, opt_state: dict) -> dict[str, dict]:
    """AdamW state per adapter name: optimizer indices follow build_optimizer's groups (>= 2-D
    params first, then 1-D), each in parameter order; shapes are checked."""
    order = [n for n in names if adapter[n].ndim >= 2] + [n for n in names if adapter[n].ndim < 2]
    indices = [i for g in opt_state["param_groups"] for i in g["params"]]
    if len(indices) != len(order):
        raise ckpt.CheckpointError(f"optimizer has {len(indices)} parameters but the file has {len(order)} "
                                   "adapters: only adapter-only optimizers can be resharded")
    out = {}
    for idx, name in zip(indices, order):
        st = opt_state["state"].get(idx)
        if st is None:
            continue
        if st["exp_avg"].shape != adapter[name].shape:
            raise ckpt.CheckpointError(f"optimizer state of {name} has shape {tuple(st['exp_avg'].shape)}, "
                                       f"the adapter {tuple(adapter[name].shape)}")
        out[name] = st
    return out


def _collect(path: str, old_tp: int, wanted: dict[str, Optional[int]]):
    """{name: {old tp rank: (tensor, AdamW state or None)}} for the wanted names; `wanted` maps a
    name to its partition dim (None = replicated: any one TP rank's copy suffices). Also the iteration."""
    parts: dict[str, dict[int, tuple]] = {n: {} for n in wanted}

    def complete(n):
        return len(parts[n]) >= (old_tp if wanted[n] is not None else 1)

    iteration = None
    for _, _, tp, file in shard_files(path):
        if iteration is not None and all(complete(n) for n in wanted):
            break
        state = torch.load(file, map_location="cpu", weights_only=False)
        iteration = int(state["iteration"])
        adapter = state["adapter"]
        names = [n for n in adapter if n in parts]
        if not names:
            continue
        moments = _moments_by_name(list(adapter), adapter, state["optimizer"])
        for n in names:
            parts[n].setdefault(tp, (adapter[n], moments.get(n)))
    missing = sorted(n for n in wanted if not complete(n))
    if missing:
        raise ckpt.CheckpointError(f"{path} lacks shards of {len(missing)} adapters, e.g. {missing[:3]}")
    return parts, iteration


def load_resharded(path: str, old_tp: int, model, optimizer, tp_rank: int, tp_size: int) -> int:
    """Adapters and AdamW moments of checkpoint `path` (saved with TP size old_tp, any PP/DP/EP)
    into this rank's model and optimizer; returns the checkpoint's iteration."""
    from trainer.model.lora.state import adapter_parameters
    from trainer.model.sharding import merge_shards, shard_dim, to_local

    own = adapter_parameters(model)
    wanted = {n: shard_dim(n, p) for n, p in own.items()}
    parts, iteration = _collect(path, old_tp, wanted)

    def reshard(name, pieces):
        full = merge_shards(name, [pieces[t] for t in sorted(pieces)], wanted[name])
        return to_local(name, full, own[name], tp_rank, tp_size)

    index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    opt_sd = optimizer.state_dict()
    opt_sd["state"] = {}
    with torch.no_grad():
        for name, p in own.items():
            by_tp = parts[name]
            p.copy_(reshard(name, {t: v[0] for t, v in by_tp.items()}).to(p.dtype))
            states = {t: v[1] for t, v in by_tp.items()}
            if id(p) not in index or any(s is None for s in states.values()):
                continue
            opt_sd["state"][index[id(p)]] = {
                "step": next(iter(states.values()))["step"],
                **{k: reshard(name, {t: s[k] for t, s in states.items()}) for k in ("exp_avg", "exp_avg_sq")}}
    optimizer.load_state_dict(opt_sd)
    return iteration
