"""The speed ceiling of ANY LoRA implementation at the anchor's shape: the frozen base's own work, no adapters.

A LoRA step must run the frozen model's forward and its input-gradient (dgrad) backward through every layer;
the adapters only add work to that. This bench runs exactly that floor of work with megatron-core's GPTModel on
the Transformer Engine spec, at the shape and settings of ../shared/bench/anchor_mcore_te.py (Llama-3-8B, seq 8192,
one document per sequence, the same TransformerConfig fusions, megatron's own loss), with every parameter frozen
and the embedding's output made to require grad, so backward computes every dgrad and no weight gradient.

    tokens_per_s(ceiling) / tokens_per_s(anchor)   = the most any adapter-side lever (fused GEMMs, fewer casts,
                                                     CUDA graphs over the adapters) can give over the anchor.

(The ceiling is slightly conservative: it also runs the first layer's dgrad, which a LoRA step skips because
nothing below the first adapter needs a gradient.) Prints one JSON line per configuration; GPU only.

    python3 bench/lora_ceiling.py bf16 fp8_delayed                 # one document per sequence (the anchor's layout)
    python3 bench/lora_ceiling.py --packed bf16 fp8_delayed        # packed: THD attention over the same synthetic
                                                                   # packs bench/trainer_throughput.py --docs packed trains
    python3 bench/lora_ceiling.py bf16 packed:bf16 bf16 packed:bf16   # repeats, single and packed interleaved
    python3 bench/lora_ceiling.py fp8_delayed_attn                 # + TE's FP8 attention (one document a row only),
                                                                   # the ceiling of ours where it runs FP8 attention
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: trainer.data
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29512")


# THD's max_seqlen bucketed (trainer.data.max_seqlen_buckets) as ours runs it: PRIMUS_CEILING_BUCKETS=1 for a call
# whose variants turn it on
BUCKETS = os.environ.get("PRIMUS_CEILING_BUCKETS") == "1"


def _model(seq: int):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
        kv_channels=128, normalization="RMSNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, bias_activation_fusion=True, bf16=True,
        params_dtype=torch.bfloat16, apply_rope_fusion=True, masked_softmax_fusion=True,
        attention_softmax_in_fp32=False, hidden_dropout=0.0, attention_dropout=0.0)
    return GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                    vocab_size=128256, max_sequence_length=seq, position_embedding_type="rope",
                    rotary_base=500000, share_embeddings_and_output_weights=False).cuda()


def _packs(seq: int, n: int, vocab: int = 128256, n_file: int = 28) -> list:
    """(tokens, positions, PackedSeqParams) of the first n packs of the file bench/trainer_throughput.py --docs packed
    writes for its 20 iterations (trainer.data.mlperf.write_synthetic, 28 packs, seed 1), positions restarting at every
    document as the trainer's."""
    import tempfile

    import numpy as np

    from trainer.data.mlperf import write_synthetic
    from trainer.model.inputs import packed_seq_params

    out = []
    with tempfile.TemporaryDirectory() as d:
        write_synthetic(d, max(n, n_file), seq, vocab, seed=1)
        for p in np.load(f"{d}/train.npy", allow_pickle=True)[:n]:
            ids = torch.tensor(p["input_ids"], dtype=torch.long)
            starts = list(p["seq_start_id"]) + [len(ids)]
            pos = torch.cat([torch.arange(b - a) for a, b in zip(starts[:-1], starts[1:])])
            pad = seq - len(ids)  # the collator pads a pack to seq; the pad is its own segment
            ids, pos = torch.nn.functional.pad(ids, (0, pad)), torch.cat([pos, torch.arange(pad)])
            cu = torch.tensor(starts, dtype=torch.int32)
            psp = packed_seq_params(cu, int(torch.diff(cu).max()), seq, "cuda", buckets=BUCKETS)
            out.append((ids.view(1, -1).cuda(), pos.view(1, -1).cuda(), psp))
    return out


def run(seq: int, fp8: str | None, steps: int = 8, warm: int = 3, packed: bool = False) -> dict:
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    model = _model(seq)
    for p in model.parameters():
        p.requires_grad_(False)
    # the gradient starts at the embedding's output: every layer's dgrad runs, no weight gradient anywhere
    model.embedding.register_forward_hook(lambda mod, args, out: out.detach().requires_grad_(True))
    if packed:
        batches = _packs(seq, warm + steps)
    else:
        ids = torch.randint(0, 128256, (1, seq), device="cuda")
        batches = [(ids, torch.arange(seq, device="cuda").unsqueeze(0), None)] * (warm + steps)
    recipes = {"delayed": recipe.DelayedScaling, "current": recipe.Float8CurrentScaling,
               "delayed_attn": lambda: recipe.DelayedScaling(fp8_dpa=True)}  # + TE's FP8 attention (one-document)
    ctx = (lambda: te.autocast(enabled=True, recipe=recipes[fp8]())) if fp8 else contextlib.nullcontext
    torch.cuda.reset_peak_memory_stats()
    for i in range(warm + steps):
        if i == warm:
            torch.cuda.synchronize()
            t = time.perf_counter()
        ids, pos, psp = batches[i]
        with ctx():
            loss = model(ids, pos, None, labels=ids, packed_seq_params=psp)
        loss.float().mean().backward()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / steps
    row = {"bench": "lora_ceiling", "mode": "frozen_base_dgrad_only", "seq": seq, "fp8": fp8,
           "docs": "packed" if packed else "single",
           "tokens_per_s": round(seq / dt), "step_ms": round(dt * 1e3, 1),
           "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}
    del model
    torch.cuda.empty_cache()
    return row


def versions() -> dict:
    import megatron.core
    import transformer_engine

    return {"bench": "versions", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformer_engine": transformer_engine.__version__, "megatron_core": megatron.core.__version__}


def main(argv: list[str]) -> int:
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    print(json.dumps(versions()), flush=True)
    packed = "--packed" in argv
    for w in [a for a in argv if a != "--packed"] or ["bf16"]:  # "packed:<precision>": that one packed
        one_packed, w = packed or w.startswith("packed:"), w.removeprefix("packed:")
        try:
            print(json.dumps(run(8192, None if w == "bf16" else w.removeprefix("fp8_"), packed=one_packed)), flush=True)
        except Exception as e:  # one configuration's failure is a row, the next one still runs
            print(json.dumps({"bench": "lora_ceiling", "config": w, "docs": "packed" if one_packed else "single",
                              "fp8": None if w == "bf16" else w.removeprefix("fp8_"),
                              "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
