"""Cross-field rules for the model, parallelism and LoRA targets over a defaulted recipe (one definition: run
by `validate`/`submit` and by the trainer at start)."""
from __future__ import annotations

from primus_contract.errors import fail
from primus_contract.flops import is_adapted, is_moe_layer, layer_linears
from primus_contract.hf_config import norm_topk_prob, rope_scaling_problem
from primus_contract.rules_shapes import linear_dims
from primus_contract.targets import pattern_matches


def model_linear_names(model: dict) -> list[str]:
    """The LoRA-wrappable linears this model builds (megatron-core module names; the one table of them)."""
    return [name for name, _, _ in linear_dims(model, 1)]


def layer_linear_paths(model: dict) -> list[tuple[int, str, str]]:
    """(layer, megatron name within a layer, full megatron name) of every LoRA-wrappable linear of every layer: the
    names the trainer matches target_modules against (primus_contract/targets.py); never a router."""
    return [(layer, suffix, f"decoder.layers.{layer}.{suffix}") for layer in range(int(model["num_layers"]))
            for short, suffix, *_ in layer_linears(model, layer) if short != "router"]


def _adapted(lora: dict, suffix: str, path: str) -> bool:
    return is_adapted(suffix.rsplit(".", 1)[-1], path, lora["target_modules"], lora["exclude_modules"])


def targeted_linears(model: dict, lora: dict) -> list[str]:
    """The names within a layer (model_linear_names' form) of the linears LoRA wraps in at least one layer."""
    hit = {suffix for _, suffix, path in layer_linear_paths(model) if _adapted(lora, suffix, path)}
    return [n for n in model_linear_names(model) if n in hit]


def world_size(cluster: dict) -> int:
    return cluster["nodes"] * nproc_per_node(cluster)


def nproc_per_node(cluster: dict) -> int:
    return cluster["nproc_per_node"] or cluster["gpus_per_node"] or 1


def model_rules(m: dict, t: dict) -> None:
    heads, groups = m["num_attention_heads"], m["num_query_groups"] or m["num_attention_heads"]
    if heads % groups:
        fail(f"`trainer.model.num_query_groups` ({groups}) must divide `num_attention_heads` ({heads})")
    if not m["kv_channels"] and not m["multi_latent_attention"] and m["hidden_size"] % heads:
        fail(f"`trainer.model.hidden_size` ({m['hidden_size']}) must be divisible by num_attention_heads ({heads})"
             " or set kv_channels")
    problem = rope_scaling_problem(m["rope_scaling"], bool(m["multi_latent_attention"]))
    if problem:
        fail(f"`trainer.model.rope_scaling`: {problem}")
    seq = t["data"]["seq_length"]
    if seq > m["max_position_embeddings"]:
        fail(f"`trainer.data.seq_length` ({seq}) exceeds `trainer.model.max_position_embeddings` "
             f"({m['max_position_embeddings']})")
    if m["num_moe_experts"]:
        if not m["moe_router_topk"] or m["moe_router_topk"] > m["num_moe_experts"]:
            fail(f"`trainer.model.moe_router_topk` must be between 1 and num_moe_experts ({m['num_moe_experts']})")
        if m["moe_router_topk"] == 1 and norm_topk_prob(m):  # (audit, 2026-12-06: accepted and overridden)
            fail("`trainer.model.moe_norm_topk_prob` (true, or null on this family) renormalises the top-k routing "
                 "weights: at moe_router_topk 1 the one expert's weight is 1 (Hugging Face), where megatron-core "
                 "weights it by its softmax probability over all experts; set moe_norm_topk_prob: false, or topk > 1")
        if not any(is_moe_layer(m, i) for i in range(m["num_layers"])):
            fail(f"`trainer.model.moe_first_k_dense` ({m['moe_first_k_dense']}) with moe_layer_freq "
                 f"({m['moe_layer_freq']}) leaves no MoE layer of num_layers ({m['num_layers']})")
        if m["family"] == "deepseek" and m["moe_layer_freq"] != 1:  # (hf_config.to_hf_config could not export it)
            fail("`trainer.model.moe_layer_freq` must be 1 for family deepseek: DeepSeek-V2 in transformers makes "
                 "every layer after the first moe_first_k_dense MoE")
    else:
        for key, default in (("moe_first_k_dense", 0), ("moe_layer_freq", 1)):
            if m[key] != default:
                fail(f"`trainer.model.{key}` is set but the model has no experts (num_moe_experts is null); "
                     "remove it")
    if m["multi_latent_attention"]:
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if not m[key]:
                fail(f"`trainer.model.{key}` is required with `trainer.model.multi_latent_attention: true`")
        # MLA's own shapes replace these (trainer/model/arch.py mla_kwargs): a value other than MLA's is ignored
        if m["num_query_groups"] not in (None, m["num_attention_heads"]):
            fail(f"`trainer.model.num_query_groups` is {m['num_query_groups']}, but multi-latent attention has no "
                 f"key/value groups; remove it (or set it to num_attention_heads, {m['num_attention_heads']})")
        if m["kv_channels"] is not None:
            fail("`trainer.model.kv_channels` is set, but multi-latent attention takes its head sizes from "
                 "qk_head_dim, qk_pos_emb_head_dim and v_head_dim; remove it")


def parallel_rules(t: dict, c: dict) -> None:
    if t["distributed"]["device"] == "cpu" and t["distributed"]["backend"] == "nccl":
        fail("`trainer.distributed.backend` nccl needs GPUs, and `trainer.distributed.device` is cpu; use gloo "
             "(or auto)")
    if t["distributed"]["device"] != "cpu" and c["gpus_per_node"] and nproc_per_node(c) > c["gpus_per_node"]:
        fail(f"`cluster.nproc_per_node` ({nproc_per_node(c)}) exceeds `cluster.gpus_per_node` ({c['gpus_per_node']}): "
             "one rank a GPU (two ranks on one GPU fail in NCCL/RCCL)")
    par, m = t["parallelism"], t["model"]
    tp, pp, cp, ep = par["tensor"], par["pipeline"], par["context"], par["expert"]
    world = world_size(c)
    lg = t["logging"]
    outside = [r for r in lg["profile_ranks"] if not 0 <= r < world]
    if lg["profile_start"] is not None and outside:  # (they profiled nothing and said nothing)
        fail(f"`trainer.logging.profile_ranks` names rank {outside[0]}, and the job has ranks 0-{world - 1} "
             f"({c['nodes']} node(s) x {nproc_per_node(c)})")
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
        tp_comm_overlap_rules(par, t["precision"], t["distributed"])
    s = t["schedule"]
    if s["global_batch_size"] % (s["micro_batch_size"] * dp):
        fail(f"`trainer.schedule.global_batch_size` ({s['global_batch_size']}) must be divisible by "
             f"micro_batch_size × data-parallel size = {s['micro_batch_size']} × {dp}")


def tp_comm_overlap_rules(par: dict, prec: dict, dist: dict) -> None:
    """What TE userbuffers cannot carry (trainer/model/tp_overlap.py runs it again, after checking GPU and TE)."""
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


def lora_rules(lora: dict, model: dict, pipeline: int = 1) -> None:
    if not lora["enabled"]:  # (the base is frozen: the trainer stopped at its optimizer, in the queue, a traceback)
        fail("`trainer.lora.enabled` is false, but this trainer fine-tunes LoRA adapters on a frozen base: nothing "
             "would train; set it to true (`primus-slurm generate RUN --base-only` answers from a run's base alone)")
    linears = layer_linear_paths(model)
    paths = [path for _, _, path in linears]
    for field in ("target_modules", "exclude_modules"):
        for i, pattern in enumerate(lora[field]):
            if not pattern_matches(pattern, paths):
                names = dict.fromkeys(n.rsplit('.', 1)[-1] for n in model_linear_names(model))
                fail(f"`trainer.lora.{field}[{i}]` ({pattern!r:.60}) matches no linear layer of this model; "
                     f"available: {', '.join(names)} (or a dotted tail of decoder.layers.<i>.<module>.<name>)")
    if not lora["target_modules"]:
        fail("`trainer.lora.target_modules` is empty; name at least one linear layer (e.g. linear_qkv)")
    per = int(model["num_layers"]) // max(pipeline, 1)
    adapted_layers = {layer for layer, suffix, path in linears if _adapted(lora, suffix, path)}
    for stage in range(pipeline if per else 0):  # each stage trains its own adapters: none would leave it idle
        first, last = stage * per, (stage + 1) * per - 1
        if not adapted_layers & set(range(first, last + 1)):
            fail(f"`trainer.lora.target_modules` adapts no linear of pipeline stage {stage} (layers {first}-{last} "
                 f"of `trainer.parallelism.pipeline` {pipeline}): that stage would have nothing to train; name "
                 "linears in every stage, or lower pipeline")


# trainer/model/lora/base_gemm.py TeFp8Gemm: the module's per-tensor FP8 quantizers (DelayedScaling, Float8CurrentScaling)
FP8_EPILOGUE_RECIPES = ("delayed", "tensorwise")


def epilogue_rules(t: dict) -> None:
    """trainer.lora.epilogue owns the frozen base GEMM in 16/32-bit at TP 1 (trainer/model/lora/epilogue.py): refused
    where no linear could take it, never accepted and ignored."""
    lora, prec = t["lora"], t["precision"]
    if not lora["epilogue"]:
        return
    if prec["fp4"]:
        fail("`trainer.lora.epilogue` owns each base GEMM in 16/32-bit or per-tensor FP8, and `trainer.precision.fp4` "
             "runs them in FP4 (an epilogue there is not built); set epilogue: false (trainer.lora.fused keeps TE's "
             "GEMMs)")
    if prec["fp8"] and prec["fp8_recipe"] not in FP8_EPILOGUE_RECIPES:
        fail("`trainer.lora.epilogue` with `trainer.precision.fp8` runs the base GEMMs through Transformer Engine's "
             "functional linear with per-tensor scaling (fp8_recipe delayed or tensorwise); fp8_recipe "
             f"{prec['fp8_recipe']} is not built there: set epilogue: false, or fp8_recipe: delayed")
    if t["parallelism"]["tensor"] > 1:
        fail("`trainer.lora.epilogue` runs at `trainer.parallelism.tensor` 1 only (the node would own the TP "
             f"collectives of the base too); tensor is {t['parallelism']['tensor']}: set epilogue: false")
    if lora["dropout"] and lora["dropout_position"] == "post":
        fail("`trainer.lora.epilogue` fuses pre-dropout into A; `trainer.lora.dropout_position` post applies the "
             "mask to the adapter's output, which the base GEMM adds into: set dropout_position: pre or epilogue: false")
    names = targeted_linears(t["model"], lora)
    if names and all(".experts." in f".{n}" for n in names):
        fail("`trainer.lora.epilogue` takes no expert linear (they keep their grouped path), and "
             "`trainer.lora.target_modules` names only experts: set epilogue: false")
