"""The layouts a recipe could run with on its nodes and GPUs: TP/PP/EP x recompute x FP8 weights (or BF16
weights with or without TE's cached FP8 copies) x adapter-input recompute x micro-batch, each checked by the
contract (what validate would say) and planned.

A candidate is a list of `--set` lines over the recipe; the ones the contract refuses are dropped. Block recompute
is searched, not sampled: each layout's fewest recomputed layers that still fit (peak memory only falls as more layers
are recomputed), found in a few plans by interpolating the planned need between two that bracket the GPU's memory
(`_fewest_block`); with no known GPU, layers/4 and layers/2. `cheapest_fit` is what a refusal suggests: the fewest
changed keys, then the fastest.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from primus_contract import check
from primus_contract.errors import ContractError
from primus_contract.plan import plan

KEYS = {"tensor": "trainer.parallelism.tensor", "pipeline": "trainer.parallelism.pipeline",
        "expert": "trainer.parallelism.expert", "sequence_parallel": "trainer.parallelism.sequence_parallel",
        "granularity": "trainer.recompute.granularity", "method": "trainer.recompute.method",
        "num_layers": "trainer.recompute.num_layers", "adapter_inputs": "trainer.recompute.adapter_inputs",
        "fp8_param": "trainer.precision.fp8_param", "fp8_recipe": "trainer.precision.fp8_recipe",
        "fp8_weight_cache": "trainer.precision.fp8_weight_cache",
        "micro_batch_size": "trainer.schedule.micro_batch_size"}


@dataclass
class Candidate:
    sets: dict            # dotted key -> value (only the keys that differ from the recipe)
    plan: object          # primus_contract.plan.Plan

    def set_lines(self) -> list[str]:
        return [f"--set {k}={_text(v)}" for k, v in self.sets.items()]

    def describe(self) -> str:
        lay = self.plan.layout
        return f"TP{lay.tp} PP{lay.pp} EP{lay.ep} DP{lay.dp} mbs {lay.mbs}"


def _text(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def get(r: dict, dotted: str):
    """The value at a dotted key of a resolved recipe."""
    node = r
    for part in dotted.split("."):
        node = node[part]
    return node


def _set(r: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    node = r
    for part in path:
        node = node[part]
    node[last] = value


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


SEARCH = None  # a want's num_layers for block recompute: the fewest layers that fit, searched (_fewest_block)


def _recomputes(layers_per_stage: int) -> list[tuple]:
    out = [(None, "uniform", 1), ("full", "uniform", 1)]
    if layers_per_stage > 1:
        out.append(("full", "block", SEARCH))
    return out


def _fixed_blocks(layers_per_stage: int) -> list[int]:
    """Block points where fitting is unknown (no GPU the planner knows): a quarter and half of the stage's layers."""
    return [k for k in (layers_per_stage // 4, layers_per_stage // 2) if 0 < k < layers_per_stage]


def _adapter_inputs_options(resolved: dict) -> tuple:
    """(False, True), or (False,) where recompute.adapter_inputs would rewire nothing (the contract refuses it:
    pre-dropout adapters, no fc2 / norm-fed target), so that the floor of _none_can_fit is a setting that runs."""
    from primus_contract.rules_levers import adapter_inputs_rules

    t = resolved["trainer"]
    try:
        adapter_inputs_rules({**t, "recompute": {**t["recompute"], "adapter_inputs": True}},
                             resolved["cluster"]["env_profile"])
    except ContractError:
        return (False,)
    return (False, True)


def _wants(resolved: dict):
    """Each layout to try, as {KEYS name: value}."""
    t, c = resolved["trainer"], resolved["cluster"]
    m = t["model"]
    ais = _adapter_inputs_options(resolved)
    world = c["nodes"] * (c["nproc_per_node"] or c["gpus_per_node"] or 1)
    per_node = c["nproc_per_node"] or c["gpus_per_node"] or 1
    fp8 = bool(t["precision"]["fp8"])
    for tp in _divisors(per_node, 8):
        for pp in _divisors(m["num_layers"], world // tp):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            eps = [d for d in _divisors(dp, dp) if m["num_moe_experts"] and m["num_moe_experts"] % d == 0] or [1]
            for ep in eps:
                for gran, method, n in _recomputes(m["num_layers"] // pp):
                    for ai in ais:
                        for f8, cache in (((False, True), (False, False), (True, False)) if fp8 else ((False, None),)):
                            for mbs in (1, 2, 4):
                                want = {"tensor": tp, "pipeline": pp, "expert": ep, "sequence_parallel": tp > 1,
                                        "granularity": gran, "method": method, "num_layers": n,
                                        "adapter_inputs": ai, "micro_batch_size": mbs}
                                if fp8:
                                    want["fp8_param"] = f8
                                    if not f8:
                                        want["fp8_weight_cache"] = cache
                                    if f8 and t["precision"]["fp8_recipe"] == "delayed":
                                        want["fp8_recipe"] = "tensorwise"
                                yield want


def candidates(resolved: dict) -> list[Candidate]:
    return _tried(resolved, _wants(resolved))


def _tried(resolved: dict, wants) -> list[Candidate]:
    """The candidates of `wants` the contract accepts, a searched block recompute planned as its fewest fitting layers."""
    out = []
    for want in wants:
        if want["method"] == "block" and want["num_layers"] is SEARCH:
            out += _fewest_block(resolved, want)
        else:
            cand = _try(resolved, want)
            if cand is not None:
                out.append(cand)
    return out


def _fewest_block(resolved: dict, want: dict) -> list[Candidate]:
    """Block recompute of the fewest layers (1 .. layers_per_stage-1) that fit, as a one-candidate list. Memory only
    falls as layers are recomputed, so: layers-1 not fitting means none does (that candidate is listed, not fitting);
    1 fitting is taken; else the bracket (lo does not fit, hi fits) is narrowed at the layer count where the planned
    need, interpolated between the two, meets the GPU's memory (the need is close to linear in the layers: two plans
    usually settle it), halving instead after two steps that did not halve it. A layer count the contract refuses
    counts as not fitting. With no known GPU (fits None): the fixed points of _fixed_blocks."""
    layers = resolved["trainer"]["model"]["num_layers"] // want["pipeline"]
    at = lambda n: _try(resolved, {**want, "num_layers": n})  # noqa: E731
    top = at(layers - 1)
    if top is None or top.plan.fits is False:
        return [top] if top is not None else []
    if top.plan.fits is None:
        return [c for c in (at(k) for k in _fixed_blocks(layers)) if c is not None]
    hi, best = layers - 1, top
    low = at(1) if layers > 2 else top
    if low is not None and low.plan.fits:
        return [low]
    lo, lo_need = 1, (low.plan.needs_gib if low is not None else None)
    cap, slow = top.plan.gpu_memory_gib, 0
    while hi - lo > 1:
        n = (lo + hi) // 2
        if lo_need is not None and slow < 2 and lo_need > best.plan.needs_gib:
            frac = (lo_need - cap) / (lo_need - best.plan.needs_gib)
            n = min(hi - 1, max(lo + 1, lo + math.ceil(frac * (hi - lo))))
        width = hi - lo
        cand = at(n)
        if cand is not None and cand.plan.fits:
            hi, best = n, cand
        else:
            lo, lo_need = n, (cand.plan.needs_gib if cand is not None else None)
        slow = 0 if 2 * (hi - lo) <= width else slow + 1
    return [best]


def _changes(resolved: dict, want: dict) -> dict:
    """The dotted keys `want` changes in the recipe, with their new values."""
    sets = {}
    for key, value in want.items():
        if key in ("method", "num_layers") and want["granularity"] is None:
            continue  # meaningless without recompute: keep the recipe's
        if key == "num_layers" and value is SEARCH:
            continue  # not known before the search: the fewest changes it can make (it may add this key)
        if get(resolved, KEYS[key]) != value:
            sets[KEYS[key]] = value
    return sets


def _try(resolved: dict, want: dict) -> Candidate | None:
    r = copy.deepcopy(resolved)
    sets = _changes(resolved, want)
    for dotted, value in sets.items():
        _set(r, dotted, value)
    try:
        check(r)
    except ContractError:
        return None
    return Candidate(sets, plan(r))


def fastest_fit(cands: list[Candidate]) -> Candidate | None:
    fits = [x for x in cands if x.plan.fits is not False]
    return max(fits, key=lambda x: x.plan.tokens_per_s_per_gpu, default=None)


def cheapest_fit(cands: list[Candidate]) -> Candidate | None:
    fits = [x for x in cands if x.plan.fits]
    return min(fits, key=lambda x: (len(x.sets), -x.plan.tokens_per_s_per_gpu), default=None)


def cheapest_fit_of(resolved: dict) -> Candidate | None:
    """cheapest_fit(candidates(resolved)), planning only the layouts of the fewest changed keys that has a fit (a
    refusal's suggestion: planning all of them took 4 s for the 70B on one H200). A searched block recompute is
    grouped by the fewest keys it can change; its found layer count may change one more (num_layers), so a fit is
    taken only once no unplanned layout can change fewer keys."""
    wants = list(_wants(resolved))
    by_size: dict[int, list[dict]] = {}
    for want in wants:
        by_size.setdefault(len(_changes(resolved, want)), []).append(want)
    planned: list[Candidate] = []
    for size in sorted(by_size):
        if size == 2 and _none_can_fit(resolved, wants):
            return None
        planned += _tried(resolved, by_size[size])
        fit = cheapest_fit(planned)
        if fit is not None and len(fit.sets) <= size:
            return fit
    return cheapest_fit(planned)


def _none_can_fit(resolved: dict, wants: list[dict]) -> bool:
    """Each layout's most memory-saving setting (full recompute, adapter inputs recomputed where they can be, FP8
    weights, micro-batch 1) is accepted by the contract and does not fit: then no setting of any layout fits (memory
    only grows along those axes), and the search need not plan every layout."""
    ai = _adapter_inputs_options(resolved)[-1]
    floor = [_try(resolved, w) for w in wants if w["granularity"] == "full" and w["method"] == "uniform"
             and w["adapter_inputs"] == ai and w["micro_batch_size"] == 1 and w.get("fp8_param", True)]
    return bool(floor) and all(c is not None for c in floor) and not any(c.plan.fits for c in floor)
