"""Bad input to sweeps and pipelines (issue 39): every case is one `error:` line naming what is wrong, exit 2, no
traceback, nothing submitted and nothing written. Pure CLI on crafted input: no cluster, no training; each case
well under a second."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, cli

QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")
SWEEP_ID = "sweep-20261204-000000-abcdef"


@pytest.fixture
def env(tmp_path) -> dict:
    return dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PRIMUS_WORKSPACE=str(tmp_path / "ws"))


def one_error(out, says: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr


def tree(root: Path) -> dict:
    """Every file below `root` with its size and mtime: what a command wrote shows as a difference."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


PROMPTS_NOT_JSON = str(ROOT / "README.md")


@pytest.mark.parametrize("args, says", [
    (["nosuch-recipe", "--grid", "trainer.lora.dim=4,8"], "recipe or preset 'nosuch-recipe' not found"),
    ([QUICKSTART, "--set", "trainer.lora.dim=4", "--grid", "trainer.lora.dim=8,16"],
     "--set trainer.lora.dim and the swept key trainer.lora.dim"),
    ([QUICKSTART, "--set", "trainer.lora={dim: 4}", "--zip", "trainer.lora.dim=8,16"],
     "--set trainer.lora and the swept key trainer.lora.dim"),
    ([QUICKSTART, "--grid", "trainer.lora.dim=4,8,4"], "--grid trainer.lora.dim=4,8,4: 4 is given twice"),
    ([QUICKSTART, "--zip", "trainer.lora.dim=4,8,4", "--zip", "trainer.lora.alpha=8,16,8"],
     "--zip trainer.lora.dim=4,8,4 --zip trainer.lora.alpha=8,16,8: 4, 8 is given twice"),
    ([QUICKSTART, "--grid", "trainer.schedule.lr=1e-3,0.001,1E-3"],  # one value three ways: as values, not text
     "--grid trainer.schedule.lr=1e-3,0.001,1E-3: 0.001 is given twice (as 1e-3: two identical trials)"),
    ([QUICKSTART, "--zip", "trainer.lora.dim=4,8,4", "--zip", "trainer.lora.alpha=8,16,8.0"],
     "4, 8.0 is given twice (as 4, 8: two identical trials)"),
    ([QUICKSTART, "--grid", "trainer.lora.dim=4,8", "--max-trials", "1000000"], "'--max-trials': 1000000 is not in"),
    ([QUICKSTART, "--grid", "trainer.schedule.train_iters=" + ",".join(map(str, range(10, 1010))),
      "--grid", "trainer.schedule.lr=" + ",".join(f"{k}e-5" for k in range(1, 1001))], "makes 1,000,000 trials"),
    ([QUICKSTART, "--set", "trainer.lora.bogus=1", "--grid", "trainer.lora.dim=4,8"],
     "every trial is refused: --set: unknown key `trainer.lora.bogus`"),
    ([QUICKSTART, "--grid", "after=[]"], "--grid after: the steps after each trial are --then's"),
    ([QUICKSTART, "--grid", "experiment.name=a,b"], "--grid experiment.name: the trials of one sweep share"),
    ([QUICKSTART, "--grid", "trainer.lora.dim=4,8", "--then", "generate", "--prompts", PROMPTS_NOT_JSON],
     "README.md:1: invalid JSON"),
    ([QUICKSTART, "--grid", "trainer.lora.dim=4,8", "--then", "export", "--no-adapter"], "exports nothing"),
    ([QUICKSTART, "--grid", "trainer.lora.dim=4,8", "--then", "generate", "--prompt", "hi", "--max-new-tokens", "0"],
     "`after[0].max_new_tokens` is 0"),
    ([QUICKSTART, "--grid", "trainer.lora.dim=4,8", "--then", "eval", "--merged"], "No such option '--merged'"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_sweep_bad_arguments(env, tmp_path, args, says, dry_run):
    out = cli(env, "sweep", *args, "--executor", "local", *(["--dry-run"] if dry_run else []))
    one_error(out, says)
    assert out.stdout == ""
    assert not (tmp_path / "ws").exists() and not (tmp_path / "state").exists()


def test_submit_dry_run_reads_the_prompts_as_the_submit_does(env, tmp_path):
    out = cli(env, "submit", QUICKSTART, "--dry-run", "--then", "generate", "--prompts", PROMPTS_NOT_JSON)
    one_error(out, "README.md:1: invalid JSON")
    assert out.stdout == "" and not (tmp_path / "ws").exists()


def test_a_dry_run_where_every_trial_is_refused_exits_2(env, tmp_path):
    """Two different refusals: the table says each, and the exit says nothing could go (as the submit would)."""
    out = cli(env, "sweep", QUICKSTART, "--executor", "slurm", "--grid", "trainer.parallelism.tensor=2,3", "--dry-run")
    assert out.returncode == 2 and out.stderr == "error: sweep: all 2 trials were refused (each one's reason above)\n"
    assert out.stdout.count("refused: ") == 2 and not (tmp_path / "ws").exists()


def _trial(index: int, run_dir: Path | None, **extra) -> dict:
    return {"index": index, "values": {"trainer.lora.dim": str(4 * (index + 1))}, "task": index, "error": None,
            "run_id": f"20261204-000000-00000{index}" if run_dir else None, "run_dir": str(run_dir) if run_dir else None,
            **extra}


def craft(tmp_path: Path, body) -> Path:
    """A sweep directory holding `body` as its sweep.json (text as given, else JSON)."""
    d = tmp_path / "ws" / "quickstart" / SWEEP_ID
    d.mkdir(parents=True)
    (d / "sweep.json").write_text(body if isinstance(body, str) else json.dumps(body))
    return d


GOOD = {"sweep_id": SWEEP_ID, "recipe": QUICKSTART, "executor": "local", "max_parallel": 1,
        "keys": ["trainer.lora.dim"]}


@pytest.mark.parametrize("body, says", [
    ({k: v for k, v in GOOD.items()}, "`trials` is missing; expected a list of trials"),
    ([1, 2], "holds a JSON list, not an object"),
    ({**GOOD, "trials": [{**_trial(0, Path("/x")), "run_dir": None}]}, "`trials[0]` has run_id"),
    ({**GOOD, "trials": {"0": {}}}, "`trials` is {'0': {}}; expected a list of trials"),
    ({**GOOD, "trials": ["trial"]}, "`trials[0]` is 'trial'; expected an object"),
    ({**GOOD, "trials": [{**_trial(0, None), "index": "0"}]}, "`trials[0].index` is '0'; expected int"),
    ({**GOOD, "trials": [{**_trial(0, None), "values": None}]}, "`trials[0].values` is None; expected dict"),
    ({**GOOD, "keys": "trainer.lora.dim", "trials": []}, "`keys` is 'trainer.lora.dim'; expected a list"),
    ({**GOOD, "sweep_id": None, "trials": []}, "`sweep_id` is None; expected a string"),
    ('{"sweep_id": "sweep-', "has no readable sweep.json"),
])
@pytest.mark.parametrize("command", [["status"], ["compare", "--json"], ["cancel"], ["resume"]])
def test_a_malformed_sweep_json_is_one_line(env, tmp_path, body, says, command):
    sweep_dir = craft(tmp_path, body)
    before = tree(tmp_path)
    out = cli(env, command[0], str(sweep_dir), *command[1:])
    one_error(out, says)
    assert out.stdout == "" and tree(tmp_path) == before


def test_resume_of_a_sweep_that_resumes_nothing_exits_2(env, tmp_path):
    """Its one trial's run directory is gone: `not resumed:` says why, and the exit says nothing was resumed."""
    sweep_dir = craft(tmp_path, {**GOOD, "trials": [_trial(0, tmp_path / "gone")]})
    out = cli(env, "resume", str(sweep_dir))
    assert out.returncode == 2 and "not resumed: " in out.stdout and "no longer exists" in out.stdout, out
    assert out.stderr == f"error: resume {sweep_dir}: no trial was resumed (each one's reason above)\n"


def test_cancel_of_a_sweep_without_a_submitted_trial_exits_2(env, tmp_path):
    refused = {**_trial(0, None), "task": None, "error": "refused"}
    sweep_dir = craft(tmp_path, {**GOOD, "trials": [refused]})
    one_error(cli(env, "cancel", str(sweep_dir)), "the sweep has no submitted trial; nothing to cancel")


def test_cancel_and_status_agree_on_a_trial_whose_directory_is_gone(env, tmp_path):
    """status SWEEP and cancel SWEEP say the same state (UNKNOWN, the directory gone), with the same reason."""
    gone = tmp_path / "ws" / "quickstart" / "20261204-000000-000000"
    sweep_dir = craft(tmp_path, {**GOOD, "trials": [_trial(0, gone, job_id="local-999999")]})
    board = json.loads(cli(env, "status", str(sweep_dir), "--json").stdout)["trials"]
    assert board[0]["state"] == "UNKNOWN" and "no longer exists" in board[0]["error"], board
    out = cli(env, "cancel", str(sweep_dir))
    assert out.returncode == 0 and " is UNKNOWN: " in out.stdout and "no longer exists" in out.stdout, out
    assert "FAILED" not in out.stdout


def test_cancel_of_a_job_slurm_no_longer_knows_says_so(env, tmp_path, local_slurm):
    """Slurm 22.05's plain `scancel ID` of an id its controller does not know prints nothing and exits 0: cancel said
    `cancelled` before. It now says the run is UNKNOWN and that Slurm does not know the job, and stamps nothing."""
    run_dir = tmp_path / "ws" / "quickstart" / "20261204-000000-000000"
    run_dir.mkdir(parents=True)
    sweep_dir = craft(tmp_path, {**GOOD, "executor": "slurm", "trials": [_trial(0, run_dir)]})
    out = cli(env, "cancel", str(sweep_dir))  # (no run.json, no registry entry: no job id at all)
    assert out.returncode == 0 and "no Slurm job id is recorded for it; nothing to cancel" in out.stdout, out
    (run_dir / "run.json").write_text(json.dumps({"job_id": "999999", "executor": "slurm"}))
    before = tree(run_dir)
    out = cli(env, "cancel", str(sweep_dir))
    assert out.returncode == 0, out
    assert "Slurm does not know job 999999" in out.stdout and "nothing to cancel" in out.stdout, out
    assert "cancelled run" not in out.stdout and tree(run_dir) == before


def fake_slurm(tmp_path: Path, env: dict, accept: int) -> tuple[dict, Path]:
    """A cluster that takes the first `accept` jobs (ids 501, 502, ...; the file `accept` holds the number) and then
    refuses, as a per-user submit limit does; scancel and scontrol only log; sacct and squeue -j know the jobs of
    the file `queue` (`ID STATE` lines), sinfo nothing. (env with it first on PATH, the file of every call)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (tmp_path / "accept").write_text(f"{accept}\n")
    (bin_dir / "sbatch").write_text(f"""#!/bin/bash
n=$(( $(cat {tmp_path}/count 2>/dev/null || echo 0) + 1 )); echo $n > {tmp_path}/count
echo "sbatch $*" >> {calls}
if [ $n -gt $(cat {tmp_path}/accept) ]; then echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2; exit 1; fi
echo "Submitted batch job $((500 + n))"
""")
    for name in ("scancel", "scontrol"):
        (bin_dir / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\n')
    (bin_dir / "sacct").write_text(f"#!/bin/bash\nawk '{{print $1 \"|\" $1 \"|\" $2 \"|0:0|node1|Unknown\"}}' "
                                   f"{tmp_path}/queue 2>/dev/null\nexit 0\n")
    (bin_dir / "squeue").write_text(f"#!/bin/bash\nwhile [ $# -gt 0 ]; do [ \"$1\" = -j ] && id=$2; shift; done\n"
                                    f"[ -n \"$id\" ] && awk -v id=\"$id\" '$1 == id {{print $2}}' {tmp_path}/queue "
                                    "2>/dev/null\nexit 0\n")
    (bin_dir / "sinfo").write_text("#!/bin/bash\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return dict(env, PATH=f"{bin_dir}:{env['PATH']}"), calls


def said(calls: Path, tool: str) -> list[str]:
    """What `tool` was asked (its arguments; sbatch's: the options, not the script's path)."""
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [" ".join(a for a in line.split()[1:] if not a.endswith(".sh")) for line in lines
            if line.split()[0] == tool]


@pytest.mark.parametrize("command, accept, queued", [
    (["submit", QUICKSTART, "--then", "eval", "--then", "export"], 2, "501 502"),  # the export refused
    (["sweep", QUICKSTART, "--grid", "trainer.lora.dim=4,8", "--then", "eval"], 2, "501 502"),  # trial 1's eval
    (["submit", QUICKSTART, "--then", "eval"], 0, ""),  # the training itself
])
def test_a_refused_step_leaves_nothing_queued_and_nothing_written(env, tmp_path, command, accept, queued):
    """The run's (or the array's) job goes in held; a step sbatch refuses cancels, by id, exactly the jobs this
    command queued, and removes what it made: no job runs with its steps missing, no run directory, no registry
    entry."""
    env, calls = fake_slurm(tmp_path, env, accept)
    out = cli(env, *command, "--executor", "slurm")
    one_error(out, "sbatch rejected the job: sbatch: error: QOSMaxSubmitJobPerUserLimit; nothing was submitted")
    assert said(calls, "sbatch")[0] == "--hold" and said(calls, "scontrol") == []
    assert said(calls, "scancel") == ([queued] if queued else [])
    assert not [p for p in (tmp_path / "ws").rglob("*") if p.is_file()]
    assert cli(env, "list", "--all", "--json").stdout.strip() == "[]"


def test_the_held_job_is_released_once_its_steps_are_queued(env, tmp_path):
    """Accepted: released after the last step; a recipe that holds its job itself (extra_sbatch --hold) stays held.
    A resume that queues the steps again holds the new job too, and cancels it when a step is refused."""
    env, calls = fake_slurm(tmp_path, env, 10)
    out = cli(env, "submit", QUICKSTART, "--executor", "slurm", "--json", "--then", "eval", "--then", "export")
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    info = json.loads((Path(entry["run_dir"]) / "run.json").read_text())
    assert entry["job_id"] == "501" and [s["job_id"] for s in info["pipeline"]] == ["502", "503"]
    assert said(calls, "sbatch") == ["--hold", "", ""] and said(calls, "scontrol") == ["release 501"]

    out = cli(env, "submit", QUICKSTART, "--executor", "slurm", "--set", 'cluster.extra_sbatch=["--hold"]',
              "--then", "eval")
    assert out.returncode == 0 and said(calls, "scontrol") == ["release 501"], out.stderr  # 504 stays held

    (tmp_path / "accept").write_text("6\n")  # the resumed job goes in, its eval step does not
    out = cli(env, "resume", entry["run_id"])
    one_error(out, "nothing runs: the resumed job of run")
    assert said(calls, "sbatch")[-2:] == ["--exclude= --hold", ""] and said(calls, "scancel") == ["506"]
    assert said(calls, "scontrol") == ["release 501"] and out.stdout == ""


def test_a_pipeline_step_checks_its_prompts_in_the_runs_format(env, tmp_path):
    """`--then generate --prompts` is checked as `generate --prompts` checks it, in the run's data format (alpaca for
    the quickstart): a JSON object without `instruction` is refused at submit, not in the step's job (audit,
    2026-12-07)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "what is 2+2?"}\n')
    for cmd in ("submit", "validate"):
        out = cli(env, cmd, QUICKSTART, *(("--dry-run",) if cmd == "submit" else ()), "--then", "generate",
                  "--prompts", str(prompts))
        one_error(out, "instruction")
    assert not (tmp_path / "ws").exists()


def test_a_pipeline_eval_step_checks_its_data_as_eval_does(env, tmp_path):
    """`--then eval --data FILE.jsonl` under the run's `bad_records: error`: a record the job's formatter refuses is
    refused at submit, as `eval --data` refuses it, not in the step's job."""
    data = tmp_path / "eval.jsonl"
    data.write_text('{"instruction": "Sort the digits.", "input": "3 1", "output": "1 3"}\n{"instruction": "x"}\n')
    out = cli(env, "submit", QUICKSTART, "--dry-run", "--then", "eval", "--data", str(data))
    one_error(out, "missing field 'output'")
    assert not (tmp_path / "ws").exists()
