"""Write a random Hugging Face checkpoint of a recipe's model, in the Hub's on-disk layout (config.json + safetensors
shards with an index, one tensor per expert), through transformers itself: for the GPU checks of the HF import on
proxy-sized models (bench/gpu_suite.sh hf-import), where no real checkpoint can be downloaded.

    python scripts/make_hf_checkpoint.py recipes/proxies/qwen3_30b_a3b_proxy.yaml /tmp/hf/qwen3 [--set k=v ...]

The recipe's model fields become config.json (primus_contract.hf_config.to_hf_config, the inverse of the import's
check), so the same recipe with `trainer.checkpoint.pretrained=/tmp/hf/qwen3` imports it without a mismatch.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from primus_contract.hf_config import to_hf_config  # noqa: E402
from primus_slurm.config.recipe import load_recipe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("out")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-size", default="2GB")
    ap.add_argument("--device", default=None, help="where the random weights are drawn (default: cuda if present)")
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = load_recipe(args.recipe, args.sets).resolved["trainer"]["model"]
    hf = to_hf_config(model)
    config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    torch.manual_seed(args.seed)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with torch.device(device):  # a 10B-parameter proxy draws in seconds on a GPU, minutes on CPU cores
        net = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    net.save_pretrained(args.out, max_shard_size=args.max_shard_size)
    size = sum(p.stat().st_size for p in Path(args.out).glob("*.safetensors"))
    print(json.dumps({"checkpoint": args.out, "model_type": config.model_type, "layers": config.num_hidden_layers,
                      "parameters": sum(p.numel() for p in net.parameters()), "gb": round(size / 1e9, 3)}))


if __name__ == "__main__":
    main()
