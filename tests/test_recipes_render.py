"""Every shipped recipe validates and renders, for every container runtime and both executors; the
rendered scripts pass `bash -n` and carry the lines the launch depends on."""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from primus_slurm.config.recipe import load_recipe
from primus_slurm.config.render import render_script
from primus_slurm.resources import recipes_dir

RECIPES = sorted(p.name for p in recipes_dir().glob("*.yaml"))
RUNTIMES = ["none", "docker", "podman", "pyxis", "apptainer"]
IMAGE = "registry.example.com/team/img:1.0"


def test_seed_recipes_exist():
    expected = {
        "llama2_70b_bf16_mlperf.yaml", "llama2_70b_bf16_squad.yaml", "llama2_70b_fp8.yaml", "llama2_70b_fp4.yaml",
        "llama3_70b_bf16.yaml", "llama3_8b_bf16_alpaca_packed.yaml", "llama3_8b_bf16_squad_packed.yaml",
        "llama3_8b_bf16_alpaca_lora.yaml", "llama3_8b_bf16_openai_multiturn.yaml", "deepseek_v2_lite_bf16.yaml",
        "qwen3_30b_a3b_bf16.yaml", "qwen3_235b_a22b_bf16.yaml", "quickstart.yaml",
    }
    assert expected <= set(RECIPES)


def bash_syntax_ok(script: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_render_every_recipe_every_runtime(recipe, runtime, tmp_path):
    overrides = [f"cluster.container.runtime={runtime}", "cluster.executor=slurm", "cluster.nodes=2"]
    if runtime != "none":  # apptainer takes a .sif path or a docker:// reference
        overrides.append(f"cluster.container.image={'docker://' if runtime == 'apptainer' else ''}{IMAGE}")
    r = load_recipe(recipes_dir() / recipe, overrides, env={})
    run_dir = f"{r.resolved['experiment']['workspace']}/{r.resolved['experiment']['name']}/20261130-000000-abcdef"
    script = render_script(r.resolved, run_dir, "20261130-000000-abcdef", "slurm")
    bash_syntax_ok(script, tmp_path)
    c = r.resolved["cluster"]
    assert script.startswith("#!/bin/bash\n")
    headers = re.findall(r"^#SBATCH (.*)$", script, flags=re.M)
    assert f"--job-name={r.resolved['experiment']['name']}" in headers
    assert "--nodes=2" in headers and "--ntasks-per-node=1" in headers
    assert f"--signal=B:{c['signal']}@{c['signal_grace_s']}" in headers
    assert f"--output={run_dir}/logs/slurm-%j.out" in headers
    assert ("--requeue" if c["requeue"] else "--no-requeue") in headers
    if c["gpus_per_node"]:
        assert f"--gpus-per-node={c['gpus_per_node']}" in headers
    assert "USR1" not in script  # NCCL owns SIGUSR1
    nproc = c["nproc_per_node"] or c["gpus_per_node"] or 1
    assert f"--nnodes \"$NNODES\" --nproc-per-node {nproc}" in script
    assert '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in script
    assert "MASTER_PORT=$(( 12000 + ${JOB_ID//[!0-9]/} % 20000 ))" in script
    assert re.search(r"^\s*srun --nodes=\"\$NNODES\" --ntasks-per-node=1 ", script, flags=re.M)
    assert '"${LAUNCH[@]}" &' in script and 'wait "$CHILD"' in script
    for name, value in {**c["env"]}.items():
        assert f"export {name}={shlex.quote(value)}" in script
    if runtime in ("docker", "podman"):
        assert f'primus-node {runtime} "$JOB_ID"' in script and '"$rt" create -i --name "$name"' in script
        assert '"$rt" start -ai' in script and '"$rt" kill --signal TERM "$name"' in script  # no docker run/wait
        assert f"--shm-size {shlex.quote(c['container']['shm_size'])}" in script and "--ipc host" not in script
        assert shlex.quote(IMAGE) in script
    if runtime == "pyxis":
        assert f"--container-image={shlex.quote(IMAGE)}" in script and "--container-mounts=" in script
        assert "--container-env=" in script
    if runtime == "apptainer":
        assert "apptainer exec" in script and "--bind" in script
    for secret in c["secrets"]:
        assert not re.search(rf"{secret}=\S", script)  # only ever passed by name


@pytest.mark.parametrize("recipe", RECIPES)
def test_render_local_executor(recipe, tmp_path):
    if load_recipe(recipes_dir() / recipe, env={}).resolved["cluster"]["nodes"] > 1:
        pytest.skip("multi-node recipe: the local executor runs one node")
    r = load_recipe(recipes_dir() / recipe, ["cluster.executor=local"], env={})
    script = render_script(r.resolved, "/tmp/run", "rid", "local")
    bash_syntax_ok(script, tmp_path)
    assert "#SBATCH" not in script and "srun" not in script
    assert "-m trainer --config \"$RUN_DIR/recipe.resolved.yaml\"" in script


def test_env_interpolation_and_types(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "extends: quickstart\n"
        "trainer:\n  parallelism: {tensor: '${PRIMUS_TP:1}'}\n"
        "  schedule: {lr: '${LR:0.01}', train_iters: '${ITERS}'}\n"
        "experiment: {name: 'exp-${SUFFIX:a}'}\n"
    )
    r = load_recipe(recipe, env={"ITERS": "7", "SUFFIX": "b"})
    t = r.resolved["trainer"]
    assert t["parallelism"]["tensor"] == 1 and isinstance(t["parallelism"]["tensor"], int)
    assert t["schedule"]["lr"] == 0.01 and t["schedule"]["train_iters"] == 7
    assert r.resolved["experiment"]["name"] == "exp-b"
    # inherited from quickstart, and its ${RECIPE_DIR} points at the preset's own folder
    assert t["data"]["train"]["path"] == str(recipes_dir().resolve() / "data/quickstart/train.jsonl")


def test_extends_merge_order_and_set(tmp_path):
    (tmp_path / "a.yaml").write_text("trainer: {schedule: {lr: 0.1, train_iters: 5}}\n")
    (tmp_path / "b.yaml").write_text("trainer: {schedule: {lr: 0.2}}\n")
    (tmp_path / "c.yaml").write_text("extends: [quickstart, a.yaml, b.yaml]\ntrainer: {schedule: {warmup_iters: 1}}\n")
    r = load_recipe(tmp_path / "c.yaml", ["trainer.schedule.train_iters=9"], env={})
    s = r.resolved["trainer"]["schedule"]
    assert (s["lr"], s["train_iters"], s["warmup_iters"]) == (0.2, 9, 1)
    assert r.resolved["cluster"]["executor"] == "local"  # from quickstart


def test_model_preset_inlined_with_override():
    r = load_recipe(recipes_dir() / "llama2_70b_fp4.yaml", env={})
    m = r.resolved["trainer"]["model"]
    assert (m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["num_query_groups"]) == (80, 8192, 64, 8)
    assert m["ffn_hidden_size"] == 28672 and m["max_position_embeddings"] == 8192
    p = r.resolved["trainer"]["precision"]
    assert (p["fp4"], p["fp4_recipe"], p["fp8"]) == ("e2m1", "nvfp4", None)


def test_hash_is_stable_and_sensitive():
    a = load_recipe(recipes_dir() / "quickstart.yaml", env={})
    b = load_recipe(recipes_dir() / "quickstart.yaml", env={})
    c = load_recipe(recipes_dir() / "quickstart.yaml", ["trainer.schedule.lr=0.5"], env={})
    assert a.hash == b.hash != c.hash


def test_exponent_without_dot_is_a_number(tmp_path):
    """PyYAML (YAML 1.1) reads `5e-3` as a string; float fields accept it, in files and in --set."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("extends: quickstart\ntrainer: {schedule: {lr: 5e-3, min_lr: 1E-4}}\n")
    s = load_recipe(recipe, ["trainer.schedule.adam_eps=1e-6"], env={}).resolved["trainer"]["schedule"]
    assert (s["lr"], s["min_lr"], s["adam_eps"]) == (5e-3, 1e-4, 1e-6)
    with pytest.raises(Exception, match="trainer.schedule.lr"):
        load_recipe(recipe, ["trainer.schedule.lr=5e-3x"], env={})


def test_bare_metal_slurm_runs_the_launchers_interpreter_and_containers_python3(tmp_path):
    """Without a container the job runs the interpreter primus-slurm (and torch) were installed into; the
    quickstart on `--executor slurm` used to fail on the node with "No module named 'torch'" from python3."""
    import sys

    def python_of(*sets):
        r = load_recipe(recipes_dir() / "quickstart.yaml", overrides=["cluster.executor=slurm", *sets])
        script = render_script(r.resolved, str(tmp_path), "20261130-000000-abcdef")
        m = re.search(r"^TRAIN=\(\n(?:.*\n)?  (\S+) -m trainer.runtime.launch", script, re.M)  # (after the preflight)
        return m.group(1)

    assert python_of() == shlex.quote(sys.executable)
    assert python_of("cluster.container.runtime=apptainer", "cluster.container.image=/img.sif") == "python3"
    assert python_of("cluster.python=/opt/venv/bin/python") == "/opt/venv/bin/python"


def test_recipes_listing_gives_each_recipe_its_first_sentence():
    from primus_slurm.cli import _summary

    text = "# Llama LoRA, BF16, packed data on\n# 8 GPUs. Second sentence here.\nexperiment: {}\n# not this\n"
    assert _summary(text) == "Llama LoRA, BF16, packed data on 8 GPUs."
    long = "# " + "word " * 40 + "\n"
    assert _summary(long, width=30) == "word word word word word word …"
    assert _summary("experiment: {}\n") == ""
    from conftest import CLI

    out = subprocess.run([str(CLI), "recipes"], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == len(list(recipes_dir().glob("*.yaml")))
    assert all(len(line) <= 37 + 112 and not line.rstrip().endswith(("on", "the", ",")) for line in lines), lines


def test_relative_paths_that_exist_here_are_anchored_like_the_workspace(tmp_path, monkeypatch):
    """The job runs in its run directory: a relative data path that exists from where submit ran used to be read
    relative to the run directory there, and the run failed after it had waited in the queue."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    monkeypatch.chdir(tmp_path)
    sets = ["trainer.data.train.path=data/train.jsonl", "trainer.tokenizer.path=gpt2"]  # gpt2: a hub name
    t = load_recipe("quickstart", sets, env={}).resolved["trainer"]
    assert t["data"]["train"]["path"] == str(tmp_path / "data" / "train.jsonl")
    assert t["tokenizer"]["path"] == "gpt2"
    inside = load_recipe("quickstart", sets + ["cluster.container.runtime=docker", "cluster.container.image=x"],
                         env={}).resolved["trainer"]
    assert inside["data"]["train"]["path"] == "data/train.jsonl"  # in a container, relative is the image's
    pyxis = load_recipe("quickstart", sets + ["cluster.container.runtime=pyxis", "cluster.container.image=x"],
                        env={}).resolved["trainer"]  # a local pyxis job runs on the host
    assert pyxis["data"]["train"]["path"] == str(tmp_path / "data" / "train.jsonl")


@pytest.mark.parametrize("sets, hidden", [
    (["trainer.distributed.device=cpu", "cluster.env_profile=none"], True),
    (["trainer.distributed.device=cpu", "cluster.env_profile=h200", "trainer.distributed.backend=gloo"], True),
    (["trainer.distributed.device=cuda", "cluster.env_profile=h200"], False),
    (["trainer.distributed.device=cpu", "cluster.env_profile=none", "cluster.env.CUDA_VISIBLE_DEVICES=0"], False)])
def test_a_cpu_run_does_not_see_the_nodes_gpus(sets, hidden):
    """trainer/model/cpu_compat.py stays off wherever CUDA is visible: a CPU run on a GPU node would use megatron's
    CUDA RNG tracker (audit, 2026-12-05). The job hides the GPUs from it; the recipe's own cluster.env wins."""
    r = load_recipe(recipes_dir() / "quickstart.yaml", sets, env={})
    script = render_script(r.resolved, "/tmp/run", "rid", "local")
    assert ("export CUDA_VISIBLE_DEVICES=''" in script) == hidden, [x for x in script.splitlines() if "CUDA_VIS" in x]
