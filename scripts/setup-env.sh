#!/usr/bin/env bash
# Creates .venv with the pinned CPU stack and installs primus-slurm into it (editable). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.stamp-$(cat requirements/cpu.txt pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements/cpu.txt
  .venv/bin/python -m pip install -q -e .   # the launcher's own deps (click, jinja2, pyyaml, submitit, rich)
  rm -f .venv/.stamp-*; touch "$stamp"
fi
