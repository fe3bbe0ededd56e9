"""Timing one training step the same way for every system: warm-up steps, then the median of
timed steps (each synchronised), and the peak memory of the timed steps only."""

import statistics
import time
from collections.abc import Callable

import torch


def time_steps(step: Callable[[], None], warmup: int, steps: int) -> dict:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    durations = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        durations.append(time.perf_counter() - start)
    return {
        "ms_per_step": 1e3 * statistics.median(durations),
        "ms_per_step_all": [round(1e3 * d, 2) for d in durations],
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
    }
