"""Merged-export benchmark: trainer.model.hf.merge.merge_adapter on a multi-GB synthetic checkpoint (CPU).

    .venv/bin/python bench/merge_export_bench.py [--dir /tmp/merge_bench] [--layers 8] [--experts 32]

Writes (once; reused when present) a synthetic BF16 Qwen3-MoE-shaped checkpoint in the Hub layout (per-expert
tensors, ~1 GB safetensors shards + index) and a rank-16 LoRA adapter in the form trainer.model.peft_export
writes (attention modules + the fused-expert ParamWrapper keys), then merges them in a child process and prints
one JSON line: bytes in/out, seconds, GB/s (wall and per CPU second of the merge: the box may be shared), the
child's peak RSS (ru_maxrss) and its peak anonymous memory
(RssAnon sampled every 20 ms: the heap, not the memory-mapped checkpoint pages the kernel can drop) above the
child's baseline after its imports, against the checkpoint size and the largest tensor.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H, I, VOCAB, HEADS, KV, D, R = 2048, 768, 32000, 32, 4, 128, 16


def _tensors(layers: int, experts: int):
    """(name, shape) of the synthetic base, in Hub names."""
    yield "model.embed_tokens.weight", (VOCAB, H)
    for i in range(layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "post_attention_layernorm.weight", (H,)
        for name, shape in (("q_proj", (HEADS * D, H)), ("k_proj", (KV * D, H)), ("v_proj", (KV * D, H)),
                            ("o_proj", (H, HEADS * D))):
            yield p + f"self_attn.{name}.weight", shape
        yield p + "self_attn.q_norm.weight", (D,)
        yield p + "self_attn.k_norm.weight", (D,)
        yield p + "mlp.gate.weight", (experts, H)
        for e in range(experts):
            for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                yield p + f"mlp.experts.{e}.{name}.weight", shape
    yield "model.norm.weight", (H,)
    yield "lm_head.weight", (VOCAB, H)


def write_base(out: Path, layers: int, experts: int, shard_bytes: int = 1 << 30) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    shards, cur, size = [], {}, 0
    for name, shape in _tensors(layers, experts):
        cur[name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        size += cur[name].numel() * 2
        if size >= shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
    shards.append(cur) if cur else None
    weight_map, total = {}, 0
    for k, shard in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update((n, fname) for n in shard)
        total += sum(t.numel() * 2 for t in shard.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "hidden_size": H,
                                                 "num_hidden_layers": layers, "num_experts": experts}))


def write_adapter(out: Path, layers: int, experts: int) -> None:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    t = {}
    for i in range(layers):
        p = f"base_model.model.model.layers.{i}."
        for name, (o, n) in (("q_proj", (HEADS * D, H)), ("k_proj", (KV * D, H)), ("v_proj", (KV * D, H)),
                             ("o_proj", (H, HEADS * D))):
            t[p + f"self_attn.{name}.lora_A.weight"] = torch.randn(R, n, generator=gen) * 0.01
            t[p + f"self_attn.{name}.lora_B.weight"] = torch.randn(o, R, generator=gen) * 0.01
        for key, (o, n) in (("mlp.experts.base_layer", (2 * I, H)), ("mlp.experts", (H, I))):
            t[p + key + ".lora_A.weight"] = torch.randn(experts * R, n, generator=gen) * 0.01
            t[p + key + ".lora_B.weight"] = torch.randn(o, R * experts, generator=gen) * 0.01
    out.mkdir(parents=True, exist_ok=True)
    save_file(t, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": R, "lora_alpha": 32.0, "target_modules": ["k_proj", "o_proj", "q_proj", "v_proj"],
        "target_parameters": ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"], "lora_dropout": 0.0}))


def _cpu_name() -> str:
    with open("/proc/cpuinfo") as fh:
        names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
    return names[0] if names else platform.machine()


def _anon_kb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def child(base: str, adapter: str, out: str) -> None:
    """The measured merge (own process, so ru_maxrss is the merge's)."""
    from trainer.model.hf.merge import merge_adapter

    baseline = _anon_kb()  # the interpreter + torch + megatron imports, before any tensor is read
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _anon_kb())
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    start, cpu0 = time.perf_counter(), sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    info = merge_adapter(base, adapter, out, note="bench: synthetic BF16")
    seconds = time.perf_counter() - start
    done.set()
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "info": info, "peak_anon_kb": peak[0], "baseline_anon_kb": baseline,
                      "ru_maxrss_kb": use.ru_maxrss, "cpu_seconds": use.ru_utime + use.ru_stime - cpu0}))


def _git_head() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/merge_bench")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--child", nargs=3, metavar=("BASE", "ADAPTER", "OUT"))
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    root = Path(args.dir)
    base, adapter, out = root / f"base_{args.layers}x{args.experts}", root / "adapter", root / "merged"
    t0 = time.perf_counter()
    if not (base / "model.safetensors.index.json").exists():
        write_base(base, args.layers, args.experts)
    write_adapter(adapter, args.layers, args.experts)
    shutil.rmtree(out, ignore_errors=True)  # (merge_adapter refuses a directory that holds a checkpoint)
    prep = time.perf_counter() - t0
    proc = subprocess.run([sys.executable, __file__, "--child", str(base), str(adapter), str(out)],
                          capture_output=True, text=True, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    info = res["info"]
    size = info["bytes"]
    largest = max(n for _, s in _tensors(args.layers, args.experts) for n in [2 * torch.Size(s).numel()])
    print(json.dumps({
        "bench": "merge_export", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": _cpu_name(), "cores": os.cpu_count(), "loadavg_1_5_15_at_end": [round(x, 1) for x in os.getloadavg()],
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "safetensors": __import__("safetensors").__version__, "git": _git_head()},
        "model": {"layers": args.layers, "experts": args.experts, "hidden": H, "expert_ffn": I, "dtype": "bf16",
                  "tensors": info["tensors"], "merged_tensors": info["merged_tensors"], "lora_rank": R},
        "checkpoint_gb": round(size / 1e9, 3), "shards": info["shards"], "prep_seconds": round(prep, 1),
        "merge_seconds": round(res["seconds"], 2), "gb_per_s_written": round(size / 1e9 / res["seconds"], 3),
        "merge_cpu_seconds": round(res["cpu_seconds"], 1), "gb_per_cpu_second": round(size / 1e9 / res["cpu_seconds"], 3),
        "peak_rss_gb": round(res["ru_maxrss_kb"] / 1e6, 3), "peak_anon_gb": round(res["peak_anon_kb"] / 1e6, 3),
        "baseline_anon_gb": round(res["baseline_anon_kb"] / 1e6, 3),
        "merge_anon_gb": round((res["peak_anon_kb"] - res["baseline_anon_kb"]) / 1e6, 3),
        "merge_anon_vs_checkpoint": round((res["peak_anon_kb"] - res["baseline_anon_kb"]) * 1e3 / size, 4),
        "largest_tensor_mb": round(largest / 1e6, 1)}))


if __name__ == "__main__":
    main()
