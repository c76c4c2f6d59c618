"""HF import under TP=2 (+SP), EP=2 and PP=2 on two gloo ranks, for the tiny Qwen3-MoE and DeepSeek-V2 (MLA, dense
first layer, shared experts) checkpoints: each rank's logits equal transformers' (fp32, 1e-4; TP's vocab shards
gathered), the stages / expert ranks together hold exactly the single-process import, and a rank reads only the
tensors it keeps: under EP=2 the routed experts of the other rank are never read, under PP=2 the other stage's
layers are never read (the `read N` count of the import's log line)."""
from __future__ import annotations

import functools
import re

import pytest
import torch

from tests.parallel_helpers import run_on_ranks

RUNS = {"qwen3_moe/ep2": {"expert": 2}, "deepseek_v2/ep2": {"expert": 2},
        "qwen3_moe/tp2_sp": {"tensor": 2, "sequence_parallel": True},
        "deepseek_v2/tp2_sp": {"tensor": 2, "sequence_parallel": True},
        "qwen3_moe/pp2": {"pipeline": 2}, "deepseek_v2/pp2": {"pipeline": 2}}
TOKENS = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))


def _cfg(path, par: dict):
    from tests.test_hf_import_families import recipe_for

    parallelism = {"tensor": 1, "pipeline": 1, "context": 1, "expert": 1, "sequence_parallel": False, **par}
    return recipe_for(path, parallelism=parallelism)


def _import(run: str, par: dict, root: str) -> dict:
    from megatron.core import parallel_state as ps

    from tests.model_helpers import dist_session
    from trainer.model import build
    from trainer.model.layout import full_global_state_dict

    family = run.split("/")[0]
    cfg = _cfg(f"{root}/{family}", par)
    with dist_session(cfg) as info:
        built = build(cfg, info.device)
        model = built.model.eval()
        out = {"state": full_global_state_dict(model), "line": built.line("hf import")}
        if not par.get("pipeline"):
            with torch.no_grad():
                logits = model(input_ids=TOKENS, position_ids=None, attention_mask=None)
            if ps.get_tensor_model_parallel_world_size() > 1:
                parts = [torch.empty_like(logits) for _ in range(2)]
                torch.distributed.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
                logits = torch.cat(parts, dim=-1)
            out["logits"] = logits
    return out


def _reads(line: str) -> int:
    return int(re.search(r"\| read (\d+) ", line).group(1))


@pytest.mark.slow
def test_import_under_tp_ep_pp_matches_transformers(tmp_path):
    from tests.hf_tiny import load_tiny, save_tiny

    refs, singles = {}, {}
    for family in ("qwen3_moe", "deepseek_v2"):
        path = save_tiny(family, tmp_path / family, seed=7)
        with torch.no_grad():
            refs[family] = load_tiny(path)(TOKENS).logits
        singles[family] = _import(f"{family}/single", {}, str(tmp_path))
        torch.testing.assert_close(singles[family]["logits"], refs[family], rtol=1e-4, atol=1e-4)
    per_rank = run_on_ranks(2, RUNS, functools.partial(_import, root=str(tmp_path)), tmp_path / "res")
    for run in RUNS:
        family = run.split("/")[0]
        single = singles[family]
        merged = {}
        for rank, results in enumerate(per_rank):
            got = results[run]
            merged.update(got["state"])
            if "logits" in got:
                torch.testing.assert_close(got["logits"], refs[family], rtol=1e-4, atol=1e-4,
                                           msg=f"{run} rank {rank}")
            if run.endswith(("ep2", "pp2")):  # a rank reads only what it keeps
                assert _reads(got["line"]) < _reads(single["line"]), (run, got["line"], single["line"])
        assert merged.keys() == single["state"].keys(), run
        for name, tensor in single["state"].items():
            if not name.endswith((".lora_a", ".lora_b")):
                torch.testing.assert_close(merged[name], tensor, rtol=0, atol=0, msg=f"{run} {name}")
    # EP=2: the two ranks' reads split the routed experts (4 experts x 3 tensors x MoE layers, half each)
    for family, moe_layers in (("qwen3_moe", 2), ("deepseek_v2", 1)):
        ep = [_reads(r[f"{family}/ep2"]["line"]) for r in per_rank]
        assert ep[0] == ep[1] == _reads(singles[family]["line"]) - 2 * 3 * moe_layers, (family, ep)
