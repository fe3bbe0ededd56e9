"""What a plan is: the machine it is made for, and what it predicts and advises."""

from dataclasses import dataclass, field

from tuneforge.hardware.cpu import cpu_cores, cpu_peak_tflops, host_memory_gib
from tuneforge.hardware.gpus import GIB, GPU_MEMORY_GIB, PEAK_TFLOPS, platform_of
from tuneforge.hardware.step_rates import MEMORY_GBPS, StepRates, step_rates
from tuneforge.plan.memory import Memory
from tuneforge.plan.workload import Workload

CPU = "CPU"
"""`Hardware.gpu` for a run on this machine's CPU (its cores and host memory)."""


@dataclass(frozen=True)
class Hardware:
    gpus: int = 1
    nodes: int = 1
    gpu: str = "H100"
    """A GPU of the tables in `hardware.gpus`, or `CPU`."""
    memory_gib: float | None = None
    time_limit_s: float | None = None
    rates: StepRates | None = None
    """The step-time model's rates: a calibration (`plan --calibrate`), else the GPU's row."""

    @property
    def data_parallel(self) -> int:
        return self.gpus * self.nodes

    @property
    def gpu_memory_gib(self) -> float:
        if self.gpu == CPU:
            return self.memory_gib or host_memory_gib()
        return self.memory_gib or GPU_MEMORY_GIB.get(self.gpu, 80.0)

    @property
    def peak_tflops(self) -> float:
        if self.gpu == CPU:
            return cpu_peak_tflops(cpu_cores())
        return PEAK_TFLOPS.get(self.gpu, PEAK_TFLOPS["H100"])

    @property
    def step_rates(self) -> StepRates:
        if self.rates is not None:
            return self.rates
        if self.gpu == CPU:  # the fitted rates scaled to this machine's cores
            h200 = step_rates("H200")
            compute = self.peak_tflops / PEAK_TFLOPS["H200"]
            return h200.scaled(
                "this CPU's rates, scaled from the H200's", compute, 20.0 / MEMORY_GBPS["H200"]
            )
        return step_rates(self.gpu)

    @property
    def platform(self) -> str:
        return platform_of(self.gpu)


@dataclass
class Plan:
    memory: Memory
    gpu_memory_gib: float
    fits: bool
    zero_stage: int
    zero_stage_advice: str
    gradient_checkpointing_needed: bool
    largest_micro_batch_tokens: int
    step_time_s: float
    steps: int | None
    """None where the run is counted in epochs of data the plan did not read."""
    eta_h: float | None
    jobs_needed: int | None
    epoch: Workload | None
    collective_gb_per_step: float = 0.0
    """Bytes (GB) each GPU sends per optimizer step in its collectives."""
    collectives_gb: dict[str, float] = field(default_factory=dict)
    """The same by collective (`fsdp all-gather`, `tp all-reduce`, `ep all-to-all`, ...)."""
    strategy: str = "single"
    strategy_reason: str = ""
    slowest_rank_factor: float = 1.0
    """A step's time over its mean rank's work (`rank_wait`; 1.0 without the data's lengths)."""
    balanced_slowest_rank_factor: float = 1.0
    """The same with `data.balance_ranks`."""
    suggested_max_seq_len: int | None = None
    tokens_per_step: float = 0.0
    """Real tokens one GPU trains per step (from the packed epoch, else full micro-batches)."""
    per_token: dict[str, float] = field(default_factory=dict)
    """What one token costs: training GFLOP, activations kept without checkpointing (MiB, every
    layer), attention's share of one layer's (KiB) — the figures that compare a MoE with a dense
    model (active dimensions, not total parameters)."""
    model: dict[str, float] = field(default_factory=dict)
    """The model: parameters and active parameters (billions), width and depth."""
    base_weights: str | None = None
    """How the frozen base linears are held, where a precision setting changes it."""
    objective: str | None = None
    """What a non-SFT objective adds to a step (a preference run's reference)."""
    step_parts: dict[str, float] = field(default_factory=dict)
    """The step's time by part (seconds), as the step-time model prices it."""
    step_bound: str = ""
    """What bounds the step: the host, or the GPU's largest part."""
    clock: float = 1.0
    """The SM clock the power cap holds, as a share of its maximum."""
    rates: str = ""
    """The calibration the step time comes from."""
    problems: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    what_if: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "memory_gib": self.memory.gib(),
            "gpu_memory_gib": self.gpu_memory_gib,
            "fits": self.fits,
            "headroom_gib": self.gpu_memory_gib - self.memory.total / GIB,
            "zero_stage": self.zero_stage,
            "zero_stage_advice": self.zero_stage_advice,
            "gradient_checkpointing_needed": self.gradient_checkpointing_needed,
            "largest_micro_batch_tokens": self.largest_micro_batch_tokens,
            "suggested_max_seq_len": self.suggested_max_seq_len,
            "step_time_s": self.step_time_s,
            "step_parts_s": self.step_parts,
            "step_bound": self.step_bound,
            "clock": self.clock,
            "rates": self.rates,
            "steps": self.steps,
            "eta_h": self.eta_h,
            "jobs_needed": self.jobs_needed,
            "collective_gb_per_step": self.collective_gb_per_step,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "slowest_rank_factor": self.slowest_rank_factor,
            "balanced_slowest_rank_factor": self.balanced_slowest_rank_factor,
            "problems": self.problems,
            "advice": self.advice,
            "what_if": self.what_if,
            "per_token": self.per_token,
            "model": self.model,
            "base_weights": self.base_weights,
            "objective": self.objective,
            "tokens_per_step": self.tokens_per_step,
        }
