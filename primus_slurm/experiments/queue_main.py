"""`python -m primus_slurm.experiments.queue_main FOLDER`: the local queue's process (local_queue.start spawns
it): the runs of FOLDER's queue.json, N at a time, each followed by its pipeline steps (pipeline.run_local)."""
from __future__ import annotations

import sys
from pathlib import Path

from primus_slurm.experiments.local_queue import run_queue
from primus_slurm.experiments.pipeline import run_local

if __name__ == "__main__":
    run_queue(Path(sys.argv[1]), after=run_local)
