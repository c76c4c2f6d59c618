"""Registry and run-dir bookkeeping: concurrent submits, run ids, lookups, provenance."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from primus_slurm.jobs import registry, runs
from primus_slurm.errors import UserError

WRITER = """
import sys
from primus_slurm.jobs import registry
registry.record({"run_id": sys.argv[1], "run_dir": "/x/" + sys.argv[1], "job_id": sys.argv[2]})
"""


def test_twenty_concurrent_writers_lose_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, runs.new_run_id(), str(i)])
             for i in range(20)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    lines = (tmp_path / registry.FILE_NAME).read_text().splitlines()
    assert len(lines) == 20 and all(json.loads(l)["run_id"] for l in lines)
    assert sorted(int(e["job_id"]) for e in registry.entries()) == list(range(20))


def test_run_ids_and_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path))
    ids = {runs.new_run_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", i) for i in ids)
    registry.record({"run_id": "20260101-000000-aaaaaa", "run_dir": str(tmp_path / "a"), "job_id": "11"})
    registry.record({"run_id": "20260101-000000-aaaabb", "run_dir": str(tmp_path / "b"), "job_id": "12"})
    registry.record({"run_id": "20260101-000000-aaaaaa", "job_id": "13"})  # a later line updates
    assert registry.find("20260101-000000-aaaaaa")["job_id"] == "13"
    assert registry.find("12")["run_id"].endswith("aaaabb")
    assert registry.find(str(tmp_path / "b"))["job_id"] == "12"
    assert registry.find("20260101-000000-aaaab")["job_id"] == "12"  # unique prefix
    with pytest.raises(UserError, match="matches 2 runs"):
        registry.find("20260101-000000-aaaa")
    with pytest.raises(UserError, match="not a known run"):
        registry.find("nope")


def test_torn_line_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path))
    registry.record({"run_id": "r1", "run_dir": "/x"})
    with open(tmp_path / registry.FILE_NAME, "a") as f:
        f.write('{"run_id": "r2", "run_d')
    assert [e["run_id"] for e in registry.entries()] == ["r1"]


def test_lines_that_are_not_run_entries_are_skipped(tmp_path, monkeypatch):
    """A hand-edited registry ({} or a list on a line) must not break status/list/logs with a KeyError."""
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path))
    registry.record({"run_id": "r1", "run_dir": "/x"})
    with open(tmp_path / registry.FILE_NAME, "a") as f:
        f.write('{}\n[1, 2]\n{"run_id": 7}\n')
    registry.record({"run_id": "r2", "run_dir": "/y"})
    assert [e["run_id"] for e in registry.entries()] == ["r1", "r2"]


def test_a_line_with_bad_bytes_spoils_only_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path))
    registry.record({"run_id": "r1", "run_dir": "/x"})
    with open(tmp_path / registry.FILE_NAME, "ab") as f:
        f.write(b'{"run_id": "r\xff\xfe"}\n\xc3\n')
    registry.record({"run_id": "r2", "run_dir": "/y"})
    assert [e["run_id"] for e in registry.entries()][::2] == ["r1", "r2"]  # (the bad line decodes with U+FFFD)


def test_a_run_directory_the_registry_does_not_list_is_found_by_its_run_json(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    run_dir = tmp_path / "ws" / "q" / "20260101-000000-cccccc"
    run_dir.mkdir(parents=True)
    with pytest.raises(UserError, match="not a known run"):  # no run.json: not a run
        registry.find(str(run_dir))
    runs.write_run_json(run_dir, {"run_id": "20260101-000000-cccccc", "executor": "local", "job_id": "local-9",
                                  "name": "q", "submit_time": "t", "pid": 9})
    found = registry.find(str(run_dir))
    assert found == {"run_id": "20260101-000000-cccccc", "name": "q", "executor": "local", "job_id": "local-9",
                     "submit_time": "t", "run_dir": str(run_dir)}


def test_an_unwritable_registry_refuses_the_submit_before_anything_runs(tmp_path, capsys, monkeypatch):
    """The job used to start, then recording it failed with a traceback: a run nobody could find, submitted again."""
    from primus_slurm.cli import run as cli_run

    ws = tmp_path / "ws"
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", "/proc/no-such-dir")
    code = cli_run(["submit", "quickstart", "--executor", "local", "--set", f"experiment.workspace={ws}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: cannot write the run registry /proc/no-such-dir/") and \
        err.rstrip().endswith("nothing submitted") and err.count("\n") == 1, err
    assert not list(ws.rglob("job.sbatch"))  # no run directory left behind


@pytest.mark.parametrize("argv", [["cancel", "REF"], ["resume", "REF"], ["logs", "REF"], ["status", "REF"],
                                  ["status", "REF", "--json"], ["compare", "REF"],
                                  ["compare", "20260101-000000-aaaaaa", "REF"], ["export", "REF"], ["eval", "REF"],
                                  ["generate", "REF", "--prompt", "hi"], ["verify-fp4", "REF"]])
@pytest.mark.parametrize("ref", ["", "  "])
def test_an_empty_run_is_refused_not_taken_for_the_only_run(tmp_path, capsys, monkeypatch, argv, ref):
    """`RUN=""; primus-slurm cancel "$RUN"`: "" is a prefix of every run id, so it named the only run there was (and
    a bare `status ""` listed them all). Every command that takes RUN refuses it, touching nothing."""
    from primus_slurm.cli import run as cli_run

    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "20260101-000000-aaaaaa"
    run_dir.mkdir()
    registry.record({"run_id": run_dir.name, "run_dir": str(run_dir), "job_id": "local-1", "executor": "local"})
    before = (tmp_path / registry.FILE_NAME).read_text()
    code = cli_run([ref if a == "REF" else a for a in argv])
    out = capsys.readouterr()
    what = "run id, job id, run directory or sweep id" if argv[0] in ("cancel", "resume", "status", "compare") \
        else "run id, job id or run directory"
    assert code == 2 and out.err == f"error: RUN is empty; give a {what}\n" and out.out == "", out
    assert (tmp_path / registry.FILE_NAME).read_text() == before and not (run_dir / "cancelled").exists()
    with pytest.raises(UserError, match="RUN is empty"):  # (and the lookup itself, for any other caller)
        registry.find(ref)


def test_provenance_names_this_checkout(tmp_path):
    info = runs.provenance({"experiment": {"name": "x"}, "cluster": {"stall_minutes": 5},
                            "trainer": {"schedule": {"train_iters": 7}}}, "h" * 64, "rid", "local")
    sha = subprocess.run(["git", "-C", str(runs.trainer_source_dir()), "rev-parse", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    assert info["git_sha"] == sha and isinstance(info["git_dirty"], bool)
    assert info["stall_minutes"] == 5.0 and info["train_iters"] == 7 and info["executor"] == "local"
    assert runs.git_provenance(tmp_path) == {"git_sha": None, "git_dirty": None}
