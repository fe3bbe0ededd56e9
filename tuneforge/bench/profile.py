"""Where a step's GPU time goes: the kernels with the most device time over a few profiled
steps, and how busy the GPU was (device time over wall time)."""

import time
from collections.abc import Callable

import torch


def profile_steps(step: Callable[[], None], steps: int = 2, top: int = 20) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    wall_ms = 1e3 * (time.perf_counter() - start) / steps
    kernels = [
        (event.key, _device_us(event) / 1e3 / steps, event.count // steps)
        for event in profiler.key_averages()
        if _device_us(event) > 0 and event.device_type == torch.autograd.DeviceType.CUDA
    ]
    kernels.sort(key=lambda kernel: -kernel[1])
    busy_ms = sum(ms for _, ms, _ in kernels)
    return {
        "wall_ms_per_step": wall_ms,
        "gpu_busy_ms_per_step": busy_ms,
        "gpu_busy_share": busy_ms / wall_ms,
        "top_kernels": [
            {"kernel": name[:120], "ms_per_step": round(ms, 3), "calls_per_step": calls}
            for name, ms, calls in kernels[:top]
        ],
    }


def _device_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0
