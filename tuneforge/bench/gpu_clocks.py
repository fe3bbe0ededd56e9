"""The GPU's SM clock, power draw and reasons for holding the clock down (`hardware/nvml.py`)
sampled on a thread over the timed steps. A kernel-bound step that runs slower back to back than
its kernels did one by one under the profiler is explained here: the clock falls where the
board reaches its power limit."""

import statistics
import threading
from collections.abc import Callable

from tuneforge.hardware.nvml import HELD_DOWN_BY, Sample

INTERVAL_S = 0.02


class GpuSampler:
    """`with GpuSampler(read) as sampler: ...` calls `read()` every `interval_s` on a thread;
    `sampler.summary(...)` condenses what it read."""

    def __init__(self, read: Callable[[], Sample], interval_s: float = INTERVAL_S):
        self._read, self._interval_s = read, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self.samples: list[Sample] = []
        self.error: str | None = None

    def __enter__(self) -> "GpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self._read())
            except Exception as error:  # NVML lost mid-run: keep what was read, say why
                self.error = str(error)
                return
            if self._stop.wait(self._interval_s):
                return

    def summary(self, max_sm_clock_mhz: float, power_limit_w: float) -> dict:
        summary = summarise(self.samples, max_sm_clock_mhz, power_limit_w)
        return summary | {"stopped_by": self.error} if self.error else summary


def summarise(samples: list[Sample], max_sm_clock_mhz: float, power_limit_w: float) -> dict:
    """Medians over the samples, and the share of samples each reason held the clock down."""
    if not samples:
        return {"unavailable": "no sample was taken"}
    return {
        "samples": len(samples),
        "sm_clock_mhz": statistics.median(s.sm_clock_mhz for s in samples),
        "sm_clock_max_mhz": max_sm_clock_mhz,
        "power_w": statistics.median(s.power_w for s in samples),
        "power_limit_w": power_limit_w,
        "held_down_share": {
            name: sum(bool(s.reasons & bits) for s in samples) / len(samples)
            for name, bits in HELD_DOWN_BY.items()
        },
    }


def describe(summary: dict) -> str:
    """One line: the median clock and power against their limits, and what held the clock."""
    held = [f"{name} in {share:.0%}" for name, share in summary["held_down_share"].items() if share]
    reasons = f"; clock held down by the {', the '.join(held)} of samples" if held else ""
    return (
        f"GPU over the timed steps: SM clock {summary['sm_clock_mhz']:,.0f} of "
        f"{summary['sm_clock_max_mhz']:,.0f} MHz, {summary['power_w']:.0f} of "
        f"{summary['power_limit_w']:.0f} W (medians of {summary['samples']} samples){reasons}"
    )
