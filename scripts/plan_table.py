"""docs/plan.md's table of planned against measured (every matched GPU row of bench/results/), generated, not typed.

    .venv/bin/python scripts/plan_table.py            # print the table
    .venv/bin/python scripts/plan_table.py --write    # replace it in docs/plan.md between the plan-table markers
    .venv/bin/python scripts/plan_table.py --unmatched  # the rows not planned, each with its reason
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import plan_rows  # noqa: E402
from primus_contract.plan import calibration, plan  # noqa: E402

START, END = "<!-- plan-table:start (scripts/plan_table.py --write) -->", "<!-- plan-table:end -->"


def table() -> str:
    fit = set(calibration.CALIBRATION_ROWS)
    lines = ["| bench/results row | fit | peak GiB measured | planned | tokens/s/GPU measured | planned |",
             "| --- | :-: | ---: | ---: | ---: | ---: |"]
    unmatched = misses = 0
    for row in plan_rows.rows():
        r, _ = plan_rows.match(row)
        if r is None:
            unmatched += 1
            continue
        p = plan(r)
        name = f"`{row.file}`: {row.label}"
        if row.oom:
            lines.append(f"| {name} | | out of memory | {p.needs_gib:.1f} (does not fit) | - | - |")
            continue
        d = row.data
        known = plan_rows.KNOWN_MISSES.get((row.file, row.label))
        misses += bool(known)
        peak_err = 100 * (p.peak_gib / d["peak_mem_gib"] - 1)
        tps_err = 100 * (p.tokens_per_s_per_gpu / d["tokens_per_s_per_gpu"] - 1)
        used = "yes" if (row.file, row.label) in fit else ""
        lines.append(f"| {name}{' (known miss)' if known else ''} | {used} | "
                     f"{d['peak_mem_gib']:.1f} | {p.peak_gib:.1f} ({peak_err:+.0f} %) | "
                     f"{d['tokens_per_s_per_gpu']:,.0f} | {p.tokens_per_s_per_gpu:,.0f} ({tps_err:+.0f} %) |")
    lines.append("")
    known = "; ".join(f"{f}: {label}: {why}" for (f, label), why in plan_rows.KNOWN_MISSES.items())
    lines.append(f"fit: the row calibrates the speed costs (scripts/plan_calibrate.py). {unmatched} rows are not "
                 "planned (other benchmarks, failed runs, code since replaced), each listed with its reason by "
                 "`scripts/plan_table.py --unmatched`" + (f". Known misses: {known}" if misses else "") + ".")
    return "\n".join(lines)


def unmatched() -> str:
    out = []
    for row in plan_rows.rows():
        r, why = plan_rows.match(row)
        if r is None:
            out.append(f"{row.file}: {row.label}: {why}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--unmatched", action="store_true")
    args = ap.parse_args()
    if args.unmatched:
        print(unmatched())
        return
    text = table()
    if not args.write:
        print(text)
        return
    readme = ROOT / "docs" / "plan.md"
    body = readme.read_text()
    head, _, rest = body.partition(START)
    _, _, tail = rest.partition(END)
    readme.write_text(f"{head}{START}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
