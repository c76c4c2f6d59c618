"""Recipe variants of OUR trainer timed interleaved in one process: A B C A B C ... on the same synthetic packs.

Each variant is a set of `--set` overrides on one recipe (e.g. `swiglu=trainer.lora.fused_swiglu=true`). The process
initialises distributed once, then for every repeat and every variant (bench/spread.py's `interleave` order) builds the
model as `python -m trainer` does (contract + machine check, trainer.model.build: every transform), runs the
trainer's own step (trainer.step.train.Trainer.step: forward, backward, grad reduction, clip, AdamW) for each
`--docs` kind — `--warmup` steps, then `--steps` timed ones — and frees the model. One JSON line per block:

    {"bench": "interleaved", "label", "variant", "docs", "precision", "rep", "tokens_per_s", "ms_per_iter",
     "peak_gib", "lm_loss", "build_s", "block_s", "gc_collections", "gc_ms", "child_processes"}

(gc_*: Python's collections inside the timed steps by generation; child_processes: this process's descendants at
the block's end; bench/host_pauses.py.)

A variant the contract or the machine refuses gives one error row (with the refusal) and is not built again. One
process per precision; bench/spread.py turns the rows into min / median / max and verdicts. Building per block costs
seconds but keeps memory like a real run's (one model at a time) and lets any transform differ between variants.

    python3 bench/interleaved.py --recipe bench/recipes/llama3_8b_h200.yaml --label 8b-bf16 \\
        --variant default= --variant swiglu=trainer.lora.fused_swiglu=true --repeats 3 --docs single,packed
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from host_pauses import GcPauses, descendants  # noqa: E402
from spread import interleave  # noqa: E402


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'name=key=value,key=value' -> (name, ['key=value', ...]); 'name=' is the recipe as it is."""
    name, _, sets = text.partition("=")
    if not name:
        raise ValueError(f"--variant {text!r}: NAME=[key=value,...]")
    return name, [s for s in sets.split(",") if s]


def write_data(work: Path, docs: str, seq: int, vocab: int, n_packs: int) -> Path:
    """The synthetic packs bench/trainer_throughput.py trains on (same writers, same seed)."""
    from trainer.data.mlperf import write_single_documents, write_synthetic

    data = work / f"data-{docs}-{seq}-v{vocab}-n{n_packs}"
    if not (data / "train.npy").exists():
        if docs == "single":
            write_single_documents(str(data), n_packs, seq, vocab, seed=1)
        else:
            write_synthetic(str(data), n_packs, seq, vocab, seed=1)
    return data


def resolve(recipe: str, overrides: list[str], data: Path, work: Path, tag: str):
    """(Config, precision) of the recipe with `overrides`, checked as the trainer checks it at start."""
    from primus_slurm.config.recipe import dump, load_recipe
    from trainer.config import load_config
    from trainer.runtime.start_check import pre_start

    r = load_recipe(recipe, [*overrides, "trainer.data.format=mlperf_npy", f"trainer.data.train.path={data}",
                             "trainer.data.validation.path=null", "trainer.schedule.eval_interval=null",
                             f"experiment.workspace={work}",
                             "cluster.nproc_per_node=1"], env={})
    path = work / f"{tag}.resolved.yaml"
    path.write_text(dump(r.resolved))
    cfg = load_config(str(path))
    return cfg, pre_start(cfg)


def reset_fp8_state() -> None:
    """TE's global FP8 buffers hold every model's amax histories: cleared between models, so a later block does not
    reduce a freed model's (TE absent: nothing to do)."""
    for mod in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        try:
            manager = getattr(__import__(mod, fromlist=["FP8GlobalStateManager"]), "FP8GlobalStateManager")
        except (ImportError, AttributeError):
            continue
        manager.reset()
        return


def run_block(cfg, info, model, packs, warmup: int, steps: int, run_dir: str) -> dict:
    """`warmup` + `steps` trainer steps on `packs` (iterations 0..); the timed steps' tokens/s, ms and last loss."""
    import torch

    from trainer.model import adapter_state_dict, forward_losses
    from trainer.observability.logger import TrainLogger
    from trainer.runtime.signals import StopSignal
    from trainer.step.optim import build_optimizer, trainable_parameters
    from trainer.step.train import Trainer

    params = trainable_parameters(model)
    opt = build_optimizer(params, cfg.trainer.schedule)
    logger = TrainLogger(run_dir, info.rank, 0, stream=sys.stderr)
    trainer = Trainer(cfg, run_dir, info, model, opt, params, packs, None, forward_losses, logger, StopSignal(),
                      adapter_state_dict)
    sync = torch.cuda.synchronize if info.device.type == "cuda" else (lambda: None)
    lr = float(cfg.trainer.schedule.lr)
    tokens, last = 0.0, None
    for i in range(warmup):
        last = trainer.step(trainer.micro_batches(i), lr)
    sync()
    t0 = time.perf_counter()
    with GcPauses() as pauses:  # the host's garbage collections inside the timed steps
        for i in range(warmup, warmup + steps):
            last = trainer.step(trainer.micro_batches(i), lr)
            tokens += last.tokens
        sync()
    dt = time.perf_counter() - t0
    logger.close()
    return {"tokens_per_s": round(tokens / dt / info.world_size, 1), "ms_per_iter": round(1000 * dt / steps, 1),
            "lm_loss": float(last.loss_sum) / max(last.num_loss_tokens, 1.0), **pauses.row(),
            "child_processes": None if (kids := descendants()) is None else len(kids)}


def by_precision(prec, cfg, packs: dict, kinds: list) -> list:
    """[(precision, docs kinds)] in order: the trainer's precision for each kind's train split (trainer.precision.
    follow_data: FP8 attention null turns on for packed data of one document a row, as `python -m trainer` does at
    start), so a variant runs each kind on the model a real run of that data would build."""
    from trainer.precision import follow_data

    groups: list = []
    for d in kinds:
        p = follow_data(prec, cfg, packs[d].max_pack_documents() <= 1)
        same = [g for g in groups if g[0] == p]
        if same:
            same[0][1].append(d)
        else:
            groups.append((p, [d]))
    return groups


def run_kinds(args, cfg, info, model, packs: dict, kinds: list, run_dir: Path, base: dict):
    """run_block on each docs kind, a JSON row each; the error text of a block that fails (the rest skipped)."""
    import torch

    on_gpu = info.device.type == "cuda"
    for d in kinds:
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        tb = time.perf_counter()
        try:
            row = run_block(cfg, info, model, packs[d], args.warmup, args.steps, str(run_dir))
        except Exception as err:  # noqa: BLE001  (a variant failing here is a row; the others still run)
            why = f"run: {type(err).__name__}: {str(err)[:400]}"
            print(json.dumps({**base, "docs": d, "error": why, "trace": traceback.format_exc()[-2000:]}), flush=True)
            return why
        peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None
        print(json.dumps({**base, "docs": d, **row, "peak_gib": None if peak is None else round(peak, 2),
                          "block_s": round(time.perf_counter() - tb, 1)}), flush=True)
    return None


def warm_process(args, configs: dict, packs: dict, kinds: list, info, work: Path, precision_name: str) -> float:
    """One untimed block before the interleaving: the first variant on its first docs kind, built and freed like any
    block. A process's first block pays one-time costs that outlast its warm-up steps (kernel compiles and their
    worker processes, first allocations): on one H100 on 2026-12-07 the first block ran 10-23 % slow in 3 of 4 calls,
    the blocks after it within 1-2 % of each other (bench/results/2026-12-07c_h100_speed/). Its row is
    "interleaved_warmup", which bench/spread.py does not read."""
    from trainer.model import build
    from trainer.runtime.distributed import seed_streams

    name, (cfg, prec) = next(iter(configs.items()))
    d_prec, (d, *_) = by_precision(prec, cfg, packs, kinds)[0]
    base = {"bench": "interleaved_warmup", "label": args.label, "variant": name, "docs": d, "precision": precision_name}
    seed_streams(int(cfg.experiment.seed), info.pp_rank, info.dp_rank)
    tb = time.perf_counter()
    built = None
    try:  # (a variant that fails here fails again as a timed block's row, which says why)
        built = build(cfg, info.device, d_prec)
        row = run_block(cfg, info, built.model, packs[d], args.warmup, args.steps, str(work / "run-warmup"))
    except Exception as err:  # noqa: BLE001
        row = {"error": f"{type(err).__name__}: {str(err)[:400]}"}
    elapsed = time.perf_counter() - tb
    print(json.dumps({**base, **row, "block_s": round(elapsed, 1)}), flush=True)
    del built
    release(info.device)
    return elapsed


def release(device) -> None:
    """After a block's model is dropped: its cycles collected, TE's FP8 state reset, the allocator's cache emptied."""
    import torch

    gc.collect()
    reset_fp8_state()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def with_job_env(recipe: str, overrides: list[str], argv: list[str]) -> None:
    """Run again under the variables a submitted job exports (env profile + cluster.env: the allocator, connection
    and TE settings bench/trainer_throughput.py's runs get), this process's own environment winning, before anything
    initialises CUDA; the first row lists them."""
    if os.environ.get("PRIMUS_BENCH_JOB_ENV"):
        return
    from primus_slurm.config.recipe import load_recipe
    from primus_slurm.config.render import job_env

    job = {k: str(v) for k, v in job_env(load_recipe(recipe, overrides, env={}).resolved).items()}
    env = {**job, **os.environ, "PRIMUS_BENCH_JOB_ENV": json.dumps(sorted(job))}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="for every variant")
    ap.add_argument("--variant", action="append", required=True, help="NAME=[key=value,...] (repeatable)")
    ap.add_argument("--docs", default="single,packed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--process-warmup", type=int, choices=(0, 1), default=1,
                    help="1: one untimed block (the first variant, first docs kind) before the timed ones")
    ap.add_argument("--label", default="")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="epoch seconds: no block starts when the last one would not end before it")
    args = ap.parse_args(argv)
    with_job_env(args.recipe, args.overrides, sys.argv[1:] if argv is None else argv)
    print(json.dumps({"bench": "interleaved_env", "label": args.label, "job_env": {
        k: os.environ.get(k) for k in json.loads(os.environ["PRIMUS_BENCH_JOB_ENV"])}}), flush=True)
    from primus_slurm.config.recipe import load_recipe
    from trainer.data import build_datasets
    from trainer.model import build
    from trainer.runtime.distributed import init_distributed, seed_streams

    work = Path(args.workdir or tempfile.mkdtemp(prefix="interleaved-"))
    work.mkdir(parents=True, exist_ok=True)
    variants = [parse_variant(v) for v in args.variant]
    docs_kinds = [d for d in args.docs.split(",") if d]
    t = load_recipe(args.recipe, args.overrides, env={}).resolved["trainer"]
    seq, vocab = t["data"]["seq_length"], t["model"]["vocab_size"]
    n_packs = (args.warmup + args.steps) * t["schedule"]["global_batch_size"] + 8
    data = {d: write_data(work, d, seq, vocab, n_packs) for d in docs_kinds}
    first = docs_kinds[0]
    precision_name = "fp8" if t["precision"]["fp8"] else ("fp4" if t["precision"]["fp4"] else "bf16")
    configs, refused = {}, {}
    for name, sets in variants:
        try:
            configs[name] = resolve(args.recipe, [*args.overrides, *sets], data[first], work, name)
        except Exception as err:  # noqa: BLE001  (a refusal is a result: its row says why)
            refused[name] = f"{type(err).__name__}: {str(err)[:400]}"
    base_cfg, _ = next(iter(configs.values()), (None, None))
    if base_cfg is None:
        for name, why in refused.items():
            print(json.dumps({"bench": "interleaved", "label": args.label, "variant": name, "error": why}))
        return 1
    info = init_distributed(base_cfg)
    packs = {}
    for d in docs_kinds:  # the same packs for every variant: only the data path differs from the variant's recipe
        cfg_d, _ = resolve(args.recipe, args.overrides, data[d], work, f"data-{d}")
        packs[d] = build_datasets(cfg_d, info.rank, info.world_size)[0]
    # (the warm-up's time, build included, is the first estimate of a block's for --deadline)
    block_s = warm_process(args, configs, packs, docs_kinds, info, work, precision_name) if args.process_warmup else 0.0
    for rep, (name, sets) in interleave(variants, args.repeats):
        base = {"bench": "interleaved", "label": args.label, "variant": name, "rep": rep,
                "precision": precision_name, "overrides": sets, "recipe": args.recipe, "set": list(args.overrides),
                "nproc": info.world_size}
        if name in refused:
            if rep == 0:
                print(json.dumps({**base, "error": refused[name]}), flush=True)
            continue
        if args.deadline and time.time() + block_s > args.deadline:
            print(json.dumps({**base, "error": "skipped: the call's deadline"}), flush=True)
            continue
        cfg, prec = configs[name]
        t0 = time.perf_counter()
        for d_prec, kinds in by_precision(prec, cfg, packs, docs_kinds):  # one model per precision the data gives
            seed_streams(int(cfg.experiment.seed), info.pp_rank, info.dp_rank)  # every block starts from the same draws
            tb = time.perf_counter()
            try:
                built = build(cfg, info.device, d_prec)
            except Exception as err:  # noqa: BLE001
                refused[name] = f"build: {type(err).__name__}: {str(err)[:400]}"
                print(json.dumps({**base, "error": refused[name]}), flush=True)
                break
            build_s = time.perf_counter() - tb
            lines = [ln for ln in built.log_lines if ln.split(" |")[0] in ("fused swiglu", "lora epilogue", "lora")]
            failed = run_kinds(args, cfg, info, built.model, packs, kinds, work / f"run-{name}",
                               {**base, "build_s": round(build_s, 1), "transforms": lines,
                                "fp8_attention": d_prec.settings.fp8_dot_product_attention})
            del built
            release(info.device)
            if failed:
                refused[name] = failed
                break
        block_s = max(block_s, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
