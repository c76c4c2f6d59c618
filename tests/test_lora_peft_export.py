"""Exported adapter loads with peft.PeftModel.from_pretrained and reproduces megatron's logits."""
import json

import torch
from peft import PeftModel
from safetensors.torch import load_file

from tests.model_helpers import tiny_cfg, trained_export
from tests.test_hf_import import make_hf_llama


def test_peft_export_matches_megatron_logits(tmp_path):
    hf = make_hf_llama(tmp_path / "hf", seed=5)
    cfg = tiny_cfg(trainer={"checkpoint": {"pretrained": str(tmp_path / "hf")},
                            "lora": {"dim": 4, "alpha": 12}})
    tokens = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    out = tmp_path / "adapter"
    mega = trained_export(cfg, tokens, out)
    conf = json.loads((out / "adapter_config.json").read_text())
    assert conf["r"] == 4 and conf["lora_alpha"] == 12
    assert set(conf["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                           "up_proj", "down_proj"}
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert len(tensors) == 2 * 7 * 2
    assert tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"].shape == (32, 4)
    with torch.no_grad():
        base_logits = hf(tokens).logits
    peft_model = PeftModel.from_pretrained(hf, str(out)).eval()
    with torch.no_grad():
        got = peft_model(tokens).logits
    assert (mega - base_logits).abs().max() > 1e-2  # the adapters change the output...
    torch.testing.assert_close(got, mega, rtol=1e-4, atol=1e-4)  # ...and peft reproduces it
