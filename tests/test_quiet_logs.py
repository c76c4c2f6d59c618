"""Quiet job logs (issue 28 item 8): megatron-core's known-harmless "TE/Apex not installed" warnings once per run
(one line of rank 0's log) instead of a few per rank, no `srun: cluster configuration lacks support for cpu
binding` on the local cluster, and the preflight names a container only when the job runs in one (this
machine may itself have a /.dockerenv). Real two-rank trainer jobs, local and on the local Slurm cluster."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import wait_state
from reliability_support import read, submit, trainer_recipe

pytestmark = pytest.mark.slow
HARMLESS = ("Transformer Engine and Apex are not installed", "Apex is not installed")


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_a_two_rank_job_log_is_quiet(executor, job_env, tmp_path, request):
    if executor == "slurm":
        request.getfixturevalue("local_slurm")
    recipe = trainer_recipe(tmp_path, f"quiet{executor}", executor=executor, nproc_per_node=2)
    entry = submit(job_env, recipe, "trainer.schedule.train_iters=4")
    row = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300,
                     key="scheduler_state")
    run_dir = Path(entry["run_dir"])
    out = read(run_dir / "logs" / ("local.out" if executor == "local" else f"slurm-{entry['job_id']}.out"))
    log = read(run_dir / "logs" / "rank-0" / "debug.log")
    assert row["state"] == "COMPLETED", (row, out[-3000:])
    assert "world_size 2" in log
    assert not any(h in out for h in HARMLESS), out[-3000:]  # (about five lines per rank before)
    assert "UserWarning" not in out, out[-3000:]
    filtered = [line for line in log.splitlines() if "] warnings filtered | " in line]
    assert len(filtered) == 1 and "megatron-core without Transformer Engine/Apex uses its torch fallbacks" in \
        filtered[0], filtered
    assert "lacks support for cpu binding" not in out, out[:2000]
    pre = [line for line in out.splitlines() if line.startswith("preflight | ")]
    assert pre and all("| container none |" in line for line in pre), pre  # bare metal, /.dockerenv or not


def test_preflight_decides_by_the_job_not_by_marker_files(monkeypatch):
    """Bare metal on a machine that is itself a container (this one may have /.dockerenv): no container. The job
    script sets PRIMUS_CONTAINER_RUNTIME only when it launches one (and unsets it otherwise)."""
    from trainer.runtime.preflight import container

    monkeypatch.delenv("PRIMUS_CONTAINER_RUNTIME", raising=False)
    assert container() == "none"
    monkeypatch.setenv("PRIMUS_CONTAINER_RUNTIME", "podman")
    markers = [p for p in ("/run/.containerenv", "/.dockerenv") if os.path.exists(p)]
    assert container() == (f"podman ({markers[0]})" if markers else "podman (no container marker file found)")



def test_the_filtered_line_names_only_what_is_missing(monkeypatch):
    """With Transformer Engine installed megatron-core warns only that Apex is missing: the line said
    "without Transformer Engine/Apex" there too (issue 33 item 5). Real warnings through the real filter."""
    import warnings

    from trainer.observability import quiet

    monkeypatch.setattr(quiet, "_counts", {})
    monkeypatch.setattr(quiet, "_shown", None)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    quiet.install()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("Apex is not installed. Falling back to Torch Norm")
        assert quiet.summary() == "warnings filtered | megatron-core without Apex uses its torch fallbacks (1 warnings)"
        warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
        assert quiet.summary() == ("warnings filtered | megatron-core without Transformer Engine/Apex uses its torch "
                                   "fallbacks (2 warnings)")
