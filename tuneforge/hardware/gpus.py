"""What GPUs are: their memory and peak dense bf16 FLOP/s by name, and the byte units the rest of
tuneforge counts in. A leaf: it imports nothing of ours, and torch only when a device is asked
about (text tools such as the OOM doctor stay quick to start)."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

GIB = 2**30

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
"""Dense bf16 TFLOP/s; more specific names come first (they are matched as substrings)."""

GPU_MEMORY_GIB = {
    "H200": 141.0,
    "H100": 80.0,
    "A100-40GB": 40.0,
    "A100": 80.0,
    "B200": 180.0,
    "MI355X": 288.0,
    "MI300X": 192.0,
    "MI250X": 64.0,
}


INTRA_NODE_GBPS = {
    "H200": 450.0,
    "H100 PCIe": 64.0,
    "H100": 450.0,
    "A100": 300.0,
    "B200": 900.0,
    "MI355X": 538.0,
    "MI300X": 448.0,
    "MI250X": 50.0,  # the xGMI links between a node's packages, which a ring over 8 GCDs crosses
}
"""GB/s one GPU sends to the others of its node (NVLink, Infinity Fabric), by the spec sheets."""

INTER_NODE_GBPS = {
    "MI250X": 12.5,  # LUMI-G: 4 × 200 Gb/s Slingshot for a node's 8 GCDs
}
"""GB/s one GPU sends to other nodes; 50 (one 400 Gb/s NIC per GPU) where not listed."""
DEFAULT_INTER_NODE_GBPS = 50.0


def link_gbps(name: str) -> tuple[float, float]:
    """(within a node, between nodes) GB/s per GPU of the first entries `name` contains."""
    intra = next((v for k, v in INTRA_NODE_GBPS.items() if k in name), 100.0)
    inter = next((v for k, v in INTER_NODE_GBPS.items() if k in name), DEFAULT_INTER_NODE_GBPS)
    return intra, inter


def table_name_of(device_name: str) -> str | None:
    """The GPU tables' name a device's name contains (the longest: `H100 PCIe` before `H100`),
    or None where none is."""
    return next(
        (k for k in sorted(GPU_MEMORY_GIB, key=len, reverse=True) if k in device_name), None
    )


def peak_tflops_of(name: str) -> float | None:
    """The peak of the first table entry whose name `name` contains."""
    return next((value for key, value in PEAK_TFLOPS.items() if key in name), None)


def peak_tflops(device: "torch.device", override: float | None = None) -> float | None:
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    import torch

    return peak_tflops_of(torch.cuda.get_device_name(device))


def platform_of(gpu: str) -> str:
    """`rocm` for AMD Instinct names, else `cuda`."""
    return "rocm" if gpu.startswith("MI") else "cuda"


def release_cached_memory(device: "torch.device") -> None:
    """Give the allocator's cached blocks back (what loading and quantising a model left), so
    that the reserved memory the steps report is their own."""
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


def pick_device() -> "torch.device":
    """The GPU where there is one, else the CPU."""
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def gfx_target(device: "torch.device") -> str:
    """An AMD GPU's gfx target (`gfx942`, without its feature flags); "" elsewhere."""
    import torch

    if device.type != "cuda" or not torch.version.hip:
        return ""
    arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "") or ""
    return arch.split(":")[0]


def low_precision_cores(capability: tuple[int, int], arch: str = "") -> dict[str, bool]:
    """Whether a GPU's tensor cores compute in FP8 and in FP4: NVIDIA by compute capability
    (FP8 from Ada, 8.9, and Hopper, 9.0; FP4 from Blackwell, 10.0), AMD by its gfx target
    (FP8 on MI300's gfx942 and MI355's gfx950, FP4 on gfx950)."""
    if arch.startswith("gfx"):
        target = arch.split(":")[0]
        return {"fp8": target in ("gfx942", "gfx950"), "fp4": target == "gfx950"}
    return {"fp8": capability >= (8, 9), "fp4": capability >= (10, 0)}
