"""One verdict (issue 28 item 4): `validate` judges a recipe as `submit --dry-run` does, lists the checks it could
not make here, refuses paths that are neither a path nor an explicit Hub id and container paths under no mount,
and jobs run with the Hub offline unless the recipe names something on it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from primus_slurm.cli import run

QS = str(ROOT / "recipes" / "quickstart.yaml")
DATA = ROOT / "recipes" / "data" / "quickstart"
PODMAN = ["cluster.container.runtime=podman", "cluster.container.image=img:1"]


def _sets(items):
    return [a for item in items for a in ("--set", item)]


def _verdict(capsys, command: list[str]) -> tuple[int, str]:
    rc = run(command)
    err = capsys.readouterr().err.strip()
    return rc, err


CASES = {  # name: (--set items, what the one error line says; None: accepted)
    "missing-data": (["trainer.data.train.path=/nope.jsonl"], "`trainer.data.train.path` is '/nope.jsonl', which "
                                                              "does not exist"),
    "relative-tokenizer": (["trainer.tokenizer.path=my_tokenizer"],
                           "`trainer.tokenizer.path` is 'my_tokenizer': neither an existing path nor a Hub id"),
    "relative-data": (["trainer.data.train.path=data/train.jsonl"],
                      "a Hub dataset goes in trainer.data.*.hf_name"),
    "bad-hub-id": (["trainer.tokenizer.path=hf://a/b/c"], "expected hf://org/name"),
    "hub-pretrained": (["trainer.checkpoint.pretrained=hf://org/base"], "names a tokenizer on the Hub only"),
    "hub-tokenizer": (["trainer.tokenizer.path=hf://org/tok"], None),
    "container-no-mount": ([*PODMAN], f"`trainer.data.train.path` is '{DATA}/train.jsonl', under none of the "
                                      "container's mounts ("),
    "container-mounted": ([*PODMAN, f"cluster.container.mounts=['{DATA}:{DATA}:ro']"], None),
    "container-relative": ([*PODMAN, f"cluster.container.mounts=['{DATA}:{DATA}:ro']",
                            "trainer.tokenizer.path=tokenizer"], "a relative path is not taken inside a container"),
    "shipped": ([], None),
    "unknown-gpu-missing-data": (["cluster.env_profile=none", "cluster.gpus_per_node=8", "trainer.distributed.device="
                                  "cuda", "trainer.distributed.backend=nccl", "trainer.data.train.path=/nope.jsonl"],
                                 "`trainer.data.train.path` is '/nope.jsonl', which does not exist"),
    "wandb-online-no-key": (["trainer.logging.wandb.project=p"], "`trainer.logging.wandb.mode` is online but "
                            "WANDB_API_KEY is not in this environment (the job's environment comes from it)"),
    "wandb-offline": (["trainer.logging.wandb.project=p", "trainer.logging.wandb.mode=offline"], None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_validate_and_dry_run_give_one_verdict(name, capsys, tmp_path, monkeypatch):
    """validate used to load the recipe only: /nope.jsonl was 'ok' there and refused by `submit --dry-run`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PRIMUS_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    sets, expect = CASES[name]
    for executor in ("local", "slurm"):
        args = [*_sets(sets), "--set", f"cluster.executor={executor}"]
        v_rc, v_err = _verdict(capsys, ["validate", QS, *args])
        d_rc, d_err = _verdict(capsys, ["submit", QS, "--dry-run", *args])
        assert (v_rc, v_err.splitlines()[-1:] if v_rc else []) == (d_rc, d_err.splitlines()[-1:] if d_rc else [])
        if expect is None:
            assert v_rc == 0, v_err
        else:
            assert v_rc == 2 and v_err.count("\n") == 0 and v_err.startswith("error: ") and expect in v_err, v_err
            assert d_err == v_err  # (audit, 2026-12-07: the dry run printed the unknown-GPU note before its error)
    assert not (tmp_path / "ws").exists()  # neither wrote anything


def test_validate_gives_submits_memory_verdict(capsys, tmp_path, monkeypatch):
    """The memory refusal (issue 26) is part of the verdict: validate said ok to the 70B on one MI300X at TP=1,
    which submit --dry-run refuses; --skip-memory-check lifts it in both."""
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    recipe = str(ROOT / "recipes" / "llama2_70b_fp8.yaml")
    sets = _sets(["cluster.gpus_per_node=1", "cluster.nproc_per_node=1", "trainer.parallelism.tensor=1",
                  "trainer.parallelism.sequence_parallel=false"])
    v_rc, v_err = _verdict(capsys, ["validate", recipe, *sets])
    d_rc, d_err = _verdict(capsys, ["submit", recipe, "--dry-run", *sets])
    assert v_rc == d_rc == 2 and v_err == d_err and v_err.count("\n") == 0, (v_err, d_err)
    assert "more than the MI300X" in v_err and "largest term: base weights" in v_err, v_err
    assert run(["validate", recipe, *sets, "--skip-memory-check"]) == 0
    assert "does NOT fit" in capsys.readouterr().out


def test_validate_lists_what_only_the_nodes_see(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    sets = ["cluster.executor=slurm", "trainer.data.train.path=/primus-compute-only/train.jsonl"]
    assert run(["validate", QS, *_sets(sets)]) == 0
    out = capsys.readouterr().out
    assert ("not checked here (the job's nodes see it): `trainer.data.train.path` /primus-compute-only/train.jsonl: "
            "/primus-compute-only is not mounted on this machine") in out, out
    assert run(["validate", QS, *_sets(sets[1:]), "--set", "cluster.executor=local"]) == 2  # the job runs here


def test_validate_takes_the_executor_and_refuses_what_submit_refuses(capsys, tmp_path, monkeypatch):
    """`validate --executor` judges as `submit --executor` does; a local job's missing interpreter and an online
    W&B run without its key were 'ok' there and failed the job 7 s after the queue (issue 33 item 4)."""
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PRIMUS_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    nodes_only = ["--set", "trainer.data.train.path=/primus-compute-only/train.jsonl"]
    assert run(["validate", QS, "--executor", "slurm", *nodes_only]) == 0 and "not checked here" in \
        capsys.readouterr().out
    assert _verdict(capsys, ["validate", QS, "--executor", "local", *nodes_only])[0] == 2
    python = ["--set", f"cluster.python={tmp_path}/no-such/python"]
    line = (f"error: `cluster.python` is '{tmp_path}/no-such/python', which is not an executable on this machine (a "
            f"local job runs it here); name an interpreter with the trainer's stack, e.g. {sys.executable}")
    wandb = ["--set", "trainer.logging.wandb.project=p"]
    for sets, expect in ((python, line), (wandb, "error: `trainer.logging.wandb.mode` is online but WANDB_API_KEY")):
        verdicts = [_verdict(capsys, [cmd, QS, "--executor", "local", *sets]) for cmd in ("validate", "submit")]
        assert verdicts[0] == verdicts[1] and verdicts[0][0] == 2 and verdicts[0][1].startswith(expect), verdicts
    assert not (tmp_path / "ws").exists() and not (tmp_path / "state" / "runs.jsonl").exists()  # nothing started
    assert run(["validate", QS, "--executor", "slurm", *python]) == 0  # the nodes run it: listed, not refused
    assert f"not checked here (the job's nodes see it): `cluster.python` {tmp_path}/no-such/python: not found on " \
           "this machine" in capsys.readouterr().out


def test_validate_json_shows_the_interpreter_the_job_runs(capsys, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    assert run(["validate", QS, "--json"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["cluster"]["python"] == sys.executable  # (it said python3, the job ran .venv/bin/python)
    assert run(["submit", QS, "--dry-run"]) == 0
    assert f"\n  {sys.executable} -m trainer.runtime.preflight" in capsys.readouterr().out


def _script(capsys, *sets: str) -> str:
    assert run(["submit", QS, "--dry-run", *_sets(sets)]) == 0
    return capsys.readouterr().out.split("# ---- recipe.resolved.yaml")[0]


def test_jobs_run_offline_unless_the_recipe_names_the_hub(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    assert "export HF_HUB_OFFLINE=1\n" in _script(capsys)
    assert "HF_HUB_OFFLINE" not in _script(capsys, "trainer.tokenizer.path=hf://org/tok")
    hub_set = ("trainer.data.validation.path=null", "trainer.data.validation.hf_name=org/set")
    assert "HF_HUB_OFFLINE" not in _script(capsys, *hub_set)
    assert "export HF_HUB_OFFLINE=0\n" in _script(capsys, "cluster.env.HF_HUB_OFFLINE=0")  # the recipe's word
    inside = _script(capsys, *PODMAN, f"cluster.container.mounts=['{DATA}:{DATA}:ro']")
    assert "export HF_HUB_OFFLINE=1\n" in inside and "  -e HF_HUB_OFFLINE\n" in inside  # reaches the container


@pytest.mark.slow
def test_an_offline_job_fails_at_once_on_a_hub_tokenizer(tmp_path):
    """What the job's HF_HUB_OFFLINE=1 buys: an uncached Hub tokenizer is one error line at once, instead of
    ~50 s of retries (the real transformers loader, no network needed)."""
    code = ("from trainer.data.tokenize import load_tokenizer\n"
            "load_tokenizer('hf://primus-test-org/no-such-tokenizer')\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    assert out.returncode != 0 and "trainer.tokenizer.path: cannot load tokenizer 'hf://primus-test-org/" \
        "no-such-tokenizer'" in out.stderr, out.stderr[-2000:]
    assert took < 30, took


BROKEN = {  # a hand-edited or truncated checkpoint file: (file, its text or the config.json fields set, the error)
    "index-not-json": ("model.safetensors.index.json", "{not json", "cannot be read as JSON"),
    "index-a-list": ("model.safetensors.index.json", "[]", "has no `weight_map` object"),
    "config-a-list": ("config.json", "[1]", "holds list [1], not an object of fields"),
    "max-positions-text": ("config.json", {"max_position_embeddings": "abc"},
                           '`max_position_embeddings: "abc"` is not a number'),
    "rope-a-number": ("config.json", {"rope_parameters": 5}, "`rope_parameters: 5` is not an object of RoPE fields"),
    "rope-factor-text": ("config.json", {"rope_scaling": {"rope_type": "llama3", "factor": "8"}},
                         '`rope_scaling.factor: "8"` is not a number'),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_pretrained_checkpoint_is_one_verdict(name, capsys, tmp_path, monkeypatch):
    """audit, 2026-12-07: `validate` gave a JSONDecodeError (exit 1) where `submit --dry-run` passed, and config.json
    values of the wrong type a traceback from both."""
    import json
    import shutil

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PRIMUS_WORKSPACE", str(tmp_path / "ws"))
    base = tmp_path / "base"
    shutil.copytree(DATA / "base", base)
    file, text, expect = BROKEN[name]
    if isinstance(text, dict):
        text = json.dumps({**json.loads((base / file).read_text()), **text})
    (base / file).write_text(text)
    args = ["--set", f"trainer.checkpoint.pretrained={base}"]
    for command in (["validate", QS, *args], ["submit", QS, "--dry-run", *args]):
        rc, err = _verdict(capsys, command)
        assert rc == 2 and err.count("\n") == 0 and err.startswith("error: ") and expect in err, (command[0], err)
    assert not (tmp_path / "ws").exists()
