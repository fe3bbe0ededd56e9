"""Before launch: per-GPU memory, step time, ETA and jobs needed, and what changes would do."""
