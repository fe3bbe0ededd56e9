"""A step's time from its parts (`StepWork`), each at the rate that bounds it (`StepRates`):
GEMMs by format, attention by kernel, memory-bound work, a 4-bit base's dequantisation, host
transfers not hidden behind the compute they overlap, collectives, and a host floor — a step
cannot be faster than the host launches it. Every time the tool states (plan, what-ifs, the
recipe search, the step-25 projection's expectation, `doctor log`) comes from here."""

from dataclasses import dataclass, field

from tuneforge.hardware.step_rates import StepRates
from tuneforge.plan.step_work import StepWork

IN_LINE = ("tp ", "ep ")
"""Collectives on the critical path (tensor and expert parallelism): never hidden."""
LIGHT = ("memory", "dequantise", "loss chunks")
"""Parts that draw less power than GEMMs (`StepRates.light_power`)."""


@dataclass(frozen=True)
class StepTime:
    parts: dict[str, float] = field(default_factory=dict)
    """Seconds by part of the GPU's work (what is hidden is not counted)."""
    host_s: float = 0.0
    """What the host needs to launch the step."""
    rates: str = ""
    """The calibration the rates come from."""
    clock: float = 1.0
    """The SM clock the power cap holds through the step, as a share of its maximum."""

    @property
    def gpu_s(self) -> float:
        return sum(self.parts.values())

    @property
    def total_s(self) -> float:
        return max(self.gpu_s, self.host_s)

    @property
    def bound(self) -> str:
        """What bounds the step: the host, or the GPU's largest part."""
        if self.host_s > self.gpu_s:
            return "host"
        return max(self.parts, key=lambda k: self.parts[k]) if self.parts else "gpu"


def step_time(
    work: StepWork, rates: StepRates, link_gbps: float | dict[str, float] = 450.0
) -> StepTime:
    """`link_gbps`: what one GPU sends per second in its collectives, or that by collective
    (those within a node and those across nodes differ)."""
    rate = {
        "bf16": rates.bf16_tflops,
        "fp8": rates.fp8_rate(work.fp8_kernel),
        "experts": rates.expert_tflops,
        "adapters": rates.bf16_tflops * rates.adapter_share,
    }
    parts = {f"gemm {k}": v / (rate[k] * 1e12) for k, v in work.gemm_flops.items()}
    parts["attention"] = work.attention_flops / (rates.attention_rate(work.attention_kernel) * 1e12)
    elementwise = 1.0 if work.compiled else rates.eager_elementwise
    parts["memory"] = work.memory_bytes * elementwise / (rates.memory_gbps * 1e9)
    parts["dequantise"] = work.dequant_bytes / (rates.dequant_gbps * 1e9)
    parts["loss chunks"] = work.loss_chunks * rates.chunk_s
    if work.attention_kernel == "cudnn":
        parts["cudnn restores"] = work.restored_blocks * rates.cudnn_restored_block_s
    clock = _held_clock(parts, rates, four_bit=work.dequant_bytes > 0)
    parts = {name: seconds / clock for name, seconds in parts.items()}
    compute = sum(parts.values())
    to_host, from_host = (b / (rates.host_link_gbps * 1e9) for b in work.host_bytes)
    parts["host transfers"] = max(0.0, to_host - compute * work.forward_share) + max(
        0.0, from_host - compute * (1 - work.forward_share)
    )
    for name, sent in work.collective_bytes.items():
        link = link_gbps if isinstance(link_gbps, float | int) else link_gbps[name]
        seconds = sent / (link * 1e9)
        if name.startswith("fsdp"):
            seconds *= rates.sharded_collectives
        elif not name.startswith(IN_LINE):
            seconds *= rates.replicated_collectives
        parts[f"collective {name}"] = seconds
    parts["step"] = rates.step_s
    launch = 0.0 if work.captured else 1.0 if work.compiled else rates.eager_launch
    host = work.blocks_launched * rates.host_s_per_block * launch + rates.step_s
    return StepTime({k: v for k, v in parts.items() if v > 0}, host, rates.name, clock)


def _held_clock(parts: dict[str, float], rates: StepRates, four_bit: bool = False) -> float:
    """The clock (share of its maximum) at which the step's mean power meets the cap: GEMMs
    alone hold it at `power_limit`; lighter work lets it rise, up to the maximum. `four_bit`:
    the dense GEMMs run on a dequantised 4-bit base (`StepRates.four_bit_gemm_power`)."""
    seconds = sum(parts.values())
    if seconds <= 0:
        return 1.0
    light = sum(v for k, v in parts.items() if k in LIGHT)
    dense = parts.get("gemm bf16", 0.0) if four_bit else 0.0
    saved = (1 - rates.light_power) * light + (1 - rates.four_bit_gemm_power) * dense
    power = (seconds - saved) / seconds
    return min(1.0, rates.power_limit / power)


def mean_step(times: list[StepTime]) -> StepTime:
    """Several steps' mean: their parts, host time and total averaged (a step's total is the
    larger of its GPU and host times, so the mean total is kept as measured steps average)."""
    count = max(len(times), 1)
    parts: dict[str, float] = {}
    for time in times:
        for key, value in time.parts.items():
            parts[key] = parts.get(key, 0.0) + value / count
    return MeanStep(
        parts,
        sum(t.host_s for t in times) / count,
        times[0].rates if times else "",
        sum(t.clock for t in times) / count,
        sum(t.total_s for t in times) / count,
    )


@dataclass(frozen=True)
class MeanStep(StepTime):
    mean_total_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.mean_total_s
