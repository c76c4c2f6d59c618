#!/usr/bin/env python3
"""The quickstart numbers of docs/after-training.md (the README's `make quickstart`), from one run: trains the
shipped quickstart (`make quickstart` itself, with the local executor), evaluates its checkpoints 250 and 500
(`primus-slurm eval`), generates from the base and from the fine-tuned model on the bundled held-out prompts
(`primus-slurm generate`) and rewrites the block between the `readme-numbers` markers.

    .venv/bin/python scripts/readme_numbers.py           # rewrite docs/after-training.md's block
    .venv/bin/python scripts/readme_numbers.py --check   # exit 1 when that block differs

tests/test_post_commands.py builds the same block (`block`) from the quickstart run it trains anyway and fails
when the page's differs, so a change of the code that moves these numbers must rerun this script.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "docs" / "after-training.md"  # (the block moved there from README.md)
PROMPTS = "recipes/data/quickstart/prompts.jsonl"
START = "<!-- readme-numbers: start (scripts/readme_numbers.py writes this block; do not edit by hand) -->"
END = "<!-- readme-numbers: end -->"
EVAL_AT = (250, 500)
SHOWN_ROWS = 5  # prompts shown per generate


def job_env(tmp: Path) -> dict:
    """State and workspace under `tmp`; nothing else (tests/conftest.py's quickstart_run runs the same)."""
    return dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp / "state"), PRIMUS_WORKSPACE=str(tmp / "ws"))


def make_quickstart(env: dict) -> tuple[str, Path]:
    """`make quickstart`, the README's command, as a newcomer runs it (its PORTABLE kernels go into the run's
    cluster.env, so the run's eval and generate jobs use them too): (run id, run directory)."""
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "quickstart"], env=env, capture_output=True, text=True,
                         timeout=1800)
    found = re.search(r"^submitted run (\S+) .*\nrun dir: (\S+)$", out.stdout, re.M)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"make quickstart failed (exit {out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return found.group(1), Path(found.group(2))


def _cli(env: dict, *args: str) -> str:
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "primus-slurm"), *args], env=env, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"primus-slurm {' '.join(args[:2])} failed (exit {out.returncode}):\n{out.stdout[-3000:]}"
                 f"{out.stderr[-3000:]}")
    return out.stdout


def result_of(stdout: str) -> dict:
    """result.json of a post command, from the path its last line names."""
    return json.loads(Path(stdout.strip().splitlines()[-1].split("result: ", 1)[1]).read_text())


def logged_evals(run_dir: Path) -> dict[int, float]:
    log = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"\] eval iteration (\d+) \| eval loss (\S+)", log)}


def generate_lines(stdout: str) -> list[str]:
    """The answer lines (`  {record} -> 'answer' (reference ...)`) and the summary line of a generate job."""
    rows = [line for line in stdout.splitlines() if line.startswith("  {")]
    summary = [line for line in stdout.splitlines() if re.match(r"generate \| \d+ prompt\(s\) \| .*exact match", line)]
    return rows[:SHOWN_ROWS] + ["  ..."] + summary[-1:]


def exact_by_task(generations: Path) -> str:
    """'all 8 sorts and 5 of 8 reversals' from a generate job's generations.jsonl."""
    counts: dict[str, list[int]] = {}
    for line in generations.read_text().splitlines():
        row = json.loads(line)
        task = "sorts" if row["prompt"]["instruction"].startswith("Sort") else "reversals"
        hit = counts.setdefault(task, [0, 0])
        hit[0] += row["answer"].strip() == (row["reference"] or "").strip()
        hit[1] += 1
    return " and ".join(f"{'all' if k == n else f'{k} of'} {n} {task}" for task, (k, n) in sorted(counts.items()))


def host_cpu() -> str:
    """The CPU's model name (/proc/cpuinfo): the pinned kernels still differ between CPU makers."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def block(logged: dict[int, float], evals: dict[int, dict], base: tuple[str, dict], trained: tuple[str, dict]) -> str:
    """The page's block: eval losses as logged and as `eval` reproduces them, then both generates.
    base/trained: (generate's stdout, its result.json)."""
    a, b = EVAL_AT
    same = all(f"{evals[i]['eval_loss']:.6E}" == f"{logged[i]:.6E}" for i in EVAL_AT)
    lines = [START, "",
             "On the run of `make quickstart` (500 iterations; the Makefile puts one trainer thread, "
             "`OMP_NUM_THREADS=1`, and AVX2 kernels, `ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2`, "
             "into the run's `cluster.env`, so its `eval` and `generate` jobs use them too), measured on an x86-64 "
             f"host whose CPU is `{host_cpu()}` (hosts of one CPU model give these digits; at the code of 2026-12-03, "
             "where this host gave 6.790187E-01 at 250, an Intel AVX-512 host gave 6.380055E-01 with the same pins, "
             "and a plain `primus-slurm submit recipes/quickstart.yaml`, each host's own kernels, 6.706821E-01 or "
             "6.828237E-01), `eval` gives "
             f"{evals[a]['eval_loss']:.6E} at iteration {a} and {evals[b]['eval_loss']:.6E} at {b} "
             f"({'both as logged' if same else f'logged: {logged[a]:.6E} and {logged[b]:.6E}'}; token accuracy "
             f"{evals[a]['token_accuracy']:.4f} and {evals[b]['token_accuracy']:.4f}).", "",
             "The quickstart before and after fine-tuning, on the 16 bundled held-out prompts "
             f"(`{PROMPTS}`, reversal and sort records in neither split; made by `scripts/make_quickstart_data.py`), "
             "greedy, from that run:", "", "```text",
             f"$ primus-slurm generate RUN --prompts {PROMPTS} --base-only", *generate_lines(base[0]), "",
             f"$ primus-slurm generate RUN --prompts {PROMPTS}", *generate_lines(trained[0]), "```", "",
             "The base, pretrained on plain text, never saw the Alpaca layout and answers with fragments; after "
             f"fine-tuning {exact_by_task(Path(trained[1]['generations']))} are exact.", "", END]
    return "\n".join(lines)


def readme_block(text: str) -> str:
    start, end = text.index(START), text.index(END) + len(END)
    return text[start:end]


def measure(tmp: Path) -> str:
    env = job_env(tmp)
    run_id, run_dir = make_quickstart(env)
    evals = {i: result_of(_cli(env, "eval", run_id, "--checkpoint", str(i))) for i in EVAL_AT}
    gens = []
    for extra in (["--base-only"], []):
        out = _cli(env, "generate", run_id, "--prompts", PROMPTS, *extra)
        gens.append((out, result_of(out)))
    return block(logged_evals(run_dir), evals, *gens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the page instead of rewriting it")
    args = ap.parse_args()
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory(prefix="readme-numbers-") as tmp:
        new = measure(Path(tmp))
    text = README.read_text()
    old = readme_block(text)
    if args.check:
        print(f"{README.name}'s quickstart numbers are current" if old == new else f"{README.name} differs; now:\n{new}")
        return 0 if old == new else 1
    README.write_text(text.replace(old, new))
    print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
