"""`primus-slurm export|generate|eval` on a real quickstart run (trained once per session by conftest.quickstart_run:
the shipped recipe as `make quickstart` runs it, 500 iterations, checkpoints at 250 and 500), locally and as jobs on
the local Slurm cluster; the README's quickstart numbers are this run's (scripts/readme_numbers.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, cli

sys.path.insert(0, str(ROOT / "scripts"))
import readme_numbers  # noqa: E402  (scripts/ is no package)

pytestmark = pytest.mark.slow
QS = ROOT / "recipes" / "data" / "quickstart"
ITERS, EVERY = 500, 250  # the shipped recipe's train_iters and save_interval


@pytest.fixture(scope="module")
def run(quickstart_run):
    """(env, run id, run dir, {iteration: logged eval loss}) of a finished quickstart run (conftest's session run,
    which test_quickstart_learns reads too)."""
    env, entry, run_dir = quickstart_run  # (what scripts/readme_numbers.py runs)
    evals = readme_numbers.logged_evals(run_dir)
    assert {EVERY, ITERS} <= set(evals), sorted(evals)
    return env, entry["run_id"], run_dir, evals


@pytest.fixture(scope="module")
def quickstart_post(run, tmp_path_factory):
    """What the README shows of the run: eval at 250 and 500, generate on the held-out prompts from the base and
    from the fine-tuned model, each as (result.json, the command's stdout); and eval of the validation records
    copied elsewhere (--data). All at once (posts)."""
    env, run_id, _, _ = run
    prompts = str(QS / "prompts.jsonl")
    other = tmp_path_factory.mktemp("data") / "other.jsonl"  # --data: the same records from elsewhere
    shutil.copyfile(QS / "validation.jsonl", other)
    # (the last eval without --checkpoint: `latest`, which is the last iteration's)
    ev250, ev500, trained, base, elsewhere = posts(
        env, ("eval", run_id, "--checkpoint", str(EVERY), "--executor", "local"),
        ("eval", run_id, "--executor", "local"),
        ("generate", run_id, "--prompts", prompts, "--executor", "local"),
        ("generate", run_id, "--prompts", prompts, "--base-only", "--executor", "local"),
        ("eval", run_id, "--data", str(other), "--executor", "local"))
    return {"eval": {EVERY: ev250, ITERS: ev500}, "trained": trained, "base": base, "data": (other, elsewhere)}


def post(env, *args, timeout=600):
    out = cli(env, *args, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    path = Path(out.stdout.strip().splitlines()[-1].split("result: ", 1)[1])
    return json.loads(path.read_text()), out.stdout


def posts(env, *commands, timeout=600) -> list:
    """post(env, *command) of each command, all at once (each a job of its own, in a directory of its own; one
    after another they took ~8 s each, mostly the start of a process that imports torch and megatron): their
    results in order."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda command: post(env, *command, timeout=timeout), commands))


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eval_reproduces_the_logged_eval_loss(run, quickstart_post):
    env, run_id, _, evals = run
    for it in (EVERY, ITERS):
        result, text = quickstart_post["eval"][it]
        assert result["iteration"] == it
        assert abs(result["eval_loss"] - evals[it]) <= 2e-6 * evals[it], (result, evals)  # logged with 7 digits
        assert 0.3 < result["token_accuracy"] < 1.0 and result["loss_tokens"] > 500, result
        assert "eval | micro-batch 1 |" in text and result["summary"] in text  # progress, then one summary line
    assert evals[ITERS] < evals[EVERY]
    other, (result, _) = quickstart_post["data"]  # --data: the same records from elsewhere, the same pipeline
    assert result["data"] == str(other) and abs(result["eval_loss"] - evals[ITERS]) <= 2e-6 * evals[ITERS]


def test_merged_export_loads_and_matches_base_plus_peft(run, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    env, run_id, run_dir, _ = run
    merged = tmp_path / "merged"
    result, _ = post(env, "export", run_id, "--merged", str(merged), "--adapter", "--executor", "local")
    assert result["iteration"] == ITERS and result["merged"] == str(merged)
    files = {p.name for p in merged.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "README.md"} <= files and any(f.endswith(".safetensors") and f.startswith("model-") for f in files)
    assert "trained in FP32" in (merged / "README.md").read_text()
    # the adapter of the last checkpoint is the one the trainer exported when it finished
    from safetensors.torch import load_file

    ours, trainers = load_file(Path(result["adapter"]) / "adapter_model.safetensors"), \
        load_file(run_dir / "adapter" / "adapter_model.safetensors")
    assert ours.keys() == trainers.keys() and all(torch.equal(ours[k], trainers[k]) for k in ours)

    tok = AutoTokenizer.from_pretrained(merged)
    ids = tok(["### Instruction:\nReverse the letters.\n\n### Input:\na b c d\n\n### Response:\nd c b a"],
              return_tensors="pt")["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(QS / "base", dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, result["adapter"]).eval()(ids).logits
        model = AutoModelForCausalLM.from_pretrained(merged).eval()
        assert next(model.parameters()).dtype == torch.float32  # the base's dtype
        merged_logits = model(ids).logits
    assert (peft_logits - plain).abs().max() > 1e-2  # the adapter matters, so equality below means something
    assert (merged_logits - peft_logits).abs().max() < 1e-4


def test_generate_answers_heldout_prompts_better_than_the_base(run, quickstart_post):
    env, run_id, run_dir, _ = run
    prompts = QS / "prompts.jsonl"
    held = records(prompts)
    seen = {(r["instruction"], r["input"]) for r in records(QS / "train.jsonl")}
    assert len(held) == 16 and not seen & {(r["instruction"], r["input"]) for r in held}
    (trained, text), (base, _) = quickstart_post["trained"], quickstart_post["base"]
    t, b = trained["scores"], base["scores"]
    assert t["scored"] == b["scored"] == 16
    assert t["char_accuracy"] >= b["char_accuracy"] + 0.25, (t, b)  # measured: 0.987 vs 0.334
    assert t["exact_match"] > b["exact_match"], (t, b)
    rows = records(Path(trained["generations"]))
    assert rows[0]["prompt_text"].endswith("### Response:\n")  # the Alpaca layout the run trained on
    job_out = (Path(trained["generations"]).parent / "job.out").read_text()  # the job's own stdout + stderr
    assert "Loading weights" not in job_out and not re.search(r"\d+%\|", job_out), job_out[-2000:]  # no bars
    # sampling: the same seed gives the same answers, and runs through the same path
    one = ["generate", run_id, "--prompt", "Reverse the letters.", "--input", "a b c", "--temperature", "0.8",
           "--top-p", "0.9", "--seed", "3", "--max-new-tokens", "8", "--executor", "local"]  # the README's example
    # greedy --prompt/--input lays the prompt out as the same record from --prompts does (below); all three at once
    greedy = ["generate", run_id, "--prompt", held[0]["instruction"], "--input", held[0]["input"],
              "--executor", "local"]
    (s1, _), (s2, _), (greedy, _) = posts(env, one, one, greedy)
    row = records(Path(s1["generations"]))[0]
    assert row["answer"] == records(Path(s2["generations"]))[0]["answer"]
    assert row["prompt"] == {"instruction": "Reverse the letters.", "input": "a b c"}
    assert "### Input:\na b c\n\n### Response:\n" in row["prompt_text"] and row["answer"], row  # it answered ''
    assert records(Path(greedy["generations"]))[0]["answer"] == records(Path(trained["generations"]))[0]["answer"]
    kinds = [r["kind"] for r in json.loads(cli(env, "status", run_id, "--json").stdout)["post"]]
    assert kinds.count("generate") >= 5


def test_the_readme_shows_this_codes_quickstart_numbers(run, quickstart_post):
    """README.md's eval losses and generate scores are this run's: a change that moves them fails here until
    scripts/readme_numbers.py rewrites the block (they drifted: 6.828237E-01 in the README, 6.706821E-01 run).
    The digits are those of one CPU model (the block names it): on another, the pinned kernels still differ."""
    _, _, run_dir, evals = run
    shown = readme_numbers.readme_block(readme_numbers.README.read_text())
    if f"whose CPU is `{readme_numbers.host_cpu()}`" not in shown:
        pytest.skip(f"the README's digits are another CPU model's, not this host's {readme_numbers.host_cpu()}")
    got = readme_numbers.block(evals, {it: r for it, (r, _) in quickstart_post["eval"].items()},
                               tuple(reversed(quickstart_post["base"])), tuple(reversed(quickstart_post["trained"])))
    assert shown == got, got


def _one_error(out) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_bad_input_is_one_error_line(run, tmp_path):
    env, run_id, run_dir, _ = run
    assert "not a known run" in _one_error(cli(env, "eval", "no-such-run"))
    assert "iter_0000007" in _one_error(cli(env, "export", run_id, "--adapter", "--checkpoint", "7"))
    # (the launcher's own check; the trainer's order, checkpoint before data: tests/test_post_eval_order.py)
    assert "iter_0000007" in _one_error(cli(env, "eval", run_id, "--checkpoint", "7"))
    assert "--prompt" in _one_error(cli(env, "generate", run_id))
    held_out = str(QS / "prompts.jsonl")
    with_input = cli(env, "generate", run_id, "--prompts", held_out, "--input", "x")
    assert "--input: goes with --prompt" in _one_error(with_input)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "x"}\n[1, 2]\n')
    assert "bad.jsonl:2" in _one_error(cli(env, "generate", run_id, "--prompts", str(bad)))
    # a run without a pretrained base: --merged is refused before anything runs
    copy = tmp_path / "ws" / "copy" / "20260101-000000-abcdef"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("exports", "generations", "evals", "code"))
    resolved = yaml.safe_load((copy / "recipe.resolved.yaml").read_text())
    resolved["trainer"]["checkpoint"]["pretrained"] = None
    (copy / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    assert "pretrained" in _one_error(cli(env, "export", str(copy), "--merged"))
    assert "pretrained" in _one_error(cli(env, "generate", str(copy), "--prompt", "hi"))
    # an adapter rank vLLM cannot serve: refused here for --engine vllm (auto takes transformers in the job)
    resolved["trainer"]["checkpoint"]["pretrained"], resolved["trainer"]["lora"]["dim"] = str(QS / "base"), 1024
    (copy / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    assert "vLLM serves LoRA ranks up to 512, and the run's trainer.lora.dim is 1024" in _one_error(
        cli(env, "generate", str(copy), "--prompt", "hi", "--engine", "vllm"))
    assert not (copy / "exports").exists() and not (copy / "generations").exists()
    # refused here, not in the job after it started (the merge refused one directory for both; eval read the file)
    before = sorted(run_dir.rglob("*"))
    same = str(tmp_path / "both")
    assert "the same directory as --adapter" in _one_error(cli(env, "export", run_id, "--adapter", same, "--merged",
                                                               same + "/"))
    bad_eval = tmp_path / "bad_eval.jsonl"  # a whole record (eval's formatter needs the output), then no object
    bad_eval.write_text('{"instruction": "x", "input": "", "output": "y"}\n[1, 2]\n')
    assert "bad_eval.jsonl:2: each line must be a JSON object" in _one_error(cli(env, "eval", run_id, "--data",
                                                                                 str(bad_eval)))
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "empty.jsonl: no records" in _one_error(cli(env, "eval", run_id, "--data", str(tmp_path / "empty.jsonl")))
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert f"its parent directory {afile} is a file" in _one_error(cli(env, "export", run_id, "--adapter",
                                                                       str(afile / "sub")))
    assert sorted(run_dir.rglob("*")) == before and not (tmp_path / "both").exists()


def _unstarted_run(tmp_path: Path) -> tuple[dict, Path]:
    """(env, run directory) of a run that never trained: the quickstart's resolved recipe, its run.json and an empty
    checkpoint, which is what the launcher's checks read (for refusals that come before any job)."""
    from primus_slurm.config.recipe import load_recipe

    run_dir = tmp_path / "ws" / "quickstart" / "20260101-000000-abc123"
    (run_dir / "checkpoints" / "iter_0000010").mkdir(parents=True)
    (run_dir / "checkpoints" / "iter_0000010" / "metadata.json").write_text("{}")
    (run_dir / "checkpoints" / "latest").write_text("iter_0000010")
    resolved = load_recipe(ROOT / "recipes" / "quickstart.yaml").resolved
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_dir.name, "job_id": "local-1", "executor": "local"}))
    return dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state")), run_dir


def test_generate_refuses_at_submit_what_the_job_would_refuse_or_ignore(tmp_path):
    """A prompt record the job's formatter refuses was found only in the queue; --top-p and --seed of a greedy
    generate were accepted and did nothing (audit, 2026-12-07). Each is one error line now, and no job starts."""
    env, run_dir = _unstarted_run(tmp_path)
    gen = lambda *args: cli(env, "generate", str(run_dir), *args)  # noqa: E731
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "Sort the digits.", "input": "3 1"}\n{"input": "x"}\n')
    assert _one_error(gen("--prompts", str(bad))) == f"error: --prompts {bad}:2: missing field 'instruction'"
    assert _one_error(gen("--prompt", " ")) == "error: --prompt: field 'instruction' is empty"
    for given, named in ((["--top-p", "0.9"], "--top-p: only sampling uses it"), (["--seed", "3"], "--seed: only"),
                         (["--temperature", "0", "--top-p", "0.9", "--seed", "3"], "--top-p and --seed: only")):
        assert _one_error(gen("--prompt", "hi", *given)).startswith(f"error: {named}")
    for sampled in ([], ["--temperature", "0.8", "--top-p", "0.9", "--seed", "3"]):  # past that check: the next one
        assert "--merged and --base-only exclude" in _one_error(gen("--prompt", "hi", "--merged", "x", "--base-only",
                                                                    *sampled))
    assert not (run_dir / "generations").exists()


def test_eval_data_records_are_checked_at_submit_as_the_job_reads_them(tmp_path):
    """`eval --data FILE.jsonl` under the run's `bad_records: error`: a record the job's formatter refuses stopped the
    job at data load, in the queue; it is one error line at submit now. Under `skip` the job skips it, so it passes."""
    env, run_dir = _unstarted_run(tmp_path)
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"instruction": "Sort the digits.", "input": "3 1", "output": "1 3"}\n{"instruction": "x"}\n')
    assert _one_error(cli(env, "eval", str(run_dir), "--data", str(bad))) == \
        f"error: --data {bad}:2: missing field 'output'"
    assert not (run_dir / "evals").exists()
    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    resolved["trainer"]["data"]["bad_records"] = "skip"
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    (run_dir / "evals").write_text("")  # past the data check, the job directory cannot be made: nothing starts
    assert _one_error(cli(env, "eval", str(run_dir), "--data", str(bad))).startswith("error: cannot create")


def test_a_post_job_imports_the_contract_of_its_own_code(tmp_path):
    """The job directory holds the trainer and the contract it imports: the run's code/ (after it on PYTHONPATH:
    templates/post.sh.j2) is as old as the run, and a contract module newer than the run (primus_contract/records.py
    here) was missing there."""
    import subprocess

    from primus_slurm.post_training import post

    env, run_dir = _unstarted_run(tmp_path)
    (run_dir / "code" / "primus_contract").mkdir(parents=True)
    (run_dir / "code" / "primus_contract" / "__init__.py").write_text("")  # an older contract, without records.py
    job = post.PostJob("generate", {"run_id": run_dir.name}, run_dir, {}, "local", "ID")
    post.create(job, "")
    path = f"{job.post_dir}/code:{run_dir}/code"
    out = subprocess.run([sys.executable, "-c", "import primus_contract.records as r, trainer; print(r.__file__, "
                          "trainer.__file__)"], env=dict(env, PYTHONPATH=path), capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"{job.post_dir}/code/primus_contract/records.py",
                                  f"{job.post_dir}/code/trainer/__init__.py"]


@pytest.mark.slurm
def test_the_three_commands_as_slurm_jobs(run, local_slurm):
    env, run_id, run_dir, evals = run
    (ev, text), (gen, _), (ex, _) = posts(  # three jobs at once
        env, ("eval", run_id, "--checkpoint", str(EVERY), "--executor", "slurm"),
        ("generate", run_id, "--prompt", "Sort the digits.", "--max-new-tokens", "8", "--executor", "slurm"),
        ("export", run_id, "--adapter", "--executor", "slurm"))
    assert text.startswith("submitted eval job ") and "eval | micro-batch 1 |" in text  # followed while it ran
    assert abs(ev["eval_loss"] - evals[EVERY]) <= 2e-6 * evals[EVERY]
    assert (Path(ex["adapter"]) / "adapter_config.json").is_file() and gen["scores"] == {}
    rows = json.loads(cli(env, "status", run_id, "--json").stdout)["post"]
    slurm = [r for r in rows if r["executor"] == "slurm"]
    assert sorted(r["kind"] for r in slurm) == ["eval", "export", "generate"], rows
    assert all(r["state"] == "COMPLETED" and r["job_id"].isdigit() and r["summary"] for r in slurm), slurm
    for r in slurm:
        assert (Path(r["path"]) / f"slurm-{r['job_id']}.out").is_file()
        assert "#SBATCH --no-requeue" in (Path(r["path"]) / "job.sh").read_text()
    table = cli(env, "status", run_id).stdout
    assert all(r["id"] in table for r in rows)


def _outside_command(text: str) -> str:
    """The script without its #SBATCH lines, the post job's PYTHONPATH lines, the command of TRAIN=(...) and the
    training job's node-ledger block (a post job trains nothing and names no node: post.sh.j2 leaves it out)."""
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#SBATCH"))
    text = re.sub(r"# The node ledger \(.*?\nexclude_and_requeue\(\) \{\n.*?\n\}\n", "", text, flags=re.S)
    text = re.sub(r"# This job's code:.*?\nexport PYTHONPATH=\"\$POST_DIR[^\n]*\n", "", text, flags=re.S)
    start = text.index(" --\n", text.index("TRAIN=(")) + 4
    return text[:start] + text[text.index("\n)\n", start):].replace("eval exited", "training exited")


@pytest.mark.parametrize("runtime", ["none", "docker", "apptainer", "pyxis"])
def test_post_job_script_is_the_training_template(runtime, tmp_path):
    """Environment, preflight, container and launch lines are the training script's; only the command differs."""
    import copy

    from primus_slurm.post_training import post
    from primus_slurm.config.recipe import load_recipe
    from primus_slurm.config.render import render_script

    sets = [] if runtime == "none" else [f"cluster.container.runtime={runtime}",
                                         "cluster.container.image=docker://registry.example/img:1"
                                         if runtime == "apptainer" else "cluster.container.image=img:1"]
    resolved = load_recipe(ROOT / "recipes" / "quickstart.yaml", overrides=sets).resolved
    run_dir = tmp_path / "run"
    job = post.PostJob("eval", {"run_id": "RUN"}, run_dir, resolved, "slurm", "ID", ["--data", "a b'c"])
    script = post.script(job)
    one_node = copy.deepcopy(resolved)
    one_node["cluster"].update(nodes=1, requeue=False)
    assert _outside_command(script) == _outside_command(render_script(one_node, str(run_dir), "RUN", "slurm"))
    assert f"--output={run_dir}/evals/ID/slurm-%j.out" in script and "#SBATCH --no-requeue" in script
    assert "-m trainer.post eval --run \"$RUN_DIR\" --out \"$POST_DIR\"" in script and "'a b'\"'\"'c'" in script
    assert "torch.distributed.run" not in script and "--job-name=quickstart-eval" in script
