#!/usr/bin/env bash
# The whole test suite. Starts the project's local Slurm cluster and builds the container image first when this
# machine can (root + apt); elsewhere the Slurm and container tests skip with that reason. Extra arguments go to pytest.
# Its last line says how long each part took (the README's fresh-clone times come from that line of a CI run).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS; times=()
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  scripts/local-slurm.sh up || { echo "run-tests: local Slurm cluster failed to start" >&2; exit 1; }
  times+=("Slurm $((SECONDS - t0)) s"); t1=$SECONDS
  # podman + the local CPU image of tests/test_container_*.py (cached; the first build takes minutes)
  scripts/container-image.sh >/dev/null || { echo "run-tests: container set-up failed" >&2; exit 1; }
  times+=("image $((SECONDS - t1)) s")
fi
t2=$SECONDS
# --durations: the slowest tests close the run, so that the next capability sees what it costs (issue 38: the budget is
# 30 minutes of pytest on 2 idle cores)
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 --durations-min=5 "$@" tests
rc=$?
times+=("pytest $((SECONDS - t2)) s")
echo "run-tests: ${times[*]}; venv ${PRIMUS_SETUP_S:-?} s (scripts/setup-env.sh)"
[ "$rc" = 5 ] && { echo "run-tests: pytest collected no tests" >&2; exit 1; }
exit "$rc"
