"""Bin packing of documents into fixed-capacity samples.

`pack_lengths` is first-fit-decreasing family *best-fit decreasing*: documents sorted by length (longest first,
stable), each placed into the fullest open bin that still has room, else a new bin. Open bins are kept in
buckets keyed by remaining capacity plus a sorted list of the distinct remaining capacities, so a placement is
one bisect over at most `capacity` values: O(N log N) for the sort, O(N log C) for the placement. It packs at
least as tightly as plain first-fit decreasing (same 11/9 OPT + 6/9 bound) and 100k documents take well
under a second (bench/packing.py). Deterministic: same lengths -> same bins.
"""
from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np


def pack_lengths(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, offsets): bin b holds documents ``order[offsets[b]:offsets[b+1]]`` (longest first within a bin).

    Every length must be in [1, capacity]; no document is split.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    if lengths.min() < 1 or lengths.max() > capacity:
        raise ValueError(f"document lengths must be in [1, {capacity}]")
    by_len = np.argsort(-lengths, kind="stable")
    bin_of = np.empty(lengths.size, dtype=np.int64)
    caps: list[int] = []                 # sorted distinct remaining capacities of open bins
    buckets: dict[int, list[int]] = {}   # remaining capacity -> open bin ids (stack)
    n_bins = 0
    for doc, size in zip(by_len.tolist(), lengths[by_len].tolist()):
        i = bisect_left(caps, size)
        if i < len(caps):
            rem = caps[i]
            stack = buckets[rem]
            b = stack.pop()
            if not stack:
                del buckets[rem]
                caps.pop(i)
        else:
            b, rem = n_bins, capacity
            n_bins += 1
        bin_of[doc] = b
        left = rem - size
        if left > 0:
            if left in buckets:
                buckets[left].append(b)
            else:
                buckets[left] = [b]
                insort(caps, left)
    # group documents by bin, keeping the decreasing-length order inside each bin
    order = by_len[np.argsort(bin_of[by_len], kind="stable")]
    counts = np.bincount(bin_of, minlength=n_bins)
    offsets = np.zeros(n_bins + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return order, offsets


def one_per_bin(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The unpacked layout: document i alone in sample i."""
    return np.arange(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64)


def fill_rate(lengths: np.ndarray, offsets: np.ndarray, capacity: int) -> float:
    n_bins = len(offsets) - 1
    return float(np.asarray(lengths).sum()) / (n_bins * capacity) if n_bins else 0.0
