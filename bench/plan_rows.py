"""Every measured GPU row of bench/results/ matched to a recipe the planner can plan, or the reason it cannot be.

A row is a JSON object bench/trainer_throughput.py printed (label, recipe, overrides, nproc, rc, tokens_per_s_per_gpu,
peak_mem_gib), in any *.jsonl / *.json file under bench/results (new result folders are picked up as they come).
The recipe is resolved with today's loader from the row's recipe and overrides, after the ERAS entry of the row's
file: what the code of that session did differently, in today's keys (a switch that did not exist yet, a default
since changed). A row its session's code measured differently than today's would (a term since removed) is listed
unmatched with the reason. Rows in files no entry names were measured with the current code.
"""
from __future__ import annotations

import fnmatch
import functools
import json
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

FIRST = ("first session (2026-11-30 00:53-02:00): adapters kept their inputs, TE's cross-entropy kept the logits, "
         "no FP8 weights",
         ["trainer.recompute.chunked_loss=false", "trainer.recompute.adapter_inputs=false",
          "trainer.precision.fp8_param=false", "trainer.precision.fp8_recipe=delayed"])
SECOND = ("second session: adapter_inputs on by default, no chunked loss, delayed scaling",
          ["trainer.recompute.chunked_loss=false", "trainer.recompute.adapter_inputs=true",
           "trainer.precision.fp8_recipe=delayed"])
# (file glob under bench/results, or "file:label" for one row; what differed; overrides in today's keys, or None: not
# reproducible)
ERAS = [
    ("2026-11-30_h200x2_llama2_70b_tp2_first.jsonl", FIRST[0] + ", TE's cached FP8 weight copies on",
     FIRST[1] + ["trainer.precision.fp8_weight_cache=true"]),
    ("2026-11-30_h200x2_llama2_70b_tp2_fp8.jsonl", *FIRST),
    ("2026-11-30_h200x2_moe_proxies.jsonl", *FIRST),
    ("2026-11-30_h200_llama3_8b_mem_v1.jsonl", "v1 norm path (fp32 torch ops), replaced: not today's speed", None),
    ("2026-11-30_h200x2_llama2_70b_tp2_fast_v1.jsonl", "v1 norm path (fp32 torch ops), replaced: not today's speed",
     None),
    ("2026-11-30_h200_llama3_8b_mem_v2.jsonl", *SECOND),
    ("2026-11-30_h200x2_llama2_70b_tp2_fast_v2.jsonl", *SECOND),
    ("2026-11-30_s3_h200_profile/profile.jsonl", "third session before the chunked loss existed",
     ["trainer.recompute.chunked_loss=false", "trainer.precision.fp8_recipe=delayed"]),
    ("2026-11-30_s3_h200_memory/*", "third session", ["trainer.precision.fp8_recipe=delayed"]),
    ("2026-11-30_s4_h200x2/70b-scopes-WRONG-VOCAB-DATA.jsonl", "synthetic data of the wrong vocabulary", None),
    ("2026-11-30_s4_h200x2/*", "fourth session: the 70B recipe had delayed scaling and BF16 weights",
     ["trainer.precision.fp8_recipe=delayed", "trainer.precision.fp8_param=false"]),
    ("2026-11-30_s5_h200x2/*", "fifth session: the 70B recipe had delayed scaling",
     ["trainer.precision.fp8_recipe=delayed"]),
    ("2026-11-30_h200_*", *FIRST),
    ("2026-12-06i_h200_speed/70b1.jsonl:70b-1gpu-block13-normout-swiglu8-prof", "under torch.profiler over "
     "iterations 8-9 (2,894 tokens/s; the unprofiled repeats ran 2,757-2,767): not a speed row", None),
    ("2026-12-05d_h100_speed/epilogue-swiglu-profile.jsonl", "under torch.profiler over iterations 8-9: the packed "
     "run's 12,507 tokens/s holds the profiler's cost (the same code ran 14,894 unprofiled): not a speed row", None),
]
# matched rows the plan misses, each with what is known (tests/test_plan_accuracy.py holds them to still miss, and
# the README table shows them)
KNOWN_MISSES = {
    ("2026-11-30_h200x2_moe_proxies.jsonl", "qwen3_30b_a3b_proxy"):
        "tokens/s (planned 28,894 against 18,197): the same proxy at DP=1 (s6 moe-fp8.jsonl, same per-micro-batch "
        "work) ran 145 ms a micro-batch and is planned within 3 %; this first-session DP=2, EP=1 run took 225 ms a "
        "micro-batch. DP=2 adds one coalesced all-reduce of 53 M adapter gradients a step (a few ms), and the "
        "Qwen3-235B proxy of the same file and session (EP=2) is planned within 3 %, so no term of the model "
        "(expert GEMMs, dispatch, router) is off by the 300 ms a step missing: cause not found (not profiled)",
    ("2026-11-30_s6_h200x2/lora-dropout-tp2.jsonl", "8b-tp2-sp-fp8-fullrecompute-lora-dropout0.1-pre"):
        "tokens/s (planned +69 % since the dropout's cost was measured apart, calibration.MEASURED_COST): the "
        "only TP > 1 row with pre-dropout, on the unfused path of 2026-11-30, every adapter under SP drawing its mask "
        "inside megatron's RNG tracker fork (trainer/model/lora/grouped.py dropout_per_tp_rank); the 70B rows of "
        "2026-12-02 ran the same unfused dropout at TP 1 and are planned within 6 %. No pair without the dropout, "
        "not profiled: the fork's share is not known",
}
# fp8_param rows measured before each transpose was freed right after its linear's backward (e87f5d3, committed
# 2026-12-02 18:41 UTC): result files git added before that ran the code that kept every layer's transpose to the
# end of the backward; files added later, or not committed yet, ran the current code
TRANSPOSES_RELEASED = 1796236901  # e87f5d3's commit time
SWIGLU_AUTO = 1796477400  # trainer.lora.fused_swiglu null (wherever it applies) by default from here (2026-12-05)
NCCL_LAZY = 1796484700  # trainer.distributed.nccl_eager_init false by default from here (after 23eecf0, 2026-12-05)
# trainer.recompute.chunked_loss_kernel and trainer.lora.triton_products true, trainer.lora.epilogue null (auto) by
# default from here (after 28e0737, 2026-12-06: the kernels levers timed and kept)
KERNELS_ON = 1796537900
KERNELS_OFF = ["trainer.recompute.chunked_loss_kernel=false", "trainer.lora.triton_products=false",
               "trainer.lora.epilogue=false"]
# trainer.lora.epilogue_norm null (wherever the epilogue is on) by default from here (twelfth session, 2026-12-06:
# its real-text loss within spread on an H200); rows added before ran it off
NORM_AUTO = 1796546114
# trainer.precision.fp8_dot_product_attention null (on for FP8 one-document rows at head dim 128) by default from
# here (twelfth session): rows added before ran it off unless they set it
FP8ATTN_AUTO = 1796546991
# trainer.lora.epilogue null on for FP8 with per-tensor scaling (the base GEMMs through TE's functional linear) from
# here (thirteenth session, 2026-12-06): FP8 rows added before ran the fused path unless they set it
FP8_EPILOGUE_AUTO = 1796557950
# trainer.lora.dropout_recompute true by default from here (sixteenth session, 2026-12-06): under pre-dropout the fused
# and epilogue nodes keep the input and the mask's bits; rows added before kept the dropped copy and a byte mask
DROPOUT_RECOMPUTE = 1796586549
# trainer.precision.fp8_swiglu_kernels true by default from here (eighteenth session, 2026-12-07): rows added before
# ran megatron's FP8 SwiGLU store (its cast and copy back) unless they set it
SWIGLU_KERNELS = 1796611776
# the epilogue's dh and dB by cuBLAS from here (0d8cd10, 2026-12-05 18:23): rows measured before ran its one-read
# dh/dB kernel (dual_grad, 2.2-2.5x slower than cuBLAS's two products), whose time the plan no longer counts
EPILOGUE_CUBLAS = 1796495022


@dataclass
class Row:
    file: str           # relative to bench/results
    label: str
    data: dict

    @property
    def oom(self) -> bool:
        return self.data.get("rc") not in (0, None) and "out of memory" in json.dumps(self.data).lower().replace(
            "outofmemory", "out of memory")


# interleaved rows (bench/interleaved.py) printed before they named their recipe and the call's own --set
INTERLEAVED_RECIPES = {"2026-12-05_h200_speed/epilogue.jsonl": "bench/recipes/llama3_8b_h200.yaml"}


def interleaved_medians(rel: str, rows_: list[dict]) -> list[Row]:
    """bench/interleaved.py's repeats of one cell (label, variant, docs) as one row: the median tokens/s and peak
    (what bench/spread.py reports), in trainer_throughput's keys, so that the plan is held to the cell and not to
    each repeat. Error rows are left out (their refusal is in the file)."""
    cells: dict[tuple, list[dict]] = {}
    for d in rows_:
        if d.get("tokens_per_s") and d.get("peak_gib"):
            cells.setdefault((d.get("label"), d.get("variant"), d.get("docs")), []).append(d)
    out = []
    for (label, variant, docs), reps in cells.items():
        first = reps[0]
        sets = first.get("set")
        if sets is None:  # older rows: only the precision came from the call (gpu_suite.sh interleaved_call)
            sets = ["trainer.precision.fp8=hybrid"] if first.get("precision") == "fp8" else []
        data = {"bench": "trainer_throughput", "recipe": first.get("recipe") or INTERLEAVED_RECIPES.get(rel),
                "overrides": [*sets, *(first.get("overrides") or [])], "nproc": first.get("nproc") or 1, "rc": 0,
                "docs": docs, "tokens_per_s_per_gpu": statistics.median(r["tokens_per_s"] for r in reps),
                "peak_mem_gib": statistics.median(r["peak_gib"] for r in reps), "repeats": len(reps)}
        out.append(Row(rel, f"{label}-{variant}-{docs} (median of {len(reps)})", data))
    return out


def rows() -> list[Row]:
    out = []
    for path in sorted(RESULTS.rglob("*.json*")):
        if path.suffix not in (".json", ".jsonl") or path.parent.name.endswith("_lifecycle"):
            continue  # (the lifecycle suite's results, tests/gpu, are no benchmark rows)
        rel = str(path.relative_to(RESULTS))
        text = path.read_text(errors="replace")
        chunks = text.splitlines() if path.suffix == ".jsonl" else [text]
        interleaved = []
        for chunk in chunks:
            chunk = chunk.strip()
            if not chunk.startswith("{"):
                continue
            try:
                data = json.loads(chunk)
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("bench") == "interleaved" and not data.get("error"):
                interleaved.append(data)
            elif isinstance(data, dict):
                out.append(Row(rel, str(data.get("label") or data.get("bench") or "?"), data))
        out.extend(interleaved_medians(rel, interleaved))
    return out


def era(file: str, label: str = "") -> tuple[str, list | None]:
    """The ERAS entry of a results file, or of one row of it (a pattern "file:label")."""
    for pattern, what, overrides in ERAS:
        if fnmatch.fnmatch(file, pattern) or (label and fnmatch.fnmatch(f"{file}:{label}", pattern)):
            return what, overrides
    return "current code", []


def match(row: Row):
    """(resolved recipe, era description) or (None, the reason the row is not planned)."""
    from primus_contract.rules_precision import epilogue_on
    from primus_slurm.errors import UserError
    from primus_slurm.config.recipe import load_recipe

    d = row.data
    if d.get("bench") != "trainer_throughput":
        return None, f"not a training-throughput row (bench {d.get('bench')!r}): no recipe to plan"
    if d.get("rc") not in (0, None) and not row.oom:
        return None, "the run failed before measuring (not out of memory): " + _error(d)
    if not row.oom and not (d.get("peak_mem_gib") and d.get("tokens_per_s_per_gpu")):
        return None, "no peak memory or tokens/s recorded"
    what, era_overrides = era(row.file, row.label)
    if era_overrides is None:
        return None, what
    nproc = int(d.get("nproc") or 1)
    if _added_before(row.file, SWIGLU_AUTO):  # measured when fused_swiglu was off by default
        era_overrides = ["trainer.lora.fused_swiglu=false", *era_overrides]
    if _added_before(row.file, KERNELS_ON):  # measured when the kernels levers were opt-in
        era_overrides = [*KERNELS_OFF, *era_overrides]
    if _added_before(row.file, NORM_AUTO):  # the norm epilogue opt-in (a row's own epilogue=true ran without it)
        era_overrides = ["trainer.lora.epilogue_norm=false", *era_overrides]
    if _added_before(row.file, FP8ATTN_AUTO):  # FP8 attention opt-in
        era_overrides = ["trainer.precision.fp8_dot_product_attention=false", *era_overrides]
    if _added_before(row.file, DROPOUT_RECOMPUTE):  # the dropped copy and the byte mask kept
        era_overrides = ["trainer.lora.dropout_recompute=false", *era_overrides]
    if _added_before(row.file, SWIGLU_KERNELS):  # megatron's SwiGLU store where a row kept fc1's output in FP8
        era_overrides = ["trainer.precision.fp8_swiglu_kernels=false", *era_overrides]
    if _added_before(row.file, NCCL_LAZY):  # measured when every NCCL communicator was made at init
        era_overrides = ["trainer.distributed.nccl_eager_init=true", *era_overrides]
    overrides = list(era_overrides) + list(d.get("overrides") or []) + [
        f"cluster.env_profile={_gpu_profile(row.file)}", f"cluster.nproc_per_node={nproc}",
        f"cluster.gpus_per_node={nproc}",
        "trainer.distributed.device=cuda", "trainer.distributed.backend=nccl", "cluster.executor=local"]
    if d.get("docs") == "single":
        overrides.append("trainer.data.packing=false")
    try:
        r = load_recipe(str(ROOT / d["recipe"]), overrides).resolved
        if (r["trainer"]["precision"]["fp8"] and _added_before(row.file, FP8_EPILOGUE_AUTO)
                and r["trainer"]["lora"]["epilogue"] is None):  # (null then was off in FP8; true/false as written)
            overrides = [*overrides, "trainer.lora.epilogue=false"]  # the FP8 epilogue's era (above)
            r = load_recipe(str(ROOT / d["recipe"]), overrides).resolved
    except (UserError, OSError) as exc:
        return None, f"its recipe does not resolve today: {exc}"
    p = r["trainer"]["precision"]
    if (p["fp8"] and p["fp8_param"] and (r["trainer"]["recompute"]["granularity"] == "full" or row.oom)
            and _added_before(row.file, TRANSPOSES_RELEASED)):
        return None, ("fp8_param with full recompute (or out of memory) measured before each FP8 transpose was freed "
                      "after its own backward (e87f5d3): every layer's transpose then lived to the end of the "
                      "backward and set the peak; the current code would not reproduce it")
    if epilogue_on(r["trainer"], r["cluster"]["env_profile"]) and _added_before(row.file, EPILOGUE_CUBLAS):
        return None, ("the epilogue measured with its one-read dh/dB kernel (dual_grad), replaced by cuBLAS's two "
                      "products in 0d8cd10: the current code would not reproduce it")
    if p["fp8_param"] and era(row.file)[1] == SECOND[1] and int(d.get("global_batch_size") or 1) > 1:
        return None, ("fp8_param over several micro-batches measured when the transposes were dropped only after "
                      "the whole step's backward (kept across micro-batches)")
    return r, what


def _gpu_profile(file: str) -> str:
    """The env profile of the GPU a results file ran on: its directory or file name says `_h100` for an H100; every
    other row ran on H200s."""
    return "h100" if "_h100" in file.split("/")[0] else "h200"


@functools.lru_cache(maxsize=None)
def _added_before(file: str, when: int) -> bool:
    """Whether git added bench/results/`file` before the unix time `when` (False: later, or not committed)."""
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%ct", "--", str(RESULTS / file)], cwd=ROOT,
                         capture_output=True, text=True).stdout.split()
    return bool(out) and int(out[-1]) < when


def _error(d: dict) -> str:
    text = str(d.get("log_tail") or d.get("tail") or "")
    for line in reversed(text.splitlines()):
        if "error |" in line or "Error" in line:
            return line.strip()[-160:]
    return "exit code " + str(d.get("rc"))
