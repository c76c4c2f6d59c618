"""Run-to-run spread of one device call: every cell's min / median / max, its ratio to the ceiling and the anchor of the
same call, and a verdict for each compared pair. CPU only; reads the JSON lines a bench/gpu_suite.sh group wrote.

A cell is (what ran, docs, precision). The rows it understands:
  anchor_mcore_te.py      {"anchor": "mcore_te", "fp8": null|"delayed", "tokens_per_s"}      -> ("anchor", "single", p)
  bench/lora_ceiling.py   {"bench": "lora_ceiling", "docs", "fp8", "tokens_per_s"}           -> ("ceiling", docs, p)
  bench/interleaved.py    {"bench": "interleaved", "variant", "docs", "precision", ...}      -> (variant, docs, p)
  trainer_throughput.py   {"bench": "trainer_throughput", "label": "<cell>-r<k>", "docs", ...} -> (<cell>, docs, "")
Rows with an error or rc != 0 are counted as failures of their cell, never as numbers.

Verdict of a pair (A, B) in the same docs and precision, tokens/s (higher is better), at least 3 repeats each:
  "A kept"        median(A) > max(B)
  "B kept"        median(B) > max(A)
  "not separated" otherwise (the spread hides the difference)

    python3 bench/spread.py OUT/epilogue.jsonl [--baseline default] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

MIN_REPEATS = 3
# the cells every variant is a ratio to: the adapter-free ceiling, the same with TE's FP8 attention (FP8 one-document
# rows, where ours runs it: bench/lora_ceiling.py fp8_delayed_attn), the bare anchor
REFERENCES = ("ceiling", "ceiling-attn", "anchor")


def interleave(variants: list, repeats: int) -> list[tuple[int, object]]:
    """The order a call runs its variants in: A B C A B C ... (repeat, variant) pairs, every repeat complete before
    the next starts, so drift in the machine (clocks, heat, a neighbour) lands on every variant alike."""
    if repeats < 1 or not variants:
        raise ValueError("interleave needs at least one variant and one repeat")
    return [(rep, v) for rep in range(repeats) for v in variants]


def _precision(fp8) -> str:
    return "bf16" if not fp8 else "fp8"


def cell_of(row: dict):
    """((name, docs, precision), tokens/s or None for a failed run), or None for a row that is no measurement."""
    if row.get("anchor") == "mcore_te":
        return ("anchor", "single", _precision(row.get("fp8") or (row.get("config", "").startswith("fp8")))), \
            row.get("tokens_per_s")
    bench = row.get("bench")
    if bench == "lora_ceiling" and ("tokens_per_s" in row or "error" in row):
        docs = row.get("docs") or ("packed" if str(row.get("config", "")).startswith("packed:") else "single")
        fp8 = row.get("fp8") or ("fp8" in str(row.get("config", "")))
        name = "ceiling-attn" if "attn" in str(fp8) else "ceiling"  # (fp8_delayed_attn: with TE's FP8 attention)
        return (name, docs, _precision(fp8)), row.get("tokens_per_s")
    if bench == "interleaved" and "variant" in row:
        value = row.get("tokens_per_s") if not row.get("error") else None
        return (row["variant"], row.get("docs", ""), row.get("precision", "")), value
    if bench == "trainer_throughput" and row.get("label"):
        name = re.sub(r"-r\d+$", "", row["label"])
        value = row.get("tokens_per_s_per_gpu") if row.get("rc", 0) == 0 else None
        return (name, row.get("docs", ""), ""), value
    return None


def collect(rows) -> dict:
    """{cell: {"values": [tokens/s...], "failed": n, "peak_gib": [...], "lm_loss": [...]}} in first-seen order."""
    cells: dict = {}
    for row in rows:
        got = cell_of(row)
        if got is None:
            continue
        key, value = got
        c = cells.setdefault(key, {"values": [], "failed": 0, "peak_gib": [], "lm_loss": []})
        if value is None or row.get("error"):
            c["failed"] += 1
            continue
        c["values"].append(float(value))
        for field, names in (("peak_gib", ("peak_gib", "peak_mem_gib")), ("lm_loss", ("lm_loss",))):
            v = next((row[n] for n in names if row.get(n) is not None), None)
            if v is not None:
                c[field].append(float(v))
    return cells


def stats(values: list) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": min(values), "median": statistics.median(values), "max": max(values)}


def verdict(a: list, b: list, name_a: str, name_b: str) -> str:
    if len(a) < MIN_REPEATS or len(b) < MIN_REPEATS:
        return f"too few repeats ({len(a)}, {len(b)}; {MIN_REPEATS} needed)"
    if statistics.median(a) > max(b):
        return f"{name_a} kept"
    if statistics.median(b) > max(a):
        return f"{name_b} kept"
    return "not separated"


def summarize(rows, baseline: str = "default") -> list[dict]:
    """One row per cell ("spread_cell"), then one per variant against the baseline of its docs and precision
    ("spread_verdict")."""
    cells = collect(rows)
    out = []
    for (name, docs, prec), c in cells.items():
        s = stats(c["values"])
        row = {"bench": "spread_cell", "cell": name, "docs": docs, "precision": prec, **s, "failed": c["failed"]}
        for ref in REFERENCES:
            r = cells.get((ref, docs, prec)) or (cells.get((ref, "single", prec)) if ref == "anchor" else None)
            if r and r["values"] and s["n"] and name not in REFERENCES:
                row[f"x_{ref.replace('-', '_')}"] = round(s["median"] / statistics.median(r["values"]), 3)
        for field in ("peak_gib", "lm_loss"):
            if c[field]:
                row[f"{field}_median"] = round(statistics.median(c[field]), 4)
        out.append(row)
    for (name, docs, prec), c in cells.items():
        base = cells.get((baseline, docs, prec))
        if name == baseline or name in REFERENCES or base is None:
            continue
        med = statistics.median
        gain = (med(c["values"]) / med(base["values"]) - 1) if c["values"] and base["values"] else None
        out.append({"bench": "spread_verdict", "docs": docs, "precision": prec, "a": name, "b": baseline,
                    "verdict": verdict(c["values"], base["values"], name, baseline),
                    "median_gain": None if gain is None else round(gain, 4)})
    return out


def markdown(summary: list[dict]) -> str:
    """The README table: medians with their spread (min-max), the ratio to the same call's ceiling and anchor."""
    lines = ["| cell | docs | precision | median tok/s (min-max, n) | x ceiling | x ceiling, FP8 attention | x anchor "
             "| peak GiB |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in summary:
        if r["bench"] != "spread_cell":
            continue
        spread = (f"{r['median']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f}, {r['n']})" if r["n"]
                  else f"failed ({r['failed']})")
        lines.append(f"| {r['cell']} | {r['docs']} | {r['precision']} | {spread} | {r.get('x_ceiling', '')} | "
                     f"{r.get('x_ceiling_attn', '')} | {r.get('x_anchor', '')} | {r.get('peak_gib_median', '')} |")
    verdicts = [r for r in summary if r["bench"] == "spread_verdict"]
    if verdicts:
        lines += ["", "| pair | docs | precision | median gain | verdict |", "| --- | --- | --- | ---: | --- |"]
        for r in verdicts:
            gain = "" if r["median_gain"] is None else f"{100 * r['median_gain']:+.1f} %"
            lines.append(f"| {r['a']} vs {r['b']} | {r['docs']} | {r['precision']} | {gain} | {r['verdict']} |")
    return "\n".join(lines)


def read_rows(paths) -> list[dict]:
    rows = []
    for p in paths:
        for line in Path(p).read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a cut line is no measurement
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--baseline", default="default", help="the variant every other one is judged against")
    ap.add_argument("--markdown", action="store_true", help="print the README tables instead of JSON lines")
    args = ap.parse_args(argv)
    summary = summarize(read_rows(args.files), args.baseline)
    if args.markdown:
        print(markdown(summary))
    else:
        for row in summary:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
