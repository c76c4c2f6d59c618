"""Cross-field rules over a fully-defaulted recipe. Each rule raises one UserError naming the fields."""
from __future__ import annotations

import fnmatch
import re

from primus_slurm.errors import UserError
from primus_slurm.schema import ALWAYS_SECRET, ENV_NAME_RE

SBATCH_FLAG_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:@%/+=&|\[\]*!-]+)?$")
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.,&|\[\]*()!:-]+$")
MOUNT_RE = re.compile(r"^/[^:,\s]*:/[^:,\s]*(:(ro|rw))?$")
IMAGE_RE = re.compile(r"^[A-Za-z0-9_./:@+#-]+$")
WORKSPACE_RE = re.compile(r"^/[A-Za-z0-9_./+@=-]*$")  # (no comma: container mount lists are comma-separated)
# sbatch options the job script sets itself; sbatch also takes any unambiguous prefix (--sig=, --out=)
MANAGED_SBATCH = ("job-name", "nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "mem", "partition",
                  "account", "qos", "reservation", "constraint", "time", "exclusive", "requeue", "no-requeue", "signal",
                  "output", "error", "open-mode", "export")
# variables the job script itself sets or relies on, and shell variables that change how it parses
RESERVED_ENV = ("CHILD", "CONTAINER", "JOB_ID", "LAUNCH", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_WRAPPER",
                "REQUEUE", "RUN_DIR", "SRUN", "TRAIN", "PYTHONPATH", "IFS", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS",
                "CDPATH", "GLOBIGNORE", "PROMPT_COMMAND")
RESERVED_ENV_PREFIXES = ("SLURM_", "PRIMUS_RUN_")
# the LoRA-wrappable linear names of each attention/MLP kind (megatron-core module names)
DENSE_ATTN = ("self_attention.linear_qkv", "self_attention.linear_proj")
MLA_ATTN = ("self_attention.linear_q_proj", "self_attention.linear_q_down_proj", "self_attention.linear_q_up_proj",
            "self_attention.linear_kv_down_proj", "self_attention.linear_kv_up_proj", "self_attention.linear_proj")
DENSE_MLP = ("mlp.linear_fc1", "mlp.linear_fc2")
MOE_MLP = ("mlp.experts.linear_fc1", "mlp.experts.linear_fc2", "mlp.shared_experts.linear_fc1",
           "mlp.shared_experts.linear_fc2")  # routers stay frozen: never a LoRA target


def model_linear_names(model: dict) -> list[str]:
    attn = MLA_ATTN if model["multi_latent_attention"] else DENSE_ATTN
    mlp = MOE_MLP + DENSE_MLP if model["num_moe_experts"] else DENSE_MLP
    return list(attn + mlp)


def pattern_matches(pattern: str, names: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(n.rsplit(".", 1)[-1], pattern) for n in names)


def world_size(cluster: dict) -> int:
    return cluster["nodes"] * nproc_per_node(cluster)


def nproc_per_node(cluster: dict) -> int:
    return cluster["nproc_per_node"] or cluster["gpus_per_node"] or 1


def fail(msg: str) -> None:
    raise UserError(msg)


def validate(r: dict) -> None:
    _cluster(r["cluster"], r["experiment"])
    t = r["trainer"]
    _precision(t["precision"], t["distributed"]["device"])
    _fp4_hardware(t["precision"], r["cluster"]["env_profile"])
    _model(t["model"], t)
    _parallel(t, r["cluster"])
    _lora(t["lora"], t["model"])
    _data_and_schedule(t)


def slurm_seconds(time: str) -> int:
    """Seconds of a Slurm time limit: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]."""
    days, _, rest = time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
        return ((int(days) * 24 + h) * 60 + m) * 60 + sec
    if len(parts) == 3:
        return (parts[0] * 60 + parts[1]) * 60 + parts[2]
    return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0)


def check_time_limit(c: dict, executor: str) -> None:
    """A Slurm job warned `signal_grace_s` before its end must have a longer limit (load_recipe checks an explicit
    slurm executor, submit.prepare the one `auto` resolves to)."""
    if executor == "slurm" and 0 < slurm_seconds(c["time"]) <= c["signal_grace_s"]:  # 0: no limit
        fail(f"`cluster.signal_grace_s` ({c['signal_grace_s']} s) is not shorter than `cluster.time` ({c['time']}): "
             "the time-limit warning would come at the start, and every attempt would stop and requeue at once; "
             "use a longer time or a smaller grace")


def _cluster(c: dict, exp: dict) -> None:
    check_time_limit(c, c["executor"])
    if not WORKSPACE_RE.match(exp["workspace"]):
        fail(f"`experiment.workspace` resolves to {exp['workspace']!r}; use a path of letters, digits and ./_-+@=")
    for i, flag in enumerate(c["extra_sbatch"]):
        if not SBATCH_FLAG_RE.match(flag):
            fail(f"`cluster.extra_sbatch[{i}]` is {flag!r:.60}; expected one '--flag' or '--flag=value' "
                 "(letters, digits and _.,:@%/+=&|[]*!-)")
        name = flag.split("=")[0][2:]
        managed = [m for m in MANAGED_SBATCH if m.startswith(name)]
        if managed:
            fail(f"`cluster.extra_sbatch[{i}]` sets --{name} (--{managed[0]}), which primus-slurm manages; "
                 "use the cluster.* field instead")
    if c["constraint"] and not CONSTRAINT_RE.match(c["constraint"]):
        fail(f"`cluster.constraint` is {c['constraint']!r:.60}; expected a Slurm feature expression")
    cont = c["container"]
    if cont["runtime"] != "none" and not cont["image"]:
        fail(f"`cluster.container.image` is required when `cluster.container.runtime` is {cont['runtime']}")
    if cont["image"] and not IMAGE_RE.match(cont["image"]):
        fail(f"`cluster.container.image` is {cont['image']!r:.60}; expected an image reference or path")
    if cont["runtime"] in ("docker", "podman") and c["gpus_per_node"] and not c["exclusive"] and c["executor"] != "local":
        fail(f"`cluster.container.runtime` {cont['runtime']} gives the container every GPU of the node (its daemon is "
             "outside the job's cgroup), so with `cluster.exclusive: false` it would use GPUs Slurm gave to other "
             "jobs; set exclusive: true, or use pyxis or apptainer")
    if cont["runtime"] in ("docker", "podman", "apptainer") and "#" in (cont["image"] or ""):
        fail(f"`cluster.container.image` {cont['image']!r:.80} uses pyxis/enroot's registry#image form; "
             f"{cont['runtime']} needs registry/image (e.g. nvcr.io/nvidia/pytorch:25.09-py3)")
    if cont["runtime"] == "apptainer" and cont["image"] and not cont["image"].startswith(("/", "docker://", "oras://")):
        fail(f"`cluster.container.image` is {cont['image']!r:.80}; apptainer needs a .sif path or a "
             "docker://registry/image (or oras://) reference")
    for i, m in enumerate(cont["mounts"]):
        if not MOUNT_RE.match(m):
            fail(f"`cluster.container.mounts[{i}]` is {m!r:.60}; expected '/host/path:/container/path[:ro|rw]'")
    for i, name in enumerate(c["secrets"]):
        if not ENV_NAME_RE.match(name):
            fail(f"`cluster.secrets[{i}]` is {name!r:.60}; expected an environment variable name")
    for key in c["env"]:
        if key in c["secrets"] or key in ALWAYS_SECRET:
            fail(f"`cluster.env.{key}` would write the secret {key} into the job script; list it in "
                 "cluster.secrets and export it in your shell instead")
        if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
            fail(f"`cluster.env.{key}` is a variable the job script sets or relies on; choose another name")
    if c["executor"] == "local" and c["nodes"] > 1:
        fail(f"`cluster.nodes` is {c['nodes']} but `cluster.executor` is local; the local executor runs one node")


# FP4 units per env profile (the trainer's gating checks the device itself at start; this catches a recipe whose
# nodes cannot run its FP4 format before it waits in the queue)
FP4_FORMAT = {"b200": "nvfp4", "mi355x": "mxfp4", "h100": None, "h200": None, "mi300x": None}


def _fp4_hardware(p: dict, profile: str) -> None:
    if not p["fp4"] or p["fp4_emulation"] or profile not in FP4_FORMAT:
        return
    native = FP4_FORMAT[profile]
    if native is None:
        fail(f"`trainer.precision.fp4` needs FP4 units, and `cluster.env_profile` {profile} has none (NVFP4: b200; "
             "MXFP4: mi355x); set `trainer.precision.fp4_emulation: true` for accuracy studies, or use fp8")
    if p["fp4_recipe"] != native:
        fail(f"`trainer.precision.fp4_recipe` is {p['fp4_recipe']}, but `cluster.env_profile` {profile} runs "
             f"{native} (NVFP4 is NVIDIA TE's, MXFP4 ROCm TE's); set fp4_recipe: {native}")


def _precision(p: dict, device: str) -> None:
    if p["fp4_param_gather"]:  # megatron's distributed-optimizer all-gather: nothing here would read it
        fail("`trainer.precision.fp4_param_gather` has no effect in LoRA training: the frozen base is sharded by "
             "tensor/pipeline parallelism only and no parameters are all-gathered; remove it")
    if p["fp4"] and p["fp8"]:
        fail("`trainer.precision.fp4` and `trainer.precision.fp8` are mutually exclusive; set one of them to null")
    for flag in ("fp4_param", "fp4_emulation", "fp4_stochastic_rounding", "fp4_random_hadamard"):
        if p[flag] and not p["fp4"]:
            fail(f"`trainer.precision.{flag}` needs `trainer.precision.fp4: e2m1`")
    if p["fp4_param"] and p["fp4_emulation"]:
        fail("`trainer.precision.fp4_param` stores weights in FP4 with native TE kernels; it cannot be combined "
             "with `trainer.precision.fp4_emulation`")
    if p["fp8_param"] and not p["fp8"]:
        fail("`trainer.precision.fp8_param` needs `trainer.precision.fp8: hybrid|e4m3`")
    if p["fp8_dot_product_attention"]:  # TE 2.20.2's nvte_get_fused_attn_backend; measured on an H200
        fail("`trainer.precision.fp8_dot_product_attention` is not supported: TE's FP8 fused attention takes bshd/sbhd "
             "inputs only, and this trainer always runs the packed THD layout (per-document cu_seqlens); remove it")
    if device == "cpu" and p["fp8"]:  # the trainer would refuse at start; say it before anything is submitted
        fail("`trainer.precision.fp8` needs a GPU with Transformer Engine; `trainer.distributed.device` is cpu "
             "(on CPU: bf16, or fp4: e2m1 with fp4_emulation: true)")
    if device == "cpu" and p["fp4"] and not p["fp4_emulation"]:
        fail("`trainer.precision.fp4` needs FP4 hardware (compute capability 10.0) with Transformer Engine; "
             "`trainer.distributed.device` is cpu: set `trainer.precision.fp4_emulation: true` to emulate it")
    if (p["fp4"] or p["fp8"]) and not p["bf16"]:
        fail(f"`trainer.precision.{'fp4' if p['fp4'] else 'fp8'}` needs `trainer.precision.bf16: true` "
             "(low-precision GEMMs run inside a bf16 model)")


def _model(m: dict, t: dict) -> None:
    heads, groups = m["num_attention_heads"], m["num_query_groups"] or m["num_attention_heads"]
    if heads % groups:
        fail(f"`trainer.model.num_query_groups` ({groups}) must divide `num_attention_heads` ({heads})")
    if not m["kv_channels"] and not m["multi_latent_attention"] and m["hidden_size"] % heads:
        fail(f"`trainer.model.hidden_size` ({m['hidden_size']}) must be divisible by num_attention_heads ({heads})"
             " or set kv_channels")
    seq = t["data"]["seq_length"]
    if seq > m["max_position_embeddings"]:
        fail(f"`trainer.data.seq_length` ({seq}) exceeds `trainer.model.max_position_embeddings` "
             f"({m['max_position_embeddings']})")
    if m["num_moe_experts"]:
        if not m["moe_router_topk"] or m["moe_router_topk"] > m["num_moe_experts"]:
            fail(f"`trainer.model.moe_router_topk` must be between 1 and num_moe_experts ({m['num_moe_experts']})")
    if m["multi_latent_attention"]:
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if not m[key]:
                fail(f"`trainer.model.{key}` is required with `trainer.model.multi_latent_attention: true`")
    # what the trainer cannot do for this model: say so before a run, not at its end
    if m["multi_latent_attention"] and t["lora"]["enabled"] and t["checkpoint"]["export_peft"]:
        fail("`trainer.checkpoint.export_peft` is not implemented for multi-latent-attention (DeepSeek) adapters; "
             "set it to false (every checkpoint holds the adapters)")


def _parallel(t: dict, c: dict) -> None:
    if t["distributed"]["device"] == "cpu" and t["distributed"]["backend"] == "nccl":
        fail("`trainer.distributed.backend` nccl needs GPUs, and `trainer.distributed.device` is cpu; use gloo "
             "(or auto)")
    if t["distributed"]["device"] != "cpu" and c["gpus_per_node"] and nproc_per_node(c) > c["gpus_per_node"]:
        fail(f"`cluster.nproc_per_node` ({nproc_per_node(c)}) exceeds `cluster.gpus_per_node` ({c['gpus_per_node']}): "
             "one rank a GPU (two ranks on one GPU fail in NCCL/RCCL)")
    par, m = t["parallelism"], t["model"]
    tp, pp, cp, ep = par["tensor"], par["pipeline"], par["context"], par["expert"]
    world = world_size(c)
    heads, groups = m["num_attention_heads"], m["num_query_groups"] or m["num_attention_heads"]
    if heads % tp or (not m["multi_latent_attention"] and groups % tp):
        fail(f"`trainer.parallelism.tensor` ({tp}) must divide num_attention_heads ({heads}) and "
             f"num_query_groups ({groups})")
    if tp * pp * cp > world or world % (tp * pp * cp):
        fail(f"`trainer.parallelism` tensor×pipeline×context = {tp * pp * cp} must divide the world size "
             f"{world} (cluster.nodes × processes per node)")
    if cp > 1:  # megatron would take the whole packed sequence for each rank's chunk: wrong attention and RoPE
        fail(f"`trainer.parallelism.context` is {cp}; context parallelism is not supported yet (packed THD batches "
             "are not split across context-parallel ranks): use 1")
    dp = world // (tp * pp * cp)
    if ep > 1 and not m["num_moe_experts"]:
        fail("`trainer.parallelism.expert` > 1 needs a MoE model (trainer.model.num_moe_experts)")
    if ep > 1 and ((dp * cp) % ep or m["num_moe_experts"] % ep):
        fail(f"`trainer.parallelism.expert` ({ep}) must divide data×context parallel size ({dp * cp}) and "
             f"num_moe_experts ({m['num_moe_experts']})")
    if m["num_layers"] % pp:
        fail(f"`trainer.parallelism.pipeline` ({pp}) must divide trainer.model.num_layers ({m['num_layers']})")
    if m["num_moe_experts"] and tp > 1 and not par["sequence_parallel"]:
        fail("`trainer.parallelism.sequence_parallel` must be true for a MoE model with tensor parallelism "
             "(megatron-core's MoE token dispatch requires it)")
    if par["sequence_parallel"] and tp == 1:
        fail("`trainer.parallelism.sequence_parallel` needs `trainer.parallelism.tensor` > 1")
    if par["tp_comm_overlap"]:
        _tp_comm_overlap(par, t["precision"], t["distributed"])
    s = t["schedule"]
    if s["global_batch_size"] % (s["micro_batch_size"] * dp):
        fail(f"`trainer.schedule.global_batch_size` ({s['global_batch_size']}) must be divisible by "
             f"micro_batch_size × data-parallel size = {s['micro_batch_size']} × {dp}")


def _tp_comm_overlap(par: dict, prec: dict, dist: dict) -> None:
    """What TE userbuffers cannot carry (the trainer checks the same, plus the GPU and TE)."""
    what = "`trainer.parallelism.tp_comm_overlap`"
    if not par["sequence_parallel"]:
        fail(f"{what} needs `trainer.parallelism.sequence_parallel: true` (and so tensor > 1): it overlaps the "
             "sequence-parallel all-gathers and reduce-scatters")
    if dist["device"] == "cpu":
        fail(f"{what} needs a GPU with Transformer Engine; `trainer.distributed.device` is cpu")
    if prec["fp4"]:
        fail(f"{what} carries BF16 or FP8; set `trainer.precision.fp4` to null or the overlap off")
    if prec["fp8"] and prec["fp8_recipe"] == "blockwise":
        fail(f"{what} works with `trainer.precision.fp8_recipe` delayed or tensorwise, not blockwise")
    if prec["fp8"] and prec["first_last_layers_bf16"]:
        fail(f"{what} cannot be combined with `trainer.precision.first_last_layers_bf16`")


def _lora(lora: dict, model: dict) -> None:
    if not lora["enabled"]:
        return
    names = model_linear_names(model)
    for field in ("target_modules", "exclude_modules"):
        for i, pattern in enumerate(lora[field]):
            if not pattern_matches(pattern, names):
                fail(f"`trainer.lora.{field}[{i}]` ({pattern!r:.60}) matches no linear layer of this model; "
                     f"available: {', '.join(n.rsplit('.', 1)[-1] for n in names)}")
    if not lora["target_modules"]:
        fail("`trainer.lora.target_modules` is empty; name at least one linear layer (e.g. linear_qkv)")


def _data_and_schedule(t: dict) -> None:
    d, s = t["data"], t["schedule"]
    if not d["train"]["path"] and not d["train"]["hf_name"]:
        fail("`trainer.data.train.path` or `trainer.data.train.hf_name` is required")
    if d["format"] == "mlperf_npy" and not d["train"]["path"]:
        fail("`trainer.data.train.path` must be the MLPerf packed .npy directory when format is mlperf_npy")
    if d["format"] != "mlperf_npy" and not t["tokenizer"]["path"]:
        fail("`trainer.tokenizer.path` is required (a local tokenizer directory or a hub name)")
    if s["eval_interval"] and not (d["validation"]["path"] or d["validation"]["hf_name"]):
        fail("`trainer.schedule.eval_interval` is set but `trainer.data.validation` has no path or hf_name")
    if s["min_lr"] > s["lr"]:
        fail(f"`trainer.schedule.min_lr` ({s['min_lr']}) must not exceed `trainer.schedule.lr` ({s['lr']})")
    if s["warmup_iters"] > s["train_iters"]:
        fail(f"`trainer.schedule.warmup_iters` ({s['warmup_iters']}) exceeds train_iters ({s['train_iters']})")
    if s["lr_decay_iters"] is not None and s["lr_decay_iters"] < s["warmup_iters"]:
        fail(f"`trainer.schedule.lr_decay_iters` ({s['lr_decay_iters']}) is before the end of warmup_iters "
             f"({s['warmup_iters']}): it must be null or >= warmup_iters")
    ckpt, m = t["checkpoint"], t["model"]
    if ckpt["pretrained"] and (m["family"] != "llama" or m["num_moe_experts"] or m["multi_latent_attention"]):
        fail("`trainer.checkpoint.pretrained` imports dense Llama-layout HF checkpoints only (the llama family, not "
             "MoE or multi-latent attention); set it to null (random weights) for this model")
    lg = t["logging"]
    if lg["profile_end"] is not None and (lg["profile_start"] is None or lg["profile_end"] < lg["profile_start"]):
        fail(f"`trainer.logging.profile_end` ({lg['profile_end']}) needs `trainer.logging.profile_start` <= it")
