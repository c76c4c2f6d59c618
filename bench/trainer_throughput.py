"""Throughput of OUR trainer (the real `python -m trainer` under torchrun) on a recipe, on synthetic data.

Resolves the recipe (+ --set overrides) exactly as `submit` does, writes MLPerf-format packed data with
either realistic document lengths (`--docs packed`) or one document per sequence (`--docs single`, the
like-for-like peer of bench/hf_peft_baseline.py), runs the trainer and reads its rank-0 log. Prints JSON.

    python bench/trainer_throughput.py --recipe bench/recipes/llama3_8b_h200.yaml --docs single --nproc 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from primus_slurm.jobs.progress import read_progress  # noqa: E402
from primus_slurm.config.recipe import dump, load_recipe  # noqa: E402
from primus_slurm.config.render import job_env  # noqa: E402
from trainer.data.mlperf import write_single_documents, write_synthetic  # noqa: E402


def first_line(lines: list, kind: str) -> str:
    """The first '<kind> | ...' line of a rank-0 log, without its prefix ('' if none)."""
    return next((ln.split("] ", 1)[1] for ln in lines if f"] {kind} |" in ln), "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--docs", choices=["packed", "single"], default="packed")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--label", default=None)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--timeout", type=int, default=540)
    ap.add_argument("--no-job-env", action="store_true",
                    help="run without the recipe's env profile / cluster.env (A/B of the profile itself)")
    ap.add_argument("--profile", default=None, metavar="A-B",
                    help="profile iterations A..B (trainer.logging.profile_*) and copy the summary to --profile-out")
    ap.add_argument("--profile-out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-"))
    r0 = load_recipe(args.recipe, args.overrides, env={})
    t = r0.resolved["trainer"]
    seq, vocab = t["data"]["seq_length"], t["model"]["vocab_size"]
    iters, gbs = t["schedule"]["train_iters"], t["schedule"]["global_batch_size"]
    n_packs = iters * gbs + 8
    # keyed by everything the data depends on: a model must never read another vocabulary's token ids
    data = work / f"data-{args.docs}-{seq}-v{vocab}-n{n_packs}"
    if not (data / "train.npy").exists():
        if args.docs == "single":
            write_single_documents(str(data), n_packs, seq, vocab, seed=1)
        else:
            write_synthetic(str(data), n_packs, seq, vocab, seed=1)
    if args.profile:
        a, _, b = args.profile.partition("-")
        args.overrides += [f"trainer.logging.profile_start={int(a)}", f"trainer.logging.profile_end={int(b or a)}"]
    overrides = [*args.overrides, "trainer.data.format=mlperf_npy", f"trainer.data.train.path={data}",
                 f"experiment.workspace={work}", f"cluster.nproc_per_node={args.nproc}"]
    r = load_recipe(args.recipe, overrides, env={})
    run_dir = work / f"run-{int(time.time() * 1000)}"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "recipe.resolved.yaml").write_text(dump(r.resolved))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "trainer", "--config", str(run_dir / "recipe.resolved.yaml"), "--run-dir", str(run_dir)]
    # the variables a submitted job exports (env profile + cluster.env); this process's own environment
    # wins, so `VAR=x python3 bench/...` A/B-tests one of them (and the device's multicast-off settings stay)
    job = {} if args.no_job_env else {k: str(v) for k, v in job_env(r.resolved).items()}
    env = {**job, **os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        text = proc.stdout + proc.stderr
        first_tb = text.find("Traceback (most recent call last)")  # the trainer's own, before torchrun's
        rc, tail = proc.returncode, (text[first_tb:first_tb + 3000] if first_tb >= 0 else text[-3000:])
    except subprocess.TimeoutExpired as exc:
        rc, tail = 124, str(exc.stdout or "")[-1500:] + str(exc.stderr or "")[-1500:]
    p = read_progress(run_dir)
    log = run_dir / "logs/rank-0/debug.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    precision_line, weights_line = (first_line(lines, kind) for kind in ("precision", "fp8_param"))
    result = {
        "bench": "trainer_throughput", "label": args.label, "recipe": args.recipe, "overrides": args.overrides,
        "docs": args.docs, "nproc": args.nproc, "seq": seq, "global_batch_size": gbs, "iters": iters,
        "rc": rc, "wall_s": round(time.time() - t0, 1), "iteration": p.iteration, "lm_loss": p.lm_loss,
        "tokens_per_s_per_gpu": p.tokens_per_s_gpu, "tflops_per_gpu": p.tflops_gpu, "peak_mem_gib": p.mem_peak_gib,
        "ms_per_iter": p.ms_per_iter, "precision": precision_line,
        "weights": weights_line,
        "job_env": {k: env[k] for k in sorted(job)},
    }
    if rc != 0:
        result["tail"] = tail
        if log.exists():
            result["log_tail"] = log.read_text(errors="replace")[-1500:]
    for name, key in (("summary.txt", "profile"), ("saved_tensors.txt", "saved_tensors")):
        src = run_dir / "profile" / "rank-0" / name
        if args.profile and src.exists():
            dest = Path(args.profile_out) / f"{key.replace('_', '-')}-{args.label or 'run'}.txt"
            dest.write_text(src.read_text())
            result[key] = str(dest)
    print(json.dumps(result), flush=True)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
