"""The cache lock: concurrent ranks build once and all read the same arrays."""
import multiprocessing as mp
import os
import time

import numpy as np

from trainer.data.cache import cache_key, cached


def _rank(cache_dir, log, out_q):
    def build():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)                                  # a slow build: others must wait, not rebuild
        return {"tokens": np.arange(1000, dtype=np.int32)}, {"samples": 1000}

    arrays, stats, hit, path = cached(cache_dir, "train", {"source": "x", "seq_length": 8}, build)
    out_q.put((hit, path, int(arrays["tokens"].sum()), stats["samples"]))


def test_one_rank_builds_the_others_read(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    log = str(tmp_path / "builds.log")
    procs = [ctx.Process(target=_rank, args=(str(tmp_path / "cache"), log, q)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(open(log).read().split()) == 1
    assert sorted(hit for hit, *_ in results) == [False, True, True]
    assert len({(path, total, n) for _, path, total, n in results}) == 1
    assert results[0][2] == sum(range(1000))
    assert not [f for f in os.listdir(tmp_path / "cache") if ".tmp-" in f]


def test_key_depends_on_every_part():
    base = {"source": {"target": "/a", "files": [["a", 1, 2]]}, "tokenizer": "t", "seq_length": 8}
    keys = {cache_key(base), cache_key({**base, "tokenizer": "u"}), cache_key({**base, "seq_length": 9}),
            cache_key({**base, "source": {"target": "/a", "files": [["a", 1, 3]]}})}
    assert len(keys) == 4 and cache_key(dict(reversed(list(base.items())))) == cache_key(base)
