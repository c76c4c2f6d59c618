"""Four gloo ranks, every kind of parallelism at once on the tiny DeepSeek model (MLA + shared experts +
dense first layer): PP=2 x DP=2 with the experts split over the two data-parallel ranks (EP=2), and the
dense model at TP=2 (+SP) x PP=2. Both follow the single-process loss trajectory (rtol 1e-5, grad norm
1e-4) through the real Trainer.step."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.model_helpers import DEEPSEEK_MLA, arch_sections, free_port
from tests.parallel_helpers import (assert_same_trajectory, initial_state, layout_cfg, run_layout, set_rank_env,
                                    synthetic_packs)

STEPS = 3
RUNS = {"deepseek_mla": {"pipeline": 2, "expert": 2}, "dense": {"tensor": 2, "sequence_parallel": True, "pipeline": 2}}


def _cfg(run: str, par: dict):
    if run == "dense":
        return layout_cfg(par)
    sections = arch_sections(DEEPSEEK_MLA)
    return layout_cfg(par, model={**sections.pop("model"), "num_layers": 2}, **sections)


def _worker(rank, world, ports, states, packs, root, out):
    results = {}
    for (run, par), port in zip(RUNS.items(), ports):
        set_rank_env(rank, world, port)
        results[run] = run_layout(_cfg(run, par), states[run], packs, f"{root}/{run}", STEPS)
    torch.save(results, f"{out}.{rank}")


@pytest.mark.slow
def test_four_ranks_pp_dp_ep_and_tp_pp_match_single_process(tmp_path):
    packs = synthetic_packs(24, 32, vocab=128, seed=41)
    states, refs = {}, {}
    for run in RUNS:
        states[run] = initial_state(_cfg(run, {}), perturb_seed=42)
        refs[run] = run_layout(_cfg(run, {}), states[run], packs, str(tmp_path / run), STEPS)["trajectory"]
    out = tmp_path / "res"
    mp.start_processes(_worker, args=(4, [free_port() for _ in RUNS], states, packs, str(tmp_path), str(out)),
                       nprocs=4, join=True, start_method="spawn")
    for rank in range(4):
        results = torch.load(f"{out}.{rank}")
        assert (results["deepseek_mla"]["pp"], results["deepseek_mla"]["dp"]) == (2, 2)
        assert (results["dense"]["tp"], results["dense"]["pp"], results["dense"]["dp"]) == (2, 2, 1)
        for run, got in results.items():
            assert_same_trajectory(got["trajectory"], refs[run], 1e-5, f"{run} rank {rank}")
