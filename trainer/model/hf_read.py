"""Read a Hugging Face safetensors checkpoint one tensor at a time.

    hf = SafetensorsDir("/models/Qwen3-30B-A3B")     # single file, or sharded with model.safetensors.index.json
    t = hf["model.layers.0.self_attn.q_proj.weight"]  # read now (memory-mapped file), not kept by hf
    lazy = LazyTensors(hf, {"megatron.name": (("hf.a", "hf.b"), fuse_fn)})   # converted when accessed

Nothing is read up front: the index (or each file's header) says where every tensor lives, a file is opened
the first time one of its tensors is asked for, and a tensor is read only when it is indexed. A rank that
builds only its own tensors therefore holds them plus the one being converted (`reads` and `peak_bytes`
count what was read, for the memory-bound test and the import benchmark).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

import torch


class SafetensorsDir(Mapping):
    """The tensors of an HF checkpoint directory, each read on access."""

    def __init__(self, hf_dir):
        from safetensors import safe_open

        self._dir, self._open, self._handles = Path(hf_dir), safe_open, {}
        index = self._dir / "model.safetensors.index.json"
        if index.exists():
            self._where = dict(json.loads(index.read_text())["weight_map"])
            missing = sorted({f for f in self._where.values() if not (self._dir / f).exists()})
            if missing:
                raise FileNotFoundError(f"{index} names {len(missing)} missing shard(s), e.g. {missing[0]}")
        else:
            files = sorted(self._dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
            self._where = {}
            for f in files:
                self._where.update((key, f.name) for key in self._handle(f.name).keys())
        self.reads, self.read_bytes, self.largest = 0, 0, 0

    def _handle(self, file: str):
        if file not in self._handles:
            self._handles[file] = self._open(str(self._dir / file), framework="pt")
        return self._handles[file]

    def __getitem__(self, key: str) -> torch.Tensor:
        tensor = self._handle(self._where[key]).get_tensor(key)
        nbytes = tensor.numel() * tensor.element_size()
        self.reads += 1
        self.read_bytes += nbytes
        self.largest = max(self.largest, nbytes)
        return tensor

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
