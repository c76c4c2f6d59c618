"""Fold a PEFT LoRA adapter into its base Hugging Face checkpoint, tensor by tensor.

    info = merge_adapter(base_dir, adapter_dir, out_dir, note="trained with FP8 (hybrid)")

writes out_dir/{model-0000k-of-0000n.safetensors, model.safetensors.index.json, config.json,
generation_config.json (if the base has one), the base's tokenizer files (unless base_tokenizer=False),
README.md}: every base tensor with W + (alpha/r)·B@A added (computed in fp32, stored in the base tensor's dtype), in
the base's on-disk names and layout. Returns what was written (tensors, merged, shards, bytes, seconds).

Adapter key -> base tensor on disk (`delta_plan`; keys are PEFT's, base_model.model.<path>):
* <P>.lora_A/B.weight where the base has <P>.weight (a linear module, or a 2-D parameter targeted by
  `target_parameters`, e.g. mlp.shared_experts.gate_proj.weight) -> <P>.weight += s·B@A.
* <L>.mlp.experts[.base_layer].lora_A/B.weight: peft's ParamWrapper over transformers 5's fused experts
  (trainer.model.peft_export.fused_expert_keys says which key is gate_up_proj and which down_proj).
  A [E·r, in]: expert e's rows e·r..e·r+r-1; B [out, r·E]: expert e's columns e, e+E, …. Their delta
  B_e@A_e [out, in] is added per expert to the Hub's per-expert tensors: gate_up_proj's rows [:I] to
  <L>.mlp.experts.<e>.gate_proj.weight and [I:] to ….up_proj.weight, down_proj's to ….down_proj.weight
  (or to the 3-D <L>.mlp.experts.gate_up_proj / down_proj if the base stores them fused).
An adapter key that reaches no base tensor, or whose delta's shape is not that tensor's, is an error (nothing is
written), never skipped.

Memory: the base is memory-mapped (one file at a time: trainer.model.hf.read) and read one tensor at a time; each
output shard is written by streaming (header first, sizes known from the base), so the heap peak is about one tensor
plus its fp32 copy, not a shard (bench/merge_export_bench.py measures it).
"""
from __future__ import annotations

import json
import math
import re
import shutil
import struct
import time
from functools import lru_cache
from pathlib import Path

import torch

from trainer.model.hf.read import DTYPES, SafetensorsDir
from trainer.model.peft_export import PEFT_PREFIX as _PREFIX, fused_expert_keys

_COPIED = ("config.json", "generation_config.json", "preprocessor_config.json", "LICENSE*", "NOTICE*")
_TOKENIZER = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt", "*.tiktoken",
              "chat_template.*")  # the base's tokenizer: copied unless the caller writes another
_FUSED = re.compile(r"^(?P<layer>.+\.mlp\.experts)(?P<inner>\.base_layer)?$")


def _scale(conf: dict) -> float:
    for key in ("use_dora", "fan_in_fan_out", "lora_bias"):
        if conf.get(key):
            raise ValueError(f"adapter_config {key}: true cannot be merged here (plain LoRA only)")
    if conf.get("rank_pattern") or conf.get("alpha_pattern"):
        raise ValueError("adapter_config rank_pattern/alpha_pattern are not supported by the merge")
    r, alpha = int(conf["r"]), float(conf["lora_alpha"])
    return alpha / math.sqrt(r) if conf.get("use_rslora") else alpha / r


class _Factors:
    """The adapter's A/B tensors, memory-mapped and cached a few modules at a time."""

    def __init__(self, adapter_dir):
        self.hf = SafetensorsDir(adapter_dir)
        self.get = lru_cache(maxsize=8)(self.hf.__getitem__)

    def pair(self, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.get(f"{_PREFIX}{module}.lora_A.weight").float(),
                self.get(f"{_PREFIX}{module}.lora_B.weight").float())


def _expert_delta(factors: _Factors, module: str, e: int, experts: int, rows: slice | None, scale: float):
    def delta() -> torch.Tensor:
        a, b = factors.pair(module)
        r = a.shape[0] // experts
        b_e = b[:, e::experts] if rows is None else b[rows, e::experts]  # B_e [out, r] (or its rows)
        return b_e @ a[e * r:(e + 1) * r] * scale                       # @ A_e [r, in]
    return delta


def delta_plan(base: SafetensorsDir, factors: _Factors, conf: dict) -> dict[str, list]:
    """base tensor name -> callables giving the fp32 deltas to add (read when called)."""
    scale = _scale(conf)
    modules = sorted({k[len(_PREFIX):].rsplit(".", 2)[0] for k in factors.hf if k.startswith(_PREFIX)
                      and k.endswith((".lora_A.weight", ".lora_B.weight"))})
    if len(modules) * 2 != len(factors.hf):
        raise ValueError(f"adapter holds {len(factors.hf)} tensors, not only lora_A/lora_B pairs")
    roles = fused_expert_keys(conf.get("target_parameters") or [])
    plan: dict[str, list] = {}

    def add(name: str, fn, shape: tuple, mod: str) -> None:  # shapes from the headers: nothing is read
        if tuple(shape) != base.meta(name)[1]:
            raise ValueError(f"adapter module {mod}: its delta for {name} is {tuple(shape)}, the base tensor "
                             f"{base.meta(name)[1]}")
        plan.setdefault(name, []).append(fn)

    for mod in modules:
        (r_in, n_in), (n_out, _) = (factors.hf.meta(f"{_PREFIX}{mod}.lora_{x}.weight")[1] for x in "AB")
        if f"{mod}.weight" in base:
            add(f"{mod}.weight", lambda mod=mod: (lambda a, b: b @ a * scale)(*factors.pair(mod)), (n_out, n_in), mod)
            continue
        m = _FUSED.match(mod)
        role = roles.get(bool(m and m.group("inner"))) if m else None
        if role is None:
            raise KeyError(f"adapter module {mod} maps to no tensor of the base checkpoint")
        layer = m.group("layer")
        experts = r_in // int(conf["r"])
        fused = f"{layer}.{role}"
        if fused in base:  # the base stores the 3-D fused tensor
            add(fused, lambda mod=mod, n=experts: torch.stack(
                [_expert_delta(factors, mod, e, n, None, scale)() for e in range(n)]), (experts, n_out, n_in), mod)
            continue
        for e in range(experts):
            if role == "down_proj":
                targets = [(f"{layer}.{e}.down_proj.weight", None)]
            else:
                gate = f"{layer}.{e}.gate_proj.weight"
                size = base.meta(gate)[1][0] if gate in base else 0
                targets = [(f"{layer}.{e}.gate_proj.weight", slice(0, size)),
                           (f"{layer}.{e}.up_proj.weight", slice(size, None))]
            for name, rows in targets:
                if name not in base:
                    raise KeyError(f"adapter module {mod} (expert {e}, {role}) needs {name}, absent from the base")
                out_rows = n_out if rows is None else len(range(n_out)[rows])
                add(name, _expert_delta(factors, mod, e, experts, rows, scale), (out_rows, n_in), mod)
    return plan


def _header(entries: list[tuple[str, torch.dtype, tuple]], metadata: dict) -> tuple[bytes, list[int]]:
    """A safetensors header for tensors written back to back in `entries` order; returns (bytes, sizes)."""
    head, offset, sizes = {"__metadata__": metadata}, 0, []
    for name, dtype, shape in entries:
        if dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {dtype} cannot be written")
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        head[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
        sizes.append(size)
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, sizes


def _shards(base: SafetensorsDir, shard_bytes: int) -> list[list[tuple[str, torch.dtype, tuple]]]:
    shards, size = [[]], 0
    for name in base:
        dtype, shape = base.meta(name)
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, dtype, shape))
        size += n
    return shards


def _merged(base: SafetensorsDir, name: str, deltas: list) -> torch.Tensor:
    w = base[name]
    if not deltas:
        return w
    if not w.dtype.is_floating_point or w.element_size() < 2:
        raise ValueError(f"{name}: a LoRA delta cannot be folded into a {w.dtype} tensor (quantized base)")
    acc = w.float()
    for fn in deltas:
        acc += fn().reshape(acc.shape)
    return acc.to(w.dtype)


def merge_adapter(base_dir, adapter_dir, out_dir, *, note: str = "", shard_bytes: int = 4 * 1024**3,
                  base_tokenizer: bool = True) -> dict:
    """Write base + adapter as a complete HF checkpoint in out_dir (see the module docstring); `base_tokenizer`
    False: without the base's tokenizer files (the caller saves the tokenizer the adapter was trained with)."""
    start = time.perf_counter()
    base_dir, adapter_dir, out = Path(base_dir), Path(adapter_dir), Path(out_dir)
    conf = json.loads((adapter_dir / "adapter_config.json").read_text())
    if conf.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"adapter peft_type {conf.get('peft_type')!r}: only LORA merges")
    if out.resolve() in (base_dir.resolve(), adapter_dir.resolve()):
        raise ValueError(f"merge output {out} must not be the base or the adapter directory")
    if out.is_dir() and any(out.glob("*.safetensors")):
        raise FileExistsError(f"{out} already holds *.safetensors; merge into an empty directory")
    base, factors = SafetensorsDir(base_dir), _Factors(adapter_dir)
    plan = delta_plan(base, factors, conf)  # every adapter key is placed before anything is written
    out.mkdir(parents=True, exist_ok=True)
    shards = _shards(base, shard_bytes)
    weight_map, total = {}, 0
    for k, entries in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        head, sizes = _header(entries, {"format": "pt"})
        with open(out / fname, "wb") as fh:
            fh.write(head)
            for (name, _, _), size in zip(entries, sizes):
                t = _merged(base, name, plan.get(name, [])).contiguous()
                data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
                if len(data) != size:
                    raise AssertionError(f"{name}: wrote {len(data)} bytes, header says {size}")
                fh.write(memoryview(data))
                weight_map[name] = fname
                total += size
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    patterns = _COPIED + (_TOKENIZER if base_tokenizer else ())
    copied = sorted({f.name for pattern in patterns for f in base_dir.glob(pattern) if f.is_file()})
    for f in copied:
        shutil.copy2(base_dir / f, out / f)
    info = {"out": str(out), "base": str(base_dir), "adapter": str(adapter_dir), "tensors": len(weight_map),
            "merged_tensors": len(plan), "shards": len(shards), "bytes": total, "copied": copied,
            "scale": _scale(conf), "note": note, "seconds": round(time.perf_counter() - start, 3)}
    readme = (f"Merged checkpoint: base {base_dir} + LoRA adapter {adapter_dir} (r {conf['r']}, alpha "
              f"{conf['lora_alpha']}), {len(plan)} of {len(weight_map)} tensors changed, stored in the base's "
              f"dtypes.\n")
    (out / "README.md").write_text(readme + (f"Training precision: {note}\n" if note else ""))
    return info
