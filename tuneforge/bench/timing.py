"""Timing one training step the same way for every system: warm-up steps, then timed steps run
back to back as a training loop runs them (nothing waits for the GPU between them), each step's
time taken on the GPU's own clock from the start of one step to the start of the next. The mean
is reported — tokens/s is then the tokens over the time they took — with the median beside it:
where steps differ in cost (packed batches of different documents), a median counts whichever
batches the timed window holds most of, so a caller cycling through batches times whole cycles.
Also the peak memory of the timed steps only, and the GPU's clock and power over them where NVML
reads them (`bench/gpu_clocks.py`)."""

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable

import torch

from tuneforge.bench.gpu_clocks import GpuSampler
from tuneforge.hardware.gpus import GIB
from tuneforge.hardware.nvml import open_nvml
from tuneforge.train.device_watch import allocator_counts


def time_steps(step: Callable[[], None], warmup: int, steps: int, host_profiler=None) -> dict:
    """On a CPU (the tests) each step is timed on the host clock and the peaks are 0.
    `host_profiler` (a `cProfile.Profile`) is enabled over the timed steps."""
    cuda = torch.cuda.is_available()
    synchronize = torch.cuda.synchronize if cuda else lambda: None
    for _ in range(warmup):
        step()
    synchronize()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    counts_before = allocator_counts()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else []
    host_marks = []
    nvml, why_not = open_nvml()
    sampler = GpuSampler(nvml.read) if nvml else None
    if host_profiler is not None:
        host_profiler.enable()
    start = time.perf_counter()
    with sampler if sampler is not None else contextlib.nullcontext():
        for index in range(steps):
            host_marks.append(time.perf_counter())
            if cuda:
                marks[index].record()
            step()
        if cuda:
            marks[-1].record()
        synchronize()
    wall = time.perf_counter() - start
    if host_profiler is not None:
        host_profiler.disable()
    host_marks.append(time.perf_counter())
    if cuda:
        durations = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(marks)]
    else:
        durations = [b - a for a, b in itertools.pairwise(host_marks)]
    return step_statistics(durations) | {
        "ms_per_step_wall": 1e3 * wall / steps,
        "allocator_per_step": {
            name: (count - counts_before[name]) / steps
            for name, count in allocator_counts().items()
        },
        "gpu_clocks": (
            sampler.summary(nvml.max_sm_clock_mhz, nvml.power_limit_w)
            if nvml and sampler is not None
            else {"unavailable": why_not}
        ),
    }


def step_statistics(durations: list[float]) -> dict:
    """Mean, median and every step's time from the steps' durations (s), and the peak memory
    since the last reset."""
    cuda = torch.cuda.is_available()
    return {
        "ms_per_step": 1e3 * statistics.fmean(durations),
        "ms_per_step_median": 1e3 * statistics.median(durations),
        "ms_per_step_all": [round(1e3 * d, 2) for d in durations],
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / GIB if cuda else 0.0,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if cuda else 0.0,
    }
