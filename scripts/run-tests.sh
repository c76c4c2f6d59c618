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
slowest=(--durations=25 --durations-min=5)
if [ $# = 0 ]; then
  # Two parts. First what `make check` selects (no Slurm, no container, no slow test) on two pytest-xdist workers, as
  # `make check` runs it: on one worker those tests left a core idle. Then the Slurm, container and slow tests on one
  # worker: they share one cluster and one image, and some of them time what they watch.
  .venv/bin/python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" --durations=10 --durations-min=5 \
    -m "not slurm and not container and not slow" tests
  rc_fast=$?
  t3=$SECONDS
  .venv/bin/python -m pytest -q -p no:cacheprovider "${slowest[@]}" -m "slurm or container or slow" tests
  rc=$?
  split=" (make check's part $((t3 - t2)) s on ${TEST_WORKERS:-2} workers, then the rest on one)"
  # exit 5, "collected no tests", is a failure only when neither part collected any
  [ "$rc" = 5 ] && [ "$rc_fast" != 5 ] && rc=0
  [ "$rc_fast" != 5 ] && [ "$rc_fast" != 0 ] && rc=$rc_fast
else  # extra arguments (a -k, -m, a file...): one pytest on one worker, as they ask
  .venv/bin/python -m pytest -q -p no:cacheprovider "${slowest[@]}" "$@" tests
  rc=$?
  split=""
fi
times+=("pytest $((SECONDS - t2)) s$split")
echo "run-tests: ${times[*]}; venv ${PRIMUS_SETUP_S:-?} s (scripts/setup-env.sh)"
[ "$rc" = 5 ] && { echo "run-tests: pytest collected no tests" >&2; exit 1; }
exit "$rc"
