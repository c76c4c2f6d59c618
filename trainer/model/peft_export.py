"""Export the LoRA adapters in Hugging Face PEFT format, independent of the parallel layout.

    export_peft(model, cfg, out_dir)   # collective over TP and PP; rank 0 of DP writes

Writes `adapter_config.json` + `adapter_model.safetensors` that
`peft.PeftModel.from_pretrained(LlamaForCausalLM, out_dir)` loads. Fused megatron linears are split
into HF modules: linear_qkv -> q/k/v_proj (each gets the same A; B split per query group),
linear_fc1 -> gate/up_proj (same A; B split in halves); linear_proj -> o_proj, linear_fc2 ->
down_proj. The scale alpha/r is the same in both, so outputs are identical. MoE: routed expert j's
adapters -> mlp.experts.<j>.gate_proj/up_proj/down_proj (the per-expert module names of the HF hub
checkpoints, global expert index whatever the EP layout), shared experts -> mlp.shared_experts.*;
multi-latent attention adapters are not exported (NotImplementedError).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.model.hf_import import split_qkv
from trainer.model.layout import namer
from trainer.model.sharding import canonical, to_full

_PREFIX = "base_model.model.model.layers"


def gathered_adapters(model) -> dict[str, torch.Tensor]:
    """Full-size LoRA factors keyed 'layers.<global i>.<module path>.lora_a|b' (global expert indices
    too), from every TP/PP/EP rank (collective over TP, EP and PP)."""
    from megatron.core import parallel_state as ps

    tp_group = ps.get_tensor_model_parallel_group()
    rename = namer(model)
    local: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if not name.endswith((".lora_a", ".lora_b")):
            continue
        full = to_full(canonical(name), p.detach(), p, tp_group)
        key = rename(name)
        if not key.startswith("decoder.layers."):
            raise ValueError(f"PEFT export supports adapters on decoder layers only, not {name}")
        local[key[len("decoder."):]] = full.float().cpu()
    for size, group in ((ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_group),
                        (ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_group)):
        if size > 1:  # EP ranks hold different experts, PP ranks different layers
            chunks = [None] * size
            dist.all_gather_object(chunks, local, group=group())
            local = {k: v for c in chunks for k, v in c.items()}
    return local


_EXPERT_PATH = re.compile(r"^mlp\.experts\.(?:local_experts\.(\d+)\.(linear_fc[12])|(linear_fc[12])\.lora\.(\d+))$")
_MLA = ("linear_q_proj", "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj")


def _hf_module(path: str) -> tuple[str, str]:
    """(HF module prefix under the layer, megatron leaf) for a megatron module path in a layer."""
    m = _EXPERT_PATH.match(path)
    if m:  # routed expert j (SequentialMLP or TE grouped adapters)
        j, leaf = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(4), m.group(3))
        return f"mlp.experts.{j}", leaf
    block, _, leaf = path.rpartition(".")
    if leaf in _MLA:
        raise NotImplementedError("PEFT export of multi-latent-attention adapters is not implemented "
                                  "(set checkpoint.export_peft: false; checkpoints hold the adapters)")
    if block == "self_attention":
        return "self_attn", leaf
    if block == "mlp":
        return "mlp", leaf
    if block == "mlp.shared_experts":  # DeepSeek-V2 naming
        return "mlp.shared_experts", leaf
    raise ValueError(f"no HF PEFT mapping for LoRA on {path}")


def to_peft_tensors(adapters: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Megatron LoRA factors -> PEFT keys (…q_proj.lora_A.weight) with fused linears split. Routed
    experts map to the HF checkpoints' per-expert modules (mlp.experts.<j>.gate_proj/up_proj/down_proj)."""
    heads, groups = config.num_attention_heads, config.num_query_groups
    out: dict[str, torch.Tensor] = {}
    modules = sorted({k.rsplit(".", 1)[0] for k in adapters})
    for mod in modules:
        a, b = adapters[mod + ".lora_a"], adapters[mod + ".lora_b"]
        _, idx, path = mod.split(".", 2)
        prefix, leaf = _hf_module(path)
        pre = f"{_PREFIX}.{idx}.{prefix}"
        if leaf == "linear_qkv":
            pieces = zip(("q_proj", "k_proj", "v_proj"), split_qkv(b, heads, groups))
        elif leaf == "linear_proj":
            pieces = [("o_proj", b)]
        elif leaf == "linear_fc1":
            pieces = zip(("gate_proj", "up_proj"), b.chunk(2, dim=0))
        elif leaf == "linear_fc2":
            pieces = [("down_proj", b)]
        else:
            raise ValueError(f"no HF PEFT mapping for LoRA on {path}")
        for hf, piece in pieces:
            out[f"{pre}.{hf}.lora_A.weight"] = a
            out[f"{pre}.{hf}.lora_B.weight"] = piece
    return {k: v.clone().contiguous() for k, v in out.items()}  # no shared storage (safetensors)


def adapter_config(cfg, targets: list[str]) -> dict:
    lcfg = cfg.trainer.lora
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(lcfg.dim),
        "lora_alpha": float(lcfg.alpha), "lora_dropout": float(lcfg.dropout or 0.0),
        "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "inference_mode": True,
        "base_model_name_or_path": cfg.trainer.checkpoint.pretrained or None,
        "init_lora_weights": True, "modules_to_save": None,
    }


def export_peft(model, cfg, out_dir, dtype: torch.dtype = torch.float32) -> Path | None:
    """Gather and write the adapter; returns out_dir on the writing rank, None elsewhere."""
    from safetensors.torch import save_file

    from megatron.core import parallel_state as ps

    adapters = gathered_adapters(model)  # collective: every rank calls it
    writer = (not dist.is_initialized()) or (ps.get_data_parallel_rank() == 0 and
                                              ps.get_tensor_model_parallel_rank() == 0 and
                                              ps.get_pipeline_model_parallel_rank() == 0)
    if not writer:
        return None
    tensors = {k: v.to(dtype) for k, v in to_peft_tensors(adapters, model.config).items()}
    targets = sorted({k.split(".")[-3] for k in tensors})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(adapter_config(cfg, targets), indent=2))
    return out
