"""`tuneforge doctor oom`: read a PyTorch out-of-memory message (CUDA or HIP, the current
format, torch 2.1's and the pre-2023 one) and say which failure it is, following the decision
tree of the LUMI-G report: fragmentation (much memory reserved but unallocated: enable expandable
segments), memory pressure (little unallocated: checkpoint activations, shorten sequences or
micro-batches, shard more), or memory held by other processes. Out-of-memory errors without the
allocator's figures (the CUDA/HIP runtime's own, the host's) are named as such.

In the allocator's message, `Process N has X memory in use` lines are the *other* processes on
the GPU; this process is the `Including non-PyTorch memory, this process has X` line. Nothing
here imports torch: a message is text."""

import re
from dataclasses import asdict, dataclass, field

from tuneforge.doctor.oom_actions import (
    HOST_ACTIONS,
    PRESSURE_ACTIONS,
    fragmentation_actions,
    runtime_actions,
)
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
ALLOCATOR_OOM = re.compile(r"(CUDA|HIP) out of memory", re.IGNORECASE)
RUNTIME_OOM = re.compile(
    r"(CUDA|HIP) error: out of memory|hipErrorOutOfMemory|cudaErrorMemoryAllocation", re.IGNORECASE
)
HOST_OOM = re.compile(
    r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|oom[-_]kill|"
    r"Out of memory: Kill(?:ed)? process|std::bad_alloc|\bMemoryError\b",
    re.IGNORECASE,
)
ALLOCATOR_IN_MESSAGE = re.compile(r"try setting (PYTORCH_\w*ALLOC_CONF)=expandable_segments")
DURING_RESUME = re.compile(r"load_checkpoint|dcp\.load|resum|load_state_dict", re.IGNORECASE)


def gib(number: str, unit: str) -> float:
    return float(number) * UNITS[unit.lower()]


@dataclass
class OomReport:
    kind: str
    """`fragmentation`, `pressure`, `other_processes`, `runtime` (the CUDA/HIP runtime's own
    out-of-memory error, without the allocator's figures), `host` (host memory) or `unknown`."""
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
    allocator_variable: str | None = None
    """The allocator setting the message itself names (it knows the failed run's torch)."""
    actions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _find(pattern: str, text: str) -> float | None:
    match = re.search(pattern, text, re.IGNORECASE)
    return gib(match.group(1), match.group(2)) if match else None


def parse_oom(text: str) -> OomReport:
    """The figures of the (last) out-of-memory message in `text`."""
    during_resume = bool(DURING_RESUME.search(text))
    starts = [m.start() for m in ALLOCATOR_OOM.finditer(text)]
    if not starts:
        for kind, pattern in (("runtime", RUNTIME_OOM), ("host", HOST_OOM)):
            found = list(pattern.finditer(text))
            if found:
                platform = found[-1].group(0)[:3].lower() if kind == "runtime" else None
                platform = {"cud": "cuda", "hip": "hip"}.get(platform or "")
                return OomReport(kind, platform=platform, during_resume=during_resume)
        return OomReport("unknown", during_resume=during_resume)
    # a log may wrap the message over lines: one space between words, as PyTorch wrote it
    message = " ".join(text[starts[-1] :].split())
    report = OomReport("unknown", platform=message[:4].strip().lower(), during_resume=during_resume)
    report.requested_gib = _find(rf"Tried to allocate {SIZE}", message)
    # current: "GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free" (torch 2.1
    # wrote "capacty"); pre-2023: "(GPU 0; 15.78 GiB total capacity; ...)"
    report.total_gib = _find(rf"total capac(?:i)?ty of {SIZE}", message) or _find(
        rf"{SIZE} total capacity", message
    )
    report.free_gib = _find(rf"of which {SIZE} is free", message) or _find(rf"{SIZE} free", message)
    report.allocated_gib = _find(rf"{SIZE} is allocated by PyTorch", message) or _find(
        rf"{SIZE} already allocated", message
    )
    report.reserved_unallocated_gib = _find(
        rf"{SIZE} is reserved by PyTorch but unallocated", message
    )
    report.reserved_gib = _find(rf"{SIZE} reserved in total by PyTorch", message)
    allocated, unallocated = report.allocated_gib, report.reserved_unallocated_gib
    if report.reserved_gib is None and allocated is not None and unallocated is not None:
        report.reserved_gib = allocated + unallocated
    reserved = report.reserved_gib
    if unallocated is None and reserved is not None and allocated is not None:
        report.reserved_unallocated_gib = max(0.0, reserved - allocated)
    report.this_process_gib = _find(rf"this process has {SIZE} memory in use", message)
    others = [
        gib(m.group(1), m.group(2))
        for m in re.finditer(rf"Process \d+ has {SIZE} memory in use", message, re.IGNORECASE)
    ]
    if others or report.this_process_gib is not None:
        report.other_processes_gib = sum(others)
    named = ALLOCATOR_IN_MESSAGE.search(message)
    report.allocator_variable = named.group(1) if named else None
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
    """What failed and what to do. `torch_version` is the failed run's; the allocator setting a
    message names itself wins over it."""
    report = parse_oom(text)
    if report.kind == "runtime":
        report.actions += runtime_actions(report.platform)
    elif report.kind == "host":
        report.actions += HOST_ACTIONS
    elif report.platform is None:
        report.actions.append(
            "no out-of-memory message found: paste the whole error, from "
            "'torch.OutOfMemoryError' (or 'RuntimeError: CUDA out of memory') to its end"
        )
        return report
    else:
        _classify(report, torch_version)
    if report.during_resume:
        report.actions.append(
            "the failure came while loading a checkpoint: resume with a shorter data.max_seq_len or "
            "fewer eval samples first, then restore them (--force allows the change)"
        )
    return report


def _classify(report: OomReport, torch_version: str | None) -> None:
    unallocated = report.reserved_unallocated_gib
    fragmented = unallocated is not None and (
        unallocated > FRAGMENTATION_GIB
        or (report.requested_gib is not None and unallocated >= report.requested_gib)
    )
    others = report.other_processes_gib or 0.0
    variable = report.allocator_variable or allocator_variable(report.platform, torch_version)
    if others > OTHER_PROCESSES_GIB:  # first: no setting of this run gives that memory back
        report.kind = "other_processes"
        tool = "rocm-smi" if report.platform == "hip" else "nvidia-smi"
        report.actions.append(
            f"{others:.1f} GiB of this GPU is held by other processes: stop them ({tool} "
            "shows which), or make sure each rank uses its own GPU (LOCAL_RANK)"
        )
        if fragmented:
            assert unallocated is not None
            report.actions += fragmentation_actions(unallocated, variable)[:1]
    elif fragmented:
        assert unallocated is not None
        report.kind = "fragmentation"
        report.actions += fragmentation_actions(unallocated, variable)
    elif unallocated is not None or report.allocated_gib is not None:
        report.kind = "pressure"
        report.actions += PRESSURE_ACTIONS
