.PHONY: quickstart test

# Train the tiny quickstart model on CPU with the local executor (no Slurm needed).
quickstart:
	scripts/setup-env.sh
	.venv/bin/primus-slurm submit recipes/quickstart.yaml --follow

# The whole test suite; starts the project's local Slurm cluster when root and apt are available.
test:
	scripts/setup-env.sh
	scripts/run-tests.sh
