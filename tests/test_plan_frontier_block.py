"""plan --frontier searches block recompute: each layout's fewest recomputed layers that still fit (peak memory only
falls as layers are recomputed), not only layers/4 and layers/2. The 70B on one H200 does not fit 20 of its 80 layers;
its sweet spot was about 50 (measured: 52 layers 2,461 tokens/s at 125.3 GiB, 48 out of memory, when each adapter kept
its dropped copy; 46 with lazy NCCL; 40 planned with trainer.lora.dropout_recompute), faster than the full-uniform
recompute the frontier recommended before (2,185 tokens/s planned)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from primus_contract.plan import frontier, plan
from primus_contract.plan.frontier import candidates, fastest_fit, get
from primus_slurm.config.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes/llama2_70b_1xh200.yaml"
REC = "trainer.recompute."


def _recompute(resolved: dict, sets: dict) -> tuple:
    return tuple(sets.get(REC + k, get(resolved, REC + k)) for k in ("granularity", "method", "num_layers"))


def test_the_70b_on_one_h200_runs_fastest_with_the_fewest_block_layers_that_fit():
    r = load_recipe(RECIPE, check=False).resolved
    best = fastest_fit(candidates(r))
    gran, method, n = _recompute(r, best.sets)
    assert (gran, method) == ("full", "block"), best.sets
    assert 20 < n < 60, n  # between the old sampled point and the recipe's 60
    lines = [line.split(" ", 1)[1] for line in best.set_lines()]
    chosen = plan(load_recipe(RECIPE, lines).resolved)  # the contract takes it
    assert chosen.fits and abs(chosen.tokens_per_s_per_gpu - best.plan.tokens_per_s_per_gpu) < 1e-6
    one_fewer = plan(load_recipe(RECIPE, lines + [f"{REC}num_layers={n - 1}"]).resolved)
    assert one_fewer.fits is False, "the fewest recomputed layers that fit"
    full = [c for c in candidates(r) if _recompute(r, c.sets)[1:] == ("uniform", 1) and c.plan.fits]
    assert best.plan.tokens_per_s_per_gpu > max(c.plan.tokens_per_s_per_gpu for c in full)

    out = subprocess.run([sys.executable, "-m", "primus_slurm", "plan", str(RECIPE), "--frontier"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    starred = [x for x in out.stdout.splitlines() if x.startswith("* TP")]
    assert len(starred) == 1 and f"full block {n} " in starred[0], out.stdout
    assert out.stdout.rstrip().endswith(" ".join(best.set_lines()))


def test_the_search_agrees_with_planning_every_layer_count():
    r = load_recipe(RECIPE, check=False).resolved
    layers = r["trainer"]["model"]["num_layers"]
    wants = [w for w in frontier._wants(r) if w["method"] == "block" and w.get("fp8_param", True)
             and not w["adapter_inputs"] and w["micro_batch_size"] in (1, 4)]
    assert len(wants) == 2
    for want in wants:
        (found,) = frontier._fewest_block(r, want)
        every = [frontier._try(r, {**want, "num_layers": k}) for k in range(1, layers)]
        fewest = min(k + 1 for k, c in enumerate(every) if c.plan.fits)
        assert found.plan.fits and found.sets[REC + "num_layers"] == fewest
        assert found.plan.peak_gib == every[fewest - 1].plan.peak_gib


def test_a_layout_where_no_block_fits_lists_its_most_recomputed_block_not_fitting():
    r = load_recipe(RECIPE, ["trainer.precision.fp8_param=false"], check=False).resolved
    want = next(w for w in frontier._wants(r) if w["method"] == "block" and not w["fp8_param"])
    (found,) = frontier._fewest_block(r, want)
    assert found.plan.fits is False and found.sets[REC + "num_layers"] == 79


def test_an_unknown_gpu_keeps_the_quarter_and_half_block_points():
    r = load_recipe(RECIPE, ["cluster.env_profile=none"], check=False).resolved
    blocks = {n for g, m, n in (_recompute(r, c.sets) for c in candidates(r)) if (g, m) == ("full", "block")}
    assert blocks == {20, 40}
