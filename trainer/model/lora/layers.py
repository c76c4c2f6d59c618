"""LoRA as a model transform over megatron-core / TE parallel linears.

    apply_lora(model, cfg.trainer.lora, tp_size, sequence_parallel, seed)

freezes every base parameter and replaces each target linear (a pattern matches any dotted tail of the
module's global name, primus_contract/targets.py; exclusions win) with `LoRALinear(base)`:

    y = base(x) + scale * B(A(drop(x))),     scale = alpha / dim

Tensor-parallel layout (tp > 1), consistent with the base linear's own sharding:

* column-parallel base (linear_qkv, linear_fc1; W is [out/tp, in]): A [r, in] replicated,
  B [out/tp, r] column-sharded. The small activation h = x A^T goes through
  copy-to-TP (identity fwd, all-reduce of dL/dh bwd), or with sequence parallelism the
  sequence-sharded h is all-gathered (bwd reduce-scatter).
* row-parallel base (linear_proj, linear_fc2; W is [out, in/tp]): A [r, in/tp] row-sharded,
  B [out, r] replicated; the partial h = x_local A_local^T is all-reduced across TP (or
  reduce-scattered to the sequence shard with sequence parallelism) before B.

TE's grouped expert linears (TEGroupedMLP) get one adapter per expert (trainer.model.lora.grouped).
MoE expert linears (megatron `is_expert`) are not tensor-parallel: their adapters are whole and marked
`allreduce = False` (grads reduced over the expert data-parallel group, see trainer.optim).

Replicated adapter weights whose gradient comes from a sequence shard (A of a column base and B of
a row base, under sequence parallelism) carry `sequence_parallel=True`, the attribute megatron uses
for layer-norm weights; `allreduce_sequence_parallel_grads(model)` sums them across TP.

TE's LayerNormColumnParallelLinear fuses the input norm: the wrapper switches on its
`return_layernorm_output` so the adapter sees the normed input, exactly like the base GEMM.
"""
from __future__ import annotations

import math
import zlib
from typing import Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from primus_contract.targets import targeted
from trainer.model.lora.grouped import GroupedLoRALinear, dropout_per_tp_rank, is_grouped_linear
from trainer.model.adapter_grads import adapter_a
from trainer.model.lora.base_gemm import base_gemm
from trainer.model.lora.drop import draw
from trainer.model.lora.epilogue import epilogue_adapter, owns_base_gemm
from trainer.model.lora.fused import fused_adapter
from trainer.model.lora.kernels import kernels_usable
from trainer.model.lora.norm_epilogue import norm_epilogue, norm_parts, owns_norm

COLUMN, ROW = "column", "row"
_ROW_NAMES = ("linear_proj", "linear_fc2")


def _parallel_mode(module: nn.Module, leaf_name: str) -> str:
    """'row' for row-parallel linears, else 'column' (TE keeps parallel_mode on the module)."""
    mode = getattr(module, "parallel_mode", None)
    if mode in (COLUMN, ROW):
        return mode
    cls = type(module).__name__
    if "RowParallel" in cls:
        return ROW
    if "ColumnParallel" in cls:
        return COLUMN
    return ROW if leaf_name in _ROW_NAMES else COLUMN


def _duplicated(module: nn.Module) -> bool:
    """A linear whose whole weight every TP rank holds (MLA's down projections). megatron's TELinear built with
    parallel_mode "duplicated" hands TE parallel_mode None (megatron/core/extensions/transformer_engine.py, 0.16 and
    0.19), so TE's module holds None, never "duplicated" (audit, 2026-12-06: the adapter took them for column shards
    on the GPU). An expert's TE linear also holds None (explicit expert communication); experts are handled apart.
    megatron's own linears have no parallel_mode: the local spec column-splits these projections."""
    if getattr(module, "is_expert", False):
        return False
    mode = getattr(module, "parallel_mode", COLUMN)
    return mode == "duplicated" or (mode is None and hasattr(module, "tp_size"))  # (TE's Linear keeps both)


def _uses_fused_layernorm(module: nn.Module) -> bool:
    return hasattr(module, "return_layernorm_output") and hasattr(module, "layer_norm_weight")


def _seeded_init(shape, kind: str, seed: int) -> torch.Tensor:
    """Full-size init from a private generator: identical for any TP layout and every rank."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.empty(shape, dtype=torch.float32)
    if kind == "xavier":
        std = math.sqrt(2.0 / (shape[0] + shape[1]))
        return t.normal_(0.0, std, generator=gen)
    if kind == "kaiming":  # kaiming_uniform_(a=sqrt(5)) as nn.Linear does
        bound = 1.0 / math.sqrt(shape[1])
        return t.uniform_(-bound, bound, generator=gen)
    if kind == "zero":
        return t.zero_()
    raise ValueError(f"unknown LoRA init {kind!r} (xavier|kaiming|zero)")


class LoRALinear(nn.Module):
    """A frozen megatron/TE parallel linear plus a TP-sharded low-rank adapter."""

    def __init__(self, base: nn.Module, leaf_name: str, dim: int, alpha: float, dropout: float,
                 dropout_position: str, a_init: str, b_init: str, tp_size: int, tp_rank: int,
                 sequence_parallel: bool, seed: int, fused: bool = False, epilogue: bool = False,
                 triton_products: bool = False, epilogue_norm: bool = False, dropout_recompute: bool = False,
                 norm_recompute: bool = False):
        super().__init__()
        if dropout_position not in ("pre", "post"):
            raise ValueError(f"lora.dropout_position must be pre|post, got {dropout_position!r}")
        self.base = base
        self.mode = _parallel_mode(base, leaf_name)
        self.fused_norm = _uses_fused_layernorm(base)
        if self.fused_norm:
            base.return_layernorm_output = True
            if hasattr(base, "return_layernorm_output_gathered"):
                base.return_layernorm_output_gathered = False
        # MoE experts are never tensor-parallel (trainer.model.arch: expert_tensor_parallel_size 1);
        # TE's "duplicated" linears (MLA's down projections) hold the whole weight on every TP rank
        self.is_expert = bool(getattr(base, "is_expert", False))
        self.duplicated = _duplicated(base)
        whole = self.is_expert or self.duplicated
        # a duplicated linear under SP sees its rank's sequence shard: both factors' grads sum over TP
        shard_fed = whole and not self.is_expert and sequence_parallel and tp_size > 1
        # a whole linear under SP sees this TP rank's own tokens (its sequence shard, or the tokens it routed)
        self.tokens_per_rank = whole and sequence_parallel and tp_size > 1
        if whole:
            tp_size, tp_rank, sequence_parallel = 1, 0, False
        self.tp_size = tp_size
        self.sequence_parallel = sequence_parallel and tp_size > 1
        self.scale = float(alpha) / float(dim)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.dropout_position = dropout_position
        # set by trainer.model.lora.inputs: x = input_act(pending_act_input), kept instead of x
        self.input_act = None
        self.pending_act_input = None
        self.adapter_norm = None  # set by trainer.model.lora.inputs: the adapter norms x itself
        self.swiglu_folded = False  # set by trainer.model.lora.swiglu: its MLP calls forward_parts, never forward
        self.fused = bool(fused)  # trainer.lora.fused: trainer.model.lora.fused where the layout allows
        self.epilogue = bool(epilogue)  # trainer.lora.epilogue: trainer.model.lora.epilogue where it owns the GEMM
        # trainer.lora.epilogue_norm true or null (auto): trainer.model.lora.norm_epilogue wherever this linear's
        # epilogue is on and its structure lets it (uses_norm_epilogue); the contract resolves null alike
        # (primus_contract.rules_precision.epilogue_norm_on)
        self.epilogue_norm = bool(epilogue_norm)
        self.triton_products = bool(triton_products)  # trainer.lora.triton_products: unmasked products in Triton
        # trainer.lora.dropout_recompute: the fused and epilogue nodes keep x and the pre-dropout mask's bits
        self.dropout_recompute = bool(dropout_recompute)
        self.norm_recompute = bool(norm_recompute)  # trainer.recompute.norm_output: the norm epilogue keeps its input
        # set by trainer.model.transforms (trainer.lora.epilogue on in an FP8 run): the epilogue runs the base's
        # GEMMs in FP8 through TE's functional linear (trainer.model.lora.base_gemm)
        self.fp8_epilogue = False

        weight = base.weight
        out_local, in_local = weight.shape[0], weight.shape[1]
        device = weight.device
        if self.mode == COLUMN:
            a_full = _seeded_init((dim, in_local), a_init, seed)
            b_full = _seeded_init((out_local * tp_size, dim), b_init, seed + 1)
            a = a_full
            b = b_full[tp_rank * out_local:(tp_rank + 1) * out_local]
        else:
            a_full = _seeded_init((dim, in_local * tp_size), a_init, seed)
            b_full = _seeded_init((out_local, dim), b_init, seed + 1)
            a = a_full[:, tp_rank * in_local:(tp_rank + 1) * in_local]
            b = b_full
        # fp32 master weights (the optimizer updates these); the GEMMs run in the activation dtype.
        self.lora_a = nn.Parameter(a.to(device=device, dtype=torch.float32).contiguous())
        self.lora_b = nn.Parameter(b.to(device=device, dtype=torch.float32).contiguous())
        # Megatron's tensor-parallel attributes: which dim is sharded (checkpointing, grad norm).
        sharded, replicated = (self.lora_b, self.lora_a) if self.mode == COLUMN else (self.lora_a, self.lora_b)
        # (marked also at TP=1, as megatron marks its parallel linears; expert adapters are whole)
        sharded.tensor_model_parallel = not whole
        sharded.partition_dim = 0 if self.mode == COLUMN else 1
        sharded.partition_stride = 1
        replicated.tensor_model_parallel = False
        # The replicated factor sees only this rank's sequence shard under SP.
        replicated.sequence_parallel = self.sequence_parallel
        sharded.sequence_parallel = shard_fed
        replicated.sequence_parallel |= shard_fed
        # Expert adapters: `allreduce = False` (megatron's mark for expert-parallel weights): their
        # grads are summed over the expert data-parallel group, not the data-parallel group
        # (trainer.optim). With experts not tensor-parallel, that group also holds the TP peers,
        # which route different tokens (their sequence shards) to the same experts.
        for p in (self.lora_a, self.lora_b):
            p.allreduce = not self.is_expert

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["base"], name)

    # -- adapter path -------------------------------------------------------------------------
    def _drop(self, t: torch.Tensor, sharded: bool) -> torch.Tensor:
        """Dropout of a tensor that is `sharded` across TP ranks (or holds this rank's own tokens) with a mask of
        this rank's own (trainer.model.lora.grouped.dropout_per_tp_rank)."""
        return dropout_per_tp_rank(self.dropout, t, self._per_rank(sharded))

    def _per_rank(self, sharded: bool) -> bool:
        return self.tokens_per_rank or (sharded and self.tp_size > 1)

    def _adapter_h(self, x: torch.Tensor, act_input: Optional[torch.Tensor] = None) -> torch.Tensor:
        """h = A(drop(x)), rank-sized, laid out like the base output (TP/SP collectives applied)."""
        if self.dropout is not None and self.dropout_position == "pre":
            x = self._drop(x, sharded=self.mode == ROW or self.sequence_parallel)
        a = self.lora_a.to(x.dtype)
        if self.adapter_norm is not None:  # x is the norm's input (trainer.model.lora.inputs)
            h = self.adapter_norm(x, a)
        else:
            h = adapter_a(x, a, act_input, self.input_act)
        return self._collective(h) if self.tp_size > 1 else h

    def _collective(self, h: torch.Tensor) -> torch.Tensor:
        """The TP/SP mapping of the rank-sized h between A and B, laid out like the base output."""
        from megatron.core.tensor_parallel import mappings as tpm

        if self.mode == COLUMN:
            return (tpm.gather_from_sequence_parallel_region(h, tensor_parallel_output_grad=True)
                    if self.sequence_parallel else tpm.copy_to_tensor_model_parallel_region(h))
        return (tpm.reduce_scatter_to_sequence_parallel_region(h)
                if self.sequence_parallel else tpm.reduce_from_tensor_model_parallel_region(h))

    def _base_and_h(self, x: torch.Tensor, args=(), kwargs=None):
        """(base output, bias, h): the frozen base's result and the adapter's rank-sized h (unfused A path)."""
        result = self.base(x, *args, **(kwargs or {}))
        if self.fused_norm and self.adapter_norm is None:
            if len(result) == 3:  # TE with return_bias: (out, bias, ln_out)
                out, bias, adapter_in = result
            else:  # megatron wrapper: ((out, ln_out), None)
                (out, adapter_in), bias = result
        else:
            out, bias = result
            adapter_in = x
        return out, bias, self._adapter_h(adapter_in, self._take_act_input(x)).to(out.dtype)

    def forward_parts(self, x: torch.Tensor):
        """(base output, h) without B's product, for a consumer that applies B itself (trainer.model.lora.swiglu:
        fc1 of a dense MLP without a bias)."""
        if self.uses_norm_epilogue():
            return norm_parts(self, x, self._p(), self._kernels(x))
        out, _, h = self._base_and_h(x)
        return out, h

    def _take_act_input(self, x: torch.Tensor):
        """The pending pre-activation u of x = act(u) (trainer.model.lora.inputs), if it matches x; used once."""
        u, self.pending_act_input = self.pending_act_input, None
        if u is not None and (u.shape[:-1] != x.shape[:-1] or u.shape[-1] != 2 * x.shape[-1]):
            return None
        return u

    def _reads_own_input(self) -> bool:
        """The adapter reads the base's own input x (no norm output, no folded norm), no post-dropout."""
        return (not self.fused_norm and self.adapter_norm is None and not self.swiglu_folded
                and (self.dropout is None or self.dropout_position == "pre"))

    def uses_fused_path(self) -> bool:
        """trainer.model.lora.fused applies: the adapter reads the base's own input (pre-dropout fused into A)."""
        return self.fused and self._reads_own_input()

    def uses_epilogue(self) -> bool:
        """trainer.model.lora.epilogue applies: it can own the base GEMM (TP 1, a plain 16/32-bit weight, no bias;
        not an expert or duplicated linear) and the adapter reads the base's own input."""
        return self._epilogue_layout() and self._reads_own_input() and owns_base_gemm(self.base, self.fp8_epilogue)

    def uses_norm_epilogue(self) -> bool:
        """trainer.model.lora.norm_epilogue applies: the epilogue's layout, on a norm-fused linear whose adapter
        reads the norm output (no folded norm, no post-dropout) and whose norm torch can run."""
        return (self.epilogue_norm and self._epilogue_layout() and self.fused_norm and self.adapter_norm is None
                and (self.dropout is None or self.dropout_position == "pre")
                and owns_norm(self.base, self.fp8_epilogue))

    def _epilogue_layout(self) -> bool:
        """trainer.lora.epilogue on, and a layout its node can own: TP 1, not an expert or duplicated linear."""
        return self.epilogue and self.tp_size == 1 and not self.is_expert and not self.duplicated

    def _kernels(self, x: torch.Tensor) -> bool:
        """The rank-r Triton passes run on x's device (the masked ones always there; the unmasked ones with
        trainer.lora.triton_products)."""
        return kernels_usable(x.device, self.lora_a.shape[0], x.dtype)

    def _p(self) -> float:
        """The pre-dropout probability in effect (0 without dropout, or in eval mode)."""
        return float(self.dropout.p) if self.dropout is not None and self.dropout.training else 0.0

    def forward(self, x: torch.Tensor, *args, **kwargs):
        if self.uses_norm_epilogue() and not args and not kwargs:
            return norm_epilogue(self, x, self._p(), self._kernels(x)), None
        if self.uses_epilogue() and not args and not kwargs:
            u = self._take_act_input(x)
            with base_gemm(self.base, x, self.fp8_epilogue) as (x, gemm):
                y = epilogue_adapter(gemm, x, self.lora_a, self.lora_b, self.scale, self._p(), u=u,
                                     act=self.input_act if u is not None else None, kernels=self._kernels(x),
                                     products=self.triton_products, recompute_drop=self.dropout_recompute)
            return y, None
        if self.uses_fused_path():
            u, p = self._take_act_input(x), self._p()
            per_rank = self._per_rank(self.mode == ROW or self.sequence_parallel)  # as _adapter_h's pre-dropout
            drop = (lambda t: dropout_per_tp_rank(lambda z: draw(z, p), t, per_rank)) if p else None
            return fused_adapter(self.base, x, self.lora_a, self.lora_b, self.scale, args, kwargs,
                                 u=u, act=self.input_act if u is not None else None,
                                 collective=self._collective if self.tp_size > 1 else None, drop=drop, p=p,
                                 kernels=self._kernels(x), products=self.triton_products,
                                 recompute_drop=self.dropout_recompute)
        # (the masked dh A in one pass: its Triton kernel matched the torch ops on an H200 at the 8B's widths,
        # bench/kernel_check.py, 2026-12-05)
        out, bias, h = self._base_and_h(x, args, kwargs)
        b = self.lora_b.to(out.dtype)
        if self.dropout is not None and self.dropout_position == "post":
            delta = F.linear(h * self.scale, b)
            return out + self._drop(delta, sharded=self.mode == COLUMN or self.sequence_parallel), bias
        # out + scale * h B^T in one GEMM (out is the epilogue's addend): no separate adapter output
        # to write and read back, and the scale lands on the rank-sized gradient in backward
        y = torch.addmm(out.reshape(-1, out.shape[-1]), h.reshape(-1, h.shape[-1]), b.t(), alpha=self.scale)
        return y.view(out.shape), bias


def lora_targets(model: nn.Module, target_modules, exclude_modules) -> list[str]:
    """Dotted names of the linear modules LoRA wraps (parallel linears with a 2-D weight, TE grouped
    expert linears; never a MoE router, an embedding or the LM head;
    names matched as primus_contract/targets.py says, on the global layer index: a pipeline stage numbers its
    layers from 0, and `layers.3.*` means the model's fourth layer on any layout)."""
    from trainer.model.layout import namer

    global_name = namer(model)
    out = []
    for name, module in model.named_modules():
        if isinstance(module, (LoRALinear, GroupedLoRALinear)):
            raise ValueError("LoRA is already applied to this model")
        weight = getattr(module, "weight", None)
        if isinstance(getattr(module, "num_gemms", None), int) and not is_grouped_linear(module):
            if targeted((global_name(name),), target_modules):
                raise NotImplementedError(f"LoRA on {name}: grouped linear without per-expert weights "
                                          "(moe_single_grouped_weight) is not supported")
            continue
        if (not isinstance(weight, torch.Tensor) or weight.dim() != 2) and not is_grouped_linear(module):
            continue
        if any(k in type(module).__name__ for k in ("Router", "Embedding")):  # never: routers stay
            continue  # frozen whatever the patterns say; embeddings are lookups, not linears
        if name.rsplit(".", 1)[-1] == "output_layer":  # never the LM head either: the contract's table of
            continue  # targets has none (a `*` pattern once wrapped it, and the chunked loss then stood down)
        if targeted((global_name(name),), target_modules, exclude_modules):
            out.append(name)
    return out


def apply_lora(model: nn.Module, lcfg, tp_size: int = 1, tp_rank: int = 0,
               sequence_parallel: bool = False, seed: int = 0, norm_recompute: bool = False) -> list[str]:
    """Freeze the base and wrap the target linears; returns the wrapped module names. norm_recompute:
    trainer.recompute.norm_output."""
    for p in model.parameters():
        p.requires_grad_(False)
    if not lcfg.enabled:
        return []
    names = lora_targets(model, tuple(lcfg.target_modules), tuple(lcfg.exclude_modules or ()))
    if not names:
        raise ValueError(f"lora.target_modules {list(lcfg.target_modules)} matched no linear layer")
    from trainer.model.layout import namer

    global_name = namer(model)  # seeds follow the global layer/expert, so any PP/EP layout inits alike
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, leaf)
        if is_grouped_linear(base):
            setattr(parent, leaf, _grouped(base, name, lcfg, seed, global_name, sequence_parallel and tp_size > 1))
            continue
        wrapped = LoRALinear(
            base, leaf, dim=int(lcfg.dim), alpha=float(lcfg.alpha), dropout=float(lcfg.dropout or 0.0),
            dropout_position=lcfg.dropout_position, a_init=lcfg.a_init, b_init=lcfg.b_init,
            tp_size=tp_size, tp_rank=tp_rank, sequence_parallel=sequence_parallel,
            seed=_seed(seed, global_name(name)), fused=bool(getattr(lcfg, "fused", False)),
            epilogue=bool(getattr(lcfg, "epilogue", False)),
            epilogue_norm=getattr(lcfg, "epilogue_norm", False) is not False,
            triton_products=bool(getattr(lcfg, "triton_products", False)),
            dropout_recompute=bool(getattr(lcfg, "dropout_recompute", False)), norm_recompute=norm_recompute)
        setattr(parent, leaf, wrapped)
    return names


def _seed(seed: int, global_name: str) -> int:
    return seed * 1_000_003 + zlib.crc32(global_name.encode())


def _grouped(base, name: str, lcfg, seed: int, global_name, tokens_per_rank: bool = False) -> GroupedLoRALinear:
    """GroupedLoRALinear with each local expert's factors seeded by its global name."""
    dim = int(lcfg.dim)
    out, inp = base.weight0.shape
    pairs = []
    for e in range(base.num_gemms):
        s = _seed(seed, global_name(f"{name}.lora.{e}"))
        pairs.append((_seeded_init((dim, inp), lcfg.a_init, s), _seeded_init((out, dim), lcfg.b_init, s + 1)))
    return GroupedLoRALinear(base, dim, float(lcfg.alpha), float(lcfg.dropout or 0.0), lcfg.dropout_position, pairs,
                             tokens_per_rank=tokens_per_rank)


def lora_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, (LoRALinear, GroupedLoRALinear))}
