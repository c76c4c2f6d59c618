#!/usr/bin/env bash
# The whole test suite. Starts the project's local Slurm cluster and builds the container image first when this
# machine can (root + apt); elsewhere the Slurm and container tests skip with that reason. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  scripts/local-slurm.sh up || { echo "run-tests: local Slurm cluster failed to start" >&2; exit 1; }
  # podman + the local CPU image of tests/test_container_*.py (cached; the first build takes minutes)
  scripts/container-image.sh >/dev/null || { echo "run-tests: container set-up failed" >&2; exit 1; }
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
rc=$?
[ "$rc" = 5 ] && { echo "run-tests: pytest collected no tests" >&2; exit 1; }
exit "$rc"
