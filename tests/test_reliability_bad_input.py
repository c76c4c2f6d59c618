"""Bad input through `primus-slurm submit` with the Slurm executor of the real local cluster.

Every case: exit 2, exactly one `error:` line on stderr that names the field (or option, or file), nothing
on stdout, no traceback, nothing submitted (no registry entry; at the end Slurm knows no job started from
any case's directory) and nothing written: each case runs with its working directory, HOME and state dir
in a fresh temp dir that afterwards holds only the case's own input files.

Shell-injection strings go into every free-text field of the schema: each field either refuses them
(exit 2 naming it) or is one of INERT, which are proven inert by running the rendered script's set-up
(everything before the launch) with bash and checking that the text arrives literally and ran nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import CLI
from primus_slurm.config import schema
from primus_slurm.cli import run
from test_bad_recipes import BAD, QS

pytestmark = pytest.mark.slurm

# accepted injection text, and why it is harmless: the first group never reaches the job script (only the
# resolved YAML, which the trainer reads as data); the second is in the script, shell-quoted
# (trainer.model.rope_scaling is refused: the quickstart's checkpoint config.json has no such scaling)
# (the path fields below refuse the text as a path that does not exist; test_injection_in_existing_paths gives
# them an existing folder whose name carries it)
NOT_IN_SCRIPT = {"experiment.description", "trainer.data.train.hf_name", "trainer.data.validation.hf_name",
                 "trainer.data.cache_dir"}
PATH_FIELDS = {"trainer.tokenizer.path": "tokenizer", "trainer.data.train.path": "train.jsonl",
               "trainer.data.validation.path": "validation.jsonl", "trainer.checkpoint.pretrained": "base"}
QUOTED_IN_SCRIPT = {"cluster.env", "cluster.container.extra_args"}
INERT = NOT_IN_SCRIPT | QUOTED_IN_SCRIPT
QS_DATA = Path(QS).parent / "data" / "quickstart"
# a container recipe's host paths must lie under a mount: the quickstart's data folder is mounted where it lies
CONTAINER = ["--set", "cluster.container.runtime=docker", "--set", "cluster.container.image=img:1",
             "--set", f"cluster.container.mounts=['{QS_DATA}:{QS_DATA}:ro']"]


def text_fields(spec=schema.SCHEMA, prefix=""):
    for key, sub in spec.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(sub, dict):
            yield from text_fields(sub, path)
        elif sub.kind in ("str", "list", "dict"):
            yield path, sub.kind


FIELDS = dict(text_fields())


def _argv(field: str, text: str) -> list[str]:
    """submit arguments that put `text` into `field` (the string, the list's item, the mapping's value A)."""
    kind = FIELDS[field]
    value = json.dumps(text if kind == "str" else [text] if kind == "list" else {"A": text})
    executor = [] if field == "cluster.executor" else ["--executor", "slurm"]  # --executor would override it
    container = CONTAINER if field.startswith("cluster.container.") and field != "cluster.container.image" else []
    # a Hub dataset name replaces the source's path (both set are refused: the path would win)
    source = ["--set", field.replace(".hf_name", ".path=null")] if field.endswith(".hf_name") else []
    return [QS, *executor, *container, *source, "--set", f"{field}={value}"]


@pytest.fixture(scope="module")
def sandbox(local_slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-submit")
    yield root
    jobs = subprocess.run(["squeue", "--states=all", "-h", "-O", "JobID,WorkDir:600,STDOUT:600"],
                          capture_output=True, text=True)
    assert jobs.returncode == 0 and str(root) not in jobs.stdout, jobs.stdout


@pytest.fixture
def case(sandbox, monkeypatch):
    """A fresh directory that is the cwd, HOME and state dir of one case; PRIMUS_WORKSPACE unset so the
    quickstart's ./runs lands here too."""
    d = Path(tempfile.mkdtemp(dir=sandbox))
    monkeypatch.chdir(d)
    monkeypatch.setenv("HOME", str(d / "home"))
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(d / "state"))
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    for name in ("PRIMUS_WORKSPACE", "PRIMUS_UNSET_VAR_XYZ", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return d


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def submit_fails(d: Path, capsys, argv: list[str], expect: str) -> str:
    before = _listing(d)
    rc = run(["submit", *argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == "", (argv[:6], rc, out[-500:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-2000:]
    assert expect in lines[0], lines[0]
    assert _listing(d) == before  # nothing written: no run dir, no registry, no HOME files
    return lines[0]


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


def _recipe(d: Path, text, name: str = "r.yaml") -> str:
    path = d / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


# every third case of the validate corpus, submitted with --executor slurm (cases that are bad only for the local
# executor would be valid there)
SAMPLE = [c for c in BAD if "executor: local" not in c[0]][::3]


@pytest.mark.parametrize("body,expect", SAMPLE, ids=[f"bad{i}" for i in range(len(SAMPLE))])
def test_validate_corpus_sample_through_submit(body, expect, case, capsys):
    submit_fails(case, capsys, [_recipe(case, f"extends: {QS}\n{body}\n"), "--executor", "slurm"], expect)


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_newline_in_every_text_field(field, case, capsys):
    submit_fails(case, capsys, _argv(field, "ok\nevil"), f"`{field}")


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_shell_injection_in_every_text_field(field, case, capsys):
    marker = case / "PWNED"
    text = f"x$(touch {marker})`touch {marker}`;touch {marker}|&<>'\" {{a,b}} *"
    argv = _argv(field, text)
    if field not in INERT:
        submit_fails(case, capsys, argv, f"`{field}")
        return
    assert run(["submit", *argv, "--dry-run", "--json"]) == 0
    script = json.loads(capsys.readouterr().out)["script"]
    if field in NOT_IN_SCRIPT:
        assert f"touch {marker}" not in script
        return
    # run the script's set-up for real (everything before the launch), then print what it would launch
    setup = script.split("# Run in the background and wait")[0]
    probe = setup + "printf '%s\\0' \"${LAUNCH[@]}\"; printf 'A=%s\\0' \"${A:-}\"\n"
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1")
    proc = subprocess.run(["bash", "-c", probe], capture_output=True, env=env, cwd=case)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.decode().split("\0")
    assert (f"A={text}" if field == "cluster.env" else text) in words, words
    assert not marker.exists()


@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
def test_injection_in_existing_paths(field, case, capsys):
    """A path field naming an existing file or folder whose folder name carries the injection text is accepted
    and never reaches the job script (the resolved YAML carries it, as data); nothing runs."""
    marker = case / "PWNED"
    folder = case / f"x$(touch {marker})`touch {marker}`;touch {marker}|&<>'\" {{a,b}} *"
    folder.mkdir(parents=True)
    src = QS_DATA / PATH_FIELDS[field]
    target = folder / src.name
    target.symlink_to(src, target_is_directory=src.is_dir())
    assert run(["submit", *_argv(field, str(target)), "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert f"touch {marker}" not in out["script"] and not marker.exists()


def test_every_injection_outcome_is_known():
    """The sets above name real fields; a new free-text field must be classified when it is added."""
    assert INERT <= set(FIELDS) and set(PATH_FIELDS) <= set(FIELDS) and not INERT & set(PATH_FIELDS)


def _chain(d: Path, names: list[str]) -> str:
    """names[i] extends names[i+1] (the last extends nothing); returns the first."""
    for name, parent in zip(names, names[1:]):
        _recipe(d, f"extends: {parent}\n", name)
    return str(d / names[0])


SUBMIT_CASES = {
    "missing-train-path": lambda d: ([QS, "--set", f"trainer.data.train.path={d}/missing.jsonl"],
                                     "`trainer.data.train.path`"),
    "missing-validation-path": lambda d: ([QS, "--set", f"trainer.data.validation.path={d}/val.jsonl"],
                                          "`trainer.data.validation.path`"),
    "missing-tokenizer": lambda d: ([QS, "--set", f"trainer.tokenizer.path={d}/no-tokenizer"],
                                    "`trainer.tokenizer.path`"),
    "missing-pretrained": lambda d: ([QS, "--set", f"trainer.checkpoint.pretrained={d}/no-ckpt"],
                                     "`trainer.checkpoint.pretrained`"),
    "missing-path-in-container": lambda d: ([QS, *CONTAINER, "--set", f"cluster.container.mounts=['{d}:/mnt/d']",
                                             "--set", "trainer.data.train.path=/mnt/d/x.jsonl"],
                                            f"on this machine: {d}/x.jsonl"),
    "bad-run-id": lambda d: ([QS, "--run-id", "../../../tmp/x"], "--run-id"),
    "unknown-executor": lambda d: ([QS, "--executor", "pbs"], "pbs"),
    "set-without-value": lambda d: ([QS, "--set", "trainer.schedule.lr"], "expected key=value"),
    "set-unknown-key": lambda d: ([QS, "--set", "trainer.sched.lr=1"], "did you mean `schedule`"),
    "infinite-lr": lambda d: ([QS, "--set", "trainer.schedule.lr=1.0e999"], "`trainer.schedule.lr`"),
    "huge-int": lambda d: ([QS, "--set", "trainer.schedule.global_batch_size=" + "9" * 40],
                           "`trainer.schedule.global_batch_size`"),
    "huge-string": lambda d: ([QS, "--set", "experiment.description=" + "x" * 100_000], "`experiment.description`"),
    "non-utf8-set": lambda d: ([QS, "--set", "experiment.description=ok\udcff"], "not valid UTF-8"),
    "secret-in-env": lambda d: ([QS, "--set", "cluster.env.WANDB_API_KEY=abc"], "`cluster.env.WANDB_API_KEY`"),
    "local-multi-node": lambda d: ([QS, "--executor", "local", "--set", "cluster.nodes=2"], "`cluster.nodes`"),
    "no-recipe": lambda d: ([], "RECIPE"),
    "missing-recipe": lambda d: ([f"{d}/nope.yaml"], "does not exist"),
    "recipe-is-a-directory": lambda d: ([_recipe(d, b"", "dir.yaml/x")[:-2]], "is not a regular file"),
    "recipe-is-a-fifo": lambda d: ([_fifo(d / "pipe.yaml")], "is not a regular file"),  # (reading it would hang)
    "workspace-is-a-file": lambda d: ([QS, "--executor", "local", "--set",
                                       f"experiment.workspace={_recipe(d, 'x', 'afile')}"],
                                      "cannot create the run directory"),
    "empty-recipe": lambda d: ([_recipe(d, "")], "is empty; a recipe is a YAML mapping"),
    "dry-run-follow": lambda d: ([QS, "--dry-run", "--follow"], "--follow has nothing to follow with --dry-run"),
    "tokenizer-dir-without-tokenizer": lambda d: ([QS, "--set", f"trainer.tokenizer.path={d}"],
                                                  "a directory without a tokenizer (no tokenizer.json"),
    "comment-only-recipe": lambda d: ([_recipe(d, "# nothing yet\n", "comments.yaml")], "is empty"),
    "recipes-folder-as-recipe": lambda d: ([str(d)], "is a directory; give a recipe .yaml file"),
    "device-file-as-recipe": lambda d: (["/dev/zero"], "is not a regular file; give a recipe .yaml file"),
    "top-level-list": lambda d: ([_recipe(d, "- a\n- b\n")], "must be a mapping"),
    "non-utf8-file": lambda d: ([_recipe(d, f"extends: {QS}\nexperiment:\n  name: ".encode() + b"\xff\xfe\n")],
                                "not valid UTF-8"),
    "alias-bomb": lambda d: ([_recipe(d, "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, n in zip("abcdefgh", "bcdefghi")))],
        "alias"),
    "recursive-extends": lambda d: ([_chain(d, ["a.yaml", "b.yaml", "a.yaml"])], "recursive"),
    "self-extends": lambda d: ([_recipe(d, "extends: self.yaml\n", "self.yaml")], "recursive"),
    "deep-extends": lambda d: ([_chain(d, [f"e{i}.yaml" for i in range(20)])], "nested deeper"),
    "missing-extends": lambda d: ([_recipe(d, "extends: no_such_preset\n")], "not found"),
    "huge-file": lambda d: ([_recipe(d, f"extends: {QS}\n" + "#" * (2 << 20) + "\n")], "bytes"),
}


@pytest.mark.parametrize("name", sorted(SUBMIT_CASES))
def test_submit_level_case(name, case, capsys):
    argv, expect = SUBMIT_CASES[name](case)
    if argv and "--executor" not in argv:
        argv = [*argv, "--executor", "slurm"]
    submit_fails(case, capsys, argv, expect)


def test_existing_run_directory_is_never_reused(case, capsys):
    run_id = "20260101-000000-abcdef"
    taken = case / "runs" / "quickstart" / run_id
    taken.mkdir(parents=True)
    (taken / "run.json").write_text("{}")
    submit_fails(case, capsys, [QS, "--executor", "slurm", "--run-id", run_id], "already exists")
    # a dry run refuses the same: it prints only a script that a submit with that id would run
    submit_fails(case, capsys, [QS, "--executor", "slurm", "--run-id", run_id, "--dry-run"], "already exists")
    assert (taken / "run.json").read_text() == "{}"


@pytest.mark.parametrize("argv,expect", [
    ([b"--set", b"experiment.description=\xff\xfe"], "not valid UTF-8"),
    ([b"--set", b"experiment.name=x;touch PWNED"], "`experiment.name`"),
    ([b"--set", b"trainer.data.train.path=/tmp/primus-no-such-dir/x.jsonl"], "`trainer.data.train.path`"),
])
def test_submit_process_exit_code_and_one_line(argv, expect, sandbox, tmp_path):
    """The installed `primus-slurm` process: exit 2, stdout empty, one stderr line, no traceback, no files."""
    d = Path(tempfile.mkdtemp(dir=sandbox))
    env = dict(os.environ, HOME=str(d / "home"), PRIMUS_SLURM_STATE_DIR=str(d / "state"))
    env.pop("PRIMUS_WORKSPACE", None)
    proc = subprocess.run([os.fsencode(CLI), b"submit", os.fsencode(QS), b"--executor", b"slurm", *argv],
                          capture_output=True, env=env, cwd=d)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2 and proc.stdout == b"", err
    assert err.startswith("error: ") and err.count("\n") == 1 and expect in err, err
    assert list(d.iterdir()) == []


def test_paths_the_launcher_cannot_see_are_left_to_the_job(tmp_path):
    """On Slurm a path under a top-level directory this machine lacks (compute-node-only storage) is not judged
    here but listed as not checked; the same path with the local executor is an error. A docker/podman path under
    none of the container's mounts is refused either way (tests/test_one_verdict.py)."""
    from primus_slurm.errors import UserError
    from primus_slurm.paths import check_paths
    from primus_slurm.config.recipe import load_recipe

    remote = load_recipe(QS, ["trainer.data.train.path=/primus-compute-only/train.jsonl"], env={}).resolved
    assert check_paths(remote, "slurm") == ["`trainer.data.train.path` /primus-compute-only/train.jsonl: "
                                            "/primus-compute-only is not mounted on this machine"]
    with pytest.raises(UserError, match="`trainer.data.train.path` is '/primus-compute-only/train.jsonl', which"):
        check_paths(remote, "local")


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory) -> dict:
    """The three trainer runs below, started at once when the first of their tests comes (one trainer thread each:
    test_train_support.beside): {case: (run dir, future of run_trainer's result)}."""
    from test_train_support import beside, run_trainer, write_recipe

    tmp = {case: tmp_path_factory.mktemp(case) for case in ("refusal", "pretrained", "note")}
    afile = tmp["pretrained"] / "afile"
    afile.write_text("not a checkpoint\n")
    recipes = {"refusal": write_recipe(tmp["refusal"], raw={"trainer.precision.fp8": "hybrid"}),  # refused on CPU
               "pretrained": write_recipe(tmp["pretrained"], raw={"trainer.checkpoint.pretrained": str(afile)}),
               "note": write_recipe(tmp["note"], "trainer.schedule.train_iters=2",
                                    "trainer.precision.fp8_recipe=tensorwise")}
    return {case: (tmp[case] / "run", beside(run_trainer, recipe, tmp[case] / "run"))
            for case, recipe in recipes.items()}


def test_a_refusal_before_distributed_init_reaches_the_rank0_log(trainer_runs):
    """The trainer's precision check runs before distributed init; its one line used to go only to stderr (inside
    torchrun's traceback), so `status` showed FAILED with no reason and `logs` found no trainer log."""
    from primus_slurm.jobs.progress import read_progress

    run_dir, started = trainer_runs["refusal"]  # fp8 hybrid: validation would refuse it on CPU
    res = started.result()
    assert res.returncode == 2, res.stderr[-2000:]
    log = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    assert "] config error | `trainer.precision.fp8`" in log, log
    progress = read_progress(run_dir)
    assert progress.error.startswith("config error | `trainer.precision.fp8`") and progress.final_state == "FAILED"


def test_a_pretrained_path_that_is_a_file_is_one_config_error_line(trainer_runs):
    """validate refuses it (tests/test_bad_recipes.py); a resolved recipe that names one anyway (edited, or the file
    appeared later) ends the trainer with one `config error` line and exit 2, not a traceback (was exit 1, with
    HFConfigError's traceback: `.../config.json cannot be read as JSON: [Errno 20] Not a directory`)."""
    run_dir, started = trainer_runs["pretrained"]  # trainer.checkpoint.pretrained: a file, `afile`
    res = started.result()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    log = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    assert "] config error | " in log and "afile" in log, log


def test_the_trainer_logs_a_key_that_does_nothing(trainer_runs):
    """The notes validate and submit print (primus_contract.rules_dependent) are in the run's log too."""
    run_dir, started = trainer_runs["note"]  # trainer.precision.fp8_recipe=tensorwise without FP8
    res = started.result()
    assert res.returncode == 0, res.stderr[-2000:]
    log = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    assert '] note | `trainer.precision.fp8_recipe` is "tensorwise" but does nothing without' in log, log[-3000:]
