"""docker against podman on the same image, through the real job script on the local Slurm cluster: the same small
quickstart run (the test suite's SMALL settings) is submitted with `runtime: podman` and `runtime: docker`, in turns,
ROUNDS times each; each job's ms/iter comes from its `training summary` line, and the CPU time podman's API service
(the docker CLI's server here) spent during each job from /proc. Prints one JSON object.

    python bench/container_runtimes.py [--rounds 3] [--iters 200]

Needs root, scripts/local-slurm.sh up and scripts/container-image.sh (it prints the image tag this uses).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "primus-slurm"
SERVICE_PID = Path(os.environ.get("PRIMUS_CONTAINER_STATE", "/var/tmp/primus-container")) / "podman-service.pid"
DATA = ROOT / "recipes" / "data"
SMALL = ["trainer.data.seq_length=64", "trainer.data.train.limit=96", "trainer.data.validation.limit=16",
         "trainer.schedule.micro_batch_size=2", "trainer.schedule.global_batch_size=4",
         "trainer.schedule.warmup_iters=2", "trainer.schedule.eval_interval=null",
         "trainer.checkpoint.save_interval=null", "trainer.checkpoint.export_peft=false",
         "trainer.logging.log_interval=10"]


def service_cpu_s() -> float:
    """User + system CPU seconds of podman's API service so far."""
    pid = SERVICE_PID.read_text().strip()
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def recipe(work: Path, runtime: str, image: str) -> Path:
    body = {"extends": str(ROOT / "recipes" / "quickstart.yaml"),
            "experiment": {"name": f"bench-{runtime}", "workspace": str(work / "ws")},
            "cluster": {"executor": "slurm", "nodes": 1, "nproc_per_node": 1, "exclusive": False, "time": "00:10:00",
                        "python": "python3", "env": {"OMP_NUM_THREADS": "1"}, "extra_sbatch": ["--nodelist=node1"],
                        "container": {"runtime": runtime, "image": image, "mounts": [f"{DATA}:{DATA}:ro"]}}}
    path = work / f"{runtime}.yaml"
    path.write_text(json.dumps(body))
    return path


def one_job(env: dict, path: Path, iters: int) -> dict:
    sets = [a for s in [*SMALL, f"trainer.schedule.train_iters={iters}"] for a in ("--set", s)]
    cpu0, t0 = service_cpu_s(), time.monotonic()
    out = subprocess.run([str(CLI), "submit", str(path), *sets, "--follow"], env=env, capture_output=True, text=True,
                         timeout=900)
    wall, cpu = time.monotonic() - t0, service_cpu_s() - cpu0
    summary = [ln for ln in out.stdout.splitlines() if "] training summary |" in ln]
    if out.returncode != 0 or not summary:
        raise SystemExit(f"job failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    ms = float(summary[-1].split("| ms/iter ")[1].split()[0])
    return {"ms_per_iter": ms, "job_wall_s": round(wall, 1), "service_cpu_s": round(cpu, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    image = subprocess.run([str(ROOT / "scripts" / "container-image.sh"), "tag"], capture_output=True, text=True,
                           check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="primus-bench-rt-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(work / "state"))
        runs: dict[str, list[dict]] = {"podman": [], "docker": []}
        for _ in range(args.rounds):
            for runtime in runs:  # in turns: a load change on the machine hits both alike
                runs[runtime].append(one_job(env, recipe(work, runtime, image), args.iters))
    median = {rt: statistics.median(r["ms_per_iter"] for r in rows) for rt, rows in runs.items()}
    print(json.dumps({"image": image, "iters": args.iters, "rounds": args.rounds,
                      "median_ms_per_iter": median, "docker_over_podman": round(median["docker"] / median["podman"], 3),
                      "runs": runs, "load_avg_after": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
