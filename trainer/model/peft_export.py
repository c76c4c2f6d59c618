"""Export the LoRA adapters in Hugging Face PEFT format, independent of the parallel layout.

    export_peft(model, cfg, out_dir)   # collective over TP, EP and PP; rank 0 of DP writes

Writes `adapter_config.json` + `adapter_model.safetensors` that `peft.PeftModel.from_pretrained` loads onto the
installed transformers (5.x) model. Fused megatron linears are split into HF modules: linear_qkv -> q/k/v_proj
(each gets the same A; B split per query group), linear_fc1 -> gate/up_proj (same A; B split in halves);
linear_proj -> o_proj, linear_fc2 -> down_proj, shared experts -> mlp.shared_experts.*. The scale alpha/r is
the same in both, so outputs are identical.

MoE models (transformers keeps routed experts fused in memory: mlp.experts.gate_up_proj [E, 2I, H] =
[gate_e; up_e] per expert, mlp.experts.down_proj [E, H, I], both [out, in] per expert): the routed experts'
adapters are written for peft's ParamWrapper (`target_parameters`: mlp.experts.gate_up_proj /
mlp.experts.down_proj), whose delta for expert e is scale * B_e @ A_e with A = [A_0; ...; A_{E-1}] [E*r, in]
and B [out, r*E] holding B_e in columns e, e+E, ... . megatron's fc1 output is [gate; up] with one A, so
gate_up_proj takes fc1's factors as they are: exact, same rank. peft nests the two wrappers in parameter order
(gate_up_proj inside): `fused_expert_keys`. On these model types peft's transformers-v5 conversion rewrites
module targets named gate_proj/up_proj/down_proj into the fused expert parameters, so the dense and shared-expert
MLP linears are targeted as parameters too (mlp.gate_proj.weight, mlp.shared_experts.gate_proj.weight, ...;
same keys, same math). peft's ParamWrapper refuses lora_dropout != 0: the adapter_config then says 0 (dropout is
a training-time setting; inference never applies it).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.model.hf.names import hf_source, split_qkv
from trainer.model.layout import namer
from trainer.model.sharding import canonical, to_full

PEFT_PREFIX = "base_model.model."  # PEFT's prefix of the wrapped transformers model's names (hf.merge reads it)
_PREFIX = PEFT_PREFIX + "model.layers"


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
_FUSED_ROLE = {"linear_fc1": "gate_up_proj", "linear_fc2": "down_proj"}


def fused_expert_keys(target_parameters) -> dict[bool, str]:
    """{inner: fused parameter}: the peft module key of each fused expert parameter, `mlp.experts.base_layer`
    (inner=True) or `mlp.experts`. peft wraps a module's targeted parameters in their definition order
    (transformers: gate_up_proj, then down_proj), each wrapper around the previous one."""
    roles = [r for r in ("gate_up_proj", "down_proj") if any(str(t).endswith(f"experts.{r}") for t in target_parameters)]
    return {False: roles[0]} if len(roles) == 1 else ({True: roles[0], False: roles[1]} if roles else {})


def _hf_pieces(idx: str, path: str, b: torch.Tensor, heads: int, groups: int) -> list[tuple[str, torch.Tensor]]:
    """(HF module under the layer, its piece of B) for the LoRA on megatron module `path` of layer idx. The names
    are the HF import's (trainer.model.hf.names.hf_source of `<path>.weight`: MLA's linears a rename, as the
    import copies their rows as is); a fused linear's B is split like its weight: linear_qkv per query group into
    q/k/v_proj, linear_fc1 in halves into gate/up_proj."""
    src = hf_source(f"decoder.layers.{idx}.{path}.weight", heads, groups)
    if src is None:
        raise ValueError(f"no HF PEFT mapping for LoRA on {path}")
    layer = f"model.layers.{idx}."
    names = [s[len(layer):-len(".weight")] for s in src[0]]
    pieces = split_qkv(b, heads, groups) if len(names) == 3 else b.chunk(2, dim=0) if len(names) == 2 else (b,)
    return list(zip(names, pieces))


def _fuse_experts(per_expert: dict, experts: int, out: dict) -> set[str]:
    """Routed experts' factors {(layer, leaf): {j: (A, B)}} -> ParamWrapper keys (module docstring). peft wraps
    every layer's experts in every parameter of target_parameters, which is one list for the model: the nesting
    (gate_up_proj inside down_proj when both are targeted) is the model's, and a layer that adapts one of the two
    gets zero factors for the other (audit, 2026-12-06: decided per layer, such an adapter did not load)."""
    roles = {leaf for _, leaf in per_expert}
    fused: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (idx, leaf), by_j in sorted(per_expert.items()):
        if sorted(by_j) != list(range(experts)):
            raise ValueError(f"layer {idx} {leaf}: adapters of experts {sorted(by_j)}, expected all {experts}")
        a = torch.cat([by_j[j][0] for j in range(experts)], dim=0)       # [E*r, in]
        b = torch.stack([by_j[j][1] for j in range(experts)], dim=2)     # [out, r, E]
        fused[(idx, leaf)] = a, b.reshape(b.shape[0], -1)                 # column k*E + e = B_e[:, k]
    shape = {leaf: tensors for (_, leaf), tensors in fused.items()}  # (the same in every MoE layer)
    for idx in sorted({i for i, _ in per_expert}):
        for leaf in sorted(roles):
            a, b = fused.get((idx, leaf)) or tuple(torch.zeros_like(t) for t in shape[leaf])
            inner = leaf == "linear_fc1" and roles == set(_FUSED_ROLE)
            pre = f"{_PREFIX}.{idx}.mlp.experts" + (".base_layer" if inner else "")
            out[f"{pre}.lora_A.weight"], out[f"{pre}.lora_B.weight"] = a, b
    return {f"mlp.experts.{_FUSED_ROLE[leaf]}" for leaf in roles}


def to_peft_tensors(adapters: dict[str, torch.Tensor], config) -> tuple[dict[str, torch.Tensor], list, list]:
    """Megatron LoRA factors -> (PEFT tensors, target_modules, target_parameters), fused linears split. Dense
    models: every adapter on an HF linear module. MoE models: routed experts on the fused expert parameters,
    the other MLP linears as parameters (module docstring)."""
    heads, groups = config.num_attention_heads, config.num_query_groups
    moe = bool(getattr(config, "num_moe_experts", None))
    out: dict[str, torch.Tensor] = {}
    modules, params, per_expert = set(), set(), {}
    for mod in sorted({k.rsplit(".", 1)[0] for k in adapters}):
        a, b = adapters[mod + ".lora_a"], adapters[mod + ".lora_b"]
        _, idx, path = mod.split(".", 2)
        m = _EXPERT_PATH.match(path)
        if m:  # routed expert j (SequentialMLP or TE grouped adapters)
            j, leaf = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(4), m.group(3))
            if moe:
                per_expert.setdefault((int(idx), leaf), {})[int(j)] = (a, b)
                continue
            path = f"mlp.experts.local_experts.{j}.{leaf}"
        for hf, piece in _hf_pieces(idx, path, b, heads, groups):
            out[f"{_PREFIX}.{idx}.{hf}.lora_A.weight"] = a
            out[f"{_PREFIX}.{idx}.{hf}.lora_B.weight"] = piece
            if moe and hf.startswith("mlp"):
                params.add(f"{hf}.weight")
            else:
                modules.add(hf.rsplit(".", 1)[-1])
    if per_expert:
        params |= _fuse_experts(per_expert, int(config.num_moe_experts), out)
    tensors = {k: v.clone().contiguous() for k, v in out.items()}  # no shared storage (safetensors)
    return tensors, sorted(modules), sorted(params)


def adapter_config(cfg, targets: list[str], parameters: list[str] = ()) -> dict:
    lcfg = cfg.trainer.lora
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(lcfg.dim), "lora_alpha": float(lcfg.alpha),
        # (peft's ParamWrapper refuses dropout; it is a training-time setting, inference never applies it)
        "lora_dropout": 0.0 if parameters else float(lcfg.dropout or 0.0),
        "target_modules": sorted(targets), "target_parameters": sorted(parameters) or None,
        "bias": "none", "fan_in_fan_out": False,
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
    tensors, targets, parameters = to_peft_tensors(adapters, model.config)
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(adapter_config(cfg, targets, parameters), indent=2))
    return out
