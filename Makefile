.PHONY: quickstart check test

# Train the tiny quickstart model on CPU with the local executor (no Slurm needed).
quickstart:
	scripts/setup-env.sh
	.venv/bin/primus-slurm submit recipes/quickstart.yaml --follow

# The fast loop: unit, contract and small CPU-model tests; no Slurm, no podman, no long runs (markers slurm,
# container and slow; conftest.py sets the first two from the fixtures a test takes).
check:
	scripts/setup-env.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -m "not slurm and not container and not slow" tests

# The whole test suite; starts the project's local Slurm cluster when root and apt are available.
test:
	start=$$(date +%s) && scripts/setup-env.sh && PRIMUS_SETUP_S=$$(( $$(date +%s) - start )) scripts/run-tests.sh
