"""Where a step's GPU time goes: the kernels with the most device time over a few profiled
steps, how busy the GPU was (device time over wall time), the timeline (compute, collectives
and how much of them no compute hides, idle time), and the operators that took the most host
time (a step that leaves the GPU idle is waiting on them)."""

import time
from collections.abc import Callable

import torch

from tuneforge.hardware.gpus import GIB


def profile_steps(step: Callable[[], None], steps: int = 2, top: int = 30) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    wall_ms = 1e3 * (time.perf_counter() - start) / steps
    events = profiler.key_averages()
    kernels = [
        (event.key, _device_us(event) / 1e3 / steps, event.count // steps)
        for event in events
        if _is_kernel(event)
    ]
    kernels.sort(key=lambda kernel: -kernel[1])
    host = [
        (event.key, event.self_cpu_time_total / 1e3 / steps, event.count // steps)
        for event in events
        if event.self_cpu_time_total > 0
    ]
    host.sort(key=lambda op: -op[1])
    busy_ms = sum(ms for _, ms, _ in kernels)
    every_event = profiler.events()
    sources = launchers(every_event, {name for name, _, _ in kernels[:top]})
    named = [
        (event.time_range.start, event.time_range.end, event.name)
        for event in every_event
        if _is_kernel(event)
    ]
    spans = [(start, end, _is_collective(name)) for start, end, name in named]
    return {
        "timeline": {key: ms / steps for key, ms in timeline(spans).items()},
        "idle_gaps": idle_gaps(named, steps),
        "wall_ms_per_step": wall_ms,
        "gpu_busy_ms_per_step": busy_ms,
        "gpu_busy_share": busy_ms / wall_ms,
        "top_kernels": [
            {
                "kernel": name[:120],
                "ms_per_step": round(ms, 3),
                "calls_per_step": calls,
                "launched_by": sources.get(name, []),
            }
            for name, ms, calls in kernels[:top]
        ],
        "top_host_ops": [
            {"op": name[:120], "host_ms_per_step": round(ms, 3), "calls_per_step": calls}
            for name, ms, calls in host[:top]
        ],
    }


def launchers(events, names: set[str], depth: int = 3, top: int = 3) -> dict[str, list[dict]]:
    """For each kernel named, the operators that launched it, most launches first: the
    innermost operator and its callers, `depth` in all (`aten::copy_ < aten::_to_copy < ...`;
    the CUDA runtime's own calls left out)."""
    counts: dict[str, dict[str, int]] = {}
    for event in events:
        for kernel in getattr(event, "kernels", ()):
            if kernel.name not in names:
                continue
            chain: list[str] = []
            op = event
            while op is not None and len(chain) < depth:
                if not op.name.startswith(("cuda", "cuLaunch")):
                    chain.append(op.name[:60])
                op = op.cpu_parent
            by_chain = counts.setdefault(kernel.name, {})
            key = " < ".join(chain)
            by_chain[key] = by_chain.get(key, 0) + 1
    return {
        name: [
            {"ops": ops, "launches": launches}
            for ops, launches in sorted(by_chain.items(), key=lambda item: -item[1])[:top]
        ]
        for name, by_chain in counts.items()
    }


def _is_kernel(event) -> bool:
    """Device time of a kernel or copy; not a range annotated on the device's timeline (the
    optimizer's `Optimizer.step#AdamW.step` spans the kernels it launched)."""
    return (
        event.device_type == torch.autograd.DeviceType.CUDA
        and _device_us(event) > 0
        and not getattr(event, "is_user_annotation", False)
    )


def _is_collective(name: str) -> bool:
    return "nccl" in name.lower() or "rccl" in name.lower()


def timeline(spans: list[tuple[float, float, bool]]) -> dict[str, float]:
    """Milliseconds of the GPU timeline from kernel spans (start and end in microseconds, and
    whether the kernel is a collective): `compute` covered by other kernels, `collectives`
    covered by collectives, `exposed_collectives` covered by collectives and no compute, `idle`
    covered by nothing between the first kernel's start and the last one's end."""
    if not spans:
        return {"compute": 0.0, "collectives": 0.0, "exposed_collectives": 0.0, "idle": 0.0}
    compute = _union([(start, end) for start, end, collective in spans if not collective])
    collectives = _union([(start, end) for start, end, collective in spans if collective])
    every = _union([(start, end) for start, end, _ in spans])
    first, last = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    return {
        "compute": _length(compute) / 1e3,
        "collectives": _length(collectives) / 1e3,
        "exposed_collectives": (_length(every) - _length(compute)) / 1e3,
        "idle": (last - first - _length(every)) / 1e3,
    }


def idle_gaps(kernels: list[tuple[float, float, str]], steps: int, top: int = 12) -> dict:
    """Where the GPU waits: idle milliseconds per step by gap length (a launch-bound stream
    has many short gaps, a host wait a few long ones) and the longest gaps with the kernels
    on either side (start and end in microseconds)."""
    ordered = sorted(kernels)
    gaps: list[tuple[float, str, str]] = []
    busy_until, last_name = None, ""
    for start, end, name in ordered:
        if busy_until is not None and start > busy_until:
            gaps.append((start - busy_until, last_name, name))
        if busy_until is None or end >= busy_until:
            busy_until, last_name = end, name
    bins = {"under_10us": 0.0, "10_to_100us": 0.0, "over_100us": 0.0}
    for length, _, _ in gaps:
        key = "under_10us" if length < 10 else "10_to_100us" if length < 100 else "over_100us"
        bins[key] += length / 1e3 / steps
    longest = sorted(gaps, key=lambda gap: -gap[0])[:top]
    return {
        "ms_per_step": bins,
        "count_per_step": len(gaps) / steps,
        "longest": [
            {"ms": round(length / 1e3, 3), "after": before[:80], "before": after[:80]}
            for length, before, after in longest
        ],
    }


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _device_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def peak_breakdown(step: Callable[[], None], top: int = 12) -> dict:
    """What was allocated during one step and still alive at its peak, grouped by the line
    of Python that allocated it (the innermost frame in tuneforge or in compiled code)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    try:
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    live: dict[int, tuple[int, str]] = {}
    current = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for event in (e for trace in snapshot["device_traces"] for e in trace):
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], _allocation_site(event.get("frames", [])))
            current += event["size"]
            if current > peak:
                peak, at_peak = current, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            current -= live.pop(event["addr"])[0]
    from tuneforge.execution.offloaded_checkpoints import copy_stream_names

    sites: dict[str, int] = {}
    for size, site in at_peak.values():
        sites[site] = sites.get(site, 0) + size
    ranked = sorted(sites.items(), key=lambda item: -item[1])[:top]
    return {
        "allocated_before_gib": before / GIB,
        "step_peak_above_before_gib": peak / GIB,
        "live_at_peak": [{"site": site, "gib": round(size / GIB, 3)} for site, size in ranked],
        "cache": cache_breakdown(snapshot, copy_stream_names()),
    }


def cache_breakdown(snapshot: dict, stream_names: dict[int, str]) -> dict:
    """Where the allocator's reserved memory sits after the traced step, per stream (the
    caching allocator keeps a pool per stream: what one caches, another cannot use without a
    free and a retry), and the most bytes that waited at once during the step for another
    stream to finish with them (tensors freed while a copy still read them, `record_stream`)."""
    by_stream: dict[str, dict[str, float]] = {}
    for segment in snapshot["segments"]:
        stream = segment["stream"]
        name = stream_names.get(stream, "compute" if stream == 0 else f"stream {stream:#x}")
        entry = by_stream.setdefault(name, {"reserved_gib": 0.0, "allocated_gib": 0.0})
        entry["reserved_gib"] += segment["total_size"] / GIB
        entry["allocated_gib"] += segment["allocated_size"] / GIB
    for entry in by_stream.values():
        entry["cached_free_gib"] = entry["reserved_gib"] - entry["allocated_gib"]
        for key in entry:
            entry[key] = round(entry[key], 3)
    awaiting: dict[int, int] = {}
    waiting = most = 0
    for event in (e for trace in snapshot["device_traces"] for e in trace):
        if event["action"] == "free_requested":
            awaiting[event["addr"]] = event["size"]
            waiting += event["size"]
            most = max(most, waiting)
        elif event["action"] == "free_completed" and event["addr"] in awaiting:
            waiting -= awaiting.pop(event["addr"])
    return {"by_stream": by_stream, "awaiting_free_peak_gib": round(most / GIB, 3)}


def _allocation_site(frames: list[dict]) -> str:
    for frame in frames:
        name = frame.get("filename", "")
        if "tuneforge" in name or "torchinductor" in name:
            return f"{name.split('/')[-1]}:{frame.get('line')} {frame.get('name', '')}"
    return frames[0]["name"] if frames else "?"
