"""Same losses with and without the per-linear FP8 transpose release (trainer/precision/fp8_release.py).

Trains a cut of a recipe (default: bench/recipes/llama2_70b_1xh200.yaml at 20 layers, FP8 weights) on the real-text
set (recipes/data/realtext), with log_interval 1, three times: twice with this checkout (the run-to-run spread), and with a copy of it whose transform
list lacks "fp8 transposes" (every transpose then lives until the micro-batch's backward has ended, as before the
change). Prints one JSON line per run (per-iteration losses, peak GiB, tokens/s) and one comparing them: the
losses without the release must lie within the run-to-run spread (equal, where the GPU's kernels are deterministic).

    python3 bench/fp8_release_loss.py --layers 20 --iters 24
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_ITER = re.compile(r"\] iteration (\d+)/\d+ \| lm loss ([0-9.eE+-]+) \|.*tokens/s/GPU ([0-9.]+).*mem peak GiB ([0-9.]+)")
_TRANSFORM = '    Transform("fp8 transposes",'


def without_release(dest: Path) -> Path:
    """A copy of the checkout whose model transforms skip the per-linear release."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", ".venv", ".gpu", ".whl", "runs", "__pycache__"))
    path = dest / "trainer/model/transforms.py"
    text = path.read_text()
    if _TRANSFORM not in text:
        raise SystemExit(f"{path}: no {_TRANSFORM.strip()!r} entry to take out")
    path.write_text("".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith(_TRANSFORM)))
    return dest


def run(checkout: Path, label: str, args, work: Path, number: int) -> dict:
    data = ROOT / "recipes/data/realtext"
    cmd = [sys.executable, "-m", "primus_slurm", "submit", str(ROOT / args.recipe), "--executor", "local", "--follow",
           "--run-id", f"20261202-000000-{number:06d}",
           "--set", f"experiment.workspace={work / label}", "--set", f"trainer.model.num_layers={args.layers}",
           "--set", f"trainer.data.seq_length={args.seq}",
           "--set", "trainer.data.format=text", "--set", "trainer.data.packing=true",
           "--set", f"trainer.data.train.path={data / 'train.jsonl'}", "--set", f"trainer.tokenizer.path={data / 'tokenizer'}",
           "--set", f"trainer.schedule.train_iters={args.iters}", "--set", "trainer.schedule.lr=1.0e-3",
           "--set", "trainer.logging.log_interval=1", "--set", "trainer.lora.dropout=0.0"]
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=args.timeout)
    text = proc.stdout + proc.stderr
    rows = [(int(i), float(loss), float(tps), float(peak)) for i, loss, tps, peak in _ITER.findall(text)]
    lines = [ln for ln in text.splitlines() if "fp8 weight transposes |" in ln]
    return {"bench": "fp8_release_loss", "label": label, "rc": proc.returncode, "layers": args.layers, "seq": args.seq,
            "recipe": args.recipe, "lm_loss": [r[1] for r in rows], "iterations": [r[0] for r in rows],
            "tokens_per_s_per_gpu": rows[-1][2] if rows else None,
            "peak_mem_gib": max((r[3] for r in rows), default=None),
            "release_line": lines[0].split("] ", 1)[-1] if lines else "", "tail": "" if rows else text[-2500:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="bench/recipes/llama2_70b_1xh200.yaml")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--iters", type=int, default=24)
    ap.add_argument("--seq", type=int, default=2048, help="sequence length (the real-text set holds ~95k tokens)")
    ap.add_argument("--timeout", type=int, default=280)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fp8-release-"))
    new = run(ROOT, "per-linear", args, work, 1)
    print(json.dumps(new), flush=True)
    again = run(ROOT, "per-linear-again", args, work, 2)  # the run-to-run spread of the same code
    print(json.dumps(again), flush=True)
    old = run(without_release(work / "checkout-without-release"), "kept-to-micro-batch-end", args, work, 3)
    print(json.dumps(old), flush=True)

    def worst(a, b):
        return max((abs(x - y) for x, y in zip(a["lm_loss"], b["lm_loss"])), default=None)

    same = bool(new["lm_loss"]) and len(new["lm_loss"]) == len(old["lm_loss"]) and \
        worst(new, old) <= (worst(new, again) or 0.0)
    print(json.dumps({"bench": "fp8_release_loss_compare", "iterations": len(new["lm_loss"]),
                      "max_abs_diff_vs_without": worst(new, old), "max_abs_diff_run_to_run": worst(new, again),
                      "within_spread": same, "peak_gib": {r["label"]: r["peak_mem_gib"] for r in (new, again, old)}}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
