"""Bad nodes on the real local cluster (node1, node2), one made bad on purpose through PRIMUS_FAULT_FILE (a file
in the test's own directory, so parallel tests do not see it; primus_contract/node_faults.py): `nodes check`
names it, two strikes exclude it and the next submit avoids it, a job that fails there is requeued onto the other
node and finishes, a slow rank there is named in `status`, and a peer that NCCL's warning names becomes suspect."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import JOBS_DIR, ROOT, cli, status_json
from reliability_support import cancel, job_info, read, run_to_end, submit, trainer_recipe, wait_for, wait_requeued

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _env(tmp_path: Path, faults: str) -> dict:
    (tmp_path / "faults").write_text(faults)
    return dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(JOBS_DIR),
                PRIMUS_FAULT_FILE=str(tmp_path / "faults"), OMP_NUM_THREADS="1")


def _testjob(tmp_path: Path, nodes: int, mode: str = "ok") -> Path:
    """A recipe whose job is tests/slurm_jobs/primus_testjob.py (seconds, not a training run)."""
    body = {"extends": str(ROOT / "recipes" / "quickstart.yaml"),
            "experiment": {"name": "nodes", "workspace": str(tmp_path / "ws")},
            "cluster": {"executor": "slurm", "nodes": nodes, "nproc_per_node": 1, "exclusive": False,
                        "time": "00:05:00", "signal_grace_s": 10, "entrypoint": "primus_testjob",
                        "python": sys.executable, "env": {"PRIMUS_TEST_MODE": mode}}}
    path = tmp_path / f"testjob-{nodes}-{mode.replace(':', '_')}.yaml"
    path.write_text(json.dumps(body))
    return path


def _sacct_nodes(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "NodeList"], capture_output=True,
                         text=True)
    return out.stdout.strip()


def _ledger(env: dict, tmp_path: Path) -> dict:
    out = cli(env, "nodes", "--json", "--workspace", str(tmp_path / "ws"))
    assert out.returncode == 0, out.stderr
    return {n["node"]: n for n in json.loads(out.stdout)["nodes"]}


def test_check_names_the_slow_node_and_two_strikes_keep_it_out_of_the_next_submit(local_slurm, tmp_path):
    env = _env(tmp_path, "check-slow node2 50\n")  # node2's GEMM takes 50 times as long
    ws = ["--workspace", str(tmp_path / "ws")]
    for strike in (1, 2):
        out = cli(env, "nodes", "check", "--nodes", "2", "--json", *ws, timeout=400)
        assert out.returncode == 3, out.stderr + out.stdout
        verdicts = {v["node"]: v for v in json.loads(out.stdout)["nodes"]}
        assert verdicts["node1"]["verdict"] == "ok" and verdicts["node2"]["verdict"] == "slow", verdicts
        assert "GEMM" in verdicts["node2"]["why"][0]
        assert _ledger(env, tmp_path)["node2"]["state"] == ("suspect" if strike == 1 else "excluded")
    text = cli(env, "nodes", *ws).stdout
    assert "node2  excluded" in text and "2 strikes" in text and "node1" not in text

    before = sorted((tmp_path / "ws" / "nodes").glob("*")) if (tmp_path / "ws" / "nodes").exists() else []
    out = cli(env, "submit", str(_testjob(tmp_path, 2)))  # two nodes cannot be placed without node2
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and "left without the excluded node2" in out.stderr
    assert sorted((tmp_path / "ws" / "nodes").glob("*")) == before  # no run directory

    out = cli(env, "submit", str(_testjob(tmp_path, 1, "fail:3")), "--json")  # ends FAILED: resume takes it
    assert out.returncode == 0, out.stderr
    assert "excluding nodes node2" in out.stderr
    entry = json.loads(out.stdout)
    jobs = [entry["job_id"]]
    try:
        assert job_info(entry["job_id"]).get("ExcNodeList") == "node2"
        row = run_to_end_plain(env, entry["run_id"])
        assert row["scheduler_state"] == "FAILED" and row["exit_code"] == 3, row
        assert _sacct_nodes(entry["job_id"]) == "node1"
        # resume submits the same script with the ledger as it is now: node2 back, node1 out
        assert cli(env, "nodes", "clear", "node2", *ws).returncode == 0
        assert cli(env, "nodes", "exclude", "node1", "--reason", "test", *ws).returncode == 0
        out = cli(env, "resume", entry["run_id"])
        assert out.returncode == 0 and "excluding nodes node1" in out.stderr, out
        jobs.append(status_json(env, entry["run_id"])["job_id"])
        assert jobs[1] != jobs[0] and job_info(jobs[1]).get("ExcNodeList") == "node1"
        assert run_to_end_plain(env, entry["run_id"])["scheduler_state"] == "FAILED"
        assert _sacct_nodes(jobs[1]) == "node2"
    finally:
        cancel(*jobs)


def run_to_end_plain(env: dict, run_id: str) -> dict:
    return wait_for(lambda: (lambda r: r if r["scheduler_state"] in ("COMPLETED", "FAILED", "CANCELLED") else None)(
        status_json(env, run_id)), 300, f"run {run_id} to end")


def test_a_job_failing_on_a_bad_node_is_requeued_onto_the_other_and_finishes(local_slurm, tmp_path):
    env = _env(tmp_path, "preflight first\n")  # the preflight's node check fails on the first node it runs on
    out = cli(env, "submit", str(_testjob(tmp_path, 1)), "--json")
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    job_id, run_dir = entry["job_id"], Path(entry["run_dir"])
    try:
        wait_requeued(job_id, 1, timeout=240)
        bad = read(tmp_path / "faults.first").strip()
        good = {"node1": "node2", "node2": "node1"}[bad]
        # the job script sets it just after its requeue (a running job's cannot change), so it may lag the PENDING
        wait_for(lambda: job_info(job_id).get("ExcNodeList") == bad or None, 60, f"ExcNodeList={bad}")
        row = run_to_end(job_id, env, entry["run_id"])
        assert row["scheduler_state"] == "COMPLETED" and row["restarts"] == 1, row
        assert _sacct_nodes(job_id) == good
    finally:
        cancel(job_id)
    text = cli(env, "status", entry["run_id"]).stdout
    assert f"attempt 0 (job {job_id}) on {bad}: exit 1, ended by {bad}: device: preflight: injected fault" in text
    assert f"requeue excluding {bad}" in text and f"attempt 1 (job {job_id}) on {good}: exit 0; finished" in text
    assert _ledger(env, tmp_path)[bad]["state"] == "suspect"
    assert "requeued with ExcNodeList=" + bad in read(run_dir / "logs" / f"slurm-{job_id}.out")


def test_a_slow_rank_is_named_in_status(local_slurm, tmp_path):
    env = _env(tmp_path, "slow node2 1.0\n")  # the rank on node2 sleeps 1 s inside each step's compute: named while
    recipe = trainer_recipe(tmp_path, "slow", nodes=2)  # the other's step is under 2 s (3 log points in a row of 6)
    entry = submit(env, recipe, "trainer.schedule.train_iters=6", f"trainer.data.cache_dir={tmp_path / 'cache'}")
    try:
        row = run_to_end_plain(env, entry["run_id"])
        assert row["scheduler_state"] == "COMPLETED", row
    finally:
        cancel(entry["job_id"])
    shown = status_json(env, entry["run_id"])["node_history"]
    assert [s["node"] for s in shown["slow"]] == ["node2"], shown
    assert "compute" in shown["slow"][0]["why"]
    text = cli(env, "status", entry["run_id"]).stdout
    assert "slow rank: node node2" in text
    assert "slow rank | node node2" in read(Path(entry["run_dir"]) / "logs" / "rank-0" / "debug.log")


def test_a_peer_that_nccl_names_becomes_suspect(local_slurm, tmp_path):
    env = _env(tmp_path, "peer-error node1 node2\n")  # node1's preflight prints NCCL's warning that the connection
    out = cli(env, "submit", str(_testjob(tmp_path, 2)), "--json")  # to node2 was closed by it, and fails
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    try:
        row = run_to_end_plain(env, entry["run_id"])
        assert row["scheduler_state"] == "FAILED", row
    finally:
        cancel(entry["job_id"])
    output = read(Path(entry["run_dir"]) / "logs" / f"slurm-{entry['job_id']}.out")
    assert "NCCL WARN socketProgress: Connection closed by remote peer node2<45678>" in output
    assert "primus-slurm: nodes: suspect: node2 (timeout: NCCL named it" in output
    text = cli(env, "status", entry["run_id"]).stdout
    assert f"attempt 0 (job {entry['job_id']}) on node1,node2: exit " in text  # (srun's code: node2's task was ended)
    assert "ended by node2: timeout: NCCL named it" in text
    assert _ledger(env, tmp_path)["node2"]["state"] == "suspect" and "node1" not in _ledger(env, tmp_path)
