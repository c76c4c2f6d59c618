#!/usr/bin/env python3
"""The list of shipped recipes in the docs is `primus-slurm recipes`, verbatim, between the `recipes` markers.

    .venv/bin/python scripts/doc_recipes.py           # rewrite the block
    .venv/bin/python scripts/doc_recipes.py --check   # exit 1 when the block differs

tests/test_doc_recipes.py fails when the block differs, so a recipe added, removed or re-described reruns this.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "recipes.md"
START = "<!-- recipes: start (scripts/doc_recipes.py writes this block from `primus-slurm recipes`) -->"
END = "<!-- recipes: end -->"


def listing() -> str:
    out = subprocess.run([str(Path(sys.executable).parent / "primus-slurm"), "recipes"], capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout


def block(text: str) -> str:
    return "\n".join([START, "```text", "$ primus-slurm recipes", *text.rstrip("\n").splitlines(), "```", END])


def doc_block(text: str) -> str:
    start, end = text.index(START), text.index(END) + len(END)
    return text[start:end]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help=f"compare with {DOC.name} instead of rewriting it")
    args = ap.parse_args()
    text, new = DOC.read_text(), block(listing())
    old = doc_block(text)
    if args.check:
        print(f"{DOC.name}'s recipe list is current" if old == new else f"{DOC.name} differs; now:\n{new}")
        return 0 if old == new else 1
    DOC.write_text(text.replace(old, new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
