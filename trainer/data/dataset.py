"""`PackedDataset`: a sequence of packs built lazily from a compact on-disk-friendly layout.

Storage (also what the cache saves): all kept documents' tokens concatenated (``tokens`` int32, ``sup`` uint8
supervise flags, ``doc_offsets`` [N+1]) plus the packing (``pack_docs`` document ids in pack order,
``pack_offsets`` [P+1]). ``ds[i]`` returns the pack dict of the contract:

  input_ids [S] int64, labels [S] int64, loss_mask [S] float32, position_ids [S] int64,
  cu_seqlens [n_segments+1] int32, num_tokens int

For each document of length n at offset c: ``labels[c+j] = tokens[j+1]`` and ``loss_mask[c+j] = sup[j+1]`` for
j < n-1; its last position gets IGNORE_INDEX / 0 (labels never cross documents); ``position_ids`` restart at 0.
The padding tail (pad id, IGNORE_INDEX, mask 0, positions 0..) is its own segment in cu_seqlens.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .tokenize import IGNORE_INDEX

ARRAYS = ("tokens", "sup", "doc_offsets", "pack_docs", "pack_offsets")


class PackedDataset:
    def __init__(self, tokens: np.ndarray, sup: np.ndarray, doc_offsets: np.ndarray, pack_docs: np.ndarray,
                 pack_offsets: np.ndarray, sample_length: int, pad_id: int):
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.sup = np.asarray(sup, dtype=np.uint8)
        self.doc_offsets = np.asarray(doc_offsets, dtype=np.int64)
        self.pack_docs = np.asarray(pack_docs, dtype=np.int64)
        self.pack_offsets = np.asarray(pack_offsets, dtype=np.int64)
        self.sample_length = int(sample_length)
        self.pad_id = int(pad_id)
        too_long = self.pack_lengths() > self.sample_length
        if too_long.any():
            raise ValueError(f"pack {int(np.argmax(too_long))} is longer than sample_length {sample_length}")

    def __len__(self) -> int:
        return len(self.pack_offsets) - 1

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self[i]

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    def doc_lengths(self) -> np.ndarray:
        return np.diff(self.doc_offsets)

    def pack_lengths(self) -> np.ndarray:
        """Real tokens per pack."""
        per_doc = self.doc_lengths()[self.pack_docs]
        csum = np.concatenate([[0], np.cumsum(per_doc)])
        return csum[self.pack_offsets[1:]] - csum[self.pack_offsets[:-1]]

    def max_pack_documents(self) -> int:
        """The most documents one pack holds (0 without packs): 1 or less means every row is one document."""
        return int(np.diff(self.pack_offsets).max()) if len(self) else 0

    def one_document_packs(self) -> int:
        """How many packs hold one document (their rows run sbhd, and FP8 attention where it follows the layout)."""
        return int((np.diff(self.pack_offsets) == 1).sum())

    def documents_of(self, i: int) -> np.ndarray:
        return self.pack_docs[self.pack_offsets[i]:self.pack_offsets[i + 1]]

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        S = self.sample_length
        input_ids = np.full(S, self.pad_id, dtype=np.int64)
        labels = np.full(S, IGNORE_INDEX, dtype=np.int64)
        loss_mask = np.zeros(S, dtype=np.float32)
        position_ids = np.zeros(S, dtype=np.int64)
        cu = [0]
        c = 0
        for d in self.documents_of(i).tolist():
            a, b = self.doc_offsets[d], self.doc_offsets[d + 1]
            n = int(b - a)
            input_ids[c:c + n] = self.tokens[a:b]
            labels[c:c + n - 1] = self.tokens[a + 1:b]
            loss_mask[c:c + n - 1] = self.sup[a + 1:b]
            position_ids[c:c + n] = np.arange(n)
            c += n
            cu.append(c)
        if c < S:
            position_ids[c:] = np.arange(S - c)
            cu.append(S)
        return {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids,
                "cu_seqlens": np.asarray(cu, dtype=np.int32), "num_tokens": c}

    def arrays(self) -> dict:
        return {k: getattr(self, k) for k in ARRAYS}

    @classmethod
    def from_arrays(cls, arrays: dict, sample_length: int, pad_id: int) -> "PackedDataset":
        return cls(*(arrays[k] for k in ARRAYS), sample_length=sample_length, pad_id=pad_id)

    def supervised_tokens(self) -> int:
        """Number of label positions with loss (sup of every non-first token of every packed document)."""
        firsts = self.doc_offsets[:-1][self.doc_lengths() > 0]
        return int(self.sup.sum()) - int(self.sup[firsts].sum())
