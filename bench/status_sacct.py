#!/usr/bin/env python
"""Cost of `primus-slurm status` over many registry entries: it must make ONE sacct call.

Submits N real runs (held, so they stay PENDING and cost no CPU) to the local Slurm cluster through the
normal submit path, then runs `primus-slurm status --json` with a PATH shim in front of sacct/squeue
that counts invocations. Prints JSON; cancels the jobs afterwards. Needs scripts/local-slurm.sh up.

    .venv/bin/python bench/status_sacct.py [--runs 200]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "primus-slurm"
SHIM = """#!/bin/sh
echo "$0 $*" >> "{log}"
exec {real} "$@"
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    if not shutil.which("sbatch"):
        print(json.dumps({"error": "sbatch not on PATH; run scripts/local-slurm.sh up"}))
        return 2
    work = Path(tempfile.mkdtemp(prefix="primus-bench-"))
    os.environ["PRIMUS_SLURM_STATE_DIR"] = str(work / "state")
    sys.path.insert(0, str(ROOT))
    from primus_slurm.jobs import registry, submit

    recipe = work / "bench.yaml"
    recipe.write_text(json.dumps({
        "extends": str(ROOT / "recipes" / "quickstart.yaml"),
        "experiment": {"name": "bench", "workspace": str(work / "ws")},
        "cluster": {"executor": "slurm", "nodes": 1, "nproc_per_node": 1, "exclusive": False,
                    "time": "00:05:00", "signal_grace_s": 10, "extra_sbatch": ["--hold"]},
    }))
    t0 = time.perf_counter()
    for _ in range(args.runs):
        submit.submit(submit.prepare(str(recipe)))
    submit_s = time.perf_counter() - t0

    shim_dir, calls = work / "shim", work / "calls.log"
    shim_dir.mkdir()
    for tool in ("sacct", "squeue", "scontrol", "sinfo"):
        real = shutil.which(tool)
        (shim_dir / tool).write_text(SHIM.format(log=calls, real=real))
        (shim_dir / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{shim_dir}:{os.environ['PATH']}")

    def measure() -> dict:
        calls.unlink(missing_ok=True)
        t0 = time.perf_counter()
        out = subprocess.run([str(CLI), "status", "--json"], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        logged = calls.read_text().splitlines() if calls.exists() else []
        count = {t: sum(1 for l in logged if l.split()[0].endswith("/" + t)) for t in ("sacct", "squeue")}
        return {"status_rows": len(rows), "states": sorted({r["state"] for r in rows}),
                "state_sources": sorted({str(r["state_source"]) for r in rows}),
                "sacct_calls": count["sacct"], "squeue_calls": count["squeue"], "status_wall_s": round(wall, 3)}

    fresh = measure()  # right after submitting: slurmdbd may not have recorded every pending job yet
    ids = [e["job_id"] for e in registry.entries()]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # settle: wait until accounting knows every job
        known = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw", "-j", ",".join(ids)],
                               capture_output=True, text=True).stdout.split()
        if set(ids) <= set(known):
            break
        time.sleep(1)
    settled = measure()
    subprocess.run(["scancel", *ids], check=False)
    shutil.rmtree(work, ignore_errors=True)
    result = {"runs": args.runs, "registry_entries": len(ids),
              "submit_wall_s_per_run": round(submit_s / max(1, args.runs), 4),
              "right_after_submit": fresh, "settled": settled}
    print(json.dumps(result, indent=2))
    ok = all(m["sacct_calls"] == 1 and m["status_rows"] == args.runs for m in (fresh, settled))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
