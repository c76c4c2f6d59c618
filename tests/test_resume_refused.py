"""A `resume` refused on the way leaves the run as it was: no `attempt-base`, the same run.json (job id, job
history, pipeline) and registry entry, no step directory; `status` shows what it showed before (not the resumed job
that was cancelled again: CANCELLED). On a fake Slurm (test_sweep_bad_input.fake_slurm): no cluster, no training."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import cli
from test_sweep_bad_input import QUICKSTART, fake_slurm, one_error, said


@pytest.fixture
def failed_run(tmp_path):
    """(env, calls, run id, run dir, accept(n)): a Slurm run with `--then STEPS` whose training (501) failed, its
    steps removed unrun; the fake cluster takes `n` more jobs."""
    def make(*steps: str):
        base = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PRIMUS_WORKSPACE=str(tmp_path / "ws"))
        env, calls = fake_slurm(tmp_path, base, 10)
        out = cli(env, "submit", QUICKSTART, "--executor", "slurm", "--json", *steps)
        assert out.returncode == 0, out.stderr
        entry = json.loads(out.stdout)
        jobs = [entry["job_id"], *(s["job_id"] for s in json.loads((Path(entry["run_dir"]) / "run.json").read_text())
                                   ["pipeline"])]
        (tmp_path / "queue").write_text(f"{jobs[0]} FAILED\n" + "".join(f"{j} CANCELLED\n" for j in jobs[1:]))

        def accept(n: int) -> None:
            count = int((tmp_path / "count").read_text())
            (tmp_path / "accept").write_text(f"{count + n}\n")
            with open(tmp_path / "queue", "a") as queue:  # (what sacct says of a job cancelled while held)
                queue.write("".join(f"{count + k} CANCELLED\n" for k in range(501, 501 + n)))
        return env, calls, entry["run_id"], Path(entry["run_dir"]), accept
    return make


def _seen(env: dict, run_id: str) -> tuple:
    """What the run looks like: its status (state, job) and registry entry."""
    row = json.loads(cli(env, "status", run_id, "--json").stdout)
    listed = [r for r in json.loads(cli(env, "list", "--all", "--json").stdout) if r["run_id"] == run_id]
    return row["state"], row["job_id"], [(r["job_id"], r.get("jobs")) for r in listed]


def _files(run_dir: Path) -> dict:
    """Every file of the run directory and its content; not resume's lock file, nor .submitit/, where submitit keeps
    the script each sbatch was given (that of the job this resume had queued and then cancelled too)."""
    return {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".resume.lock"
            and ".submitit" not in p.parts}


@pytest.mark.parametrize("accept, says", [
    (1, "nothing runs: the resumed job of run"),  # the resumed job goes in held, its eval step is refused
    (0, "sbatch rejected the job: sbatch: error: QOSMaxSubmitJobPerUserLimit"),  # the resumed job itself
])
def test_a_refused_resume_leaves_the_run_as_it_was(failed_run, accept, says):
    env, calls, run_id, run_dir, take = failed_run("--then", "eval", "--then", "export")
    before, seen = _files(run_dir), _seen(env, run_id)
    assert seen == ("FAILED", "501", [("501", None)])
    take(accept)
    one_error(cli(env, "resume", run_id), says)
    assert said(calls, "scancel") == (["504"] if accept else [])  # (what this resume queued: cancelled by id)
    assert _files(run_dir) == before and not (run_dir / "attempt-base").exists()
    assert _seen(env, run_id) == seen
    take(3)  # and it resumes as any run once the cluster takes the jobs
    out = cli(env, "resume", run_id)
    assert out.returncode == 0 and "(attempt 0, no checkpoint yet: from iteration 0)" in out.stdout, out.stderr
    info = json.loads((run_dir / "run.json").read_text())
    assert [j["job_id"] for j in info["jobs"]] == ["501"] and len(info["pipeline_before"]) == 2


def test_a_resume_whose_step_input_is_gone_is_refused_before_anything_is_queued(failed_run, tmp_path):
    """The step's prompts were checked at submit; the file moved since: refused as the submit would refuse it, not a
    traceback after the resumed job was queued."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"instruction": "say hi"}\n')
    env, calls, run_id, run_dir, take = failed_run("--then", "generate", "--prompts", str(prompts))
    prompts.unlink()
    before, seen, asked = _files(run_dir), _seen(env, run_id), said(calls, "sbatch")
    take(2)
    one_error(cli(env, "resume", run_id), f"`after[0].prompts` is '{prompts}', which does not exist")
    assert said(calls, "sbatch") == asked and _files(run_dir) == before and _seen(env, run_id) == seen
