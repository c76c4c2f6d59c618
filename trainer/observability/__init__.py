"""Observability: the log and its events (logger), experiment trackers (tracking), the profiler (profiling,
profile_timeline), the saved-tensor census (saved_census) and the filtered library warnings (quiet)."""
