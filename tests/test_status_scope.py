"""A bare `status`/`list` shows the runs of the checkout it runs in (issue 33 item 7): the registry is one per user
across every clone. A run belongs to the git checkout holding the current directory (else to the current directory)
when it was submitted from there or below, or its run directory lies there; `--all` shows every run, one line
says how many were left out, sacct is asked only about the Slurm runs shown, and a named RUN is found anywhere."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import CLI
from primus_slurm.jobs import registry


@pytest.fixture
def world(tmp_path):
    """Two clones (git checkouts) and a directory outside both, a registry with a Slurm run from each clone and a
    local run whose run directory lies in clone A, and sacct/squeue stubs that log every call."""
    clones = {name: tmp_path / name for name in ("a", "b")}
    for clone in clones.values():
        (clone / ".git").mkdir(parents=True)
        (clone / "sub").mkdir()
    (tmp_path / "elsewhere").mkdir()
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("sacct", "squeue"):
        (stubs / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls\n')
        (stubs / tool).chmod(0o755)
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PATH=f"{stubs}:{os.environ['PATH']}")
    scratch = tmp_path / "scratch"  # a shared workspace ($PRIMUS_WORKSPACE) outside every clone
    lines = [
        {"run_id": "20261203-000000-aaaaaa", "executor": "slurm", "job_id": "101", "name": "qa",
         "run_dir": str(scratch / "qa" / "20261203-000000-aaaaaa"), "submit_dir": str(clones["a"] / "sub")},
        {"run_id": "20261203-000001-bbbbbb", "executor": "slurm", "job_id": "202", "name": "qb",
         "run_dir": str(scratch / "qb" / "20261203-000001-bbbbbb"), "submit_dir": str(clones["b"])},
        {"run_id": "20261203-000002-cccccc", "executor": "local", "job_id": "303", "name": "old",  # before submit_dir
         "run_dir": str(clones["a"] / "runs" / "old" / "20261203-000002-cccccc")},
    ]
    for line in lines:
        Path(line["run_dir"]).mkdir(parents=True)
    state = tmp_path / "state"
    state.mkdir()
    (state / registry.FILE_NAME).write_text("".join(json.dumps(line) + "\n" for line in lines))

    def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
        (tmp_path / "calls").unlink(missing_ok=True)
        return subprocess.run([str(CLI), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)

    def calls() -> str:
        return (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""

    return clones, tmp_path / "elsewhere", cli, calls


def test_a_bare_status_shows_this_checkouts_runs_and_asks_sacct_about_those_only(world):
    clones, _, cli, calls = world
    out = cli(clones["a"] / "sub", "status")  # a subdirectory of clone A: its checkout is clone A
    assert out.returncode == 0, out.stderr
    assert "aaaaaa" in out.stdout and "cccccc" in out.stdout and "bbbbbb" not in out.stdout
    assert out.stdout.splitlines()[-1] == f"1 run submitted outside {clones['a']} not shown (--all lists every run)"
    assert "-j 101 " in calls() and "202" not in calls()
    out = cli(clones["b"], "status", "--json")  # the JSON stays one document; the line goes to stderr
    assert [r["run_id"] for r in json.loads(out.stdout)] == ["20261203-000001-bbbbbb"]
    assert out.stderr.strip() == f"2 runs submitted outside {clones['b']} not shown (--all lists every run)"
    assert "-j 202 " in calls() and "101" not in calls()


def test_all_shows_every_run_and_a_named_run_is_found_anywhere(world):
    clones, elsewhere, cli, calls = world
    out = cli(clones["b"], "status", "--all", "--json")
    assert len(json.loads(out.stdout)) == 3 and out.stderr == ""
    assert "-j 101,202 " in calls()
    listed = cli(clones["b"], "list", "--all").stdout
    assert all(r in listed for r in ("aaaaaa", "bbbbbb", "cccccc")) and "not shown" not in listed
    named = {"20261203-000000-aaaaaa": "aaaaaa", "101": "aaaaaa", "20261203-000002": "cccccc"}  # clone A's runs
    for ref, run_id in named.items():
        for cwd in (clones["b"], elsewhere):
            out = cli(cwd, "status", ref, "--json")
            assert out.returncode == 0 and json.loads(out.stdout)["run_id"].endswith(run_id), out.stderr
    out = cli(clones["b"], "status", "101", "--all")
    assert (out.returncode, out.stdout, out.stderr) == (2, "", "error: --all: lists every run; not with RUN\n")


def test_list_is_scoped_too_and_says_what_it_left_out(world):
    clones, elsewhere, cli, calls = world
    out = cli(clones["a"], "list")
    assert out.stdout.splitlines()[0].split()[:2] == ["RUN", "NAME"]
    assert [line.split()[0] for line in out.stdout.splitlines()[1:-1]] == ["20261203-000000-aaaaaa",
                                                                          "20261203-000002-cccccc"]
    assert out.stdout.splitlines()[-1].startswith("1 run submitted outside")
    out = cli(clones["a"], "list", "--json")
    assert len(json.loads(out.stdout)) == 2 and "1 run submitted outside" in out.stderr
    out = cli(elsewhere, "list")  # nothing here: the one line, not "no runs yet"
    assert out.stdout == f"3 runs submitted outside {elsewhere} not shown (--all lists every run)\n"
    out = cli(elsewhere, "status")
    assert out.stdout == f"3 runs submitted outside {elsewhere} not shown (--all lists every run)\n"
    assert calls() == ""  # no run shown: no scheduler query


def test_submit_records_where_it_was_submitted_from(tmp_path, monkeypatch):
    from primus_slurm.jobs import submit

    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "ws" / "r"
    run_dir.mkdir(parents=True)
    p = submit.Prepared(recipe=None, executor="local", run_id="20261203-000000-dddddd", run_dir=run_dir, script="")
    info = {"run_id": p.run_id, "name": "r", "executor": "local", "run_dir": str(run_dir), "submit_time": "t"}
    entry = submit.record(p, info, {"job_id": "9"})
    assert entry["submit_dir"] == str(tmp_path) and registry.entries()[0]["submit_dir"] == str(tmp_path)
    assert registry.belongs(entry, tmp_path.resolve()) and not registry.belongs(entry, tmp_path.resolve() / "x")
