"""HF Llama (GQA, untied) saved locally -> megatron GPTModel: logits match transformers'."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.model_helpers import dist_session, tiny_cfg
from trainer.model import build_model
from trainer.model.hf.importer import fuse_qkv, split_qkv
from trainer.model.lora.layers import lora_modules


def make_hf_llama(path, seed=0, rope_base=10000.0, layers=2):
    torch.manual_seed(seed)
    hf_cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=rope_base, tie_word_embeddings=False,
                         attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # norms default to ones: randomise so a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    return model



def test_qkv_fuse_split_round_trip():
    q, k, v = torch.randn(32, 8), torch.randn(16, 8), torch.randn(16, 8)
    fused = fuse_qkv(q, k, v, heads=4, groups=2)
    # group 0 = q heads 0,1 then k head 0 then v head 0 (head dim 8)
    assert torch.equal(fused[:16], q[:16]) and torch.equal(fused[16:24], k[:8])
    assert torch.equal(fused[24:32], v[:8]) and torch.equal(fused[32:48], q[16:])
    for a, b in zip(split_qkv(fused, 4, 2), (q, k, v)):
        assert torch.equal(a, b)


def test_hf_llama_logits_match(tmp_path):
    hf = make_hf_llama(tmp_path / "hf", seed=3)
    cfg = tiny_cfg(trainer={"checkpoint": {"pretrained": str(tmp_path / "hf")}})
    tokens = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(tokens).logits
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)  # loads the HF weights, then wraps LoRA (B = 0)
        assert len(lora_modules(model)) == 8
        model.eval()
        with torch.no_grad():
            got = model(input_ids=tokens, position_ids=None, attention_mask=None)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    # a fresh random model (no import) is far off, so the match is not an accident
    with dist_session(tiny_cfg()) as info:
        other = build_model(tiny_cfg(), info.device).eval()
        with torch.no_grad():
            far = other(input_ids=tokens, position_ids=None, attention_mask=None)
    assert (far - ref).abs().max() > 1e-1


def test_import_reads_one_tensor_at_a_time(tmp_path):
    """A rank must not hold the whole checkpoint (138 GB for Llama2-70B, on every rank): nothing is read
    until the loader reaches a tensor, and each megatron tensor reads only its own HF tensors."""
    from trainer.model.hf.importer import hf_entries
    from trainer.model.hf.read import SafetensorsDir

    make_hf_llama(tmp_path / "hf", seed=1, layers=2)
    hf = SafetensorsDir(tmp_path / "hf")
    with dist_session(tiny_cfg()) as info:
        model = build_model(tiny_cfg(), info.device)
        full, missing = hf_entries(model, hf)
    assert hf.reads == 0 and not missing and len(full) == 2 * 6 + 3
    reads = []
    for name in full:
        before = hf.reads
        assert full[name].dim() in (1, 2)
        reads.append((name.rsplit(".", 2)[-2], hf.reads - before))
    assert dict(reads)["linear_qkv"] == 3 and dict(reads)["linear_fc1"] == 2 and hf.reads == 21
    assert torch.equal(full["decoder.layers.1.self_attention.linear_proj.weight"],
                       hf["model.layers.1.self_attn.o_proj.weight"])


@pytest.mark.parametrize("gone", ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"])
def test_missing_tensor_is_refused_before_loading(tmp_path, gone):
    from safetensors.torch import load_file, save_file

    make_hf_llama(tmp_path / "hf", seed=2)
    (f,) = (tmp_path / "hf").glob("*.safetensors")
    tensors = load_file(str(f))
    del tensors[gone]
    save_file(tensors, str(f), metadata={"format": "pt"})
    cfg = tiny_cfg(trainer={"checkpoint": {"pretrained": str(tmp_path / "hf")}})
    with dist_session(cfg) as info:
        with pytest.raises(KeyError, match=f"lacks 1 tensors.*{gone}"):
            build_model(cfg, info.device)
