#!/usr/bin/env python3
"""Write a synthetic dataset in the MLPerf Llama2-70B LoRA packed format (train.npy / validation.npy object arrays
of {input_ids, loss_mask, seq_start_id} + packed_metadata.jsonl), GovReport-like document lengths.

The real GovReport set is not reachable on air-gapped machines; this gives the same shapes and token counts so the
recipe recipes/llama2_70b_bf16_mlperf.yaml (format: mlperf_npy) runs end to end:

    python scripts/make_mlperf_synthetic.py /data/gov_report --packs 3456 --seq 8192
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.data.mlperf import write_synthetic  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory")
    ap.add_argument("--packs", type=int, default=3456, help="training packs (MLPerf's run processes 3,456 samples)")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000, help="Llama-2 vocabulary")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    meta = write_synthetic(args.directory, args.packs, args.seq, args.vocab, args.seed)
    print(json.dumps({"directory": args.directory, "packs": args.packs, "seq": args.seq, **meta}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
