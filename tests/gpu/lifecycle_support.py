"""What the GPU lifecycle suite (tests/gpu/test_lifecycle.py) drives: the real CLI (`python -m primus_slurm`, as on
the device machine, where nothing is pip-installed), local-executor runs of the real-text recipe, and the run
directories' event streams.

The device is CUDA when there is one. `PRIMUS_LIFECYCLE_ON_CPU=1` runs the same suite on the CPU (FP8 and the 8B
shape skipped) so that its own logic is proven before device time is spent on it; without either it is skipped.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import conftest  # tests/conftest.py (pytest puts tests/ on sys.path)

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "compare_realtext.yaml"
BASE = ROOT / "recipes" / "data" / "realtext" / "base"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "DIVERGED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}
# long enough that a cancel after the first checkpoint (iteration 20) lands mid-run: on an H200 the tiny model
# steps in tens of milliseconds; on the CPU it takes 0.1-1.5 s a step
ITERS, SAVE_EVERY = (300 if os.environ.get("PRIMUS_LIFECYCLE_ON_CPU") != "1" else 120), 20


def device() -> str | None:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if os.environ.get("PRIMUS_LIFECYCLE_ON_CPU") == "1" else None


def precisions(dev: str) -> tuple[str, ...]:
    return ("bf16", "fp8") if dev == "cuda" else ("fp32",)


def precision_sets(precision: str) -> list[str]:
    return {"bf16": ["trainer.precision.bf16=true", "trainer.precision.fp8=null"],
            "fp8": ["trainer.precision.bf16=true", "trainer.precision.fp8=hybrid"],
            "fp32": ["trainer.precision.bf16=false"]}[precision]


def device_sets(dev: str, tmp: Path) -> list[str]:
    """Every run's overrides: the device, deterministic kernels (so a resume can be compared bit for bit), this
    interpreter for the job, a short schedule with a checkpoint and an eval every SAVE_EVERY iterations (each resume
    then starts from a checkpoint whose iteration also ran an eval: under FP8 delayed scaling the eval's amaxes must
    be in the checkpoint, audit 2026-12-06), and LoRA pre-dropout
    (0.1, as the MLPerf recipes): a resume must restore every generator to continue bit for bit, and on the GPU the
    default fused path then runs its masked Triton kernel."""
    sets = [f"cluster.python={sys.executable}", f"trainer.data.cache_dir={tmp / 'cache'}", "trainer.lora.dropout=0.1",
            f"trainer.schedule.train_iters={ITERS}", f"trainer.checkpoint.save_interval={SAVE_EVERY}",
            f"trainer.schedule.eval_interval={SAVE_EVERY}", "trainer.schedule.eval_iters=4",
            "cluster.env.CUBLAS_WORKSPACE_CONFIG=:4096:8", "cluster.env.NVTE_ALLOW_NONDETERMINISTIC_ALGO=0"]
    if dev == "cuda":
        return sets + ["trainer.distributed.device=cuda", "trainer.distributed.backend=nccl",
                       "cluster.env_profile=h200"]
    return sets + ["trainer.distributed.device=cpu", "cluster.env.OMP_NUM_THREADS=1"]


def one_document_fp8_sets(tmp: Path) -> list[str]:
    """A quickstart run (20 iterations, an eval at the end) in FP8 delayed on packed data whose every row is one
    document, head dim 128 (one head), on a random base of that shape: precision.fp8_dot_product_attention null turns
    on from the data there (trainer.precision.follow_data). Data: 64 train packs, 8 validation packs (one batch)."""
    from trainer.data.mlperf import write_single_documents

    data = tmp / "one-document-rows"
    write_single_documents(str(data), 64, 256, 512, seed=3)
    return [f"cluster.python={sys.executable}", "cluster.env_profile=h200", "trainer.distributed.device=cuda",
            "trainer.distributed.backend=nccl", "trainer.model.num_attention_heads=1",
            "trainer.model.num_query_groups=1", "trainer.checkpoint.pretrained=null", "trainer.precision.bf16=true",
            "trainer.precision.fp8=hybrid", "trainer.data.format=mlperf_npy", f"trainer.data.train.path={data}",
            f"trainer.data.validation.path={data}", f"trainer.data.cache_dir={tmp / 'cache'}",
            "trainer.schedule.train_iters=20", "trainer.schedule.eval_interval=20", "trainer.schedule.eval_iters=1",
            "trainer.checkpoint.save_interval=20"]


def env_for(tmp: Path) -> dict:
    return dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp / "state"), PRIMUS_WORKSPACE=str(tmp / "ws"),
                HF_HUB_OFFLINE="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def cli(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return conftest.cli(env, *args, timeout=timeout)  # (`python -m primus_slurm` where it is not installed)


def ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, (out.args[len(conftest.CLI_ARGS):], out.stdout[-3000:], out.stderr[-3000:])
    return out.stdout


def submit(env: dict, *sets: str, recipe: Path = RECIPE, then: tuple = ()) -> dict:
    args = [a for s in sets for a in ("--set", s)] + [a for step in then for a in ("--then", step)]
    return json.loads(ok(cli(env, "submit", str(recipe), "--executor", "local", "--json", *args)))


status = conftest.status_json  # `status RUN --json`


# Set when the suite is stopped (its deadline's SIGINT): every wait of the fixture's threads ends at once, so that
# pytest can write its JSON before `timeout` kills it.
STOP = threading.Event()


def pause(seconds: float) -> None:
    if STOP.wait(seconds):
        raise AssertionError("the suite was stopped (deadline)")


def wait_state(env: dict, run: str, states=TERMINAL, timeout: float = 600) -> dict:
    return conftest.wait_state(env, run, states, timeout=timeout, every=1.0, pause=pause)


def wait_pipeline(env: dict, run: str) -> dict:
    """The run's status once its training and every step after it (`--then`) have ended."""
    row = wait_state(env, run, timeout=900)
    end = time.monotonic() + 600
    while not (row["pipeline"] and all(s["state"] in TERMINAL for s in row["pipeline"])):
        assert time.monotonic() < end, row
        pause(1)
        row = status(env, run)
    return row


def events(run_dir: Path) -> list[list[dict]]:
    """Each attempt's rank-0 event stream, oldest first (what `status` reads)."""
    from primus_slurm.experiments.cost import attempt_events

    return attempt_events(run_dir)


def losses(run_dir: Path) -> dict[int, float]:
    """{iteration: lm loss} over every attempt (a later attempt's value for an iteration wins)."""
    out: dict[int, float] = {}
    for attempt in events(run_dir):
        for e in attempt:
            if e.get("event") == "metrics":
                out.update({int(it): float(v) for it, v in e.get("losses") or ()})
    return out


def logged_eval(run_dir: Path, iteration: int) -> float:
    found = [e["eval_loss"] for a in events(run_dir) for e in a if e.get("event") == "eval"
             and e.get("iteration") == iteration]
    assert found, f"no eval at iteration {iteration} in {run_dir}"
    return float(found[-1])


def gpu_total_gib() -> float:
    """GPU 0's memory: from nvidia-smi where it is (no CUDA context in pytest's own process), else from torch."""
    cmd = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"]
    try:
        return float(subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.split()[0]) / 1024
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 2**30


def wait_checkpoint(run_dir: Path, timeout: float = 600) -> int:
    """The iteration of the run's first checkpoint event, once it is there. A run that ended without one fails at
    once with its outcome (on the H100 on 2026-12-05 the 8B shape died of OOM at its start, and this wait, blind to
    that, held the suite for its whole timeout)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        stream = [e for a in events(run_dir) for e in a]
        saved = [e["iteration"] for e in stream if e.get("event") == "checkpoint"]
        if saved:
            return int(saved[0])
        ended = [e for e in stream if e.get("event") == "outcome"]
        if ended:
            raise AssertionError(f"{run_dir.name} ended before its first checkpoint: {ended[-1].get('status')}, "
                                 f"exit {ended[-1].get('exit')}: {str(ended[-1].get('message'))[:600]}")
        if (run_dir / "exit_code").is_file():  # the job ended with no outcome (an import error, a kill)
            raise AssertionError(f"{run_dir.name} ended before its first checkpoint, exit "
                                 f"{(run_dir / 'exit_code').read_text().strip()}, no outcome event")
        pause(0.2)
    raise AssertionError(f"no checkpoint in {run_dir} after {timeout} s")


def job_script_pid(run_dir: Path) -> int:
    """The pid of `bash job.sbatch` under the local executor's wrapper: where Slurm's --signal=B:SIG@T lands."""
    wrapper = json.loads((run_dir / "run.json").read_text())["pid"]
    for child in Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split():
        if "job.sbatch" in Path(f"/proc/{child}/cmdline").read_text():
            return int(child)
    raise AssertionError(f"no job.sbatch under the wrapper {wrapper}")


def warn_time_limit(run_dir: Path, sig: str = "USR2") -> None:
    os.kill(job_script_pid(run_dir), getattr(signal, f"SIG{sig}"))


def compare(got: dict[int, float], want: dict[int, float], first: int) -> dict:
    """How the resumed run's losses from iteration `first` on match the uninterrupted run's."""
    its = sorted(i for i in want if i >= first)
    missing = [i for i in its if i not in got]
    diffs = [abs(got[i] - want[i]) for i in its if i in got]
    differ = [i for i in its if i in got and got[i] != want[i]]  # where the runs part: the first resumed step or later
    return {"from_iteration": first, "iterations": len(its), "missing": missing[:5],
            "max_abs_diff": max(diffs) if diffs else None, "bitwise": bool(diffs) and max(diffs) == 0.0,
            "first_differing": differ[0] if differ else None,
            "first_diff": abs(got[differ[0]] - want[differ[0]]) if differ else None}
