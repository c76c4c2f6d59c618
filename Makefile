.PHONY: quickstart check test gpu-test

# Train the tiny quickstart model on CPU with the local executor (no Slurm needed). PORTABLE goes into the run's
# cluster.env: one trainer thread and the AVX2 kernels of PyTorch, MKL and oneDNN, the same digits on every x86-64
# host for training and for the run's eval/generate jobs (the README's numbers). Not in the recipe itself: there
# they changed every quickstart-based test job (lr=10 no longer diverged; commit 4eb2dad).
PORTABLE = --set cluster.env.OMP_NUM_THREADS=1 --set cluster.env.ATEN_CPU_CAPABILITY=avx2 \
	--set cluster.env.MKL_CBWR=AVX2 --set cluster.env.ONEDNN_MAX_CPU_ISA=AVX2
quickstart:
	scripts/setup-env.sh
	.venv/bin/primus-slurm submit recipes/quickstart.yaml --follow $(PORTABLE)

# The fast loop: unit, contract and small CPU-model tests; no Slurm, no podman, no long runs (markers slurm,
# container and slow; conftest.py sets the first two from the fixtures a test takes).
check:
	scripts/setup-env.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -n $${CHECK_WORKERS:-2} -m "not slurm and not container and not slow" tests

# The whole test suite; starts the project's local Slurm cluster when root and apt are available.
test:
	start=$$(date +%s) && scripts/setup-env.sh && PRIMUS_SETUP_S=$$(( $$(date +%s) - start )) scripts/run-tests.sh

# The GPU lifecycle suite (tests/gpu): resume, eval, generate, export, a pipelined sweep and cost on the device. First
# in every device session (scripts/gpu-test.sh says how to stage it); skipped where there is no CUDA device.
gpu-test:
	bash scripts/gpu-test.sh
