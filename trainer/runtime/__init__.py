"""The run's runtime: torchrun with the trainer's exit codes (launch), process groups (distributed), signals and
exit codes (signals), the preflights (preflight, preflight_comm) and the start check of the recipe (start_check)."""
