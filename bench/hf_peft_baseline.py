"""Peer baseline: HF transformers + PEFT LoRA on the same shape and tokens as our trainer benchmark.

Random-weight LlamaForCausalLM of a preset's shape, LoRA on q/k/v/o/gate/up/down (the HF names of our
linear_qkv/linear_proj/linear_fc1/linear_fc2), SDPA attention, bf16, AdamW over the adapters. One document
per sequence (HF's SDPA path cannot keep packed documents apart), so compare it with our single-document run.
Prints one JSON object.

    python bench/hf_peft_baseline.py --preset llama3_8b --seq 8192 --iters 12 --warmup 3
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml


def preset(name: str) -> dict:
    return yaml.safe_load((Path(__file__).resolve().parent.parent / "recipes/models" / f"{name}.yaml").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama3_8b")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--num-layers", type=int, default=None, help="reduce depth (for quick checks)")
    ap.add_argument("--grad-ckpt", action="store_true")
    args = ap.parse_args()

    import transformers
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM

    m = preset(args.preset)
    cfg = LlamaConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"],
        num_hidden_layers=args.num_layers or m["num_layers"], num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_query_groups"] or m["num_attention_heads"],
        max_position_embeddings=max(m["max_position_embeddings"], args.seq), rope_theta=m["rotary_base"],
        rms_norm_eps=m["norm_epsilon"], tie_word_embeddings=not m["untie_embeddings"],
        attn_implementation="sdpa", torch_dtype=torch.bfloat16,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    lora = peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, lora)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (args.iters + args.warmup, 1, args.seq), device="cuda", generator=gen)

    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.iters + args.warmup):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=tokens[i], labels=tokens[i])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step = sum(times) / len(times)
    print(json.dumps({
        "bench": "hf_peft_baseline", "preset": args.preset, "num_layers": cfg.num_hidden_layers, "seq": args.seq,
        "lora_rank": args.rank, "grad_ckpt": args.grad_ckpt, "iters_timed": len(times),
        "step_s": round(step, 4), "tokens_per_s": round(args.seq / step, 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "last_loss": round(out.loss.item(), 4),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
        "peft": peft.__version__,
    }))


if __name__ == "__main__":
    main()
