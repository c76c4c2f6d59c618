"""trainer/runtime/nccl_groups.py: with lazy NCCL (trainer.distributed.nccl_eager_init false, the default) the
groups the trainer's collectives use get their communicators before the model is built, not at the first step's
peak. Two real processes (torchrun, gloo) and real megatron parallel state: the groups walked per layout, and the
planner's count of them (primus_contract/plan/memory.py lazy_communicators) is the same."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT
from tests.model_helpers import free_port

# (name, tp, pp, moe, fp8) on two ranks
LAYOUTS = (("dp2", 1, 1, False, False), ("dp2-fp8", 1, 1, False, True), ("tp2-fp8", 2, 1, False, True),
           ("dp2-moe", 1, 1, True, False), ("pp2", 1, 2, False, False))
SCRIPT = "LAYOUTS = " + repr(LAYOUTS) + r'''
import json, os, torch, torch.distributed as dist
from megatron.core import parallel_state as ps
from trainer.runtime.nccl_groups import make_used_communicators
dist.init_process_group("gloo")
out = {}
for name, tp, pp, moe, fp8 in LAYOUTS:
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_tensor_parallel_size=1, create_gloo_process_groups=False)  # as the trainer
    out[name] = make_used_communicators(torch.device("cpu"), moe=moe, fp8=fp8)
    ps.destroy_model_parallel()
if dist.get_rank() == 0:
    print("GROUPS " + json.dumps(out))
dist.destroy_process_group()
'''


def _planned(tp: int, pp: int, moe: bool, fp8: bool) -> int:
    from primus_contract.plan.memory import lazy_communicators
    from primus_contract.plan.shapes import Layout

    lay = Layout(tp=tp, pp=pp, ep=1, dp=2 // (tp * pp), sp=False, world=2, mbs=1, gbs=2, seq=64)
    t = {"parallelism": {"context": 1}, "model": {"num_moe_experts": 4 if moe else None},
         "precision": {"fp8": "hybrid" if fp8 else None}}
    return 1 + lazy_communicators(lay, t) - 2 * (pp > 1)  # + the world's, the first; - the point-to-point pairs


def test_the_used_groups_are_walked_and_planned(tmp_path):
    script = tmp_path / "groups.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("GROUPS "))
    got = json.loads(line[len("GROUPS "):])
    assert got == {
        "dp2": ["world", "get_data_parallel_group"],
        "dp2-fp8": ["world", "get_data_parallel_group", "get_amax_reduction_group"],
        "tp2-fp8": ["world", "get_model_parallel_group", "get_tensor_model_parallel_group",
                    "get_amax_reduction_group"],
        # the experts' gradient sums and the pipeline's loss all-reduce were made at the first step (audit, 2026-12-06)
        "dp2-moe": ["world", "get_data_parallel_group", "get_expert_data_parallel_group"],
        "pp2": ["world", "get_model_parallel_group", "get_expert_tensor_model_pipeline_parallel_group",
                "get_pipeline_model_parallel_group"],
    }, got
    for name, tp, pp, moe, fp8 in LAYOUTS:
        assert _planned(tp, pp, moe, fp8) == len(got[name]), name
