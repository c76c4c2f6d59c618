"""Many jobs as one experiment: sweeps (job arrays), pipelines (dependent jobs), what runs cost (issue 32)."""
