"""`python -m primus_slurm ...` — the same CLI as the `primus-slurm` console script."""
from primus_slurm.cli import entry

entry()
