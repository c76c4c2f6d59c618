"""On-disk cache of tokenized + packed splits.

Key: sha256 of (source fingerprint — path, size, mtime or hub name —, split, limit, formatter, tokenizer
identity, seq_length and packing options, FORMAT_VERSION). The first rank to take the file lock builds and
writes ``<cache_dir>/<split>-<key>.npz`` (tmp file + atomic rename); every other rank waits on the lock and then
reads the same file. Stats travel in the file, so a hit reports what the build counted.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid
from typing import Callable

import numpy as np
from filelock import FileLock

# 2 (2026-12-07): the chat formatters' supervision changed (trimmed content, templates rendered once, EOS after a
# multi-token <|im_end|>): a split cached by an earlier version is built again, never read with its old masks;
# 3: chat content located by position (Qwen3 reasoning supervised as the template writes it, not refused)
FORMAT_VERSION = 3


def cache_key(parts: dict) -> str:
    blob = json.dumps({"format_version": FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cache_path(cache_dir: str, name: str, key: str) -> str:
    return os.path.join(cache_dir, f"{name}-{key}.npz")


def _read(path: str) -> tuple[dict, dict]:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "stats_json"}
        stats = json.loads(str(z["stats_json"]))
    return arrays, stats


def _write(path: str, arrays: dict, stats: dict) -> None:
    # unique across nodes too: where the lock is node-local (a filesystem mounted with localflock) two nodes'
    # builders, whose container pids may repeat, must not share a temporary file
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as f:
        np.savez(f, stats_json=np.asarray(json.dumps(stats)), **arrays)
    os.replace(tmp, path)


def cached(cache_dir: str, name: str, parts: dict, build: Callable[[], tuple[dict, dict]],
           timeout_s: float = 3600) -> tuple[dict, dict, bool, str]:
    """(arrays, stats, hit, path); `build()` runs only on a miss, under the lock."""
    os.makedirs(cache_dir, exist_ok=True)
    path = cache_path(cache_dir, name, cache_key(parts))
    if os.path.exists(path):
        arrays, stats = _read(path)
        return arrays, stats, True, path
    with FileLock(path + ".lock", timeout=timeout_s):
        if os.path.exists(path):
            arrays, stats = _read(path)
            return arrays, stats, True, path
        arrays, stats = build()
        _write(path, arrays, stats)
    return arrays, stats, False, path
