"""The GPU lifecycle suite (issue 36): every command that reads a checkpoint, on the device it runs on. Run first in
every device session with `make gpu-test` (scripts/gpu-test.sh: pytest -m gpu tests/gpu, its JSON into
bench/results/<date>_<gpu>_lifecycle/). Marked `gpu`; skipped without CUDA (PRIMUS_LIFECYCLE_ON_CPU=1: on the CPU).

Everything starts at once in one module fixture, so the runs share the device's time (the H200 has room for all):
- a sweep over the precisions (BF16 / FP8 delayed; on the CPU two LoRA alphas) with `--then eval --then export`:
  its trials are also the uninterrupted references;
- per precision, a run cancelled after its first checkpoint and resumed;
- a run warned of its time limit (the recipe's cluster.signal to the job script, as Slurm's --signal=B:SIG@T),
  which checkpoints and stops with the preempted code, then resumes;
- on CUDA, the Llama-3-8B shape (bench/recipes/llama3_8b_h200.yaml, FP8) cancelled, resumed and exported: beside
  the others where they all fit (an H200, and an H100 since NCCL's communicators are lazy), else alone after them:
  EIGHT_B_GIB and its neighbours;
- an FP4-emulated run of the same recipe, which `compare` (with the sweep's trials) and `verify-fp4` then read;
- on CUDA, an FP8 run on packed rows of one document with `--then eval` (FP8 attention null turns on from the data);
- where `make gpu-test` started a Slurm cluster: a Slurm run warned, requeued and resumed (tests/gpu/slurm_gpu.py).
Each test records what it measured (the `record` fixture, tests/gpu/lifecycle_report.py).
"""
from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest

import lifecycle_report
import lifecycle_support as ls
import slurm_gpu

DEV = ls.device()
if DEV is None:
    pytest.skip("no CUDA device (PRIMUS_LIFECYCLE_ON_CPU=1 runs this suite on the CPU)", allow_module_level=True)
pytestmark = pytest.mark.gpu
PRECISIONS = ls.precisions(DEV)
# bitwise where the kernels are deterministic (CUBLAS_WORKSPACE_CONFIG, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0)
RESUME_TOL = {"bf16": 0.0, "fp8": 0.0, "fp32": 0.0}
EVAL_RTOL = {"bf16": 1e-5, "fp8": 1e-3, "fp32": 2e-6}  # FP8: the eval forward moves TE's amax history
R8 = ls.ROOT / "bench" / "recipes" / "llama3_8b_h200.yaml"
QUICKSTART = ls.ROOT / "recipes" / "quickstart.yaml"
# GPU memory (GiB) for the 8B shape to run beside the small runs (else alone, after them), beside up to 8 small
# processes at once (2 sweep trials or their steps, 2 cancelled runs, the warned one, the FP4 one, the Slurm one, the
# one-document FP8 run or its eval step).
# With NCCL's communicators made eagerly every process held ~8.9 GiB outside PyTorch (H100, 2026-12-05: the 8B FP8 at
# seq 4096 used 56.3 GiB by NVML, peak 47.3), and the H100 ran the 8B alone; lazily (trainer.distributed.
# nccl_eager_init false, the default since) the trainer holds 0.73 (bench/results/2026-12-05c_h100_levers/): the 8B
# ~48.2 GiB, a small run under 1.5. The bounds keep ~1 GiB of slack each for a communicator a checkpoint's collective
# might make: the H100 (79.2) and the H200 (139.8) both run it beside them.
EIGHT_B_GIB, SMALL_GIB, SMALL_AT_ONCE = 50, 2.5, 8


def _grid() -> tuple[str, list[str]]:
    if DEV == "cuda":
        return "trainer.precision.fp8=null,hybrid", ["trainer.precision.bf16=true"]
    return "trainer.lora.alpha=64,32", ls.precision_sets("fp32")  # 64 is the recipe's: trial 0 = the reference


def _eight_b(env, tmp: Path) -> dict:
    from trainer.data.mlperf import write_synthetic

    data = tmp / "data-8b"
    write_synthetic(str(data), 40, 4096, 128256, seed=1)
    return ls.submit(env, f"trainer.data.train.path={data}", f"experiment.workspace={tmp / 'ws8b'}",
                     f"cluster.python={sys.executable}", "trainer.precision.fp8=hybrid", "trainer.data.seq_length=4096",
                     "trainer.schedule.train_iters=16", "trainer.checkpoint.save_interval=2",
                     "trainer.checkpoint.resume=auto", "trainer.logging.log_interval=1", recipe=R8)


def _interrupt(env, entry: dict, how: str, timeout: float = 600):
    """Once the run's first checkpoint is there: `cancel` it, or warn it of its time limit as Slurm does (the
    schema's default cluster.signal, USR2, to the job script); once it has stopped, `resume --follow` it at once (the
    resumes run side by side: one after another, test by test, they took most of the suite's 8.4 minutes on the H200
    on 2026-12-05). Returns (the run, its status when it stopped, the resume's completed process)."""
    run_dir = Path(entry["run_dir"])
    ls.wait_checkpoint(run_dir, timeout=timeout)
    if how == "cancel":
        ls.ok(ls.cli(env, "cancel", entry["run_id"]))
    else:
        ls.warn_time_limit(run_dir, "USR2")
    row = ls.wait_state(env, entry["run_id"])
    return entry, row, ls.cli(env, "resume", entry["run_id"], "--follow", timeout=900)


def _eight_b_interrupted(env, tmp: Path):
    """The 8B shape submitted, cancelled after its first checkpoint and resumed (in a thread: a failed submit is
    this test's failure, not the fixture's)."""
    return _interrupt(env, _eight_b(env, tmp), "cancel", 900)


def _slurm_requeued(tmp: Path):
    """(the run, scontrol's record once requeued, its status at the end): tests/gpu/slurm_gpu.py."""
    entry = slurm_gpu.submit(DEV, tmp)
    return (entry, *slurm_gpu.warn_and_requeue(entry))


def _start(pool, jobs: dict, key, fn, *args) -> None:
    jobs[key] = pool.submit(fn, *args)
    jobs[key].add_done_callback(lambda f: lifecycle_report.progress(
        "/".join(key) if isinstance(key, tuple) else key,
        "done" if f.exception() is None else f"{type(f.exception()).__name__}: {str(f.exception())[:400]}"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Everything started at once; each interruption made by a thread of its own the moment its run has
    checkpointed (a test that waited its turn would find a tiny run already finished). The deadline's SIGINT stops
    every thread's waits (ls.STOP), so that pytest can still write its JSON."""
    tmp = tmp_path_factory.mktemp("lifecycle")
    env = ls.env_for(tmp)
    base = ls.device_sets(DEV, tmp)
    axis, fixed = _grid()
    # on the GPU both trials (and their eval/export steps) at once: one after another they took 4.5 of the
    # H100's minutes on 2026-12-05, the longest thread of the suite
    parallel = ["--max-parallel", "2"] if DEV == "cuda" else []
    sweep = json.loads(ls.ok(ls.cli(env, "sweep", str(ls.RECIPE), "--executor", "local", "--json", "--grid", axis,
                                    *[a for s in (*base, *fixed) for a in ("--set", s)], *parallel,
                                    "--then", "eval", "--then", "export")))
    trials = [t["run_id"] for t in sweep["trials"]]
    runs = {("cancel", p): ls.submit(env, *base, *ls.precision_sets(p)) for p in PRECISIONS}
    runs["warn", PRECISIONS[0]] = ls.submit(env, *base, *ls.precision_sets(PRECISIONS[0]))
    fp4 = ls.submit(env, *base, *fixed, "trainer.precision.fp8=null", "trainer.precision.fp4=e2m1",
                    "trainer.precision.fp4_emulation=true")
    one_doc = ls.submit(env, *ls.one_document_fp8_sets(tmp), recipe=QUICKSTART, then=("eval",)) \
        if DEV == "cuda" else None
    total = ls.gpu_total_gib() if DEV == "cuda" else 0.0
    beside = total >= EIGHT_B_GIB + SMALL_GIB * SMALL_AT_ONCE
    pool, jobs = ThreadPoolExecutor(8), {}
    try:
        for key, entry in runs.items():
            _start(pool, jobs, key, _interrupt, env, entry, key[0])
        if slurm_gpu.available():
            _start(pool, jobs, "slurm", _slurm_requeued, tmp)
        if DEV == "cuda" and beside:
            _start(pool, jobs, ("cancel", "8b"), _eight_b_interrupted, env, tmp)
        wait(jobs.values())
        if DEV == "cuda" and not beside:
            try:  # the small runs' processes gone first (their own tests report how they ended)
                _chain(env, trials)
                ls.wait_state(env, fp4["run_id"], timeout=900)
            except Exception:  # noqa: BLE001
                pass
            _start(pool, jobs, ("cancel", "8b"), _eight_b_interrupted, env, tmp)
            wait([jobs["cancel", "8b"]])
    except BaseException:  # the deadline's SIGINT (KeyboardInterrupt): no thread may hold pytest past its JSON
        ls.STOP.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=False)
    return {"env": env, "tmp": tmp, "sweep": sweep, "trials": trials, "jobs": jobs, "fp4": fp4, "one_doc": one_doc,
            "eight_b": f"{'beside the small runs' if beside else 'alone, after the small runs'} ({total:.1f} GiB)"}


def _stopped(lab, key) -> tuple[str, Path, dict]:
    """(run id, run dir, its status when it stopped); an error of the interruption or of the resume after it (the
    same thread: a resume that timed out, say) is raised here."""
    entry, row, _ = lab["jobs"][key].result()
    return entry["run_id"], Path(entry["run_dir"]), row


def _resumed(lab, key) -> str:
    """The resume's output; it must have exited 0."""
    return ls.ok(lab["jobs"][key].result()[2])


def _reference(lab, precision: str) -> Path:
    run = lab["trials"][PRECISIONS.index(precision)]
    row = ls.wait_state(lab["env"], run, timeout=900)
    assert row["state"] == "COMPLETED", row
    return Path(row["run_dir"])


def _stop_iteration(run_dir: Path) -> int:
    """The last checkpoint of the interrupted first attempt (the resume, already run, wrote later ones)."""
    from primus_contract import run_files

    (first,) = [p for p in run_files.attempt_files(run_dir, "jsonl") if run_files.attempt_of(p) == 0]
    saved = [e["iteration"] for e in run_files.read_events(first) if e.get("event") == "checkpoint"]
    return max(saved)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_cancel_then_resume_continues_the_uninterrupted_run(lab, precision, record):
    env = lab["env"]
    run, run_dir, row = _stopped(lab, ("cancel", precision))
    assert row["state"] == "CANCELLED", row
    stop = _stop_iteration(run_dir)
    assert stop < ls.ITERS, stop  # the cancel landed mid-run, after a checkpoint
    _resumed(lab, ("cancel", precision))
    row = ls.wait_state(env, run)
    assert row["state"] == "COMPLETED", row
    log = (run_dir / "logs" / "rank-0" / "debug.attempt-1.log").read_text()
    assert f"checkpoint loaded | iteration {stop} |" in log
    match = ls.compare(ls.losses(run_dir), ls.losses(_reference(lab, precision)), stop + 1)
    record(precision=precision, cancelled_at=stop, **match)
    assert not match["missing"] and match["iterations"] == ls.ITERS - stop, match
    assert match["max_abs_diff"] <= RESUME_TOL[precision], match


def test_time_limit_warning_checkpoints_and_resumes(lab, record):
    env = lab["env"]
    run, run_dir, row = _stopped(lab, ("warn", PRECISIONS[0]))
    stop = _stop_iteration(run_dir)
    assert row["exit_code"] == 75 and stop < ls.ITERS, row  # trainer/runtime/signals.py: EXIT_PREEMPTED
    assert "caught SIGUSR2" in (run_dir / "logs" / "local.out").read_text()
    _resumed(lab, ("warn", PRECISIONS[0]))
    assert ls.wait_state(env, run)["state"] == "COMPLETED"
    match = ls.compare(ls.losses(run_dir), ls.losses(_reference(lab, PRECISIONS[0])), stop + 1)
    record(stopped_at=stop, **match)  # the requeue itself: test_slurm_job_on_gres_gpu_…
    assert not match["missing"] and match["max_abs_diff"] <= RESUME_TOL[PRECISIONS[0]], match


def _chain(env, trials) -> list[dict]:
    """Each trial's status once its training and both steps have ended."""
    return [ls.wait_pipeline(env, run) for run in trials]


def test_sweep_pipeline_completes_and_eval_equals_the_logged_loss(lab, record):
    rows = _chain(lab["env"], lab["trials"])
    measured = []
    for precision, row in zip(PRECISIONS if DEV == "cuda" else ("fp32", "fp32"), rows):
        assert row["state"] == "COMPLETED" and [s["state"] for s in row["pipeline"]] == ["COMPLETED"] * 2, row
        evaluated = json.loads((Path(row["pipeline"][0]["dir"]) / "result.json").read_text())
        logged = ls.logged_eval(Path(row["run_dir"]), ls.ITERS)
        rel = abs(evaluated["eval_loss"] - logged) / logged
        measured.append({"precision": precision, "eval_loss": evaluated["eval_loss"], "logged": logged, "rel": rel})
        assert evaluated["iteration"] == ls.ITERS and rel <= EVAL_RTOL[precision], measured[-1]
        exported = json.loads((Path(row["pipeline"][1]["dir"]) / "result.json").read_text())
        assert (Path(exported["adapter"]) / "adapter_model.safetensors").is_file()
    board = json.loads(ls.ok(ls.cli(lab["env"], "status", lab["sweep"]["sweep_id"], "--json")))
    assert {t["state"] for t in board["trials"]} == {"COMPLETED"}, board
    record(evals=measured)


def test_generate_answers(lab, record):
    run = lab["trials"][0]
    _reference(lab, PRECISIONS[0])
    out = ls.ok(ls.cli(lab["env"], "generate", run, "--prompt", "Return the number of items.", "--executor",
                       "local", "--max-new-tokens", "16", timeout=600))
    result = json.loads(Path(out.strip().splitlines()[-1].split("result: ", 1)[1]).read_text())
    rows = [json.loads(x) for x in Path(result["generations"]).read_text().splitlines()]
    record(answer=rows[0]["answer"])
    assert len(rows) == 1 and rows[0]["answer"].strip(), rows


def test_adapter_and_merged_exports_load_in_peft_with_equal_logits(lab, record):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = lab["trials"][0]
    _reference(lab, PRECISIONS[0])
    out_dir = lab["tmp"] / "export"
    out_dir.mkdir()
    out = ls.ok(ls.cli(lab["env"], "export", run, "--adapter", str(out_dir / "adapter"), "--merged",
                       str(out_dir / "merged"), "--executor", "local", timeout=600))
    assert "result: " in out
    dev = torch.device(DEV)
    torch.backends.cuda.matmul.allow_tf32 = False
    ids = AutoTokenizer.from_pretrained(out_dir / "merged")(["def count(items):\n    return len(items)"],
                                                           return_tensors="pt")["input_ids"].to(dev)
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(ls.BASE, dtype=torch.float32).to(dev).eval()
        plain = base(ids).logits
        peft = PeftModel.from_pretrained(base, str(out_dir / "adapter")).eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out_dir / "merged", dtype=torch.float32).to(dev).eval()(
            ids).logits
    effect, diff = float((peft - plain).abs().max()), float((merged - peft).abs().max())
    record(adapter_effect=effect, merged_vs_peft_max_abs=diff)
    assert effect > 1e-2 and diff < 1e-3, (effect, diff)


def test_a_gpu_run_costs_its_gpu_hours(lab, record):
    _reference(lab, PRECISIONS[0])
    row = ls.status(lab["env"], lab["trials"][0])  # status --json: every run's gpu_hours, elapsed_s, tokens/GPU-hour
    cost = {k: row[k] for k in ("gpu_hours", "steps_gpu_hours", "elapsed_s", "tokens_per_gpu_hour")}
    record(**cost)
    if DEV == "cuda":
        assert cost["gpu_hours"] > 0 and cost["tokens_per_gpu_hour"], cost
        # the trial's eval step held the GPU too: counted since 2026-12-07 (the local queue's steps, as Slurm's)
        assert cost["steps_gpu_hours"] > 0, cost
        # one GPU held the whole training; elapsed_s is its seconds rounded (43.55 s of GPU time read 44 s on
        # 2026-12-06)
        assert abs((cost["gpu_hours"] - cost["steps_gpu_hours"]) * 3600 - cost["elapsed_s"]) <= 0.5 + 1e-6, cost
    else:
        assert cost["gpu_hours"] == 0 == cost["steps_gpu_hours"], cost  # a CPU run holds no GPU


def test_8b_shape_saves_resumes_and_exports(lab, record):
    if ("cancel", "8b") not in lab["jobs"]:
        pytest.skip("the 8B shape needs the GPU")
    env = lab["env"]
    run, run_dir, row = _stopped(lab, ("cancel", "8b"))
    assert row["state"] == "CANCELLED", row
    stop = _stop_iteration(run_dir)
    _resumed(lab, ("cancel", "8b"))
    assert ls.wait_state(env, run)["state"] == "COMPLETED"
    got = ls.losses(run_dir)
    log = (run_dir / "logs" / "rank-0" / "debug.attempt-1.log").read_text()
    assert f"checkpoint loaded | iteration {stop} |" in log and max(got) == 16
    assert all(math.isfinite(v) for v in got.values())
    out = ls.ok(ls.cli(env, "export", run, "--adapter", str(lab["tmp"] / "adapter-8b"), "--executor", "local",
                       timeout=600))
    from safetensors.torch import load_file

    tensors = load_file(lab["tmp"] / "adapter-8b" / "adapter_model.safetensors")
    layers = {int(k.split(".layers.", 1)[1].split(".", 1)[0]) for k in tensors if ".layers." in k}
    summary = ([e for a in ls.events(run_dir) for e in a if e.get("event") == "summary"] or [{}])[-1]
    record(stopped_at=stop, last_loss=got[16], adapter_tensors=len(tensors), export=out.strip().splitlines()[-1],
           ran=lab["eight_b"], **{k: summary.get(k) for k in ("mem_peak_gib", "mem_reserved_gib",
                                                               "mem_device_used_gib", "tokens_per_s_gpu")})
    assert layers == set(range(32)) and all(".lora_A." in k or ".lora_B." in k for k in tensors), sorted(tensors)[:4]


def test_compare_and_verify_fp4_read_the_device_runs(lab, record):
    """`compare` of the sweep's trials and the FP4-emulated run; `verify-fp4` of that run against the FP8 trial (on
    the CPU, where no FP8 ran, alone): the evidence the trainer logs on the device is there and reads as FP4."""
    env, fp4 = lab["env"], lab["fp4"]
    row = ls.wait_state(env, fp4["run_id"], timeout=900)
    assert row["state"] == "COMPLETED", row
    trials = [_reference(lab, p) for p in PRECISIONS] if DEV == "cuda" else [_reference(lab, PRECISIONS[0])]
    out = ls.ok(ls.cli(env, "compare", *map(str, trials), fp4["run_dir"]))
    assert all(Path(d).name in out for d in (*trials, fp4["run_dir"])), out
    fp8_run = ["--fp8-run", str(trials[1])] if DEV == "cuda" else []
    done = ls.cli(env, "verify-fp4", fp4["run_dir"], *fp8_run)
    checks = [line.strip() for line in done.stdout.splitlines() if line.strip()[:2] in ("1.", "2.", "3.", "4.", "5.")]
    record(compare=out.strip().splitlines()[-4:], verify_fp4=checks, verify_fp4_rc=done.returncode)
    assert len(checks) == 5 and all("[PASS]" in c for c in checks[:3]), done.stdout + done.stderr
    assert "EMULATED" in done.stdout and "hardware path" not in done.stdout, done.stdout


def test_slurm_job_on_gres_gpu_requeues_resumes_and_costs_its_gpu_hours(lab, record):
    """tests/gpu/slurm_gpu.py: a Slurm run warned of its time limit, requeued, resumed; its GPU-hours from sacct."""
    if "slurm" not in lab["jobs"]:
        pytest.skip("no Slurm cluster at SLURM_CONF (bash scripts/gpu-slurm.sh up; make gpu-test starts it when "
                    ".gpu/slurm is staged)")
    entry, info, row = lab["jobs"]["slurm"].result()
    job, run, run_dir, gpus = str(entry["job_id"]), entry["run_id"], Path(entry["run_dir"]), entry["gpus"]
    out = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert row["state"] == "COMPLETED", (row, out[-3000:])
    stop = max(e["iteration"] for e in ls.events(run_dir)[0] if e.get("event") == "checkpoint")
    assert "caught SIGUSR2" in out and f"requeueing job {job}" in out, out[-3000:]
    log = (run_dir / "logs" / "rank-0" / "debug.attempt-1.log").read_text()
    assert f"checkpoint loaded | iteration {stop} |" in log and max(ls.losses(run_dir)) == ls.ITERS
    start = next(e for e in ls.events(run_dir)[-1] if e.get("event") == "start")
    alloc = slurm_gpu.out("sacct", "--parsable2", "--noheader", "--duplicates", "-X", "-j", job, "-o",
                          "State,ElapsedRaw,AllocTRES").split()
    cost = ls.status(entry["env"], run)
    record(gpus=gpus, tres_per_node=info.get("TresPerNode"), stopped_at=stop, device_in_job=start.get("device"),
           sacct=alloc, **{k: cost.get(k) for k in ("gpu_hours", "elapsed_s", "tokens_per_gpu_hour")})
    assert sorted(a.split("|")[0] for a in alloc) == ["COMPLETED", "REQUEUED"], alloc
    assert all(f"gres/gpu={gpus}" in a for a in alloc) if gpus else not any("gres/gpu" in a for a in alloc), alloc
    if DEV == "cuda":
        assert start.get("device") == "cuda", start
    elapsed = sum(int(a.split("|")[1]) for a in alloc)
    assert cost["elapsed_s"] == elapsed and math.isclose(cost["gpu_hours"], elapsed * gpus / 3600), (cost, alloc)
    assert cost["gpu_hours"] > 0 if gpus else cost["gpu_hours"] == 0, cost


def test_fp8_attention_null_runs_on_packed_rows_of_one_document_and_eval_follows(lab, record):
    """fp8_dot_product_attention null on packed rows of one document (ls.one_document_fp8_sets): trained with TE's FP8
    attention, said in the log, recorded in the checkpoint; the `eval` step builds the same model from that record,
    so its loss equals the logged eval loss."""
    if lab["one_doc"] is None:
        pytest.skip("TE's FP8 attention needs the GPU")
    row = ls.wait_pipeline(lab["env"], lab["one_doc"]["run_id"])
    run_dir, step = Path(row["run_dir"]), Path(row["pipeline"][0]["dir"])
    assert row["state"] == "COMPLETED" and [s["state"] for s in row["pipeline"]] == ["COMPLETED"], row
    log = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    meta = json.loads((run_dir / "checkpoints" / "iter_0000020" / "metadata.json").read_text())
    evaluated, logged = json.loads((step / "result.json").read_text())["eval_loss"], ls.logged_eval(run_dir, 20)
    post = next((ln for ln in (step / "job.out").read_text().splitlines() if "precision |" in ln), "")
    record(eval_loss=evaluated, logged=logged, rel=abs(evaluated - logged) / logged, post_precision=post,
           fp8_attention_meta=meta.get("fp8_attention"))
    assert "note | fp8 attention | on: every row of the train split holds one document" in log
    assert "| attention fp8 (one-document micro-batches)" in log and meta.get("fp8_attention") is True, meta
    assert "| attention fp8 (one-document micro-batches)" in post, post
    assert abs(evaluated - logged) <= EVAL_RTOL["fp8"] * logged, (evaluated, logged)
