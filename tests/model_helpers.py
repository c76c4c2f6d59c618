"""Shared helpers for the model/LoRA/HF/TP tests: a tiny resolved-recipe Config."""
from __future__ import annotations

from primus_slurm.config.recipe import deep_merge
from primus_slurm.config.schema import apply_schema
from trainer.config import Config

# Only what differs from the schema's defaults (primus_slurm/config/schema.py is the one source of defaults).
TINY = {
    "experiment": {"name": "t"},
    "trainer": {
        "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 160, "num_attention_heads": 4,
                  "num_query_groups": 2, "vocab_size": 128, "max_position_embeddings": 256},
        "precision": {"bf16": False},
        "lora": {"dim": 4, "alpha": 8},
        "distributed": {"device": "cpu", "timeout_minutes": 5},
    },
}


def tiny_cfg(**overrides) -> Config:
    """Tiny model recipe; overrides are nested dicts, e.g. tiny_cfg(trainer={"lora": {"dim": 8}})."""
    return Config.from_dict(apply_schema(deep_merge(TINY, overrides)))


# ---------------------------------------------------------------------------------------------
import contextlib
import os
import random
import socket
import subprocess
import sys

import torch


@contextlib.contextmanager
def dist_session(cfg):
    """init_distributed/destroy_distributed around a block (single process unless RANK is set)."""
    from trainer.runtime.distributed import destroy_distributed, init_distributed

    preset = "RANK" in os.environ
    info = init_distributed(cfg)
    try:
        yield info
    finally:
        destroy_distributed()
        if not preset:  # init_distributed filled a one-rank env; don't leak it into later tests
            for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
                os.environ.pop(key, None)


def packed_batch(rows: int, seq: int, doc_lens: list[int], vocab: int, seed: int = 0,
                 row_documents: bool = False) -> dict:
    """A collate-shaped packed batch: documents of `doc_lens` laid out over rows*seq tokens
    (any remainder is padding with label -100 and loss_mask 0); row_documents: with collate's count of the most
    documents a row holds (an 'auto' model runs such a batch sbhd when it is 1)."""
    g = torch.Generator().manual_seed(seed)
    total = rows * seq
    assert sum(doc_lens) <= total
    tokens = torch.randint(0, vocab, (total,), generator=g)
    labels = torch.full((total,), -100, dtype=torch.long)
    loss_mask = torch.zeros(total)
    position_ids = torch.zeros(total, dtype=torch.long)
    cu = [0]
    for n in doc_lens:
        s = cu[-1]
        labels[s:s + n - 1] = tokens[s + 1:s + n]
        loss_mask[s:s + n - 1] = 1.0
        position_ids[s:s + n] = torch.arange(n)
        cu.append(s + n)
    batch = {
        "tokens": tokens.view(rows, seq), "labels": labels.view(rows, seq),
        "loss_mask": loss_mask.view(rows, seq), "position_ids": position_ids.view(rows, seq),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32), "max_seqlen": max(doc_lens),
    }
    if row_documents:  # documents overlapping each row [r*seq, (r+1)*seq)
        batch["row_documents"] = max(sum(1 for a, b in zip(cu, cu[1:]) if a < (r + 1) * seq and b > r * seq)
                                     for r in range(rows))
    return batch


def perturb_adapters(model, seed: int = 0, std: float = 0.05) -> None:
    """Give every LoRA factor random values (B starts at zero, which would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith((".lora_a", ".lora_b")):
                p.copy_(torch.randn(p.shape, generator=g) * std)


def models_with_same_adapters(configs, seed: int):
    """For each config: (its distributed session info, a built model) whose LoRA factors all equal the
    first model's randomly perturbed ones (yielded inside that model's dist_session)."""
    from trainer.model import adapter_state_dict, build_model, load_adapter_state_dict

    sd = None
    for cfg in configs:
        with dist_session(cfg) as info:
            model = build_model(cfg, info.device)
            if sd is None:
                perturb_adapters(model, seed=seed)
                sd = {k: v.clone() for k, v in adapter_state_dict(model).items()}
            load_adapter_state_dict(model, sd)
            yield info, model


def train_losses(cfg, iters: int, seed: int, check_model=None, rows: int = 2, seq: int = 32,
                 doc_lens: tuple = (30, 9, 21), row_documents: bool = False) -> list[float]:
    """Per-iteration losses of `iters` AdamW steps (lr 1e-2) of the model `cfg` builds, with randomly perturbed
    adapters (seed), alternating two fixed packed batches of rows x seq tokens holding doc_lens (memorised: the loss
    falls; one document a row for a packing-false model; a tuple of such tuples: batch i holds the (i mod n)-th, e.g.
    one-document rows and packed ones in turn); check_model(model) runs once before training."""
    from trainer.model import forward_losses

    losses = []
    for _, model in models_with_same_adapters([cfg], seed=seed):
        if check_model is not None:
            check_model(model)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for it in range(iters):
            lens = doc_lens[it % len(doc_lens)] if isinstance(doc_lens[0], tuple) else doc_lens
            batch = packed_batch(rows, seq, list(lens), vocab=128, seed=it % 2, row_documents=row_documents)
            per_token = forward_losses(model, batch)
            mask = batch["loss_mask"].to(per_token.device)
            loss = (per_token * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def free_port() -> int:
    """A free TCP port for a rendezvous, picked BELOW the kernel's ephemeral range: a port the kernel hands
    out itself (bind to 0) can be taken by one of gloo's own outgoing connections before the rendezvous
    binds it (EADDRINUSE, seen in CI); ports below that range are never assigned to outgoing sockets."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(os.urandom(8))
    for _ in range(1000):
        port = rng.randrange(max(1024, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port below the ephemeral range")


# Tiny MoE / MLA architectures (model-section overrides for tiny_cfg / parallel_helpers.layout_cfg).
QWEN3_MOE = {"family": "qwen3", "qk_layernorm": True, "kv_channels": 16, "num_moe_experts": 4,
             "moe_router_topk": 2, "moe_ffn_hidden_size": 32}
DEEPSEEK_MLA = {"family": "deepseek", "num_query_groups": None, "multi_latent_attention": True,
                "kv_lora_rank": 16, "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16,
                "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
                "moe_shared_expert_intermediate_size": 64, "moe_first_k_dense": 1}
MLA_TARGETS = ["linear_q_proj", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj", "linear_fc1", "linear_fc2"]


def arch_sections(arch: dict) -> dict:
    """trainer sections for a tiny MoE/MLA model: the model overrides and, for MLA, its LoRA targets."""
    out = {"model": dict(arch)}
    if arch.get("multi_latent_attention"):
        out["lora"] = {"target_modules": MLA_TARGETS}  # merged over the tiny defaults
    return out


def trained_export(cfg, tokens, adapter_dir, seed: int = 6, std: float = 0.2):
    """Build the model of `cfg` (its pretrained import included), give its adapters random values, export them
    in PEFT format to adapter_dir (trainer.model.export_peft); returns the model's logits on `tokens`."""
    from trainer.model import build_model, export_peft

    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        perturb_adapters(model, seed=seed, std=std)
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=tokens, position_ids=None, attention_mask=None)
        export_peft(model, cfg, adapter_dir)
    return logits


class FrozenLinear(torch.nn.Module):
    """A frozen bias-free linear returning (out, bias) as megatron's parallel linears do (the LoRA path tests' base)."""

    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(w, requires_grad=False)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight), None


def adapter_census(recipe: dict, targets, rows: int, seq: int) -> list[tuple[str, int, int]]:
    """(target, last dim, bytes) of each per-token storage (leading dims = rows*seq tokens) autograd keeps in a module
    named by `targets`, over one forward + backward of a packed batch of the real model built from `recipe`
    (trainer.observability.saved_census: once per storage; A/B's own casts have no token dimension)."""
    import math
    import re

    from trainer.model import build_model, forward_losses
    from trainer.observability.saved_census import SavedTensorCensus

    cfg = Config.from_dict(recipe)
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        batch = packed_batch(rows, seq, [30, 9, 21, 17], vocab=128, seed=0)
        census = SavedTensorCensus(model, info.device)
        census.start()
        (forward_losses(model, batch) * batch["loss_mask"]).sum().backward()
        census.close()
    kept = []
    for where, nbytes, desc in census.storages.values():
        shape = [int(d) for d in re.findall(r"\d+", desc.split("[", 1)[1])]
        leaf = where.rsplit(".", 1)[-1]
        if leaf in targets and math.prod(shape[:-1]) == rows * seq:
            kept.append((leaf, shape[-1], nbytes))
    return kept


def interpreted(*args: str, timeout: float = 600):
    """`python ARGS` from the repository root under Triton's CPU interpreter (TRITON_INTERPRET=1): the kernels'
    CPU tests, in a process of their own (the variable is read when Triton is imported)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, *args], cwd=root, env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=timeout)


class FusedNormLinear(torch.nn.Module):
    """CPU stand-in for TE's LayerNormLinear: the same attributes (layer_norm_weight, normalization, eps,
    zero_centered_gamma, return_layernorm_output) and return convention ((out, bias, ln_out) when
    return_layernorm_output, else (out, bias)); frozen like a LoRA base. RMSNorm, or LayerNorm with a norm bias."""

    def __init__(self, hidden: int, out: int, seed: int, normalization: str = "RMSNorm"):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(out, hidden, generator=g) * 0.1, requires_grad=False)
        self.layer_norm_weight = torch.nn.Parameter(torch.rand(hidden, generator=g) + 0.5, requires_grad=False)
        if normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.randn(hidden, generator=g) * 0.1, requires_grad=False)
        self.eps, self.normalization, self.zero_centered_gamma = 1e-5, normalization, False
        self.return_layernorm_output, self.parallel_mode = False, "column"

    def forward(self, x):
        import torch.nn.functional as F

        if self.normalization == "RMSNorm":
            ln = F.rms_norm(x, (x.shape[-1],), self.layer_norm_weight, self.eps)
        else:
            ln = F.layer_norm(x, (x.shape[-1],), self.layer_norm_weight, self.layer_norm_bias, self.eps)
        out = F.linear(ln, self.weight)
        return (out, None, ln) if self.return_layernorm_output else (out, None)


def epilogue_branches(device: str, tokens: int, hidden: int, out: int, p: float, kernels: bool = False):
    """trainer.model.lora.epilogue's node on BF16 inputs, with grad and without (megatron's recompute runs a layer's
    first forward without grad and replays it with grad): (with_grad output, without-grad output), the same draws."""
    from trainer.model.lora.epilogue import epilogue_adapter

    g = torch.Generator(device=device).manual_seed(0)
    w = (torch.randn(out, hidden, device=device, generator=g) * 0.05).bfloat16()
    x = torch.randn(tokens, hidden, device=device, generator=g).bfloat16()
    a = (torch.randn(16, hidden, device=device, generator=g) * 0.1).requires_grad_(True)
    b = (torch.randn(out, 16, device=device, generator=g) * 0.1).requires_grad_(True)
    torch.manual_seed(5)
    with_grad = epilogue_adapter(w, x, a, b, 2.0, p, kernels=kernels, products=kernels)
    torch.manual_seed(5)
    with torch.no_grad():
        without = epilogue_adapter(w, x, a, b, 2.0, p, kernels=kernels, products=kernels)
    assert with_grad.requires_grad and not without.requires_grad
    return with_grad.detach(), without
