"""Timing one training step the same way for every system: warm-up steps, then the median of
timed steps (each synchronised), and the peak memory of the timed steps only."""

import statistics
import time
from collections.abc import Callable

import torch


def time_steps(step: Callable[[], None], warmup: int, steps: int) -> dict:
    """On a CPU (the tests) the steps are timed the same way and the peaks are 0."""
    cuda = torch.cuda.is_available()
    synchronize = torch.cuda.synchronize if cuda else lambda: None
    for _ in range(warmup):
        step()
    synchronize()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    durations = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize()
        durations.append(time.perf_counter() - start)
    return {
        "ms_per_step": 1e3 * statistics.median(durations),
        "ms_per_step_all": [round(1e3 * d, 2) for d in durations],
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
    }
