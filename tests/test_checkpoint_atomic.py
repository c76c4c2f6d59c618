"""Crash-safe checkpoint protocol: publish/prune, disk full (a real RLIMIT_FSIZE write failure),
kill -9 mid-save, recipe hash and resume refusal."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tests.test_train_support import ROOT
from trainer.checkpointing import checkpoint as ckpt
from primus_contract.schema import apply_schema
from trainer.config import Config

CPU = torch.device("cpu")


def _save(d, it, value, keep=2, size=16):
    state = {"iteration": it, "adapter": {"w": torch.full((size,), float(value))}}
    return ckpt.save(str(d), it, state, rank=0, coords=(0, 0, 0), metadata={"recipe_hash": "h", "world_size": 1},
                     keep_last=keep, device=CPU)


def test_publish_latest_and_keep_last(tmp_path):
    for it in (1, 2, 3):
        _save(tmp_path, it, it)
    assert (tmp_path / "latest").read_text() == "iter_0000003"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002", "iter_0000003", "latest"]
    state, meta = ckpt.load(ckpt.read_latest(str(tmp_path)), rank=0, coords=(0, 0, 0))
    assert meta["iteration"] == 3 and torch.equal(state["adapter"]["w"], torch.full((16,), 3.0))
    with pytest.raises(ckpt.CheckpointError, match="no shard for rank 1"):
        ckpt.load(str(tmp_path / "iter_0000003"), rank=1, coords=(0, 0, 1))


_CHILD = textwrap.dedent("""
    import resource, signal, sys, torch
    sys.path.insert(0, {root!r})
    from trainer.checkpointing import checkpoint as ckpt
    d, mode = sys.argv[1], sys.argv[2]
    def save(it, n):
        state = {{"adapter": {{"w": torch.full((n,), float(it))}}}}
        return ckpt.save(d, it, state, rank=0, coords=(0, 0, 0), metadata={{"recipe_hash": "h"}}, keep_last=2)
    save(1, 16)
    if mode == "diskfull":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            save(2, 1 << 20)                                   # 4 MiB shard > 1 MiB limit
        except ckpt.CheckpointError as err:
            print("FAILED", err, flush=True)
            sys.exit(4)
        sys.exit(0)
    print("SAVING", flush=True)
    save(2, 1 << 26)                                           # 256 MiB: killed mid-write by the parent
""")


def _child(tmp_path, mode):
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT)))
    return [sys.executable, str(script), str(tmp_path / "ck"), mode]


def _assert_previous_intact(d):
    assert (d / "latest").read_text() == "iter_0000001"
    state, meta = ckpt.load(ckpt.read_latest(str(d)), rank=0, coords=(0, 0, 0))
    assert meta["iteration"] == 1 and torch.equal(state["adapter"]["w"], torch.ones(16))
    assert not (d / "iter_0000002").exists()


def test_disk_full_leaves_latest_intact(tmp_path):
    res = subprocess.run(_child(tmp_path, "diskfull"), capture_output=True, text=True, timeout=120)
    assert res.returncode == 4, res.stderr
    assert "FAILED writing shards" in res.stdout and "File too large" in res.stdout
    d = tmp_path / "ck"
    _assert_previous_intact(d)
    assert not any(p.name.startswith(".tmp-") for p in d.iterdir())  # temp dir cleaned up


def test_kill_9_during_save_then_next_save_works(tmp_path):
    d = tmp_path / "ck"
    proc = subprocess.Popen(_child(tmp_path, "kill"), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "SAVING"
    deadline = time.time() + 60
    tmp = d / ".tmp-iter_0000002"
    while not (tmp.exists() and any(tmp.iterdir())) and time.time() < deadline:  # shard write under way
        time.sleep(0.002)
    proc.kill()
    proc.wait(timeout=30)
    _assert_previous_intact(d)
    _save(d, 2, 2.0)  # the stale .tmp dir does not block the next save
    assert (d / "latest").read_text() == "iter_0000002"
    assert not (d / ".tmp-iter_0000002").exists()


def test_recipe_hash_ignores_resume_mutable_fields():
    base = {"schedule": {"train_iters": 10, "lr": 1e-4}, "logging": {"log_interval": 1},
            "checkpoint": {"save_interval": 5, "keep_last": 2, "pretrained": None},
            "distributed": {"timeout_minutes": 30, "device": "cpu"}}
    h = ckpt.recipe_hash(base)
    changed = json.loads(json.dumps(base))
    changed["schedule"]["train_iters"] = 99
    changed["logging"]["log_interval"] = 7
    changed["checkpoint"].update(save_interval=1, keep_last=9)
    changed["distributed"]["timeout_minutes"] = 1
    assert ckpt.recipe_hash(changed) == h
    changed["schedule"]["lr"] = 2e-4
    assert ckpt.recipe_hash(changed) != h
    # experiment.seed drives the data order and the adapters' init: a resume must not change it silently
    assert ckpt.recipe_hash(base, seed=1) == ckpt.recipe_hash(changed | {"schedule": base["schedule"]}, seed=1)
    assert ckpt.recipe_hash(base, seed=1) != ckpt.recipe_hash(base, seed=2)


def _config(trainer: dict) -> Config:
    """The resolved recipe of these trainer sections (every other key its default)."""
    return Config.from_dict(apply_schema({"trainer": trainer}))


def test_resume_refused_when_recipe_changed(tmp_path):
    from trainer.__main__ import SetupError, find_resume

    trainer = {"schedule": {"lr": 1e-4}, "checkpoint": {"resume": "auto"}}
    cfg = _config(trainer)
    rhash = ckpt.recipe_hash(trainer)
    ckpt.save(str(tmp_path / "checkpoints"), 5, {"x": 1}, rank=0, coords=(0, 0, 0),
              metadata={"recipe_hash": rhash}, keep_last=2)
    path, note = find_resume(cfg, str(tmp_path), rhash)
    assert path.endswith("iter_0000005") and note == ""  # an older checkpoint without lr_decay_iters: no check
    other = ckpt.recipe_hash({"schedule": {"lr": 3e-4}, "checkpoint": {"resume": "auto"}})
    with pytest.raises(SetupError, match=r"resume refused \| checkpoints/iter_0000005 was written by a different recipe"):
        find_resume(cfg, str(tmp_path), other)
    never = _config({"schedule": {"lr": 1e-4}, "checkpoint": {"resume": "never"}})
    assert find_resume(never, str(tmp_path), other) == (None, "")


def test_resume_refused_when_train_iters_moves_the_lr_decay(tmp_path):
    """Extending train_iters on resume would move a cosine decay's end and make the LR jump: refused, with the
    jump and both ways out; an explicit lr_decay_iters is taken (and noted); a constant LR has no decay end."""
    from trainer.__main__ import SetupError, find_resume

    def cfg(**schedule):
        return _config({"schedule": {"lr": 1e-4, "min_lr": 0.0, "warmup_iters": 100, "lr_decay": "cosine",
                                     "train_iters": 1000, "lr_decay_iters": None, **schedule},
                        "checkpoint": {"resume": "auto"}})

    first = cfg()
    rhash = ckpt.recipe_hash(first.trainer.to_dict())
    ckpt.save(str(tmp_path / "checkpoints"), 500, {"x": 1}, rank=0, coords=(0, 0, 0),
              metadata={"recipe_hash": rhash, "lr_decay_iters": 1000}, keep_last=2)
    assert find_resume(first, str(tmp_path), rhash)[1] == ""
    longer = cfg(train_iters=2000)
    assert ckpt.recipe_hash(longer.trainer.to_dict()) == rhash  # train_iters alone may change on resume ...
    with pytest.raises(SetupError) as err:  # ... but not move the schedule silently
        find_resume(longer, str(tmp_path), rhash)
    assert str(err.value) == ("resume refused | trainer.schedule.train_iters changed the LR decay end from iteration "
                              "1000 to 2000: at iteration 501 the LR would be 8.941e-05 instead of 5.851e-05. Set "
                              "trainer.schedule.lr_decay_iters: 1000 to keep the saved schedule, or 2000 to stretch it")
    ckpt.save(str(tmp_path / "warm" / "checkpoints"), 50, {"x": 1}, rank=0, coords=(0, 0, 0),
              metadata={"recipe_hash": rhash, "lr_decay_iters": 1000}, keep_last=2)
    with pytest.raises(SetupError, match=r"at iteration 551 the LR would be 8\.673e-05 instead of 4\.983e-05\. "):
        find_resume(longer, str(tmp_path / "warm"), rhash)  # stopped in warmup: the LR differs later, in the decay
    assert find_resume(cfg(train_iters=2000, lr_decay_iters=1000), str(tmp_path), rhash)[1] == ""
    path, note = find_resume(cfg(train_iters=2000, lr_decay_iters=2000), str(tmp_path), rhash)
    assert note == "schedule | LR decay end moved on resume from iteration 1000 to 2000 (trainer.schedule.lr_decay_iters)"
    flat, flat_dir = cfg(lr_decay="constant"), tmp_path / "constant"
    flat_hash = ckpt.recipe_hash(flat.trainer.to_dict())
    ckpt.save(str(flat_dir / "checkpoints"), 500, {"x": 1}, rank=0, coords=(0, 0, 0),
              metadata={"recipe_hash": flat_hash, "lr_decay_iters": 1000}, keep_last=2)
    assert find_resume(cfg(lr_decay="constant", train_iters=2000), str(flat_dir), flat_hash)[1] == ""
