"""Four gloo ranks, every kind of parallelism at once on the tiny DeepSeek model (MLA + shared experts +
dense first layer): PP=2 x DP=2 with the experts split over the two data-parallel ranks (EP=2), and the
dense model at TP=2 (+SP) x PP=2. Both follow the single-process loss trajectory (rtol 1e-5, grad norm
1e-4) through the real Trainer.step."""
from __future__ import annotations

import functools

import pytest

from tests.model_helpers import DEEPSEEK_MLA
from tests.parallel_helpers import (arch_layout_cfg, assert_same_trajectory, layout_cfg, run_layout, run_on_ranks,
                                    single_process_references, synthetic_packs)

STEPS = 3
RUNS = {"deepseek_mla": {"pipeline": 2, "expert": 2}, "dense": {"tensor": 2, "sequence_parallel": True, "pipeline": 2}}


def _cfg(run: str, par: dict):
    return layout_cfg(par) if run == "dense" else arch_layout_cfg(DEEPSEEK_MLA, par)


def _run(run, par, states, packs, root):
    return run_layout(_cfg(run, par), states[run], packs, f"{root}/{run}", STEPS)


@pytest.mark.slow
def test_four_ranks_pp_dp_ep_and_tp_pp_match_single_process(tmp_path):
    packs = synthetic_packs(24, 32, vocab=128, seed=41)
    states, refs = single_process_references(RUNS, _cfg, packs, str(tmp_path), STEPS, perturb_seed=42)
    per_rank = run_on_ranks(4, RUNS, functools.partial(_run, states=states, packs=packs, root=str(tmp_path)),
                            tmp_path / "res")
    for rank, results in enumerate(per_rank):
        assert (results["deepseek_mla"]["pp"], results["deepseek_mla"]["dp"]) == (2, 2)
        assert (results["dense"]["tp"], results["dense"]["pp"], results["dense"]["dp"]) == (2, 2, 1)
        for run, got in results.items():
            assert_same_trajectory(got["trajectory"], refs[run], 1e-5, f"{run} rank {rank}")
