#!/usr/bin/env bash
# `make gpu-test`: the GPU lifecycle suite (tests/gpu, marker `gpu`): the first call of every device session.
#   bash scripts/gpu-test.sh stage      here (registries reachable): pytest + pytest-timeout wheels for the device's
#                                       Python 3.12 into the git-ignored .gpu/test-wheels (send it along once)
#   PRIMUS_COMMIT=<sha> make gpu-test   on the device, after `bash .gpu/bin/gpu-install.sh` (../shared/gpu): its
#                                       JSON goes to $OUT/lifecycle.json, else bench/results/<date>_<gpu>_lifecycle/
# PRIMUS_LIFECYCLE_ON_CPU=1 runs the same suite on the CPU (FP8 and the 8B shape skipped), to prove it before device
# time is spent on it. Extra arguments go to pytest.
# Slurm: `stage` also stages scripts/gpu-slurm.sh's kit (.gpu/slurm, Debian 12 debs, ~18 MB; send it along too);
# where it is there and CUDA is (or PRIMUS_GPU_SLURM=1), the suite starts that one-node cluster with gres/gpu first,
# so that the Slurm test (tests/gpu/slurm_gpu.py) runs, and stops it at the end (PRIMUS_GPU_SLURM_KEEP=1: leaves it up).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = stage ]; then
  shift
  "$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d .gpu/test-wheels pytest pytest-timeout || exit
  bash scripts/gpu-slurm.sh stage || echo "gpu-test: no Slurm kit staged (the Slurm test will skip there)" >&2
  exit 0
fi
if ! "$PY" -c "import pytest, pytest_timeout" 2>/dev/null; then
  ls .gpu/test-wheels/*.whl >/dev/null 2>&1 || { echo "gpu-test: no pytest here and no .gpu/test-wheels (run: bash scripts/gpu-test.sh stage, then send .gpu/test-wheels)" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --find-links .gpu/test-wheels pytest pytest-timeout || exit 2
fi
gpu=$("$PY" -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower() if torch.cuda.is_available() else 'cpu')")
dir=${OUT:-bench/results/$(date +%F)_${gpu}_lifecycle}
mkdir -p "$dir"
start=$SECONDS
if ls "${PRIMUS_GPU_SLURM_KIT:-.gpu/slurm}"/*.deb >/dev/null 2>&1 && { [ "$gpu" != cpu ] || [ "${PRIMUS_GPU_SLURM:-}" = 1 ]; }; then
  if bash scripts/gpu-slurm.sh up >"$dir/gpu-slurm-up.log" 2>&1; then
    . "${PRIMUS_GPU_SLURM_STATE:-/var/tmp/primus-gpu-slurm}/env.sh"
    [ "${PRIMUS_GPU_SLURM_KEEP:-}" = 1 ] || trap 'bash scripts/gpu-slurm.sh down' EXIT
    echo "gpu-test: Slurm up in $((SECONDS - start)) s ($(sinfo -h -o '%N %T %G'))"
  else
    echo "gpu-test: Slurm did not come up (the Slurm test will skip); its log:" >&2
    tail -n 40 "$dir/gpu-slurm-up.log" >&2
  fi
fi
# A device call that ends at its limit returns only what is under $OUT: so the progress line reaches the log as it
# happens (unbuffered), pytest gets SIGINT at the deadline (it still writes the JSON of what ran), and the runs'
# small logs go beside it (runs.tgz). On the H100 on 2026-12-05 a blind wait used a whole call and left nothing.
export PYTHONUNBUFFERED=1
base=${PRIMUS_LIFECYCLE_BASETEMP:-/tmp/primus-lifecycle}
# counted from this script's start (Slurm's start comes out of it), leaving the call's last minute for the rest
deadline=$(( ${PRIMUS_GPU_TEST_DEADLINE:-540} - SECONDS ))
rm -rf "$base"
PYTHONPATH="$PWD/tests/gpu:$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout -s INT -k 10 "$deadline" \
  "$PY" -m pytest -v -p no:cacheprovider -p lifecycle_report -m gpu tests/gpu --basetemp "$base" \
  --lifecycle-json "$dir/lifecycle.json" -rA "$@"
rc=$?
case $rc in
  124) echo "gpu-test: stopped at the deadline (PRIMUS_GPU_TEST_DEADLINE, from the script's start)" ;;
  137) echo "gpu-test: killed 10 s after the deadline (its JSON holds what had finished)" ;;
esac
if [ -d "$base" ]; then
  (cd "$base" && find . -type f \( -name '*.jsonl' -o -name '*.out' -o -name 'result.json' -o -name 'debug*.log' \) \
    -size -4M -print0 | tar czf "$dir/runs.tgz" --null -T -) && echo "gpu-test: the runs' logs in $dir/runs.tgz"
fi
# what the suite left going (a deadline, a failed test) holds the GPU into the next call on a warm machine: the
# process trees of every run, queue and step under $base, by the pids their run.json / queue files name
timeout 60 "$PY" tests/gpu/reap.py "$base"
echo "gpu-test: $((SECONDS - start)) s, pytest exit $rc, $dir/lifecycle.json"
exit "$rc"
