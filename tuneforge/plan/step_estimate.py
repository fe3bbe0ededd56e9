"""A configured run's step time on given micro-batches: its work counted (`step_work`) and priced
at a GPU's rates (`step_time`). The planner, the recipe search, the calibration and the
validation against measured steps all go through `estimate_step`."""

from dataclasses import replace

from tuneforge.config import RunConfig
from tuneforge.config.objectives.registry import declaration_of
from tuneforge.hardware.step_rates import FOUR_BIT_FP8, StepRates
from tuneforge.models.cost import forward_flops_per_token
from tuneforge.plan.frozen_models import frozen_forward_flops_per_token
from tuneforge.plan.memory import Setup, sharded_by_fsdp
from tuneforge.plan.sampling_time import decode_captured, sampling_seconds
from tuneforge.plan.step_time import StepTime, step_time
from tuneforge.plan.step_work import StepWork, step_work
from tuneforge.plan.traffic import collective_bytes

KERNELS = {"auto": "flash", "flash4": "flash", "varlen": "flash", "sdpa": "sdpa", "eager": "eager"}
"""The attention kernel a configured backend runs (`cudnn` by its own name)."""


def attention_kernel(backend: str) -> str:
    return KERNELS.get(backend, backend)


def frozen_forward_share(config: RunConfig, setup: Setup, length: int) -> float:
    """A frozen model's forwards per step (a preference run's reference, a teacher) over the
    trained model's own forward."""
    own = forward_flops_per_token(setup.args, length)
    return frozen_forward_flops_per_token(config, setup.args, length) / own if own else 0.0


def estimate_step(
    config: RunConfig,
    setup: Setup,
    micro_batches: list[list[int]],
    rates: StepRates,
    link_gbps: float | dict[str, float] = 450.0,
) -> StepTime:
    """One rank's step over `micro_batches` (each a list of document lengths read); an objective
    that samples first trains on each document once per sample, after sampling them."""
    samples, generated = declaration_of(config).sampling(config)
    trained = [documents * samples for documents in micro_batches]
    time = step_time(configured_work(config, setup, trained), rates, link_gbps)
    if not generated:
        return time
    captured = decode_captured(setup.args, sharded_by_fsdp(setup), setup.offload_embedding)
    sampling = sum(
        sampling_seconds(setup.args, m, samples, generated, setup.param_bytes, rates, captured)
        for m in micro_batches
    )
    return replace(time, parts=time.parts | {"sampling": sampling})


def configured_work(config: RunConfig, setup: Setup, micro_batches: list[list[int]]) -> StepWork:
    """One rank's step's work over `micro_batches`, as the configuration runs it."""
    reduce_bytes = 4 if config.parallel.reduce_dtype == "float32" else setup.param_bytes
    tokens = sum(sum(m) for m in micro_batches)
    documents = sum(len(m) for m in micro_batches)
    length = max(1, round(tokens / max(documents, 1)))
    return step_work(
        setup,
        micro_batches,
        fp8=config.precision.fp8,
        dora=config.lora.enabled and config.lora.use_dora,
        frozen_forward_share=frozen_forward_share(config, setup, length),
        collectives=collective_bytes(setup, reduce_bytes),
        captured=config.train.cuda_graph,
        attention_kernel=attention_kernel(config.model.attention),
        fp8_kernel=fp8_kernel(config),
    )


def fp8_kernel(config: RunConfig) -> str:
    """The FP8 products' implementation, as `StepRates.fp8_kernels` names it: a 4-bit base
    multiplied in FP8 is dequantised into E4M3 at each product, by its own kernel."""
    if config.model.quantize:
        return FOUR_BIT_FP8
    return f"{config.precision.fp8_implementation} {config.precision.fp8_scaling}"
