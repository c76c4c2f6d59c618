"""What `submit` accepts the trainer runs: over thousands of recipe variations (precision x parallelism x model x
LoRA x data x checkpoint), the launcher's verdict (accept, or the field it refuses) equals the trainer's pre-start
verdict (trainer/runtime/start_check.py: the contract, the machine rules on the node the recipe names, the data options
and megatron-core's TransformerConfig checks) on the resolved recipe. CPU only, no model is built.

The node: `trainer.distributed.device: cpu` (or env profile cpu) is a CPU; a GPU env profile is that GPU with
Transformer Engine; profile none is a GPU that has the recipe's format (the launcher cannot know the machine:
`validate` lists those checks as made at start)."""
from __future__ import annotations

import contextlib
import copy
import random
from collections import Counter
from unittest import mock

import pytest
from megatron.core.transformer import transformer_config

from primus_contract.machine import Environment
from primus_slurm.errors import UserError
from primus_slurm.config.recipe import resolve_raw
from primus_slurm.config.validate import validate
from trainer.config import Config
from trainer.runtime.start_check import StartRefused, pre_start

N = 2000
SKIP = object()  # leave the key out (its default)
CPU = Environment(device="cpu")
NODES = {
    "b200": Environment(device="cuda", device_name="B200", cuda_cc=(10, 0), te_version=(2, 9, 0)),
    "h100": Environment(device="cuda", device_name="H100", cuda_cc=(9, 0), te_version=(2, 9, 0)),
    "h200": Environment(device="cuda", device_name="H200", cuda_cc=(9, 0), te_version=(2, 9, 0)),
    "mi300x": Environment(device="cuda", device_name="MI300X", rocm_arch="gfx942", te_version=(2, 4, 0)),
    "mi355x": Environment(device="cuda", device_name="MI355X", rocm_arch="gfx950", te_version=(2, 8, 0),
                          te_has_mxfp4=True),
}
# dotted key -> the values a variation may give it
SPACE = {
    "trainer.model.preset": ["tiny_llama", "llama2_70b", "llama3_8b", "qwen3_30b_a3b", "deepseek_v2_lite"],
    "trainer.model.num_layers": [SKIP, 2, 4, 6, 80],
    "trainer.precision.bf16": [SKIP, False],
    "trainer.precision.fp8": [SKIP, "hybrid", "e4m3"],
    "trainer.precision.fp8_recipe": [SKIP, "tensorwise", "blockwise"],
    "trainer.precision.fp4": [SKIP, "e2m1"],
    "trainer.precision.fp4_recipe": [SKIP, "mxfp4"],
    "trainer.precision.fp4_emulation": [SKIP, True],
    "trainer.precision.fp4_param": [SKIP, True],
    "trainer.precision.fp8_param": [SKIP, True],
    "trainer.precision.fp4_random_hadamard": [SKIP, True],
    "trainer.precision.fp4_stochastic_rounding": [SKIP, True],
    "trainer.precision.fp8_dot_product_attention": [SKIP, SKIP, True],
    "trainer.precision.fp4_param_gather": [SKIP, SKIP, True],
    "trainer.precision.first_last_layers_bf16": [SKIP, True],
    "trainer.precision.num_layers_at_start_in_bf16": [SKIP, 0, 2, 60],
    "trainer.precision.num_layers_at_end_in_bf16": [SKIP, 0, 2, 60],
    "trainer.parallelism.tensor": [1, 2, 4],
    "trainer.parallelism.pipeline": [1, 2],
    "trainer.parallelism.context": [1, 2],
    "trainer.parallelism.expert": [1, 2],
    "trainer.parallelism.sequence_parallel": [SKIP, True],
    "trainer.parallelism.tp_comm_overlap": [SKIP, SKIP, True],
    "trainer.lora.enabled": [SKIP, False],
    "trainer.lora.target_modules": [SKIP, ["linear_qkv"], ["linear_q_proj", "linear_kv_up_proj"], ["*"],
                                    ["linear_fc1"], []],
    "trainer.lora.exclude_modules": [SKIP, ["linear_fc2"], ["router"]],
    "trainer.data.format": [SKIP, "text", "mlperf_npy", "openai"],
    "trainer.data.train.path": ["/data/train", None],
    "trainer.data.train.hf_name": [SKIP, "org/ds"],
    "trainer.data.validation.path": [SKIP, "/data/val"],
    "trainer.data.seq_length": [SKIP, 128, 4096],
    "trainer.data.pad_to_multiple_of": [SKIP, 64],
    "trainer.data.packing": [SKIP, False],
    "trainer.recompute.activation_offload_layers": [SKIP, SKIP, 1, 79],
    "trainer.recompute.granularity": [SKIP, SKIP, "full"],
    "trainer.tokenizer.path": ["/tok", ""],
    "trainer.schedule.eval_interval": [SKIP, 10],
    "trainer.schedule.micro_batch_size": [SKIP, 2],
    "trainer.schedule.global_batch_size": [SKIP, 6, 16],
    "trainer.schedule.warmup_iters": [SKIP, 200],
    "trainer.checkpoint.pretrained": [SKIP, "/ckpt/hf"],
    "trainer.checkpoint.export_peft": [SKIP, False],
    "trainer.checkpoint.save_interval": [SKIP, 5],
    "trainer.distributed.device": ["cuda", "auto", "cpu"],
    "trainer.distributed.backend": [SKIP, "gloo", "nccl"],
    "cluster.nodes": [SKIP, 2],
    "cluster.gpus_per_node": [SKIP, 4, 0],
    "cluster.nproc_per_node": [SKIP, 1, 2, 4],
    "cluster.env_profile": [SKIP, "h100", "h200", "b200", "mi300x", "mi355x", "cpu"],
}
BASE = {"experiment": {"name": "verdict", "workspace": "/tmp/primus-verdicts"}, "cluster": {"executor": "slurm"},
        "trainer": {"data": {"train": {"path": "/data/train"}}, "tokenizer": {"path": "/tok"},
                    "distributed": {"device": "cuda"}}}


@pytest.fixture(autouse=True)
def presets_read_once(monkeypatch):
    """Each model preset file parsed once (pure-Python YAML is most of the time otherwise)."""
    from primus_slurm.config import recipe

    cache: dict = {}
    read = recipe.load_model_preset

    def cached(name: str) -> dict:
        if name not in cache:
            cache[name] = read(name)
        return copy.deepcopy(cache[name])

    monkeypatch.setattr(recipe, "load_model_preset", cached)


def _set(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = copy.deepcopy(value)


def variations(n: int = N, seed: int = 18) -> list:
    """Each variation: the base recipe with 0-7 of SPACE's keys set to one of their values (seeded)."""
    rng = random.Random(seed)
    keys = sorted(SPACE)
    out = []
    for _ in range(n):
        raw = copy.deepcopy(BASE)
        for key in rng.sample(keys, rng.randint(0, 7)):
            value = rng.choice(SPACE[key])
            if value is not SKIP:
                _set(raw, key, value)
        out.append(raw)
    return out


def node_for(resolved: dict) -> Environment:
    t, profile = resolved["trainer"], resolved["cluster"]["env_profile"]
    if t["distributed"]["device"] == "cpu" or profile == "cpu":
        return CPU
    if profile in NODES:
        return NODES[profile]
    p = t["precision"]
    return NODES["mi355x" if p["fp4"] and p["fp4_recipe"] == "mxfp4" and not p["fp4_emulation"] else "b200"]


@contextlib.contextmanager
def te_version_of(node: Environment):
    """megatron-core's TransformerConfig asks TE's version (MoE + FP8): answer for the simulated node."""
    have = node.te_version or ()

    def is_te_min_version(version: str, check_equality: bool = True) -> bool:
        want = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
        return bool(have) and (have >= want if check_equality else have > want)

    with mock.patch.object(transformer_config, "is_te_min_version", is_te_min_version):
        yield


def verdicts(raw: dict) -> tuple:
    """(launcher's verdict, trainer's pre-start verdict): "accept" or the refused field. The launcher's is
    resolve_raw's (= load_recipe's after the file is read): the schema, then validate(); the trainer is handed what
    the schema resolved, as the job would be had the launcher let it through."""
    try:
        resolved = resolve_raw(copy.deepcopy(raw), {}, check=False)
    except UserError as err:  # a type error: no resolved recipe exists (the trainer's schema says the same)
        return err.field, err.field
    try:
        validate(copy.deepcopy(resolved))
        launcher = "accept"
    except UserError as err:
        launcher = err.field or f"(no field) {err}"
    node = node_for(resolved)
    try:
        with te_version_of(node):
            pre_start(Config.from_dict(resolved), node)
        trainer = "accept"
    except StartRefused as err:
        trainer = err.field or f"(no field) {err}"
    return launcher, trainer


def test_launcher_and_trainer_verdicts_agree():
    counts, disagree = Counter(), []
    for i, raw in enumerate(variations()):
        launcher, trainer = verdicts(raw)
        counts["accept" if launcher == "accept" else "refuse"] += 1
        if launcher != trainer:
            disagree.append((i, launcher, trainer))
    assert not disagree, f"{len(disagree)} of {N} disagree (index, launcher, trainer): {disagree[:12]}"
    assert counts["accept"] >= N // 4 and counts["refuse"] >= N // 4, counts  # both verdicts well exercised


# the drifts found by reading the code (issue 18), and two more the generator found; each failed on the old code
DRIFTS = [
    ("fp8 delayed with first/last layers in bf16",
     {"trainer.model.preset": "llama2_70b", "trainer.precision.fp8": "hybrid",
      "trainer.precision.first_last_layers_bf16": True, "trainer.distributed.device": "cuda"},
     "trainer.precision.first_last_layers_bf16"),
    ("60 + 60 bf16 layers of Llama2-70B's 80",
     {"trainer.model.preset": "llama2_70b", "trainer.precision.fp8": "hybrid",
      "trainer.precision.fp8_recipe": "tensorwise", "trainer.precision.first_last_layers_bf16": True,
      "trainer.precision.num_layers_at_start_in_bf16": 60, "trainer.precision.num_layers_at_end_in_bf16": 60,
      "trainer.distributed.device": "cuda"},
     "trainer.precision.num_layers_at_start_in_bf16"),
    ("fp8 inside an fp32 model (bf16: false): megatron-core and TE run it",
     {"trainer.model.preset": "llama2_70b", "trainer.precision.fp8": "hybrid", "trainer.precision.bf16": False,
      "trainer.distributed.device": "cuda"}, "accept"),
    ("first/last layers in bf16 without fp8 or fp4",
     {"trainer.precision.first_last_layers_bf16": True, "trainer.distributed.device": "cpu"},
     "trainer.precision.first_last_layers_bf16"),
    ("FP8 attention with one document a row",
     {"trainer.model.preset": "llama3_8b", "trainer.precision.fp8": "hybrid", "trainer.data.packing": False,
      "trainer.precision.fp8_dot_product_attention": True, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "accept"),
    ("FP8 attention at head dim 32 (TE has no FP8 attention backend for it: the H200, 2026-12-06)",
     {"trainer.model.preset": "tiny_llama", "trainer.precision.fp8": "hybrid", "trainer.data.packing": False,
      "trainer.precision.fp8_dot_product_attention": True, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "trainer.precision.fp8_dot_product_attention"),
    ("FP8 attention with MLA's 192/128 head dims",
     {"trainer.model.preset": "deepseek_v2_lite", "trainer.precision.fp8": "hybrid", "trainer.data.packing": False,
      "trainer.precision.fp8_dot_product_attention": True, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "trainer.precision.fp8_dot_product_attention"),
    ("FP8 attention on packed rows without the one-document switch (always THD)",
     {"trainer.model.preset": "llama3_8b", "trainer.precision.fp8": "hybrid", "trainer.data.single_document_sbhd": False,
      "trainer.precision.fp8_dot_product_attention": True, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "trainer.precision.fp8_dot_product_attention"),
    ("FP8 attention on packed rows with pipeline parallelism (always THD)",
     {"trainer.model.preset": "llama3_8b", "trainer.precision.fp8": "hybrid", "trainer.parallelism.pipeline": 2,
      "cluster.nproc_per_node": 2, "cluster.gpus_per_node": 2,
      "trainer.precision.fp8_dot_product_attention": True, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "trainer.precision.fp8_dot_product_attention"),
    ("FP8 attention on packed rows with the one-document switch: the one-document micro-batches take it",
     {"trainer.model.preset": "llama3_8b", "trainer.precision.fp8": "hybrid",
      "trainer.precision.fp8_dot_product_attention": True, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "accept"),
    ("70B activations of 56 layers offloaded on an H200",
     {"trainer.model.preset": "llama2_70b", "trainer.precision.fp8": "hybrid",
      "trainer.recompute.activation_offload_layers": 56, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "accept"),
    ("random Hadamard with mxfp4",
     {"trainer.precision.fp4": "e2m1", "trainer.precision.fp4_recipe": "mxfp4", "trainer.precision.fp4_emulation": True,
      "trainer.precision.fp4_random_hadamard": True, "trainer.distributed.device": "cpu"},
     "trainer.precision.fp4_random_hadamard"),
    ("stochastic rounding with native mxfp4 (ROCm TE rounds its own way)",
     {"trainer.precision.fp4": "e2m1", "trainer.precision.fp4_recipe": "mxfp4",
      "trainer.precision.fp4_stochastic_rounding": True, "trainer.distributed.device": "cuda",
      "cluster.env_profile": "mi355x"}, "trainer.precision.fp4_stochastic_rounding"),
    ("fused_swiglu true with no adapter on fc1 (was refused only at the trainer's start)",
     {"trainer.lora.fused_swiglu": True, "trainer.lora.target_modules": ["linear_qkv", "linear_proj"],
      "trainer.distributed.device": "cpu"}, "trainer.lora.fused_swiglu"),
    ("fused_swiglu true on a model whose every layer is MoE",
     {"trainer.model.preset": "qwen3_30b_a3b", "trainer.lora.fused_swiglu": True, "trainer.distributed.device": "cpu"},
     "trainer.lora.fused_swiglu"),
    ("epilogue on a GPU with only norm-fed targets (TE fuses qkv and fc1 with their norms), the norm epilogue off",
     {"trainer.lora.epilogue": True, "trainer.lora.epilogue_norm": False,
      "trainer.lora.target_modules": ["linear_qkv", "linear_fc1"], "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "trainer.lora.epilogue"),
    ("epilogue on a GPU with only norm-fed targets, the norm epilogue null (the default): it owns them",
     {"trainer.lora.epilogue": True, "trainer.lora.target_modules": ["linear_qkv", "linear_fc1"],
      "trainer.distributed.device": "cuda", "cluster.env_profile": "h200"}, "accept"),
    ("epilogue on a GPU with only MLA's up-projection (TE fuses it with its latent norm), the norm epilogue off",
     {"trainer.model.preset": "deepseek_v2_lite", "trainer.lora.epilogue": True, "trainer.lora.epilogue_norm": False,
      "trainer.lora.target_modules": ["linear_kv_up_proj"], "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "trainer.lora.epilogue"),
    ("epilogue true with FP8 delayed on an NVIDIA GPU: TE's functional linear runs the base GEMMs in FP8",
     {"trainer.lora.epilogue": True, "trainer.precision.fp8": "hybrid", "trainer.distributed.device": "cuda",
      "cluster.env_profile": "h200"}, "accept"),
    ("epilogue true with FP8 tensorwise and FP8 weights (the 70B's precision)",
     {"trainer.lora.epilogue": True, "trainer.precision.fp8": "hybrid", "trainer.precision.fp8_recipe": "tensorwise",
      "trainer.precision.fp8_param": True, "trainer.distributed.device": "cuda", "cluster.env_profile": "h200"},
     "accept"),
    ("epilogue true with FP8 blockwise scaling (not per-tensor: not built)",
     {"trainer.lora.epilogue": True, "trainer.precision.fp8": "hybrid", "trainer.precision.fp8_recipe": "blockwise",
      "trainer.distributed.device": "cuda", "cluster.env_profile": "h200"}, "trainer.lora.epilogue"),
    ("epilogue true with FP8 on an AMD profile (built and checked on NVIDIA only)",
     {"trainer.lora.epilogue": True, "trainer.precision.fp8": "hybrid", "trainer.distributed.device": "cuda",
      "cluster.env_profile": "mi300x"}, "trainer.lora.epilogue"),
    ("epilogue true with FP4 (not built)",
     {"trainer.lora.epilogue": True, "trainer.precision.fp4": "e2m1", "trainer.precision.fp4_emulation": True,
      "trainer.distributed.device": "cpu"}, "trainer.lora.epilogue"),
    ("epilogue on the CPU with only fc1, folded by fused_swiglu",
     {"trainer.lora.epilogue": True, "trainer.lora.fused_swiglu": True, "trainer.lora.target_modules": ["linear_fc1"],
      "trainer.distributed.device": "cpu"}, "trainer.lora.epilogue"),
    ("key/value groups on multi-latent attention (it has none: the value was ignored)",
     {"trainer.model.preset": "deepseek_v2_lite", "trainer.model.num_query_groups": 2,
      "trainer.distributed.device": "cpu"}, "trainer.model.num_query_groups"),
    ("a Hub dataset beside a local path (the path won, the name was ignored)",
     {"trainer.data.train.hf_name": "org/data"}, "trainer.data.train.hf_name"),
    ("a DeepSeek MoE layer frequency transformers cannot export",
     {"trainer.model.preset": "deepseek_v2_lite", "trainer.model.moe_layer_freq": 2,
      "trainer.distributed.device": "cpu"},
     "trainer.model.moe_layer_freq"),
    ("a Qwen3-MoE layer frequency after a dense layer",
     {"trainer.model.preset": "qwen3_30b_a3b", "trainer.model.moe_layer_freq": 2, "trainer.model.moe_first_k_dense": 1,
      "trainer.distributed.device": "cpu"}, "accept"),
    ("a MoE layer frequency without experts",
     {"trainer.model.moe_layer_freq": 2, "trainer.distributed.device": "cpu"}, "trainer.model.moe_layer_freq"),
    ("stochastic rounding with emulated mxfp4",
     {"trainer.precision.fp4": "e2m1", "trainer.precision.fp4_recipe": "mxfp4", "trainer.precision.fp4_emulation": True,
      "trainer.precision.fp4_stochastic_rounding": True, "trainer.distributed.device": "cpu"}, "accept"),
]


@pytest.mark.parametrize("what,sets,expect", DRIFTS, ids=[d[0] for d in DRIFTS])
def test_named_drifts(what, sets, expect):
    raw = copy.deepcopy(BASE)
    for key, value in {"trainer.data.train.path": "/data/train", "trainer.tokenizer.path": "/tok",
                       "cluster.nproc_per_node": 1, **sets}.items():
        _set(raw, key, value)
    assert verdicts(raw) == (expect, expect)


def test_validate_lists_the_machine_rules_checked_at_start(capsys):
    from primus_slurm.cli import run
    from primus_slurm.resources import recipes_dir

    assert run(["validate", str(recipes_dir() / "llama2_70b_fp8.yaml")]) == 0
    out = capsys.readouterr().out
    assert "checked at start on the node: fp8_device: fp8 needs Transformer Engine" in out
    # the null levers as they will run there: packed FP8 keeps BF16 attention, FP8 keeps the epilogue off
    assert "automatic levers: " in out and "precision.fp8_dot_product_attention off" in out
    assert "lora.epilogue off" in out
    assert run(["validate", str(recipes_dir() / "quickstart.yaml")]) == 0  # bf16 on CPU: no precision rule there
    out = capsys.readouterr().out
    assert "checked at start" in out and "fp8_device" not in out and "nvfp4_native" not in out
