"""Read a Hugging Face safetensors checkpoint one tensor at a time (the HF import, the merged export, the adapter).

    hf = SafetensorsDir("/models/Qwen3-30B-A3B")     # sharded with model.safetensors.index.json, or single file
    t = hf["model.layers.0.self_attn.q_proj.weight"]  # read now (memory-mapped file), not kept by hf
    dtype, shape = hf.meta("model.norm.weight")       # from the file's header, nothing read
    lazy = LazyTensors(hf, {"megatron.name": (("hf.a", "hf.b"), fuse_fn)})   # converted when accessed

Which files: the ones model.safetensors.index.json names (a repo may also hold e.g. consolidated.safetensors),
else model.safetensors, else every *.safetensors. Names iterate file by file, then by name (the merged export
writes its shards in that order).

Nothing is read up front: the index (or each file's header) says where every tensor lives, and a tensor is read
only when it is indexed. One file is open (memory-mapped) at a time, so neither a rank's import nor a sequential
pass over a 470 GB checkpoint ever maps all of its shards. A rank that builds only its own tensors therefore
holds them plus the one being converted (`reads`, `read_bytes` and `largest` count what was read, for the
memory-bound test and the import benchmark).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

import torch

# torch dtype <-> safetensors header dtype (the merged export writes headers with it)
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
_TORCH = {v: k for k, v in DTYPES.items()}


class SafetensorsDir(Mapping):
    """The tensors of a safetensors checkpoint directory, each read on access (module docstring)."""

    def __init__(self, directory):
        self._dir, self._file, self._handle_of = Path(directory), None, None
        index = self._dir / "model.safetensors.index.json"
        if index.exists():
            where = dict(json.loads(index.read_text())["weight_map"])
            missing = sorted({f for f in where.values() if not (self._dir / f).exists()})
            if not where:
                raise FileNotFoundError(f"{index} names no tensors")
            if missing:
                raise FileNotFoundError(f"{index} names {len(missing)} missing shard(s), e.g. {missing[0]}")
        else:
            single = self._dir / "model.safetensors"
            files = [single] if single.exists() else sorted(self._dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {directory}")
            where = {key: f.name for f in files for key in self._handle(f.name).keys()}
        self._where = dict(sorted(where.items(), key=lambda kv: (kv[1], kv[0])))
        self.reads, self.read_bytes, self.largest = 0, 0, 0

    def _handle(self, file: str):
        """The open file; the previous one is dropped (unmapped once no tensor read from it is alive)."""
        if file != self._file:
            from safetensors import safe_open

            self._file = self._handle_of = None  # the previous file goes before the next one is mapped
            self._handle_of = safe_open(str(self._dir / file), framework="pt")
            self._file = file
        return self._handle_of

    def __getitem__(self, key: str) -> torch.Tensor:
        tensor = self._handle(self._where[key]).get_tensor(key)
        nbytes = tensor.numel() * tensor.element_size()
        self.reads += 1
        self.read_bytes += nbytes
        self.largest = max(self.largest, nbytes)
        return tensor

    def meta(self, key: str) -> tuple[torch.dtype, tuple]:
        """(dtype, shape) of one tensor, from its file's header (nothing is read)."""
        sl = self._handle(self._where[key]).get_slice(key)
        return _TORCH[sl.get_dtype()], tuple(sl.get_shape())

    def __contains__(self, key) -> bool:  # (Mapping's default would read the tensor)
        return key in self._where

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class LazyTensors(Mapping):
    """name -> tensor converted from HF tensors when accessed (and not kept). Each entry is
    (HF source names, function of those tensors)."""

    def __init__(self, hf: Mapping, entries: dict[str, tuple[tuple[str, ...], Callable]]):
        self._hf, self._entries = hf, entries

    def __getitem__(self, key: str) -> torch.Tensor:
        sources, fn = self._entries[key]
        return fn(*(self._hf[s] for s in sources))

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def sources(self) -> set[str]:
        """Every HF name these entries read (no tensor is read)."""
        return {s for sources, _ in self._entries.values() for s in sources}

    def absent_sources(self) -> list[str]:
        """HF names these entries need that the checkpoint lacks (no tensor is read)."""
        return sorted(s for s in self.sources() if s not in self._hf)
