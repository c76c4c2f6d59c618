"""`primus-slurm export --merged` of a trained MoE run: a tiny Qwen3-MoE (Hub layout, one tensor per expert) fine-tuned
from its own checkpoint with LoRA on attention and every expert, through `submit --executor local`; the merged
checkpoint loads in transformers and its logits equal base + the run's PEFT adapter (fp32, 1e-4), expert adapters
included."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli, local_training_run
from tests.hf_tiny import save_tiny

pytestmark = pytest.mark.slow


def test_merged_export_of_a_moe_run_matches_base_plus_peft(tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = save_tiny("qwen3_moe", tmp_path / "base", seed=11, vocab_size=512, hidden_size=128,
                         max_position_embeddings=1024)
    env, entry, _ = local_training_run(tmp_path, "trainer.model.preset=checkpoint",
                                       f"trainer.checkpoint.pretrained={base_dir}",
                                       "trainer.lora.target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]",
                                       "trainer.schedule.train_iters=20", "trainer.schedule.eval_interval=null",
                                       "trainer.checkpoint.save_interval=null", timeout=900)
    merged = tmp_path / "merged"
    res = cli(env, "export", entry["run_id"], "--merged", str(merged), "--adapter", "--executor", "local",
              timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    result = json.loads(Path(res.stdout.strip().splitlines()[-1].split("result: ", 1)[1]).read_text())
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(3))
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, result["adapter"]).eval()(ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()(ids).logits
    assert (peft_logits - plain).abs().max() > 1e-3  # the trained adapters matter, experts' too (below)
    assert (merged_logits - peft_logits).abs().max() < 1e-4
    from safetensors import safe_open

    with safe_open(str(Path(result["adapter"]) / "adapter_model.safetensors"), "pt") as f:
        experts = [k for k in f.keys() if ".mlp.experts." in k]
        assert experts and max(f.get_tensor(k).abs().max().item() for k in experts if "lora_B" in k) > 0
