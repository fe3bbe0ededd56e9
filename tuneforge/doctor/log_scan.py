"""`tuneforge doctor log`: what a training log says went wrong (ours, and the common formats of
HF Trainer / tqdm, DeepSpeed, Megatron and torchrun): an allocator setting silently inactive,
deprecated allocator variables, NaN or skipped iterations, a chain that restarted from step 0
(shown by the step counter or stated by the framework), an ETA past the time limit, a GPU slowed
by heat or a hardware slowdown, and collective (NCCL/RCCL) errors; in a metrics file
(`metrics.jsonl`), a reinforcement-learning run's rewards and KL (`reward_scan.py`).

The log is read line by line, once, keeping only counts and a few lines: a 50 MB log takes
seconds. Step times are read with the unit each format prints (tqdm's `s/it` or `it/s`,
Megatron's milliseconds, our seconds), never guessed from their size."""

import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from tuneforge.config.durations import format_duration
from tuneforge.doctor.reward_scan import RewardTrack

RANK = re.compile(r"\[(?:default)?rank\s*(\d+)\]|\brank[ =:]*(\d+)\b", re.IGNORECASE)
STEP_PATTERNS = (
    re.compile(r"\bstep (\d+)/(\d+)\b"),  # ours: "step 12/600 ..."
    re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)"),  # Megatron: "iteration 100/ 6060"
    # tqdm: "12/6060 [01:23<210:00:00, 125.00s/it]" or "[00:10<03:00,  7.99it/s]"
    re.compile(r"(?<![\d.])(\d+)/(\d+) \[[^\]]*?(?:s/it|it/s)"),
)
StepTime = tuple[re.Pattern[str], Callable[[float], float]]
STEP_TIMES: tuple[StepTime, ...] = (
    (re.compile(r"(?<![\d.])\d+/\d+ \[[^\]]*?([\d.]+)\s*s/it\]"), lambda s: s),
    (re.compile(r"(?<![\d.])\d+/\d+ \[[^\]]*?([\d.]+)\s*it/s\]"), lambda rate: 1 / rate),
    (re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)"), lambda ms: ms / 1000),
    (re.compile(r"\bstep_s['\"]?:\s*([\d.]+)"), lambda s: s),
)
STATED_RESTART = re.compile(
    r"Continuing training from global step 0\b"  # HF Trainer, resuming "from" nothing
    r"|Unable to find latest file at \S+"  # DeepSpeed: no checkpoint, so a fresh start
    r"|no complete checkpoint: starting from step 0",  # ours
    re.IGNORECASE,
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
DEPRECATED_ALLOCATOR = re.compile(
    r"PYTORCH_(CUDA|HIP)_ALLOC_CONF.*deprecat|deprecat.*PYTORCH_(CUDA|HIP)_ALLOC_CONF"
)
RECENT_TIMES = 50


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
    planned_step_s: float | None = None
    """What the planner predicts for the run's configuration (`doctor log --config`)."""
    planned_rates: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _rank_of(line: str) -> str:
    match = RANK.search(line)
    return (match.group(1) or match.group(2)) if match else "?"


@dataclass
class _Matches:
    """The lines one pattern matched: how many, the first, and the ranks they name."""

    count: int = 0
    first: str = ""
    ranks: set[str] = field(default_factory=set)

    def add(self, line: str) -> None:
        if not self.count:
            self.first = line.strip()[:160]
        self.count += 1
        self.ranks.add(_rank_of(line))

    def rank_list(self) -> str:
        return ", ".join(sorted(self.ranks))


class LogScanner:
    """Feed it lines; `report()` says what they show."""

    def __init__(self) -> None:
        self.inactive, self.deprecated, self.nan = _Matches(), _Matches(), _Matches()
        self.collective, self.slowdown, self.stated = _Matches(), _Matches(), _Matches()
        self.highest_step = 0
        self.restarts, self.restarted_after = 0, 0
        self.last_step: tuple[int, int] | None = None
        self.times: list[float] = []
        self.rewards = RewardTrack()

    def feed(self, line: str) -> None:
        self.rewards.feed(line)
        if "expandable_segments not supported" in line:
            self.inactive.add(line)
        for matches, pattern in (
            (self.deprecated, DEPRECATED_ALLOCATOR),
            (self.nan, NAN),
            (self.collective, COLLECTIVE),
            (self.slowdown, SLOWDOWN),
            (self.stated, STATED_RESTART),
        ):
            if pattern.search(line):
                matches.add(line)
        self._step(line)
        for pattern, to_seconds in STEP_TIMES:
            match = pattern.search(line)
            if match and float(match.group(1)) > 0:
                self.times.append(to_seconds(float(match.group(1))))
                del self.times[:-RECENT_TIMES]
                break

    def _step(self, line: str) -> None:
        for pattern in STEP_PATTERNS:
            match = pattern.search(line)
            if match:
                step = (int(match.group(1)), int(match.group(2)))
                if step[0] <= 1 and self.highest_step > 1:
                    self.restarts += 1
                    self.restarted_after = self.restarted_after or self.highest_step
                self.highest_step = max(self.highest_step, step[0])
                self.last_step = step
                return

    def report(self, time_limit_s: float | None = None) -> LogReport:
        report = LogReport()
        report.findings = [finding for finding in self._findings() if finding is not None]
        report.findings += [Finding(*found) for found in self.rewards.findings()]
        if self.last_step is not None:
            report.steps_seen, report.total_steps = self.last_step
        if self.times:
            report.step_time_s = statistics.fmean(self.times)  # N steps take N times the mean
        if report.step_time_s and report.total_steps and report.steps_seen is not None:
            report.eta_s = (report.total_steps - report.steps_seen) * report.step_time_s
            total_s = report.total_steps * report.step_time_s
            if time_limit_s is not None and total_s > time_limit_s:
                report.findings.append(_over_limit(report, total_s, time_limit_s))
        return report

    def _findings(self) -> Iterable[Finding | None]:
        yield self._found(
            self.inactive,
            "expandable_segments_inactive",
            f"'expandable_segments not supported' appears {self.inactive.count} time(s) "
            f"(ranks: {self.inactive.rank_list()}): fragmentation protection is off on those ranks",
            "this PyTorch/ROCm build ignores the setting: expect fragmentation OOMs; leave "
            "headroom (smaller micro-batches), or use a build that supports it",
        )
        yield self._found(
            self.deprecated,
            "allocator_env_deprecated",
            "the log warns that PYTORCH_CUDA_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF is deprecated",
            "set PYTORCH_ALLOC_CONF (torch >= 2.9) with the same value; keep the old name only "
            "for older torch",
        )
        yield self._found(
            self.nan,
            "nan_or_skipped_iterations",
            f"{self.nan.count} line(s) report NaN/Inf losses or skipped iterations, first: "
            f"{self.nan.first}",
            "lower the learning rate or raise warm-up, check the data of those steps, keep "
            "gradient clipping on; bf16 overflow in attention scores points at the attention "
            "backend",
        )
        yield self._restart()
        yield self._found(
            self.collective,
            "collective_error",
            f"{self.collective.count} NCCL/RCCL error or timeout line(s), first: "
            f"{self.collective.first}",
            "check NCCL_SOCKET_IFNAME (e.g. hsn0 on LUMI), the network plugin, and that every "
            "rank reached the same collective (a rank that died first shows in its own log)",
        )
        yield self._found(
            self.slowdown,
            "gpu_clock_slowdown",
            f"{self.slowdown.count} line(s) report a GPU's clock held down by heat or a hardware "
            f"slowdown (ranks: {self.slowdown.rank_list()}), first: {self.slowdown.first}",
            "every step waits for the slowest GPU: check the node's cooling and power "
            "(nvidia-smi -q -d PERFORMANCE), or leave the node out (sbatch --exclude=NODE)",
        )

    @staticmethod
    def _found(matches: _Matches, code: str, message: str, advice: str) -> Finding | None:
        return Finding(code, matches.count, message, advice) if matches.count else None

    def _restart(self) -> Finding | None:
        if not (self.restarts or self.stated.count):
            return None
        shown = (
            f"the step counter went back to the start after reaching step {self.restarted_after}"
            if self.restarts
            else ""
        )
        stated = f"the log says so: {self.stated.first}" if self.stated.count else ""
        return Finding(
            "restart_from_step_zero",
            self.restarts + self.stated.count,
            "; ".join(part for part in (shown, stated) if part)
            + ": a job of the chain did not resume",
            "give every job of a chain the same run directory (never $SLURM_JOB_ID in it) and "
            "--resume auto; check that a checkpoint was written before the job ended "
            "(checkpoint.save_steps below the steps one job can do) and that the path the "
            "framework looks for exists",
        )


def _over_limit(report: LogReport, total_s: float, time_limit_s: float) -> Finding:
    assert report.step_time_s is not None
    jobs = -(-total_s // time_limit_s)
    return Finding(
        "eta_exceeds_limit",
        1,
        f"{report.total_steps} steps at {report.step_time_s:.2f} s/step take "
        f"{total_s / 3600:.0f} h ({format_duration(total_s)}), more than the "
        f"{format_duration(time_limit_s)} limit",
        f"chain about {int(jobs)} jobs with --resume auto (tuneforge slurm), or "
        "reconfigure: fewer steps, packing, shorter sequences, more GPUs",
    )


def scan_log(lines: str | Iterable[str], time_limit_s: float | None = None) -> LogReport:
    """Scan a log's text, or its lines as they are read (a file handle)."""
    scanner = LogScanner()
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        scanner.feed(line)
    return scanner.report(time_limit_s)
