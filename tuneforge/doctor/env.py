"""`tuneforge doctor env`: what this machine offers a training run — GPUs, versions, the allocator
setting actually in effect (probed, not read back from the environment), attention kernels,
collective-library variables and where the Hugging Face cache lives."""

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tuneforge.doctor.env_checks import (
    ALLOCATOR_VARIABLES,
    allocator_findings,
    rocm_variables,
    shared_cache_findings,
    unresponsive_gpus,
)
from tuneforge.doctor.extras import optional_extras
from tuneforge.hardware.cpu import choose_cpu_threads
from tuneforge.hardware.gpus import GIB, low_precision_cores
from tuneforge.hardware.nvml import Nvml, open_nvml
from tuneforge.models import flash4
from tuneforge.models.attention import resolve_backend

SMALL_CACHE_GIB = 50.0
LOWERED_POWER_LIMIT = 0.95
"""A power limit below this share of the board's default is taken as lowered on purpose."""


@dataclass
class EnvReport:
    torch: str
    platform: str
    """`cuda`, `rocm` or `cpu`."""
    platform_version: str | None
    gpus: list[dict] = field(default_factory=list)
    allocator_env: dict[str, str] = field(default_factory=dict)
    expandable_segments_effective: bool | None = None
    """From a probe allocation on the GPU; None without one."""
    varlen_attention: bool = False
    flex_attention: bool = False
    attention_backend: str = "sdpa"
    """What `model.attention: auto` runs here."""
    collective_env: dict[str, str] = field(default_factory=dict)
    rocm_env: dict[str, str] = field(default_factory=dict)
    """The ROCm variables that change a run (HSA_*, visible devices, queues, serialisation,
    MIOpen's and Triton's caches)."""
    cpu_threads: str = ""
    """The threads a run on the CPU here would compute with, and why."""
    hf_home: str = ""
    hf_home_free_gib: float | None = None
    extras: dict[str, dict[str, str | None]] = field(default_factory=dict)
    """tuneforge's optional extras: their packages and the versions installed (None: missing)."""
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def probe_expandable_segments() -> bool | None:
    """Allocate on the GPU and ask the allocator whether the segment is expandable."""
    if not torch.cuda.is_available():
        return None
    probe = torch.empty(4 * 2**20, dtype=torch.uint8, device="cuda")
    try:
        segments = torch.cuda.memory_snapshot()
        return any(segment.get("is_expandable", False) for segment in segments)
    finally:
        del probe


def _module_has(module: str, name: str) -> bool:
    try:
        imported = __import__(module, fromlist=[name])
    except ImportError:
        return False
    return hasattr(imported, name)


def inspect_environment() -> EnvReport:
    hip = getattr(torch.version, "hip", None)
    platform = "rocm" if hip else ("cuda" if torch.cuda.is_available() else "cpu")
    report = EnvReport(
        torch=torch.__version__,
        platform=platform,
        platform_version=hip or torch.version.cuda,
    )
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        gpu = {
            "index": index,
            "name": properties.name,
            "memory_gib": properties.total_memory / GIB,
        } | low_precision_cores(
            (properties.major, properties.minor), getattr(properties, "gcnArchName", "")
        )
        nvml, _ = open_nvml(torch.device("cuda", index))
        if nvml is not None:
            clocks, warnings = power_findings(index, nvml)
            gpu |= clocks
            report.warnings += warnings
        report.gpus.append(gpu)
    report.allocator_env = {k: os.environ[k] for k in ALLOCATOR_VARIABLES if k in os.environ}
    report.warnings += allocator_findings(os.environ, torch.__version__, platform == "rocm")
    report.warnings += unresponsive_gpus(torch.cuda.device_count())
    report.expandable_segments_effective = probe_expandable_segments()
    asked = any("expandable_segments:true" in v.lower() for v in report.allocator_env.values())
    if asked and report.expandable_segments_effective is False:
        report.warnings.append(
            "expandable_segments is set but the probe allocation is not expandable: this build "
            "ignores it, so fragmentation protection is off"
        )
    if not asked and report.gpus:
        report.warnings.append(
            "expandable segments are off: export PYTORCH_ALLOC_CONF=expandable_segments:True "
            "(PYTORCH_CUDA_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF before torch 2.9) against fragmentation"
        )
    report.varlen_attention = _module_has("torch.nn.attention.varlen", "varlen_attn")
    report.flex_attention = _module_has("torch.nn.attention.flex_attention", "flex_attention")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report.attention_backend = resolve_backend("auto", device)
    if (
        platform == "cuda"
        and report.attention_backend != "flash4"
        and torch.cuda.get_device_capability()[0] in flash4.SUPPORTED_MAJORS
    ):
        report.warnings.append(
            "this GPU runs FlashAttention-4's kernels, faster than PyTorch's own: "
            "pip install flash-attn-4 (model.attention: auto then picks it)"
        )
    report.collective_env = {
        k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "RCCL_", "FI_", "GLOO_"))
    }
    report.rocm_env = rocm_variables(os.environ)
    mounts = Path("/proc/mounts")
    if mounts.is_file():
        report.warnings += shared_cache_findings(os.environ, mounts.read_text())
    report.cpu_threads = choose_cpu_threads().describe()
    report.extras = optional_extras()
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    report.hf_home = str(home)
    existing = next((p for p in (home, *home.parents) if p.exists()), None)
    if existing is not None:
        report.hf_home_free_gib = shutil.disk_usage(existing).free / GIB
        if report.hf_home_free_gib < SMALL_CACHE_GIB:
            report.warnings.append(
                f"HF_HOME ({home}) has {report.hf_home_free_gib:.0f} GiB free: point it at scratch "
                "storage (home quotas are small on clusters)"
            )
    return report


def power_findings(index: int, nvml: Nvml) -> tuple[dict, list[str]]:
    """A GPU's power limit against its default, and what holds its clock down now (at rest,
    nothing should): the numbers for the report, and warnings."""
    sample = nvml.read()
    held = sample.held_down_by()
    clocks = {
        "power_limit_w": nvml.power_limit_w,
        "default_power_limit_w": nvml.default_power_limit_w,
        "sm_clock_max_mhz": nvml.max_sm_clock_mhz,
        "clock_held_down_by": held,
    }
    warnings = []
    if nvml.power_limit_w < LOWERED_POWER_LIMIT * nvml.default_power_limit_w:
        warnings.append(
            f"GPU {index}'s power limit is {nvml.power_limit_w:.0f} W, below its default "
            f"{nvml.default_power_limit_w:.0f} W: a fine-tuning step bound by its GEMMs runs at "
            "the power limit, so every step is slower; ask the cluster's admins why "
            "(nvidia-smi -q -d POWER)"
        )
    slowing = sample.slowed_by()
    if slowing:
        warnings.append(
            f"GPU {index} has its clock held down by {' and '.join(slowing)} now "
            f"({sample.sm_clock_mhz:,.0f} of {nvml.max_sm_clock_mhz:,.0f} MHz, "
            f"{sample.power_w:.0f} W): a run on it is slower; check the node's cooling or use "
            "another node"
        )
    return clocks, warnings
