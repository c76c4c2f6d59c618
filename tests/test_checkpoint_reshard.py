"""A checkpoint written on one parallel layout resumes on another with the same next steps
(trainer.checkpointing.reshard: adapters AND AdamW moments merged from the old TP shards / PP stages and sliced
for the new layout), through the real Trainer.save files.

    TP=2 -> TP=1, PP=2 -> TP=1 (checkpoints written by two gloo ranks, resumed in this process)
    TP=1 -> TP=2 (written here, resumed by the two ranks)

Each resumed run's steps 3-4 are compared with an uninterrupted single-process 4-step run: the
next-step loss checks the adapters, step 4 (loss and grad norm) the resharded AdamW state.
Tolerance: fp32 on CPU, rtol 1e-5 (reduction order only).
"""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.model_helpers import free_port
from tests.parallel_helpers import (assert_same_trajectory, initial_state, layout_cfg, run_layout, set_rank_env,
                                    synthetic_packs)

SAVED = {"tp2": {"tensor": 2}, "pp2": {"pipeline": 2}}


def _worker(rank, world, ports, full, packs, root, out):
    results = {}
    for (name, par), port in zip(SAVED.items(), ports):
        set_rank_env(rank, world, port)
        results[name] = run_layout(layout_cfg(par), full, packs, f"{root}/{name}", 2, save_at=2)
    set_rank_env(rank, world, ports[-1])
    results["tp1_to_tp2"] = run_layout(layout_cfg({"tensor": 2}), full, packs, f"{root}/resume_tp2", 2,
                                       resume=f"{root}/single/checkpoints/iter_0000002")
    torch.save(results, f"{out}.{rank}")


@pytest.mark.slow
def test_resume_on_another_layout_continues_the_trajectory(tmp_path):
    packs = synthetic_packs(24, 32, vocab=128, seed=21)
    full = initial_state(layout_cfg({}), perturb_seed=22)
    single = run_layout(layout_cfg({}), full, packs, str(tmp_path / "single"), 4, save_at=2)
    ref = single["trajectory"]
    assert single["checkpoint"].endswith("iter_0000002")
    out = tmp_path / "res"
    mp.start_processes(_worker, args=(2, [free_port() for _ in range(3)], full, packs, str(tmp_path), str(out)),
                       nprocs=2, join=True, start_method="spawn")
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for r in ranks:  # the ranks saved on their own layouts, and resumed our TP=1 checkpoint at TP=2
        for name in SAVED:
            assert_same_trajectory(r[name]["trajectory"], ref[:2], 1e-5, name, falls=False)
        assert r["tp1_to_tp2"]["note"] == "resharded from world_size 1 tensor 1 pipeline 1 data_parallel 1 expert 1"
        assert_same_trajectory(r["tp1_to_tp2"]["trajectory"], ref[2:], 1e-5, "tp1->tp2", falls=False)
    for name in SAVED:
        saved = ranks[0][name]["checkpoint"]
        got = run_layout(layout_cfg({}), full, packs, str(tmp_path / f"{name}_to_tp1"), 2, resume=saved)
        assert got["note"].startswith(f"resharded from world_size 2 tensor {SAVED[name].get('tensor', 1)} "
                                      f"pipeline {SAVED[name].get('pipeline', 1)}")
        assert_same_trajectory(got["trajectory"], ref[2:], 1e-5, f"{name}->tp1", falls=False)

