"""`sweep` without a cluster: bad input is one line and exit 2 with nothing written; --dry-run prints the trial
table (refused trials with their one reason) and the job array script (issue 32)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, cli

QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")


@pytest.fixture
def env(tmp_path) -> dict:
    return dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PRIMUS_WORKSPACE=str(tmp_path / "ws"))


@pytest.mark.parametrize("args, says", [
    (["--grid", "trainer.schedule.lrr=1e-3,2e-3"], "unknown key `trainer.schedule.lrr`"),
    (["--grid", "trainer.schedule.lr="], "the grid is empty"),
    ([], "give at least one --grid"),
    (["--grid", "trainer.lora.dim=4,eight"], "`trainer.lora.dim` is str 'eight'"),
    (["--grid", "trainer.lora.dim=" + ",".join(map(str, range(1, 51))),
      "--grid", "trainer.schedule.train_iters=" + ",".join(map(str, range(1, 22)))], "makes 1,050 trials"),
    (["--grid", "trainer.lora.dim=1,2,3", "--max-trials", "2"], "--max-trials 2 allows fewer"),
    (["--zip", "trainer.lora.dim=4,8", "--zip", "trainer.lora.alpha=8"], "each needs as many values"),
    (["--grid", "trainer.lora.dim=4,8", "--zip", "trainer.lora.dim=4,8"], "swept twice"),
])
def test_bad_input_is_one_line_and_nothing_submitted(env, tmp_path, args, says):
    out = cli(env, "sweep", QUICKSTART, "--executor", "local", *args)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and says in out.stderr, out.stderr
    assert not (tmp_path / "ws").exists() and not (tmp_path / "state").exists()


def test_many_trials_pass_with_max_trials(env):
    grid = ["--grid", "trainer.lora.dim=" + ",".join(map(str, range(1, 51))),
            "--grid", "trainer.schedule.train_iters=" + ",".join(map(str, range(1, 22)))]
    out = cli(env, "sweep", QUICKSTART, "--executor", "slurm", *grid, "--max-trials", "1050", "--dry-run", "--json",
              timeout=600)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    accepted = [t for t in data["trials"] if t["error"] is None]
    assert len(data["trials"]) == 1050 and len(accepted) == 850  # (train_iters 1-4: shorter than the warmup, refused)
    assert f"#SBATCH --array=0-{len(accepted) - 1}\n" in data["script"]


def test_dry_run_prints_table_and_array_script(env, tmp_path):
    out = cli(env, "sweep", QUICKSTART, "--executor", "slurm", "--grid", "trainer.schedule.lr=1e-3,2e-3",
              "--grid", "trainer.parallelism.tensor=1,3", "--max-parallel", "2", "--dry-run")
    assert out.returncode == 0, out.stderr
    table, _, script = out.stdout.partition("# ---- the array script ----\n")
    lines = table.splitlines()
    assert lines[0].split() == ["trial", "trainer.schedule.lr", "trainer.parallelism.tensor", "verdict"]
    assert lines[1].split() == ["0", "1e-3", "1", "task", "0"] and lines[3].split()[:4] == ["2", "2e-3", "1", "task"]
    for refused in (lines[2], lines[4]):  # TP 3 on one process: the contract's own one line, not submitted
        assert "refused: `trainer.parallelism" in refused, refused
    assert "#SBATCH --array=0-1%2\n" in script and "#SBATCH --job-name=quickstart\n" in script
    run_dirs = [line.split("RUN_DIR=")[1].split(" ;;")[0] for line in script.splitlines() if "RUN_DIR=/" in line]
    assert len(run_dirs) == 2 and len(set(run_dirs)) == 2
    assert 'exec bash "$RUN_DIR/job.sbatch"' in script
    assert not (tmp_path / "ws").exists()  # a dry run writes nothing


def test_array_tasks_share_resources(env):
    out = cli(env, "sweep", QUICKSTART, "--executor", "slurm", "--grid", "cluster.time=00:10:00,00:20:00",
              "--dry-run")
    assert out.returncode == 2 and "--time=00:20:00" in out.stderr and "share their resources" in out.stderr


@pytest.mark.parametrize("command", ["submit", "sweep"])
@pytest.mark.parametrize("then, says", [(["--then", "foo"], "--then 'foo': unknown step"),
                                        (["--then"], "--then: name a step"),
                                        (["--then", "generate"], "needs exactly one of prompts"),
                                        (["--then", "eval", "--data", "/no/such.jsonl"], "which does not exist")])
def test_bad_then_is_one_line(env, tmp_path, command, then, says):
    grid = ["--grid", "trainer.lora.dim=4,8"] if command == "sweep" else []
    out = cli(env, command, QUICKSTART, "--executor", "local", *grid, *then)
    # (a sweep lists a recipe a step makes invalid as each trial's refusal, then says none can go)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr + out.stdout, out.stderr
    assert not (tmp_path / "ws").exists() and not (tmp_path / "state").exists()


def test_pipeline_dry_run_shows_every_script(env):
    prompts = ROOT / "recipes" / "data" / "quickstart" / "validation.jsonl"
    out = cli(env, "submit", QUICKSTART, "--executor", "slurm", "--set", "cluster.gpus_per_node=2",
              "--set", "cluster.env_profile=h200", "--set", "trainer.distributed.device=auto",
              "--set", "trainer.distributed.backend=auto", "--dry-run", "--then", "eval", "--then", "export",
              "--merged", "--then", "generate", "--prompts", str(prompts), "--afterany")
    assert out.returncode == 0, out.stderr
    parts = out.stdout.split("# ---- after[")
    assert len(parts) == 4 and "#SBATCH --gpus-per-node=2\n" in parts[0]
    assert "#SBATCH --dependency=afterok:TRAIN_JOB\n#SBATCH --kill-on-invalid-dep=yes\n" in parts[1]
    assert "--gpus-per-node=1\n" in parts[1] and "#SBATCH --exclusive\n" in parts[1]
    # export builds the run's model under its precision, as eval does (a CPU node refuses FP8): one GPU too
    assert "--gpus-per-node=1\n" in parts[2] and "#SBATCH --exclusive\n" in parts[2]
    assert "--dependency=afterok:STEP_0_JOB" in parts[2] and "--merged" in parts[2]
    assert "--dependency=afterany:STEP_1_JOB" in parts[3] and "prompts.jsonl" in parts[3]
    assert "- step: generate\n#   when: afterany\n" in parts[0]  # the resolved recipe's after:


def test_wandb_group_needs_a_project(env):
    out = cli(env, "validate", QUICKSTART, "--set", "trainer.logging.wandb.group=g")
    assert out.returncode == 2 and "`trainer.logging.wandb.group` is set but" in out.stderr, out.stderr


def test_a_trial_that_does_not_fit_is_refused_with_the_plan(env):
    out = cli(env, "sweep", str(ROOT / "recipes" / "llama3_8b_bf16_alpaca_lora.yaml"), "--executor", "slurm",
              "--set", "cluster.gpus_per_node=1", "--set", "trainer.parallelism.tensor=1",
              "--set", "trainer.parallelism.sequence_parallel=false",
              "--grid", "trainer.schedule.micro_batch_size=1,16", "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split()[-2:] == ["task", "0"]
    assert "refused: predicted to need" in lines[2] and "GiB/GPU" in lines[2] and "#SBATCH --array=0-0\n" in out.stdout
    with_skip = cli(env, "sweep", str(ROOT / "recipes" / "llama3_8b_bf16_alpaca_lora.yaml"), "--executor", "slurm",
                    "--set", "cluster.gpus_per_node=1", "--set", "trainer.parallelism.tensor=1",
                    "--set", "trainer.parallelism.sequence_parallel=false",
                    "--grid", "trainer.schedule.micro_batch_size=1,16", "--dry-run", "--skip-memory-check")
    assert "#SBATCH --array=0-1\n" in with_skip.stdout


def test_dry_run_says_how_long_and_how_many_gpu_hours(env):
    """The plan's step time x train_iters per trial, and the sweep's GPU-hours, before anything is submitted."""
    out = cli(env, "sweep", str(ROOT / "recipes" / "llama3_8b_bf16_alpaca_lora.yaml"), "--executor", "slurm",
              "--grid", "trainer.lora.dim=8,16", "--max-parallel", "1", "--dry-run", "--set", "cluster.nodes=2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["trial", "trainer.lora.dim", "time", "GPU-h", "verdict"]
    data = json.loads(cli(env, "sweep", str(ROOT / "recipes" / "llama3_8b_bf16_alpaca_lora.yaml"), "--executor",
                          "slurm", "--grid", "trainer.lora.dim=8,16", "--dry-run", "--json", "--set",
                          "cluster.nodes=2").stdout)
    hours = [t["planned_hours"] for t in data["trials"]]
    assert all(h > 0 for h in hours) and all(t["planned_gpu_hours"] == t["planned_hours"] * 16 for t in data["trials"])
    h, m, s = (int(x) for x in lines[1].split()[2].split(":"))
    assert abs(h * 3600 + m * 60 + s - hours[0] * 3600) <= 1 and lines[1].split()[3] == f"{hours[0] * 16:,.1f}"
    total = sum(hours) * 16
    assert lines[3].startswith(f"planned: 2 trials, {total:,.1f} GPU-hours in all; about ") and "with 1 at once" in lines[3]


def test_a_key_that_does_nothing_in_some_trials_is_noted_once_with_them(env):
    """submit's notes (primus_contract.rules_dependent) for a sweep: each once on stderr, naming the trials it
    concerns when not all."""
    out = cli(env, "sweep", QUICKSTART, "--executor", "local", "--dry-run", "--grid",
              "trainer.precision.fp8_recipe=delayed,tensorwise", "--grid", "trainer.schedule.lr=1e-3,2e-3")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ('note: `trainer.precision.fp8_recipe` is "tensorwise" but does nothing without '
                          "`trainer.precision.fp8` hybrid or e4m3 (trials 2, 3)\n"), out.stderr


def test_trials_never_share_a_run_directory(env, monkeypatch):
    """Ids drawn within one second share their stamp; two trials that draw the same 3 random bytes got one run
    directory (the second one's create refused, and the cleanup removed the first). The plan draws again."""
    from primus_slurm.experiments import sweep as sweep_mod
    from primus_slurm.jobs import runs

    for key in ("PRIMUS_SLURM_STATE_DIR", "PRIMUS_WORKSPACE"):
        monkeypatch.setenv(key, env[key])
    drawn = iter(["20261207-100000-abc123", "20261207-100000-abc123", "20261207-100000-def456"])
    monkeypatch.setattr(runs, "new_run_id", lambda now=None: next(drawn))
    sweep = sweep_mod.plan(QUICKSTART, ("trainer.lora.dim=8,16",), (), (), "local")
    assert [t.error for t in sweep.trials] == [None, None]
    assert [t.prepared.run_id for t in sweep.trials] == ["20261207-100000-abc123", "20261207-100000-def456"]


def test_a_failed_launch_removes_what_it_made_and_nothing_else(env, monkeypatch):
    """A directory in the way of a trial (another run's, made since the plan) stops the launch: the trial and sweep
    directories the launch made go, that one stays as it was."""
    from primus_slurm.errors import UserError
    from primus_slurm.experiments import sweep as sweep_mod

    for key in ("PRIMUS_SLURM_STATE_DIR", "PRIMUS_WORKSPACE"):
        monkeypatch.setenv(key, env[key])
    sweep = sweep_mod.plan(QUICKSTART, ("trainer.lora.dim=8,16",), (), (), "local")
    other = sweep.trials[1].prepared.run_dir
    other.mkdir(parents=True)
    (other / "run.json").write_text("{}\n")
    with pytest.raises(UserError, match=f"run directory {other} already exists"):
        sweep_mod.launch(sweep)
    assert (other / "run.json").read_text() == "{}\n" and sorted(other.parent.iterdir()) == [other]


def test_resume_sweep_keeps_to_max_parallel_on_slurm(env, tmp_path):
    """resume SWEEP submitted every unfinished trial at once, whatever --max-parallel said: now each resumed trial
    waits (afterany) for the job N before it, the sweep's trials still running first: N lanes. Four trials, N 2,
    trial 3 still running, on a stand-in cluster."""
    from test_sweep_bad_input import fake_slurm, said

    env, calls = fake_slurm(tmp_path, env, 10)
    out = cli(env, "sweep", QUICKSTART, "--executor", "slurm", "--grid", "trainer.lora.dim=4,8,16,32",
              "--max-parallel", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert said(calls, "sbatch") == [""]  # the array, 501 (--array=0-3%2 in its script)
    (tmp_path / "queue").write_text("501_3 RUNNING\n")
    out = cli(env, "resume", data["sweep_id"])
    assert out.returncode == 0 and out.stdout.count("resumed run") == 3, out
    assert f"not resumed: run {data['runs'][3]['run_id']} is RUNNING" in out.stdout
    assert said(calls, "sbatch")[1:] == ["--exclude=", "--exclude= --dependency=afterany:501_3",
                                        "--exclude= --dependency=afterany:502"]
