"""`tuneforge doctor log`: what a training log says went wrong (ours, and the common formats of
HF Trainer / tqdm, Megatron and torchrun): an allocator setting silently inactive, deprecated
allocator variables, NaN or skipped iterations, a chain that restarted from step 0, an ETA past
the time limit, a GPU slowed by heat or a hardware slowdown, and collective (NCCL/RCCL) errors."""

import re
import statistics
from dataclasses import asdict, dataclass, field

from tuneforge.config.durations import format_duration

RANK = re.compile(r"\[(?:default)?rank\s*(\d+)\]|\brank[ =:]*(\d+)\b", re.IGNORECASE)
STEP_PATTERNS = (
    re.compile(r"\bstep (\d+)/(\d+)\b"),  # ours: "step 12/600 ..."
    re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)"),  # Megatron: "iteration 100/ 6060"
    re.compile(
        r"(?<![\d.])(\d+)/(\d+) \[[^\]]*?s/it"
    ),  # tqdm: "12/6060 [01:23<210:00:00, 125.00s/it]"
)
STEP_TIME_PATTERNS = (
    re.compile(r"(?<![\d.])\d+/\d+ \[[^\]]*?([\d.]+)s/it\]"),
    re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)"),
    re.compile(r"\bstep_s['\"]?:\s*([\d.]+)"),
)
NAN = re.compile(
    r"non-finite|loss is nan|nan loss|'loss': nan|loss[=: ]+nan\b|skipped iterations?: *[1-9]"
    r"|skipping (?:step|batch|update)|update skipped|inf(?:inite)? (?:loss|grad)",
    re.IGNORECASE,
)
SLOWDOWN = re.compile(
    r"clock held down by (?:thermal|hardware slowdown)"  # ours (train/device_watch.py)
    r"|(?:HW|SW Thermal|HW Thermal|HW Power Brake) Slowdown\s*:\s*Active",  # nvidia-smi -q
    re.IGNORECASE,
)
COLLECTIVE = re.compile(
    r"NCCL error|RCCL error|ncclInternalError|ncclUnhandledCudaError|ncclSystemError"
    r"|Watchdog caught collective operation timeout|NCCL timeout|collective operation timeout"
    r"|ProcessGroupNCCL.*(?:error|timed out)|Connection reset by peer",
    re.IGNORECASE,
)


@dataclass
class Finding:
    code: str
    count: int
    message: str
    advice: str


@dataclass
class LogReport:
    findings: list[Finding] = field(default_factory=list)
    steps_seen: int | None = None
    total_steps: int | None = None
    step_time_s: float | None = None
    eta_s: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _rank_of(line: str) -> str:
    match = RANK.search(line)
    return (match.group(1) or match.group(2)) if match else "?"


def _ranks(lines: list[str]) -> str:
    """The ranks the lines name, in order ("?" for a line that names none)."""
    return ", ".join(sorted({_rank_of(line) for line in lines}))


def _steps(lines: list[str]) -> list[tuple[int, int]]:
    found = []
    for line in lines:
        for pattern in STEP_PATTERNS:
            match = pattern.search(line)
            if match:
                found.append((int(match.group(1)), int(match.group(2))))
                break
    return found


def scan_log(text: str, time_limit_s: float | None = None) -> LogReport:
    lines = text.splitlines()
    report = LogReport()
    inactive = [line for line in lines if "expandable_segments not supported" in line]
    if inactive:
        report.findings.append(
            Finding(
                "expandable_segments_inactive",
                len(inactive),
                f"'expandable_segments not supported' appears {len(inactive)} time(s) "
                f"(ranks: {_ranks(inactive)}): fragmentation protection is off on those ranks",
                "this PyTorch/ROCm build ignores the setting: expect fragmentation OOMs; leave "
                "headroom (smaller micro-batches), or use a build that supports it",
            )
        )
    deprecated = [
        line
        for line in lines
        if re.search(
            r"PYTORCH_(CUDA|HIP)_ALLOC_CONF.*deprecat|deprecat.*PYTORCH_(CUDA|HIP)_ALLOC_CONF", line
        )
    ]
    if deprecated:
        report.findings.append(
            Finding(
                "allocator_env_deprecated",
                len(deprecated),
                "the log warns that PYTORCH_CUDA_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF is deprecated",
                "set PYTORCH_ALLOC_CONF (torch >= 2.9) with the same value; keep the old name only "
                "for older torch",
            )
        )
    nan = [line for line in lines if NAN.search(line)]
    if nan:
        report.findings.append(
            Finding(
                "nan_or_skipped_iterations",
                len(nan),
                f"{len(nan)} line(s) report NaN/Inf losses or skipped iterations, first: {nan[0].strip()[:160]}",
                "lower the learning rate or raise warm-up, check the data of those steps, keep "
                "gradient clipping on; bf16 overflow in attention scores points at the attention backend",
            )
        )
    steps = _steps(lines)
    restarts = [
        index
        for index in range(1, len(steps))
        if steps[index][0] <= 1 and max(s for s, _ in steps[:index]) > 1
    ]
    if restarts:
        report.findings.append(
            Finding(
                "restart_from_step_zero",
                len(restarts),
                "the step counter went back to the start after reaching "
                f"step {max(s for s, _ in steps[: restarts[0]])}: a job of the chain did not resume",
                "give every job of a chain the same run directory (never $SLURM_JOB_ID in it) and "
                "--resume auto; check that a checkpoint was written before the job ended "
                "(checkpoint.save_steps below the steps one job can do)",
            )
        )
    collective = [line for line in lines if COLLECTIVE.search(line)]
    if collective:
        report.findings.append(
            Finding(
                "collective_error",
                len(collective),
                f"{len(collective)} NCCL/RCCL error or timeout line(s), first: {collective[0].strip()[:160]}",
                "check NCCL_SOCKET_IFNAME (e.g. hsn0 on LUMI), the network plugin, and that every "
                "rank reached the same collective (a rank that died first shows in its own log)",
            )
        )
    slowdown = [line for line in lines if SLOWDOWN.search(line)]
    if slowdown:
        report.findings.append(
            Finding(
                "gpu_clock_slowdown",
                len(slowdown),
                f"{len(slowdown)} line(s) report a GPU's clock held down by heat or a hardware "
                f"slowdown (ranks: {_ranks(slowdown)}), first: {slowdown[0].strip()[:160]}",
                "every step waits for the slowest GPU: check the node's cooling and power "
                "(nvidia-smi -q -d PERFORMANCE), or leave the node out (sbatch --exclude=NODE)",
            )
        )
    times = [
        float(m.group(1)) for line in lines for p in STEP_TIME_PATTERNS if (m := p.search(line))
    ]
    if any("elapsed time per iteration (ms)" in line for line in lines):
        times = [t / 1000 if t > 100 else t for t in times]
    if steps:
        report.steps_seen, report.total_steps = steps[-1]
    if times:
        report.step_time_s = statistics.fmean(times[-50:])  # N steps take N times the mean
    if report.step_time_s and report.total_steps and report.steps_seen is not None:
        report.eta_s = (report.total_steps - report.steps_seen) * report.step_time_s
        total_s = report.total_steps * report.step_time_s
        if time_limit_s is not None and total_s > time_limit_s:
            jobs = -(-total_s // time_limit_s)
            report.findings.append(
                Finding(
                    "eta_exceeds_limit",
                    1,
                    f"{report.total_steps} steps at {report.step_time_s:.2f} s/step take "
                    f"{total_s / 3600:.0f} h ({format_duration(total_s)}), more than the "
                    f"{format_duration(time_limit_s)} limit",
                    f"chain about {int(jobs)} jobs with --resume auto (tuneforge slurm), or "
                    "reconfigure: fewer steps, packing, shorter sequences, more GPUs",
                )
            )
    return report
