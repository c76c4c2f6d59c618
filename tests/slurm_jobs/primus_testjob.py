"""A tiny job for the Slurm/local executor tests, run by torchrun as `-m primus_testjob` (cluster.entrypoint).

Every rank joins a gloo process group and all-reduces its rank+1; rank 0 checks the sum and writes a
trainer log in the contract format (docs/contract.md §3) so `status` and `logs` have something real to
parse, and the same events to the event stream (primus_contract/run_files.py) that the job script's requeue
decision and `status` read. PRIMUS_TEST_MODE (through cluster.env) picks the ending: `ok`, `fail:<code>`, `sleep:<seconds>`,
`nan` (a diverged line).
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist

from primus_contract import run_files


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    mode = os.environ.get("PRIMUS_TEST_MODE", "ok")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    gathered = [None] * world
    dist.all_gather_object(gathered, node)
    expected = world * (world + 1) / 2
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    log = events = None
    if rank == 0:
        folder = run_files.rank_dir(args.run_dir)
        os.makedirs(folder, exist_ok=True)
        log = open(folder / run_files.log_name(attempt), "a", buffering=1)
        events = open(folder / run_files.events_name(attempt), "a", buffering=1)

    def line(text: str, kind: str | None = None, **fields) -> None:
        if log:
            log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")
            if kind:
                events.write(run_files.event_line(kind, **fields) + "\n")
        print(text, flush=True)

    line(f"primus-trainer start | attempt {attempt} | world_size {world} | device cpu | resumed_from none", "start",
         attempt=attempt, world_size=world, device="cpu", resumed_from=None)
    line(f"arg experiment.mode = {mode}")  # the real trainer logs every resolved setting so
    line(f"allreduce | sum {value.item():g} | expected {expected:g} | nodes {','.join(gathered)}")
    if value.item() != expected:
        return 4
    total = 4
    for it in range(1, total + 1):
        loss = float("nan") if (mode == "nan" and it == total) else 2.0 / it
        line(f"iteration {it}/{total} | lm loss {loss:.6E} | lr 1.000000E-04 | grad norm 1.000E-01 | "
             f"tokens/s/GPU {100.0 * it:.1f} | TFLOP/s/GPU 0.01 | mem alloc GiB 0.10 | mem peak GiB 0.20 | "
             f"ms/iter 50.0", "metrics", iteration=it, train_iters=total, lm_loss=loss, lr=1e-4, grad_norm=0.1,
             tokens_per_s_gpu=100.0 * it, tflops_gpu=0.01, mem_alloc_gib=0.1, mem_peak_gib=0.2, ms_per_iter=50.0)
        if mode.startswith("sleep:"):
            time.sleep(float(mode.split(":", 1)[1]) / total)
    if mode == "nan":
        line(f"diverged | iteration {total} | lm loss nan", "diverged", iteration=total, lm_loss=float("nan"))
    line("checkpoint saved | iteration 4 | path checkpoints/iter_0000004", "checkpoint", iteration=4,
         path="checkpoints/iter_0000004")
    code = int(mode.split(":", 1)[1]) if mode.startswith("fail:") else 0
    dist.barrier()
    dist.destroy_process_group()
    line(f"training finished | iterations {total} | exit {code}", "outcome", status="training finished", exit=code,
         message=f"iterations {total}")
    return code


if __name__ == "__main__":
    from trainer.runtime.signals import exit_process

    exit_process(main())  # as the trainer exits: without the interpreter's finalization, ~0.4 s less
