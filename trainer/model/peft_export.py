"""Export the LoRA adapters in Hugging Face PEFT format, independent of the parallel layout.

    export_peft(model, cfg, out_dir)   # collective over TP and PP; rank 0 of DP writes

Writes `adapter_config.json` + `adapter_model.safetensors` that
`peft.PeftModel.from_pretrained(LlamaForCausalLM, out_dir)` loads. Fused megatron linears are split
into HF modules: linear_qkv -> q/k/v_proj (each gets the same A; B split per query group),
linear_fc1 -> gate/up_proj (same A; B split in halves); linear_proj -> o_proj, linear_fc2 ->
down_proj. The scale alpha/r is the same in both, so outputs are identical.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.model.hf_import import split_qkv
from trainer.model.sharding import canonical, to_full

_PREFIX = "base_model.model.model.layers"


def _global_layer_index(model, local_index: int) -> int:
    return int(model.decoder.layers[local_index].layer_number) - 1


def gathered_adapters(model) -> dict[str, torch.Tensor]:
    """Full-size LoRA factors keyed 'layers.<global i>.<module path>.lora_a|b' (all TP/PP ranks)."""
    from megatron.core import parallel_state as ps

    tp_group = ps.get_tensor_model_parallel_group()
    local: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if not name.endswith((".lora_a", ".lora_b")):
            continue
        full = to_full(canonical(name), p.detach(), p, tp_group)
        parts = canonical(name).split(".")
        if parts[:2] != ["decoder", "layers"]:
            raise ValueError(f"PEFT export supports adapters on decoder layers only, not {name}")
        gi = _global_layer_index(model, int(parts[2]))
        local[".".join(["layers", str(gi)] + parts[3:])] = full.float().cpu()
    if ps.get_pipeline_model_parallel_world_size() > 1:
        chunks = [None] * ps.get_pipeline_model_parallel_world_size()
        dist.all_gather_object(chunks, local, group=ps.get_pipeline_model_parallel_group())
        local = {k: v for c in chunks for k, v in c.items()}
    return local


def to_peft_tensors(adapters: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Megatron LoRA factors -> PEFT keys (…q_proj.lora_A.weight) with fused linears split."""
    heads, groups = config.num_attention_heads, config.num_query_groups
    out: dict[str, torch.Tensor] = {}
    modules = sorted({k.rsplit(".", 1)[0] for k in adapters})
    for mod in modules:
        a, b = adapters[mod + ".lora_a"], adapters[mod + ".lora_b"]
        _, idx, block, leaf = mod.split(".")
        pre = f"{_PREFIX}.{idx}"
        if leaf == "linear_qkv":
            for hf, piece in zip(("q_proj", "k_proj", "v_proj"), split_qkv(b, heads, groups)):
                out[f"{pre}.self_attn.{hf}.lora_A.weight"] = a
                out[f"{pre}.self_attn.{hf}.lora_B.weight"] = piece
        elif leaf == "linear_proj":
            out[f"{pre}.self_attn.o_proj.lora_A.weight"] = a
            out[f"{pre}.self_attn.o_proj.lora_B.weight"] = b
        elif leaf == "linear_fc1":
            gate, up = b.chunk(2, dim=0)
            for hf, piece in (("gate_proj", gate), ("up_proj", up)):
                out[f"{pre}.mlp.{hf}.lora_A.weight"] = a
                out[f"{pre}.mlp.{hf}.lora_B.weight"] = piece
        elif leaf == "linear_fc2":
            out[f"{pre}.mlp.down_proj.lora_A.weight"] = a
            out[f"{pre}.mlp.down_proj.lora_B.weight"] = b
        else:
            raise ValueError(f"no HF PEFT mapping for LoRA on {block}.{leaf}")
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
