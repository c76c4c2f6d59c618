"""Crash safety of checkpoints with the real `python -m trainer`: kill -9 in the middle of a save, and a disk
that fills up during a save. Either way the previous checkpoint and `latest` stay intact and the next
resume continues from them."""
from __future__ import annotations

import contextlib
import re
import resource
import signal
import subprocess
import uuid
import warnings

import pytest
import torch

from reliability_support import Inotify
from test_train_support import ROOT, beside, log_text, losses, run_trainer, trainer_cmd, trainer_env, write_recipe
from trainer.checkpointing import checkpoint as ckpt

pytestmark = pytest.mark.slow


def _latest_state(ck):
    """(iteration, adapter) of the checkpoint `latest` names, loaded the way a resume loads it."""
    state, meta = ckpt.load(ckpt.read_latest(str(ck)), rank=0, coords=(0, 0, 0))
    assert meta["iteration"] == state["iteration"]
    assert all(torch.isfinite(t).all() for t in state["adapter"].values())
    return state["iteration"]


def test_kill_9_in_the_middle_of_a_save_then_resume(tmp_path):
    cfg = write_recipe(tmp_path, "trainer.schedule.train_iters=30", "trainer.checkpoint.save_interval=1",
                       "trainer.checkpoint.keep_last=3")
    run = tmp_path / "run"
    ck = run / "checkpoints"
    ck.mkdir(parents=True)
    watch = Inotify(ck)
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(trainer_cmd(cfg, run), env=trainer_env(0), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=err)
    victim = None
    try:
        # freeze the trainer the moment a save creates its temp dir; if the temp dir is still there the save
        # is under way (the rename that publishes it has not happened): kill -9 now, else let it go on
        while victim is None and proc.poll() is None:
            for name in watch.created(timeout=1.0):
                m = re.fullmatch(r"\.tmp-iter_(\d+)", name)
                if not m or int(m.group(1)) < 3:
                    continue
                proc.send_signal(signal.SIGSTOP)
                if (ck / name).is_dir():
                    proc.kill()
                    victim = int(m.group(1))
                    break
                proc.send_signal(signal.SIGCONT)
    finally:
        watch.close()
        if proc.poll() is None and victim is None:
            proc.kill()
        proc.wait(timeout=60)
    assert victim is not None, "the trainer finished before a save could be caught in progress"
    assert proc.returncode == -signal.SIGKILL

    # the save in flight left only its temp dir; `latest` names the previous, complete checkpoint
    assert (ck / f".tmp-{ckpt.iter_name(victim)}").is_dir()
    assert not (ck / ckpt.iter_name(victim)).exists()
    assert (ck / "latest").read_text() == ckpt.iter_name(victim - 1)
    assert _latest_state(ck) == victim - 1
    first = losses(log_text(run, 0))
    assert max(first) == victim  # the killed attempt had logged the iteration it was saving

    res = run_trainer(cfg, run, attempt=1)
    assert res.returncode == 0, res.stderr[-3000:]
    second = log_text(run, 1)
    assert f"resumed_from checkpoints/{ckpt.iter_name(victim - 1)}" in second
    assert f"checkpoint loaded | iteration {victim - 1}" in second
    resumed = losses(second)
    assert sorted(resumed) == list(range(victim, 31))
    assert resumed[victim] == first[victim]  # the repeated iteration computes exactly what attempt 0 logged
    assert not any(p.name.startswith(".tmp-") for p in ck.iterdir())
    assert (ck / "latest").read_text() == ckpt.iter_name(30) and _latest_state(ck) == 30


class _SmallDisk:
    """A checkpoint directory with room for one checkpoint and not two.

    Preferred: a 640 KiB tmpfs mounted on the directory (one checkpoint of this recipe is ~420 KiB), so the
    save fails with ENOSPC. Where mounting is not allowed: RLIMIT_FSIZE of 256 KiB set by a preexec_fn with
    SIGXFSZ ignored, so the shard write fails with EFBIG. `lift()` gives the room back."""

    def __init__(self, folder):
        self.folder = folder
        folder.mkdir(parents=True)
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=640k", f"primus-test-{uuid.uuid4().hex[:8]}",
                                str(folder)], capture_output=True, text=True)
        self.kind = "tmpfs" if mount.returncode == 0 else "rlimit"
        self.limited = True

    def preexec(self):
        if self.kind == "rlimit" and self.limited:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))

    def lift(self):
        self.limited = False
        if self.kind == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=16m", str(self.folder)], check=True)

    def close(self):
        if self.kind == "tmpfs":
            subprocess.run(["umount", str(self.folder)], check=True)

    def run(self, cfg, run_dir, attempt):
        return subprocess.run(trainer_cmd(cfg, run_dir), env=trainer_env(attempt), cwd=ROOT, capture_output=True,
                              text=True, timeout=300, preexec_fn=self.preexec)


@pytest.fixture(scope="module", autouse=True)
def disk_full_start(request, tmp_path_factory):
    """test_disk_full_during_save_keeps_latest_and_resume_works's small disk and its first run (2 iterations, the
    one checkpoint that fits), started when the module starts if that test is selected: one trainer thread
    (test_train_support.beside) beside test_kill_9's, instead of after it. (full recipe, run dir, disk, future of the
    first run's result), or None; the module's end unmounts the disk."""
    if not any(item.originalname == "test_disk_full_during_save_keeps_latest_and_resume_works"
               for item in request.session.items if item.module is request.module):
        yield None
        return
    tmp_path = tmp_path_factory.mktemp("diskfull")
    # LoRA dim pinned: the 640 KiB tmpfs is sized for one checkpoint of this adapter (~420 KiB), not two
    sets = ("trainer.checkpoint.save_interval=2", "trainer.checkpoint.keep_last=1", "trainer.lora.dim=8",
            "trainer.lora.alpha=16", "trainer.schedule.lr_decay_iters=6")  # the same LR schedule for both lengths
    short = write_recipe(tmp_path, "trainer.schedule.train_iters=2", *sets, name="short.yaml")
    full = write_recipe(tmp_path, "trainer.schedule.train_iters=6", *sets, name="full.yaml")
    run = tmp_path / "run"
    disk = _SmallDisk(run / "checkpoints")
    # rlimit: the first checkpoint is written without the limit
    first = beside(run_trainer, short, run) if disk.kind == "rlimit" else beside(disk.run, short, run, 0)
    try:
        yield full, run, disk, first
    finally:
        with contextlib.suppress(Exception):
            first.result()
        with contextlib.suppress(subprocess.CalledProcessError):
            disk.close()


def test_disk_full_during_save_keeps_latest_and_resume_works(disk_full_start):
    full, run, disk, first = disk_full_start
    assert first.result().returncode == 0
    assert (run / "checkpoints" / "latest").read_text() == "iter_0000002"
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints" / "iter_0000002").iterdir()}

    # attempt 1 resumes at 2, trains 3-4, and its save at 4 does not fit
    res = disk.run(full, run, 1)
    assert res.returncode == 4, (disk.kind, res.stdout[-2000:], res.stderr[-2000:])
    text = log_text(run, 1)
    failed = next(line for line in text.splitlines() if "] checkpoint failed | iteration 4 |" in line)
    assert "writing shards" in failed
    assert ("No space left on device" if disk.kind == "tmpfs" else "File too large") in failed, failed
    assert text.rstrip().endswith("training finished | iterations 4 | exit 4")
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["iter_0000002", "latest"]  # no temp dir left
    assert {p.name: p.stat().st_mtime_ns for p in (ck / "iter_0000002").iterdir()} == before
    assert _latest_state(ck) == 2

    # room again (a requeue after the disk was cleaned up): resume from 2 and finish
    disk.lift()
    res = disk.run(full, run, 2)
    assert res.returncode == 0, res.stderr[-3000:]
    third = log_text(run, 2)
    assert "resumed_from checkpoints/iter_0000002" in third
    assert losses(third)[3] == losses(text)[3] and losses(third)[4] == losses(text)[4]
    assert _latest_state(ck) == 6
    if disk.kind == "rlimit":
        warnings.warn("disk full simulated with RLIMIT_FSIZE/EFBIG: mount -t tmpfs is not permitted here")
