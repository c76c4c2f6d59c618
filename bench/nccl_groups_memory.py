"""Device memory per NCCL process group in one process (world size 1): what megatron's many groups cost.

The trainer's process held ~8.9 GiB outside PyTorch's allocator on an H100 (bench/process_memory.py, 2026-12-05),
while one NCCL rank with one all-reduce held ~0.55 GiB. megatron's initialize_model_parallel makes 20 groups at
world size 1 (counted on CPU, megatron-core 0.16.1); with init_process_group(device_id=...) torch creates each NCCL
communicator eagerly. This walks that: device used (cudaMemGetInfo, the whole GPU) after init and after each new
group, eager (device_id) or lazy (an all-reduce per group), under the NCCL environment given. One JSON line a
variant.

    python3 bench/nccl_groups_memory.py [--groups 20]     # ~10 s a variant on an H100
    python3 bench/nccl_groups_memory.py --trainer         # + the real trainer (~40 s a variant, needs the stack):
                                                          #   nccl_eager_init true / false, eager + split-share
                                                          # (H100, 2026-12-05: 189 s in all; the results are in
                                                          #  bench/results/2026-12-05c_h100_levers/nccl_groups.jsonl)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

VARIANTS = {
    "eager": {},
    "lazy": {"PRIMUS_PROBE_LAZY": "1"},
    "eager-split-share": {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"},  # split children share the parent's buffers
    "eager-nvls0-cumem0": {"NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"},
    "eager-buffsize-1m-nchannels-2": {"NCCL_BUFFSIZE": "1048576", "NCCL_MAX_NCHANNELS": "2"},
}

# the real trainer (bench/process_memory.py's row, alone on the GPU): recipe --set lines and environment
EAGER = ("trainer.distributed.nccl_eager_init=true",)
TRAINER_VARIANTS = {  # the key is set both ways: its default went from true to false on 2026-12-05 (by these rows)
    "nccl_eager_init true": (EAGER, {}),
    "nccl_eager_init false": (("trainer.distributed.nccl_eager_init=false",), {}),
    "eager, split-share": (EAGER, {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}),
}


def child(groups: int) -> dict:
    import torch
    import torch.distributed as dist
    from process_memory import _nccl, device_used_gib

    torch.cuda.set_device(0)
    used = lambda: round(device_used_gib(), 3)  # noqa: E731
    steps = {"cuda context": used()}
    x = _nccl(eager=not os.environ.get("PRIMUS_PROBE_LAZY"))
    steps["world + all_reduce"] = used()
    for i in range(groups):
        dist.all_reduce(x, group=dist.new_group([0]))
        torch.cuda.synchronize()
        steps[f"group {i + 1}"] = used()
    dist.destroy_process_group()
    first, last = steps["world + all_reduce"], list(steps.values())[-1]
    return {"steps": steps, "per_group_gib": round((last - first) / max(groups, 1), 3),
            "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "gpu": torch.cuda.get_device_name()}


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/process_memory.py's measurements
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--trainer", action="store_true", help="then the trainer under each TRAINER_VARIANTS entry")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.groups)))
        return
    for name, env in VARIANTS.items():
        done = subprocess.run([sys.executable, __file__, "--child", "--groups", str(a.groups)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, **env})
        row = {"variant": name, "env": env}
        try:
            row.update(json.loads(done.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            row["error"] = (done.stderr or done.stdout)[-800:]
        print(json.dumps(row), flush=True)
    if a.trainer:
        from process_memory import _trainer_row

        for name, (sets, env) in TRAINER_VARIANTS.items():
            print(json.dumps({"variant": f"trainer {name}", **_trainer_row(0.0, sets, env, f"trainer {name}")}),
                  flush=True)


if __name__ == "__main__":
    main()
