"""What the device can do: peak dense bf16 FLOP/s by GPU name (for MFU) and memory in use."""

import torch

PEAK_TFLOPS = {
    "H200": 989.4,
    "H100 PCIe": 756.5,
    "H100": 989.4,
    "A100": 312.0,
    "B200": 2250.0,
    "MI355X": 2516.6,
    "MI300X": 1307.4,
    "MI250X": 191.5,  # one GCD, which is what one device is
}
GIB = 2**30


def peak_tflops(device: torch.device, override: float | None = None) -> float | None:
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_TFLOPS.items():  # more specific names come first
        if key in name:
            return value
    return None


def memory_stats(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    allocated = torch.cuda.memory_allocated(device)
    reserved = torch.cuda.memory_reserved(device)
    return {
        "mem_allocated_gib": allocated / GIB,
        "mem_reserved_gib": reserved / GIB,
        "mem_peak_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "mem_reserved_unallocated_gib": (reserved - allocated) / GIB,
    }
