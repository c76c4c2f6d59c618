"""One rule names LoRA's targets (primus_contract/targets.py): the linears the trainer wraps in a real tiny
megatron-core model (trainer/model/lora/layers.py lora_targets) are the ones the planner counts as adapted
(primus_contract/flops.py is_adapted, through plan/shapes.py), for full-name, last-part and layer-scoped patterns,
with exclusions, on a dense, a Qwen3-MoE and a DeepSeek MLA model."""
from __future__ import annotations

import pytest

from primus_contract.flops import layer_linears
from primus_contract.targets import canonical, targeted
from trainer.config import Config
from tests.model_helpers import DEEPSEEK_MLA, QWEN3_MOE, arch_sections, dist_session, tiny_cfg

PATTERNS = [
    (["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], []),
    (["*"], ["linear_fc2"]),
    (["decoder.layers.1.*"], []),
    (["*.mlp.*"], ["*shared_experts*"]),
    (["self_attention.*", "linear_q_proj"], ["decoder.layers.0.*"]),
    (["*_proj"], ["linear_kv_*"]),
    # dotted tails: before primus_contract/targets.py the trainer matched only the full name or its last part, so
    # these (which the contract accepted) wrapped nothing
    (["self_attention.linear_proj", "mlp.experts.linear_fc2", "layers.1.mlp.linear_fc1"], []),
]


def _planned(m: dict, targets, excludes) -> set:
    """The full names of the linears the planner's FLOPs/shapes count as adapted."""
    names = set()
    for layer in range(int(m["num_layers"])):
        for short, suffix, *_ in layer_linears(m, layer):
            path = f"decoder.layers.{layer}.{suffix}"
            if short != "router" and targeted((path,), targets, excludes):
                names.add(path)
    return names


@pytest.mark.parametrize("arch", [None, QWEN3_MOE, DEEPSEEK_MLA], ids=["dense", "qwen3-moe", "mla"])
def test_trainer_wraps_what_the_planner_counts(arch):
    from trainer.model import build_model
    from trainer.model.lora.layers import lora_targets

    cfg = tiny_cfg(trainer={**(arch_sections(arch) if arch else {}), "lora": {"enabled": False}})
    m = cfg.to_dict()["trainer"]["model"]
    with dist_session(Config.from_dict(cfg.to_dict())) as info:
        model = build_model(cfg, info.device)
        for targets, excludes in PATTERNS:
            wrapped = {canonical(n) for n in lora_targets(model, targets, excludes)}
            planned = _planned(m, targets, excludes)
            assert wrapped and wrapped == planned, (targets, excludes, sorted(wrapped ^ planned))
    assert "decoder.layers.1.self_attention.linear_proj" in wrapped
