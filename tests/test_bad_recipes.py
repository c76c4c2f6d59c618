"""Bad input: one `error:` line naming the field, exit 2, no traceback, nothing written. Injection attempts
never reach the shell unquoted."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from primus_slurm.cli import run
from primus_slurm.config.recipe import load_recipe
from primus_slurm.config.render import render_script
from primus_slurm.resources import recipes_dir

QS = str(recipes_dir() / "quickstart.yaml")
QS_DATA = next((recipes_dir() / "data" / "quickstart").rglob("*.jsonl"))  # a real .jsonl (read whole)
A_FILE, A_FOLDER = str(recipes_dir() / "quickstart.yaml"), str(recipes_dir().parent / "docs")  # exist, wrong kind

# (recipe body appended to `extends: quickstart`, text the error must contain)
BAD = [
    ("trainer: {paralellism: {tensor: 2}}", "did you mean `parallelism`"),
    # validate checks the `after:` steps' files as submit does; their text as every text field's
    ("after: [{step: eval, data: /nonexistent/eval.jsonl}]", "`after[0].data` is '/nonexistent/eval.jsonl', which"),
    ('after: [{step: generate, prompt: "a\\rb"}]', "`after[0].prompt` contains a newline or control character"),
    ("cluster: {env: {HUGGING_FACE_HUB_TOKEN: hf_x}}", "would write the secret HUGGING_FACE_HUB_TOKEN"),
    ("cluster: {env: {PATH: /opt/bin}}", "`cluster.env.PATH` is a variable the job script sets or relies on"),
    # a path that exists here but is not what its field needs is refused here, as the job would refuse it
    (f"trainer: {{checkpoint: {{pretrained: {A_FILE}}}}}", "a file; expected the directory of a Hugging Face"),
    (f"trainer: {{tokenizer: {{path: {A_FILE}}}}}", "a file; expected a tokenizer directory"),
    (f"trainer: {{data: {{train: {{path: {A_FOLDER}}}}}}}", "is neither a datasets save_to_disk directory nor holds"),
    (f"experiment: {{workspace: {A_FILE}}}", "(`experiment.workspace`): " + A_FILE + " is not a directory"),
    ("trainer: {schedule: {lr: fast}}", "`trainer.schedule.lr`"),
    ("trainer: {schedule: {train_iters: 1.5}}", "`trainer.schedule.train_iters`"),
    ("trainer: {schedule: {train_iters: true}}", "`trainer.schedule.train_iters`"),
    ("trainer: {schedule: {train_iters: 0}}", "`trainer.schedule.train_iters`"),
    ("trainer: {schedule: {train_iters: 100000000000000}}", "`trainer.schedule.train_iters`"),
    ("trainer: {schedule: {lr: .nan}}", "`trainer.schedule.lr`"),
    ("trainer: {precision: {fp4: e2m1, fp8: hybrid}}", "mutually exclusive"),
    ("trainer: {precision: {fp4_param: true}}", "`trainer.precision.fp4_param`"),
    ("trainer: {precision: {fp8_param: true}}", "`trainer.precision.fp8_param` needs"),
    ("trainer: {logging: {profile_end: 5}}", "`trainer.logging.profile_end` (5) needs"),
    ("trainer: {recompute: {adapter_inputs_scope: mlp}}", "`trainer.recompute.adapter_inputs_scope`"),
    ("trainer: {logging: {profile_start: 6, profile_end: 5}}", "`trainer.logging.profile_end` (5) needs"),
    ("trainer: {logging: {profile_ranks: [zero]}}", "`trainer.logging.profile_ranks[0]`"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, data: {single_document_sbhd: false}, "
     "precision: {fp8_dot_product_attention: true, fp8: hybrid}}",
     "`trainer.precision.fp8_dot_product_attention` needs rows of one document: TE's FP8 attention takes bshd/sbhd"),
    ("trainer: {precision: {fp8_dot_product_attention: true}, data: {packing: false}}",
     "`trainer.precision.fp8_dot_product_attention` needs `trainer.precision.fp8: hybrid|e4m3`"),
    ("trainer: {precision: {fp8_dot_product_attention: true, fp8: hybrid}, data: {packing: false}}",
     "`trainer.precision.fp8` needs a GPU with Transformer Engine"),  # on CPU: refused like fp8
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, data: {packing: false}, precision: "
     "{fp8_dot_product_attention: true, fp8: hybrid, fp8_recipe: blockwise}}", "runs with fp8_recipe delayed or"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, data: {packing: false}, precision: "
     "{fp8_dot_product_attention: true, fp8: hybrid}}", "needs attention head dim 128 (Transformer Engine's FP8 "
     "attention has no backend for others); this model has head dim 32 (from trainer.model)"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, data: {packing: false}, precision: "
     "{fp8_dot_product_attention: true, fp8: hybrid, fp8_recipe: tensorwise}, model: {num_attention_heads: 1, "
     "num_query_groups: 1}, checkpoint: {pretrained: null}}",
     "with fp8_recipe tensorwise (current scaling) needs compute capability >= 10.0"),
    ("cluster: {env_profile: mi300x}\ntrainer: {distributed: {device: cuda}, data: {packing: false}, precision: "
     "{fp8_dot_product_attention: true, fp8: hybrid}, model: {num_attention_heads: 1, num_query_groups: 1}, "
     "checkpoint: {pretrained: null}}",
     "`cluster.env_profile` mi300x is AMD, where it was never run"),
    ("trainer: {recompute: {activation_offload_layers: 1}}",
     "`trainer.recompute.activation_offload_layers` needs a GPU with Transformer Engine"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, recompute: {activation_offload_layers: 2}}",
     "`trainer.recompute.activation_offload_layers` (2) must be fewer than trainer.model.num_layers (2)"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, recompute: {activation_offload_layers: 1, "
     "granularity: full}}", "and `trainer.recompute.granularity` full exclude each other"),
    ("trainer: {recompute: {activation_offload_layers: -1}}", "`trainer.recompute.activation_offload_layers`"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {tensor: 2, sequence_parallel: true}, data: {packing: "
     "false, seq_length: 127}}", "`trainer.data.seq_length` (127 after pad_to_multiple_of) must be divisible by"),
    ("trainer: {precision: {fp4_param_gather: true, fp4: e2m1}}", "`trainer.precision.fp4_param_gather`"),
    ("trainer: {precision: {fp4: e3m2}}", "`trainer.precision.fp4`"),
    ("trainer: {model: {preset: qwen3_30b_a3b, num_layers: 2}, checkpoint: {pretrained: /tmp}}",
     "`trainer.checkpoint.pretrained` /tmp has no config.json"),
    ("cluster: {executor: slurm, time: '5'}",  # the default 300 s warning would come at the start
     "`cluster.signal_grace_s` (300 s) is not shorter than `cluster.time` (5)"),
    ("cluster: {time: 1:30:00}", "`cluster.time` is the number 5400; quote it"),
    ("cluster: {container: {runtime: docker, image: 'nvcr.io#nvidia/pytorch:25.09-py3'}}",
     "uses pyxis/enroot's registry#image form; docker needs registry/image"),
    ("cluster: {executor: slurm, exclusive: false, gpus_per_node: 4, container: {runtime: docker, image: a/b:1}}",
     "with `cluster.exclusive: false` it would use GPUs Slurm gave to other jobs"),
    ("trainer: {distributed: {backend: nccl}}", "`trainer.distributed.backend` nccl needs GPUs"),
    ("cluster: {container: {runtime: docker, image: a/b:1, workdir: relative}}",
     "`cluster.container.workdir` is 'relative'; expected an absolute path"),
    ("cluster: {python: 'python3 -c'}", "expected an interpreter name or path of letters, digits and _./+-"),
    ("cluster: {container: {runtime: apptainer, image: 'rocm/megatron-lm:v25.9'}}",
     "apptainer needs a .sif path or a docker://registry/image"),
    ("cluster: {gpus_per_node: 8, nproc_per_node: 16}\ntrainer: {distributed: {device: cuda}}",
     "`cluster.nproc_per_node` (16) exceeds `cluster.gpus_per_node` (8)"),
    ("cluster: {env_profile: h100}\ntrainer: {distributed: {device: cuda}, precision: {fp4: e2m1, bf16: true}}",
     "`cluster.env_profile` h100 has none (NVFP4: b200; MXFP4: mi355x)"),
    ("cluster: {env_profile: mi355x}\ntrainer: {distributed: {device: cuda}, precision: {fp4: e2m1, bf16: true}}",
     "`trainer.precision.fp4_recipe` is nvfp4, but `cluster.env_profile` mi355x runs mxfp4"),
    ("trainer: {precision: {fp8: hybrid}}",  # quickstart's device is cpu: refused at submit, not at the job's start
     "`trainer.precision.fp8` needs a GPU with Transformer Engine; `trainer.distributed.device` is cpu"),
    ("trainer: {precision: {fp4: e2m1, bf16: true}}", "set `trainer.precision.fp4_emulation: true` to emulate it"),
    ("trainer: {precision: {fp8_swiglu_input: true}}", "`trainer.precision.fp8_swiglu_input` needs the GPU's fused"),
    ("trainer: {lora: {fused_swiglu: true}, recompute: {adapter_inputs: true}}",
     "`trainer.lora.fused_swiglu` and `trainer.recompute.adapter_inputs` scope all"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, precision: {fp8_swiglu_input: true}, "
     "recompute: {adapter_inputs: true}}", "`trainer.precision.fp8_swiglu_input` and `trainer.recompute.adapter_inputs`"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, precision: {fp8: hybrid, "
     "fp8_recipe: blockwise}, lora: {epilogue: true}}", "fp8_recipe blockwise is not built there"),
    ("cluster: {env_profile: mi300x}\ntrainer: {distributed: {device: cuda}, precision: {fp8: hybrid}, "
     "lora: {epilogue: true}}", "built and checked on NVIDIA GPUs only"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {tensor: 2}, lora: {epilogue: true}}",
     "`trainer.lora.epilogue` runs at `trainer.parallelism.tensor` 1 only"),
    ("trainer: {lora: {epilogue: true, dropout: 0.1, dropout_position: post}}", "fuses pre-dropout into A"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, lora: {epilogue: false, "
     "epilogue_norm: true}}",
     "`trainer.lora.epilogue_norm` extends `trainer.lora.epilogue` to the norm-fed linears; epilogue is false"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, precision: {bf16: true, fp8: hybrid, "
     "fp8_recipe: blockwise}, lora: {epilogue_norm: true}}",  # epilogue null (the default) is off under blockwise
     "`trainer.lora.epilogue_norm` extends `trainer.lora.epilogue` to the norm-fed linears; epilogue null stays off"),
    ("trainer: {lora: {epilogue: true, epilogue_norm: true}}",  # quickstart's device is cpu: no TE norm-fused linear
     "`trainer.lora.epilogue_norm` owns the input norms Transformer Engine fuses into qkv and fc1"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, lora: {epilogue: true, epilogue_norm: "
     "true, target_modules: [linear_proj, linear_fc2]}}", "`trainer.lora.epilogue_norm` has no norm-fed linear"),
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, lora: {epilogue: true, epilogue_norm: "
     "true}, recompute: {adapter_inputs: true}}", "`trainer.recompute.adapter_inputs` scope all folds that norm"),
    # device auto without a GPU profile may build TE's spec, where qkv is norm-fused: no owner there (audit 2026-12-06)
    ("cluster: {env_profile: none}\ntrainer: {distributed: {device: auto}, lora: {epilogue: true, target_modules: "
     "[linear_qkv]}}", "`trainer.lora.epilogue` has no linear to own on a GPU, where Transformer Engine fuses"),
    # the fold's FP8 store is Triton's, which takes 16-bit weights only (the trainer refused in the queue)
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, precision: {bf16: false, "
     "fp8_swiglu_input: true}, lora: {fused_swiglu: true}}", "which take 16-bit weights (`trainer.precision.bf16`"),
    # accepted before, then a traceback in the queue (audit, 2026-12-06): megatron's uniform recompute indexed past
    # the last layer; SP's split of a packed THD row; arch.rope_kwargs' NotImplementedError
    ("trainer: {recompute: {granularity: full, method: uniform, num_layers: 3}}",
     "`trainer.recompute.num_layers` (3) must divide the 2 layers of each pipeline stage"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {tensor: 2, sequence_parallel: true}, data: "
     "{seq_length: 255, pad_to_multiple_of: 1}}", "`trainer.data.seq_length` (255 after pad_to_multiple_of) must be"),
    ("trainer: {model: {rope_scaling: {type: linear, factor: 2}}}", "`trainer.model.rope_scaling`: linear scaling: "
     "implemented are llama3 (Llama) and yarn"),
    ("trainer: {model: {rope_scaling: {type: llama3, factor: abc}}}",  # (audit, 2026-12-07: the trainer's float())
     "`trainer.model.rope_scaling`: factor 'abc' is not a positive number"),
    ("trainer: {model: {rope_scaling: {type: llama3, factor: 8, low_freq_factor: x}}}",
     "`trainer.model.rope_scaling`: low_freq_factor 'x' is not a positive number"),
    ("trainer: {model: {rope_scaling: {type: llama3, factor: 8, low_freq_factor: 2}}}",
     "`trainer.model.rope_scaling`: llama3 scaling with low_freq_factor 2"),
    # accepted and ignored before (audit, 2026-12-06): the build line said "fc2 0 | norm 0"
    ("trainer: {recompute: {adapter_inputs: true}, lora: {dropout: 0.1}}",
     "`trainer.recompute.adapter_inputs` rewires adapters that read their base's own input, and with"),
    ("trainer: {recompute: {adapter_inputs: true, adapter_inputs_scope: norm}}",
     "`trainer.recompute.adapter_inputs` scope norm would rewire nothing here"),
    (f"trainer: {{data: {{validation: {{path: {QS_DATA}, split: 'test[:5%]'}}}}}}",
     "`trainer.data.validation.split` is 'test[:5%]', but `trainer.data.validation.path` is one jsonl file"),
    ("trainer: {logging: {profile_start: 2, profile_ranks: [0, 3]}}",
     "`trainer.logging.profile_ranks` names rank 3, and the job has ranks 0-0"),
    # TE's FP8 linears refuse a micro-batch whose tokens are no multiple of 8 in the first forward (its message, seen
    # on the H200: rules_shapes.py); 255 x 2 tokens
    ("cluster: {env_profile: h200}\ntrainer: {distributed: {device: cuda}, precision: {fp8: hybrid}, data: "
     "{seq_length: 255}}", "`trainer.precision.fp8` needs the tokens of a micro-batch to be a multiple of 8"),
    ("trainer: {lora: {enabled: false}}", "`trainer.lora.enabled` is false, but this trainer fine-tunes LoRA"),
    ("trainer: {precision: {fp8: hybrid, bf16: false}}", "`trainer.precision.fp8`"),
    ("trainer: {precision: {fp4_recipe: nvfp8, fp4: e2m1}}", "`trainer.precision.fp4_recipe`"),
    ("cluster: {nproc_per_node: 3}\ntrainer: {parallelism: {tensor: 3}}", "`trainer.parallelism.tensor`"),
    ("trainer: {parallelism: {pipeline: 2}}", "tensor×pipeline×context"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {context: 2}}", "context parallelism is not supported"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {schedule: {global_batch_size: 5}}", "`trainer.schedule.global_batch_size`"),
    ("trainer: {data: {seq_length: 4096}}", "`trainer.data.seq_length`"),
    ("trainer: {lora: {target_modules: [linear_qkvv]}}", "`trainer.lora.target_modules[0]`"),
    ("trainer: {model: {preset: llama9_1t}}", "`trainer.model.preset`"),
    ("trainer: {model: {num_query_groups: 3}}", "`trainer.model.num_query_groups`"),
    ("trainer: {parallelism: {expert: 2}}", "`trainer.parallelism.expert`"),
    ("trainer: {parallelism: {sequence_parallel: true}}", "`trainer.parallelism.sequence_parallel`"),
    ("trainer: {parallelism: {tp_comm_overlap: true}}", "`trainer.parallelism.tp_comm_overlap` needs"),
    ("trainer: {parallelism: {tp_comm_overlap: maybe}}", "`trainer.parallelism.tp_comm_overlap`"),
    ("trainer: {schedule: {min_lr: 1.0}}", "`trainer.schedule.min_lr`"),
    ("experiment: {name: 'x; rm -rf /'}", "`experiment.name`"),
    ("experiment: {name: '$(id)'}", "`experiment.name`"),
    ("experiment: {name: \"a\\nb\"}", "`experiment.name`"),
    ("experiment: {workspace: '/tmp/$(id)'}", "`experiment.workspace`"),
    ("experiment: {description: \"line1\\nline2\"}", "`experiment.description`"),
    ("cluster: {partition: 'gpu`id`'}", "`cluster.partition`"),
    ("cluster: {account: 'a b'}", "`cluster.account`"),
    ("cluster: {time: 'tomorrow'}", "`cluster.time`"),
    ("cluster: {signal: USR1}", "`cluster.signal`"),
    # audit, 2026-12-06: TERM as the warning made a cancel requeue the job; an image that is an option; a secret in
    # the container's arguments; job-shaping sbatch options that pipeline steps inherit
    ("cluster: {signal: TERM}", "`cluster.signal`"),
    ("cluster: {time: '99:99'}", "`cluster.time`"),
    ("cluster: {time: '99999999999999999999'}", "`cluster.time`"),
    ("cluster: {container: {runtime: podman, image: '-v/:/host'}}", "`cluster.container.image`"),
    ("cluster: {container: {runtime: podman, image: 'img:1', extra_args: ['--env=HF_TOKEN=hf_x']}}",
     "`cluster.container.extra_args[0]`"),
    ("cluster: {container: {runtime: docker, image: 'img:1', extra_args: ['--privileged', '-e', 'A=1']}}",
     "`cluster.container.extra_args[1]`"),
    # audit, 2026-12-07: a secret in srun's --export under pyxis, docker's combined -ie, SIGUSR1 through srun
    ("cluster: {container: {runtime: pyxis, image: 'nvcr.io#x', extra_args: ['--export=ALL,HF_TOKEN=hf_x']}}",
     "`cluster.container.extra_args[0]` would write the secret HF_TOKEN"),
    ("cluster: {container: {runtime: docker, image: 'img:1', extra_args: ['-ie', 'A=1']}}",
     "`cluster.container.extra_args[0]`"),
    ("cluster: {container: {runtime: pyxis, image: 'nvcr.io#x', extra_args: ['--container-name=a', '--sig=USR1']}}",
     "`cluster.container.extra_args[1]` sets srun's --sig (--signal)"),
    ("cluster: {container: {runtime: pyxis, image: 'nvcr.io#x', extra_args: ['-N2']}}",
     "`cluster.container.extra_args[0]` sets srun's -N"),
    ("cluster: {extra_sbatch: ['--array=0-3']}", "`cluster.extra_sbatch[0]` sets --array"),
    ("cluster: {extra_sbatch: ['--mail-type=END', '--dependency=singleton']}", "`cluster.extra_sbatch[1]`"),
    ("cluster: {extra_sbatch: ['--comment=$(id)']}", "`cluster.extra_sbatch[0]`"),
    ("cluster: {extra_sbatch: ['--output=/tmp/x']}", "`cluster.extra_sbatch[0]`"),
    ("cluster: {container: {runtime: docker}}", "`cluster.container.image`"),
    ("cluster: {container: {runtime: kubernetes}}", "`cluster.container.runtime`"),
    ("cluster: {container: {runtime: pyxis, image: 'img;reboot'}}", "`cluster.container.image`"),
    ("cluster: {container: {mounts: ['/data:/data,/etc:/etc']}}", "`cluster.container.mounts[0]`"),
    ("cluster: {env: {HF_TOKEN: abc}}", "`cluster.env.HF_TOKEN`"),
    ("cluster: {env: {'BAD NAME': x}}", "`cluster.env`"),
    ("cluster: {env: {A: \"x\\ny\"}}", "`cluster.env.A`"),
    ("cluster: {nodes: 2, executor: local}", "`cluster.nodes`"),  # (valid for the slurm executor)
    ("cluster: {python: 'python3; id'}", "`cluster.python`"),
    ("cluster: {entrypoint: 'trainer --evil'}", "`cluster.entrypoint`"),
    ("trainer: {tokenizer: {path: '${HF_TOKEN}'}}", "secret"),
    ("trainer: {tokenizer: {path: '${PRIMUS_UNSET_VAR_XYZ}'}}", "PRIMUS_UNSET_VAR_XYZ"),
    ("trainer: {schedule: {eval_interval: 5}, data: {validation: {path: null}}}", "`trainer.schedule.eval_interval`"),
    ("trainer: {data: {format: csv}}", "`trainer.data.format`"),
    ("trainer: [1, 2]", "`trainer`"),
    ("base: &b {lr: 1}\ntrainer: {schedule: *b}", "alias"),
    ("trainer: {schedule: {lr: 0.1}}\ntrainer: {schedule: {lr: 0.2}}", "duplicate key"),
    ("trainer: {schedule: {lr: [0.1}", "not valid YAML"),
    (f"experiment: {{description: '{'x' * 5000}'}}", "`experiment.description`"),
    # section and list types checked before anything reads them
    ("cluster: [1, 2]", "`cluster` must be a mapping"),
    ("cluster: {secrets: 5}", "`cluster.secrets` must be a list"),
    ("cluster: {secrets: [[HF_TOKEN]]}", "`cluster.secrets` must be a list"),
    ("trainer: {model: llama3_8b}", "`trainer.model` must be a mapping"),
    ("? [a, b]\n: 1", "keys must be plain names"),
    ("family: llama\nhidden_size: 64", "belongs in `trainer.model.preset`, not `extends`"),  # a model file extended
    # sbatch takes unambiguous prefixes: --sig= is --signal=
    ("cluster: {extra_sbatch: ['--sig=B:USR1@600']}", "sets --sig (--signal), which primus-slurm manages"),
    ("cluster: {extra_sbatch: ['--out=/tmp/x']}", "(--output)"),
    ("cluster: {extra_sbatch: ['--export=NONE']}", "(--export)"),
    ("cluster: {extra_sbatch: ['--no-requeue']}", "(--no-requeue)"),
    ("cluster: {env: {JOB_ID: '777'}}", "`cluster.env.JOB_ID` is a variable the job script"),
    ("cluster: {env: {SLURM_JOB_ID: '1'}}", "`cluster.env.SLURM_JOB_ID`"),
    ("cluster: {env: {IFS: ','}}", "`cluster.env.IFS`"),
    ("cluster: {secrets: [WANDB_API_KEY], env: {HF_TOKEN: x}}", "would write the secret HF_TOKEN"),
    ("cluster: {time: '\u0660\u0664:\u0660\u0660:\u0660\u0660'}", "`cluster.time`"),  # Arabic-Indic digits
    ("cluster: {mem: '\u0661\u0660G'}", "`cluster.mem`"),
    ("experiment: {workspace: '/tmp/a,b'}", "`experiment.workspace`"),
    # what TE userbuffers cannot carry is refused before anything is submitted
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {tensor: 2, sequence_parallel: true, tp_comm_overlap: true}}",
     "`trainer.parallelism.tp_comm_overlap` needs a GPU"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {tensor: 2, sequence_parallel: true, context: 1, "
     "tp_comm_overlap: true}, distributed: {device: cuda}, precision: {bf16: true, fp8: hybrid, "
     "fp8_recipe: blockwise}}", "not blockwise"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {tensor: 2, sequence_parallel: true, "
     "tp_comm_overlap: true}, distributed: {device: cuda}, precision: {bf16: true, fp4: e2m1, fp4_emulation: true}}",
     "carries BF16 or FP8"),
    ("cluster: {nproc_per_node: 2}\ntrainer: {parallelism: {tensor: 2, sequence_parallel: true, "
     "tp_comm_overlap: true}, distributed: {device: cuda}, precision: {bf16: true, fp8: hybrid, "
     "fp8_recipe: tensorwise, first_last_layers_bf16: true, num_layers_at_start_in_bf16: 0}}",
     "first_last_layers_bf16"),
]


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(f"extends: {QS}\n{body}\n")
    return path


def _check_error(capsys, argv, expect: str) -> str:
    rc = run(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (argv, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expect in lines[0], lines[0]
    assert "Traceback" not in out + err
    return lines[0]


@pytest.mark.parametrize("body,expect", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_recipe_validate(body, expect, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PRIMUS_UNSET_VAR_XYZ", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    _check_error(capsys, ["validate", str(_write(tmp_path, body))], expect)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing written


@pytest.mark.parametrize("argv,expect", [
    (["validate", QS, "--set", "trainer.schedul.lr=1"], "did you mean `schedule`"),
    (["validate", QS, "--set", "trainer.schedule.lr"], "expected key=value"),
    (["validate", QS, "--set", "trainer.schedule.lr=abc"], "`trainer.schedule.lr`"),
    (["validate", "/nonexistent/recipe.yaml"], "does not exist"),
    (["validate", "no_such_recipe_name"], "not found"),
    (["render", QS, "--executor", "pbs"], "pbs"),
    (["render", QS, "--executor", "slurm", "--run-dir", "/tmp/x\ntouch /tmp/pwned #"], "the run directory"),
    (["validate", QS, "--set", "cluster.env.FOO.BAR=1"], "nothing can be set below a single value"),
    (["validate"], "RECIPE"),
])
def test_bad_cli(argv, expect, capsys):
    _check_error(capsys, argv, expect)


@pytest.mark.parametrize("typed,limit", [("60", "60"), ("1:30:00", "1:30:00"), ("2-0", "2-0"), ("0", "0")])
def test_set_time_takes_the_text_as_typed(typed, limit, capsys):
    """YAML reads --set cluster.time=1:30:00 as the number 5400 (and 60 as a number): a text field takes the text."""
    assert run(["render", QS, "--executor", "slurm", "--set", f"cluster.time={typed}"]) == 0
    assert f"#SBATCH --time={limit}\n" in capsys.readouterr().out


def test_time_limit_check_follows_the_executor_auto_resolves_to(capsys, monkeypatch, tmp_path):
    """`auto` becomes slurm where sbatch is on PATH: the grace check must see that, not the word auto."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    argv = ["submit", QS, "--dry-run", "--set", "cluster.executor=auto", "--set", "cluster.time=5"]
    assert run(argv) == 2
    assert "`cluster.signal_grace_s` (300 s) is not shorter than `cluster.time` (5)" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: auto is local, where no limit applies
    assert run(argv) == 0


def test_set_text_fields_keep_what_was_typed(capsys):
    """YAML folded a newline into a space (the newline refusal never fired) and read '# x' as null."""
    assert run(["validate", QS, "--set", "experiment.description=a\nb"]) == 2
    assert "`experiment.description` contains a newline" in capsys.readouterr().err
    r = load_recipe(QS, ["experiment.description=# not a comment", "cluster.partition=true"], env={})
    assert r.resolved["experiment"]["description"] == "# not a comment"
    assert r.resolved["cluster"]["partition"] == "true"
    assert load_recipe(QS, ["cluster.partition=null"], env={}).resolved["cluster"]["partition"] is None
    env = load_recipe(QS, ["cluster.env.MODE=0755", "cluster.env.WHEN=1:30", "cluster.env.NOTE=a # b"],
                      env={}).resolved["cluster"]["env"]
    assert (env["MODE"], env["WHEN"], env["NOTE"]) == ("0755", "1:30", "a # b")  # YAML: 493, 90, 'a'


def test_non_utf8_and_recursive_extends(tmp_path, capsys):
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"experiment:\n  name: \xff\xfe\n")
    _check_error(capsys, ["validate", str(bad)], "not valid UTF-8")
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    _check_error(capsys, ["validate", str(tmp_path / "a.yaml")], "recursive")


def test_cli_process_exit_code_and_no_traceback(tmp_path):
    path = _write(tmp_path, "trainer: {precision: {fp4: e2m1, fp8: hybrid}}")
    exe = Path(sys.executable).with_name("primus-slurm")
    proc = subprocess.run([str(exe), "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_injection_is_quoted_in_rendered_script(tmp_path):
    """Free-text values reach the script only shell-quoted: executing the script's export lines yields the
    literal text and runs nothing."""
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); `touch {marker}` ' \" ; touch {marker} && echo"
    r = load_recipe(QS, [f"cluster.env.EVIL={evil}"], env={})
    script = render_script(r.resolved, str(tmp_path / "run"), "rid", "local")
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export EVIL="))
    proc = subprocess.run(["bash", "-c", exports + '\nprintf %s "$EVIL"'], capture_output=True, text=True,
                          env={**os.environ})
    assert proc.returncode == 0 and proc.stdout == evil
    assert not marker.exists()
    assert not re.search(r"^[^'#]*\$\(touch", script, flags=re.M)


def test_run_dir_behind_a_symlink_is_checked_after_resolving(tmp_path, capsys):
    """The workspace passes its pattern, but a symlink on the way resolves to a name with a newline: the run
    directory lands unquoted in #SBATCH lines, so it is refused after symlinks are followed."""
    evil = tmp_path / "evil\ntouch pwned #"
    evil.mkdir()
    (tmp_path / "ws").symlink_to(evil)
    line = _check_error(capsys, ["submit", QS, "--executor", "slurm", "--dry-run", "--set",
                                 f"experiment.workspace={tmp_path}/ws"], "the run directory")
    assert "symlinks" in line
