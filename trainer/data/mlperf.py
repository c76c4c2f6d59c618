"""The MLPerf Llama2-70B LoRA packed format (GovReport, seq 8192).

A directory with ``train.npy`` and ``validation.npy`` — numpy object arrays of dicts, one per pack:
``input_ids`` (token ids), ``loss_mask`` (per token, 1 where the token is an answer/target token) and
``seq_start_id`` (offsets of the documents inside the pack, starting at 0) — plus ``packed_metadata.jsonl``
(one JSON line: ``max_samples_per_bin``, ``dataset_max_seqlen``, ``min_packed_seqlen``).
`load_split` turns it into the same `PackedDataset` as the tokenizing path (documents from seq_start_id, so
labels never cross documents and cu_seqlens follow them). `write_synthetic` writes such a directory.
"""
from __future__ import annotations

import json
import os

import numpy as np

from primus_contract import data_paths

from .dataset import PackedDataset
from .errors import DataError
from .options import DataOptions, SourceSpec
from .packing import pack_lengths
from .stats import summarize

def split_file(spec: SourceSpec, key: str) -> str:
    if not spec.path:
        raise DataError(f"{key}.path: format mlperf_npy needs a local directory or .npy file")
    try:
        return data_paths.mlperf_file(os.path.abspath(os.path.expanduser(spec.path)), spec.split)
    except ValueError as exc:
        raise DataError(f"{key}.path: {exc}") from None


def load_packs(path: str, sample_length: int, limit: int | None = None) -> tuple[np.ndarray, ...]:
    """(tokens, sup, doc_offsets, pack_offsets) of a packed .npy file."""
    try:
        packs = np.load(path, allow_pickle=True)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{path}: not a readable .npy file ({type(e).__name__})") from None
    if limit is not None:
        packs = packs[:limit]
    toks, sups, doc_lens, docs_per_pack = [], [], [], []
    for i, p in enumerate(packs):
        loc = f"{path}:pack {i}"
        if not isinstance(p, dict) or not {"input_ids", "loss_mask", "seq_start_id"} <= set(p):
            raise DataError(f"{loc}: expected a dict with input_ids, loss_mask, seq_start_id")
        ids = np.asarray(p["input_ids"], dtype=np.int64)
        lm = np.asarray(p["loss_mask"], dtype=np.uint8)
        starts = np.asarray(p["seq_start_id"], dtype=np.int64)
        if len(lm) != len(ids):
            raise DataError(f"{loc}: loss_mask has {len(lm)} entries for {len(ids)} input_ids")
        if len(ids) > sample_length:
            raise DataError(f"trainer.data.seq_length: {loc} has {len(ids)} tokens > sample length "
                            f"{sample_length}")
        bounds = np.concatenate([starts, [len(ids)]])
        if len(starts) == 0 or starts[0] != 0 or np.any(np.diff(bounds) <= 0):
            raise DataError(f"{loc}: seq_start_id must start at 0 and increase within the pack")
        toks.append(ids)
        sups.append(lm)
        doc_lens.append(np.diff(bounds))
        docs_per_pack.append(len(starts))
    if not toks:
        raise DataError(f"{path}: no packs")
    doc_offsets = np.concatenate([[0], np.cumsum(np.concatenate(doc_lens))]).astype(np.int64)
    pack_offsets = np.concatenate([[0], np.cumsum(docs_per_pack)]).astype(np.int64)
    return np.concatenate(toks), np.concatenate(sups), doc_offsets, pack_offsets


def load_split(opts: DataOptions, spec: SourceSpec, name: str, pad_id: int = 0) -> tuple[PackedDataset, dict]:
    path = split_file(spec, f"trainer.data.{name}")
    tokens, sup, doc_offsets, pack_offsets = load_packs(path, opts.sample_length, spec.limit)
    per_pack = np.diff(pack_offsets)
    if not opts.packing and per_pack.size and per_pack.max() > 1:  # the file is packed: packing false cannot undo it
        i = int(np.argmax(per_pack > 1))
        raise DataError(f"trainer.data.packing: false means one document a row, and {path} pack {i} holds "
                        f"{int(per_pack[i])} (format mlperf_npy is packed in its file); set packing: true")
    if tokens.size and tokens.max() >= 2**31:
        raise DataError(f"{path}: token ids do not fit in int32")
    ds = PackedDataset(tokens, sup, doc_offsets, np.arange(len(doc_offsets) - 1), pack_offsets,
                       opts.sample_length, pad_id)
    return ds, {**summarize(ds, records=len(ds), skipped_bad_records=0, truncated=0, dropped_overlong=0,
                            dropped_no_target=0), "cache": "none", "cache_path": path}


def synthetic_lengths(rng: np.random.Generator, n: int, seq_length: int) -> np.ndarray:
    """GovReport-like document lengths: log-normal, median ~30% of seq_length, long right tail, clipped."""
    raw = rng.lognormal(mean=np.log(0.3 * seq_length), sigma=0.55, size=n)
    return np.clip(raw.astype(np.int64), 16, seq_length)


def _doc(rng: np.random.Generator, n: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (1 = BOS first, 2 = EOS last, content in [3, vocab)) and a mask on the final summary part."""
    ids = rng.integers(3, vocab_size, size=n, dtype=np.int64)
    ids[0], ids[-1] = 1, 2
    answer = max(1, int(n * rng.uniform(0.05, 0.2)))
    mask = np.zeros(n, dtype=np.int64)
    mask[n - answer:] = 1
    return ids, mask


def _write_split(path: str, rng: np.random.Generator, n_packs: int, seq_length: int, vocab_size: int) -> dict:
    lengths = synthetic_lengths(rng, max(8, int(n_packs * 3.6 * 1.3)), seq_length)
    order, offsets = pack_lengths(lengths, seq_length)
    while len(offsets) - 1 < n_packs:
        lengths = np.concatenate([lengths, synthetic_lengths(rng, len(lengths), seq_length)])
        order, offsets = pack_lengths(lengths, seq_length)
    packs = np.empty(n_packs, dtype=object)
    for b in range(n_packs):
        docs = [_doc(rng, int(lengths[d]), vocab_size) for d in order[offsets[b]:offsets[b + 1]]]
        sizes = [len(d[0]) for d in docs]
        packs[b] = {"input_ids": np.concatenate([d[0] for d in docs]).tolist(),
                    "loss_mask": np.concatenate([d[1] for d in docs]).tolist(),
                    "seq_start_id": np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()}
    np.save(path, packs, allow_pickle=True)
    per_bin = np.diff(offsets[:n_packs + 1])
    pack_len = [len(p["input_ids"]) for p in packs]
    return {"max_samples_per_bin": int(per_bin.max()), "dataset_max_seqlen": int(lengths[order[:offsets[n_packs]]].max()),
            "min_packed_seqlen": int(min(pack_len))}


def write_synthetic(directory: str, n_packs: int, seq_length: int, vocab_size: int, seed: int) -> dict:
    """Write train.npy (n_packs packs), validation.npy (max(1, n_packs // 8)) and packed_metadata.jsonl."""
    if vocab_size < 4:
        raise ValueError("vocab_size must be >= 4")
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    meta = {"train": _write_split(os.path.join(directory, "train.npy"), rng, n_packs, seq_length, vocab_size),
            "validation": _write_split(os.path.join(directory, "validation.npy"), rng, max(1, n_packs // 8),
                                       seq_length, vocab_size)}
    with open(os.path.join(directory, "packed_metadata.jsonl"), "w") as f:
        f.write(json.dumps({k: max(m[k] for m in meta.values()) if k != "min_packed_seqlen" else
                            min(m[k] for m in meta.values()) for k in meta["train"]}) + "\n")
    return meta


def write_single_documents(directory: str, n_packs: int, seq_length: int, vocab_size: int, seed: int) -> None:
    """The MLPerf layout with one full-length document a pack (train.npy, validation.npy of max(1, n_packs // 8)),
    the second half of each supervised: data whose every row is one document (no packing benefit)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    mask = np.zeros(seq_length, dtype=np.int64)
    mask[seq_length // 2:] = 1
    for split, n in (("train", n_packs), ("validation", max(1, n_packs // 8))):
        packs = np.empty(n, dtype=object)
        for i in range(n):
            ids = rng.integers(3, vocab_size, size=seq_length, dtype=np.int64)
            packs[i] = {"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_start_id": [0]}
        np.save(os.path.join(directory, f"{split}.npy"), packs, allow_pickle=True)
    with open(os.path.join(directory, "packed_metadata.jsonl"), "w") as f:
        f.write(json.dumps({"max_samples_per_bin": 1, "dataset_max_seqlen": seq_length,
                            "min_packed_seqlen": seq_length}) + "\n")
