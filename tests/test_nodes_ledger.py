"""The node ledger's rules, the job's settle decision, the node check's verdicts (standard-library functions, no
Slurm), and bad input to every `primus-slurm nodes` command: one line, exit 2, nothing written or submitted."""
from __future__ import annotations

import json
import os

import pytest

from conftest import ROOT
from primus_contract import node_faults, node_health, node_ledger
from primus_slurm.cli import run
from trainer.runtime import gpu_counters


def _ledger(tmp_path, *records):
    path = tmp_path / "ledger.jsonl"
    node_ledger.append(path, [node_ledger.line(*r) for r in records])
    return path


def test_two_strikes_from_different_runs_exclude_and_clear_forgets_them(tmp_path):
    path = _ledger(tmp_path, ("n1", "suspect", "CUDA error", "run A attempt 0"),
                   ("n1", "suspect", "again", "run A attempt 0"))  # one run attempt: one strike
    assert node_ledger.fold(node_ledger.read(path))["n1"].state == "suspect"
    assert node_ledger.excluded(path) == []
    node_ledger.append(path, [node_ledger.line("n1", "suspect", "slow GEMM", "check C")])
    state = node_ledger.fold(node_ledger.read(path))["n1"]
    assert (state.state, len(state.strikes)) == ("excluded", 2) and "slow GEMM" in state.why
    node_ledger.append(path, [node_ledger.line("n1", "cleared", "fixed", "hand"),
                              node_ledger.line("n1", "suspect", "once more", "run B attempt 0")])
    assert node_ledger.fold(node_ledger.read(path))["n1"].state == "suspect"  # strikes start again
    node_ledger.append(path, [node_ledger.line("n2", "excluded", "by hand", "hand")])
    assert node_ledger.excluded(path) == ["n2"]


def test_a_hand_edited_line_never_reaches_the_script(tmp_path):
    """The names go into sbatch's --exclude: a line whose node is not one Slurm node name (a newline, a space) or
    whose time is not a number is skipped (audit, 2026-12-07: `n1\nrm -rf x #` rendered a shell line)."""
    from primus_slurm.errors import UserError
    from primus_slurm.nodes.ledger import check_node

    path = _ledger(tmp_path, ("n1", "excluded", "by hand", "hand"))
    bad = [{"t": 1.0, "node": "n2\nrm -rf /tmp/x #", "state": "excluded"}, {"t": 1.0, "node": "n3\n",
           "state": "excluded"}, {"t": 1.0, "node": "a b", "state": "excluded"},
           {"t": "abc", "node": "n4", "state": "excluded"}, {"node": "n5", "state": "excluded"}]
    node_ledger.append(path, [json.dumps(r) for r in bad])
    assert node_ledger.excluded(path) == ["n1", "n5"]
    for name in ("n3\n", "a b", "n1;x"):
        with pytest.raises(UserError, match="NODE must be one Slurm node name"):
            check_node(name)


def _fault(node, kind, attempt=0, why="x"):
    return {"event": "fault", "attempt": attempt, "node": node, "kind": kind, "why": why}


def test_settle_requeues_away_from_a_named_node_within_its_limits():
    nodes, part = ["n1", "n2"], ["n1", "n2", "n3"]
    action, exclude, _ = node_faults.decide([_fault("n2", "device")], 0, nodes, 1, True, [], part)
    assert (action, exclude) == ("requeue", ["n2"])
    # a preflight failure on every node is the image's, not a node's
    both = [_fault("n1", "preflight"), _fault("n2", "preflight")]
    assert node_faults.decide(both, 0, nodes, 2, True, [], part)[0] == "end"
    assert node_faults.decide(both[1:], 0, nodes, 2, True, [], part)[:2] == ("requeue", ["n2"])
    # placement: excluding n2 and n3 leaves one node for a two-node job
    action, _, why = node_faults.decide([_fault("n2", "device")], 0, nodes, 1, True, ["n3"], part)
    assert action == "end" and "leaves 1 of the partition's 3 nodes" in why
    # no requeue without cluster.requeue, after a finish, or past the limit
    assert node_faults.decide([_fault("n2", "device")], 0, nodes, 1, False, [], part)[0] == "end"
    assert node_faults.decide([_fault("n2", "slow")], 0, nodes, 1, True, [], part)[0] == "end"  # slow: no requeue
    earlier = [{"event": "attempt", "action": "requeue excluding x"}] * node_faults.MAX_NODE_REQUEUES
    assert node_faults.decide([*earlier, _fault("n2", "device")], 0, nodes, 1, True, [], part)[0] == "end"
    # only this attempt's faults count
    assert node_faults.decide([_fault("n2", "device", attempt=0)], 1, nodes, 1, True, [], part)[0] == "end"


def test_a_hang_names_the_node_whose_ranks_never_timed_out():
    ranks = [{"event": "rank", "attempt": 0, "rank": r, "node": n} for r, n in enumerate(["n1", "n1", "n2", "n2"])]
    waited = [{"event": "timeout", "attempt": 0, "rank": r, "node": "n1", "why": "Timed out", "t": 0.1 * r}
              for r in (0, 1)]
    assert list(node_faults.stopped(ranks + waited, 0)) == ["n2"]
    one_on_n2 = waited + [{"event": "timeout", "attempt": 0, "rank": 3, "node": "n2", "t": 0.5}]
    assert node_faults.stopped(ranks + one_on_n2, 0) == {}  # each node had a rank waiting: nobody is named
    woken = waited + [{"event": "timeout", "attempt": 0, "rank": 3, "node": "n2", "t": 3.5}]
    assert list(node_faults.stopped(ranks + woken, 0)) == ["n2"]  # a stopped rank woken to be killed, seconds on
    assert node_faults.stopped(ranks, 0) == {}
    # a rank named slow before it hung (CI under load, 2026-12-06): the hang is why the attempt ended, not the slowness
    slow_then_hung = ranks + waited + [_fault("n1", "slow", why="rank 0: compute"), _fault("n2", "slow", why="rank 2")]
    named = node_faults.suspects(slow_then_hung, 0, ["n1", "n2"])
    assert named["n2"].startswith("hang: its ranks [2, 3] never timed out") and named["n1"] == "slow: rank 0: compute"


def test_settle_writes_the_ledger_and_the_attempt(tmp_path):
    run_dir, ledger = tmp_path / "run", tmp_path / "ws" / ".nodes" / "c.jsonl"
    node_faults.record(run_dir, "fault", attempt=0, node="n2", kind="device", why="CUDA error: ECC")
    out = node_faults.settle(run_dir, 0, "7", 1, ["n2"], ledger, True, [], ["n1", "n2"])
    assert out.startswith("requeue n2 | suspect: n2 (device: CUDA error: ECC)")
    assert node_ledger.fold(node_ledger.read(ledger))["n2"].state == "suspect"
    last = node_faults.read(run_dir)[-1]
    assert (last["event"], last["node"], last["action"]) == ("attempt", "n2", "requeue excluding n2")
    assert node_faults.settle(run_dir, 1, "7", 75, ["n1"], ledger, True, [], ["n1", "n2"]).startswith("end ")
    assert node_faults.read(run_dir)[-1]["action"].startswith("stopped to be resumed")
    # the attempt names the node that failed it, not a slow one that sorts first
    other = tmp_path / "run2"
    node_faults.record(other, "fault", attempt=0, node="n1", kind="slow", why="rank 0: compute +53 %")
    node_faults.record(other, "fault", attempt=0, node="n2", kind="device", why="CUDA error: ECC")
    node_faults.settle(other, 0, "8", 1, ["n1", "n2"], None, False, [], ["n1", "n2"])
    assert [node_faults.read(other)[-1][k] for k in ("node", "why")] == ["n2", "device: CUDA error: ECC"]


def _report(node, gemm, device="cpu", gpu_name=None, **extra):
    return {"node": node, "device": device, "gpu_name": gpu_name, "gemm_tflops": gemm, "gpus": [],
            "disk": {"path": "/tmp", "free_gib": 100.0}, "shared_fs": {"path": "/ws", "write_ms": 3.0}, **extra}


def test_node_check_verdicts():
    # CPU nodes: against the median node only
    v = node_health.judge([_report("a", 1.0), _report("b", 0.9), _report("c", 0.2)])
    assert [x["verdict"] for x in v] == ["ok", "ok", "slow"] and node_health.exit_code(v) == 3
    assert node_health.judge([_report("a", 1.0), _report("b", 0.3)])[1]["verdict"] == "ok"  # CPU noise: 0.25x
    # an H200 is held to the planner's rate (plan/calibration.py, scaled by plan/gpus.py)
    want = node_health.expected_tflops(node_health.gpu_of("NVIDIA H200"))
    assert 500 < want < 900
    gpu = dict(device="cuda", gpu_name="NVIDIA H200")
    v = node_health.judge([_report("a", want, **gpu), _report("b", 0.5 * want, **gpu)])
    assert [x["verdict"] for x in v] == ["ok", "slow"] and "planner expects" in v[1]["why"][0]
    held = {"index": 0, "free_gib": 20.0, "total_gib": 140.0, "errors": {"ecc.errors.uncorrected.volatile.total": 2}}
    v = node_health.judge([_report("a", want, gpus=[held], **gpu)])
    assert v[0]["verdict"] == "failed" and len(v[0]["why"]) == 2
    v = node_health.judge([_report("a", 1.0), _report("b", 1.0, shared_fs={"path": "/ws", "error": "EROFS"})])
    assert [x["verdict"] for x in v] == ["ok", "failed"]
    ring = {"ring": [{"src": "a", "dst": "b", "gb_s": 10.0}, {"src": "b", "dst": "c", "gb_s": 10.0},
                     {"src": "c", "dst": "a", "gb_s": 1.0}]}
    v = node_health.judge([_report(n, want, **gpu) for n in "abc"], ring)
    assert [x["verdict"] for x in v] == ["slow", "ok", "slow"] and "link c->a" in v[0]["why"][0]
    assert {x["verdict"] for x in node_health.judge([_report(n, 1.0) for n in "abc"], ring)} == {"ok"}  # CPU
    assert node_health.exit_code(node_health.judge([_report("a", 1.0)])) == 0


def test_counters_are_judged_per_node_by_the_tools_numbering():
    """A job that sees some GPUs only (Slurm's CUDA_VISIBLE_DEVICES) has torch's numbering, not nvidia-smi's: the
    report's `counters` hold every GPU of the node by the tool's index, and a bad GPU the job was not given still
    fails the node, named by that index."""
    gpu = {"device": "cuda", "gpu_name": "NVIDIA H200", "vendor_tool": "nvidia-smi"}
    want = node_health.expected_tflops(node_health.gpu_of("NVIDIA H200"))
    row = {"index": 0, "free_gib": 139.0, "total_gib": 140.0, "errors": None}
    bad = {"0": {"remapped_rows.failure": 0.0}, "3": {"remapped_rows.failure": 1.0}}
    (v,) = node_health.judge([_report("a", want, gpus=[row], counters=bad, **gpu)])
    assert v["verdict"] == "failed" and v["why"] == ["nvidia-smi GPU 3: remapped_rows.failure 1"], v
    (v,) = node_health.judge([_report("a", want, gpus=[row], counters={"0": {"remapped_rows.failure": 0.0}}, **gpu)])
    assert v["verdict"] == "ok", v


def test_gemm_margin_is_wider_where_the_rate_is_only_scaled():
    """0.8x the expected rate on the Hopper parts (measured: a healthy H200 766.6 against 696.9), 0.55x where the
    expectation is the H200's scaled by vendor peak (an MI300X: unmeasured)."""
    def verdict(name, rate):
        return node_health.judge([_report("a", rate, device="cuda", gpu_name=name)])[0]["verdict"]

    h200 = node_health.expected_tflops(node_health.gpu_of("NVIDIA H200"))
    mi300x = node_health.expected_tflops(node_health.gpu_of("AMD Instinct MI300X"))
    assert verdict("NVIDIA H200", 0.81 * h200) == "ok" and verdict("NVIDIA H200", 0.79 * h200) == "slow"
    assert verdict("AMD Instinct MI300X", 0.6 * mi300x) == "ok"
    assert verdict("AMD Instinct MI300X", 0.5 * mi300x) == "slow"


def test_vendor_counters_parse():  # (the real formats, and which tool is asked: tests/test_node_gpu_counters.py)
    found = gpu_counters.nvidia("0, 00000000:18:00.0, 0, [N/A]\n1, 00000000:2A:00.0, 3, Yes\n")
    assert found[0] == {"ecc.errors.uncorrected.volatile.total": 0.0}
    assert gpu_counters.bad(found) == "GPU 1: ecc.errors.uncorrected.volatile.total 3, retired_pages.pending 1"
    assert gpu_counters.bad(gpu_counters.nvidia("0, 00000000:18:00.0, 0, No\n")) is None


@pytest.mark.parametrize("args, needle", [
    (["exclude", "node 2", "--reason", "x"], "NODE must be one Slurm node name"),
    (["exclude", "node2"], "--reason"),
    (["exclude", "node2", "--reason", " "], "--reason is required"),
    (["exclude", "node2", "--reason", "a\nb"], "--reason must be one line"),
    (["clear", "node9"], "node node9 is not in the ledger"),
    (["clear", "no;de"], "NODE must be one Slurm node name"),
    (["check", "--nodes", "2", "--nodelist", "node1"], "--nodes and --nodelist"),
    (["check", "--nodes", "0"], "--nodes"),
    (["check", "--nodelist", "node1;rm -rf /"], "--nodelist must be a Slurm host list"),
    (["check", "--partition", "deb ug"], "--partition must be a partition name"),
    (["check", "--gpus-per-node", "-1"], "--gpus-per-node"),
    (["check", "--timeout", "5"], "--timeout"),
    (["check", "--python", "py thon"], "--python must be an interpreter path"),
    (["check", "--local", "--nodes", "2"], "--local checks this machine only; not with --nodes"),
    (["check", "--bogus"], "--bogus"),
    (["--bogus"], "--bogus"),
])
def test_bad_input_to_nodes_commands_is_one_line_and_exit_2(tmp_path, capsys, args, needle):
    ws = tmp_path / "ws"
    sub, rest = (args[0], args[1:]) if args[0] in ("exclude", "clear", "check") else (None, args)
    assert run(["nodes", *([sub] if sub else []), *rest, "--workspace", str(ws)]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], out.err
    assert "Traceback" not in out.err and out.out == ""
    assert not ws.exists()  # nothing written: no ledger, no check directory (so no job either)


def test_a_workspace_that_cannot_hold_the_ledger_is_one_line(tmp_path, capsys):
    afile = tmp_path / "ws"
    afile.write_text("not a directory")
    assert run(["nodes", "exclude", "node2", "--reason", "x", "--workspace", str(afile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write the node ledger") and "Not a directory" in err[0]
    assert afile.read_text() == "not a directory"


def test_nodes_lists_and_edits_the_ledger(tmp_path, capsys):
    ws = ["--workspace", str(tmp_path / "ws")]
    assert run(["nodes", *ws]) == 0 and "no nodes in the ledger" in capsys.readouterr().out
    assert run(["nodes", "exclude", "node7", "--reason", "fans failing", *ws]) == 0
    assert "node7 excluded" in capsys.readouterr().out
    assert run(["nodes", "--json", *ws]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(n["node"], n["state"], n["why"]) for n in shown["nodes"]] == [("node7", "excluded", "fans failing")]
    assert run(["nodes", *ws]) == 0 and "node7  excluded" in capsys.readouterr().out
    assert run(["nodes", "clear", "node7", *ws]) == 0 and "was excluded" in capsys.readouterr().out
    assert run(["nodes", "--json", *ws]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"][0]["state"] == "ok"


def test_local_check_judges_this_machine_without_slurm(tmp_path, capsys):
    assert run(["nodes", "check", "--local", "--json", "--workspace", str(tmp_path / "ws")]) == 0
    result = json.loads(capsys.readouterr().out)
    (node,) = result["nodes"]
    assert node["verdict"] == "ok" and node["report"]["device"] == "cpu" and node["report"]["gemm_tflops"] > 0
    assert node["report"]["shared_fs"]["write_ms"] > 0 and "error counters" in node["report"]["notes"][0]


def test_excluded_nodes_reach_every_script_of_submit_pipelines_and_sweeps(tmp_path, capsys):
    ws = tmp_path / "ws"
    assert run(["nodes", "exclude", "node2", "--reason", "bad GPU", "--workspace", str(ws)]) == 0
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({
        "extends": str(ROOT / "recipes" / "quickstart.yaml"), "experiment": {"name": "x", "workspace": str(ws)},
        "cluster": {"executor": "slurm", "nodes": 1, "exclusive": False, "extra_sbatch": ["--exclude=node3"]}}))
    capsys.readouterr()
    assert run(["submit", str(recipe), "--dry-run", "--then", "eval", "--then", "export"]) == 0
    text = capsys.readouterr().out
    assert text.count("#SBATCH --exclude=node2,node3\n") == 3 == text.count("#SBATCH --exclude")  # training, 2 steps
    assert run(["sweep", str(recipe), "--grid", "trainer.schedule.lr=1e-2,2e-2", "--dry-run"]) == 0
    assert "#SBATCH --exclude=node2,node3\n" in capsys.readouterr().out  # the array script


def test_a_cuda_error_names_the_node_and_a_timeout_is_recorded_as_waiting(tmp_path, monkeypatch):
    from trainer.observability.stragglers import record_error

    monkeypatch.setenv("SLURMD_NODENAME", "gpu7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    record_error(str(tmp_path), RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    record_error(str(tmp_path), RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))  # the recipe's
    record_error(str(tmp_path), RuntimeError("Timed out waiting 6000ms for recv operation to complete"))
    record_error(str(tmp_path), RuntimeError("Timed out waiting 6000ms"), stopping=True)  # woken to be killed
    record_error(str(tmp_path), RuntimeError("Timed out waiting 6000ms"), stopping=lambda: True)  # (asked inside)
    got = [(r["event"], r.get("kind"), r["node"], r["attempt"]) for r in node_faults.read(tmp_path)]
    # the out-of-memory is the rank's own failure (`error`: its peers that lose it do not blame its node)
    assert got == [("fault", "device", "gpu7", 2), ("error", None, "gpu7", 2), ("timeout", None, "gpu7", 2)]


def test_the_cluster_name_comes_from_slurm_conf_without_the_controller(tmp_path):
    """ClusterName is read from SLURM_CONF's file, lower-cased as Slurm keeps it: with the controller down,
    `scontrol show config` held every validate and dry run ~9 s (2026-12-05). (The job script takes Slurm's
    SLURM_CLUSTER_NAME, the same lower-case name.) Where no scontrol is installed, the ledger is the local one."""
    import shutil
    import subprocess
    import sys

    from primus_slurm.nodes import ledger

    for line, want in (("ClusterName=Elsewhere  # trailing comment", "elsewhere"),
                       ("SlurmctldHost=a ClusterName=beta", "beta"), ('ClusterName="gamma" SlurmctldHost=a', "gamma"),
                       ("#ClusterName=commented", None), ("MyClusterName=no", None)):
        assert ledger._cluster_name_in(f"# a comment\n{line}\n") == want, line
    assert ledger._cluster_name_in("AuthType                = auth/munge\nClusterName             = primus-local\n") == \
        "primus-local"  # scontrol show config's layout
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=nowhere\nClusterName=Elsewhere\n")
    ws = tmp_path / "ws"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    code = ("from primus_slurm.nodes import ledger; import sys; print(ledger.path_for(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(ws)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    name = "elsewhere" if shutil.which("scontrol") else ledger.LOCAL_CLUSTER  # not primus-local: the file was read
    assert out.stdout.strip() == f"{ws}/{node_ledger.DIR}/{name}.jsonl", out.stdout
