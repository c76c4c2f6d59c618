"""Refit the planner's speed costs (primus_contract/plan/calibration.py COST) from measured rows of bench/results.

    .venv/bin/python scripts/plan_calibrate.py [--write]

Rows: every row bench/plan_rows.py matches that ran to the end (not out of memory), except files listed with
--exclude (e.g. new variations kept back to test the plan). Fit: non-negative least squares on the relative step
time, sum_rows (sum_f work_f x cost_f / measured step - 1)^2, by Lawson-Hanson's active set (numpy); the costs in
calibration.MEASURED_COST are held at their measured values. --write rewrites the fitted block of calibration.py
(COST and CALIBRATION_ROWS); without it, prints the costs and the fit.
"""
from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import plan_rows  # noqa: E402
from primus_contract.plan import calibration as cal  # noqa: E402
from primus_contract.plan.gpus import CALIBRATED_ON  # noqa: E402
from primus_contract.plan.shapes import layout_of  # noqa: E402
from primus_contract.plan.speed import features  # noqa: E402


def nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """min |a x - b| subject to x >= 0 (Lawson-Hanson)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    for _ in range(iters):
        w = a.T @ (b - a @ x)
        if passive.all() or (w[~passive] <= 1e-12).all():
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-18
    return x


def calibration_rows(exclude=()) -> list:
    out = []
    for row in plan_rows.rows():
        known = (row.file, row.label) in plan_rows.KNOWN_MISSES
        if any(fnmatch.fnmatch(row.file, p) for p in exclude) or row.oom or known:
            continue
        r, _ = plan_rows.match(row)
        if r is not None and r["cluster"]["env_profile"] == CALIBRATED_ON:  # the costs are the H200's
            out.append((row, r))
    return out


def fit(rows: list) -> dict:
    """The costs: cal.MEASURED_COST as they are (each measured apart, by a pair of rows that differ in that feature
    alone), the rest fitted on what those leave of each row's step."""
    fixed = cal.MEASURED_COST
    names = [n for n in cal.COST if n not in fixed]
    a, b = [], []
    for row, r in rows:
        lay = layout_of(r)
        f = features(r, lay)
        measured = lay.gbs * lay.seq / row.data["tokens_per_s_per_gpu"] / lay.world
        a.append([f.get(n, 0.0) / measured for n in names])
        b.append(1.0 - sum(f.get(n, 0.0) * v for n, v in fixed.items()) / measured)
    a = np.array(a)
    # fit each column scaled to a largest entry of 1 (well-conditioned; a cost at 0 today can still become
    # non-zero, which scaling by today's costs would forbid); a feature no row has stays at 0
    scale = a.max(axis=0)
    scale[scale <= 0] = 1.0
    x = nnls(a / scale, np.array(b))
    fitted = {n: float(v / s) for n, v, s in zip(names, x, scale)}
    return {n: fixed.get(n, fitted.get(n)) for n in cal.COST}


def write(cost: dict, rows: list) -> None:
    path = ROOT / "primus_contract" / "plan" / "calibration.py"
    text = path.read_text()
    body = "COST = {\n" + "".join(f"    {n!r}: {v:.4e},\n" for n, v in cost.items()) + "}\n"
    listed = "".join(f"    ({row.file!r}, {row.label!r}),\n" for row, _ in rows)
    body += "CALIBRATION_ROWS: tuple = (\n" + listed + ")\n"
    text = re.sub(r"(# --- fitted by scripts/plan_calibrate.py ---\n).*?(# --- end of fitted block ---)",
                  lambda m: m.group(1) + body + m.group(2), text, flags=re.S)
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--exclude", action="append", default=[], help="result-file glob kept out of the fit")
    args = ap.parse_args()
    rows = calibration_rows(args.exclude)
    cost = fit(rows)
    for n, v in cost.items():
        rate = v and ("gemm" in n or n == "attention")
        print(f"{n:28s} {v:.4e}" + (f"  (= {1 / v / 1e12:.0f} TFLOP/s)" if rate else ""))
    print(f"{len(rows)} rows")
    if args.write:
        write(cost, rows)


if __name__ == "__main__":
    main()
