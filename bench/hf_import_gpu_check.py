"""HF import on the device's layer spec (TE on a GPU: fused layer-norm linears, grouped expert GEMMs) against
transformers on the same device: tiny random checkpoints of every family (tests/hf_tiny.py, Hub layout), logits in
fp32 and in BF16. Prints one JSON line per case.

    python3 bench/hf_import_gpu_check.py            # cuda when there is one (TE spec if TE imports), else cpu

fp32: max |ours - transformers| (TF32 off on both sides). BF16: both models run in BF16 and are compared with the
fp32 transformers logits; ours should be no further off than transformers' own BF16 run (ratio <= 2).
On the TE spec two FP8 rows follow (tensorwise current scaling): BF16 weights cast per step, and `fp8_param` (the
checkpoint loaded straight into FP8 weights); fp8_param should be no further off than the per-step cast (x1.5).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hf_tiny import load_tiny, save_tiny  # noqa: E402
from tests.model_helpers import dist_session  # noqa: E402
from tests.test_hf_import_families import CASES, recipe_for  # noqa: E402
from trainer.model import build_model  # noqa: E402
from trainer.model.specs import uses_te  # noqa: E402


def ours(path, device: str, bf16: bool, tokens, **precision):
    sections = {"precision": {"bf16": bf16, **precision},
                "distributed": {"device": device, "backend": "nccl" if device == "cuda" else "gloo"}}
    cfg = recipe_for(path, **sections)
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device).eval()
        with torch.no_grad():
            out = model(input_ids=tokens.to(info.device), position_ids=None, attention_mask=None).float().cpu()
        return out, uses_te(model)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        for case, (family, overrides) in sorted(CASES.items()):
            path = save_tiny(family, Path(tmp) / case, seed=3, **overrides)
            hf = load_tiny(path).to(device)
            with torch.no_grad():
                ref = hf(tokens.to(device)).logits.float().cpu()
                hf_bf16 = hf.to(torch.bfloat16)(tokens.to(device)).logits.float().cpu()
            row = {"bench": "hf_import_device_check", "case": case, "device": device,
                   "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
            try:
                got32, te = ours(path, device, False, tokens)
                got16, _ = ours(path, device, True, tokens)
            except Exception as exc:  # noqa: BLE001 - a device report: name the failing case, carry on
                row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}")
                print(json.dumps(row), flush=True)
                continue
            hf_err = (hf_bf16 - ref).abs().max().item()
            row.update(te_spec=te, fp32_max_abs_diff=(got32 - ref).abs().max().item(),
                       bf16_ours_vs_fp32=(got16 - ref).abs().max().item(), bf16_hf_vs_fp32=hf_err)
            row["ok"] = row["fp32_max_abs_diff"] <= 1e-3 and row["bf16_ours_vs_fp32"] <= 2 * hf_err + 1e-3
            print(json.dumps(row), flush=True)
            if te:
                print(json.dumps(fp8_row(case, path, device, tokens, ref)), flush=True)


def fp8_row(case, path, device, tokens, ref) -> dict:
    """FP8 tensorwise with BF16 weights vs with fp8_param weights, both against transformers' fp32 logits."""
    row = {"bench": "hf_import_device_check_fp8", "case": case, "recipe": "tensorwise"}
    fp8 = {"fp8": "hybrid", "fp8_recipe": "tensorwise"}
    for key, extra in (("fp8_bf16_weights_vs_fp32", {}), ("fp8_param_vs_fp32", {"fp8_param": True})):
        try:
            got, _ = ours(path, device, True, tokens, **fp8, **extra)
            row[key] = (got - ref).abs().max().item()
        except Exception as exc:  # noqa: BLE001 - a device report: say what refused, carry on with the next case
            row[key] = None
            row[key + "_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    a, b = row["fp8_bf16_weights_vs_fp32"], row["fp8_param_vs_fp32"]
    row["ok"] = a is not None and b is not None and b <= 1.5 * a + 1e-3
    return row


if __name__ == "__main__":
    main()
