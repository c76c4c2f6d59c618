"""What a local data path must hold, read by the trainer (trainer/data/sources.py, mlperf.py) and checked by the
launcher where the path is visible (primus_slurm/paths.py): one rule, so a path `submit` accepts is one the job loads.

    local_source(path, split)        -> ("file" | "hf_disk", target)   records: .jsonl/.json/.parquet, a directory
                                                                        holding <split>.<ext>, or a save_to_disk one
    mlperf_file(path, split)         -> the packed .npy file of a split (a directory holding it, or the file)
    source(path, split, data_format) -> (kind, target) of either, by the recipe's trainer.data.format
Both raise ValueError with the reason (the caller names the field); the path must exist.
"""
from __future__ import annotations

import os

FILE_EXTS = (".jsonl", ".ndjson", ".json", ".parquet")
HF_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
MLPERF_SPLIT_FILES = {"train": "train.npy", "validation": "validation.npy", "val": "validation.npy",
                      "test": "validation.npy"}


def local_source(path: str, split: str) -> tuple[str, str]:
    if os.path.isfile(path):
        if not path.endswith(FILE_EXTS):
            raise ValueError(f"unsupported file type {path} (expected .jsonl, .json or .parquet)")
        return "file", path
    if os.path.isdir(path):
        if any(os.path.exists(os.path.join(path, m)) for m in HF_DISK_MARKERS):
            return "hf_disk", path
        for ext in FILE_EXTS:
            cand = os.path.join(path, split + ext)
            if os.path.isfile(cand):
                return "file", cand
        raise ValueError(f"{path} is neither a datasets save_to_disk directory nor holds {split}.jsonl/.json/.parquet")
    raise ValueError(f"no such file or directory: {path}")


def source(path: str, split: str, data_format: str) -> tuple[str, str]:
    """What a job of `data_format` reads at `path` for `split`: ("npy", file) for mlperf_npy, else local_source's."""
    if data_format == "mlperf_npy":
        return "npy", mlperf_file(path, split)
    return local_source(path, split)


def mlperf_file(path: str, split: str) -> str:
    if os.path.isdir(path):
        path = os.path.join(path, MLPERF_SPLIT_FILES.get(split, f"{split}.npy"))
    if not os.path.isfile(path):
        raise ValueError(f"no such MLPerf packed file: {path}")
    return path
