"""A tiny job for the Slurm/local executor tests, run by torchrun as `-m primus_testjob` (cluster.entrypoint).

Every rank joins a gloo process group and all-reduces its rank+1; rank 0 checks the sum and writes a
trainer log in the contract format (docs/contract.md §3) so `status` and `logs` have something real to
parse. PRIMUS_TEST_MODE (through cluster.env) picks the ending: `ok`, `fail:<code>`, `sleep:<seconds>`,
`nan` (a diverged line).
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


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
    log = None
    if rank == 0:
        folder = os.path.join(args.run_dir, "logs", "rank-0")
        os.makedirs(folder, exist_ok=True)
        log = open(os.path.join(folder, "debug.log" if attempt == 0 else f"debug.attempt-{attempt}.log"),
                   "a", buffering=1)

    def line(text: str) -> None:
        if log:
            log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")
        print(text, flush=True)

    line(f"primus-trainer start | attempt {attempt} | world_size {world} | device cpu | resumed_from none")
    line(f"arg experiment.mode = {mode}")  # the real trainer logs every resolved setting so
    line(f"allreduce | sum {value.item():g} | expected {expected:g} | nodes {','.join(gathered)}")
    if value.item() != expected:
        return 4
    total = 4
    for it in range(1, total + 1):
        loss = float("nan") if (mode == "nan" and it == total) else 2.0 / it
        line(f"iteration {it}/{total} | lm loss {loss:.6E} | lr 1.000000E-04 | grad norm 1.000E-01 | "
             f"tokens/s/GPU {100.0 * it:.1f} | TFLOP/s/GPU 0.01 | mem alloc GiB 0.10 | mem peak GiB 0.20 | "
             f"ms/iter 50.0")
        if mode.startswith("sleep:"):
            time.sleep(float(mode.split(":", 1)[1]) / total)
    if mode == "nan":
        line(f"diverged | iteration {total} | lm loss nan")
    line("checkpoint saved | iteration 4 | path checkpoints/iter_0000004")
    code = int(mode.split(":", 1)[1]) if mode.startswith("fail:") else 0
    dist.barrier()
    dist.destroy_process_group()
    line(f"training finished | iterations {total} | exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
