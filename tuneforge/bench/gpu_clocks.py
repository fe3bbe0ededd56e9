"""The GPU's SM clock, its power draw and the reasons the driver gives for holding the clock
down, sampled on a thread over the timed steps through NVML (`nvidia-ml-py`, the `bench`
extra). A kernel-bound step that runs slower back to back than its kernels did one by one under
the profiler is explained here: the clock falls where the board reaches its power limit.
Without NVML (not installed, no NVIDIA driver) nothing is sampled and the result says why."""

import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

INTERVAL_S = 0.02

# The clock event reasons' bits (nvml.h, `nvmlClocksEventReason*`) a run can do something about
# or should know of; the idle and application-clock bits are left out.
HELD_DOWN_BY = {
    "power cap": 0x4,
    "hardware slowdown": 0x8 | 0x80,
    "thermal": 0x20 | 0x40,
}


@dataclass(frozen=True)
class Sample:
    sm_clock_mhz: float
    power_w: float
    reasons: int


class GpuSampler:
    """`with GpuSampler(read) as sampler: ...` calls `read()` every `interval_s` on a thread;
    `sampler.summary(...)` condenses what it read."""

    def __init__(self, read: Callable[[], Sample], interval_s: float = INTERVAL_S):
        self._read, self._interval_s = read, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self.samples: list[Sample] = []

    def __enter__(self) -> "GpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.samples.append(self._read())
            if self._stop.wait(self._interval_s):
                return

    def summary(self, max_sm_clock_mhz: float, power_limit_w: float) -> dict:
        return summarise(self.samples, max_sm_clock_mhz, power_limit_w)


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


class Nvml:
    """The current CUDA device as NVML sees it (found by its UUID: NVML's device order is not
    CUDA's under `CUDA_VISIBLE_DEVICES`)."""

    def __init__(self):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.max_sm_clock_mhz = float(
            pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM)
        )
        self.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1e3

    def read(self) -> Sample:
        nvml, handle = self._nvml, self._handle
        return Sample(
            sm_clock_mhz=float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            reasons=int(self._reasons(handle)),
        )


def open_nvml() -> tuple[Nvml | None, str]:
    """NVML on the current CUDA device, or None and why not."""
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    if torch.version.hip is not None:
        return None, "NVML reads NVIDIA GPUs only"
    try:
        return Nvml(), ""
    except ImportError:
        return None, "`nvidia-ml-py` is not installed (pip install 'tuneforge[bench]')"
    except Exception as error:  # pynvml.NVMLError and its many subclasses
        return None, f"NVML: {error}"


def describe(summary: dict) -> str:
    """One line: the median clock and power against their limits, and what held the clock."""
    held = [f"{name} in {share:.0%}" for name, share in summary["held_down_share"].items() if share]
    reasons = f"; clock held down by the {', the '.join(held)} of samples" if held else ""
    return (
        f"GPU over the timed steps: SM clock {summary['sm_clock_mhz']:,.0f} of "
        f"{summary['sm_clock_max_mhz']:,.0f} MHz, {summary['power_w']:.0f} of "
        f"{summary['power_limit_w']:.0f} W (medians of {summary['samples']} samples){reasons}"
    )
