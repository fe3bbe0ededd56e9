"""The GPU's SM clock, its power draw and the reasons the driver gives for holding the clock
down, read through NVML (`nvidia-ml-py`). Without NVML (not installed, no
NVIDIA driver, a ROCm build) nothing is read and `open_nvml` says why."""

from dataclasses import dataclass

import torch

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

    def held_down_by(self) -> list[str]:
        return [name for name, bits in HELD_DOWN_BY.items() if self.reasons & bits]

    def slowed_by(self) -> list[str]:
        """What held the clock down besides the power cap (a busy GPU's normal state): heat, a
        hardware slowdown — a node that runs every step slower."""
        return [name for name in self.held_down_by() if name != "power cap"]


class Nvml:
    """A CUDA device as NVML sees it (found by its UUID: NVML's device order is not CUDA's under
    `CUDA_VISIBLE_DEVICES`)."""

    def __init__(self, device: torch.device | None = None):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        index = torch.cuda.current_device() if device is None else device
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.max_sm_clock_mhz = float(
            pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM)
        )
        self.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1e3
        self.default_power_limit_w = (
            pynvml.nvmlDeviceGetPowerManagementDefaultLimit(self._handle) / 1e3
        )

    def read(self) -> Sample:
        nvml, handle = self._nvml, self._handle
        return Sample(
            sm_clock_mhz=float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            reasons=int(self._reasons(handle)),
        )


def open_nvml(device: torch.device | None = None) -> tuple[Nvml | None, str]:
    """NVML on `device` (the current CUDA device by default), or None and why not."""
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return None, "no CUDA device"
    if torch.version.hip is not None:
        return None, "NVML reads NVIDIA GPUs only"
    try:
        return Nvml(device), ""
    except ImportError:
        return None, "`nvidia-ml-py` is not installed (pip install nvidia-ml-py)"
    except Exception as error:  # pynvml.NVMLError and its many subclasses
        return None, f"NVML: {error}"
