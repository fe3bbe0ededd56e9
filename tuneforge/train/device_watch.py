"""What the device is doing: memory
in use and the allocator's costly events, and the GPU's clock and power; with warnings where
these show a run slowed."""

import logging
import time
from collections.abc import Callable

import torch

from tuneforge.hardware.gpus import GIB
from tuneforge.hardware.nvml import Nvml, open_nvml

log = logging.getLogger(__name__)


def memory_stats(device: torch.device) -> dict[str, float]:
    """Memory in use, and `alloc_retries`: how often so far the caching allocator found no
    cached block and no room to reserve one, so that it freed its cache, waiting for the GPU,
    and tried again (a run at its memory limit; each retry slows its step)."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)  # one read: each of torch's getters builds it anew
    allocated = stats.get("allocated_bytes.all.current", 0)
    reserved = stats.get("reserved_bytes.all.current", 0)
    return {
        "mem_allocated_gib": allocated / GIB,
        "mem_reserved_gib": reserved / GIB,
        "mem_peak_gib": stats.get("allocated_bytes.all.peak", 0) / GIB,
        "mem_reserved_unallocated_gib": (reserved - allocated) / GIB,
        "alloc_retries": stats.get("num_alloc_retries", 0),
    }


ALLOCATOR_COUNTS = (
    "num_alloc_retries",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
)


def allocator_counts(device: torch.device | None = None) -> dict[str, int]:
    """The caching allocator's counters of costly events: retries (an allocation that found no
    cached block and no room under the limit, so the cache was freed, waiting for the GPU),
    waits for all streams, and the device's own allocations and frees."""
    if not torch.cuda.is_available():
        return dict.fromkeys(ALLOCATOR_COUNTS, 0)
    stats = torch.cuda.memory_stats(device)
    return {name: stats.get(name, 0) for name in ALLOCATOR_COUNTS}


class RetryWatch:
    """Says once when the allocator starts retrying after the first steps (compilation and the
    allocator's own warm-up retry too), with what to do about it."""

    def __init__(self, settle_steps: int) -> None:
        self.settle_steps, self.settled_count, self.said = settle_steps, None, False

    def check(self, step: int, stats: dict) -> str | None:
        count = stats.get("alloc_retries")
        if count is None or self.said:
            return None
        if step <= self.settle_steps or self.settled_count is None:
            self.settled_count = count
            return None
        if count == self.settled_count:
            return None
        self.said = True
        return (
            f"step {step}: the CUDA caching allocator found no room {count - self.settled_count} "
            f"time(s) since step {self.settle_steps} and freed its cache to retry, waiting for "
            "the GPU each time: the run is at its memory limit and these steps are slower. "
            "`tuneforge plan CONFIG` shows what leaves room (train.compile_memory_budget, "
            "checkpointing, offloading)"
        )


class ClockWatch:
    """The GPU's SM clock and power draw (NVML; nothing without it), read with a step at most
    every `interval_s` (a reading costs the host up to a millisecond), and a warning once when
    heat or a hardware slowdown has held the clock down at `patience` readings in a row: a hot
    node or a failing fan slows every step of the run. The power cap holding the clock is a busy
    GPU's normal state, and only logged."""

    def __init__(
        self,
        nvml: Nvml | None,
        rank: int = 0,
        patience: int = 5,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml, self.rank, self.patience = nvml, rank, patience
        self.interval_s, self.clock, self.next_read = interval_s, clock, float("-inf")
        self.in_row, self.said = 0, False

    def check(self, step: int) -> tuple[dict, str | None]:
        """This step's reading for the metrics (empty between readings) and a warning, if due."""
        if self.nvml is None or self.clock() < self.next_read:
            return {}, None
        self.next_read = self.clock() + self.interval_s
        try:
            sample = self.nvml.read()
        except Exception as error:  # a metric is never worth a run: stop reading, say so once
            self.nvml = None
            return {}, f"step {step}: the GPU's clock and power are no longer read ({error})"
        stats = {
            "gpu_sm_clock_mhz": sample.sm_clock_mhz,
            "gpu_power_w": sample.power_w,
            "gpu_clock_held_down_by": sample.held_down_by(),
        }
        slowing = sample.slowed_by()
        self.in_row = self.in_row + 1 if slowing else 0
        if self.in_row < self.patience or self.said:
            return stats, None
        self.said = True
        return stats, (
            f"step {step}: rank {self.rank}'s GPU has had its clock held down by "
            f"{' and '.join(slowing)} at {self.patience} readings in a row (SM clock "
            f"{sample.sm_clock_mhz:,.0f} of {self.nvml.max_sm_clock_mhz:,.0f} MHz, "
            f"{sample.power_w:.0f} W): every step of the run is slower for it. Check the node's "
            "cooling, or leave the node out of the job (sbatch --exclude=NODE)"
        )


class DeviceWatch:
    """Each step's device numbers for the metrics — memory (`memory_stats`) and the clock and
    power (`ClockWatch`) — with a warning, once each, where they show the run slowed."""

    def __init__(self, device: torch.device, rank: int, settle_steps: int) -> None:
        self.device = device
        self.retries = RetryWatch(settle_steps)
        self.clocks = ClockWatch(open_nvml(device)[0] if device.type == "cuda" else None, rank)

    def check(self, step: int) -> dict:
        stats = memory_stats(self.device)
        clock_stats, clock_note = self.clocks.check(step)
        for note in (self.retries.check(step, stats), clock_note):
            if note:
                log.warning(note)
        return stats | clock_stats
