"""HF import speed and memory on CPU: a synthetic Qwen3-MoE checkpoint at Qwen3-30B-A3B widths (hidden 2048, 32 heads /
4 KV heads of 128, experts of 768, vocab 151936; `--layers`, `--experts` set its size), written in the Hub layout
(one tensor per expert, BF16, shards with model.safetensors.index.json), imported into the trainer's model by
trainer.model.hf.importer.load_hf (the code path of checkpoint.pretrained). Prints JSON: bytes read, GB/s, and peak
anonymous RSS during the import against the rank's share (its parameter bytes) and the largest tensor.

    .venv/bin/python bench/hf_import_bench.py --layers 4 --experts 64 --out /tmp/hf_bench

The peer of the import is the checkpoint itself: "rank share" is what the model must hold anyway; the import's
own cost is the anonymous memory above it (file pages of the memory-mapped shards are page cache, not counted).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.model_helpers import dist_session, tiny_cfg  # noqa: E402
from trainer.model.hf.importer import load_hf  # noqa: E402

WIDTHS = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
              num_key_value_heads=4, head_dim=128, vocab_size=151936, num_experts_per_tok=8)


def hf_tensors(layers: int, experts: int):
    """(name, shape) of a Qwen3-MoE checkpoint in the Hub's on-disk layout."""
    h, e, v, d = WIDTHS["hidden_size"], WIDTHS["moe_intermediate_size"], WIDTHS["vocab_size"], WIDTHS["head_dim"]
    q, kv = WIDTHS["num_attention_heads"] * d, WIDTHS["num_key_value_heads"] * d
    yield "model.embed_tokens.weight", (v, h)
    for i in range(layers):
        p = f"model.layers.{i}."
        yield from ((p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                    (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                    (p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,)),
                    (p + "mlp.gate.weight", (experts, h)))
        for j in range(experts):
            x = f"{p}mlp.experts.{j}."
            yield from ((x + "gate_proj.weight", (e, h)), (x + "up_proj.weight", (e, h)), (x + "down_proj.weight", (h, e)))
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def write_checkpoint(out: Path, layers: int, experts: int, shard_bytes: int = 1 << 30) -> int:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": layers,
           "num_experts": experts, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "hidden_act": "silu",
           "max_position_embeddings": 40960, "torch_dtype": "bfloat16", **WIDTHS}
    (out / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    weight_map, shard, size, total, n = {}, {}, 0, 0, 0

    def flush():
        nonlocal shard, size, n
        if shard:
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            weight_map.update((k, name) for k in shard)
            shard, size, n = {}, 0, n + 1

    for name, shape in hf_tensors(layers, experts):
        t = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        shard[name] = t
        size += t.numel() * 2
        total += t.numel() * 2
        if size >= shard_bytes:
            flush()
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    return total


def rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.stop = rss_anon(), threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.005)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--out", default="/tmp/primus_hf_import_bench")
    args = ap.parse_args()
    out = Path(args.out)
    t0 = time.perf_counter()
    total = write_checkpoint(out, args.layers, args.experts)
    write_s = time.perf_counter() - t0
    model_fields = {"family": "qwen3", "num_layers": args.layers, "hidden_size": 2048, "ffn_hidden_size": 6144,
                    "num_attention_heads": 32, "num_query_groups": 4, "kv_channels": 128, "vocab_size": 151936,
                    "max_position_embeddings": 4096, "rotary_base": 1000000.0, "norm_epsilon": 1e-6,
                    "untie_embeddings": True, "qk_layernorm": True, "num_moe_experts": args.experts,
                    "moe_router_topk": 8, "moe_ffn_hidden_size": 768, "moe_norm_topk_prob": True}
    cfg = tiny_cfg(trainer={"model": model_fields, "precision": {"bf16": True},
                            "lora": {"target_modules": ["linear_qkv", "linear_proj"]}})
    with dist_session(cfg) as info:
        from trainer.model.build import _gpt_model, make_transformer_config

        config = make_transformer_config(cfg, info.device, use_te=False)
        model = _gpt_model(config, cfg.trainer.model, info.device, int(cfg.experiment.seed))
        share = sum(p.numel() * p.element_size() for p in model.parameters())
        before = rss_anon()
        sampler = PeakSampler()
        sampler.start()
        t1 = time.perf_counter()
        line = load_hf(model, out, cfg.trainer.model.to_dict())
        load_s = time.perf_counter() - t1
        sampler.stop.set()
        sampler.join()
    read = float(line.split("| read ")[1].split("(")[1].split(" GB")[0]) * 1e9
    largest = float(line.split("largest ")[1].split(" MB")[0]) * 1e6
    print(json.dumps({
        "bench": "hf_import", "date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "torch": torch.__version__, "layers": args.layers, "experts": args.experts,
        "checkpoint_gb": round(total / 1e9, 3), "write_s": round(write_s, 1), "import_s": round(load_s, 2),
        "read_gb": round(read / 1e9, 3), "gb_per_s": round(read / 1e9 / load_s, 3),
        "rank_share_gb": round(share / 1e9, 3), "rss_anon_before_gb": round(before / 1e9, 3),
        "rss_anon_peak_gb": round(sampler.peak / 1e9, 3),
        "import_extra_gb": round((sampler.peak - before) / 1e9, 3), "largest_tensor_gb": round(largest / 1e9, 3),
        "line": line}, indent=1))


if __name__ == "__main__":
    main()
