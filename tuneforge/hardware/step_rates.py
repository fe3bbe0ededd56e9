"""What one GPU does per second with each kind of work a training step holds: the constants of
the planner's step-time model (`plan/step_time.py`). One table by GPU kind; the H200's are fitted
on its measured steps (`tuneforge plan --calibrate`, docs/plan.md), the others scaled from it by
their spec sheets. A calibration file (JSON) written by `plan --calibrate` replaces a row.

A leaf: it imports nothing of ours beyond the GPU tables."""

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from tuneforge.hardware.gpus import PEAK_TFLOPS

FITTED = (
    "bf16_tflops",
    "fp8_tflops",
    "expert_tflops",
    "attention_tflops",
    "memory_gbps",
    "host_link_gbps",
    "dequant_gbps",
    "host_s_per_block",
    "step_s",
    "chunk_s",
    "replicated_collectives",
    "sharded_collectives",
    "power_limit",
    "light_power",
    "four_bit_gemm_power",
)
"""The rates `plan --calibrate` fits; the rest are ratios the measurements cannot separate."""


FOUR_BIT_FP8 = "4-bit dequantised"
"""The FP8 products of a 4-bit base (`fp8_kernels`)."""


@dataclass(frozen=True)
class StepRates:
    name: str
    """Where the rates come from: shown beside every predicted time."""
    bf16_tflops: float
    """Dense GEMMs in the model's dtype at the GPU's maximum clock (`power_limit` lowers it)."""
    fp8_tflops: float
    """FP8 GEMMs (frozen or trained linears in FP8), with their quantisation."""
    expert_tflops: float
    """A MoE layer's grouped expert GEMMs (a few hundred rows per expert)."""
    attention_tflops: float
    """Causal attention through flash kernels (FlashAttention, varlen)."""
    memory_gbps: float
    """Elementwise work, the loss's logits and the optimizer, against memory bandwidth."""
    host_link_gbps: float
    """Activations and embeddings moved to and from host memory."""
    dequant_gbps: float
    """A 4-bit base's weights read and dequantised for each product."""
    host_s_per_block: float
    """Host time to launch one compiled block's kernels, forward and backward."""
    step_s: float
    """A step's fixed cost: the optimizer's launches, gradient clipping, the loop's own work."""
    chunk_s: float
    """One chunk of the loss: its launches and the small products at its edges."""
    replicated_collectives: float
    """Seconds a step waits per second of DDP's (and HSDP's) all-reduce at the links' rate:
    less than 1 where backward hides it."""
    sharded_collectives: float
    """The same for FSDP2's all-gathers and reduce-scatters (its copies and its kernels' SMs
    included: above 1 where they cost more than the links' rate)."""
    power_limit: float
    """The SM clock, as a share of its maximum, that the board's power cap holds under GEMMs
    alone; work that draws less lets the clock rise (`light_power`)."""
    light_power: float
    """Power of memory-bound work (elementwise, loss, optimizer, dequantisation) at a given
    clock, as a share of GEMMs'."""
    four_bit_gemm_power: float = 1.0
    """Power of GEMMs against a dequantised 4-bit weight (sixteen values a block: fewer bits
    toggle), as a share of GEMMs' on the model's weights: QLoRA steps hold a higher clock
    under the cap than bf16 ones (bench/RESULTS.md)."""
    adapter_share: float = 0.25
    """LoRA's small products run at this share of the dense GEMM rate."""
    attention_kernels: tuple[tuple[str, float], ...] = (
        ("flash", 1.0),
        ("cudnn", 1.7),
        ("sdpa", 0.8),
        ("eager", 0.25),
    )
    """Other attention kernels' speed relative to `flash` (bench/kernel_probe.py: cuDNN 1.7x)."""
    fp8_kernels: tuple[tuple[str, float], ...] = (("torchao rowwise", 0.7), (FOUR_BIT_FP8, 0.84))
    """Other FP8 implementations' GEMM speed relative to tuneforge's (rowwise or tensorwise),
    read off bench/measured_steps.json: torchao's from the 1B full fine-tune's FP8 rows, a 4-bit
    base dequantised into E4M3 at each product (its kernel's time counted in) from QLoRA's."""
    cudnn_restored_block_s: float = 0.0066
    """What cuDNN attention adds to a block whose saved activations come back from host memory
    (flash attention adds nothing), read off one row of bench/measured_steps.json and checked
    on another (docs/plan.md, Validation)."""
    eager_elementwise: float = 2.0
    """Blocks run without torch.compile move about twice the bytes (no fused kernels)."""
    eager_launch: float = 4.0
    """... and launch about four times the kernels."""

    def attention_rate(self, kernel: str) -> float:
        """TFLOP/s of attention through `kernel` (`flash` for names not listed)."""
        ratios = dict(self.attention_kernels)
        return self.attention_tflops * ratios.get(kernel, 1.0)

    def fp8_rate(self, kernel: str) -> float:
        """TFLOP/s of FP8 GEMMs through `kernel` (an implementation and its scaling)."""
        return self.fp8_tflops * dict(self.fp8_kernels).get(kernel, 1.0)

    def scaled(self, name: str, compute: float, memory: float) -> "StepRates":
        """These rates on another GPU: compute rates times `compute`, bandwidths times
        `memory`, host costs the same."""
        return replace(
            self,
            name=name,
            bf16_tflops=self.bf16_tflops * compute,
            fp8_tflops=self.fp8_tflops * compute,
            expert_tflops=self.expert_tflops * compute,
            attention_tflops=self.attention_tflops * compute,
            memory_gbps=self.memory_gbps * memory,
            dequant_gbps=self.dequant_gbps * memory,
        )

    def fitted_values(self) -> list[float]:
        return [getattr(self, key) for key in FITTED]

    def with_fitted(self, values: list[float], name: str) -> "StepRates":
        fitted: dict = dict(zip(FITTED, values, strict=True))
        return replace(self, name=name, **fitted)

    def save(self, file: Path) -> None:
        values = asdict(self)
        values["attention_kernels"] = dict(self.attention_kernels)
        values["fp8_kernels"] = dict(self.fp8_kernels)
        file.write_text(json.dumps(values, indent=2) + "\n")


H200 = StepRates(
    name="H200 rates fitted on 88 bench steps of 2026-12-01..04 (bench/measured_steps.json)",
    bf16_tflops=664.0,
    fp8_tflops=734.6,
    expert_tflops=593.8,
    attention_tflops=533.8,
    memory_gbps=1812.8,
    host_link_gbps=49.2,
    dequant_gbps=3718.1,
    host_s_per_block=0.0008,
    step_s=0.00226,
    chunk_s=0.00041,
    replicated_collectives=0.764,
    sharded_collectives=6.809,
    power_limit=0.869,
    light_power=0.422,
    four_bit_gemm_power=0.873,
)
"""The fit's values (`bench/plan_validation.py`, docs/plan.md)."""

MEMORY_GBPS = {
    "H200": 4800.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100": 2039.0,
    "B200": 8000.0,
    "MI355X": 8000.0,
    "MI300X": 5300.0,
    "MI250X": 1638.0,  # one GCD
}
"""Spec-sheet memory bandwidth (GB/s), which scales the fitted H200 rates to another GPU."""


def step_rates(gpu: str) -> StepRates:
    """The rates of a GPU by name: the fitted H200's, scaled to another GPU by its peak FLOP/s
    and memory bandwidth (the first entries `gpu` contains; the H100's where none does)."""
    if "H200" in gpu:
        return H200
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in gpu), PEAK_TFLOPS["H100"])
    memory = next((v for k, v in MEMORY_GBPS.items() if k in gpu), MEMORY_GBPS["H100"])
    return H200.scaled(
        f"{gpu} rates scaled from the H200's by peak FLOP/s and memory bandwidth",
        peak / PEAK_TFLOPS["H200"],
        memory / MEMORY_GBPS["H200"],
    )


def load_rates(file: Path) -> StepRates:
    """A calibration written by `plan --calibrate`; unknown or missing keys are refused."""
    try:
        values = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{file}: not a calibration file ({error})") from None
    names = {f.name for f in fields(StepRates)}
    if not isinstance(values, dict) or set(values) - names or not set(FITTED) <= set(values):
        raise ValueError(
            f"{file}: not a calibration file written by `tuneforge plan --calibrate` "
            f"(it needs the keys {', '.join(FITTED)})"
        )
    attention, fp8 = values.pop("attention_kernels", None), values.pop("fp8_kernels", None)
    rates = replace(H200, **values)
    if isinstance(attention, dict):
        rates = replace(rates, attention_kernels=tuple(attention.items()))
    if isinstance(fp8, dict):
        rates = replace(rates, fp8_kernels=tuple(fp8.items()))
    return rates
