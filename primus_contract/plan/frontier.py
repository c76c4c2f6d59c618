"""The layouts a recipe could run with on its nodes and GPUs: TP/PP/EP x recompute x FP8 weights (or BF16
weights with or without TE's cached FP8 copies) x adapter-input recompute x micro-batch, each checked by the
contract (what validate would say) and planned.

A candidate is a list of `--set` lines over the recipe; the ones the contract refuses are dropped. `cheapest_fit`
is what a refusal suggests: the fewest changed keys, then the fastest.
"""
from __future__ import annotations

import copy
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


def _recomputes(layers_per_stage: int) -> list[tuple]:
    out = [(None, "uniform", 1), ("full", "uniform", 1)]
    for share in (4, 2):
        k = layers_per_stage // share
        if 0 < k < layers_per_stage:
            out.append(("full", "block", k))
    return out


def _wants(resolved: dict):
    """Each layout to try, as {KEYS name: value}."""
    t, c = resolved["trainer"], resolved["cluster"]
    m = t["model"]
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
                    for ai in (False, True):
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
    return [cand for cand in (_try(resolved, want) for want in _wants(resolved)) if cand is not None]


def _changes(resolved: dict, want: dict) -> dict:
    """The dotted keys `want` changes in the recipe, with their new values."""
    sets = {}
    for key, value in want.items():
        if key in ("method", "num_layers") and want["granularity"] is None:
            continue  # meaningless without recompute: keep the recipe's
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
    refusal's suggestion: planning all of them took 4 s for the 70B on one H200)."""
    wants = list(_wants(resolved))
    by_size: dict[int, list[dict]] = {}
    for want in wants:
        by_size.setdefault(len(_changes(resolved, want)), []).append(want)
    for size in sorted(by_size):
        if size == 2 and _none_can_fit(resolved, wants):
            return None
        fit = cheapest_fit([cand for cand in (_try(resolved, want) for want in by_size[size]) if cand is not None])
        if fit is not None:
            return fit
    return None


def _none_can_fit(resolved: dict, wants: list[dict]) -> bool:
    """Each layout's most memory-saving setting (full recompute, adapter inputs recomputed, FP8 weights, micro-batch
    1) is accepted by the contract and does not fit: then no setting of any layout fits (memory only grows along
    those axes), and the search need not plan every layout."""
    floor = [_try(resolved, w) for w in wants if w["granularity"] == "full" and w["method"] == "uniform"
             and w["adapter_inputs"] and w["micro_batch_size"] == 1 and w.get("fp8_param", True)]
    return bool(floor) and all(c is not None for c in floor) and not any(c.plan.fits for c in floor)
