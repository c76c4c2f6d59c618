"""trainer.model.transforms: the build applies one ordered list, and the BuiltModel carries what each decided
(the lines the train loop logs after the precision line), nothing set on the model."""
import torch

from tests.model_helpers import dist_session, tiny_cfg
from trainer.model import build
from trainer.model.transforms import TRANSFORMS
from trainer.precision import Environment, resolve


def test_transforms_run_in_order_and_report_their_lines():
    assert [t.name for t in TRANSFORMS] == ["hf import", "fp8 params", "lora", "fp8 transposes", "adapter inputs",
                                            "fused swiglu", "fp8 swiglu kernels", "fp8 swiglu store",
                                            "lora epilogue", "tp comm overlap", "chunked loss", "fp4 emulation"]
    cfg = tiny_cfg(trainer={"recompute": {"adapter_inputs": True, "adapter_inputs_scope": "fc2"},
                            "precision": {"fp4": "e2m1", "fp4_emulation": True}})
    prec = resolve(cfg, Environment(device="cpu"))
    with dist_session(cfg) as info:
        built = build(cfg, info.device, prec)
    assert built.precision is prec and built.ub_tokens is None
    assert [name for name, _ in built.lines] == ["lora", "adapter inputs", "fused swiglu", "lora epilogue",
                                                  "chunked loss", "fp4 emulation"]
    adapters = sum(p.numel() for n, p in built.model.named_parameters() if n.endswith((".lora_a", ".lora_b")))
    assert adapters == 2 * (4 * 64 + 128 * 4 + 4 * 64 + 64 * 4 + 4 * 64 + 320 * 4 + 4 * 160 + 64 * 4)  # 2 layers
    assert built.log_lines == [f"lora | rank 4 | alpha 8 | wrapped linears 8 | trainable parameters {adapters} "
                               "(this rank)",
                               "adapter inputs | scope fc2 | fc2 2 | norm 0",
                               # on by default (null), but fc2's adapter recomputes from fc1's full output here
                               "fused swiglu | off: recompute.adapter_inputs scope fc2 recomputes fc2's input from "
                               "fc1's full output, which the fold never writes; the unfused path",
                               # on by default (null) where it was measured: BF16 on an NVIDIA GPU
                               "lora epilogue | auto (epilogue null): off, not an NVIDIA GPU (where it was measured)",
                               "chunked loss | output layer + cross-entropy in token chunks, logits not kept | torch ops",
                               f"fp4 emulation | {prec.settings.fp4_recipe} quantize-dequantize on 8 linears"]
    assert built.line("hf import") is None and built.line("adapter inputs").startswith("adapter inputs | ")
    assert not [k for m in built.model.modules() for k in vars(m) if k.startswith("_primus_")]
    assert any(p.requires_grad for p in built.model.parameters()) and isinstance(built.model, torch.nn.Module)


def test_without_chunked_loss_only_lora_applies():
    cfg = tiny_cfg(trainer={"recompute": {"chunked_loss": False}, "lora": {"fused_swiglu": False, "epilogue": False}})
    with dist_session(cfg) as info:
        built = build(cfg, info.device)
    assert [name for name, _ in built.lines] == ["lora"] and built.log_lines[0].startswith("lora | rank 4 | ")
    assert len(built.log_lines) == 1
