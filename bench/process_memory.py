"""Where a process's GPU memory outside PyTorch's allocator comes from: one JSON line per stage.

On the H100 on 2026-12-05 every trainer process of the lifecycle suite held ~8.9 GiB by NVML's count while PyTorch
had allocated 0.35 GiB at peak (the tiny model; the 8B process: 34.4 GiB in use, 25.5 GiB of it PyTorch's). Seven
such processes left the 8B shape no room on the 79 GiB card. This script walks the stages a trainer goes through,
alone on the GPU, and prints after each: the device's used memory (total - free, so: run it alone), PyTorch's
reserved memory, and their difference (what the stage added outside the allocator).

    python3 bench/process_memory.py [--no-te] [--trainer]   # ~20 s (+40 s) on an H100/H200; JSON lines

Stages: CUDA context; import transformer_engine.pytorch; a te.Linear forward/backward in BF16 (cuBLASLt workspace);
the same under FP8 delayed scaling; TE's fused attention in THD (cuDNN); one LoRA Triton kernel of ours; a NCCL
process group of one rank and an all-reduce. Nothing here is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

GIB = 2**30


def device_used_gib() -> float:
    """The whole GPU's used memory (cudaMemGetInfo), every process's, in GiB."""
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def _row(stage: str, base: float, **extra) -> dict:
    used, reserved = device_used_gib(), torch.cuda.memory_reserved() / GIB
    return {"stage": stage, "device_used_gib": round(used, 3), "torch_reserved_gib": round(reserved, 3),
            "outside_torch_gib": round(used - reserved - base, 3), **extra}


def _te_linear(fp8: bool) -> None:
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling

    layer = te.Linear(4096, 4096, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ctx = te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling()) if fp8 else torch.autocast("cuda", enabled=False)
    with ctx:
        y = layer(x)
    y.float().sum().backward()
    torch.cuda.synchronize()


def _attention() -> None:
    import transformer_engine.pytorch as te

    heads, dim, docs = 8, 128, [1000, 3000, 4192]
    attn = te.DotProductAttention(heads, dim, attn_mask_type="padding_causal", qkv_format="thd")
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(docs), heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(docs), max_seqlen_kv=max(docs))
    out.float().sum().backward()
    torch.cuda.synchronize()


def _lora_kernel() -> None:
    from trainer.model.lora import kernels

    dy = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 16, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(8192, 16, device="cuda", dtype=torch.bfloat16)
    kernels.dual_grad(dy, b, h, 2.0, kernels=kernels.kernels_usable(dy.device))  # dy read once (Triton)
    torch.cuda.synchronize()


def _nccl(eager: bool = True) -> torch.Tensor:
    """A world of one on GPU 0 and one all-reduce; eager: bound to the GPU (device_id), as the trainer does with
    trainer.distributed.nccl_eager_init true. Returns the reduced tensor."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, **({"device_id": torch.device("cuda", 0)} if eager else {}))
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-te", action="store_true", help="skip the Transformer Engine stages")
    parser.add_argument("--trainer", action="store_true", help="then the real trainer alone (~40 s): its summary's "
                        "GPU used minus PyTorch reserved, less this process's")
    args = parser.parse_args()
    env = {k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_NVLS_ENABLE",
                                          "CUBLAS_WORKSPACE_CONFIG", "CUDA_DEVICE_MAX_CONNECTIONS")}
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device: this probe measures GPU memory"}))
        return 2
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    before = (total - free) / GIB  # other processes (there should be none)
    rows = [_row("cuda context", before, torch=torch.__version__, gpu=torch.cuda.get_device_name(), env=env)]
    stages = [] if args.no_te else [("import transformer_engine.pytorch", lambda: __import__(
        "transformer_engine.pytorch")), ("te.Linear bf16 fwd+bwd", lambda: _te_linear(False)),
        ("te.Linear fp8 delayed fwd+bwd", lambda: _te_linear(True)), ("TE attention thd fwd+bwd", _attention)]
    stages += [("LoRA Triton kernel (dual_grad)", _lora_kernel), ("nccl 1 rank + all_reduce", _nccl)]
    for name, stage in stages:
        try:
            stage()
            rows.append(_row(name, before))
        except Exception as err:  # noqa: BLE001  (a stage that cannot run here: say so and go on)
            rows.append({"stage": name, "error": f"{type(err).__name__}: {str(err)[:300]}"})
    if args.trainer:
        rows.append(_trainer_row(rows[-1].get("device_used_gib", before)))
    for row in rows:
        print(json.dumps(row))
    return 0


def _trainer_row(held: float, extra_sets: tuple = (), extra_env: dict | None = None,
                 label: str = "trainer (compare_realtext, 20 iterations)") -> dict:
    """The real trainer alone beside this process: recipes/compare_realtext.yaml on the GPU, 20 iterations, local
    executor; its summary event's GPU used minus PyTorch reserved, less what this process holds (`held`).
    extra_sets / extra_env: the variant (bench/nccl_groups_memory.py --trainer)."""
    import subprocess
    import tempfile

    from primus_contract import run_files

    root = Path(__file__).resolve().parents[1]
    tmp = tempfile.mkdtemp(prefix="process-memory-")
    sets = ["trainer.distributed.device=cuda", "trainer.distributed.backend=nccl", "cluster.env_profile=h200",
            f"cluster.python={sys.executable}", "trainer.schedule.train_iters=20", f"experiment.workspace={tmp}",
            *extra_sets]
    cmd = [sys.executable, "-m", "primus_slurm", "submit", str(root / "recipes" / "compare_realtext.yaml"),
           "--executor", "local", "--follow", *[a for x in sets for a in ("--set", x)]]
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=f"{tmp}/state", HF_HUB_OFFLINE="1", **(extra_env or {}))
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env, timeout=400)
    events = [e for p in Path(tmp).rglob("events.jsonl") for e in run_files.read_events(p)]
    summary = next((e for e in events if e.get("event") == "summary"), None)
    if not summary or "mem_device_used_gib" not in summary:
        return {"stage": label, "error": (done.stderr or done.stdout)[-600:]}
    outside = summary["mem_device_used_gib"] - summary["mem_reserved_gib"] - held
    return {"stage": label, "device_used_gib": summary["mem_device_used_gib"],
            "torch_reserved_gib": round(summary["mem_reserved_gib"], 3), "outside_torch_gib": round(outside, 3),
            "mem_peak_gib": summary.get("mem_peak_gib")}


if __name__ == "__main__":
    sys.exit(main())
