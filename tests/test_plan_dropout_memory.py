"""The planner's adapter activations under LoRA pre-dropout against what a real tiny model keeps.

With pre-dropout an adapter's A reads the dropped copy, so its backward needs that copy and the dropout's keep (a bool
mask on a GPU: trainer/model/lora/drop.py; the scaled noise in x's dtype on CPU), never the input itself, and
nothing folds or recomputes it (trainer/model/lora/inputs.py refuses pre-dropout). The planner counted the input
as well (norm-fed in FP8: 1.5 inputs) plus the dropout's 1.5: on the one-H200 70B recipe (dropout 0.1 on qkv/proj,
FP8) it planned block52 at 131.5 GiB and block60 at 116.8 (measured 125.3 and 111.5); now 126.1 and 112.8.

With trainer.lora.dropout_recompute (the default) the fused and epilogue nodes keep the input and the mask's bits
instead (8 to a byte, [tokens, ceil(width / 8)] uint8), and the planner counts that where those nodes run."""
from __future__ import annotations

import pytest

from primus_contract.plan.memory import layer_activation_bytes
from primus_contract.plan.shapes import Layout, layer_linears_local, moe_layer
from primus_slurm.config.recipe import deep_merge
from primus_slurm.config.schema import apply_schema
from tests.model_helpers import TINY, adapter_census

TARGETS = ("linear_qkv", "linear_proj", "linear_fc2")
ROWS, SEQ = 2, 40  # 80 tokens: no other dimension of the tiny model is 80


def _recipe(fold: bool, fp8: bool = False, recompute_drop: bool = False) -> dict:
    return apply_schema(deep_merge(TINY, {"trainer": {
        "precision": {"bf16": True}, "lora": {"target_modules": list(TARGETS), "dropout": 0.1,
                                              "dropout_position": "pre", "dropout_recompute": recompute_drop},
        "recompute": {"adapter_inputs": fold, "adapter_inputs_scope": "all"}}}))


def _census(r: dict) -> dict:
    """{target: [(width, bytes)]}: the per-token storages each target's adapter keeps (all layers)."""
    kept = {t: [] for t in TARGETS}
    for leaf, width, nbytes in adapter_census(r, TARGETS, ROWS, SEQ):
        kept[leaf].append((width, nbytes))
    return kept


def _measured(r: dict):
    """(trainer, model, the layout, layer 0's linears by name, the census) of the tiny model's one step."""
    t, m = r["trainer"], r["trainer"]["model"]
    lay = Layout(tp=1, pp=1, ep=1, dp=1, sp=False, world=1, mbs=ROWS, gbs=ROWS, seq=SEQ)
    return t, m, lay, {lin.short: lin for lin in layer_linears_local(m, t["lora"], lay, 0)}, _census(r)


@pytest.mark.parametrize("fold", [False, True])
def test_pre_dropout_adapters_keep_the_dropped_copy_and_the_keep_not_the_input(fold):
    r = _recipe(fold)
    t, m, lay, lins, kept = _measured(r)
    layers, dim, tokens = m["num_layers"], t["lora"]["dim"], ROWS * SEQ
    census_total = 0.0
    for target in TARGETS:
        width = lins[target].in_local
        # per layer: the dropped copy and the CPU keep (both the input's width and dtype), A's rank-sized output
        assert sorted(kept[target]) == sorted([(width, tokens * width * 2)] * 2 * layers
                                              + [(dim, tokens * dim * 2)] * layers), (target, kept[target])
        census_total += sum(b for _, b in kept[target]) / layers
        # the planner's bool mask is half the CPU keep's bf16
        census_total -= tokens * width * 2 * 0.5
    for layer in range(layers):
        planned = layer_activation_bytes(m, t, lay, layer_linears_local(m, t["lora"], lay, layer),
                                         moe_layer(m, layer))["adapter"]
        assert planned == census_total


def test_pre_dropout_term_is_the_same_in_fp8_and_with_the_fold():
    """FP8 made the norm-fed input count 1.5 times on top of the dropout; with pre-dropout neither the input nor its
    cast is kept."""
    base = _recipe(False)
    t, m = base["trainer"], base["trainer"]["model"]
    lay = Layout(tp=1, pp=1, ep=1, dp=1, sp=False, world=1, mbs=1, gbs=1, seq=SEQ)
    lins = layer_linears_local(m, t["lora"], lay, 0)
    plain = layer_activation_bytes(m, t, lay, lins, False)["adapter"]
    fp8 = {**t, "precision": {**t["precision"], "fp8": "hybrid"}}
    assert layer_activation_bytes(m, fp8, lay, lins, False)["adapter"] == plain
    folded = _recipe(True)["trainer"]
    assert layer_activation_bytes(m, folded, lay, lins, False)["adapter"] == plain
    widths = sum(lin.in_local * 1.5 + t["lora"]["dim"] for lin in lins if lin.adapted)
    assert plain == SEQ * widths * 2  # 1.5 inputs (copy + bool mask) + h, bf16 bytes


def test_recomputed_drop_keeps_the_input_and_the_masks_bits():
    """dropout_recompute on (the fused path, every adapter of the CPU model): each adapter keeps its input (bf16) and
    the mask's bits (uint8, a byte for 8 elements), no dropped copy, no byte mask. The planner counts the same on a
    GPU run where those nodes run (norm-fed qkv there through the norm epilogue), but for linear_proj's input: the
    GPU's core attention keeps its output, which is that input (one storage); the CPU attention does not keep it."""
    r = _recipe(False, recompute_drop=True)
    t, m, lay, lins, kept = _measured(r)
    layers, dim, tokens = m["num_layers"], t["lora"]["dim"], ROWS * SEQ
    gpu_total = 0.0
    for target in TARGETS:
        width = lins[target].in_local
        bits = -(-width // 8)
        assert sorted(kept[target]) == sorted([(width, tokens * width * 2), (bits, tokens * bits)] * layers
                                              + [(dim, tokens * dim * 2)] * layers), (target, kept[target])
        gpu_total += sum(b for _, b in kept[target]) / layers
        if target == "linear_proj":
            gpu_total -= tokens * width * 2
    gpu = deep_merge(r, {"cluster": {"env_profile": "h200"}, "trainer": {"distributed": {"device": "cuda"}}})
    lins_all = layer_linears_local(m, t["lora"], lay, 0)
    planned = layer_activation_bytes(m, gpu["trainer"], lay, lins_all, False, "h200")["adapter"]
    assert planned == gpu_total
    # off: the dropped copy and the bool mask again, 1.5 inputs an adapter
    off = deep_merge(gpu, {"trainer": {"lora": {"dropout_recompute": False}}})
    assert layer_activation_bytes(m, off["trainer"], lay, lins_all, False, "h200")["adapter"] == tokens * sum(
        lin.in_local * 1.5 * 2 + dim * 2 for lin in lins_all if lin.adapted)


def test_a_dropout_whose_mask_cannot_be_rebuilt_is_planned_as_kept_on_a_gpu():
    """At p = 0.104 native_dropout's forward and backward float32 scales differ and a BF16 input shows it
    (dropout_recomputable), so a GPU's nodes keep the dropped copy and the bool mask even with dropout_recompute on
    (trainer/model/lora/drop.py kept_drop); the planner plans that, the CPU's noise still rebuilds, and `validate` notes
    the key set where it acts nowhere (audit, 2026-12-07: planned 7.7 GiB low on the 8B packed recipe, silently). At
    0.15 the scales differ too, but only an FP32 input shows it."""
    from primus_contract.rules_dependent import inert_keys

    r = _recipe(False, recompute_drop=True)
    t, m = r["trainer"], r["trainer"]["model"]
    lay = Layout(tp=1, pp=1, ep=1, dp=1, sp=False, world=1, mbs=ROWS, gbs=ROWS, seq=SEQ)
    lins = layer_linears_local(m, t["lora"], lay, 0)

    def adapter(p, recompute=True, profile="h200", device="cuda", bf16=True):
        x = deep_merge(r, {"cluster": {"env_profile": profile}, "trainer": {
            "distributed": {"device": device}, "lora": {"dropout": p, "dropout_recompute": recompute},
            "precision": {"bf16": bf16}}})
        return layer_activation_bytes(m, x["trainer"], lay, lins, False, profile)["adapter"]

    assert r["trainer"]["precision"]["bf16"]
    assert adapter(0.1) < adapter(0.1, recompute=False)
    assert adapter(0.104) == adapter(0.104, recompute=False)
    assert adapter(0.104, profile="cpu", device="cpu") == adapter(0.1, profile="cpu", device="cpu")
    assert adapter(0.15) < adapter(0.15, recompute=False)
    assert adapter(0.15, bf16=False) == adapter(0.15, recompute=False, bf16=False)
    gpu = {"cluster": {"env_profile": "h200"}, "trainer": {"distributed": {"device": "cuda"},
                                                            "lora": {"dropout_recompute": False}}}
    notes = [line for p in (0.1, 0.104)
             for line in inert_keys(deep_merge(r, deep_merge(gpu, {"trainer": {"lora": {"dropout": p}}})))]
    assert len(notes) == 1 and "`trainer.lora.dropout_recompute` is false but does nothing" in notes[0]
