"""`primus-slurm plan`: will the recipe fit, and how fast (primus_contract.plan); the plan line of `validate` and
the memory refusal of `submit`."""
from __future__ import annotations

import json

import click

from primus_contract.plan import ADDED_TO_PEAK, Plan, calibration, plan
from primus_contract.plan.frontier import candidates, cheapest_fit_of, fastest_fit, get
from primus_contract.plan.gpus import GPUS
from primus_slurm.cli_options import set_option
from primus_slurm.errors import UserError
from primus_slurm.config.recipe import load_recipe

FRONTIER_ROWS = 20


def summary(p: Plan) -> str:
    """One line: peak against the GPU, speed."""
    lay = p.layout
    if p.on_cpu:
        return f"a CPU run, no GPU plan (on one H200 it would peak at {p.peak_gib:.1f} GiB)"
    if p.gpu is None:
        where = "GPU unknown (memory not checked)"
    else:
        verdict = "fits" if p.fits else "does NOT fit"
        where = f"{verdict} in {p.gpu.name} ({p.gpu.memory_gib:.1f} GiB; needs {p.needs_gib:.1f})"
    return (f"peak {p.peak_gib:.1f} GiB/GPU, {where}; {p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step "
            f"{1000 * p.step_s:,.0f} ms (TP{lay.tp} PP{lay.pp} EP{lay.ep} DP{lay.dp}, mbs {lay.mbs}, {p.precision})")


def refusal(p: Plan, resolved: dict) -> str | None:
    """The one-line reason submit refuses the recipe planned as `p`, or None (fits, or the GPU is unknown)."""
    if p.fits is not False:
        return None
    name, gib = p.largest_term
    fix = cheapest_fit_of(resolved)
    change = (f"the cheapest change that fits: {' '.join(fix.set_lines())} ({fix.plan.peak_gib:.1f} GiB, "
              f"{fix.plan.tokens_per_s_per_gpu:,.0f} tokens/s/GPU)" if fix else
              "no layout of TP/PP/EP, recompute, FP8 weights and micro-batch fits on these GPUs: add GPUs")
    return (f"predicted to need {p.needs_gib:.1f} GiB/GPU (peak {p.peak_gib:.1f} + allocator margin and context), "
            f"more than the {p.gpu.name}'s {p.gpu.memory_gib:.1f} GiB "
            f"(largest term: {name} {gib:.1f} GiB); {change}; `primus-slurm plan` shows the breakdown, "
            "--skip-memory-check submits anyway")


def check_memory(resolved: dict, skip: bool) -> Plan:
    """submit's and validate's memory verdict: a UserError when the plan predicts the recipe does not fit; else
    the plan (made once, for the callers' plan line and note)."""
    p = plan(resolved)
    reason = None if skip else refusal(p, resolved)
    if reason:
        raise UserError(reason)
    return p


def unknown_gpu_note(p: Plan, resolved: dict) -> str | None:
    """The note submit prints when the recipe's GPU has no memory table entry (nothing is refused then)."""
    if p.on_cpu or p.gpu is not None:
        return None
    return (f"note: cluster.env_profile {resolved['cluster']['env_profile']!r} names no GPU the planner knows: "
            f"memory not checked (known: {', '.join(GPUS)})")


def _text(p: Plan, recipe_path) -> str:
    lines = [f"plan: {recipe_path}", summary(p), f"memory, GiB per GPU (pipeline stage {p.stage}):"]
    lines += [f"  {k:28s} {v:8.2f}" for k, v in p.breakdown.items() if v >= 0.005 and k not in ADDED_TO_PEAK]
    lines.append(f"  {'peak (allocator)':28s} {p.peak_gib:8.2f}")
    lines += [f"  {'+ ' + k:28s} {p.breakdown[k]:8.2f}" for k in ADDED_TO_PEAK]
    room = f" of the {p.gpu.name}'s {p.gpu.memory_gib:.2f}" if p.gpu is not None else ""  # (none on a CPU run)
    lines.append(f"  {'= needs':28s} {p.needs_gib:8.2f}{room}")
    lines.append("step time, ms:")
    lines += [f"  {k:28s} {1000 * v:8.1f}" for k, v in p.time_parts.items() if v > 0]
    lines.append(f"calibrated on one H200 from {len(calibration.CALIBRATION_ROWS)} measured rows of bench/results "
                 "(primus_contract/plan/calibration.py lists them)")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _frontier_text(resolved: dict, cands: list) -> str:
    fits = sorted((x for x in cands if x.plan.fits is not False), key=lambda x: -x.plan.tokens_per_s_per_gpu)
    best = fastest_fit(cands)
    c = resolved["cluster"]
    lines = [f"frontier: {len(cands)} layouts the contract accepts on {c['nodes']} node(s) x "
             f"{c['nproc_per_node'] or c['gpus_per_node']} GPU(s), {len(fits)} fit"
             + (f" (the {FRONTIER_ROWS} fastest shown)" if len(fits) > FRONTIER_ROWS else ""),
             f"  {'layout':26s} {'recompute':16s} {'fp8 weights':11s} {'fp8 cache':9s} {'adapter in':10s} {'peak GiB':>8s} "
             f"{'tokens/s/GPU':>12s}"]
    for x in fits[:FRONTIER_ROWS]:
        r = x.plan
        rec = _recompute_of(resolved, x.sets)
        lines.append(f"{'*' if x is best else ' '} {x.describe():26s} {rec:16s} "
                     f"{str(_value(resolved, x.sets, 'trainer.precision.fp8_param')).lower():11s} "
                     f"{_cache_of(resolved, x.sets):9s} "
                     f"{str(_value(resolved, x.sets, 'trainer.recompute.adapter_inputs')).lower():10s} "
                     f"{r.peak_gib:8.1f} {r.tokens_per_s_per_gpu:12,.0f}")
    if best is None:
        lines.append("no layout fits: add GPUs or nodes")
    else:
        lines.append(f"* fastest that fits: {best.describe()}, {best.plan.tokens_per_s_per_gpu:,.0f} tokens/s/GPU at "
                     f"{best.plan.peak_gib:.1f} GiB; select it with:")
        lines.append("  " + (" ".join(best.set_lines()) or "(the recipe as it is)"))
    return "\n".join(lines)


def _value(resolved: dict, sets: dict, dotted: str):
    return sets[dotted] if dotted in sets else get(resolved, dotted)


def _cache_of(resolved: dict, sets: dict) -> str:
    """TE's FP8 weight cache across micro-batches ('-' where it does not apply: BF16, or FP8 weights)."""
    t = resolved["trainer"]["precision"]
    if not t["fp8"] or _value(resolved, sets, "trainer.precision.fp8_param"):
        return "-"
    return str(_value(resolved, sets, "trainer.precision.fp8_weight_cache")).lower()


def _recompute_of(resolved: dict, sets: dict) -> str:
    gran = _value(resolved, sets, "trainer.recompute.granularity")
    if gran is None:
        return "none"
    if gran != "full":
        return gran
    method = _value(resolved, sets, "trainer.recompute.method")
    n = _value(resolved, sets, "trainer.recompute.num_layers")
    return f"full {method} {n}"


def register(main: click.Group) -> None:
    @main.command("plan")
    @click.argument("recipe")
    @set_option
    @click.option("--json", "as_json", is_flag=True, help="one JSON object (peak_gib, tokens_per_s_per_gpu, step_ms, "
                                                          "gpu_memory_gib, fits, breakdown, ...)")
    @click.option("--frontier", is_flag=True, help="list the layouts that fit these nodes and GPUs, the fastest "
                                                   "marked with the --set lines that select it")
    def plan_cmd(recipe: str, overrides: tuple, as_json: bool, frontier: bool) -> None:
        """Predict RECIPE's peak GPU memory (a breakdown) and speed per GPU, before it is queued."""
        r = load_recipe(recipe, overrides, check=not frontier)
        if frontier:
            cands = candidates(r.resolved)
            if as_json:
                best = fastest_fit(cands)
                click.echo(json.dumps({"layouts": [{"set": x.sets, **x.plan.as_dict()} for x in cands],
                                       "fastest": best and {"set": best.sets, "set_lines": best.set_lines()}}))
            else:
                click.echo(_frontier_text(r.resolved, cands))
            return
        p = plan(r.resolved)
        click.echo(json.dumps(p.as_dict()) if as_json else _text(p, r.path))
