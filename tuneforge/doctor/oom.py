"""`tuneforge doctor oom`: read a PyTorch out-of-memory message (CUDA or HIP, the current
format and the pre-2023 one) and say which failure it is, following the decision tree of the
LUMI-G report: fragmentation (much memory reserved but unallocated: enable expandable segments),
memory pressure (little unallocated: checkpoint activations, shorten sequences or micro-batches,
shard more), or memory held by other processes."""

import re
from dataclasses import asdict, dataclass, field

from tuneforge.hardware.gpus import GIB

FRAGMENTATION_GIB = 2.0
OTHER_PROCESSES_GIB = 1.0
UNITS = {
    "b": 1 / GIB,
    "bytes": 1 / GIB,
    "kib": 1 / 2**20,
    "mib": 1 / 2**10,
    "gib": 1.0,
    "kb": 1e3 / GIB,
    "mb": 1e6 / GIB,
    "gb": 1e9 / GIB,
    "tib": 1024.0,
}
SIZE = r"([\d.]+)\s*(bytes|b|kib|mib|gib|tib|kb|mb|gb)"


def gib(number: str, unit: str) -> float:
    return float(number) * UNITS[unit.lower()]


@dataclass
class OomReport:
    kind: str
    """`fragmentation`, `pressure`, `other_processes` or `unknown`."""
    platform: str | None = None
    """`cuda` or `hip`."""
    requested_gib: float | None = None
    total_gib: float | None = None
    free_gib: float | None = None
    allocated_gib: float | None = None
    reserved_gib: float | None = None
    reserved_unallocated_gib: float | None = None
    this_process_gib: float | None = None
    other_processes_gib: float | None = None
    during_resume: bool = False
    actions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _find(pattern: str, text: str) -> float | None:
    match = re.search(pattern, text, re.IGNORECASE)
    return gib(match.group(1), match.group(2)) if match else None


def parse_oom(text: str) -> OomReport:
    """The figures of the (last) out-of-memory message in `text`."""
    starts = [m.start() for m in re.finditer(r"(CUDA|HIP) out of memory", text, re.IGNORECASE)]
    if not starts:
        return OomReport("unknown")
    message = text[starts[-1] :]
    report = OomReport("unknown", platform=message[:4].strip().lower())
    report.requested_gib = _find(rf"Tried to allocate {SIZE}", message)
    # current format: "GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free"
    report.total_gib = _find(rf"total capacity of {SIZE}", message) or _find(
        rf"{SIZE} total capacity", message
    )
    report.free_gib = _find(rf"of which {SIZE} is free", message) or _find(rf"{SIZE} free", message)
    report.allocated_gib = _find(rf"{SIZE} is allocated by PyTorch", message) or _find(
        rf"{SIZE} already allocated", message
    )
    report.reserved_unallocated_gib = _find(
        rf"{SIZE} is reserved by PyTorch but unallocated", message
    )
    # pre-2023 format: "14.75 GiB reserved in total by PyTorch"
    report.reserved_gib = _find(rf"{SIZE} reserved in total by PyTorch", message)
    allocated, unallocated = report.allocated_gib, report.reserved_unallocated_gib
    if report.reserved_gib is None and allocated is not None and unallocated is not None:
        report.reserved_gib = allocated + unallocated
    reserved = report.reserved_gib
    if unallocated is None and reserved is not None and allocated is not None:
        report.reserved_unallocated_gib = max(0.0, reserved - allocated)
    report.this_process_gib = _find(rf"this process has {SIZE} memory in use", message)
    processes = [
        gib(m.group(1), m.group(2))
        for m in re.finditer(rf"Process \d+ has {SIZE} memory in use", message, re.IGNORECASE)
    ]
    if processes:
        this = report.this_process_gib or 0.0
        report.other_processes_gib = max(0.0, sum(processes) - this)
    report.during_resume = bool(
        re.search(r"load_checkpoint|dcp\.load|resum|load_state_dict", text, re.IGNORECASE)
    )
    return report


def allocator_variable(platform: str | None, torch_version: str | None) -> str:
    """The allocator setting to export: `PYTORCH_ALLOC_CONF` from torch 2.9 on, before that the
    platform's own."""
    if torch_version is not None:
        major, minor = (int(part) for part in re.findall(r"\d+", torch_version)[:2])
        if (major, minor) >= (2, 9):
            return "PYTORCH_ALLOC_CONF"
    return "PYTORCH_HIP_ALLOC_CONF" if platform == "hip" else "PYTORCH_CUDA_ALLOC_CONF"


def diagnose(text: str, torch_version: str | None = None) -> OomReport:
    report = parse_oom(text)
    if report.platform is None:
        report.actions.append(
            "no CUDA/HIP out-of-memory message found: paste the whole error, from "
            "'torch.OutOfMemoryError' (or 'RuntimeError: CUDA out of memory') to its end"
        )
        return report
    fragmented = report.reserved_unallocated_gib is not None and (
        report.reserved_unallocated_gib > FRAGMENTATION_GIB
        or (
            report.requested_gib is not None
            and report.reserved_unallocated_gib >= report.requested_gib
        )
    )
    others = report.other_processes_gib or 0.0
    if others > OTHER_PROCESSES_GIB and not fragmented:
        report.kind = "other_processes"
        report.actions.append(
            f"{others:.1f} GiB of this GPU is held by other processes: stop them (nvidia-smi / "
            "rocm-smi shows which), or make sure each rank uses its own GPU (LOCAL_RANK)"
        )
    elif fragmented:
        report.kind = "fragmentation"
        variable = allocator_variable(report.platform, torch_version)
        report.actions += [
            f"{report.reserved_unallocated_gib:.1f} GiB is reserved but unallocated: the allocator's "
            "cache is fragmented, the model fits. Do not shrink the batch; enable expandable "
            f"segments: export {variable}=expandable_segments:True",
            "check that it takes effect: `tuneforge doctor env` probes it, and `tuneforge doctor log` "
            "finds 'expandable_segments not supported' warnings (some ROCm builds ignore the "
            "setting, per rank)",
        ]
    elif report.reserved_unallocated_gib is not None or report.allocated_gib is not None:
        report.kind = "pressure"
        report.actions += [
            "memory pressure: the tensors themselves do not fit",
            "with train.compile, first train.compile_memory_budget: 0.8: the compiled blocks make "
            "their cheapest activations again in backward (a little slower, much less memory)",
            "make sure activation checkpointing is on (train.activation_checkpointing: full, or "
            "selective with a smaller checkpoint_every)",
            "lower data.max_seq_len (to the p99 of your data: `tuneforge data inspect`) or "
            "train.tokens_per_micro_batch, keeping the global batch with grad_accum_steps",
            "shard more: parallel.strategy: fsdp with zero_stage: 3, or more GPUs; "
            "`tuneforge plan CONFIG` predicts each setting's memory",
        ]
    if report.during_resume:
        report.actions.append(
            "the failure came while loading a checkpoint: resume with a shorter data.max_seq_len or "
            "fewer eval samples first, then restore them (--force allows the change)"
        )
    return report
