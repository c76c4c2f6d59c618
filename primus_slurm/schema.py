"""The recipe schema: every key, its type, default and allowed values. The single source of defaults.

`SCHEMA` is a nested dict whose leaves are `Field`s. `apply_schema(raw)` checks types and ranges, rejects
unknown keys (suggesting the nearest valid name) and returns a fully-defaulted copy. Cross-field rules live in
`validate.py`; model presets are inlined by `recipe.py` before this runs.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from primus_slurm.errors import UserError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ALWAYS_SECRET = ("HF_TOKEN", "WANDB_API_KEY")  # protected whatever cluster.secrets lists
TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$", re.ASCII)
MAX_STR = 4096
FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)$", re.ASCII)


@dataclass(frozen=True)
class Field:
    kind: str  # int | float | bool | str | list | dict
    default: Any = None
    nullable: bool = False
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    pattern: re.Pattern | None = None
    item: str = "str"  # element kind for list/dict values
    help: str = ""

    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices) + (" or null" if self.nullable else "")
        what = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                "list": f"a list of {self.item}s", "dict": f"a mapping of names to {self.item}s"}[self.kind]
        if self.min is not None and self.max is not None:
            what += f" in [{self.min:g}, {self.max:g}]"
        elif self.min is not None:
            what += f" >= {self.min:g}"
        return what + (" or null" if self.nullable else "")


def _opt(kind: str, **kw) -> Field:
    return Field(kind, None, nullable=True, **kw)


SIGNALS = ("USR2", "TERM", "INT", "URG", "XCPU")  # never USR1: NCCL uses it
RUNTIMES = ("none", "docker", "podman", "pyxis", "apptainer")
PROFILES = ("none", "cpu", "mi300x", "mi355x", "h100", "h200", "b200")

MODEL = {
    "preset": Field("str", "tiny_llama", pattern=NAME_RE),
    "family": Field("str", "llama", choices=("llama", "qwen3", "deepseek")),
    "num_layers": Field("int", 2, min=1, max=1024),
    "hidden_size": Field("int", 128, min=8, max=1 << 20),
    "ffn_hidden_size": Field("int", 352, min=8, max=1 << 22),
    "num_attention_heads": Field("int", 4, min=1, max=4096),
    "num_query_groups": _opt("int", min=1, max=4096),
    "kv_channels": _opt("int", min=1, max=1 << 16),
    "vocab_size": Field("int", 512, min=2, max=1 << 24),
    "max_position_embeddings": Field("int", 1024, min=1, max=1 << 24),
    "rotary_base": Field("float", 10000.0, min=1),
    "rope_scaling": _opt("dict", item="number"),
    "norm_epsilon": Field("float", 1e-5, min=0, max=1),
    "untie_embeddings": Field("bool", True),
    "qk_layernorm": Field("bool", False),
    "num_moe_experts": _opt("int", min=1, max=4096),
    "moe_router_topk": _opt("int", min=1, max=64),
    "moe_ffn_hidden_size": _opt("int", min=1, max=1 << 20),
    "moe_shared_expert_intermediate_size": _opt("int", min=1, max=1 << 20),
    "moe_layer_freq": Field("int", 1, min=1, max=1024),
    "moe_first_k_dense": Field("int", 0, min=0, max=1024),
    "multi_latent_attention": Field("bool", False),
    "q_lora_rank": _opt("int", min=1, max=1 << 16),
    "kv_lora_rank": _opt("int", min=1, max=1 << 16),
    "qk_head_dim": _opt("int", min=1, max=1 << 12),
    "qk_pos_emb_head_dim": _opt("int", min=1, max=1 << 12),
    "v_head_dim": _opt("int", min=1, max=1 << 12),
}

DATA_SOURCE = {
    "path": _opt("str"),
    "hf_name": _opt("str"),
    "split": Field("str", "train", pattern=re.compile(r"^[A-Za-z0-9_.:\[\]%-]{1,64}$")),
    "limit": _opt("int", min=1),
}

SCHEMA: dict = {
    "experiment": {
        "name": Field("str", "run", pattern=NAME_RE, help="letters, digits, '.', '_', '-'; at most 64"),
        "workspace": Field("str", "./runs"),
        "seed": Field("int", 1234, min=0, max=2**31 - 1),
        "description": Field("str", ""),
    },
    "cluster": {
        "executor": Field("str", "auto", choices=("auto", "slurm", "local")),
        "partition": _opt("str", pattern=NAME_RE),
        "account": _opt("str", pattern=NAME_RE),
        "qos": _opt("str", pattern=NAME_RE),
        "reservation": _opt("str", pattern=NAME_RE),
        "constraint": _opt("str"),
        "nodes": Field("int", 1, min=1, max=4096),
        "gpus_per_node": Field("int", 8, min=0, max=64),
        "nproc_per_node": _opt("int", min=1, max=256, help="processes per node; default gpus_per_node (1 on CPU)"),
        "cpus_per_task": _opt("int", min=1, max=1024),
        "mem": _opt("str", pattern=re.compile(r"^\d+[KMGT]?$", re.ASCII)),
        "time": Field("str", "04:00:00", pattern=TIME_RE, help="minutes, HH:MM:SS or D-HH:MM:SS"),
        "exclusive": Field("bool", True),
        "requeue": Field("bool", True),
        "signal": Field("str", "USR2", choices=SIGNALS),
        "signal_grace_s": Field("int", 300, min=10, max=3600),
        "extra_sbatch": Field("list", [], help="extra '--flag=value' sbatch options"),
        "env_profile": Field("str", "none", choices=PROFILES),
        "env": Field("dict", {}, item="str"),
        "secrets": Field("list", ["HF_TOKEN", "WANDB_API_KEY"], help="environment variable names passed through"),
        "python": Field("str", "python3", pattern=re.compile(r"^[A-Za-z0-9_./+-]{1,256}$"),
                        help="an interpreter name or path of letters, digits and _./+- (python3: the launcher's "
                             "own when there is no container)"),
        "entrypoint": Field("str", "trainer", pattern=re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}$"),
                            help="python module torchrun runs with -m"),
        "stall_minutes": Field("float", 30.0, min=0.1, max=10080),
        "container": {
            "runtime": Field("str", "none", choices=RUNTIMES),
            "image": _opt("str"),
            "mounts": Field("list", [], help="'src:dst[:ro]'"),
            "workdir": _opt("str", pattern=re.compile(r"^/[A-Za-z0-9_./+@=-]*$"), help="an absolute path"),
            "shm_size": Field("str", "64g", pattern=re.compile(r"^\d+[kmgKMG]?$", re.ASCII)),
            "extra_args": Field("list", []),
        },
    },
    "trainer": {
        "model": MODEL,
        "tokenizer": {"path": Field("str", "")},
        "data": {
            "format": Field("str", "alpaca", choices=("alpaca", "squad", "openai", "chatml", "mlperf_npy", "text")),
            "train": DATA_SOURCE,
            "validation": {**DATA_SOURCE, "split": Field("str", "validation", pattern=DATA_SOURCE["split"].pattern)},
            "seq_length": Field("int", 256, min=8, max=1 << 20),
            "packing": Field("bool", True),
            "pad_to_multiple_of": Field("int", 1, min=1, max=4096),
            "overlong": Field("str", "truncate", choices=("truncate", "drop")),
            "bad_records": Field("str", "error", choices=("error", "skip")),
            "cache_dir": _opt("str"),
            "shuffle": Field("bool", True),
        },
        "schedule": {
            "train_iters": Field("int", 100, min=1, max=10**9),
            "micro_batch_size": Field("int", 1, min=1, max=65536),
            "global_batch_size": Field("int", 8, min=1, max=10**7),
            "lr": Field("float", 1e-4, min=0, max=10),
            "min_lr": Field("float", 0.0, min=0, max=10),
            "warmup_iters": Field("int", 0, min=0),
            "lr_decay": Field("str", "cosine", choices=("cosine", "linear", "constant")),
            "lr_decay_iters": _opt("int", min=1, help="iteration the LR decay ends at (null: train_iters); set it to "
                                   "train longer on resume without moving the schedule"),
            "weight_decay": Field("float", 0.0, min=0, max=10),
            "adam_beta1": Field("float", 0.9, min=0, max=1),
            "adam_beta2": Field("float", 0.999, min=0, max=1),
            "adam_eps": Field("float", 1e-8, min=0, max=1),
            "clip_grad": Field("float", 1.0, min=0),
            "eval_interval": _opt("int", min=1),
            "eval_iters": Field("int", 10, min=1),
            "target_eval_loss": _opt("float", min=0),
        },
        "parallelism": {
            "tensor": Field("int", 1, min=1, max=1024),
            "pipeline": Field("int", 1, min=1, max=1024),
            "context": Field("int", 1, min=1, max=1024),
            "expert": Field("int", 1, min=1, max=1024),
            "sequence_parallel": Field("bool", False),
            "tp_comm_overlap": Field("bool", False, help="overlap the tensor-parallel all-gathers / reduce-scatters "
                                     "with the GEMMs (TE userbuffers; needs sequence_parallel, a GPU and TE)"),
        },
        "precision": {
            "bf16": Field("bool", True),
            "fp8": _opt("str", choices=("hybrid", "e4m3")),
            "fp8_recipe": Field("str", "delayed", choices=("delayed", "tensorwise", "blockwise")),
            "fp4": _opt("str", choices=("e2m1",)),
            "fp4_recipe": Field("str", "nvfp4", choices=("nvfp4", "mxfp4")),
            "fp4_param": Field("bool", False),
            "fp4_param_gather": Field("bool", False),
            "fp4_emulation": Field("bool", False),
            "fp4_stochastic_rounding": Field("bool", False),
            "fp4_random_hadamard": Field("bool", False),
            "fp8_weight_cache": Field("bool", True, help="keep quantized copies of the frozen base weights "
                                      "between steps (faster; ~2 bytes/param more); false for models that barely fit"),
            "fp8_param": Field("bool", False, help="keep the frozen base weights as FP8 tensors only (quantized "
                               "once, each with a scale from its own amax: 1 byte a parameter instead of 2, no "
                               "per-step re-quantization); needs fp8; works with checkpoint.pretrained"),
            "fp8_dot_product_attention": Field("bool", False, help="refused when true: TE's FP8 attention takes "
                                               "bshd/sbhd only, the trainer runs packed THD"),
            "first_last_layers_bf16": Field("bool", False),
            "num_layers_at_start_in_bf16": Field("int", 1, min=0),
            "num_layers_at_end_in_bf16": Field("int", 1, min=0),
        },
        "lora": {
            "enabled": Field("bool", True),
            "dim": Field("int", 16, min=1, max=65536),
            "alpha": Field("float", 32.0, min=0),
            "dropout": Field("float", 0.0, min=0, max=0.99),
            "dropout_position": Field("str", "pre", choices=("pre", "post")),
            "a_init": Field("str", "xavier", choices=("xavier", "kaiming")),
            "b_init": Field("str", "zero", choices=("zero",)),
            "target_modules": Field("list", ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]),
            "exclude_modules": Field("list", []),
        },
        "recompute": {
            "granularity": _opt("str", choices=("full", "selective")),
            "method": Field("str", "uniform", choices=("uniform", "block")),
            "num_layers": Field("int", 1, min=1),
            "adapter_inputs": Field("bool", False, help="adapters keep only what the frozen base keeps anyway (fc2: "
                                    "SwiGLU recomputed from fc1's output; RMSNorm linears: norm folded into A): "
                                    "Llama-3-8B at 8192 tokens 50.4 -> 39.4 GiB, ~5 % slower in bf16, ~8 % in FP8"),
            "chunked_loss": Field("bool", True, help="output layer + cross-entropy a chunk of tokens at a time with "
                                  "the input gradient computed in forward (frozen output layer): the [tokens, "
                                  "vocab] logits are never kept (Llama-3-8B at 8192 tokens: 53.7 -> 50.4 GiB, "
                                  "~3 % slower)"),
            "adapter_inputs_scope": Field("str", "all", choices=("all", "fc2", "norm"),
                                          help="which adapters adapter_inputs rewires: fc2 (SwiGLU recompute, "
                                          "ffn/tp x tokens x 2 bytes a layer) or norm (RMSNorm linears, 2 x "
                                          "hidden/tp x tokens x 2 bytes a layer)"),
        },
        "checkpoint": {
            "save_interval": _opt("int", min=1),
            "keep_last": Field("int", 2, min=1, max=1000),
            "resume": Field("str", "auto", choices=("auto", "never")),
            "pretrained": _opt("str"),
            "disable_last_saving": Field("bool", False),
            "export_peft": Field("bool", True),
        },
        "logging": {
            "log_interval": Field("int", 1, min=1),
            "log_avg_skip_iterations": Field("int", 2, min=0),
            "tensorboard": Field("bool", False),
            "wandb_project": _opt("str", pattern=NAME_RE),
            "profile_start": _opt("int", min=1, help="first iteration to run under torch.profiler"),
            "profile_end": _opt("int", min=1, help="last profiled iteration (default: profile_start)"),
            "profile_ranks": Field("list", [0], item="int"),
            "profile_trace": Field("bool", False, help="also write a chrome trace (large for big models)"),
        },
        "distributed": {
            "device": Field("str", "auto", choices=("auto", "cpu", "cuda")),
            "backend": Field("str", "auto", choices=("auto", "nccl", "gloo")),
            "timeout_minutes": Field("float", 30.0, min=0.05, max=1440),
        },
    },
}


def nearest(name: str, options) -> str:
    if not options:  # under a free-form mapping's entry or a plain value: nothing can nest there
        return "; nothing can be set below a single value"
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    if match:
        return f"; did you mean `{match[0]}`?"
    hint = " (a model preset file belongs in `trainer.model.preset`, not `extends`)" if name in MODEL else ""
    return f"; allowed: {', '.join(sorted(options))}{hint}"


def _check_text(path: str, value: str) -> None:
    if len(value) > MAX_STR:
        raise UserError(f"`{path}` is {len(value)} characters long; at most {MAX_STR} are allowed")
    if any(ord(c) < 32 and c != "\t" for c in value) or "\x7f" in value:
        raise UserError(f"`{path}` contains a newline or control character; use a single-line value")
    if any("\ud800" <= c <= "\udfff" for c in value):  # how Python decodes non-UTF-8 argv/environment bytes
        raise UserError(f"`{path}` contains bytes that are not valid UTF-8")


def _coerce(path: str, f: Field, value: Any) -> Any:
    if value is None:
        if f.nullable:
            return None
        raise UserError(f"`{path}` must not be null; expected {f.allowed()}")
    if f.kind == "float" and isinstance(value, str) and FLOAT_RE.match(value.strip()):
        value = float(value)  # YAML 1.1 reads 5e-3 (no dot) as a string
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "list": isinstance(value, list),
        "dict": isinstance(value, dict),
    }[f.kind]
    if not ok and f.kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        sexagesimal = " (YAML reads an unquoted 1:30:00 as the number 5400)" if f.pattern is TIME_RE else ""
        raise UserError(f"`{path}` is the number {value!r:.40}; quote it: expected {f.help or f.allowed()}, as a "
                        f"string{sexagesimal}")
    if not ok:
        raise UserError(f"`{path}` is {type(value).__name__} {value!r:.60}; expected {f.allowed()}")
    if f.kind == "float":
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise UserError(f"`{path}` is {value}; expected a finite number")
    if f.kind in ("int", "float"):
        if (f.min is not None and value < f.min) or (f.max is not None and value > f.max):
            raise UserError(f"`{path}` is {value}; expected {f.allowed()}")
    if f.kind == "str":
        _check_text(path, value)
        if f.pattern and not f.pattern.match(value):
            raise UserError(f"`{path}` is {value!r:.80}; expected {f.help or 'a value matching ' + f.pattern.pattern}")
    if f.choices and value not in f.choices:
        raise UserError(f"`{path}` is {value!r:.60}; expected {f.allowed()}")
    if f.kind == "list":
        for i, item in enumerate(value):
            if f.item == "int":
                if not isinstance(item, int) or isinstance(item, bool) or item < 0:
                    raise UserError(f"`{path}[{i}]` is {item!r:.40}; expected an integer >= 0")
                continue
            if not isinstance(item, str):
                raise UserError(f"`{path}[{i}]` is {type(item).__name__}; expected a string")
            _check_text(f"{path}[{i}]", item)
        value = list(value)
    if f.kind == "dict":
        value = _coerce_dict(path, f, value)
    return value


def _coerce_dict(path: str, f: Field, value: dict) -> dict:
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not ENV_NAME_RE.match(k):
            raise UserError(f"`{path}` has key {k!r:.60}; keys must be names like FOO_BAR")
        if f.item == "number":
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise UserError(f"`{path}.{k}` must be a number or string")
            if isinstance(v, str):
                _check_text(f"{path}.{k}", v)
        else:
            if isinstance(v, bool):
                v = "1" if v else "0"
            if isinstance(v, (int, float)):
                v = str(v)
            if not isinstance(v, str):
                raise UserError(f"`{path}.{k}` is {type(v).__name__}; expected a string")
            _check_text(f"{path}.{k}", v)
        out[k] = v
    return out


def apply_schema(raw: Any, spec: dict = SCHEMA, path: str = "") -> dict:
    """Validate `raw` against `spec`, returning a new dict with every default filled in."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"`{path or 'recipe'}` must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in spec:
            where = f"{path}.{key}" if path else str(key)
            raise UserError(f"unknown key `{where}`{nearest(str(key), spec)}")
    out = {}
    for key, sub in spec.items():
        where = f"{path}.{key}" if path else key
        if isinstance(sub, dict):
            out[key] = apply_schema(raw.get(key), sub, where)
        elif key in raw:
            out[key] = _coerce(where, sub, raw[key])
        else:
            out[key] = _copy(sub.default)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def field_at(dotted: str) -> Field | dict | None:
    node: Any = SCHEMA
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
